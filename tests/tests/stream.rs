//! End to end: snapshot, streaming, clean stop and restart, crash and restart.

use std::time::Duration;

use serde_json::{Value, json};
use walbridge_tests::Cluster;
use walbridge_tests::walbridge::Deployment;

const WAIT: Duration = Duration::from_secs(60);

fn setup(pg: &Cluster) {
    pg.psql("CREATE TABLE items (id int PRIMARY KEY, name text, qty int)");
    pg.psql("INSERT INTO items SELECT g, 'item' || g, g FROM generate_series(1, 5) g");
    pg.psql("CREATE PUBLICATION pub FOR TABLE items");
}

fn ops(lines: &[Value]) -> Vec<String> {
    lines
        .iter()
        .map(|l| l["op"].as_str().unwrap_or("?").to_owned())
        .collect()
}

#[test]
fn snapshot_then_stream_then_clean_stop() {
    let pg = Cluster::start();
    setup(&pg);
    let wb = Deployment::new();
    wb.configure(&pg, "postgres", "pub", "");
    let running = wb.start();
    let lines = wb.wait_for_lines(5, WAIT);
    assert_eq!(ops(&lines), ["r"; 5]);
    assert_eq!(
        lines[0]["after"],
        json!({"id": 1, "name": "item1", "qty": 1})
    );
    assert_eq!(lines[0]["source"]["snapshot"], json!(true));
    assert_eq!(lines[0]["source"]["table"], "items");

    pg.psql("BEGIN; INSERT INTO items VALUES (6, 'six', 6); UPDATE items SET qty = 60 WHERE id = 6; DELETE FROM items WHERE id = 1; COMMIT");
    pg.psql("UPDATE items SET id = 100 WHERE id = 2");
    let lines = wb.wait_for_lines(9, WAIT);
    assert_eq!(ops(&lines[5..]), ["c", "u", "d", "u"]);
    let (insert, update, delete, key_change) = (&lines[5], &lines[6], &lines[7], &lines[8]);
    assert_eq!(insert["after"], json!({"id": 6, "name": "six", "qty": 6}));
    assert_eq!(update["after"]["qty"], 60);
    assert_eq!(
        update["before"],
        Value::Null,
        "DEFAULT identity, key unchanged: no old row"
    );
    assert_eq!(delete["before"], json!({"id": 1}));
    assert_eq!(key_change["before"], json!({"id": 2}));
    assert_eq!(key_change["after"]["id"], 100);
    // One transaction: same xid and commit LSN, increasing change LSNs.
    assert_eq!(insert["source"]["xid"], delete["source"]["xid"]);
    assert_eq!(
        insert["source"]["commit_lsn"],
        delete["source"]["commit_lsn"]
    );
    assert_ne!(insert["source"]["xid"], key_change["source"]["xid"]);
    assert!(insert["source"]["ts_us"].as_i64().unwrap_or(0) > 1_600_000_000_000_000);

    // The publisher sees walbridge under the source's name (for synchronous_standby_names).
    assert_eq!(
        pg.wait_for(
            "SELECT count(*) FROM pg_stat_replication WHERE application_name = 'src'",
            "1",
            WAIT
        ),
        "1"
    );

    let status = running.stop(WAIT);
    assert!(status.success(), "exit status {status}; log:\n{}", wb.log());
    // The final status update confirmed everything written.
    let last_commit = key_change["source"]["commit_lsn"]
        .as_str()
        .unwrap_or("0/0")
        .to_owned();
    assert_eq!(
        pg.psql(&format!("SELECT confirmed_flush_lsn > '{last_commit}' FROM pg_replication_slots WHERE slot_name = 'walbridge_src'")),
        "t"
    );
}

#[test]
fn restart_continues_without_copying_again() {
    let pg = Cluster::start();
    setup(&pg);
    let wb = Deployment::new();
    wb.configure(&pg, "postgres", "pub", "");
    let running = wb.start();
    wb.wait_for_lines(5, WAIT);
    assert!(running.stop(WAIT).success());

    pg.psql("INSERT INTO items VALUES (7, 'while down', 7)");
    let running = wb.start();
    let lines = wb.wait_for_lines(6, WAIT);
    pg.psql("INSERT INTO items VALUES (8, 'after restart', 8)");
    let lines_after = wb.wait_for_lines(7, WAIT);
    assert!(running.stop(WAIT).success());
    assert_eq!(
        ops(&lines_after),
        ["r", "r", "r", "r", "r", "c", "c"],
        "log:\n{}",
        wb.log()
    );
    assert_eq!(lines[5]["after"]["name"], "while down");
    assert_eq!(lines_after[6]["after"]["name"], "after restart");
}

#[test]
fn crash_and_restart_loses_nothing() {
    let pg = Cluster::start();
    setup(&pg);
    let wb = Deployment::new();
    wb.configure(&pg, "postgres", "pub", "");
    let running = wb.start();
    wb.wait_for_lines(5, WAIT);
    for i in 10..30 {
        pg.psql(&format!("INSERT INTO items VALUES ({i}, 'x', {i})"));
    }
    running.kill();
    for i in 30..40 {
        pg.psql(&format!("INSERT INTO items VALUES ({i}, 'y', {i})"));
    }
    let running = wb.start();
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let ids: std::collections::BTreeSet<i64> = wb
            .lines()
            .iter()
            .filter(|l| l["op"] == "c")
            .filter_map(|l| l["after"]["id"].as_i64())
            .collect();
        if ids == (10..40).collect() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "missing inserts after restart: have {ids:?}; log:\n{}",
            wb.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Snapshot rows were not copied again.
    assert_eq!(wb.lines().iter().filter(|l| l["op"] == "r").count(), 5);
    assert!(running.stop(WAIT).success());
}

#[test]
fn drop_removes_slot_and_state() {
    let pg = Cluster::start();
    setup(&pg);
    let wb = Deployment::new();
    wb.configure(&pg, "postgres", "pub", "");
    let running = wb.start();
    wb.wait_for_lines(5, WAIT);
    assert!(running.stop(WAIT).success());
    let out = wb.command(&["drop"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(pg.psql("SELECT count(*) FROM pg_replication_slots"), "0");
    // Starting again copies the tables again into a fresh slot.
    let running = wb.start();
    let lines = wb.wait_for_lines(10, WAIT);
    assert_eq!(ops(&lines), ["r"; 10]);
    assert!(running.stop(WAIT).success());
}
