//! The single writer of a log: group commit and segment rolling.
//!
//! Appends queue up while the previous write and fsync are in progress;
//! the writer thread then takes everything queued (up to [`WRITE_BATCH`]
//! bytes), writes it with one `write` and makes it durable with one
//! `fdatasync`. Readers and the source see records only once they are
//! durable and their unit (transaction) is complete; readers that asked
//! for it ([`crate::Visibility::Written`], [`crate::Visibility::WrittenUnits`])
//! see whole units once written, while the fsync runs. A steady stream's
//! segments are written into zeros made ahead ([`crate::spare`]), so that
//! the `fdatasync` has no file length to make durable.
//!
//! Written here: an appender whose batch is a caught-up stream's
//! transactions, nothing waiting after them ([`LogWriter::begin_batch`]: one,
//! or the few a publisher sends back to back), writes it itself, on its own
//! thread, when nothing is queued for the writer thread and the last fsync
//! was quick ([`QUICK_SYNC`]). On a steady stream that spares each
//! transaction a wake-up of the writer thread, and the readers it wakes run
//! next on the appender's own thread (a runtime worker). Who fsyncs it
//! depends on who waits for that:
//! * while readers of written records (either visibility) follow the
//!   log, the sync thread: they have the records before the
//!   fsync, and the appender goes on to its next batch while the sync
//!   thread makes this one durable and publishes what was written when its
//!   fsync began (one fsync covers every batch written before it, so a
//!   stream faster than the disk's fsyncs shares them). In the appender's
//!   path, the fsync made the next transaction wait before it was received.
//!   While nothing else waits for it (no reader of durable records is
//!   open, and the readers of written records have everything written),
//!   it fsyncs at most once per [`crate::LogOptions::sync_gap`], for all the
//!   batches written since;
//! * otherwise the appender, before it publishes: every reader waits for
//!   the fsync, and handing it to another thread only adds that thread's
//!   wake-ups to their delay (measured: the log's share at 1,000
//!   transactions/s 0.25 against 0.17 ms).
//!
//! The rules do not change: one state, behind
//! one lock, appended in order (the writer thread's queue is empty before
//! the appender writes, and the appender hands anything that needs a new
//! segment, or finds the disk full, to the thread, after what it added);
//! readers other than those of written records see what it wrote once it
//! is durable. A backlog goes to the thread, which writes and fsyncs one
//! batch while the next is decoded and encoded (written here, a catch-up's
//! batches kept a runtime worker waiting on each fsync, and took longer).
//!
//! With `fsync = "interval"` what is written is published at once and the
//! sync thread fsyncs it once per interval, without the lock: the writers
//! never wait for that fsync.
//!
//! A full disk is not a failure: a write that finds no room is cut back to
//! the last whole record (a partial write would leave bytes no frame
//! accounts for) and tried again every [`ROOM_RETRY`] until there is room.
//! Meanwhile the writer takes no appends, so the queue fills, the source
//! stops reading from the publisher, and nothing past the durable end is
//! confirmed there: the publisher keeps those changes and nothing is lost.
//! Any other failure stops the writer for good; [`LogWriter::failed`]
//! tells whoever waits on it at once, before their next append.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{Semaphore, mpsc, watch};
use walbridge_core::Lsn;

use crate::error::LogError;
use crate::frame;
use crate::handoff::Ends;
use crate::log::{
    FsyncPolicy, Head, Log, Segment, Shared, WhenFull, create_segment, send_if_moved, sync_dir,
};
use crate::reader::ReadRecord;
use crate::record::Entry;
use crate::segment::{self, IndexBuilder, SEGMENT_HEADER_LEN, index_path, segment_path};
use crate::spare::{Ready, Spares};

/// The most bytes written between two fsyncs (a larger single record is written alone).
pub const WRITE_BATCH: usize = 8 << 20;

/// How often a write that found the disk full is tried again.
const ROOM_RETRY: Duration = Duration::from_secs(1);

/// How often a full disk is reported while it stays full.
const FULL_REPORT: Duration = Duration::from_secs(60);

/// An appender writes its batch itself only while an fsync takes less than
/// this: it holds the thread it runs on (a runtime's worker) meanwhile,
/// which a busy disk's fsync would hold too long.
pub(crate) const QUICK_SYNC: Duration = Duration::from_millis(1);

/// Records queued before `append` waits.
const QUEUE: usize = 4096;

/// Bytes queued before `append` waits: bounds the writer's memory whatever
/// the record sizes.
const QUEUE_BYTES: usize = 32 << 20;

enum Command {
    Append {
        payload: Vec<u8>,
        /// What the payload holds, for readers taking it from memory
        /// ([`crate::handoff`]); only on a record that is a whole unit.
        entry: Option<Entry>,
        lsn: Lsn,
        unit_end: bool,
        /// Queue bytes to give back once written.
        permits: u32,
    },
    /// Write what an appender left in the buffer (it found the disk full).
    Write,
}

