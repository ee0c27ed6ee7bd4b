//! Sinks: where changes go. Each sink is a folder with its configuration,
//! encoder and run loop.

pub mod jsonl;

use std::sync::Arc;

use tokio::sync::watch;
use walbridge_core::{EventBatch, Lsn};

/// Which source an event came from, as a sink sees it.
#[derive(Debug)]
pub struct SourceContext {
    /// The source's name.
    pub name: String,
    /// The publisher's database.
    pub database: String,
    /// Where the sink reports how far it has made this source's changes durable.
    pub flushed: watch::Sender<Lsn>,
}

/// Events together with their source.
#[derive(Debug)]
pub struct Routed {
    /// The source.
    pub source: Arc<SourceContext>,
    /// The events, in order.
    pub events: EventBatch,
}
