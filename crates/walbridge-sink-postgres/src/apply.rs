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

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_util::SinkExt;
use tokio::sync::mpsc;
use tokio_postgres::{Client, CopyInSink, Statement};
use walbridge_core::{
    Change, Datum, Lsn, Oid, OldRow, OldRowKind, PgTimestamp, Relation, Row, SnapshotBatch,
    SourceEvent, TransactionInfo, Truncate,
};
use walbridge_log::{LogPosition, Routed, SourceContext};
use walbridge_pg::describe_pg_error;

use crate::batch::{Batch, BatchKind, BatchRow, Batcher, batch_sql, bound_columns};
use crate::config::{OnConflict, PostgresSinkConfig};
use crate::copy::encode_row;
use crate::error::{SinkError, StoppedOn};
use crate::inflight::{Failed, InFlight, Outcome, Reply};
use crate::mapping::{BinaryForm, Mapper, TableMap};
use crate::progress::ProgressStore;
use crate::state::SinkState;
use crate::statement::{ColumnSet, Find, InsertMode, Param, Shape, bind_order, sql};
use crate::target::TargetCatalog;

/// COPY data is sent in chunks of about this size.
const COPY_CHUNK: usize = 256 << 10;

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
    /// A TRUNCATE of a source transaction.
    Truncate {
        txn: Arc<TransactionInfo>,
        tables: String,
    },
    /// The COMMIT of a group.
    Commit(Box<Committed>),
    /// The target's WAL positions read right after a COMMIT.
    WalPosition(LogPosition),
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
    /// BEGIN was sent.
    open: bool,
    started: Option<Instant>,
    changes: usize,
    bytes: usize,
    transactions: u64,
    /// The last unit boundary inside the group: what COMMIT records.
    position: Option<LogPosition>,
    /// Commit time of the last source transaction.
    commit_time: PgTimestamp,
    /// The group holds the transaction the sink stopped on, alone.
    isolated: bool,
    /// The last source transaction in the group.
    last_txn: Option<Arc<TransactionInfo>>,
}

/// Snapshot rows being copied into one table.
struct CopyIn {
    table: Oid,
    display: String,
    sink: std::pin::Pin<Box<CopyInSink<Bytes>>>,
    buffer: BytesMut,
    rows: u64,
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

fn failed(what: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> SinkError {
    let what = what.into();
    move |source| SinkError::Target { what, source }
}

/// A transient failure of the target (connection, deadlock, shutdown,
/// resources): retrying the same transaction later may well succeed.
fn transient(code: Option<&str>) -> bool {
    match code {
        None => true,
        Some(c) => matches!(
            &c[..2.min(c.len())],
            "08" | "40" | "53" | "55" | "57" | "58"
        ),
    }
}

/// The columns of `row` that are not unchanged TOAST values, or `None` for all.
fn present_columns(row: &Row) -> ColumnSet {
    row.contains(&Datum::UnchangedToast).then(|| {
        row.iter()
            .enumerate()
            .filter(|(_, d)| **d != Datum::UnchangedToast)
            .map(|(i, _)| i as u16)
            .collect()
    })
}

fn null_columns(row: &Row) -> ColumnSet {
    row.contains(&Datum::Null).then(|| {
        row.iter()
            .enumerate()
            .filter(|(_, d)| **d == Datum::Null)
            .map(|(i, _)| i as u16)
            .collect()
    })
}

/// The target's WAL write (insert) and flush positions.
async fn wal_positions(client: &Client) -> Result<(Lsn, Lsn), tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT pg_current_wal_insert_lsn()::text, pg_current_wal_flush_lsn()::text",
            &[],
        )
        .await?;
    let parse = |i: usize| row.get::<_, String>(i).parse::<Lsn>().unwrap_or(Lsn::ZERO);
    Ok((parse(0), parse(1)))
}

/// True when every value is text or NULL (batches carry text only).
fn all_text(row: &Row) -> bool {
    row.iter()
        .all(|d| matches!(d, Datum::Text(_) | Datum::Null))
}

