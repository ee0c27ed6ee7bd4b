//! What a log record holds, and its protobuf encoding
//! (`proto/walbridge/log/v1/record.proto`).

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use foldhash::fast::RandomState;
use prost::Message as _;
use walbridge_core::{
    Change, Column, CopyText, Datum, EventBatch, KeyOrder, LogicalMessage, Lsn, OldRow, OldRowKind,
    Origin, PgTimestamp, ReadRange, Relation, ReplicaIdentity, Row, SequenceValue, SequenceValues,
    SnapshotBatch, SourceEvent, TableName, TransactionInfo, Truncate, TruncateOptions, ValueKind,
};

use crate::pb;

mod chunk;

/// The record format this build writes (`Record.format`).
pub const FORMAT: u32 = 2;

/// One decoded log record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// A committed transaction, or a contiguous chunk of one.
    Transaction {
        /// The transaction.
        info: Arc<TransactionInfo>,
        /// The chunk starts the transaction.
        first: bool,
        /// The chunk ends the transaction.
        last: bool,
        /// Its changes, in order.
        changes: Vec<Change>,
    },
    /// Rows of the initial copy.
    Snapshot(SnapshotBatch),
    /// The initial copy is complete.
    SnapshotComplete {
        /// The slot's consistent point.
        consistent_point: Lsn,
    },
    /// A non-transactional logical decoding message.
    Message(LogicalMessage),
    /// Sequences' values, between transactions.
    Sequences(SequenceValues),
}

impl Entry {
    /// Adds the events the record stands for to `events`, in the order the
    /// source emitted them.
    pub fn push_events(self, events: &mut EventBatch) {
        match self {
            Entry::Transaction {
                info,
                first,
                last,
                changes,
            } => {
                events.reserve(changes.len() + 2);
                if first {
                    events.push(SourceEvent::Begin(info.clone()));
                }
                events.extend(changes.into_iter().map(SourceEvent::Change));
                if last {
                    events.push(SourceEvent::Commit(info));
                }
            }
            Entry::Snapshot(batch) => events.push(SourceEvent::Snapshot(batch)),
            Entry::SnapshotComplete { consistent_point } => {
                events.push(SourceEvent::SnapshotComplete { consistent_point });
            }
            Entry::Message(m) => events.push(SourceEvent::Message(m)),
            Entry::Sequences(s) => events.push(SourceEvent::Sequences(s)),
        }
    }
}

/// A record that does not decode.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The protobuf is malformed.
    #[error("malformed record: {0}")]
    Protobuf(#[from] prost::DecodeError),
    /// Written by a newer walbridge, in a format this one does not know.
    #[error(
        "record format {0} is newer than this walbridge understands ({FORMAT}); upgrade walbridge"
    )]
    Format(u32),
    /// Well-formed protobuf with contents that make no sense.
    #[error("invalid record: {0}")]
    Invalid(&'static str),
    /// Snapshot rows that are not COPY text.
    #[error("invalid snapshot rows in record: {0}")]
    CopyText(#[from] walbridge_core::CopyTextError),
}

/// `walbridge.log.v1.Record` with its relation descriptors left encoded.
///
/// On the wire an embedded message and `bytes` are the same, so this reads
/// and writes exactly the generated `Record`; keeping descriptors as bytes
/// lets both sides encode and decode a table's descriptor once, not once
/// per record.
#[derive(Clone, PartialEq, prost::Message)]
struct RecordView {
    #[prost(uint32, tag = "1")]
    format: u32,
    #[prost(bytes = "bytes", repeated, tag = "2")]
    relations: Vec<Bytes>,
    #[prost(oneof = "pb::record::Body", tags = "3, 4, 5, 6, 7")]
    body: Option<pb::record::Body>,
}

/// Turns the core model into record payloads, caching encoded relation
/// descriptors.
#[derive(Default)]
pub struct RecordEncoder {
    /// Keyed by the descriptor's address; the `Arc` kept in the value keeps
    /// the address from being reused.
    relations: HashMap<usize, (Arc<Relation>, Bytes), RandomState>,
    /// A record's relation list and their addresses, kept between records
    /// (emptied) so that each record does not allocate them anew.
    scratch: (Vec<Bytes>, Vec<usize>),
}

/// Descriptors cached before the cache starts over (schema changes create
/// new descriptors; old ones are not referenced again).
const RELATION_CACHE: usize = 4096;

/// Descriptors of one record looked up by a scan of their addresses, up to
/// this many: a record's changes are mostly of a few tables, and a scan of
/// a few is cheaper than hashing each change's (a map is built beyond).
const RELATIONS_SCANNED: usize = 16;

/// The relations of one record being built.
struct RecordRelations<'a> {
    encoder: &'a mut RecordEncoder,
    list: Vec<Bytes>,
    /// The descriptors' addresses, in `list`'s order.
    keys: Vec<usize>,
    /// Positions in `list` by address, once there are many.
    positions: Option<HashMap<usize, u32, RandomState>>,
}

