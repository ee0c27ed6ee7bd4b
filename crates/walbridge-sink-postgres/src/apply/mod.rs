//! Applying one source's log into the target: one connection, one
//! transaction at a time, in the source's commit order.
//!
//! # Ordering and exactly once
//!
//! Consecutive source transactions are grouped into one target
//! transaction (bounded by `batch_changes`, `batch_bytes`, `batch_time`,
//! and committed at once whenever the input runs dry). A group only ever
//! ends at a unit boundary of the log — after a whole source transaction,
//! the whole initial copy, or a message — and its last statement before
//! COMMIT records the log position of that boundary (see [`crate::progress`]).
//! Statements are sent ahead of their results, but in order, on one
//! connection, inside one transaction, so the target sees exactly the
//! source's order. If anything fails, the target transaction rolls back
//! whole and the run ends; the next run resumes from the position the
//! target holds. Nothing is applied twice and nothing is skipped.
//!
//! The log shows the sink a small transaction as soon as it is written,
//! before its fsync ([`walbridge_log::Visibility::Written`]), so the target
//! may commit a transaction the log then loses in a crash. The publisher
//! still has it (the source confirms only what the log made durable) and
//! sends it again, with the same LSN, after the position the log kept; and
//! a run that resumes while the log is running starts at the durable end,
//! which may be before what the target holds. So the applier passes over
//! every transaction ending at or before the position the target held when
//! the run began.
//!
//! A position is acknowledged (to the log and through it to the publisher)
//! only once the target has it durably: at once with a synchronous commit,
//! otherwise when the target's WAL flush position passes the commit.
//!
//! # Stopping on a transaction
//!
//! When a statement fails because of the data (a conflict, a value that
//! does not fit), the failing source transaction is recorded as the one
//! the sink is stopped on. The next run commits everything before it
//! first and then applies it alone (with `on_conflict = "skip"`, change by
//! change under savepoints, skipping the changes that conflict), so the
//! transactions before it are applied and nothing after it is, as with a
//! native subscriber; `walbridge skip` moves the target's position past it.

mod changes;
mod ddl;
mod failure;
mod one_query;
mod snapshot;

use std::collections::{HashMap, HashSet, VecDeque};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use foldhash::fast::RandomState;
use tokio::sync::mpsc;
use tokio_postgres::{Client, Statement};
use walbridge_core::{
    Lsn, Oid, PgTimestamp, Relation, SequenceValues, SourceEvent, TransactionInfo,
};
use walbridge_sink::{LogPosition, Routed, SourceContext};

use crate::batch::{BatchKind, Batcher};
use crate::config::PostgresSinkConfig;
use crate::deferred::DeferredIndexes;
use crate::error::{SinkError, StoppedOn, failed};
use crate::inflight::{Failed, InFlight, Outcome, Reply};
use crate::mapping::{Mapper, TableMap};
use crate::progress::ProgressStore;
use crate::sequences::{SequenceOutcome, set_sequences};
use crate::state::{Published, SinkState};
use crate::statement::{InsertMode, Shape};
use crate::target::TargetCatalog;
use snapshot::{CopyIn, Lanes};

/// How often positions awaiting the target's WAL flush are checked while idle.
const FLUSH_POLL: Duration = Duration::from_millis(100);

/// How often progress is logged while applying.
const PROGRESS_LOG: Duration = Duration::from_secs(30);

