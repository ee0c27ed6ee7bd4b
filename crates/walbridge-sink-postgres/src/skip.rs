//! `walbridge skip`: move a sink past the source transaction it is stopped
//! on, like `ALTER SUBSCRIPTION … SKIP (lsn = …)`.

use std::path::Path;

use walbridge_core::Lsn;
use walbridge_log::CursorFile;

use crate::config::PostgresSinkConfig;
use crate::connect::{connect, params};
use crate::error::{SinkError, StoppedOn};
use crate::progress::ProgressStore;
use crate::state::SinkState;

/// Skips the transaction the sink is stopped on — the one whose commit LSN
/// is `lsn`, when given — by moving the target's stored position of its
/// source to the end of that transaction, exactly where the transactions
/// before it left it. A running walbridge picks this up at its next retry.
/// Returns the transaction skipped.
pub async fn skip(
    config: &PostgresSinkConfig,
    cursor_dir: &Path,
    lsn: Option<Lsn>,
) -> Result<StoppedOn, SinkError> {
    let state = SinkState::load(&config.name, CursorFile::new(cursor_dir, &config.name))?;
    let stopped = state.all_stopped();
    let describe = || {
        stopped
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let target = match lsn {
        Some(lsn) => stopped
            .iter()
            .find(|s| s.commit_lsn == lsn || s.end_lsn == lsn)
            .ok_or_else(|| {
                SinkError::Mapping(if stopped.is_empty() {
                    format!("sink `{}` is not stopped on any transaction", config.name)
                } else {
                    format!(
                        "sink `{}` is not stopped on a transaction with commit LSN {lsn}; it is stopped on {}",
                        config.name,
                        describe()
                    )
                })
            })?,
        None => match stopped.as_slice() {
            [] => {
                return Err(SinkError::Mapping(format!(
                    "sink `{}` is not stopped on any transaction",
                    config.name
                )));
            }
            [one] => one,
            _ => {
                return Err(SinkError::Mapping(format!(
                    "sink `{}` is stopped on several transactions ({}): say which with --lsn",
                    config.name,
                    describe()
                )));
            }
        },
    }
    .clone();
    let params = params(config)?;
    let client = connect(config, &params).await?;
    let progress = ProgressStore::open(
        &client,
        config.progress,
        &config.progress_table,
        &config.name,
        &target.source,
    )
    .await?;
    let applied = progress.applied(&client).await?;
    if applied.is_some_and(|a| a >= target.end_lsn) {
        state.clear_stopped(&target.source);
        return Err(SinkError::Mapping(format!(
            "{target} is already behind the sink (the target has applied source `{}` up to {}); nothing to skip",
            target.source,
            applied.unwrap_or_default()
        )));
    }
    // The origin is held by the applying session while a retry runs: try for a while.
    let mut attempts = 0;
    loop {
        match progress.advance(&client, applied, target.end_lsn).await {
            Err(SinkError::Privilege { .. }) if attempts < 50 => {
                attempts += 1;
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            other => break other?,
        }
    }
    state.clear_stopped(&target.source);
    Ok(target)
}
