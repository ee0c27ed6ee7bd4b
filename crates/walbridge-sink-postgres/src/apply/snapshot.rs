//! The initial copy into the target with `COPY`.
//!
//! Snapshot rows arrive as the publisher's COPY text (see
//! [`walbridge_core::copy_text`]) and go to the target as they are; the
//! `COPY` statement names the target's columns in the source's order. Only
//! `source_column` adds a field to every line.
//!
//! # Copy lanes
//!
//! One COPY goes at the speed of one target backend, and on the target
//! that is nearly the whole cost of an initial copy. With
//! `copy_connections` above 1 the copy's records are dealt round-robin, by
//! their index in the log's initial-copy unit (fixed once written), to that
//! many lanes: connections with a transaction each, COPYing their records
//! as they arrive. No lane commits before the whole copy is in the log;
//! then every lane commits with a marker of its own — an origin, or a row
//! of the progress table — set to the copy's consistent point, and after
//! them the apply connection commits the source's position. A run that
//! stops in between finds the markers of the lanes that committed, skips
//! their records and copies the others again, so the target ends with
//! every row exactly once. A target table is checked for rows (and
//! emptied, with `truncate_before_copy`) on the apply connection before a
//! lane writes into it — and not at all once a lane has committed.

use std::pin::Pin;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::SinkExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_postgres::{Client, CopyInSink};
use walbridge_core::{Lsn, Oid, PgTimestamp, SnapshotBatch, copy_text::escape_field};

use super::{Applier, failed};
use crate::config::PostgresSinkConfig;
use crate::connect::{connect_for_apply, params};
use crate::error::SinkError;
use crate::mapping::TableMap;
use crate::progress::ProgressStore;

/// Snapshot rows being copied into one table.
pub(super) struct CopyIn {
    table: Oid,
    display: String,
    sink: Pin<Box<CopyInSink<Bytes>>>,
}

impl CopyIn {
    async fn start(client: &Client, map: &TableMap) -> Result<Self, SinkError> {
        let mut columns: Vec<&str> = map.columns.iter().map(|c| c.quoted.as_str()).collect();
        if let Some((column, _)) = &map.source_tag {
            columns.push(column);
        }
        let statement = format!("COPY {} ({}) FROM STDIN", map.quoted(), columns.join(", "));
        let sink = client
            .copy_in::<_, Bytes>(statement.as_str())
            .await
            .map_err(failed(format!(
                "starting to copy rows into {}",
                map.target.display()
            )))?;
        Ok(CopyIn {
            table: map.target.oid,
            display: map.target.display(),
            sink: Box::pin(sink),
        })
    }

    async fn send(&mut self, text: Bytes) -> Result<(), SinkError> {
        self.sink
            .send(text)
            .await
            .map_err(failed(format!("copying rows into {}", self.display)))
    }

    /// Ends the COPY; returns the rows it copied.
    async fn finish(mut self) -> Result<u64, SinkError> {
        self.sink
            .as_mut()
            .finish()
            .await
            .map_err(failed(format!("copying rows into {}", self.display)))
    }
}

/// Records queued for each copy lane.
const LANE_QUEUE: usize = 4;

/// What a copy lane is told to do.
enum LaneWork {
    /// COPY these rows into the table.
    Rows(Arc<TableMap>, Bytes),
    /// The whole copy is in the log: commit. A lane whose queue closes
    /// without this rolls back.
    Commit,
}

/// One connection of the initial copy, with a transaction of its own, run
/// by a task of its own so that a busy lane never holds up the others.
struct Lane {
    queue: mpsc::Sender<LaneWork>,
    task: JoinHandle<Result<(Client, ProgressStore, u64), SinkError>>,
}

impl Lane {
    async fn open(
        index: usize,
        count: usize,
        consistent_point: Lsn,
        config: &PostgresSinkConfig,
        progress: &ProgressStore,
    ) -> Result<Lane, SinkError> {
        let client = connect_for_apply(config, &params(config)?).await?;
        let store = progress.open_copy_lane(&client, index, count).await?;
        store.bind_session(&client).await?;
        client
            .batch_execute("BEGIN")
            .await
            .map_err(failed(format!("starting copy lane {index}")))?;
        let (queue, records) = mpsc::channel(LANE_QUEUE);
        let task = tokio::spawn(run_lane(client, store, index, consistent_point, records));
        Ok(Lane { queue, task })
    }