/// What a statement in flight was sent for.
enum Purpose {
    /// Transaction control or bookkeeping.
    Control(&'static str),
    /// A row change of a source transaction.
    Change {
        txn: Arc<TransactionInfo>,
        map: Arc<TableMap>,
        kind: ChangeKind,
        binds: Arc<[(bool, usize)]>,
    },
    /// Removing the rows a re-sync's chunk did not find.
    Stale {
        txn: Arc<TransactionInfo>,
        table: String,
    },
    /// A TRUNCATE of a source transaction.
    Truncate {
        txn: Arc<TransactionInfo>,
        tables: String,
    },
    /// The COMMIT of a group.
    Commit(Box<Committed>),
    /// A whole group in one query: its BEGIN, batches (each a
    /// [`Purpose::Batch`]) and COMMIT (see [`one_query`]).
    Group {
        batches: Vec<Purpose>,
        commit: Box<Committed>,
    },
    /// Preparing a batch statement; until it is ready the statement runs
    /// unnamed, in the same message as its values (no round trip of its
    /// own, which would wait for everything in flight before it).
    Prepare {
        key: (usize, BatchKind),
        sql: String,
        table: String,
    },
    /// A batch of changes of one table.
    Batch {
        map: Arc<TableMap>,
        kind: BatchKind,
        rows: usize,
        last_txn: Arc<TransactionInfo>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChangeKind {
    Insert,
    InsertOrSkip,
    Update,
    Delete,
}

/// A prepared statement and the values it binds, in order.
#[derive(Clone)]
struct Prepared {
    statement: Statement,
    binds: Arc<[(bool, usize)]>,
}

/// A group whose COMMIT was sent.
struct Committed {
    position: LogPosition,
    transactions: u64,
    changes: usize,
    started: Option<Instant>,
    isolated: bool,
    /// Its last source transaction.
    last_txn: Option<Arc<TransactionInfo>>,
    /// Commit times of its source transactions.
    commit_times: Vec<PgTimestamp>,
    /// The published columns, when the group changed them.
    published: Option<Published>,
}

/// Changes that found nothing to change, since the last COMMIT's result.
#[derive(Default)]
struct Misses {
    updates: u64,
    deletes: u64,
    skipped_conflicts: u64,
    example: Option<String>,
}

/// The target transaction being built.
#[derive(Default)]
struct Group {
    /// It has begun: a change or the copy is in it.
    open: bool,
    /// Its BEGIN was sent (a group of batches only sends it with them).
    begun: bool,
    started: Option<Instant>,
    changes: usize,
    bytes: usize,
    transactions: u64,
    /// The last unit boundary inside the group: what COMMIT records.
    position: Option<LogPosition>,
    /// Commit time of the last source transaction.
    commit_time: PgTimestamp,
    /// Commit times of every source transaction in the group, for their delays.
    commit_times: Vec<PgTimestamp>,
    /// The group holds the transaction the sink stopped on, alone.
    isolated: bool,
    /// The last source transaction in the group.
    last_txn: Option<Arc<TransactionInfo>>,
    /// A table's published columns changed in the group.
    published_changed: bool,
}

/// Totals since the applier started, for progress logs.
#[derive(Default)]
struct Totals {
    transactions: u64,
    changes: u64,
    rows_copied: u64,
    update_missing: u64,
    delete_missing: u64,
    skipped_conflicts: u64,
}

/// Gives the sink's metrics their help text (for the recorder the process
/// has installed by the time an applier starts; a no-op without one).
fn describe_metrics() {
    use metrics::describe_counter;
    describe_counter!(
        "walbridge_postgres_transactions_total",
        "Source transactions a postgres sink committed on its target."
    );
    describe_counter!(
        "walbridge_postgres_changes_total",
        "Changes a postgres sink applied on its target."
    );
    describe_counter!(
        "walbridge_postgres_missing_rows_total",
        "Updates and deletes that found no row on the target and were skipped, as a native subscriber does, by operation."
    );
    describe_counter!(
        "walbridge_postgres_conflicts_skipped_total",
        "Inserts skipped because the row was already there (on_conflict = \"skip\")."
    );
}

/// The sink's counters for one source, registered once per applier so the
/// apply path only adds to them.
struct Counters {
    transactions: metrics::Counter,
    changes: metrics::Counter,
    missing_updates: metrics::Counter,
    missing_deletes: metrics::Counter,
    conflicts_skipped: metrics::Counter,
}

impl Counters {
    /// Registered at 0, so the series exist from the start (an alert on
    /// their increase needs one).
    fn new(sink: &str, source: &str) -> Self {
        let labels = [("sink", sink.to_owned()), ("source", source.to_owned())];
        let missing = |operation: &str| {
            let mut labels = labels.to_vec();
            labels.push(("operation", operation.to_owned()));
            metrics::counter!("walbridge_postgres_missing_rows_total", &labels)
        };
        Counters {
            transactions: metrics::counter!("walbridge_postgres_transactions_total", &labels),
            changes: metrics::counter!("walbridge_postgres_changes_total", &labels),
            missing_updates: missing("update"),
            missing_deletes: missing("delete"),
            conflicts_skipped: metrics::counter!(
                "walbridge_postgres_conflicts_skipped_total",
                &labels
            ),
        }
    }
}

fn simple(client: &Arc<Client>, sql: String) -> impl Future<Output = Outcome> + Send + 'static {
    let client = client.clone();
    async move {
        client
            .batch_execute(&sql)
            .await
            .map(|()| Reply::Rows(0))
            .map_err(|error| Failed {
                error,
                params: Vec::new(),
            })
    }
}

/// What the target's WAL positions are read with.
const WAL_POSITIONS: &str =
    "SELECT pg_current_wal_insert_lsn()::text, pg_current_wal_flush_lsn()::text";

/// Runs `commit` (a simple query ending in COMMIT), then, in the same
/// query, reads the target's WAL positions: where the commit's WAL ends
/// (written) and what is flushed.
fn commit_reading_wal(
    client: &Arc<Client>,
    commit: String,
) -> Pin<Box<dyn Future<Output = Outcome> + Send + 'static>> {
    let client = client.clone();
    Box::pin(async move {
        let messages = client
            .simple_query(&format!("{commit}; {WAL_POSITIONS}"))
            .await
            .map_err(|error| Failed {
                error,
                params: Vec::new(),
            })?;
        Ok(wal_read(&messages))
    })
}

/// The WAL positions [`WAL_POSITIONS`], ending a query that committed, read.
fn wal_read(messages: &[tokio_postgres::SimpleQueryMessage]) -> Reply {
    // The last row is the positions' (the commit may return one too).
    let row = messages.iter().rev().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(row) => Some(row),
        _ => None,
    });
    let lsn = |i: usize| {
        row.and_then(|r| r.get(i))
            .and_then(|t| t.parse::<Lsn>().ok())
    };
    match (lsn(0), lsn(1)) {
        (Some(written), Some(flushed)) => Reply::Wal { written, flushed },
        // Never guess where the commit ends (a guess too low would
        // acknowledge it before it is flushed): a later commit's
        // acknowledgement covers this one.
        _ => {
            tracing::warn!("the target did not return its WAL positions after a commit");
            Reply::Rows(0)
        }
    }
}

