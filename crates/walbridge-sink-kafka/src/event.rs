//! From the log's events to Kafka messages: which topic, which key, which
//! Debezium-style event, independent of how it is encoded.
//!
//! * snapshot rows, and rows read while streaming (a new table, a
//!   re-sync), are `op = "r"`, inserts `c`, updates `u`, deletes `d`
//!   (followed by a tombstone unless `tombstones = false`);
//! * an update that changes the key is a delete of the old key (and its
//!   tombstone) followed by a create of the new one, so compaction keeps
//!   the right row under each key;
//! * a truncate is an event with a null key on each truncated table's
//!   topic (unless `truncate_events = false`);
//! * logical decoding messages go to `message_topic` when there is one,
//!   sequences' values to `sequence_topic`;
//! * with `transaction_topic`, a BEGIN and an END record frame every
//!   source transaction and each event carries its place in it.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use walbridge_core::{
    Change, Datum, LogicalMessage, Lsn, OldRow, OldRowKind, PgTimestamp, Relation, ReplicaIdentity,
    Row, SequenceValues, SnapshotBatch, TransactionInfo, update_new_row,
};

use crate::config::KafkaSinkConfig;
use crate::encode::Encoder;
use crate::error::SinkError;
use crate::topic::TopicNamer;

/// Debezium's operation codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// A snapshot row (`r`).
    Read,
    /// An insert (`c`).
    Create,
    /// An update (`u`).
    Update,
    /// A delete (`d`).
    Delete,
    /// A truncate (`t`).
    Truncate,
    /// A logical decoding message (`m`).
    Message,
}

impl Op {
    /// The one-letter code of the `op` field.
    pub fn code(self) -> &'static str {
        match self {
            Op::Read => "r",
            Op::Create => "c",
            Op::Update => "u",
            Op::Delete => "d",
            Op::Truncate => "t",
            Op::Message => "m",
        }
    }
}

/// The envelope's `source` block: where and when the change was made.
pub use walbridge_sink::SourceBlock;

/// The envelope's `transaction` block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransactionBlock {
    /// `xid:commit_lsn` (commit LSN as a number), unique per source.
    pub id: String,
    /// Position of the event among all events of the transaction, from 1.
    pub total_order: u64,
    /// Position among the transaction's events of the same table, from 1.
    pub data_collection_order: u64,
}

/// A row as one of the envelope's images.
#[derive(Clone, Debug)]
pub struct RowImage<'a> {
    /// One value per relation column.
    pub row: Cow<'a, Row>,
    /// Only the replica-identity columns are known (the old image of a
    /// DEFAULT or INDEX identity): other columns are written as null.
    pub only_keys: bool,
}

/// One change event, before it is encoded.
#[derive(Clone, Debug)]
pub struct ChangeEvent<'a> {
    /// What happened.
    pub op: Op,
    /// The table, as described when the change was made.
    pub relation: &'a Relation,
    /// The row before the change.
    pub before: Option<RowImage<'a>>,
    /// The row after the change.
    pub after: Option<RowImage<'a>>,
    /// Where it happened.
    pub source: SourceBlock<'a>,
    /// Its place in its transaction (with `transaction_topic`).
    pub transaction: Option<TransactionBlock>,
}

/// A record of the transaction-metadata topic.
#[derive(Clone, Debug)]
pub struct TransactionRecord<'a> {
    /// BEGIN or END.
    pub status: TransactionStatus,
    /// As in [`TransactionBlock::id`].
    pub id: &'a str,
    /// Events of the transaction (END only).
    pub event_count: Option<u64>,
    /// Events per table, `schema.table` (END only).
    pub data_collections: Option<&'a BTreeMap<String, u64>>,
    /// Commit time, milliseconds since the Unix epoch.
    pub ts_ms: i64,
}

/// Which end of a transaction a metadata record marks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransactionStatus {
    /// The transaction's first record.
    Begin,
    /// The transaction's last record.
    End,
}

/// The message key columns of a table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyColumns(pub Vec<usize>);

