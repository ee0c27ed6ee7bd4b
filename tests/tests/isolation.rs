//! One sink's trouble is nobody else's: with a sink blocked for good, the
//! other sink keeps up and the publisher's slot keeps advancing; a failing
//! sink is retried and, once its destination works again, catches up from
//! its cursor.

use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

use walbridge_tests::Cluster;
use walbridge_tests::walbridge::{Deployment, Running, ids_with_op};

const WAIT: Duration = Duration::from_secs(300);
/// WAL generated while the sink is blocked.
const WAL_MB: u64 = 500;
/// Of which changes to the published table.
const PUBLISHED_MB: u64 = 100;

#[test]
fn a_blocked_sink_stalls_neither_the_other_sink_nor_the_slot() {
    let pg = Cluster::builder().setting("max_wal_size", "4GB").start();
    pg.psql(
        "CREATE TABLE t (id bigint PRIMARY KEY, pad text);
         CREATE TABLE other (pad text);
         CREATE PUBLICATION pub FOR TABLE t",
    );
    let wb = Deployment::new();
    let _stuck = configure_with_stuck_sink(&wb, &pg, "");
    let running = wb.start();
    pg.wait_for_streaming(WAIT);

    let lag = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint FROM pg_replication_slots WHERE slot_name = 'walbridge_src'";
    let start = pg.psql("SELECT pg_current_wal_lsn()");
    let generated_sql = format!("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '{start}')::bigint");
    let mut next_id = 0;
    let mut worst_lag = 0i64;
    let mut generated = 0i64;
    let mut chunk = 0;
    while generated < (WAL_MB as i64) << 20 {
        // About 10 MB of WAL per chunk; one chunk in WAL_MB / PUBLISHED_MB is published.
        if chunk % (WAL_MB / PUBLISHED_MB) == 0 {
            let rows = 10_000;
            pg.psql(&format!(
                "INSERT INTO t SELECT g, repeat('p', 900) FROM generate_series({next_id}, {}) g",
                next_id + rows - 1
            ));
            next_id += rows;
        } else {
            pg.psql("INSERT INTO other SELECT repeat('o', 900) FROM generate_series(1, 10000)");
        }
        chunk += 1;
        let current: i64 = pg.psql(lag).parse().unwrap_or_else(|e| panic!("lag: {e}"));
        worst_lag = worst_lag.max(current);
        generated = pg
            .psql(&generated_sql)
            .parse()
            .unwrap_or_else(|e| panic!("{e}"));
    }

    eprintln!("worst slot lag: {worst_lag} bytes while {generated} bytes of WAL were written");
    // The other sink has every published row.
    let lines = wb.wait_for_lines(next_id as usize, WAIT);
    assert_eq!(
        ids_with_op(&lines, "c"),
        (0..next_id as i64).collect::<Vec<_>>()
    );
    // The slot kept advancing all along, and catches up at the end.
    let caught_up = pg.wait_for(&format!("SELECT ({lag}) < 1024 * 1024"), "t", WAIT);
    assert_eq!(
        caught_up,
        "t",
        "the slot does not catch up; log:\n{}",
        wb.log()
    );
    assert!(
        worst_lag < 128 << 20,
        "the slot fell {worst_lag} bytes behind while {generated} bytes of WAL were written; log:\n{}",
        wb.log()
    );
    // Stopping does not hang on the blocked sink.
    let status = running.stop(Duration::from_secs(60));
    assert!(status.success(), "log:\n{}", wb.log());
}

