//! The log of one source: opening and recovery, shared state, cursors and retention.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use walbridge_core::Lsn;

use crate::epoch::{Epochs, ResumePoint};
use crate::error::LogError;
use crate::frame::FrameError;
use crate::handoff::Handoff;
use crate::reader::LogReader;
use crate::segment::{
    self, IndexBuilder, IndexEntry, SEGMENT_HEADER_LEN, ScanError, index_path, segment_path,
};
use crate::sync_time::{self, SyncTime};
use crate::writer::{LogWriter, WRITE_BATCH};

/// When appended records are fsynced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// Before an append is acknowledged (group commit shares one fsync
    /// among every append waiting at the time). Nothing acknowledged is
    /// lost, whatever fails.
    Always,
    /// Appends are acknowledged once written to the operating system and
    /// fsynced every interval: a process crash loses nothing, a power
    /// failure or kernel crash may lose the last interval.
    Interval(Duration),
}

/// What to do when the log reaches `max_size` because a sink is behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WhenFull {
    /// Stop accepting appends until the sinks catch up; the source stops
    /// reading, and the publisher's slot retains WAL meanwhile.
    Block,
    /// Give up on the slowest sinks: their cursors are dropped (the sink
    /// needs a fresh snapshot) and the space is reclaimed. While no sink is
    /// behind another (all are level), appends wait as with `Block`.
    DropSink,
}

/// How a log is kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogOptions {
    /// A new segment is started once the current one reaches this size.
    pub segment_size: u64,
    /// When appends are fsynced.
    pub fsync: FsyncPolicy,
    /// With [`FsyncPolicy::Always`], the least time between two fsyncs
    /// that nothing waits for: while only readers of
    /// [`Visibility::Written`] records follow the log (they have the
    /// records before their fsync) and no reader of durable records is
    /// open, a steady stream's transactions share one fsync per gap
    /// instead of taking one each (a thousand a second at 3,000
    /// transactions/s, on a disk the servers fsync their own WAL to), and
    /// the durable end moves once per gap. Nothing is acknowledged before
    /// its fsync. 5 ms by default: the source reports the durable end to
    /// the publisher at most every 10 ms anyway.
    pub sync_gap: Duration,
    /// Keep segments every cursor has passed for at least this long (for replay).
    pub retention_time: Option<Duration>,
    /// Keep up to this many bytes of segments every cursor has passed.
    pub retention_size: Option<u64>,
    /// The most the log may hold.
    pub max_size: Option<u64>,
    /// What happens at `max_size`.
    pub when_full: WhenFull,
    /// Write segments into files zero-filled ahead (see `crate::spare`),
    /// when they are at least 1 MiB and written slower than a bulk load
    /// writes them but fast enough to fill within an hour: it makes each
    /// commit of a steady stream cheaper. On by default.
    pub preallocate: bool,
    /// The source whose log this is: the `source` label of its metrics
    /// ([`crate::SYNC_TIME_METRIC`]); empty, none are kept.
    pub source: String,
}

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            segment_size: 64 << 20,
            fsync: FsyncPolicy::Always,
            sync_gap: Duration::from_millis(5),
            retention_time: None,
            retention_size: None,
            max_size: None,
            when_full: WhenFull::Block,
            preallocate: true,
            source: String::new(),
        }
    }
}

impl LogOptions {
    /// Whether segments are written into zeros made ahead: asked for, and
    /// the segments are large enough for it to matter.
    pub(crate) fn preallocates(&self) -> bool {
        self.preallocate && self.segment_size >= crate::spare::PREALLOCATE_MIN
    }

    /// Whether every write is fsynced before it is published (`always`).
    pub(crate) fn syncs_each_write(&self) -> bool {
        matches!(self.fsync, FsyncPolicy::Always)
    }
}

