//! Schema changes (`schema_changes = "apply"`, `create_tables`): the
//! statements that make a target table fit a new descriptor of its
//! source table.
//!
//! pgoutput sends a table's descriptor again before the first change
//! made under a new definition, so the statements run exactly there: in
//! the target transaction that holds that change, after every change
//! before it, and they commit or roll back with it (during the initial
//! copy, which several connections load, they commit on their own before
//! the table's rows).
//!
//! * Columns the target lacks are added; a column added on the publisher
//!   with a constant default is added with that value
//!   (`attmissingval`), which the rows older than it hold without ever
//!   passing through the stream.
//! * Drops, renames and type changes are told by comparing the descriptor
//!   with the one applied before (same attribute number, other name: a
//!   rename). The published columns are stored after each commit that
//!   changed them, so this works across restarts; the store may lag the
//!   target, never lead it, which is why every statement is planned from
//!   the target as it is (a column already there is not added again, a
//!   type already right is not changed). On first sight of a table nothing
//!   is dropped: a target column the publisher never described may be the
//!   user's own.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use walbridge_core::{Column, Oid, Relation, ReplicaIdentity};
use walbridge_pg::{quote_ident, quote_literal, quote_qualified};

use crate::config::{DroppedColumns, PostgresSinkConfig, SchemaChanges};
use crate::target::{TargetColumn, TargetTable};

/// Object identifiers below this are built into PostgreSQL and equal on
/// every server.
const FIRST_NORMAL_OBJECT_ID: Oid = 16384;

/// A published column as last applied: enough to tell the next
/// descriptor's drops, renames and type changes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishedColumn {
    /// Its name.
    pub name: String,
    /// Its attribute number on the publisher (0: unknown).
    pub attnum: i16,
    /// Its type's OID on the publisher.
    pub type_oid: Oid,
    /// Its type modifier.
    pub type_modifier: i32,
}

impl PublishedColumn {
    /// The columns `relation` publishes.
    pub fn all_of(relation: &Relation) -> Vec<PublishedColumn> {
        relation
            .columns
            .iter()
            .map(|c| PublishedColumn {
                name: c.name.clone(),
                attnum: c.attnum,
                type_oid: c.type_oid,
                type_modifier: c.type_modifier,
            })
            .collect()
    }

    fn same_type(&self, column: &Column) -> bool {
        self.type_oid == column.type_oid && self.type_modifier == column.type_modifier
    }
}

/// `relation` with the attribute numbers the catalog could not give
/// (0) taken from the columns applied before under the same name, when
/// any is missing. The source reads them when a descriptor arrives, and
/// the walsender, decoding behind the publisher, sends descriptors of
/// transactions older than DDL already made: a descriptor naming a column
/// renamed since finds no such name in the catalog.
pub fn carry_attnums(
    previous: Option<&[PublishedColumn]>,
    relation: &Relation,
) -> Option<Arc<Relation>> {
    let previous = previous?;
    let known = |c: &Column| {
        previous
            .iter()
            .find(|p| p.name == c.name && p.attnum != 0)
            .map(|p| p.attnum)
    };
    if !relation
        .columns
        .iter()
        .any(|c| c.attnum == 0 && known(c).is_some())
    {
        return None;
    }
    let mut carried = relation.clone();
    for column in &mut carried.columns {
        if column.attnum == 0 {
            column.attnum = known(column).unwrap_or(0);
        }
    }
    Some(Arc::new(carried))
}

/// One statement of a schema change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The column it changes (`None`: the whole table).
    pub column: Option<String>,
    /// What it does, for the log: `add column`, `drop column`, ….
    pub action: &'static str,
    /// The statement.
    pub sql: String,
}

/// The publisher's type of `column` as SQL writes it, with its modifier.
pub fn sql_type(column: &Column) -> String {
    let display = column.type_display();
    let modifier = display.get(column.type_name.len()..).unwrap_or_default();
    let (schema, name) = column
        .type_name
        .split_once('.')
        .unwrap_or(("pg_catalog", &column.type_name));
    format!("{}{modifier}", quote_qualified(schema, name))
}

/// Whether `target` already has `column`'s type (built-in types by OID
/// and modifier; others, whose OIDs differ between servers, by name).
fn has_type(target: &TargetColumn, column: &Column) -> bool {
    if column.type_oid < FIRST_NORMAL_OBJECT_ID {
        target.type_oid == column.type_oid && target.type_modifier == column.type_modifier
    } else {
        let (schema, name) = column
            .type_name
            .split_once('.')
            .unwrap_or(("pg_catalog", &column.type_name));
        let unquote = |s: &str| s.trim_matches('"').replace("\"\"", "\"");
        let (target_schema, target_name) = target
            .type_name
            .split_once("\".\"")
            .or_else(|| target.type_name.split_once('.'))
            .unwrap_or(("", &target.type_name));
        unquote(target_schema) == schema && unquote(target_name) == name
    }
}

