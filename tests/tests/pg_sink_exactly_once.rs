//! The postgres sink applies every transaction exactly once however often
//! walbridge is killed while applying, and large transactions pass with
//! bounded memory.

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
