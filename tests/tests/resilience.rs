//! Failures around walbridge: the publisher restarts or fails over to its
//! standby, walbridge dies in the middle of the initial copy, the
//! publication stays idle while the database writes WAL, changes arrive
//! from a replication origin.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use walbridge_tests::fixtures::{WORKLOAD_SCHEMA, assert_replays_to_publisher, transaction};
use walbridge_tests::walbridge::{Deployment, Running, ids_with_op};
use walbridge_tests::{Cluster, ClusterBuilder};

const WAIT: Duration = Duration::from_secs(120);

#[test]
fn reconnects_after_the_publisher_restarts() {
    let pg = Cluster::start();
    pg.psql("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t");
    let wb = Deployment::new();
    wb.configure(&pg, "postgres", "pub", "copy_data = false");
    let running = wb.start();
    pg.wait_for_streaming(WAIT);
    pg.psql("INSERT INTO t SELECT generate_series(1, 10)");
    wb.wait_for_lines(10, WAIT);
    pg.restart();
    pg.psql("INSERT INTO t SELECT generate_series(11, 20)");
    let lines = wb.wait_for_lines(20, WAIT);
    assert!(running.stop(WAIT).success(), "log:\n{}", wb.log());
    assert_eq!(ids_with_op(&lines, "c"), (1..=20).collect::<Vec<_>>());
    assert!(
        wb.log().contains("retrying in"),
        "the reconnect is logged:\n{}",
        wb.log()
    );
}