/// Appends to a log. There is one per log; appends are applied in the
/// order they are made.
#[derive(Debug)]
pub struct LogWriter {
    commands: mpsc::Sender<Command>,
    thread: Option<std::thread::JoinHandle<Result<(), LogError>>>,
    shared: Arc<Shared>,
    /// Why the writer thread stopped, once it has.
    failure: Arc<watch::Sender<Option<String>>>,
    queued: Arc<Semaphore>,
    /// The last record queued did not end its unit.
    within_unit: AtomicBool,
    /// What the writer thread writes from; the appender too, in a batch
    /// it writes itself.
    state: Arc<Mutex<WriterState>>,
    /// Commands sent to the writer thread and not yet applied.
    in_flight: Arc<AtomicUsize>,
    /// The batch under way is written here ([`LogWriter::begin_batch`]).
    here: AtomicBool,
    /// Wakes the sync thread (with `state`'s lock).
    to_sync: Arc<Condvar>,
}

impl LogWriter {
    pub(crate) fn start(
        shared: Arc<Shared>,
        base: u64,
        len: u64,
        index: IndexBuilder,
        head: Head,
    ) -> Result<Self, LogError> {
        let path = segment_path(&shared.dir, base);
        let file = File::options()
            .write(true)
            .open(&path)
            .map_err(LogError::io("open", &path))?;
        let allocated = file.metadata().map_err(LogError::io("stat", &path))?.len();
        let spares = if shared.options.preallocates() {
            Some(Spares::start(&shared.dir, shared.options.segment_size)?)
        } else {
            None
        };
        let (tx, rx) = mpsc::channel(QUEUE);
        let in_flight = Arc::new(AtomicUsize::new(0));
        let failure = Arc::new(watch::Sender::new(None));
        let queued = Arc::new(Semaphore::new(QUEUE_BYTES));
        let state = Arc::new(Mutex::new(WriterState {
            shared: shared.clone(),
            file: Arc::new(file),
            base,
            len,
            allocated,
            spares,
            writing_since: None,
            asked_spare: false,
            index,
            published_index: 0,
            next_seq: head.next_seq,
            last_unit_lsn: head.last_lsn,
            tail: head,
            unit_tail: head,
            in_file: InFile {
                tail: head,
                unit_tail: head,
            },
            written: head,
            handed: Vec::new(),
            buffer: Vec::with_capacity(WRITE_BATCH + (1 << 20)),
            writes: 0,
            synced_writes: 0,
            stopping: false,
            last_sync: Instant::now(),
            sync_took: Duration::ZERO,
            sync_waits: false,
        }));
        let to_sync = Arc::new(Condvar::new());
        let sync_thread = SyncThread {
            shared: shared.clone(),
            state: state.clone(),
            to_sync: to_sync.clone(),
            failure: failure.clone(),
        };
        let sync_handle = std::thread::Builder::new()
            .name("walbridge-log-sync".into())
            .spawn(move || {
                if let Err(e) = sync_thread.run() {
                    report_failure(&sync_thread.shared, &sync_thread.failure, &e);
                }
            })
            .map_err(LogError::io("start a thread for", &shared.dir))?;
        let thread = WriterThread {
            shared: shared.clone(),
            state: state.clone(),
            queued: queued.clone(),
            in_flight: in_flight.clone(),
            failure: failure.clone(),
            to_sync: to_sync.clone(),
        };
        let handle = std::thread::Builder::new()
            .name("walbridge-log-writer".into())
            .spawn(move || {
                let result = thread.run(rx);
                if let Err(e) = &result {
                    report_failure(&thread.shared, &thread.failure, e);
                }
                // Whatever ended the writer, the sync thread makes durable
                // what is written (unless a failure was reported) and ends.
                thread.stop_syncing(sync_handle);
                result
            })
            .map_err(LogError::io("start a thread for", &shared.dir))
            .inspect_err(|_| stop_syncing(&state, &to_sync))?;
        Ok(LogWriter {
            commands: tx,
            thread: Some(handle),
            shared,
            failure,
            queued,
            within_unit: AtomicBool::new(false),
            state,
            in_flight,
            here: AtomicBool::new(false),
            to_sync,
        })
    }

    /// The log written to.
    pub fn log(&self) -> Log {
        Log {
            shared: self.shared.clone(),
        }
    }

    /// Queues a record. `unit_end` marks the last record of a unit (a
    /// transaction's last chunk, or a record on its own); readers see a unit
    /// only once all of it is durable. Waits while the queue is full, and,
    /// before a unit's first record, while the log is at `max_size` (see
    /// [`WhenFull`]): the rest of a unit begun goes in regardless, since no
    /// sink can move past a unit, and so free space, before it is whole
    /// (the log then holds max_size and the rest of one unit).
    pub async fn append(&self, payload: Vec<u8>, lsn: Lsn, unit_end: bool) -> Result<(), LogError> {
        self.queue(payload, None, lsn, unit_end).await
    }

