//! The postgres sink against real clusters: a publisher, walbridge, and a
//! separate subscriber cluster, checked with psql.

use std::time::Duration;

use walbridge_tests::Cluster;
use walbridge_tests::admin::{lint_metrics, metrics, value};
use walbridge_tests::walbridge::{Deployment, Running};

const WAIT: Duration = Duration::from_secs(90);

/// A publisher and a subscriber cluster with walbridge between them.
struct Replication {
    publisher: Cluster,
    subscriber: Cluster,
    wb: Deployment,
}

impl Replication {
    /// Starts both clusters and runs `ddl` on each (the schema is not replicated).
    fn new(ddl: &str) -> Self {
        let publisher = Cluster::start();
        let subscriber = Cluster::start();
        publisher.psql(ddl);
        subscriber.psql(ddl);
        Replication {
            publisher,
            subscriber,
            wb: Deployment::new(),
        }
    }

    /// Configures source `src` with `publications` and a postgres sink
    /// `replica` into the subscriber's `postgres` database with `sink_extra`.
    fn configure(&self, publications: &[&str], source_extra: &str, sink_extra: &str) {
        self.configure_sink(
            publications,
            source_extra,
            &self.subscriber.superuser(),
            sink_extra,
        );
    }

    /// As [`Replication::configure`] with publication `pub`, the sink
    /// connecting to the subscriber as `role`.
    fn configure_as(&self, role: &str, sink_extra: &str) {
        self.configure_sink(
            &["pub"],
            "",
            &self.subscriber.connstr(role, "postgres"),
            sink_extra,
        );
    }

    fn configure_sink(
        &self,
        publications: &[&str],
        source_extra: &str,
        connection: &str,
        sink_extra: &str,
    ) {
        self.wb.configure_sinks(
            &self.publisher.superuser(),
            publications,
            source_extra,
            &format!(
                "[[sink]]\nname = \"replica\"\ntype = \"postgres\"\nconnection = \"{connection}\"\n{sink_extra}\n"
            ),
        );
    }

