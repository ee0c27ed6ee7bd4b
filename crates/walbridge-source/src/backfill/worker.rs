//! The copy worker: reads one chunk at a time between its watermarks, on
//! its own connection, while the stream goes on (see the module above for
//! the method).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::{Client, SimpleQueryMessage};
use walbridge_core::{Datum, Row};
use walbridge_pg::{describe_pg_error, quote_ident, quote_literal};

use super::{ChunkKey, ChunkRead, CopyMode, Opening, PgSnapshot, ReadKey, WATERMARK_PREFIX};
use crate::catalog::{PublishedTable, TypeCatalog, describe_table, published_tables};
use crate::config::SourceConfig;
use crate::wire::{ConnParams, connect_sql};

/// A table to copy, from where its copy stands.
#[derive(Clone, Debug)]
pub struct Job {
    /// The table's OID.
    pub oid: u32,
    /// `schema.name`, for messages.
    pub table: String,
    /// What the targets hold.
    pub mode: CopyMode,
    /// Copied up to this key; none to start at the beginning.
    pub after: Option<ReadKey>,
}

/// What the worker tells the stream.
#[derive(Debug)]
pub enum WorkerEvent {
    /// A chunk's low watermark is about to be written.
    Opening(Opening),
    /// A chunk was read; its high watermark is about to be written.
    Chunk(ChunkRead),
    /// The table left the publications (or was dropped): its copy ends.
    Gone {
        /// The table's OID.
        oid: u32,
    },
    /// The table cannot be copied this way; the reason says what to do.
    Refused {
        /// The table's OID.
        oid: u32,
        /// Why, and what to do.
        reason: String,
    },
    /// The worker's connection failed; the stream reconnects and a new
    /// worker goes on from where the copies stand.
    Failed(String),
}

/// Reads chunks of the tables it is given, one table after another.
pub struct Worker {
    params: ConnParams,
    config: Arc<SourceConfig>,
    server_version: u32,
    jobs: mpsc::UnboundedReceiver<Job>,
    events: mpsc::UnboundedSender<WorkerEvent>,
    /// Chunk ids start here: a per-run random base, so an earlier run's
    /// watermarks (read again from the slot) never match.
    next_id: u64,
}

/// How long a chunk may wait for transactions running at its low
/// watermark before the wait is reported.
const REPORT_WAIT: Duration = Duration::from_secs(10);

impl Worker {
    /// A worker for the source; `jobs` feeds it, `events` reports.
    pub fn new(
        params: ConnParams,
        config: Arc<SourceConfig>,
        server_version: u32,
        jobs: mpsc::UnboundedReceiver<Job>,
        events: mpsc::UnboundedSender<WorkerEvent>,
    ) -> Self {
        let next_id = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or_default()
            ^ u64::from(std::process::id()) << 32;
        Worker {
            params,
            config,
            server_version,
            jobs,
            events,
            next_id,
        }
    }

    /// Copies what it is given until the stream drops its side.
    pub async fn run(mut self) {
        let failed = match self.work().await {
            Ok(()) => return,
            Err(e) => e,
        };
        let _ = self.events.send(WorkerEvent::Failed(failed));
    }

    async fn work(&mut self) -> Result<(), String> {
        let client = connect_sql(
            &self.params,
            &format!("{}_copy", self.config.application_name()),
        )
        .await
        .map_err(|e| format!("copying while streaming: {e}"))?;
        let mut queue: VecDeque<Job> = VecDeque::new();
        loop {
            if queue.is_empty() {
                match self.jobs.recv().await {
                    Some(job) => queue.push_back(job),
                    None => return Ok(()),
                }
            }
            while let Ok(job) = self.jobs.try_recv() {
                queue.retain(|j| j.oid != job.oid);
                queue.push_back(job);
            }
            let Some(job) = queue.pop_front() else {
                continue;
            };
            match self.copy(&client, job.clone()).await {
                Ok(()) => {}
                Err(Trouble::Table(reason)) => {
                    let _ = self.events.send(WorkerEvent::Refused {
                        oid: job.oid,
                        reason,
                    });
                }
                Err(Trouble::Connection(e)) => return Err(e),
            }
        }
    }

