//! Sinks: where changes go. Each sink is a folder with its configuration,
//! encoder and run loop. A sink reads every source through its own cursor
//! in that source's log, and acknowledges a position once what precedes it
//! is durable at the destination and its cursor is stored.

pub mod jsonl;

use std::sync::Arc;

use tokio::sync::watch;
use walbridge_core::{EventBatch, Lsn};

/// A position in a source's log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogPosition {
    /// The next record to read.
    pub next: u64,
    /// The LSN of the record before it: the publisher position covered.
    pub lsn: Lsn,
}

/// Which source an event came from, as a sink sees it.
#[derive(Debug)]
pub struct SourceContext {
    /// The source's name.
    pub name: String,
    /// The publisher's database.
    pub database: String,
    /// The identity of the source's log, recorded with cursor positions.
    pub log_id: String,
    /// Where the sink acknowledges how far it has durably processed this source.
    pub acked: watch::Sender<LogPosition>,
}

/// Events of consecutive log records, together with their source.
#[derive(Debug)]
pub struct Routed {
    /// The source.
    pub source: Arc<SourceContext>,
    /// The events, in order.
    pub events: EventBatch,
    /// Set when the last record completes a unit: the position after it,
    /// which a cursor may store.
    pub position: Option<LogPosition>,
}

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
