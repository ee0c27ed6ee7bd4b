//! Pausing a sink (`walbridge pause` / `resume`, like `ALTER SUBSCRIPTION
//! … DISABLE` / `ENABLE`).
//!
//! A paused sink has a marker file, `data_dir/paused/<sink>`: it outlives
//! restarts, and the commands need no running process. The running
//! pipeline looks at the markers every [`POLL`]; a sink that becomes
//! paused finishes what it was given, stores its cursor and stops reading
//! until resumed. Its sources go on writing their logs meanwhile (within
//! `[log] max_size`), which the sink then catches up on.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::watch;

/// How often the running pipeline looks for pause markers.
pub const POLL: Duration = Duration::from_millis(500);

fn marker(data_dir: &Path, sink: &str) -> PathBuf {
    data_dir.join("paused").join(sink)
}

/// Whether sink `sink` is paused.
pub fn is_paused(data_dir: &Path, sink: &str) -> bool {
    marker(data_dir, sink).exists()
}

/// Pauses (`paused`) or resumes sink `sink`; true when that changed
/// anything.
pub fn set_paused(data_dir: &Path, sink: &str, paused: bool) -> std::io::Result<bool> {
    let path = marker(data_dir, sink);
    if paused == path.exists() {
        return Ok(false);
    }
    if paused {
        std::fs::create_dir_all(data_dir.join("paused"))?;
        std::fs::write(&path, b"")?;
    } else {
        std::fs::remove_file(&path)?;
    }
    Ok(true)
}

/// Whether sink `sink` is paused, as it changes: looked at every [`POLL`]
/// until every receiver is gone.
pub fn watch(data_dir: &Path, sink: &str) -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(is_paused(data_dir, sink));
    let (data_dir, sink) = (data_dir.to_owned(), sink.to_owned());
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = tx.closed() => return,
            }
            let paused = is_paused(&data_dir, &sink);
            tx.send_if_modified(|current| std::mem::replace(current, paused) != paused);
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_outlive_the_process() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        assert!(!is_paused(dir.path(), "out"));
        assert!(set_paused(dir.path(), "out", true).unwrap_or(false));
        assert!(!set_paused(dir.path(), "out", true).unwrap_or(true));
        assert!(is_paused(dir.path(), "out"));
        assert!(!is_paused(dir.path(), "other"));
        assert!(set_paused(dir.path(), "out", false).unwrap_or(false));
        assert!(!is_paused(dir.path(), "out"));
    }
}