impl RecordRelations<'_> {
    fn index(&mut self, relation: &Arc<Relation>) -> u32 {
        let key = Arc::as_ptr(relation) as usize;
        let known = match &self.positions {
            Some(positions) => positions.get(&key).copied(),
            None => self.keys.iter().position(|&k| k == key).map(|i| i as u32),
        };
        if let Some(i) = known {
            return i;
        }
        if self.encoder.relations.len() >= RELATION_CACHE
            && !self.encoder.relations.contains_key(&key)
        {
            self.encoder.relations.clear();
        }
        let encoded = &self
            .encoder
            .relations
            .entry(key)
            .or_insert_with(|| {
                (
                    relation.clone(),
                    Bytes::from(relation_to_pb(relation).encode_to_vec()),
                )
            })
            .1;
        let i = self.list.len() as u32;
        self.list.push(encoded.clone());
        self.keys.push(key);
        match &mut self.positions {
            Some(positions) => {
                positions.insert(key, i);
            }
            None if self.keys.len() > RELATIONS_SCANNED => {
                self.positions = Some(self.keys.iter().zip(0..).map(|(&k, i)| (k, i)).collect());
            }
            None => {}
        }
        i
    }
}

impl Drop for RecordRelations<'_> {
    fn drop(&mut self) {
        self.list.clear();
        self.keys.clear();
        self.encoder.scratch = (
            std::mem::take(&mut self.list),
            std::mem::take(&mut self.keys),
        );
    }
}

impl RecordEncoder {
    fn relations(&mut self) -> RecordRelations<'_> {
        let (list, keys) = std::mem::take(&mut self.scratch);
        RecordRelations {
            encoder: self,
            list,
            keys,
            positions: None,
        }
    }

    /// A transaction chunk.
    pub fn transaction(
        &mut self,
        info: &TransactionInfo,
        first: bool,
        last: bool,
        changes: &[Change],
    ) -> Vec<u8> {
        let info = transaction_to_pb(info).encode_to_vec();
        chunk::transaction(self.relations(), &info, first, last, changes)
    }

    /// Rows of the initial copy.
    pub fn snapshot(&mut self, batch: &SnapshotBatch) -> Vec<u8> {
        let mut relations = self.relations();
        relations.index(&batch.relation);
        let list = std::mem::take(&mut relations.list);
        let body = pb::record::Body::Snapshot(pb::SnapshotRows {
            consistent_point: batch.consistent_point.0,
            rows: Vec::new(),
            copy_text: batch.rows.text().clone(),
        });
        finish(list, body)
    }

    /// The end of the initial copy.
    pub fn snapshot_complete(&mut self, consistent_point: Lsn) -> Vec<u8> {
        finish(
            Vec::new(),
            pb::record::Body::SnapshotComplete(pb::SnapshotComplete {
                consistent_point: consistent_point.0,
            }),
        )
    }

    /// A non-transactional message.
    pub fn message(&mut self, message: &LogicalMessage) -> Vec<u8> {
        finish(
            Vec::new(),
            pb::record::Body::Message(message_to_pb(message)),
        )
    }

    /// The record of sequences' values.
    pub fn sequences(&mut self, values: &SequenceValues) -> Vec<u8> {
        finish(
            Vec::new(),
            pb::record::Body::Sequences(pb::Sequences {
                lsn: values.lsn.0,
                read_time: values.read_time.0,
                sequences: values
                    .sequences
                    .iter()
                    .map(|s| pb::Sequence {
                        schema: s.schema.clone(),
                        name: s.name.clone(),
                        last_value: s.last_value,
                    })
                    .collect(),
            }),
        )
    }
}