/// Which records a reader sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Visibility {
    /// Durable records of complete units: nothing of a transaction before
    /// its last chunk, nothing of the initial copy before all of it. What
    /// a consumer that acts on each record must read.
    CompleteUnits,
    /// Every durable record, also of a unit still being written. For a
    /// consumer that makes nothing final before a unit's end (one that
    /// applies a whole unit in one target transaction): a unit cut short
    /// by a crash or a stop is removed when the log is reopened, so what
    /// such a consumer read of it must never take effect. Lets it work on
    /// a large transaction or the initial copy while it is still arriving.
    Unfinished,
    /// What [`Visibility::Unfinished`] sees, and besides, as soon as they
    /// are written and before their fsync, the records that are whole units
    /// by themselves (a small transaction, a message, sequences' values)
    /// while nothing else precedes them past the durable end. For a
    /// consumer that applies units idempotently by their LSN, such as one
    /// that stores the LSN it applied up to in its target and passes over
    /// what ends at or before it: a record lost in a crash before its fsync
    /// was never confirmed to the publisher (the source confirms only the
    /// durable end), which sends the same unit, with the same LSN, again.
    /// Spares such a consumer the wait for the fsync on a steady stream.
    Written,
    /// What [`Visibility::CompleteUnits`] sees, and besides the whole units
    /// [`Visibility::Written`] shows before their fsync: nothing of a unit
    /// before its end, but a small transaction as soon as it is written.
    /// For a consumer that acts on each unit as it comes and keeps (or
    /// acknowledges) only what is durable ([`Log::head`]): a unit lost in a
    /// crash before its fsync comes again from the publisher, the same,
    /// after the durable end the consumer resumes from.
    WrittenUnits,
}

impl Visibility {
    /// Whether it sees records before their fsync: its readers do not wait
    /// for an fsync (see [`LogOptions::sync_gap`]).
    pub(crate) fn before_fsync(self) -> bool {
        matches!(self, Visibility::Written | Visibility::WrittenUnits)
    }
}

/// How far the log can be read: everything before `next_seq` is durable
/// (per the fsync policy) and made of complete units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    /// One past the last readable record.
    pub next_seq: u64,
    /// The segment holding the end of the readable records.
    pub segment: u64,
    /// The byte offset in that segment where readable records end.
    pub end: u64,
    /// The LSN of the last readable record: the source resumes after it.
    pub last_lsn: Lsn,
}

/// What the log knows about one segment.
#[derive(Clone, Debug)]
pub(crate) struct Segment {
    /// Bytes written (the file may be longer while a write is in progress).
    pub len: u64,
    /// One past its last record.
    pub next_seq: u64,
    /// The sparse index.
    pub index: Vec<IndexEntry>,
    /// When it was last written.
    pub modified: SystemTime,
}

#[derive(Debug, Default)]
pub(crate) struct State {
    /// By base sequence number; the last one is being written.
    pub segments: BTreeMap<u64, Segment>,
    /// Each cursor's position: the next record it will read.
    cursors: HashMap<String, u64>,
    /// Cursors dropped because the log was full.
    dropped: HashSet<String>,
}

impl State {
    pub(crate) fn total_size(&self) -> u64 {
        self.segments.values().map(|s| s.len).sum()
    }

    fn first_seq(&self) -> u64 {
        self.segments.keys().next().copied().unwrap_or(0)
    }
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub dir: PathBuf,
    pub id: String,
    /// Every opening's first record (see crate::epoch).
    epochs: Epochs,
    pub options: LogOptions,
    state: Mutex<State>,
    pub head: watch::Sender<Head>,
    /// `head`'s `last_lsn` alone, for the source (see [`Log::subscribe_last_lsn`]).
    pub last_lsn: watch::Sender<Lsn>,
    /// The end of the durable records, complete units or not (see
    /// [`Visibility::Unfinished`]).
    pub durable: watch::Sender<Head>,
    /// The end of what [`Visibility::Written`] readers see.
    pub written: watch::Sender<Head>,
    /// The end of what [`Visibility::WrittenUnits`] readers see (moved
    /// with the others: [`Shared::move_written_units`]).
    pub written_units: watch::Sender<Head>,
    /// Total bytes in the log.
    pub size: watch::Sender<u64>,
    /// Records handed from the writer to readers that have caught up.
    pub handoff: Handoff,
    /// Records readers returned from the hand-off.
    pub read_from_memory: AtomicU64,
    /// Records readers read from the file.
    pub read_from_file: AtomicU64,
    /// Readers open that see only durable records (any [`Visibility`] but
    /// `Written` and `WrittenUnits`): while there are none, the sync thread
    /// may gather fsyncs (see [`crate::writer`]).
    pub durable_readers: AtomicUsize,
    /// Fsyncs of the records made by an appender writing its own batch …
    pub synced_by_appender: AtomicU64,
    /// … by the sync thread (of the batches appenders wrote themselves
    /// while readers of written records follow, and `interval`'s) …
    pub synced_by_sync_thread: AtomicU64,
    /// … and by the writer thread.
    pub synced_by_writer: AtomicU64,
    /// How long they took.
    pub sync_time: SyncTime,
}

