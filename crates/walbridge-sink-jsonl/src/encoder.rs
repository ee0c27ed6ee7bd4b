//! One JSON object per change:
//!
//! ```json
//! {"op":"u","source":{"name":"shop","db":"shop","schema":"public","table":"orders",
//!  "lsn":"0/16B3748","commit_lsn":"0/16B37A0","xid":735,"ts_us":1700000000000000},
//!  "before":{"id":1},"after":{"id":1,"total":"9.50"}}
//! ```
//!
//! `op`: `r` snapshot read, `c` insert, `u` update, `d` delete, `t`
//! truncate, `m` logical decoding message, `q` a sequence's value
//! (`"sequence":{"schema","name","last_value"}`), `s` a table's columns changed
//! (before its first change under the new definition:
//! `"schema":{"columns":[{"name","type","key","not_null"}…]}` and
//! `"changes":[{"change":"add"|"drop"|"rename"|"type","column",…}]`).
//! Values follow [`walbridge_core::json`].

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::Serialize;
use serde::ser::{SerializeMap, SerializeStruct};
use serde_json::{Value, json};
use walbridge_core::json::{datum_to_json, plain_text};
use walbridge_core::{
    Change, ColumnChange, CopyTextError, LogicalMessage, Lsn, OldRowKind, Relation, Row,
    SequenceValues, SnapshotBatch, TransactionInfo, update_new_row,
};
use walbridge_sink::SourceBlock;

/// Writes change lines for one sink.
#[derive(Debug)]
pub struct Encoder {
    placeholder: Value,
}

/// Where a change sits: its source and transaction.
pub struct Position<'a> {
    /// Source name.
    pub source: &'a str,
    /// Publisher database.
    pub database: &'a str,
    /// The transaction, `None` for snapshot rows and non-transactional messages.
    pub transaction: Option<&'a TransactionInfo>,
}

impl Encoder {
    /// An encoder writing `placeholder` for unchanged TOASTed values.
    pub fn new(placeholder: &str) -> Self {
        Encoder {
            placeholder: Value::String(placeholder.to_owned()),
        }
    }

