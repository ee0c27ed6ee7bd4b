//! Which log positions are safe to store: a position is stored only once
//! every message produced before it was acknowledged by the brokers.
//!
//! Messages are counted in epochs: an epoch is closed ("sealed") with the
//! log position reached when a unit (a transaction, the initial copy) has
//! been handed to the producer. Deliveries complete out of order across
//! partitions; positions are released in epoch order, each once its epoch
//! and every earlier one have no message in flight.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use rdkafka::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::ProducerContext;
use tokio::sync::Notify;
use walbridge_core::PgTimestamp;
use walbridge_sink::LogPosition;

use crate::error::SinkError;

/// The longest a key is shown in an error message.
const KEY_SHOWN: usize = 200;

/// Messages of one epoch still in flight, and where it ends.
#[derive(Debug, Default)]
struct Epoch {
    in_flight: usize,
    sealed: Option<Released>,
}

/// A position whose messages are all delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    /// The source.
    pub source: String,
    /// The position reached.
    pub position: LogPosition,
    /// Commit times of the source transactions the epoch ended, for their delays.
    pub commit_times: Vec<PgTimestamp>,
}

#[derive(Debug)]
struct State {
    /// Id of `epochs[0]`.
    first: u64,
    /// Oldest first; the last one is open (not sealed).
    epochs: VecDeque<Epoch>,
    /// The first delivery that failed, until reported.
    failure: Option<SinkError>,
    /// A delivery failed: no position is released any more.
    failed: bool,
    /// Messages in flight in all epochs.
    in_flight: usize,
}

/// Counts messages in flight per epoch.
#[derive(Debug)]
pub struct Tracker {
    state: Mutex<State>,
    changed: Notify,
    /// `walbridge_kafka_in_flight_messages` of the sink.
    in_flight: metrics::Gauge,
}

impl Default for Tracker {
    fn default() -> Self {
        Tracker::new(metrics::Gauge::noop())
    }
}

impl Tracker {
    /// A tracker that also keeps `in_flight` (a metric) up to date.
    pub fn new(in_flight: metrics::Gauge) -> Self {
        // A producer made again (after a failure) starts from nothing.
        in_flight.set(0.0);
        Tracker {
            state: Mutex::new(State {
                first: 0,
                epochs: VecDeque::from([Epoch::default()]),
                failure: None,
                failed: false,
                in_flight: 0,
            }),
            changed: Notify::new(),
            in_flight,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the counts half
        // updated: every update is a single field write.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a message about to be produced; returns its epoch.
    pub fn track(&self) -> u64 {
        let mut state = self.state();
        let id = state.first + state.epochs.len() as u64 - 1;
        if let Some(open) = state.epochs.back_mut() {
            open.in_flight += 1;
        }
        state.in_flight += 1;
        self.in_flight.set(state.in_flight as f64);
        id
    }

    /// Takes back a message that was counted but not produced.
    pub fn untrack(&self, epoch: u64) {
        self.finish(epoch, None);
    }

    /// Closes the open epoch: `position` of `source` is reached once all
    /// its messages (and every earlier epoch's) are delivered; the epoch
    /// ended the transactions committed at `commit_times`.
    pub fn seal(&self, source: &str, position: LogPosition, commit_times: Vec<PgTimestamp>) {
        let mut state = self.state();
        if let Some(open) = state.epochs.back_mut() {
            open.sealed = Some(Released {
                source: source.to_owned(),
                position,
                commit_times,
            });
        }
        state.epochs.push_back(Epoch::default());
    }

    fn finish(&self, epoch: u64, failure: Option<SinkError>) {
        let mut state = self.state();
        let index = epoch.checked_sub(state.first).map(|i| i as usize);
        if let Some(e) = index.and_then(|i| state.epochs.get_mut(i)) {
            e.in_flight = e.in_flight.saturating_sub(1);
        }
        state.in_flight = state.in_flight.saturating_sub(1);
        self.in_flight.set(state.in_flight as f64);
        if !state.failed && failure.is_some() {
            state.failed = true;
            state.failure = failure;
        }
        drop(state);
        self.changed.notify_one();
    }

    /// The positions released since the last call (oldest first), or the
    /// first delivery failure.
    pub fn take_delivered(&self) -> Result<Vec<Released>, SinkError> {
        let mut state = self.state();
        if let Some(failure) = state.failure.take() {
            return Err(failure);
        }
        let mut released = Vec::new();
        if state.failed {
            return Ok(released);
        }
        while state.epochs.len() > 1
            && state.epochs.front().is_some_and(|e| e.in_flight == 0)
            && let Some(epoch) = state.epochs.pop_front()
        {
            state.first += 1;
            released.extend(epoch.sealed);
        }
        Ok(released)
    }

    /// Messages in flight in all epochs.
    pub fn in_flight(&self) -> usize {
        self.state().in_flight
    }

    /// Waits until a delivery completes.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}

/// What the producer carries along with each message.
#[derive(Debug)]
pub struct Pending {
    /// The message's epoch.
    pub epoch: u64,
    /// Its source table (`schema.table`, or `-`), for error messages.
    pub table: Arc<str>,
}

/// The producer's context: delivery reports go to the tracker, librdkafka's
/// logs and errors to `tracing`, whether the brokers answer to the
/// sink's log.
pub struct DeliveryContext {
    /// Where deliveries are counted.
    pub tracker: Arc<Tracker>,
    /// `walbridge_kafka_messages_total` of the sink: delivered, failed.
    pub delivered: [metrics::Counter; 2],
    /// Says when the brokers stop and start answering.
    pub reachability: crate::client::Reachability,
}

impl DeliveryContext {
    /// The context of sink `sink`'s producer: its deliveries tracked by
    /// `tracker`, both counted in its metrics.
    pub fn new(sink: &str, brokers: &str) -> Self {
        use metrics::{counter, describe_counter, describe_gauge, gauge};
        describe_counter!(
            "walbridge_kafka_messages_total",
            "Messages a kafka sink produced, by outcome: delivered (acknowledged by the brokers) or failed."
        );
        describe_gauge!(
            "walbridge_kafka_in_flight_messages",
            "Messages a kafka sink produced that the brokers have not acknowledged yet."
        );
        let outcome = |outcome: &'static str| counter!("walbridge_kafka_messages_total", "sink" => sink.to_owned(), "outcome" => outcome);
        DeliveryContext {
            tracker: Arc::new(Tracker::new(gauge!(
                "walbridge_kafka_in_flight_messages",
                "sink" => sink.to_owned()
            ))),
            delivered: [outcome("delivered"), outcome("failed")],
            reachability: crate::client::Reachability::new(sink, brokers),
        }
    }
}

/// A key as text for error messages: JSON keys as they are, others as hex.
pub fn show_key(key: Option<&[u8]>) -> String {
    let Some(key) = key else {
        return "null".to_owned();
    };
    let shown = match std::str::from_utf8(key) {
        Ok(text) if !text.contains(char::is_control) => text.to_owned(),
        _ => key.iter().map(|b| format!("{b:02x}")).collect(),
    };
    if shown.len() > KEY_SHOWN {
        let mut end = KEY_SHOWN;
        while !shown.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &shown[..end])
    } else {
        shown
    }
}

impl ClientContext for DeliveryContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        self.reachability.log(level, facility, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.reachability.error(error, reason);
    }
}

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = Box<Pending>;

