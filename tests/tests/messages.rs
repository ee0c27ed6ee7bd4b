//! Every kind of pgoutput traffic, end to end: streamed transactions with
//! subtransaction aborts (and spilling), two-phase commit, logical
//! decoding messages, truncate options, replica identities, TOAST.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};
use walbridge_tests::Cluster;
use walbridge_tests::admin::{metrics, value};
use walbridge_tests::walbridge::{Deployment, ids_with_op};

const WAIT: Duration = Duration::from_secs(120);

#[test]
fn streamed_transactions_with_subtransaction_aborts_spill_and_commit_in_order() {
    let pg = Cluster::builder()
        .setting("logical_decoding_work_mem", "64kB")
        .start();
    pg.psql("CREATE TABLE big (id int PRIMARY KEY, pad text)");
    pg.psql("CREATE PUBLICATION pub FOR TABLE big");
    let wb = Deployment::new();
    wb.configure(&pg, "postgres", "pub", "spill_threshold = \"256kB\"");
    let running = wb.start();
    let admin = wb.admin_address(WAIT);
    pg.wait_for_streaming(WAIT);

    let rows = |from: i32, to: i32| {
        format!("INSERT INTO big SELECT g, repeat('x', 100) FROM generate_series({from}, {to}) g;")
    };
    // Session A runs a large transaction with subtransactions; session B
    // commits a small one while A is still open.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    runtime.block_on(async {
        let a = pg.client("postgres").await;
        let b = pg.client("postgres").await;
        let run = |sql: String| {
            let a = &a;
            async move {
                a.batch_execute(&sql)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"))
            }
        };
        run(format!(
            "BEGIN; {} SAVEPOINT a; {} ROLLBACK TO a; SAVEPOINT b; {} RELEASE b;",
            rows(1, 5000),
            rows(10_001, 15_000),
            rows(20_001, 25_000)
        ))
        .await;
        run(format!(
            "SAVEPOINT c; {} SAVEPOINT d; {} ROLLBACK TO d; RELEASE c;",
            rows(30_001, 31_000),
            rows(40_001, 42_000)
        ))
        .await;
        b.batch_execute("INSERT INTO big VALUES (-1, 'small')")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        // While A is open, what walbridge spilled of it shows in /metrics.
        wait_for_spill(&admin, |bytes| bytes > 256.0 * 1024.0);
        run(format!("{} COMMIT;", rows(50_001, 50_001))).await;
    });
    // An aborted streamed transaction leaves nothing.
    pg.psql(&format!("BEGIN; {} ROLLBACK;", rows(60_001, 70_000)));
    pg.psql("INSERT INTO big VALUES (-2, 'last')");
    let expected = 5000 + 5000 + 1000 + 1 + 2;
    let lines = wb.wait_for_lines(expected, WAIT);
    wait_for_spill(&admin, |bytes| bytes == 0.0);
    assert!(running.stop(WAIT).success());
    let inserted = ids_with_op(&lines, "c");
    assert_eq!(inserted.len(), expected, "exactly the committed rows");
    // Commit order: the small transaction committed first.
    assert_eq!(inserted[0], -1);
    assert_eq!(*inserted.last().unwrap_or(&0), -2);
    let set: BTreeSet<i64> = inserted.iter().copied().collect();
    let want: BTreeSet<i64> = [-1, -2, 50_001]
        .into_iter()
        .chain(1..=5000)
        .chain(20_001..=25_000)
        .chain(30_001..=31_000)
        .collect();
    assert_eq!(set, want);
    // The big transaction kept its order and one xid.
    let big: Vec<&Value> = lines
        .iter()
        .filter(|l| l["after"]["id"].as_i64().is_some_and(|i| i > 0))
        .collect();
    assert!(
        big.windows(2)
            .all(|w| w[0]["source"]["xid"] == w[1]["source"]["xid"])
    );
    assert_eq!(
        big.first().map(|l| l["after"]["id"].clone()),
        Some(json!(1))
    );
    // The publisher really streamed it, and walbridge really spilled.
    assert_ne!(
        pg.psql(
            "SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = 'walbridge_src'"
        ),
        "0"
    );
    let spilled_dir = wb.path().join("data/sources/src/spill");
    assert!(spilled_dir.is_dir());
    assert_eq!(
        std::fs::read_dir(&spilled_dir)
            .map(|d| d.count())
            .unwrap_or(99),
        0,
        "spill files are removed after use"
    );
}