    /// Copies `job`'s table to its end.
    async fn copy(&mut self, client: &Client, job: Job) -> Result<(), Trouble> {
        let source = &self.config.name;
        if self.server_version < 140_000 {
            // The watermarks are logical decoding messages, which pgoutput
            // sends from PostgreSQL 14 on.
            return Err(Trouble::Table(format!(
                "table {}: copying a table while streaming needs PostgreSQL 14 or newer on the publisher; copy it by hand, or upgrade",
                job.table
            )));
        }
        let mut after = job.after;
        let mut types = TypeCatalog::new();
        let mut rows_copied = 0u64;
        let mut chunk_rows = None;
        let mut last_report = tokio::time::Instant::now();
        tracing::info!(source = %source, table = %job.table, mode = job.mode.as_str(), resuming = after.is_some(), "copying the table while streaming");
        loop {
            let tables = published_tables(client, &self.config.publications, self.server_version)
                .await
                .map_err(|e| Trouble::from_catalog(&job.table, e))?;
            let Some(table) = tables.into_iter().find(|t| t.oid == job.oid) else {
                let _ = self.events.send(WorkerEvent::Gone { oid: job.oid });
                return Ok(());
            };
            let relation = Arc::new(
                describe_table(client, &mut types, &table)
                    .await
                    .map_err(|e| Trouble::from_catalog(&job.table, e))?,
            );
            // Replacing the table reads it whole, in no order: one chunk.
            let whole = job.mode == CopyMode::Replace;
            let key = ChunkKey::of(&relation).filter(|_| !whole);
            if key.is_none() && !whole {
                return Err(Trouble::Table(format!(
                    "table {} has neither a primary key nor a replica identity index, so it cannot be copied in key order while streaming: add a primary key, then run `walbridge resync --source {source} --table {}`; or have it emptied on the targets and copied whole, in one unit: `walbridge resync --source {source} --table {} --truncate`",
                    job.table, job.table, job.table
                )));
            }
            if let Some(key) = &key
                && self.config.binary
                && !key.binary_comparable()
            {
                return Err(Trouble::Table(format!(
                    "table {}: with binary = true, copying while streaming needs a key of integers, uuids or text; set binary = false on source `{source}` to copy it",
                    job.table
                )));
            }
            let partitioned = client
                .query_one(
                    "SELECT relkind = 'p' FROM pg_class WHERE oid = $1",
                    &[&table.oid],
                )
                .await
                .map_err(|e| Trouble::query(&job.table, &e))?
                .get::<_, bool>(0);
            let from = Source {
                table: &table,
                relation: &relation,
                key: key.as_ref(),
                partitioned,
            };
            let chunk_rows = match chunk_rows {
                Some(rows) => rows,
                None => {
                    let rows = self.chunk_rows(client, &from).await?;
                    tracing::info!(source = %source, table = %job.table, "copying in chunks of {rows} rows");
                    *chunk_rows.insert(rows)
                }
            };
            let up_to = match &key {
                Some(key) => {
                    self.upper_bound(client, &from, key, after.as_ref(), chunk_rows)
                        .await?
                }
                None => None,
            };
            let id = self.next_id;
            self.next_id = self.next_id.wrapping_add(1);
            self.send(WorkerEvent::Opening(Opening {
                id,
                oid: job.oid,
                up_to: up_to.as_ref().map(|k| k.parts.clone()),
            }))?;
            watermark(client, "low", id, &job.table).await?;
            self.wait_for_running(client, &job.table).await?;
            let (snapshot, rows) =
                read_chunk(client, &from, after.as_ref(), up_to.as_ref()).await?;
            let read = rows.len() as u64;
            let (done, told) = oneshot::channel();
            self.send(WorkerEvent::Chunk(ChunkRead {
                id,
                oid: job.oid,
                relation,
                rows,
                snapshot,
                up_to: up_to.clone(),
                key: key.as_ref().map(ChunkKey::ordered).unwrap_or_default(),
                done,
            }))?;
            watermark(client, "high", id, &job.table).await?;
            match told.await {
                Ok(true) => {}
                // The window was not the one open (the stream started over):
                // read the chunk again.
                _ => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            }
            rows_copied += read;
            if up_to.is_none() {
                tracing::info!(source = %source, table = %job.table, rows = rows_copied, "table copied while streaming");
                return Ok(());
            }
            if last_report.elapsed() >= self.config.progress_interval {
                last_report = tokio::time::Instant::now();
                tracing::info!(source = %source, table = %job.table, rows = rows_copied, "copying the table while streaming: {rows_copied} rows so far");
            }
            after = up_to;
        }
    }

    fn send(&self, event: WorkerEvent) -> Result<(), Trouble> {
        self.events
            .send(event)
            .map_err(|_| Trouble::Connection("the stream stopped".into()))
    }