    /// Queues a record that is a whole unit by itself, with what it holds:
    /// readers that have caught up take `entry` from memory instead of
    /// reading and decoding the record (the hand-off, `handoff.rs`). `entry` must be
    /// what decoding `payload` gives.
    pub async fn append_unit(
        &self,
        payload: Vec<u8>,
        entry: Entry,
        lsn: Lsn,
    ) -> Result<(), LogError> {
        self.queue(payload, Some(entry), lsn, true).await
    }

    async fn queue(
        &self,
        payload: Vec<u8>,
        entry: Option<Entry>,
        lsn: Lsn,
        unit_end: bool,
    ) -> Result<(), LogError> {
        let continuing = self.within_unit.swap(!unit_end, Ordering::Relaxed);
        if let Some(max) = self.shared.options.max_size.filter(|_| !continuing) {
            let mut size = self.shared.size.subscribe();
            let queued = || (QUEUE_BYTES - self.queued.available_permits()) as u64;
            let mut full = *size.borrow_and_update() + queued() > max;
            if full {
                // Retention may free space now (with `drop_sink`, by dropping a sink).
                self.log().collect()?;
                full = *size.borrow_and_update() + queued() > max;
            }
            if full {
                let until = match self.shared.options.when_full {
                    WhenFull::Block => "it catches up",
                    WhenFull::DropSink => "it catches up or falls behind another and is dropped",
                };
                tracing::warn!(
                    log = %self.shared.dir.display(),
                    max_size = max,
                    "the log is at max_size because a sink is behind: not reading from the source until {until}"
                );
                // The sender lives in `shared`, so this only ends when space is freed.
                let _ = size.wait_for(|s| *s + queued() <= max).await;
                tracing::info!(log = %self.shared.dir.display(), "the log has room again");
            }
        }
        if self.here.load(Ordering::Relaxed) {
            let mut state = self.lock()?;
            if !state.must_roll() {
                state.mind_spare();
                state.add(&payload, entry, lsn, unit_end);
                return Ok(());
            }
            // A new segment may have to wait for room: the thread makes it,
            // and takes the rest of the batch, after what is added here.
            self.here.store(false, Ordering::Relaxed);
        }
        // A decoded entry takes two to three times its record's bytes (the
        // max_size check above counts them too: it waits a little early,
        // never late).
        let bytes = if entry.is_some() {
            payload.len() * 3
        } else {
            payload.len()
        };
        let permits = bytes.clamp(1, QUEUE_BYTES) as u32;
        self.queued
            .acquire_many(permits)
            .await
            .map_err(|_| self.stopped())?
            .forget();
        self.send(Command::Append {
            payload,
            entry,
            lsn,
            unit_end,
            permits,
        })
        .await
    }

    async fn send(&self, command: Command) -> Result<(), LogError> {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.commands
            .send(command)
            .await
            .map_err(|_| self.stopped())
    }

