//! walbridge reading another walbridge's change feed (`[[source]] type =
//! "grpc"`): PG A → walbridge 1 (feed) → walbridge 2 → postgres sink into
//! B, exactly once whichever of the two is killed; and several feeds fanned
//! into one target.

use std::time::Duration;

use walbridge_tests::fixtures::{
    Rng, WORKLOAD_SCHEMA, assert_replays_to_publisher, assert_workload_replicated, crash_seed,
    transaction,
};
use walbridge_tests::walbridge::{Deployment, Running};
use walbridge_tests::{Cluster, feed, free_port};

const WAIT: Duration = Duration::from_secs(300);

/// The feed's walbridge: the publisher's source `src`, a feed on `port`
/// that keeps its log for the downstream walbridge's `consumer`.
fn upstream(publisher: &Cluster, port: u16, consumer: &str) -> Deployment {
    let wb = Deployment::new();
    wb.configure_sinks(
        &publisher.superuser(),
        &["pub"],
        "status_interval = 1",
        &feed::sink(
            &format!("127.0.0.1:{port}"),
            &format!("consumers = [\"{consumer}\"]"),
        ),
    );
    wb
}

/// A walbridge whose sources are the feeds on `ports` (the first named
/// `src`, the others `src2`, …) and whose sink is a postgres target.
fn downstream(ports: &[u16], target: &Cluster, sink_extra: &str) -> Deployment {
    let wb = Deployment::new();
    let sources: String = ports
        .iter()
        .enumerate()
        .map(|(i, port)| {
            let name = match i {
                0 => "src".to_owned(),
                i => format!("src{}", i + 1),
            };
            format!(
                "[[source]]\nname = \"{name}\"\ntype = \"grpc\"\nurl = \"http://127.0.0.1:{port}\"\n\n"
            )
        })
        .collect();
    wb.write_config(&format!(
        "data_dir = \"{}\"\n\n{sources}[[sink]]\nname = \"replica\"\ntype = \"postgres\"\nconnection = \"{}\"\n{sink_extra}\n",
        wb.path().join("data").display(),
        target.superuser()
    ));
    wb
}