impl Shared {
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; go on with it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The end a reader of `visibility` reads to.
    pub(crate) fn end(&self, visibility: Visibility) -> &watch::Sender<Head> {
        match visibility {
            Visibility::CompleteUnits => &self.head,
            Visibility::Unfinished => &self.durable,
            Visibility::Written => &self.written,
            Visibility::WrittenUnits => &self.written_units,
        }
    }

    /// Whether a reader follows the records written before their fsync.
    pub(crate) fn follows_written(&self) -> bool {
        self.written.receiver_count() > 0 || self.written_units.receiver_count() > 0
    }

    /// Moves the end of [`Visibility::WrittenUnits`] after the writer moved
    /// the others (under its lock): the written end while everything past
    /// the durable end is whole units written and shown before their
    /// fsync, and nothing of an unfinished unit is durable; the complete
    /// units' end otherwise. Returns whether it moved and a reader follows it.
    pub(crate) fn move_written_units(&self) -> bool {
        let (head, durable, written) = (
            *self.head.borrow(),
            *self.durable.borrow(),
            *self.written.borrow(),
        );
        let end = if shows_written_units(head.next_seq, durable.next_seq, written.next_seq) {
            written
        } else {
            head
        };
        send_if_moved(&self.written_units, end) && self.written_units.receiver_count() > 0
    }
}

/// Whether [`Visibility::WrittenUnits`] readers read to the written end
/// (else to the complete units' end), given the complete units' end, the
/// durable end and the written end (see [`Shared::move_written_units`]).
pub(crate) fn shows_written_units(head_next: u64, durable_next: u64, written_next: u64) -> bool {
    written_next > durable_next && durable_next == head_next
}

/// Moves an end, waking its readers only if it moved (then true).
pub(crate) fn send_if_moved<T: PartialEq>(end: &watch::Sender<T>, to: T) -> bool {
    end.send_if_modified(|at| {
        let moved = *at != to;
        *at = to;
        moved
    })
}

/// Fsyncs of a log's records, by who made them ([`Log::syncs`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Syncs {
    /// An appender writing its own batch, which nothing reads before it is durable.
    pub appender: u64,
    /// The sync thread: batches appenders wrote while readers of written
    /// records follow, and every fsync of `fsync = "interval"`.
    pub sync_thread: u64,
    /// The writer thread: a backlog, the initial copy, a large transaction,
    /// a new segment.
    pub writer: u64,
}

impl Syncs {
    /// Each count with the `by` label its fsyncs have in the metrics.
    pub fn by_label(&self) -> [(&'static str, u64); 3] {
        [
            (sync_time::BY_APPENDER, self.appender),
            (sync_time::BY_SYNC_THREAD, self.sync_thread),
            (sync_time::BY_WRITER, self.writer),
        ]
    }
}

/// A source's durable, transaction-ordered log. Cheap to clone; every clone
/// is the same log.
#[derive(Clone, Debug)]
pub struct Log {
    pub(crate) shared: Arc<Shared>,
}

/// What opening the log had to repair.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Bytes of torn or incomplete records removed from the end.
    pub truncated_bytes: u64,
    /// Records removed: a torn frame, or chunks of a transaction whose last chunk was never written.
    pub removed_records: u64,
}