fn finish(relations: Vec<Bytes>, body: pb::record::Body) -> Vec<u8> {
    RecordView {
        format: FORMAT,
        relations,
        body: Some(body),
    }
    .encode_to_vec()
}

fn transaction_to_pb(info: &TransactionInfo) -> pb::Transaction {
    pb::Transaction {
        xid: info.xid,
        commit_lsn: info.commit_lsn.0,
        end_lsn: info.end_lsn.0,
        commit_time: info.commit_time.0,
        origin_name: info.origin.as_ref().map(|o| o.name.clone()),
        origin_lsn: info.origin.as_ref().map_or(0, |o| o.lsn.0),
        gid: info.gid.clone(),
        for_sink: info.for_sink.clone(),
    }
}

fn relation_to_pb(r: &Relation) -> pb::Relation {
    pb::Relation {
        id: r.id,
        schema: r.schema.clone(),
        name: r.name.clone(),
        replica_identity: u32::from(r.replica_identity.as_byte()),
        columns: r
            .columns
            .iter()
            .map(|c| pb::Column {
                name: c.name.clone(),
                type_oid: c.type_oid,
                type_modifier: c.type_modifier,
                type_name: c.type_name.clone(),
                kind: Some(kind_to_pb(&c.kind)),
                is_key: c.is_key,
                attnum: i32::from(c.attnum),
                not_null: c.not_null,
                missing_value: c.missing_value.clone(),
            })
            .collect(),
        partition_root: r.partition_root.as_ref().map(|t| pb::TableName {
            schema: t.schema.clone(),
            name: t.name.clone(),
        }),
        primary_key: r
            .primary_key
            .iter()
            .map(|&i| u32::try_from(i).unwrap_or(u32::MAX))
            .collect(),
    }
}

fn kind_to_pb(kind: &ValueKind) -> pb::ValueKind {
    use pb::value_kind::Scalar as S;
    let scalar = |s: S| pb::ValueKind {
        scalar: s as i32,
        element: None,
        delimiter: 0,
    };
    match kind {
        ValueKind::Bool => scalar(S::Bool),
        ValueKind::Int2 => scalar(S::Int2),
        ValueKind::Int4 => scalar(S::Int4),
        ValueKind::Int8 => scalar(S::Int8),
        ValueKind::Oid => scalar(S::Oid),
        ValueKind::Float4 => scalar(S::Float4),
        ValueKind::Float8 => scalar(S::Float8),
        ValueKind::Numeric => scalar(S::Numeric),
        ValueKind::Text => scalar(S::Text),
        ValueKind::Bytea => scalar(S::Bytea),
        ValueKind::Date => scalar(S::Date),
        ValueKind::Time => scalar(S::Time),
        ValueKind::TimeTz => scalar(S::TimeTz),
        ValueKind::Timestamp => scalar(S::Timestamp),
        ValueKind::TimestampTz => scalar(S::TimestampTz),
        ValueKind::Interval => scalar(S::Interval),
        ValueKind::Uuid => scalar(S::Uuid),
        ValueKind::Json => scalar(S::Json),
        ValueKind::Jsonb => scalar(S::Jsonb),
        ValueKind::Enum => scalar(S::Enum),
        ValueKind::Composite => scalar(S::Composite),
        ValueKind::Range => scalar(S::Range),
        ValueKind::Other => scalar(S::Other),
        ValueKind::Array { element, delimiter } => pb::ValueKind {
            scalar: S::Array as i32,
            element: Some(Box::new(kind_to_pb(element))),
            delimiter: u32::from(*delimiter),
        },
    }
}

fn datum_to_pb(d: &Datum) -> pb::Datum {
    use pb::datum::Value;
    pb::Datum {
        value: Some(match d {
            Datum::Null => Value::Null(true),
            Datum::UnchangedToast => Value::UnchangedToast(true),
            Datum::Text(b) => Value::Text(b.clone()),
            Datum::Binary(b) => Value::Binary(b.clone()),
        }),
    }
}

fn row_to_pb(row: &Row) -> pb::Row {
    pb::Row {
        values: row.iter().map(datum_to_pb).collect(),
    }
}