/// Interrupts the initial copy with `interrupt`, restarts, and checks that
/// the copy is done again completely, with a new slot.
fn interrupted_copy_starts_over(interrupt: impl FnOnce(&Deployment, Running)) {
    let pg = Cluster::start();
    pg.psql("CREATE TABLE t (id int PRIMARY KEY, pad text)");
    pg.psql("INSERT INTO t SELECT g, repeat('x', 500) FROM generate_series(1, 200000) g");
    pg.psql("CREATE PUBLICATION pub FOR TABLE t");
    let wb = Deployment::new();
    wb.configure(&pg, "postgres", "pub", "snapshot_workers = 1");
    let running = wb.start();
    let deadline = Instant::now() + WAIT;
    // Snapshot rows reach the log as they are copied, and the sink once the copy is complete.
    while wb.log_bytes() < 5 << 20 {
        assert!(
            Instant::now() < deadline,
            "no snapshot rows; log:\n{}",
            wb.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    interrupt(&wb, running);
    assert!(
        wb.lines().is_empty(),
        "the copy finished before the interruption; make the table bigger"
    );
    pg.psql("INSERT INTO t VALUES (0, 'after the interruption')");
    let running = wb.start();
    let lines = wb.wait_for_lines(200_001, WAIT);
    std::thread::sleep(Duration::from_millis(500));
    let lines = if wb.lines().len() > lines.len() {
        wb.lines()
    } else {
        lines
    };
    assert!(running.stop(WAIT).success());
    assert!(
        wb.log().contains("did not finish; dropping slot"),
        "log:\n{}",
        wb.log()
    );
    // The sink sees the whole table exactly once, the late row included
    // (it is in the new snapshot): nothing of the abandoned copy.
    let rerun: BTreeSet<i64> = ids_with_op(&lines, "r").into_iter().collect();
    assert_eq!(rerun, (0..=200_000).collect::<BTreeSet<_>>());
    assert_eq!(lines.len(), 200_001);
}

#[test]
fn a_crash_during_the_initial_copy_copies_again_with_a_new_slot() {
    interrupted_copy_starts_over(|_, running| running.kill());
}

#[test]
fn sigterm_during_the_initial_copy_exits_cleanly_and_copies_again() {
    interrupted_copy_starts_over(|wb, running| {
        let status = running.stop(Duration::from_secs(20));
        assert!(status.success(), "exit status {status}; log:\n{}", wb.log());
        assert!(
            wb.log().contains("stopping during the initial copy"),
            "log:\n{}",
            wb.log()
        );
    });
}

/// walbridge streaming a publication of an empty table, `other` left out
/// of it, with status updates every `status_interval` seconds, from a
/// publisher whose `wal_sender_timeout` is `timeout`.
fn streaming_an_idle_publication(
    status_interval: u32,
    timeout: &str,
) -> (Cluster, Deployment, Running) {
    let pg = ClusterBuilder::default()
        .setting("wal_sender_timeout", &format!("'{timeout}'"))
        .start();
    pg.psql("CREATE TABLE published (id int PRIMARY KEY); CREATE TABLE other (pad text); CREATE PUBLICATION pub FOR TABLE published");
    let wb = Deployment::new();
    wb.configure(
        &pg,
        "postgres",
        "pub",
        &format!("copy_data = false\nstatus_interval = {status_interval}"),
    );
    let running = wb.start();
    pg.wait_for_streaming(WAIT);
    (pg, wb, running)
}

#[test]
fn an_idle_publication_does_not_hold_back_the_slot() {
    let (pg, wb, running) = streaming_an_idle_publication(1, "60s");
    // 200 MB of WAL, none of it published.
    for _ in 0..20 {
        pg.psql("INSERT INTO other SELECT repeat('x', 1000) FROM generate_series(1, 10000)");
    }
    let lag = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn) < 1024 * 1024 FROM pg_replication_slots WHERE slot_name = 'walbridge_src'";
    assert_eq!(
        pg.wait_for(lag, "t", WAIT),
        "t",
        "the slot keeps up with unrelated WAL"
    );
    assert!(wb.lines().is_empty());
    assert!(running.stop(WAIT).success());
}

/// An idle stream confirms the WAL's end as soon as a keepalive tells it,
/// as a native subscriber does, not at its next status (every 10 minutes
/// here; the publisher asks for one every 5): the slot's restart point can
/// follow, so a walbridge stopped soon after catching up does not decode
/// that WAL again at its next start.
#[test]
fn an_idle_stream_confirms_the_wal_end_at_once() {
    let (pg, wb, running) = streaming_an_idle_publication(600, "10min");
    pg.psql("INSERT INTO other SELECT repeat('x', 100) FROM generate_series(1, 10000)");
    let end = pg.psql("SELECT pg_current_wal_lsn()");
    let confirmed = format!(
        "SELECT confirmed_flush_lsn >= '{end}' FROM pg_replication_slots WHERE slot_name = 'walbridge_src'"
    );
    assert_eq!(
        pg.wait_for(&confirmed, "t", WAIT),
        "t",
        "log:\n{}",
        wb.log()
    );
    assert!(running.stop(WAIT).success());
}

#[test]
fn heartbeats_move_the_slot_on_a_quiet_database_and_stay_out_of_the_output() {
    let pg = Cluster::start();
    pg.psql("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t");
    let wb = Deployment::new();
    wb.configure(
        &pg,
        "postgres",
        "pub",
        "copy_data = false\nstatus_interval = 1\nheartbeat_interval = 1\nmessages = true",
    );
    let running = wb.start();
    pg.wait_for_streaming(WAIT);
    let start = pg.psql("SELECT pg_current_wal_lsn()");
    let advanced = pg.wait_for(
        &format!("SELECT confirmed_flush_lsn > '{start}' FROM pg_replication_slots WHERE slot_name = 'walbridge_src'"),
        "t",
        Duration::from_secs(20),
    );
    assert_eq!(advanced, "t", "log:\n{}", wb.log());
    // A real message still goes through; the heartbeats do not.
    pg.psql("SELECT pg_logical_emit_message(false, 'app', 'hello')");
    let lines = wb.wait_for_lines(1, WAIT);
    std::thread::sleep(Duration::from_secs(2));
    assert!(running.stop(WAIT).success());
    let lines = if wb.lines().len() > lines.len() {
        wb.lines()
    } else {
        lines
    };
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["message"]["prefix"], "app", "{lines:?}");
}

