//! What the running pipeline shows of itself: each source (what it does,
//! its positions, its log) and each sink (what it does, its last error,
//! how far it has acknowledged each source and how far behind it is).
//!
//! The pipeline keeps live handles (counters, watch channels), read only
//! when someone asks — the admin endpoint's `/status`, `/readyz` and
//! `/metrics` — so watching costs nothing on the data path.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::sync::watch;
use walbridge_core::{OPERATIONS, PgTimestamp, SourceEvent};
use walbridge_log::{Entry, Log};
use walbridge_sink::LogPosition;
use walbridge_source::{SourcePhase, SourceStats};

/// What a sink is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkState {
    /// Its first attempt is starting.
    Starting,
    /// Delivering.
    Running,
    /// An attempt failed; it is tried again (and counts as running again
    /// once it acknowledges something or has run for a while).
    Retrying,
    /// Stopped by a failure no retry cures.
    Stopped,
    /// Paused by `walbridge pause`.
    Paused,
}

impl SinkState {
    /// Every state, in the order of their numbers.
    pub const ALL: [SinkState; 5] = [
        SinkState::Starting,
        SinkState::Running,
        SinkState::Retrying,
        SinkState::Stopped,
        SinkState::Paused,
    ];

    /// The state's name in status and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            SinkState::Starting => "starting",
            SinkState::Running => "running",
            SinkState::Retrying => "retrying",
            SinkState::Stopped => "stopped",
            SinkState::Paused => "paused",
        }
    }
}

/// A sink's state as its supervisor reports it.
#[derive(Debug, Default)]
pub struct SinkHealth {
    state: AtomicU8,
    last_error: Mutex<Option<String>>,
    failures: AtomicU64,
}

impl SinkHealth {
    /// What the sink is doing.
    pub fn state(&self) -> SinkState {
        SinkState::ALL
            .get(self.state.load(Ordering::Relaxed) as usize)
            .copied()
            .unwrap_or(SinkState::Starting)
    }

    /// The sink is now `state`.
    pub fn set(&self, state: SinkState) {
        let n = SinkState::ALL.iter().position(|s| *s == state).unwrap_or(0);
        self.state.store(n as u8, Ordering::Relaxed);
    }

    /// An attempt failed with `error`; the sink is now `state`.
    pub fn failed(&self, state: SinkState, error: String) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(error);
        self.set(state);
    }

    /// The last failure, as logged.
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Attempts that failed.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }
}

/// A source as the pipeline runs it.
pub struct ObservedSource {
    /// Its name.
    pub name: String,
    /// Its live counters.
    pub stats: Arc<SourceStats>,
    /// Its log.
    pub log: Log,
    /// The most its log may hold (`[log] max_size`).
    pub log_max_bytes: Option<u64>,
    /// Where it spills transactions too large for memory.
    pub spill_dir: std::path::PathBuf,
}

/// What a sink's events are counted by: [`OPERATIONS`] (`read` for rows
/// copied while streaming), then `snapshot` for rows of the initial copy.
pub const EVENT_KINDS: [&str; 6] = ["insert", "update", "delete", "truncate", "read", "snapshot"];

/// Where `snapshot` is in [`EVENT_KINDS`].
const SNAPSHOT: usize = OPERATIONS.len();

/// Events handed to a sink from one source, by [`EVENT_KINDS`]. A sink
/// attempt that fails is handed what it had not acknowledged again, and
/// that is counted again.
#[derive(Debug, Default)]
pub struct SinkEvents([AtomicU64; EVENT_KINDS.len()]);

impl SinkEvents {
    /// `events` counted by [`EVENT_KINDS`], for [`SinkEvents::add`].
    pub fn tally(events: &[SourceEvent]) -> [u64; EVENT_KINDS.len()] {
        let mut counts = [0u64; EVENT_KINDS.len()];
        for event in events {
            match event {
                SourceEvent::Change(change) => {
                    if let Some(i) = change.operation() {
                        counts[i] += 1;
                    }
                }
                SourceEvent::Snapshot(batch) => counts[SNAPSHOT] += batch.rows.len() as u64,
                _ => {}
            }
        }
        counts
    }