    /// Tells the lane to commit and waits for it.
    async fn commit(self) -> Result<(Client, ProgressStore, u64), SinkError> {
        // A failed lane has ended: its error comes from the task.
        let _ = self.queue.send(LaneWork::Commit).await;
        self.join().await
    }

    /// Waits for the lane's task to end.
    async fn join(mut self) -> Result<(Client, ProgressStore, u64), SinkError> {
        (&mut self.task)
            .await
            .unwrap_or_else(|e| Err(SinkError::Mapping(format!("a copy lane panicked: {e}"))))
    }
}

impl Drop for Lane {
    /// A lane dropped before it committed (the applier failed, or the
    /// copy stopped short) ends at once: its connection closes and its
    /// transaction rolls back, rather than lingering in a COPY and holding
    /// its origin against the next run.
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// COPYs every record the lane is given, in order, and commits with the
/// lane's marker when told to. Returns the rows copied.
async fn run_lane(
    client: Client,
    store: ProgressStore,
    index: usize,
    consistent_point: Lsn,
    mut work: mpsc::Receiver<LaneWork>,
) -> Result<(Client, ProgressStore, u64), SinkError> {
    let mut copy: Option<CopyIn> = None;
    let mut rows = 0;
    loop {
        let (map, text) = match work.recv().await {
            Some(LaneWork::Rows(map, text)) => (map, text),
            Some(LaneWork::Commit) => break,
            // The applier stopped (and the task was not aborted yet): the
            // connection closes, the transaction rolls back.
            None => {
                return Err(SinkError::Mapping(format!(
                    "copy lane {index} stopped before the copy was complete"
                )));
            }
        };
        if copy.as_ref().map(|c| c.table) != Some(map.target.oid) {
            if let Some(done) = copy.take() {
                rows += done.finish().await?;
            }
            copy = Some(CopyIn::start(&client, &map).await?);
        }
        if let Some(copy) = copy.as_mut() {
            copy.send(text).await?;
        }
    }
    if let Some(done) = copy {
        rows += done.finish().await?;
    }
    client
        .batch_execute(&store.commit_sql(consistent_point, PgTimestamp::now()))
        .await
        .map_err(failed(format!("committing copy lane {index}")))?;
    Ok((client, store, rows))
}

/// The initial copy over several connections.
pub(super) struct Lanes {
    consistent_point: Lsn,
    /// Per lane: connected at its first record.
    lanes: Vec<Option<Lane>>,
    /// Per lane: a previous run committed it.
    done: Vec<bool>,
    /// The index of the next record of the copy.
    next: usize,
}

impl Lanes {
    /// The lane of the next record, `None` if its rows are in the target already.
    fn deal(&mut self) -> Option<usize> {
        let lane = self.next % self.lanes.len();
        self.next += 1;
        (!self.done[lane]).then_some(lane)
    }

    fn resumed(&self) -> bool {
        self.done.iter().any(|&d| d)
    }

    /// Queues `text` for lane `index`, connecting it first if need be.
    async fn send(
        &mut self,
        index: usize,
        map: Arc<TableMap>,
        text: Bytes,
        config: &PostgresSinkConfig,
        progress: &ProgressStore,
    ) -> Result<(), SinkError> {
        let count = self.lanes.len();
        let slot = &mut self.lanes[index];
        let lane = match slot {
            Some(lane) => lane,
            None => slot
                .insert(Lane::open(index, count, self.consistent_point, config, progress).await?),
        };
        if lane.queue.send(LaneWork::Rows(map, text)).await.is_ok() {
            return Ok(());
        }
        // The lane's task ended without being told to commit: it failed.
        let ended = match slot.take() {
            Some(lane) => lane.join().await.err(),
            None => None,
        };
        Err(ended.unwrap_or_else(|| {
            SinkError::Mapping(format!(
                "copy lane {index} ended before the copy was complete"
            ))
        }))
    }