#[test]
fn origin_none_skips_replicated_changes() {
    let pg = Cluster::start();
    if pg.major() < 16 {
        return;
    }
    pg.psql("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t");
    pg.psql("SELECT pg_replication_origin_create('upstream')");
    let wb = Deployment::new();
    wb.configure(
        &pg,
        "postgres",
        "pub",
        "copy_data = false\norigin = \"none\"",
    );
    let running = wb.start();
    pg.wait_for_streaming(WAIT);
    pg.psql("SELECT pg_replication_origin_session_setup('upstream'); INSERT INTO t VALUES (1); SELECT pg_replication_origin_session_reset()");
    pg.psql("INSERT INTO t VALUES (2)");
    let lines = wb.wait_for_lines(1, WAIT);
    std::thread::sleep(Duration::from_millis(300));
    assert!(running.stop(WAIT).success());
    assert_eq!(ids_with_op(&wb.lines(), "c"), [2], "{lines:?}");
}

/// Transactions `range` of the workload, sent in one `psql` call.
fn workload(pg: &Cluster, range: std::ops::RangeInclusive<u64>) -> u64 {
    let (mut sql, mut changes) = (String::new(), 0);
    for i in range {
        let (text, n) = transaction(i);
        sql += &text;
        changes += n;
    }
    pg.psql(&sql);
    changes
}

#[test]
fn a_failover_slot_goes_on_from_the_promoted_standby_without_loss_repeat_or_copy() {
    let primary = Cluster::builder().at_least(17).start();
    primary.psql(WORKLOAD_SCHEMA);
    primary.psql("INSERT INTO big SELECT -g, 'copied' FROM generate_series(1, 1000) g");
    primary.psql("CREATE PUBLICATION pub FOR ALL TABLES");
    let standby = primary.standby("standby_1", &[("sync_replication_slots", "on")]);
    let wb = Deployment::new();
    wb.configure_connection(
        &format!(
            "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname=postgres sslmode=disable target_session_attrs=read-write",
            primary.port(),
            standby.port()
        ),
        "pub",
        "failover = true",
    );
    let check = walbridge_tests::printed(&wb.command(&["check"]));
    assert!(
        check.contains("synchronized_standby_slots is empty")
            && check.contains("ALTER SYSTEM SET synchronized_standby_slots = 'standby_1'")
            && check.contains("sync_replication_slots = on, hot_standby_feedback = on"),
        "check says what failover needs: {check}"
    );
    // The slot never passes what the standby has received; and every
    // commit waits for the standby, so the failover itself loses nothing
    // and what walbridge delivers can be counted.
    primary.psql("ALTER SYSTEM SET synchronized_standby_slots = 'standby_1'");
    primary.psql("ALTER SYSTEM SET synchronous_standby_names = 'standby'");
    primary.psql("ALTER SYSTEM SET synchronous_commit = on");
    primary.psql("SELECT pg_reload_conf()");
    let check = wb.command(&["check"]);
    assert!(
        check.status.success(),
        "the primary is ready for failover: {}",
        walbridge_tests::printed(&check)
    );
    let running = wb.start();
    let streaming = "SELECT count(*) FROM pg_stat_replication WHERE application_name = 'src' AND state = 'streaming'";
    assert_eq!(primary.wait_for(streaming, "1", WAIT), "1", "{}", wb.log());
    let mut changes = 1000 + workload(&primary, 1..=300);
    assert_eq!(
        standby.wait_for(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'walbridge_src' AND synced AND NOT temporary",
            "1",
            WAIT
        ),
        "1",
        "the standby synchronizes the slot"
    );
    changes += workload(&primary, 301..=600);
    primary.stop();
    standby.promote();
    changes += workload(&standby, 601..=900);
    let lines = wb.wait_for_lines(changes as usize, WAIT);
    assert!(running.stop(WAIT).success(), "log:\n{}", wb.log());
    assert_eq!(lines.len() as u64, changes, "nothing twice");
    let events: Vec<&serde_json::Value> = lines.iter().collect();
    assert_replays_to_publisher(&standby, &events, "after the failover");
    let log = wb.log();
    assert_eq!(
        log.matches("initial copy starting").count(),
        1,
        "no second copy:\n{log}"
    );
    assert!(log.contains("retrying in"), "it reconnected:\n{log}");
}
