//! Sinks: where changes go. Each sink is a folder with its configuration,
//! encoder and run loop. A sink reads every source through its own cursor
//! in that source's log, and acknowledges a position once what precedes it
//! is durable at the destination and its cursor is stored.

pub mod jsonl;

pub use walbridge_log::{LogPosition, Routed, SourceContext};

/// How a sink that failed is opened again.
#[derive(Clone)]
pub enum Reopen {
    /// From its configuration (reloading its cursor).
    Config(Box<crate::config::SinkConfig>, std::path::PathBuf),
    /// As another unit of a postgres sink, sharing its state.
    PostgresUnit(walbridge_sink_postgres::PostgresSinkHandle),
}

impl Reopen {
    /// Opens the sink again; may block (a FIFO waits for its reader).
    pub fn open(&self) -> anyhow::Result<Sink> {
        match self {
            Reopen::Config(config, dir) => Sink::open(config, dir),
            Reopen::PostgresUnit(handle) => Ok(Sink::Postgres(handle.sink())),
        }
    }
}

/// A configured sink, opened.
pub enum Sink {
    /// Newline-delimited JSON.
    Jsonl(jsonl::JsonlSink),
    /// Apply into PostgreSQL.
    Postgres(walbridge_sink_postgres::PostgresSink),
    /// Change events to Kafka.
    Kafka(Box<walbridge_sink_kafka::KafkaSink>),
}

impl Sink {
    /// Opens the sink described by `config`, with its cursor from
    /// `cursor_dir` (the health check of sinks that need no network).
    pub fn open(
        config: &crate::config::SinkConfig,
        cursor_dir: &std::path::Path,
    ) -> anyhow::Result<Self> {
        use anyhow::Context;
        match config {
            crate::config::SinkConfig::Jsonl(c) => {
                jsonl::JsonlSink::open(c.clone(), cursor_dir).map(Sink::Jsonl)
            }
            crate::config::SinkConfig::Postgres(c) => {
                walbridge_sink_postgres::PostgresSink::open(c.clone(), cursor_dir)
                    .map(Sink::Postgres)
                    .with_context(|| format!("sink `{}`", c.name))
            }
            crate::config::SinkConfig::Kafka(c) => {
                walbridge_sink_kafka::KafkaSink::open((**c).clone(), cursor_dir)
                    .map(|s| Sink::Kafka(Box::new(s)))
                    .with_context(|| format!("sink `{}`", c.name))
            }
        }
    }

    /// Where the sink's stored cursor says to go on reading `source`.
    pub fn stored_position(&self, source: &str) -> Option<walbridge_log::CursorPosition> {
        match self {
            Sink::Jsonl(s) => s.stored_position(source).cloned(),
            Sink::Postgres(s) => s.stored_position(source),
            Sink::Kafka(s) => s.stored_position(source).cloned(),
        }
    }

    /// The sink split into the parts that run (and fail, and are retried)
    /// on their own, each with the inputs it reads and how to reopen it: a
    /// postgres sink applies every source on its own, other sinks take all
    /// their sources together.
    pub fn into_units<I>(
        self,
        inputs: Vec<I>,
        config: &crate::config::SinkConfig,
        cursor_dir: &std::path::Path,
    ) -> Vec<(Sink, Vec<I>, Reopen)> {
        match self {
            Sink::Postgres(sink) => {
                let handle = sink.handle();
                inputs
                    .into_iter()
                    .map(|input| {
                        (
                            Sink::Postgres(handle.sink()),
                            vec![input],
                            Reopen::PostgresUnit(handle.clone()),
                        )
                    })
                    .collect()
            }
            sink => vec![(
                sink,
                inputs,
                Reopen::Config(Box::new(config.clone()), cursor_dir.to_owned()),
            )],
        }
    }

    /// Which log records the sink is given: a postgres sink applies a unit
    /// in one target transaction that commits only at the unit's end, so it
    /// can start on a large transaction or the initial copy while the rest
    /// is still arriving; others act on every record and wait for whole units.
    pub fn visibility(&self) -> walbridge_log::Visibility {
        match self {
            Sink::Jsonl(_) | Sink::Kafka(_) => walbridge_log::Visibility::CompleteUnits,
            Sink::Postgres(_) => walbridge_log::Visibility::Unfinished,
        }
    }

    /// Consumes `events` until the channel closes.
    pub async fn run(self, events: tokio::sync::mpsc::Receiver<Routed>) -> anyhow::Result<()> {
        match self {
            // Blocking writes: on a thread of its own.
            Sink::Jsonl(s) => tokio::task::spawn_blocking(move || s.run(events))
                .await
                .map_err(|e| anyhow::anyhow!("the sink panicked: {e}"))?,
            Sink::Postgres(s) => {
                let name = s.name().to_owned();
                s.run(events)
                    .await
                    .map_err(|e| anyhow::Error::new(e).context(format!("sink `{name}`")))
            }
            Sink::Kafka(s) => {
                let name = s.name().to_owned();
                s.run(events)
                    .await
                    .map_err(|e| anyhow::Error::new(e).context(format!("sink `{name}`")))
            }
        }
    }
}

/// True when a sink's failure is one a retry cannot cure (a message the
/// brokers refuse, a topic the sink may not write): the sink stops until
/// its configuration or the cluster is fixed; sources and other sinks go on.
pub fn is_permanent(error: &anyhow::Error) -> bool {
    error
        .chain()
        .filter_map(|e| e.downcast_ref::<walbridge_sink_kafka::SinkError>())
        .any(walbridge_sink_kafka::SinkError::is_permanent)
}