    /// Rows per chunk for `from`: `backfill_chunk_rows`, fewer when that
    /// many would pass `backfill_chunk_bytes` by the average size of a
    /// sample of its rows (as the read returns them: text).
    async fn chunk_rows(&self, client: &Client, from: &Source<'_>) -> Result<u64, Trouble> {
        let sql = format!(
            "SELECT coalesce(avg(octet_length(s::text)), 0)::int8 FROM (SELECT {} FROM {} LIMIT 1000) s",
            from.columns(),
            from.relation_sql()
        );
        let table = from.table.quoted_name();
        let width: i64 = client
            .query_one(&sql, &[])
            .await
            .map_err(|e| Trouble::query(&table, &e))?
            .get(0);
        let limit = self.config.backfill_chunk_rows.max(1);
        let by_bytes =
            self.config.backfill_chunk_bytes.0 / u64::try_from(width.max(1)).unwrap_or(1);
        Ok(limit.min(by_bytes.max(1)))
    }

    /// The key `rows` rows after `after`; none when fewer remain (the
    /// chunk then reads to the end).
    async fn upper_bound(
        &self,
        client: &Client,
        from: &Source<'_>,
        key: &ChunkKey,
        after: Option<&ReadKey>,
        rows: u64,
    ) -> Result<Option<ReadKey>, Trouble> {
        let columns: Vec<String> = key
            .columns
            .iter()
            .map(|&i| format!("({})::text", from.column(i)))
            .collect();
        let sql = format!(
            "SELECT {} FROM {}{} ORDER BY {} OFFSET {} LIMIT 1",
            columns.join(", "),
            from.relation_sql(),
            from.conditions(after, None),
            key.order_by(),
            rows.max(1) - 1
        );
        let rows = simple_rows(client, &sql, &from.table.quoted_name()).await?;
        let Some(row) = rows.into_iter().next() else {
            return Ok(None);
        };
        let text = row
            .into_iter()
            .map(|d| match d {
                Datum::Text(t) => String::from_utf8(t.to_vec()).ok(),
                _ => None,
            })
            .collect::<Option<Vec<String>>>();
        text.and_then(|t| key.parse(&t)).map(Some).ok_or_else(|| {
            Trouble::Table(format!(
                "table {}: a key value could not be read",
                from.table.quoted_name()
            ))
        })
    }

    /// Waits until the transactions running when the low watermark was
    /// written have ended, so the read shows every one that committed
    /// before it.
    async fn wait_for_running(&self, client: &Client, table: &str) -> Result<(), Trouble> {
        let at_low: String = client
            .query_one("SELECT pg_current_snapshot()::text", &[])
            .await
            .map_err(|e| Trouble::query(table, &e))?
            .get(0);
        let started = tokio::time::Instant::now();
        let mut reported = false;
        // Most writers' transactions last a millisecond or two: look again
        // soon, then less often.
        let mut pause = Duration::from_millis(1);
        loop {
            let running: i64 = client
                .query_one(
                    "SELECT count(*) FROM pg_snapshot_xip($1::text::pg_snapshot) x WHERE NOT pg_visible_in_snapshot(x, pg_current_snapshot())",
                    &[&at_low],
                )
                .await
                .map_err(|e| Trouble::query(table, &e))?
                .get(0);
            if running == 0 {
                return Ok(());
            }
            if !reported && started.elapsed() >= REPORT_WAIT {
                reported = true;
                tracing::info!(source = %self.config.name, table = %table, running, "copying the table waits for {running} transaction(s) open since before its chunk began (see pg_stat_activity)");
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }
}

/// Why a copy stopped.
enum Trouble {
    /// This table cannot be copied; the others can.
    Table(String),
    /// The connection failed.
    Connection(String),
}

impl Trouble {
    fn query(table: &str, e: &tokio_postgres::Error) -> Self {
        if e.code().is_some() {
            Trouble::Table(format!(
                "copying table {table} while streaming: {}",
                describe_pg_error(e)
            ))
        } else {
            Trouble::Connection(format!(
                "copying table {table} while streaming: {}",
                describe_pg_error(e)
            ))
        }
    }

    fn from_catalog(table: &str, e: crate::catalog::CatalogError) -> Self {
        match e {
            crate::catalog::CatalogError::Query { source, .. } => Trouble::query(table, &source),
            other => Trouble::Table(format!("copying table {table} while streaming: {other}")),
        }
    }
}

/// The table a chunk is read from.
struct Source<'a> {
    table: &'a PublishedTable,
    /// The published columns, as the stream describes them.
    relation: &'a walbridge_core::Relation,
    /// None: the table is read whole, in no order.
    key: Option<&'a ChunkKey>,
    partitioned: bool,
}

impl Source<'_> {
    /// Column `index`, quoted.
    fn column(&self, index: usize) -> String {
        self.relation
            .columns
            .get(index)
            .map(|c| quote_ident(&c.name))
            .unwrap_or_default()
    }