/// The target's WAL write (insert) and flush positions.
async fn wal_positions(client: &Client) -> Result<(Lsn, Lsn), tokio_postgres::Error> {
    let row = client.query_one(WAL_POSITIONS, &[]).await?;
    let parse = |i: usize| row.get::<_, String>(i).parse::<Lsn>().unwrap_or(Lsn::ZERO);
    Ok((parse(0), parse(1)))
}

/// Applies one source into the target.
pub struct Applier {
    sink: String,
    source: Arc<SourceContext>,
    config: Arc<PostgresSinkConfig>,
    client: Arc<Client>,
    catalog: TargetCatalog,
    mapper: Mapper,
    /// Looked up for every change (foldhash: SipHash was a visible share).
    statements: HashMap<(usize, Shape), Prepared, RandomState>,
    /// Batch statements by table and kind: `None` while being prepared.
    batch_statements: HashMap<(usize, BatchKind), Option<Statement>, RandomState>,
    /// Batch statements prepared by name, for groups sent as one query.
    named_statements: HashMap<(usize, BatchKind), String, RandomState>,
    batcher: Batcher,
    /// Changes of transactions ending at or before this are applied one
    /// by one (a batch failed; this finds the transaction at fault).
    one_by_one_until: Option<Lsn>,
    inflight: InFlight<Purpose>,
    progress: ProgressStore,
    state: Arc<SinkState>,
    group: Group,
    txn: Option<Arc<TransactionInfo>>,
    copy: Option<CopyIn>,
    /// The initial copy over several connections.
    lanes: Option<Lanes>,
    copied: HashSet<Oid>,
    /// Where indexes dropped for the initial copy are recorded; `None`
    /// when tables keep them (`defer_indexes = false`, `source_column`).
    deferred: Option<DeferredIndexes>,
    /// Inside the initial copy (it may still be arriving, and may never be
    /// finished if the source stops): nothing commits until its end.
    in_snapshot: bool,
    /// The transaction to apply alone (the one the sink stopped on).
    isolate: Option<StoppedOn>,
    /// Committed positions waiting for the target's WAL flush.
    unflushed: VecDeque<(Lsn, LogPosition)>,
    /// COMMITs sent whose result has not been taken.
    commits_in_flight: usize,
    /// Changes that found nothing to change, since the last COMMIT's result.
    misses: Misses,
    totals: Totals,
    counters: Counters,
    last_log: Instant,
    /// Per table, the published columns last mapped.
    published: Published,
    /// Sequences found missing on the target (said once).
    missing_sequences: HashSet<String>,
    /// Inside a unit meant for another sink, or one the target holds.
    passing: bool,
    /// The position the target held when the run began: a transaction
    /// ending at or before it is there already.
    applied_before: Option<Lsn>,
    /// Target tables the current source transaction truncated.
    truncated: HashSet<Oid>,
}