#[test]
fn two_phase_transactions_arrive_at_commit_prepared() {
    let pg = Cluster::start();
    if pg.major() < 15 {
        return;
    }
    pg.psql("CREATE TABLE t (id int PRIMARY KEY)");
    pg.psql("CREATE PUBLICATION pub FOR TABLE t");
    let wb = Deployment::new();
    wb.configure(&pg, "postgres", "pub", "two_phase = true");
    let running = wb.start();
    pg.wait_for_streaming(WAIT);
    assert_eq!(
        pg.psql("SELECT two_phase FROM pg_replication_slots WHERE slot_name = 'walbridge_src'"),
        "t"
    );
    pg.psql("BEGIN; INSERT INTO t VALUES (1), (2); PREPARE TRANSACTION 'keep'");
    pg.psql("BEGIN; INSERT INTO t VALUES (3); PREPARE TRANSACTION 'drop'");
    pg.psql("INSERT INTO t VALUES (10)");
    let lines = wb.wait_for_lines(1, WAIT);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        ids_with_op(&wb.lines(), "c"),
        [10],
        "prepared transactions wait for their outcome: {lines:?}"
    );
    pg.psql("ROLLBACK PREPARED 'drop'");
    pg.psql("COMMIT PREPARED 'keep'");
    pg.psql("INSERT INTO t VALUES (11)");
    let lines = wb.wait_for_lines(4, WAIT);
    assert!(running.stop(WAIT).success());
    assert_eq!(ids_with_op(&lines, "c"), [10, 1, 2, 11]);
}