/// A message ready to be produced.
#[derive(Clone, Debug)]
pub struct Outgoing {
    /// The topic.
    pub topic: String,
    /// The source table (`schema.table`) or `-`, for error messages.
    pub table: String,
    /// The encoded key; `None` is a null key.
    pub key: Option<Vec<u8>>,
    /// The encoded value; `None` is a tombstone.
    pub value: Option<Vec<u8>>,
    /// WAL position, for the `walbridge.lsn` header.
    pub lsn: Lsn,
    /// Transaction id, for the `walbridge.xid` header.
    pub xid: Option<u32>,
}

/// What a source is in the middle of.
#[derive(Default)]
struct SourceState {
    transaction: Option<Arc<TransactionInfo>>,
    /// Events of the open transaction so far, in all and per table.
    total: u64,
    per_table: BTreeMap<String, u64>,
}

/// Turns the events of every source into [`Outgoing`] messages.
pub struct Emitter {
    namer: TopicNamer,
    encoder: Encoder,
    key_columns: BTreeMap<String, Vec<String>>,
    tombstones: bool,
    truncate_events: bool,
    message_topic: Option<String>,
    sequence_topic: Option<String>,
    transaction_topic: Option<String>,
    sources: HashMap<String, SourceState>,
}

/// Which source an event comes from.
#[derive(Clone, Copy, Debug)]
pub struct SourceRef<'a> {
    /// The source's name.
    pub source: &'a str,
    /// Its publisher's database.
    pub database: &'a str,
}

impl Emitter {
    /// An emitter for the sink configured by `config`.
    pub fn new(config: &KafkaSinkConfig) -> Result<Self, SinkError> {
        Ok(Emitter {
            namer: TopicNamer::new(&config.topic)?,
            encoder: Encoder::new(config)?,
            key_columns: config.key_columns.clone(),
            tombstones: config.tombstones,
            truncate_events: config.truncate_events,
            message_topic: config.message_topic.clone(),
            sequence_topic: config.sequence_topic.clone(),
            transaction_topic: config.transaction_topic.clone(),
            sources: HashMap::new(),
        })
    }

    /// The key columns of `relation`: configured ones, else its replica
    /// identity (DEFAULT or INDEX), else its primary key (FULL marks every
    /// column as identity, which would make every update a key change; a
    /// NOTHING table may still have one).
    fn key_columns(&self, relation: &Relation) -> Result<Option<KeyColumns>, SinkError> {
        // Most sinks configure none: no table name to build per change.
        let configured = if self.key_columns.is_empty() {
            None
        } else {
            let table = table_name(relation);
            self.key_columns.get(&table).map(|names| (table, names))
        };
        if let Some((table, names)) = configured {
            let indexes = names
                .iter()
                .map(|name| {
                    relation
                        .columns
                        .iter()
                        .position(|c| &c.name == name)
                        .ok_or_else(|| {
                            SinkError::Config(format!(
                                "`key_columns` for {table} names column `{name}`, which the table does not publish"
                            ))
                        })
                })
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(Some(KeyColumns(indexes)));
        }
        Ok(match relation.replica_identity {
            ReplicaIdentity::Default | ReplicaIdentity::Index => {
                let keys: Vec<usize> = relation.key_columns().collect();
                (!keys.is_empty()).then_some(KeyColumns(keys))
            }
            ReplicaIdentity::Full | ReplicaIdentity::Nothing => {
                (!relation.primary_key.is_empty()).then(|| KeyColumns(relation.primary_key.clone()))
            }
        })
    }

    fn table_topic(&self, source: &str, relation: &Relation) -> Result<String, SinkError> {
        self.namer.topic(source, &relation.schema, &relation.name)
    }