/// Everything an applier needs, connected.
pub struct ApplierParts {
    /// The sink's name.
    pub sink: String,
    /// The source.
    pub source: Arc<SourceContext>,
    /// The sink's configuration.
    pub config: Arc<PostgresSinkConfig>,
    /// The apply connection (bound to the origin, settings made).
    pub client: Client,
    /// The lookup connection.
    pub catalog: TargetCatalog,
    /// Where progress is stored.
    pub progress: ProgressStore,
    /// The position the target held when the run began.
    pub applied_before: Option<Lsn>,
    /// The sink's shared state.
    pub state: Arc<SinkState>,
}

impl Applier {
    /// An applier over connected parts.
    pub fn new(parts: ApplierParts) -> Result<Self, SinkError> {
        describe_metrics();
        let mapper = Mapper::new(&parts.config, &parts.source.name).map_err(SinkError::Mapping)?;
        let isolate = parts.state.stopped_on(&parts.source.name);
        let one_by_one_until = parts.state.one_by_one_until(&parts.source.name);
        let counters = Counters::new(&parts.sink, &parts.source.name);
        let published = parts.state.published(&parts.source.name);
        let deferred = if parts.config.defer_indexes && parts.config.source_column.is_none() {
            Some(DeferredIndexes::new(
                &parts.config.progress_table,
                &parts.sink,
                &parts.source.name,
            )?)
        } else {
            None
        };
        Ok(Applier {
            inflight: InFlight::new(parts.config.pipeline_depth),
            sink: parts.sink,
            source: parts.source,
            config: parts.config,
            client: Arc::new(parts.client),
            catalog: parts.catalog,
            mapper,
            statements: HashMap::default(),
            batch_statements: HashMap::default(),
            named_statements: HashMap::default(),
            batcher: Batcher::default(),
            one_by_one_until,
            progress: parts.progress,
            state: parts.state,
            group: Group::default(),
            txn: None,
            copy: None,
            lanes: None,
            copied: HashSet::new(),
            deferred,
            in_snapshot: false,
            isolate,
            unflushed: VecDeque::new(),
            commits_in_flight: 0,
            misses: Misses::default(),
            totals: Totals::default(),
            counters,
            last_log: Instant::now(),
            published,
            missing_sequences: HashSet::new(),
            passing: false,
            applied_before: parts.applied_before,
            truncated: HashSet::new(),
        })
    }

    /// Applies everything `input` delivers until it closes, then waits
    /// (briefly) for the target to flush what was committed.
    pub async fn run(mut self, mut input: mpsc::Receiver<Routed>) -> Result<(), SinkError> {
        loop {
            let routed = match input.try_recv() {
                Ok(routed) => routed,
                Err(mpsc::error::TryRecvError::Disconnected) => break,
                Err(mpsc::error::TryRecvError::Empty) => {
                    // Nothing more right now: commit what is applied — once
                    // the previous COMMIT is through, so that while the
                    // target is busy the next group grows instead of
                    // queueing behind it — and take results while waiting,
                    // going on with new input as soon as there is some.
                    let next = loop {
                        if self.commits_in_flight == 0 {
                            self.commit().await?;
                        }
                        if self.inflight.is_empty() {
                            tokio::select! {
                                next = input.recv() => break next,
                                _ = tokio::time::sleep(FLUSH_POLL), if !self.unflushed.is_empty() => {
                                    self.check_flushed().await?;
                                }
                            }
                        } else {
                            tokio::select! {
                                biased;
                                next = input.recv() => break next,
                                taken = self.take_one() => {
                                    taken?;
                                }
                            }
                        }
                    };
                    match next {
                        Some(routed) => routed,
                        None => break,
                    }
                }
            };
            self.apply(routed).await?;
        }
        self.commit().await?;
        self.drain().await?;
        self.flush_all().await?;
        self.log_totals();
        Ok(())
    }

