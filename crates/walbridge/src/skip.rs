//! `walbridge skip`: past the source transaction a sink is stopped on,
//! like ALTER SUBSCRIPTION … SKIP.

use anyhow::Context;
use walbridge_runtime::pipeline;

use crate::{EXIT_CONFIG, Failure, load};

/// Moves sink `sink` past the transaction it is stopped on (with commit
/// LSN `lsn`, when given).
pub async fn skip(
    path: &std::path::Path,
    sink: &str,
    lsn: Option<walbridge_core::Lsn>,
) -> Result<(), Failure> {
    let config = load(path)?;
    let usage = |error: anyhow::Error| Failure {
        code: EXIT_CONFIG,
        error,
    };
    let Some(sink_config) = config.sinks.iter().find(|s| s.name() == sink) else {
        return Err(usage(anyhow::anyhow!(
            "no sink named `{sink}` in {}",
            path.display()
        )));
    };
    let cursor_dir = pipeline::cursor_dir(&config.data_dir);
    let Some(skipping) = sink_config.skip(&cursor_dir, lsn) else {
        return Err(usage(anyhow::anyhow!(
            "sink `{sink}` never stops on a transaction; only postgres sinks do"
        )));
    };
    let skipped = skipping.await.with_context(|| format!("sink `{sink}`"))?;
    println!("{skipped}");
    Ok(())
}
