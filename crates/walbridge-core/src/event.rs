use std::sync::Arc;

use crate::change::{Change, LogicalMessage};
use crate::copy_text::CopyText;
use crate::lsn::Lsn;
use crate::relation::Relation;
use crate::time::PgTimestamp;

/// The replication origin a transaction was applied under on the publisher
/// (it was itself replicated from elsewhere).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    /// The origin's name.
    pub name: String,
    /// The commit position on the origin's own server.
    pub lsn: Lsn,
}

/// What is known about a committed transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransactionInfo {
    /// Top-level transaction id on the publisher.
    pub xid: u32,
    /// Position of the commit record.
    pub commit_lsn: Lsn,
    /// Position just past the commit record: the value to confirm once the
    /// transaction is durable downstream.
    pub end_lsn: Lsn,
    /// Commit time on the publisher.
    pub commit_time: PgTimestamp,
    /// Set when the transaction was itself replicated into the publisher.
    pub origin: Option<Origin>,
    /// The global identifier for a two-phase transaction (`PREPARE TRANSACTION 'gid'`).
    pub gid: Option<String>,
    /// A unit meant for one sink only, by name (a chunk of `walbridge
    /// resync --sink`): every other sink passes over it.
    pub for_sink: Option<String>,
}

impl TransactionInfo {
    /// The unit is meant for another sink than `sink`.
    pub fn passes_over(&self, sink: &str) -> bool {
        self.for_sink.as_deref().is_some_and(|s| s != sink)
    }
}

/// Rows read by the initial snapshot, all of one table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotBatch {
    /// The table the rows belong to.
    pub relation: Arc<Relation>,
    /// The rows, as of the slot's consistent point, in COPY text format
    /// with the relation's columns in order.
    pub rows: CopyText,
    /// The slot's consistent point: the snapshot shows exactly what was
    /// committed before it.
    pub consistent_point: Lsn,
}

/// A sequence's state on the publisher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SequenceValue {
    /// Its schema.
    pub schema: String,
    /// Its name.
    pub name: String,
    /// The last value it handed out (as `pg_sequences.last_value`): a
    /// value any row written so far can hold, counting values sessions
    /// hold in their caches. Sequences never used are left out.
    pub last_value: i64,
}

/// The sequences a source replicates, read on the publisher
/// (`sequences = true`). Sequences change without a trace in logical
/// decoding, so they are read now and then and handed on between
/// transactions; what consumers do with them must not go backwards.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SequenceValues {
    /// The stream's position they are handed on at: the end of the last
    /// transaction before them (a sequence read is ahead of that).
    pub lsn: Lsn,
    /// When they were read, on the publisher's clock.
    pub read_time: PgTimestamp,
    /// The sequences, ordered by schema and name.
    pub sequences: Vec<SequenceValue>,
}

/// Events handed downstream together, in order: a transaction (or a chunk
/// of a large one), a snapshot batch, a message. Batching keeps the cost of
/// moving events between tasks per transaction rather than per change.
pub type EventBatch = Vec<SourceEvent>;

/// What a source hands downstream, in order.
///
/// A source emits first the snapshot (any number of [`SourceEvent::Snapshot`]
/// batches, then [`SourceEvent::SnapshotComplete`]) and then committed
/// transactions in commit order, each as `Begin`, its changes, `Commit`,
/// with non-transactional messages in between. A transaction is emitted
/// only once it has committed, so nothing downstream ever sees a change
/// that is later rolled back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceEvent {
    /// Rows of the initial snapshot.
    Snapshot(SnapshotBatch),
    /// The snapshot finished: every row committed before the consistent point was emitted.
    SnapshotComplete {
        /// The slot's consistent point.
        consistent_point: Lsn,
    },
    /// A committed transaction starts.
    Begin(Arc<TransactionInfo>),
    /// A change of the transaction most recently begun.
    Change(Change),
    /// The transaction most recently begun ends.
    Commit(Arc<TransactionInfo>),
    /// A logical decoding message emitted outside any transaction.
    Message(LogicalMessage),
    /// Sequences' values, between transactions.
    Sequences(SequenceValues),
}