    /// Adds what [`SinkEvents::tally`] counted of events handed over
    /// together: one atomic add per kind present, not per event.
    pub fn add(&self, counts: [u64; EVENT_KINDS.len()]) {
        for (total, n) in self.0.iter().zip(counts) {
            if n > 0 {
                total.fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    /// The counts, in [`EVENT_KINDS`] order.
    pub fn get(&self) -> [u64; EVENT_KINDS.len()] {
        std::array::from_fn(|i| self.0[i].load(Ordering::Relaxed))
    }
}

/// One source a sink reads.
pub struct ObservedInput {
    /// The source.
    pub source: String,
    /// What the sink has acknowledged of it.
    pub acked: watch::Receiver<LogPosition>,
    /// The source's log.
    pub log: Log,
    /// The events handed to the sink from it.
    pub events: Arc<SinkEvents>,
}

/// A sink as the pipeline runs it.
pub struct ObservedSink {
    /// Its name.
    pub name: String,
    /// The state of each of its parts that run apart (a postgres sink
    /// applies each source on its own).
    pub units: Vec<Arc<SinkHealth>>,
    /// The sources it reads.
    pub inputs: Vec<ObservedInput>,
}

impl ObservedSink {
    /// The unit faring worst: the sink is as well as that one.
    fn worst(&self) -> Option<&SinkHealth> {
        let rank = |s: SinkState| match s {
            SinkState::Running => 0,
            SinkState::Paused => 1,
            SinkState::Starting => 2,
            SinkState::Retrying => 3,
            SinkState::Stopped => 4,
        };
        self.units
            .iter()
            .map(AsRef::as_ref)
            .max_by_key(|u: &&SinkHealth| rank(u.state()))
    }

    /// What the sink is doing.
    pub fn state(&self) -> SinkState {
        self.worst().map_or(SinkState::Starting, SinkHealth::state)
    }

    /// The last failure of the unit faring worst.
    pub fn last_error(&self) -> Option<String> {
        self.worst().and_then(SinkHealth::last_error)
    }

    /// Attempts that failed, over every unit.
    pub fn failures(&self) -> u64 {
        self.units.iter().map(|u| u.failures()).sum()
    }
}

/// Everything the pipeline shows of itself.
#[derive(Default)]
pub struct Observed {
    /// The sources.
    pub sources: Vec<ObservedSource>,
    /// The sinks.
    pub sinks: Vec<ObservedSink>,
}

/// `/status`: every source and sink, as JSON.
#[derive(Debug, Serialize)]
pub struct Status {
    /// Whether the pipeline is ready (see [`Observed::unready`]).
    pub ready: bool,
    /// Why not, a line each.
    pub unready: Vec<String>,
    /// The sources.
    pub sources: Vec<SourceStatus>,
    /// The sinks.
    pub sinks: Vec<SinkStatus>,
}

/// One source in [`Status`].
#[derive(Debug, Serialize)]
pub struct SourceStatus {
    /// Its name.
    pub name: String,
    /// What it does.
    pub state: &'static str,
    /// The furthest position received from the publisher.
    pub received_lsn: String,
    /// What it last confirmed to the publisher.
    pub confirmed_lsn: String,
    /// Transactions it has put in its log since it started.
    pub transactions: u64,
    /// Changes by operation since it started.
    pub changes: BTreeMap<&'static str, u64>,
    /// Connections tried again.
    pub reconnects: u64,
    /// Bytes of transactions being assembled that are spilled to disk now.
    pub spill_bytes: u64,
    /// The initial copy: tables done and to do, rows and bytes.
    pub snapshot: SnapshotStatus,
    /// Tables being copied while streaming (added to the publication,
    /// re-synced).
    pub copies: Vec<StreamCopyStatus>,
    /// The slot as the publisher last reported it (polled every few
    /// seconds); `None` until the first poll answers.
    pub slot: Option<SlotStatus>,
    /// Its log.
    pub log: LogStatus,
}

/// A table being copied while streaming, in [`SourceStatus`].
#[derive(Debug, Serialize)]
pub struct StreamCopyStatus {
    /// `schema.name`.
    pub table: String,
    /// `new table` or `re-sync`.
    pub mode: &'static str,
    /// Rows handed to the log since this process started or went on with
    /// the copy.
    pub rows: u64,
    /// The key copied up to (its columns' values as text); none before the
    /// first chunk.
    pub up_to: Option<Vec<String>>,
    /// The only sink the rows are for (`resync --sink`); every sink when none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sink: Option<String>,
}

/// A source's slot in [`SourceStatus`].
#[derive(Debug, Serialize)]
pub struct SlotStatus {
    /// When the publisher was asked (Unix seconds).
    pub polled_at: f64,
    /// Whether the slot exists.
    pub exists: bool,
    /// The publisher's current WAL position.
    pub current_lsn: String,
    /// WAL bytes the publisher has written past what the source received.
    pub lag_bytes: u64,
    /// WAL bytes the slot keeps the publisher from removing.
    pub retained_bytes: u64,
    /// `reserved`, `extended`, `unreserved` or `lost` (PostgreSQL 13+).
    pub wal_status: Option<String>,
    /// WAL bytes that can still be written before the slot is at risk.
    pub safe_wal_size: Option<i64>,
}

/// The initial copy in [`SourceStatus`].
#[derive(Debug, Serialize)]
pub struct SnapshotStatus {
    /// Tables copied.
    pub tables_done: u64,
    /// Tables to copy.
    pub tables_total: u64,
    /// Rows copied.
    pub rows: u64,
    /// COPY data received.
    pub bytes: u64,
    /// Each table of the copy under way (or the last one).
    pub tables: Vec<TableCopyStatus>,
}

/// One table of the initial copy in [`SnapshotStatus`].
#[derive(Debug, Serialize)]
pub struct TableCopyStatus {
    /// The table, quoted as in SQL.
    pub table: String,
    /// `waiting` (for a worker), `copying` or `done`.
    pub state: &'static str,
    /// Rows copied.
    pub rows: u64,
    /// COPY data received.
    pub bytes: u64,
    /// The planner's estimate of its rows, when it was analyzed.
    pub estimated_rows: Option<u64>,
    /// Seconds it has been copied (or took).
    pub seconds: f64,
}

/// A source's log in [`SourceStatus`].
#[derive(Debug, Serialize)]
pub struct LogStatus {
    /// The oldest record kept.
    pub first_record: u64,
    /// The position just before the oldest record kept (`0/0` while the
    /// log holds its beginning); `None` when it cannot be read.
    pub start_lsn: Option<walbridge_core::Lsn>,
    /// Segment files on disk.
    pub segments: usize,
    /// The record the next append gets.
    pub next_record: u64,
    /// The LSN of the readable end.
    pub last_lsn: String,
    /// Bytes on disk.
    pub bytes: u64,
}

/// One sink in [`Status`].
#[derive(Debug, Serialize)]
pub struct SinkStatus {
    /// Its name.
    pub name: String,
    /// What it does.
    pub state: SinkState,
    /// Its last failure.
    pub last_error: Option<String>,
    /// Attempts that failed.
    pub failures: u64,
    /// Each source it reads.
    pub sources: Vec<SinkInputStatus>,
}

/// One source of a sink in [`SinkStatus`].
#[derive(Debug, Serialize)]
pub struct SinkInputStatus {
    /// The source.
    pub source: String,
    /// The sink's cursor: the next record it reads.
    pub cursor: u64,
    /// The publisher position the sink has acknowledged.
    pub acked_lsn: String,
    /// Records of the log the sink has not acknowledged.
    pub lag_records: u64,
    /// WAL bytes between the log's end and what the sink acknowledged.
    pub lag_bytes: u64,
    /// How long the oldest transaction the sink has not acknowledged has
    /// been committed on the publisher; 0 when it has everything, `None`
    /// while what it has not is no transaction (rows of the copy).
    pub lag_seconds: Option<f64>,
    /// Events handed to the sink since walbridge started, by operation
    /// (`snapshot`: rows of the initial copy).
    pub events: BTreeMap<&'static str, u64>,
}

impl ObservedInput {
    fn status(&self) -> SinkInputStatus {
        let acked = *self.acked.borrow();
        let head = self.log.head();
        SinkInputStatus {
            source: self.source.clone(),
            cursor: acked.next,
            acked_lsn: acked.lsn.to_string(),
            lag_records: head.next_seq.saturating_sub(acked.next),
            lag_bytes: head.last_lsn.0.saturating_sub(acked.lsn.0),
            lag_seconds: if acked.next >= head.next_seq {
                Some(0.0)
            } else {
                self.oldest_pending_commit().map(|commit| {
                    let micros = PgTimestamp::now().0.saturating_sub(commit.0);
                    micros.max(0) as f64 / 1e6
                })
            },
            events: EVENT_KINDS.into_iter().zip(self.events.get()).collect(),
        }
    }

    /// The commit time of the first transaction at or after the sink's
    /// cursor (a few records are looked at: past the copy's rows there is
    /// soon one), read from the log.
    fn oldest_pending_commit(&self) -> Option<PgTimestamp> {
        const LOOK_AHEAD: usize = 16;
        let mut reader = self.log.reader(self.acked.borrow().next).ok()?;
        for _ in 0..LOOK_AHEAD {
            match reader.try_next().ok()??.entry {
                Entry::Transaction { info, .. } => return Some(info.commit_time),
                Entry::Snapshot(_)
                | Entry::SnapshotComplete { .. }
                | Entry::Message(_)
                | Entry::Sequences(_) => {}
            }
        }
        None
    }
}

impl Observed {
    /// Whether the pipeline answers, for `/healthz`: its state read (the
    /// sinks' health, the logs' state: locks the stages take as they
    /// work) on the blocking pool (where sinks start) within `deadline`.
    /// Nothing is read from disk, so a slow disk does not count as dead.
    pub async fn alive(self: &Arc<Self>, deadline: std::time::Duration) -> Result<(), String> {
        let observed = self.clone();
        let read = tokio::task::spawn_blocking(move || {
            let _ = observed.unready();
            for source in &observed.sources {
                let _ = (source.log.first_seq(), source.log.segment_count());
            }
        });
        match tokio::time::timeout(deadline, read).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("reading the pipeline's state failed: {e}")),
            Err(_) => Err(format!(
                "the pipeline's state could not be read within {deadline:?} (a stage holds it and does not go on, or the blocking pool is exhausted): restart walbridge and report its log"
            )),
        }
    }

    /// Why the pipeline is not ready, a line each: a source that is not
    /// copying or streaming, a sink that is neither running nor paused (a
    /// pause is asked for). Empty when ready.
    pub fn unready(&self) -> Vec<String> {
        let mut reasons = Vec::new();
        for source in &self.sources {
            let phase = source.stats.phase();
            if !matches!(phase, SourcePhase::Copying | SourcePhase::Streaming) {
                reasons.push(format!("source `{}` is {}", source.name, phase.as_str()));
            }
        }
        for sink in &self.sinks {
            let state = sink.state();
            if !matches!(state, SinkState::Running | SinkState::Paused) {
                let mut line = format!("sink `{}` is {}", sink.name, state.as_str());
                if let Some(error) = sink.last_error().filter(|_| state != SinkState::Starting) {
                    line.push_str(&format!(": {error}"));
                }
                reasons.push(line);
            }
        }
        reasons
    }

    /// Everything, for `/status`.
    pub fn status(&self) -> Status {
        let unready = self.unready();
        Status {
            ready: unready.is_empty(),
            unready,
            sources: self.sources.iter().map(source_status).collect(),
            sinks: self
                .sinks
                .iter()
                .map(|sink| SinkStatus {
                    name: sink.name.clone(),
                    state: sink.state(),
                    last_error: sink.last_error(),
                    failures: sink.failures(),
                    sources: sink.inputs.iter().map(ObservedInput::status).collect(),
                })
                .collect(),
        }
    }

    /// Gives every metric of [`Observed::record_metrics`] its help text.
    pub fn describe_metrics() {
        use metrics::{Unit, describe_counter, describe_gauge};
        let lsn = "(a WAL position as a number of bytes)";
        describe_gauge!(
            "walbridge_source_received_lsn",
            format!("The furthest position received from the publisher {lsn}.")
        );
        describe_gauge!(
            "walbridge_source_confirmed_lsn",
            format!("The position last confirmed to the publisher {lsn}.")
        );
        describe_counter!(
            "walbridge_source_transactions_total",
            "Transactions the source put in its log since walbridge started."
        );
        describe_counter!(
            "walbridge_source_changes_total",
            "Changes the source put in its log since walbridge started, by operation."
        );
        describe_counter!(
            "walbridge_source_reconnects_total",
            "Times the source connected again after a failure."
        );
        describe_gauge!(
            "walbridge_source_spill_bytes",
            Unit::Bytes,
            "Transactions being assembled that are spilled to disk now (over spill_threshold)."
        );
        describe_gauge!(
            "walbridge_source_state",
            "1 for what the source does now (starting, copying, streaming, reconnecting, stopped)."
        );
        describe_gauge!(
            "walbridge_source_lag_bytes",
            Unit::Bytes,
            "WAL the publisher has written past what the source received (polled)."
        );
        describe_gauge!(
            "walbridge_slot_retained_bytes",
            Unit::Bytes,
            "WAL the source's slot keeps on the publisher (polled)."
        );
        describe_gauge!(
            "walbridge_slot_safe_wal_size_bytes",
            Unit::Bytes,
            "WAL the publisher can still write before the slot is at risk of being lost (polled; only with max_slot_wal_keep_size)."
        );
        describe_gauge!(
            "walbridge_slot_wal_status",
            "1 for the slot's wal_status now (reserved, extended, unreserved, lost; missing: no slot)."
        );
        describe_counter!("walbridge_snapshot_rows_total", "Rows of the initial copy.");
        describe_counter!(
            "walbridge_snapshot_bytes_total",
            Unit::Bytes,
            "COPY data of the initial copy."
        );
        describe_counter!(
            "walbridge_snapshot_table_rows_total",
            "Rows of one table of the initial copy (once its copy began)."
        );
        describe_counter!(
            "walbridge_snapshot_table_bytes_total",
            Unit::Bytes,
            "COPY data of one table of the initial copy (once its copy began)."
        );
        describe_gauge!(
            "walbridge_snapshot_tables_done",
            "Tables of the initial copy done."
        );
        describe_gauge!("walbridge_snapshot_tables", "Tables of the initial copy.");
        describe_gauge!(
            "walbridge_log_bytes",
            Unit::Bytes,
            "The source's log on disk."
        );
        describe_gauge!(
            "walbridge_log_max_bytes",
            Unit::Bytes,
            "The most the source's log may hold ([log] max_size; only when set)."
        );
        describe_gauge!(
            "walbridge_log_segments",
            "Segment files of the source's log on disk."
        );
        describe_counter!(
            "walbridge_log_records_read_total",
            "Records of the source's log its readers (sinks' feeders, feed sessions) returned since walbridge started, by where from: memory (handed over by the writer to a reader that keeps up) or file."
        );
        describe_counter!(
            "walbridge_log_syncs_total",
            "Fsyncs of the source's log's records since walbridge started, by who made them: appender (a caught-up stream's transactions, written and fsynced by the task that appends them, when no sink reads records before they are durable), sync (the log's sync thread: such transactions while a postgres sink follows, which applies them before they are durable, so that the appending task goes on meanwhile; and every fsync of `fsync = \"interval\"`) or writer (the log's writer thread: a backlog, the initial copy, a large transaction, a slow disk)."
        );
        describe_gauge!(
            "walbridge_log_start_lsn",
            format!(
                "The position just before the oldest record the source's log keeps {lsn} (0 while it keeps its beginning)."
            )
        );
        describe_gauge!(
            "walbridge_log_first_record",
            "The oldest record the source's log keeps."
        );
        describe_gauge!(
            "walbridge_log_next_record",
            "The number the source's log gives its next record."
        );
        describe_gauge!(
            "walbridge_log_last_lsn",
            format!("The position of the last readable record of the source's log {lsn}.")
        );
        describe_gauge!(
            "walbridge_sink_state",
            "1 for what the sink does now (starting, running, retrying, stopped, paused)."
        );
        describe_counter!(
            "walbridge_sink_failures_total",
            "Attempts of the sink that failed."
        );
        describe_gauge!(
            "walbridge_sink_acked_lsn",
            format!("The position of the source the sink has acknowledged {lsn}.")
        );
        describe_gauge!(
            "walbridge_sink_cursor",
            "The sink's cursor: the next record of the source's log it reads."
        );
        describe_gauge!(
            "walbridge_sink_lag_records",
            "Records of the source's log the sink has not acknowledged."
        );
        describe_gauge!(
            "walbridge_sink_lag_bytes",
            Unit::Bytes,
            "WAL between the end of the source's log and what the sink acknowledged."
        );
        describe_counter!(
            "walbridge_sink_events_total",
            "Events handed to the sink since walbridge started, by operation (snapshot: rows of the initial copy; a failed attempt's events are handed, and counted, again)."
        );
        describe_gauge!(
            "walbridge_sink_lag_seconds",
            Unit::Seconds,
            "Since the commit of the oldest transaction the sink has not acknowledged (0: it has everything; NaN: it is behind on rows of the copy)."
        );
    }

    /// Sets every gauge and counter of `/metrics` to what is now.
    pub fn record_metrics(&self) {
        use metrics::{counter, gauge};
        for source in &self.sources {
            let status = source_status(source);
            let name = source.name.clone();
            let stats = &source.stats;
            gauge!("walbridge_source_received_lsn", "source" => name.clone())
                .set(stats.received.load(Ordering::Relaxed) as f64);
            gauge!("walbridge_source_confirmed_lsn", "source" => name.clone())
                .set(stats.confirmed.load(Ordering::Relaxed) as f64);
            counter!("walbridge_source_transactions_total", "source" => name.clone())
                .absolute(status.transactions);
            for (operation, n) in OPERATIONS.iter().zip(stats.changes()) {
                counter!("walbridge_source_changes_total", "source" => name.clone(), "operation" => *operation)
                    .absolute(n);
            }
            counter!("walbridge_source_reconnects_total", "source" => name.clone())
                .absolute(status.reconnects);
            gauge!("walbridge_source_spill_bytes", "source" => name.clone())
                .set(status.spill_bytes as f64);
            for phase in SourcePhase::ALL {
                gauge!("walbridge_source_state", "source" => name.clone(), "state" => phase.as_str())
                    .set(if phase == stats.phase() { 1.0 } else { 0.0 });
            }
            counter!("walbridge_snapshot_rows_total", "source" => name.clone())
                .absolute(status.snapshot.rows);
            counter!("walbridge_snapshot_bytes_total", "source" => name.clone())
                .absolute(status.snapshot.bytes);
            // Tables not begun have nothing to show yet.
            for table in status
                .snapshot
                .tables
                .iter()
                .filter(|t| t.state != "waiting")
            {
                let labels = [("source", name.clone()), ("table", table.table.clone())];
                counter!("walbridge_snapshot_table_rows_total", &labels).absolute(table.rows);
                counter!("walbridge_snapshot_table_bytes_total", &labels).absolute(table.bytes);
            }
            gauge!("walbridge_snapshot_tables_done", "source" => name.clone())
                .set(status.snapshot.tables_done as f64);
            gauge!("walbridge_snapshot_tables", "source" => name.clone())
                .set(status.snapshot.tables_total as f64);
            if let Some(slot) = &status.slot {
                gauge!("walbridge_source_lag_bytes", "source" => name.clone())
                    .set(slot.lag_bytes as f64);
                gauge!("walbridge_slot_retained_bytes", "source" => name.clone())
                    .set(slot.retained_bytes as f64);
                // Without max_slot_wal_keep_size nothing limits it: no sample.
                if let Some(safe) = slot.safe_wal_size {
                    gauge!("walbridge_slot_safe_wal_size_bytes", "source" => name.clone())
                        .set(safe as f64);
                }
                for wal_status in WAL_STATUSES {
                    let now = slot.wal_status.as_deref() == Some(wal_status)
                        || (!slot.exists && wal_status == "missing");
                    gauge!("walbridge_slot_wal_status", "source" => name.clone(), "wal_status" => wal_status)
                        .set(if now { 1.0 } else { 0.0 });
                }
            }
            gauge!("walbridge_log_bytes", "source" => name.clone()).set(status.log.bytes as f64);
            if let Some(max) = source.log_max_bytes {
                gauge!("walbridge_log_max_bytes", "source" => name.clone()).set(max as f64);
            }
            gauge!("walbridge_log_segments", "source" => name.clone())
                .set(status.log.segments as f64);
            let (from_memory, from_file) = source.log.records_read();
            counter!("walbridge_log_records_read_total", "source" => name.clone(), "from" => "memory")
                .absolute(from_memory);
            counter!("walbridge_log_records_read_total", "source" => name.clone(), "from" => "file")
                .absolute(from_file);
            for (by, count) in source.log.syncs().by_label() {
                counter!("walbridge_log_syncs_total", "source" => name.clone(), "by" => by)
                    .absolute(count);
            }
            if let Some(start) = status.log.start_lsn {
                gauge!("walbridge_log_start_lsn", "source" => name.clone()).set(start.0 as f64);
            }
            gauge!("walbridge_log_first_record", "source" => name.clone())
                .set(status.log.first_record as f64);
            gauge!("walbridge_log_next_record", "source" => name.clone())
                .set(status.log.next_record as f64);
            gauge!("walbridge_log_last_lsn", "source" => name)
                .set(source.log.head().last_lsn.0 as f64);
        }
        for sink in &self.sinks {
            let name = sink.name.clone();
            let state = sink.state();
            for s in SinkState::ALL {
                gauge!("walbridge_sink_state", "sink" => name.clone(), "state" => s.as_str())
                    .set(if s == state { 1.0 } else { 0.0 });
            }
            counter!("walbridge_sink_failures_total", "sink" => name.clone())
                .absolute(sink.failures());
            for input in &sink.inputs {
                let status = input.status();
                let acked = *input.acked.borrow();
                let labels = [("sink", name.clone()), ("source", input.source.clone())];
                gauge!("walbridge_sink_acked_lsn", &labels).set(acked.lsn.0 as f64);
                gauge!("walbridge_sink_cursor", &labels).set(status.cursor as f64);
                gauge!("walbridge_sink_lag_records", &labels).set(status.lag_records as f64);
                gauge!("walbridge_sink_lag_bytes", &labels).set(status.lag_bytes as f64);
                // NaN while what it has not acknowledged is rows of the copy.
                gauge!("walbridge_sink_lag_seconds", &labels)
                    .set(status.lag_seconds.unwrap_or(f64::NAN));
                for (kind, n) in status.events {
                    counter!("walbridge_sink_events_total", "sink" => name.clone(), "source" => input.source.clone(), "operation" => kind)
                        .absolute(n);
                }
            }
        }
    }
}

/// Bytes of the files in `dir` (0 when it cannot be read: none yet).
fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// A slot's `wal_status` values in `walbridge_slot_wal_status` (and
/// `missing`: the slot is gone).
const WAL_STATUSES: [&str; 5] = ["reserved", "extended", "unreserved", "lost", "missing"];

fn source_status(source: &ObservedSource) -> SourceStatus {
    let stats = &source.stats;
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let head = source.log.head();
    SourceStatus {
        name: source.name.clone(),
        state: stats.phase().as_str(),
        received_lsn: walbridge_core::Lsn(load(&stats.received)).to_string(),
        confirmed_lsn: walbridge_core::Lsn(load(&stats.confirmed)).to_string(),
        transactions: load(&stats.transactions),
        changes: OPERATIONS.into_iter().zip(stats.changes()).collect(),
        reconnects: load(&stats.reconnects),
        spill_bytes: dir_bytes(&source.spill_dir),
        snapshot: SnapshotStatus {
            tables_done: load(&stats.snapshot.tables_done),
            tables_total: load(&stats.snapshot.tables_total),
            rows: load(&stats.snapshot.rows),
            bytes: load(&stats.snapshot.bytes),
            tables: stats
                .snapshot
                .tables()
                .iter()
                .map(|t| TableCopyStatus {
                    table: t.table().to_owned(),
                    state: match (t.elapsed(), t.done()) {
                        (_, true) => "done",
                        (Some(_), false) => "copying",
                        (None, false) => "waiting",
                    },
                    rows: t.rows(),
                    bytes: t.bytes(),
                    estimated_rows: t.estimate(),
                    seconds: t.elapsed().map_or(0.0, |e| e.as_secs_f64()),
                })
                .collect(),
        },
        copies: stats
            .copies()
            .into_iter()
            .map(|c| StreamCopyStatus {
                table: c.table,
                mode: c.mode,
                rows: c.rows,
                up_to: c.up_to,
                sink: c.sink,
            })
            .collect(),
        slot: stats.slot().map(|(slot, polled)| {
            let received = load(&stats.received);
            SlotStatus {
                polled_at: polled
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64()),
                exists: slot.exists,
                current_lsn: slot.current_lsn.to_string(),
                lag_bytes: slot.current_lsn.0.saturating_sub(received),
                retained_bytes: slot
                    .restart_lsn
                    .map_or(0, |r| slot.current_lsn.0.saturating_sub(r.0)),
                wal_status: slot.wal_status,
                safe_wal_size: slot.safe_wal_size,
            }
        }),
        log: LogStatus {
            first_record: source.log.first_seq(),
            start_lsn: source.log.start_lsn().ok(),
            segments: source.log.segment_count(),
            next_record: head.next_seq,
            last_lsn: head.last_lsn.to_string(),
            bytes: source.log.size(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn it_is_alive_while_its_state_can_be_read_and_not_when_a_stage_holds_it() {
        let health = Arc::new(SinkHealth::default());
        let observed = Arc::new(Observed {
            sources: Vec::new(),
            sinks: vec![ObservedSink {
                name: "replica".into(),
                units: vec![health.clone()],
                inputs: Vec::new(),
            }],
        });
        let deadline = std::time::Duration::from_millis(300);
        assert_eq!(observed.alive(deadline).await, Ok(()));
        // A stage that took the sink's health and does not let go.
        let (taken_tx, taken) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let stage = {
            let health = health.clone();
            std::thread::spawn(move || {
                let _held = health.last_error.lock().unwrap_or_else(|p| p.into_inner());
                let _ = taken_tx.send(());
                let _ = released.recv();
            })
        };
        let _ = taken.recv();
        let said = observed.alive(deadline).await;
        assert!(
            said.as_ref()
                .is_err_and(|e| e.contains("could not be read within 300ms")),
            "{said:?}"
        );
        let _ = release.send(());
        let _ = stage.join();
        // The blocked reader finishes; the next probe answers again.
        assert_eq!(observed.alive(deadline).await, Ok(()));
    }
}
