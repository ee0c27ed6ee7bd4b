//! The snapshot is consistent with the stream: under heavy concurrent
//! writes, every row committed before the slot's consistent point arrives
//! once in the snapshot and every later change once in the stream.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use walbridge_tests::Cluster;
use walbridge_tests::fixtures::replay_image;
use walbridge_tests::walbridge::Deployment;

const WAIT: Duration = Duration::from_secs(120);

#[test]
fn parallel_chunked_snapshot_under_concurrent_writes_matches_the_publisher() {
    let pg = Cluster::start();
    pg.psql("CREATE TABLE acc (id int PRIMARY KEY, v int NOT NULL, pad text)");
    pg.psql("CREATE TABLE small (id int PRIMARY KEY, v int NOT NULL)");
    pg.psql("INSERT INTO acc SELECT g, 0, repeat('p', 200) FROM generate_series(1, 100000) g");
    pg.psql("INSERT INTO small SELECT g, 0 FROM generate_series(1, 100) g");
    pg.psql("CREATE PUBLICATION pub FOR TABLE acc, small");

    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let connstr = pg.superuser();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap_or_else(|e| panic!("{e}"));
            runtime.block_on(async move {
                let (client, conn) = tokio_postgres::connect(&connstr, tokio_postgres::NoTls).await.unwrap_or_else(|e| panic!("{e}"));
                tokio::spawn(conn);
                let mut i: i64 = 0;
                while !stop.load(Ordering::Relaxed) || i < 300 {
                    i += 1;
                    let id = (i * 7919) % 100_000 + 1;
                    let sql = format!(
                        "BEGIN; UPDATE acc SET v = v + 1 WHERE id = {id}; INSERT INTO acc VALUES ({}, {i}, 'new'); DELETE FROM acc WHERE id = {}; UPDATE small SET v = {i} WHERE id = {}; COMMIT",
                        100_000 + i,
                        (i * 104_729) % 100_000 + 1,
                        i % 100 + 1
                    );
                    // A delete may hit a row already deleted: that is fine.
                    client.batch_execute(&sql).await.unwrap_or_else(|e| panic!("{e}"));
                }
                i
            })
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let wb = Deployment::new();
    wb.configure(
        &pg,
        "postgres",
        "pub",
        "snapshot_workers = 3\nsnapshot_chunk_size = \"1MiB\"",
    );
    let running = wb.start();
    // Keep writing until the copy has finished and streaming has begun.
    let deadline = Instant::now() + WAIT;
    while !wb.log().contains("streaming changes") {
        assert!(
            Instant::now() < deadline,
            "snapshot did not finish; log:\n{}",
            wb.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let transactions = writer.join().unwrap_or_else(|_| panic!("writer failed"));
    assert!(transactions >= 300);

    let expected: BTreeMap<i64, i64> = pg
        .psql("SELECT id, v FROM acc UNION ALL SELECT -id, v FROM small")
        .lines()
        .filter_map(|l| {
            let (id, v) = l.split_once('|')?;
            Some((id.parse().ok()?, v.parse().ok()?))
        })
        .collect();
    let deadline = Instant::now() + WAIT;
    loop {
        let lines: Vec<Value> = wb
            .lines()
            .into_iter()
            .map(|mut l| {
                // Keep the two tables apart in one image.
                if l["source"]["table"] == "small" {
                    for side in ["before", "after"] {
                        if let Some(id) = l[side]["id"].as_i64() {
                            l[side]["id"] = Value::from(-id);
                        }
                    }
                }
                l
            })
            .collect();
        let image = replay_image(&lines).unwrap_or_else(|e| panic!("{e}"));
        if image == expected {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the output never matched the publisher ({} rows vs {})",
            image.len(),
            expected.len()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(running.stop(WAIT).success());
    let log = wb.log();
    assert!(
        log.contains("snapshot of table finished"),
        "per-table progress is logged:\n{log}"
    );
}

#[test]
fn row_filters_and_column_lists_apply_to_the_copy_and_the_stream() {
    let pg = Cluster::start();
    if pg.major() < 15 {
        return;
    }
    pg.psql("CREATE TABLE t (id int PRIMARY KEY, a text, secret text)");
    pg.psql("INSERT INTO t SELECT g, 'a' || g, 'hidden' FROM generate_series(1, 20) g");
    pg.psql("CREATE PUBLICATION pub FOR TABLE t (id, a) WHERE (id > 10)");
    let wb = Deployment::new();
    wb.configure(&pg, "postgres", "pub", "");
    let running = wb.start();
    wb.wait_for_lines(10, WAIT);
    pg.psql("INSERT INTO t VALUES (-5, 'filtered out', 'x'), (30, 'a30', 'x')");
    let lines = wb.wait_for_lines(11, WAIT);
    assert!(running.stop(WAIT).success());
    let snapshot: Vec<i64> = lines[..10]
        .iter()
        .filter_map(|l| l["after"]["id"].as_i64())
        .collect();
    assert_eq!(snapshot, (11..=20).collect::<Vec<_>>());
    assert!(lines[..10].iter().all(|l| l["op"] == "r"));
    for l in &lines {
        let columns: Vec<&String> = l["after"]
            .as_object()
            .map(|o| o.keys().collect())
            .unwrap_or_default();
        assert_eq!(columns, ["id", "a"], "only the listed columns: {l}");
    }
    assert_eq!(lines[10]["after"]["id"], 30);
}