    async fn apply(&mut self, routed: Routed) -> Result<(), SinkError> {
        let mut boundaries = routed.boundaries.into_iter().peekable();
        for (i, event) in routed.events.into_iter().enumerate() {
            self.event(event).await?;
            if let Some((_, position)) = boundaries.next_if(|(end, _)| *end == i + 1) {
                self.unit_end(position).await?;
            }
        }
        Ok(())
    }

    /// A unit of the log (a transaction, the initial copy, a message) is
    /// complete: the group may end here.
    async fn unit_end(&mut self, position: LogPosition) -> Result<(), SinkError> {
        self.group.position = Some(position);
        if !self.in_snapshot && self.lanes.is_some() {
            return self.finish_lanes().await;
        }
        let limits = &self.config;
        let full = self.group.changes >= limits.batch_changes
            || self.group.bytes as u64 >= limits.batch_bytes.0
            || self
                .group
                .started
                .is_some_and(|t| t.elapsed() >= limits.batch_time.0);
        // Finding a transaction at fault: one per target transaction.
        let one_by_one = self.one_by_one_until.is_some();
        if full || self.group.isolated || one_by_one {
            self.commit().await?;
        }
        Ok(())
    }

    async fn event(&mut self, event: SourceEvent) -> Result<(), SinkError> {
        match event {
            SourceEvent::Snapshot(batch) => self.snapshot_rows(batch).await,
            SourceEvent::SnapshotComplete { .. } => {
                self.in_snapshot = false;
                self.finish_copy().await?;
                // Copy lanes build them once they commit (`finish_lanes`).
                if self.lanes.is_none() {
                    self.drain().await?;
                    let client = self.client.clone();
                    self.build_deferred(&[client.as_ref()]).await?;
                }
                Ok(())
            }
            // A unit for another sink (`resync --sink`): nothing of it,
            // but its place in the log still counts.
            SourceEvent::Begin(info) if info.passes_over(&self.sink) => {
                self.passing = true;
                Ok(())
            }
            SourceEvent::Begin(info) if self.applied_before.is_some_and(|a| info.end_lsn <= a) => {
                tracing::info!(sink = %self.sink, source = %self.source.name, xid = info.xid, end_lsn = %info.end_lsn, "passing over a transaction the target already holds (applied while the log made it durable, and read again after a restart)");
                self.passing = true;
                Ok(())
            }
            SourceEvent::Change(_) if self.passing => Ok(()),
            SourceEvent::Commit(_) if self.passing => {
                self.passing = false;
                Ok(())
            }
            SourceEvent::Begin(info) => {
                let isolate = self
                    .isolate
                    .as_ref()
                    .is_some_and(|s| s.end_lsn == info.end_lsn);
                if isolate {
                    // Everything before it goes in first, in its own transaction.
                    self.commit().await?;
                    self.group.isolated = true;
                    tracing::info!(sink = %self.sink, source = %self.source.name, xid = info.xid, commit_lsn = %info.commit_lsn, "applying the transaction the sink stopped on, alone");
                }
                self.txn = Some(info);
                self.truncated.clear();
                Ok(())
            }
            SourceEvent::Change(change) => self.change(change).await,
            SourceEvent::Commit(info) => {
                self.txn = None;
                self.group.transactions += 1;
                self.group.commit_time = info.commit_time;
                self.group.commit_times.push(info.commit_time);
                self.group.last_txn = Some(info);
                Ok(())
            }
            // Logical decoding messages have no place in tables (a native
            // subscriber ignores them too).
            SourceEvent::Message(_) => Ok(()),
            SourceEvent::Sequences(values) => {
                self.sequences(&values).await;
                Ok(())
            }
        }
    }

