//! The kafka sink against a real Apache Kafka broker
//! (`scripts/throwaway-kafka.sh`), read back with Python's confluent-kafka.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{Value, json};
use walbridge_tests::Cluster;
use walbridge_tests::admin::{metrics, value};
use walbridge_tests::kafka::{Broker, ConsumeOptions, Consumed, consume};
use walbridge_tests::walbridge::Deployment;

const WAIT: Duration = Duration::from_secs(90);

/// A publisher, a broker, and walbridge between them.
struct Pipeline {
    publisher: Cluster,
    broker: Broker,
    wb: Deployment,
}

impl Pipeline {
    fn new(ddl: &str) -> Self {
        let publisher = Cluster::start();
        publisher.psql(ddl);
        Pipeline {
            publisher,
            broker: Broker::start(),
            wb: Deployment::new(),
        }
    }

    /// Source `src` reading publication `pub`, a kafka sink `events` with
    /// `sink_extra`, and `other_sinks` verbatim.
    fn configure(&self, sink_extra: &str, other_sinks: &str) {
        self.wb.configure_sinks(
            &self.publisher.superuser(),
            &["pub"],
            "",
            &format!(
                "[[sink]]\nname = \"events\"\ntype = \"kafka\"\nbrokers = \"{}\"\n{sink_extra}\n\n{other_sinks}",
                self.broker.bootstrap()
            ),
        );
    }

    fn read(&self, topics: &[&str], expect: usize) -> Vec<Consumed> {
        consume(
            &self.broker.bootstrap(),
            &ConsumeOptions {
                topics,
                format: "json",
                expect,
                timeout: WAIT,
                registry: None,
                read_committed: false,
                schema_version: None,
                properties: &[],
            },
        )
    }
}

/// Waits until walbridge's log contains `text`; returns the log.
fn wait_for_log(wb: &Deployment, text: &str) -> String {
    wb.wait_for_log(text, WAIT)
}

/// Messages per key, each key's in partition order (Kafka orders a key's
/// messages, nothing across keys).
fn by_key(messages: &[Consumed]) -> BTreeMap<String, Vec<&Consumed>> {
    let mut keys: BTreeMap<String, Vec<&Consumed>> = BTreeMap::new();
    for m in messages {
        keys.entry(m.key.to_string()).or_default().push(m);
    }
    keys
}

fn ops(messages: &[&Consumed]) -> Vec<String> {
    messages
        .iter()
        .map(|m| m.value["op"].as_str().unwrap_or("tombstone").to_owned())
        .collect()
}

#[test]
fn change_events_keys_tombstones_and_headers() {
    let p = Pipeline::new(
        "CREATE TABLE items (id int PRIMARY KEY, name text, qty int8, doc jsonb, price numeric(10,2));
         CREATE TABLE notes (body text);
         CREATE TABLE full_items (label text, id int PRIMARY KEY);
         ALTER TABLE full_items REPLICA IDENTITY FULL;
         INSERT INTO items VALUES (1, 'one', 10, '{\"a\": [1, 2]}', 1.50), (2, 'two', 20, NULL, NULL), (3, 'three', 30, '{}', 3.00);
         INSERT INTO notes VALUES ('first');
         INSERT INTO full_items VALUES ('a', 1);
         CREATE PUBLICATION pub FOR TABLE items, notes, full_items;",
    );
    p.configure("", "");
    let check = p.wb.command(&["check"]);
    let printed = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success()
            && printed.contains("ok: sink `events`: 1 Kafka broker(s) reachable"),
        "{printed}{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let _running = p.wb.start();
    let items = "src.public.items";
    let notes = "src.public.notes";
    let snapshot = p.read(&[items], 3);
    let snapshot = by_key(&snapshot);
    assert_eq!(snapshot.len(), 3);
    let first = snapshot[&json!({"id": 1}).to_string()][0];
    assert_eq!(first.value["op"], "r");
    assert_eq!(
        first.value["after"],
        json!({"id": 1, "name": "one", "qty": 10, "doc": {"a": [1, 2]}, "price": "1.50"})
    );
    assert_eq!(first.value["before"], Value::Null);
    let source = &first.value["source"];
    assert_eq!(source["snapshot"], "true");
    assert_eq!(source["connector"], "postgresql");
    assert_eq!(source["name"], "src");
    assert_eq!(source["db"], "postgres");
    assert_eq!(
        (&source["schema"], &source["table"]),
        (&json!("public"), &json!("items"))
    );
    assert!(
        first.value["ts_ms"]
            .as_i64()
            .is_some_and(|t| t > 1_600_000_000_000)
    );
    assert_eq!(first.headers["walbridge.source"], "src");

    p.publisher.psql(
        "BEGIN;
         INSERT INTO items VALUES (4, 'four', 40, NULL, 4.00);
         UPDATE items SET qty = 11 WHERE id = 1;
         COMMIT;
         UPDATE items SET id = 20 WHERE id = 2;
         DELETE FROM items WHERE id = 3;
         INSERT INTO notes VALUES ('second');
         TRUNCATE notes;",
    );
    // c, u, then the key change (d + tombstone, c), then d + tombstone.
    let all = p.read(&[items], 3 + 7);
    let keys = by_key(&all);
    let history = |id: i64| ops(&keys[&json!({"id": id}).to_string()]);
    assert_eq!(history(1), ["r", "u"]);
    assert_eq!(history(2), ["r", "d", "tombstone"]);
    assert_eq!(history(20), ["c"]);
    assert_eq!(history(3), ["r", "d", "tombstone"]);
    assert_eq!(history(4), ["c"]);
    let insert = keys[&json!({"id": 4}).to_string()][0];
    let update = keys[&json!({"id": 1}).to_string()][1];
    let key_delete = keys[&json!({"id": 2}).to_string()][1];
    let key_create = keys[&json!({"id": 20}).to_string()][0];
    let delete = keys[&json!({"id": 3}).to_string()][1];
    assert_eq!(insert.value["after"]["price"], "4.00");
    assert_eq!(
        update.value["before"],
        Value::Null,
        "DEFAULT identity: no old row"
    );
    assert_eq!(update.value["after"]["qty"], 11);
    // One transaction: same xid and commit LSN; headers agree with `source`.
    assert_eq!(
        insert.value["source"]["txId"],
        update.value["source"]["txId"]
    );
    assert_eq!(
        insert.value["source"]["commit_lsn"],
        update.value["source"]["commit_lsn"]
    );
    assert_eq!(insert.value["source"]["snapshot"], "false");
    assert_eq!(
        insert.headers["walbridge.xid"],
        insert.value["source"]["txId"].to_string()
    );
    let lsn = insert.value["source"]["lsn"].as_u64().unwrap_or_default();
    assert_eq!(
        insert.headers["walbridge.lsn"],
        format!("{:X}/{:X}", lsn >> 32, lsn & 0xffff_ffff)
    );
    // The key change: the old key is deleted (and compacted away), the new one created.
    assert_eq!(key_delete.value["before"]["id"], 2);
    assert_eq!(key_create.value["before"], Value::Null);
    assert_eq!(key_create.value["after"]["name"], "two");
    assert_eq!(
        delete.value["before"],
        json!({"id": 3, "name": null, "qty": null, "doc": null, "price": null}),
        "DEFAULT identity: the old row has the key only"
    );
    assert_eq!(delete.value["after"], Value::Null);
    // Every message of a row on one partition.
    for (key, messages) in &keys {
        let partitions: BTreeSet<i64> = messages.iter().map(|m| m.partition).collect();
        assert_eq!(partitions.len(), 1, "{key}: {messages:#?}");
    }

    // A table without identity: null keys; its truncate is an event too.
    let note_events = p.read(&[notes], 3);
    let mut note_ops = ops(&note_events.iter().collect::<Vec<_>>());
    note_ops.sort();
    assert_eq!(note_ops, ["c", "r", "t"]);
    assert!(note_events.iter().all(|m| m.key.is_null()));
    let truncate = note_events.iter().find(|m| m.value["op"] == "t");
    assert_eq!(
        truncate.map(|m| &m.value["source"]["table"]),
        Some(&json!("notes"))
    );

    // REPLICA IDENTITY FULL flags every column; the key is the primary key.
    p.publisher.psql(
        "UPDATE full_items SET label = 'b' WHERE id = 1;
         UPDATE full_items SET id = 2 WHERE id = 1;
         DELETE FROM full_items WHERE id = 2;",
    );
    let full = p.read(&["src.public.full_items"], 7);
    let keys = by_key(&full);
    let first = &keys[&json!({"id": 1}).to_string()];
    assert_eq!(ops(first), ["r", "u", "d", "tombstone"], "{full:#?}");
    assert_eq!(first[1].value["before"], json!({"label": "a", "id": 1}));
    assert_eq!(first[1].value["after"], json!({"label": "b", "id": 1}));
    assert_eq!(
        ops(&keys[&json!({"id": 2}).to_string()]),
        ["c", "d", "tombstone"]
    );
}

