//! `walbridge sync-sequences`: reads every source's sequences on its
//! publisher now and sets them on each sink's target that keeps its own
//! (postgres), never backwards — the step before a switchover to the
//! subscriber, which logical replication leaves to the operator.

use walbridge_runtime::config::SourceSpec;
use walbridge_sink::reads;
use walbridge_source::Source;

use crate::{EXIT_CONFIG, EXIT_FAILURE, Failure, load};

/// Syncs every source's sequences into the sinks reading it; fails when
/// one could not be set (missing on a target, refused).
pub async fn sync_sequences(path: &std::path::Path) -> Result<(), Failure> {
    let config = load(path)?;
    let mut complete = true;
    for spec in &config.sources {
        let name = spec.name();
        let source_config = match spec {
            SourceSpec::Postgres(source_config) => source_config,
            SourceSpec::Feed(_) => {
                println!(
                    "source `{name}` reads another walbridge's feed: sync the sequences from the walbridge that reads the publisher"
                );
                continue;
            }
        };
        let source = Source::new(source_config.clone(), &config.data_dir).map_err(|e| Failure {
            code: EXIT_CONFIG,
            error: e.into(),
        })?;
        let values = source.read_sequences().await.map_err(|e| Failure {
            code: EXIT_FAILURE,
            error: anyhow::anyhow!(e)
                .context(format!("cannot read the sequences of source `{name}`")),
        })?;
        println!(
            "source `{name}`: {} sequence(s) read on {}",
            values.sequences.len(),
            source.target()
        );
        for sink in config.sinks.iter().filter(|s| reads(s.as_ref(), name)) {
            let Some(sync) = sink.sync_sequences(name, &values) else {
                continue;
            };
            match sync.await {
                Ok(synced) => {
                    complete &= synced.complete;
                    for line in synced.lines {
                        println!("sink `{}`: {line}", sink.name());
                    }
                }
                Err(e) => {
                    complete = false;
                    println!("sink `{}`: sequences not set: {e}", sink.name());
                }
            }
        }
    }
    if complete {
        Ok(())
    } else {
        Err(Failure {
            code: EXIT_FAILURE,
            error: anyhow::anyhow!("some sequences could not be set on a target (above)"),
        })
    }
}
