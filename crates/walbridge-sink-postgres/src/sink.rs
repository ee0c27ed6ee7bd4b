//! The sink's run: one applier per source, each on its own target
//! connection, fed from the sink's queue.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use walbridge_core::Lsn;
use walbridge_log::{CursorFile, CursorPosition, Log};
use walbridge_sink::{Routed, SourceLog};

use crate::apply::{Applier, ApplierParts};
use crate::config::PostgresSinkConfig;
use crate::connect::{connect, connect_for_apply, params};
use crate::error::{SinkError, StoppedOn};
use crate::progress::ProgressStore;
use crate::state::SinkState;
use crate::target::TargetCatalog;

/// Routed batches queued for each applier.
const APPLIER_QUEUE: usize = 4;

/// Makes [`PostgresSink`]s sharing one configuration and state.
#[derive(Clone)]
pub struct PostgresSinkHandle {
    config: Arc<PostgresSinkConfig>,
    state: Arc<SinkState>,
}

impl PostgresSinkHandle {
    /// A sink sharing the configuration and state, nothing connected.
    pub fn sink(&self) -> PostgresSink {
        PostgresSink {
            config: self.config.clone(),
            state: self.state.clone(),
            appliers: HashMap::new(),
        }
    }
}

/// A postgres sink.
pub struct PostgresSink {
    config: Arc<PostgresSinkConfig>,
    state: Arc<SinkState>,
    appliers: HashMap<String, Applier>,
}

impl PostgresSink {
    /// Loads the sink's state from `cursor_dir`. Does not connect: the
    /// target may be down, which [`PostgresSink::resume`] reports (and the
    /// runtime retries) without holding up the sources.
    pub fn open(config: PostgresSinkConfig, cursor_dir: &Path) -> Result<Self, SinkError> {
        params(&config)?;
        let state = SinkState::load(&config.name, CursorFile::new(cursor_dir, &config.name))?;
        Ok(PostgresSink {
            config: Arc::new(config),
            state: Arc::new(state),
            appliers: HashMap::new(),
        })
    }

    /// A handle that makes more of the same sink (same configuration and
    /// state), to apply some of its sources on their own: a source that
    /// stops on a conflict then never holds up the others.
    pub fn handle(&self) -> PostgresSinkHandle {
        PostgresSinkHandle {
            config: self.config.clone(),
            state: self.state.clone(),
        }
    }

    /// The sink's name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The log position last stored for `source` (it trails the target's
    /// own position; it holds back log retention until a run resumes).
    pub fn stored_cursor(&self, source: &str) -> Option<CursorPosition> {
        self.state.cursor(source)
    }

    /// The transactions the sink is stopped on, per source.
    pub fn stopped_on(&self) -> Vec<StoppedOn> {
        self.state.all_stopped()
    }

    /// Connects to the target for every source, reads how far the target
    /// has applied each, and returns where to read each log: just after
    /// the target's position, whatever the stored cursor says.
    pub async fn resume(&mut self, sources: &[SourceLog]) -> Result<Vec<u64>, SinkError> {
        let params = params(&self.config)?;
        self.appliers.clear();
        let mut starts = Vec::with_capacity(sources.len());
        for source in sources {
            let name = &source.context.name;
            let client = connect_for_apply(&self.config, &params).await?;
            let progress = ProgressStore::open(
                &client,
                self.config.progress,
                &self.config.progress_table,
                &self.config.name,
                name,
            )
            .await?;
            progress.bind_session(&client).await?;
            let applied = progress.applied(&client).await?;
            let start = start_after(name, &source.log, applied).map_err(|e| match e {
                StartError::Sink(e) => e,
                StartError::Log(source) => SinkError::Log {
                    sink: self.config.name.clone(),
                    source,
                },
            })?;
            if applied.is_some()
                && let Err(e) = progress.drop_copy_lanes(&client).await
            {
                // Left over by a run that stopped right after the copy.
                tracing::warn!(sink = %self.config.name, source = %name, error = %e, "could not remove the initial copy's lane markers (they are ignored by later copies)");
            }
            if let Some(stopped) = self.state.stopped_on(name)
                && applied.is_some_and(|a| a >= stopped.end_lsn)
            {
                // Skipped, or applied since: no longer stopped on it.
                self.state.clear_stopped(name);
            }
            tracing::info!(
                sink = %self.config.name,
                source = %name,
                applied = %applied.map_or("nothing yet".to_owned(), |l| l.to_string()),
                progress = %progress,
                "resuming from the target's stored position"
            );
            let log_end = source.log.head().last_lsn;
            if let Some(applied) = applied.filter(|&a| a > log_end) {
                tracing::warn!(sink = %self.config.name, source = %name, %applied, %log_end, progress = %progress, "the target holds a position past the end of the source's log: transactions ending at or before it are passed over as applied. Expected when the sink restarts while the log is making what it applied durable (it applies small transactions before their fsync), or after a crash took them from the log (the publisher sends them again); otherwise another walbridge's sink of this name, for a source of this name, stores its position there (a replication origin belongs to the whole target cluster): give one of them another name");
            }
            let catalog = TargetCatalog::new(connect(&self.config, &params).await?);
            let applier = Applier::new(ApplierParts {
                sink: self.config.name.clone(),
                source: source.context.clone(),
                config: self.config.clone(),
                client,
                catalog,
                progress,
                applied_before: applied,
                state: self.state.clone(),
            })?;
            self.appliers.insert(name.clone(), applier);
            starts.push(start);
        }
        Ok(starts)
    }

