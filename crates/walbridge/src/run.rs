//! `walbridge run`: the pipeline, until SIGINT or SIGTERM.

use walbridge_runtime::{RuntimeError, pipeline};

use crate::progress::Bars;
use crate::{EXIT_FAILURE, EXIT_PREREQUISITE, Failure, load, lock};

/// Runs the pipeline of the configuration at `path`, holding its data_dir;
/// draws the copy's progress on `bars` when given.
pub async fn run_pipeline(path: &std::path::Path, bars: Option<&Bars>) -> Result<(), Failure> {
    let config = load(path)?;
    let _lock = lock(&config)?;
    // What `check` finds wrong on this machine stops `run` the same way.
    for sink in &config.sinks {
        sink.preflight().map_err(|e| Failure {
            code: EXIT_PREREQUISITE,
            error: anyhow::Error::new(e).context(format!("sink `{}`", sink.name())),
        })?;
    }
    let mut following = None;
    let result = pipeline::run(config, |observed| {
        following = bars.map(|bars| bars.follow(observed));
    })
    .await;
    // The bars are cleared before the outcome is written.
    drop(following);
    result.map_err(|error| Failure {
        code: match &error {
            RuntimeError::Source(e) if e.is_prerequisite() => EXIT_PREREQUISITE,
            // An address in use, like a data_dir that cannot be written.
            RuntimeError::Admin { .. } => EXIT_PREREQUISITE,
            _ => EXIT_FAILURE,
        },
        error: error.into(),
    })
}