    fn lock(&self) -> Result<MutexGuard<'_, WriterState>, LogError> {
        lock(&self.state)
    }

    /// Begins a batch of appends. When it is `alone` (a caught-up stream's
    /// transactions, nothing waiting after them), nothing is queued for
    /// the writer thread and its last fsync was quick, the batch is written
    /// and fsynced here, by [`LogWriter::end_batch`], instead of by the
    /// writer thread (see the module's docs). A backlog's batches are not
    /// alone: while the thread fsyncs one, the caller's thread goes on.
    pub fn begin_batch(&self, alone: bool) {
        let here = alone
            && self.in_flight.load(Ordering::Acquire) == 0
            && self.failure.borrow().is_none()
            && self.lock().is_ok_and(|state| state.sync_took < QUICK_SYNC);
        self.here.store(here, Ordering::Relaxed);
    }

    /// Ends a batch: one written here is now written and shown to readers
    /// of written records, and fsynced (as the fsync policy says) and
    /// readable to the rest — or, while readers of written records follow,
    /// being fsynced by the sync thread, which then publishes it (see the
    /// module's docs). A full disk leaves it to the writer thread, which
    /// waits for room.
    pub async fn end_batch(&self) -> Result<(), LogError> {
        if !self.here.swap(false, Ordering::Relaxed) {
            return Ok(());
        }
        let written = {
            let mut state = self.lock()?;
            if self.failure.borrow().is_some() {
                // The sync thread failed: write nothing more.
                return Err(self.stopped());
            }
            let written = state.write_buffer().map(|()| {
                state.update_shared();
                let woken = state.show_written();
                let to_sync_thread =
                    self.shared.follows_written() && self.shared.options.syncs_each_write();
                if to_sync_thread && (state.sync_waits || !state.nobody_waits()) {
                    // Readers of written records have it: the sync thread
                    // makes it durable while this task goes on. One that
                    // holds back an fsync nobody waits for is woken only
                    // when somebody does now (a reader of durable records
                    // opened meanwhile).
                    self.to_sync.notify_one();
                }
                (woken, to_sync_thread)
            });
            match written {
                Ok(written) => Ok(Some(written)),
                Err(e) if e.is_disk_full() => Ok(None),
                Err(e) => Err(e),
            }
        };
        let (woken, to_sync_thread) = match written {
            Ok(Some(written)) => written,
            Ok(None) => return self.send(Command::Write).await,
            Err(e) => {
                report_failure(&self.shared, &self.failure, &e);
                return Err(e);
            }
        };
        if woken {
            // The readers of written records were woken on this thread, a
            // runtime worker, as its next task (which no other worker
            // takes): let them run before this one goes on.
            tokio::task::yield_now().await;
        }
        if to_sync_thread {
            return Ok(());
        }
        self.lock()
            .and_then(|mut state| {
                if self.shared.options.syncs_each_write() {
                    state.sync(Syncer::Appender)?;
                }
                state.publish();
                Ok(())
            })
            .inspect_err(|e| report_failure(&self.shared, &self.failure, e))
    }

    fn stopped(&self) -> LogError {
        let failure = self.failure.borrow().clone();
        LogError::WriterStopped(failure.unwrap_or_else(|| "it was closed".into()))
    }

    /// Waits until the writer fails and returns why (pending forever while
    /// it works). Lets a quiet source learn of a failure at once, not at
    /// its next append.
    pub async fn failed(&self) -> LogError {
        let mut failure = self.failure.subscribe();
        // The sender lives in `self`, so this only ends with a failure.
        let _ = failure.wait_for(Option::is_some).await;
        self.stopped()
    }

    /// Writes and fsyncs everything queued, then stops the writer.
    pub async fn close(self) -> Result<(), LogError> {
        let LogWriter {
            commands, thread, ..
        } = self;
        drop(commands);
        let Some(thread) = thread else {
            return Ok(());
        };
        tokio::task::spawn_blocking(move || thread.join())
            .await
            .map_err(|e| LogError::WriterStopped(e.to_string()))?
            .map_err(|_| LogError::WriterStopped("the writer thread panicked".into()))?
    }
}

/// Who fsyncs the log's records (counted apart: see [`Log::syncs`]).
#[derive(Clone, Copy)]
enum Syncer {
    /// An appender writing its own batch ([`LogWriter::end_batch`]).
    Appender,
    /// The sync thread ([`SyncThread`]).
    SyncThread,
    /// The writer thread.
    Writer,
}

/// The writer's state, locked by the thread or by an appender writing its
/// own batch; a panic in either while holding it stops the writer.
fn lock(state: &Mutex<WriterState>) -> Result<MutexGuard<'_, WriterState>, LogError> {
    state.lock().map_err(|_| poisoned())
}

fn poisoned() -> LogError {
    LogError::WriterStopped("a writer of the log panicked".into())
}

/// Says why the writer stopped, to the log and to whoever waits on it
/// ([`LogWriter::failed`]); the thread writes nothing more once it is set.
fn report_failure(shared: &Shared, failure: &watch::Sender<Option<String>>, e: &LogError) {
    tracing::error!(log = %shared.dir.display(), "log writer failed: {e}");
    failure.send_replace(Some(e.to_string()));
}

/// Tells the sync thread to make durable what is written and end.
fn stop_syncing(state: &Mutex<WriterState>, to_sync: &Condvar) {
    // A poisoned lock: the writer panicked, and the sync thread, finding
    // the lock poisoned too, ends.
    if let Ok(mut state) = state.lock() {
        state.stopping = true;
    }
    to_sync.notify_one();
}

/// The sync thread: fsyncs the batches appenders wrote while readers of
/// written records follow (with `fsync = "always"`, as soon as each is
/// written, then publishes it), or everything written once per interval
/// (with `interval`), without holding the state's lock while the fsync
/// runs, so that the next batch is written meanwhile.
struct SyncThread {
    shared: Arc<Shared>,
    state: Arc<Mutex<WriterState>>,
    to_sync: Arc<Condvar>,
    failure: Arc<watch::Sender<Option<String>>>,
}

