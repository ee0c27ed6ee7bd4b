//! The feed's series on the admin endpoint's `/metrics`: sessions open,
//! what each consumer was sent and acknowledged, and how far each durable
//! consumer is behind each source's log.
//!
//! Counters are added to as the sessions send and acknowledge; the
//! sessions gauge and the consumers' lag are set by [`Feed::report`]
//! every [`REPORT_INTERVAL`] (a scrape sees them at most that old). An
//! ephemeral subscription counts under an empty `consumer` label, which
//! Prometheus shows as none.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use metrics::{Counter, Unit, counter, describe_counter, describe_gauge, gauge};

use crate::server::Feed;

/// How often the gauges are set again.
pub(crate) const REPORT_INTERVAL: Duration = Duration::from_secs(1);

/// Gives the feed's series their help text (for the recorder the process
/// has installed by the time a feed starts; a no-op without one).
pub(crate) fn describe() {
    describe_gauge!(
        "walbridge_feed_sessions",
        "Subscriptions open on a gRPC feed now."
    );
    describe_counter!(
        "walbridge_feed_events_total",
        "Events a gRPC feed sent to a consumer: changes, messages and rows of the copy (sent again after a reconnect, counted again)."
    );
    describe_counter!(
        "walbridge_feed_sent_bytes_total",
        Unit::Bytes,
        "Encoded messages a gRPC feed sent to a consumer."
    );
    describe_counter!(
        "walbridge_feed_acknowledgements_total",
        "Acknowledgements a gRPC feed received from a consumer."
    );
    describe_gauge!(
        "walbridge_feed_consumer_lag_records",
        "Records of the source's log past what the durable consumer acknowledged."
    );
    describe_gauge!(
        "walbridge_feed_consumer_lag_bytes",
        Unit::Bytes,
        "WAL between the end of the source's log and what the durable consumer acknowledged."
    );
}

/// One subscription's counters.
#[derive(Clone)]
pub(crate) struct SessionCounters {
    pub events: Counter,
    pub bytes: Counter,
    pub acknowledgements: Counter,
}

impl SessionCounters {
    /// The counters of `consumer` (empty: ephemeral) of sink `sink`.
    pub fn new(sink: &str, consumer: &str) -> SessionCounters {
        let labels = [("sink", sink.to_owned()), ("consumer", consumer.to_owned())];
        SessionCounters {
            events: counter!("walbridge_feed_events_total", &labels),
            bytes: counter!("walbridge_feed_sent_bytes_total", &labels),
            acknowledgements: counter!("walbridge_feed_acknowledgements_total", &labels),
        }
    }
}

impl Feed {
    /// Sets the sessions gauge and every durable consumer's lag every
    /// [`REPORT_INTERVAL`] until the feed stops. A consumer deleted since
    /// is set to no lag once (the recorder keeps its series until
    /// walbridge restarts).
    pub async fn report(self: Arc<Self>) {
        let sink = self.sink.clone();
        let sessions = gauge!("walbridge_feed_sessions", "sink" => sink.clone());
        let mut reported = BTreeSet::<(String, String)>::new();
        let mut stopping = self.stopping.clone();
        loop {
            sessions.set(self.session_count() as f64);
            let mut now = BTreeSet::new();
            for (name, consumer) in self.consumers.list() {
                for lag in self.lags(&consumer) {
                    let labels = [
                        ("sink", sink.clone()),
                        ("consumer", name.clone()),
                        ("source", lag.source.clone()),
                    ];
                    gauge!("walbridge_feed_consumer_lag_records", &labels).set(lag.records as f64);
                    gauge!("walbridge_feed_consumer_lag_bytes", &labels).set(lag.bytes as f64);
                    now.insert((name.clone(), lag.source));
                }
            }
            for (name, source) in reported.difference(&now) {
                let labels = [
                    ("sink", sink.clone()),
                    ("consumer", name.clone()),
                    ("source", source.clone()),
                ];
                gauge!("walbridge_feed_consumer_lag_records", &labels).set(0.0);
                gauge!("walbridge_feed_consumer_lag_bytes", &labels).set(0.0);
            }
            reported = now;
            tokio::select! {
                _ = tokio::time::sleep(REPORT_INTERVAL) => {}
                _ = stopping.wait_for(|s| *s) => {
                    sessions.set(0.0);
                    return;
                }
            }
        }
    }
}
