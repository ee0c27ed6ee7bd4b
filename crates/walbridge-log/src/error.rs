use std::path::PathBuf;

use crate::frame::FrameError;
use crate::record::RecordError;

/// A log operation failed.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// A file operation failed.
    #[error("log: cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Data in the middle of the log is damaged: not a crash's torn tail.
    #[error(
        "log segment {} is corrupt at offset {offset}: {problem}; the records from there on cannot be read. Restore the data directory from a backup, or remove the log (and the sinks' cursors) to start over with a fresh snapshot",
        path.display()
    )]
    Corrupt {
        /// The segment.
        path: PathBuf,
        /// Byte offset of the damaged frame.
        offset: u64,
        /// What is wrong.
        problem: String,
    },
    /// A file in the log directory is not a segment this walbridge reads.
    #[error("log segment {}: {problem}", path.display())]
    Segment {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// The position asked for was removed by retention.
    #[error(
        "log position {seq} is no longer in {} (the oldest record is {first}): it was removed because every cursor had passed it or the log reached max_size",
        dir.display()
    )]
    Gone {
        /// The log directory.
        dir: PathBuf,
        /// The position asked for.
        seq: u64,
        /// The oldest retained position.
        first: u64,
    },
    /// A record's payload does not decode.
    #[error("log record {seq} in {}: {source}", path.display())]
    Record {
        /// The segment.
        path: PathBuf,
        /// The record.
        seq: u64,
        /// The cause.
        source: RecordError,
    },
    /// Events reached the log out of the order a source emits them.
    #[error("log: {0}")]
    OutOfOrder(&'static str),
    /// The writer stopped after an earlier failure.
    #[error("the log writer stopped: {0}")]
    WriterStopped(String),
}

impl LogError {
    /// An I/O failure of `action` on `path`, for `map_err`.
    pub fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| LogError::Io {
            action,
            path,
            source,
        }
    }

    /// True when the file system had no room (`ENOSPC`, or the user's
    /// quota, `EDQUOT`): space may come back, so the write is worth trying again.
    pub fn is_disk_full(&self) -> bool {
        matches!(self, LogError::Io { source, .. }
            if matches!(source.kind(), std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded))
    }

    pub(crate) fn corrupt(path: impl Into<PathBuf>, offset: u64, problem: FrameError) -> Self {
        LogError::Corrupt {
            path: path.into(),
            offset,
            problem: problem.to_string(),
        }
    }
}
