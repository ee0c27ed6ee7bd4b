//! Transaction assembly: turns the decoded pgoutput stream into committed
//! transactions, in commit order.
//!
//! Invariants:
//!
//! * A transaction is handed out only once its commit (Commit, Stream
//!   Commit or Commit Prepared) has arrived, so nothing downstream ever sees
//!   a change that is later rolled back; aborted streamed transactions and
//!   rolled-back prepared ones are dropped without a trace.
//! * The walsender sends commits in commit order, and each transaction is
//!   emitted when its commit arrives, so emission order is commit order.
//! * Memory is bounded: the in-memory changes of all open transactions
//!   together stay under `spill_threshold`; above it the largest open
//!   transaction is appended to its spill file, and at commit the file is
//!   read back in order before the changes still in memory.
//! * Every change holds the relation descriptor current when it was
//!   decoded. A Relation message inside a stream block applies only to that
//!   streamed transaction (its schema may be uncommitted DDL).
//! * Subtransaction aborts inside a streamed transaction discard everything
//!   from the subtransaction's first change on: by WAL order, all later
//!   changes of the transaction belong to that subtransaction or its children.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use foldhash::fast::RandomState;
use walbridge_core::{
    Change, LogicalMessage, Lsn, OldRow, OldRowKind, Origin, PgTimestamp, Relation, RelationId,
    TransactionInfo, Truncate, TruncateOptions,
};

use crate::pgoutput::{Message, OldTupleKind};
use crate::spill::{SpillError, SpillReader, SpillWriter};