impl Log {
    /// Opens (creating if needed) the log in `dir`, repairing a torn tail,
    /// and starts its writer.
    pub fn open(dir: &Path, options: LogOptions) -> Result<(Log, LogWriter, Recovery), LogError> {
        std::fs::create_dir_all(dir).map_err(LogError::io("create", dir))?;
        let id = log_id(dir)?;
        crate::spare::remove_leftovers(dir, options.preallocates())?;
        for path in files_ending(dir, CREATING_SUFFIX)? {
            std::fs::remove_file(&path).map_err(LogError::io("remove", &path))?;
        }
        let mut bases = list_segments(dir)?;
        let mut recovery = Recovery::default();
        let mut segments = BTreeMap::new();
        if bases.is_empty() {
            // Grown as it is written: a new log is usually followed by the
            // initial copy, a bulk load (see crate::spare).
            create_segment(dir, 0, Lsn::ZERO)?;
            bases.push(0);
        }
        let (tail, last_lsn) = recover_tail(dir, &mut bases, &options, &mut recovery)?;
        let first_seq = *bases.first().unwrap_or(&tail.next_seq);
        let epochs = Epochs::begin(dir, tail.next_seq, last_lsn, first_seq)?;
        for (i, &base) in bases.iter().enumerate() {
            let path = segment_path(dir, base);
            let meta = std::fs::metadata(&path).map_err(LogError::io("stat", &path))?;
            let next_seq = bases.get(i + 1).copied().unwrap_or(tail.next_seq);
            // The last segment may be longer than its records (zeros made ahead).
            let (index, len) = if i + 1 == bases.len() {
                (tail.index.entries.clone(), tail.valid_end)
            } else {
                (sealed_index(dir, base, meta.len())?, meta.len())
            };
            segments.insert(
                base,
                Segment {
                    len,
                    next_seq,
                    index,
                    modified: meta.modified().unwrap_or_else(|_| SystemTime::now()),
                },
            );
        }
        let active = *bases.last().unwrap_or(&0);
        let head = Head {
            next_seq: tail.next_seq,
            segment: active,
            end: tail.valid_end,
            last_lsn,
        };
        let state = State {
            segments,
            ..State::default()
        };
        let size = state.total_size();
        let sync_time = SyncTime::new(&options.source);
        let shared = Arc::new(Shared {
            dir: dir.to_owned(),
            id,
            epochs,
            options,
            state: Mutex::new(state),
            head: watch::Sender::new(head),
            last_lsn: watch::Sender::new(head.last_lsn),
            durable: watch::Sender::new(head),
            written: watch::Sender::new(head),
            written_units: watch::Sender::new(head),
            size: watch::Sender::new(size),
            handoff: Handoff::new(head.next_seq),
            read_from_memory: AtomicU64::new(0),
            read_from_file: AtomicU64::new(0),
            durable_readers: AtomicUsize::new(0),
            synced_by_appender: AtomicU64::new(0),
            synced_by_sync_thread: AtomicU64::new(0),
            synced_by_writer: AtomicU64::new(0),
            sync_time,
        });
        let writer = LogWriter::start(shared.clone(), active, tail.valid_end, tail.index, head)?;
        Ok((Log { shared }, writer, recovery))
    }

    /// Records its readers have returned since it was opened: `(taken
    /// from memory, read from the file)` (see [`LogReader`]).
    pub fn records_read(&self) -> (u64, u64) {
        (
            self.shared.read_from_memory.load(Ordering::Relaxed),
            self.shared.read_from_file.load(Ordering::Relaxed),
        )
    }

    /// Fsyncs of its records since it was opened, by who made them (see
    /// [`LogWriter::begin_batch`]).
    pub fn syncs(&self) -> Syncs {
        Syncs {
            appender: self.shared.synced_by_appender.load(Ordering::Relaxed),
            sync_thread: self.shared.synced_by_sync_thread.load(Ordering::Relaxed),
            writer: self.shared.synced_by_writer.load(Ordering::Relaxed),
        }
    }

    /// The log's directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// The log's identity, chosen when it was created: cursors record it
    /// so that a position is never applied to a different log.
    pub fn id(&self) -> &str {
        &self.shared.id
    }

    /// The log's epoch: one more each time it is opened (see
    /// [`Log::resume_point`]). A position a reader of records before their
    /// fsync hands out names it.
    pub fn epoch(&self) -> u64 {
        self.shared.epochs.current()
    }

    /// Where a reader that had read the records before `next` during
    /// `epoch` resumes now: `next` itself unless a crash of the machine
    /// took records before it, which come again (as the publisher sends
    /// them again) from the end that survived. Positions handed out only
    /// once durable ([`Log::head`]) are always kept, whatever their epoch.
    pub fn resume_point(&self, epoch: u64, next: u64) -> ResumePoint {
        self.shared.epochs.resume_point(epoch, next)
    }

    /// How far the log can be read now.
    pub fn head(&self) -> Head {
        *self.shared.head.borrow()
    }

    /// Follows the readable end of the log.
    pub fn subscribe(&self) -> watch::Receiver<Head> {
        self.shared.head.subscribe()
    }

    /// Follows the LSN of the last readable record ([`Head::last_lsn`]):
    /// what the source may confirm to the publisher. A watch of its own,
    /// moved with the head, so that a source following it is woken by
    /// nothing in between (a task converting `Head`s would be woken by
    /// every transaction).
    pub fn subscribe_last_lsn(&self) -> watch::Receiver<Lsn> {
        self.shared.last_lsn.subscribe()
    }