    fn row<'a>(&'a self, relation: &'a Relation, row: &'a Row, only_keys: bool) -> RowObject<'a> {
        RowObject {
            relation,
            row,
            only_keys,
            placeholder: &self.placeholder,
        }
    }

    fn source<'a>(
        &self,
        at: &Position<'a>,
        relation: Option<&'a Relation>,
        lsn: Lsn,
        snapshot: bool,
    ) -> SourceObject<'a> {
        SourceObject(SourceBlock {
            snapshot,
            ..SourceBlock::new(at.source, at.database, relation, lsn, at.transaction)
        })
    }

    fn write(out: &mut Vec<u8>, line: &impl Serialize) {
        // Serializing into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, line);
        out.push(b'\n');
    }

    /// Appends the lines of a batch of snapshot rows, all with one source
    /// object: stamped with the time the batch was handled, read once.
    pub fn snapshot_rows(
        &self,
        out: &mut Vec<u8>,
        at: &Position<'_>,
        batch: &SnapshotBatch,
    ) -> Result<(), CopyTextError> {
        let relation = &batch.relation;
        let source = self.source(at, Some(relation), batch.consistent_point, true);
        for row in batch.rows.rows(relation.columns.len()) {
            let row = row?;
            let line = RowLine {
                op: "r",
                source: source.clone(),
                before: None,
                after: Some(self.row(relation, &row, false)),
            };
            Self::write(out, &line);
        }
        Ok(())
    }

    /// Appends the line saying `relation`'s columns changed (`changes`),
    /// before its change at `lsn`.
    pub fn schema_change(
        &self,
        out: &mut Vec<u8>,
        at: &Position<'_>,
        relation: &Relation,
        changes: &[ColumnChange<'_>],
        lsn: Lsn,
    ) {
        let columns: Vec<Value> = relation
            .columns
            .iter()
            .map(|c| json!({"name": c.name, "type": c.type_display(), "key": c.is_key, "not_null": c.not_null}))
            .collect();
        let changes: Vec<Value> = changes
            .iter()
            .map(|change| match change {
                ColumnChange::Added(c) => {
                    json!({"change": "add", "column": c.name, "type": c.type_display()})
                }
                ColumnChange::Dropped(c) => json!({"change": "drop", "column": c.name}),
                ColumnChange::Renamed { from, to } => {
                    json!({"change": "rename", "column": to.name, "from": from.name})
                }
                ColumnChange::Retyped { from, to } => json!({
                    "change": "type", "column": to.name, "type": to.type_display(), "from": from.type_display
                }),
            })
            .collect();
        let line = json!({
            "op": "s",
            "source": self.source(at, Some(relation), lsn, false),
            "schema": {"columns": columns},
            "changes": changes,
        });
        Self::write(out, &line);
    }

    /// Appends a line per sequence.
    pub fn sequences(&self, out: &mut Vec<u8>, at: &Position<'_>, values: &SequenceValues) {
        for sequence in &values.sequences {
            let source = SourceObject(SourceBlock {
                ts_us: values.read_time.unix_micros(),
                ..self.source(at, None, values.lsn, false).0
            });
            let line = json!({
                "op": "q",
                "source": source,
                "sequence": {"schema": sequence.schema, "name": sequence.name, "last_value": sequence.last_value},
            });
            Self::write(out, &line);
        }
    }

    /// Appends the line for a logical decoding message.
    pub fn message(&self, out: &mut Vec<u8>, at: &Position<'_>, m: &LogicalMessage) {
        let line = json!({
            "op": "m",
            "source": self.source(at, None, m.lsn, false),
            "message": {"prefix": m.prefix, "content": BASE64.encode(&m.content), "transactional": m.transactional},
        });
        Self::write(out, &line);
    }

    /// Appends the line for a change.
    pub fn change(&self, out: &mut Vec<u8>, at: &Position<'_>, change: &Change) {
        let line = match change {
            Change::Insert { lsn, relation, new } | Change::Read { lsn, relation, new } => {
                let read = matches!(change, Change::Read { .. });
                RowLine {
                    op: if read { "r" } else { "c" },
                    source: self.source(at, Some(relation), *lsn, read),
                    before: None,
                    after: Some(self.row(relation, new, false)),
                }
            }
            Change::Update {
                lsn,
                relation,
                old,
                new,
            } => {
                let new = update_new_row(new, old.as_ref());
                let line = RowLine {
                    op: "u",
                    source: self.source(at, Some(relation), *lsn, false),
                    before: old
                        .as_ref()
                        .map(|o| self.row(relation, &o.row, o.kind == OldRowKind::Key)),
                    after: Some(self.row(relation, &new, false)),
                };
                return Self::write(out, &line);
            }
            Change::Delete { lsn, relation, old } => RowLine {
                op: "d",
                source: self.source(at, Some(relation), *lsn, false),
                before: Some(self.row(relation, &old.row, old.kind == OldRowKind::Key)),
                after: None,
            },
            Change::Truncate(t) => {
                let line = json!({
                    "op": "t",
                    "source": self.source(at, None, t.lsn, false),
                    "truncate": {
                        "tables": t.relations.iter().map(|r| json!({"schema": r.schema, "table": r.name})).collect::<Vec<_>>(),
                        "cascade": t.options.cascade,
                        "restart_identity": t.options.restart_identity,
                    },
                });
                return Self::write(out, &line);
            }
            Change::Message(m) => return self.message(out, at, m),
            // Consumers get a re-sync's rows as reads; what a target
            // should delete is not a line.
            Change::ReadRange(_) => return,
        };
        Self::write(out, &line);
    }
}

/// A row change's line. Written as it is serialized, without a tree of
/// JSON values in between (building one was most of the sink's cost per
/// row: a map per line, per source and per row).
#[derive(Serialize)]
struct RowLine<'a> {
    op: &'static str,
    source: SourceObject<'a>,
    before: Option<RowObject<'a>>,
    after: Option<RowObject<'a>>,
}

/// Where a line's change comes from: the `source` object, the snapshot
/// key only on snapshot rows.
#[derive(Clone)]
struct SourceObject<'a>(SourceBlock<'a>);

impl Serialize for SourceObject<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let block = &self.0;
        let mut object = serializer.serialize_struct("source", 9)?;
        object.serialize_field("name", block.name)?;
        object.serialize_field("db", block.database)?;
        object.serialize_field("schema", &block.schema)?;
        object.serialize_field("table", &block.table)?;
        object.serialize_field("lsn", &AsText(block.lsn))?;
        object.serialize_field("commit_lsn", &block.commit_lsn.map(AsText))?;
        object.serialize_field("xid", &block.xid)?;
        object.serialize_field("ts_us", &block.ts_us)?;
        if block.snapshot {
            object.serialize_field("snapshot", &true)?;
        }
        object.end()
    }
}