fn old_to_pb(old: &OldRow) -> pb::OldRow {
    pb::OldRow {
        full: old.kind == OldRowKind::Full,
        row: Some(row_to_pb(&old.row)),
    }
}

fn message_to_pb(m: &LogicalMessage) -> pb::Message {
    pb::Message {
        lsn: m.lsn.0,
        transactional: m.transactional,
        prefix: m.prefix.clone(),
        content: m.content.clone(),
    }
}

fn change_to_pb(change: &Change, relations: &mut RecordRelations<'_>) -> pb::Change {
    use pb::change::Kind;
    let kind = match change {
        Change::Insert { relation, new, .. } => Kind::Insert(pb::Insert {
            relation: relations.index(relation),
            new: Some(row_to_pb(new)),
        }),
        Change::Read { relation, new, .. } => Kind::Read(pb::Insert {
            relation: relations.index(relation),
            new: Some(row_to_pb(new)),
        }),
        Change::Update {
            relation, old, new, ..
        } => Kind::Update(pb::Update {
            relation: relations.index(relation),
            old: old.as_ref().map(old_to_pb),
            new: Some(row_to_pb(new)),
        }),
        Change::Delete { relation, old, .. } => Kind::Delete(pb::Delete {
            relation: relations.index(relation),
            old: Some(old_to_pb(old)),
        }),
        Change::Truncate(t) => Kind::Truncate(pb::Truncate {
            relations: t.relations.iter().map(|r| relations.index(r)).collect(),
            cascade: t.options.cascade,
            restart_identity: t.options.restart_identity,
        }),
        Change::Message(m) => Kind::Message(message_to_pb(m)),
        Change::ReadRange(r) => {
            let key = |values: &Vec<String>| pb::Key {
                values: values.clone(),
            };
            Kind::ReadRange(pb::ReadRange {
                relation: relations.index(&r.relation),
                key: r
                    .key
                    .iter()
                    .map(|(index, order)| pb::KeyColumn {
                        index: *index as u32,
                        order: match order {
                            KeyOrder::Value => 0,
                            KeyOrder::Bytes => 1,
                            KeyOrder::TextForm => 2,
                        },
                    })
                    .collect(),
                after: r.after.as_ref().map(key),
                up_to: r.up_to.as_ref().map(key),
                keys: r.keys.iter().map(key).collect(),
            })
        }
    };
    pb::Change {
        lsn: change.lsn().0,
        kind: Some(kind),
    }
}

/// Decodes record payloads, caching the relation descriptors it has seen
/// (a table's descriptor is decoded once, and its rows share one `Arc`).
#[derive(Debug, Default)]
pub struct RecordDecoder {
    relations: HashMap<Bytes, Arc<Relation>, RandomState>,
}

impl RecordDecoder {
    /// Decodes a record payload (zero-copy: column values share `payload`).
    pub fn decode(&mut self, payload: Bytes) -> Result<Entry, RecordError> {
        let record = RecordView::decode(payload)?;
        if record.format > FORMAT {
            return Err(RecordError::Format(record.format));
        }
        if self.relations.len() >= RELATION_CACHE {
            self.relations.clear();
        }
        let relations = record
            .relations
            .into_iter()
            .map(|bytes| match self.relations.get(&bytes) {
                Some(r) => Ok(r.clone()),
                None => {
                    let r = Arc::new(relation_from_pb(pb::Relation::decode(bytes.clone())?)?);
                    self.relations.insert(bytes, r.clone());
                    Ok(r)
                }
            })
            .collect::<Result<Vec<_>, RecordError>>()?;
        decode_body(record.body, &relations)
    }
}

/// Decodes one record payload without a cache.
pub fn decode(payload: Bytes) -> Result<Entry, RecordError> {
    RecordDecoder::default().decode(payload)
}

