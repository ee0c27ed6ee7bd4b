//! The jsonl sink under the sink contract.

use std::path::Path;
use std::sync::Arc;

use tokio::sync::mpsc;
use walbridge_sink::{
    BoxFuture, CheckScope, ConfigContext, CursorFileSink, Health, Routed, Sink, SinkConfig,
    SinkFailure, SinkKind, SinkRun, SourceLog, Visibility, starts_from_cursor,
};

use crate::{JsonlSink, JsonlSinkConfig, health_check};

/// `type = "jsonl"`.
pub static KIND: Jsonl = Jsonl;

/// The jsonl sink kind.
pub struct Jsonl;

impl SinkKind for Jsonl {
    fn kind(&self) -> &'static str {
        "jsonl"
    }

    fn configure(
        &self,
        table: toml::Table,
        _: &ConfigContext,
    ) -> Result<Arc<dyn SinkConfig>, String> {
        let config: JsonlSinkConfig = table.try_into().map_err(|e| e.to_string())?;
        Ok(Arc::new(config))
    }
}

impl SinkConfig for JsonlSinkConfig {
    fn name(&self) -> &str {
        &self.name
    }

    fn sources(&self) -> Option<&[String]> {
        self.sources.as_deref()
    }

    fn validate(&self) -> Vec<String> {
        Vec::new()
    }

    fn check<'a>(&'a self, _: &'a CheckScope<'a>) -> BoxFuture<'a, Health> {
        Box::pin(async move {
            match health_check(self) {
                Ok(line) => Health {
                    ready: vec![line],
                    problems: Vec::new(),
                },
                Err(e) => Health::failed(e),
            }
        })
    }

    fn writes_to_stdout(&self) -> bool {
        self.path == "-"
    }

    fn preflight(&self) -> Result<(), SinkFailure> {
        health_check(self).map(drop).map_err(SinkFailure::permanent)
    }

    fn open(&self, cursor_dir: &Path) -> Result<Arc<dyn Sink>, SinkFailure> {
        let (config, dir) = (self.clone(), cursor_dir.to_owned());
        let sink = CursorFileSink::open(
            cursor_dir,
            &self.name,
            Visibility::WrittenUnits,
            move || {
                // Each attempt opens the output again, cut back to the cursor.
                JsonlSink::open(config.clone(), &dir)
                    .map(|sink| Box::new(sink) as Box<dyn SinkRun>)
                    .map_err(SinkFailure::transient)
            },
        )?;
        Ok(Arc::new(sink))
    }
}

impl SinkRun for JsonlSink {
    fn resume<'a>(
        &'a mut self,
        logs: &'a [SourceLog],
    ) -> BoxFuture<'a, Result<Vec<u64>, SinkFailure>> {
        let starts = starts_from_cursor(&self.config.name, &self.cursor, logs);
        self.logs = logs
            .iter()
            .map(|l| (l.context.name.clone(), l.log.clone()))
            .collect();
        Box::pin(async move { Ok(starts) })
    }

    fn run(
        self: Box<Self>,
        events: mpsc::Receiver<Routed>,
    ) -> BoxFuture<'static, Result<(), SinkFailure>> {
        Box::pin(async move {
            // Blocking writes: on a thread of their own.
            tokio::task::spawn_blocking(move || (*self).run(events))
                .await
                .map_err(|e| SinkFailure::transient(format!("the sink panicked: {e}")))?
                .map_err(SinkFailure::transient)
        })
    }
}
