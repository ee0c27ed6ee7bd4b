//! Log entries as feed messages, for one session: which relations it has
//! described (and with which columns), and what its filter lets through.
//!
//! A relation is described before the first message that refers to it,
//! and again whenever the descriptor a record carries differs from the one
//! described (a column added, say): the log's records are self-contained,
//! so the descriptor at hand is always the one its rows were written with.

use std::collections::HashMap;
use std::sync::Arc;

use walbridge_core::{
    Change, Datum, LogicalMessage, Lsn, OldRow, Relation, ReplicaIdentity, Row, SequenceValues,
    TransactionInfo, update_new_row,
};

use crate::filter::Filter;
use crate::pb::{self, subscribe_response::Event};
use crate::value::value;

/// The most rows one `Rows` message carries (and about the most bytes of
/// text they are made of), far below gRPC's usual 4 MiB message limit.
const ROWS_PER_MESSAGE: usize = 500;
const ROW_BYTES_PER_MESSAGE: usize = 1 << 20;

/// A relation as described to the session.
struct Described {
    number: u32,
    relation: Arc<Relation>,
    /// The relation's columns sent, in order.
    columns: Vec<usize>,
}

/// Turns log entries into a session's messages.
pub(crate) struct Encoder {
    filter: Filter,
    text_values: bool,
    /// By source (its index in the session) and publisher OID.
    described: HashMap<(usize, u32), Described>,
    next_number: u32,
}

/// A transaction in progress in a session.
#[derive(Default)]
pub(crate) struct Transaction {
    /// Its `begin`, until a change passes the filter and it is sent.
    began: bool,
    /// The next change's place in the transaction.
    sequence: u64,
}

impl Transaction {
    /// Passes over a change another group member receives: it keeps its
    /// place in the transaction, so event ids are the same for everyone.
    pub fn skip(&mut self) {
        self.sequence += 1;
    }
}

fn lsn_text(lsn: Lsn) -> String {
    lsn.to_string()
}

fn event_id(source: &str, lsn: Lsn, sequence: u64) -> pb::EventId {
    pb::EventId {
        source: source.to_owned(),
        lsn: lsn_text(lsn),
        sequence,
    }
}

fn response(event: Event) -> pb::SubscribeResponse {
    pb::SubscribeResponse { event: Some(event) }
}

impl Encoder {
    pub fn new(filter: Filter, text_values: bool) -> Encoder {
        Encoder {
            filter,
            text_values,
            described: HashMap::new(),
            next_number: 1,
        }
    }

    /// The session's number for `relation`, describing it into `out` first
    /// when it is new or changed; `None` when the filter leaves it out.
    fn describe(
        &mut self,
        source: (usize, &str),
        relation: &Arc<Relation>,
        out: &mut Vec<pb::SubscribeResponse>,
    ) -> Option<u32> {
        if !self.filter.table(relation) {
            return None;
        }
        let key = (source.0, relation.id);
        let number = match self.described.get(&key) {
            Some(d) if Arc::ptr_eq(&d.relation, relation) || *d.relation == **relation => {
                return Some(d.number);
            }
            Some(d) => d.number,
            None => {
                self.next_number += 1;
                self.next_number - 1
            }
        };
        let columns = self.filter.columns(relation);
        // The primary key only when every column of it is sent.
        let primary_key = relation
            .primary_key
            .iter()
            .map(|k| columns.iter().position(|c| c == k).map(|i| i as u32))
            .collect::<Option<Vec<u32>>>()
            .unwrap_or_default();
        out.push(response(Event::Relation(pb::RelationDescription {
            relation: number,
            source: source.1.to_owned(),
            schema: relation.schema.clone(),
            table: relation.name.clone(),
            oid: relation.id,
            columns: columns
                .iter()
                .filter_map(|&i| relation.columns.get(i))
                .map(|c| pb::Column {
                    name: c.name.clone(),
                    type_oid: c.type_oid,
                    type_name: c.type_display(),
                    key: c.is_key,
                    type_modifier: c.type_modifier,
                })
                .collect(),
            partition_root: relation
                .partition_root
                .as_ref()
                .map(|t| format!("{}.{}", t.schema, t.name))
                .unwrap_or_default(),
            replica_identity: match relation.replica_identity {
                ReplicaIdentity::Default => "default",
                ReplicaIdentity::Nothing => "nothing",
                ReplicaIdentity::Full => "full",
                ReplicaIdentity::Index => "index",
            }
            .to_owned(),
            primary_key,
        })));
        self.described.insert(
            key,
            Described {
                number,
                relation: relation.clone(),
                columns,
            },
        );
        Some(number)
    }

