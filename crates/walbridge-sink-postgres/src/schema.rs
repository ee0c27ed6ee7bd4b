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

use walbridge_core::{
    Column, ColumnChange, ColumnShape, Relation, ReplicaIdentity, column_changes,
};
use walbridge_pg::{quote_ident, quote_literal, quote_qualified};

use crate::config::{DroppedColumns, PostgresSinkConfig, SchemaChanges};
use crate::mapping::FIRST_NORMAL_OBJECT_ID;
use crate::target::{TargetColumn, TargetTable};

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
    previous: Option<&[ColumnShape]>,
    relation: &Relation,
    target: &TargetTable,
) -> Vec<Step> {
    if config.schema_changes != SchemaChanges::Apply {
        return Vec::new();
    }
    let table = target.quoted();
    let step = |column: &str, action, sql: String| Step {
        column: Some(column.to_owned()),
        action,
        sql: format!("ALTER TABLE {table} {sql}"),
    };
    let changes = previous.map_or_else(Vec::new, |p| column_changes(p, relation));
    let mut steps = Vec::new();
    // What the target's columns are named once the renames below are made.
    let mut names: Vec<String> = target.columns.iter().map(|c| c.name.clone()).collect();
    for change in &changes {
        if let ColumnChange::Renamed { from, to } = change
            && names.contains(&from.name)
            && !names.contains(&to.name)
        {
            steps.push(step(
                &to.name,
                "rename column",
                format!(
                    "RENAME COLUMN {} TO {}",
                    quote_ident(&from.name),
                    quote_ident(&to.name)
                ),
            ));
            for n in names.iter_mut().filter(|n| **n == from.name) {
                n.clone_from(&to.name);
            }
        }
    }
    for column in relation.columns.iter().filter(|c| !names.contains(&c.name)) {
        let quoted = quote_ident(&column.name);
        let type_sql = sql_type(column);
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
    }
    for change in &changes {
        // Only when the publisher changed it, and the target is not there yet.
        if let ColumnChange::Retyped { to, .. } = change
            && let Some((target_column, _)) = target
                .columns
                .iter()
                .zip(&names)
                .find(|(_, n)| **n == to.name)
            && !has_type(target_column, to)
        {
            let quoted = quote_ident(&to.name);
            let type_sql = sql_type(to);
            steps.push(step(
                &to.name,
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
    for change in &changes {
        let ColumnChange::Dropped(gone) = change else {
            continue;
        };
        if !names.contains(&gone.name)
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