    /// Sets the target's sequences; what the target refuses is logged
    /// (a missing sequence once), and applying goes on.
    async fn sequences(&mut self, values: &SequenceValues) {
        let results = set_sequences(
            self.catalog.client(),
            self.mapper.template(),
            &self.source.name,
            values,
        )
        .await;
        let mut set = 0;
        for result in results {
            match result.outcome {
                SequenceOutcome::Set => set += 1,
                SequenceOutcome::Ahead => {}
                SequenceOutcome::Missing => {
                    if self.missing_sequences.insert(result.target.clone()) {
                        tracing::warn!(sink = %self.sink, source = %self.source.name, sequence = %result.target, value = result.value, "the target has no sequence {}: create it (CREATE SEQUENCE …), or its value is not replicated", result.target);
                    }
                }
                SequenceOutcome::Refused(reason) => {
                    tracing::warn!(sink = %self.sink, source = %self.source.name, sequence = %result.target, value = result.value, "cannot set sequence {} to {}: {reason}", result.target, result.value);
                }
            }
        }
        tracing::debug!(sink = %self.sink, source = %self.source.name, set, of = values.sequences.len(), "sequences");
    }

    async fn map(&mut self, relation: &Arc<Relation>) -> Result<Arc<TableMap>, SinkError> {
        if let Some(map) = self.mapper.known(relation) {
            return Ok(map);
        }
        self.change_schema(relation).await?;
        self.mapper.map(&mut self.catalog, relation).await
    }

    /// Begins the group, if it has not begun, without sending its BEGIN:
    /// its batches may yet go with it (see [`one_query`]).
    fn open_group(&mut self) {
        if !self.group.open {
            self.group.open = true;
            self.group.started = Some(Instant::now());
        }
    }

    /// Begins the group, if it has not begun, and sends its BEGIN, if that
    /// is not sent yet: a statement of the group follows.
    async fn ensure_open(&mut self) -> Result<(), SinkError> {
        self.open_group();
        if !self.group.begun {
            self.send(
                Purpose::Control("BEGIN"),
                simple(&self.client, "BEGIN".into()),
            )
            .await?;
            self.group.begun = true;
        }
        Ok(())
    }

    async fn send(
        &mut self,
        purpose: Purpose,
        request: impl Future<Output = Outcome> + Send + 'static,
    ) -> Result<(), SinkError> {
        self.send_sized(purpose, 0, request).await
    }

    /// Sends a request carrying about `bytes` of values.
    async fn send_sized(
        &mut self,
        purpose: Purpose,
        bytes: usize,
        request: impl Future<Output = Outcome> + Send + 'static,
    ) -> Result<(), SinkError> {
        while self.inflight.is_full() {
            self.take_one().await?;
        }
        self.inflight.push(purpose, bytes, request).await;
        Ok(())
    }

    /// Takes the oldest result; `false` when nothing was in flight.
    async fn take_one(&mut self) -> Result<bool, SinkError> {
        let Some((purpose, outcome)) = self.inflight.next().await else {
            return Ok(false);
        };
        match outcome {
            Ok(reply) => {
                self.completed(purpose, reply);
                Ok(true)
            }
            Err(f) => Err(self.failure(purpose, f).await),
        }
    }

    async fn drain(&mut self) -> Result<(), SinkError> {
        while self.take_one().await? {}
        Ok(())
    }

