//! Schema changes on the publisher, followed by the postgres sink with
//! `schema_changes = "apply"` and `create_tables = true`: columns added
//! (with a constant default older rows take), retyped, renamed and
//! dropped under a steady writer, one dropped while walbridge is down,
//! and a table created on the publisher created on the target and copied.
//! After each, the target's columns and rows equal the publisher's.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use walbridge_tests::Cluster;
use walbridge_tests::blocking::Blocking;
use walbridge_tests::walbridge::Deployment;

const WAIT: Duration = Duration::from_secs(40);

/// The columns of `table` on `pg`: name, type and nullability, by name
/// (but for `seen`, the subscriber's own).
fn columns(pg: &Cluster, table: &str) -> String {
    pg.psql(&format!(
        "SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod) || CASE WHEN attnotnull THEN ' not null' ELSE '' END, ', ' ORDER BY attname) \
         FROM pg_attribute WHERE attrelid = '{table}'::regclass AND attnum > 0 AND NOT attisdropped AND attname <> 'seen'"
    ))
}

/// The publisher's column names of `table`, for a digest over them.
fn column_list(pg: &Cluster, table: &str) -> String {
    pg.psql(&format!(
        "SELECT string_agg(quote_ident(attname), ', ' ORDER BY attname) \
         FROM pg_attribute WHERE attrelid = '{table}'::regclass AND attnum > 0 AND NOT attisdropped"
    ))
}

/// Waits until `table` on the subscriber has the publisher's columns and rows.
fn assert_same(publisher: &Cluster, subscriber: &Cluster, table: &str, wb: &Deployment) {
    let list = column_list(publisher, table);
    let expected = publisher.table_digest("postgres", table, &list);
    let got = subscriber.wait_for_db(
        "postgres",
        &format!(
            "SELECT coalesce((SELECT string_agg(quote_ident(attname), ', ' ORDER BY attname) FROM pg_attribute \
              WHERE attrelid = to_regclass('{table}') AND attnum > 0 AND NOT attisdropped AND attname <> 'seen'), '') = '{list}'"
        ),
        "t",
        WAIT,
    );
    assert_eq!(
        got,
        "t",
        "columns of {table}: publisher {list}\nlog:\n{}",
        wb.log()
    );
    let got = subscriber.wait_for_digest("postgres", table, &list, &expected, WAIT);
    assert_eq!(
        got,
        expected,
        "rows of {table} ({list})\nlog:\n{}",
        wb.log()
    );
    assert_eq!(columns(subscriber, table), columns(publisher, table));
}

/// Writes to `t` (only `id` and `v`, which every step keeps) until
/// stopped: inserts, updates and deletes, a transaction every millisecond.
struct Writer {
    stop: Arc<AtomicBool>,
    done: JoinHandle<()>,
}

impl Writer {
    fn start(publisher: &Cluster, next: &Arc<AtomicI64>) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let done = {
            let (stop, next) = (stop.clone(), next.clone());
            let client = Blocking::connect(&publisher.superuser());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    client.execute(&format!(
                        "BEGIN; INSERT INTO t (id, v) VALUES ({i}, {i}); UPDATE t SET v = v + 1 WHERE id = {}; DELETE FROM t WHERE id = {}; COMMIT",
                        i / 2,
                        i / 3
                    ));
                    std::thread::sleep(Duration::from_millis(1));
                }
            })
        };
        Writer { stop, done }
    }

    /// Lets it write a while longer, then stops it.
    fn stop(self) {
        std::thread::sleep(Duration::from_millis(300));
        self.stop.store(true, Ordering::Relaxed);
        self.done
            .join()
            .unwrap_or_else(|_| panic!("the writer failed"));
    }
}