    /// The messages of a batch of snapshot rows.
    pub async fn snapshot(
        &mut self,
        from: SourceRef<'_>,
        batch: &SnapshotBatch,
        out: &mut Vec<Outgoing>,
    ) -> Result<(), SinkError> {
        let relation = &batch.relation;
        let topic = self.table_topic(from.source, relation)?;
        let keys = self.key_columns(relation)?;
        let ts_us = PgTimestamp::now().unix_micros();
        for row in batch.rows.rows(relation.columns.len()) {
            let row = row.map_err(|e| SinkError::Encode {
                table: table_name(relation),
                reason: format!("snapshot rows in the log: {e}"),
            })?;
            let event = ChangeEvent {
                op: Op::Read,
                relation,
                before: None,
                after: Some(new_image(Cow::Borrowed(&row))),
                source: SourceBlock {
                    name: from.source,
                    database: from.database,
                    schema: Some(&relation.schema),
                    table: Some(&relation.name),
                    lsn: batch.consistent_point,
                    commit_lsn: None,
                    xid: None,
                    ts_us,
                    snapshot: true,
                },
                transaction: None,
            };
            let key = match &keys {
                Some(k) => Some(self.encoder.key(&topic, relation, k, &row).await?),
                None => None,
            };
            out.push(Outgoing {
                value: Some(self.encoder.change(&topic, &event).await?),
                topic: topic.clone(),
                table: table_name(relation),
                key,
                lsn: batch.consistent_point,
                xid: None,
            });
        }
        Ok(())
    }

    /// A source transaction begins.
    pub async fn begin(
        &mut self,
        from: SourceRef<'_>,
        info: Arc<TransactionInfo>,
        out: &mut Vec<Outgoing>,
    ) -> Result<(), SinkError> {
        if let Some(topic) = self.transaction_topic.clone() {
            let id = transaction_id(&info);
            let record = TransactionRecord {
                status: TransactionStatus::Begin,
                id: &id,
                event_count: None,
                data_collections: None,
                ts_ms: info.commit_time.unix_micros().div_euclid(1000),
            };
            out.push(
                self.transaction_message(&topic, from, &info, &record)
                    .await?,
            );
        }
        let state = self.sources.entry(from.source.to_owned()).or_default();
        state.transaction = Some(info);
        state.total = 0;
        state.per_table.clear();
        Ok(())
    }

    /// A source transaction commits.
    pub async fn commit(
        &mut self,
        from: SourceRef<'_>,
        out: &mut Vec<Outgoing>,
    ) -> Result<(), SinkError> {
        let Some(state) = self.sources.get_mut(from.source) else {
            return Ok(());
        };
        let Some(info) = state.transaction.take() else {
            return Ok(());
        };
        let per_table = std::mem::take(&mut state.per_table);
        let total = state.total;
        if let Some(topic) = self.transaction_topic.clone() {
            let id = transaction_id(&info);
            let record = TransactionRecord {
                status: TransactionStatus::End,
                id: &id,
                event_count: Some(total),
                data_collections: Some(&per_table),
                ts_ms: info.commit_time.unix_micros().div_euclid(1000),
            };
            out.push(
                self.transaction_message(&topic, from, &info, &record)
                    .await?,
            );
        }
        Ok(())
    }

    async fn transaction_message(
        &mut self,
        topic: &str,
        from: SourceRef<'_>,
        info: &TransactionInfo,
        record: &TransactionRecord<'_>,
    ) -> Result<Outgoing, SinkError> {
        Ok(Outgoing {
            topic: topic.to_owned(),
            table: "-".into(),
            key: Some(
                self.encoder
                    .transaction_key(topic, from.source, record.id)
                    .await?,
            ),
            value: Some(self.encoder.transaction(topic, from.source, record).await?),
            lsn: info.commit_lsn,
            xid: Some(info.xid),
        })
    }

    /// A logical decoding message, inside a transaction or not.
    pub async fn message(
        &mut self,
        from: SourceRef<'_>,
        message: &LogicalMessage,
        out: &mut Vec<Outgoing>,
    ) -> Result<(), SinkError> {
        let Some(topic) = self.message_topic.clone() else {
            tracing::debug!(
                prefix = message.prefix,
                "logical decoding message not sent: no `message_topic`"
            );
            return Ok(());
        };
        let transaction = self
            .sources
            .get(from.source)
            .and_then(|s| s.transaction.clone())
            .filter(|_| message.transactional);
        let source = self.source_block(from, None, message.lsn, transaction.as_deref());
        out.push(Outgoing {
            table: "-".into(),
            key: Some(self.encoder.message_key(&topic, &message.prefix).await?),
            value: Some(self.encoder.message(&topic, &source, message).await?),
            topic,
            lsn: message.lsn,
            xid: transaction.map(|t| t.xid),
        });
        Ok(())
    }