impl SyncThread {
    fn run(&self) -> Result<(), LogError> {
        let mut state = lock(&self.state)?;
        loop {
            if self.failure.borrow().is_some() {
                // Nothing written after a failure is to be published.
                return Ok(());
            }
            let gap = self.gap(&state);
            let unsynced = state.unsynced();
            let since = state.last_sync.elapsed();
            if unsynced && since >= gap {
                let (file, base, writes, to) =
                    (state.file.clone(), state.base, state.writes, state.in_file);
                drop(state);
                let started = Instant::now();
                let synced = sync_segment(&file, &self.shared, base);
                state = lock(&self.state)?;
                synced?;
                state.synced(writes, started, Syncer::SyncThread);
                if self.shared.options.syncs_each_write() {
                    state.publish_to(to);
                }
                continue;
            }
            if state.stopping {
                return Ok(());
            }
            state = match (unsynced, self.shared.options.fsync) {
                // Woken by a write (or the writer thread ending).
                (false, FsyncPolicy::Always) => {
                    state.sync_waits = true;
                    let mut state = self.to_sync.wait(state).map_err(|_| poisoned())?;
                    state.sync_waits = false;
                    state
                }
                // The gap's end, or, with `interval`, nothing tells of a
                // write: look again an interval on.
                _ => {
                    let wait = if unsynced { gap - since } else { gap };
                    self.to_sync
                        .wait_timeout(state, wait)
                        .map_err(|_| poisoned())?
                        .0
                }
            };
        }
    }

    /// How long after the last fsync the next one comes.
    fn gap(&self, state: &WriterState) -> Duration {
        match self.shared.options.fsync {
            _ if state.stopping => Duration::ZERO,
            FsyncPolicy::Interval(every) => every,
            FsyncPolicy::Always if state.nobody_waits() => self.shared.options.sync_gap,
            FsyncPolicy::Always => Duration::ZERO,
        }
    }
}

/// The writer thread: applies queued commands to the state.
struct WriterThread {
    shared: Arc<Shared>,
    state: Arc<Mutex<WriterState>>,
    queued: Arc<Semaphore>,
    in_flight: Arc<AtomicUsize>,
    failure: Arc<watch::Sender<Option<String>>>,
    to_sync: Arc<Condvar>,
}

impl WriterThread {
    fn run(&self, mut commands: mpsc::Receiver<Command>) -> Result<(), LogError> {
        while let Some(first) = commands.blocking_recv() {
            let mut state = self.lock()?;
            if self.failure.borrow().is_some() {
                // An appender writing a batch itself failed: write nothing more.
                return Ok(());
            }
            let mut applied = 0;
            let mut released = 0;
            let mut next = Some(first);
            while let Some(command) = next.take() {
                applied += 1;
                match command {
                    Command::Append {
                        payload,
                        entry,
                        lsn,
                        unit_end,
                        permits,
                    } => {
                        if state.must_roll() {
                            let rolled;
                            (state, rolled) =
                                self.until_room(state, &commands, WriterState::roll)?;
                            if !rolled {
                                return Ok(());
                            }
                        }
                        state.mind_spare();
                        state.add(&payload, entry, lsn, unit_end);
                        released += permits as usize;
                    }
                    Command::Write => {}
                }
                if state.buffer.len() < WRITE_BATCH {
                    next = commands.try_recv().ok();
                }
            }
            let written;
            (state, written) = self.until_room(state, &commands, WriterState::write_buffer)?;
            if !written {
                return Ok(());
            }
            state.make_readable()?;
            self.queued.add_permits(released);
            if self.shared.options.max_size.is_some() {
                // An append waiting at max_size counts the log's size and
                // the queue's bytes; the size moved (waking it) while these
                // were still counted as queued, and retention may have
                // freed room meanwhile: it looks again now.
                self.shared.size.send_modify(|_| {});
            }
            // Under the lock: an appender that finds nothing in flight finds it all written.
            self.in_flight.fetch_sub(applied, Ordering::AcqRel);
        }
        let mut state = self.lock()?;
        if self.failure.borrow().is_some() {
            // An appender's write failed: what it left is not to be written.
            return Ok(());
        }
        if state.buffer.is_empty() {
            // An appender's last batch is made durable by the sync thread
            // as it stops ([`WriterThread::stop_syncing`]).
            return Ok(());
        }
        // What an appender left after finding the disk full.
        let written;
        (state, written) = self.until_room(state, &commands, WriterState::write_buffer)?;
        if written {
            state.make_readable()?;
        }
        Ok(())
    }

    /// Stops the sync thread once it has made durable what is written, and waits for it.
    fn stop_syncing(&self, sync_thread: std::thread::JoinHandle<()>) {
        stop_syncing(&self.state, &self.to_sync);
        if sync_thread.join().is_err() {
            report_failure(
                &self.shared,
                &self.failure,
                &LogError::WriterStopped("the log's sync thread panicked".into()),
            );
        }
    }

