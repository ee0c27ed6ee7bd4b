//! The change feed (`type = "grpc"`) through Python's `grpcio`, a client
//! generated from the proto: the initial copy and every kind of change
//! decoded into the expected values, filters, acknowledgements and
//! resumption, durable consumers across `kill -9`, the log kept for them
//! and retention's bound, the admin RPCs, health and reflection, TLS
//! with client certificates and the bearer token, consumer groups, and the
//! Go example consumer.

use std::time::Duration;

use serde_json::{Value, json};
use walbridge_tests::feed::{self, Client, earliest, end, envelopes, events};
use walbridge_tests::fixtures::{
    Rng, TYPES_ROW, TYPES_SCHEMA, WORKLOAD_SCHEMA, assert_replays_to_publisher, write_while_killing,
};
use walbridge_tests::tls::{Authority, Purpose};
use walbridge_tests::walbridge::{Deployment, Running};
use walbridge_tests::{Cluster, admin, free_port};

const WAIT: Duration = Duration::from_secs(60);

/// A publisher with `schema` published as `pub`, and a walbridge serving
/// it as a feed (sink keys `extra`).
struct Fixture {
    pg: Cluster,
    wb: Deployment,
    running: Option<Running>,
    client: Client,
}

impl Fixture {
    /// The feed on any free port, sink keys `extra`.
    fn start(schema: &str, source_extra: &str, extra: &str) -> Fixture {
        Fixture::start_with(schema, source_extra, &feed::sink("127.0.0.1:0", extra))
    }

    /// The configuration's `sinks` part (the feed's section and more) verbatim.
    fn start_with(schema: &str, source_extra: &str, sinks: &str) -> Fixture {
        let pg = Cluster::start();
        pg.psql(schema);
        pg.psql("CREATE PUBLICATION pub FOR ALL TABLES");
        let wb = Deployment::new();
        wb.configure_sinks(&pg.superuser(), &["pub"], source_extra, sinks);
        let running = wb.start();
        let client = Client::new(&feed::address(&wb, 0, WAIT));
        // The feed listens before the source has its slot: a write made
        // before that would come as a copied row, not a change.
        pg.wait_for_streaming(WAIT);
        Fixture {
            pg,
            wb,
            running: Some(running),
            client,
        }
    }

    /// Segment files in the source's log.
    fn segments(&self) -> usize {
        std::fs::read_dir(self.wb.path().join("data/sources/src/log"))
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok())
                    .filter(|e| e.path().extension().is_some_and(|x| x == "seg"))
                    .count()
            })
            .unwrap_or(0)
    }

    /// Waits until the log has at most `most` segments; returns how many it has.
    fn wait_for_segments_at_most(&self, most: usize) -> usize {
        let deadline = std::time::Instant::now() + WAIT;
        while self.segments() > most && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        self.segments()
    }
}

/// Reads everything there is: until nothing new came for 3 s.
fn read_all(client: &Client, open: &Value) -> Vec<Value> {
    let lines = client.subscribe(open, &["--idle", "3"]);
    assert_eq!(end(&lines)["end"], "stopped", "{lines:?}");
    lines
}