    /// Takes in what a request returned.
    fn completed(&mut self, purpose: Purpose, reply: Reply) {
        let rows = match (purpose, reply) {
            (
                Purpose::Group { batches, commit },
                Reply::Group {
                    rows,
                    commit: reply,
                },
            ) => {
                for (batch, rows) in batches.into_iter().zip(rows) {
                    self.completed(batch, Reply::Rows(rows));
                }
                self.completed(Purpose::Commit(commit), *reply);
                return;
            }
            (Purpose::Commit(committed), reply) => {
                let position = committed.position;
                self.committed(*committed);
                if let Reply::Wal { written, flushed } = reply {
                    self.unflushed.push_back((written, position));
                    self.acknowledge_flushed(flushed);
                }
                return;
            }
            (Purpose::Prepare { key, .. }, Reply::Prepared(statement)) => {
                self.batch_statements.insert(key, Some(statement));
                return;
            }
            (purpose, Reply::Rows(rows)) => (purpose, rows),
            (_, Reply::Wal { .. } | Reply::Prepared(_) | Reply::Group { .. }) => return,
        };
        let (purpose, rows) = rows;
        let misses = &mut self.misses;
        let (map, missed) = match &purpose {
            Purpose::Batch {
                map,
                kind,
                rows: sent,
                ..
            } => {
                let missed = (*sent as u64).saturating_sub(rows);
                match kind {
                    BatchKind::Update { .. } => misses.updates += missed,
                    BatchKind::Delete => misses.deletes += missed,
                    BatchKind::Insert(InsertMode::OrSkip) => misses.skipped_conflicts += missed,
                    BatchKind::Insert(_) => return,
                }
                (map, missed)
            }
            Purpose::Change { map, kind, .. } if rows == 0 => {
                match kind {
                    ChangeKind::Update => misses.updates += 1,
                    ChangeKind::Delete => misses.deletes += 1,
                    ChangeKind::InsertOrSkip => misses.skipped_conflicts += 1,
                    ChangeKind::Insert => return,
                }
                (map, 1)
            }
            _ => return,
        };
        if missed > 0 {
            misses.example.get_or_insert_with(|| map.target.display());
        }
    }

    /// Commits the group with its position, if it has one.
    async fn commit(&mut self) -> Result<(), SinkError> {
        let Some(position) = self.group.position else {
            return Ok(());
        };
        // Never inside a unit: the log may yet remove its unfinished end.
        if self.txn.is_some() || self.in_snapshot {
            return Ok(());
        }
        self.finish_copy().await?;
        let batches = self.batcher.take_all();
        let one_query = self.one_query(&batches);
        if one_query.is_none() {
            self.ensure_open().await?;
            self.send_batches(batches).await?;
            // A group's COMMIT goes only once the previous one succeeded: were
            // it to fail, this group must not commit a position beyond it.
            while self.commits_in_flight > 0 {
                self.take_one().await?;
            }
        }
        let group = std::mem::take(&mut self.group);
        let committed = Committed {
            position,
            transactions: group.transactions,
            changes: group.changes,
            started: group.started,
            isolated: group.isolated,
            last_txn: group.last_txn,
            commit_times: group.commit_times,
            published: group.published_changed.then(|| self.published.clone()),
        };
        let finish = self.progress.commit_sql(position.lsn, group.commit_time);
        // Acknowledged once the target has flushed it: the same query
        // reads where the commit's WAL ends (a statement of its own was one
        // more for the target to run per commit).
        let read_wal = self.config.synchronous_commit == crate::config::SynchronousCommit::Off;
        let committed = Box::new(committed);
        match one_query {
            Some(one_query) => {
                let (purpose, request) =
                    one_query.finish(&self.client, committed, &finish, read_wal);
                self.send(purpose, request).await?;
            }
            None => {
                let request = if read_wal {
                    commit_reading_wal(&self.client, finish)
                } else {
                    Box::pin(simple(&self.client, finish))
                };
                self.send(Purpose::Commit(committed), request).await?;
            }
        }
        self.commits_in_flight += 1;
        Ok(())
    }

    /// A group's COMMIT succeeded (everything before it did too).
    fn committed(&mut self, committed: Committed) {
        self.commits_in_flight = self.commits_in_flight.saturating_sub(1);
        let position = committed.position;
        tracing::debug!(
            sink = %self.sink,
            source = %self.source.name,
            transactions = committed.transactions,
            changes = committed.changes,
            open_for = ?committed.started.map(|t| t.elapsed()),
            position = %position.lsn,
            "committed"
        );
        self.report(&committed);
        for &commit_time in &committed.commit_times {
            self.source.delays.applied(commit_time);
        }
        if let Some(published) = committed.published {
            self.state.set_published(&self.source.name, published);
        }
        if self
            .one_by_one_until
            .is_some_and(|until| position.lsn >= until)
        {
            self.one_by_one_until = None;
            self.state.set_one_by_one_until(&self.source.name, None);
        }
        if committed.isolated {
            self.state.clear_stopped(&self.source.name);
            self.isolate = None;
            tracing::info!(sink = %self.sink, source = %self.source.name, "the transaction the sink stopped on is applied; going on");
        }
        if self.config.synchronous_commit != crate::config::SynchronousCommit::Off {
            self.acknowledge(position);
        }
    }