#[test]
fn logical_messages_and_truncates() {
    let pg = Cluster::start();
    pg.psql("CREATE TABLE parent (id serial PRIMARY KEY)");
    pg.psql("CREATE TABLE child (id serial PRIMARY KEY, parent int REFERENCES parent)");
    pg.psql("CREATE PUBLICATION pub FOR TABLE parent, child");
    let wb = Deployment::new();
    wb.configure(&pg, "postgres", "pub", "copy_data = false");
    let running = wb.start();
    pg.wait_for_streaming(WAIT);
    pg.psql("BEGIN; INSERT INTO parent DEFAULT VALUES; SELECT pg_logical_emit_message(true, 'audit', 'in txn'); COMMIT");
    pg.psql("SELECT pg_logical_emit_message(false, 'beat', '\\x00ff'::bytea)");
    pg.psql("TRUNCATE parent, child RESTART IDENTITY");
    pg.psql("INSERT INTO parent DEFAULT VALUES");
    pg.psql("INSERT INTO child (parent) VALUES (1)");
    pg.psql("TRUNCATE parent CASCADE");
    let lines = wb.wait_for_lines(7, WAIT);
    assert!(running.stop(WAIT).success());
    let ops: Vec<&str> = lines
        .iter()
        .map(|l| l["op"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(ops, ["c", "m", "m", "t", "c", "c", "t"]);
    assert_eq!(
        lines[1]["message"],
        json!({"prefix": "audit", "content": "aW4gdHhu", "transactional": true})
    );
    assert_eq!(lines[1]["source"]["xid"], lines[0]["source"]["xid"]);
    assert_eq!(
        lines[2]["message"],
        json!({"prefix": "beat", "content": "AP8=", "transactional": false})
    );
    assert_eq!(lines[2]["source"]["xid"], Value::Null);
    let tables = |l: &Value| -> BTreeSet<String> {
        l["truncate"]["tables"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["table"].as_str().map(str::to_owned))
            .collect()
    };
    assert_eq!(
        tables(&lines[3]),
        ["child".to_owned(), "parent".to_owned()].into()
    );
    assert_eq!(lines[3]["truncate"]["restart_identity"], true);
    assert_eq!(lines[3]["truncate"]["cascade"], false);
    assert_eq!(lines[6]["truncate"]["cascade"], true);
    assert_eq!(lines[4]["after"]["id"], 1, "identity restarted");
}

#[test]
fn replica_identities_shape_the_old_row() {
    let pg = Cluster::start();
    pg.psql(
        "CREATE TABLE d (id int PRIMARY KEY, v text);
         CREATE TABLE i (id int, code text NOT NULL, v text); CREATE UNIQUE INDEX i_code ON i (code); ALTER TABLE i REPLICA IDENTITY USING INDEX i_code;
         CREATE TABLE f (id int, v text); ALTER TABLE f REPLICA IDENTITY FULL;
         CREATE TABLE n (id int, v text); ALTER TABLE n REPLICA IDENTITY NOTHING;
         CREATE PUBLICATION pub FOR TABLE d, i, f;
         CREATE PUBLICATION pub_ins FOR TABLE n WITH (publish = 'insert');",
    );
    let wb = Deployment::new();
    wb.configure(&pg, "postgres", "pub", "copy_data = false");
    let config = std::fs::read_to_string(wb.config_path())
        .unwrap_or_default()
        .replace("[\"pub\"]", "[\"pub\", \"pub_ins\"]");
    wb.write_config(&config);
    let running = wb.start();
    pg.wait_for_streaming(WAIT);
    pg.psql("INSERT INTO d VALUES (1, 'a'); UPDATE d SET v = 'b'; DELETE FROM d");
    pg.psql("INSERT INTO i VALUES (1, 'k1', 'a'); UPDATE i SET v = 'b'; UPDATE i SET code = 'k2'; DELETE FROM i");
    pg.psql("INSERT INTO f VALUES (1, 'a'), (1, 'a'); UPDATE f SET v = 'b'; DELETE FROM f");
    pg.psql("INSERT INTO n VALUES (1, 'a'); UPDATE n SET v = 'b'");
    pg.psql("INSERT INTO d VALUES (2, 'end')");
    let lines = wb.wait_for_lines(15, WAIT);
    assert!(running.stop(WAIT).success());
    let shape: Vec<(String, String, Value)> = lines
        .iter()
        .map(|l| {
            (
                l["source"]["table"].as_str().unwrap_or("").to_owned(),
                l["op"].as_str().unwrap_or("").to_owned(),
                l["before"].clone(),
            )
        })
        .collect();
    let row = |t: &str, op: &str, before: Value| (t.to_owned(), op.to_owned(), before);
    assert_eq!(
        shape,
        [
            row("d", "c", Value::Null),
            row("d", "u", Value::Null),
            row("d", "d", json!({"id": 1})),
            row("i", "c", Value::Null),
            row("i", "u", Value::Null),
            row("i", "u", json!({"code": "k1"})),
            row("i", "d", json!({"code": "k2"})),
            row("f", "c", Value::Null),
            row("f", "c", Value::Null),
            row("f", "u", json!({"id": 1, "v": "a"})),
            row("f", "u", json!({"id": 1, "v": "a"})),
            row("f", "d", json!({"id": 1, "v": "b"})),
            row("f", "d", json!({"id": 1, "v": "b"})),
            row("n", "c", Value::Null),
            // NOTHING in an inserts-only publication: its update is not published.
            row("d", "c", Value::Null),
        ]
    );
}

#[test]
fn unchanged_toast_values_are_reported_as_unavailable() {
    let pg = Cluster::start();
    pg.psql("CREATE TABLE docs (id int PRIMARY KEY, n int, body text); ALTER TABLE docs ALTER body SET STORAGE EXTERNAL");
    pg.psql("CREATE TABLE docs_full (id int PRIMARY KEY, n int, body text); ALTER TABLE docs_full ALTER body SET STORAGE EXTERNAL; ALTER TABLE docs_full REPLICA IDENTITY FULL");
    pg.psql("CREATE PUBLICATION pub FOR TABLE docs, docs_full");
    let wb = Deployment::new();
    wb.configure(&pg, "postgres", "pub", "copy_data = false");
    let running = wb.start();
    pg.wait_for_streaming(WAIT);
    let big = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 16000) g)";
    pg.psql(&format!(
        "INSERT INTO docs VALUES (1, 0, {big}); INSERT INTO docs_full VALUES (1, 0, {big})"
    ));
    pg.psql("UPDATE docs SET n = 1; UPDATE docs_full SET n = 1");
    let lines = wb.wait_for_lines(4, WAIT);
    assert!(running.stop(WAIT).success());
    let body_len = |v: &Value| v["after"]["body"].as_str().map_or(0, str::len);
    assert_eq!(body_len(&lines[0]), 512_000);
    assert_eq!(lines[2]["after"]["n"], 1);
    assert_eq!(
        lines[2]["after"]["body"], "__debezium_unavailable_value",
        "never null, never the old value"
    );
    // With REPLICA IDENTITY FULL the old row carries the value.
    assert_eq!(body_len(&lines[3]), 512_000);
}

/// Waits until `/metrics` at `admin` shows source `src`'s spilled bytes
/// satisfying `wanted`.
fn wait_for_spill(admin: &str, wanted: impl Fn(f64) -> bool) {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let samples = metrics(admin);
        let spilled = value(
            &samples,
            "walbridge_source_spill_bytes",
            &[("source", "src")],
        );
        if spilled.is_some_and(&wanted) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "spilled bytes still {spilled:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