/// What the feed sends for `TYPES_ROW`, as the client decodes it.
fn expected_types(id: i64) -> Value {
    let s = |t: &str| json!({"string": t});
    json!({
        "id": {"int64": id},
        "i2": {"int64": -32768}, "i4": {"int64": 2147483647}, "i8": {"int64": 9223372036854775807i64},
        "num": {"decimal": "12345678901234567890.123456789"}, "num_nan": {"decimal": "NaN"},
        "f4": {"double": 0.1}, "f8": {"double": 1.5e300}, "f_nan": {"double": "nan"},
        "f_inf": {"double": "inf"}, "f_ninf": {"double": "-inf"},
        "txt": s("h\u{e9}\tllo \"q\"\n"), "vc": s("short"), "ch": s("ab "),
        "raw": {"bytes": "deadbeef"}, "flag": {"bool": true},
        "d": s("2024-02-29"), "d_bc": s("0044-03-15 BC"), "tm": s("13:14:15.123456"),
        "tmz": s("13:14:15+05:30"),
        "ts": {"timestamp": "2024-02-29T13:14:15.500000+00:00"},
        "tstz": {"timestamp": "2024-02-29T11:14:15.500000+00:00"},
        "iv": s("P1Y2M3DT4H5M6.5S"),
        "u": s("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
        "js": {"json": {"b": 1, "a": [1, 2.5]}}, "jsb": {"json": {"a": [1, 2.5], "b": 1}},
        "ints": {"array": [{"int64": 1}, null, {"int64": 3}]},
        "texts": {"array": [{"array": [s("a b"), s("c")]}, {"array": [s("d"), null]}]},
        "moods": {"array": [s("happy"), s("sad")]},
        "m": s("happy"), "comp": s("(1,x)"), "rng": s("[1,5)"), "dom": {"int64": 7}
    })
}

#[test]
fn the_copy_and_every_kind_of_change_arrive_decoded_in_whole_transactions() {
    let f = Fixture::start(
        &format!(
            "{TYPES_SCHEMA}; CREATE TABLE k (id int PRIMARY KEY, v text);
             INSERT INTO k SELECT g, 'v' || g FROM generate_series(1, 1200) g; {}",
            TYPES_ROW.replace("ID", "1")
        ),
        "",
        "",
    );
    let open = json!({"start": earliest(), "filter": {"message_prefixes": ["app"]}});
    // The copy: every row, as reads, in batches with tokens; then its end.
    let started = std::time::Instant::now();
    let copy = read_all(&f.client, &open);
    eprintln!("copy read in {:?}", started.elapsed());
    let rows: Vec<&Value> = events(&copy, "rows");
    let copied: Vec<&Value> = rows
        .iter()
        .flat_map(|r| r["decoded"]["rows"].as_array().into_iter().flatten())
        .collect();
    assert_eq!(copied.len(), 1201, "every row of the copy");
    let typed = rows
        .iter()
        .find(|r| r["decoded"]["table"] == "public.t")
        .unwrap_or_else(|| panic!("no rows of t: {copy:?}"));
    assert_row(&typed["decoded"]["rows"][0], &expected_types(1));
    assert!(
        rows.last()
            .is_some_and(|r| r["message"]["resume_token"].is_string()),
        "the last rows carry a token"
    );
    assert_eq!(events(&copy, "copy_complete").len(), 1);
    let relation = events(&copy, "relation")
        .into_iter()
        .find(|r| r["message"]["table"] == "t")
        .unwrap_or_else(|| panic!("no description of t: {copy:?}"));
    let columns = relation["message"]["columns"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(columns.len(), 33);
    assert_eq!(
        columns[0],
        json!({"name": "id", "type_oid": 23, "type_name": "int4", "key": true, "type_modifier": -1})
    );
    assert_eq!(columns[5]["type_name"], "numeric");
    assert_eq!(columns[12]["type_name"], "varchar(10)");
    assert_eq!(columns[12]["type_modifier"], 14);
    assert_eq!(columns[13]["type_name"], "bpchar(3)");
    assert_eq!(columns[26]["type_name"], "_int4");
    assert_eq!(columns[29]["type_name"], "public.mood");
    assert_eq!(relation["message"]["primary_key"], json!([0]));

    // The stream: one transaction of every kind of change, messages in
    // and outside it (only the `app` prefix asked for).
    f.pg.psql(&format!(
        "BEGIN; {}; UPDATE k SET v = 'changed' WHERE id = 1; UPDATE k SET id = 5000 WHERE id = 2;
         DELETE FROM k WHERE id = 3; SELECT pg_logical_emit_message(true, 'app', 'inside');
         SELECT pg_logical_emit_message(true, 'other', 'filtered'); COMMIT;",
        TYPES_ROW.replace("ID", "2")
    ));
    f.pg.psql("SELECT pg_logical_emit_message(false, 'app', 'outside')");
    f.pg.psql("TRUNCATE k");
    let stream = read_all(
        &f.client,
        &json!({"start": {"resume_token": last_token(&copy)}, "filter": {"message_prefixes": ["app"]}}),
    );
    let kinds: Vec<&str> = stream
        .iter()
        .filter_map(|l| l["event"].as_str())
        .filter(|k| !matches!(*k, "progress" | "subscribed"))
        .collect();
    assert_eq!(
        kinds,
        [
            "begin", "relation", "change", "relation", "change", "change", "change", "change",
            "commit", "message", "begin", "change", "commit"
        ],
        "{stream:?}"
    );
    let changes: Vec<&Value> = events(&stream, "change")
        .into_iter()
        .map(|c| &c["decoded"])
        .collect();
    assert_eq!(changes[0]["operation"], "INSERT");
    assert_row(&changes[0]["new"], &expected_types(2));
    assert_eq!(changes[1]["operation"], "UPDATE");
    assert_eq!(
        changes[1]["new"],
        json!({"id": {"int64": 1}, "v": {"string": "changed"}})
    );
    assert_eq!(
        changes[1]["old"],
        Value::Null,
        "no old row under REPLICA IDENTITY DEFAULT"
    );
    assert_eq!(changes[2]["new"]["id"], json!({"int64": 5000}));
    assert_eq!(
        changes[2]["old"],
        json!({"id": {"int64": 2}, "v": null}),
        "the old key"
    );
    assert_eq!(changes[3]["operation"], "DELETE");
    assert_eq!(changes[3]["old"], json!({"id": {"int64": 3}, "v": null}));
    assert_eq!(changes[4]["operation"], "MESSAGE");
    assert_eq!(
        changes[4]["message"],
        json!({"prefix": "app", "content": "inside"})
    );
    assert_eq!(
        events(&stream, "message")[0]["decoded"],
        json!({"prefix": "app", "content": "outside"})
    );
    assert_eq!(changes[5]["operation"], "TRUNCATE");
    assert_eq!(changes[5]["tables"], json!(["public.k"]));
    // Ids: source, commit LSN, place in the transaction (the filtered
    // message counts).
    let begin = &events(&stream, "begin")[0]["message"];
    let commit_lsn = begin["commit_lsn"].clone();
    let ids: Vec<Value> = changes[..5].iter().map(|c| c["id"].clone()).collect();
    assert_eq!(
        ids,
        (0..5)
            .map(|i| json!(["src", commit_lsn, i]))
            .collect::<Vec<_>>()
    );
    assert!(begin["commit_time"].is_string() && begin["xid"].as_u64().is_some_and(|x| x > 0));
    assert_eq!(
        events(&stream, "commit")[0]["message"]["commit_lsn"],
        commit_lsn
    );
    // Known at the begin, for consumers that store a transaction in parts.
    assert_eq!(
        begin["end_lsn"],
        events(&stream, "commit")[0]["message"]["end_lsn"]
    );

    // Text forms on request.
    let texts = read_all(
        &f.client,
        &json!({"start": {"resume_token": last_token(&copy)}, "text_values": true, "filter": {"tables": ["public.t"]}}),
    );
    let new = &events(&texts, "change")[0]["decoded"]["new"];
    assert_eq!(new["tstz"]["value"], expected_types(2)["tstz"]);
    assert_eq!(
        new["iv"]["text"], "P1Y2M3DT4H5M6.5S",
        "the source reads intervals in ISO 8601"
    );
    assert_eq!(new["num"]["text"], "12345678901234567890.123456789");
    assert_eq!(new["texts"]["text"], "{{\"a b\",c},{d,NULL}}");
}

/// `actual` equals `expected`, column by column (a mismatch names it).
fn assert_row(actual: &Value, expected: &Value) {
    let keys = |v: &Value| v.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>());
    for (column, value) in expected.as_object().into_iter().flatten() {
        assert_eq!(&actual[column], value, "column {column}");
    }
    assert_eq!(keys(actual), keys(expected), "the columns");
}

/// The last token a subscription received.
fn last_token(lines: &[Value]) -> Value {
    lines
        .iter()
        .rev()
        .find_map(|l| {
            let token = &l["message"]["resume_token"];
            token.is_string().then(|| token.clone())
        })
        .unwrap_or_else(|| panic!("no token in {lines:?}"))
}

/// The publisher's current WAL position, as a number.
fn wal_position(pg: &Cluster) -> u64 {
    lsn(&Value::String(pg.psql("SELECT pg_current_wal_lsn()")))
}

/// An LSN in PostgreSQL's text form, as a number.
fn lsn(text: &Value) -> u64 {
    let text = text
        .as_str()
        .unwrap_or_else(|| panic!("not an LSN: {text}"));
    let (high, low) = text
        .split_once('/')
        .unwrap_or_else(|| panic!("not an LSN: {text}"));
    let part = |p: &str| u64::from_str_radix(p, 16).unwrap_or_else(|e| panic!("{text}: {e}"));
    (part(high) << 32) | part(low)
}

/// The tables and operations of the changes received, in order.
fn changes_of(lines: &[Value]) -> Vec<(String, String)> {
    events(lines, "change")
        .iter()
        .map(|c| {
            let d = &c["decoded"];
            (
                d["table"].as_str().unwrap_or_default().to_owned(),
                d["operation"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[test]
fn filters_choose_tables_operations_columns_and_sources_on_the_server() {
    let f = Fixture::start(
        "CREATE TABLE orders (id int PRIMARY KEY, total int, note text);
         CREATE TABLE order_lines (id int PRIMARY KEY, order_id int, qty int);
         CREATE TABLE audit (id int PRIMARY KEY, what text)",
        "",
        "",
    );
    f.pg.psql(
        "BEGIN; INSERT INTO orders VALUES (1, 10, 'a'); INSERT INTO order_lines VALUES (1, 1, 2);
         INSERT INTO audit VALUES (1, 'x'); COMMIT",
    );
    f.pg.psql("UPDATE orders SET total = 20 WHERE id = 1");
    f.pg.psql("DELETE FROM order_lines WHERE id = 1");
    let before_last = wal_position(&f.pg);
    f.pg.psql("INSERT INTO audit VALUES (2, 'y')");
    let filter = json!({
        "sources": ["src"],
        "tables": ["public.order*"],
        "operations": ["INSERT", "DELETE"],
        "columns": [{"table": "public.orders", "columns": ["total"]}],
    });
    let lines = read_all(
        &f.client,
        &json!({"start": earliest(), "filter": filter, "heartbeat_interval_ms": 200}),
    );
    assert_eq!(
        changes_of(&lines),
        [
            ("public.orders".into(), "INSERT".into()),
            ("public.order_lines".into(), "INSERT".into()),
            ("public.order_lines".into(), "DELETE".into())
        ],
        "{lines:?}"
    );
    let changes = events(&lines, "change");
    assert_eq!(
        changes[0]["decoded"]["new"],
        json!({"id": {"int64": 1}, "total": {"int64": 10}}),
        "the columns asked for, and the key"
    );
    assert_eq!(
        changes[1]["decoded"]["new"],
        json!({"id": {"int64": 1}, "order_id": {"int64": 1}, "qty": {"int64": 2}}),
        "a table no column filter names is sent whole"
    );
    // Transactions left empty by the filter are not sent...
    assert_eq!(events(&lines, "begin").len(), 2);
    assert_eq!(events(&lines, "commit").len(), 2);
    // ...but the position moves past them: progress covers the last one.
    let progress = events(&lines, "progress");
    let last = progress
        .last()
        .unwrap_or_else(|| panic!("no progress: {lines:?}"));
    assert!(
        lsn(&last["message"]["sources"][0]["lsn"]) > before_last,
        "progress past the filtered transactions: {last}"
    );

    let refused = |open: Value, code: &str, says: &str| {
        let lines = f.client.subscribe(&open, &["--idle", "3"]);
        let end = end(&lines);
        assert_eq!(end["code"], code, "{open}: {lines:?}");
        let details = end["details"].as_str().unwrap_or_default();
        assert!(details.contains(says), "{open}: {details}");
    };
    refused(
        json!({"filter": {"sources": ["elsewhere"]}}),
        "NOT_FOUND",
        "this feed has no source `elsewhere` (it has: src)",
    );
    refused(
        json!({"filter": {"tables": ["orders"]}}),
        "INVALID_ARGUMENT",
        "`public.orders`",
    );
    refused(
        json!({"filter": {"columns": [{"table": "public.orders"}]}}),
        "INVALID_ARGUMENT",
        "at least one column",
    );
}

#[test]
fn acknowledged_units_are_not_sent_again_unacknowledged_ones_are() {
    let f = Fixture::start("CREATE TABLE t (id int PRIMARY KEY)", "", "");
    let open = json!({"consumer": "billing", "start": earliest()});
    // The copy's end (the table is empty) is the first unit.
    let first = f.client.subscribe(&open, &["--units", "1", "--idle", "10"]);
    assert_eq!(events(&first, "subscribed")[0]["message"]["created"], true);
    assert_eq!(events(&first, "copy_complete").len(), 1, "{first:?}");
    for i in 1..=10 {
        f.pg.psql(&format!("INSERT INTO t VALUES ({i})"));
    }
    let ids = |lines: &[Value]| -> Vec<i64> {
        events(lines, "change")
            .iter()
            .filter_map(|c| c["decoded"]["new"]["id"]["int64"].as_i64())
            .collect()
    };
    // Four acknowledged, then a clean close: the next session starts at the fifth.
    let acked = f.client.subscribe(&open, &["--units", "4"]);
    assert_eq!(events(&acked, "subscribed")[0]["message"]["created"], false);
    assert_eq!(ids(&acked), [1, 2, 3, 4]);
    // Three received, none acknowledged: sent again.
    let unacked = f
        .client
        .subscribe(&open, &["--units", "3", "--ack", "none"]);
    assert_eq!(ids(&unacked), [5, 6, 7]);
    let rest = f.client.subscribe(&open, &["--idle", "3"]);
    assert_eq!(ids(&rest), [5, 6, 7, 8, 9, 10]);
    let none = f.client.subscribe(&open, &["--idle", "2"]);
    assert_eq!(ids(&none), Vec::<i64>::new(), "everything was acknowledged");

    // An ephemeral subscriber resumes from a token it received.
    let token = events(&acked, "commit")[1]["message"]["resume_token"].clone();
    let resumed = f
        .client
        .subscribe(&json!({"start": {"resume_token": token}}), &["--idle", "3"]);
    assert_eq!(ids(&resumed), [3, 4, 5, 6, 7, 8, 9, 10]);
    // ... or from an LSN: the first transaction committed after it.
    let commit = &events(&acked, "commit")[0]["message"];
    let resumed = f.client.subscribe(
        &json!({"start": {"lsns": {"lsns": {"src": commit["end_lsn"]}}}}),
        &["--idle", "3"],
    );
    assert_eq!(ids(&resumed), [2, 3, 4, 5, 6, 7, 8, 9, 10]);
    let refused = f
        .client
        .subscribe(&json!({"start": {"resume_token": "bm90IGEgdG9rZW4="}}), &[]);
    assert_eq!(end(&refused)["code"], "INVALID_ARGUMENT", "{refused:?}");
}

#[test]
fn flow_control_holds_back_only_what_is_not_acknowledged() {
    let f = Fixture::start("CREATE TABLE t (id int PRIMARY KEY)", "", "");
    for i in 1..=10 {
        f.pg.psql(&format!(
            "BEGIN; INSERT INTO t VALUES ({i}); INSERT INTO t VALUES ({i} + 100); COMMIT"
        ));
    }
    let open = |max_events: u32| json!({"start": {"lsns": {"lsns": {"src": "0/0"}}}, "flow": {"max_events": max_events}});
    // A window of 3 events: two transactions of two changes fill it
    // (the second goes while one event of room is left); none is acknowledged.
    let held = f
        .client
        .subscribe(&open(3), &["--ack", "none", "--idle", "3"]);
    assert_eq!(events(&held, "commit").len(), 2, "{held:?}");
    // A transaction larger than the window goes whole, alone.
    let alone = f
        .client
        .subscribe(&open(1), &["--ack", "none", "--idle", "3"]);
    assert_eq!(events(&alone, "commit").len(), 1, "{alone:?}");
    assert_eq!(events(&alone, "change").len(), 2);
    // Acknowledging frees the window: everything arrives.
    let all = f.client.subscribe(&open(1), &["--idle", "3"]);
    assert_eq!(events(&all, "commit").len(), 10, "{all:?}");
}

#[test]
fn durable_consumers_are_managed_with_the_admin_calls_and_have_one_session() {
    let f = Fixture::start("CREATE TABLE t (id int PRIMARY KEY)", "", "");
    f.pg.psql("INSERT INTO t VALUES (1)");
    let created = f.client.call(
        "CreateConsumer",
        &json!({"consumer": "audit", "start": earliest()}),
    );
    assert_eq!(created["consumer"], "audit", "{created}");
    let again = f
        .client
        .call("CreateConsumer", &json!({"consumer": "audit"}));
    assert_eq!(again["error"], "ALREADY_EXISTS", "{again}");
    let bad = f
        .client
        .call("CreateConsumer", &json!({"consumer": "no spaces"}));
    assert_eq!(bad["error"], "INVALID_ARGUMENT", "{bad}");

    // One session at a time.
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let open = json!({"consumer": "audit"});
    let reading = f
        .client
        .spawn_subscribe(&open, &["--idle", "30"], &dir.path().join("a.jsonl"));
    reading.wait_for(WAIT, |lines| !events(lines, "commit").is_empty());
    let second = f.client.subscribe(&open, &[]);
    assert_eq!(end(&second)["code"], "FAILED_PRECONDITION", "{second:?}");
    assert!(
        end(&second)["details"]
            .as_str()
            .is_some_and(|d| d.contains("`audit` already has a session")),
        "{second:?}"
    );
    let listed = f.client.call("ListConsumers", &json!({}));
    let audit = &listed["consumers"][0];
    assert_eq!(audit["consumer"], "audit", "{listed}");
    assert_eq!(audit["connected"], true, "{listed}");
    // On /metrics: the session, what it was sent and acknowledged.
    let admin = f.wb.admin_address(WAIT);
    let feed_metric = |name: &str, labels: &[(&str, &str)]| {
        let mut labels = labels.to_vec();
        labels.push(("sink", "feed"));
        admin::value(&admin::metrics(&admin), name, &labels)
    };
    // The gauges are set every second.
    let wait_for_metric = |name: &str, labels: &[(&str, &str)], wanted: &dyn Fn(f64) -> bool| {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let value = feed_metric(name, labels);
            if value.is_some_and(wanted) || std::time::Instant::now() > deadline {
                return value;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    assert_eq!(
        wait_for_metric("walbridge_feed_sessions", &[], &|v| v == 1.0),
        Some(1.0)
    );
    let sent = reading.lines();
    let audit_metric = |name: &str| feed_metric(name, &[("consumer", "audit")]);
    let changes = events(&sent, "change").len() as f64;
    assert_eq!(
        wait_for_metric(
            "walbridge_feed_events_total",
            &[("consumer", "audit")],
            &|v| v == changes
        ),
        Some(changes),
        "{sent:?}"
    );
    assert!(audit_metric("walbridge_feed_sent_bytes_total").is_some_and(|b| b > 0.0));
    assert!(
        audit_metric("walbridge_feed_acknowledgements_total")
            .is_some_and(|n| n >= events(&sent, "commit").len() as f64)
    );
    let seek = f
        .client
        .call("Seek", &json!({"consumer": "audit", "start": earliest()}));
    assert_eq!(
        seek["error"], "FAILED_PRECONDITION",
        "not while it has a session: {seek}"
    );
    drop(reading);

    // Lag: records and WAL bytes past the consumer's position.
    f.client
        .call("Seek", &json!({"consumer": "audit", "start": earliest()}));
    f.pg.psql("INSERT INTO t VALUES (2)");
    let lag = || {
        let listed = f.client.call("ListConsumers", &json!({}));
        listed["consumers"][0]["positions"][0].clone()
    };
    let records = |p: &Value| {
        p["lag_records"]
            .as_str()
            .and_then(|r| r.parse::<u64>().ok())
    };
    let deadline = std::time::Instant::now() + WAIT;
    while records(&lag()) < Some(3) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let position = lag();
    assert_eq!(position["source"], "src");
    assert!(
        records(&position) >= Some(3),
        "the copy's end and two transactions: {position}"
    );
    assert!(
        position["lag_bytes"].as_str().is_some_and(|b| b != "0"),
        "{position}"
    );
    let lag_labels = [("consumer", "audit"), ("source", "src")];
    assert!(
        wait_for_metric("walbridge_feed_consumer_lag_records", &lag_labels, &|v| v
            >= 3.0)
        .is_some_and(|v| v >= 3.0)
    );
    assert!(feed_metric("walbridge_feed_consumer_lag_bytes", &lag_labels).is_some_and(|v| v > 0.0));
    assert_eq!(
        feed_metric("walbridge_feed_sessions", &[]),
        Some(0.0),
        "the session ended"
    );
    let moved = f.client.call(
        "Seek",
        &json!({"consumer": "audit", "start": {"latest": {}}}),
    );
    assert_eq!(
        moved["positions"][0]["lag_records"], "0",
        "no lag at latest: {moved}"
    );
    assert_eq!(
        wait_for_metric("walbridge_feed_consumer_lag_bytes", &lag_labels, &|v| v
            == 0.0),
        Some(0.0)
    );
    assert_eq!(admin::lint_metrics(&admin), "");

    let deleted = f
        .client
        .call("DeleteConsumer", &json!({"consumer": "audit"}));
    assert_eq!(deleted, json!({}));
    assert_eq!(
        f.client.call("ListConsumers", &json!({})),
        json!({"consumers": []})
    );
    let gone = f
        .client
        .call("DeleteConsumer", &json!({"consumer": "audit"}));
    assert_eq!(gone["error"], "NOT_FOUND", "{gone}");

    // Standard health checking and reflection.
    assert_eq!(f.client.health(""), json!({"status": "SERVING"}));
    assert_eq!(
        f.client.health("walbridge.feed.v1.ChangeFeed"),
        json!({"status": "SERVING"})
    );
    let reflected = f.client.reflect();
    let services = reflected["services"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for service in ["walbridge.feed.v1.ChangeFeed", "grpc.health.v1.Health"] {
        assert!(services.contains(&json!(service)), "{reflected}");
    }
    assert_eq!(
        reflected["methods"]["Subscribe"]["input"],
        "walbridge.feed.v1.SubscribeRequest"
    );
}

#[test]
fn a_durable_consumer_misses_nothing_when_walbridge_is_killed() {
    let port = free_port();
    let mut f = Fixture::start_with(
        WORKLOAD_SCHEMA,
        "",
        &feed::sink(&format!("127.0.0.1:{port}"), ""),
    );
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    // A consumer that acknowledges every transaction as it goes and
    // reconnects whenever the feed goes away, to the same port.
    let subscriber = f.client.spawn_subscribe(
        &json!({"consumer": "app", "start": earliest()}),
        &["--reconnect", "60", "--idle", "20"],
        &dir.path().join("app.jsonl"),
    );
    subscriber.wait_for(WAIT, |lines| !events(lines, "copy_complete").is_empty());
    let seed = 17;
    let running = f.running.take().unwrap_or_else(|| panic!("not running"));
    let reconnects = || {
        subscriber
            .lines()
            .iter()
            .filter(|l| l.get("reconnect").is_some())
            .count()
    };
    let (running, kills, written) = write_while_killing(
        &f.pg,
        &f.wb,
        running,
        (20, 10),
        &mut Rng::new(seed),
        700,
        || {},
        || reconnects() >= 5,
    );
    f.running = Some(running);
    let lines = subscriber.finish(Duration::from_secs(180));
    let context = format!("seed {seed}, {kills} kills, {written} transactions");
    assert_eq!(
        end(&lines)["reason"],
        "idle",
        "{context}: {:?}",
        end(&lines)
    );
    let reconnected = lines
        .iter()
        .filter(|l| l.get("reconnect").is_some())
        .count();
    assert!(reconnected >= 5, "the subscriber saw the kills: {context}");

    // A transaction sent again after a kill (its acknowledgement not yet
    // stored) is the same transaction: consumers deduplicate by event id.
    let mut seen = std::collections::BTreeMap::new();
    let mut unique = Vec::new();
    let mut duplicates = 0;
    for (line, envelope) in events(&lines, "change").into_iter().zip(envelopes(&lines)) {
        let id = line["decoded"]["id"].to_string();
        match seen.get(&id) {
            Some(first) => {
                assert_eq!(
                    first, &envelope,
                    "event {id} sent twice differently; {context}"
                );
                duplicates += 1;
            }
            None => {
                seen.insert(id, envelope.clone());
                unique.push(envelope);
            }
        }
    }
    eprintln!(
        "{context}: {} changes, {duplicates} sent again after a kill",
        unique.len()
    );
    // Within each session, commits only go forward.
    let mut last = 0;
    for line in &lines {
        if line.get("reconnect").is_some() || line["event"] == "subscribed" {
            last = 0;
        } else if line["event"] == "commit" {
            let at = lsn(&line["message"]["commit_lsn"]);
            assert!(at > last, "commits out of order: {line}; {context}");
            last = at;
        }
    }
    let unique: Vec<&Value> = unique.iter().collect();
    assert_replays_to_publisher(&f.pg, &unique, &context);
}

#[test]
fn the_log_is_kept_for_a_durable_consumer_until_it_acknowledges_within_retention() {
    let f = Fixture::start_with(
        "CREATE TABLE t (id int PRIMARY KEY, pad text)",
        "",
        &format!(
            "{}\n[log]\nsegment_size = \"64KiB\"\n",
            feed::sink("127.0.0.1:0", "retention = \"3s\"")
        ),
    );
    let created = f
        .client
        .call("CreateConsumer", &json!({"consumer": "slow"}));
    assert_eq!(created["consumer"], "slow", "{created}");
    let write = |from: i64| {
        for chunk in 0..10 {
            let first = from + chunk * 100;
            f.pg.psql(&format!(
                "INSERT INTO t SELECT g, repeat('x', 300) FROM generate_series({first}, {}) g",
                first + 99
            ));
        }
    };
    // 1,000 rows of 300 bytes: about five segments, all kept for `slow`.
    write(0);
    let deadline = std::time::Instant::now() + WAIT;
    while f.segments() < 5 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    // Time for the sink to have let go of anything it would.
    std::thread::sleep(Duration::from_secs(1));
    let kept = f.segments();
    assert!(
        kept >= 5,
        "{kept} segments: the log keeps what `slow` has not acknowledged"
    );
    let read = f
        .client
        .subscribe(&json!({"consumer": "slow"}), &["--idle", "3"]);
    assert_eq!(events(&read, "change").len(), 1000);
    assert!(
        f.wait_for_segments_at_most(2) <= 2,
        "once acknowledged, the segments go ({} left)",
        f.segments()
    );

    // Past retention, the log no longer waits: the consumer is told, not
    // given a gap.
    write(1000);
    std::thread::sleep(Duration::from_secs(4));
    write(2000);
    assert!(
        f.wait_for_segments_at_most(kept - 1) < kept,
        "segments older than retention are removed although `slow` did not acknowledge them"
    );
    let late = f
        .client
        .subscribe(&json!({"consumer": "slow"}), &["--idle", "3"]);
    let refused = end(&late);
    assert_eq!(refused["code"], "OUT_OF_RANGE", "{late:?}");
    let details = refused["details"].as_str().unwrap_or_default();
    assert!(
        details.contains("durable consumer `slow` is at LSN")
            && details.contains("but the log now starts after LSN")
            && details.contains("Seek"),
        "{details}"
    );
    assert!(
        events(&late, "change").is_empty(),
        "nothing sent past a gap"
    );
    // Moved to what the log holds, it reads on. Retention goes on removing
    // what is past it, so the oldest record may go between the Seek and
    // the subscription: that is refused the same way, and moved again.
    let mut attempts = 0;
    let rest = loop {
        let moved = f
            .client
            .call("Seek", &json!({"consumer": "slow", "start": earliest()}));
        assert_eq!(moved["consumer"], "slow", "{moved}");
        let rest = f
            .client
            .subscribe(&json!({"consumer": "slow"}), &["--idle", "3"]);
        attempts += 1;
        if end(&rest)["code"] != "OUT_OF_RANGE" || attempts == 5 {
            break rest;
        }
    };
    let ids: Vec<i64> = events(&rest, "change")
        .iter()
        .filter_map(|c| c["decoded"]["new"]["id"]["int64"].as_i64())
        .collect();
    assert!(
        ids.last() == Some(&2999) && ids.windows(2).all(|w| w[1] == w[0] + 1),
        "from the oldest record held to the end, in order: {} rows from {:?}",
        ids.len(),
        ids.first()
    );
}

#[test]
fn over_tls_only_a_client_with_a_certificate_and_the_token_reads() {
    let pg = Cluster::start();
    pg.psql("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub FOR ALL TABLES");
    pg.psql("INSERT INTO t VALUES (1)");
    let wb = Deployment::new();
    let authority = Authority::new(wb.path());
    let server = authority.issue("feed", Purpose::Server);
    let reader = authority.issue("reader", Purpose::Client);
    let tls = format!(
        "tls_cert = \"{}\"\ntls_key = \"{}\"\ntls_client_ca = \"{}\"\ntoken = \"${{FEED_TOKEN}}\"",
        server.cert.display(),
        server.key.display(),
        authority.cert().display()
    );
    wb.configure_sinks(
        &pg.superuser(),
        &["pub"],
        "",
        &feed::sink("127.0.0.1:0", &tls),
    );
    let token = [("FEED_TOKEN", "the-feed-secret")];
    let empty = walbridge_tests::printed(&wb.command_with_env(&["check"], &[("FEED_TOKEN", "")]));
    assert!(empty.contains("token is empty"), "{empty}");
    let checked = walbridge_tests::printed(&wb.command_with_env(&["check"], &token));
    assert!(
        checked.contains("over TLS, with client certificates, with a token"),
        "{checked}"
    );
    let _running = wb.start_with_env(&token);
    let address = feed::address(&wb, 0, WAIT);
    let tls = Client::new(&address).with_tls(&authority.cert());
    let certified = tls.with_certificate(&reader);

    let allowed = certified.with_token("the-feed-secret");
    let lines = allowed.subscribe(&json!({"start": earliest()}), &["--units", "1"]);
    assert_eq!(end(&lines)["end"], "stopped", "{lines:?}");
    assert_eq!(
        events(&lines, "rows")[0]["decoded"]["rows"],
        json!([{"id": {"int64": 1}}]),
        "{lines:?}"
    );
    assert_eq!(
        allowed.call("ListConsumers", &json!({})),
        json!({"consumers": []})
    );
    assert!(allowed.reflect()["services"].is_array());

    // A wrong or missing token: every call but the health check refused.
    for refused in [certified.with_token("not-the-secret"), certified.clone()] {
        let lines = refused.subscribe(&json!({"start": earliest()}), &[]);
        assert_eq!(end(&lines)["code"], "UNAUTHENTICATED", "{lines:?}");
        assert!(
            end(&lines)["details"]
                .as_str()
                .is_some_and(|d| d.contains("authorization: Bearer")),
            "the message says what to send: {lines:?}"
        );
        let listed = refused.call("ListConsumers", &json!({}));
        assert_eq!(listed["error"], "UNAUTHENTICATED", "{listed}");
        let reflected = refused.reflect();
        assert_eq!(reflected["error"], "UNAUTHENTICATED", "{reflected}");
        assert_eq!(refused.health(""), json!({"status": "SERVING"}));
    }

    // Without a certificate the CA signed, or without TLS, no connection.
    let stranger_ca = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let stranger = Authority::new(stranger_ca.path()).issue("stranger", Purpose::Client);
    for refused in [
        tls.with_token("the-feed-secret"),
        tls.with_certificate(&stranger)
            .with_token("the-feed-secret"),
        Client::new(&address).with_token("the-feed-secret"),
    ] {
        let listed = refused.call("ListConsumers", &json!({}));
        assert_eq!(listed["error"], "UNAVAILABLE", "{listed}");
        assert_eq!(refused.health("")["error"], "UNAVAILABLE");
    }
}

/// Runs the Go example consumer against the feed at `address` until it is
/// idle for 3 s; its JSON lines.
fn run_go_consumer(address: &str, args: &[&str]) -> Vec<Value> {
    let output = walbridge_tests::succeeds(
        std::process::Command::new(feed::go_consumer())
            .args(["-address", address, "-idle", "3s"])
            .args(args),
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

/// The changes among a Go consumer's lines, without their ids.
fn go_changes(lines: &[Value]) -> Vec<Value> {
    lines
        .iter()
        .filter(|l| l.get("op").is_some())
        .map(|l| {
            assert!(
                l["id"].as_str().is_some_and(|id| id.starts_with("src/")),
                "{l}"
            );
            let mut change = l.clone();
            change.as_object_mut().map(|o| o.remove("id"));
            change
        })
        .collect()
}

#[test]
fn the_go_example_reads_the_copy_and_changes_and_resumes_after_its_acknowledgement() {
    let f = Fixture::start(
        "CREATE TABLE t (id int PRIMARY KEY, name text, at timestamptz, doc jsonb, tags int[]);
         ALTER TABLE t REPLICA IDENTITY FULL;
         INSERT INTO t VALUES (1, 'one', '2026-12-04 10:00:00.5+00', '{\"a\": [1, 2]}', '{1,2}'),
                              (2, NULL, NULL, NULL, '{}')",
        "",
        "",
    );
    let address = f.client.address();
    let first = run_go_consumer(&address, &["-consumer", "go-audit", "-start", "earliest"]);
    assert_eq!(
        go_changes(&first),
        vec![
            json!({"op": "read", "table": "public.t", "new": {"id": 1, "name": "one", "at": "2026-12-04T10:00:00.5Z", "doc": {"a": [1, 2]}, "tags": [1, 2]}}),
            json!({"op": "read", "table": "public.t", "new": {"id": 2, "name": null, "at": null, "doc": null, "tags": []}}),
        ],
        "{first:?}"
    );
    assert!(first.iter().any(|l| l.get("acked").is_some()), "{first:?}");

    f.pg.psql("INSERT INTO t (id, name) VALUES (3, 'three')");
    f.pg.psql("UPDATE t SET name = 'uno' WHERE id = 1; DELETE FROM t WHERE id = 2");
    // The same durable consumer: after its acknowledgements, nothing twice.
    let second = run_go_consumer(&address, &["-consumer", "go-audit"]);
    let one = json!({"id": 1, "name": "one", "at": "2026-12-04T10:00:00.5Z", "doc": {"a": [1, 2]}, "tags": [1, 2]});
    let mut uno = one.clone();
    uno["name"] = json!("uno");
    assert_eq!(
        go_changes(&second),
        vec![
            json!({"op": "INSERT", "table": "public.t", "new": {"id": 3, "name": "three", "at": null, "doc": null, "tags": null}}),
            json!({"op": "UPDATE", "table": "public.t", "new": uno, "old": one}),
            json!({"op": "DELETE", "table": "public.t", "old": {"id": 2, "name": null, "at": null, "doc": null, "tags": []}}),
        ],
        "{second:?}"
    );
    let third = run_go_consumer(&address, &["-consumer", "go-audit"]);
    assert_eq!(go_changes(&third), Vec::<Value>::new(), "{third:?}");
}

/// Per key, the values of `v` a member received, in its order: the copy's
/// and every update's.
fn values_by_key(lines: &[Value]) -> std::collections::BTreeMap<i64, Vec<i64>> {
    let mut by_key = std::collections::BTreeMap::<i64, Vec<i64>>::new();
    for envelope in envelopes(lines) {
        let after = &envelope["after"];
        let (Some(id), Some(v)) = (after["id"].as_i64(), after["v"].as_i64()) else {
            panic!("a row without id and v: {envelope}");
        };
        by_key.entry(id).or_default().push(v);
    }
    by_key
}

/// The last assignment a member received.
fn last_assignment(lines: &[Value]) -> Value {
    events(lines, "assignment")
        .last()
        .map(|l| l["message"].clone())
        .unwrap_or(Value::Null)
}

#[test]
fn a_group_of_three_shares_every_change_exactly_once_across_a_member_leaving() {
    const KEYS: i64 = 60;
    let f = Fixture::start(
        &format!(
            "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL);
             INSERT INTO t SELECT g, 0 FROM generate_series(1, {KEYS}) g"
        ),
        "",
        "",
    );
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let open = json!({"consumer": "workers", "group": {"partitions": 12}, "start": earliest()});
    let member = |name: &str, options: &[&str]| {
        f.client
            .spawn_subscribe(&open, options, &dir.path().join(format!("{name}.jsonl")))
    };
    let a = member("a", &["--idle", "15"]);
    let b = member("b", &["--idle", "15"]);
    // C leaves after 40 transactions, while the writes go on.
    let c = member("c", &["--idle", "15", "--units", "40"]);
    for m in [&a, &b, &c] {
        m.wait_for(WAIT, |lines| last_assignment(lines)["members"] == 3);
    }
    let listed = f.client.call("ListConsumers", &json!({}));
    assert_eq!(listed["consumers"][0]["members"], 3, "{listed}");
    let alone = f.client.subscribe(&json!({"consumer": "workers"}), &[]);
    assert_eq!(end(&alone)["code"], "FAILED_PRECONDITION", "{alone:?}");
    assert!(
        end(&alone)["details"]
            .as_str()
            .is_some_and(|d| d.contains("is a consumer group")),
        "{alone:?}"
    );
    assert_eq!(listed["consumers"][0]["partitions"], 12, "{listed}");

    // Transactions of updates to two keys each: every key's `v` counts
    // its updates, so each member's sequence per key must be 1, 2, 3, ...
    let mut rng = Rng::new(17);
    let mut script = String::new();
    for _ in 0..400 {
        let (k1, k2) = (rng.next(KEYS as u64) + 1, rng.next(KEYS as u64) + 1);
        script.push_str(&format!(
            "BEGIN; UPDATE t SET v = v + 1 WHERE id = {k1}; UPDATE t SET v = v + 1 WHERE id = {k2}; COMMIT;\n"
        ));
    }
    f.pg.psql(&script);

    let c = c.finish(WAIT);
    assert_eq!(
        end(&c)["reason"],
        "units",
        "C left on its own: {:?}",
        end(&c)
    );
    let (a, b) = (a.finish(WAIT * 2), b.finish(WAIT * 2));
    for lines in [&a, &b] {
        assert_eq!(end(lines)["end"], "stopped", "{:?}", end(lines));
        assert_eq!(
            last_assignment(lines)["members"],
            2,
            "rebalanced after C left"
        );
    }

    // Every member's partitions are its own: a key is read by one member
    // at a time, and across members every value arrives exactly once.
    let publisher: std::collections::BTreeMap<i64, i64> =
        f.pg.psql("SELECT id || ' ' || v FROM t")
            .lines()
            .filter_map(|line| {
                let (id, v) = line.split_once(' ')?;
                Some((id.parse().ok()?, v.parse().ok()?))
            })
            .collect();
    assert_eq!(publisher.len(), KEYS as usize);
    let members = [values_by_key(&a), values_by_key(&b), values_by_key(&c)];
    for (id, last) in &publisher {
        let mut received: Vec<i64> = Vec::new();
        for (m, by_key) in members.iter().enumerate() {
            if let Some(values) = by_key.get(id) {
                assert!(
                    values.windows(2).all(|w| w[0] < w[1]),
                    "member {m} received key {id} out of order: {values:?}"
                );
                received.extend(values);
            }
        }
        received.sort_unstable();
        assert_eq!(
            received,
            (0..=*last).collect::<Vec<_>>(),
            "key {id}: its copy and every update exactly once"
        );
    }
    let keys_of = |m: usize| {
        members[m]
            .keys()
            .copied()
            .collect::<std::collections::BTreeSet<_>>()
    };
    assert!(
        (0..3).all(|m| !keys_of(m).is_empty()),
        "every member had partitions"
    );
}

#[test]
fn a_table_created_under_for_all_tables_arrives_as_reads_then_changes() {
    let f = Fixture::start(
        "CREATE TABLE a (id int PRIMARY KEY)",
        "refresh_interval = 1",
        "",
    );
    f.pg.psql(
        "CREATE TABLE b (id int PRIMARY KEY, v int);
         INSERT INTO b SELECT g, g FROM generate_series(1, 300) g",
    );
    f.wb.wait_for_log("table copied while streaming", WAIT);
    f.pg.psql("UPDATE b SET v = 0 WHERE id = 1");
    let lines = read_all(&f.client, &json!({"start": earliest()}));
    let changes: Vec<&Value> = events(&lines, "change")
        .into_iter()
        .map(|c| &c["decoded"])
        .collect();
    let operations: Vec<&str> = changes
        .iter()
        .filter_map(|c| c["operation"].as_str())
        .collect();
    // The inserts that made the rows are held back: each row comes once,
    // read, then its change.
    assert_eq!(operations.len(), 301, "{operations:?}");
    assert!(
        operations[..300].iter().all(|o| *o == "READ"),
        "{operations:?}"
    );
    assert_eq!(operations[300], "UPDATE");
    let ids: Vec<i64> = changes[..300]
        .iter()
        .filter_map(|c| c["new"]["id"]["int64"].as_i64())
        .collect();
    assert_eq!(ids, (1..=300).collect::<Vec<_>>());
}

#[test]
fn sequences_arrive_as_sequence_events_between_transactions() {
    let f = Fixture::start(
        "CREATE TABLE a (id serial PRIMARY KEY, v int); CREATE SEQUENCE other",
        "refresh_interval = 1\nsequences = true",
        "",
    );
    f.pg.psql("INSERT INTO a (v) SELECT g FROM generate_series(1, 5) g; SELECT nextval('other')");
    // Each event holds the sequences that moved since the one before.
    let deadline = std::time::Instant::now() + WAIT;
    let (events_seen, latest) = loop {
        let lines = read_all(&f.client, &json!({"start": earliest()}));
        let found: Vec<Value> = events(&lines, "sequences")
            .into_iter()
            .map(|e| e["message"].clone())
            .collect();
        let mut latest = std::collections::BTreeMap::new();
        for event in &found {
            for s in event["sequences"].as_array().into_iter().flatten() {
                latest.insert(
                    format!(
                        "{}.{}",
                        s["schema"].as_str().unwrap_or(""),
                        s["name"].as_str().unwrap_or("")
                    ),
                    s["last_value"].clone(),
                );
            }
        }
        let expected = json!({"public.a_id_seq": "5", "public.other": "1"});
        if serde_json::to_value(&latest).unwrap_or_default() == expected {
            break (found, latest);
        }
        assert!(std::time::Instant::now() < deadline, "{lines:?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    // FOR ALL TABLES: every sequence; int64 is a JSON string.
    assert_eq!(latest.len(), 2);
    let last = events_seen.last().unwrap_or_else(|| panic!("no event"));
    assert_eq!(last["id"]["source"], "src");
    assert!(!last["resume_token"].as_str().unwrap_or_default().is_empty());
}
