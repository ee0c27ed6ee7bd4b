//! The change feed (`type = "grpc"`) through Python's `grpcio`, a client
//! generated from the proto: the initial copy and every kind of change
//! decoded into the expected values, filters, acknowledgements and
//! resumption, durable consumers across `kill -9`, the log kept for them
//! and retention's bound, the admin RPCs, health and reflection.

use std::time::Duration;

use serde_json::{Value, json};
use walbridge_tests::Cluster;
use walbridge_tests::feed::{self, Client, earliest, end, envelopes, events};
use walbridge_tests::fixtures::{TYPES_ROW, TYPES_SCHEMA};
use walbridge_tests::walbridge::{Deployment, Running};

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
    fn start(schema: &str, source_extra: &str, extra: &str) -> Fixture {
        let pg = Cluster::start();
        pg.psql(schema);
        pg.psql("CREATE PUBLICATION pub FOR ALL TABLES");
        let wb = Deployment::new();
        wb.configure_sinks(&pg.superuser(), &["pub"], source_extra, &feed::sink(extra));
        let running = wb.start();
        let client = Client::new(&feed::address(&wb, 0, WAIT));
        Fixture {
            pg,
            wb,
            running: Some(running),
            client,
        }
    }

    /// Kills walbridge (SIGKILL) and starts it again; the client follows
    /// the feed to its new address.
    fn kill_and_restart(&mut self) {
        if let Some(running) = self.running.take() {
            running.kill();
        }
        let seen = self.wb.log().len();
        self.running = Some(self.wb.start());
        self.client = Client::new(&feed::address(&self.wb, seen, WAIT));
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
        json!({"name": "id", "type_oid": 23, "type_name": "int4", "key": true})
    );
    assert_eq!(columns[5]["type_name"], "numeric");
    assert_eq!(columns[12]["type_name"], "varchar(10)");
    assert_eq!(columns[13]["type_name"], "bpchar(3)");
    assert_eq!(columns[26]["type_name"], "_int4");
    assert_eq!(columns[29]["type_name"], "public.mood");

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
