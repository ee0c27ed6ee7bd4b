//! Describing published tables against a real server: the descriptors the
//! initial copy plans with (a few queries for many tables) are the ones
//! pgoutput's Relation messages give once streaming.

use std::collections::HashMap;
use std::time::Duration;

use walbridge_core::{Oid, Relation, TableName};
use walbridge_source::catalog::{
    DescribedTable, TypeCatalog, describe_in_groups, describe_table, describe_tables,
    published_tables,
};
use walbridge_source::pgoutput::{Decoder, Message};
use walbridge_source::wire::copyboth::ServerMessage;
use walbridge_source::wire::{ConnParams, CopyMessage, ReplicationConnection, connect_sql};
use walbridge_tests::Cluster;

/// Tables whose descriptions differ in every way pgoutput's can: key
/// order unlike column order, each replica identity, a generated column,
/// a column added with a default (older rows read a missing value), a
/// dropped column, arrays, an enum and a domain, a partition published on
/// its own; and, from PostgreSQL 15, a column list.
const SCHEMA: &str = "
CREATE TYPE mood AS ENUM ('sad', 'ok');
CREATE DOMAIN posint AS int CHECK (VALUE > 0);
CREATE TABLE plain (a int, b text, PRIMARY KEY (b, a));
CREATE TABLE full_identity (a int PRIMARY KEY, b text);
ALTER TABLE full_identity REPLICA IDENTITY FULL;
CREATE TABLE by_index (a int NOT NULL, b int NOT NULL UNIQUE, c text);
ALTER TABLE by_index REPLICA IDENTITY USING INDEX by_index_b_key;
CREATE TABLE typed (a int PRIMARY KEY, g int GENERATED ALWAYS AS (a * 2) STORED,
                    m mood, arr int[], p posint, ps posint[]);
INSERT INTO typed (a) VALUES (0);
ALTER TABLE typed ADD COLUMN d int NOT NULL DEFAULT 7;
CREATE TABLE dropped (a int PRIMARY KEY, x int, b text);
ALTER TABLE dropped DROP COLUMN x;
CREATE TABLE parent (a int PRIMARY KEY, b int) PARTITION BY RANGE (a);
CREATE TABLE child PARTITION OF parent FOR VALUES FROM (0) TO (100);
CREATE TABLE listed (a int PRIMARY KEY, b text, c text);
";

const PUBLISHED: &str = "plain, full_identity, by_index, typed, dropped, parent";

/// One row in each table, after the slot: each Relation message once.
const CHANGES: &str = "
INSERT INTO plain VALUES (1, 'x');
INSERT INTO full_identity VALUES (1, 'x');
INSERT INTO by_index VALUES (1, 2, 'x');
INSERT INTO typed (a, m, arr, p, ps) VALUES (1, 'ok', '{1,2}', 3, '{4}');
INSERT INTO dropped VALUES (1, 'x');
INSERT INTO parent VALUES (1, 2);
INSERT INTO listed VALUES (1, 'x', 'y');
";

fn ok<T, E: std::fmt::Display>(result: Result<T, E>) -> T {
    result.unwrap_or_else(|e| panic!("{e}"))
}

async fn server_version(client: &tokio_postgres::Client) -> u32 {
    let version: i32 = ok(client
        .query_one("SELECT current_setting('server_version_num')::int4", &[])
        .await)
    .get(0);
    version as u32
}

/// Streams the slot until `tables` Relation messages have arrived and
/// describes each as the source does while streaming.
async fn streamed_relations(pg: &Cluster, tables: usize) -> HashMap<Oid, Relation> {
    let params = ok(ConnParams::parse(&pg.superuser()));
    let client = ok(connect_sql(&params, "catalog-test").await);
    let mut conn = ok(ReplicationConnection::connect(&params, "catalog-test").await);
    ok(conn
        .start_copy_both(
            "START_REPLICATION SLOT s LOGICAL 0/0 (proto_version '1', publication_names 'p')",
        )
        .await);
    let (mut decoder, mut types) = (Decoder::new(), TypeCatalog::new());
    let mut relations = HashMap::new();
    let read = async {
        while relations.len() < tables {
            let CopyMessage::Data(payload) = ok(conn.recv_copy().await) else {
                panic!("the stream ended")
            };
            if let Ok(ServerMessage::XLogData { data, .. }) = ServerMessage::parse(payload)
                && let Message::Relation { body, .. } = ok(decoder.decode(data))
            {
                let relation = ok(types.describe(&client, body).await);
                relations.insert(relation.id, relation);
            }
        }
    };
    ok(tokio::time::timeout(Duration::from_secs(30), read).await);
    relations
}

