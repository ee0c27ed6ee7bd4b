//! The admin endpoint of a running walbridge: `/metrics` (read by
//! Prometheus's own parser and linter), `/status`, `/healthz` and
//! `/readyz`, following a postgres sink that stops on a conflict and goes
//! on after `walbridge skip`; a paused sink; the status page in Chromium;
//! TLS and the bearer token.

use std::time::{Duration, Instant};

use serde_json::Value;
use walbridge_tests::Cluster;
use walbridge_tests::admin::{
    Sample, artifacts_dir, chromium, curl, get, lint_metrics, metrics, value,
};
use walbridge_tests::tls::{Authority, Issued, Purpose};
use walbridge_tests::walbridge::Deployment;

const WAIT: Duration = Duration::from_secs(90);

/// Asks `ask` every 100 ms until `done` holds for its answer, which it
/// returns; after [`WAIT`], fails with `what` and the last answer.
fn wait_until<T: std::fmt::Debug>(what: &str, ask: impl Fn() -> T, done: impl Fn(&T) -> bool) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        let answer = ask();
        if done(&answer) {
            return answer;
        }
        assert!(Instant::now() < deadline, "{what}: still {answer:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until `/readyz` answers `status`; returns its body.
fn wait_readyz(address: &str, status: u16) -> String {
    let what = format!("/readyz answering {status}");
    wait_until(&what, || get(address, "/readyz"), |(got, _)| *got == status).1
}

/// Waits until `/metrics` says `name{labels}` is `expected`; returns the scrape.
fn wait_metric(address: &str, name: &str, labels: &[(&str, &str)], expected: f64) -> Vec<Sample> {
    let what = format!("{name}{labels:?} = {expected}");
    wait_until(
        &what,
        || metrics(address),
        |samples| value(samples, name, labels) == Some(expected),
    )
}

#[test]
fn metrics_status_and_readiness_follow_a_sink_stopped_on_a_conflict() {
    let publisher = Cluster::start();
    let target = Cluster::start();
    let ddl = "CREATE TABLE t (id int PRIMARY KEY, v text)";
    publisher.psql(ddl);
    target.psql(ddl);
    publisher.psql(
        "CREATE PUBLICATION pub FOR TABLE t;
         INSERT INTO t SELECT g, 'copied' FROM generate_series(1, 10) g;",
    );
    let wb = Deployment::new();
    wb.configure_sinks(
        &publisher.superuser(),
        &["pub"],
        "",
        &format!(
            "[[sink]]\nname = \"replica\"\ntype = \"postgres\"\nconnection = \"{}\"\n",
            target.superuser()
        ),
    );
    let running = wb.start();
    let admin = wb.admin_address(WAIT);
    assert_eq!(get(&admin, "/healthz"), (200, "ok\n".to_owned()));
    publisher.wait_for_streaming(WAIT);
    assert_eq!(wait_readyz(&admin, 200), "ready\n");

    // Five transactions of one insert each, after the copy of ten rows.
    for id in 11..=15 {
        publisher.psql(&format!("INSERT INTO t VALUES ({id}, 'streamed')"));
    }
    let labels = [("sink", "replica"), ("source", "src")];
    let src = [("source", "src")];
    wait_metric(&admin, "walbridge_source_transactions_total", &src, 5.0);
    let samples = wait_metric(&admin, "walbridge_sink_lag_records", &labels, 0.0);
    assert_eq!(
        value(
            &samples,
            "walbridge_source_changes_total",
            &[("source", "src"), ("operation", "insert")]
        ),
        Some(5.0)
    );
    assert_eq!(
        value(&samples, "walbridge_snapshot_rows_total", &src),
        Some(10.0)
    );
    let table = [("source", "src"), ("table", "\"public\".\"t\"")];
    assert_eq!(
        value(&samples, "walbridge_snapshot_table_rows_total", &table),
        Some(10.0)
    );
    // What the sink was handed: the ten rows of the copy, the five inserts.
    for (operation, n) in [("snapshot", 10.0), ("insert", 5.0), ("update", 0.0)] {
        let labels = [
            ("sink", "replica"),
            ("source", "src"),
            ("operation", operation),
        ];
        assert_eq!(
            value(&samples, "walbridge_sink_events_total", &labels),
            Some(n),
            "{operation}"
        );
    }
    // Each of the five transactions passed every stage, each later than
    // the one before (one clock, so every delay is at least the last).
    let delay = |stage: &str, what: &str| {
        let mut labels = vec![("stage", stage), ("source", "src")];
        if stage != "received" {
            labels.push(("sink", "replica"));
        }
        value(
            &samples,
            &format!("walbridge_transaction_delay_seconds_{what}"),
            &labels,
        )
    };
    let stages = ["received", "read", "delivered", "applied"];
    for stage in stages {
        assert_eq!(delay(stage, "count"), Some(5.0), "{stage}: {samples:#?}");
    }
    let sums: Vec<f64> = stages
        .iter()
        .map(|stage| delay(stage, "sum").unwrap_or(f64::NAN))
        .collect();
    assert!(
        sums[0] > 0.0 && sums.windows(2).all(|w| w[0] <= w[1]),
        "delays by stage: {sums:?}"
    );
    // The publisher's share: from each commit to the walsender's sending
    // it (the publisher's clock; one machine here, so within `received`).
    let sent = |what: &str| {
        value(
            &samples,
            &format!("walbridge_publisher_send_delay_seconds_{what}"),
            &[("source", "src")],
        )
    };
    assert_eq!(sent("count"), Some(5.0), "{samples:#?}");
    let sent = sent("sum").unwrap_or(f64::NAN);
    assert!(
        sent >= 0.0 && sent <= sums[0],
        "sent {sent}, received {}",
        sums[0]
    );
    // The log's fsyncs timed: at least the initial copy's, by the writer
    // thread (the postgres sink's stream is fsynced by the sync thread).
    let sync_time = |what: &str| {
        value(
            &samples,
            &format!("walbridge_log_sync_seconds_{what}"),
            &[("source", "src"), ("by", "writer")],
        )
    };
    assert!(
        sync_time("count").is_some_and(|n| n >= 1.0) && sync_time("sum").is_some_and(|s| s > 0.0),
        "{samples:#?}"
    );
    // One segment, holding the log from its beginning.
    assert_eq!(value(&samples, "walbridge_log_segments", &src), Some(1.0));
    assert_eq!(value(&samples, "walbridge_log_start_lsn", &src), Some(0.0));
    assert_eq!(
        value(
            &samples,
            "walbridge_source_state",
            &[("source", "src"), ("state", "streaming")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &samples,
            "walbridge_sink_state",
            &[("sink", "replica"), ("state", "running")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&samples, "walbridge_sink_lag_bytes", &labels),
        Some(0.0)
    );
    assert_eq!(
        value(&samples, "walbridge_sink_lag_seconds", &labels),
        Some(0.0)
    );
    // The slot, as the publisher reports it (polled every few seconds).
    let samples = wait_metric(
        &admin,
        "walbridge_slot_wal_status",
        &[("source", "src"), ("wal_status", "reserved")],
        1.0,
    );
    assert!(
        value(&samples, "walbridge_source_lag_bytes", &src).is_some_and(|v| v >= 0.0),
        "{samples:#?}"
    );
    assert!(
        value(&samples, "walbridge_slot_retained_bytes", &src).is_some_and(|v| v > 0.0),
        "{samples:#?}"
    );
    assert_eq!(lint_metrics(&admin), "", "promtool check metrics");
    let confirmed = value(&samples, "walbridge_source_confirmed_lsn", &src).unwrap_or(0.0);
    assert!(confirmed > 0.0, "{samples:#?}");
    assert!(
        value(&samples, "process_resident_memory_bytes", &[]).is_some_and(|v| v > 0.0),
        "{samples:#?}"
    );
    let (status, body) = get(&admin, "/status");
    assert_eq!(status, 200, "{body}");
    let json: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(json["ready"], true, "{json:#}");
    assert_eq!(json["sources"][0]["name"], "src", "{json:#}");
    assert_eq!(json["sources"][0]["state"], "streaming", "{json:#}");
    assert_eq!(json["sources"][0]["transactions"], 5, "{json:#}");
    assert_eq!(json["sinks"][0]["name"], "replica", "{json:#}");
    assert_eq!(json["sinks"][0]["state"], "running", "{json:#}");
    assert_eq!(json["sinks"][0]["sources"][0]["lag_records"], 0, "{json:#}");
    assert_eq!(
        json["sinks"][0]["sources"][0]["events"]["insert"], 5,
        "{json:#}"
    );
    let copied = &json["sources"][0]["snapshot"]["tables"][0];
    assert_eq!(copied["table"], "\"public\".\"t\"", "{json:#}");
    assert_eq!(copied["state"], "done", "{json:#}");
    assert_eq!(copied["rows"], 10, "{json:#}");
    assert_eq!(json["sources"][0]["log"]["segments"], 1, "{json:#}");
    assert_eq!(json["sources"][0]["log"]["start_lsn"], "0/0", "{json:#}");

    // A sink that keeps up takes new transactions from the log's writer,
    // in memory, not from the file: five more, now that it has everything.
    let read = |samples: &[Sample], from: &str| {
        let labels = [("source", "src"), ("from", from)];
        value(samples, "walbridge_log_records_read_total", &labels)
    };
    // The log's fsyncs, by who made them: the copy's by the writer thread.
    let syncs = |samples: &[Sample], by: &str| {
        let labels = [("source", "src"), ("by", by)];
        value(samples, "walbridge_log_syncs_total", &labels)
    };
    assert!(
        syncs(&samples, "writer").is_some_and(|n| n >= 1.0),
        "{samples:#?}"
    );
    let synced = |samples: &[Sample]| {
        ["appender", "sync", "writer"]
            .iter()
            .map(|by| syncs(samples, by).unwrap_or(f64::NAN))
            .sum::<f64>()
    };
    let synced_before = synced(&samples);
    let before = read(&samples, "memory").unwrap_or(f64::NAN);
    for id in 21..=25 {
        publisher.psql(&format!("INSERT INTO t VALUES ({id}, 'streamed')"));
    }
    wait_metric(&admin, "walbridge_source_transactions_total", &src, 10.0);
    let samples = wait_metric(&admin, "walbridge_sink_lag_records", &labels, 0.0);
    assert_eq!(
        read(&samples, "memory").map(|n| n - before),
        Some(5.0),
        "{samples:#?}"
    );
    // Made durable by fsyncs, never more than one per transaction (those
    // that reached walbridge together share one).
    let more = synced(&samples) - synced_before;
    assert!(
        (1.0..=5.0).contains(&more),
        "{synced_before} then {more} more"
    );
    // The copy was read from the file.
    assert!(
        read(&samples, "file").is_some_and(|n| n >= 2.0),
        "{samples:#?}"
    );

    // A row the target already has: the sink stops on that transaction,
    // the pipeline is not ready, the lag shows, and `/readyz` says why.
    target.psql("INSERT INTO t VALUES (100, 'target')");
    publisher.psql("INSERT INTO t VALUES (100, 'publisher')");
    let body = wait_readyz(&admin, 503);
    assert!(
        body.contains("sink `replica` is retrying") && body.contains("duplicate key"),
        "{body}"
    );
    let samples = wait_metric(
        &admin,
        "walbridge_sink_state",
        &[("sink", "replica"), ("state", "retrying")],
        1.0,
    );
    assert_eq!(
        value(&samples, "walbridge_sink_lag_records", &labels),
        Some(1.0)
    );
    assert!(
        value(
            &samples,
            "walbridge_sink_failures_total",
            &[("sink", "replica")]
        )
        .is_some_and(|v| v >= 1.0),
        "{samples:#?}"
    );
    // The source goes on meanwhile.
    assert_eq!(get(&admin, "/healthz").0, 200);

    // Skipped (once the sink has found which transaction it is: a batch
    // that fails is applied again one transaction at a time), the sink goes
    // on, acknowledges, and the pipeline is ready again.
    wb.wait_for_log("stopped on transaction", WAIT);
    succeeded(&wb, &["skip", "--sink", "replica"]);
    publisher.psql("INSERT INTO t VALUES (16, 'after the skip')");
    assert_eq!(wait_readyz(&admin, 200), "ready\n");
    wait_metric(&admin, "walbridge_sink_lag_records", &labels, 0.0);
    assert_eq!(
        target.psql("SELECT count(*) FROM t WHERE v <> 'target'"),
        "21"
    );

    // `walbridge status` asks the running process…
    let text = succeeded(&wb, &["status"]);
    assert!(
        text.contains(&format!(
            "walbridge is running (pid {}): ready",
            running.pid()
        )) && text.contains("source src: streaming")
            && text.contains("sink replica: running")
            && text.contains("behind by 0 records"),
        "{text}"
    );
    let out = wb.command(&["status", "--json"]);
    let json: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(json["pid"], running.pid(), "{json:#}");
    assert_eq!(json["sinks"][0]["state"], "running", "{json:#}");
    let cursor = json["sinks"][0]["sources"][0]["cursor"].clone();
    assert!(running.stop(WAIT).success(), "{}", wb.log());

    // …and without it, reads the data_dir and the publisher's slot.
    let text = succeeded(&wb, &["status"]);
    assert!(
        text.contains("walbridge is not running")
            && text.contains("slot walbridge_src: confirmed ")
            && text.contains("not in use")
            && text.contains(&format!("from src: cursor {cursor}")),
        "{text}"
    );
}

/// Runs a walbridge command that must succeed; returns what it printed.
fn succeeded(wb: &Deployment, args: &[&str]) -> String {
    let out = wb.command(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What `/status` says of the first sink.
fn sink_status(address: &str) -> Value {
    let (status, body) = get(address, "/status");
    assert_eq!(status, 200, "{body}");
    let json: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    json["sinks"][0].clone()
}

/// Waits until `/status` says the first sink is `state`.
fn wait_sink_state(address: &str, state: &str) {
    let what = format!("the sink {state}");
    wait_until(
        &what,
        || sink_status(address),
        |sink| sink["state"] == state,
    );
}

#[test]
fn a_paused_sink_falls_behind_and_catches_up_after_resume_even_across_a_restart() {
    let pg = Cluster::start();
    pg.psql("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t");
    let wb = Deployment::new();
    wb.configure(&pg, "postgres", "pub", "copy_data = false");
    let running = wb.start();
    let admin = wb.admin_address(WAIT);
    pg.wait_for_streaming(WAIT);
    pg.psql("INSERT INTO t VALUES (1)");
    wb.wait_for_lines(1, WAIT);

    let said = succeeded(&wb, &["pause", "--sink", "out"]);
    assert!(
        said.contains(&format!(
            "sink `out` paused: the walbridge running on this data_dir (pid {}) follows within a second",
            running.pid()
        )),
        "{said}"
    );
    wait_sink_state(&admin, "paused");
    // The source goes on; the sink falls behind by each transaction.
    for id in 2..=6 {
        pg.psql(&format!("INSERT INTO t VALUES ({id})"));
    }
    let labels = [("sink", "out"), ("source", "src")];
    wait_metric(&admin, "walbridge_sink_lag_records", &labels, 5.0);
    // The oldest of them has waited since its commit, and waits on.
    let waited = |samples: &Vec<Sample>| {
        value(samples, "walbridge_sink_lag_seconds", &labels).unwrap_or(f64::NAN)
    };
    let before = wait_until("a lag in seconds", || metrics(&admin), |s| waited(s) > 0.0);
    wait_until(
        "the lag in seconds to grow",
        || metrics(&admin),
        |s| waited(s) > waited(&before) + 1.0,
    );
    // A pause is asked for: it does not make the pipeline unready.
    assert_eq!(get(&admin, "/readyz"), (200, "ready\n".to_owned()));
    assert_eq!(wb.lines().len(), 1);

    // Still paused after a restart.
    assert!(running.stop(WAIT).success(), "{}", wb.log());
    let seen = wb.log().len();
    let running = wb.start();
    let admin = wb.admin_address_after(seen, WAIT);
    wait_sink_state(&admin, "paused");
    pg.psql("INSERT INTO t VALUES (7)");
    wait_metric(&admin, "walbridge_sink_lag_records", &labels, 6.0);
    assert_eq!(wb.lines().len(), 1);

    succeeded(&wb, &["resume", "--sink", "out"]);
    wb.wait_for_lines(7, WAIT);
    wait_metric(&admin, "walbridge_sink_lag_records", &labels, 0.0);
    wait_metric(&admin, "walbridge_sink_lag_seconds", &labels, 0.0);
    wait_sink_state(&admin, "running");
    let ids: Vec<i64> = wb
        .lines()
        .iter()
        .filter_map(|l| l["after"]["id"].as_i64())
        .collect();
    assert_eq!(ids, (1..=7).collect::<Vec<_>>());
    assert!(running.stop(WAIT).success(), "{}", wb.log());
}

#[test]
fn the_status_page_names_every_source_and_sink_and_draws_their_last_minutes() {
    let pg = Cluster::start();
    pg.psql("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t");
    let wb = Deployment::new();
    let out = |name: &str| {
        wb.path()
            .join(format!("{name}.jsonl"))
            .display()
            .to_string()
    };
    wb.configure_sinks(
        &pg.connstr("postgres", "postgres"),
        &["pub"],
        "copy_data = false",
        &format!(
            "[[sink]]\nname = \"orders-feed\"\ntype = \"jsonl\"\npath = \"{}\"\n\n\
             [[sink]]\nname = \"audit\"\ntype = \"jsonl\"\npath = \"{}\"\n",
            out("orders"),
            out("audit")
        ),
    );
    let running = wb.start();
    let admin = wb.admin_address(WAIT);
    // The page's history takes a sample at once and every 10 s after: a
    // rate needs two, a line two rates.
    let until = Instant::now() + Duration::from_secs(23);
    pg.wait_for_streaming(WAIT);
    succeeded(&wb, &["pause", "--sink", "audit"]);
    let mut id = 0;
    while Instant::now() < until {
        id += 1;
        pg.psql(&format!("INSERT INTO t VALUES ({id})"));
        std::thread::sleep(Duration::from_millis(200));
    }
    wait_sink_state(&admin, "running");

    let screenshot = artifacts_dir().join("status-page.png");
    let dom = chromium(&format!("http://{admin}/"), &screenshot);
    for expected in [
        "<title>walbridge: ready</title>",
        r#"id="source-src""#,
        r#"<section class="sink" id="sink-orders-feed"><h3>orders-feed <span class="state good">running</span>"#,
        r#"<section class="sink" id="sink-audit"><h3>audit <span class="state good">paused</span>"#,
        "<h4>from src</h4>",
        "streaming",
    ] {
        assert!(dom.contains(expected), "{expected} not in\n{dom}");
    }
    // Throughput and lag drawn, for the source and each sink.
    let lines = dom.matches("<polyline points=").count();
    assert_eq!(lines, 6, "sparklines in\n{dom}");
    let png = std::fs::read(&screenshot).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "screenshot of {} bytes",
        png.len()
    );
    assert!(running.stop(WAIT).success(), "{}", wb.log());
}

#[test]
fn over_tls_a_token_guards_everything_but_the_probes() {
    let pg = Cluster::start();
    pg.psql("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t");
    let wb = Deployment::new();
    wb.configure(&pg, "postgres", "pub", "copy_data = false");
    let authority = Authority::new(wb.path());
    let Issued { cert, key } = authority.issue("admin", Purpose::Server);
    let mut config = std::fs::read_to_string(wb.config_path()).unwrap_or_default();
    config.push_str(&format!(
        "\n[admin]\ntls_cert = \"{}\"\ntls_key = \"{}\"\ntoken = \"${{ADMIN_TOKEN}}\"\n",
        cert.display(),
        key.display()
    ));
    wb.write_config(&config);
    let token = [("ADMIN_TOKEN", "a-secret-of-the-test")];
    let running = wb.start_with_env(&token);
    let admin = wb.admin_address(WAIT);
    pg.wait_for_streaming(WAIT);

    let cacert = authority.cert().display().to_string();
    let https = |path: &str, extra: &[&str]| {
        let mut args = vec!["--cacert", cacert.as_str()];
        args.extend(extra);
        curl(&format!("https://{admin}{path}"), &args)
    };
    // The probes need no token.
    assert_eq!(https("/healthz", &[]), (200, "ok\n".to_owned()));
    let (status, body) = wait_until("ready", || https("/readyz", &[]), |(s, _)| *s == 200);
    assert_eq!((status, body.as_str()), (200, "ready\n"));
    // Everything else does.
    for path in ["/metrics", "/status", "/"] {
        let (status, body) = https(path, &[]);
        assert_eq!(status, 401, "{path}: {body}");
        assert!(body.contains("Authorization: Bearer"), "{body}");
        let wrong = https(path, &["-H", "Authorization: Bearer a-secret-of-the-tesT"]);
        assert_eq!(wrong.0, 401, "{path} with a wrong token");
        let (status, body) = https(path, &["-H", "Authorization: Bearer a-secret-of-the-test"]);
        assert_eq!(status, 200, "{path}: {body}");
    }
    // No plain HTTP, and no certificate but the configured one is trusted.
    assert_eq!(get(&admin, "/healthz").0, 0);
    assert_eq!(curl(&format!("https://{admin}/healthz"), &[]).0, 0);

    // `walbridge status` speaks TLS with the token, from the same configuration.
    let out = wb.command_with_env(&["status"], &token);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("source src: streaming"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = wb.command_with_env(&["status"], &[("ADMIN_TOKEN", "not-it")]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("401"), "{said}");
    // The token never reaches the log.
    assert!(!wb.log().contains("a-secret-of-the-test"), "{}", wb.log());
    assert!(running.stop(WAIT).success(), "{}", wb.log());
}