    fn lock(&self) -> Result<MutexGuard<'_, WriterState>, LogError> {
        lock(&self.state)
    }

    /// Runs `step` until it succeeds, waiting for room while the disk is
    /// full (see the module's docs), without the lock while it waits.
    /// Returns `false` when the log was closed while waiting: what is not
    /// written was never acknowledged, and the source reads it again from
    /// the publisher at the next start.
    fn until_room<'a>(
        &'a self,
        mut state: MutexGuard<'a, WriterState>,
        commands: &mpsc::Receiver<Command>,
        step: impl Fn(&mut WriterState) -> Result<(), LogError>,
    ) -> Result<(MutexGuard<'a, WriterState>, bool), LogError> {
        let mut full_since = None;
        let mut next_report = Instant::now();
        loop {
            let e = match step(&mut state) {
                Ok(()) => {
                    if let Some(since) = full_since.map(|t: Instant| t.elapsed()) {
                        tracing::info!(log = %state.shared.dir.display(), "the disk has room again after {}s; reading from the source again", since.as_secs());
                    }
                    return Ok((state, true));
                }
                Err(e) if e.is_disk_full() => e,
                Err(e) => return Err(e),
            };
            full_since.get_or_insert_with(Instant::now);
            if commands.is_closed() {
                tracing::warn!(log = %state.shared.dir.display(), "stopping while the disk is full: {} bytes of changes were not written; the publisher sends them again at the next start", state.buffer.len());
                return Ok((state, false));
            }
            if Instant::now() >= next_report {
                tracing::warn!(
                    log = %state.shared.dir.display(),
                    "{e}: the file system holding the log is full; not reading from the source until there is room (nothing is lost: the publisher keeps the changes), trying again every {}s. Free space there, or keep the log below the space there is with [log] max_size (and a smaller segment_size)",
                    ROOM_RETRY.as_secs()
                );
                next_report = Instant::now() + FULL_REPORT;
            }
            drop(state);
            std::thread::sleep(ROOM_RETRY);
            state = self.lock()?;
        }
    }
}

/// The writer's state: the segment written, what is buffered for it, and
/// what readers have been shown.
struct WriterState {
    shared: Arc<Shared>,
    /// Shared with the sync thread while it fsyncs.
    file: Arc<File>,
    base: u64,
    /// Bytes in the segment, including those buffered.
    len: u64,
    /// The segment file's length: past `len` (less the buffer) it holds zeros.
    allocated: u64,
    /// Makes the zero-filled files segments are written into.
    spares: Option<Spares>,
    /// When the first record went into this segment (in this run), and
    /// the segment's length then.
    writing_since: Option<(Instant, u64)>,
    /// A spare was asked for while writing this segment.
    asked_spare: bool,
    index: IndexBuilder,
    /// Index entries already copied to the shared state.
    published_index: usize,
    next_seq: u64,
    last_unit_lsn: Lsn,
    /// The end of the last record added, complete unit or not.
    tail: Head,
    /// The end of the last complete unit added.
    unit_tail: Head,
    /// Where what is written to the file ends (what an fsync begun now
    /// makes durable).
    in_file: InFile,
    /// The end of what [`crate::Visibility::Written`] readers may see once
    /// it is written: the whole units handed off that follow the durable
    /// end with nothing else between.
    written: Head,
    /// Records of this batch with their entries, to hand off.
    handed: Vec<ReadRecord>,
    buffer: Vec<u8>,
    /// Writes made, and how many of them the last fsync made durable
    /// (those made before it began).
    writes: u64,
    synced_writes: u64,
    /// The writer thread has ended: the sync thread makes durable what is
    /// written and ends.
    stopping: bool,
    /// When the last fsync was, and how long it took.
    last_sync: Instant,
    sync_took: Duration,
    /// The sync thread waits for a write to fsync (with `always`): an
    /// appender's write wakes it.
    sync_waits: bool,
}

/// Where the records written to the file end.
#[derive(Clone, Copy, Debug)]
struct InFile {
    /// All of them …
    tail: Head,
    /// … and the complete units.
    unit_tail: Head,
}

impl std::fmt::Debug for WriterState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriterState")
            .field("segment", &self.base)
            .field("len", &self.len)
            .field("next_seq", &self.next_seq)
            .finish_non_exhaustive()
    }
}

impl WriterState {
    /// The next record goes to a new segment (see [`Self::segment_full`],
    /// [`Self::spare_waits`]).
    fn must_roll(&self) -> bool {
        self.segment_full() || self.spare_waits()
    }

    /// The current segment has reached `segment_size`: the next record goes to a new one.
    fn segment_full(&self) -> bool {
        self.len >= self.shared.options.segment_size && self.len > SEGMENT_HEADER_LEN
    }

    /// A spare is ready while this segment grows as it is written (and has
    /// records): better to leave it now than at its end.
    fn spare_waits(&self) -> bool {
        self.asked_spare
            && self.allocated <= self.len
            && self.len > SEGMENT_HEADER_LEN
            && self.spares.as_ref().is_some_and(Spares::is_ready)
    }

    /// Asks for a spare once this segment has been written to for longer
    /// than a bulk load would take to fill it, at a rate that fills it
    /// within the horizon ([`Spares::due`]).
    fn mind_spare(&mut self) {
        let len = self.len;
        let (since, from) = *self
            .writing_since
            .get_or_insert_with(|| (Instant::now(), len));
        let size = self.shared.options.segment_size;
        if let Some(spares) = &self.spares
            && !self.asked_spare
            && Spares::due(size, size.saturating_sub(len), len - from, since.elapsed())
        {
            spares.request();
            self.asked_spare = true;
        }
    }