    /// The oldest record still held.
    pub fn first_seq(&self) -> u64 {
        self.shared.state().first_seq()
    }

    /// The LSN just before the oldest record still held (`0/0` while the
    /// log still holds its beginning): a consumer that has processed less
    /// than this has missed records that were removed.
    pub fn start_lsn(&self) -> Result<Lsn, LogError> {
        self.segment_start(State::first_seq).map(|(_, lsn)| lsn)
    }

    /// The first record of the oldest segment last written to within
    /// `age` (the segment being written always is), and the LSN just
    /// before it: where a consumer whose records are kept for at most
    /// `age` is held back to.
    pub fn written_within(&self, age: Duration) -> Result<(u64, Lsn), LogError> {
        let since = SystemTime::now().checked_sub(age);
        self.segment_start(|state| {
            let newest = state.segments.keys().next_back().copied().unwrap_or(0);
            since
                .and_then(|since| {
                    state
                        .segments
                        .iter()
                        .find(|(_, s)| s.modified >= since)
                        .map(|(&base, _)| base)
                })
                .unwrap_or(if since.is_some() {
                    newest
                } else {
                    state.first_seq()
                })
        })
    }

    /// The segment `pick` chooses (by its base), and the LSN just before
    /// its first record, from its header.
    fn segment_start(&self, pick: impl Fn(&State) -> u64) -> Result<(u64, Lsn), LogError> {
        use std::io::Read;
        loop {
            let (base, first) = {
                let state = self.shared.state();
                (pick(&state), state.first_seq())
            };
            let path = segment_path(&self.shared.dir, base);
            let mut header = [0u8; SEGMENT_HEADER_LEN as usize];
            match File::open(&path).and_then(|mut f| f.read_exact(&mut header)) {
                Ok(()) => {
                    return segment::check_header(&header)
                        .map(|lsn| (base, lsn))
                        .map_err(|_| LogError::Segment {
                            path,
                            problem: "bad segment header".into(),
                        });
                }
                // Retention removed it meanwhile: look again.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && self.first_seq() != first => {
                }
                Err(e) => return Err(LogError::io("read", &path)(e)),
            }
        }
    }

    /// Segment files held on disk (the last one is being written).
    pub fn segment_count(&self) -> usize {
        self.shared.state().segments.len()
    }

    /// Bytes held on disk.
    pub fn size(&self) -> u64 {
        *self.shared.size.borrow()
    }

    /// A reader positioned at record `seq`, seeing complete units only.
    pub fn reader(&self, seq: u64) -> Result<LogReader, LogError> {
        LogReader::open(self.shared.clone(), seq, Visibility::CompleteUnits)
    }

    /// A reader positioned at record `seq` with the given visibility.
    pub fn reader_with(&self, seq: u64, visibility: Visibility) -> Result<LogReader, LogError> {
        LogReader::open(self.shared.clone(), seq, visibility)
    }

    /// The position of the first record whose LSN is after `lsn`: where a
    /// consumer that has applied everything up to `lsn` resumes.
    pub fn seq_after_lsn(&self, lsn: Lsn) -> Result<u64, LogError> {
        let head = self.head();
        if lsn >= head.last_lsn {
            return Ok(head.next_seq);
        }
        let (base, entry) = {
            let state = self.shared.state();
            let mut found = None;
            for (&base, seg) in &state.segments {
                match seg.index.first() {
                    Some(first) if first.lsn <= lsn => {
                        found = segment::lookup_lsn(&seg.index, lsn).map(|e| (base, e))
                    }
                    Some(_) => break,
                    None => {}
                }
            }
            match found {
                Some(f) => f,
                None => return Ok(state.first_seq()),
            }
        };
        let mut reader = LogReader::open_at(
            self.shared.clone(),
            base,
            entry.pos,
            entry.seq,
            Visibility::CompleteUnits,
        )?;
        while let Some(header) = reader.next_header()? {
            if header.lsn > lsn {
                return Ok(header.seq);
            }
        }
        Ok(head.next_seq)
    }

    /// Registers a cursor at `seq`, holding back retention for it. A
    /// cursor that was dropped because the log was full stays dropped.
    pub fn register_cursor(&self, name: &str, seq: u64) {
        let mut state = self.shared.state();
        if !state.dropped.contains(name) {
            state.cursors.insert(name.to_owned(), seq);
        }
    }

    /// Records that cursor `name` durably reached `seq`, and removes what
    /// no cursor needs any more.
    pub fn advance_cursor(&self, name: &str, seq: u64) -> Result<(), LogError> {
        {
            let mut state = self.shared.state();
            match state.cursors.get_mut(name) {
                Some(at) => *at = (*at).max(seq),
                None => return Ok(()),
            }
        }
        self.collect()
    }

    /// True once cursor `name` has been dropped because the log was full.
    pub fn is_dropped(&self, name: &str) -> bool {
        self.shared.state().dropped.contains(name)
    }

    /// Deletes segments that every cursor has passed and retention does not
    /// keep; at `max_size` with [`WhenFull::DropSink`], drops the slowest
    /// cursors.
    pub fn collect(&self) -> Result<(), LogError> {
        let options = &self.shared.options;
        let mut state = self.shared.state();
        let now = SystemTime::now();
        let mut total = state.total_size();
        let newest = state.segments.keys().next_back().copied().unwrap_or(0);
        let mut remove = Vec::new();
        let mut kept_after = total;
        let State {
            segments,
            cursors,
            dropped,
        } = &mut *state;
        for (&base, seg) in segments.iter() {
            if base == newest {
                break;
            }
            // Without any cursor nobody has said what it needs: keep everything.
            let behind_all = !cursors.is_empty() && cursors.values().all(|&c| c >= seg.next_seq);
            kept_after -= seg.len;
            let within_time = options
                .retention_time
                .is_some_and(|t| now.duration_since(seg.modified).unwrap_or_default() < t);
            let within_size = options
                .retention_size
                .is_some_and(|s| kept_after + seg.len <= s);
            let over_max = options.max_size.is_some_and(|m| total > m);
            let retained = (within_time || within_size) && !over_max;
            if behind_all && !retained {
                remove.push(base);
                total -= seg.len;
                continue;
            }
            if !behind_all && over_max && options.when_full == WhenFull::DropSink {
                // Drop the cursor(s) furthest behind, and only those another
                // cursor is ahead of: while all are level, appends wait (as
                // with `block`) until one moves on. If another still needs
                // the segment, it stays until that one moves on too.
                let slowest = cursors.values().copied().min().unwrap_or(0);
                let fastest = cursors.values().copied().max().unwrap_or(0);
                let slow: Vec<String> = cursors
                    .iter()
                    .filter(|&(_, &c)| c == slowest && c < fastest)
                    .map(|(n, _)| n.clone())
                    .collect();
                for name in slow {
                    tracing::error!(
                        log = %self.shared.dir.display(),
                        cursor = %name,
                        max_size = options.max_size.unwrap_or_default(),
                        "the log reached max_size: dropping the sink that is furthest behind; it needs a fresh snapshot"
                    );
                    cursors.remove(&name);
                    dropped.insert(name);
                }
                if cursors.values().all(|&c| c >= seg.next_seq) {
                    remove.push(base);
                    total -= seg.len;
                    continue;
                }
            }
            break;
        }
        for base in &remove {
            state.segments.remove(base);
        }
        let size = state.total_size();
        drop(state);
        for base in remove {
            let path = segment_path(&self.shared.dir, base);
            std::fs::remove_file(&path).map_err(LogError::io("remove", &path))?;
            let _ = std::fs::remove_file(index_path(&self.shared.dir, base));
            tracing::debug!(segment = %path.display(), "removed log segment");
        }
        self.shared.size.send_replace(size);
        Ok(())
    }
}

