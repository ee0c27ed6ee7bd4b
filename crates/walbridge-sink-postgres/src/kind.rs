//! The postgres sink under the sink contract.

use std::path::Path;
use std::sync::Arc;

use tokio::sync::mpsc;
use walbridge_core::{Lsn, SequenceValues};
use walbridge_sink::{
    BoxFuture, CheckScope, ConfigContext, CursorPosition, Forgotten, Health, Routed,
    SequencesSynced, Sink, SinkConfig, SinkFailure, SinkKind, SinkRun, SourceLog, Visibility,
};

use crate::deferred::DeferredIndexes;
use crate::sequences::SequenceOutcome;
use crate::{PostgresSink, PostgresSinkConfig, PostgresSinkHandle, SinkError};

/// `type = "postgres"`.
pub static KIND: Postgres = Postgres;

/// The postgres sink kind.
pub struct Postgres;

impl SinkKind for Postgres {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    fn configure(
        &self,
        table: toml::Table,
        _: &ConfigContext,
    ) -> Result<Arc<dyn SinkConfig>, String> {
        let config: PostgresSinkConfig = table.try_into().map_err(|e| e.to_string())?;
        Ok(Arc::new(config))
    }
}

fn failure(e: SinkError) -> SinkFailure {
    let permanent = e.is_permanent();
    SinkFailure::new(e, permanent)
}

impl SinkConfig for PostgresSinkConfig {
    fn name(&self) -> &str {
        &self.name
    }

    fn sources(&self) -> Option<&[String]> {
        self.sources.as_deref()
    }

    fn validate(&self) -> Vec<String> {
        PostgresSinkConfig::validate(self)
    }

    /// The target answers and takes the sink's role, and every published
    /// table of every source it reads maps onto a target table.
    fn check<'a>(&'a self, scope: &'a CheckScope<'a>) -> BoxFuture<'a, Health> {
        Box::pin(async move {
            let mut health = match crate::health_check(self).await {
                Ok(line) => Health {
                    ready: vec![line],
                    problems: Vec::new(),
                },
                Err(e) => return Health::failed(e),
            };
            for (source, relations) in scope.tables_read_by(self) {
                match crate::check_tables(self, source, relations).await {
                    Ok(found) if found.is_empty() => health.ready.push(format!(
                        "the {} table(s) source `{source}` publishes map onto the target",
                        relations.len()
                    )),
                    Ok(found) => health.problems.extend(found.into_iter().map(Into::into)),
                    Err(e) => health.problems.push(e.into()),
                }
            }
            health
        })
    }

    fn open(&self, cursor_dir: &Path) -> Result<Arc<dyn Sink>, SinkFailure> {
        let sink = PostgresSink::open(self.clone(), cursor_dir).map_err(failure)?;
        Ok(Arc::new(Opened {
            handle: sink.handle(),
        }))
    }

    fn forget<'a>(&'a self, source: &'a str) -> BoxFuture<'a, Forgotten> {
        Box::pin(async move {
            let by_hand = || {
                crate::progress::forget_by_hand(
                    self.progress,
                    &self.progress_table,
                    &self.name,
                    source,
                )
            };
            let connected = async {
                let params = crate::connect::params(self)?;
                crate::connect::connect(self, &params).await
            };
            match connected.await {
                Ok(client) => {
                    crate::progress::forget(&client, &self.progress_table, &self.name, source).await
                }
                Err(e) => Forgotten {
                    removed: Vec::new(),
                    left: std::iter::once(format!("nothing removed from the target: {e}"))
                        .chain(by_hand())
                        .chain(
                            DeferredIndexes::new(&self.progress_table, &self.name, source)
                                .map(|deferred| deferred.by_hand()),
                        )
                        .collect(),
                },
            }
        })
    }

    fn sync_sequences<'a>(
        &'a self,
        source: &'a str,
        values: &'a SequenceValues,
    ) -> Option<BoxFuture<'a, Result<SequencesSynced, SinkFailure>>> {
        Some(Box::pin(async move {
            let params = crate::connect::params(self).map_err(failure)?;
            let client = crate::connect::connect(self, &params)
                .await
                .map_err(failure)?;
            let template = crate::mapping::NameTemplate::parse(&self.table)
                .map_err(|e| failure(SinkError::Mapping(e)))?;
            let results = crate::sequences::set_sequences(&client, &template, source, values).await;
            let mut complete = true;
            let lines = results
                .into_iter()
                .map(|r| {
                    let (target, value) = (r.target, r.value);
                    match r.outcome {
                        SequenceOutcome::Set => format!("{target}: set to {value}"),
                        SequenceOutcome::Ahead => {
                            format!("{target}: already at or past {value}, left as it is")
                        }
                        SequenceOutcome::Missing => {
                            complete = false;
                            format!("{target}: no such sequence on the target (create it, then run this again)")
                        }
                        SequenceOutcome::Refused(reason) => {
                            complete = false;
                            format!("{target}: cannot set it to {value}: {reason}")
                        }
                    }
                })
                .collect();
            Ok(SequencesSynced { lines, complete })
        }))
    }

    fn skip<'a>(
        &'a self,
        cursor_dir: &'a Path,
        lsn: Option<Lsn>,
    ) -> Option<BoxFuture<'a, Result<String, SinkFailure>>> {
        Some(Box::pin(async move {
            let skipped = crate::skip(self, cursor_dir, lsn).await.map_err(failure)?;
            Ok(format!(
                "skipped {skipped}; sink `{}` goes on after it (error was: {})",
                self.name, skipped.error
            ))
        }))
    }
}

/// A postgres sink opened: its state, shared by every source's attempts.
struct Opened {
    handle: PostgresSinkHandle,
}

impl Sink for Opened {
    fn stored_cursor(&self, source: &str) -> Option<CursorPosition> {
        self.handle.sink().stored_cursor(source)
    }

    /// A unit is applied in one target transaction that commits only at
    /// its end, so the sink can start on a large transaction or the
    /// initial copy while the rest is still arriving; and a small
    /// transaction as soon as the log has written it, while its fsync runs:
    /// the target stores the LSN it applied up to with what it applied, and
    /// the applier passes over what ends at or before it (a transaction the
    /// log lost in a crash comes again from the publisher with its LSN).
    fn visibility(&self) -> Visibility {
        Visibility::Written
    }

    fn per_source(&self) -> bool {
        true
    }

    fn start(&self) -> Result<Box<dyn SinkRun>, SinkFailure> {
        Ok(Box::new(self.handle.sink()))
    }
}

impl SinkRun for PostgresSink {
    fn resume<'a>(
        &'a mut self,
        logs: &'a [SourceLog],
    ) -> BoxFuture<'a, Result<Vec<u64>, SinkFailure>> {
        Box::pin(async move { PostgresSink::resume(self, logs).await.map_err(failure) })
    }

    fn run(
        self: Box<Self>,
        events: mpsc::Receiver<Routed>,
    ) -> BoxFuture<'static, Result<(), SinkFailure>> {
        Box::pin(async move { PostgresSink::run(*self, events).await.map_err(failure) })
    }
}
