//! `walbridge_publisher_send_delay_seconds`: per transaction, the time from
//! its commit to the walsender's sending its commit message, both on the
//! publisher's clock (the commit time in the commit message, the send time
//! in the `XLogData` that carries it). It is the publisher's share of a
//! transaction's delay — its commit's WAL flush (a walsender sends only
//! flushed WAL), the walsender's wake-up and its decoding — which any
//! subscriber pays, a native one too. Against the stages of
//! `walbridge_transaction_delay_seconds` (walbridge's clock, from the same
//! commit time) it splits `received` into the publisher's part and
//! walbridge's; unlike them it is exact whatever the clocks' skew.

use metrics::Histogram;
use walbridge_core::PgTimestamp;

/// The histogram's name (its buckets are the transaction delay's).
pub const SEND_DELAY_METRIC: &str = "walbridge_publisher_send_delay_seconds";

/// Gives the histogram its help text (for the recorder the process installs).
pub fn describe_send_delay() {
    metrics::describe_histogram!(
        SEND_DELAY_METRIC,
        metrics::Unit::Seconds,
        "Time from a transaction's commit to the walsender's sending its commit, both on the publisher's clock: the publisher's share of the delay, by source."
    );
}

/// Where one source counts its transactions' send delays.
#[derive(Clone, Debug)]
pub(crate) struct SendDelay(Histogram);

impl SendDelay {
    /// For source `source`, on the recorder installed now (none: nothing is kept).
    pub(crate) fn new(source: &str) -> Self {
        SendDelay(metrics::histogram!(SEND_DELAY_METRIC, "source" => source.to_owned()))
    }

    /// A transaction committed at `commit_time` was sent at `send_time`.
    pub(crate) fn sent(&self, commit_time: PgTimestamp, send_time: PgTimestamp) {
        let micros = send_time
            .unix_micros()
            .saturating_sub(commit_time.unix_micros());
        self.0.record(micros.max(0) as f64 / 1e6);
    }
}