/// Reads the log's identity, creating it (durably) for a new log.
fn log_id(dir: &Path) -> Result<String, LogError> {
    let path = dir.join("id");
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => return Ok(id.trim().to_owned()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(LogError::io("read", &path)(e)),
    }
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let id = format!("{nanos:x}-{:x}", std::process::id());
    write_durably(dir, "id", id.as_bytes())?;
    Ok(id)
}

/// Replaces file `name` in `dir` with `contents` atomically and durably:
/// written and fsynced under another name, renamed, the directory fsynced.
pub(crate) fn write_durably(dir: &Path, name: &str, contents: &[u8]) -> Result<(), LogError> {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = File::create(&tmp).map_err(LogError::io("create", &tmp))?;
    f.write_all(contents)
        .and_then(|()| f.sync_all())
        .map_err(LogError::io("write", &tmp))?;
    std::fs::rename(&tmp, dir.join(name)).map_err(LogError::io("rename", &tmp))?;
    sync_dir(dir)
}

fn list_segments(dir: &Path) -> Result<Vec<u64>, LogError> {
    let mut bases = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(LogError::io("list", dir))? {
        let entry = entry.map_err(LogError::io("list", dir))?;
        if let Some(base) = entry
            .file_name()
            .to_str()
            .and_then(segment::parse_segment_name)
        {
            bases.push(base);
        }
    }
    bases.sort_unstable();
    Ok(bases)
}

