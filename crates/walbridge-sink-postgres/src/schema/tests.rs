use super::*;
use walbridge_core::{Oid, ValueKind};

fn config(extra: &str) -> PostgresSinkConfig {
    let text =
        format!("name = \"t\"\nconnection = \"host=x\"\nschema_changes = \"apply\"\n{extra}");
    toml::from_str(&text).unwrap_or_else(|e| panic!("{e}"))
}

fn column(name: &str, attnum: i16, type_name: &str, type_oid: Oid, type_modifier: i32) -> Column {
    Column {
        name: name.into(),
        type_oid,
        type_modifier,
        type_name: type_name.into(),
        kind: ValueKind::builtin(type_oid).unwrap_or(ValueKind::Other),
        is_key: name == "id",
        attnum,
        not_null: name == "id",
        missing_value: None,
    }
}

fn relation(columns: Vec<Column>) -> Relation {
    Relation {
        id: 7,
        schema: "public".into(),
        name: "t".into(),
        replica_identity: ReplicaIdentity::Default,
        columns,
        partition_root: None,
        primary_key: vec![0],
    }
}

fn target(columns: &[(&str, Oid, i32)]) -> TargetTable {
    TargetTable {
        oid: 1,
        schema: "public".into(),
        name: "t".into(),
        partitioned: false,
        columns: columns
            .iter()
            .map(|&(name, type_oid, type_modifier)| TargetColumn {
                name: name.into(),
                type_oid,
                type_modifier,
                type_sql: String::new(),
                type_name: String::new(),
                base_oid: type_oid,
                is_enum: false,
                array_oid: 0,
                element: None,
                generated: false,
                comparable: true,
            })
            .collect(),
        unique_keys: vec![vec!["id".into()]],
        has_primary_key: true,
        has_apply_triggers: false,
        has_always_identity: false,
    }
}

fn sql(steps: &[Step]) -> Vec<&str> {
    steps.iter().map(|s| s.sql.as_str()).collect()
}

#[test]
fn a_column_added_with_a_constant_default_gives_older_rows_its_value() {
    let mut added = column("note", 3, "varchar", 1043, 14);
    added.missing_value = Some("it's new".into());
    added.not_null = true;
    let r = relation(vec![column("id", 1, "int8", 20, -1), added]);
    let steps = alter_table(&config(""), None, &r, &target(&[("id", 20, -1)]));
    assert_eq!(
        sql(&steps),
        [
            r#"ALTER TABLE "public"."t" ADD COLUMN IF NOT EXISTS "note" "pg_catalog"."varchar"(10) DEFAULT 'it''s new'::"pg_catalog"."varchar"(10) NOT NULL"#,
            r#"ALTER TABLE "public"."t" ALTER COLUMN "note" DROP DEFAULT"#,
        ]
    );
}

#[test]
fn a_column_keeping_its_number_under_another_name_is_renamed_not_dropped() {
    let before = ColumnShape::all_of(&relation(vec![
        column("id", 1, "int8", 20, -1),
        column("old", 2, "text", 25, -1),
    ]));
    let r = relation(vec![
        column("id", 1, "int8", 20, -1),
        column("new", 2, "text", 25, -1),
    ]);
    let t = target(&[("id", 20, -1), ("old", 25, -1)]);
    assert_eq!(
        sql(&alter_table(&config(""), Some(&before), &r, &t)),
        [r#"ALTER TABLE "public"."t" RENAME COLUMN "old" TO "new""#]
    );
    // A descriptor of an older transaction decoded after the rename: the
    // catalog no longer knows the name, the number is carried over.
    let late = relation(vec![
        column("id", 1, "int8", 20, -1),
        column("old", 0, "text", 25, -1),
    ]);
    let carried =
        walbridge_core::carry_attnums(Some(&before), &late).unwrap_or_else(|| panic!("carried"));
    assert_eq!(ColumnShape::all_of(&carried), before);
    assert!(walbridge_core::carry_attnums(Some(&before), &r).is_none());
    // Applied already (the stored columns lag the target): nothing to do.
    let renamed = target(&[("id", 20, -1), ("new", 25, -1)]);
    assert!(alter_table(&config(""), Some(&before), &r, &renamed).is_empty());
}

#[test]
fn a_dropped_column_is_dropped_or_kept_and_never_guessed_on_first_sight() {
    let before = ColumnShape::all_of(&relation(vec![
        column("id", 1, "int8", 20, -1),
        column("gone", 2, "text", 25, -1),
    ]));
    let r = relation(vec![column("id", 1, "int8", 20, -1)]);
    let t = target(&[("id", 20, -1), ("gone", 25, -1), ("mine", 25, -1)]);
    assert_eq!(
        sql(&alter_table(&config(""), Some(&before), &r, &t)),
        [r#"ALTER TABLE "public"."t" DROP COLUMN IF EXISTS "gone""#]
    );
    assert_eq!(
        sql(&alter_table(
            &config("dropped_columns = \"keep\""),
            Some(&before),
            &r,
            &t
        )),
        [r#"ALTER TABLE "public"."t" ALTER COLUMN "gone" DROP NOT NULL"#]
    );
    // Without the columns applied before, a target-only column is the user's.
    assert!(alter_table(&config(""), None, &r, &t).is_empty());
    // And with schema_changes = "stop", nothing is ever planned.
    let stop: PostgresSinkConfig =
        toml::from_str("name = \"t\"\nconnection = \"host=x\"").unwrap_or_else(|e| panic!("{e}"));
    assert!(alter_table(&stop, Some(&before), &r, &t).is_empty());
}

#[test]
fn a_type_changes_only_when_the_publisher_changed_it_and_the_target_differs() {
    let before = ColumnShape::all_of(&relation(vec![
        column("id", 1, "int8", 20, -1),
        column("n", 2, "int4", 23, -1),
    ]));
    let r = relation(vec![
        column("id", 1, "int8", 20, -1),
        column("n", 2, "numeric", 1700, (12 << 16 | 2) + 4),
    ]);
    assert_eq!(
        sql(&alter_table(
            &config(""),
            Some(&before),
            &r,
            &target(&[("id", 20, -1), ("n", 23, -1)])
        )),
        [
            r#"ALTER TABLE "public"."t" ALTER COLUMN "n" TYPE "pg_catalog"."numeric"(12,2) USING "n"::"pg_catalog"."numeric"(12,2)"#
        ]
    );
    // The target chose its own type and the publisher did not change: left alone.
    let same = ColumnShape::all_of(&r);
    assert!(
        alter_table(
            &config(""),
            Some(&same),
            &r,
            &target(&[("id", 20, -1), ("n", 25, -1)])
        )
        .is_empty()
    );
}

#[test]
fn a_created_table_has_the_publishers_columns_and_key_with_the_source_column() {
    let r = relation(vec![
        column("id", 1, "int8", 20, -1),
        column("char", 2, "char", 18, -1),
    ]);
    assert_eq!(
        sql(&create_table(&r, Some("a b"), "t", Some("origin"))),
        [
            r#"CREATE SCHEMA IF NOT EXISTS "a b""#,
            r#"CREATE TABLE IF NOT EXISTS "a b"."t" ("id" "pg_catalog"."int8" NOT NULL, "char" "pg_catalog"."char", "origin" text NOT NULL, PRIMARY KEY ("id", "origin"))"#,
        ]
    );
}
