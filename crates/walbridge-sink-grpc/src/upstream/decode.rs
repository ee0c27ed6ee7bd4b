//! Feed messages back into walbridge's model, exactly as the upstream log
//! holds them: values in the form the publisher sent (the subscription asks
//! for `text_values`), LSNs, transaction metadata, old-row kinds.

use std::collections::HashMap;
use std::sync::Arc;

use walbridge_core::{
    Change, Column, CopyText, Datum, LogicalMessage, Lsn, OldRow, OldRowKind, Origin, PgTimestamp,
    Relation, ReplicaIdentity, Row, SequenceValue, SequenceValues, TableName, TransactionInfo,
    Truncate, TruncateOptions, ValueKind,
};

use crate::pb;

/// What the feed sent that this walbridge cannot take.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Malformed(pub String);

fn malformed<T>(what: impl Into<String>) -> Result<T, Malformed> {
    Err(Malformed(what.into()))
}

/// An LSN in PostgreSQL's text form; `what` names the field.
pub(crate) fn lsn(text: &str, what: &str) -> Result<Lsn, Malformed> {
    text.parse().map_err(|_| {
        Malformed(format!(
            "{what} {text:?} is not an LSN (an upstream walbridge older than this one? upgrade it first)"
        ))
    })
}

/// The relations described in one subscription, by their feed numbers.
#[derive(Default)]
pub(crate) struct Relations(HashMap<u32, Arc<Relation>>);

impl Relations {
    /// Takes a description (replacing an earlier one with its number).
    pub fn describe(&mut self, d: pb::RelationDescription) {
        let columns = d
            .columns
            .into_iter()
            .map(|c| {
                // The feed spells the modifier after the name; the model keeps it apart.
                let type_name = match c.type_name.split_once('(') {
                    Some((name, _)) if c.type_modifier >= 0 => name.to_owned(),
                    _ => c.type_name,
                };
                Column {
                    name: c.name,
                    type_oid: c.type_oid,
                    type_modifier: c.type_modifier,
                    kind: ValueKind::builtin(c.type_oid)
                        .or_else(|| ValueKind::builtin_array(c.type_oid))
                        .unwrap_or(ValueKind::Other),
                    type_name,
                    is_key: c.key,
                    attnum: 0,
                    not_null: false,
                    missing_value: None,
                }
            })
            .collect();
        let relation = Relation {
            id: d.oid,
            schema: d.schema,
            name: d.table,
            replica_identity: match d.replica_identity.as_str() {
                "nothing" => ReplicaIdentity::Nothing,
                "full" => ReplicaIdentity::Full,
                "index" => ReplicaIdentity::Index,
                _ => ReplicaIdentity::Default,
            },
            columns,
            partition_root: d
                .partition_root
                .split_once('.')
                .map(|(schema, name)| TableName {
                    schema: schema.to_owned(),
                    name: name.to_owned(),
                }),
            primary_key: d.primary_key.into_iter().map(|i| i as usize).collect(),
        };
        self.0.insert(d.relation, Arc::new(relation));
    }

    /// The relation with feed number `number`.
    pub fn get(&self, number: u32) -> Result<&Arc<Relation>, Malformed> {
        self.0.get(&number).ok_or_else(|| {
            Malformed(format!(
                "a change refers to relation {number}, which the feed has not described"
            ))
        })
    }
}

/// A row's values as the publisher sent them.
pub(crate) fn row(row: Option<pb::Row>, relation: &Relation) -> Result<Row, Malformed> {
    let Some(row) = row else {
        return malformed(format!(
            "a change of {}.{} has no row",
            relation.schema, relation.name
        ));
    };
    if row.values.len() != relation.columns.len() {
        return malformed(format!(
            "a row of {}.{} has {} values for {} columns",
            relation.schema,
            relation.name,
            row.values.len(),
            relation.columns.len()
        ));
    }
    row.values.into_iter().map(datum).collect()
}