    fn row(&self, source: usize, relation: &Relation, row: &Row) -> pb::Row {
        let columns = self
            .described
            .get(&(source, relation.id))
            .map(|d| d.columns.as_slice())
            .unwrap_or_default();
        pb::Row {
            values: columns
                .iter()
                .filter_map(|&i| Some((relation.columns.get(i)?, row.get(i)?)))
                .map(|(column, datum)| value(datum, &column.kind, self.text_values))
                .collect(),
        }
    }

    /// One change of `info`'s transaction into `out`, its `begin` first if
    /// it is the first to pass the filter.
    pub fn change(
        &mut self,
        source: (usize, &str),
        info: &TransactionInfo,
        transaction: &mut Transaction,
        change: &Change,
        out: &mut Vec<pb::SubscribeResponse>,
    ) {
        let sequence = transaction.sequence;
        transaction.sequence += 1;
        let start = out.len();
        let Some(encoded) = self.encode_change(source, change, out) else {
            return;
        };
        if !transaction.began {
            transaction.began = true;
            out.insert(
                start,
                response(Event::Begin(pb::Begin {
                    source: source.1.to_owned(),
                    xid: info.xid,
                    commit_lsn: lsn_text(info.commit_lsn),
                    commit_time: Some(timestamp(info.commit_time.unix_micros())),
                    origin: info
                        .origin
                        .as_ref()
                        .map(|o| o.name.clone())
                        .unwrap_or_default(),
                    end_lsn: lsn_text(info.end_lsn),
                    origin_lsn: info
                        .origin
                        .as_ref()
                        .map(|o| lsn_text(o.lsn))
                        .unwrap_or_default(),
                    gid: info.gid.clone().unwrap_or_default(),
                })),
            );
        }
        out.push(response(Event::Change(pb::Change {
            id: Some(event_id(source.1, info.commit_lsn, sequence)),
            lsn: lsn_text(change.lsn()),
            ..encoded
        })));
    }

    fn encode_change(
        &mut self,
        source: (usize, &str),
        change: &Change,
        out: &mut Vec<pb::SubscribeResponse>,
    ) -> Option<pb::Change> {
        let operation = match change {
            Change::Insert { .. } => pb::Operation::Insert,
            Change::Read { .. } => pb::Operation::Read,
            Change::Update { .. } => pb::Operation::Update,
            Change::Delete { .. } => pb::Operation::Delete,
            Change::Truncate(_) => pb::Operation::Truncate,
            // What a target should delete in a re-sync: consumers get the
            // rows as READs, and apply them as upserts.
            Change::ReadRange(_) => return None,
            Change::Message(m) => {
                return self.filter.message(&m.prefix).then(|| pb::Change {
                    operation: pb::Operation::Message.into(),
                    message: Some(message(source.1, m, 0, None)),
                    ..Default::default()
                });
            }
        };
        if !self.filter.operation(operation) {
            return None;
        }
        let mut encoded = pb::Change {
            operation: operation.into(),
            ..Default::default()
        };
        match change {
            Change::Insert { relation, new, .. } | Change::Read { relation, new, .. } => {
                encoded.relation = self.describe(source, relation, out)?;
                encoded.new = Some(self.row(source.0, relation, new));
            }
            Change::Update {
                relation, old, new, ..
            } => {
                encoded.relation = self.describe(source, relation, out)?;
                encoded.new =
                    Some(self.row(source.0, relation, &update_new_row(new, old.as_ref())));
                encoded.old = old.as_ref().map(|o| self.old_row(source.0, relation, o));
            }
            Change::Delete { relation, old, .. } => {
                encoded.relation = self.describe(source, relation, out)?;
                encoded.old = Some(self.old_row(source.0, relation, old));
            }
            Change::Truncate(truncate) => {
                encoded.relations = truncate
                    .relations
                    .iter()
                    .filter_map(|r| self.describe(source, r, out))
                    .collect();
                encoded.relation = *encoded.relations.first()?;
                encoded.cascade = truncate.options.cascade;
                encoded.restart_identity = truncate.options.restart_identity;
            }
            Change::ReadRange(_) | Change::Message(_) => return None,
        }
        Some(encoded)
    }

