//! The initial snapshot: a consistent parallel copy of every published table.
//!
//! Why it neither loses nor duplicates a row: the slot is created with an
//! exported snapshot, and its consistent point is the boundary. Every
//! worker imports that snapshot (`SET TRANSACTION SNAPSHOT`) inside a
//! REPEATABLE READ transaction, so all of them see exactly the transactions
//! committed before the consistent point — no more, whatever is written
//! concurrently. The slot then streams exactly the transactions that commit
//! after it. The exported snapshot lives as long as the replication
//! connection that created the slot runs no other command, so that
//! connection stays idle until every worker has imported it, and only then
//! starts streaming.
//!
//! Large tables are split into ranges of heap pages (`ctid` ranges, which
//! PostgreSQL 14+ scans directly), copied by whichever worker is free.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use tokio::sync::{Mutex, mpsc};
use walbridge_core::{CopyText, EventBatch, Lsn, Relation, SnapshotBatch, SourceEvent};

use crate::catalog::{CatalogError, DescribedTable, PublishedTable, TypeCatalog, describe_tables};
use crate::config::SourceConfig;
use crate::wire::{ConnParams, ConnectionError, connect_sql};
use walbridge_pg::{quote_ident, quote_literal};

/// Bytes of rows per batch handed downstream: at most the log's record
/// size (`walbridge_log::MAX_CHUNK_BYTES`), so a batch is one record.
const BATCH_BYTES: usize = 1 << 20;

/// The snapshot failed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// A worker could not connect or import the snapshot.
    #[error("snapshot worker: {0}")]
    Connection(#[from] ConnectionError),
    /// A query failed.
    #[error("snapshot of {table}: {}", crate::wire::describe_pg_error(.source))]
    Copy {
        /// The table.
        table: String,
        /// Cause.
        source: tokio_postgres::Error,
    },
    /// A catalog lookup failed.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// COPY output did not parse.
    #[error("snapshot of {table}: {source}")]
    Malformed {
        /// The table.
        table: String,
        /// What was wrong.
        source: walbridge_core::CopyTextError,
    },
    /// Downstream went away.
    #[error("snapshot output closed")]
    Closed,
}

/// The log target of the periodic "copying table" lines, so that a
/// front end drawing its own progress (bars on a terminal) can leave them out.
pub const COPY_PROGRESS_TARGET: &str = "walbridge_source::snapshot::progress";

/// Counters of a running snapshot, for logs, metrics and progress bars.
#[derive(Debug, Default)]
pub struct SnapshotProgress {
    /// Tables to copy.
    pub tables_total: AtomicU64,
    /// Tables finished.
    pub tables_done: AtomicU64,
    /// Rows copied.
    pub rows: AtomicU64,
    /// Bytes of COPY data received.
    pub bytes: AtomicU64,
    /// Each table of the copy under way (or the last one), as planned.
    tables: std::sync::Mutex<Vec<Arc<TableProgress>>>,
}