    /// Commits every lane (each once its queue is copied); returns the
    /// connections with their markers and the rows copied.
    async fn commit(self) -> Result<(Vec<(Client, ProgressStore)>, u64), SinkError> {
        let mut lanes = Vec::new();
        let mut rows = 0;
        for lane in self.lanes.into_iter().flatten() {
            let (client, store, copied) = lane.commit().await?;
            lanes.push((client, store));
            rows += copied;
        }
        Ok((lanes, rows))
    }
}

/// Unbinds the lanes' connections from their origins once they committed:
/// what they run next (building deferred indexes) is no lane's work.
async fn release_lanes(lanes: &[(Client, ProgressStore)]) {
    for (lane, store) in lanes {
        if matches!(store, ProgressStore::Origin { .. }) {
            let _ = lane
                .batch_execute("SELECT pg_replication_origin_session_reset()")
                .await;
        }
    }
}

impl Applier {
    pub(super) async fn snapshot_rows(&mut self, batch: SnapshotBatch) -> Result<(), SinkError> {
        if !self.in_snapshot {
            self.in_snapshot = true;
            self.lanes = self.open_lanes(batch.consistent_point).await?;
        }
        if let Some(mut lanes) = self.lanes.take() {
            let copied = self.copy_into_lane(&mut lanes, &batch).await;
            self.lanes = Some(lanes);
            return copied;
        }
        let map = self.map(&batch.relation).await?;
        if self.copy.as_ref().map(|c| c.table) != Some(map.target.oid) {
            self.finish_copy().await?;
            self.ensure_open().await?;
            self.drain().await?;
            if self.copied.insert(map.target.oid) {
                self.prepare_copy_target(&map).await?;
            }
            self.copy = Some(CopyIn::start(&self.client, &map).await?);
        }
        let text = self.copy_text(&batch);
        self.group.changes += batch.rows.len();
        match self.copy.as_mut() {
            Some(copy) => copy.send(text).await,
            None => Ok(()),
        }
    }