/// A value written as the string its `Display` makes (an LSN as `0/16B3748`).
struct AsText<T>(T);

impl<T: std::fmt::Display> Serialize for AsText<T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&self.0)
    }
}

/// A row as an object of its columns (only the key columns for an old
/// key), values per [`walbridge_core::json`].
struct RowObject<'a> {
    relation: &'a Relation,
    row: &'a Row,
    only_keys: bool,
    placeholder: &'a Value,
}

impl Serialize for RowObject<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        for (column, datum) in self.relation.columns.iter().zip(self.row) {
            if self.only_keys && !column.is_key {
                continue;
            }
            match plain_text(datum, &column.kind) {
                Some(text) => map.serialize_entry(&column.name, text)?,
                None => map.serialize_entry(
                    &column.name,
                    &datum_to_json(datum, &column.kind, self.placeholder),
                )?,
            }
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;
    use walbridge_core::{
        Column, CopyText, Datum, OldRow, PgTimestamp, ReplicaIdentity, ValueKind,
    };

    use super::*;

    fn relation() -> Arc<Relation> {
        let column = |name: &str, kind: ValueKind, is_key| Column {
            name: name.into(),
            type_oid: 0,
            type_modifier: -1,
            type_name: String::new(),
            kind,
            is_key,
            attnum: 0,
            not_null: false,
            missing_value: None,
        };
        Arc::new(Relation {
            id: 1,
            schema: "public".into(),
            name: "t".into(),
            replica_identity: ReplicaIdentity::Default,
            columns: vec![
                column("id", ValueKind::Int4, true),
                column("doc", ValueKind::Text, false),
            ],
            partition_root: None,
            primary_key: Vec::new(),
        })
    }

    fn text(s: &str) -> Datum {
        Datum::Text(Bytes::copy_from_slice(s.as_bytes()))
    }

    #[test]
    fn update_with_key_change_and_unchanged_toast() {
        let e = Encoder::new("?");
        let info = TransactionInfo {
            xid: 7,
            commit_lsn: Lsn(0x10),
            end_lsn: Lsn(0x20),
            commit_time: PgTimestamp(0),
            origin: None,
            gid: None,
            for_sink: None,
        };
        let at = Position {
            source: "s",
            database: "d",
            transaction: Some(&info),
        };
        let change = Change::Update {
            lsn: Lsn(5),
            relation: relation(),
            old: Some(OldRow {
                kind: OldRowKind::Key,
                row: vec![text("1"), Datum::Null],
            }),
            new: vec![text("2"), Datum::UnchangedToast],
        };
        let mut out = Vec::new();
        e.change(&mut out, &at, &change);
        let v: Value = serde_json::from_slice(&out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v["op"], "u");
        assert_eq!(v["before"], json!({"id": 1}));
        assert_eq!(v["after"], json!({"id": 2, "doc": "?"}));
        assert_eq!(v["source"]["lsn"], "0/5");
        assert_eq!(v["source"]["commit_lsn"], "0/10");
        assert_eq!(v["source"]["xid"], 7);
        assert_eq!(v["source"]["ts_us"], 946_684_800_000_000i64);
        assert_eq!(out.last(), Some(&b'\n'));
    }

    #[test]
    fn lines_are_written_with_their_keys_in_order() {
        let e = Encoder::new("?");
        let at = Position {
            source: "s",
            database: "d",
            transaction: None,
        };
        let mut out = Vec::new();
        let batch = SnapshotBatch {
            relation: relation(),
            rows: CopyText::new(Bytes::from_static(b"7\ta\"b\n")).unwrap_or_else(|e| panic!("{e}")),
            consistent_point: Lsn(0x10),
        };
        e.snapshot_rows(&mut out, &at, &batch)
            .unwrap_or_else(|e| panic!("{e}"));
        let line = String::from_utf8_lossy(&out);
        let (head, tail) = line
            .split_once("\"ts_us\":")
            .unwrap_or_else(|| panic!("no ts_us in {line}"));
        assert_eq!(
            head,
            r#"{"op":"r","source":{"name":"s","db":"d","schema":"public","table":"t","lsn":"0/10","commit_lsn":null,"xid":null,"#
        );
        let (_, tail) = tail
            .split_once(',')
            .unwrap_or_else(|| panic!("nothing after ts_us in {line}"));
        assert_eq!(
            tail,
            "\"snapshot\":true},\"before\":null,\"after\":{\"id\":7,\"doc\":\"a\\\"b\"}}\n"
        );
    }
}
