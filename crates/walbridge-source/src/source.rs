//! Running one source: prerequisite checks, slot, snapshot, stream.
//!
//! The flush rule (what is confirmed to the publisher, and why) is in
//! [`crate::feedback`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use walbridge_core::{Change, EventBatch, Lsn, Relation, SourceEvent, TransactionInfo};

use crate::assembler::{Assembled, Assembler, CommittedTransaction};
use crate::backfill::{ChunkUnit, ResyncRequest, Tracker, WATERMARK_PREFIX, request_resync};
use crate::catalog::{TypeCatalog, describe_tables, published_tables};
use crate::checks::{Finding, Outlook, Severity, check_source, explain_connection_error};
use crate::config::{OnSlotLost, OriginFilter, SourceConfig};
pub use crate::error::SourceError;
use crate::feedback::Feedback;
use crate::pgoutput::{Decoder, Message};
use crate::send_delay::SendDelay;
use crate::sequences::SequenceReader;
use crate::slot::{self, SlotOptions, SlotPersistence, SnapshotAction};
use crate::snapshot::{SnapshotError, SnapshotProgress, copy_tables};
use crate::spill;
pub use crate::state::SourceState;
use crate::wire::batching::is_backlog;
use crate::wire::copyboth::{ServerMessage, StatusUpdate};
use crate::wire::{ConnParams, ConnectionError, CopyMessage, ReplicationConnection, connect_sql};
use walbridge_pg::quote_ident;

/// How the initial copy ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CopyOutcome {
    /// Copied (or nothing to copy) and acknowledged: go on streaming.
    Copied,
    /// A stop was requested: exit now (the state records whether the copy finished).
    Stopped,
}

/// The shortest time between two status updates sent because downstream progressed.
const STATUS_GAP: Duration = Duration::from_millis(10);

/// Messages taken from the connection's buffer in one go before the stream
/// loop looks at its other duties (status updates, shutdown) again.
const BURST: usize = 512;

/// The first wait before connecting again after a transient failure; it
/// doubles with every failure in a row, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);

/// The longest wait between two connection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The wait before a source connects again after a transient failure:
/// [`FIRST_BACKOFF`], doubling with every failure in a row up to
/// [`MAX_BACKOFF`], and back to the first once a connection streamed.
#[derive(Debug)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            next: FIRST_BACKOFF,
        }
    }
}

impl Backoff {
    /// After a connection that streamed: the next failure waits the least.
    pub fn reset(&mut self) {
        self.next = FIRST_BACKOFF;
    }

    /// Counts a reconnect of `source` on `stats`, logs `error` with the
    /// wait, and waits; false when `shutdown` came first.
    pub async fn wait(
        &mut self,
        stats: &SourceStats,
        source: &str,
        error: impl std::fmt::Display,
        shutdown: &mut watch::Receiver<bool>,
    ) -> bool {
        stats.set_phase(SourcePhase::Reconnecting);
        stats
            .reconnects
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let wait = self.next;
        tracing::warn!(source = %source, "{error}; retrying in {wait:?}");
        self.next = (wait * 2).min(MAX_BACKOFF);
        tokio::select! {
            _ = tokio::time::sleep(wait) => true,
            _ = shutdown.changed() => false,
        }
    }
}

/// Changes per batch handed downstream; a large transaction goes in several.
const MAX_BATCH: usize = 256;

/// … and about this many bytes of changes (by their memory estimate): with
/// wide rows a batch of 256 changes was hundreds of MB, and the queue to
/// the log holds 64 batches.
const MAX_BATCH_BYTES: usize = 256 << 10;

/// Prefix of the logical messages the source emits as a heartbeat; they
/// advance the slot on a quiet database and are not passed downstream.
pub const HEARTBEAT_PREFIX: &str = "walbridge.heartbeat";

/// Where a source's events go, and what it hears back.
#[derive(Debug)]
pub struct Downstream {
    /// Event batches, in order.
    pub events: mpsc::Sender<EventBatch>,
    /// The LSN up to which what was sent is durable downstream.
    pub durable: watch::Receiver<Lsn>,
    /// The LSN up to which every consumer has applied what was sent.
    pub applied: watch::Receiver<Lsn>,
    /// The last position downstream already holds: transactions ending
    /// at or before it are not sent again. For a non-transactional message
    /// the position is just past its LSN.
    pub resume_after: Lsn,
}

/// Shared, live view of a source for status and metrics.
#[derive(Debug, Default)]
pub struct SourceStats {
    /// What the source is doing ([`SourcePhase`] as a number).
    phase: std::sync::atomic::AtomicU8,
    /// Snapshot counters.
    pub snapshot: SnapshotProgress,
    /// Last position received.
    pub received: std::sync::atomic::AtomicU64,
    /// Last position confirmed to the publisher.
    pub confirmed: std::sync::atomic::AtomicU64,
    /// Transactions emitted.
    pub transactions: std::sync::atomic::AtomicU64,
    /// Changes emitted, by operation: insert, update, delete, truncate.
    changes: [std::sync::atomic::AtomicU64; walbridge_core::OPERATIONS.len()],
    /// Connections that broke or failed and were tried again.
    pub reconnects: std::sync::atomic::AtomicU64,
    /// The slot as last polled ([`Source::watch_slot`]), and when.
    slot: std::sync::Mutex<Option<(slot::SlotHealth, std::time::SystemTime)>>,
    /// Tables being copied while streaming, by OID.
    copies: std::sync::Mutex<std::collections::BTreeMap<u32, CopyProgress>>,
}

/// A table being copied while streaming, as status shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyProgress {
    /// `schema.name`.
    pub table: String,
    /// `new table` or `re-sync`.
    pub mode: &'static str,
    /// Rows handed downstream since this process started it or went on
    /// with it.
    pub rows: u64,
    /// The key copied up to, as text; none before the first chunk.
    pub up_to: Option<Vec<String>>,
    /// The only sink the rows are for (`resync --sink`).
    pub sink: Option<String>,
}