#[test]
fn connect_schemas_transaction_metadata_and_messages() {
    let p = Pipeline::new(
        "CREATE TABLE a (id int PRIMARY KEY, v text, t timestamptz, j json, tags text[]);
         CREATE TABLE b (id bigint PRIMARY KEY, n numeric, c serial);
         INSERT INTO b VALUES (0, 0);
         CREATE PUBLICATION pub FOR TABLE a, b;",
    );
    p.wb.configure_sinks(
        &p.publisher.superuser(),
        &["pub"],
        "sequences = true\nrefresh_interval = 1",
        &format!(
            "[[sink]]\nname = \"events\"\ntype = \"kafka\"\nbrokers = \"{}\"\njson_schemas = true\ntransaction_topic = \"cdc.transactions\"\nmessage_topic = \"cdc.messages\"\nsequence_topic = \"cdc.sequences\"\ntombstones = false\ntopic = \"cdc.{{table}}\"\n",
            p.broker.bootstrap()
        ),
    );
    let _running = p.wb.start();
    // Streaming has started once the initial copy is out.
    p.read(&["cdc.b"], 1);
    p.publisher.psql(
        "SET timezone = 'UTC';
         BEGIN;
         INSERT INTO a VALUES (1, 'x', '2024-05-06 07:08:09.123456+00', '{\"k\": 1}', '{p,q}');
         INSERT INTO b VALUES (1, 12.5), (2, 7);
         SELECT pg_logical_emit_message(true, 'audit', 'who=alice');
         DELETE FROM b WHERE id = 2;
         COMMIT;",
    );
    let a = p.read(&["cdc.a"], 1);
    let event = &a[0];
    let schema = &event.value["schema"];
    assert_eq!(schema["name"], "cdc.a.Envelope");
    let fields: Vec<&str> = schema["fields"]
        .as_array()
        .map(|f| f.iter().filter_map(|f| f["field"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        fields,
        [
            "before",
            "after",
            "source",
            "op",
            "ts_ms",
            "ts_us",
            "transaction"
        ]
    );
    let after_fields = &schema["fields"][1]["fields"];
    let field = |name: &str| {
        after_fields
            .as_array()
            .and_then(|f| f.iter().find(|f| f["field"] == name))
            .cloned()
            .unwrap_or(Value::Null)
    };
    assert_eq!(field("id")["type"], "int32");
    assert_eq!(field("id")["optional"], false);
    assert_eq!(field("v")["optional"], true);
    assert_eq!(field("t")["name"], "io.debezium.time.ZonedTimestamp");
    assert_eq!(field("j")["name"], "io.debezium.data.Json");
    assert_eq!(field("tags")["type"], "array");
    let payload = &event.value["payload"];
    assert_eq!(payload["op"], "c");
    assert_eq!(
        payload["after"],
        json!({"id": 1, "v": "x", "t": "2024-05-06T07:08:09.123456Z", "j": "{\"k\": 1}", "tags": ["p", "q"]})
    );
    assert_eq!(event.key["schema"]["name"], "cdc.a.Key");
    assert_eq!(event.key["payload"], json!({"id": 1}));
    let transaction = &payload["transaction"];
    assert_eq!(transaction["total_order"], 1);
    assert_eq!(transaction["data_collection_order"], 1);
    let id = transaction["id"].as_str().unwrap_or_default().to_owned();
    assert!(id.starts_with(&format!("{}:", payload["source"]["txId"])));

    // b: the copied row, then two inserts and a delete (no tombstone with
    // `tombstones = false`).
    let b = p.read(&["cdc.b"], 4);
    let b_keys = by_key(&b);
    let b_events = |id: i64| -> Vec<&Value> {
        b_keys[&json!({"schema": b[0].key["schema"], "payload": {"id": id}}).to_string()]
            .iter()
            .map(|m| &m.value["payload"])
            .collect()
    };
    let ops_of = |id: i64| -> Vec<Value> { b_events(id).iter().map(|p| p["op"].clone()).collect() };
    assert_eq!(ops_of(0), ["r"]);
    assert_eq!(ops_of(1), ["c"]);
    assert_eq!(ops_of(2), ["c", "d"]);
    assert_eq!(b_events(1)[0]["after"]["n"], "12.5");
    let b_delete = b_events(2)[1];
    assert_eq!(b_delete["transaction"]["total_order"], 4);
    assert_eq!(b_delete["transaction"]["data_collection_order"], 3);

    // BEGIN and END per transaction, END with its counts per table.
    let transactions = p.read(&["cdc.transactions"], 2);
    let ours: Vec<&Value> = transactions
        .iter()
        .map(|m| &m.value["payload"])
        .filter(|v| v["id"] == id)
        .collect();
    assert_eq!(ours.len(), 2, "{transactions:#?}");
    assert_eq!(ours[0]["status"], "BEGIN");
    assert_eq!(ours[1]["status"], "END");
    assert_eq!(ours[1]["event_count"], 4);
    assert_eq!(
        ours[1]["data_collections"],
        json!([
            {"data_collection": "public.a", "event_count": 1},
            {"data_collection": "public.b", "event_count": 3},
        ])
    );

    let messages = p.read(&["cdc.messages"], 1);
    let message = &messages[0];
    assert_eq!(message.key["payload"], json!({"prefix": "audit"}));
    assert_eq!(message.value["payload"]["op"], "m");
    assert_eq!(message.value["payload"]["message"]["prefix"], "audit");
    assert_eq!(
        message.value["payload"]["message"]["content"],
        "d2hvPWFsaWNl"
    );
    assert_eq!(
        message.value["payload"]["source"]["txId"],
        payload["source"]["txId"]
    );

    // Sequences: an event per sequence that moved, keyed by its name; the
    // last one has b's serial at 3.
    let mut expect = 1;
    let sequence = loop {
        let read = p.read(&["cdc.sequences"], expect);
        let last = read.last().map(|m| (m.key.clone(), m.value.clone()));
        match last {
            Some((key, value)) if value["payload"]["sequence"]["last_value"] == 3 => {
                break (key, value);
            }
            _ => {
                assert!(read.len() < 10, "no event with b_c_seq at 3: {read:#?}");
                expect = read.len() + 1;
            }
        }
    };
    assert_eq!(
        sequence.0["payload"],
        json!({"schema": "public", "name": "b_c_seq"})
    );
    assert_eq!(sequence.1["payload"]["op"], "q");
    assert_eq!(sequence.1["schema"]["name"], "cdc.sequences.SequenceValue");
    assert_eq!(
        sequence.1["payload"]["sequence"],
        json!({"schema": "public", "name": "b_c_seq", "last_value": 3})
    );
}

#[test]
fn a_crash_loses_nothing_and_duplicates_are_recognizable() {
    let p = Pipeline::new(
        "CREATE TABLE t (id int PRIMARY KEY, v text);
         CREATE PUBLICATION pub FOR TABLE t;",
    );
    p.configure("", "");
    let mut next = 0;
    for round in 0..4 {
        let running = p.wb.start();
        for _ in 0..20 {
            p.publisher.psql(&format!(
                "INSERT INTO t SELECT g, 'v' || g FROM generate_series({}, {}) g",
                next + 1,
                next + 50
            ));
            next += 50;
        }
        std::thread::sleep(Duration::from_millis(200 * round));
        running.kill();
    }
    let running = p.wb.start();
    let messages = p.read(&["src.public.t"], next);
    running.stop(WAIT);
    // Every row arrived; a row seen more than once was re-sent whole
    // after a crash (same LSN, same row), never changed or reordered.
    let mut seen: BTreeMap<i64, &Consumed> = BTreeMap::new();
    let mut duplicates = 0;
    for m in &messages {
        let id = m.key["id"].as_i64().unwrap_or(-1);
        match seen.get(&id) {
            Some(first) => {
                duplicates += 1;
                assert_eq!(first.value["after"], m.value["after"]);
                assert_eq!(first.value["source"]["lsn"], m.value["source"]["lsn"]);
                assert_eq!(first.headers["walbridge.lsn"], m.headers["walbridge.lsn"]);
            }
            None => {
                seen.insert(id, m);
            }
        }
    }
    assert_eq!(seen.len(), next);
    assert_eq!(seen.keys().next(), Some(&1));
    assert_eq!(seen.keys().last(), Some(&(next as i64)));
    eprintln!(
        "{} messages, {duplicates} re-sent after crashes",
        messages.len()
    );
}

#[test]
fn an_unreachable_broker_holds_only_this_sink_back() {
    let publisher = Cluster::start();
    publisher.psql(
        "CREATE TABLE t (id int PRIMARY KEY);
         CREATE PUBLICATION pub FOR TABLE t;",
    );
    let port = walbridge_tests::free_port();
    let wb = Deployment::new();
    wb.configure_sinks(
        &publisher.superuser(),
        &["pub"],
        "",
        &format!(
            "[[sink]]\nname = \"events\"\ntype = \"kafka\"\nbrokers = \"127.0.0.1:{port}\"\n\n[[sink]]\nname = \"out\"\ntype = \"jsonl\"\npath = \"{}\"\n",
            wb.output_path().display()
        ),
    );
    let _running = wb.start();
    publisher.psql("INSERT INTO t SELECT generate_series(1, 100)");
    // The jsonl sink goes on while the kafka sink cannot reach its broker.
    wb.wait_for_lines(100, WAIT);
    wait_for_log(&wb, "cannot reach the Kafka brokers");
    let broker = Broker::start_on(port);
    publisher.psql("INSERT INTO t SELECT generate_series(101, 150)");
    let messages = consume(
        &broker.bootstrap(),
        &ConsumeOptions {
            topics: &["src.public.t"],
            format: "json",
            expect: 150,
            timeout: WAIT,
            registry: None,
            read_committed: false,
            schema_version: None,
            properties: &[],
        },
    );
    let ids: BTreeSet<i64> = messages
        .iter()
        .filter_map(|m| m.value["after"]["id"].as_i64())
        .collect();
    assert_eq!(ids, (1..=150).collect());
}

#[test]
fn an_oversized_message_stops_the_sink_naming_topic_table_and_key() {
    let p = Pipeline::new(
        "CREATE TABLE docs (id int PRIMARY KEY, body text);
         CREATE PUBLICATION pub FOR TABLE docs;",
    );
    p.configure(
        "[sink.kafka_properties]\n\"message.max.bytes\" = \"10000\"\n",
        &format!(
            "[[sink]]\nname = \"out\"\ntype = \"jsonl\"\npath = \"{}\"\n",
            p.wb.output_path().display()
        ),
    );
    let _running = p.wb.start();
    p.publisher.psql("INSERT INTO docs VALUES (1, 'small')");
    p.read(&["src.public.docs"], 1);
    p.publisher
        .psql("INSERT INTO docs VALUES (7, repeat('x', 20000))");
    p.publisher.psql("INSERT INTO docs VALUES (8, 'after')");
    let log = wait_for_log(&p.wb, "the sink stopped");
    assert!(
        log.contains("topic `src.public.docs` (table public.docs, key {\"id\":7})"),
        "{log}"
    );
    // The other sink goes on.
    let lines = p.wb.wait_for_lines(3, WAIT);
    assert_eq!(lines[2]["after"]["id"], 8);
    // Nothing after the refused message was sent.
    let messages = p.read(&["src.public.docs"], 1);
    assert_eq!(messages.len(), 1);
    // /metrics: the one message delivered, none failed in delivery (the
    // client refused the big one before sending it), none in flight.
    let samples = metrics(&p.wb.admin_address(WAIT));
    let messages = |outcome| {
        value(
            &samples,
            "walbridge_kafka_messages_total",
            &[("sink", "events"), ("outcome", outcome)],
        )
    };
    assert_eq!(
        (messages("delivered"), messages("failed")),
        (Some(1.0), Some(0.0)),
        "{samples:#?}"
    );
    assert_eq!(
        value(
            &samples,
            "walbridge_kafka_in_flight_messages",
            &[("sink", "events")]
        ),
        Some(0.0)
    );
}

/// A table of the type list, in one row, for the schema formats.
const KINDS_DDL: &str = "CREATE TYPE mood AS ENUM ('sad', 'happy');
     CREATE TABLE kinds (
         id int8 PRIMARY KEY, small int2, flag bool, price numeric(12,3), ratio float8,
         label text, raw bytea, day date, at_time time, at timestamp, at_tz timestamptz,
         uid uuid, doc jsonb, tags text[], nums int4[], feeling mood, free numeric
     );
     CREATE PUBLICATION pub FOR TABLE kinds;";

/// A pipeline whose kafka sink writes `format` with the embedded registry
/// it serves, started; the registry's URL.
/// Sequences go to `src.sequences` (`kinds_seq`, owned by the table, at 7).
fn with_embedded_registry(format: &str, rows: &str) -> (Pipeline, String) {
    let p = Pipeline::new(&format!(
        "{KINDS_DDL}\nCREATE SEQUENCE kinds_seq OWNED BY kinds.id; SELECT setval('kinds_seq', 7);\n{rows}"
    ));
    let registry_port = walbridge_tests::free_port();
    p.wb.configure_sinks(
        &p.publisher.superuser(),
        &["pub"],
        "sequences = true\nrefresh_interval = 1",
        &format!(
            "[schema_registry]\nlisten = \"127.0.0.1:{registry_port}\"\n\n[[sink]]\nname = \"events\"\ntype = \"kafka\"\nbrokers = \"{}\"\nformat = \"{format}\"\nsequence_topic = \"src.sequences\"\n",
            p.broker.bootstrap()
        ),
    );
    (p, format!("http://127.0.0.1:{registry_port}"))
}

/// The sequence event `with_embedded_registry`'s pipeline sends, read
/// with `format`'s deserializers.
fn assert_sequence_event(p: &Pipeline, registry: &str, format: &str) {
    let read = read_registered(p, registry, format, "src.sequences", 1, None);
    let event = &read.messages[0];
    assert_eq!(event.key, json!({"schema": "public", "name": "kinds_seq"}));
    assert_eq!(event.value["op"], "q");
    assert_eq!(
        event.value["sequence"],
        json!({"schema": "public", "name": "kinds_seq", "last_value": 7})
    );
    assert_eq!(event.value["source"]["name"], "src");
}

/// Reads `topic` with `format`'s deserializers and the registry (Protobuf:
/// with classes made from `schema_version`, else the latest).
fn read_registered(
    p: &Pipeline,
    registry: &str,
    format: &str,
    topic: &str,
    expect: usize,
    schema_version: Option<u32>,
) -> walbridge_tests::kafka::ConsumeResult {
    walbridge_tests::kafka::consume_with_registry(
        &p.broker.bootstrap(),
        &ConsumeOptions {
            topics: &[topic],
            format,
            expect,
            timeout: WAIT,
            registry: Some(registry),
            read_committed: false,
            schema_version,
            properties: &[],
        },
    )
}

#[test]
fn avro_events_through_the_embedded_registry() {
    let (p, registry) = with_embedded_registry(
        "avro",
        "INSERT INTO kinds VALUES (1, -7, true, 1234.5, 0.25, 'é', '\\x00ff', '2024-05-06', '07:08:09.5',
             '2024-05-06 07:08:09.123456', '2024-05-06 07:08:09.123456+02', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
             '{\"k\": [1, 2]}', '{a,NULL,\"b c\"}', '{1,2}', 'happy', 'NaN');",
    );
    let check = p.wb.command(&["check"]);
    let out = String::from_utf8_lossy(&check.stdout);
    assert!(
        out.contains("schemas go to the registry walbridge serves"),
        "{out}{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let running = p.wb.start();
    let topic = "src.public.kinds";
    let read = |expect: usize| read_registered(&p, &registry, "avro", topic, expect, None);
    let first = read(1);
    assert_sequence_event(&p, &registry, "avro");
    let snapshot = &first.messages[0];
    assert_eq!(snapshot.key, json!({"id": 1}));
    assert_eq!(snapshot.value["op"], "r");
    assert_eq!(snapshot.value["source"]["snapshot"], "true");
    assert_eq!(
        snapshot.value["after"],
        json!({
            "id": 1, "small": -7, "flag": true, "price": "1234.500", "ratio": 0.25,
            "label": "é", "raw": "AP8=", "day": "2024-05-06", "at_time": "07:08:09.500000",
            "at": "2024-05-06T07:08:09.123456", "at_tz": "2024-05-06T05:08:09.123456+00:00",
            "uid": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "doc": "{\"k\": [1, 2]}",
            "tags": ["a", null, "b c"], "nums": [1, 2], "feeling": "happy", "free": "NaN"
        })
    );

    // A column added on the publisher: a new, backward-compatible version.
    p.publisher.psql(
        "ALTER TABLE kinds ADD COLUMN note text;
         INSERT INTO kinds (id, note) VALUES (2, 'new');
         UPDATE kinds SET label = 'changed' WHERE id = 1;
         DELETE FROM kinds WHERE id = 2;",
    );
    let all = read(1 + 4);
    let ops: Vec<&Value> = all.messages.iter().map(|m| &m.value["op"]).collect();
    let keys = by_key(&all.messages);
    assert_eq!(ops.len(), 5, "{:#?}", all.messages);
    let second = &keys[&json!({"id": 2}).to_string()];
    assert_eq!(second[0].value["after"]["note"], "new");
    assert_eq!(second[0].value["after"]["small"], Value::Null);
    assert_eq!(second[1].value["op"], "d");
    assert_eq!(second[2].value, Value::Null, "tombstone");
    let updated = &keys[&json!({"id": 1}).to_string()][1];
    assert_eq!(updated.value["after"]["label"], "changed");
    assert_eq!(updated.value["after"]["note"], Value::Null);
    assert_eq!(all.subjects[format!("{topic}-value")], json!([1, 2]));
    assert_eq!(all.subjects[format!("{topic}-key")], json!([1]));

    // Third-party clients use the same registry for their own subjects.
    let seen = walbridge_tests::kafka::exercise_registry(&registry);
    let ids = seen["ids"].as_array().cloned().unwrap_or_default();
    assert_eq!(ids.len(), 2, "{seen}");
    assert_ne!(ids[0], ids[1], "{seen}");
    assert_eq!(seen["again"], ids[0], "{seen}");
    assert_eq!(seen["lookup"], json!([ids[0], 1]), "{seen}");
    assert_eq!(seen["latest"], json!([ids[1], 2]), "{seen}");
    assert_eq!(seen["version1"], ids[0], "{seen}");
    assert_eq!(seen["by_id"], "note", "{seen}");
    assert_eq!(seen["versions"], json!([1, 2]), "{seen}");
    assert_eq!(seen["global_level"], "BACKWARD", "{seen}");
    assert_eq!(seen["incompatible"], 409, "{seen}");
    assert_eq!(seen["subject_level"], "NONE", "{seen}");
    assert!(seen["after_none"].as_i64().is_some(), "{seen}");
    assert_eq!(seen["missing"], json!([404, 40401]), "{seen}");
    assert_eq!(seen["deleted_version"], 1, "{seen}");
    assert_eq!(seen["after_version_delete"], json!([2, 3]), "{seen}");
    assert_eq!(seen["deleted_subject"], json!([2, 3]), "{seen}");
    assert_eq!(seen["soft_deleted"], 404, "{seen}");
    assert_eq!(seen["purged"], json!([1, 2, 3]), "{seen}");
    assert_eq!(seen["reregistered"], ids[0], "{seen}");
    assert_eq!(seen["fresh_versions"], json!([1]), "{seen}");

    // The registry is kept in data_dir: after a restart the ids stay.
    running.stop(WAIT);
    let _running = p.wb.start();
    p.publisher.psql("INSERT INTO kinds (id) VALUES (3)");
    let again = read(6);
    assert_eq!(again.subjects[format!("{topic}-value")], json!([1, 2]));
}

#[test]
fn protobuf_events_through_the_embedded_registry() {
    let (p, registry) = with_embedded_registry(
        "protobuf",
        "INSERT INTO kinds VALUES (1, -7, true, -1234.5, 0.25, 'é', '\\x00ff', '2024-05-06', '07:08:09.5',
             '2024-05-06 07:08:09.123456', '2024-05-06 07:08:09.123456+02', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
             '{\"k\": [1, 2]}', '{a,\"b c\"}', '{1,-2}', 'happy', 'NaN');
         INSERT INTO kinds (id, day, at_tz, tags) VALUES (2, 'infinity', '-infinity', '{}');",
    );
    let _running = p.wb.start();
    let topic = "src.public.kinds";
    let read = |expect: usize| read_registered(&p, &registry, "protobuf", topic, expect, None);
    let first = read(2);
    assert_sequence_event(&p, &registry, "protobuf");
    let keys = by_key(&first.messages);
    let full = &keys[&json!({"id": 1}).to_string()][0];
    assert_eq!(full.value["op"], "r");
    assert_eq!(full.value["before"], Value::Null);
    assert_eq!(full.value["source"]["snapshot"], "true");
    assert_eq!(full.value["source"]["table"], "kinds");
    assert_eq!(
        full.value["after"],
        json!({
            "id": 1, "small": -7, "flag": true, "price": "-1234.500", "ratio": 0.25,
            "label": "é", "raw": "AP8=", "day": 19_849, "at_time": 25_689_500_000_i64,
            "at": "2024-05-06T07:08:09.123456+00:00", "at_tz": "2024-05-06T05:08:09.123456+00:00",
            "uid": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "doc": "{\"k\": [1, 2]}",
            "tags": ["a", "b c"], "nums": [1, -2], "feeling": "happy", "free": "NaN"
        })
    );
    let sparse = &keys[&json!({"id": 2}).to_string()][0].value["after"];
    assert_eq!(sparse["small"], Value::Null);
    assert_eq!(sparse["price"], Value::Null);
    assert_eq!(sparse["day"], i64::from(i32::MAX));
    assert_eq!(sparse["at_tz"], "0001-01-01T00:00:00+00:00");
    assert_eq!(sparse["tags"], json!([]));

    // A column added on the publisher registers a new version; older
    // messages decode with the newer class.
    p.publisher.psql(
        "ALTER TABLE kinds ADD COLUMN note text;
         INSERT INTO kinds (id, note) VALUES (3, 'new');
         UPDATE kinds SET label = 'changed' WHERE id = 1;
         DELETE FROM kinds WHERE id = 3;",
    );
    let all = read(2 + 4);
    let keys = by_key(&all.messages);
    let third = &keys[&json!({"id": 3}).to_string()];
    assert_eq!(ops(third), ["c", "d", "tombstone"], "{:#?}", all.messages);
    assert_eq!(third[0].value["after"]["note"], "new");
    assert_eq!(third[1].value["before"]["id"], 3);
    assert_eq!(third[1].value["after"], Value::Null);
    let first_row = &keys[&json!({"id": 1}).to_string()];
    assert_eq!(first_row[0].value["after"]["note"], Value::Null);
    assert_eq!(first_row[1].value["op"], "u");
    assert_eq!(first_row[1].value["after"]["label"], "changed");
    assert_eq!(all.subjects[format!("{topic}-value")], json!([1, 2]));
    assert_eq!(all.subjects[format!("{topic}-key")], json!([1]));

    // A column dropped on the publisher: the other fields keep their
    // numbers, so a consumer built from version 1 reads new events right.
    p.publisher.psql(
        "ALTER TABLE kinds DROP COLUMN small;
         INSERT INTO kinds (id, flag, note) VALUES (6, false, 'after drop');",
    );
    let sixth = |result: &walbridge_tests::kafka::ConsumeResult| {
        by_key(&result.messages)[&json!({"id": 6}).to_string()][0].value["after"].clone()
    };
    let with_v1 = sixth(&read_registered(
        &p,
        &registry,
        "protobuf",
        topic,
        7,
        Some(1),
    ));
    assert_eq!(
        (&with_v1["id"], &with_v1["flag"], &with_v1["small"]),
        (&json!(6), &json!(false), &Value::Null),
        "{with_v1}"
    );
    assert_eq!(with_v1.get("note"), None, "version 1 has no `note`");
    let latest = read(7);
    let with_v3 = sixth(&latest);
    assert_eq!(
        (&with_v3["flag"], &with_v3["note"]),
        (&json!(false), &json!("after drop"))
    );
    assert_eq!(with_v3.get("small"), None, "version 3 has no `small`");
    assert_eq!(latest.subjects[format!("{topic}-value")], json!([1, 2, 3]));

    // An array with a NULL element has no Protobuf form: the sink stops
    // naming table and column, and nothing after it is sent.
    p.publisher.psql(
        "INSERT INTO kinds (id, nums) VALUES (4, '{1,NULL}'); INSERT INTO kinds (id) VALUES (5);",
    );
    let log = wait_for_log(&p.wb, "an array with NULL elements");
    assert!(
        log.contains("public.kinds") && log.contains("nums"),
        "{log}"
    );
    assert_eq!(read(7).messages.len(), 7);
}

#[test]
fn a_registry_behind_tls_and_basic_auth() {
    let p = Pipeline::new(
        "CREATE TABLE items (id int PRIMARY KEY, v text);
         INSERT INTO items VALUES (1, 'one');
         CREATE PUBLICATION pub FOR TABLE items;",
    );
    let registry_port = walbridge_tests::free_port();
    let registry = format!("http://127.0.0.1:{registry_port}");
    let proxy = walbridge_tests::kafka::AuthProxy::start(&registry, "walbridge", "s3cret");
    let sink = |name: &str, password: &str| {
        format!(
            "[[sink]]\nname = \"{name}\"\ntype = \"kafka\"\nbrokers = \"{}\"\nformat = \"avro\"\ntopic = \"{name}.{{table}}\"\nschema_registry = {{ url = \"{}\", username = \"walbridge\", password = \"{password}\", ca_cert = \"{}\" }}\n",
            p.broker.bootstrap(),
            proxy.url(),
            proxy.ca_cert().display()
        )
    };
    p.wb.configure_sinks(
        &p.publisher.superuser(),
        &["pub"],
        "",
        &format!(
            "[schema_registry]\nlisten = \"127.0.0.1:{registry_port}\"\n\n{}\n{}",
            sink("secured", "s3cret"),
            sink("denied", "wrong")
        ),
    );
    let _running = p.wb.start();
    // Wrong credentials: the registry refuses, which no retry mends; only
    // that sink stops. (Not a bare "401": a port number can hold it.)
    let log = wait_for_log(&p.wb, "answered 401 Unauthorized");
    assert!(log.contains("denied"), "{log}");
    // `walbridge check` asks the registry too, with each sink's credentials.
    let check = p.wb.command(&["check"]);
    let (out, err) = (
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr),
    );
    assert!(
        !check.status.success()
            // Its topic may not exist yet ("(1 to be created)").
            && out.contains(&format!(
                "sink `secured`: 1 Kafka broker(s) reachable at {}; the sink may write its 1 topic(s)",
                p.broker.bootstrap(),
            ))
            && out.contains(&format!("; schema registry at {} answers", proxy.url()))
            && err.contains("error: sink `denied`")
            && err.contains("answered 401 Unauthorized"),
        "{out}{err}"
    );
    p.publisher.psql("INSERT INTO items VALUES (2, 'two')");
    let read = walbridge_tests::kafka::consume_with_registry(
        &p.broker.bootstrap(),
        &ConsumeOptions {
            topics: &["secured.items"],
            format: "avro",
            expect: 2,
            timeout: WAIT,
            registry: Some(&registry),
            read_committed: false,
            schema_version: None,
            properties: &[],
        },
    );
    // Two keys may sit on two partitions: Kafka orders neither across them.
    let mut values: Vec<String> = read
        .messages
        .iter()
        .map(|m| m.value["after"]["v"].to_string())
        .collect();
    values.sort();
    assert_eq!(values, ["\"one\"", "\"two\""]);
    let requests = proxy.requests();
    assert!(
        requests.contains(&"POST /subjects/secured.items-value/versions 200".to_owned())
            && requests.contains(&"POST /subjects/denied.items-value/versions 401".to_owned()),
        "{requests:#?}"
    );
}

