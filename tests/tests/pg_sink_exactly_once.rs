//! The postgres sink applies every transaction exactly once however often
//! walbridge is killed while applying, or the log loses what it had not
//! made durable, and large transactions pass with bounded memory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use walbridge_tests::Cluster;
use walbridge_tests::fixtures::{
    Rng, WORKLOAD_SCHEMA, assert_workload_replicated, crash_seed, write_while_killing,
};
use walbridge_tests::walbridge::Deployment;

const WAIT: Duration = Duration::from_secs(300);
const CHUNKS: u64 = 20;
const PER_CHUNK: u64 = 1000;

fn configure(wb: &Deployment, publisher: &Cluster, subscriber: &Cluster, sink_extra: &str) {
    wb.configure_sinks(
        &publisher.superuser(),
        &["pub"],
        "status_interval = 1",
        &format!(
            "[[sink]]\nname = \"replica\"\ntype = \"postgres\"\nconnection = \"{}\"\n{sink_extra}\n",
            subscriber.superuser()
        ),
    );
}

#[test]
fn kill_9_during_heavy_apply_loses_and_repeats_nothing() {
    let publisher = Cluster::builder()
        .setting("logical_decoding_work_mem", "64kB")
        .start();
    let subscriber = Cluster::start();
    publisher.psql(WORKLOAD_SCHEMA);
    subscriber.psql(WORKLOAD_SCHEMA);
    publisher.psql("INSERT INTO big SELECT -s, 'copied' FROM generate_series(1, 20000) s");
    publisher.psql("CREATE PUBLICATION pub FOR TABLE t, g, big");
    let wb = Deployment::new();
    // Small groups, so kills land between and inside many target transactions.
    configure(&wb, &publisher, &subscriber, "batch_changes = 2000");
    let seed = crash_seed();
    let mut rng = Rng::new(seed);
    let running = wb.start();
    publisher.wait_for_streaming(WAIT);
    let killed_mid_apply = std::cell::Cell::new(0);
    let applied = || -> u64 {
        subscriber
            .psql("SELECT count(*) FROM t")
            .parse()
            .unwrap_or(0)
    };
    let (running, kills, written) = write_while_killing(
        &publisher,
        &wb,
        running,
        (CHUNKS, PER_CHUNK),
        &mut rng,
        1500,
        || {
            // Rows of `t` are one per transaction: fewer than written means
            // the kill came while walbridge was still applying.
            let applied = applied();
            let written: u64 = publisher
                .psql("SELECT count(*) FROM t")
                .parse()
                .unwrap_or(0);
            if applied > 0 && applied < written {
                killed_mid_apply.set(killed_mid_apply.get() + 1);
            }
        },
        || killed_mid_apply.get() >= 3,
    );
    let killed_mid_apply = killed_mid_apply.get();
    let context = || {
        format!(
            "seed {seed}, {kills} kills, {written} transactions; walbridge log:\n{}",
            wb.log()
        )
    };
    assert_workload_replicated(&publisher, &subscriber, WAIT, &context);
    let status = running.stop(WAIT);
    assert!(status.success(), "{}", context());
    assert!(kills >= 10);
    assert!(
        killed_mid_apply >= 3,
        "only {killed_mid_apply} kills while applying; {}",
        context()
    );
    // No conflict was ever met: a transaction applied twice would have hit its own rows.
    assert!(!wb.log().contains("conflict on target"), "{}", context());
}

#[test]
fn a_million_row_transaction_is_applied_with_bounded_memory() {
    let publisher = Cluster::builder()
        .setting("logical_decoding_work_mem", "64kB")
        .start();
    let subscriber = Cluster::start();
    let ddl = "CREATE TABLE big (id bigint PRIMARY KEY, pad text)";
    publisher.psql(ddl);
    subscriber.psql(ddl);
    publisher.psql("CREATE PUBLICATION pub FOR TABLE big");
    let wb = Deployment::new();
    configure(&wb, &publisher, &subscriber, "");
    let running = wb.start();
    publisher.wait_for_streaming(WAIT);
    publisher.psql("INSERT INTO big SELECT s, md5(s::text) FROM generate_series(1, 1000000) s");
    let got = subscriber.wait_for("SELECT count(*) FROM big", "1000000", WAIT);
    assert_eq!(got, "1000000", "log:\n{}", wb.log());
    let peak = running.peak_rss();
    eprintln!(
        "peak RSS applying a 1,000,000-row transaction: {} MiB",
        peak >> 20
    );
    assert!(
        publisher.psql("SELECT stream_txns > 0 FROM pg_stat_replication_slots WHERE slot_name = 'walbridge_src'") == "t",
        "the transaction was streamed"
    );
    assert_eq!(
        publisher.table_digest("postgres", "big", "*"),
        subscriber.table_digest("postgres", "big", "*")
    );
    // The transaction is ~100 MB of row data; walbridge holds bounded
    // windows of it (the source's spill threshold, the log writer's queue,
    // the sink's batches in flight), whatever its size.
    assert!(peak < 250 << 20, "peak RSS {} MiB", peak >> 20);
    let status = running.stop(WAIT);
    assert!(status.success(), "exit {status}; log:\n{}", wb.log());
}

