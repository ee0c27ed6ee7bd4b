//! Turning a source's events into log records.

use std::sync::Arc;

use walbridge_core::{Change, Lsn, SnapshotBatch, SourceEvent, TransactionInfo};

use crate::error::LogError;
use crate::log::Log;
use crate::record::{Entry, RecordEncoder};
use crate::writer::LogWriter;

/// A transaction's changes are written in chunks of about this many bytes,
/// so memory stays bounded however large the transaction.
pub const MAX_CHUNK_BYTES: usize = 1 << 20;

/// The transaction being appended.
struct OpenTransaction {
    info: Arc<TransactionInfo>,
    /// No chunk of it has been written yet.
    first: bool,
    changes: Vec<Change>,
    bytes: usize,
}

/// Appends a source's events to its log: one record per small transaction,
/// contiguous chunks for a large one, snapshot rows in bounded records.
///
/// The whole initial copy is one unit, ending with its `SnapshotComplete`
/// record: readers see none of it until all of it is durable, and a copy
/// cut short by a crash or a stop is removed from the log when it is
/// reopened, so the copy that starts over is the only one sinks ever see.
pub struct Appender {
    writer: LogWriter,
    encoder: RecordEncoder,
    open: Option<OpenTransaction>,
}

impl Appender {
    /// Appends through `writer`.
    pub fn new(writer: LogWriter) -> Self {
        Appender {
            writer,
            encoder: RecordEncoder::default(),
            open: None,
        }
    }

    /// The log appended to.
    pub fn log(&self) -> Log {
        self.writer.log()
    }

    /// Waits until the log's writer fails and returns why (see
    /// [`LogWriter::failed`]).
    pub async fn failed(&self) -> LogError {
        self.writer.failed().await
    }

    /// Begins a batch of events; one `alone` (whole transactions of a
    /// caught-up stream, nothing waiting after them) is written here, at
    /// [`Appender::end_batch`], while the log's writer is idle (see
    /// [`LogWriter::begin_batch`]).
    pub fn begin_batch(&self, alone: bool) {
        self.writer.begin_batch(alone);
    }

    /// Ends a batch begun by [`Appender::begin_batch`].
    pub async fn end_batch(&self) -> Result<(), LogError> {
        self.writer.end_batch().await
    }

    /// The LSN recorded for a non-transactional message at `lsn`: just past
    /// it, so that "skip what ends at or before the log's last LSN" skips
    /// the message itself after a restart but nothing that follows it.
    pub fn message_lsn(lsn: Lsn) -> Lsn {
        Lsn(lsn.0.saturating_add(1))
    }

    /// Appends one event. Events must come as a source emits them: a
    /// transaction's changes between its `Begin` and `Commit`.
    pub async fn append(&mut self, event: SourceEvent) -> Result<(), LogError> {
        match event {
            SourceEvent::Begin(info) => {
                // Chunks of the previous one are in the log: a second
                // start would leave them there, a unit never ended.
                if self.open.as_ref().is_some_and(|open| !open.first) {
                    return Err(LogError::OutOfOrder(
                        "a transaction began while part of the previous one was written",
                    ));
                }
                self.open = Some(OpenTransaction {
                    info,
                    first: true,
                    changes: Vec::new(),
                    bytes: 0,
                });
            }
            SourceEvent::Change(change) => {
                let Some(open) = self.open.as_mut() else {
                    return Err(LogError::OutOfOrder(
                        "a change arrived outside a transaction",
                    ));
                };
                open.bytes += change.approximate_size();
                open.changes.push(change);
                if open.bytes >= MAX_CHUNK_BYTES {
                    self.write_chunk(false).await?;
                }
            }
            SourceEvent::Commit(_) => self.write_chunk(true).await?,
            SourceEvent::Snapshot(batch) => self.write_snapshot(batch).await?,
            SourceEvent::SnapshotComplete { consistent_point } => {
                let payload = self.encoder.snapshot_complete(consistent_point);
                self.writer.append(payload, consistent_point, true).await?;
            }
            SourceEvent::Message(m) => {
                let payload = self.encoder.message(&m);
                let lsn = Self::message_lsn(m.lsn);
                self.writer
                    .append_unit(payload, Entry::Message(m), lsn)
                    .await?;
            }
            SourceEvent::Sequences(values) => {
                let payload = self.encoder.sequences(&values);
                let lsn = values.lsn;
                self.writer
                    .append_unit(payload, Entry::Sequences(values), lsn)
                    .await?;
            }
        }
        Ok(())
    }

    async fn write_chunk(&mut self, last: bool) -> Result<(), LogError> {
        let Some(open) = self.open.as_mut() else {
            return Err(LogError::OutOfOrder(
                "a commit arrived outside a transaction",
            ));
        };
        let payload = self
            .encoder
            .transaction(&open.info, open.first, last, &open.changes);
        let lsn = open.info.end_lsn;
        if open.first && last {
            // A whole transaction in one record: readers that keep up take it as it is.
            let entry = Entry::Transaction {
                info: open.info.clone(),
                first: true,
                last: true,
                changes: std::mem::take(&mut open.changes),
            };
            self.open = None;
            return self.writer.append_unit(payload, entry, lsn).await;
        }
        open.first = false;
        open.changes.clear();
        open.bytes = 0;
        if last {
            self.open = None;
        }
        self.writer.append(payload, lsn, last).await
    }

    async fn write_snapshot(&mut self, batch: SnapshotBatch) -> Result<(), LogError> {
        let SnapshotBatch {
            relation,
            rows,
            consistent_point,
        } = batch;
        if rows.is_empty() {
            return Ok(());
        }
        for rows in rows.split(MAX_CHUNK_BYTES) {
            let chunk = SnapshotBatch {
                relation: relation.clone(),
                rows,
                consistent_point,
            };
            let payload = self.encoder.snapshot(&chunk);
            self.writer.append(payload, consistent_point, false).await?;
        }
        Ok(())
    }

    /// Writes and fsyncs everything appended, then stops the writer.
    pub async fn close(self) -> Result<(), LogError> {
        self.writer.close().await
    }
}
