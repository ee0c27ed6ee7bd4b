//! Sinks: where changes go. Each sink is a folder with its configuration,
//! encoder and run loop. A sink reads every source through its own cursor
//! in that source's log, and acknowledges a position once what precedes it
//! is durable at the destination and its cursor is stored.

pub mod jsonl;

pub use walbridge_log::{LogPosition, Routed, SourceContext};

/// A configured sink, opened.
pub enum Sink {
    /// Newline-delimited JSON.
    Jsonl(jsonl::JsonlSink),
}

impl Sink {
    /// Opens the sink described by `config`, with its cursor from `cursor_dir`.
    pub fn open(
        config: &crate::config::SinkConfig,
        cursor_dir: &std::path::Path,
    ) -> anyhow::Result<Self> {
        match config {
            crate::config::SinkConfig::Jsonl(c) => {
                jsonl::JsonlSink::open(c.clone(), cursor_dir).map(Sink::Jsonl)
            }
        }
    }

    /// Where the sink's stored cursor says to go on reading `source`.
    pub fn stored_position(&self, source: &str) -> Option<&walbridge_log::CursorPosition> {
        match self {
            Sink::Jsonl(s) => s.stored_position(source),
        }
    }

    /// Consumes `events` until the channel closes (blocking: run it on a thread of its own).
    pub fn run(self, events: tokio::sync::mpsc::Receiver<Routed>) -> anyhow::Result<()> {
        match self {
            Sink::Jsonl(s) => s.run(events),
        }
    }
}