/// A segment being created is named so until its header is durable: a
/// crash never leaves a segment name on a file without its header.
const CREATING_SUFFIX: &str = ".creating";

/// Creates an empty segment and makes it durable (file and directory
/// entry): written and synced under another name, then renamed.
pub(crate) fn create_segment(dir: &Path, base: u64, start_lsn: Lsn) -> Result<File, LogError> {
    let path = segment_path(dir, base);
    let creating = dir.join(format!("{base:020}{CREATING_SUFFIX}"));
    let created = File::options()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&creating)
        .map_err(LogError::io("create", &creating))
        .and_then(|mut file| {
            file.write_all(&segment::header(start_lsn, false))
                .map_err(LogError::io("write", &creating))?;
            file.sync_all().map_err(LogError::io("fsync", &creating))?;
            std::fs::rename(&creating, &path).map_err(LogError::io("rename", &creating))?;
            Ok(file)
        });
    if created.is_err() {
        // Creating it is tried again (a full disk).
        let _ = std::fs::remove_file(&creating);
    }
    let file = created?;
    sync_dir(dir)?;
    Ok(file)
}

/// The files in `dir` whose names end with `suffix`.
pub(crate) fn files_ending(dir: &Path, suffix: &str) -> Result<Vec<PathBuf>, LogError> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(LogError::io("list", dir))? {
        let entry = entry.map_err(LogError::io("list", dir))?;
        if entry.file_name().to_string_lossy().ends_with(suffix) {
            found.push(entry.path());
        }
    }
    Ok(found)
}

pub(crate) fn sync_dir(dir: &Path) -> Result<(), LogError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(LogError::io("fsync", dir))
}

fn sealed_index(dir: &Path, base: u64, len: u64) -> Result<Vec<IndexEntry>, LogError> {
    let path = index_path(dir, base);
    if let Some(entries) = segment::load_index(&path, base, len) {
        return Ok(entries);
    }
    let seg = segment_path(dir, base);
    let scan = segment::scan(&seg, base).map_err(|e| scan_error(&seg, e))?;
    if let Some((offset, problem, _)) = scan.bad {
        return Err(LogError::corrupt(seg, offset, problem));
    }
    let _ = segment::store_index(&path, &scan.index.entries);
    Ok(scan.index.entries)
}

fn scan_error(path: &Path, e: ScanError) -> LogError {
    match e {
        ScanError::Io(source) => LogError::Io {
            action: "read",
            path: path.to_owned(),
            source,
        },
        ScanError::Header(segment::HeaderProblem::NotASegment) => LogError::Segment {
            path: path.to_owned(),
            problem: "not a walbridge log segment (bad header)".into(),
        },
        ScanError::Header(segment::HeaderProblem::Version(v)) => LogError::Segment {
            path: path.to_owned(),
            problem: format!(
                "layout version {v}, which this walbridge does not read (it reads {} and {}); use the walbridge that wrote it",
                segment::VERSION,
                segment::VERSION_PREALLOCATED
            ),
        },
        ScanError::Sequence {
            offset,
            expected,
            found,
        } => LogError::Corrupt {
            path: path.to_owned(),
            offset,
            problem: format!("record {found} where record {expected} was expected"),
        },
    }
}

/// The state of the last segment after recovery.
pub(crate) struct Tail {
    pub next_seq: u64,
    pub valid_end: u64,
    pub index: IndexBuilder,
}

