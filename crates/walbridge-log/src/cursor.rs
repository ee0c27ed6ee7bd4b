//! A consumer's durable position in one or more logs.
//!
//! A cursor file holds, for each source log the consumer reads, the next
//! record to read, plus whatever the consumer needs to resume exactly (the
//! jsonl sink keeps its output file's length). It is replaced atomically:
//! written to a temporary file, fsynced, renamed over the old one, and the
//! directory fsynced.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::LogError;

/// A position in one log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CursorPosition {
    /// The log's identity ([`crate::Log::id`]): a position means nothing in
    /// a log recreated since (after `walbridge drop`, say).
    pub log: String,
    /// The next record to read.
    pub next: u64,
}

/// What a cursor file holds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CursorState {
    /// Per source: where to go on reading its log.
    pub positions: BTreeMap<String, CursorPosition>,
    /// The consumer's own resume data.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub consumer: serde_json::Value,
}

/// A cursor stored in a file.
#[derive(Clone, Debug)]
pub struct CursorFile {
    path: PathBuf,
}

impl CursorFile {
    /// The cursor named `name` in `dir`.
    pub fn new(dir: &Path, name: &str) -> Self {
        CursorFile {
            path: dir.join(format!("{name}.json")),
        }
    }

    /// Where it is stored.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the cursor; `None` if it was never stored.
    pub fn load(&self) -> Result<Option<CursorState>, LogError> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| LogError::Io {
                    action: "parse the cursor",
                    path: self.path.clone(),
                    source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(LogError::Io {
                action: "read",
                path: self.path.clone(),
                source: e,
            }),
        }
    }

    /// Replaces the stored cursor atomically.
    pub fn store(&self, state: &CursorState) -> Result<(), LogError> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(LogError::io("create", dir))?;
        let tmp = self.path.with_extension("json.tmp");
        let bytes = serde_json::to_vec(state).map_err(|e| LogError::Io {
            action: "serialize the cursor for",
            path: self.path.clone(),
            source: std::io::Error::other(e),
        })?;
        let mut f = std::fs::File::create(&tmp).map_err(LogError::io("create", &tmp))?;
        f.write_all(&bytes).map_err(LogError::io("write", &tmp))?;
        f.sync_all().map_err(LogError::io("fsync", &tmp))?;
        std::fs::rename(&tmp, &self.path).map_err(LogError::io("rename", &tmp))?;
        crate::log::sync_dir(dir)
    }

    /// Removes the stored cursor, durably; nothing to do when none is stored.
    pub fn remove(&self) -> Result<(), LogError> {
        match std::fs::remove_file(&self.path) {
            Ok(()) => crate::log::sync_dir(self.path.parent().unwrap_or(Path::new("."))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(LogError::io("remove", &self.path)(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_survive_replacement_and_keep_consumer_data() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let cursor = CursorFile::new(dir.path(), "sink");
        assert_eq!(cursor.load().ok().flatten(), None);
        let mut state = CursorState::default();
        for i in 0..5u64 {
            for (source, next) in [("a", i * 10), ("b", i)] {
                state.positions.insert(
                    source.into(),
                    CursorPosition {
                        log: format!("log-{source}"),
                        next,
                    },
                );
            }
            state.consumer = serde_json::json!({ "output_len": i * 100 });
            cursor.store(&state).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(cursor.load().ok().flatten().as_ref(), Some(&state));
        }
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap_or_else(|e| panic!("{e}"))
            .filter_map(|e| e.ok())
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("sink.json")]);
    }

    #[test]
    fn a_damaged_cursor_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let cursor = CursorFile::new(dir.path(), "sink");
        std::fs::write(cursor.path(), b"{\"positions\":").unwrap_or_else(|e| panic!("{e}"));
        let err = cursor
            .load()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("sink.json"), "{err}");
    }
}
