//! The kafka sink under the sink contract.

use std::path::Path;
use std::sync::Arc;

use tokio::sync::mpsc;
use walbridge_sink::{
    BoxFuture, CheckScope, ConfigContext, CursorFileSink, Forgotten, Health, Routed, Sink,
    SinkConfig, SinkFailure, SinkKind, SinkRun, SourceLog, Visibility, starts_from_cursor,
};

use crate::{KafkaSink, KafkaSinkConfig, SchemaRegistrySetting, SinkError};

/// `type = "kafka"`.
pub static KIND: Kafka = Kafka;

/// The kafka sink kind.
pub struct Kafka;

impl SinkKind for Kafka {
    fn kind(&self) -> &'static str {
        "kafka"
    }

    /// Without a registry of its own, a sink uses the one walbridge serves.
    fn configure(
        &self,
        table: toml::Table,
        context: &ConfigContext,
    ) -> Result<Arc<dyn SinkConfig>, String> {
        let mut config: KafkaSinkConfig = table.try_into().map_err(|e| e.to_string())?;
        if let Some(url) = &context.embedded_registry {
            config.embedded_registry = Some(url.clone());
            if config.schema_registry.is_none() {
                config.schema_registry = Some(SchemaRegistrySetting::Url(url.clone()));
            }
        }
        Ok(Arc::new(config))
    }
}

fn failure(e: SinkError) -> SinkFailure {
    let permanent = e.is_permanent();
    SinkFailure::new(e, permanent)
}

impl SinkConfig for KafkaSinkConfig {
    fn name(&self) -> &str {
        &self.name
    }

    fn sources(&self) -> Option<&[String]> {
        self.sources.as_deref()
    }

    fn validate(&self) -> Vec<String> {
        KafkaSinkConfig::validate(self)
    }

    fn check<'a>(&'a self, scope: &'a CheckScope<'a>) -> BoxFuture<'a, Health> {
        Box::pin(crate::health_check(self, scope))
    }

    /// Topics and their messages are the consumers' (nothing is removed).
    /// With `exactly_once`, the source's position record stays on the
    /// positions topic: it names the log that was dropped, so the next run
    /// does not resume from it; compaction keeps it until a newer one.
    fn forget<'a>(&'a self, source: &'a str) -> BoxFuture<'a, Forgotten> {
        let left = if self.exactly_once {
            vec![format!(
                "the position record `{}` on topic {} (it names the dropped log and is not resumed from; nothing to do)",
                crate::positions::record_key(&self.name, source),
                self.positions_topic
            )]
        } else {
            Vec::new()
        };
        Box::pin(async move {
            Forgotten {
                removed: Vec::new(),
                left,
            }
        })
    }

    fn open(&self, cursor_dir: &Path) -> Result<Arc<dyn Sink>, SinkFailure> {
        let (config, dir) = (self.clone(), cursor_dir.to_owned());
        let sink = CursorFileSink::open(
            cursor_dir,
            &self.name,
            Visibility::CompleteUnits,
            move || {
                KafkaSink::open(config.clone(), &dir)
                    .map(|sink| Box::new(sink) as Box<dyn SinkRun>)
                    .map_err(failure)
            },
        )?;
        Ok(Arc::new(sink))
    }
}

impl SinkRun for KafkaSink {
    /// With `exactly_once`, the positions committed in Kafka; else the
    /// cursor file.
    fn resume<'a>(
        &'a mut self,
        logs: &'a [SourceLog],
    ) -> BoxFuture<'a, Result<Vec<u64>, SinkFailure>> {
        Box::pin(async move {
            self.recover().await.map_err(failure)?;
            Ok(starts_from_cursor(self.name(), self.cursor(), logs))
        })
    }

    fn run(
        self: Box<Self>,
        events: mpsc::Receiver<Routed>,
    ) -> BoxFuture<'static, Result<(), SinkFailure>> {
        Box::pin(async move { KafkaSink::run(*self, events).await.map_err(failure) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafka_sinks_read_with_their_defaults_and_the_served_registry() {
        let table: toml::Table = toml::from_str(
            "name = \"events\"\nbrokers = \"k1:9092,k2:9092\"\nformat = \"avro\"\n[kafka_properties]\n\"compression.type\" = \"zstd\"\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let context = ConfigContext {
            embedded_registry: Some("http://127.0.0.1:8081".into()),
        };
        let config = KIND
            .configure(table.clone(), &context)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(config.name(), "events");
        let k: KafkaSinkConfig = table.try_into().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(k.topic, "{source}.{schema}.{table}");
        assert!(k.tombstones && k.topic_creation.enabled);
        let properties = k.client_properties();
        assert_eq!(properties["compression.type"], "zstd");
        assert_eq!(properties["enable.idempotence"], "true");
        assert_eq!(properties["bootstrap.servers"], "k1:9092,k2:9092");
        // Without a registry of its own, the one walbridge serves.
        assert!(format!("{config:?}").contains("Url(\"http://127.0.0.1:8081\")"));
    }
}