/// Scans the last segment, cuts a torn tail and any records of a unit that
/// never completed (which may reach back into earlier segments), and
/// returns the tail's state and the LSN of the last complete unit.
fn recover_tail(
    dir: &Path,
    bases: &mut Vec<u64>,
    options: &LogOptions,
    recovery: &mut Recovery,
) -> Result<(Tail, Lsn), LogError> {
    let mut sealed = false;
    loop {
        let Some(&base) = bases.last() else {
            return Err(LogError::Segment {
                path: dir.to_owned(),
                problem: "no segment left".into(),
            });
        };
        let path = segment_path(dir, base);
        let len = std::fs::metadata(&path)
            .map_err(LogError::io("stat", &path))?
            .len();
        if !sealed && len < SEGMENT_HEADER_LEN && bases.len() > 1 {
            // A roll cut short before the new segment's header was written
            // (by a walbridge that named it first): nothing was in it, and
            // the segment before was sealed whole.
            tracing::warn!(log = %dir.display(), segment = base, "removed a segment whose creation a crash cut short");
            std::fs::remove_file(&path).map_err(LogError::io("remove", &path))?;
            bases.pop();
            sealed = true;
            continue;
        }
        let scan = segment::scan(&path, base).map_err(|e| scan_error(&path, e))?;
        // Only the segment that was being written can have a torn end; one
        // sealed by a roll was fsynced whole.
        // Nothing but zeros from the first bad frame on is the room of a
        // preallocated segment (see crate::spare), which only the segment
        // being written has.
        let bad = scan
            .bad
            .filter(|&(offset, ..)| sealed || scan.written_end > offset);
        if let Some((offset, problem, declared)) = bad
            && (sealed || !is_torn_tail(options, scan.written_end - offset, declared, problem))
        {
            return Err(LogError::corrupt(path, offset, problem));
        }
        let (cut, next_seq, lsn) = match scan.last_unit_end {
            Some(end) => end,
            None if bases.len() > 1 => {
                // Nothing in this segment completed: all of it belongs to a
                // unit that started earlier (or it is empty).
                recovery.truncated_bytes += scan.written_end - SEGMENT_HEADER_LEN;
                recovery.removed_records += scan.next_seq - base;
                std::fs::remove_file(&path).map_err(LogError::io("remove", &path))?;
                let _ = std::fs::remove_file(index_path(dir, base));
                bases.pop();
                sealed = true;
                continue;
            }
            None => (SEGMENT_HEADER_LEN, base, scan.start_lsn),
        };
        // Zeros made ahead after the records stay; anything else past the cut goes.
        if cut < scan.written_end {
            recovery.truncated_bytes += scan.written_end - cut;
            recovery.removed_records += scan.next_seq - next_seq;
            if bad.is_some() {
                recovery.removed_records += 1;
            }
            let file = File::options()
                .write(true)
                .open(&path)
                .map_err(LogError::io("open", &path))?;
            if scan.preallocated {
                // Zeros again, so the room made ahead stays.
                let zeros = vec![0u8; (scan.written_end - cut) as usize];
                file.write_all_at(&zeros, cut)
                    .map_err(LogError::io("write zeros over the torn end of", &path))?;
                file.sync_data().map_err(LogError::io("fsync", &path))?;
            } else {
                file.set_len(cut).map_err(LogError::io("truncate", &path))?;
                file.sync_all().map_err(LogError::io("fsync", &path))?;
            }
        } else {
            // A process that crashed may have written records it had not
            // fsynced: they are read back from the operating system's
            // cache, and the head the source confirms to the publisher
            // and the new epoch both start after them (see crate::epoch).
            File::open(&path)
                .and_then(|file| file.sync_data())
                .map_err(LogError::io("fsync", &path))?;
        }
        if recovery.truncated_bytes > 0 {
            tracing::warn!(
                log = %dir.display(),
                bytes = recovery.truncated_bytes,
                records = recovery.removed_records,
                "removed the unfinished end of the log left by a crash (never acknowledged; the source sends it again)"
            );
        }
        let mut index = scan.index;
        index.truncate(cut);
        return Ok((
            Tail {
                next_seq,
                valid_end: cut,
                index,
            },
            lsn,
        ));
    }
}

/// Whether a bad frame `remaining` bytes before the end of the last segment
/// can be the torn end of a write cut short by a crash. With fsync
/// `always`, no write reaches further than one write batch (or one frame,
/// if larger) past the last fsync; damage further from the end is
/// corruption. With `interval`, a power failure may tear any unsynced part.
fn is_torn_tail(options: &LogOptions, remaining: u64, declared: u64, problem: FrameError) -> bool {
    match options.fsync {
        FsyncPolicy::Interval(_) => true,
        FsyncPolicy::Always => {
            matches!(problem, FrameError::Incomplete { .. })
                || remaining <= (WRITE_BATCH as u64).max(declared)
        }
    }
}