impl SnapshotProgress {
    /// Each table of the copy under way (or the last one), in the order
    /// they are copied.
    pub fn tables(&self) -> Vec<Arc<TableProgress>> {
        self.tables
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// How far the copy of one table has come; its chunks share it.
#[derive(Debug)]
pub struct TableProgress {
    /// The table, quoted as in SQL.
    table: String,
    rows: AtomicU64,
    bytes: AtomicU64,
    chunks_left: AtomicU64,
    /// When its first chunk started.
    began: std::sync::OnceLock<Instant>,
    /// The planner's row estimate (`reltuples`), when the table was analyzed.
    estimate: Option<u64>,
    /// Milliseconds since `began` when progress is next reported.
    next_report: AtomicU64,
}

impl TableProgress {
    /// The table, quoted as in SQL.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Rows copied.
    pub fn rows(&self) -> u64 {
        self.rows.load(Ordering::Relaxed)
    }

    /// Bytes of COPY data received.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// The planner's estimate of its rows, when it was analyzed.
    pub fn estimate(&self) -> Option<u64> {
        self.estimate
    }

    /// How long it has been copied; `None` while it waits for a worker.
    pub fn elapsed(&self) -> Option<std::time::Duration> {
        self.began.get().map(Instant::elapsed)
    }

    /// Rows copied per second so far (0 before it began).
    pub fn rows_per_sec(&self) -> f64 {
        let secs = self.elapsed().unwrap_or_default().as_secs_f64().max(0.001);
        self.rows() as f64 / secs
    }

    /// Seconds left at the rate so far until the planner's estimate: none
    /// without an estimate or a rate, and none once past the estimate
    /// (then it was low, and nothing better is known).
    pub fn seconds_left(&self) -> Option<u64> {
        eta_seconds(self.rows(), self.estimate, self.rows_per_sec())
    }

    /// Whether every chunk of it is copied.
    pub fn done(&self) -> bool {
        self.chunks_left.load(Ordering::Acquire) == 0
    }

    /// True when it is time to report progress (once per `every`, whichever
    /// of the table's chunks asks first).
    fn report_due(&self, every: std::time::Duration) -> bool {
        let now = self.elapsed().unwrap_or_default().as_millis() as u64;
        let due = self.next_report.load(Ordering::Relaxed);
        now >= due
            && self
                .next_report
                .compare_exchange(
                    due,
                    now + every.as_millis() as u64,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }
}

struct TableJob {
    relation: Arc<Relation>,
    table: PublishedTable,
    /// `(first page, end page)` or the whole table.
    pages: Option<(u64, u64)>,
    /// A partitioned table, read with its partitions.
    partitioned: bool,
    /// Shared by the table's chunks.
    tally: Arc<TableProgress>,
}

/// Copies `tables` as of `snapshot_name` with the source's
/// `snapshot_workers` connections (tables larger than `snapshot_chunk_size`
/// in chunks) and sends their rows downstream as [`SourceEvent::Snapshot`]
/// batches.
pub async fn copy_tables(
    params: &ConnParams,
    config: &SourceConfig,
    snapshot_name: &str,
    tables: Vec<PublishedTable>,
    consistent_point: Lsn,
    events: &mpsc::Sender<EventBatch>,
    progress: &SnapshotProgress,
) -> Result<(), SnapshotError> {
    let chunk_bytes = config.snapshot_chunk_size.0;
    let mut sessions = Vec::new();
    for _ in 0..config.snapshot_workers.max(1) {
        let client =
            connect_sql(params, &format!("{}_snapshot", config.application_name())).await?;
        client
            .batch_execute(&format!(
                "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT {}",
                quote_literal(snapshot_name)
            ))
            .await
            .map_err(|source| SnapshotError::Copy {
                table: "(snapshot import)".into(),
                source,
            })?;
        sessions.push(client);
    }
    // Plan with the first session: describe tables and split large ones.
    let planning = Instant::now();
    let planner = &sessions[0];
    let mut types = TypeCatalog::new();
    let mut jobs = VecDeque::new();
    let mut planned = Vec::new();
    let block_size: i64 = planner
        .query_one("SELECT current_setting('block_size')::int8", &[])
        .await
        .map_err(|source| SnapshotError::Copy {
            table: "(block_size)".into(),
            source,
        })?
        .get(0);
    progress
        .tables_total
        .store(tables.len() as u64, Ordering::Relaxed);
    // Described in order, with a few queries for up to 10,000 tables.
    let described = describe_tables(planner, &mut types, &tables).await?;
    for (table, described) in tables.into_iter().zip(described) {
        let DescribedTable {
            relation,
            bytes,
            partitioned,
            estimate,
        } = described;
        let relation = Arc::new(relation);
        let pages = bytes.div_ceil(block_size.max(1) as u64);
        let chunk_pages = (chunk_bytes / block_size.max(1) as u64).max(1);
        let ranges: Vec<Option<(u64, u64)>> = if bytes > chunk_bytes {
            (0..pages)
                .step_by(chunk_pages as usize)
                .map(|start| Some((start, start + chunk_pages)))
                .collect()
        } else {
            vec![None]
        };
        // The last range is open-ended, so rows added to new pages before the snapshot are not missed.
        let last = ranges.len() - 1;
        let tally = Arc::new(TableProgress {
            table: table.quoted_name(),
            rows: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            chunks_left: AtomicU64::new(ranges.len() as u64),
            began: std::sync::OnceLock::new(),
            estimate,
            next_report: AtomicU64::new(config.progress_interval.as_millis() as u64),
        });
        planned.push(tally.clone());
        for (i, range) in ranges.into_iter().enumerate() {
            let pages = range.map(|(s, e)| if i == last { (s, u64::MAX) } else { (s, e) });
            jobs.push_back(TableJob {
                relation: relation.clone(),
                table: table.clone(),
                pages,
                partitioned,
                tally: tally.clone(),
            });
        }
    }
    tracing::info!(
        source = %config.name,
        tables = planned.len(),
        chunks = jobs.len(),
        seconds = format!("{:.2}", planning.elapsed().as_secs_f64()),
        "planned the initial copy"
    );
    *progress.tables.lock().unwrap_or_else(|p| p.into_inner()) = planned;
    let queue = Mutex::new(jobs);
    let run = sessions.iter().map(|client| async {
        loop {
            let Some(job) = queue.lock().await.pop_front() else {
                return Ok(());
            };
            copy_job(client, &job, config, consistent_point, events, progress).await?;
        }
    });
    let results = futures_util::future::join_all(run).await;
    for session in &sessions {
        // Read-only: nothing to commit, but end the transaction cleanly.
        let _ = session.batch_execute("COMMIT").await;
    }
    results
        .into_iter()
        .collect::<Result<Vec<()>, SnapshotError>>()?;
    Ok(())
}

/// Logs how far the copy of `table` has come.
fn report_progress(table: &str, tally: &TableProgress) {
    let eta = tally.seconds_left();
    tracing::info!(
        target: COPY_PROGRESS_TARGET,
        table = %table,
        rows = tally.rows(),
        bytes = tally.bytes(),
        rows_per_sec = tally.rows_per_sec() as u64,
        eta_seconds = eta,
        "copying table: {}",
        progress_text(tally.rows(), tally.estimate, eta)
    );
}

/// Seconds left at `rows_per_sec` until `estimate` rows (see
/// [`TableProgress::seconds_left`]).
fn eta_seconds(rows: u64, estimate: Option<u64>, rows_per_sec: f64) -> Option<u64> {
    let total = estimate?;
    (rows > 0 && rows < total && rows_per_sec > 0.0)
        .then(|| ((total - rows) as f64 / rows_per_sec).ceil() as u64)
}

/// `N rows of about M (P%, about S s left) so far`.
fn progress_text(rows: u64, estimate: Option<u64>, eta: Option<u64>) -> String {
    let share = estimate
        .map(|total| {
            let percent = (rows * 100 / total.max(1)).min(99);
            match eta {
                Some(left) => format!(" of about {total} ({percent}%, about {left} s left)"),
                None => format!(" of about {total} ({percent}%)"),
            }
        })
        .unwrap_or_default();
    format!("{rows} rows{share} so far")
}

fn copy_query(job: &TableJob) -> String {
    let columns: Vec<String> = job
        .relation
        .columns
        .iter()
        .map(|c| quote_ident(&c.name))
        .collect();
    let mut conditions = Vec::new();
    if let Some((start, end)) = job.pages {
        conditions.push(format!("ctid >= '({start},0)'::tid"));
        if end != u64::MAX {
            conditions.push(format!("ctid < '({end},0)'::tid"));
        }
    }
    if let Some(filter) = &job.table.row_filter {
        conditions.push(format!("({filter})"));
    }
    let filter = if conditions.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conditions.join(" AND "))
    };
    // A partitioned root (published via the root) is read with its
    // partitions; any other table with ONLY, because inheritance children
    // are published, and copied, on their own.
    let only = if job.partitioned { "" } else { "ONLY " };
    format!(
        "COPY (SELECT {} FROM {only}{}{filter}) TO STDOUT",
        columns.join(", "),
        job.table.quoted_name()
    )
}

async fn copy_job(
    client: &tokio_postgres::Client,
    job: &TableJob,
    config: &SourceConfig,
    consistent_point: Lsn,
    events: &mpsc::Sender<EventBatch>,
    progress: &SnapshotProgress,
) -> Result<(), SnapshotError> {
    let table = job.table.quoted_name();
    job.tally.began.get_or_init(Instant::now);
    let sql = copy_query(job);
    let stream = client
        .copy_out(sql.as_str())
        .await
        .map_err(|source| SnapshotError::Copy {
            table: table.clone(),
            source,
        })?;
    futures_util::pin_mut!(stream);
    // The rows are kept as the COPY text the server wrote (see
    // `walbridge_core::copy_text`); only whole lines go downstream.
    let mut pending = BytesMut::new();
    let send = |text: Bytes| async {
        let rows = CopyText::new(text).map_err(|source| SnapshotError::Malformed {
            table: table.clone(),
            source,
        })?;
        let (n, bytes) = (rows.len() as u64, rows.text().len() as u64);
        events
            .send(vec![SourceEvent::Snapshot(SnapshotBatch {
                relation: job.relation.clone(),
                rows,
                consistent_point,
            })])
            .await
            .map_err(|_| SnapshotError::Closed)?;
        // Counted per batch, not per row: a clock read and four atomic
        // adds per row were a tenth of the copy's CPU in walbridge.
        progress.rows.fetch_add(n, Ordering::Relaxed);
        progress.bytes.fetch_add(bytes, Ordering::Relaxed);
        job.tally.rows.fetch_add(n, Ordering::Relaxed);
        job.tally.bytes.fetch_add(bytes, Ordering::Relaxed);
        if job.tally.report_due(config.progress_interval) {
            report_progress(&table, &job.tally);
        }
        Ok::<(), SnapshotError>(())
    };
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|source| SnapshotError::Copy {
            table: table.clone(),
            source,
        })?;
        // Batches stay within BATCH_BYTES (the log's record size) unless
        // one row is larger. PostgreSQL sends a row per message, so
        // `pending` normally ends at the end of a row.
        if pending.len() + chunk.len() > BATCH_BYTES
            && let Some(end) = memchr::memrchr(b'\n', &pending)
        {
            send(pending.split_to(end + 1).freeze()).await?;
        }
        pending.extend_from_slice(&chunk);
    }
    if !pending.is_empty() {
        send(pending.freeze()).await?;
    }
    if job.tally.chunks_left.fetch_sub(1, Ordering::AcqRel) == 1 {
        progress.tables_done.fetch_add(1, Ordering::Relaxed);
        let secs = job
            .tally
            .elapsed()
            .unwrap_or_default()
            .as_secs_f64()
            .max(0.001);
        let rows = job.tally.rows.load(Ordering::Relaxed);
        let bytes = job.tally.bytes.load(Ordering::Relaxed);
        tracing::info!(
            table = %table,
            rows,
            bytes,
            rows_per_sec = (rows as f64 / secs) as u64,
            mb_per_sec = format!("{:.1}", bytes as f64 / secs / 1e6),
            "snapshot of table finished ({} of {})",
            progress.tables_done.load(Ordering::Relaxed),
            progress.tables_total.load(Ordering::Relaxed)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn copy_progress_says_share_and_time_left_against_the_estimate() {
        assert_eq!(super::eta_seconds(250, Some(1000), 50.0), Some(15));
        assert_eq!(super::eta_seconds(0, Some(1000), 0.0), None);
        assert_eq!(super::eta_seconds(1200, Some(1000), 50.0), None);
        assert_eq!(super::eta_seconds(250, None, 50.0), None);
        assert_eq!(
            super::progress_text(250, Some(1000), Some(15)),
            "250 rows of about 1000 (25%, about 15 s left) so far"
        );
        assert_eq!(
            super::progress_text(1200, Some(1000), None),
            "1200 rows of about 1000 (99%) so far"
        );
        assert_eq!(super::progress_text(7, None, None), "7 rows so far");
    }
}