fn decode_body(
    body: Option<pb::record::Body>,
    relations: &[Arc<Relation>],
) -> Result<Entry, RecordError> {
    let relation = |i: u32| {
        relations
            .get(i as usize)
            .cloned()
            .ok_or(RecordError::Invalid(
                "a change refers to a missing relation",
            ))
    };
    Ok(match body {
        None => return Err(RecordError::Invalid("record without a body")),
        Some(pb::record::Body::Transaction(t)) => {
            let info = t
                .info
                .ok_or(RecordError::Invalid("transaction without its description"))?;
            let changes = t
                .changes
                .into_iter()
                .map(|c| change_from_pb(c, &relation))
                .collect::<Result<_, _>>()?;
            Entry::Transaction {
                info: Arc::new(transaction_from_pb(info)),
                first: t.first,
                last: t.last,
                changes,
            }
        }
        Some(pb::record::Body::Snapshot(s)) => {
            let rows = if s.rows.is_empty() {
                CopyText::new(s.copy_text)?
            } else {
                // Format 1.
                let rows: Vec<Row> = s
                    .rows
                    .into_iter()
                    .map(row_from_pb)
                    .collect::<Result<_, _>>()?;
                CopyText::from_rows(&rows)?
            };
            Entry::Snapshot(SnapshotBatch {
                relation: relation(0)?,
                rows,
                consistent_point: Lsn(s.consistent_point),
            })
        }
        Some(pb::record::Body::SnapshotComplete(s)) => Entry::SnapshotComplete {
            consistent_point: Lsn(s.consistent_point),
        },
        Some(pb::record::Body::Message(m)) => Entry::Message(message_from_pb(m)),
        Some(pb::record::Body::Sequences(s)) => Entry::Sequences(SequenceValues {
            lsn: Lsn(s.lsn),
            read_time: PgTimestamp(s.read_time),
            sequences: s
                .sequences
                .into_iter()
                .map(|q| SequenceValue {
                    schema: q.schema,
                    name: q.name,
                    last_value: q.last_value,
                })
                .collect(),
        }),
    })
}

fn transaction_from_pb(t: pb::Transaction) -> TransactionInfo {
    TransactionInfo {
        xid: t.xid,
        commit_lsn: Lsn(t.commit_lsn),
        end_lsn: Lsn(t.end_lsn),
        commit_time: PgTimestamp(t.commit_time),
        origin: t.origin_name.map(|name| Origin {
            name,
            lsn: Lsn(t.origin_lsn),
        }),
        gid: t.gid,
        for_sink: t.for_sink,
    }
}

fn relation_from_pb(r: pb::Relation) -> Result<Relation, RecordError> {
    let replica_identity = u8::try_from(r.replica_identity)
        .ok()
        .and_then(ReplicaIdentity::from_byte)
        .ok_or(RecordError::Invalid("unknown replica identity"))?;
    Ok(Relation {
        id: r.id,
        schema: r.schema,
        name: r.name,
        replica_identity,
        columns: r
            .columns
            .into_iter()
            .map(|c| Column {
                name: c.name,
                type_oid: c.type_oid,
                type_modifier: c.type_modifier,
                type_name: c.type_name,
                kind: c.kind.map_or(ValueKind::Other, kind_from_pb),
                is_key: c.is_key,
                attnum: i16::try_from(c.attnum).unwrap_or(0),
                not_null: c.not_null,
                missing_value: c.missing_value,
            })
            .collect(),
        partition_root: r.partition_root.map(|t| TableName {
            schema: t.schema,
            name: t.name,
        }),
        primary_key: r.primary_key.into_iter().map(|i| i as usize).collect(),
    })
}

fn kind_from_pb(k: pb::ValueKind) -> ValueKind {
    use pb::value_kind::Scalar as S;
    // An unknown scalar (from a newer format) degrades to text rendering.
    match S::try_from(k.scalar).unwrap_or(S::Other) {
        S::Other => ValueKind::Other,
        S::Bool => ValueKind::Bool,
        S::Int2 => ValueKind::Int2,
        S::Int4 => ValueKind::Int4,
        S::Int8 => ValueKind::Int8,
        S::Oid => ValueKind::Oid,
        S::Float4 => ValueKind::Float4,
        S::Float8 => ValueKind::Float8,
        S::Numeric => ValueKind::Numeric,
        S::Text => ValueKind::Text,
        S::Bytea => ValueKind::Bytea,
        S::Date => ValueKind::Date,
        S::Time => ValueKind::Time,
        S::TimeTz => ValueKind::TimeTz,
        S::Timestamp => ValueKind::Timestamp,
        S::TimestampTz => ValueKind::TimestampTz,
        S::Interval => ValueKind::Interval,
        S::Uuid => ValueKind::Uuid,
        S::Json => ValueKind::Json,
        S::Jsonb => ValueKind::Jsonb,
        S::Enum => ValueKind::Enum,
        S::Composite => ValueKind::Composite,
        S::Range => ValueKind::Range,
        S::Array => ValueKind::Array {
            element: Box::new(k.element.map_or(ValueKind::Other, |e| kind_from_pb(*e))),
            delimiter: u8::try_from(k.delimiter).unwrap_or(b','),
        },
    }
}