    fn old_row(&self, source: usize, relation: &Relation, old: &OldRow) -> pb::Row {
        self.row(source, relation, &old.row)
    }

    /// The transaction's `commit`, if its `begin` was sent.
    pub fn commit(
        source: &str,
        info: &TransactionInfo,
        transaction: &Transaction,
        token: bytes::Bytes,
    ) -> Option<pb::SubscribeResponse> {
        transaction.began.then(|| {
            response(Event::Commit(pb::Commit {
                source: source.to_owned(),
                commit_lsn: lsn_text(info.commit_lsn),
                end_lsn: lsn_text(info.end_lsn),
                resume_token: token,
            }))
        })
    }

    /// Rows of the copy of `relation` into `out`, each with its sequence
    /// (a `Rows` message holds consecutive ones); `token` goes with the
    /// last message. Nothing when the filter leaves them out.
    pub fn rows(
        &mut self,
        source: (usize, &str),
        relation: &Arc<Relation>,
        consistent_point: Lsn,
        rows: Vec<(u64, Row)>,
        token: bytes::Bytes,
        out: &mut Vec<pb::SubscribeResponse>,
    ) {
        if !self.filter.operation(pb::Operation::Read) {
            return;
        }
        let Some(number) = self.describe(source, relation, out) else {
            return;
        };
        let mut message = Vec::new();
        let mut first = 0;
        let mut bytes = 0;
        let total = rows.len();
        for (i, (sequence, row)) in rows.iter().enumerate() {
            if message.is_empty() {
                first = *sequence;
            }
            bytes += row.iter().map(Datum::len).sum::<usize>();
            message.push(self.row(source.0, relation, row));
            let last = i + 1 == total;
            let gap = rows
                .get(i + 1)
                .is_some_and(|(next, _)| *next != sequence + 1);
            if last || gap || message.len() >= ROWS_PER_MESSAGE || bytes >= ROW_BYTES_PER_MESSAGE {
                out.push(response(Event::Rows(pb::Rows {
                    first_id: Some(event_id(source.1, consistent_point, first)),
                    relation: number,
                    rows: std::mem::take(&mut message),
                    resume_token: if last {
                        token.clone()
                    } else {
                        bytes::Bytes::new()
                    },
                })));
                bytes = 0;
            }
        }
    }

    /// A non-transactional message, if the filter lets it through.
    pub fn message(
        &self,
        source: &str,
        m: &LogicalMessage,
        token: bytes::Bytes,
    ) -> Option<pb::SubscribeResponse> {
        self.filter
            .message(&m.prefix)
            .then(|| response(Event::Message(message(source, m, 0, Some(token)))))
    }
}

/// The event carrying sequences' values.
pub(crate) fn sequences(
    source: &str,
    values: &SequenceValues,
    token: bytes::Bytes,
) -> pb::SubscribeResponse {
    response(Event::Sequences(pb::Sequences {
        id: Some(event_id(source, values.lsn, 0)),
        read_time: Some(timestamp(values.read_time.unix_micros())),
        sequences: values
            .sequences
            .iter()
            .map(|s| pb::Sequence {
                schema: s.schema.clone(),
                name: s.name.clone(),
                last_value: s.last_value,
            })
            .collect(),
        resume_token: token,
    }))
}

fn message(
    source: &str,
    m: &LogicalMessage,
    sequence: u64,
    token: Option<bytes::Bytes>,
) -> pb::Message {
    pb::Message {
        id: Some(event_id(source, m.lsn, sequence)),
        transactional: m.transactional,
        prefix: m.prefix.clone(),
        content: m.content.clone(),
        resume_token: token.unwrap_or_default(),
    }
}

/// A protobuf timestamp of Unix microseconds.
pub(crate) fn timestamp(micros: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: micros.div_euclid(1_000_000),
        nanos: (micros.rem_euclid(1_000_000) * 1000) as i32,
    }
}

/// A response carrying `event`.
pub(crate) fn respond(event: Event) -> pb::SubscribeResponse {
    response(event)
}