/// What a source is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourcePhase {
    /// Connecting and checking, before its first copy or stream.
    Starting,
    /// Copying the published tables.
    Copying,
    /// Streaming changes.
    Streaming,
    /// Waiting to connect again after a failure.
    Reconnecting,
    /// Stopped.
    Stopped,
}

impl SourcePhase {
    /// Every phase, in the order of their numbers.
    pub const ALL: [SourcePhase; 5] = [
        SourcePhase::Starting,
        SourcePhase::Copying,
        SourcePhase::Streaming,
        SourcePhase::Reconnecting,
        SourcePhase::Stopped,
    ];

    /// The phase's name in status and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            SourcePhase::Starting => "starting",
            SourcePhase::Copying => "copying",
            SourcePhase::Streaming => "streaming",
            SourcePhase::Reconnecting => "reconnecting",
            SourcePhase::Stopped => "stopped",
        }
    }
}

/// Marks a source stopped when its run ends, however it ends.
struct StoppedOnDrop<'a>(&'a SourceStats);

impl Drop for StoppedOnDrop<'_> {
    fn drop(&mut self) {
        self.0.set_phase(SourcePhase::Stopped);
    }
}

impl SourceStats {
    /// What the source is doing.
    pub fn phase(&self) -> SourcePhase {
        let n = self.phase.load(std::sync::atomic::Ordering::Relaxed) as usize;
        SourcePhase::ALL
            .get(n)
            .copied()
            .unwrap_or(SourcePhase::Starting)
    }

    /// Records what the source is doing.
    pub fn set_phase(&self, phase: SourcePhase) {
        let n = SourcePhase::ALL
            .iter()
            .position(|p| *p == phase)
            .unwrap_or(0);
        self.phase
            .store(n as u8, std::sync::atomic::Ordering::Relaxed);
    }

    /// The slot as last polled, and when; `None` before the first poll.
    pub fn slot(&self) -> Option<(slot::SlotHealth, std::time::SystemTime)> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set_slot(&self, health: Option<slot::SlotHealth>) {
        *self.slot.lock().unwrap_or_else(|p| p.into_inner()) =
            health.map(|h| (h, std::time::SystemTime::now()));
    }

    /// Tables being copied while streaming.
    pub fn copies(&self) -> Vec<CopyProgress> {
        self.copies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// How the copy of table `oid` stands, if it is being copied.
    pub fn copies_of(&self, oid: u32) -> Option<CopyProgress> {
        self.copies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&oid)
            .cloned()
    }

    /// Records how the copy of table `oid` stands; `None` when it ended.
    pub fn set_copy(&self, oid: u32, progress: Option<CopyProgress>) {
        let mut copies = self.copies.lock().unwrap_or_else(|p| p.into_inner());
        match progress {
            Some(p) => copies.insert(oid, p),
            None => copies.remove(&oid),
        };
    }