#[test]
fn a_broker_outage_under_load_loses_nothing_and_holds_back_only_its_sink() {
    let publisher = Cluster::start();
    publisher.psql(
        "CREATE TABLE t (id int PRIMARY KEY);
         CREATE PUBLICATION pub FOR TABLE t;",
    );
    let kept = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let broker = Broker::start_keeping(kept.path());
    let wb = Deployment::new();
    wb.configure_sinks(
        &publisher.superuser(),
        &["pub"],
        "",
        &format!(
            "[[sink]]\nname = \"events\"\ntype = \"kafka\"\nbrokers = \"{}\"\n\n[[sink]]\nname = \"out\"\ntype = \"jsonl\"\npath = \"{}\"\n",
            broker.bootstrap(),
            wb.output_path().display()
        ),
    );
    let running = wb.start();
    publisher.wait_for_streaming(WAIT);
    // Load all along: a transaction every 20 ms for about 45 s.
    let rows = 2000;
    let outage = std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            publisher.psql(&format!(
                "DO $$ BEGIN FOR i IN 1..{rows} LOOP INSERT INTO t VALUES (i); COMMIT; PERFORM pg_sleep(0.02); END LOOP; END $$"
            ));
        });
        std::thread::sleep(Duration::from_secs(5));
        // The broker stops for 30 s; the source and the jsonl sink go on.
        drop(broker);
        let before = wb.lines().len();
        wait_for_log(&wb, "cannot reach the Kafka brokers");
        std::thread::sleep(Duration::from_secs(30));
        let during = wb.lines().len();
        assert!(
            during > before + 500,
            "the jsonl sink stalled with the broker: {before} then {during} lines"
        );
        let broker = Broker::start_keeping(kept.path());
        writer
            .join()
            .unwrap_or_else(|_| panic!("the writer panicked"));
        broker
    });
    let messages = consume(
        &outage.bootstrap(),
        &ConsumeOptions {
            topics: &["src.public.t"],
            format: "json",
            expect: rows,
            timeout: WAIT,
            registry: None,
            read_committed: false,
            schema_version: None,
            properties: &[],
        },
    );
    assert!(running.stop(WAIT).success(), "log:\n{}", wb.log());
    // Every row, in order; a row seen again is the same message re-sent.
    let mut seen: BTreeMap<i64, &Consumed> = BTreeMap::new();
    let mut last = 0;
    for m in &messages {
        let id = m.key["id"].as_i64().unwrap_or(-1);
        if let Some(first) = seen.get(&id) {
            assert_eq!(first.value["source"]["lsn"], m.value["source"]["lsn"]);
            continue;
        }
        assert!(id > last, "row {id} after row {last}");
        last = id;
        seen.insert(id, m);
    }
    assert_eq!(seen.len(), rows);
    assert_eq!(wb.lines().len(), rows);
    // The outage is said once each way, as a warning, not as librdkafka's
    // connection errors every few seconds.
    let log = wb.log();
    assert!(log.contains("answer again"), "{log}");
    assert!(
        !log.lines()
            .any(|l| l.contains("ERROR") && l.contains("Connection refused")),
        "{log}"
    );
}