#[tokio::test]
async fn tables_described_together_are_what_pgoutput_describes() {
    let pg = Cluster::start();
    pg.psql(SCHEMA);
    let params = ok(ConnParams::parse(&pg.superuser()));
    let client = ok(connect_sql(&params, "catalog-test").await);
    let version = server_version(&client).await;
    let column_lists = version >= 150_000;
    let published = if column_lists {
        format!("{PUBLISHED}, listed (a, c)")
    } else {
        PUBLISHED.to_owned()
    };
    pg.psql(&format!("CREATE PUBLICATION p FOR TABLE {published}"));
    pg.psql("SELECT pg_create_logical_replication_slot('s', 'pgoutput')");
    pg.psql(CHANGES);

    let tables = ok(published_tables(&client, &["p".to_owned()], version).await);
    let described = ok(describe_tables(&client, &mut TypeCatalog::new(), &tables).await);
    let streamed = streamed_relations(&pg, tables.len()).await;
    assert_eq!(described.len(), tables.len());
    let mut by_name = HashMap::new();
    for (table, DescribedTable { relation, .. }) in tables.iter().zip(&described) {
        assert_eq!(relation.id, table.oid, "in the order asked");
        assert_eq!(
            Some(relation),
            streamed.get(&relation.id),
            "{} as pgoutput describes it",
            relation.name
        );
        let alone = ok(describe_table(&client, &mut TypeCatalog::new(), table).await);
        assert_eq!(&alone, relation, "{} described alone", relation.name);
        by_name.insert(relation.name.as_str(), relation);
    }

    // What the comparison rests on, spelled out.
    let names = |r: &Relation| r.columns.iter().map(|c| c.name.clone()).collect::<Vec<_>>();
    let keys = |r: &Relation| r.key_columns().collect::<Vec<_>>();
    let plain = by_name["plain"];
    assert_eq!(plain.primary_key, [1, 0], "key order, not column order");
    assert_eq!(keys(plain), [0, 1]);
    assert_eq!(keys(by_name["full_identity"]), [0, 1]);
    assert_eq!(by_name["full_identity"].primary_key, [0]);
    assert_eq!(keys(by_name["by_index"]), [1]);
    assert!(by_name["by_index"].primary_key.is_empty());
    let typed = by_name["typed"];
    assert_eq!(names(typed), ["a", "m", "arr", "p", "ps", "d"]);
    let d = &typed.columns[5];
    assert_eq!(
        (d.attnum, d.not_null, d.missing_value.as_deref()),
        (7, true, Some("7"))
    );
    assert_eq!(typed.columns[1].type_name, "public.mood");
    assert_eq!(typed.columns[3].type_name, "public.posint");
    let dropped = by_name["dropped"];
    assert_eq!(names(dropped), ["a", "b"]);
    assert_eq!(dropped.columns[1].attnum, 3);
    assert_eq!(
        by_name["child"].partition_root,
        Some(TableName {
            schema: "public".into(),
            name: "parent".into(),
        })
    );
    assert!(
        !by_name.contains_key("parent"),
        "its partitions are published"
    );
    if column_lists {
        assert_eq!(names(by_name["listed"]), ["a", "c"]);
    }
    let child = described
        .iter()
        .find(|d| d.relation.name == "child")
        .unwrap_or_else(|| panic!("child described"));
    assert!(child.bytes > 0 && !child.partitioned);
}

/// Tables in several groups (of a thousand here): every one, in order.
#[tokio::test]
async fn many_tables_are_described_in_order() {
    let pg = Cluster::start();
    // Committed every 250 tables: one transaction's locks would not hold them all.
    pg.psql(
        "DO $$ BEGIN FOR g IN 1..2500 LOOP \
           EXECUTE format('CREATE TABLE t%s (id int PRIMARY KEY, v%s int)', g, g); \
           IF g % 250 = 0 THEN COMMIT; END IF; \
         END LOOP; END $$",
    );
    pg.psql("CREATE PUBLICATION many FOR ALL TABLES");
    let params = ok(ConnParams::parse(&pg.superuser()));
    let client = ok(connect_sql(&params, "catalog-test").await);
    let mut tables =
        ok(published_tables(&client, &["many".to_owned()], server_version(&client).await).await);
    // Not the catalog's order: the answer must follow the question.
    tables.reverse();
    let described = ok(describe_in_groups(&client, &mut TypeCatalog::new(), &tables, 1000).await);
    assert_eq!(described.len(), 2500);
    for (table, described) in tables.iter().zip(&described) {
        let relation = &described.relation;
        assert_eq!((relation.id, &relation.name), (table.oid, &table.name));
        let value = format!("v{}", &table.name[1..]);
        assert_eq!(relation.columns[1].name, value);
        assert_eq!(relation.primary_key, [0]);
        assert!(!described.partitioned && described.estimate.is_none());
    }
}
