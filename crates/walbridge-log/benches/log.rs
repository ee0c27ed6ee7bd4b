//! Log throughput on the machine's disk: appends with fsync `always` for
//! 1 KB and 64 KB transaction records, a sequential read that decodes every
//! record, and the time to open (recover) a 1 GB log.
//!
//! `cargo bench -p walbridge-log --bench log` (set `WALBRIDGE_BENCH_DIR` to
//! measure another file system; the default is the system temp directory).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use walbridge_core::{
    Change, Column, Datum, Lsn, PgTimestamp, Relation, ReplicaIdentity, TransactionInfo, ValueKind,
};
use walbridge_log::{Log, LogOptions, RecordEncoder};

/// A transaction record of about `size` bytes: inserts of ~100-byte rows.
fn record(size: usize) -> Vec<u8> {
    let relation = Arc::new(Relation {
        id: 1,
        schema: "public".into(),
        name: "orders".into(),
        replica_identity: ReplicaIdentity::Default,
        columns: ["id", "customer", "note"]
            .iter()
            .enumerate()
            .map(|(i, name)| Column {
                name: (*name).into(),
                type_oid: if i == 2 { 25 } else { 20 },
                type_modifier: -1,
                type_name: if i == 2 { "text" } else { "int8" }.into(),
                kind: if i == 2 {
                    ValueKind::Text
                } else {
                    ValueKind::Int8
                },
                is_key: i == 0,
                attnum: 0,
                not_null: false,
                missing_value: None,
            })
            .collect(),
        partition_root: None,
        primary_key: Vec::new(),
    });
    let info = TransactionInfo {
        xid: 7,
        commit_lsn: Lsn(100),
        end_lsn: Lsn(108),
        commit_time: PgTimestamp(0),
        origin: None,
        gid: None,
        for_sink: None,
    };
    let rows = (size / 110).max(1);
    let changes: Vec<Change> = (0..rows)
        .map(|i| Change::Insert {
            lsn: Lsn(i as u64),
            relation: relation.clone(),
            new: vec![
                Datum::Text(Bytes::from(format!("{}", 1_000_000 + i))),
                Datum::Text(Bytes::from_static(b"424242")),
                Datum::Text(Bytes::from(vec![b'n'; 80])),
            ],
        })
        .collect();
    RecordEncoder::default().transaction(&info, true, true, &changes)
}

fn bench_dir() -> tempfile::TempDir {
    match std::env::var_os("WALBRIDGE_BENCH_DIR") {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .unwrap_or_else(|e| panic!("bench directory: {e}"))
}

fn mb(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / elapsed.as_secs_f64()
}

/// Appends `total` bytes of `size`-byte records and waits until all are
/// durable (or, for a unit never finished, until the writer closed).
async fn append(dir: &std::path::Path, size: usize, total: u64, unit_end: bool) -> (u64, Duration) {
    let payload = record(size);
    let count = (total / payload.len() as u64).max(1);
    let (log, writer, _) =
        Log::open(dir, LogOptions::default()).unwrap_or_else(|e| panic!("open: {e}"));
    let first = log.head().next_seq;
    let start = Instant::now();
    for i in 0..count {
        writer
            .append(payload.clone(), Lsn(i + 1), unit_end)
            .await
            .unwrap_or_else(|e| panic!("append: {e}"));
    }
    if unit_end {
        let mut head = log.subscribe();
        let _ = head.wait_for(|h| h.next_seq >= first + count).await;
    }
    writer
        .close()
        .await
        .unwrap_or_else(|e| panic!("close: {e}"));
    (count, start.elapsed())
}

#[tokio::main]
async fn main() {
    for (label, size, total) in [
        ("1 KB", 1024, 256u64 << 20),
        ("64 KB", 64 * 1024, 1u64 << 30),
    ] {
        let dir = bench_dir();
        let bytes = record(size).len() as u64;
        let (count, elapsed) = append(dir.path(), size, total, true).await;
        println!(
            "append {label} records, fsync always: {count} records in {:.2} s = {:.0} appends/s, {:.0} MB/s",
            elapsed.as_secs_f64(),
            count as f64 / elapsed.as_secs_f64(),
            mb(count * bytes, elapsed)
        );
        if size == 64 * 1024 {
            // The 1 GB log: read it back, then reopen it as after a crash.
            let (log, writer, _) = Log::open(dir.path(), LogOptions::default())
                .unwrap_or_else(|e| panic!("open: {e}"));
            let start = Instant::now();
            let mut reader = log.reader(0).unwrap_or_else(|e| panic!("reader: {e}"));
            let mut read = 0u64;
            let mut records = 0u64;
            while let Some(r) = reader.try_next().unwrap_or_else(|e| panic!("read: {e}")) {
                read += r.size;
                records += 1;
            }
            let elapsed = start.elapsed();
            println!(
                "sequential read + decode: {records} records, {:.0} MB in {:.2} s = {:.0} MB/s",
                read as f64 / (1 << 20) as f64,
                elapsed.as_secs_f64(),
                mb(read, elapsed)
            );
            writer
                .close()
                .await
                .unwrap_or_else(|e| panic!("close: {e}"));
            let start = Instant::now();
            let (log, writer, recovery) = Log::open(dir.path(), LogOptions::default())
                .unwrap_or_else(|e| panic!("open: {e}"));
            let elapsed = start.elapsed();
            println!(
                "open of a {:.0} MB log after a clean stop: {:.3} s (only the last segment is scanned; {} bytes cut)",
                log.size() as f64 / (1 << 20) as f64,
                elapsed.as_secs_f64(),
                recovery.truncated_bytes
            );
            writer
                .close()
                .await
                .unwrap_or_else(|e| panic!("close: {e}"));
        }
    }
    // The worst case: a crash while 1 GB of one transaction (or an initial
    // copy) was in the log but not its end. Recovery scans back through
    // every segment of the unit and removes them.
    let dir = bench_dir();
    append(dir.path(), 64 * 1024, 1 << 30, false).await;
    let start = Instant::now();
    let (_, writer, recovery) =
        Log::open(dir.path(), LogOptions::default()).unwrap_or_else(|e| panic!("open: {e}"));
    let elapsed = start.elapsed();
    println!(
        "recovery of a 1 GB log ending in an unfinished 1 GB unit: {:.2} s, {:.0} MB scanned and removed",
        elapsed.as_secs_f64(),
        recovery.truncated_bytes as f64 / (1 << 20) as f64
    );
    writer
        .close()
        .await
        .unwrap_or_else(|e| panic!("close: {e}"));
}
