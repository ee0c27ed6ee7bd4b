//! The next segment, zero-filled ahead of time by a thread of its own.
//!
//! An `fdatasync` after an append that grows the file must also make the
//! new length durable: on ext4 and XFS that is a journal commit, done by
//! the journal's own thread, so every commit of the log waited for a
//! second device write and a second thread's turn on a CPU. Writing into
//! blocks that already hold zeros changes no metadata, and the `fdatasync`
//! is the data alone (measured on this project's machines: 125-160 µs per
//! append-and-sync down to 77-96 µs, and far fewer multi-millisecond
//! stalls when the CPUs are busy). PostgreSQL's WAL segments are
//! zero-filled for the same reason.
//!
//! The zeros are written once more per segment, which is worth it only
//! where each commit is small: a steady stream, not a bulk load (the
//! initial copy, a catch-up), whose commits are large and whose time goes
//! to writing. So a spare is asked for only once the segment being
//! written has been written to for longer than it takes to fill at
//! [`SPARE_RATE`] ([`Spares::due_after`]): a stream slower than that gets
//! one well before its segment is full, a bulk load fills its segments
//! first and writes no zeros. Nor does a source so quiet that its segment
//! would take longer than [`FILL_HORIZON`] to fill ([`Spares::due`]): its
//! log stays as small as its records. The writer then moves into the
//! spare at the next roll, or at once when the segment it is writing
//! grows as it is written (a new log's first segment, one begun while no
//! spare was ready): a steady stream writes into zeros from
//! [`Spares::due_after`] after its first record on.
//!
//! The spare is written as `<pid>-<n>.zeroing`, fsynced and renamed
//! `<pid>-<n>.spare` when ready (names no segment has); at a roll the
//! writer writes the segment header into it (of layout version 2: zeros
//! after its records are room, not damage — and a walbridge older than
//! this refuses it by its version), syncs, and renames it into place.
//!
//! Invariants: a segment file in the log directory never has a segment
//! name without its header (the header is written and synced before the
//! rename); only the segment being written can be longer than its records
//! (a roll cuts it to them before the next exists), and what follows its
//! records is zeros — or a write a crash cut short, which recovery treats
//! as any torn tail and overwrites with zeros, keeping the room. A spare
//! left ready when the log closed is taken by the next run; one that was
//! being made is removed when the log is opened. Segments smaller than
//! [`PREALLOCATE_MIN`] are not preallocated.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use crate::error::LogError;
use crate::log::files_ending;

/// Segments at least this large are preallocated; smaller ones are not
/// worth a thread.
pub const PREALLOCATE_MIN: u64 = 1 << 20;

/// A segment written to for longer than it takes to fill at this many
/// bytes a second gets a spare: ten times slower than the initial copy
/// writes the log on this project's machines (about 90 MB/s), and seven
/// times faster than a steady 3,000 transactions/s (about 1.1 MB/s).
pub const SPARE_RATE: u64 = 8 << 20;

/// A segment that would take longer than this to fill at the rate it is
/// being written gets no spare: a source that commits that seldom pays
/// little in all for a growing file's dearer fsync, and zeros made ahead
/// for it would be most of its log on disk (twice the segment size per
/// source, however idle).
pub const FILL_HORIZON: std::time::Duration = std::time::Duration::from_secs(3600);

/// Zeros are written this much at a time (and the thread can stop between two).
const CHUNK: usize = 1 << 20;

/// A spare's file name ends so once it is ready …
const SPARE_SUFFIX: &str = ".spare";
/// … and so while it is being made.
const MAKING_SUFFIX: &str = ".zeroing";

/// A spare ready to become a segment.
pub(crate) struct Ready {
    pub file: File,
    pub path: PathBuf,
    /// Its length: the bytes already allocated.
    pub len: u64,
}

