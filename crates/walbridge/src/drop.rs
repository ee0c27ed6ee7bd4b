//! `walbridge drop`: a source's slot, its state, and what sinks keep for
//! it on their targets — like DROP SUBSCRIPTION, including the case of a
//! publisher that is gone (`--keep-slot`, like first `ALTER SUBSCRIPTION …
//! SET (slot_name = NONE)`).

use anyhow::Context;
use walbridge_runtime::config::SourceSpec;
use walbridge_sink::reads;
use walbridge_sink_grpc::upstream::FeedSource;
use walbridge_source::Source;

use crate::{EXIT_CONFIG, Failure, load, lock};

/// Drops every source, or `only`: its slot (unless `keep_slot`), its
/// state, and what each sink reading it keeps on its target.
pub async fn drop_sources(
    path: &std::path::Path,
    only: Option<&str>,
    keep_slot: bool,
) -> Result<(), Failure> {
    let config = load(path)?;
    if let Some(name) = only
        && !config.sources.iter().any(|s| s.name() == name)
    {
        return Err(Failure {
            code: EXIT_CONFIG,
            error: anyhow::anyhow!("no source named `{name}` in {}", path.display()),
        });
    }
    let _lock = lock(&config)?;
    for spec in config
        .sources
        .iter()
        .filter(|s| only.is_none_or(|n| n == s.name()))
    {
        let name = spec.name();
        let source_config = match spec {
            SourceSpec::Postgres(source_config) => source_config,
            SourceSpec::Feed(feed) => {
                drop_feed_source(&FeedSource::new(feed.clone(), &config.data_dir), keep_slot)
                    .await?;
                forget(&config, name).await;
                continue;
            }
        };
        let source = Source::new(source_config.clone(), &config.data_dir).map_err(|e| Failure {
            code: EXIT_CONFIG,
            error: e.into(),
        })?;
        let slot = source_config.slot_name();
        if keep_slot {
            source
                .remove_state()
                .with_context(|| format!("cannot drop source `{name}`"))?;
            println!(
                "source `{name}`: state removed; slot `{slot}` kept on {} (--keep-slot). \
                 It holds WAL on the publisher until it is dropped there: \
                 SELECT pg_drop_replication_slot('{slot}');",
                source.target()
            );
        } else {
            let existed = source.drop_slot().await.with_context(|| {
                format!(
                    "cannot drop the slot of source `{name}` (if the publisher is gone for good, \
                     `walbridge drop --keep-slot` removes walbridge's state without it)"
                )
            })?;
            source
                .remove_state()
                .with_context(|| format!("cannot drop source `{name}`"))?;
            if existed {
                println!("source `{name}`: dropped slot `{slot}` and the state");
            } else {
                println!("source `{name}`: slot `{slot}` did not exist; state removed");
            }
        }
        forget(&config, name).await;
    }
    Ok(())
}

/// What each sink reading source `name` keeps of it on its target.
async fn forget(config: &walbridge_runtime::Config, name: &str) {
    for sink in config.sinks.iter().filter(|s| reads(s.as_ref(), name)) {
        let forgotten = sink.forget(name).await;
        for line in forgotten.removed {
            println!("sink `{}`: {line}", sink.name());
        }
        for line in forgotten.left {
            println!("sink `{}`: left for source `{name}`: {line}", sink.name());
        }
    }
}

/// A feed source: its durable consumer upstream (unless `keep_consumer`,
/// for a feed that is gone) and its state.
async fn drop_feed_source(source: &FeedSource, keep_consumer: bool) -> Result<(), Failure> {
    let config = source.config();
    let name = &config.name;
    let consumer = config.consumer_name();
    if keep_consumer {
        println!(
            "source `{name}`: consumer `{consumer}` kept on the feed at {} (--keep-slot); the feed keeps its log for it until it is deleted there (DeleteConsumer)",
            config.url
        );
    } else {
        let existed = source.delete_consumer().await.with_context(|| {
            format!(
                "cannot delete consumer `{consumer}` of source `{name}` (if the feed is gone for good, `walbridge drop --keep-slot` removes walbridge's state without it)"
            )
        })?;
        match existed {
            true => println!(
                "source `{name}`: deleted consumer `{consumer}` on the feed at {}",
                config.url
            ),
            false => println!(
                "source `{name}`: consumer `{consumer}` did not exist on the feed at {}",
                config.url
            ),
        }
    }
    source
        .remove_state()
        .with_context(|| format!("cannot drop source `{name}`"))?;
    println!("source `{name}`: state removed");
    Ok(())
}