#[test]
fn a_failing_sink_is_retried_and_catches_up_from_its_cursor() {
    let pg = Cluster::start();
    pg.psql("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t");
    let wb = Deployment::new();
    // Writes to /dev/full fail (ENOSPC) until the link points at a real file.
    let link = wb.path().join("flaky.jsonl");
    std::os::unix::fs::symlink("/dev/full", &link).unwrap_or_else(|e| panic!("{e}"));
    wb.write_config(&format!(
        "data_dir = \"{data}\"\n\n[[source]]\nname = \"src\"\nconnection = \"{conn}\"\npublications = [\"pub\"]\ncopy_data = false\n\n\
         [[sink]]\nname = \"flaky\"\ntype = \"jsonl\"\npath = \"{link}\"\n\n\
         [[sink]]\nname = \"out\"\ntype = \"jsonl\"\npath = \"{out}\"\n",
        data = wb.path().join("data").display(),
        conn = pg.connstr("postgres", "postgres"),
        link = link.display(),
        out = wb.output_path().display(),
    ));
    let running = wb.start();
    pg.wait_for_streaming(WAIT);
    pg.psql("INSERT INTO t SELECT generate_series(1, 100)");
    let lines = wb.wait_for_lines(100, WAIT);
    assert_eq!(ids_with_op(&lines, "c"), (1..=100).collect::<Vec<_>>());
    let deadline = std::time::Instant::now() + WAIT;
    while !wb.log().contains("retrying in") {
        assert!(
            std::time::Instant::now() < deadline,
            "no retry logged:\n{}",
            wb.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        wb.log().contains("No space left on device"),
        "the cause is shown:\n{}",
        wb.log()
    );

    let recovered = wb.path().join("recovered.jsonl");
    std::fs::remove_file(&link).unwrap_or_else(|e| panic!("{e}"));
    std::os::unix::fs::symlink(&recovered, &link).unwrap_or_else(|e| panic!("{e}"));
    pg.psql("INSERT INTO t SELECT generate_series(101, 150)");
    let ids = |path: &std::path::Path| -> Vec<i64> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v["after"]["id"].as_i64())
            .collect()
    };
    while ids(&recovered).len() < 150 {
        assert!(
            std::time::Instant::now() < deadline,
            "the sink did not catch up; log:\n{}",
            wb.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(running.stop(WAIT).success(), "log:\n{}", wb.log());
    assert_eq!(ids(&recovered), (1..=150).collect::<Vec<_>>());
    assert_eq!(ids_with_op(&wb.lines(), "c"), (1..=150).collect::<Vec<_>>());
}

/// A FIFO nobody reads: a sink writing to it blocks once the pipe is full.
/// The returned file holds the read end open (without reading), so the
/// sink can open the write end; keep it alive.
fn stuck_fifo(wb: &Deployment) -> (std::path::PathBuf, std::fs::File) {
    let fifo = wb.path().join("stuck.fifo");
    let path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes())
        .unwrap_or_else(|e| panic!("{e}"));
    // SAFETY: mkfifo(3) with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    let reader = std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap_or_else(|e| panic!("open fifo: {e}"));
    (fifo, reader)
}

/// Configures source `src` (publication `pub`, no copy) with two sinks:
/// `stuck`, blocked for good, and `out`, the deployment's output file;
/// `log` is the `[log]` section's body.
fn configure_with_stuck_sink(wb: &Deployment, pg: &Cluster, log: &str) -> std::fs::File {
    let (fifo, reader) = stuck_fifo(wb);
    wb.write_config(&format!(
        "data_dir = \"{data}\"\n\n[log]\n{log}\n\n[[source]]\nname = \"src\"\nconnection = \"{conn}\"\npublications = [\"pub\"]\ncopy_data = false\nstatus_interval = 1\n\n\
         [[sink]]\nname = \"stuck\"\ntype = \"jsonl\"\npath = \"{fifo}\"\n\n\
         [[sink]]\nname = \"out\"\ntype = \"jsonl\"\npath = \"{out}\"\n",
        data = wb.path().join("data").display(),
        conn = pg.connstr("postgres", "postgres"),
        fifo = fifo.display(),
        out = wb.output_path().display(),
    ));
    reader
}

/// Starts walbridge with a stuck sink and a 1 MiB log (`when_full` as
/// given), and writes 10 MB of published rows (ids 0..10,000).
fn ten_mb_past_a_stuck_sink(when_full: &str) -> (Cluster, Deployment, std::fs::File, Running) {
    let pg = Cluster::start();
    pg.psql("CREATE TABLE t (id bigint PRIMARY KEY, pad text); CREATE PUBLICATION pub FOR TABLE t");
    let wb = Deployment::new();
    let stuck = configure_with_stuck_sink(
        &wb,
        &pg,
        &format!("segment_size = \"256kB\"\nmax_size = \"1MiB\"\nwhen_full = \"{when_full}\""),
    );
    let running = wb.start();
    pg.wait_for_streaming(WAIT);
    for chunk in 0..10 {
        insert_rows(&pg, chunk * 1000, 1000);
    }
    (pg, wb, stuck, running)
}

/// Inserts `rows` rows of ~1 kB into `t`, ids from `from`.
fn insert_rows(pg: &Cluster, from: i64, rows: i64) {
    pg.psql(&format!(
        "INSERT INTO t SELECT g, repeat('p', 900) FROM generate_series({from}, {}) g",
        from + rows - 1
    ));
}

