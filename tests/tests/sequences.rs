//! Sequences: with `sequences = true` the published tables' sequences
//! (serial, identity, and one a column default uses) follow the publisher
//! on the postgres sink's target — never backwards — and reach jsonl as
//! `op = "q"` lines; a sequence of no published table stays behind;
//! `walbridge sync-sequences` sets them at once, for a switchover, and
//! names one the target lacks. (Rows of a `GENERATED ALWAYS` identity
//! column are applied with `OVERRIDING SYSTEM VALUE`.)

use std::time::Duration;

use walbridge_tests::Cluster;
use walbridge_tests::walbridge::Deployment;

const WAIT: Duration = Duration::from_secs(40);

const SCHEMA: &str = "CREATE TABLE t (id bigserial PRIMARY KEY, v int);
     CREATE TABLE u (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v int);
     CREATE SEQUENCE standalone START 100;
     CREATE TABLE w (id int DEFAULT nextval('standalone') PRIMARY KEY, v int);
     CREATE SEQUENCE unrelated";

/// `name`'s last value (NULL as an empty string when never used).
fn last_value(pg: &Cluster, name: &str) -> String {
    pg.psql(&format!(
        "SELECT CASE WHEN is_called THEN last_value::text ELSE '' END FROM {name}"
    ))
}

fn insert(pg: &Cluster, rows: u32) {
    pg.psql(&format!(
        "INSERT INTO t (v) SELECT g FROM generate_series(1, {rows}) g;
         INSERT INTO u (v) SELECT g FROM generate_series(1, {rows}) g;
         INSERT INTO w (v) SELECT g FROM generate_series(1, {rows}) g;
         SELECT nextval('unrelated')"
    ));
}

#[test]
fn sequences_follow_the_publisher_never_backwards_and_sync_on_demand() {
    let publisher = Cluster::start();
    let subscriber = Cluster::start();
    publisher.psql(SCHEMA);
    subscriber.psql(SCHEMA);
    publisher.psql("CREATE PUBLICATION pub FOR TABLE t, u, w");
    insert(&publisher, 5);
    let wb = Deployment::new();
    wb.configure_sinks(
        &publisher.superuser(),
        &["pub"],
        "sequences = true\nrefresh_interval = 1",
        &format!(
            "[[sink]]\nname = \"replica\"\ntype = \"postgres\"\nconnection = \"{}\"\n\n\
             [[sink]]\nname = \"lines\"\ntype = \"jsonl\"\npath = \"{}\"\n",
            subscriber.superuser(),
            wb.output_path().display()
        ),
    );
    let running = wb.start();
    publisher.wait_for_streaming(WAIT);
    insert(&publisher, 20);
    for sequence in ["t_id_seq", "u_id_seq", "standalone"] {
        let expected = last_value(&publisher, sequence);
        let got = subscriber.wait_for(
            &format!(
                "SELECT CASE WHEN is_called THEN last_value::text ELSE '' END FROM {sequence}"
            ),
            &expected,
            WAIT,
        );
        assert_eq!(got, expected, "{sequence}\nlog:\n{}", wb.log());
    }
    assert_eq!(last_value(&subscriber, "unrelated"), "");
    // Rows of a GENERATED ALWAYS identity column keep the publisher's ids.
    let expected = publisher.table_digest("postgres", "u", "id, v");
    assert_eq!(
        subscriber.wait_for_digest("postgres", "u", "id, v", &expected, WAIT),
        expected
    );
    assert_eq!(last_value(&publisher, "standalone"), "124");

    // Never backwards: a target sequence already past the publisher's stays.
    subscriber.psql("SELECT setval('t_id_seq', 1000)");
    insert(&publisher, 3);
    let expected = last_value(&publisher, "u_id_seq");
    assert_eq!(
        subscriber.wait_for("SELECT last_value::text FROM u_id_seq", &expected, WAIT),
        expected
    );
    assert_eq!(last_value(&subscriber, "t_id_seq"), "1000");

    // jsonl: a line per sequence that moved, with its value.
    let lines = wb.lines();
    let last_t = lines
        .iter()
        .rfind(|l| l["op"] == "q" && l["sequence"]["name"] == "t_id_seq")
        .unwrap_or_else(|| panic!("no sequence line:\n{}", wb.log()));
    assert_eq!(last_t["sequence"]["schema"], "public");
    assert_eq!(
        last_t["sequence"]["last_value"].to_string(),
        last_value(&publisher, "t_id_seq")
    );
    assert!(
        !lines
            .iter()
            .any(|l| l["op"] == "q" && l["sequence"]["name"] == "unrelated")
    );
    assert!(running.stop(WAIT).success(), "log:\n{}", wb.log());

    // Stopped: the publisher moves on; sync-sequences catches the target
    // up at once and says what it did.
    insert(&publisher, 50);
    let out = wb.command(&["sync-sequences"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let u = last_value(&publisher, "u_id_seq");
    assert!(
        stdout.contains(&format!("sink `replica`: public.u_id_seq: set to {u}")),
        "{stdout}"
    );
    assert!(
        stdout.contains("sink `replica`: public.t_id_seq: already at or past"),
        "{stdout}"
    );
    for sequence in ["u_id_seq", "standalone"] {
        assert_eq!(
            last_value(&subscriber, sequence),
            last_value(&publisher, sequence)
        );
    }

    // A sequence the target lacks fails the command, named.
    subscriber.psql("ALTER TABLE w ALTER COLUMN id DROP DEFAULT; DROP SEQUENCE standalone");
    let out = wb.command(&["sync-sequences"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("public.standalone: no such sequence on the target"),
        "{stdout}"
    );
}