fn row_from_pb(row: pb::Row) -> Result<Row, RecordError> {
    use pb::datum::Value;
    row.values
        .into_iter()
        .map(|d| match d.value {
            Some(Value::Null(_)) => Ok(Datum::Null),
            Some(Value::UnchangedToast(_)) => Ok(Datum::UnchangedToast),
            Some(Value::Text(b)) => Ok(Datum::Text(b)),
            Some(Value::Binary(b)) => Ok(Datum::Binary(b)),
            None => Err(RecordError::Invalid("column value of unknown kind")),
        })
        .collect()
}

fn old_from_pb(old: pb::OldRow) -> Result<OldRow, RecordError> {
    Ok(OldRow {
        kind: if old.full {
            OldRowKind::Full
        } else {
            OldRowKind::Key
        },
        row: row_from_pb(old.row.unwrap_or_default())?,
    })
}

fn message_from_pb(m: pb::Message) -> LogicalMessage {
    LogicalMessage {
        lsn: Lsn(m.lsn),
        transactional: m.transactional,
        prefix: m.prefix,
        content: m.content,
    }
}

fn change_from_pb(
    change: pb::Change,
    relation: &impl Fn(u32) -> Result<Arc<Relation>, RecordError>,
) -> Result<Change, RecordError> {
    use pb::change::Kind;
    let lsn = Lsn(change.lsn);
    Ok(
        match change
            .kind
            .ok_or(RecordError::Invalid("change of unknown kind"))?
        {
            Kind::Insert(i) => Change::Insert {
                lsn,
                relation: relation(i.relation)?,
                new: row_from_pb(i.new.unwrap_or_default())?,
            },
            Kind::ReadRange(r) => {
                let relation = relation(r.relation)?;
                let columns = relation.columns.len();
                Change::ReadRange(ReadRange {
                    lsn,
                    relation,
                    key: r
                        .key
                        .into_iter()
                        .map(|k| {
                            if k.index as usize >= columns {
                                return Err(RecordError::Invalid("key column out of range"));
                            }
                            let order = match k.order {
                                0 => KeyOrder::Value,
                                1 => KeyOrder::Bytes,
                                2 => KeyOrder::TextForm,
                                _ => {
                                    return Err(RecordError::Invalid(
                                        "key column of unknown order",
                                    ));
                                }
                            };
                            Ok((k.index as usize, order))
                        })
                        .collect::<Result<_, _>>()?,
                    after: r.after.map(|k| k.values),
                    up_to: r.up_to.map(|k| k.values),
                    keys: r.keys.into_iter().map(|k| k.values).collect(),
                })
            }
            Kind::Read(r) => Change::Read {
                lsn,
                relation: relation(r.relation)?,
                new: row_from_pb(r.new.unwrap_or_default())?,
            },
            Kind::Update(u) => Change::Update {
                lsn,
                relation: relation(u.relation)?,
                old: u.old.map(old_from_pb).transpose()?,
                new: row_from_pb(u.new.unwrap_or_default())?,
            },
            Kind::Delete(d) => Change::Delete {
                lsn,
                relation: relation(d.relation)?,
                old: old_from_pb(d.old.unwrap_or_default())?,
            },
            Kind::Truncate(t) => Change::Truncate(Truncate {
                lsn,
                relations: t
                    .relations
                    .into_iter()
                    .map(relation)
                    .collect::<Result<_, _>>()?,
                options: TruncateOptions {
                    cascade: t.cascade,
                    restart_identity: t.restart_identity,
                },
            }),
            Kind::Message(m) => Change::Message(message_from_pb(m)),
        },
    )
}

#[cfg(test)]
mod tests;