#[test]
fn at_max_size_drop_sink_gives_up_on_the_stuck_sink_and_the_rest_goes_on() {
    let (pg, wb, _stuck, running) = ten_mb_past_a_stuck_sink("drop_sink");
    let lines = wb.wait_for_lines(10_000, WAIT);
    assert_eq!(ids_with_op(&lines, "c"), (0..10_000).collect::<Vec<_>>());
    assert!(
        wb.log()
            .contains("dropping the sink that is furthest behind")
            && wb.log().contains("cursor=stuck"),
        "the drop is reported:\n{}",
        wb.log()
    );
    // 10 MB went through a log that never held much more than 1 MiB.
    assert!(
        wb.log_bytes() <= 1536 << 10,
        "log holds {} bytes",
        wb.log_bytes()
    );
    let caught_up = pg.wait_for(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn) < 1024 * 1024 FROM pg_replication_slots WHERE slot_name = 'walbridge_src'",
        "t",
        WAIT,
    );
    assert_eq!(caught_up, "t");
    running.kill();
}

#[test]
fn at_max_size_block_stops_reading_and_the_slot_retains_the_wal() {
    let (pg, wb, _stuck, running) = ten_mb_past_a_stuck_sink("block");
    let deadline = std::time::Instant::now() + WAIT;
    while !wb.log().contains("the log is at max_size") {
        assert!(
            std::time::Instant::now() < deadline,
            "no blocking reported:\n{}",
            wb.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(2));
    // The log stays bounded; what does not fit stays in the publisher's WAL.
    assert!(
        wb.log_bytes() <= (1536 << 10) + (2 << 20),
        "log holds {} bytes",
        wb.log_bytes()
    );
    let lag: i64 = pg
        .psql("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint FROM pg_replication_slots WHERE slot_name = 'walbridge_src'")
        .parse()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(lag > 4 << 20, "the slot retains the unread WAL: lag {lag}");
    assert!(
        wb.lines().len() < 10_000,
        "the other sink waits too (the source stopped)"
    );
    running.kill();
}

#[test]
fn a_sink_that_cannot_go_on_stops_with_a_clear_error_and_the_rest_goes_on() {
    let pg = Cluster::start();
    pg.psql("CREATE TABLE t (id bigint PRIMARY KEY, pad text); CREATE PUBLICATION pub FOR TABLE t");
    let wb = Deployment::new();
    let config = |sinks: &str| {
        format!(
            "data_dir = \"{data}\"\n\n[log]\nsegment_size = \"64kB\"\n\n[[source]]\nname = \"src\"\nconnection = \"{conn}\"\npublications = [\"pub\"]\ncopy_data = false\n\n\
             [[sink]]\nname = \"a\"\ntype = \"jsonl\"\npath = \"{out}\"\n{sinks}",
            data = wb.path().join("data").display(),
            conn = pg.connstr("postgres", "postgres"),
            out = wb.output_path().display(),
        )
    };
    wb.write_config(&config(""));
    let running = wb.start();
    pg.wait_for_streaming(WAIT);
    insert_rows(&pg, 0, 2000);
    wb.wait_for_lines(2000, WAIT);
    assert!(running.stop(WAIT).success());
    // Sink `b` comes with a cursor at the log's first record, which
    // retention removed long ago (sink `a` read it).
    let cursors = wb.path().join("data/cursors");
    let a: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(cursors.join("a.json")).unwrap_or_else(|e| panic!("{e}")),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let log_id = a["positions"]["src"]["log"].clone();
    std::fs::write(
        cursors.join("b.json"),
        serde_json::json!({ "positions": { "src": { "log": log_id, "next": 0 } } }).to_string(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let b_out = wb.path().join("b.jsonl");
    wb.write_config(&config(&format!(
        "\n[[sink]]\nname = \"b\"\ntype = \"jsonl\"\npath = \"{}\"\n",
        b_out.display()
    )));
    let running = wb.start();
    pg.wait_for_streaming(WAIT);
    insert_rows(&pg, 2000, 100);
    let lines = wb.wait_for_lines(2100, WAIT);
    assert_eq!(ids_with_op(&lines, "c"), (0..2100).collect::<Vec<_>>());
    assert!(
        wb.log().contains("sink `b`") && wb.log().contains("no longer in"),
        "the sink's failure is explained:\n{}",
        wb.log()
    );
    assert_eq!(std::fs::read_to_string(&b_out).unwrap_or_default(), "");
    // The failure is the run's outcome once it stops.
    let status = running.stop(WAIT);
    assert_eq!(status.code(), Some(1), "log:\n{}", wb.log());
    let last = wb.log().lines().last().unwrap_or_default().to_owned();
    assert!(
        last.starts_with("walbridge: ") && last.contains("sink `b`"),
        "{last}"
    );
}