    /// Lanes for the copy taken at `consistent_point`, as many as a
    /// previous run of it used, else as configured; `None` for one.
    async fn open_lanes(&mut self, consistent_point: Lsn) -> Result<Option<Lanes>, SinkError> {
        let (count, done) = match self
            .progress
            .copy_lanes_done(&self.client, consistent_point)
            .await?
        {
            Some(found) => found,
            None => (self.config.copy_connections, Vec::new()),
        };
        if count <= 1 {
            return Ok(None);
        }
        if !done.is_empty() {
            tracing::info!(sink = %self.sink, source = %self.source.name, lanes = count, committed = %done.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "), "resuming the initial copy: copying again only the lanes that did not commit");
        }
        Ok(Some(Lanes {
            consistent_point,
            lanes: (0..count).map(|_| None).collect(),
            done: (0..count).map(|lane| done.contains(&lane)).collect(),
            next: 0,
        }))
    }

    async fn copy_into_lane(
        &mut self,
        lanes: &mut Lanes,
        batch: &SnapshotBatch,
    ) -> Result<(), SinkError> {
        let Some(index) = lanes.deal() else {
            return Ok(());
        };
        let map = self.map(&batch.relation).await?;
        if !lanes.resumed() && self.copied.insert(map.target.oid) {
            self.prepare_copy_target(&map).await?;
        }
        let text = self.copy_text(batch);
        self.group.changes += batch.rows.len();
        lanes
            .send(index, map, text, &self.config, &self.progress)
            .await
    }

    /// The whole copy is in the log: commits every lane, builds the
    /// deferred indexes, commits the source's position, then removes the
    /// lanes' markers.
    pub(super) async fn finish_lanes(&mut self) -> Result<(), SinkError> {
        let Some(lanes) = self.lanes.take() else {
            return Ok(());
        };
        let (lanes, rows) = lanes.commit().await?;
        self.totals.rows_copied += rows;
        tracing::info!(sink = %self.sink, source = %self.source.name, rows, connections = lanes.len(), "copied the snapshot");
        release_lanes(&lanes).await;
        // Every lane committed, so the indexes go up side by side on their
        // connections (on the apply connection when a previous run had
        // committed every lane already) — before the position commits.
        let apply = self.client.clone();
        let mut clients: Vec<&Client> = lanes.iter().map(|(client, _)| client).collect();
        if clients.is_empty() {
            clients.push(apply.as_ref());
        }
        self.build_deferred(&clients).await?;
        self.commit().await?;
        self.drain().await?;
        if let Err(e) = self.progress.drop_copy_lanes(&self.client).await {
            tracing::warn!(sink = %self.sink, error = %e, "could not remove the initial copy's lane markers (they are ignored by later copies)");
        }
        Ok(())
    }

    /// The batch's rows as COPY text for the target, with the source's
    /// name as a last field for `source_column`.
    fn copy_text(&self, batch: &SnapshotBatch) -> Bytes {
        if self.config.source_column.is_none() {
            return batch.rows.text().clone();
        }
        let mut source = BytesMut::new();
        escape_field(&mut source, self.source.name.as_bytes());
        let mut text = BytesMut::with_capacity(
            batch.rows.text().len() + batch.rows.len() * (source.len() + 1),
        );
        for line in batch.rows.lines() {
            text.put_slice(&line);
            text.put_u8(b'\t');
            text.put_slice(&source);
            text.put_u8(b'\n');
        }
        text.freeze()
    }

    /// Before the first rows of the initial copy go into a table: it must
    /// be empty (of this source's rows), or be emptied when configured;
    /// then its indexes are deferred past the copy.
    ///
    /// The check and the drop run on the catalog connection: the apply
    /// connection may be inside the copy's transaction (one connection),
    /// and a lock taken there on the table would hold up the drop.
    pub(super) async fn prepare_copy_target(&mut self, map: &TableMap) -> Result<(), SinkError> {
        let filter = map
            .source_tag
            .as_ref()
            .map(|(c, v)| format!(" WHERE {c} = {v}"))
            .unwrap_or_default();
        let table = map.quoted();
        let catalog = self.catalog.client().clone();
        let has_rows: bool = catalog
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
        if has_rows && !self.config.truncate_before_copy {
            return Err(SinkError::TargetNotEmpty {
                table: map.target.display(),
                scope: match &map.source_tag {
                    Some(_) => format!(" of source `{}`", self.source.name),
                    None => String::new(),
                },
                source_table: map.source_table.clone(),
            });
        }
        if let Some(deferred) = &self.deferred {
            let dropped = deferred.defer(&catalog, &map.target).await?;
            if !dropped.is_empty() {
                tracing::info!(sink = %self.sink, source = %self.source.name, table = %map.target.display(), indexes = %dropped.join(", "), records = %deferred.records(), "dropped the table's indexes for the initial copy: they are built again after it");
            }
        }
        if !has_rows {
            return Ok(());
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

    /// Builds every index recorded for this sink and source over
    /// `clients`: at the end of the initial copy, before its position
    /// commits (also those a previous, unfinished copy recorded).
    pub(super) async fn build_deferred(&mut self, clients: &[&Client]) -> Result<(), SinkError> {
        let Some(deferred) = &self.deferred else {
            return Ok(());
        };
        let pending = deferred.pending(self.catalog.client()).await?;
        if pending.is_empty() {
            return Ok(());
        }
        tracing::info!(sink = %self.sink, source = %self.source.name, indexes = pending.len(), connections = clients.len(), "building the indexes deferred past the initial copy");
        deferred.build_all(clients, pending).await
    }

    pub(super) async fn finish_copy(&mut self) -> Result<(), SinkError> {
        let Some(copy) = self.copy.take() else {
            return Ok(());
        };
        let table = copy.display.clone();
        let rows = copy.finish().await?;
        self.totals.rows_copied += rows;
        tracing::info!(sink = %self.sink, source = %self.source.name, %table, rows, "copied snapshot rows");
        Ok(())
    }
}