/// The stream violated pgoutput's rules, or spilling failed.
#[derive(Debug, thiserror::Error)]
pub enum AssemblyError {
    /// A data message arrived outside any transaction.
    #[error("pgoutput sent {0} outside a transaction")]
    OutsideTransaction(&'static str),
    /// A change named a relation that was never described.
    #[error("pgoutput sent a change for relation {0} before describing it")]
    UnknownRelation(RelationId),
    /// A row had a different number of columns than its relation.
    #[error("row for {schema}.{table} has {got} columns, its relation has {expected}")]
    ColumnCount {
        /// Schema.
        schema: String,
        /// Table.
        table: String,
        /// Columns in the relation.
        expected: usize,
        /// Columns in the row.
        got: usize,
    },
    /// A stream block or streamed commit for a transaction that is not open.
    #[error("pgoutput sent {what} for transaction {xid}, which is not open")]
    UnknownStreamedTransaction {
        /// Which message.
        what: &'static str,
        /// Its xid.
        xid: u32,
    },
    /// COMMIT PREPARED for a transaction never prepared in this stream.
    #[error(
        "COMMIT PREPARED for '{0}', whose PREPARE was never received; the slot may have been used by another client — recreate it with `walbridge drop`"
    )]
    UnknownPrepared(String),
    /// Begin inside a transaction, Commit without Begin, ….
    #[error("pgoutput sent {0} out of sequence")]
    OutOfSequence(&'static str),
    /// A spill file failed.
    #[error(transparent)]
    Spill(#[from] SpillError),
}

/// Changes of one transaction: a spilled prefix on disk, the rest in memory.
#[derive(Debug)]
pub struct ChangeBuffer {
    spill: Option<SpillWriter>,
    /// Where it spills, named only if it does (most transactions never do).
    spill_dir: Arc<Path>,
    spill_id: u64,
    memory: Vec<Change>,
    memory_bytes: usize,
    count: usize,
    spilled_count: usize,
    /// For streamed transactions: where each subtransaction's first change is.
    subxacts: Vec<SubxactStart>,
}

#[derive(Debug, Clone, Copy)]
struct SubxactStart {
    subxid: u32,
    index: usize,
    /// Offset in the spill file, once the change has been spilled.
    spill_offset: Option<u64>,
}

impl ChangeBuffer {
    fn new(spill_dir: Arc<Path>, spill_id: u64) -> Self {
        ChangeBuffer {
            spill: None,
            spill_dir,
            spill_id,
            memory: Vec::new(),
            memory_bytes: 0,
            count: 0,
            spilled_count: 0,
            subxacts: Vec::new(),
        }
    }

    fn push(&mut self, change: Change) {
        self.memory_bytes += change.approximate_size();
        self.memory.push(change);
        self.count += 1;
    }

    fn note_subxact(&mut self, top_xid: u32, subxid: u32) {
        if subxid != top_xid && !self.subxacts.iter().any(|s| s.subxid == subxid) {
            self.subxacts.push(SubxactStart {
                subxid,
                index: self.count,
                spill_offset: None,
            });
        }
    }

    /// Writes the in-memory changes to the spill file.
    fn spill(&mut self) -> Result<(), SpillError> {
        if self.memory.is_empty() {
            return Ok(());
        }
        let writer = match &mut self.spill {
            Some(w) => w,
            None => self.spill.insert(SpillWriter::create(self.spill_path())?),
        };
        for (offset, change) in self.memory.drain(..).enumerate() {
            let index = self.spilled_count + offset;
            for s in self.subxacts.iter_mut().filter(|s| s.index == index) {
                s.spill_offset = Some(writer.len());
            }
            writer.write(&change)?;
        }
        self.spilled_count = self.count;
        self.memory_bytes = 0;
        // Drained, the vector would keep its capacity: as large as the
        // memory threshold allows, for the rest of the transaction.
        self.memory = Vec::new();
        Ok(())
    }

    /// Drops the changes of `subxid` and everything after them.
    fn abort_subxact(&mut self, subxid: u32) -> Result<(), SpillError> {
        let Some(pos) = self.subxacts.iter().position(|s| s.subxid == subxid) else {
            return Ok(());
        };
        let start = self.subxacts[pos];
        self.subxacts.truncate(pos);
        if start.index >= self.spilled_count {
            self.memory.truncate(start.index - self.spilled_count);
        } else {
            self.memory.clear();
            if let (Some(writer), Some(offset)) = (&mut self.spill, start.spill_offset) {
                writer.truncate(offset)?;
            }
            self.spilled_count = start.index;
        }
        self.memory_bytes = self.memory.iter().map(Change::approximate_size).sum();
        self.count = start.index;
        Ok(())
    }

    /// True when the buffer has gone to disk.
    pub fn is_spilled(&self) -> bool {
        self.spill.is_some()
    }

    /// Number of changes.
    pub fn len(&self) -> usize {
        self.count
    }

    /// True when the transaction has no changes.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Reads the changes back in order: first from the spill file, then from memory.
    pub fn into_changes(self) -> Result<ChangeIter, SpillError> {
        let reader = match self.spill {
            Some(w) => Some(w.into_reader()?),
            None => None,
        };
        Ok(ChangeIter {
            reader,
            memory: self.memory.into_iter(),
        })
    }

    fn discard(self) {
        if self.spill.is_some() {
            let _ = std::fs::remove_file(self.spill_path());
        }
    }

    fn spill_path(&self) -> PathBuf {
        self.spill_dir.join(format!("txn-{}.spill", self.spill_id))
    }
}

/// The changes of a committed transaction, in order.
#[derive(Debug)]
pub struct ChangeIter {
    reader: Option<SpillReader>,
    memory: std::vec::IntoIter<Change>,
}

impl Iterator for ChangeIter {
    type Item = Result<Change, SpillError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(reader) = &mut self.reader {
            match reader.next_change() {
                Ok(Some(change)) => return Some(Ok(change)),
                Ok(None) => {
                    if let Some(r) = self.reader.take() {
                        r.remove();
                    }
                }
                Err(e) => return Some(Err(e)),
            }
        }
        self.memory.next().map(Ok)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let in_memory = self.memory.len();
        match self.reader {
            Some(_) => (in_memory, None),
            None => (in_memory, Some(in_memory)),
        }
    }
}

/// A transaction whose commit has arrived.
#[derive(Debug)]
pub struct CommittedTransaction {
    /// Commit metadata.
    pub info: Arc<TransactionInfo>,
    /// Its changes.
    pub changes: ChangeBuffer,
}

/// What the assembler produces for a message.
#[derive(Debug)]
pub enum Assembled {
    /// Nothing to hand out yet.
    Nothing,
    /// A transaction committed.
    Committed(CommittedTransaction),
    /// A non-transactional logical decoding message.
    Message(LogicalMessage),
}

#[derive(Debug)]
struct OpenTransaction {
    xid: u32,
    origin: Option<Origin>,
    gid: Option<String>,
    /// Relation messages received inside this streamed transaction.
    relations: HashMap<RelationId, Arc<Relation>, RandomState>,
    changes: ChangeBuffer,
}

/// Counters for progress reporting.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct AssemblerStats {
    /// Transactions handed out.
    pub committed: u64,
    /// Streamed transactions aborted.
    pub aborted: u64,
    /// Transactions that went to disk.
    pub spilled: u64,
}