    /// An event per sequence to `sequence_topic`, when there is one.
    pub async fn sequences(
        &mut self,
        from: SourceRef<'_>,
        values: &SequenceValues,
        out: &mut Vec<Outgoing>,
    ) -> Result<(), SinkError> {
        let Some(topic) = self.sequence_topic.clone() else {
            return Ok(());
        };
        let mut source = self.source_block(from, None, values.lsn, None);
        source.ts_us = values.read_time.unix_micros();
        for sequence in &values.sequences {
            out.push(Outgoing {
                table: "-".into(),
                key: Some(self.encoder.sequence_key(&topic, sequence).await?),
                value: Some(self.encoder.sequence(&topic, &source, sequence).await?),
                topic: topic.clone(),
                lsn: values.lsn,
                xid: None,
            });
        }
        Ok(())
    }

    fn source_block<'a>(
        &self,
        from: SourceRef<'a>,
        relation: Option<&'a Relation>,
        lsn: Lsn,
        transaction: Option<&TransactionInfo>,
    ) -> SourceBlock<'a> {
        SourceBlock::new(from.source, from.database, relation, lsn, transaction)
    }

    /// Counts an event of `relation` in its source's transaction and
    /// returns its place, when transaction metadata is on.
    fn place(&mut self, source: &str, relation: &Relation) -> Option<TransactionBlock> {
        self.transaction_topic.as_ref()?;
        let state = self.sources.get_mut(source)?;
        let info = state.transaction.as_ref()?;
        state.total += 1;
        let per_table = state.per_table.entry(table_name(relation)).or_default();
        *per_table += 1;
        Some(TransactionBlock {
            id: transaction_id(info),
            total_order: state.total,
            data_collection_order: *per_table,
        })
    }

    /// The messages of one change.
    pub async fn change(
        &mut self,
        from: SourceRef<'_>,
        change: &Change,
        out: &mut Vec<Outgoing>,
    ) -> Result<(), SinkError> {
        let transaction = self
            .sources
            .get(from.source)
            .and_then(|s| s.transaction.clone());
        let (relation, rows) = match change {
            Change::Insert { lsn, relation, new } | Change::Read { lsn, relation, new } => (
                relation,
                vec![RowChange {
                    op: if matches!(change, Change::Read { .. }) {
                        Op::Read
                    } else {
                        Op::Create
                    },
                    lsn: *lsn,
                    before: None,
                    after: Some(new_image(Cow::Borrowed(new))),
                }],
            ),
            Change::Update {
                lsn,
                relation,
                old,
                new,
            } => {
                let new_row = update_new_row(new, old.as_ref());
                let key_changed = match (old, self.key_columns(relation)?) {
                    (Some(old), Some(keys)) => key_differs(&keys, &old.row, &new_row),
                    _ => false,
                };
                let before = old.as_ref().map(old_image);
                let after = Some(new_image(new_row));
                let rows = if key_changed {
                    vec![
                        RowChange {
                            op: Op::Delete,
                            lsn: *lsn,
                            before,
                            after: None,
                        },
                        RowChange {
                            op: Op::Create,
                            lsn: *lsn,
                            before: None,
                            after,
                        },
                    ]
                } else {
                    vec![RowChange {
                        op: Op::Update,
                        lsn: *lsn,
                        before,
                        after,
                    }]
                };
                (relation, rows)
            }
            Change::Delete { lsn, relation, old } => (
                relation,
                vec![RowChange {
                    op: Op::Delete,
                    lsn: *lsn,
                    before: Some(old_image(old)),
                    after: None,
                }],
            ),
            Change::Truncate(truncate) => {
                if !self.truncate_events {
                    return Ok(());
                }
                for relation in &truncate.relations {
                    let topic = self.table_topic(from.source, relation)?;
                    let event = ChangeEvent {
                        op: Op::Truncate,
                        relation,
                        before: None,
                        after: None,
                        transaction: self.place(from.source, relation),
                        source: self.source_block(
                            from,
                            Some(relation),
                            truncate.lsn,
                            transaction.as_deref(),
                        ),
                    };
                    out.push(Outgoing {
                        value: Some(self.encoder.change(&topic, &event).await?),
                        topic,
                        table: table_name(relation),
                        key: None,
                        lsn: truncate.lsn,
                        xid: transaction.as_ref().map(|t| t.xid),
                    });
                }
                return Ok(());
            }
            Change::Message(message) => return self.message(from, message, out).await,
            // Consumers get a re-sync's rows as reads; what a target should
            // delete is not an event.
            Change::ReadRange(_) => return Ok(()),
        };
        for row in rows {
            self.row_event(from, transaction.as_deref(), relation, row, out)
                .await?;
        }
        Ok(())
    }

    /// An insert, update or delete event (a delete with its tombstone).
    async fn row_event(
        &mut self,
        from: SourceRef<'_>,
        transaction: Option<&TransactionInfo>,
        relation: &Relation,
        row: RowChange<'_>,
        out: &mut Vec<Outgoing>,
    ) -> Result<(), SinkError> {
        let RowChange {
            op,
            lsn,
            before,
            after,
        } = row;
        let topic = self.table_topic(from.source, relation)?;
        let keys = self.key_columns(relation)?;
        let key_row = after.as_ref().or(before.as_ref()).map(|image| &image.row);
        let key = match (&keys, key_row) {
            (Some(keys), Some(row)) => Some(self.encoder.key(&topic, relation, keys, row).await?),
            _ => None,
        };
        let event = ChangeEvent {
            op,
            relation,
            before,
            after,
            transaction: self.place(from.source, relation),
            source: self.source_block(from, Some(relation), lsn, transaction),
        };
        let value = self.encoder.change(&topic, &event).await?;
        let xid = transaction.map(|t| t.xid);
        let tombstone = op == Op::Delete && self.tombstones && key.is_some();
        out.push(Outgoing {
            topic: topic.clone(),
            table: table_name(relation),
            key: key.clone(),
            value: Some(value),
            lsn,
            xid,
        });
        if tombstone {
            out.push(Outgoing {
                topic,
                table: table_name(relation),
                key,
                value: None,
                lsn,
                xid,
            });
        }
        Ok(())
    }
}

