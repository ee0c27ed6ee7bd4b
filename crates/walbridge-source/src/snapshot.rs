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
use walbridge_core::{Datum, EventBatch, Lsn, Relation, Row, SnapshotBatch, SourceEvent};

use crate::catalog::{CatalogError, PublishedTable, TypeCatalog, describe_table};
use crate::wire::{ConnParams, ConnectionError, connect_sql};
use walbridge_pg::{quote_ident, quote_literal};

/// Rows per batch handed downstream.
const BATCH_ROWS: usize = 1000;
/// Bytes per batch handed downstream.
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
    #[error("snapshot of {table}: malformed COPY row: {reason}")]
    Malformed {
        /// The table.
        table: String,
        /// What was wrong.
        reason: String,
    },
    /// Downstream went away.
    #[error("snapshot output closed")]
    Closed,
}

/// Counters of a running snapshot, for logs and metrics.
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
}

struct TableJob {
    relation: Arc<Relation>,
    table: PublishedTable,
    /// `(first page, end page)` or the whole table.
    pages: Option<(u64, u64)>,
    /// A partitioned table, read with its partitions.
    partitioned: bool,
    /// Shared by the table's chunks: rows, bytes, chunks left, start time.
    tally: Arc<TableTally>,
}

struct TableTally {
    rows: AtomicU64,
    bytes: AtomicU64,
    chunks_left: AtomicU64,
    started: Instant,
}