    /// The published columns, quoted, in the stream's order.
    fn columns(&self) -> String {
        (0..self.relation.columns.len())
            .map(|i| self.column(i))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// A partitioned root (published via the root) is read with its
    /// partitions; any other table with ONLY, as the initial copy does.
    fn relation_sql(&self) -> String {
        let only = if self.partitioned { "" } else { "ONLY " };
        format!("{only}{}", self.table.quoted_name())
    }

    /// ` WHERE …`: the chunk's range and the publication's row filter.
    fn conditions(&self, after: Option<&ReadKey>, up_to: Option<&ReadKey>) -> String {
        let mut conditions: Vec<String> = Vec::new();
        if let Some(key) = self.key {
            conditions.extend(after.map(|a| key.after(a)));
            conditions.extend(up_to.map(|u| key.up_to(u)));
        }
        if let Some(filter) = &self.table.row_filter {
            conditions.push(format!("({filter})"));
        }
        if conditions.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", conditions.join(" AND "))
        }
    }
}

/// Writes a watermark: a message in a transaction of its own, committed
/// with `synchronous_commit = on`, so its WAL is flushed at once and the
/// walsender sends it at once (a non-transactional message waits for the
/// WAL writer, up to `wal_writer_delay`, 200 ms by default, per watermark).
async fn watermark(client: &Client, side: &str, id: u64, table: &str) -> Result<(), Trouble> {
    let sql = format!(
        "BEGIN; SET LOCAL synchronous_commit = on; SELECT pg_logical_emit_message(true, {}, {}); COMMIT",
        quote_literal(WATERMARK_PREFIX),
        quote_literal(&format!("{side} {id}"))
    );
    client
        .simple_query(&sql)
        .await
        .map(drop)
        .map_err(|e| Trouble::query(table, &e))
}

/// Reads the chunk `(after, up_to]` in one REPEATABLE READ transaction,
/// with that transaction's snapshot.
async fn read_chunk(
    client: &Client,
    from: &Source<'_>,
    after: Option<&ReadKey>,
    up_to: Option<&ReadKey>,
) -> Result<(PgSnapshot, Vec<(ReadKey, Row)>), Trouble> {
    let table = from.table.quoted_name();
    client
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .await
        .map_err(|e| Trouble::query(&table, &e))?;
    let read = async {
        let text: String = client
            .query_one("SELECT pg_current_snapshot()::text", &[])
            .await
            .map_err(|e| Trouble::query(&table, &e))?
            .get(0);
        let snapshot = PgSnapshot::parse(&text)
            .ok_or_else(|| Trouble::Table(format!("unexpected snapshot {text:?}")))?;
        let sql = format!(
            "SELECT {} FROM {}{}{}",
            from.columns(),
            from.relation_sql(),
            from.conditions(after, up_to),
            from.key
                .map(|k| format!(" ORDER BY {}", k.order_by()))
                .unwrap_or_default()
        );
        let rows = simple_rows(client, &sql, &table).await?;
        let keyed = rows
            .into_iter()
            .map(|row| match from.key {
                Some(key) => key.read_key(&row).map(|k| (k, row)).ok_or_else(|| {
                    Trouble::Table(format!("table {table}: a key value could not be read"))
                }),
                None => Ok((ReadKey::default(), row)),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok((snapshot, keyed))
    }
    .await;
    let ended = client.batch_execute("COMMIT").await;
    let read = read?;
    ended.map_err(|e| Trouble::query(&table, &e))?;
    Ok(read)
}

/// The rows of a simple query, values as text.
async fn simple_rows(client: &Client, sql: &str, table: &str) -> Result<Vec<Row>, Trouble> {
    let messages = client
        .simple_query(sql)
        .await
        .map_err(|e| Trouble::query(table, &e))?;
    Ok(messages
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(row) => Some(
                (0..row.len())
                    .map(|i| match row.get(i) {
                        Some(v) => Datum::Text(Bytes::copy_from_slice(v.as_bytes())),
                        None => Datum::Null,
                    })
                    .collect(),
            ),
            _ => None,
        })
        .collect())
}
