use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;

use crate::lsn::Lsn;
use crate::relation::Relation;
use crate::value::{Datum, Row};

/// Which old-row image an UPDATE or DELETE carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OldRowKind {
    /// Only the replica-identity columns are meaningful (other columns are null).
    Key,
    /// Every column (REPLICA IDENTITY FULL).
    Full,
}

/// The old image of a row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OldRow {
    /// Key columns only, or the full row.
    pub kind: OldRowKind,
    /// The values, one per relation column.
    pub row: Row,
}

/// TRUNCATE options as the publisher ran them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TruncateOptions {
    /// `CASCADE` was given.
    pub cascade: bool,
    /// `RESTART IDENTITY` was given.
    pub restart_identity: bool,
}

/// A TRUNCATE of one or more published tables, as one statement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Truncate {
    /// Position of the change in the WAL.
    pub lsn: Lsn,
    /// Every truncated table that is published.
    pub relations: Vec<Arc<Relation>>,
    /// The statement's options.
    pub options: TruncateOptions,
}

/// How a key column is ordered when a table is read in key order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyOrder {
    /// By the type's own order (integers, uuids).
    Value,
    /// Text in byte order (`COLLATE "C"`).
    Bytes,
    /// By the value's text form, in byte order (`::text COLLATE "C"`).
    TextForm,
}

impl KeyOrder {
    /// The SQL expression ordering `column` (quoted) this way.
    pub fn expression(self, column: &str) -> String {
        match self {
            KeyOrder::Value => column.to_owned(),
            KeyOrder::Bytes => format!("{column} COLLATE \"C\""),
            KeyOrder::TextForm => format!("{column}::text COLLATE \"C\""),
        }
    }
}

/// A range of a table's keys and the keys a read found in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadRange {
    /// Position of the read in the stream.
    pub lsn: Lsn,
    /// The table, as read.
    pub relation: Arc<Relation>,
    /// The key: column indexes in the relation, and how each is ordered.
    pub key: Vec<(usize, KeyOrder)>,
    /// Keys after this one (text values); from the first when none.
    pub after: Option<Vec<String>>,
    /// Keys up to this one; to the last when none.
    pub up_to: Option<Vec<String>>,
    /// The keys the read found, in key order.
    pub keys: Vec<Vec<String>>,
}

/// A logical decoding message (`pg_logical_emit_message`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogicalMessage {
    /// Position of the message in the WAL.
    pub lsn: Lsn,
    /// True when emitted as part of a transaction.
    pub transactional: bool,
    /// The prefix the emitter chose.
    pub prefix: String,
    /// The message body.
    pub content: Bytes,
}

/// One change inside a committed transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// An INSERT.
    Insert {
        /// Position of the change in the WAL.
        lsn: Lsn,
        /// The table, as described when the change was made.
        relation: Arc<Relation>,
        /// The new row.
        new: Row,
    },
    /// An UPDATE.
    Update {
        /// Position of the change in the WAL.
        lsn: Lsn,
        /// The table, as described when the change was made.
        relation: Arc<Relation>,
        /// The old row: absent unless the identity is FULL or the key changed.
        old: Option<OldRow>,
        /// The new row; columns may be [`crate::Datum::UnchangedToast`].
        new: Row,
    },
    /// A DELETE.
    Delete {
        /// Position of the change in the WAL.
        lsn: Lsn,
        /// The table, as described when the change was made.
        relation: Arc<Relation>,
        /// The deleted row's identity (key columns or the full row).
        old: OldRow,
    },
    /// A row read from the table while streaming went on (a table added
    /// to the publication, or one re-synchronized): the row as it was at a
    /// point of the stream, to be applied idempotently (an upsert by key;
    /// `op = "r"` for consumers). Later changes to it follow in the stream.
    Read {
        /// Position of the read in the stream (the watermark that closed
        /// the chunk it belongs to).
        lsn: Lsn,
        /// The table, as the stream describes it.
        relation: Arc<Relation>,
        /// The row.
        new: Row,
    },
    /// The rows a re-sync read between two keys: a target row in that
    /// range whose key is not among them is not in the publisher's table.
    /// Comes before the rows ([`Change::Read`]) of the chunk it bounds.
    ReadRange(ReadRange),
    /// A TRUNCATE.
    Truncate(Truncate),
    /// A transactional logical decoding message.
    Message(LogicalMessage),
}