/// Configures one kafka sink, `events`, reading publication `pub`, with
/// `extra` settings and librdkafka `properties`.
fn configure_events(
    wb: &Deployment,
    publisher: &Cluster,
    broker: &Broker,
    extra: &str,
    properties: &[(String, String)],
) {
    let properties: String = properties
        .iter()
        .map(|(k, v)| format!("\"{k}\" = \"{v}\"\n"))
        .collect();
    wb.configure_sinks(
        &publisher.superuser(),
        &["pub"],
        "",
        &format!(
            "[[sink]]\nname = \"events\"\ntype = \"kafka\"\nbrokers = \"{}\"\n{extra}\n[sink.kafka_properties]\n{properties}",
            broker.bootstrap()
        ),
    );
}

#[test]
fn a_sasl_ssl_broker_with_scram_and_a_verified_certificate() {
    let publisher = Cluster::start();
    publisher.psql(
        "CREATE TABLE t (id int PRIMARY KEY);
         CREATE PUBLICATION pub FOR TABLE t;",
    );
    let broker = Broker::start_sasl_ssl();
    let wb = Deployment::new();
    let configure = |properties: &[(String, String)]| {
        configure_events(&wb, &publisher, &broker, "", properties)
    };
    let check_error = || {
        let out = wb.command(&["check"]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(3), "{err}");
        let line = err
            .lines()
            .find(|l| l.starts_with("error: sink `events`"))
            .unwrap_or_default()
            .to_owned();
        assert!(
            line.contains(&format!(
                "the Kafka brokers {} refuse walbridge",
                broker.bootstrap()
            )),
            "{err}"
        );
        line
    };

    // A wrong password: one line naming the brokers and the mechanism.
    configure(&broker.client_properties(Some("wrong")));
    let line = check_error();
    assert!(
        line.contains("SCRAM-SHA-512") && line.contains("invalid credentials"),
        "{line}"
    );
    // `run`: the sink stops for good instead of retrying, and says why.
    let running = wb.start();
    wait_for_log(&wb, "refuse walbridge");
    let status = running.stop(WAIT);
    assert_eq!(status.code(), Some(1), "{}", wb.log());
    let log = wb.log();
    let last = log.lines().last().unwrap_or_default();
    assert!(last.contains("refuse walbridge"), "{last}");

    // A mechanism the broker does not offer.
    let mut plain = broker.client_properties(None);
    for (key, value) in &mut plain {
        if key == "sasl.mechanism" {
            *value = "PLAIN".to_owned();
        }
    }
    configure(&plain);
    let line = check_error();
    assert!(
        line.contains("PLAIN") && line.contains("SCRAM-SHA-512"),
        "{line}"
    );

    // A CA that did not sign the broker's certificate: verification is on.
    let mut untrusted = broker.client_properties(None);
    for (key, value) in &mut untrusted {
        if key == "ssl.ca.location" {
            *value = "/etc/ssl/certs/ca-certificates.crt".to_owned();
        }
    }
    configure(&untrusted);
    let line = check_error();
    assert!(line.contains("SSL handshake failed"), "{line}");

    // The right settings: check passes and changes arrive.
    let properties = broker.client_properties(None);
    configure(&properties);
    let out = wb.command(&["check"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let running = wb.start();
    publisher.wait_for_streaming(WAIT);
    publisher.psql("INSERT INTO t SELECT generate_series(1, 20)");
    let messages = consume(
        &broker.bootstrap(),
        &ConsumeOptions {
            topics: &["src.public.t"],
            format: "json",
            expect: 20,
            timeout: WAIT,
            registry: None,
            read_committed: false,
            schema_version: None,
            properties: &properties,
        },
    );
    let ids: BTreeSet<i64> = messages
        .iter()
        .filter_map(|m| m.value["after"]["id"].as_i64())
        .collect();
    assert_eq!(ids, (1..=20).collect());
    assert!(running.stop(WAIT).success(), "{}", wb.log());
}

#[test]
fn kafka_connect_and_debezium_read_our_topics_unchanged() {
    let p = Pipeline::new(
        "CREATE TABLE kinds (id int PRIMARY KEY, small int2, big int8, flag bool, ratio float8,
                             note text, at timestamptz, data jsonb, raw bytea, tags text[]);
         INSERT INTO kinds VALUES (1, 1, 10000000000, true, 0.5, 'copied', '2024-05-06 07:08:09+00',
                                  '{\"k\": 1}', '\\x0102', '{a,b}');
         CREATE PUBLICATION pub FOR TABLE kinds;",
    );
    p.configure("json_schemas = true\n", "");
    let _running = p.wb.start();
    p.read(&["src.public.kinds"], 1);
    p.publisher.psql(
        "SET timezone = 'UTC';
         INSERT INTO kinds VALUES (2, -2, -20, false, 1.25, 'new', '2025-01-02 03:04:05.5+00',
                                  '[1, 2]', '\\xff', '{}');
         UPDATE kinds SET note = 'changed', small = NULL WHERE id = 1;
         INSERT INTO kinds (id) VALUES (3);
         DELETE FROM kinds WHERE id = 3;",
    );
    // Snapshot, insert, update, insert, delete and its tombstone.
    let messages = p.read(&["src.public.kinds"], 6);
    let input: Vec<(String, Value, Value)> = messages
        .iter()
        .map(|m| (m.topic.clone(), m.key.clone(), m.value.clone()))
        .collect();
    let records = walbridge_tests::connect::read_with_connect(&input)
        .unwrap_or_else(|e| panic!("Connect and Debezium refused our messages: {e}"));
    assert_eq!(records.len(), messages.len());

    // The flattened rows, replayed: the table as the publisher has it.
    let mut rows: BTreeMap<i64, Value> = BTreeMap::new();
    for record in &records {
        let id = record["key"]["payload"]["id"]
            .as_i64()
            .unwrap_or_else(|| panic!("{record}"));
        match &record["value"] {
            Value::Null => {
                rows.remove(&id);
            }
            value => {
                rows.insert(id, value.clone());
            }
        }
    }
    assert_eq!(rows.keys().copied().collect::<Vec<_>>(), [1, 2]);
    let one = &rows[&1]["payload"];
    assert_eq!(
        (
            &one["id"],
            &one["small"],
            &one["big"],
            &one["flag"],
            &one["note"],
            &one["__op"]
        ),
        (
            &json!(1),
            &Value::Null,
            &json!(10_000_000_000_i64),
            &json!(true),
            &json!("changed"),
            &json!("u")
        ),
        "{one}"
    );
    let two = &rows[&2]["payload"];
    assert_eq!(
        (
            &two["small"],
            &two["big"],
            &two["ratio"],
            &two["at"],
            &two["data"],
            &two["raw"],
            &two["tags"]
        ),
        (
            &json!(-2),
            &json!(-20),
            &json!(1.25),
            &json!("2025-01-02T03:04:05.5Z"),
            &json!("[1, 2]"),
            &json!("/w=="),
            &json!([])
        ),
        "{two}"
    );
    assert_eq!(two["__table"], "kinds");
    assert!(two["__lsn"].as_i64().is_some_and(|l| l > 0), "{two}");
    // The row's Connect schema: the table's columns with their types.
    let schema = &rows[&2]["schema"];
    let types: Vec<(String, String)> = schema["fields"]
        .as_array()
        .map(|fields| {
            fields
                .iter()
                .map(|f| {
                    (
                        f["field"].as_str().unwrap_or_default().to_owned(),
                        f["name"]
                            .as_str()
                            .or(f["type"].as_str())
                            .unwrap_or_default()
                            .to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let expected = [
        ("id", "int32"),
        ("small", "int16"),
        ("big", "int64"),
        ("flag", "boolean"),
        ("ratio", "double"),
        ("note", "string"),
        ("at", "io.debezium.time.ZonedTimestamp"),
        ("data", "io.debezium.data.Json"),
        ("raw", "bytes"),
        ("tags", "array"),
        ("__op", "string"),
        ("__table", "string"),
        ("__lsn", "int64"),
    ];
    assert_eq!(
        types,
        expected
            .iter()
            .map(|(f, t)| (f.to_string(), t.to_string()))
            .collect::<Vec<_>>(),
        "{schema}"
    );

    // The check is a real one: a wrong envelope is refused.
    let mut broken = input.clone();
    broken[1].2["schema"]["name"] = json!("src.public.kinds.Value");
    let refused = walbridge_tests::connect::read_with_connect(&broken).err();
    assert!(
        refused
            .as_deref()
            .is_some_and(|e| e.contains("not *.Envelope")),
        "{refused:?}"
    );
    let mut broken = input;
    broken[1].2["payload"]["after"]["id"] = json!("one");
    let refused = walbridge_tests::connect::read_with_connect(&broken).err();
    assert!(
        refused
            .as_deref()
            .is_some_and(|e| e.contains("does not match its schema")),
        "{refused:?}"
    );
}

/// The error lines `walbridge check` gave sink `events`, once it failed.
fn check_errors(wb: &Deployment) -> Vec<String> {
    let out = wb.command(&["check"]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(3), "{err}");
    err.lines()
        .filter(|l| l.starts_with("error: sink `events`"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn what_the_brokers_deny_is_reported_by_check_and_stops_the_sink() {
    let publisher = Cluster::start();
    publisher.psql(
        "CREATE TABLE t (id int PRIMARY KEY);
         CREATE TABLE secret (id int PRIMARY KEY);
         CREATE PUBLICATION pub FOR TABLE t, secret;",
    );
    let broker = Broker::start_sasl_ssl();
    let properties = broker.client_properties(None);
    let wb = Deployment::new();
    let configure = |extra: &str| configure_events(&wb, &publisher, &broker, extra, &properties);
    let principal = ["--principal", "User:walbridge"];

    // A topic the sink's principal may neither create nor write; it may
    // create the other table's topic (no ACL names it).
    broker.acl(
        &[
            &["deny"][..],
            &principal,
            &["--cluster", "--operation", "CREATE"],
        ]
        .concat(),
    );
    broker.acl(&[&["deny"][..], &principal, &["--topic", "src.public.secret"]].concat());
    configure("");
    let errors = check_errors(&wb);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0]
            .contains("deny the sink's principal topic `src.public.secret` (table public.secret)")
            && errors[0].contains("Topic authorization failed")
            && errors[0].contains("grant it DESCRIBE and WRITE"),
        "{errors:#?}"
    );
    // `run`: the sink stops at the first change of that table, in one line.
    let running = wb.start();
    publisher.wait_for_streaming(WAIT);
    publisher.psql("INSERT INTO secret VALUES (1); INSERT INTO t VALUES (1);");
    wait_for_log(&wb, "cannot create topic `src.public.secret`");
    assert_eq!(running.stop(WAIT).code(), Some(1), "{}", wb.log());
    let log = wb.log();
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.contains("cannot create topic `src.public.secret` (table public.secret)")
            && last.contains("authorization failed")
            && last.contains("grant the sink's principal CREATE"),
        "{log}"
    );
    // Not retried: one ERROR, then walbridge's last line.
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("ERROR") && l.contains("cannot create topic"))
            .count(),
        1,
        "{log}"
    );
    broker.acl(&[&["remove"][..], &principal, &["--cluster"]].concat());
    broker.acl(
        &[
            &["remove"][..],
            &principal,
            &["--topic", "src.public.secret"],
        ]
        .concat(),
    );

    // A transactional id the principal may not use.
    broker.acl(
        &[
            &["deny"][..],
            &principal,
            &["--transactional-id", "walbridge-events"],
        ]
        .concat(),
    );
    configure("exactly_once = true");
    let errors = check_errors(&wb);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    let refused = "initializing Kafka transactions (transactional.id `walbridge-events`)";
    assert!(
        errors[0].contains(refused)
            && errors[0].contains("Transactional Id authorization failed")
            && errors[0]
                .contains("grant the sink's principal WRITE and DESCRIBE on this TransactionalId"),
        "{errors:#?}"
    );
    let running = wb.start();
    wait_for_log(&wb, refused);
    assert_eq!(running.stop(WAIT).code(), Some(1), "{}", wb.log());
    let log = wb.log();
    let last = log.lines().last().unwrap_or_default();
    assert!(last.contains(refused), "{log}");

    // Granted: check passes and claims the id; while walbridge runs, check
    // leaves the id alone (claiming it would fence the running producer),
    // and the changes held back arrive once each.
    broker.acl(
        &[
            &["remove"][..],
            &principal,
            &["--transactional-id", "walbridge-events"],
        ]
        .concat(),
    );
    let out = wb.command(&["check"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("the sink may write its 3 topic(s)")
            && stdout.contains("transactions granted for transactional.id `walbridge-events`"),
        "{stdout}"
    );
    let running = wb.start();
    publisher.wait_for_streaming(WAIT);
    let out = wb.command(&["check"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(stdout.contains("transactions not probed"), "{stdout}");
    publisher.psql("INSERT INTO secret VALUES (2); INSERT INTO t VALUES (2);");
    let messages = consume(
        &broker.bootstrap(),
        &ConsumeOptions {
            topics: &["src.public.t", "src.public.secret"],
            format: "json",
            expect: 4,
            timeout: WAIT,
            registry: None,
            read_committed: true,
            schema_version: None,
            properties: &properties,
        },
    );
    let rows: BTreeSet<(String, i64)> = messages
        .iter()
        .filter_map(|m| Some((m.topic.clone(), m.value["after"]["id"].as_i64()?)))
        .collect();
    let expected: BTreeSet<(String, i64)> = [
        ("src.public.secret", 1),
        ("src.public.secret", 2),
        ("src.public.t", 1),
        ("src.public.t", 2),
    ]
    .into_iter()
    .map(|(t, id)| (t.to_owned(), id))
    .collect();
    assert_eq!(rows, expected);
    assert_eq!(messages.len(), 4, "{messages:#?}");
    assert!(running.stop(WAIT).success(), "{}", wb.log());
}

#[test]
fn a_table_added_to_the_publication_arrives_as_reads_then_changes() {
    let p = Pipeline::new(
        "CREATE TABLE a (id int PRIMARY KEY);
         CREATE TABLE b (id int PRIMARY KEY, v int NOT NULL);
         INSERT INTO b SELECT g, 0 FROM generate_series(1, 5000) g;
         CREATE PUBLICATION pub FOR TABLE a",
    );
    p.configure("", "");
    let running = p.wb.start();
    p.publisher.wait_for_streaming(WAIT);
    p.publisher.psql(
        "ALTER PUBLICATION pub ADD TABLE b;
         UPDATE b SET v = 1 WHERE id <= 10;
         DELETE FROM b WHERE id BETWEEN 11 AND 20;
         INSERT INTO b VALUES (9999, 9);
         UPDATE b SET v = 3 WHERE id = 4000;",
    );
    wait_for_log(&p.wb, "table copied while streaming");
    p.publisher
        .psql("UPDATE b SET v = 2 WHERE id = 1; DELETE FROM b WHERE id = 2");
    let expected: BTreeMap<i64, i64> = p
        .publisher
        .psql("SELECT id, v FROM b")
        .lines()
        .filter_map(|l| {
            let (id, v) = l.split_once('|')?;
            Some((id.parse().ok()?, v.parse().ok()?))
        })
        .collect();
    // Every row once as a read, then its changes (row 1's update, row 2's
    // delete and tombstone).
    let messages = p.read(&["src.public.b"], expected.len() + 3);
    let mut image = BTreeMap::new();
    for (key, history) in by_key(&messages) {
        let ops = ops(&history);
        assert_eq!(ops[0], "r", "key {key} starts with its read: {ops:?}");
        assert_eq!(
            ops.iter().filter(|o| *o == "r").count(),
            1,
            "key {key} is read once: {ops:?}"
        );
        let last = history.iter().rev().find(|m| !m.value.is_null());
        if let Some(last) = last.filter(|m| m.value["op"] != "d") {
            image.insert(
                last.value["after"]["id"].as_i64().unwrap_or(-1),
                last.value["after"]["v"].as_i64().unwrap_or(-1),
            );
        }
    }
    assert_eq!(image, expected);
    assert!(running.stop(WAIT).success(), "log:\n{}", p.wb.log());
}
