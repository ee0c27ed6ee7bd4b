//! Reading a log from any position, record by record.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufReader, Read, Take};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use tokio::sync::watch;
use walbridge_core::Lsn;

use crate::error::LogError;
use crate::frame::{self, FrameError, FrameHeader, HEADER_LEN};
use crate::handoff::Taken;
use crate::log::{Head, Shared, Visibility};
use crate::record::{Entry, RecordDecoder};
use crate::segment::{self, SEGMENT_HEADER_LEN, segment_path};

/// One record read from the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadRecord {
    /// Its position.
    pub seq: u64,
    /// Its LSN (the source's resume point after it).
    pub lsn: Lsn,
    /// True when it completes a unit: a consumer's cursor may stop after it.
    pub unit_end: bool,
    /// Bytes it occupies in the log.
    pub size: u64,
    /// What it holds.
    pub entry: Entry,
}

/// Reads records in order, never past the readable end ([`Head`]; or the
/// end its [`Visibility`] sees). Memory
/// is one record plus a read buffer, whatever the log's size.
///
/// Once it has read everything readable it takes what follows from the
/// writer, in memory, while it keeps up (the hand-off, `handoff.rs`), and from the
/// file otherwise.
#[derive(Debug)]
pub struct LogReader {
    shared: Arc<Shared>,
    visibility: Visibility,
    head: watch::Receiver<Head>,
    base: u64,
    path: PathBuf,
    /// Reads at most to the readable end (see [`segment::open_at`]).
    file: BufReader<Take<File>>,
    pos: u64,
    next_seq: u64,
    decoder: RecordDecoder,
    /// Its subscription to the hand-off, while it has one.
    subscription: Option<u64>,
    /// Records taken from the hand-off, not yet returned.
    taken: VecDeque<ReadRecord>,
    /// The file is not at `next_seq` (records came from the hand-off).
    moved_on: bool,
    /// Records returned from the hand-off.
    from_memory: u64,
}

impl LogReader {
    pub(crate) fn open(
        shared: Arc<Shared>,
        seq: u64,
        visibility: Visibility,
    ) -> Result<Self, LogError> {
        let end = shared.end(visibility).borrow().next_seq;
        let (base, pos, at) = Self::locate(&shared, seq, end)?;
        let mut reader = Self::open_at(shared, base, pos, at, visibility)?;
        reader.skip_to(seq)?;
        Ok(reader)
    }

    /// The segment holding record `seq` (at most `end`, one past the last
    /// readable record), and the indexed record before it: `(segment,
    /// position, record)`.
    fn locate(shared: &Shared, seq: u64, end: u64) -> Result<(u64, u64, u64), LogError> {
        let (base, entry) = {
            let state = shared.state();
            let first = state.segments.keys().next().copied().unwrap_or(0);
            if seq < first || seq > end {
                return Err(LogError::Gone {
                    dir: shared.dir.clone(),
                    seq,
                    first,
                });
            }
            let (&base, seg) =
                state
                    .segments
                    .range(..=seq)
                    .next_back()
                    .ok_or_else(|| LogError::Gone {
                        dir: shared.dir.clone(),
                        seq,
                        first,
                    })?;
            (base, segment::lookup(&seg.index, seq))
        };
        let (pos, at) = entry.map_or((SEGMENT_HEADER_LEN, base), |e| (e.pos, e.seq));
        Ok((base, pos, at))
    }

    /// Reads past the records before `seq`.
    fn skip_to(&mut self, seq: u64) -> Result<(), LogError> {
        while self.next_seq < seq {
            if self.next_header()?.is_none() {
                break;
            }
        }
        Ok(())
    }

    /// Puts the file at `next_seq` again, after records taken from the hand-off.
    fn catch_up_file(&mut self) -> Result<(), LogError> {
        let seq = self.next_seq;
        let end = self.head.borrow().next_seq;
        let (base, pos, at) = Self::locate(&self.shared, seq, end)?;
        let path = segment_path(&self.shared.dir, base);
        self.file = segment::open_at(&path, pos).map_err(LogError::io("open", &path))?;
        self.path = path;
        self.base = base;
        self.pos = pos;
        self.next_seq = at;
        self.skip_to(seq)?;
        self.moved_on = false;
        Ok(())
    }

    pub(crate) fn open_at(
        shared: Arc<Shared>,
        base: u64,
        pos: u64,
        seq: u64,
        visibility: Visibility,
    ) -> Result<Self, LogError> {
        let path = segment_path(&shared.dir, base);
        let file = segment::open_at(&path, pos).map_err(LogError::io("open", &path))?;
        if !visibility.before_fsync() {
            shared.durable_readers.fetch_add(1, Ordering::Relaxed);
        }
        Ok(LogReader {
            head: shared.end(visibility).subscribe(),
            visibility,
            shared,
            base,
            path,
            file,
            pos,
            next_seq: seq,
            decoder: RecordDecoder::default(),
            subscription: None,
            taken: VecDeque::new(),
            moved_on: false,
            from_memory: 0,
        })
    }

    /// The position of the next record to read.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Waits until there is something new to read.
    pub async fn wait(&mut self) {
        let next = self.next_seq;
        // The sender lives as long as the log; it never closes while we hold it.
        let _ = self.head.wait_for(|h| h.next_seq > next).await;
    }

    /// How many of the records it returned it took from memory, not
    /// the file.
    pub fn from_memory(&self) -> u64 {
        self.from_memory
    }