    /// Frames a record into the buffer; one that ends a unit becomes the
    /// head to publish.
    fn add(&mut self, payload: &[u8], entry: Option<Entry>, lsn: Lsn, unit_end: bool) {
        let pos = self.len;
        let before = self.buffer.len();
        frame::encode(&mut self.buffer, self.next_seq, lsn, unit_end, payload);
        let size = (self.buffer.len() - before) as u64;
        self.len += size;
        self.index.note(self.next_seq, pos, lsn);
        let handed = entry.is_some();
        if let Some(entry) = entry {
            self.handed.push(ReadRecord {
                seq: self.next_seq,
                lsn,
                unit_end,
                size,
                entry,
            });
        }
        let follows_written = self.written.next_seq == self.next_seq;
        self.next_seq += 1;
        self.tail = Head {
            next_seq: self.next_seq,
            segment: self.base,
            end: self.len,
            last_lsn: lsn,
        };
        if handed && follows_written {
            self.written = self.tail;
        }
        if unit_end {
            self.last_unit_lsn = lsn;
            self.unit_tail = self.tail;
        }
    }

    /// Writes the buffer to the segment. A write that fails part-way is cut
    /// back, so the segment always ends at a whole record and the write can
    /// be tried again.
    fn write_buffer(&mut self) -> Result<(), LogError> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let path = || segment_path(&self.shared.dir, self.base);
        let written = self.len - self.buffer.len() as u64;
        if let Err(e) = self.file.write_all_at(&self.buffer, written) {
            self.file
                .set_len(written)
                .map_err(LogError::io("cut back a partial write to", path()))?;
            self.allocated = written;
            return Err(LogError::io("write", path())(e));
        }
        self.allocated = self.allocated.max(self.len);
        self.buffer.clear();
        self.writes += 1;
        self.in_file = InFile {
            tail: self.tail,
            unit_tail: self.unit_tail,
        };
        Ok(())
    }

    /// Something written is not yet durable.
    fn unsynced(&self) -> bool {
        self.writes > self.synced_writes
    }

    /// Nothing waits for what is written to be durable but the source's
    /// confirmation to the publisher: readers of written records have it
    /// all, and no reader of durable records is open.
    fn nobody_waits(&self) -> bool {
        self.written.next_seq >= self.in_file.tail.next_seq
            && self.shared.durable_readers.load(Ordering::Relaxed) == 0
    }

    /// Fsyncs what is written, holding the lock (the sync thread fsyncs without it).
    fn sync(&mut self, by: Syncer) -> Result<(), LogError> {
        let started = Instant::now();
        sync_segment(&self.file, &self.shared, self.base)?;
        self.synced(self.writes, started, by);
        Ok(())
    }

    /// Notes an fsync begun at `started`, when `writes` writes were made.
    fn synced(&mut self, writes: u64, started: Instant, by: Syncer) {
        let (count, time) = match by {
            Syncer::Appender => (
                &self.shared.synced_by_appender,
                &self.shared.sync_time.appender,
            ),
            Syncer::SyncThread => (
                &self.shared.synced_by_sync_thread,
                &self.shared.sync_time.sync_thread,
            ),
            Syncer::Writer => (&self.shared.synced_by_writer, &self.shared.sync_time.writer),
        };
        count.fetch_add(1, Ordering::Relaxed);
        self.synced_writes = self.synced_writes.max(writes);
        self.last_sync = Instant::now();
        self.sync_took = self.last_sync - started;
        time.record(self.sync_took.as_secs_f64());
    }

    /// Seals the current segment (written, cut to its records, fsynced,
    /// indexed) and starts the next: the spare if one is ready.
    fn roll(&mut self) -> Result<(), LogError> {
        self.write_buffer()?;
        if self.allocated > self.len {
            self.file.set_len(self.len).map_err(LogError::io(
                "cut the zeros after the records of",
                segment_path(&self.shared.dir, self.base),
            ))?;
            self.allocated = self.len;
        }
        self.sync(Syncer::Writer)?;
        let dir = self.shared.dir.clone();
        if let Err(e) = segment::store_index(&index_path(&dir, self.base), &self.index.entries) {
            tracing::warn!(
                segment = self.base,
                "cannot write the segment index (it is rebuilt when needed): {e}"
            );
        }
        self.update_shared();
        let base = self.next_seq;
        let spare = self.spares.as_ref().and_then(Spares::take);
        let (file, allocated) = match spare {
            Some(spare) => self.install(spare, base)?,
            None => (
                create_segment(&dir, base, self.last_unit_lsn)?,
                SEGMENT_HEADER_LEN,
            ),
        };
        (self.file, self.allocated) = (Arc::new(file), allocated);
        self.base = base;
        self.len = SEGMENT_HEADER_LEN;
        self.writing_since = None;
        self.asked_spare = false;
        self.index = IndexBuilder::default();
        self.published_index = 0;
        self.update_shared();
        sync_dir(&dir)?;
        // A new segment may let retention (or max_size) remove an old one.
        self.log().collect()
    }

    /// Makes a spare the segment `base`: its header written and synced
    /// before it takes the segment's name (the directory is synced by the
    /// roll). Returns the file and its length.
    fn install(&self, spare: Ready, base: u64) -> Result<(File, u64), LogError> {
        let Ready { file, path, len } = spare;
        let target = segment_path(&self.shared.dir, base);
        let header = segment::header(self.last_unit_lsn, true);
        crate::spare::become_segment(&file, &path, &target, &header)
            .map_err(LogError::io("make a segment of", &path))?;
        Ok((file, len))
    }

    fn log(&self) -> Log {
        Log {
            shared: self.shared.clone(),
        }
    }

    /// Copies the current segment's length, end and new index entries to
    /// the shared state; only once what they describe is written (the
    /// sync thread, which may publish while records are in the buffer,
    /// does not).
    fn update_shared(&mut self) {
        let size = {
            let mut state = self.shared.state();
            let segment = state.segments.entry(self.base).or_insert_with(|| Segment {
                len: SEGMENT_HEADER_LEN,
                next_seq: self.base,
                index: Vec::new(),
                modified: SystemTime::now(),
            });
            segment.len = self.len;
            segment.next_seq = self.next_seq;
            segment.modified = SystemTime::now();
            segment
                .index
                .extend_from_slice(&self.index.entries[self.published_index..]);
            self.published_index = self.index.entries.len();
            state.total_size()
        };
        self.shared.size.send_replace(size);
    }

    /// Shows readers of [`crate::Visibility::Written`] what was just
    /// written, before its fsync, and hands over the batch's records (the
    /// others get theirs from the hand-off once their ends take them in).
    /// Returns whether that woke a reader.
    fn show_written(&mut self) -> bool {
        let written = self.written;
        let ends = Ends {
            head_next: self.shared.head.borrow().next_seq,
            durable_next: self.shared.durable.borrow().next_seq,
            written_next: written.next_seq,
        };
        // Before the end moves: a reader it wakes finds its records queued.
        self.shared.handoff.hand_over(&mut self.handed, ends);
        let woke = send_if_moved(&self.shared.written, written)
            && self.shared.written.receiver_count() > 0;
        self.shared.move_written_units() || woke
    }

    /// Makes readable what the writer thread wrote: shown to readers of
    /// written records, fsynced (with `fsync = "always"`), published.
    fn make_readable(&mut self) -> Result<(), LogError> {
        self.show_written();
        if self.shared.options.syncs_each_write() {
            self.sync(Syncer::Writer)?;
        }
        self.update_shared();
        self.publish();
        Ok(())
    }

    /// Makes readable everything written (see [`Self::publish_to`]).
    fn publish(&mut self) {
        self.publish_to(self.in_file);
    }

    /// Makes readable what was written `to` that point: durable (as the
    /// fsync policy says), and its complete units. Ends only move forward
    /// (the writer thread may have published past an fsync of the sync
    /// thread's that began earlier).
    fn publish_to(&mut self, to: InFile) {
        if to.tail.next_seq <= self.shared.durable.borrow().next_seq {
            return;
        }
        // What is added after `to` may not be written yet (an appender
        // fills the buffer while the sync thread publishes): the end
        // written records are shown to moves only up to `to`.
        if self.written.next_seq < to.tail.next_seq {
            self.written = to.tail;
        }
        let shown = *self.shared.written.borrow();
        let written = if shown.next_seq < to.tail.next_seq {
            to.tail
        } else {
            shown
        };
        let head = self.shared.head.borrow().next_seq;
        let ends = Ends {
            head_next: head.max(to.unit_tail.next_seq),
            durable_next: to.tail.next_seq,
            written_next: written.next_seq,
        };
        // Before the ends move: a reader they wake finds its records
        // queued (handed over when they were written, by `show_written`).
        self.shared.handoff.hand_over(&mut Vec::new(), ends);
        send_if_moved(&self.shared.written, written);
        send_if_moved(&self.shared.durable, to.tail);
        if to.unit_tail.next_seq > head {
            // The LSN first: whoever the head wakes finds it moved too.
            send_if_moved(&self.shared.last_lsn, to.unit_tail.last_lsn);
            self.shared.head.send_replace(to.unit_tail);
        }
        self.shared.move_written_units();
    }
}

/// Fsyncs segment `base` (its path is built only for an error: this is
/// every transaction's path).
fn sync_segment(file: &File, shared: &Shared, base: u64) -> Result<(), LogError> {
    file.sync_data()
        .map_err(|e| LogError::io("fsync", segment_path(&shared.dir, base))(e))
}