#[test]
fn a_cascade_over_the_feed_is_exact_whichever_walbridge_is_killed() {
    let publisher = Cluster::builder()
        .setting("logical_decoding_work_mem", "64kB")
        .start();
    let target = Cluster::start();
    publisher.psql(WORKLOAD_SCHEMA);
    target.psql(WORKLOAD_SCHEMA);
    publisher.psql("INSERT INTO big SELECT -s, 'copied ' || s FROM generate_series(1, 20000) s");
    publisher.psql("CREATE PUBLICATION pub FOR TABLE t, g, big");
    let port = free_port();
    let first = upstream(&publisher, port, "walbridge-src");
    // Its log, as a jsonl file (exactly once), shows what entered it.
    let second = downstream(&[port], &target, "batch_changes = 2000");
    let config = std::fs::read_to_string(second.config_path()).unwrap_or_else(|e| panic!("{e}"));
    second.write_config(&format!(
        "{config}\n[[sink]]\nname = \"lines\"\ntype = \"jsonl\"\npath = \"{}\"\n",
        second.output_path().display()
    ));
    let mut running = [Some(first.start()), Some(second.start())];
    let deployments = [&first, &second];
    let context = || {
        format!(
            "walbridge 1 log:\n{}\nwalbridge 2 log:\n{}",
            first.log(),
            second.log()
        )
    };
    // The copy crosses both walbridges before anything is killed (a copy
    // cut short starts over, which another test covers).
    let copied = target.wait_for("SELECT count(*) FROM big", "20000", WAIT);
    assert_eq!(copied, "20000", "{}", context());
    let check = second.command(&["check"]);
    assert!(
        String::from_utf8_lossy(&check.stdout).contains(&format!(
            "source `src`: the feed at http://127.0.0.1:{port} answers (Serving)"
        )),
        "{check:?}"
    );

    let seed = crash_seed();
    let mut rng = Rng::new(seed);
    let mut kills = [0u32; 2];
    let written = std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            let per_chunk = 200;
            for chunk in 0..30u64 {
                let sql: String = (chunk * per_chunk..(chunk + 1) * per_chunk)
                    .map(|i| transaction(i).0)
                    .collect();
                publisher.psql(&sql);
                std::thread::sleep(Duration::from_millis(100));
            }
            30 * per_chunk
        });
        while kills.iter().any(|&k| k < 5) {
            std::thread::sleep(Duration::from_millis(400 + rng.next(900)));
            // Whichever still needs kills; either when both do.
            let which = match kills {
                [a, _] if a >= 5 => 1,
                [_, b] if b >= 5 => 0,
                _ => rng.next(2) as usize,
            };
            deployments[which].wait_for_growth(Duration::from_secs(2));
            let mut killed = running[which]
                .take()
                .unwrap_or_else(|| panic!("walbridge {} is not running", which + 1));
            assert!(
                killed.is_running(),
                "walbridge {} stopped by itself; {}",
                which + 1,
                context()
            );
            killed.kill();
            running[which] = Some(deployments[which].start());
            kills[which] += 1;
        }
        writer
            .join()
            .unwrap_or_else(|_| panic!("the writer panicked"))
    });
    let context = || {
        format!(
            "seed {seed}, kills {kills:?}, {written} transactions; {}",
            context()
        )
    };
    assert_workload_replicated(&publisher, &target, WAIT, &context);
    let [Some(one), Some(two)] = running else {
        panic!("not running; {}", context())
    };
    assert!(two.stop(WAIT).success(), "{}", context());
    assert!(one.stop(WAIT).success(), "{}", context());
    // A transaction applied twice would have met its own rows.
    assert!(
        !second.log().contains("conflict on target"),
        "{}",
        context()
    );
    // Every change entered walbridge 2's log once: a transaction logged
    // again would repeat its changes' WAL positions.
    let lines = second.lines();
    let mut positions = std::collections::HashSet::new();
    for line in lines.iter().filter(|l| l["op"] != "r") {
        let position = line["source"]["lsn"].to_string();
        assert!(
            positions.insert(position),
            "logged twice: {line}; {}",
            context()
        );
    }
    let events: Vec<&serde_json::Value> = lines.iter().collect();
    assert_replays_to_publisher(&publisher, &events, &context());
}

#[test]
fn feeds_of_several_walbridges_fan_into_one_target() {
    let publishers = [Cluster::start(), Cluster::start()];
    let target = Cluster::start();
    target
        .psql("CREATE TABLE orders (origin text, id bigint, amount int, PRIMARY KEY (origin, id))");
    let ports = [free_port(), free_port()];
    let mut feeds = Vec::new();
    for ((publisher, port), consumer) in publishers
        .iter()
        .zip(ports)
        .zip(["walbridge-src", "walbridge-src2"])
    {
        publisher.psql("CREATE TABLE orders (id bigint PRIMARY KEY, amount int)");
        publisher.psql("INSERT INTO orders SELECT s, s FROM generate_series(1, 500) s");
        publisher.psql("CREATE PUBLICATION pub FOR TABLE orders");
        feeds.push(upstream(publisher, port, consumer));
    }
    let consolidated = downstream(&ports, &target, "source_column = \"origin\"");
    let _running: Vec<Running> = feeds
        .iter()
        .chain([&consolidated])
        .map(Deployment::start)
        .collect();
    for (i, publisher) in publishers.iter().enumerate() {
        publisher.psql(&format!(
            "UPDATE orders SET amount = amount * 10 + {i} WHERE id % 3 = 0;
             DELETE FROM orders WHERE id % 5 = 0;
             INSERT INTO orders SELECT s, s FROM generate_series(501, 600) s"
        ));
    }
    for (i, (publisher, origin)) in publishers.iter().zip(["src", "src2"]).enumerate() {
        let expected = publisher.table_digest("postgres", "orders", "id, amount");
        let got = target.wait_for_digest(
            "postgres",
            &format!("orders WHERE origin = '{origin}'"),
            "id, amount",
            &expected,
            WAIT,
        );
        assert_eq!(
            got,
            expected,
            "publisher {i}'s rows in the target; walbridge log:\n{}",
            consolidated.log()
        );
    }
}