/// Copies `tables` as of `snapshot_name` with `workers` connections and
/// sends their rows downstream as [`SourceEvent::Snapshot`] batches.
#[allow(clippy::too_many_arguments)]
pub async fn copy_tables(
    params: &ConnParams,
    application_name: &str,
    snapshot_name: &str,
    tables: Vec<PublishedTable>,
    workers: usize,
    chunk_bytes: u64,
    consistent_point: Lsn,
    events: &mpsc::Sender<EventBatch>,
    progress: &SnapshotProgress,
) -> Result<(), SnapshotError> {
    let mut sessions = Vec::new();
    for _ in 0..workers.max(1) {
        let client = connect_sql(params, &format!("{application_name}_snapshot")).await?;
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
    let planner = &sessions[0];
    let mut types = TypeCatalog::new();
    let mut jobs = VecDeque::new();
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
    for table in tables {
        let relation = Arc::new(describe_table(planner, &mut types, &table).await?);
        let class = planner
            .query_one(
                "SELECT pg_relation_size(oid), relkind = 'p' FROM pg_class WHERE oid = $1",
                &[&table.oid],
            )
            .await
            .map_err(|source| SnapshotError::Copy {
                table: table.quoted_name(),
                source,
            })?;
        let (size, partitioned): (i64, bool) = (class.get(0), class.get(1));
        let pages = (size.max(0) as u64).div_ceil(block_size.max(1) as u64);
        let chunk_pages = (chunk_bytes / block_size.max(1) as u64).max(1);
        let ranges: Vec<Option<(u64, u64)>> = if size as u64 > chunk_bytes {
            (0..pages)
                .step_by(chunk_pages as usize)
                .map(|start| Some((start, start + chunk_pages)))
                .collect()
        } else {
            vec![None]
        };
        // The last range is open-ended, so rows added to new pages before the snapshot are not missed.
        let last = ranges.len() - 1;
        let tally = Arc::new(TableTally {
            rows: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            chunks_left: AtomicU64::new(ranges.len() as u64),
            started: Instant::now(),
        });
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
    let queue = Mutex::new(jobs);
    let run = sessions.iter().map(|client| async {
        loop {
            let Some(job) = queue.lock().await.pop_front() else {
                return Ok(());
            };
            copy_job(client, &job, consistent_point, events, progress).await?;
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
    consistent_point: Lsn,
    events: &mpsc::Sender<EventBatch>,
    progress: &SnapshotProgress,
) -> Result<(), SnapshotError> {
    let table = job.table.quoted_name();
    let sql = copy_query(job);
    let stream = client
        .copy_out(sql.as_str())
        .await
        .map_err(|source| SnapshotError::Copy {
            table: table.clone(),
            source,
        })?;
    futures_util::pin_mut!(stream);
    let mut pending = BytesMut::new();
    let mut batch: Vec<Row> = Vec::new();
    let mut batch_bytes = 0;
    let ncols = job.relation.columns.len();
    let send = |rows: Vec<Row>| async {
        events
            .send(vec![SourceEvent::Snapshot(SnapshotBatch {
                relation: job.relation.clone(),
                rows,
                consistent_point,
            })])
            .await
            .map_err(|_| SnapshotError::Closed)
    };
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|source| SnapshotError::Copy {
            table: table.clone(),
            source,
        })?;
        progress
            .bytes
            .fetch_add(chunk.len() as u64, Ordering::Relaxed);
        job.tally
            .bytes
            .fetch_add(chunk.len() as u64, Ordering::Relaxed);
        // PostgreSQL sends one row per CopyData, so a chunk is normally one whole line.
        let lines = if pending.is_empty() && chunk.ends_with(b"\n") {
            chunk
        } else {
            pending.extend_from_slice(&chunk);
            match pending.iter().rposition(|&b| b == b'\n') {
                Some(end) => pending.split_to(end + 1).freeze(),
                None => continue,
            }
        };
        for line in split_lines(&lines) {
            let row = parse_copy_line(line, ncols).map_err(|reason| SnapshotError::Malformed {
                table: table.clone(),
                reason,
            })?;
            batch_bytes += row.iter().map(Datum::len).sum::<usize>();
            batch.push(row);
            if batch.len() >= BATCH_ROWS || batch_bytes >= BATCH_BYTES {
                let n = batch.len() as u64;
                send(std::mem::take(&mut batch)).await?;
                batch_bytes = 0;
                progress.rows.fetch_add(n, Ordering::Relaxed);
                job.tally.rows.fetch_add(n, Ordering::Relaxed);
            }
        }
    }
    if !pending.is_empty() {
        return Err(SnapshotError::Malformed {
            table,
            reason: "COPY output ended inside a row".into(),
        });
    }
    if !batch.is_empty() {
        let n = batch.len() as u64;
        send(batch).await?;
        progress.rows.fetch_add(n, Ordering::Relaxed);
        job.tally.rows.fetch_add(n, Ordering::Relaxed);
    }
    if job.tally.chunks_left.fetch_sub(1, Ordering::AcqRel) == 1 {
        progress.tables_done.fetch_add(1, Ordering::Relaxed);
        let secs = job.tally.started.elapsed().as_secs_f64().max(0.001);
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

fn split_lines(lines: &Bytes) -> impl Iterator<Item = Bytes> + '_ {
    let mut start = 0;
    std::iter::from_fn(move || {
        let end = lines[start..].iter().position(|&b| b == b'\n')? + start;
        let line = lines.slice(start..end);
        start = end + 1;
        Some(line)
    })
}

/// Parses one line of COPY text format (without its newline): tab-separated
/// fields, `\N` for NULL, backslash escapes. Fields without escapes share
/// the line's memory.
pub fn parse_copy_line(line: Bytes, expected: usize) -> Result<Row, String> {
    let mut row = Vec::with_capacity(expected);
    let mut start = 0;
    loop {
        let end = line[start..]
            .iter()
            .position(|&b| b == b'\t')
            .map_or(line.len(), |p| p + start);
        let field = line.slice(start..end);
        row.push(if &field[..] == b"\\N" {
            Datum::Null
        } else if field.contains(&b'\\') {
            Datum::Text(unescape(&field)?)
        } else {
            Datum::Text(field)
        });
        if end == line.len() {
            break;
        }
        start = end + 1;
    }
    if row.len() != expected {
        return Err(format!("{} fields, expected {expected}", row.len()));
    }
    Ok(row)
}

fn unescape(field: &[u8]) -> Result<Bytes, String> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let b = field[i];
        if b != b'\\' {
            out.push(b);
            i += 1;
            continue;
        }
        let Some(&next) = field.get(i + 1) else {
            return Err("trailing backslash".into());
        };
        i += 2;
        match next {
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(11),
            b'x' => {
                let digits: Vec<u8> = field[i..]
                    .iter()
                    .take(2)
                    .take_while(|c| c.is_ascii_hexdigit())
                    .copied()
                    .collect();
                if digits.is_empty() {
                    out.push(b'x');
                } else {
                    i += digits.len();
                    let text = std::str::from_utf8(&digits).map_err(|e| e.to_string())?;
                    out.push(u8::from_str_radix(text, 16).map_err(|e| e.to_string())?);
                }
            }
            b'0'..=b'7' => {
                let mut value = u32::from(next - b'0');
                let mut n = 1;
                while n < 3 && field.get(i).is_some_and(|c| (b'0'..=b'7').contains(c)) {
                    value = value * 8 + u32::from(field[i] - b'0');
                    i += 1;
                    n += 1;
                }
                out.push((value & 0xff) as u8);
            }
            other => out.push(other),
        }
    }
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Datum {
        Datum::Text(Bytes::copy_from_slice(s.as_bytes()))
    }

    #[test]
    fn parses_copy_text_rows() {
        let row = parse_copy_line(Bytes::from_static(b"1\t\\N\ta\\tb\\\\c\\nd\t\\101\\x42"), 4)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            row,
            vec![text("1"), Datum::Null, text("a\tb\\c\nd"), text("AB")]
        );
        assert!(parse_copy_line(Bytes::from_static(b"1\t2"), 3).is_err());
        assert_eq!(
            parse_copy_line(Bytes::from_static(b""), 1),
            Ok(vec![text("")])
        );
    }
}