/// The identity values of `row`.
fn key_of(map: &TableMap, row: &Row) -> Vec<Bytes> {
    map.identity
        .iter()
        .map(|&i| match row.get(i) {
            Some(Datum::Text(b) | Datum::Binary(b)) => b.clone(),
            _ => Bytes::new(),
        })
        .collect()
}

/// An array's binary form with its element type OID (bytes 8..12 of the
/// header: dimensions, flags, element type) replaced.
fn with_element_type(array: &Bytes, element: Oid) -> Bytes {
    if array.len() < 12 {
        return array.clone();
    }
    let mut patched = BytesMut::from(&array[..]);
    patched[8..12].copy_from_slice(&element.to_be_bytes());
    patched.freeze()
}

fn row_bytes(row: &Row) -> usize {
    row.iter().map(|d| d.len() + 8).sum()
}

/// Applies one source into the target.
pub struct Applier {
    sink: String,
    source: Arc<SourceContext>,
    config: Arc<PostgresSinkConfig>,
    client: Arc<Client>,
    catalog: TargetCatalog,
    mapper: Mapper,
    statements: HashMap<(usize, Shape), Prepared>,
    batch_statements: HashMap<(usize, BatchKind), Statement>,
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
    copied: HashSet<Oid>,
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
    last_log: Instant,
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
    /// The sink's shared state.
    pub state: Arc<SinkState>,
}

