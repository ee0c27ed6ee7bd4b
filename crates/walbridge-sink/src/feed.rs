//! What a sink receives from the logs it reads, and how it acknowledges.
//!
//! The runtime reads each source's log from the sink's position and hands
//! the sink [`Routed`] batches of events, in log order per source. A sink
//! acknowledges a [`LogPosition`] through its source's [`SourceContext`]
//! once everything before it is durable at the destination (and the
//! sink's own resume point is stored): that lets the log remove what every
//! sink has passed and the source report it as applied to the publisher.

use std::sync::Arc;

use tokio::sync::watch;
use walbridge_core::{EventBatch, Lsn};
use walbridge_log::Log;

use crate::delay::SinkDelays;

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
    /// Where the sink's stages count this source's transactions' delays.
    pub delays: SinkDelays,
}

/// Events of consecutive log records, together with their source.
#[derive(Debug)]
pub struct Routed {
    /// The source.
    pub source: Arc<SourceContext>,
    /// The events, in order.
    pub events: EventBatch,
    /// Set when the last record completes a unit (a transaction, the
    /// initial copy, a message): the position after it, which a cursor may
    /// store.
    pub position: Option<LogPosition>,
    /// Every unit that ends in the batch: the number of events up to its
    /// end, and the position after it (the last one is `position`). A sink
    /// that commits at unit boundaries can commit at any of them.
    pub boundaries: Vec<(usize, LogPosition)>,
}

/// One source's log, as a sink resumes reading it.
#[derive(Clone)]
pub struct SourceLog {
    /// The source.
    pub context: Arc<SourceContext>,
    /// Its log.
    pub log: Log,
}
