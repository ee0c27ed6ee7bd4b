//! `walbridge pause` / `resume`: a sink stops or starts again taking
//! changes, like ALTER SUBSCRIPTION … DISABLE / ENABLE (see
//! `walbridge_runtime::pause`).

use walbridge_runtime::{data_dir, pause};

use crate::{EXIT_CONFIG, Failure, load};

/// Pauses (`paused`) or resumes sink `sink` of the configuration at `path`.
pub fn set_paused(path: &std::path::Path, sink: &str, paused: bool) -> Result<(), Failure> {
    let config = load(path)?;
    if !config.sinks.iter().any(|s| s.name() == sink) {
        return Err(Failure {
            code: EXIT_CONFIG,
            error: anyhow::anyhow!("no sink named `{sink}` in {}", path.display()),
        });
    }
    let changed = pause::set_paused(&config.data_dir, sink, paused).map_err(|e| {
        anyhow::anyhow!(
            "cannot {} sink `{sink}` in {}: {e}",
            if paused { "pause" } else { "resume" },
            config.data_dir.display()
        )
    })?;
    let done = if paused { "paused" } else { "resumed" };
    let when = match data_dir::DataDirLock::holder(&config.data_dir) {
        Some(pid) => {
            format!("the walbridge running on this data_dir (pid {pid}) follows within a second")
        }
        None => "it holds when walbridge starts".to_owned(),
    };
    if !changed {
        println!("sink `{sink}` was already {done}");
    } else if paused {
        println!(
            "sink `{sink}` paused: {when}; its sources keep writing their logs (within [log] max_size) for it to catch up on after `walbridge resume`"
        );
    } else {
        println!("sink `{sink}` resumed: {when}");
    }
    Ok(())
}