fn datum(value: pb::Value) -> Result<Datum, Malformed> {
    use pb::value::Kind;
    Ok(match (value.kind, value.text, value.binary) {
        (Some(Kind::Null(true)), ..) => Datum::Null,
        (Some(Kind::UnchangedToast(true)), ..) => Datum::UnchangedToast,
        (_, Some(text), _) => Datum::Text(text.into_bytes().into()),
        (_, None, Some(binary)) => Datum::Binary(binary),
        (_, None, None) => {
            return malformed(
                "a value came without the form the publisher sent (an upstream walbridge older than this one? upgrade it first)",
            );
        }
    })
}

/// A transaction's metadata from its `begin`.
pub(crate) fn transaction(begin: &pb::Begin) -> Result<TransactionInfo, Malformed> {
    let commit_time = begin.commit_time.unwrap_or_default();
    Ok(TransactionInfo {
        xid: begin.xid,
        commit_lsn: lsn(&begin.commit_lsn, "begin.commit_lsn")?,
        end_lsn: lsn(&begin.end_lsn, "begin.end_lsn")?,
        commit_time: PgTimestamp::from_unix_micros(
            commit_time.seconds * 1_000_000 + i64::from(commit_time.nanos / 1_000),
        ),
        origin: match begin.origin.as_str() {
            "" => None,
            name => Some(Origin {
                name: name.to_owned(),
                lsn: lsn(&begin.origin_lsn, "begin.origin_lsn")?,
            }),
        },
        gid: (!begin.gid.is_empty()).then(|| begin.gid.clone()),
        // The feed sends another walbridge's sink only the units for it.
        for_sink: None,
    })
}

/// One change of a transaction.
pub(crate) fn change(c: pb::Change, relations: &Relations) -> Result<Change, Malformed> {
    let at = lsn(&c.lsn, "change.lsn")?;
    let operation = pb::Operation::try_from(c.operation).unwrap_or_default();
    Ok(match operation {
        pb::Operation::Insert => {
            let relation = relations.get(c.relation)?.clone();
            Change::Insert {
                lsn: at,
                new: row(c.new, &relation)?,
                relation,
            }
        }
        pb::Operation::Read => {
            let relation = relations.get(c.relation)?.clone();
            Change::Read {
                lsn: at,
                new: row(c.new, &relation)?,
                relation,
            }
        }
        pb::Operation::Update => {
            let relation = relations.get(c.relation)?.clone();
            Change::Update {
                lsn: at,
                old: match c.old {
                    Some(old) => Some(old_row(old, &relation)?),
                    None => None,
                },
                new: row(c.new, &relation)?,
                relation,
            }
        }
        pb::Operation::Delete => {
            let relation = relations.get(c.relation)?.clone();
            let Some(old) = c.old else {
                return malformed(format!(
                    "a delete of {}.{} has no old row",
                    relation.schema, relation.name
                ));
            };
            Change::Delete {
                lsn: at,
                old: old_row(old, &relation)?,
                relation,
            }
        }
        pb::Operation::Truncate => Change::Truncate(Truncate {
            lsn: at,
            relations: c
                .relations
                .iter()
                .map(|&n| relations.get(n).cloned())
                .collect::<Result<_, _>>()?,
            options: TruncateOptions {
                cascade: c.cascade,
                restart_identity: c.restart_identity,
            },
        }),
        pb::Operation::Message => {
            let Some(m) = c.message else {
                return malformed("a message change without its message");
            };
            Change::Message(LogicalMessage {
                lsn: at,
                transactional: true,
                prefix: m.prefix,
                content: m.content,
            })
        }
        pb::Operation::Unspecified => {
            return malformed(format!(
                "a change of operation {} inside a transaction",
                c.operation
            ));
        }
    })
}

/// pgoutput sends the whole old row exactly for REPLICA IDENTITY FULL and
/// the key otherwise, so the relation tells which this is.
fn old_row(old: pb::Row, relation: &Relation) -> Result<OldRow, Malformed> {
    Ok(OldRow {
        kind: if relation.replica_identity == ReplicaIdentity::Full {
            OldRowKind::Full
        } else {
            OldRowKind::Key
        },
        row: row(Some(old), relation)?,
    })
}