/// `CREATE TABLE` (and its schema) for a table the target lacks: the
/// published columns with their types and `NOT NULL`, the primary key
/// (else the identity index's columns) as primary key, and the sink's
/// `source_column` as part of it.
pub fn create_table(
    relation: &Relation,
    schema: Option<&str>,
    name: &str,
    source_column: Option<&str>,
) -> Vec<Step> {
    let quoted = match schema {
        Some(s) => quote_qualified(s, name),
        None => quote_ident(name),
    };
    let mut definitions: Vec<String> = relation
        .columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let not_null = if c.not_null || relation.is_never_null(i) {
                " NOT NULL"
            } else {
                ""
            };
            format!("{} {}{not_null}", quote_ident(&c.name), sql_type(c))
        })
        .collect();
    if let Some(column) = source_column {
        definitions.push(format!("{} text NOT NULL", quote_ident(column)));
    }
    let mut key: Vec<String> = if !relation.primary_key.is_empty() {
        relation
            .primary_key
            .iter()
            .map(|&i| quote_ident(&relation.columns[i].name))
            .collect()
    } else if matches!(relation.replica_identity, ReplicaIdentity::Index) {
        relation
            .key_columns()
            .map(|i| quote_ident(&relation.columns[i].name))
            .collect()
    } else {
        Vec::new()
    };
    if !key.is_empty() {
        key.extend(source_column.map(quote_ident));
        definitions.push(format!("PRIMARY KEY ({})", key.join(", ")));
    }
    let mut steps = Vec::new();
    if let Some(schema) = schema {
        steps.push(Step {
            column: None,
            action: "create schema",
            sql: format!("CREATE SCHEMA IF NOT EXISTS {}", quote_ident(schema)),
        });
    }
    steps.push(Step {
        column: None,
        action: "create table",
        sql: format!(
            "CREATE TABLE IF NOT EXISTS {quoted} ({})",
            definitions.join(", ")
        ),
    });
    steps
}

/// The statements that make `target` fit `relation`, given the columns
/// applied before (`None`: first sight of the table).
pub fn alter_table(
    config: &PostgresSinkConfig,
    previous: Option<&[PublishedColumn]>,
    relation: &Relation,
    target: &TargetTable,
) -> Vec<Step> {
    if config.schema_changes != SchemaChanges::Apply {
        return Vec::new();
    }
    let table = target.quoted();
    let mut steps = Vec::new();
    let previous = previous.unwrap_or_default();
    let step = |column: &str, action, sql: String| Step {
        column: Some(column.to_owned()),
        action,
        sql: format!("ALTER TABLE {table} {sql}"),
    };
    // What the target's columns are named once the renames below are made.
    let mut names: Vec<String> = target.columns.iter().map(|c| c.name.clone()).collect();
    let mut renamed_from = Vec::new();
    for column in &relation.columns {
        let before = previous
            .iter()
            .find(|p| column.attnum != 0 && p.attnum == column.attnum);
        if let Some(before) = before
            && before.name != column.name
            && names.contains(&before.name)
            && !names.contains(&column.name)
        {
            steps.push(step(
                &column.name,
                "rename column",
                format!(
                    "RENAME COLUMN {} TO {}",
                    quote_ident(&before.name),
                    quote_ident(&column.name)
                ),
            ));
            for n in names.iter_mut().filter(|n| **n == before.name) {
                n.clone_from(&column.name);
            }
            renamed_from.push(before.name.clone());
        }
    }
    for column in &relation.columns {
        let quoted = quote_ident(&column.name);
        let type_sql = sql_type(column);
        if !names.contains(&column.name) {
            let mut sql = format!("ADD COLUMN IF NOT EXISTS {quoted} {type_sql}");
            if let Some(value) = &column.missing_value {
                sql.push_str(&format!(" DEFAULT {}::{type_sql}", quote_literal(value)));
                if column.not_null {
                    sql.push_str(" NOT NULL");
                }
            }
            steps.push(step(&column.name, "add column", sql));
            if column.missing_value.is_some() {
                // The default filled the rows already there; later rows
                // bring their own values, as on the publisher.
                steps.push(step(
                    &column.name,
                    "add column",
                    format!("ALTER COLUMN {quoted} DROP DEFAULT"),
                ));
            }
            continue;
        }
        let changed_on_publisher = previous
            .iter()
            .find(|p| p.name == column.name || (column.attnum != 0 && p.attnum == column.attnum))
            .is_some_and(|p| !p.same_type(column));
        let target_column = target
            .columns
            .iter()
            .zip(&names)
            .find(|(_, n)| **n == column.name)
            .map(|(c, _)| c);
        if changed_on_publisher && target_column.is_some_and(|t| !has_type(t, column)) {
            steps.push(step(
                &column.name,
                "change column type",
                format!("ALTER COLUMN {quoted} TYPE {type_sql} USING {quoted}::{type_sql}"),
            ));
        }
    }
    let primary_key = if target.has_primary_key {
        target.unique_keys.first().cloned().unwrap_or_default()
    } else {
        Vec::new()
    };
    for gone in previous {
        let still_published = relation
            .columns
            .iter()
            .any(|c| c.name == gone.name || (gone.attnum != 0 && c.attnum == gone.attnum));
        if still_published
            || renamed_from.contains(&gone.name)
            || !names.contains(&gone.name)
            || config.source_column.as_deref() == Some(gone.name.as_str())
        {
            continue;
        }
        let quoted = quote_ident(&gone.name);
        match config.dropped_columns {
            DroppedColumns::Drop => steps.push(step(
                &gone.name,
                "drop column",
                format!("DROP COLUMN IF EXISTS {quoted}"),
            )),
            // New rows leave it empty; a key column keeps its NOT NULL.
            DroppedColumns::Keep if !primary_key.contains(&gone.name) => steps.push(step(
                &gone.name,
                "keep column",
                format!("ALTER COLUMN {quoted} DROP NOT NULL"),
            )),
            DroppedColumns::Keep => {}
        }
    }
    steps
}

#[cfg(test)]
mod tests;