    fn report(&mut self, committed: &Committed) {
        self.totals.transactions += committed.transactions;
        self.totals.changes += committed.changes as u64;
        let misses = std::mem::take(&mut self.misses);
        self.counters.transactions.increment(committed.transactions);
        self.counters.changes.increment(committed.changes as u64);
        self.counters.missing_updates.increment(misses.updates);
        self.counters.missing_deletes.increment(misses.deletes);
        self.counters
            .conflicts_skipped
            .increment(misses.skipped_conflicts);
        self.totals.update_missing += misses.updates;
        self.totals.delete_missing += misses.deletes;
        self.totals.skipped_conflicts += misses.skipped_conflicts;
        if misses.updates + misses.deletes > 0 {
            tracing::warn!(
                sink = %self.sink,
                source = %self.source.name,
                updates = misses.updates,
                deletes = misses.deletes,
                table = misses.example.as_deref().unwrap_or(""),
                "updates/deletes found no row on the target and were skipped, as a native subscriber does (totals: {} updates, {} deletes)",
                self.totals.update_missing,
                self.totals.delete_missing
            );
        }
        if misses.skipped_conflicts > 0 {
            tracing::warn!(
                sink = %self.sink,
                source = %self.source.name,
                skipped = misses.skipped_conflicts,
                table = misses.example.as_deref().unwrap_or(""),
                "conflicting changes skipped (on_conflict = \"skip\"; total {})",
                self.totals.skipped_conflicts
            );
        }
        if self.last_log.elapsed() >= PROGRESS_LOG {
            self.log_totals();
        }
    }

    fn log_totals(&mut self) {
        let secs = self.last_log.elapsed().as_secs_f64().max(0.001);
        tracing::info!(
            sink = %self.sink,
            source = %self.source.name,
            transactions = self.totals.transactions,
            changes = self.totals.changes,
            rows_copied = self.totals.rows_copied,
            changes_per_sec = (self.totals.changes as f64 / secs) as u64,
            update_missing = self.totals.update_missing,
            delete_missing = self.totals.delete_missing,
            skipped_conflicts = self.totals.skipped_conflicts,
            "applied"
        );
        self.totals = Totals::default();
        self.last_log = Instant::now();
    }

    async fn check_flushed(&mut self) -> Result<(), SinkError> {
        let (_, flushed) = wal_positions(&self.client)
            .await
            .map_err(failed("reading the target's WAL position"))?;
        self.acknowledge_flushed(flushed);
        Ok(())
    }

    /// Acknowledges every commit the target has flushed.
    fn acknowledge_flushed(&mut self, flushed: Lsn) {
        let mut last = None;
        while let Some(&(written, position)) = self.unflushed.front() {
            if written > flushed {
                break;
            }
            self.unflushed.pop_front();
            last = Some(position);
        }
        if let Some(position) = last {
            self.acknowledge(position);
        }
    }

    fn acknowledge(&mut self, position: LogPosition) {
        self.source.acked.send_replace(position);
        self.state.advanced(&self.source, position);
    }

    /// At the end of a run: one synchronous commit flushes the target's WAL
    /// up to it, so every earlier commit can be acknowledged.
    async fn flush_all(&mut self) -> Result<(), SinkError> {
        // With a unit left unfinished the transaction stays open, to be
        // rolled back when the connection closes.
        if self.unflushed.is_empty() || self.group.open {
            return Ok(());
        }
        self.client
            .batch_execute(
                "BEGIN; SET LOCAL synchronous_commit = local; SELECT pg_current_xact_id(); COMMIT",
            )
            .await
            .map_err(failed("flushing the target's WAL"))?;
        self.check_flushed().await
    }
}