/// The new row of an UPDATE as completely as the change tells it: with
/// REPLICA IDENTITY FULL the old row carries the TOASTed values the new row
/// leaves out ([`Datum::UnchangedToast`]), so those are taken from it.
pub fn update_new_row<'a>(new: &'a Row, old: Option<&OldRow>) -> Cow<'a, Row> {
    match old {
        Some(old) if old.kind == OldRowKind::Full && new.contains(&Datum::UnchangedToast) => {
            Cow::Owned(
                new.iter()
                    .zip(&old.row)
                    .map(|(n, o)| {
                        if *n == Datum::UnchangedToast {
                            o.clone()
                        } else {
                            n.clone()
                        }
                    })
                    .collect(),
            )
        }
        _ => Cow::Borrowed(new),
    }
}

/// What changes do, by the names metrics and status count them under, in
/// the order of [`Change::operation`].
pub const OPERATIONS: [&str; 5] = ["insert", "update", "delete", "truncate", "read"];

impl Change {
    /// What the change does, as an index into [`OPERATIONS`]; none for a
    /// logical decoding message, which changes no row.
    pub fn operation(&self) -> Option<usize> {
        match self {
            Change::Insert { .. } => Some(0),
            Change::Update { .. } => Some(1),
            Change::Delete { .. } => Some(2),
            Change::Truncate(_) => Some(3),
            Change::Read { .. } => Some(4),
            Change::ReadRange(_) | Change::Message(_) => None,
        }
    }

    /// The WAL position of the change.
    pub fn lsn(&self) -> Lsn {
        match self {
            Change::Insert { lsn, .. }
            | Change::Read { lsn, .. }
            | Change::Update { lsn, .. }
            | Change::Delete { lsn, .. } => *lsn,
            Change::Truncate(t) => t.lsn,
            Change::ReadRange(r) => r.lsn,
            Change::Message(m) => m.lsn,
        }
    }

    /// An estimate of the memory the change holds, used for spill decisions.
    pub fn approximate_size(&self) -> usize {
        // What a change costs in memory besides its values: the enum,
        // twice (a transaction's vector of changes grows by doubling, so
        // up to half its slots are empty), the row vector's header and
        // allocator rounding, and the received message the values are
        // slices of (its own allocation, the shared buffer's header and
        // the bytes around the values). Per value, the Datum and the
        // bytes buffer's header. Measured with scripts/bench-large-txn.sh:
        // counting the enum once and not the message, resident memory grew
        // by about 2.5 MB per MB of spill_threshold.
        const OVERHEAD: usize = 2 * std::mem::size_of::<Change>() + 32 + 96;
        let row = |r: &Row| {
            r.iter()
                .map(|d| d.len() + std::mem::size_of::<Datum>() + 5)
                .sum::<usize>()
        };
        OVERHEAD
            + match self {
                Change::Insert { new, .. } | Change::Read { new, .. } => row(new),
                Change::Update { old, new, .. } => {
                    row(new) + old.as_ref().map_or(0, |o| row(&o.row))
                }
                Change::Delete { old, .. } => row(&old.row),
                Change::Truncate(t) => t.relations.len() * 8,
                Change::ReadRange(r) => r
                    .keys
                    .iter()
                    .flatten()
                    .map(|k| k.len() + std::mem::size_of::<String>())
                    .sum(),
                Change::Message(m) => m.prefix.len() + m.content.len(),
            }
    }
}