/// What [`Emitter::row_event`] writes.
struct RowChange<'a> {
    op: Op,
    lsn: Lsn,
    before: Option<RowImage<'a>>,
    after: Option<RowImage<'a>>,
}

/// `schema.table`.
pub fn table_name(relation: &Relation) -> String {
    format!("{}.{}", relation.schema, relation.name)
}

fn transaction_id(info: &TransactionInfo) -> String {
    format!("{}:{}", info.xid, info.commit_lsn.0)
}

fn new_image(row: Cow<'_, Row>) -> RowImage<'_> {
    RowImage {
        row,
        only_keys: false,
    }
}

fn old_image(old: &OldRow) -> RowImage<'_> {
    RowImage {
        row: Cow::Borrowed(&old.row),
        only_keys: old.kind == OldRowKind::Key,
    }
}

/// True when a key column's value differs between the old and new row
/// (an unchanged TOASTed key value has not changed).
fn key_differs(keys: &KeyColumns, old: &Row, new: &Row) -> bool {
    keys.0.iter().any(|&i| match (old.get(i), new.get(i)) {
        (Some(_), Some(Datum::UnchangedToast)) => false,
        (o, n) => o != n,
    })
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn text(s: &str) -> Datum {
        Datum::Text(Bytes::copy_from_slice(s.as_bytes()))
    }

    #[test]
    fn key_changes_ignore_unchanged_toast() {
        let keys = KeyColumns(vec![0]);
        assert!(!key_differs(
            &keys,
            &vec![text("1"), text("a")],
            &vec![text("1"), text("b")]
        ));
        assert!(key_differs(&keys, &vec![text("1")], &vec![text("2")]));
        assert!(!key_differs(
            &keys,
            &vec![text("1")],
            &vec![Datum::UnchangedToast]
        ));
    }
}
