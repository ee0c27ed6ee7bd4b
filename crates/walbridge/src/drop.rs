//! `walbridge drop`: a source's slot and state, like DROP SUBSCRIPTION.

use anyhow::Context;
use walbridge_source::Source;

use crate::{EXIT_CONFIG, Failure, load, lock};

/// Drops the slot and the state of every source, or of `only`.
pub async fn drop_sources(path: &std::path::Path, only: Option<&str>) -> Result<(), Failure> {
    let config = load(path)?;
    if let Some(name) = only
        && !config.sources.iter().any(|s| s.name == name)
    {
        return Err(Failure {
            code: EXIT_CONFIG,
            error: anyhow::anyhow!("no source named `{name}` in {}", path.display()),
        });
    }
    let _lock = lock(&config)?;
    for source_config in config
        .sources
        .iter()
        .filter(|s| only.is_none_or(|n| n == s.name))
    {
        let source = Source::new(source_config.clone(), &config.data_dir).map_err(|e| Failure {
            code: EXIT_CONFIG,
            error: e.into(),
        })?;
        let existed = source
            .drop_slot_and_state()
            .await
            .with_context(|| format!("cannot drop source `{}`", source_config.name))?;
        let slot = source_config.slot_name();
        if existed {
            println!(
                "dropped slot `{slot}` and the state of source `{}`",
                source_config.name
            );
        } else {
            println!(
                "source `{}`: slot `{slot}` did not exist; state removed",
                source_config.name
            );
        }
    }
    Ok(())
}
