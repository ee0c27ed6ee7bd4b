//! When the publisher changes under a running walbridge: a table added to
//! the publication gets its existing rows copied while streaming goes on,
//! consistently (each row once, then its changes; no gap, no duplicate),
//! into every sink.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use walbridge_tests::Cluster;
use walbridge_tests::blocking::Blocking;
use walbridge_tests::fixtures::replay_image;
use walbridge_tests::walbridge::Deployment;

const WAIT: Duration = Duration::from_secs(40);

/// Rows table `b` holds before it enters the publication.
const ROWS: i64 = 100_000;

const SCHEMA: &str = "CREATE TABLE a (id int PRIMARY KEY, v int NOT NULL);
     CREATE TABLE b (id int PRIMARY KEY, v int NOT NULL, pad text)";

/// Writes to `a` and `b` until `stop`, then returns how many transactions
/// it ran: each updates, inserts and deletes rows of `b` across its whole
/// key range, and updates `a`.
fn spawn_writer(connstr: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<i64> {
    std::thread::spawn(move || {
        let client = Blocking::connect(&connstr);
        let mut i: i64 = 0;
        while !stop.load(Ordering::Relaxed) || i < 200 {
            i += 1;
            client.execute(&format!(
                "BEGIN; UPDATE b SET v = v + 1 WHERE id = {}; INSERT INTO b VALUES ({}, {i}, 'new'); DELETE FROM b WHERE id = {}; UPDATE b SET id = {} WHERE id = {}; INSERT INTO a VALUES ({i}, 0) ON CONFLICT (id) DO UPDATE SET v = a.v + 1; COMMIT",
                (i * 7919) % ROWS + 1,
                ROWS + i,
                (i * 104_729) % ROWS + 1,
                // Moves a row to a new key, now and then across chunks.
                -i,
                (i * 3_571) % ROWS + 1,
            ));
        }
        i
    })
}

/// `table` (columns `id`, `v`) on `pg`: id to v.
fn image(pg: &Cluster, table: &str) -> BTreeMap<i64, i64> {
    pg.psql(&format!("SELECT id, v FROM {table}"))
        .lines()
        .filter_map(|l| {
            let (id, v) = l.split_once('|')?;
            Some((id.parse().ok()?, v.parse().ok()?))
        })
        .collect()
}

#[test]
fn a_table_added_to_the_publication_is_copied_while_writes_go_on() {
    let publisher = Cluster::start();
    let subscriber = Cluster::start();
    publisher.psql(SCHEMA);
    subscriber.psql(SCHEMA);
    publisher.psql(&format!(
        "INSERT INTO b SELECT g, 0, repeat('p', 100) FROM generate_series(1, {ROWS}) g;
         CREATE PUBLICATION pub FOR TABLE a"
    ));
    let wb = Deployment::new();
    wb.configure_sinks(
        &publisher.superuser(),
        &["pub"],
        "backfill_chunk_rows = 7000\nrefresh_interval = 1",
        &format!(
            "[[sink]]\nname = \"out\"\ntype = \"jsonl\"\npath = \"{}\"\n\n[[sink]]\nname = \"replica\"\ntype = \"postgres\"\nconnection = \"{}\"\n",
            wb.output_path().display(),
            subscriber.superuser()
        ),
    );
    let running = wb.start();
    publisher.wait_for_streaming(WAIT);

    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(publisher.superuser(), stop.clone());
    std::thread::sleep(Duration::from_millis(300));
    publisher.psql("ALTER PUBLICATION pub ADD TABLE b");
    wb.wait_for_log("table copied while streaming", WAIT);
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let transactions = writer.join().unwrap_or_else(|_| panic!("writer failed"));
    assert!(transactions >= 200);

    // The postgres sink: both tables equal the publisher's.
    for table in ["a", "b"] {
        assert_same(&publisher, &subscriber, table);
    }
    // The jsonl sink: `b`'s lines replay, each row once then its changes,
    // to exactly the publisher's table.
    let expected = image(&publisher, "b");
    let deadline = Instant::now() + WAIT;
    loop {
        let lines: Vec<Value> = wb
            .lines()
            .into_iter()
            .filter(|l| l["source"]["table"] == "b")
            .collect();
        let replayed = replay_image(&lines).unwrap_or_else(|e| panic!("{e}"));
        if replayed == expected {
            assert!(
                lines.iter().filter(|l| l["op"] == "r").count() as i64 >= ROWS - transactions * 2,
                "the existing rows came as reads"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the jsonl output never matched the publisher ({} rows vs {})",
            replayed.len(),
            expected.len()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(running.stop(WAIT).success(), "log:\n{}", wb.log());
    let log = wb.log();
    assert!(
        log.contains("a table entered the publication: copying its rows while streaming"),
        "{log}"
    );
}

#[test]
fn a_new_table_under_for_all_tables_is_copied_and_a_crash_resumes_the_copy() {
    let (publisher, subscriber, wb) = replicating("CREATE PUBLICATION pub FOR ALL TABLES");
    let running = wb.start();
    publisher.wait_for_streaming(WAIT);
    // A table created with its rows in one go: no change of it streams,
    // so only re-reading the publication finds it.
    subscriber.psql("CREATE TABLE c (id int PRIMARY KEY, v int NOT NULL)");
    publisher.psql(&format!(
        "CREATE TABLE c AS SELECT g AS id, 0 AS v FROM generate_series(1, {ROWS}) g; ALTER TABLE c ADD PRIMARY KEY (id)"
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let publisher = publisher.superuser();
        std::thread::spawn(move || {
            let client = Blocking::connect(&publisher);
            let mut i = 0i64;
            while !stop.load(Ordering::Relaxed) || i < 100 {
                i += 1;
                let sql = format!(
                    "BEGIN; UPDATE c SET v = v + 1 WHERE id = {}; DELETE FROM c WHERE id = {}; INSERT INTO c VALUES ({}, {i}); COMMIT",
                    (i * 7919) % ROWS + 1,
                    (i * 104_729) % ROWS + 1,
                    ROWS + i
                );
                client.execute(&sql);
                // A steady few hundred transactions a second: the copy's
                // last chunk catches up with the rows added at the end.
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    // Killed in the middle of the copy, it goes on from its last durable
    // chunk when it starts again.
    kill_after_a_durable_chunk(&wb, running);
    let seen = wb.log().len();
    let running = wb.start();
    wb.wait_for_log_after(seen, "table copied while streaming", WAIT);
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap_or_else(|_| panic!("writer failed"));
    assert_same(&publisher, &subscriber, "c");
    assert!(running.stop(WAIT).success(), "log:\n{}", wb.log());
    let log = wb.log();
    assert!(log.contains("resuming=true"), "the copy resumed:\n{log}");
}

/// A publisher and a subscriber with [`SCHEMA`], `setup` run on the
/// publisher, and walbridge configured from one to the other (a postgres
/// sink), copying in chunks of 2,000 rows and looking at the publication
/// every second.
fn replicating(setup: &str) -> (Cluster, Cluster, Deployment) {
    replicating_from(Cluster::start(), setup, "")
}

/// As [`replicating`], from `publisher`, with more source keys.
fn replicating_from(
    publisher: Cluster,
    setup: &str,
    source_extra: &str,
) -> (Cluster, Cluster, Deployment) {
    let subscriber = Cluster::start();
    publisher.psql(SCHEMA);
    subscriber.psql(SCHEMA);
    publisher.psql(setup);
    let wb = Deployment::new();
    wb.configure_sinks(
        &publisher.superuser(),
        &["pub"],
        &format!("backfill_chunk_rows = 2000\nrefresh_interval = 1\n{source_extra}"),
        &format!(
            "[[sink]]\nname = \"replica\"\ntype = \"postgres\"\nconnection = \"{}\"\n",
            subscriber.superuser()
        ),
    );
    (publisher, subscriber, wb)
}

/// Kills walbridge once a chunk of a copy is durable downstream (the
/// source's state says how far the copy is), and checks that the copy was
/// not durable whole by then, so the next start has to resume it.
fn kill_after_a_durable_chunk(wb: &Deployment, running: walbridge_tests::walbridge::Running) {
    // Status shows the copy while the source reads it. Looked at first:
    // the source can have read the whole table (and dropped it from the
    // status) before the sink has made its first chunk durable.
    let admin = wb.admin_address(WAIT);
    let deadline = Instant::now() + WAIT;
    loop {
        let (code, body) = walbridge_tests::admin::get(&admin, "/status");
        assert_eq!(code, 200, "{body}");
        let status: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        let copies = &status["sources"][0]["copies"];
        if copies[0]["table"].is_string() && copies[0]["rows"].as_u64() > Some(0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "status never showed the copy: {copies}\n{}",
            wb.log()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let state = wb.path().join("data/sources/src/state.json");
    let stored = || {
        let text = std::fs::read_to_string(&state).unwrap_or_default();
        serde_json::from_str::<Value>(&text).unwrap_or(Value::Null)
    };
    while !stored()["copies"][0]["after"].is_array() {
        assert!(Instant::now() < deadline, "no chunk durable:\n{}", wb.log());
        std::thread::sleep(Duration::from_millis(2));
    }
    running.kill();
    assert!(
        stored()["copies"][0]["table"].is_string(),
        "killed after the copy was durable whole: {}\n{}",
        stored(),
        wb.log()
    );
}

/// Waits until `table` (columns `id`, `v`) on the subscriber equals the
/// publisher's; panics naming the rows that differ.
fn assert_same(publisher: &Cluster, subscriber: &Cluster, table: &str) {
    let expected = publisher.table_digest("postgres", table, "id, v");
    let got = subscriber.wait_for_digest("postgres", table, "id, v", &expected, WAIT);
    if got != expected {
        let (want, have) = (image(publisher, table), image(subscriber, table));
        let differ: Vec<String> = want
            .keys()
            .chain(have.keys())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .filter(|id| want.get(id) != have.get(id))
            .take(20)
            .map(|id| {
                format!(
                    "{id}: publisher {:?}, target {:?}",
                    want.get(id),
                    have.get(id)
                )
            })
            .collect();
        panic!(
            "table {table} differs ({} rows vs {}):\n{}",
            want.len(),
            have.len(),
            differ.join("\n")
        );
    }
}

#[test]
fn resync_repairs_a_damaged_table_while_writes_go_on_and_survives_a_crash() {
    let (publisher, subscriber, wb) = replicating(&format!(
        "INSERT INTO b SELECT g, 0, repeat('p', 100) FROM generate_series(1, {ROWS}) g;
         CREATE PUBLICATION pub FOR TABLE a, b"
    ));
    let running = wb.start();
    publisher.wait_for_streaming(WAIT);
    assert_same(&publisher, &subscriber, "b");
    // Damage the target's copy: wrong values, missing rows, rows the
    // publisher never had (before, among and after its keys).
    subscriber.psql(
        "SET session_replication_role = replica;
         UPDATE b SET v = -1 WHERE id % 100 = 0;
         DELETE FROM b WHERE id % 97 = 0;
         INSERT INTO b SELECT g, 7, 'extra' FROM generate_series(-2000000, -1999901) g;
         INSERT INTO b SELECT g, 7, 'extra' FROM generate_series(2000000, 2000099) g;
         UPDATE b SET id = id + 1000000 WHERE id % 89 = 0",
    );
    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(publisher.superuser(), stop.clone());
    let asked = wb.command(&["resync", "--source", "src", "--table", "public.b"]);
    assert!(
        asked.status.success(),
        "{}",
        walbridge_tests::printed(&asked)
    );
    kill_after_a_durable_chunk(&wb, running);
    let seen = wb.log().len();
    let running = wb.start();
    wb.wait_for_log_after(seen, "table copied while streaming", WAIT);
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap_or_else(|_| panic!("writer failed"));
    for table in ["a", "b"] {
        assert_same(&publisher, &subscriber, table);
    }
    assert!(running.stop(WAIT).success(), "log:\n{}", wb.log());
    let log = wb.log();
    assert!(
        log.contains("mode=\"re-sync\" resuming=true"),
        "the re-sync resumed:\n{log}"
    );
}

#[test]
fn the_admin_endpoint_takes_resync_requests() {
    let pg = Cluster::start();
    pg.psql(
        "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL);
         INSERT INTO t SELECT g, g FROM generate_series(1, 10) g;
         CREATE TABLE keyless (v int);
         CREATE PUBLICATION pub FOR TABLE t, keyless",
    );
    let wb = Deployment::new();
    wb.configure(&pg, "postgres", "pub", "refresh_interval = 1");
    let running = wb.start();
    wb.wait_for_lines(10, WAIT);
    let admin = wb.admin_address(WAIT);
    let post = |query: &str| {
        walbridge_tests::admin::curl(&format!("http://{admin}/resync{query}"), &["-X", "POST"])
    };
    assert_eq!(post("").0, 400);
    assert_eq!(post("?source=nope&table=public.t").0, 404);
    let (status, body) = post("?source=src&table=public.t&sink=nope");
    assert_eq!(
        (status, body.trim()),
        (404, "no sink `nope` reads source `src` (its sinks: out)")
    );
    let (status, body) = post("?source=src&table=public.t");
    assert_eq!(status, 202, "{body}");
    // Each row again, as a read, after the copy.
    let lines = wb.wait_for_lines(20, WAIT);
    let reads: Vec<i64> = lines[10..]
        .iter()
        .map(|l| {
            assert_eq!(l["op"], "r", "{l}");
            l["after"]["id"].as_i64().unwrap_or(-1)
        })
        .collect();
    assert_eq!(reads, (1..=10).collect::<Vec<_>>());
    // A table without a key is refused, saying what to do.
    assert_eq!(post("?source=src&table=public.keyless").0, 202);
    wb.wait_for_log(
        "has neither a primary key nor a replica identity index",
        WAIT,
    );
    assert!(running.stop(WAIT).success(), "log:\n{}", wb.log());
}

#[test]
fn resync_for_one_sink_repairs_it_and_the_other_sinks_pass_over_the_rows() {
    let publisher = Cluster::start();
    let (first, second) = (Cluster::start(), Cluster::start());
    for pg in [&publisher, &first, &second] {
        pg.psql(SCHEMA);
    }
    publisher.psql(
        "INSERT INTO b SELECT g, 0, 'p' FROM generate_series(1, 5000) g;
         CREATE PUBLICATION pub FOR TABLE a, b",
    );
    let wb = Deployment::new();
    let target = |name: &str, pg: &Cluster| {
        format!(
            "[[sink]]\nname = \"{name}\"\ntype = \"postgres\"\nconnection = \"{}\"\n\n",
            pg.superuser()
        )
    };
    wb.configure_sinks(
        &publisher.superuser(),
        &["pub"],
        "backfill_chunk_rows = 1000\nrefresh_interval = 1",
        &format!(
            "{}{}[[sink]]\nname = \"lines\"\ntype = \"jsonl\"\npath = \"{}\"\n",
            target("first", &first),
            target("second", &second),
            wb.output_path().display()
        ),
    );
    // A sink the source has not: refused, naming the ones it has.
    let refused = wb.command(&[
        "resync", "--source", "src", "--table", "b", "--sink", "third",
    ]);
    assert_eq!(
        refused.status.code(),
        Some(2),
        "{}",
        walbridge_tests::printed(&refused)
    );
    assert!(
        String::from_utf8_lossy(&refused.stderr)
            .contains("no sink `third` reads source `src` (its sinks: first, second, lines)"),
        "{}",
        walbridge_tests::printed(&refused)
    );
    let running = wb.start();
    publisher.wait_for_streaming(WAIT);
    assert_same(&publisher, &first, "b");
    assert_same(&publisher, &second, "b");
    let copied_lines = wb.wait_for_lines(5000, WAIT).len();
    // Both targets damaged the same way; only the first is re-synced.
    let damage = "DELETE FROM b WHERE id % 3 = 0; UPDATE b SET v = -1 WHERE id % 5 = 0";
    first.psql(damage);
    second.psql(damage);
    let damaged = second.table_digest("postgres", "b", "id, v");
    let asked = wb.command(&[
        "resync", "--source", "src", "--table", "b", "--sink", "first",
    ]);
    assert!(
        asked.status.success(),
        "{}",
        walbridge_tests::printed(&asked)
    );
    assert!(
        walbridge_tests::printed(&asked).contains("sink `first` alone applies the rows"),
        "{}",
        walbridge_tests::printed(&asked)
    );
    wb.wait_for_log("table copied while streaming", WAIT);
    publisher.psql("UPDATE b SET v = 7 WHERE id = 1");
    assert_same(&publisher, &first, "b");
    // The second target and the jsonl sink got nothing of it: the update
    // after it, and nothing else.
    let expected_second = second.wait_for_db("postgres", "SELECT v FROM b WHERE id = 1", "7", WAIT);
    assert_eq!(expected_second, "7");
    second.psql("UPDATE b SET v = 0 WHERE id = 1");
    assert_eq!(second.table_digest("postgres", "b", "id, v"), damaged);
    let lines = wb.wait_for_lines(copied_lines + 1, WAIT);
    assert_eq!(
        lines.len(),
        copied_lines + 1,
        "{:?}",
        &lines[copied_lines..]
    );
    assert_eq!(lines[copied_lines]["op"], "u");
    assert!(running.stop(WAIT).success(), "log:\n{}", wb.log());
}

#[test]
fn a_table_without_a_key_is_emptied_and_copied_whole_when_asked_to_truncate() {
    let (publisher, subscriber, wb) = replicating(
        "CREATE TABLE k (v int, w text); ALTER TABLE k REPLICA IDENTITY FULL;
         INSERT INTO k SELECT g % 1000, 'w' || (g % 7) FROM generate_series(1, 3000) g;
         CREATE PUBLICATION pub FOR TABLE a, k",
    );
    subscriber.psql("CREATE TABLE k (v int, w text)");
    let running = wb.start();
    publisher.wait_for_streaming(WAIT);
    let same = || {
        let expected = publisher.table_digest("postgres", "k", "v, w");
        let got = subscriber.wait_for_digest("postgres", "k", "v, w", &expected, WAIT);
        assert_eq!(got, expected, "log:\n{}", wb.log());
    };
    same();
    // Damaged: rows lost, duplicates changed, rows the publisher never had.
    subscriber.psql(
        "DELETE FROM k WHERE v % 10 = 0; UPDATE k SET w = 'wrong' WHERE v % 13 = 0;
         INSERT INTO k SELECT -g, 'junk' FROM generate_series(1, 50) g",
    );
    // In key order it cannot be: refused, saying what to do.
    let asked = wb.command(&["resync", "--source", "src", "--table", "k"]);
    assert!(
        asked.status.success(),
        "{}",
        walbridge_tests::printed(&asked)
    );
    wb.wait_for_log("--table public.k --truncate", WAIT);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let client = Blocking::connect(&publisher.superuser());
        std::thread::spawn(move || {
            let mut i = 0i64;
            while !stop.load(Ordering::Relaxed) || i < 100 {
                i += 1;
                client.execute(&format!(
                    "BEGIN; INSERT INTO k VALUES ({}, 'new'); UPDATE k SET w = 'u{i}' WHERE v = {}; DELETE FROM k WHERE v = {} AND w <> 'new'; COMMIT",
                    i % 1000,
                    (i * 7) % 1000,
                    (i * 13) % 1000
                ));
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let asked = wb.command(&["resync", "--source", "src", "--table", "k", "--truncate"]);
    assert!(
        walbridge_tests::printed(&asked).contains("emptied on the targets and copied whole"),
        "{}",
        walbridge_tests::printed(&asked)
    );
    wb.wait_for_log("table copied while streaming", WAIT);
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap_or_else(|_| panic!("writer failed"));
    same();
    assert!(running.stop(WAIT).success(), "log:\n{}", wb.log());
    assert!(
        wb.log().contains("mode=\"truncate and copy\""),
        "{}",
        wb.log()
    );
}

#[test]
fn wide_rows_are_copied_in_chunks_that_fit_backfill_chunk_bytes() {
    let pg = Cluster::start();
    pg.psql(
        "CREATE TABLE t (id int PRIMARY KEY, pad text);
         INSERT INTO t SELECT g, repeat(md5(g::text), 3125) FROM generate_series(1, 50) g;
         CREATE PUBLICATION pub FOR TABLE t",
    );
    let wb = Deployment::new();
    // About 100 kB a row: 10 rows to a 1 MiB chunk, not the 32768 rows.
    wb.configure(
        &pg,
        "postgres",
        "pub",
        "backfill_chunk_bytes = \"1MiB\"\nrefresh_interval = 1",
    );
    let running = wb.start();
    wb.wait_for_lines(50, WAIT);
    let asked = wb.command(&["resync", "--source", "src", "--table", "t"]);
    assert!(
        asked.status.success(),
        "{}",
        walbridge_tests::printed(&asked)
    );
    wb.wait_for_log("table copied while streaming", WAIT);
    let log = wb.log();
    assert!(log.contains("copying in chunks of 10 rows"), "{log}");
    let lines = wb.wait_for_lines(100, WAIT);
    let reads: Vec<i64> = lines[50..]
        .iter()
        .filter_map(|l| l["after"]["id"].as_i64())
        .collect();
    assert_eq!(reads, (1..=50).collect::<Vec<_>>());
    assert!(running.stop(WAIT).success(), "log:\n{}", wb.log());
}

#[test]
fn a_lost_slot_with_recopy_is_created_again_and_every_table_copied_again() {
    let (publisher, subscriber, wb) = replicating_from(
        Cluster::builder()
            .setting("max_slot_wal_keep_size", "'1MB'")
            .setting("wal_keep_size", "0")
            .start(),
        "INSERT INTO b SELECT g, 0, 'p' FROM generate_series(1, 10000) g;
         INSERT INTO a SELECT g, 0 FROM generate_series(1, 100) g;
         CREATE PUBLICATION pub FOR TABLE a, b",
        "on_slot_lost = \"recopy\"",
    );
    let running = wb.start();
    publisher.wait_for_streaming(WAIT);
    assert_same(&publisher, &subscriber, "b");
    assert!(running.stop(WAIT).success(), "log:\n{}", wb.log());
    // Changes made while walbridge is away, then the slot lost: they never
    // reach walbridge as changes.
    publisher.psql(
        "UPDATE b SET v = 5 WHERE id % 10 = 0;
         DELETE FROM b WHERE id % 7 = 0;
         INSERT INTO b SELECT g, 1, 'late' FROM generate_series(20001, 20500) g;
         DELETE FROM a WHERE id > 50",
    );
    let lost = "SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'walbridge_src'";
    for _ in 0..20 {
        publisher.psql("CREATE TABLE IF NOT EXISTS filler (pad text); INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 20000); SELECT pg_switch_wal(); CHECKPOINT");
        if publisher.psql(lost) == "lost" {
            break;
        }
    }
    assert_eq!(publisher.psql(lost), "lost");
    let running = wb.start();
    wb.wait_for_log("created the replication slot again", WAIT);
    let deadline = Instant::now() + WAIT;
    while wb
        .log()
        .matches("the table's copy is durable downstream")
        .count()
        < 2
    {
        assert!(
            Instant::now() < deadline,
            "the copies did not end:\n{}",
            wb.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    publisher.psql("UPDATE b SET v = v + 1 WHERE id <= 100");
    for table in ["a", "b"] {
        assert_same(&publisher, &subscriber, table);
    }
    assert!(running.stop(WAIT).success(), "log:\n{}", wb.log());
    assert!(
        wb.log()
            .contains("on_slot_lost = \"recopy\": the slot is created again"),
        "{}",
        wb.log()
    );
}