/// Rows of the initial copy, as COPY text.
pub(crate) fn copy_rows(rows: Vec<pb::Row>, relation: &Relation) -> Result<CopyText, Malformed> {
    let rows = rows
        .into_iter()
        .map(|r| row(Some(r), relation))
        .collect::<Result<Vec<_>, _>>()?;
    CopyText::from_rows(&rows).map_err(|e| {
        Malformed(format!(
            "rows of the copy of {}.{}: {e}",
            relation.schema, relation.name
        ))
    })
}

/// A non-transactional message.
/// Sequences' values.
pub(crate) fn sequences(s: pb::Sequences) -> Result<SequenceValues, Malformed> {
    let id = s.id.unwrap_or_default();
    let read_time = s.read_time.unwrap_or_default();
    Ok(SequenceValues {
        lsn: lsn(&id.lsn, "sequences.id.lsn")?,
        read_time: PgTimestamp::from_unix_micros(
            read_time.seconds * 1_000_000 + i64::from(read_time.nanos / 1_000),
        ),
        sequences: s
            .sequences
            .into_iter()
            .map(|q| SequenceValue {
                schema: q.schema,
                name: q.name,
                last_value: q.last_value,
            })
            .collect(),
    })
}

pub(crate) fn message(m: pb::Message) -> Result<LogicalMessage, Malformed> {
    let id = m.id.unwrap_or_default();
    Ok(LogicalMessage {
        lsn: lsn(&id.lsn, "message.id.lsn")?,
        transactional: false,
        prefix: m.prefix,
        content: m.content,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> pb::Value {
        pb::Value {
            kind: Some(pb::value::Kind::String(s.to_owned())),
            text: Some(s.to_owned()),
            binary: None,
        }
    }

    #[test]
    fn descriptions_and_rows_come_back_as_the_log_held_them() {
        let mut relations = Relations::default();
        relations.describe(pb::RelationDescription {
            relation: 3,
            source: "a".into(),
            schema: "public".into(),
            table: "t".into(),
            oid: 16384,
            columns: vec![
                pb::Column {
                    name: "id".into(),
                    type_oid: 23,
                    type_name: "int4".into(),
                    key: true,
                    type_modifier: -1,
                },
                pb::Column {
                    name: "price".into(),
                    type_oid: 1700,
                    type_name: "numeric(10,2)".into(),
                    key: false,
                    type_modifier: (10 << 16 | 2) + 4,
                },
            ],
            partition_root: String::new(),
            replica_identity: "full".into(),
            primary_key: vec![0],
        });
        let relation = relations.get(3).unwrap().clone();
        assert_eq!(relation.columns[1].type_name, "numeric");
        assert_eq!(relation.columns[1].type_display(), "numeric(10,2)");
        assert_eq!(relation.columns[1].kind, ValueKind::Numeric);
        assert_eq!(relation.primary_key, [0]);
        let change = change(
            pb::Change {
                operation: pb::Operation::Delete.into(),
                relation: 3,
                lsn: "0/16B3748".into(),
                old: Some(pb::Row {
                    values: vec![
                        text("1"),
                        pb::Value {
                            kind: Some(pb::value::Kind::Null(true)),
                            ..Default::default()
                        },
                    ],
                }),
                ..Default::default()
            },
            &relations,
        )
        .unwrap();
        let Change::Delete { lsn, old, .. } = change else {
            panic!("not a delete: {change:?}");
        };
        assert_eq!(lsn, "0/16B3748".parse().unwrap());
        assert_eq!(old.kind, OldRowKind::Full);
        assert_eq!(old.row, vec![Datum::Text("1".into()), Datum::Null]);
        assert!(relations.get(4).is_err());
    }

    #[test]
    fn a_value_without_its_sent_form_is_refused() {
        let value = pb::Value {
            kind: Some(pb::value::Kind::Int64(1)),
            ..Default::default()
        };
        assert!(datum(value).is_err());
    }
}
