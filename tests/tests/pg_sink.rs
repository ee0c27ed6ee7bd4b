//! The postgres sink against real clusters: a publisher, walbridge, and a
//! separate subscriber cluster, checked with psql.

use std::time::Duration;

use walbridge_tests::Cluster;
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
        self.wb.configure_sinks(
            &self.publisher.superuser(),
            publications,
            source_extra,
            &format!(
                "[[sink]]\nname = \"replica\"\ntype = \"postgres\"\nconnection = \"{}\"\n{sink_extra}\n",
                self.subscriber.superuser()
            ),
        );
    }

    fn start(&self) -> Running {
        self.wb.start()
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
    let status = running.stop(WAIT);
    assert!(status.success(), "exit {status}; log:\n{}", r.wb.log());
}
