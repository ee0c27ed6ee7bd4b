//! A configured source of either kind, as the pipeline runs it: a
//! publisher read through logical replication, or another walbridge's
//! change feed. Both hand events to their log and hear back what it made
//! durable ([`Downstream`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use walbridge_sink_grpc::upstream::FeedSource;
use walbridge_source::{Downstream, Source, SourceStats};

use crate::config::SourceSpec;
use crate::error::RuntimeError;

/// How often a running publisher's slot is polled for the admin endpoint.
const SLOT_POLL: Duration = Duration::from_secs(5);

/// A source ready to run.
pub enum AnySource {
    /// A publisher (boxed, as the feed is: both hold their configuration).
    Postgres(Box<Source>),
    /// Another walbridge's feed.
    Feed(Box<FeedSource>),
}

impl AnySource {
    /// Prepares the source `spec` describes; `data_dir` is walbridge's
    /// state directory.
    pub fn new(spec: &SourceSpec, data_dir: &Path) -> Result<AnySource, RuntimeError> {
        Ok(match spec {
            SourceSpec::Postgres(config) => {
                AnySource::Postgres(Box::new(Source::new(config.clone(), data_dir)?))
            }
            SourceSpec::Feed(config) => {
                AnySource::Feed(Box::new(FeedSource::new(config.clone(), data_dir)))
            }
        })
    }

    /// The source's name.
    pub fn name(&self) -> &str {
        match self {
            AnySource::Postgres(s) => &s.config().name,
            AnySource::Feed(f) => &f.config().name,
        }
    }

    /// Live counters.
    pub fn stats(&self) -> Arc<SourceStats> {
        match self {
            AnySource::Postgres(s) => s.stats(),
            AnySource::Feed(f) => f.stats(),
        }
    }

    /// The source's directory under `data_dir`; its log is `log/` in it.
    pub fn state_dir(&self) -> &Path {
        match self {
            AnySource::Postgres(s) => s.state_dir(),
            AnySource::Feed(f) => f.state_dir(),
        }
    }

    /// Where large transactions spill (a feed source spills nothing: its
    /// units stream into the log).
    pub fn spill_dir(&self) -> PathBuf {
        match self {
            AnySource::Postgres(s) => s.spill_dir(),
            AnySource::Feed(f) => f.state_dir().join("spill"),
        }
    }

    /// The database name sinks report.
    pub fn database(&self) -> &str {
        match self {
            AnySource::Postgres(s) => s.database(),
            AnySource::Feed(f) => f.config().database_name(),
        }
    }

    /// Runs until `shutdown` turns true or a permanent failure; with
    /// `watched`, a publisher's slot is polled for someone to see.
    pub async fn run(
        &self,
        downstream: Downstream,
        shutdown: watch::Receiver<bool>,
        watched: bool,
    ) -> Result<(), RuntimeError> {
        match self {
            AnySource::Postgres(source) => {
                let run = source.run(downstream, shutdown);
                let result = if watched {
                    tokio::select! {
                        result = run => result,
                        never = source.watch_slot(SLOT_POLL) => match never {},
                    }
                } else {
                    run.await
                };
                result.map_err(RuntimeError::Source)
            }
            AnySource::Feed(feed) => feed
                .run(downstream, shutdown)
                .await
                .map_err(RuntimeError::Feed),
        }
    }
}
