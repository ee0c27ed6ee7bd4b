//! What a source remembers between runs.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::backfill::StoredCopy;

/// What the source remembers between runs (`data_dir/sources/<name>/state.json`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceState {
    /// The slot walbridge created for this source.
    pub slot: String,
    /// The slot's consistent point.
    pub consistent_point: String,
    /// The snapshot was fully delivered downstream.
    pub snapshot_complete: bool,
    /// The published tables (OIDs) whose rows are copied or being copied;
    /// a published table not listed is new. None in a state written
    /// before walbridge kept it: the tables published at the next start
    /// are taken as copied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tables: Option<Vec<u32>>,
    /// Tables being copied while streaming, and how far each is durable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copies: Vec<StoredCopy>,
}

impl SourceState {
    fn path(dir: &Path) -> PathBuf {
        dir.join("state.json")
    }

    /// Reads the state, `None` if there is none.
    pub fn load(dir: &Path) -> std::io::Result<Option<Self>> {
        match std::fs::read(Self::path(dir)) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes the state atomically (temporary file, fsync, rename, fsync of the directory).
    pub fn store(&self, dir: &Path) -> std::io::Result<()> {
        use std::io::Write;
        std::fs::create_dir_all(dir)?;
        let tmp = dir.join("state.json.tmp");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?)?;
        f.sync_all()?;
        std::fs::rename(&tmp, Self::path(dir))?;
        std::fs::File::open(dir)?.sync_all()
    }
}