/// The assembler. Feed it every decoded message with [`Assembler::push`].
#[derive(Debug)]
pub struct Assembler {
    spill_dir: Arc<Path>,
    spill_threshold: usize,
    /// Looked up for every change: hashed with foldhash, not SipHash.
    relations: HashMap<RelationId, Arc<Relation>, RandomState>,
    current: Option<OpenTransaction>,
    /// The transaction of the current stream block.
    stream_xid: Option<u32>,
    streamed: HashMap<u32, OpenTransaction>,
    prepared: HashMap<String, OpenTransaction>,
    /// Prepare positions of transactions waiting for COMMIT/ROLLBACK PREPARED.
    prepare_lsns: HashMap<String, Lsn>,
    next_spill_id: u64,
    stats: AssemblerStats,
}

impl Assembler {
    /// An assembler spilling into `spill_dir` once open transactions hold
    /// more than `spill_threshold` bytes in memory.
    pub fn new(spill_dir: PathBuf, spill_threshold: usize) -> Self {
        Assembler {
            spill_dir: spill_dir.into(),
            spill_threshold,
            relations: HashMap::default(),
            current: None,
            stream_xid: None,
            streamed: HashMap::new(),
            prepared: HashMap::new(),
            prepare_lsns: HashMap::new(),
            next_spill_id: 0,
            stats: AssemblerStats::default(),
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> AssemblerStats {
        self.stats
    }

    /// True while a non-streamed transaction is between Begin and Commit.
    pub fn in_transaction(&self) -> bool {
        self.current.is_some()
    }

    /// The earliest prepare position of a prepared transaction still
    /// waiting for COMMIT/ROLLBACK PREPARED. The confirmed position must
    /// stay below it, or a restart would never see the prepared changes again.
    pub fn oldest_pending_prepare(&self) -> Option<Lsn> {
        self.prepare_lsns.values().min().copied()
    }

    fn new_buffer(&mut self) -> ChangeBuffer {
        self.next_spill_id += 1;
        ChangeBuffer::new(self.spill_dir.clone(), self.next_spill_id)
    }

    fn open(&mut self, xid: u32, gid: Option<String>) -> OpenTransaction {
        OpenTransaction {
            xid,
            origin: None,
            gid,
            relations: HashMap::default(),
            changes: self.new_buffer(),
        }
    }

    /// Registers the current description of a table (from a Relation
    /// message outside a stream block, with types resolved).
    pub fn set_relation(
        &mut self,
        relation: Relation,
        stream_xid: Option<u32>,
    ) -> Result<(), AssemblyError> {
        let relation = Arc::new(relation);
        match stream_xid.and(self.stream_xid) {
            Some(top) => {
                let txn = self.streamed.get_mut(&top).ok_or(
                    AssemblyError::UnknownStreamedTransaction {
                        what: "Relation",
                        xid: top,
                    },
                )?;
                txn.relations.insert(relation.id, relation);
            }
            None => {
                self.relations.insert(relation.id, relation);
            }
        }
        Ok(())
    }

    /// Feeds one decoded message; `wal_start` is the XLogData position.
    /// Relation messages must go through [`Assembler::set_relation`].
    pub fn push(&mut self, wal_start: Lsn, message: Message) -> Result<Assembled, AssemblyError> {
        match message {
            Message::Begin { xid, .. } => {
                if self.current.is_some() {
                    return Err(AssemblyError::OutOfSequence("Begin inside a transaction"));
                }
                self.current = Some(self.open(xid, None));
            }
            Message::BeginPrepare { xid, gid, .. } => {
                if self.current.is_some() {
                    return Err(AssemblyError::OutOfSequence(
                        "Begin Prepare inside a transaction",
                    ));
                }
                self.current = Some(self.open(xid, Some(gid)));
            }
            Message::Origin { lsn, name } => {
                let txn = self
                    .current
                    .as_mut()
                    .ok_or(AssemblyError::OutsideTransaction("Origin"))?;
                txn.origin = Some(Origin { name, lsn });
            }
            Message::Commit {
                commit_lsn,
                end_lsn,
                commit_time,
                ..
            } => {
                let txn = self
                    .current
                    .take()
                    .ok_or(AssemblyError::OutOfSequence("Commit without Begin"))?;
                return Ok(self.committed(txn, commit_lsn, end_lsn, commit_time));
            }
            Message::Prepare(body) => {
                let txn = self.current.take().ok_or(AssemblyError::OutOfSequence(
                    "Prepare without Begin Prepare",
                ))?;
                self.prepare_lsns.insert(body.gid.clone(), body.prepare_lsn);
                self.prepared.insert(body.gid, txn);
            }
            Message::StreamPrepare(body) => {
                let mut txn = self.streamed.remove(&body.xid).ok_or(
                    AssemblyError::UnknownStreamedTransaction {
                        what: "Stream Prepare",
                        xid: body.xid,
                    },
                )?;
                txn.gid = Some(body.gid.clone());
                self.adopt_relations(&mut txn);
                self.prepare_lsns.insert(body.gid.clone(), body.prepare_lsn);
                self.prepared.insert(body.gid, txn);
            }
            Message::CommitPrepared {
                commit_lsn,
                end_lsn,
                commit_time,
                gid,
                ..
            } => {
                self.prepare_lsns.remove(&gid);
                let txn = self
                    .prepared
                    .remove(&gid)
                    .ok_or(AssemblyError::UnknownPrepared(gid))?;
                return Ok(self.committed(txn, commit_lsn, end_lsn, commit_time));
            }
            Message::RollbackPrepared { gid, .. } => {
                self.prepare_lsns.remove(&gid);
                if let Some(txn) = self.prepared.remove(&gid) {
                    self.stats.aborted += 1;
                    txn.changes.discard();
                }
            }
            Message::StreamStart { xid, .. } => {
                if self.stream_xid.is_some() {
                    return Err(AssemblyError::OutOfSequence(
                        "Stream Start inside a stream block",
                    ));
                }
                if !self.streamed.contains_key(&xid) {
                    let txn = self.open(xid, None);
                    self.streamed.insert(xid, txn);
                }
                self.stream_xid = Some(xid);
            }
            Message::StreamStop => {
                self.stream_xid.take().ok_or(AssemblyError::OutOfSequence(
                    "Stream Stop outside a stream block",
                ))?;
            }
            Message::StreamCommit {
                xid,
                commit_lsn,
                end_lsn,
                commit_time,
                ..
            } => {
                let mut txn = self.streamed.remove(&xid).ok_or(
                    AssemblyError::UnknownStreamedTransaction {
                        what: "Stream Commit",
                        xid,
                    },
                )?;
                self.adopt_relations(&mut txn);
                return Ok(self.committed(txn, commit_lsn, end_lsn, commit_time));
            }
            Message::StreamAbort { xid, subxid, .. } => {
                if xid == subxid {
                    if let Some(txn) = self.streamed.remove(&xid) {
                        self.stats.aborted += 1;
                        txn.changes.discard();
                    }
                } else if let Some(txn) = self.streamed.get_mut(&xid) {
                    txn.changes.abort_subxact(subxid)?;
                }
            }
            Message::Relation { .. } | Message::Type { .. } => {}
            Message::Message {
                transactional: false,
                lsn,
                prefix,
                content,
                ..
            } => {
                return Ok(Assembled::Message(LogicalMessage {
                    lsn,
                    transactional: false,
                    prefix,
                    content,
                }));
            }
            Message::Message {
                xid,
                transactional: true,
                lsn,
                prefix,
                content,
            } => {
                let change = Change::Message(LogicalMessage {
                    lsn,
                    transactional: true,
                    prefix,
                    content,
                });
                self.add_change(xid, change)?;
            }
            Message::Insert {
                xid,
                relation_id,
                new,
            } => {
                let relation = self.relation(xid, relation_id)?;
                check_columns(&relation, new.len())?;
                self.add_change(
                    xid,
                    Change::Insert {
                        lsn: wal_start,
                        relation,
                        new,
                    },
                )?;
            }
            Message::Update {
                xid,
                relation_id,
                old,
                new,
            } => {
                let relation = self.relation(xid, relation_id)?;
                check_columns(&relation, new.len())?;
                let old = old.map(|(kind, row)| old_row(kind, row));
                if let Some(o) = &old {
                    check_columns(&relation, o.row.len())?;
                }
                self.add_change(
                    xid,
                    Change::Update {
                        lsn: wal_start,
                        relation,
                        old,
                        new,
                    },
                )?;
            }
            Message::Delete {
                xid,
                relation_id,
                old: (kind, row),
            } => {
                let relation = self.relation(xid, relation_id)?;
                check_columns(&relation, row.len())?;
                self.add_change(
                    xid,
                    Change::Delete {
                        lsn: wal_start,
                        relation,
                        old: old_row(kind, row),
                    },
                )?;
            }
            Message::Truncate {
                xid,
                cascade,
                restart_identity,
                relation_ids,
            } => {
                let relations = relation_ids
                    .iter()
                    .map(|id| self.relation(xid, *id))
                    .collect::<Result<Vec<_>, _>>()?;
                let change = Change::Truncate(Truncate {
                    lsn: wal_start,
                    relations,
                    options: TruncateOptions {
                        cascade,
                        restart_identity,
                    },
                });
                self.add_change(xid, change)?;
            }
        }
        Ok(Assembled::Nothing)
    }

    fn relation(&self, xid: Option<u32>, id: RelationId) -> Result<Arc<Relation>, AssemblyError> {
        let streamed = xid
            .and(self.stream_xid)
            .and_then(|top| self.streamed.get(&top))
            .and_then(|t| t.relations.get(&id));
        streamed
            .or_else(|| self.relations.get(&id))
            .cloned()
            .ok_or(AssemblyError::UnknownRelation(id))
    }

    fn add_change(&mut self, xid: Option<u32>, change: Change) -> Result<(), AssemblyError> {
        match (xid, self.stream_xid) {
            (Some(subxid), Some(top)) => {
                let txn = self.streamed.get_mut(&top).ok_or(
                    AssemblyError::UnknownStreamedTransaction {
                        what: "a change",
                        xid: top,
                    },
                )?;
                txn.changes.note_subxact(top, subxid);
                txn.changes.push(change);
            }
            _ => {
                let txn = self
                    .current
                    .as_mut()
                    .ok_or(AssemblyError::OutsideTransaction("a change"))?;
                txn.changes.push(change);
            }
        }
        self.enforce_memory_limit()
    }

    fn enforce_memory_limit(&mut self) -> Result<(), AssemblyError> {
        loop {
            let buffers = self
                .current
                .iter_mut()
                .chain(self.streamed.values_mut())
                .chain(self.prepared.values_mut())
                .map(|t| &mut t.changes);
            let mut total = 0;
            let mut largest: Option<&mut ChangeBuffer> = None;
            for b in buffers {
                total += b.memory_bytes;
                if largest
                    .as_ref()
                    .is_none_or(|l| b.memory_bytes > l.memory_bytes)
                {
                    largest = Some(b);
                }
            }
            match largest {
                Some(b) if total > self.spill_threshold && b.memory_bytes > 0 => {
                    let first_spill = !b.is_spilled();
                    b.spill()?;
                    if first_spill {
                        self.stats.spilled += 1;
                    }
                }
                _ => return Ok(()),
            }
        }
    }

    /// A streamed transaction that commits (or is prepared) makes the
    /// descriptors sent inside it current: pgoutput then counts them as
    /// sent and describes those tables to later transactions no more.
    fn adopt_relations(&mut self, txn: &mut OpenTransaction) {
        self.relations.extend(txn.relations.drain());
    }

    fn committed(
        &mut self,
        txn: OpenTransaction,
        commit_lsn: Lsn,
        end_lsn: Lsn,
        commit_time: PgTimestamp,
    ) -> Assembled {
        self.stats.committed += 1;
        Assembled::Committed(CommittedTransaction {
            info: Arc::new(TransactionInfo {
                xid: txn.xid,
                commit_lsn,
                end_lsn,
                commit_time,
                origin: txn.origin,
                gid: txn.gid,
                for_sink: None,
            }),
            changes: txn.changes,
        })
    }

    /// Forgets every open transaction (after a disconnect: the server
    /// sends them again from the start) and removes their spill files.
    pub fn reset(&mut self) {
        self.stream_xid = None;
        let open = self
            .current
            .take()
            .into_iter()
            .chain(self.streamed.drain().map(|(_, t)| t))
            .chain(self.prepared.drain().map(|(_, t)| t));
        for txn in open {
            txn.changes.discard();
        }
        self.prepare_lsns.clear();
    }
}

fn old_row(kind: OldTupleKind, row: walbridge_core::Row) -> OldRow {
    OldRow {
        kind: if kind == OldTupleKind::Key {
            OldRowKind::Key
        } else {
            OldRowKind::Full
        },
        row,
    }
}

fn check_columns(relation: &Relation, got: usize) -> Result<(), AssemblyError> {
    if got == relation.columns.len() {
        Ok(())
    } else {
        Err(AssemblyError::ColumnCount {
            schema: relation.schema.clone(),
            table: relation.name.clone(),
            expected: relation.columns.len(),
            got,
        })
    }
}

#[cfg(test)]
mod tests;