    /// Runs `walbridge check`: its exit code and what it printed (stdout
    /// then stderr).
    fn check(&self) -> (Option<i32>, String) {
        let out = self.wb.command(&["check"]);
        let printed = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), printed)
    }

    fn start(&self) -> Running {
        self.wb.start()
    }

    /// Runs a walbridge command that must succeed; returns its output.
    fn command_ok(&self, args: &[&str]) -> String {
        let out = self.wb.command(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits until `table` holds the same rows on both sides.
    fn wait_equal(&self, table: &str) {
        let expected = self.publisher.table_digest("postgres", table, "*");
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let got = self.subscriber.table_digest("postgres", table, "*");
            if got == expected {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{table} differs: publisher {expected}, subscriber {got}\npublisher rows:\n{}\nsubscriber rows:\n{}\nwalbridge log:\n{}",
                self.publisher
                    .psql(&format!("SELECT * FROM {table} ORDER BY 1 LIMIT 50")),
                self.subscriber
                    .psql(&format!("SELECT * FROM {table} ORDER BY 1 LIMIT 50")),
                self.wb.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until `sql` on the subscriber returns `expected`.
    fn wait_subscriber(&self, sql: &str, expected: &str) {
        let got = self.subscriber.wait_for(sql, expected, WAIT);
        assert_eq!(got, expected, "`{sql}`; walbridge log:\n{}", self.wb.log());
    }
}

#[test]
fn copy_then_changes_with_an_insert_only_publication() {
    let r = Replication::new(
        "CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL, tier text);
         CREATE TABLE orders (id bigint PRIMARY KEY, customer int, total numeric(10,2), note text);
         CREATE TABLE audit (id int PRIMARY KEY, what text)",
    );
    let p = &r.publisher;
    p.psql("INSERT INTO customers SELECT g, 'c' || g, CASE WHEN g % 3 = 0 THEN 'gold' END FROM generate_series(1, 100) g");
    p.psql("INSERT INTO orders SELECT g, g % 100 + 1, g * 1.25, repeat('n', g % 7) FROM generate_series(1, 1000) g");
    p.psql("INSERT INTO audit SELECT g, 'start ' || g FROM generate_series(1, 5) g");
    p.psql("CREATE PUBLICATION pub_all FOR TABLE customers, orders");
    p.psql("CREATE PUBLICATION pub_ins FOR TABLE audit WITH (publish = 'insert')");
    r.configure(&["pub_all", "pub_ins"], "", "");
    let running = r.start();
    r.wait_equal("customers");
    r.wait_equal("orders");
    r.wait_equal("audit");
    p.wait_for_streaming(WAIT);

    p.psql("BEGIN; INSERT INTO customers VALUES (101, 'new', 'gold'); UPDATE customers SET tier = 'silver' WHERE id <= 10; DELETE FROM customers WHERE id BETWEEN 90 AND 95; COMMIT");
    p.psql("UPDATE orders SET total = total + 1, note = NULL WHERE id % 10 = 0");
    p.psql("UPDATE orders SET id = id + 100000 WHERE id <= 5");
    p.psql("DELETE FROM orders WHERE id BETWEEN 500 AND 600");
    p.psql("INSERT INTO audit VALUES (6, 'six'), (7, 'seven')");
    p.psql("UPDATE audit SET what = 'changed' WHERE id <= 6");
    p.psql("DELETE FROM audit WHERE id = 7");
    r.wait_equal("customers");
    r.wait_equal("orders");
    // Only inserts of audit are published: the update and delete stay on the publisher.
    r.wait_subscriber(
        "SELECT string_agg(id || ':' || what, ',' ORDER BY id) FROM audit",
        "1:start 1,2:start 2,3:start 3,4:start 4,5:start 5,6:six,7:seven",
    );
    // Progress lives in the target, in a replication origin per source.
    assert_eq!(
        r.subscriber
            .psql("SELECT count(*) FROM pg_replication_origin_status s JOIN pg_replication_origin o ON o.roident = s.local_id WHERE o.roname = 'walbridge_replica_src' AND s.remote_lsn > '0/0'"),
        "1"
    );
    // The origins of the copy's lanes (three tables: two lanes) are gone.
    assert_eq!(
        r.subscriber
            .psql("SELECT count(*) FROM pg_replication_origin WHERE roname LIKE 'walbridge\\_replica\\_src\\_copy%'"),
        "0"
    );
    let status = running.stop(WAIT);
    assert!(status.success(), "exit {status}; log:\n{}", r.wb.log());
}

#[test]
fn columns_match_by_name_with_target_defaults_and_a_column_dropped_mid_stream() {
    let r = Replication::new("SELECT 1");
    r.publisher
        .psql("CREATE TABLE t (id int PRIMARY KEY, a text, b int, c text)");
    r.subscriber.psql(
        "CREATE TABLE t (c text, extra text DEFAULT 'dflt', b int, id int PRIMARY KEY, a text, added timestamptz DEFAULT now())",
    );
    let p = &r.publisher;
    p.psql("INSERT INTO t SELECT g, 'a' || g, g * 10, 'c' || g FROM generate_series(1, 20) g");
    p.psql("CREATE PUBLICATION pub FOR TABLE t");
    r.configure(&["pub"], "", "");
    let running = r.start();
    let columns = "id, a, b, c";
    let same = |what: &str| {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let expected = p.table_digest("postgres", "t", columns);
            let got = r.subscriber.table_digest("postgres", "t", columns);
            if expected == got {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{what}: publisher {expected}, subscriber {got}; log:\n{}",
                r.wb.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    same("after the copy");
    p.wait_for_streaming(WAIT);
    p.psql("INSERT INTO t VALUES (21, 'x', 1, 'y'); UPDATE t SET b = -b WHERE id <= 5; DELETE FROM t WHERE id = 20");
    same("after changes");
    // The publisher drops a column; the target keeps it and new rows get its default.
    p.psql("ALTER TABLE t DROP COLUMN c");
    p.psql("INSERT INTO t VALUES (22, 'after drop', 2); UPDATE t SET a = 'upd' WHERE id = 1");
    r.wait_subscriber(
        "SELECT count(*) FROM t WHERE id = 22 AND c IS NULL AND a = 'after drop'",
        "1",
    );
    r.wait_subscriber("SELECT a || ':' || c FROM t WHERE id = 1", "upd:c1");
    // Target-only columns got their defaults throughout.
    assert_eq!(
        r.subscriber
            .psql("SELECT count(*) FROM t WHERE extra = 'dflt' AND added IS NOT NULL"),
        "21"
    );
    let status = running.stop(WAIT);
    assert!(status.success(), "exit {status}; log:\n{}", r.wb.log());
}

#[test]
fn a_published_column_missing_on_the_target_stops_the_sink_until_added() {
    let r = Replication::new("CREATE TABLE t (id int PRIMARY KEY, a text)");
    let p = &r.publisher;
    p.psql("CREATE PUBLICATION pub FOR TABLE t");
    r.configure(&["pub"], "", "");
    let running = r.start();
    p.wait_for_streaming(WAIT);
    p.psql("INSERT INTO t VALUES (1, 'one')");
    r.wait_equal("t");
    p.psql("ALTER TABLE t ADD COLUMN score numeric(6,2)");
    p.psql("INSERT INTO t VALUES (2, 'two', 2.5)");
    let log = wait_for_log(&r.wb, "has no column \"score\"");
    assert!(
        log.contains(
            "target table public.t has no column \"score\" (numeric(6,2) on the publisher"
        ),
        "{log}"
    );
    assert_eq!(r.subscriber.psql("SELECT count(*) FROM t"), "1");
    // Adding it on the target lets the retry go through.
    r.subscriber
        .psql("ALTER TABLE t ADD COLUMN score numeric(6,2)");
    r.wait_equal("t");
    let status = running.stop(WAIT);
    assert!(status.success(), "exit {status}; log:\n{}", r.wb.log());
}

#[test]
fn replica_identities_full_with_duplicates_nothing_no_key_and_index() {
    let r = Replication::new(
        "CREATE TABLE full_dup (a int, b text, j json, p point);
         ALTER TABLE full_dup REPLICA IDENTITY FULL;
         CREATE TABLE only_inserts (a int, b text);
         ALTER TABLE only_inserts REPLICA IDENTITY NOTHING;
         CREATE TABLE by_index (id int NOT NULL, code text NOT NULL, v text);
         CREATE UNIQUE INDEX by_index_key ON by_index (code, id);
         ALTER TABLE by_index REPLICA IDENTITY USING INDEX by_index_key",
    );
    let p = &r.publisher;
    let s = &r.subscriber;
    // A key on the publisher, none on the target.
    p.psql("CREATE TABLE keyed (id int PRIMARY KEY, v text)");
    s.psql("CREATE TABLE keyed (id int, v text)");
    p.psql("INSERT INTO full_dup VALUES (1, 'x', '{\"k\": 1}', '(1,2)'), (1, 'x', '{\"k\": 1}', '(1,2)'), (2, NULL, '[1]', NULL), (3, 'z', NULL, '(0,0)')");
    p.psql("INSERT INTO by_index SELECT g, 'code' || g, 'v' || g FROM generate_series(1, 10) g");
    p.psql("INSERT INTO keyed SELECT g, 'v' || g FROM generate_series(1, 10) g");
    p.psql("CREATE PUBLICATION pub FOR TABLE full_dup, by_index, keyed");
    p.psql("CREATE PUBLICATION ins FOR TABLE only_inserts WITH (publish = 'insert')");
    r.configure(&["pub", "ins"], "", "");
    let running = r.start();
    r.wait_equal("full_dup");
    p.wait_for_streaming(WAIT);
    // One of two equal rows changes, then one of two equal rows goes.
    p.psql(
        "UPDATE full_dup SET b = 'y' WHERE ctid = (SELECT ctid FROM full_dup WHERE a = 1 LIMIT 1)",
    );
    p.psql("UPDATE full_dup SET b = 'was null' WHERE a = 2");
    p.psql("INSERT INTO full_dup VALUES (4, 'dup', '{}', '(4,4)'), (4, 'dup', '{}', '(4,4)')");
    p.psql("DELETE FROM full_dup WHERE ctid = (SELECT ctid FROM full_dup WHERE a = 4 LIMIT 1)");
    p.psql("DELETE FROM full_dup WHERE a = 3");
    p.psql("INSERT INTO only_inserts VALUES (1, 'a'), (2, NULL)");
    p.psql("UPDATE by_index SET v = 'changed' WHERE id <= 3");
    p.psql("UPDATE by_index SET code = 'recoded' || id WHERE id BETWEEN 4 AND 6");
    p.psql("DELETE FROM by_index WHERE id = 10");
    p.psql("UPDATE keyed SET v = 'new' WHERE id <= 5; UPDATE keyed SET id = 100 WHERE id = 9; DELETE FROM keyed WHERE id = 10");
    for table in ["full_dup", "only_inserts", "by_index", "keyed"] {
        let columns = if table == "full_dup" {
            "a, b, j::text, p::text"
        } else {
            "*"
        };
        let expected = p.table_digest("postgres", table, columns);
        let got = s.wait_for_digest("postgres", table, columns, &expected, WAIT);
        assert_eq!(got, expected, "{table}; log:\n{}", r.wb.log());
    }
    let status = running.stop(WAIT);
    assert!(status.success(), "exit {status}; log:\n{}", r.wb.log());
}

#[test]
fn changes_to_rows_missing_on_the_target_are_skipped_and_counted() {
    let r = Replication::new("CREATE TABLE t (id int PRIMARY KEY, v text)");
    let p = &r.publisher;
    p.psql("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 10) g");
    p.psql("CREATE PUBLICATION pub FOR TABLE t");
    r.configure(&["pub"], "", "");
    let running = r.start();
    r.wait_equal("t");
    p.wait_for_streaming(WAIT);
    r.subscriber.psql("DELETE FROM t WHERE id IN (3, 4)");
    p.psql("UPDATE t SET v = 'updated' WHERE id IN (3, 5)");
    p.psql("DELETE FROM t WHERE id IN (4, 6)");
    p.psql("INSERT INTO t VALUES (11, 'after')");
    r.wait_subscriber(
        "SELECT string_agg(id || '=' || v, ',' ORDER BY id) FROM t",
        "1=v1,2=v2,5=updated,7=v7,8=v8,9=v9,10=v10,11=after",
    );
    // Counted in /metrics too, by operation.
    let admin = r.wb.admin_address(WAIT);
    let labels = |op| [("sink", "replica"), ("source", "src"), ("operation", op)];
    let samples = metrics(&admin);
    let missing = |op| {
        value(
            &samples,
            "walbridge_postgres_missing_rows_total",
            &labels(op),
        )
    };
    assert_eq!(
        (missing("update"), missing("delete")),
        (Some(1.0), Some(1.0))
    );
    assert_eq!(
        value(
            &samples,
            "walbridge_postgres_transactions_total",
            &[("sink", "replica"), ("source", "src")]
        ),
        Some(3.0),
        "{samples:#?}"
    );
    assert_eq!(lint_metrics(&admin), "", "promtool check metrics");
    let status = running.stop(WAIT);
    assert!(status.success(), "exit {status}; log:\n{}", r.wb.log());
    let log = r.wb.log();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("found no row on the target") && l.contains("table=\"public.t\""))
        .collect();
    assert!(
        !warnings.is_empty(),
        "no warning about missing rows:\n{log}"
    );
    // The totals at the stop count each once.
    assert!(
        log.contains("update_missing=1") && log.contains("delete_missing=1"),
        "{log}"
    );
}

#[test]
fn a_small_group_goes_to_the_target_as_one_query() {
    let r = Replication::new("CREATE TABLE t (id int PRIMARY KEY, v text, n int)");
    let (p, s) = (&r.publisher, &r.subscriber);
    p.psql("CREATE PUBLICATION pub FOR TABLE t");
    // Acknowledged at COMMIT: no later query for the WAL's flush on the
    // apply session, whose last query is then the group's.
    r.configure(&["pub"], "", "synchronous_commit = \"on\"");
    let running = r.start();
    p.wait_for_streaming(WAIT);
    let last_query = || {
        s.psql(
            "SELECT query FROM pg_stat_activity \
             WHERE query LIKE 'BEGIN;%' AND pid <> pg_backend_pid()",
        )
    };
    // Values whose literals need their quotes doubled (backslashes and
    // the array's own quoting are taken as they are), and a NULL.
    p.psql(r#"INSERT INTO t VALUES (1, 'it''s \ "quoted" {a,b}', NULL), (2, '', 2)"#);
    r.wait_subscriber("SELECT count(*) FROM t", "2");
    assert_eq!(
        s.psql("SELECT string_agg(id || '=' || v || '/' || coalesce(n::text, 'null'), ',' ORDER BY id) FROM t"),
        r#"1=it's \ "quoted" {a,b}/null,2=/2"#
    );
    let first = last_query();
    assert!(
        first.starts_with("BEGIN; PREPARE walbridge_batch_0 AS INSERT INTO")
            && first.contains("; EXECUTE walbridge_batch_0(")
            && first.contains("; COMMIT"),
        "{first}"
    );
    // An update and a delete, each a batch of its own; one of them finds
    // no row, and is counted from the query's results.
    s.psql("DELETE FROM t WHERE id = 2");
    p.psql("BEGIN; UPDATE t SET n = 7 WHERE id IN (1, 2); DELETE FROM t WHERE id = 1; COMMIT");
    r.wait_subscriber("SELECT count(*) FROM t", "0");
    let second = last_query();
    assert!(
        second.starts_with("BEGIN; PREPARE walbridge_batch_1 AS UPDATE")
            && second.contains("; PREPARE walbridge_batch_2 AS DELETE"),
        "{second}"
    );
    // A statement prepared once is executed from then on.
    p.psql("INSERT INTO t VALUES (3, 'again', 3)");
    r.wait_subscriber("SELECT count(*) FROM t", "1");
    let third = last_query();
    assert!(
        third.starts_with("BEGIN; EXECUTE walbridge_batch_0("),
        "{third}"
    );
    let samples = metrics(&r.wb.admin_address(WAIT));
    assert_eq!(
        value(
            &samples,
            "walbridge_postgres_missing_rows_total",
            &[
                ("sink", "replica"),
                ("source", "src"),
                ("operation", "update")
            ]
        ),
        Some(1.0),
        "{samples:#?}"
    );
    let status = running.stop(WAIT);
    assert!(status.success(), "exit {status}; log:\n{}", r.wb.log());
}

#[test]
fn toasted_values_stay_intact_when_other_columns_change() {
    let r = Replication::new(
        "CREATE TABLE docs (id int PRIMARY KEY, body text, n int);
         ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL",
    );
    let p = &r.publisher;
    p.psql("INSERT INTO docs SELECT g, (SELECT string_agg(md5(g::text || i::text), '') FROM generate_series(1, 16000) i), g FROM generate_series(1, 3) g");
    p.psql("CREATE PUBLICATION pub FOR TABLE docs");
    r.configure(&["pub"], "", "");
    let running = r.start();
    r.wait_equal("docs");
    p.wait_for_streaming(WAIT);
    assert_eq!(
        p.psql("SELECT min(length(body)) FROM docs"),
        "512000",
        "500 kB values"
    );
    p.psql("INSERT INTO docs VALUES (4, (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 16000) i), 4)");
    p.psql("UPDATE docs SET n = n + 100");
    p.psql("UPDATE docs SET n = n + 1, body = body || 'tail' WHERE id = 2");
    r.wait_equal("docs");
    let status = running.stop(WAIT);
    assert!(status.success(), "exit {status}; log:\n{}", r.wb.log());
}

/// Waits until walbridge's log contains `text`.
fn wait_for_log(wb: &Deployment, text: &str) -> String {
    wb.wait_for_log(text, WAIT)
}

#[test]
fn truncates_one_table_linked_tables_and_restart_identity() {
    let r = Replication::new(
        "CREATE TABLE parent (id int PRIMARY KEY, v text);
         CREATE TABLE child (id int PRIMARY KEY, parent int REFERENCES parent (id));
         CREATE TABLE solo (id serial PRIMARY KEY, v text);
         CREATE TABLE kept (id int PRIMARY KEY)",
    );
    let (p, s) = (&r.publisher, &r.subscriber);
    p.psql("INSERT INTO parent SELECT g, 'p' FROM generate_series(1, 5) g; INSERT INTO child SELECT g, g FROM generate_series(1, 5) g");
    p.psql("INSERT INTO solo (v) SELECT 's' FROM generate_series(1, 5); INSERT INTO kept VALUES (1), (2)");
    p.psql("CREATE PUBLICATION pub FOR TABLE parent, child, solo, kept");
    r.configure(&["pub"], "", "");
    let running = r.start();
    r.wait_equal("child");
    r.wait_equal("solo");
    p.wait_for_streaming(WAIT);
    // The subscriber's own sequence has moved on; RESTART IDENTITY resets it.
    s.psql("SELECT setval('solo_id_seq', 42)");
    p.psql("TRUNCATE solo RESTART IDENTITY");
    p.psql("INSERT INTO solo (v) VALUES ('after')");
    r.wait_equal("solo");
    assert_eq!(
        s.psql("SELECT last_value || ',' || is_called FROM solo_id_seq"),
        "1,false"
    );
    // Tables linked by a foreign key go together, in one statement.
    p.psql("TRUNCATE parent, child");
    p.psql("INSERT INTO parent VALUES (10, 'new'); INSERT INTO child VALUES (10, 10)");
    r.wait_equal("parent");
    r.wait_equal("child");
    r.wait_equal("kept");

    // A target-only table referencing a replicated one: the truncate would
    // have to cascade outside the set, so the sink stops instead.
    s.psql("CREATE TABLE local_ref (id int PRIMARY KEY, kept int REFERENCES kept (id))");
    p.psql("TRUNCATE kept");
    p.psql("INSERT INTO solo (v) VALUES ('behind the truncate')");
    let log = wait_for_log(&r.wb, "TRUNCATE of public.kept failed on the target");
    assert!(
        log.contains("cannot truncate a table referenced in a foreign key constraint"),
        "{log}"
    );
    assert!(log.contains("walbridge skip --sink replica"), "{log}");
    assert_eq!(s.psql("SELECT count(*) FROM kept"), "2");
    assert_eq!(
        s.psql("SELECT count(*) FROM solo WHERE v = 'behind the truncate'"),
        "0"
    );
    // Skipping the transaction lets what follows through.
    let out = r.wb.command(&["skip", "--sink", "replica"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    r.wait_subscriber(
        "SELECT count(*) FROM solo WHERE v = 'behind the truncate'",
        "1",
    );
    assert_eq!(s.psql("SELECT count(*) FROM kept"), "2");
    let status = running.stop(WAIT);
    assert!(status.success(), "exit {status}; log:\n{}", r.wb.log());
}

#[test]
fn a_duplicate_key_stops_on_the_transaction_until_skipped() {
    let r = Replication::new("CREATE TABLE t (id int PRIMARY KEY, v text)");
    let (p, s) = (&r.publisher, &r.subscriber);
    p.psql("CREATE PUBLICATION pub FOR TABLE t");
    r.configure(&["pub"], "", "batch_time = \"5s\"");
    let running = r.start();
    p.wait_for_streaming(WAIT);
    s.psql("INSERT INTO t VALUES (100, 'local')");
    // Several transactions land in one target transaction: the ones
    // before the conflict must still be applied, none after it.
    let stopped = running;
    p.psql("BEGIN; INSERT INTO t VALUES (1, 'before'); COMMIT");
    p.psql("BEGIN; INSERT INTO t VALUES (2, 'before too'); COMMIT");
    let xid = p.psql("BEGIN; INSERT INTO t VALUES (3, 'in the conflict'); INSERT INTO t VALUES (100, 'remote'); SELECT txid_current(); COMMIT");
    p.psql("INSERT INTO t VALUES (4, 'after')");
    let log = wait_for_log(&r.wb, "conflict on target table public.t");
    let line = log
        .lines()
        .find(|l| l.contains("conflict on target table public.t"))
        .unwrap_or_default()
        .to_owned();
    assert!(
        line.contains("duplicate key value violates unique constraint \"t_pkey\""),
        "{line}"
    );
    assert!(line.contains("Key (id)=(100) already exists"), "{line}");
    assert!(
        line.contains(&format!(
            "stopped on transaction {xid} of source `src` (commit LSN "
        )),
        "{line}"
    );
    r.wait_subscriber(
        "SELECT string_agg(id::text, ',' ORDER BY id) FROM t",
        "1,2,100",
    );
    // It keeps retrying and stays stopped on it.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        s.psql("SELECT string_agg(id::text, ',' ORDER BY id) FROM t"),
        "1,2,100"
    );
    let commit_lsn = line
        .split("(commit LSN ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .unwrap_or_default()
        .to_owned();
    // A wrong LSN is refused and changes nothing.
    let out = r.wb.command(&["skip", "--sink", "replica", "--lsn", "0/1"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("is not stopped on a transaction with commit LSN 0/1"),
        "{stderr}"
    );
    let out =
        r.wb.command(&["skip", "--sink", "replica", "--lsn", &commit_lsn]);
    assert!(
        out.status.success(),
        "{}; log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        r.wb.log()
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("skipped transaction {xid}")));
    // The whole transaction is skipped (3 as well as 100), and 4 follows.
    r.wait_subscriber(
        "SELECT string_agg(id || '=' || v, ',' ORDER BY id) FROM t",
        "1=before,2=before too,4=after,100=local",
    );
    let out = r.wb.command(&["skip", "--sink", "replica"]);
    assert!(!out.status.success(), "nothing left to skip");
    let status = stopped.stop(WAIT);
    assert!(status.success(), "exit {status}; log:\n{}", r.wb.log());
}

#[test]
fn on_conflict_skip_and_upsert() {
    let r = Replication::new("CREATE TABLE t (id int PRIMARY KEY, v text, n int CHECK (n >= 0))");
    let (p, s) = (&r.publisher, &r.subscriber);
    p.psql("CREATE PUBLICATION pub FOR TABLE t");
    // Two sinks into two databases of the subscriber.
    s.psql("CREATE DATABASE upserts");
    s.psql_db(
        "upserts",
        "CREATE TABLE t (id int PRIMARY KEY, v text, n int CHECK (n >= 0))",
    );
    r.wb.configure_sinks(
        &p.superuser(),
        &["pub"],
        "",
        &format!(
            "[[sink]]\nname = \"skipping\"\ntype = \"postgres\"\nconnection = \"{}\"\non_conflict = \"skip\"\n\n[[sink]]\nname = \"upserting\"\ntype = \"postgres\"\nconnection = \"{}\"\non_conflict = \"upsert\"\n",
            s.superuser(),
            s.connstr("postgres", "upserts")
        ),
    );
    let running = r.start();
    p.wait_for_streaming(WAIT);
    s.psql("INSERT INTO t VALUES (1, 'local', 1)");
    s.psql_db("upserts", "INSERT INTO t VALUES (1, 'local', 1)");
    // The check constraint differs on the publisher: n = -1 is fine there.
    p.psql("ALTER TABLE t DROP CONSTRAINT t_n_check");
    p.psql(
        "BEGIN; INSERT INTO t VALUES (1, 'remote', 10); INSERT INTO t VALUES (2, 'two', 2); COMMIT",
    );
    p.psql("BEGIN; INSERT INTO t VALUES (3, 'negative', -1); INSERT INTO t VALUES (4, 'four', 4); COMMIT");
    p.psql("INSERT INTO t VALUES (5, 'five', 5)");
    // skip: the duplicate insert and the check violation are skipped, the rest applied.
    r.wait_subscriber(
        "SELECT string_agg(id || '=' || v, ',' ORDER BY id) FROM t",
        "1=local,2=two,4=four,5=five",
    );
    // Both counted in /metrics.
    let admin = r.wb.admin_address(WAIT);
    let skipped = [("sink", "skipping"), ("source", "src")];
    let deadline = std::time::Instant::now() + WAIT;
    while value(
        &metrics(&admin),
        "walbridge_postgres_conflicts_skipped_total",
        &skipped,
    ) != Some(2.0)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "{:#?}",
            metrics(&admin)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // upsert: the duplicate insert updates the row; the check violation still stops it.
    let got = s.wait_for_db(
        "upserts",
        "SELECT string_agg(id || '=' || v, ',' ORDER BY id) FROM t",
        "1=remote,2=two",
        WAIT,
    );
    assert_eq!(got, "1=remote,2=two", "log:\n{}", r.wb.log());
    let log = wait_for_log(
        &r.wb,
        "sink `upserting`: conflict on target table public.t: new row for relation \"t\" violates check constraint \"t_n_check\"",
    );
    assert!(log.contains("skipped a conflicting change"), "{log}");
    // Stopping while a sink is stopped on a transaction is a clean stop
    // (exit 0, as for any sink that retries); the log says where it stands.
    let status = running.stop(WAIT);
    assert_eq!(status.code(), Some(0), "log:\n{}", r.wb.log());
    let log = r.wb.log();
    let last = log.lines().last().unwrap_or_default().to_owned();
    assert!(!last.starts_with("walbridge: "), "{last}");
    assert!(
        log.contains("stopping while the sink retries (sink `upserting`: conflict"),
        "{log}"
    );
}

#[test]
fn replica_triggers_fire_and_ordinary_ones_do_not() {
    let r = Replication::new("CREATE TABLE t (id int PRIMARY KEY, parent int, v text)");
    let (p, s) = (&r.publisher, &r.subscriber);
    s.psql(
        "CREATE TABLE parents (id int PRIMARY KEY);
         ALTER TABLE t ADD FOREIGN KEY (parent) REFERENCES parents (id);
         CREATE TABLE fired (kind text, op text, level text, id int);
         CREATE FUNCTION note() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           INSERT INTO fired VALUES (TG_ARGV[0], TG_OP, TG_LEVEL, CASE WHEN TG_LEVEL = 'ROW' THEN COALESCE(NEW.id, OLD.id) END);
           RETURN NULL;
         END $$;
         CREATE TRIGGER ordinary_row AFTER INSERT OR UPDATE OR DELETE ON t FOR EACH ROW EXECUTE FUNCTION note('ordinary');
         CREATE TRIGGER replica_row AFTER INSERT OR UPDATE OR DELETE ON t FOR EACH ROW EXECUTE FUNCTION note('replica');
         CREATE TRIGGER always_row AFTER INSERT OR UPDATE OR DELETE ON t FOR EACH ROW EXECUTE FUNCTION note('always');
         CREATE TRIGGER replica_statement AFTER INSERT ON t FOR EACH STATEMENT EXECUTE FUNCTION note('replica');
         ALTER TABLE t ENABLE REPLICA TRIGGER replica_row;
         ALTER TABLE t ENABLE REPLICA TRIGGER replica_statement;
         ALTER TABLE t ENABLE ALWAYS TRIGGER always_row",
    );
    p.psql("INSERT INTO t SELECT g, g, 'v' FROM generate_series(1, 3) g");
    p.psql("CREATE PUBLICATION pub FOR TABLE t");
    r.configure(&["pub"], "", "");
    let running = r.start();
    // The foreign key to a table that is empty on the subscriber is not
    // checked while applying (session_replication_role = replica).
    r.wait_equal("t");
    p.wait_for_streaming(WAIT);
    // The copy fired row triggers and one statement trigger, like COPY.
    assert_eq!(
        s.psql("SELECT string_agg(kind || ' ' || op || ' ' || level || coalesce(' ' || id, ''), ',' ORDER BY kind, level, id) FROM fired"),
        "always INSERT ROW 1,always INSERT ROW 2,always INSERT ROW 3,replica INSERT ROW 1,replica INSERT ROW 2,replica INSERT ROW 3,replica INSERT STATEMENT"
    );
    s.psql("TRUNCATE fired");
    p.psql("INSERT INTO t VALUES (4, 4, 'new'); UPDATE t SET v = 'upd' WHERE id = 1; DELETE FROM t WHERE id = 2");
    r.wait_equal("t");
    r.wait_subscriber(
        "SELECT string_agg(kind || ' ' || op || ' ' || id, ',' ORDER BY kind, id) FROM fired WHERE level = 'ROW'",
        "always UPDATE 1,always DELETE 2,always INSERT 4,replica UPDATE 1,replica DELETE 2,replica INSERT 4",
    );
    assert_eq!(
        s.psql("SELECT count(*) FROM fired WHERE kind = 'ordinary'"),
        "0"
    );
    let status = running.stop(WAIT);
    assert!(status.success(), "exit {status}; log:\n{}", r.wb.log());
}

#[test]
fn row_filters_and_column_lists_are_honoured() {
    let r = Replication::new("SELECT 1");
    let (p, s) = (&r.publisher, &r.subscriber);
    if p.major() < 15 {
        return; // row filters and column lists are PostgreSQL 15+
    }
    // The filter's column must be part of the replica identity.
    p.psql("CREATE TABLE t (id int, region text, v text, secret text, PRIMARY KEY (id, region))");
    s.psql("CREATE TABLE t (id int, region text, v text, secret text DEFAULT 'not published', PRIMARY KEY (id, region))");
    p.psql("INSERT INTO t SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END, 'v' || g, 's' || g FROM generate_series(1, 20) g");
    p.psql("CREATE PUBLICATION pub FOR TABLE t (id, region, v) WHERE (region = 'eu')");
    r.configure(&["pub"], "", "");
    let running = r.start();
    let expected = "SELECT string_agg(id || ':' || v, ',' ORDER BY id) FROM t WHERE region = 'eu'";
    let published = || p.psql(expected);
    r.wait_subscriber(
        "SELECT string_agg(id || ':' || v, ',' ORDER BY id) FROM t",
        &published(),
    );
    p.wait_for_streaming(WAIT);
    p.psql("INSERT INTO t VALUES (21, 'us', 'x', 's'), (22, 'eu', 'y', 's')");
    // Rows leaving the filter are deleted, rows entering it inserted.
    p.psql("UPDATE t SET region = 'us' WHERE id IN (2, 4)");
    p.psql("UPDATE t SET region = 'eu' WHERE id IN (1, 3)");
    p.psql("UPDATE t SET v = 'changed', secret = 'changed' WHERE id IN (6, 7)");
    r.wait_subscriber(
        "SELECT string_agg(id || ':' || v, ',' ORDER BY id) FROM t",
        &published(),
    );
    assert_eq!(
        s.psql("SELECT count(*) FROM t WHERE secret <> 'not published' OR region <> 'eu'"),
        "0"
    );
    let status = running.stop(WAIT);
    assert!(status.success(), "exit {status}; log:\n{}", r.wb.log());
}

#[test]
fn fan_in_of_two_databases_with_renaming_and_a_source_column() {
    let publisher = Cluster::start();
    let subscriber = Cluster::start();
    let ddl = "CREATE TABLE orders (id int PRIMARY KEY, item text)";
    for db in ["shop_a", "shop_b"] {
        publisher.psql(&format!("CREATE DATABASE {db}"));
        publisher.psql_db(db, ddl);
        publisher.psql_db(
            db,
            &format!("INSERT INTO orders SELECT g, '{db} ' || g FROM generate_series(1, 5) g"),
        );
        publisher.psql_db(db, "CREATE PUBLICATION pub FOR TABLE orders");
        subscriber.psql(&format!(
            "CREATE SCHEMA {db}; CREATE TABLE {db}.orders (id int PRIMARY KEY, item text)"
        ));
    }
    // One table for both, told apart by a source column that is part of the key.
    subscriber
        .psql("CREATE TABLE all_orders (origin text, id int, item text, PRIMARY KEY (origin, id))");
    let wb = Deployment::new();
    let source = |name: &str| {
        format!(
            "[[source]]\nname = \"{name}\"\nconnection = \"{}\"\npublications = [\"pub\"]\n",
            publisher.connstr("postgres", name)
        )
    };
    wb.write_config(&format!(
        "data_dir = \"{}\"\n\n{}\n{}\n[[sink]]\nname = \"per_source\"\ntype = \"postgres\"\nconnection = \"{}\"\ntable = \"{{source}}.{{table}}\"\n\n[[sink]]\nname = \"combined\"\ntype = \"postgres\"\nconnection = \"{}\"\ntable = \"public.all_{{table}}\"\nsource_column = \"origin\"\n",
        wb.path().join("data").display(),
        source("shop_a"),
        source("shop_b"),
        subscriber.superuser(),
        subscriber.superuser()
    ));
    let running = wb.start();
    let wait = |sql: &str, expected: &str| {
        let got = subscriber.wait_for(sql, expected, WAIT);
        assert_eq!(got, expected, "`{sql}`; log:\n{}", wb.log());
    };
    wait("SELECT count(*) FROM all_orders", "10");
    for db in ["shop_a", "shop_b"] {
        let deadline = std::time::Instant::now() + WAIT;
        while publisher.psql("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")
            != "2"
        {
            assert!(std::time::Instant::now() < deadline, "not streaming");
            std::thread::sleep(Duration::from_millis(100));
        }
        publisher.psql_db(db, "INSERT INTO orders VALUES (6, 'six'); UPDATE orders SET item = 'upd' WHERE id = 1; DELETE FROM orders WHERE id = 2");
    }
    // Each source only ever touches its own rows.
    publisher.psql_db("shop_b", "TRUNCATE orders");
    publisher.psql_db(
        "shop_b",
        "INSERT INTO orders VALUES (100, 'after truncate')",
    );
    wait(
        "SELECT string_agg(origin || '/' || id || '=' || item, ',' ORDER BY origin, id) FROM all_orders",
        "shop_a/1=upd,shop_a/3=shop_a 3,shop_a/4=shop_a 4,shop_a/5=shop_a 5,shop_a/6=six,shop_b/100=after truncate",
    );
    for db in ["shop_a", "shop_b"] {
        assert_eq!(
            subscriber.table_digest("postgres", &format!("{db}.orders"), "*"),
            publisher.table_digest(db, "orders", "*"),
            "{db}; log:\n{}",
            wb.log()
        );
    }
    // Each source's progress is its own.
    assert_eq!(
        subscriber
            .psql("SELECT string_agg(roname, ',' ORDER BY roname) FROM pg_replication_origin"),
        "walbridge_combined_shop_a,walbridge_combined_shop_b,walbridge_per_source_shop_a,walbridge_per_source_shop_b"
    );
    // A source stopped on a conflict holds up neither the other source of
    // the same sink nor the other sink, however long it has been retrying.
    subscriber.psql("INSERT INTO shop_a.orders VALUES (50, 'local')");
    publisher.psql_db("shop_a", "INSERT INTO orders VALUES (50, 'remote')");
    wait_for_log(&wb, "conflict on target table shop_a.orders");
    // Long enough for the retries to back off to several seconds.
    std::thread::sleep(Duration::from_secs(8));
    publisher.psql_db(
        "shop_b",
        "INSERT INTO orders VALUES (200, 'while a is stopped')",
    );
    let got = subscriber.wait_for(
        "SELECT count(*) FROM shop_b.orders WHERE id = 200",
        "1",
        Duration::from_secs(6),
    );
    assert_eq!(got, "1", "shop_b waited for shop_a; log:\n{}", wb.log());
    wait(
        "SELECT count(*) FROM all_orders WHERE origin = 'shop_a' AND id = 50",
        "1",
    );
    assert_eq!(
        subscriber.psql("SELECT item FROM shop_a.orders WHERE id = 50"),
        "local"
    );
    subscriber.psql("DELETE FROM shop_a.orders WHERE id = 50");
    wait("SELECT item FROM shop_a.orders WHERE id = 50", "remote");
    let status = running.stop(WAIT);
    assert!(status.success(), "exit {status}; log:\n{}", wb.log());
}

#[test]
fn a_role_without_origins_uses_the_progress_table_and_check_reports_privileges() {
    let r = Replication::new("CREATE TABLE t (id int PRIMARY KEY, v text)");
    let (p, s) = (&r.publisher, &r.subscriber);
    if s.major() < 15 {
        return; // GRANT SET ON PARAMETER is PostgreSQL 15+
    }
    s.psql(
        "CREATE ROLE applier LOGIN;
         CREATE SCHEMA bookkeeping AUTHORIZATION applier;
         GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON t TO applier",
    );
    p.psql("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 10) g");
    p.psql("CREATE PUBLICATION pub FOR TABLE t");
    r.configure_as("applier", "progress_table = \"bookkeeping.progress\"");
    // Without the right to set session_replication_role, check says how to grant it.
    let (code, printed) = r.check();
    assert_eq!(code, Some(3), "{printed}");
    assert!(
        printed.contains("may not set session_replication_role")
            && printed.contains("GRANT SET ON PARAMETER session_replication_role TO \"applier\""),
        "{printed}"
    );
    s.psql("GRANT SET ON PARAMETER session_replication_role TO applier");
    let (code, printed) = r.check();
    assert_eq!(code, Some(0), "{printed}");
    assert!(
        printed.contains("ok: sink `replica`: target 127.0.0.1:"),
        "{printed}"
    );

    let running = r.start();
    r.wait_equal("t");
    p.wait_for_streaming(WAIT);
    p.psql("INSERT INTO t VALUES (11, 'eleven'); UPDATE t SET v = 'upd' WHERE id = 1");
    r.wait_equal("t");
    assert!(running.stop(WAIT).success(), "log:\n{}", r.wb.log());
    // The position is in the table, no origin was made, and a restart resumes after it.
    assert_eq!(s.psql("SELECT count(*) FROM pg_replication_origin"), "0");
    assert_eq!(
        s.psql("SELECT sink || '/' || source || ' ' || (lsn > '0/0') FROM bookkeeping.progress"),
        "replica/src true"
    );
    let running = r.start();
    p.psql("INSERT INTO t VALUES (12, 'twelve')");
    r.wait_equal("t");
    assert!(running.stop(WAIT).success(), "log:\n{}", r.wb.log());
    assert!(
        r.wb.log()
            .contains(r#"progress=table "bookkeeping"."progress""#),
        "{}",
        r.wb.log()
    );
    // `drop` takes the source's row out of the progress table too.
    let said = r.command_ok(&["drop"]);
    assert!(
        said.contains("source `src`: dropped slot `walbridge_src` and the state")
            && said.contains("sink `replica`: deleted 1 row(s) from bookkeeping.progress"),
        "{said}"
    );
    assert_eq!(s.psql("SELECT count(*) FROM bookkeeping.progress"), "0");
    assert_eq!(p.psql("SELECT count(*) FROM pg_replication_slots"), "0");
}

/// Every row of `t` in its text form, the same time zone on both sides.
fn rows_as_text(cluster: &Cluster) -> String {
    cluster.psql("SET TimeZone = 'UTC'; SELECT string_agg(t::text, E'\\n' ORDER BY id) FROM t")
}

fn wait_same_rows(r: &Replication) {
    let expected = rows_as_text(&r.publisher);
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let got = rows_as_text(&r.subscriber);
        if got == expected {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "rows differ:\npublisher:\n{expected}\nsubscriber:\n{got}\nlog:\n{}",
            r.wb.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Replicates a row of every type through the copy, then rows, updates and
/// a delete through the stream, comparing every row's text on both sides.
fn every_type_round_trips(r: &Replication) {
    for cluster in [&r.publisher, &r.subscriber] {
        cluster.psql(walbridge_tests::fixtures::TYPES_SCHEMA);
    }
    let p = &r.publisher;
    p.psql(&walbridge_tests::fixtures::TYPES_ROW.replace("ID", "1"));
    p.psql("CREATE PUBLICATION pub FOR TABLE t");
    r.configure(&["pub"], "", "");
    let running = r.start();
    wait_same_rows(r);
    p.wait_for_streaming(WAIT);
    p.psql(&walbridge_tests::fixtures::TYPES_ROW.replace("ID", "2"));
    p.psql("INSERT INTO t (id) VALUES (3), (4)");
    p.psql("UPDATE t SET num = -0.000001, tstz = '1999-12-31 23:59:59.999999-08', texts = '{}', comp = ROW(NULL, 'q\"uote'), rng = 'empty', iv = '-1 day' WHERE id = 2");
    p.psql("UPDATE t SET txt = 'updated', ints = NULL WHERE id = 1; DELETE FROM t WHERE id = 4");
    wait_same_rows(r);
    let status = running.stop(WAIT);
    assert!(status.success(), "exit {status}; log:\n{}", r.wb.log());
}

#[test]
fn every_type_round_trips_exactly_in_text_mode() {
    every_type_round_trips(&Replication::new("SELECT 1"));
}

#[test]
fn every_type_but_composites_round_trips_exactly_in_binary_mode() {
    let r = Replication::new(walbridge_tests::fixtures::TYPES_SCHEMA);
    let (p, s) = (&r.publisher, &r.subscriber);
    // The enum and domain get other OIDs on the subscriber than on the publisher.
    s.psql("CREATE TYPE unrelated AS ENUM ('x')");
    p.psql("ALTER TABLE t DROP COLUMN comp");
    s.psql("ALTER TABLE t DROP COLUMN comp");
    p.psql("CREATE PUBLICATION pub FOR TABLE t");
    r.configure(&["pub"], "binary = true", "");
    let running = r.start();
    p.wait_for_streaming(WAIT);
    p.psql(
        &walbridge_tests::fixtures::TYPES_ROW
            .replace(", ROW(1, 'x')", "")
            .replace("ID", "1"),
    );
    p.psql("INSERT INTO t (id) VALUES (2)");
    p.psql("UPDATE t SET moods = '{sad,NULL}', ints = '{{1,2},{3,4}}', dom = 9 WHERE id = 1");
    wait_same_rows(&r);
    // Composites embed the publisher's type OIDs: refused with what to do.
    p.psql("ALTER TABLE t ADD COLUMN comp pair");
    s.psql("ALTER TABLE t ADD COLUMN comp pair");
    p.psql("INSERT INTO t (id, comp) VALUES (3, ROW(1, 'x'))");
    let log = wait_for_log(
        &r.wb,
        "column \"comp\" of target table public.t has type pair",
    );
    assert!(log.contains("set `binary = false` on the source"), "{log}");
    drop(running);
}

#[test]
fn partitioned_publisher_into_plain_tables_and_the_reverse() {
    let r = Replication::new("SELECT 1");
    let (p, s) = (&r.publisher, &r.subscriber);
    p.psql(
        "CREATE TABLE measurements (id int, region text, v int, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
         CREATE TABLE measurements_eu PARTITION OF measurements FOR VALUES IN ('eu');
         CREATE TABLE measurements_us PARTITION OF measurements FOR VALUES IN ('us');
         CREATE TABLE events (id int, year int, what text, PRIMARY KEY (id, year)) PARTITION BY RANGE (year);
         CREATE TABLE events_2024 PARTITION OF events FOR VALUES FROM (2024) TO (2025);
         CREATE TABLE events_2025 PARTITION OF events FOR VALUES FROM (2025) TO (2026);
         CREATE TABLE readings (id int PRIMARY KEY, region text, v int)",
    );
    s.psql(
        "CREATE TABLE measurements (id int, region text, v int, PRIMARY KEY (id, region));
         CREATE TABLE events (id int, year int, what text, PRIMARY KEY (id, year));
         CREATE TABLE readings (id int, region text, v int, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
         CREATE TABLE readings_eu PARTITION OF readings FOR VALUES IN ('eu');
         CREATE TABLE readings_other PARTITION OF readings DEFAULT",
    );
    p.psql("INSERT INTO measurements SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END, g FROM generate_series(1, 10) g");
    p.psql("INSERT INTO events SELECT g, 2024 + g % 2, 'e' || g FROM generate_series(1, 10) g");
    p.psql("INSERT INTO readings SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END, g FROM generate_series(1, 10) g");
    // measurements through its root; events as its partitions, routed by walbridge into the one target table.
    p.psql("CREATE PUBLICATION via_root FOR TABLE measurements WITH (publish_via_partition_root = true)");
    p.psql("CREATE PUBLICATION leaves FOR TABLE events, readings");
    r.configure(&["via_root", "leaves"], "", "");
    let running = r.start();
    for table in ["measurements", "events", "readings"] {
        r.wait_equal(table);
    }
    p.wait_for_streaming(WAIT);
    p.psql("INSERT INTO measurements VALUES (11, 'eu', 11); UPDATE measurements SET region = 'eu' WHERE id = 1; UPDATE measurements SET v = -v WHERE id = 2; DELETE FROM measurements WHERE id = 3");
    p.psql("INSERT INTO events VALUES (11, 2025, 'new'); UPDATE events SET year = 2024 WHERE id = 1; UPDATE events SET what = 'upd' WHERE id = 2; DELETE FROM events WHERE id = 3");
    p.psql("INSERT INTO readings VALUES (11, 'eu', 11); UPDATE readings SET region = 'eu' WHERE id = 1; UPDATE readings SET region = 'asia' WHERE id = 2; DELETE FROM readings WHERE id = 4");
    for table in ["measurements", "events", "readings"] {
        r.wait_equal(table);
    }
    // Rows moved between the subscriber's own partitions.
    assert_eq!(
        s.psql("SELECT count(*) FROM readings_eu"),
        p.psql("SELECT count(*) FROM readings WHERE region = 'eu'")
    );
    // A TRUNCATE of one routed partition would empty the others' rows too: the sink stops.
    p.psql("TRUNCATE events_2024");
    p.psql("INSERT INTO events VALUES (12, 2025, 'after')");
    let log = wait_for_log(
        &r.wb,
        "TRUNCATE of partition public.events_2024 cannot be applied",
    );
    assert!(log.contains("publish_via_partition_root = true"), "{log}");
    let out = r.wb.command(&["skip", "--sink", "replica"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    r.wait_subscriber("SELECT count(*) FROM events WHERE id = 12", "1");
    let status = running.stop(WAIT);
    assert!(status.success(), "exit {status}; log:\n{}", r.wb.log());
}

/// A walbridge from `from` (publication `pub`, extra source keys) into
/// `into` with a postgres sink named `sink`.
fn bridge(from: &Cluster, into: &Cluster, sink: &str, source_extra: &str) -> Deployment {
    let wb = Deployment::new();
    wb.configure_sinks(
        &from.superuser(),
        &["pub"],
        source_extra,
        &format!(
            "[[sink]]\nname = \"{sink}\"\ntype = \"postgres\"\nconnection = \"{}\"\n",
            into.superuser()
        ),
    );
    wb
}

fn wait_same(a: &Cluster, b: &Cluster, table: &str, logs: &[&Deployment]) {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let (x, y) = (
            a.table_digest("postgres", table, "*"),
            b.table_digest("postgres", table, "*"),
        );
        if x == y {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{table} differs: {x} vs {y}; logs:\n{}",
            logs.iter()
                .map(|d| d.log())
                .collect::<Vec<_>>()
                .join("\n----\n")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn cascade_a_to_b_to_c() {
    let ddl = "CREATE TABLE t (id int PRIMARY KEY, v text)";
    let [a, b, c] = [Cluster::start(), Cluster::start(), Cluster::start()];
    for cluster in [&a, &b, &c] {
        cluster.psql(ddl);
    }
    a.psql("INSERT INTO t SELECT g, 'a' || g FROM generate_series(1, 10) g");
    a.psql("CREATE PUBLICATION pub FOR TABLE t");
    b.psql("CREATE PUBLICATION pub FOR TABLE t");
    let ab = bridge(&a, &b, "from_a", "");
    let bc = bridge(&b, &c, "from_b", "");
    let running_ab = ab.start();
    let running_bc = bc.start();
    wait_same(&a, &c, "t", &[&ab, &bc]);
    a.wait_for_streaming(WAIT);
    b.wait_for_streaming(WAIT);
    a.psql("INSERT INTO t VALUES (11, 'new'); UPDATE t SET v = 'upd' WHERE id <= 3; DELETE FROM t WHERE id = 10");
    wait_same(&a, &c, "t", &[&ab, &bc]);
    wait_same(&a, &b, "t", &[&ab, &bc]);
    assert!(running_ab.stop(WAIT).success(), "{}", ab.log());
    assert!(running_bc.stop(WAIT).success(), "{}", bc.log());
}

#[test]
fn bidirectional_without_loops_using_origin_none() {
    let ddl = "CREATE TABLE t (id int PRIMARY KEY, v text, at text)";
    let a = Cluster::builder().at_least(16).start();
    let b = Cluster::builder().at_least(16).start();
    for cluster in [&a, &b] {
        cluster.psql(ddl);
        cluster.psql("CREATE PUBLICATION pub FOR TABLE t");
    }
    a.psql("INSERT INTO t SELECT g, 'v', 'a' FROM generate_series(1, 5) g");
    // A's rows reach B through the copy; B → A must not copy them back.
    let ab = bridge(&a, &b, "from_a", "origin = \"none\"");
    let ba = bridge(&b, &a, "from_b", "origin = \"none\"\ncopy_data = false");
    let running_ab = ab.start();
    wait_same(&a, &b, "t", &[&ab]);
    let running_ba = ba.start();
    a.wait_for_streaming(WAIT);
    b.wait_for_streaming(WAIT);
    a.psql(
        "INSERT INTO t VALUES (100, 'from a', 'a'); UPDATE t SET v = 'changed on a' WHERE id = 1",
    );
    b.psql("INSERT INTO t VALUES (200, 'from b', 'b'); UPDATE t SET v = 'changed on b' WHERE id = 2; DELETE FROM t WHERE id = 3");
    wait_same(&a, &b, "t", &[&ab, &ba]);
    assert_eq!(
        a.psql("SELECT string_agg(id || '=' || v, ',' ORDER BY id) FROM t"),
        "1=changed on a,2=changed on b,4=v,5=v,100=from a,200=from b"
    );
    // Nothing comes back around: a while later both are unchanged, and
    // neither sink met a conflict (a looping insert would hit its own row).
    std::thread::sleep(Duration::from_secs(2));
    wait_same(&a, &b, "t", &[&ab, &ba]);
    for wb in [&ab, &ba] {
        assert!(!wb.log().contains("conflict"), "{}", wb.log());
    }
    assert!(running_ab.stop(WAIT).success(), "{}", ab.log());
    assert!(running_ba.stop(WAIT).success(), "{}", ba.log());
}

/// The type round trip from a `from`-version publisher into an
/// `into`-version subscriber.
fn across_versions(from: u32, into: u32) {
    let publisher = Cluster::builder().version(from).start();
    let subscriber = Cluster::builder().version(into).start();
    assert_eq!((publisher.major(), subscriber.major()), (from, into));
    every_type_round_trips(&Replication {
        publisher,
        subscriber,
        wb: Deployment::new(),
    });
}

#[test]
fn from_postgres_14_into_17() {
    across_versions(14, 17);
}

#[test]
fn from_postgres_17_into_15() {
    across_versions(17, 15);
}

#[test]
fn a_value_the_target_cannot_hold_names_column_and_types() {
    let r = Replication::new("SELECT 1");
    let (p, s) = (&r.publisher, &r.subscriber);
    p.psql("CREATE TABLE t (id int PRIMARY KEY, code varchar(10), n int)");
    s.psql("CREATE TABLE t (id int PRIMARY KEY, code varchar(3), n int)");
    p.psql("CREATE PUBLICATION pub FOR TABLE t");
    r.configure(&["pub"], "", "");
    let running = r.start();
    p.wait_for_streaming(WAIT);
    p.psql("INSERT INTO t VALUES (1, 'abc', 1)");
    r.wait_subscriber("SELECT count(*) FROM t", "1");
    // Batched with others first; the failing batch is redone row by row.
    let xid = p.psql("BEGIN; INSERT INTO t VALUES (2, 'ok', 2); INSERT INTO t VALUES (3, 'too long', 3); SELECT txid_current(); COMMIT");
    p.psql("INSERT INTO t VALUES (4, 'yes', 4)");
    let log = wait_for_log(&r.wb, "value does not fit the target");
    let line = log
        .lines()
        .find(|l| l.contains("value does not fit the target"))
        .unwrap_or_default();
    assert!(
        line.contains("column \"code\" of target table public.t is character varying(3) (the publisher's is varchar(10))")
            && line.contains("value too long for type character varying(3)")
            && line.contains(&format!("stopped on transaction {xid} of source `src`")),
        "{line}"
    );
    // Never silently truncated; nothing of that transaction or after it is in.
    assert_eq!(
        s.psql("SELECT string_agg(id || '=' || code, ',' ORDER BY id) FROM t"),
        "1=abc"
    );
    s.psql("ALTER TABLE t ALTER COLUMN code TYPE varchar(10)");
    r.wait_equal("t");
    let status = running.stop(WAIT);
    assert!(status.success(), "exit {status}; log:\n{}", r.wb.log());
}

#[test]
fn the_copy_refuses_a_target_with_rows_unless_told_to_empty_it_and_names_missing_tables() {
    let r = Replication::new("CREATE TABLE t (id int PRIMARY KEY, v text)");
    let (p, s) = (&r.publisher, &r.subscriber);
    p.psql("CREATE TABLE only_on_publisher (id int PRIMARY KEY)");
    p.psql("INSERT INTO t SELECT g, 'p' || g FROM generate_series(1, 5) g");
    s.psql("INSERT INTO t VALUES (100, 'stale')");
    p.psql("CREATE PUBLICATION pub FOR TABLE t");
    r.configure(&["pub"], "", "");
    let running = r.start();
    let log = wait_for_log(&r.wb, "target table public.t already holds rows");
    assert!(log.contains("set truncate_before_copy = true"), "{log}");
    running.kill();
    assert_eq!(s.psql("SELECT count(*) FROM t"), "1");
    r.configure(&["pub"], "", "truncate_before_copy = true");
    let running = r.start();
    r.wait_equal("t");
    p.wait_for_streaming(WAIT);
    // A table added to the publication that the target lacks is named.
    p.psql("ALTER PUBLICATION pub ADD TABLE only_on_publisher");
    p.psql("INSERT INTO only_on_publisher VALUES (1)");
    let log = wait_for_log(
        &r.wb,
        "target table public.only_on_publisher does not exist",
    );
    assert!(
        log.contains("(it receives source table public.only_on_publisher)"),
        "{log}"
    );
    s.psql("CREATE TABLE only_on_publisher (id int PRIMARY KEY)");
    r.wait_equal("only_on_publisher");
    let status = running.stop(WAIT);
    assert!(status.success(), "exit {status}; log:\n{}", r.wb.log());
}

/// Makes the subscriber's progress table refuse to store any row for which
/// `refused` (a condition on `NEW`) holds, with the error "held by the
/// test: <source>": an ENABLE ALWAYS trigger, so it fires while applying.
fn hold_progress_rows(s: &Cluster, refused: &str) {
    s.psql(&format!(
        "CREATE TABLE public.walbridge_progress (sink text NOT NULL, source text NOT NULL, \
           lsn pg_lsn NOT NULL, commit_time timestamptz, updated_at timestamptz NOT NULL DEFAULT now(), \
           PRIMARY KEY (sink, source));
         CREATE FUNCTION refuse_held() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN
             IF {refused} THEN RAISE EXCEPTION 'held by the test: %', NEW.source; END IF;
             RETURN NEW;
           END $$;
         CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON walbridge_progress FOR EACH ROW EXECUTE FUNCTION refuse_held();
         ALTER TABLE walbridge_progress ENABLE ALWAYS TRIGGER refuse"
    ));
}

#[test]
fn an_interrupted_parallel_copy_copies_again_only_the_lanes_that_did_not_commit() {
    // `keyed` has a primary key (a second copy of a row would fail), `bag`
    // none (it would count twice); together about 4 MB of COPY text, so
    // both lanes get records of both.
    let r = Replication::new(
        "CREATE TABLE keyed (id int PRIMARY KEY, pad text);
         CREATE TABLE bag (id int, pad text)",
    );
    let (p, s) = (&r.publisher, &r.subscriber);
    p.psql("INSERT INTO keyed SELECT g, repeat('k', 60) FROM generate_series(1, 30000) g");
    p.psql("INSERT INTO bag SELECT g % 1000, repeat('b', 60) FROM generate_series(1, 30000) g");
    p.psql("CREATE PUBLICATION pub FOR TABLE keyed, bag");
    // The test holds back the commit of whichever marker `hold` names.
    s.psql("CREATE TABLE hold (source text); INSERT INTO hold VALUES ('src/copy 1 of 2')");
    hold_progress_rows(s, "NEW.source IN (SELECT source FROM hold)");
    r.configure(&["pub"], "", "progress = \"table\"\ncopy_connections = 2");
    let running = r.start();
    let markers =
        "SELECT coalesce(string_agg(source, ',' ORDER BY source), '') FROM walbridge_progress";
    // Lane 0 commits, lane 1 cannot: part of the rows is in, and stays in
    // while the sink retries.
    wait_for_log(&r.wb, "held by the test: src/copy 1 of 2");
    r.wait_subscriber(markers, "src/copy 0 of 2");
    let partial: u64 = s
        .psql("SELECT (SELECT count(*) FROM keyed) + (SELECT count(*) FROM bag)")
        .parse()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        partial > 0 && partial < 60000,
        "{partial} rows after lane 0"
    );
    // Now lane 1 commits (copying only its own records again), the source's
    // position cannot.
    s.psql("UPDATE hold SET source = 'src'");
    r.wait_subscriber(markers, "src/copy 0 of 2,src/copy 1 of 2");
    r.wait_equal("keyed");
    r.wait_equal("bag");
    // Then the position: the copy is done, the markers go, streaming starts.
    s.psql("DELETE FROM hold");
    r.wait_subscriber(markers, "src");
    p.wait_for_streaming(WAIT);
    p.psql("INSERT INTO bag VALUES (-1, 'after'); UPDATE keyed SET pad = 'changed' WHERE id <= 10");
    r.wait_equal("keyed");
    r.wait_equal("bag");
    let log = r.wb.log();
    assert!(
        log.lines()
            .any(|l| l.contains("resuming the initial copy") && l.ends_with("committed=0")),
        "{log}"
    );
    assert!(running.stop(WAIT).success(), "log:\n{}", r.wb.log());
}

/// Every index of the subscriber's tables but walbridge's, with what a
/// rebuild must keep: definition, constraint, replica identity,
/// clustering; and the foreign keys.
fn index_catalog(s: &Cluster) -> String {
    s.psql(
        "SELECT string_agg(d, E'\\n' ORDER BY d) FROM ( \
           SELECT format('%s | %s | %s | replident %s | clustered %s | %s', i.indrelid::regclass, \
                         pg_get_indexdef(i.indexrelid), coalesce(pg_get_constraintdef(c.oid), '-'), \
                         i.indisreplident, i.indisclustered, coalesce(obj_description(i.indexrelid, 'pg_class'), '-')) \
           FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid \
           LEFT JOIN pg_constraint c ON c.conindid = i.indexrelid AND c.contype IN ('p', 'u', 'x') \
           WHERE t.relnamespace = 'public'::regnamespace AND t.relname NOT LIKE 'walbridge%' \
           UNION ALL SELECT format('%s | %s', conrelid::regclass, pg_get_constraintdef(oid)) \
           FROM pg_constraint WHERE contype = 'f') d(d)",
    )
}

/// `1` once the sink stored a position of source `src` (the initial copy
/// is complete), else `0`.
const POSITION_STORED: &str = "SELECT count(*) FROM pg_replication_origin_status s \
    JOIN pg_replication_origin o ON o.roident = s.local_id \
    WHERE o.roname = 'walbridge_replica_src' AND s.remote_lsn > '0/0'";

/// Rows left in the records of indexes deferred past the copy.
fn deferred_records(s: &Cluster) -> String {
    s.psql(
        "SELECT CASE WHEN to_regclass('public.walbridge_deferred_indexes') IS NULL THEN 'none' \
           ELSE (SELECT count(*)::text FROM public.walbridge_deferred_indexes) END",
    )
}

#[test]
fn the_copy_builds_the_target_indexes_after_the_rows_and_keeps_those_it_cannot_rebuild() {
    let r = Replication::new(
        "CREATE TABLE parent (id int PRIMARY KEY, code text UNIQUE DEFERRABLE INITIALLY DEFERRED, \
                              span int4range, note text, EXCLUDE USING gist (span WITH &&));
         CREATE INDEX parent_note ON parent (lower(note)) WHERE note IS NOT NULL;
         CREATE TABLE child (id int PRIMARY KEY, parent_id int REFERENCES parent (id), tag text NOT NULL);
         CREATE INDEX child_lower_tag ON child (lower(tag)) WITH (fillfactor = 70);
         CREATE UNIQUE INDEX child_tag_id ON child (tag, id);
         ALTER TABLE child REPLICA IDENTITY USING INDEX child_tag_id;
         CREATE INDEX child_parent ON child (parent_id);
         ALTER TABLE child CLUSTER ON child_parent;
         CREATE INDEX child_commented ON child (tag);
         COMMENT ON INDEX child_commented IS 'kept';
         CREATE TABLE events (id int, at date, PRIMARY KEY (id, at))",
    );
    let (p, s) = (&r.publisher, &r.subscriber);
    // On the target, events is partitioned: its indexes hang together.
    s.psql(
        "DROP TABLE events;
         CREATE TABLE events (id int, at date, PRIMARY KEY (id, at)) PARTITION BY RANGE (at);
         CREATE TABLE events_2026 PARTITION OF events FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')",
    );
    p.psql(
        "INSERT INTO parent SELECT g, 'c' || g, int4range(g * 10, g * 10 + 5), CASE WHEN g % 3 = 0 THEN 'N' || g END \
           FROM generate_series(1, 20000) g;
         INSERT INTO child SELECT g, g % 20000 + 1, 'tag' || g FROM generate_series(1, 40000) g;
         INSERT INTO events SELECT g, date '2026-01-01' + g % 300 FROM generate_series(1, 500) g;
         CREATE PUBLICATION pub FOR TABLE parent, child, events",
    );
    let before = index_catalog(s);
    r.configure(&["pub"], "", "");
    let running = r.start();
    r.wait_subscriber(POSITION_STORED, "1");
    for table in ["parent", "child", "events"] {
        r.wait_equal(table);
    }
    // Every index is back as it was, and nothing is left recorded.
    assert_eq!(index_catalog(s), before, "log:\n{}", r.wb.log());
    assert_eq!(deferred_records(s), "0");
    // Dropped were exactly those a definition rebuilds: not the key a
    // foreign key references, the replica identity, the clustering index,
    // a commented one, nor a partitioned table's.
    let log = r.wb.log();
    let dropped: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("dropped the table's indexes for the initial copy"))
        .filter_map(|l| l.split_once(" table=").map(|(_, rest)| rest))
        .filter_map(|rest| rest.split_once(" records=").map(|(kept, _)| kept))
        .collect();
    let mut dropped = dropped;
    dropped.sort();
    assert_eq!(
        dropped,
        [
            "public.child indexes=public.child_pkey, public.child_lower_tag",
            "public.parent indexes=public.parent_code_key, public.parent_span_excl, public.parent_note",
        ],
        "{log}"
    );
    // The rebuilt ones work: the deferred unique constraint and the
    // exclusion constraint still refuse on the target.
    assert!(
        s.psql_result("INSERT INTO parent VALUES (-1, 'c1', int4range(-10, -5))")
            .is_err()
    );
    assert!(
        s.psql_result("INSERT INTO parent VALUES (-2, 'new', int4range(10, 12))")
            .is_err()
    );
    p.psql("UPDATE child SET tag = 'changed' WHERE id <= 10; UPDATE parent SET note = 'updated' WHERE id <= 10");
    r.wait_equal("child");
    r.wait_equal("parent");
    assert!(running.stop(WAIT).success(), "log:\n{}", r.wb.log());
}

#[test]
fn indexes_dropped_by_a_copy_that_never_finished_are_recorded_and_built_by_drop() {
    let r = Replication::new(
        "CREATE TABLE keyed (id int PRIMARY KEY, pad text);
         CREATE INDEX keyed_pad ON keyed (pad)",
    );
    let (p, s) = (&r.publisher, &r.subscriber);
    p.psql("INSERT INTO keyed SELECT g, repeat('k', 60) || g FROM generate_series(1, 30000) g");
    p.psql("CREATE PUBLICATION pub FOR TABLE keyed");
    let before = index_catalog(s);
    // Lane 1 cannot commit (see the interrupted parallel copy test), so
    // the copy never ends.
    hold_progress_rows(s, "NEW.source = 'src/copy 1 of 2'");
    r.configure(&["pub"], "", "progress = \"table\"\ncopy_connections = 2");
    let running = r.start();
    wait_for_log(&r.wb, "held by the test: src/copy 1 of 2");
    running.kill();
    // Dropped, and recorded in the same transaction.
    assert_eq!(
        s.psql("SELECT count(*) FROM pg_indexes WHERE tablename = 'keyed'"),
        "0"
    );
    assert_eq!(deferred_records(s), "2");
    // The operator gives up on this copy: drop builds them again.
    let said = r.command_ok(&["drop"]);
    assert!(
        said.contains("sink `replica`: built index public.keyed_pkey of public.keyed again")
            && said.contains("sink `replica`: built index public.keyed_pad of public.keyed again"),
        "{said}"
    );
    assert_eq!(index_catalog(s), before);
    assert_eq!(deferred_records(s), "0");
}

#[test]
fn an_index_the_copied_rows_break_stops_the_copy_until_the_rows_fit() {
    // The publisher allows duplicate codes; the target's unique index does
    // not. Only the rebuild after the copy can find that out.
    let r = Replication::new("CREATE TABLE dup (id int PRIMARY KEY, code int)");
    let (p, s) = (&r.publisher, &r.subscriber);
    s.psql("CREATE UNIQUE INDEX dup_code ON dup (code)");
    p.psql("INSERT INTO dup SELECT g, g FROM generate_series(1, 5000) g; UPDATE dup SET code = 7 WHERE id = 4000");
    p.psql("CREATE PUBLICATION pub FOR TABLE dup");
    let before = index_catalog(s);
    r.configure(&["pub"], "", "");
    let running = r.start();
    let log = wait_for_log(
        &r.wb,
        "building index public.dup_code of target table public.dup again after the initial copy of source `src`",
    );
    assert!(
        log.contains("Key (code)=(7) is duplicated")
            && log.contains("make the rows fit (delete duplicates the index refuses)"),
        "{log}"
    );
    // Nothing streams meanwhile: the copy's position is not stored.
    assert_eq!(s.psql(POSITION_STORED), "0");
    // The operator removes the duplicate on the target: the next attempt
    // builds the index, and the copy completes.
    s.psql("DELETE FROM dup WHERE id = 4000");
    r.wait_subscriber(POSITION_STORED, "1");
    assert_eq!(index_catalog(s), before);
    assert_eq!(deferred_records(s), "0");
    p.wait_for_streaming(WAIT);
    p.psql("INSERT INTO dup VALUES (6000, 6000)");
    r.wait_subscriber("SELECT count(*) FROM dup", "5000");
    assert!(running.stop(WAIT).success(), "log:\n{}", r.wb.log());
}

#[test]
fn check_maps_every_published_table_onto_the_target_before_streaming() {
    let r = Replication::new("SELECT 1");
    let (p, s) = (&r.publisher, &r.subscriber);
    p.psql("CREATE TABLE a (id int PRIMARY KEY, x text); CREATE TABLE b (id int PRIMARY KEY)");
    s.psql("CREATE TABLE a (id int PRIMARY KEY)");
    p.psql("CREATE PUBLICATION pub FOR TABLE a, b");
    r.configure(&["pub"], "", "");
    let (code, printed) = r.check();
    assert_eq!(code, Some(3), "{printed}");
    assert!(
        printed.contains("error: sink `replica`: target table public.a has no column \"x\" (text on the publisher")
            && printed.contains("error: sink `replica`: target table public.b does not exist"),
        "{printed}"
    );
    s.psql("ALTER TABLE a ADD COLUMN x text; CREATE TABLE b (id int PRIMARY KEY)");
    let (code, printed) = r.check();
    assert_eq!(code, Some(0), "{printed}");
    assert!(
        printed.contains(
            "ok: sink `replica`: the 2 table(s) source `src` publishes map onto the target"
        ),
        "{printed}"
    );
}

/// The SQL block of the README marked `<!-- tested: target role -->`.
fn readme_target_role() -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let readme =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let after = readme
        .split("<!-- tested: target role -->")
        .nth(1)
        .unwrap_or_else(|| panic!("the README lost its tested target-role block"));
    let block = after
        .split("```sql\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .unwrap_or_else(|| panic!("no SQL block after the target-role marker"));
    block.to_owned()
}

#[test]
fn the_readme_least_privilege_target_role_runs() {
    let r = Replication::new("CREATE TABLE t (id int PRIMARY KEY, v text)");
    let (p, s) = (&r.publisher, &r.subscriber);
    if s.major() < 15 {
        return; // the README's block is for PostgreSQL 15+ (GRANT SET ON PARAMETER)
    }
    s.psql(&readme_target_role());
    p.psql("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 10) g");
    p.psql("CREATE PUBLICATION pub FOR TABLE t");
    r.configure_as("replicator", "progress_table = \"walbridge.progress\"");
    let (code, printed) = r.check();
    assert_eq!(code, Some(0), "{printed}");
    let running = r.start();
    r.wait_equal("t");
    p.wait_for_streaming(WAIT);
    p.psql("INSERT INTO t VALUES (11, 'eleven'); UPDATE t SET v = 'upd' WHERE id = 1; DELETE FROM t WHERE id = 2; TRUNCATE t; INSERT INTO t VALUES (12, 'after truncate')");
    r.wait_equal("t");
    assert!(running.stop(WAIT).success(), "log:\n{}", r.wb.log());
}

#[test]
fn check_finds_a_role_that_cannot_create_the_progress_table() {
    let r = Replication::new("CREATE TABLE t (id int PRIMARY KEY, v text)");
    let (p, s) = (&r.publisher, &r.subscriber);
    if s.major() < 15 {
        return; // GRANT SET ON PARAMETER is PostgreSQL 15+
    }
    // As on PostgreSQL 15+ by default: ordinary roles may not create in public.
    s.psql(
        "REVOKE CREATE ON SCHEMA public FROM PUBLIC;
         CREATE ROLE applier LOGIN;
         GRANT SET ON PARAMETER session_replication_role TO applier;
         GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON t TO applier",
    );
    p.psql("CREATE PUBLICATION pub FOR TABLE t");
    r.configure_as("applier", "");
    let (code, printed) = r.check();
    assert_eq!(code, Some(3), "{printed}");
    assert!(
        printed.contains("cannot store its progress in \"public\".\"walbridge_progress\"")
            && printed.contains("GRANT CREATE ON SCHEMA \"public\" TO \"applier\""),
        "{printed}"
    );
    // The grant it names is enough.
    s.psql("GRANT CREATE ON SCHEMA public TO applier");
    let (code, printed) = r.check();
    assert_eq!(code, Some(0), "{printed}");
    // Once the table exists, writing it is what counts.
    s.psql("CREATE TABLE public.walbridge_progress (sink text, source text, lsn pg_lsn, commit_time timestamptz, updated_at timestamptz, PRIMARY KEY (sink, source))");
    let (code, printed) = r.check();
    assert_eq!(code, Some(3), "{printed}");
    assert!(
        printed.contains(
            "GRANT SELECT, INSERT, UPDATE ON \"public\".\"walbridge_progress\" TO \"applier\""
        ),
        "{printed}"
    );
}

#[test]
fn drop_cleans_the_target_and_with_keep_slot_needs_neither_publisher_nor_target() {
    let r = Replication::new("CREATE TABLE t (id int PRIMARY KEY, v text)");
    let (p, s) = (&r.publisher, &r.subscriber);
    p.psql("CREATE PUBLICATION pub FOR TABLE t");
    r.configure(&["pub"], "copy_data = false", "");
    let applied_once = |id: i32| {
        let running = r.start();
        p.wait_for_streaming(WAIT);
        p.psql(&format!("INSERT INTO t VALUES ({id}, 'v')"));
        r.wait_equal("t");
        assert!(running.stop(WAIT).success(), "{}", r.wb.log());
        assert_eq!(
            s.psql("SELECT roname FROM pg_replication_origin"),
            "walbridge_replica_src"
        );
    };

    // Both reachable: the slot, the state and the target's origin go.
    applied_once(1);
    let said = r.command_ok(&["drop"]);
    assert_eq!(
        said,
        "source `src`: dropped slot `walbridge_src` and the state\n\
         sink `replica`: dropped replication origin walbridge_replica_src\n"
    );
    assert_eq!(p.psql("SELECT count(*) FROM pg_replication_slots"), "0");
    assert_eq!(s.psql("SELECT count(*) FROM pg_replication_origin"), "0");

    // Both gone: drop says to keep the slot; --keep-slot removes the local
    // state and says exactly what is left where, and how to remove it.
    applied_once(2);
    p.stop();
    s.stop();
    let out = r.wb.command(&["drop"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("cannot drop the slot of source `src`")
            && said.contains("`walbridge drop --keep-slot` removes walbridge's state without it"),
        "{said}"
    );
    assert!(r.wb.path().join("data/sources/src").exists());
    let said = r.command_ok(&["drop", "--keep-slot"]);
    let slot_sql = "SELECT pg_drop_replication_slot('walbridge_src');";
    assert!(
        said.contains(&format!(
            "source `src`: state removed; slot `walbridge_src` kept on 127.0.0.1:{}/postgres (--keep-slot). It holds WAL on the publisher until it is dropped there: {slot_sql}",
            p.port()
        )) && said.contains("sink `replica`: left for source `src`: nothing removed from the target: "),
        "{said}"
    );
    assert!(!r.wb.path().join("data/sources/src").exists());
    let origin_sql = said
        .lines()
        .find_map(|l| {
            l.split_once(
                "replication origin walbridge_replica_src (and its copy lanes), if it exists: ",
            )
        })
        .map(|(_, sql)| sql.to_owned())
        .unwrap_or_else(|| panic!("no origin to drop by hand in:\n{said}"));
    assert!(
        said.contains(
            "DELETE FROM public.walbridge_progress WHERE sink = 'replica' AND (source = 'src'"
        ),
        "{said}"
    );
    // What it printed is what removes what was left.
    p.start_again();
    s.start_again();
    assert_eq!(p.psql("SELECT count(*) FROM pg_replication_slots"), "1");
    p.psql(slot_sql);
    assert_eq!(p.psql("SELECT count(*) FROM pg_replication_slots"), "0");
    assert_eq!(s.psql("SELECT count(*) FROM pg_replication_origin"), "1");
    s.psql(&origin_sql);
    assert_eq!(s.psql("SELECT count(*) FROM pg_replication_origin"), "0");
}