/// The directory named `name` somewhere under `dir`.
fn find_dir(dir: &Path, name: &str) -> Option<PathBuf> {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if entry.file_name() == name {
                return Some(path);
            }
            if let Some(found) = find_dir(&path, name) {
                return Some(found);
            }
        }
    }
    None
}

fn copy_dir(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap_or_else(|e| panic!("cp: {e}"));
    assert!(
        status.success(),
        "cp -a {} {}",
        from.display(),
        to.display()
    );
}

/// The sink applies a small transaction as soon as the log has written it,
/// while the log's fsync runs; a machine crash inside that fsync takes the
/// transaction out of the log after the target committed it. The
/// publisher, which the source told only of what the log made durable,
/// sends it again. Played here without a crash: the log and the slot as
/// they were before a transaction are put back after the target applied
/// it (the sink's own files are left as they are, so its cursor is past
/// the log's end too).
#[test]
fn a_transaction_the_log_lost_after_the_target_applied_it_is_passed_over() {
    let publisher = Cluster::start();
    let subscriber = Cluster::start();
    let ddl = "CREATE TABLE t (id int PRIMARY KEY, v text)";
    publisher.psql(ddl);
    subscriber.psql(ddl);
    publisher.psql("CREATE PUBLICATION pub FOR TABLE t");
    let wb = Deployment::new();
    configure(&wb, &publisher, &subscriber, "");
    let applied = |rows: &str| {
        let got = subscriber.wait_for("SELECT string_agg(v, ',' ORDER BY id) FROM t", rows, WAIT);
        assert_eq!(got, rows, "log:\n{}", wb.log());
    };
    let running = wb.start();
    publisher.wait_for_streaming(WAIT);
    publisher.psql("INSERT INTO t VALUES (1, 'kept')");
    applied("kept");
    assert!(running.stop(WAIT).success(), "log:\n{}", wb.log());
    // What the log and the slot hold now.
    let log_dir = find_dir(&wb.path().join("data"), "log").expect("the source's log directory");
    let kept = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    copy_dir(&log_dir, kept.path());
    publisher.psql("SELECT pg_copy_logical_replication_slot('walbridge_src', 'kept')");

    let running = wb.start();
    publisher.wait_for_streaming(WAIT);
    publisher.psql("INSERT INTO t VALUES (2, 'lost')");
    applied("kept,lost");
    assert!(running.stop(WAIT).success(), "log:\n{}", wb.log());
    // The crash: the log without the transaction, the slot not past it.
    std::fs::remove_dir_all(&log_dir).unwrap_or_else(|e| panic!("rm: {e}"));
    copy_dir(&kept.path().join("log"), &log_dir);
    publisher.psql("SELECT pg_drop_replication_slot('walbridge_src')");
    publisher.psql("SELECT pg_copy_logical_replication_slot('kept', 'walbridge_src')");
    publisher.psql("SELECT pg_drop_replication_slot('kept')");

    let seen = wb.log().len();
    let running = wb.start();
    publisher.wait_for_streaming(WAIT);
    publisher.psql("INSERT INTO t VALUES (3, 'after')");
    // Applied again, the transaction would have met its own row and
    // stopped the sink before the next one.
    applied("kept,lost,after");
    let log = wb.log();
    for said in [
        "the target holds a position past the end of the source's log",
        "passing over a transaction the target already holds",
    ] {
        assert!(log[seen..].contains(said), "{said}; log:\n{log}");
    }
    assert!(!log.contains("conflict on target"), "log:\n{log}");
    assert!(running.stop(WAIT).success(), "log:\n{}", wb.log());
    // Once more from the start: nothing new, nothing passed over again.
    let seen = wb.log().len();
    let running = wb.start();
    publisher.wait_for_streaming(WAIT);
    publisher.psql("INSERT INTO t VALUES (4, 'last')");
    applied("kept,lost,after,last");
    assert!(running.stop(WAIT).success(), "log:\n{}", wb.log());
    let log = wb.log();
    assert!(
        !log[seen..].contains("passing over") && !log[seen..].contains("past the end"),
        "log:\n{log}"
    );
}