    /// Changes emitted per operation, in [`walbridge_core::OPERATIONS`] order.
    pub fn changes(&self) -> [u64; walbridge_core::OPERATIONS.len()] {
        std::array::from_fn(|i| self.changes[i].load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Counts a change emitted.
    pub fn count(&self, change: &walbridge_core::Change) {
        if let Some(i) = change.operation() {
            self.changes[i].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Where source `name` keeps its state (slot bookkeeping, spill files,
/// requests) under `data_dir`.
pub fn state_dir(data_dir: &Path, name: &str) -> PathBuf {
    data_dir.join("sources").join(name)
}

/// One configured source.
pub struct Source {
    config: SourceConfig,
    params: ConnParams,
    state_dir: PathBuf,
    stats: Arc<SourceStats>,
}

impl Source {
    /// Prepares a source; `data_dir` is walbridge's state directory.
    pub fn new(config: SourceConfig, data_dir: &Path) -> Result<Self, SourceError> {
        let params =
            ConnParams::parse(&config.connection).map_err(|error| SourceError::Params {
                source_name: config.name.clone(),
                error,
            })?;
        let state_dir = state_dir(data_dir, &config.name);
        Ok(Source {
            config,
            params,
            state_dir,
            stats: Arc::new(SourceStats::default()),
        })
    }

    /// The source's configuration.
    pub fn config(&self) -> &SourceConfig {
        &self.config
    }

    /// Live counters.
    pub fn stats(&self) -> Arc<SourceStats> {
        self.stats.clone()
    }

    /// The source's directory under `data_dir` (state, spill files, log);
    /// `walbridge drop` removes it.
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// The database name, as reported in events.
    pub fn database(&self) -> &str {
        &self.params.dbname
    }

    /// Runs the prerequisite checks.
    pub async fn check(&self) -> Vec<Finding> {
        check_source(&self.config, &self.params).await
    }

    /// The tables the publications cover, described as the stream will
    /// describe them (published columns, identity, types): what a sink can
    /// check its targets against before anything streams.
    pub async fn published_relations(&self) -> Result<Vec<Relation>, SourceError> {
        let name = &self.config.name;
        let client = connect_sql(&self.params, self.config.application_name())
            .await
            .map_err(|e| self.err(e))?;
        let version: String = client
            .query_one("SHOW server_version", &[])
            .await
            .map_err(|e| self.err(e.into()))?
            .get(0);
        let tables = published_tables(
            &client,
            &self.config.publications,
            walbridge_pg::parse_server_version(&version),
        )
        .await
        .map_err(|e| SourceError::Catalog(name.clone(), e))?;
        let described = describe_tables(&client, &mut TypeCatalog::new(), &tables)
            .await
            .map_err(|e| SourceError::Catalog(name.clone(), e))?;
        Ok(described.into_iter().map(|d| d.relation).collect())
    }

    fn err(&self, e: ConnectionError) -> SourceError {
        SourceError::Connection(
            explain_connection_error(&self.config.name, &self.params.display_target(), &e),
            e,
        )
    }

    /// The source's slot as the publisher shows it (`pg_replication_slots`),
    /// `None` when it does not exist.
    pub async fn slot(&self) -> Result<Option<slot::SlotInfo>, SourceError> {
        let mut conn = ReplicationConnection::connect(&self.params, self.config.application_name())
            .await
            .map_err(|e| self.err(e))?;
        slot::slot_info(&mut conn, &self.config.slot_name())
            .await
            .map_err(|e| self.err(e))
    }

    /// Polls the publisher every `interval` for its current WAL position
    /// and its view of the slot ([`SourceStats::slot`]), until dropped.
    /// A failed poll clears the view (so nothing stale is shown) and is
    /// logged once until polling works again: the stream reports the
    /// connection's troubles itself.
    pub async fn watch_slot(&self, interval: Duration) -> std::convert::Infallible {
        let name = self.config.slot_name();
        let mut client = None;
        let mut failing = false;
        loop {
            let polled = async {
                if client.is_none() {
                    let c = connect_sql(&self.params, self.config.application_name())
                        .await
                        .map_err(|e| e.to_string())?;
                    let version: String = c
                        .query_one("SHOW server_version", &[])
                        .await
                        .map_err(|e| e.to_string())?
                        .get(0);
                    client = Some((c, walbridge_pg::parse_server_version(&version)));
                }
                let Some((c, version)) = &client else {
                    return Err("no connection".to_owned());
                };
                slot::slot_health(c, &name, *version)
                    .await
                    .map_err(|e| e.to_string())
            }
            .await;
            match polled {
                Ok(health) => {
                    failing = false;
                    self.stats.set_slot(Some(health));
                }
                Err(e) => {
                    if !failing {
                        tracing::info!(source = %self.config.name, "cannot poll the slot's health: {e}");
                    }
                    failing = true;
                    client = None;
                    self.stats.set_slot(None);
                }
            }
            tokio::time::sleep(interval).await;
        }
    }

    /// Drops the source's slot on the publisher, if it exists; says
    /// whether it did.
    pub async fn drop_slot(&self) -> Result<bool, SourceError> {
        let mut conn = ReplicationConnection::connect(&self.params, self.config.application_name())
            .await
            .map_err(|e| self.err(e))?;
        let name = self.config.slot_name();
        let existed = slot::slot_info(&mut conn, &name)
            .await
            .map_err(|e| self.err(e))?
            .is_some();
        if existed {
            slot::drop_slot(&mut conn, &name, false)
                .await
                .map_err(|e| self.err(e))?;
        }
        conn.close().await;
        Ok(existed)
    }

    /// The sequences the source replicates, read now (`walbridge
    /// sync-sequences`), whether or not `sequences` is set.
    pub async fn read_sequences(&self) -> Result<walbridge_core::SequenceValues, SourceError> {
        let client = connect_sql(&self.params, self.config.application_name())
            .await
            .map_err(|e| self.err(e))?;
        crate::sequences::read_sequences(&client, &self.config.publications, Lsn::ZERO)
            .await
            .map_err(|e| SourceError::Catalog(self.config.name.clone(), e))
    }

    /// Removes the source's state from `data_dir` (its log, spill files and
    /// slot bookkeeping): the next run starts over.
    pub fn remove_state(&self) -> Result<(), SourceError> {
        match std::fs::remove_dir_all(&self.state_dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(SourceError::State(
                self.config.name.clone(),
                self.state_dir.clone(),
                e,
            )),
        }
    }

    /// Where transactions too large to hold in memory are spilled while
    /// they are assembled (emptied at every start).
    pub fn spill_dir(&self) -> PathBuf {
        self.state_dir.join("spill")
    }

    /// Where the publisher is, for messages (`host:port/dbname`).
    pub fn target(&self) -> String {
        self.params.display_target()
    }

    /// Runs until `shutdown` turns true or a permanent error. Transient
    /// failures (an unreachable publisher, a lost connection, a server
    /// restart) are retried with exponential backoff, at start as
    /// mid-stream; the backoff starts again from its first step after a
    /// connection that reached streaming.
    pub async fn run(
        &self,
        downstream: Downstream,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<(), SourceError> {
        let Downstream {
            events,
            durable: mut flushed,
            applied,
            resume_after,
        } = downstream;
        let spill_dir = self.spill_dir();
        spill::clear_dir(&spill_dir)
            .map_err(|e| SourceError::Spill(self.config.name.clone(), e))?;
        let mut assembler = Assembler::new(spill_dir, self.config.spill_threshold.0 as usize);
        let mut feedback = Feedback::new(resume_after, applied);
        let mut tracker = Tracker::new(self.state_dir.clone(), self.stats.clone());
        let _stopped = StoppedOnDrop(&self.stats);
        let mut checked = false;
        let mut backoff = Backoff::default();
        loop {
            let result = if checked {
                Ok(())
            } else {
                self.preflight(&mut shutdown).await
            };
            let result = match result {
                Ok(()) => {
                    checked = true;
                    self.run_once(
                        &events,
                        &mut flushed,
                        &mut shutdown,
                        &mut assembler,
                        &mut feedback,
                        &mut tracker,
                    )
                    .await
                }
                Err(e) => Err(e),
            };
            assembler.reset();
            if std::mem::take(&mut feedback.streamed) {
                backoff.reset();
            }
            match result {
                Ok(()) | Err(SourceError::Stopped(_)) => return Ok(()),
                Err(e) if e.is_transient() && !*shutdown.borrow() => {
                    if !backoff
                        .wait(&self.stats, &self.config.name, e, &mut shutdown)
                        .await
                    {
                        return Ok(());
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Runs the checks; fails on errors, except that a slot still held by a
    /// walsender that is going away (our own previous process, killed) is
    /// waited for, briefly.
    async fn preflight(&self, shutdown: &mut watch::Receiver<bool>) -> Result<(), SourceError> {
        const GRACE: Duration = Duration::from_secs(10);
        let deadline = tokio::time::Instant::now() + GRACE;
        loop {
            let findings = self.check().await;
            let errors: Vec<&Finding> = findings
                .iter()
                .filter(|f| f.severity == Severity::Error)
                .collect();
            if errors.is_empty() {
                for w in &findings {
                    tracing::warn!("{}", w.message);
                }
                return Ok(());
            }
            if !errors.iter().all(|f| f.outlook == Outlook::Passing)
                || tokio::time::Instant::now() >= deadline
            {
                return Err(SourceError::Prerequisites(
                    errors.into_iter().cloned().collect(),
                ));
            }
            tracing::info!(source = %self.config.name, "slot still in use, waiting for it to be released");
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = shutdown.changed() => return Ok(()),
            }
        }
    }

    async fn run_once(
        &self,
        events: &mpsc::Sender<EventBatch>,
        flushed: &mut watch::Receiver<Lsn>,
        shutdown: &mut watch::Receiver<bool>,
        assembler: &mut Assembler,
        feedback: &mut Feedback,
        tracker: &mut Tracker,
    ) -> Result<(), SourceError> {
        let name = &self.config.name;
        let slot_name = self.config.slot_name();
        let mut conn = ReplicationConnection::connect(&self.params, self.config.application_name())
            .await
            .map_err(|e| self.err(e))?;
        let state = SourceState::load(&self.state_dir)
            .map_err(|e| SourceError::State(name.clone(), self.state_dir.clone(), e))?;
        let mut slot = slot::slot_info(&mut conn, &slot_name)
            .await
            .map_err(|e| self.err(e))?;
        if let (Some(_), Some(state)) = (&slot, &state)
            && !state.snapshot_complete
            && self.config.copy_data
        {
            tracing::warn!(source = %name, "the previous initial copy did not finish; dropping slot {slot_name} and copying again");
            slot::drop_slot(&mut conn, &slot_name, true)
                .await
                .map_err(|e| self.err(e))?;
            slot = None;
        }
        let lost = match (&slot, &state) {
            (None, Some(state)) if state.snapshot_complete => Some(format!(
                "source `{name}`: slot \"{slot_name}\" is gone from the publisher, so changes since walbridge last ran are lost; run `walbridge drop --source {name}` to start over with a fresh copy"
            )),
            (Some(existing), Some(state)) if existing.is_lost() && state.snapshot_complete => {
                Some(slot::lost_slot_message(name, &slot_name, existing))
            }
            _ => None,
        };
        if let (Some(message), Some(state)) = (lost, &state) {
            if self.config.on_slot_lost == OnSlotLost::Stop {
                return Err(SourceError::Slot(message));
            }
            self.recreate_lost_slot(&mut conn, slot.is_some(), state.clone())
                .await?;
            tracing::warn!(source = %name, "{message}. on_slot_lost = \"recopy\": the slot is created again and every table is copied again while streaming; sinks apply the rows as upserts, and what changed meanwhile arrives as its result");
            slot = slot::slot_info(&mut conn, &slot_name)
                .await
                .map_err(|e| self.err(e))?;
        }
        match (&slot, &state) {
            (None, _) if !self.config.create_slot => {
                return Err(SourceError::Slot(format!(
                    "source `{name}`: slot \"{slot_name}\" does not exist and create_slot = false: create it or set create_slot = true"
                )));
            }
            (None, _) => {
                self.stats.set_phase(SourcePhase::Copying);
                if self
                    .create_slot_and_copy(&mut conn, events, flushed, shutdown)
                    .await?
                    == CopyOutcome::Stopped
                {
                    return Ok(());
                }
            }
            (Some(_), None) if self.config.copy_data => {
                return Err(SourceError::Slot(format!(
                    "source `{name}`: slot \"{slot_name}\" exists but walbridge's data_dir has no record of copying its tables; set copy_data = false to stream from the slot as it is, or run `walbridge drop --source {name}` to start over"
                )));
            }
            // Lost while walbridge ran (the preflight saw it whole).
            (Some(existing), _) if existing.is_lost() => {
                return Err(SourceError::Slot(slot::lost_slot_message(
                    name, &slot_name, existing,
                )));
            }
            (Some(existing), _) => {
                if self.config.failover && !existing.failover {
                    slot::set_failover(&mut conn, &slot_name)
                        .await
                        .map_err(|e| self.err(e))?;
                    tracing::info!(source = %name, slot = %slot_name, "the slot is now synchronized to standbys (failover)");
                }
            }
        }
        self.stream(
            conn, events, flushed, shutdown, assembler, feedback, tracker,
        )
        .await
    }

    /// Drops the lost slot (if it is there), creates it again and asks for
    /// every published table to be re-synchronized (taken when streaming
    /// starts).
    async fn recreate_lost_slot(
        &self,
        conn: &mut ReplicationConnection,
        exists: bool,
        mut state: SourceState,
    ) -> Result<(), SourceError> {
        let name = &self.config.name;
        let slot_name = self.config.slot_name();
        if exists {
            slot::drop_slot(conn, &slot_name, true)
                .await
                .map_err(|e| self.err(e))?;
        }
        let client = connect_sql(&self.params, self.config.application_name())
            .await
            .map_err(|e| self.err(e))?;
        let tables = published_tables(
            &client,
            &self.config.publications,
            conn.server_version_num(),
        )
        .await
        .map_err(|e| SourceError::Catalog(name.clone(), e))?;
        let state_error = |e| SourceError::State(name.clone(), self.state_dir.clone(), e);
        // Asked for before the slot exists: a crash in between leaves the
        // requests, and the next start finds the slot gone again.
        for table in &tables {
            let request = ResyncRequest {
                table: format!("{}.{}", table.schema, table.name),
                sink: None,
                truncate: false,
            };
            request_resync(&self.state_dir, &request).map_err(state_error)?;
        }
        let created = slot::create_slot(
            conn,
            &slot_name,
            SlotPersistence::Permanent,
            SnapshotAction::Nothing,
            SlotOptions {
                two_phase: self.config.two_phase,
                failover: self.config.failover,
            },
        )
        .await
        .map_err(|e| self.err(e))?;
        state.consistent_point = created.consistent_point.to_string();
        state.store(&self.state_dir).map_err(state_error)?;
        tracing::info!(source = %name, slot = %slot_name, consistent_point = %created.consistent_point, tables = tables.len(), "created the replication slot again");
        Ok(())
    }

    async fn create_slot_and_copy(
        &self,
        conn: &mut ReplicationConnection,
        events: &mpsc::Sender<EventBatch>,
        flushed: &mut watch::Receiver<Lsn>,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<CopyOutcome, SourceError> {
        let name = &self.config.name;
        let slot_name = self.config.slot_name();
        let action = if self.config.copy_data {
            SnapshotAction::Export
        } else {
            SnapshotAction::Nothing
        };
        let created = slot::create_slot(
            conn,
            &slot_name,
            SlotPersistence::Permanent,
            action,
            SlotOptions {
                two_phase: self.config.two_phase,
                failover: self.config.failover,
            },
        )
        .await
        .map_err(|e| self.err(e))?;
        tracing::info!(source = %name, slot = %slot_name, consistent_point = %created.consistent_point, "created replication slot");
        let mut state = SourceState {
            slot: slot_name.clone(),
            consistent_point: created.consistent_point.to_string(),
            snapshot_complete: !self.config.copy_data,
            tables: None,
            copies: Vec::new(),
        };
        state
            .store(&self.state_dir)
            .map_err(|e| SourceError::State(name.clone(), self.state_dir.clone(), e))?;
        let Some(snapshot_name) = created.snapshot_name.filter(|_| self.config.copy_data) else {
            return Ok(CopyOutcome::Copied);
        };
        let client = connect_sql(&self.params, self.config.application_name())
            .await
            .map_err(|e| self.err(e))?;
        let tables = published_tables(
            &client,
            &self.config.publications,
            conn.server_version_num(),
        )
        .await
        .map_err(|e| SourceError::Catalog(name.clone(), e))?;
        drop(client);
        let copied: Vec<u32> = tables.iter().map(|t| t.oid).collect();
        tracing::info!(source = %name, tables = tables.len(), workers = self.config.snapshot_workers, "initial copy starting");
        let copy = copy_tables(
            &self.params,
            &self.config,
            &snapshot_name,
            tables,
            created.consistent_point,
            events,
            &self.stats.snapshot,
        );
        // A stop request abandons the copy: the state says it is
        // unfinished, so the next start copies again with a new slot.
        tokio::select! {
            copied = copy => copied.map_err(|e| SourceError::Snapshot(name.clone(), e))?,
            _ = shutdown.changed() => {
                tracing::info!(source = %name, "stopping during the initial copy; it starts over on the next run");
                return Ok(CopyOutcome::Stopped);
            }
        }
        events
            .send(vec![SourceEvent::SnapshotComplete {
                consistent_point: created.consistent_point,
            }])
            .await
            .map_err(|_| SourceError::Snapshot(name.clone(), SnapshotError::Closed))?;
        // The copy counts as done only once the consumers made it durable.
        // A stop request now still waits for that, for a while, since
        // everything has been handed over.
        let acknowledged = async {
            while *flushed.borrow() < created.consistent_point {
                if flushed.changed().await.is_err() {
                    return Err(SourceError::Snapshot(name.clone(), SnapshotError::Closed));
                }
            }
            Ok(())
        };
        tokio::pin!(acknowledged);
        tokio::select! {
            done = &mut acknowledged => done?,
            _ = shutdown.changed() => match tokio::time::timeout(Duration::from_secs(10), &mut acknowledged).await {
                Ok(done) => done?,
                Err(_) => {
                    tracing::info!(source = %name, "stopping before the sinks confirmed the initial copy; it starts over on the next run");
                    return Ok(CopyOutcome::Stopped);
                }
            },
        }
        state.snapshot_complete = true;
        state.tables = Some(copied);
        state
            .store(&self.state_dir)
            .map_err(|e| SourceError::State(name.clone(), self.state_dir.clone(), e))?;
        let rows = self
            .stats
            .snapshot
            .rows
            .load(std::sync::atomic::Ordering::Relaxed);
        tracing::info!(source = %name, rows, "initial copy finished");
        if *shutdown.borrow() {
            return Ok(CopyOutcome::Stopped);
        }
        Ok(CopyOutcome::Copied)
    }

    fn start_command(&self, server_version: u32) -> String {
        let proto = match server_version {
            v if v >= 160_000 => 4,
            v if v >= 150_000 => 3,
            v if v >= 140_000 => 2,
            _ => 1,
        };
        let publications: Vec<String> = self
            .config
            .publications
            .iter()
            .map(|p| quote_ident(p))
            .collect();
        let mut options = vec![
            format!("proto_version '{proto}'"),
            format!(
                "publication_names '{}'",
                publications.join(",").replace('\'', "''")
            ),
        ];
        if self.config.binary {
            options.push("binary 'true'".into());
        }
        // Always: the watermarks of copies made while streaming are
        // messages; with `messages = false` the others are dropped here.
        if proto >= 2 {
            options.push("messages 'true'".into());
        }
        if self.config.streaming && proto >= 2 {
            options.push("streaming 'on'".into());
        }
        if self.config.two_phase && proto >= 3 {
            options.push("two_phase 'on'".into());
        }
        if server_version >= 160_000 {
            let origin = match self.config.origin {
                OriginFilter::Any => "any",
                OriginFilter::None => "none",
            };
            options.push(format!("origin '{origin}'"));
        }
        format!(
            "START_REPLICATION SLOT \"{}\" LOGICAL 0/0 ({})",
            self.config.slot_name(),
            options.join(", ")
        )
    }

    /// Sends a status update with the current feedback.
    async fn send_status(
        &self,
        conn: &mut ReplicationConnection,
        feedback: &mut Feedback,
        flushed: Lsn,
        assembler: &Assembler,
    ) -> Result<StatusUpdate, SourceError> {
        let status = feedback.status(
            flushed,
            assembler.in_transaction(),
            assembler.oldest_pending_prepare(),
        );
        self.stats
            .confirmed
            .store(status.flush.0, std::sync::atomic::Ordering::Relaxed);
        conn.send_copy_data(status.encode())
            .await
            .map_err(|e| self.err(e))?;
        Ok(status)
    }

    #[allow(clippy::too_many_arguments)]
    async fn stream(
        &self,
        mut conn: ReplicationConnection,
        events: &mpsc::Sender<EventBatch>,
        flushed: &mut watch::Receiver<Lsn>,
        shutdown: &mut watch::Receiver<bool>,
        assembler: &mut Assembler,
        feedback: &mut Feedback,
        tracker: &mut Tracker,
    ) -> Result<(), SourceError> {
        let name = self.config.name.clone();
        let version = conn.server_version_num();
        let command = self.start_command(version);
        tracing::debug!(source = %name, "{command}");
        let client = connect_sql(&self.params, self.config.application_name())
            .await
            .map_err(|e| self.err(e))?;
        tracker
            .start(
                &client,
                version,
                &self.config,
                &self.params,
                feedback.last_emitted_end,
            )
            .await
            .map_err(|e| SourceError::Backfill(name.clone(), e))?;
        let mut refresh = tokio::time::interval_at(
            tokio::time::Instant::now() + Duration::from_secs(self.config.refresh_interval),
            Duration::from_secs(self.config.refresh_interval),
        );
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        conn.start_copy_both(&command)
            .await
            .map_err(|e| self.err(e))?;
        tracing::info!(source = %name, slot = %self.config.slot_name(), "streaming changes");
        feedback.streamed = true;
        self.stats.set_phase(SourcePhase::Streaming);
        let mut decoder = Decoder::new();
        let send_delay = SendDelay::new(&name);
        let mut types = TypeCatalog::new();
        let mut ticker = tokio::time::interval(Duration::from_secs(self.config.status_interval));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut heartbeat = self.config.heartbeat_interval.map(|secs| {
            let mut t = tokio::time::interval(Duration::from_secs(secs));
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        });
        let mut applied = feedback.applied.clone();
        // Progress is reported promptly but coalesced: one status update
        // per STATUS_GAP at most, however often the log or the sinks move.
        let mut status_due = None;
        let mut last_status = tokio::time::Instant::now();
        let mut sequences = SequenceReader::default();
        loop {
            if *shutdown.borrow_and_update() {
                self.last_sequences(&mut sequences, &client, events, feedback)
                    .await;
                return self.finish(conn, flushed, assembler, feedback).await;
            }
            let burst = tokio::select! {
                biased;
                _ = shutdown.changed() => {
                    self.last_sequences(&mut sequences, &client, events, feedback).await;
                    return self.finish(conn, flushed, assembler, feedback).await;
                }
                // The log failed: stop now, not at the next change (a quiet
                // database may send none for hours).
                _ = events.closed() => return Err(SourceError::DownstreamClosed(name.clone())),
                // While a status is due, the log's and the sinks' moves
                // are not looked at (it reports them): at most a wake-up
                // or two per STATUS_GAP, not one per transaction.
                _ = flushed.changed(), if status_due.is_none() => {
                    status_due = Some(last_status + STATUS_GAP);
                    None
                }
                Some(event) = tracker.next_event() => {
                    tracker.handle(event, &name).map_err(|e| SourceError::Backfill(name.clone(), e))?;
                    None
                }
                _ = refresh.tick() => {
                    tracker
                        .refresh(&client, version, &self.config)
                        .await
                        .map_err(|e| SourceError::Backfill(name.clone(), e))?;
                    if self.config.sequences
                        && let Some(values) = sequences
                            .moved(&name, &client, &self.config.publications, feedback.last_emitted_end)
                            .await
                    {
                        let mut lost = None;
                        self.deliver(
                            &mut conn,
                            events,
                            flushed,
                            shutdown,
                            assembler,
                            feedback,
                            &mut lost,
                            vec![SourceEvent::Sequences(values)],
                        )
                        .await?;
                        if let Some(e) = lost {
                            return Err(e);
                        }
                    }
                    None
                }
                Ok(()) = applied.changed(), if status_due.is_none() => {
                    status_due = Some(last_status + STATUS_GAP);
                    None
                }
                _ = tokio::time::sleep_until(status_due.unwrap_or(last_status)), if status_due.is_some() => {
                    status_due = None;
                    last_status = tokio::time::Instant::now();
                    let acked = *flushed.borrow();
                    tracker.durable(acked, &name).map_err(|e| SourceError::Backfill(name.clone(), e))?;
                    self.send_status(&mut conn, feedback, acked, assembler).await?;
                    None
                }
                _ = ticker.tick() => {
                    let acked = *flushed.borrow();
                    self.send_status(&mut conn, feedback, acked, assembler).await?;
                    None
                }
                _ = async {
                    match heartbeat.as_mut() {
                        Some(t) => t.tick().await,
                        None => std::future::pending().await,
                    }
                } => {
                    let sql = format!("SELECT pg_logical_emit_message(false, '{HEARTBEAT_PREFIX}', '')");
                    if let Err(e) = client.simple_query(&sql).await {
                        tracing::warn!(source = %name, "heartbeat failed: {}; heartbeats are off until the next reconnect", crate::wire::describe_pg_error(&e));
                        heartbeat = None;
                    }
                    None
                }
                // The stream comes last: while the walsender is behind a
                // message is always ready, and every branch above (each of
                // bounded rate) would wait for the backlog to end — chunks
                // of a copy would not count as durable, status not be sent.
                message = conn.recv_copy() => Some(message),
            };
            // Take every message already received before going back to the
            // select: one wake-up per burst, not per message.
            let mut next = burst;
            let mut taken = 0;
            while let Some(message) = next {
                let data = match message.map_err(|e| self.err(e))? {
                    CopyMessage::Data(d) => d,
                    CopyMessage::Done => return Err(self.err(ConnectionError::Closed)),
                };
                match ServerMessage::parse(data)
                    .map_err(|e| SourceError::CopyBoth(name.clone(), e))?
                {
                    ServerMessage::Keepalive {
                        wal_end,
                        reply_requested,
                        ..
                    } => {
                        let acked = *flushed.borrow();
                        let moves = feedback.keepalive(
                            wal_end,
                            acked,
                            assembler.in_transaction(),
                            assembler.oldest_pending_prepare(),
                        );
                        if reply_requested {
                            self.send_status(&mut conn, feedback, acked, assembler)
                                .await?;
                        } else if moves {
                            status_due.get_or_insert(last_status + STATUS_GAP);
                        }
                    }
                    ServerMessage::XLogData {
                        wal_start,
                        send_time,
                        data,
                        ..
                    } => {
                        feedback.received = feedback.received.max(wal_start);
                        self.stats
                            .received
                            .store(feedback.received.0, std::sync::atomic::Ordering::Relaxed);
                        let message = decoder
                            .decode(data)
                            .map_err(|e| SourceError::Decode(name.clone(), e))?;
                        if let Message::Commit { commit_time, .. }
                        | Message::StreamCommit { commit_time, .. }
                        | Message::CommitPrepared { commit_time, .. } = &message
                        {
                            send_delay.sent(*commit_time, send_time);
                        }
                        // Batch the reads only while the walsender is behind
                        // (see wire::batching): a transaction sent long after
                        // its commit says so, and so does one big enough to be
                        // streamed before it commits.
                        match &message {
                            Message::Begin { commit_time, .. } => conn
                                .set_behind(is_backlog(send_time, *commit_time))
                                .map_err(|e| self.err(e))?,
                            Message::StreamStart { .. } => {
                                conn.set_behind(true).map_err(|e| self.err(e))?
                            }
                            _ => {}
                        }
                        let assembled = match message {
                            Message::Relation { xid, body } => {
                                let relation = types
                                    .describe(&client, body)
                                    .await
                                    .map_err(|e| SourceError::Catalog(name.clone(), e))?;
                                tracker
                                    .seen(&relation, &self.config)
                                    .map_err(|e| SourceError::Backfill(name.clone(), e))?;
                                assembler
                                    .set_relation(relation, xid)
                                    .map_err(|e| SourceError::Assembly(name.clone(), e))?;
                                Assembled::Nothing
                            }
                            other => assembler
                                .push(wal_start, other)
                                .map_err(|e| SourceError::Assembly(name.clone(), e))?,
                        };
                        match assembled {
                            Assembled::Nothing => {}
                            Assembled::Message(m) => {
                                // Downstream records a message just past its LSN.
                                let end = Lsn(m.lsn.0.saturating_add(1));
                                // Watermarks are written in transactions
                                // ([`Source::emit`]); one outside (written by
                                // hand, say) is not passed on either.
                                if m.prefix != HEARTBEAT_PREFIX
                                    && m.prefix != WATERMARK_PREFIX
                                    && self.config.messages
                                    && end > feedback.last_emitted_end
                                {
                                    let mut lost = None;
                                    self.deliver(
                                        &mut conn,
                                        events,
                                        flushed,
                                        shutdown,
                                        assembler,
                                        feedback,
                                        &mut lost,
                                        vec![SourceEvent::Message(m)],
                                    )
                                    .await?;
                                    feedback.last_emitted_end = end;
                                    if let Some(e) = lost {
                                        return Err(e);
                                    }
                                }
                            }
                            Assembled::Committed(txn) => {
                                self.emit(
                                    &mut conn, events, flushed, shutdown, assembler, feedback,
                                    tracker, txn,
                                )
                                .await?
                            }
                        }
                    }
                }
                taken += 1;
                next = if taken < BURST {
                    conn.try_recv_copy().map_err(|e| self.err(e))?.map(Ok)
                } else {
                    None
                };
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn emit(
        &self,
        conn: &mut ReplicationConnection,
        events: &mpsc::Sender<EventBatch>,
        flushed: &watch::Receiver<Lsn>,
        shutdown: &watch::Receiver<bool>,
        assembler: &Assembler,
        feedback: &mut Feedback,
        tracker: &mut Tracker,
        txn: CommittedTransaction,
    ) -> Result<(), SourceError> {
        let name = &self.config.name;
        if txn.info.end_lsn <= feedback.last_emitted_end {
            // Already handed downstream before a reconnect.
            return Ok(());
        }
        let info = txn.info.clone();
        let single = txn.changes.len() == 1;
        let mut changes = txn
            .changes
            .into_changes()
            .map_err(|e| SourceError::Spill(name.clone(), e))?
            .map(|c| c.map_err(|e| SourceError::Spill(name.clone(), e)));
        // A watermark of a copy made while streaming is a transaction of
        // one message: it goes no further, and a high one hands over its
        // chunk in its place.
        let first = if single {
            changes.next().transpose()?
        } else {
            None
        };
        if let Some(Change::Message(m)) = &first {
            let watermark = tracker
                .watermark(m, name)
                .map_err(|e| SourceError::Backfill(name.clone(), e))?;
            if let Some(unit) = watermark {
                if let Some(unit) = unit {
                    self.emit_chunk(
                        conn, events, flushed, shutdown, assembler, feedback, tracker, unit, info,
                    )
                    .await?;
                }
                return Ok(());
            }
        }
        let changes = first.map(Ok).into_iter().chain(changes);
        self.hand_over(
            conn,
            events,
            flushed,
            shutdown,
            assembler,
            feedback,
            Some(tracker),
            info,
            changes,
        )
        .await
    }

    /// Hands a chunk copied while streaming downstream, as one unit in the
    /// place of its high watermark's transaction (`info`).
    #[allow(clippy::too_many_arguments)]
    async fn emit_chunk(
        &self,
        conn: &mut ReplicationConnection,
        events: &mpsc::Sender<EventBatch>,
        flushed: &watch::Receiver<Lsn>,
        shutdown: &watch::Receiver<bool>,
        assembler: &Assembler,
        feedback: &mut Feedback,
        tracker: &mut Tracker,
        unit: ChunkUnit,
        info: Arc<TransactionInfo>,
    ) -> Result<(), SourceError> {
        tracker
            .handing(info.end_lsn, &unit)
            .map_err(|e| SourceError::Backfill(self.config.name.clone(), e))?;
        let ChunkUnit { changes, sink, .. } = unit;
        let info = match sink {
            Some(sink) => Arc::new(TransactionInfo {
                for_sink: Some(sink),
                ..(*info).clone()
            }),
            None => info,
        };
        self.hand_over(
            conn,
            events,
            flushed,
            shutdown,
            assembler,
            feedback,
            None,
            info,
            changes.into_iter().map(Ok),
        )
        .await
    }

    /// Hands a committed unit downstream: `Begin`, its changes (through the
    /// copies under way, when `tracker` is given), `Commit`. The unit is
    /// all here: it goes downstream whole even if the connection breaks
    /// meanwhile (a unit cut in the middle would stay in the log until the
    /// next start), and then the break is reported.
    #[allow(clippy::too_many_arguments)]
    async fn hand_over(
        &self,
        conn: &mut ReplicationConnection,
        events: &mpsc::Sender<EventBatch>,
        flushed: &watch::Receiver<Lsn>,
        shutdown: &watch::Receiver<bool>,
        assembler: &Assembler,
        feedback: &mut Feedback,
        mut tracker: Option<&mut Tracker>,
        info: Arc<TransactionInfo>,
        changes: impl Iterator<Item = Result<Change, SourceError>>,
    ) -> Result<(), SourceError> {
        let name = &self.config.name;
        let mut lost = None;
        // Room for the transaction's events, up to a batch: a whole batch's
        // room (22 kB) for a transaction of a few changes cost more than them.
        let mut batch = Vec::with_capacity((changes.size_hint().0 + 2).min(MAX_BATCH));
        let mut batch_bytes = 0;
        batch.push(SourceEvent::Begin(info.clone()));
        let mut passed = Vec::new();
        for change in changes {
            let change = change?;
            match tracker.as_deref_mut() {
                Some(t) => t
                    .filter(info.xid, change, &mut passed)
                    .map_err(|e| SourceError::Backfill(name.clone(), e))?,
                None => passed.push(change),
            }
            for change in passed.drain(..) {
                if !self.config.messages && matches!(change, Change::Message(_)) {
                    continue;
                }
                self.stats.count(&change);
                batch_bytes += change.approximate_size();
                batch.push(SourceEvent::Change(change));
                if batch.len() >= MAX_BATCH || batch_bytes >= MAX_BATCH_BYTES {
                    let full = std::mem::replace(&mut batch, Vec::with_capacity(MAX_BATCH));
                    batch_bytes = 0;
                    self.deliver(
                        conn, events, flushed, shutdown, assembler, feedback, &mut lost, full,
                    )
                    .await?;
                }
            }
        }
        batch.push(SourceEvent::Commit(info.clone()));
        self.deliver(
            conn, events, flushed, shutdown, assembler, feedback, &mut lost, batch,
        )
        .await?;
        feedback.last_emitted_end = info.end_lsn;
        self.stats
            .transactions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        lost.map_or(Ok(()), Err)
    }

    /// Hands a batch of events downstream, waiting for room; while waiting, keeps
    /// the publisher informed so it does not time the connection out (a
    /// failure to is kept in `lost`, and the wait goes on: the caller
    /// reports it once its unit is whole downstream). A
    /// stop request ends the wait ([`SourceError::Stopped`]): what was not
    /// handed over was never confirmed, so the publisher sends it again.
    #[allow(clippy::too_many_arguments)]
    async fn deliver(
        &self,
        conn: &mut ReplicationConnection,
        events: &mpsc::Sender<EventBatch>,
        flushed: &watch::Receiver<Lsn>,
        shutdown: &watch::Receiver<bool>,
        assembler: &Assembler,
        feedback: &mut Feedback,
        lost: &mut Option<SourceError>,
        batch: EventBatch,
    ) -> Result<(), SourceError> {
        let name = &self.config.name;
        let mut stop = shutdown.clone();
        loop {
            tokio::select! {
                permit = events.reserve() => {
                    let permit = permit.map_err(|_| SourceError::DownstreamClosed(name.clone()))?;
                    permit.send(batch);
                    return Ok(());
                }
                _ = async { stop.wait_for(|stop| *stop).await.is_ok() } => {
                    return Err(SourceError::Stopped(name.clone()));
                }
                _ = tokio::time::sleep(Duration::from_secs(self.config.status_interval)), if lost.is_none() => {
                    let acked = *flushed.borrow();
                    if let Err(e) = self.send_status(conn, feedback, acked, assembler).await {
                        *lost = Some(e);
                    }
                }
            }
        }
    }

    /// At shutdown: the sequences once more, when they moved (so a
    /// switchover after a clean stop finds them current downstream).
    async fn last_sequences(
        &self,
        sequences: &mut SequenceReader,
        client: &tokio_postgres::Client,
        events: &mpsc::Sender<EventBatch>,
        feedback: &Feedback,
    ) {
        if !self.config.sequences {
            return;
        }
        let name = &self.config.name;
        let Some(values) = sequences
            .moved(
                name,
                client,
                &self.config.publications,
                feedback.last_emitted_end,
            )
            .await
        else {
            return;
        };
        // Downstream may be full: stopping does not wait on it for long.
        let sent = tokio::time::timeout(
            Duration::from_secs(5),
            events.send(vec![SourceEvent::Sequences(values)]),
        )
        .await;
        if !matches!(sent, Ok(Ok(()))) {
            tracing::warn!(source = %name, "the sequences read at shutdown could not be handed on: downstream is full or gone");
        }
    }

    async fn finish(
        &self,
        mut conn: ReplicationConnection,
        flushed: &mut watch::Receiver<Lsn>,
        assembler: &Assembler,
        feedback: &mut Feedback,
    ) -> Result<(), SourceError> {
        // Give the consumers a moment to make what they received durable,
        // so the final status update confirms as much as possible.
        let target = feedback.last_emitted_end;
        let wait = async {
            while *flushed.borrow() < target {
                if flushed.changed().await.is_err() {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(10), wait).await;
        let acked = *flushed.borrow();
        let s = self
            .send_status(&mut conn, feedback, acked, assembler)
            .await?;
        conn.finish_copy_both().await.map_err(|e| self.err(e))?;
        conn.close().await;
        tracing::info!(source = %self.config.name, confirmed = %s.flush, "stopped streaming");
        Ok(())
    }
}