impl Applier {
    /// An applier over connected parts.
    pub fn new(parts: ApplierParts) -> Result<Self, SinkError> {
        let mapper = Mapper::new(&parts.config, &parts.source.name).map_err(SinkError::Mapping)?;
        let isolate = parts.state.stopped_on(&parts.source.name);
        let one_by_one_until = parts.state.one_by_one_until(&parts.source.name);
        Ok(Applier {
            inflight: InFlight::new(parts.config.pipeline_depth),
            sink: parts.sink,
            source: parts.source,
            config: parts.config,
            client: Arc::new(parts.client),
            catalog: parts.catalog,
            mapper,
            statements: HashMap::new(),
            batch_statements: HashMap::new(),
            batcher: Batcher::default(),
            one_by_one_until,
            progress: parts.progress,
            state: parts.state,
            group: Group::default(),
            txn: None,
            copy: None,
            copied: HashSet::new(),
            in_snapshot: false,
            isolate,
            unflushed: VecDeque::new(),
            commits_in_flight: 0,
            misses: Misses::default(),
            totals: Totals::default(),
            last_log: Instant::now(),
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
                    // Nothing more right now: commit what is applied and take the results.
                    self.commit().await?;
                    self.drain().await?;
                    let next = loop {
                        tokio::select! {
                            next = input.recv() => break next,
                            _ = tokio::time::sleep(FLUSH_POLL), if !self.unflushed.is_empty() => {
                                self.check_flushed().await?;
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
            SourceEvent::Snapshot(batch) => {
                self.in_snapshot = true;
                self.snapshot_rows(batch).await
            }
            SourceEvent::SnapshotComplete { .. } => {
                self.in_snapshot = false;
                self.finish_copy().await
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
                Ok(())
            }
            SourceEvent::Change(change) => self.change(change).await,
            SourceEvent::Commit(info) => {
                self.txn = None;
                self.group.transactions += 1;
                self.group.commit_time = info.commit_time;
                self.group.last_txn = Some(info);
                Ok(())
            }
            // Logical decoding messages have no place in tables (a native
            // subscriber ignores them too).
            SourceEvent::Message(_) => Ok(()),
        }
    }

    async fn map(&mut self, relation: &Arc<Relation>) -> Result<Arc<TableMap>, SinkError> {
        self.mapper.map(&mut self.catalog, relation).await
    }

    async fn change(&mut self, change: Change) -> Result<(), SinkError> {
        let Some(txn) = self.txn.clone() else {
            return Err(SinkError::Mapping(
                "the log delivered a change outside a transaction".into(),
            ));
        };
        match change {
            Change::Insert { relation, new, .. } => {
                let map = self.map(&relation).await?;
                let (kind, mode) = match self.config.on_conflict {
                    OnConflict::Error => (ChangeKind::Insert, InsertMode::Plain),
                    OnConflict::Skip => (ChangeKind::InsertOrSkip, InsertMode::OrSkip),
                    OnConflict::Upsert => (ChangeKind::Insert, InsertMode::Upsert),
                };
                self.group.bytes += row_bytes(&new);
                if self.batchable(&map, &txn) && all_text(&new) {
                    let key = (!map.full_identity && !map.identity.is_empty())
                        .then(|| key_of(&map, &new));
                    return self
                        .batch(&map, BatchKind::Insert(mode), key, &new, txn, false)
                        .await;
                }
                self.execute(&txn, &map, Shape::Insert(mode), kind, &new, None)
                    .await
            }
            Change::Update {
                relation, old, new, ..
            } => {
                let map = self.map(&relation).await?;
                self.group.bytes += row_bytes(&new);
                let set = present_columns(&new);
                let kind = BatchKind::Update { set: set.clone() };
                if old.is_none()
                    && self.batchable(&map, &txn)
                    && !map.full_identity
                    && !map.identity.is_empty()
                    && all_text(&new)
                    && bound_columns(&map, &kind).len() > map.identity.len()
                {
                    // Nothing observes the row in between: a later update replaces an earlier one.
                    let key = key_of(&map, &new);
                    return self.batch(&map, kind, Some(key), &new, txn, true).await;
                }
                let (find, old) = self.find(&map, old.as_ref(), &new)?;
                self.execute(
                    &txn,
                    &map,
                    Shape::Update { set, find },
                    ChangeKind::Update,
                    &new,
                    Some(old),
                )
                .await
            }
            Change::Delete { relation, old, .. } => {
                let map = self.map(&relation).await?;
                self.group.bytes += row_bytes(&old.row);
                if self.batchable(&map, &txn)
                    && !map.full_identity
                    && !map.identity.is_empty()
                    && map
                        .identity
                        .iter()
                        .all(|&i| matches!(old.row.get(i), Some(Datum::Text(_))))
                {
                    let key = key_of(&map, &old.row);
                    return self
                        .batch(&map, BatchKind::Delete, Some(key), &old.row, txn, false)
                        .await;
                }
                let (find, old) = self.find(&map, Some(&old), &old.row)?;
                self.execute(
                    &txn,
                    &map,
                    Shape::Delete { find },
                    ChangeKind::Delete,
                    old,
                    Some(old),
                )
                .await
            }
            Change::Truncate(truncate) => {
                self.send_batches_all().await?;
                self.truncate(&txn, truncate).await
            }
            Change::Message(_) => Ok(()),
        }
    }

    /// Whether a change of `map` in `txn` may join a batch: not when
    /// triggers fire on the table, nor while finding or applying alone the
    /// transaction the sink stopped on.
    fn batchable(&self, map: &TableMap, txn: &TransactionInfo) -> bool {
        !map.target.has_apply_triggers
            && !self.group.isolated
            && self
                .one_by_one_until
                .is_none_or(|until| txn.end_lsn > until)
    }

    /// Adds a row to its table's batches, sending them when full.
    async fn batch(
        &mut self,
        map: &Arc<TableMap>,
        kind: BatchKind,
        key: Option<Vec<Bytes>>,
        row: &Row,
        txn: Arc<TransactionInfo>,
        replace: bool,
    ) -> Result<(), SinkError> {
        self.ensure_open().await?;
        self.group.changes += 1;
        let values = bound_columns(map, &kind)
            .into_iter()
            .map(|i| row.get(i).cloned().unwrap_or(Datum::Null))
            .collect();
        let row = BatchRow { key, values, txn };
        if let Some(full) = self.batcher.add(map, kind, row, replace) {
            self.send_batches(full).await?;
        }
        Ok(())
    }

    async fn send_batches_all(&mut self) -> Result<(), SinkError> {
        let batches = self.batcher.take_all();
        self.send_batches(batches).await
    }

    async fn send_batches(&mut self, batches: Vec<Batch>) -> Result<(), SinkError> {
        for batch in batches {
            if batch.is_empty() {
                continue;
            }
            let statement = self.batch_statement(&batch.map, &batch.kind).await?;
            let params: Vec<Param> = batch.arrays().into_iter().map(Param).collect();
            let bytes = params.iter().map(|p| p.0.len()).sum();
            let purpose = Purpose::Batch {
                rows: batch.len(),
                last_txn: batch.last_txn.clone(),
                map: batch.map,
                kind: batch.kind,
            };
            let client = self.client.clone();
            let request = async move {
                match client.execute_raw(&statement, params.iter()).await {
                    Ok(rows) => Ok(Reply::Rows(rows)),
                    Err(error) => Err(Failed { error, params }),
                }
            };
            self.send_sized(purpose, bytes, request).await?;
        }
        Ok(())
    }

    async fn batch_statement(
        &mut self,
        map: &Arc<TableMap>,
        kind: &BatchKind,
    ) -> Result<Statement, SinkError> {
        let key = (map.id, kind.clone());
        if let Some(s) = self.batch_statements.get(&key) {
            return Ok(s.clone());
        }
        let text = batch_sql(map, kind);
        match self.client.prepare(&text).await {
            Ok(statement) => {
                self.batch_statements.insert(key, statement.clone());
                Ok(statement)
            }
            Err(e) => {
                self.drain().await?;
                Err(SinkError::Target {
                    what: format!(
                        "preparing `{text}` for target table {}",
                        map.target.display()
                    ),
                    source: e,
                })
            }
        }
    }

    /// How to find the changed row, and the row holding the values to find it by.
    fn find<'a>(
        &self,
        map: &TableMap,
        old: Option<&'a OldRow>,
        new: &'a Row,
    ) -> Result<(Find, &'a Row), SinkError> {
        if map.full_identity {
            let old = old.filter(|o| o.kind == OldRowKind::Full).ok_or_else(|| {
                SinkError::Mapping(format!(
                    "source table {} has REPLICA IDENTITY FULL but a change came without its old row",
                    map.source_table
                ))
            })?;
            let find = Find::Full {
                present: present_columns(&old.row),
                nulls: null_columns(&old.row),
            };
            return Ok((find, &old.row));
        }
        // The old key when it changed (or came whole), else the new row's key.
        Ok((Find::Key, old.map_or(new, |o| &o.row)))
    }

    async fn prepared(&mut self, map: &Arc<TableMap>, shape: Shape) -> Result<Prepared, SinkError> {
        let key = (map.id, shape);
        if let Some(p) = self.statements.get(&key) {
            return Ok(p.clone());
        }
        let text = sql(map, &key.1);
        let statement = match self.client.prepare(&text).await {
            Ok(s) => s,
            Err(e) => {
                // An earlier statement may have aborted the transaction: report that one.
                self.drain().await?;
                return Err(SinkError::Target {
                    what: format!(
                        "preparing `{text}` for target table {}",
                        map.target.display()
                    ),
                    source: e,
                });
            }
        };
        let prepared = Prepared {
            statement,
            binds: bind_order(map, &key.1).into(),
        };
        self.statements.insert(key, prepared.clone());
        Ok(prepared)
    }

    async fn ensure_open(&mut self) -> Result<(), SinkError> {
        if !self.group.open {
            self.send(
                Purpose::Control("BEGIN"),
                simple(&self.client, "BEGIN".into()),
            )
            .await?;
            self.group.open = true;
            self.group.started = Some(Instant::now());
        }
        Ok(())
    }

    async fn execute(
        &mut self,
        txn: &Arc<TransactionInfo>,
        map: &Arc<TableMap>,
        shape: Shape,
        kind: ChangeKind,
        new: &Row,
        old: Option<&Row>,
    ) -> Result<(), SinkError> {
        self.ensure_open().await?;
        // Order within the table (and with triggers) must hold: what waits goes first.
        self.send_batches_all().await?;
        let prepared = self.prepared(map, shape).await?;
        let mut params = Vec::with_capacity(prepared.binds.len());
        for &(from_old, i) in prepared.binds.iter() {
            let row = if from_old { old.unwrap_or(new) } else { new };
            let mut datum = row.get(i).cloned().unwrap_or(Datum::Null);
            if let Datum::Binary(bytes) = &datum {
                let column = &map.columns[i];
                match column.binary {
                    BinaryForm::AsIs => {}
                    BinaryForm::ArrayOf(element) => {
                        datum = Datum::Binary(with_element_type(bytes, element));
                    }
                    BinaryForm::Refused => {
                        return Err(SinkError::BinaryMismatch {
                            table: map.target.display(),
                            column: column.quoted.trim_matches('"').to_owned(),
                            source_type: column.source_type.clone(),
                            target_type: column.target_type.clone(),
                        });
                    }
                }
            }
            params.push(Param(datum));
        }
        self.group.changes += 1;
        let bytes = params.iter().map(|p| p.0.len()).sum();
        let purpose = Purpose::Change {
            txn: txn.clone(),
            map: map.clone(),
            kind,
            binds: prepared.binds.clone(),
        };
        let client = self.client.clone();
        let statement = prepared.statement;
        let request = async move {
            match client.execute_raw(&statement, params.iter()).await {
                Ok(rows) => Ok(Reply::Rows(rows)),
                Err(error) => Err(Failed { error, params }),
            }
        };
        if self.group.isolated && self.config.on_conflict == OnConflict::Skip {
            return self.execute_or_skip(purpose, request).await;
        }
        self.send_sized(purpose, bytes, request).await
    }

    /// Runs one change of the transaction being applied alone under a
    /// savepoint: a conflict rolls back just that change, which is skipped.
    async fn execute_or_skip(
        &mut self,
        purpose: Purpose,
        request: impl Future<Output = Outcome> + Send + 'static,
    ) -> Result<(), SinkError> {
        self.drain().await?;
        let client = self.client.clone();
        let savepoint = |sql: &'static str| {
            let client = client.clone();
            async move { client.batch_execute(sql).await.map_err(failed(sql)) }
        };
        savepoint("SAVEPOINT walbridge_change").await?;
        match request.await {
            Ok(reply) => {
                self.completed(purpose, reply);
                savepoint("RELEASE SAVEPOINT walbridge_change").await
            }
            Err(f) if f.error.code().is_some_and(|c| c.code().starts_with("23")) => {
                savepoint("ROLLBACK TO SAVEPOINT walbridge_change").await?;
                if let Purpose::Change { map, .. } = &purpose {
                    tracing::warn!(sink = %self.sink, source = %self.source.name, table = %map.target.display(), "skipped a conflicting change (on_conflict = \"skip\"): {}", describe_pg_error(&f.error));
                    self.misses
                        .example
                        .get_or_insert_with(|| map.target.display());
                }
                self.misses.skipped_conflicts += 1;
                Ok(())
            }
            Err(f) => Err(self.failure(purpose, f).await),
        }
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
            (Purpose::Commit(committed), _) => return self.committed(*committed),
            (Purpose::WalPosition(position), Reply::Wal { written, flushed }) => {
                self.unflushed.push_back((written, position));
                return self.acknowledge_flushed(flushed);
            }
            (purpose, Reply::Rows(rows)) => (purpose, rows),
            (_, Reply::Wal { .. }) => return,
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

    /// Records (durably) that the sink stops on `txn` because of `error`.
    fn stop_on(&self, txn: &TransactionInfo, error: String) -> Box<StoppedOn> {
        let stopped = Box::new(StoppedOn {
            source: self.source.name.clone(),
            xid: txn.xid,
            commit_lsn: txn.commit_lsn,
            end_lsn: txn.end_lsn,
            error,
        });
        self.state.set_stopped(&stopped);
        stopped
    }

    /// Turns a failed statement into the sink's error, recording the
    /// source transaction it stopped on when the data is the cause.
    async fn failure(&mut self, purpose: Purpose, failed: Failed) -> SinkError {
        let code = failed.error.code().map(|c| c.code().to_owned());
        let (txn, table) = match &purpose {
            Purpose::Control(what) => {
                return SinkError::Target {
                    what: (*what).to_owned(),
                    source: failed.error,
                };
            }
            Purpose::Commit(committed) => {
                let deferred = code.as_deref().is_some_and(|c| c.starts_with("23"));
                match &committed.last_txn {
                    // A deferred constraint failed at the end of one transaction: that one.
                    Some(txn) if deferred && committed.transactions == 1 => {
                        (txn.clone(), "the deferred constraints".to_owned())
                    }
                    Some(txn) if deferred => {
                        self.state
                            .set_one_by_one_until(&self.source.name, Some(txn.end_lsn));
                        return SinkError::Batch {
                            table: "the deferred constraints".to_owned(),
                            rows: committed.changes,
                            message: describe_pg_error(&failed.error),
                        };
                    }
                    _ => {
                        return SinkError::Target {
                            what: "committing".to_owned(),
                            source: failed.error,
                        };
                    }
                }
            }
            Purpose::WalPosition(_) => {
                return SinkError::Target {
                    what: "reading the target's WAL position".to_owned(),
                    source: failed.error,
                };
            }
            Purpose::Change { txn, map, .. } => (txn.clone(), map.target.display()),
            Purpose::Truncate { txn, tables } => (txn.clone(), tables.clone()),
            Purpose::Batch {
                map,
                rows,
                last_txn,
                ..
            } => {
                if transient(code.as_deref()) {
                    return SinkError::Target {
                        what: format!("applying {rows} changes to {}", map.target.display()),
                        source: failed.error,
                    };
                }
                self.state
                    .set_one_by_one_until(&self.source.name, Some(last_txn.end_lsn));
                return SinkError::Batch {
                    table: map.target.display(),
                    rows: *rows,
                    message: describe_pg_error(&failed.error),
                };
            }
        };
        if transient(code.as_deref()) {
            return SinkError::Target {
                what: format!(
                    "applying transaction {} of source `{}` to {table}",
                    txn.xid, self.source.name
                ),
                source: failed.error,
            };
        }
        let stopped = self.stop_on(&txn, describe_pg_error(&failed.error));
        let db = failed.error.as_db_error();
        let message = db.map_or_else(|| failed.error.to_string(), |d| d.message().to_owned());
        let class = code.as_deref().map_or("", |c| &c[..2.min(c.len())]);
        match purpose {
            Purpose::Truncate { tables, .. } => SinkError::Truncate {
                sink: self.sink.clone(),
                tables,
                message: describe_pg_error(&failed.error),
                stopped,
            },
            Purpose::Change { .. } if class == "23" => SinkError::Conflict {
                sink: self.sink.clone(),
                table,
                message,
                key: db
                    .and_then(|d| d.detail())
                    .map(|d| format!(" ({})", d.trim_end_matches('.')))
                    .unwrap_or_default(),
                stopped,
            },
            Purpose::Change { map, binds, .. }
                if class == "22" || code.as_deref() == Some("42804") =>
            {
                let message = self.diagnose(&map, &binds, &failed).await;
                SinkError::Value {
                    sink: self.sink.clone(),
                    message,
                    stopped,
                }
            }
            Purpose::Change { .. }
            | Purpose::Control(_)
            | Purpose::Commit(_)
            | Purpose::WalPosition(_)
            | Purpose::Batch { .. } => SinkError::Apply {
                table,
                message: describe_pg_error(&failed.error),
                stopped,
            },
        }
    }

    /// Finds the column whose value the target type cannot hold, by
    /// assigning each value to a column of the same type in a temporary
    /// table on the lookup connection (assignment, unlike an explicit cast,
    /// refuses what does not fit instead of truncating it).
    async fn diagnose(
        &mut self,
        map: &TableMap,
        binds: &[(bool, usize)],
        failed: &Failed,
    ) -> String {
        let client = self.catalog.client();
        for (&(_, i), param) in binds.iter().zip(&failed.params) {
            let column = &map.columns[i];
            let probe = async {
                client
                    .batch_execute(&format!(
                        "BEGIN; CREATE TEMP TABLE walbridge_probe (v {}) ON COMMIT DROP",
                        column.target_type
                    ))
                    .await?;
                client
                    .execute("INSERT INTO walbridge_probe VALUES ($1)", &[param])
                    .await
            };
            let result = probe.await;
            let _ = client.batch_execute("ROLLBACK").await;
            if let Err(e) = result
                && e.code().is_some_and(|c| c.code().starts_with("22"))
            {
                return format!(
                    "column {} of target table {} is {} (the publisher's is {}): {}",
                    column.quoted,
                    map.target.display(),
                    column.target_type,
                    column.source_type,
                    describe_pg_error(&e)
                );
            }
        }
        format!(
            "target table {}: {}",
            map.target.display(),
            describe_pg_error(&failed.error)
        )
    }

    async fn truncate(
        &mut self,
        txn: &Arc<TransactionInfo>,
        truncate: Truncate,
    ) -> Result<(), SinkError> {
        self.ensure_open().await?;
        let mut tables: Vec<String> = Vec::new();
        let mut deletes = Vec::new();
        let mut names = Vec::new();
        for relation in &truncate.relations {
            let map = self.map(relation).await?;
            if map.routed_partition {
                let stopped =
                    self.stop_on(txn, format!("TRUNCATE of partition {}", map.source_table));
                return Err(SinkError::TruncatePartition {
                    sink: self.sink.clone(),
                    partition: map.source_table.clone(),
                    table: map.target.display(),
                    stopped,
                });
            }
            names.push(map.target.display());
            match &map.source_tag {
                // The table holds other sources' rows too: remove only this source's.
                Some((column, value)) => deletes.push(format!(
                    "DELETE FROM {} WHERE {column} = {value}",
                    map.quoted()
                )),
                None if !tables.contains(&map.quoted()) => tables.push(map.quoted()),
                None => {}
            }
        }
        let mut statements = deletes;
        if !tables.is_empty() {
            // RESTRICT, as a native subscriber: never reach tables outside the set.
            statements.insert(
                0,
                format!(
                    "TRUNCATE {}{}",
                    tables.join(", "),
                    if truncate.options.restart_identity {
                        " RESTART IDENTITY"
                    } else {
                        ""
                    }
                ),
            );
        }
        self.group.changes += 1;
        let purpose = Purpose::Truncate {
            txn: txn.clone(),
            tables: names.join(", "),
        };
        self.send(purpose, simple(&self.client, statements.join("; ")))
            .await
    }

    async fn snapshot_rows(&mut self, batch: SnapshotBatch) -> Result<(), SinkError> {
        let map = self.map(&batch.relation).await?;
        if self.copy.as_ref().map(|c| c.table) != Some(map.target.oid) {
            self.finish_copy().await?;
            self.ensure_open().await?;
            self.drain().await?;
            if self.copied.insert(map.target.oid) {
                self.prepare_copy_target(&map).await?;
            }
            self.start_copy(&map).await?;
        }
        let extra = self
            .config
            .source_column
            .is_some()
            .then_some(self.source.name.as_str());
        let Some(copy) = self.copy.as_mut() else {
            return Ok(());
        };
        for row in &batch.rows {
            encode_row(&mut copy.buffer, row, extra).map_err(|e| {
                SinkError::Mapping(format!("snapshot of {}: {e}", map.source_table))
            })?;
        }
        copy.rows += batch.rows.len() as u64;
        self.group.changes += batch.rows.len();
        if copy.buffer.len() >= COPY_CHUNK {
            let chunk = copy.buffer.split().freeze();
            copy.sink
                .send(chunk)
                .await
                .map_err(failed(format!("copying rows into {}", copy.display)))?;
        }
        Ok(())
    }

    /// Before the first rows of the initial copy go into a table: it must
    /// be empty (of this source's rows), or be emptied when configured.
    async fn prepare_copy_target(&mut self, map: &TableMap) -> Result<(), SinkError> {
        let filter = map
            .source_tag
            .as_ref()
            .map(|(c, v)| format!(" WHERE {c} = {v}"))
            .unwrap_or_default();
        let table = map.quoted();
        let has_rows: bool = self
            .client
            .query_one(
                &format!("SELECT EXISTS (SELECT 1 FROM {table}{filter})"),
                &[],
            )
            .await
            .map_err(failed(format!(
                "checking that {} is empty",
                map.target.display()
            )))?
            .get(0);
        if !has_rows {
            return Ok(());
        }
        if !self.config.truncate_before_copy {
            return Err(SinkError::TargetNotEmpty {
                table: map.target.display(),
                scope: match &map.source_tag {
                    Some(_) => format!(" of source `{}`", self.source.name),
                    None => String::new(),
                },
                source_table: map.source_table.clone(),
            });
        }
        let empty = match &map.source_tag {
            Some(_) => format!("DELETE FROM {table}{filter}"),
            None => format!("TRUNCATE {table}"),
        };
        tracing::info!(sink = %self.sink, table = %map.target.display(), "emptying the target table before the initial copy (truncate_before_copy)");
        self.client
            .batch_execute(&empty)
            .await
            .map_err(failed(format!("emptying {}", map.target.display())))
    }

    async fn start_copy(&mut self, map: &TableMap) -> Result<(), SinkError> {
        let mut columns: Vec<&str> = map.columns.iter().map(|c| c.quoted.as_str()).collect();
        if let Some((column, _)) = &map.source_tag {
            columns.push(column);
        }
        let statement = format!("COPY {} ({}) FROM STDIN", map.quoted(), columns.join(", "));
        let sink = self
            .client
            .copy_in::<_, Bytes>(statement.as_str())
            .await
            .map_err(failed(format!(
                "starting to copy rows into {}",
                map.target.display()
            )))?;
        self.copy = Some(CopyIn {
            table: map.target.oid,
            display: map.target.display(),
            sink: Box::pin(sink),
            buffer: BytesMut::with_capacity(COPY_CHUNK * 2),
            rows: 0,
        });
        Ok(())
    }

    async fn finish_copy(&mut self) -> Result<(), SinkError> {
        let Some(mut copy) = self.copy.take() else {
            return Ok(());
        };
        let what = || format!("copying rows into {}", copy.display);
        if !copy.buffer.is_empty() {
            let chunk = copy.buffer.split().freeze();
            copy.sink.send(chunk).await.map_err(failed(what()))?;
        }
        let rows = copy.sink.as_mut().finish().await.map_err(failed(what()))?;
        self.totals.rows_copied += rows;
        tracing::info!(sink = %self.sink, source = %self.source.name, table = %copy.display, rows, "copied snapshot rows");
        Ok(())
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
        self.ensure_open().await?;
        self.send_batches_all().await?;
        // A group's COMMIT goes only once the previous one succeeded: were
        // it to fail, this group must not commit a position beyond it.
        while self.commits_in_flight > 0 {
            self.take_one().await?;
        }
        let group = std::mem::take(&mut self.group);
        let committed = Committed {
            position,
            transactions: group.transactions,
            changes: group.changes,
            started: group.started,
            isolated: group.isolated,
            last_txn: group.last_txn,
        };
        let record = self.progress.record_sql(position.lsn, group.commit_time);
        // One message: PostgreSQL records the session's origin position in
        // an abort record too, so once the position is set nothing may fail
        // or wait before COMMIT (walbridge dying in between would abort the
        // transaction and still move the origin past its changes). Deferred
        // constraints are checked first, while an error still rolls back
        // without touching the position; an earlier error in the group
        // makes every statement here fail the same way.
        let xid = if self.progress.needs_xid() {
            // The commit record carries the position only if there is one.
            "SELECT pg_current_xact_id(); "
        } else {
            ""
        };
        let finish = format!("SET CONSTRAINTS ALL IMMEDIATE; {xid}{record}; COMMIT");
        self.send(
            Purpose::Commit(Box::new(committed)),
            simple(&self.client, finish),
        )
        .await?;
        self.commits_in_flight += 1;
        if self.config.synchronous_commit == crate::config::SynchronousCommit::Off {
            let client = self.client.clone();
            let request = async move {
                match wal_positions(&client).await {
                    Ok((written, flushed)) => Ok(Reply::Wal { written, flushed }),
                    Err(error) => Err(Failed {
                        error,
                        params: Vec::new(),
                    }),
                }
            };
            self.send(Purpose::WalPosition(position), request).await?;
        }
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
