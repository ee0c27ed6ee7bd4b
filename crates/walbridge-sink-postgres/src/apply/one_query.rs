//! A small group as one query: its BEGIN, its batches and its COMMIT.
//!
//! Sent as requests of their own, a group is three rounds of the protocol
//! on the target — BEGIN, each batch (with its own Sync), the COMMIT query
//! — each ending in a flush of the target's output, and three results for
//! the sink to wake up for. On a steady stream nearly every group is one
//! small transaction, and those rounds were most of what applying it cost
//! both sides. A group of small batches, nothing of which was sent, goes
//! instead as one simple query:
//!
//! ```sql
//! BEGIN; EXECUTE walbridge_batch_0('{1}', '{"a"}'); SET CONSTRAINTS ALL IMMEDIATE; …; COMMIT; SELECT pg_current_wal_insert_lsn()::text, …
//! ```
//!
//! Invariants:
//! * A group goes as one query only while nothing of it was sent and no
//!   COMMIT is in flight: its statements are then the connection's next,
//!   in the group's order, and it commits only after the previous group.
//! * The batches run the statements the protocol would prepare
//!   ([`batch_sql`]), prepared by name with SQL `PREPARE` (in the query
//!   itself, the first time), with the same text array literals as string
//!   constants ([`push_literal`]).
//! * The failure of one query does not say which statement failed: as for
//!   a failed batch, the group's transactions are then applied one by one,
//!   which finds the one at fault (see [`super::failure`]).
//! * A statement's name is taken before its query is sent; if the query
//!   fails, the applier ends, and its session with it.

use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio_postgres::{Client, SimpleQueryMessage};
use walbridge_core::Datum;
use walbridge_pg::push_literal;

use super::{Applier, Committed, Purpose, WAL_POSITIONS, wal_read};
use crate::batch::{Batch, batch_sql};
use crate::inflight::{Failed, Outcome, Reply};

/// Bytes of values up to which a group's batches go in one query: more
/// than a steady stream's group holds, far less than a catch-up's, whose
/// batches go as parameters (no query text to scan) while earlier ones run.
const MAX_BYTES: usize = 64 << 10;

/// A group's query up to its COMMIT: BEGIN, then each batch's statement.
pub(super) struct OneQuery {
    sql: String,
    /// Statements in `sql`.
    statements: usize,
    /// Which of them run a batch, in order.
    executes: Vec<usize>,
    /// What each batch is for ([`Purpose::Batch`]), in order.
    batches: Vec<Purpose>,
}

impl Applier {
    /// The group's query up to its COMMIT, or `None` when the group does
    /// not go as one: a statement of it was sent (and its BEGIN with it), a
    /// COMMIT is in flight, or its batches are large.
    pub(super) fn one_query(&mut self, batches: &[Batch]) -> Option<OneQuery> {
        if self.group.begun || self.commits_in_flight > 0 {
            return None;
        }
        let batches: Vec<&Batch> = batches.iter().filter(|b| !b.is_empty()).collect();
        let bytes: usize = batches.iter().map(|b| b.bytes()).sum();
        if bytes > MAX_BYTES {
            return None;
        }
        let arrays: Vec<Vec<Datum>> = batches.iter().map(|b| b.arrays()).collect();
        // Query text is UTF-8 (the session's encoding): anything else goes
        // as parameters, as before.
        let values: Vec<Vec<&str>> = arrays
            .iter()
            .map(|arrays| {
                arrays
                    .iter()
                    .map(|array| match array {
                        Datum::Text(text) => std::str::from_utf8(text).ok(),
                        _ => None,
                    })
                    .collect::<Option<Vec<&str>>>()
            })
            .collect::<Option<_>>()?;
        let mut query = OneQuery {
            sql: String::with_capacity(bytes + 64 * batches.len() + 256),
            statements: 1,
            executes: Vec::with_capacity(batches.len()),
            batches: Vec::with_capacity(batches.len()),
        };
        query.sql.push_str("BEGIN");
        for (batch, values) in batches.into_iter().zip(values) {
            let key = (batch.map.id, batch.kind.clone());
            let next = self.named_statements.len();
            let name = self.named_statements.entry(key).or_insert_with(|| {
                let name = format!("walbridge_batch_{next}");
                // `write!` into a String cannot fail.
                let _ = write!(
                    query.sql,
                    "; PREPARE {name} AS {}",
                    batch_sql(&batch.map, &batch.kind)
                );
                query.statements += 1;
                name
            });
            let _ = write!(query.sql, "; EXECUTE {name}(");
            for (i, value) in values.into_iter().enumerate() {
                if i > 0 {
                    query.sql.push_str(", ");
                }
                push_literal(&mut query.sql, value);
            }
            query.sql.push(')');
            query.executes.push(query.statements);
            query.statements += 1;
            query.batches.push(Purpose::Batch {
                map: batch.map.clone(),
                kind: batch.kind.clone(),
                rows: batch.len(),
                last_txn: batch.last_txn.clone(),
            });
        }
        Some(query)
    }
}

impl OneQuery {
    /// The whole query, ending with `commit` (the COMMIT's statements) and,
    /// with `read_wal`, the target's WAL positions: what it is for, and
    /// the request.
    pub(super) fn finish(
        mut self,
        client: &Arc<Client>,
        committed: Box<Committed>,
        commit: &str,
        read_wal: bool,
    ) -> (
        Purpose,
        Pin<Box<dyn Future<Output = Outcome> + Send + 'static>>,
    ) {
        self.sql.push_str("; ");
        self.sql.push_str(commit);
        if read_wal {
            self.sql.push_str("; ");
            self.sql.push_str(WAL_POSITIONS);
        }
        let OneQuery {
            sql,
            executes,
            batches,
            ..
        } = self;
        let client = client.clone();
        let request = Box::pin(async move {
            let messages = client.simple_query(&sql).await.map_err(|error| Failed {
                error,
                params: Vec::new(),
            })?;
            // One completion per statement, in order.
            let completions: Vec<u64> = messages
                .iter()
                .filter_map(|m| match m {
                    SimpleQueryMessage::CommandComplete(rows) => Some(*rows),
                    _ => None,
                })
                .collect();
            let rows = executes
                .iter()
                .map_while(|&i| completions.get(i).copied())
                .collect();
            let commit = if read_wal {
                wal_read(&messages)
            } else {
                Reply::Rows(0)
            };
            Ok(Reply::Group {
                rows,
                commit: Box::new(commit),
            })
        });
        (
            Purpose::Group {
                batches,
                commit: committed,
            },
            request,
        )
    }
}