    /// The next record, or `None` when everything readable has been read.
    pub fn try_next(&mut self) -> Result<Option<ReadRecord>, LogError> {
        if let Some(record) = self.take_handed() {
            return Ok(Some(record));
        }
        if self.subscription.is_some() {
            return Ok(None);
        }
        if self.moved_on {
            self.catch_up_file()?;
        }
        let Some((header, payload)) = self.next_frame()? else {
            // Everything readable is read: what follows may come from memory.
            self.subscription = self
                .shared
                .handoff
                .subscribe(self.next_seq, self.visibility);
            return Ok(None);
        };
        let entry = self
            .decoder
            .decode(Bytes::from(payload))
            .map_err(|source| LogError::Record {
                path: self.path.clone(),
                seq: header.seq,
                source,
            })?;
        self.shared.read_from_file.fetch_add(1, Ordering::Relaxed);
        Ok(Some(ReadRecord {
            seq: header.seq,
            lsn: header.lsn,
            unit_end: header.unit_end,
            size: header.frame_len(),
            entry,
        }))
    }

    fn take_handed(&mut self) -> Option<ReadRecord> {
        if self.taken.is_empty() {
            let id = self.subscription?;
            if let Taken::Dropped = self.shared.handoff.take(id, &mut self.taken) {
                self.subscription = None;
            }
        }
        let record = self.taken.pop_front()?;
        self.next_seq = record.seq + 1;
        self.moved_on = true;
        self.from_memory += 1;
        self.shared.read_from_memory.fetch_add(1, Ordering::Relaxed);
        Some(record)
    }

    /// Reads and verifies the next frame without decoding it.
    pub(crate) fn next_header(&mut self) -> Result<Option<FrameHeader>, LogError> {
        Ok(self.next_frame()?.map(|(header, _)| header))
    }

    /// Reads and verifies the next frame, returning its header and payload.
    fn next_frame(&mut self) -> Result<Option<(FrameHeader, Vec<u8>)>, LogError> {
        let Some((header, header_bytes)) = self.read_header()? else {
            return Ok(None);
        };
        let mut payload = vec![0u8; header.len as usize];
        self.file
            .read_exact(&mut payload)
            .map_err(LogError::io("read", &self.path))?;
        self.check(&header, &header_bytes, &payload)?;
        self.pos += header.frame_len();
        self.next_seq += 1;
        Ok(Some((header, payload)))
    }

    fn check(
        &self,
        header: &FrameHeader,
        header_bytes: &[u8],
        payload: &[u8],
    ) -> Result<(), LogError> {
        let (_, crc) = frame::parse_header(header_bytes)
            .map_err(|e| LogError::corrupt(&self.path, self.pos, e))?;
        frame::verify_parts(header_bytes, payload, crc)
            .map_err(|e| LogError::corrupt(&self.path, self.pos, e))?;
        if header.seq != self.next_seq {
            return Err(LogError::Corrupt {
                path: self.path.clone(),
                offset: self.pos,
                problem: format!(
                    "record {} where record {} was expected",
                    header.seq, self.next_seq
                ),
            });
        }
        Ok(())
    }

    /// Reads the header of the next readable frame, moving to the next
    /// segment at the end of one.
    fn read_header(&mut self) -> Result<Option<(FrameHeader, [u8; HEADER_LEN])>, LogError> {
        let head = *self.head.borrow_and_update();
        if self.next_seq >= head.next_seq {
            return Ok(None);
        }
        loop {
            let limit = if self.base == head.segment {
                head.end
            } else {
                let state = self.shared.state();
                match state.segments.get(&self.base) {
                    Some(seg) => seg.len,
                    // Removed by retention while open: the open file still reads.
                    None => self
                        .file
                        .get_ref()
                        .get_ref()
                        .metadata()
                        .map_or(0, |m| m.len()),
                }
            };
            if self.pos < limit {
                // What is buffered ends where the file's reads are.
                let read_to = self.pos + self.file.buffer().len() as u64;
                self.file.get_mut().set_limit(limit.saturating_sub(read_to));
                break;
            }
            self.next_segment()?;
        }
        let mut bytes = [0u8; HEADER_LEN];
        self.file
            .read_exact(&mut bytes)
            .map_err(LogError::io("read", &self.path))?;
        let (header, _) =
            frame::parse_header(&bytes).map_err(|e| LogError::corrupt(&self.path, self.pos, e))?;
        Ok(Some((header, bytes)))
    }

    fn next_segment(&mut self) -> Result<(), LogError> {
        let base = self.next_seq;
        let exists = self.shared.state().segments.contains_key(&base);
        if !exists {
            let first = self
                .shared
                .state()
                .segments
                .keys()
                .next()
                .copied()
                .unwrap_or(0);
            return Err(if base < first {
                LogError::Gone {
                    dir: self.shared.dir.clone(),
                    seq: base,
                    first,
                }
            } else {
                LogError::corrupt(
                    &self.path,
                    self.pos,
                    FrameError::Incomplete {
                        needed: HEADER_LEN as u64,
                        available: 0,
                    },
                )
            });
        }
        let path = segment_path(&self.shared.dir, base);
        self.file =
            segment::open_at(&path, SEGMENT_HEADER_LEN).map_err(LogError::io("open", &path))?;
        self.path = path;
        self.base = base;
        self.pos = SEGMENT_HEADER_LEN;
        Ok(())
    }
}

impl Drop for LogReader {
    fn drop(&mut self) {
        if !self.visibility.before_fsync() {
            self.shared.durable_readers.fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(id) = self.subscription {
            self.shared.handoff.unsubscribe(id);
        }
    }
}