#[test]
fn columns_added_retyped_renamed_and_dropped_on_the_publisher_follow_on_the_target() {
    let publisher = Cluster::start();
    let subscriber = Cluster::start();
    let schema =
        "CREATE TABLE t (id bigint PRIMARY KEY, v int NOT NULL, note varchar(20) DEFAULT 'n')";
    publisher.psql(schema);
    subscriber.psql(&format!(
        "{schema}; ALTER TABLE t ADD COLUMN seen timestamptz DEFAULT clock_timestamp()"
    ));
    publisher.psql(
        "INSERT INTO t (id, v) SELECT g, g FROM generate_series(1, 1000) g; \
         CREATE PUBLICATION pub FOR ALL TABLES",
    );
    let wb = Deployment::new();
    wb.configure_sinks(
        &publisher.superuser(),
        &["pub"],
        "refresh_interval = 1",
        &format!(
            "[[sink]]\nname = \"replica\"\ntype = \"postgres\"\nconnection = \"{}\"\nschema_changes = \"apply\"\ncreate_tables = true\n\n\
             [[sink]]\nname = \"lines\"\ntype = \"jsonl\"\npath = \"{}\"\n",
            subscriber.superuser(),
            wb.output_path().display()
        ),
    );
    let running = wb.start();
    publisher.wait_for_streaming(WAIT);
    let next = Arc::new(AtomicI64::new(1001));
    // The target-only column `seen` is the subscriber's own: kept throughout.
    let same = |publisher: &Cluster| {
        assert_same(publisher, &subscriber, "t", &wb);
        assert_eq!(
            subscriber.psql("SELECT count(*) FROM t WHERE seen IS NULL"),
            "0"
        );
    };
    for ddl in [
        // Rows before it read 7 without ever passing through the stream.
        "ALTER TABLE t ADD COLUMN added int NOT NULL DEFAULT 7",
        "ALTER TABLE t ADD COLUMN later numeric(12,2)",
        "ALTER TABLE t ALTER COLUMN v TYPE bigint",
        "ALTER TABLE t ALTER COLUMN note TYPE text",
        "ALTER TABLE t RENAME COLUMN note TO remark",
        "ALTER TABLE t DROP COLUMN added",
    ] {
        let writer = Writer::start(&publisher, &next);
        std::thread::sleep(Duration::from_millis(200));
        publisher.psql(ddl);
        publisher.psql("UPDATE t SET v = v + 1 WHERE id % 97 = 0");
        writer.stop();
        same(&publisher);
    }
    let log = wb.log();
    for line in [
        "add column on the target, as on the publisher",
        "change column type on the target, as on the publisher",
        "rename column on the target, as on the publisher",
        "drop column on the target, as on the publisher",
    ] {
        assert!(log.contains(line), "{line}:\n{log}");
    }

    // The jsonl sink wrote one schema line per change, before the table's
    // first change under it.
    let lines = wb.lines();
    let schema_lines: Vec<&serde_json::Value> = lines.iter().filter(|l| l["op"] == "s").collect();
    let changes: Vec<String> = schema_lines
        .iter()
        .map(|l| l["changes"].to_string())
        .collect();
    assert_eq!(
        changes,
        [
            r#"[{"change":"add","column":"added","type":"int4"}]"#,
            r#"[{"change":"add","column":"later","type":"numeric(12,2)"}]"#,
            r#"[{"change":"type","column":"v","type":"int8","from":"int4"}]"#,
            r#"[{"change":"type","column":"note","type":"text","from":"varchar(20)"}]"#,
            r#"[{"change":"rename","column":"remark","from":"note"}]"#,
            r#"[{"change":"drop","column":"added"}]"#,
        ]
    );
    let first_with = lines
        .iter()
        .position(|l| l["op"] == "c" && l["after"].get("remark").is_some())
        .unwrap_or(usize::MAX);
    let rename = lines
        .iter()
        .position(|l| l["changes"][0]["change"] == "rename")
        .unwrap_or(usize::MAX);
    assert!(rename < first_with, "the rename line comes first");
    assert_eq!(
        schema_lines[0]["schema"]["columns"][3],
        serde_json::json!({"name": "added", "type": "int4", "key": false, "not_null": true})
    );

    // A column dropped while walbridge is down: the columns applied before
    // were stored, so the next descriptor still tells the drop.
    assert!(running.stop(WAIT).success(), "log:\n{}", wb.log());
    publisher.psql("ALTER TABLE t DROP COLUMN later; INSERT INTO t (id, v) VALUES (0, 0)");
    let running = wb.start();
    same(&publisher);

    // A table created on the publisher: created on the target, its rows copied.
    publisher.psql(
        "CREATE TABLE fresh (id int PRIMARY KEY, name text NOT NULL, at timestamptz(3), tags int[]); \
         INSERT INTO fresh SELECT g, 'n' || g, '2026-01-01'::timestamptz + g * interval '1 s', ARRAY[g, g + 1] FROM generate_series(1, 5000) g",
    );
    let writer = Writer::start(&publisher, &next);
    publisher.psql("UPDATE fresh SET name = 'changed' WHERE id % 10 = 0");
    writer.stop();
    assert_same(&publisher, &subscriber, "fresh", &wb);
    assert_eq!(
        subscriber.psql(
            "SELECT string_agg(a.attname, ',') FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) WHERE i.indrelid = 'fresh'::regclass AND i.indisprimary"
        ),
        "id"
    );
    assert!(running.stop(WAIT).success(), "log:\n{}", wb.log());
}

#[test]
fn a_schema_change_the_target_cannot_take_stops_the_sink_naming_the_statement() {
    let publisher = Cluster::start();
    let subscriber = Cluster::start();
    publisher
        .psql("CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE t");
    // A view on the column keeps the target from changing its type.
    subscriber
        .psql("CREATE TABLE t (id int PRIMARY KEY, v text); CREATE VIEW w AS SELECT v FROM t");
    let wb = Deployment::new();
    wb.configure_sinks(
        &publisher.superuser(),
        &["pub"],
        "",
        &format!(
            "[[sink]]\nname = \"replica\"\ntype = \"postgres\"\nconnection = \"{}\"\nschema_changes = \"apply\"\n",
            subscriber.superuser()
        ),
    );
    let running = wb.start();
    publisher.wait_for_streaming(WAIT);
    publisher.psql("INSERT INTO t VALUES (1, '1')");
    publisher
        .psql("ALTER TABLE t ALTER COLUMN v TYPE int USING v::int; INSERT INTO t VALUES (2, 2)");
    wb.wait_for_log(
        r#"cannot change column type on target table public.t, column "v""#,
        WAIT,
    );
    let log = wb.log();
    assert!(
        log.contains(r#"ALTER TABLE "public"."t" ALTER COLUMN "v" TYPE "pg_catalog"."int4""#),
        "{log}"
    );
    // What came before is applied (the retry commits it first, then tries
    // the transaction with the change alone), nothing of that transaction.
    let ids = "SELECT coalesce(string_agg(id::text, ',' ORDER BY id), '') FROM t";
    assert_eq!(subscriber.wait_for(ids, "1", WAIT), "1");
    wb.wait_for_log_after(
        log.len(),
        r#"cannot change column type on target table public.t, column "v""#,
        WAIT,
    );
    assert_eq!(subscriber.psql(ids), "1");
    // Fixed by hand, the sink goes on by itself.
    subscriber.psql("DROP VIEW w");
    assert_same(&publisher, &subscriber, "t", &wb);
    assert!(running.stop(WAIT).success(), "log:\n{}", wb.log());
}