    fn delivery(&self, result: &DeliveryResult<'_>, pending: Box<Pending>) {
        let [delivered, failed] = &self.delivered;
        match result {
            Ok(_) => delivered.increment(1),
            Err(_) => failed.increment(1),
        }
        let failure = match result {
            Ok(_) => {
                self.reachability.delivered();
                None
            }
            Err((error, message)) => Some(SinkError::Delivery {
                topic: message.topic().to_owned(),
                table: pending.table.to_string(),
                key: show_key(message.key()),
                reason: error.to_string(),
                code: error.rdkafka_error_code(),
            }),
        };
        self.tracker.finish(pending.epoch, failure);
    }
}

#[cfg(test)]
mod tests {
    use walbridge_core::Lsn;

    use super::*;

    fn at(next: u64) -> LogPosition {
        LogPosition {
            next,
            lsn: Lsn(next),
        }
    }

    #[test]
    fn positions_are_released_in_order_once_delivered() {
        let tracker = Tracker::default();
        let a1 = tracker.track();
        let a2 = tracker.track();
        tracker.seal("s", at(1), vec![PgTimestamp(10)]);
        let b1 = tracker.track();
        tracker.seal("s", at(2), Vec::new());
        tracker.seal("t", at(7), vec![PgTimestamp(11), PgTimestamp(12)]);
        assert_eq!(tracker.in_flight(), 3);
        // The later epoch is delivered first: nothing is released yet.
        tracker.finish(b1, None);
        assert!(tracker.take_delivered().unwrap_or_default().is_empty());
        tracker.finish(a1, None);
        assert!(tracker.take_delivered().unwrap_or_default().is_empty());
        tracker.finish(a2, None);
        let released = tracker.take_delivered().unwrap_or_default();
        let shown: Vec<_> = released
            .iter()
            .map(|r| (r.source.as_str(), r.position, r.commit_times.len()))
            .collect();
        assert_eq!(shown, [("s", at(1), 1), ("s", at(2), 0), ("t", at(7), 2)]);
        assert_eq!(tracker.in_flight(), 0);
        let c = tracker.track();
        tracker.untrack(c);
        assert!(tracker.take_delivered().unwrap_or_default().is_empty());
    }

    #[test]
    fn a_failed_delivery_is_reported_once() {
        let tracker = Tracker::default();
        let e = tracker.track();
        tracker.seal("s", at(1), Vec::new());
        tracker.finish(
            e,
            Some(SinkError::Delivery {
                topic: "t".into(),
                table: "public.t".into(),
                key: "1".into(),
                reason: "too large".into(),
                code: None,
            }),
        );
        assert!(tracker.take_delivered().is_err());
        assert!(tracker.take_delivered().unwrap_or_default().is_empty());
    }

    #[test]
    fn keys_are_shown_readably() {
        assert_eq!(show_key(None), "null");
        assert_eq!(show_key(Some(b"{\"id\":1}")), "{\"id\":1}");
        assert_eq!(show_key(Some(&[0, 0, 0, 1, 2])), "0000000102");
        assert!(show_key(Some("é".repeat(300).as_bytes())).ends_with('…'));
    }
}
