//! `walbridge_log_sync_seconds`: how long each fsync of the log's records
//! took (the `fdatasync` of the segment being written), by source and by
//! who made it (as `walbridge_log_syncs_total` counts them). A jsonl
//! sink, a Kafka sink or a feed waits for one before it has a transaction
//! (a postgres sink does not), so on a steady stream it is their share of
//! the delay, and its tail is the disk's: a disk in trouble shows here
//! first, as it does in etcd's `etcd_disk_wal_fsync_duration_seconds`.

use metrics::Histogram;

/// The histogram's name.
pub const SYNC_TIME_METRIC: &str = "walbridge_log_sync_seconds";

/// Its buckets: from a fast disk's tenth of a millisecond to a stalled one's seconds.
pub const SYNC_TIME_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_2, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5,
];

/// Gives the histogram its help text (for the recorder the process installs).
pub fn describe_sync_time() {
    metrics::describe_histogram!(
        SYNC_TIME_METRIC,
        metrics::Unit::Seconds,
        "How long each fsync of the source's log's records took, by who made it (as walbridge_log_syncs_total): what a jsonl sink, a Kafka sink or a feed waits for before it has a transaction."
    );
}

/// The `by` label of each syncer's fsyncs, here and in
/// `walbridge_log_syncs_total` ([`crate::Syncs::by_label`]).
pub(crate) const BY_APPENDER: &str = "appender";
pub(crate) const BY_SYNC_THREAD: &str = "sync";
pub(crate) const BY_WRITER: &str = "writer";

/// One log's histograms, one per [`crate::writer`] syncer.
#[derive(Debug)]
pub(crate) struct SyncTime {
    pub appender: Histogram,
    pub sync_thread: Histogram,
    pub writer: Histogram,
}

impl SyncTime {
    /// For the log of source `source`, on the recorder installed now (none,
    /// or no source named: nothing is kept).
    pub(crate) fn new(source: &str) -> Self {
        let by = |by: &'static str| {
            if source.is_empty() {
                Histogram::noop()
            } else {
                metrics::histogram!(SYNC_TIME_METRIC, "source" => source.to_owned(), "by" => by)
            }
        };
        SyncTime {
            appender: by(BY_APPENDER),
            sync_thread: by(BY_SYNC_THREAD),
            writer: by(BY_WRITER),
        }
    }
}