    /// Applies everything `events` delivers until it closes. Every source
    /// given to [`PostgresSink::resume`] is applied concurrently, each on
    /// its own connection, in its own commit order.
    pub async fn run(mut self, mut events: mpsc::Receiver<Routed>) -> Result<(), SinkError> {
        if self.appliers.len() == 1
            && let Some((_, applier)) = self.appliers.drain().next()
        {
            // One source (the usual case): its applier takes the sink's
            // input itself, so a caught-up stream's transactions wake one
            // task less each on their way.
            let done = tokio::spawn(applier.run(events)).await;
            self.state.flush();
            return joined(done);
        }
        let mut inputs = HashMap::new();
        let mut tasks = JoinSet::new();
        for (name, applier) in self.appliers.drain() {
            let (tx, rx) = mpsc::channel(APPLIER_QUEUE);
            inputs.insert(name, tx);
            tasks.spawn(applier.run(rx));
        }
        let mut failure = None;
        while let Some(routed) = tokio::select! {
            routed = events.recv() => routed,
            Some(done) = tasks.join_next() => {
                // An applier ended early: it failed; stop the others too.
                failure = Some(joined(done).err().unwrap_or_else(|| {
                    SinkError::Mapping("an applier stopped before its input ended".into())
                }));
                None
            }
        } {
            let Some(input) = inputs.get(&routed.source.name) else {
                continue;
            };
            if input.send(routed).await.is_err() {
                break;
            }
        }
        drop(inputs);
        while let Some(done) = tasks.join_next().await {
            if let Err(e) = joined(done) {
                failure.get_or_insert(e);
            }
        }
        self.state.flush();
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

fn joined(done: Result<Result<(), SinkError>, tokio::task::JoinError>) -> Result<(), SinkError> {
    done.unwrap_or_else(|e| Err(SinkError::Mapping(format!("an applier panicked: {e}"))))
}

enum StartError {
    Sink(SinkError),
    Log(walbridge_log::LogError),
}

impl From<walbridge_log::LogError> for StartError {
    fn from(e: walbridge_log::LogError) -> Self {
        StartError::Log(e)
    }
}

/// Where to read `log` when the target has applied up to `applied`.
fn start_after(source: &str, log: &Log, applied: Option<Lsn>) -> Result<u64, StartError> {
    let log_start = log.start_lsn()?;
    match applied {
        Some(lsn) if lsn < log_start => Err(StartError::Sink(SinkError::PositionGone {
            source_name: source.to_owned(),
            applied: lsn,
            log_start,
        })),
        Some(lsn) => Ok(log.seq_after_lsn(lsn)?),
        None if log.first_seq() > 0 => Err(StartError::Sink(SinkError::CopyGone {
            source_name: source.to_owned(),
            log_start,
        })),
        None => Ok(log.first_seq()),
    }
}
