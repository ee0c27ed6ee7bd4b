//! How long a transaction takes to get through: the histogram
//! `walbridge_transaction_delay_seconds`, the time from a transaction's
//! commit on the publisher to each stage it passes, per source (and sink):
//!
//! * `received`: the source has the whole transaction and hands it to its log;
//! * `read`: a sink's feeder has read it from the log (so it is durable there);
//! * `delivered`: it is in the sink's queue (what is left is the sink's own work);
//! * `applied`: the sink's destination has it (committed on a target
//!   PostgreSQL, written out by jsonl, acknowledged by Kafka, sent to a
//!   feed consumer).
//!
//! Each is measured against the commit time the publisher sends, on this
//! machine's clock: a clock skew between the two moves every stage alike,
//! so the differences between stages — each stage's share of the delay —
//! hold whatever the skew. Means subtract exactly (from the histogram's
//! `_sum` and `_count`); `scripts/bench-latency.sh` reports them that way.
//! What of `received` is the publisher's own (its commit's flush, the
//! walsender's decoding) the source measures apart, on the publisher's
//! clock alone: `walbridge_publisher_send_delay_seconds`
//! (`walbridge_source::SEND_DELAY_METRIC`).

use std::time::SystemTime;

use metrics::Histogram;
use walbridge_core::PgTimestamp;

/// The histogram's name.
pub const DELAY_METRIC: &str = "walbridge_transaction_delay_seconds";

/// Its buckets, in seconds: from a steady stream's sub-millisecond delays
/// to a catch-up's minutes.
pub const DELAY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0,
    300.0,
];

/// Gives the histogram its help text (for the recorder the process installs).
pub fn describe_delay() {
    metrics::describe_histogram!(
        DELAY_METRIC,
        metrics::Unit::Seconds,
        "Time from a transaction's commit on the publisher to each stage it passes (received, read, delivered, applied), by source and sink."
    );
}

/// Seconds from `commit_time` (the publisher's) to now (this machine's);
/// zero when the clocks say the commit is in the future.
fn since(commit_time: PgTimestamp) -> f64 {
    let now = match SystemTime::now().duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => d.as_micros() as i64,
        Err(_) => return 0.0,
    };
    now.saturating_sub(commit_time.unix_micros()).max(0) as f64 / 1e6
}

/// Where a source's transactions are counted as received.
#[derive(Debug, Clone)]
pub struct SourceDelay(Histogram);

impl SourceDelay {
    /// For source `source`, on the recorder installed now (none: nothing is kept).
    pub fn new(source: &str) -> Self {
        SourceDelay(metrics::histogram!(
            DELAY_METRIC,
            "stage" => "received",
            "source" => source.to_owned(),
        ))
    }

    /// A transaction committed at `commit_time` is received.
    pub fn received(&self, commit_time: PgTimestamp) {
        self.0.record(since(commit_time));
    }
}

/// Where one sink counts one source's transactions at its stages.
#[derive(Debug, Clone)]
pub struct SinkDelays {
    read: Histogram,
    delivered: Histogram,
    applied: Histogram,
}

impl SinkDelays {
    /// For sink `sink` reading source `source`, on the recorder installed
    /// now (none: nothing is kept).
    pub fn new(source: &str, sink: &str) -> Self {
        let at = |stage: &'static str| {
            metrics::histogram!(
                DELAY_METRIC,
                "stage" => stage,
                "source" => source.to_owned(),
                "sink" => sink.to_owned(),
            )
        };
        SinkDelays {
            read: at("read"),
            delivered: at("delivered"),
            applied: at("applied"),
        }
    }

    /// Not counted anywhere (tests, tools).
    pub fn none() -> Self {
        SinkDelays {
            read: Histogram::noop(),
            delivered: Histogram::noop(),
            applied: Histogram::noop(),
        }
    }

    /// A transaction committed at `commit_time` was read from the log.
    pub fn read(&self, commit_time: PgTimestamp) {
        self.read.record(since(commit_time));
    }

    /// A transaction committed at `commit_time` is in the sink's queue.
    pub fn delivered(&self, commit_time: PgTimestamp) {
        self.delivered.record(since(commit_time));
    }

    /// The sink's destination has a transaction committed at `commit_time`.
    pub fn applied(&self, commit_time: PgTimestamp) {
        self.applied.record(since(commit_time));
    }
}