#[derive(Default)]
struct State {
    /// A spare is to be made.
    wanted: bool,
    /// One is being made.
    making: bool,
    ready: Option<Ready>,
    closed: bool,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Plain data behind the lock: a panic elsewhere leaves it usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Makes spares for one log, one at a time.
pub(crate) struct Spares {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Spares {
    /// Starts a thread that makes spares of `size` bytes in `dir`, the
    /// first when [`Spares::request`]ed — unless a previous run left one
    /// ready, which is taken as it is.
    pub fn start(dir: &Path, size: u64) -> Result<Self, LogError> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                ready: adopt(dir, size)?,
                ..State::default()
            }),
            changed: Condvar::new(),
        });
        let maker = shared.clone();
        let dir = dir.to_owned();
        let thread = std::thread::Builder::new()
            .name("walbridge-log-spare".into())
            .spawn(move || make_spares(&maker, &dir, size))
            .map_err(LogError::io("start a thread for", PathBuf::new()))?;
        Ok(Spares {
            shared,
            thread: Some(thread),
        })
    }

    /// How long a segment of `size` bytes is written to before a spare is
    /// asked for: the time it takes to fill at [`SPARE_RATE`].
    pub fn due_after(size: u64) -> std::time::Duration {
        std::time::Duration::from_secs_f64(size as f64 / SPARE_RATE as f64)
    }

    /// Whether a segment of `size` bytes, of which `left` are still free,
    /// written with `written` bytes over `elapsed`, is to have a spare: it
    /// has been written to for [`Spares::due_after`] (not a bulk load), and
    /// at that rate the rest fills within [`FILL_HORIZON`] (not an idle
    /// source).
    pub fn due(size: u64, left: u64, written: u64, elapsed: std::time::Duration) -> bool {
        elapsed >= Self::due_after(size)
            && written as f64 * FILL_HORIZON.as_secs_f64() >= left as f64 * elapsed.as_secs_f64()
    }

    /// Has a spare made unless one is ready or under way.
    pub fn request(&self) {
        let mut state = self.shared.state();
        if state.ready.is_none() && !state.making {
            state.wanted = true;
            self.shared.changed.notify_all();
        }
    }

    /// Whether a spare is ready to be taken.
    pub fn is_ready(&self) -> bool {
        self.shared.state().ready.is_some()
    }

    /// The ready spare, if there is one (the next is made when requested).
    pub fn take(&self) -> Option<Ready> {
        self.shared.state().ready.take()
    }
}

impl Drop for Spares {
    fn drop(&mut self) {
        self.shared.state().closed = true;
        self.shared.changed.notify_all();
        // The thread stops within one chunk of zeros.
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        // A spare left ready is complete and synced: the next run takes it.
    }
}

/// The spare of `size` bytes a previous run left ready in `dir`, if any;
/// others (of another size) are removed.
fn adopt(dir: &Path, size: u64) -> Result<Option<Ready>, LogError> {
    let mut adopted = None;
    for path in files_ending(dir, SPARE_SUFFIX)? {
        let fits = std::fs::metadata(&path).is_ok_and(|m| m.len() == size);
        let file = match adopted {
            None if fits => File::options().read(true).write(true).open(&path).ok(),
            _ => None,
        };
        match file {
            Some(file) => {
                adopted = Some(Ready {
                    file,
                    path,
                    len: size,
                })
            }
            None => std::fs::remove_file(&path).map_err(LogError::io("remove", &path))?,
        }
    }
    Ok(adopted)
}

/// Makes zero-filled `file` (at `from`) the segment `to`: its header
/// written and synced before it takes the segment's name (the caller
/// syncs the directory).
pub(crate) fn become_segment(
    file: &File,
    from: &Path,
    to: &Path,
    header: &[u8],
) -> std::io::Result<()> {
    file.write_all_at(header, 0)?;
    file.sync_data()?;
    std::fs::rename(from, to)
}

/// Says that the log in `dir` writes its next segment without zeros made
/// ahead, and why: not a failure of the log.
fn not_preallocated(dir: &Path, e: &std::io::Error) {
    tracing::warn!(
        log = %dir.display(),
        "cannot preallocate the log's next segment ({e}); it is written without, which makes each commit of the log slower"
    );
}

