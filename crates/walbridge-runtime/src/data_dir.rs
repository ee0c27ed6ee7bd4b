//! One process per `data_dir`.
//!
//! Two processes writing one `data_dir` take the slot from each other in
//! turn and append to the same logs and cursor files: records out of
//! sequence, output written twice or not at all, a log that no longer
//! opens. So every command that writes there (`run`, `drop`) first takes an
//! exclusive `flock` on `data_dir/walbridge.lock` and holds it for the
//! life of the process. The kernel releases it when the process ends, by a
//! crash or `kill -9` too, so a lock file left behind never blocks the
//! next start; the file's content (the holder's pid) only serves the
//! message of a process that is refused. Commands that only read (`check`,
//! `skip`, which writes to the target database only) take no lock.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// The lock file's name inside `data_dir`.
const LOCK_FILE: &str = "walbridge.lock";

/// Why `data_dir` could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds the lock.
    #[error(
        "data_dir {} is in use by another walbridge process{}: stop it first (one process per data_dir; read-only commands such as `walbridge check` work meanwhile)",
        .dir.display(),
        .pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
    )]
    Held {
        /// The `data_dir`.
        dir: PathBuf,
        /// The holder's pid, when its lock file says.
        pid: Option<u32>,
    },
    /// The lock file could not be created or locked.
    #[error(
        "cannot lock {}: {error}: make data_dir writable by the user walbridge runs as",
        .path.display()
    )]
    Io {
        /// The lock file.
        path: PathBuf,
        /// Cause.
        error: std::io::Error,
    },
}

/// Exclusive use of a `data_dir`, until dropped (or the process ends).
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
}

impl DataDirLock {
    /// Creates `data_dir` if needed and locks it, at once: fails with
    /// [`LockError::Held`] when another process holds it.
    pub fn acquire(data_dir: &Path) -> Result<DataDirLock, LockError> {
        let path = data_dir.join(LOCK_FILE);
        let io = |error| LockError::Io {
            path: path.clone(),
            error,
        };
        std::fs::create_dir_all(data_dir).map_err(io)?;
        // Not truncated before it is locked: that would erase the holder's pid.
        let mut file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(LockError::Held {
                    dir: data_dir.to_owned(),
                    pid: holder(&mut file),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
        }
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(DataDirLock { _file: file })
    }

    /// The pid of the process holding `data_dir`, or `None` when no
    /// process does.
    pub fn holder(data_dir: &Path) -> Option<u32> {
        let mut file = File::open(data_dir.join(LOCK_FILE)).ok()?;
        match file.try_lock_shared() {
            // Nobody holds it (the shared lock is released with `file`).
            Ok(()) => None,
            Err(_) => holder(&mut file),
        }
    }
}

/// The pid written in a lock file.
fn holder(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.rewind().ok()?;
    file.read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_until_the_first_is_released() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let data_dir = dir.path().join("data");
        let first = DataDirLock::acquire(&data_dir).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(DataDirLock::holder(&data_dir), Some(std::process::id()));
        match DataDirLock::acquire(&data_dir) {
            Err(LockError::Held { pid, .. }) => assert_eq!(pid, Some(std::process::id())),
            other => panic!("a second lock was not refused: {other:?}"),
        }
        drop(first);
        assert_eq!(DataDirLock::holder(&data_dir), None);
        let again = DataDirLock::acquire(&data_dir);
        assert!(again.is_ok(), "{again:?}");
    }
}
