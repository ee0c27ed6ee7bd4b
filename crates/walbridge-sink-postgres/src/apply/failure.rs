//! What a failed statement means: a transient fault, a conflict, a value
//! that does not fit; and which source transaction the sink stops on.

use walbridge_core::TransactionInfo;
use walbridge_pg::describe_pg_error;

use super::{Applier, Purpose};
use crate::error::{SinkError, StoppedOn};
use crate::inflight::Failed;
use crate::mapping::TableMap;

/// A transient failure of the target (connection, deadlock, shutdown,
/// resources): retrying the same transaction later may well succeed.
pub(super) fn transient(code: Option<&str>) -> bool {
    match code {
        None => true,
        Some(c) => matches!(
            &c[..2.min(c.len())],
            "08" | "40" | "53" | "55" | "57" | "58"
        ),
    }
}

impl Applier {
    /// Records (durably) that the sink stops on `txn` because of `error`.
    pub(super) fn stop_on(&self, txn: &TransactionInfo, error: String) -> Box<StoppedOn> {
        let stopped = Box::new(StoppedOn {
            source: self.source.name.clone(),
            xid: txn.xid,
            commit_lsn: txn.commit_lsn,
            end_lsn: txn.end_lsn,
            error,
        });
        self.state.set_stopped(&stopped);
        stopped
    }

    /// Turns a failed statement into the sink's error, recording the
    /// source transaction it stopped on when the data is the cause.
    pub(super) async fn failure(&mut self, purpose: Purpose, failed: Failed) -> SinkError {
        let code = failed.error.code().map(|c| c.code().to_owned());
        let purpose = match purpose {
            // Only its COMMIT's statements could fail.
            Purpose::Group { batches, commit } if batches.is_empty() => Purpose::Commit(commit),
            purpose => purpose,
        };
        let (txn, table) = match &purpose {
            Purpose::Control(what) => {
                return SinkError::Target {
                    what: (*what).to_owned(),
                    source: failed.error,
                };
            }
            Purpose::Commit(committed) => {
                let deferred = code.as_deref().is_some_and(|c| c.starts_with("23"));
                match &committed.last_txn {
                    // A deferred constraint failed at the end of one transaction: that one.
                    Some(txn) if deferred && committed.transactions == 1 => {
                        (txn.clone(), "the deferred constraints".to_owned())
                    }
                    Some(txn) if deferred => {
                        self.state
                            .set_one_by_one_until(&self.source.name, Some(txn.end_lsn));
                        return SinkError::Batch {
                            table: "the deferred constraints".to_owned(),
                            rows: committed.changes,
                            message: describe_pg_error(&failed.error),
                        };
                    }
                    _ => {
                        return SinkError::Target {
                            what: "committing".to_owned(),
                            source: failed.error,
                        };
                    }
                }
            }
            Purpose::Group { batches, commit } => {
                // Which of its statements failed is not known.
                let tables = batches
                    .iter()
                    .filter_map(|b| match b {
                        Purpose::Batch { map, .. } => Some(map.target.display()),
                        _ => None,
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                let last_txn = commit
                    .last_txn
                    .as_ref()
                    .filter(|_| !transient(code.as_deref()));
                let Some(txn) = last_txn else {
                    return SinkError::Target {
                        what: format!(
                            "applying {} changes to {tables} and committing",
                            commit.changes
                        ),
                        source: failed.error,
                    };
                };
                self.state
                    .set_one_by_one_until(&self.source.name, Some(txn.end_lsn));
                return SinkError::Batch {
                    table: tables,
                    rows: commit.changes,
                    message: describe_pg_error(&failed.error),
                };
            }
            Purpose::Prepare { sql, table, .. } => {
                return SinkError::Target {
                    what: format!("preparing `{sql}` for target table {table}"),
                    source: failed.error,
                };
            }
            Purpose::Change { txn, map, .. } => (txn.clone(), map.target.display()),
            Purpose::Truncate { txn, tables } => (txn.clone(), tables.clone()),
            Purpose::Stale { txn, table } => (txn.clone(), table.clone()),
            Purpose::Batch {
                map,
                rows,
                last_txn,
                ..
            } => {
                if transient(code.as_deref()) {
                    return SinkError::Target {
                        what: format!("applying {rows} changes to {}", map.target.display()),
                        source: failed.error,
                    };
                }
                self.state
                    .set_one_by_one_until(&self.source.name, Some(last_txn.end_lsn));
                return SinkError::Batch {
                    table: map.target.display(),
                    rows: *rows,
                    message: describe_pg_error(&failed.error),
                };
            }
        };
        if transient(code.as_deref()) {
            return SinkError::Target {
                what: format!(
                    "applying transaction {} of source `{}` to {table}",
                    txn.xid, self.source.name
                ),
                source: failed.error,
            };
        }
        let stopped = self.stop_on(&txn, describe_pg_error(&failed.error));
        let db = failed.error.as_db_error();
        let message = db.map_or_else(|| failed.error.to_string(), |d| d.message().to_owned());
        let class = code.as_deref().map_or("", |c| &c[..2.min(c.len())]);
        match purpose {
            Purpose::Truncate { tables, .. } => SinkError::Truncate {
                sink: self.sink.clone(),
                tables,
                message: describe_pg_error(&failed.error),
                stopped,
            },
            Purpose::Change { .. } if class == "23" => SinkError::Conflict {
                sink: self.sink.clone(),
                table,
                message,
                key: db
                    .and_then(|d| d.detail())
                    .map(|d| format!(" ({})", d.trim_end_matches('.')))
                    .unwrap_or_default(),
                stopped,
            },
            Purpose::Change { map, binds, .. }
                if class == "22" || code.as_deref() == Some("42804") =>
            {
                let message = self.diagnose(&map, &binds, &failed).await;
                SinkError::Value {
                    sink: self.sink.clone(),
                    message,
                    stopped,
                }
            }
            Purpose::Change { .. }
            | Purpose::Stale { .. }
            | Purpose::Control(_)
            | Purpose::Commit(_)
            | Purpose::Group { .. }
            | Purpose::Prepare { .. }
            | Purpose::Batch { .. } => SinkError::Apply {
                table,
                message: describe_pg_error(&failed.error),
                stopped,
            },
        }
    }

    /// Finds the column whose value the target type cannot hold, by
    /// assigning each value to a column of the same type in a temporary
    /// table on the lookup connection (assignment, unlike an explicit cast,
    /// refuses what does not fit instead of truncating it).
    pub(super) async fn diagnose(
        &mut self,
        map: &TableMap,
        binds: &[(bool, usize)],
        failed: &Failed,
    ) -> String {
        let client = self.catalog.client();
        for (&(_, i), param) in binds.iter().zip(&failed.params) {
            let column = &map.columns[i];
            let probe = async {
                client
                    .batch_execute(&format!(
                        "BEGIN; CREATE TEMP TABLE walbridge_probe (v {}) ON COMMIT DROP",
                        column.target_type
                    ))
                    .await?;
                client
                    .execute("INSERT INTO walbridge_probe VALUES ($1)", &[param])
                    .await
            };
            let result = probe.await;
            let _ = client.batch_execute("ROLLBACK").await;
            if let Err(e) = result
                && e.code().is_some_and(|c| c.code().starts_with("22"))
            {
                return format!(
                    "column {} of target table {} is {} (the publisher's is {}): {}",
                    column.quoted,
                    map.target.display(),
                    column.target_type,
                    column.source_type,
                    describe_pg_error(&e)
                );
            }
        }
        format!(
            "target table {}: {}",
            map.target.display(),
            describe_pg_error(&failed.error)
        )
    }
}