/// Removes from `dir` the spares a previous run was making (never
/// complete), and the ready ones too unless `keep_ready` (the log makes
/// none now).
pub(crate) fn remove_leftovers(dir: &Path, keep_ready: bool) -> Result<(), LogError> {
    let mut leftovers = files_ending(dir, MAKING_SUFFIX)?;
    if !keep_ready {
        leftovers.extend(files_ending(dir, SPARE_SUFFIX)?);
    }
    for path in leftovers {
        std::fs::remove_file(&path).map_err(LogError::io("remove", &path))?;
    }
    Ok(())
}

fn make_spares(shared: &Shared, dir: &Path, size: u64) {
    static MADE: AtomicU64 = AtomicU64::new(0);
    loop {
        {
            let mut state = shared.state();
            while !state.wanted && !state.closed {
                state = shared
                    .changed
                    .wait(state)
                    .unwrap_or_else(|p| p.into_inner());
            }
            if state.closed {
                return;
            }
            state.wanted = false;
            state.making = true;
        }
        let n = MADE.fetch_add(1, Ordering::Relaxed);
        // Unique beside a spare an earlier process (maybe of the same pid) left.
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let name = format!("{}-{started}-{n}", std::process::id());
        let making = dir.join(format!("{name}{MAKING_SUFFIX}"));
        let path = dir.join(format!("{name}{SPARE_SUFFIX}"));
        let made = zero_fill(shared, &making, size).and_then(|file| {
            file.map(|f| std::fs::rename(&making, &path).map(|()| f))
                .transpose()
        });
        if !matches!(made, Ok(Some(_))) {
            let _ = std::fs::remove_file(&making);
        }
        let mut state = shared.state();
        state.making = false;
        match made {
            Ok(Some(file)) if !state.closed => {
                state.ready = Some(Ready {
                    file,
                    path,
                    len: size,
                });
            }
            Ok(_) => {
                // Closed meanwhile.
                drop(state);
                let _ = std::fs::remove_file(&path);
                return;
            }
            Err(e) => {
                drop(state);
                // Not a failure of the log: segments grow as they are written.
                let _ = std::fs::remove_file(&path);
                not_preallocated(dir, &e);
            }
        }
    }
}

/// Writes `size` zeros to a new file at `path` and syncs it; `None` when
/// the log closed meanwhile (checked between two chunks).
fn zero_fill(shared: &Shared, path: &Path, size: u64) -> std::io::Result<Option<File>> {
    let mut file = File::options()
        .create_new(true)
        .read(true)
        .write(true)
        .open(path)?;
    let zeros = vec![0u8; CHUNK];
    let mut left = size;
    while left > 0 {
        if shared.state().closed {
            return Ok(None);
        }
        let n = left.min(CHUNK as u64) as usize;
        file.write_all(&zeros[..n])?;
        left -= n as u64;
    }
    file.sync_all()?;
    Ok(Some(file))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Spares;

    const MIB: u64 = 1 << 20;

    /// `rate` bytes a second into a 64 MiB segment for `secs`: due?
    fn due_at(rate: u64, secs: u64) -> bool {
        let size = 64 * MIB;
        let written = rate * secs;
        Spares::due(size, size - written, written, Duration::from_secs(secs))
    }

    #[test]
    fn a_steady_stream_gets_a_spare_a_bulk_load_and_an_idle_source_none() {
        // The initial copy writes about 90 MB/s: full before it is due.
        assert!(!Spares::due(
            64 * MIB,
            4_000_000,
            63_000_000,
            Duration::from_millis(700)
        ));
        // 3,000 and 1,000 transactions a second, after 8 s.
        assert!(due_at(1_100_000, 8));
        assert!(due_at(300_000, 8));
        assert!(
            !due_at(300_000, 7),
            "not before it has been written for 8 s"
        );
        // A transaction of 300 bytes every second: 62 hours to fill.
        assert!(!due_at(300, 600));
        // The horizon itself: 10 kB a second fills 36 MB in an hour.
        let (size, secs) = (64 * MIB, Duration::from_secs(100));
        assert!(Spares::due(size, 36_000_000, 1_000_000, secs));
        assert!(!Spares::due(size, 36_000_001, 1_000_000, secs));
    }
}
