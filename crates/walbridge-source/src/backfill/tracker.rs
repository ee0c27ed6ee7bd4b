//! The stream's side of copying while streaming: which tables are
//! published and which are being copied (kept in the source's state), the
//! worker that reads their chunks, and each chunk's progress made durable.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_postgres::Client;
use walbridge_core::{Change, LogicalMessage, Lsn, Relation};

use super::{
    ChunkKey, ChunkMark, ChunkRead, ChunkUnit, Copies, CopyMode, Job, ReadKey, ResyncRequest,
    Standing, StoredCopy, WATERMARK_PREFIX, Worker, WorkerEvent, requests,
};
use crate::catalog::{CatalogError, PublishedTable, TypeCatalog, describe_table, published_tables};
use crate::config::SourceConfig;
use crate::source::{CopyProgress, SourceStats};
use crate::state::SourceState;
use crate::wire::ConnParams;

/// What went wrong with copying while streaming.
#[derive(Debug, thiserror::Error)]
pub enum TrackerError {
    /// The source's state could not be read or written.
    #[error("state in {0}: {1}")]
    State(PathBuf, std::io::Error),
    /// Reading the publications' tables failed.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// The copy worker's connection failed.
    #[error("{0}")]
    Worker(String),
}

/// Tables and their copies, across the stream's reconnects.
pub struct Tracker {
    state_dir: PathBuf,
    /// Where status reads how the copies stand.
    stats: Arc<SourceStats>,
    /// The state as stored; `None` until the first stream start loads it.
    state: Option<SourceState>,
    /// The copies under way were taken from the state (at the first start
    /// in this process; later starts go on from where they are).
    loaded: bool,
    copies: Copies,
    /// Chunks read whose high watermark has not come yet.
    reads: Vec<ChunkRead>,
    jobs: Option<mpsc::UnboundedSender<Job>>,
    events: Option<mpsc::UnboundedReceiver<WorkerEvent>>,
    worker: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Tracker {
    fn drop(&mut self) {
        if let Some(w) = self.worker.take() {
            w.abort();
        }
    }
}

impl Tracker {
    /// A tracker keeping its state in `state_dir`.
    pub fn new(state_dir: PathBuf, stats: Arc<SourceStats>) -> Self {
        Tracker {
            state_dir,
            stats,
            state: None,
            loaded: false,
            copies: Copies::default(),
            reads: Vec::new(),
            jobs: None,
            events: None,
            worker: None,
        }
    }

    /// At each stream start, before any change: loads the state (the first
    /// time, where downstream holds everything up to `held`), finds tables
    /// added or removed meanwhile, and starts a worker for the copies under
    /// way.
    pub async fn start(
        &mut self,
        client: &Client,
        server_version: u32,
        config: &SourceConfig,
        params: &ConnParams,
        held: Lsn,
    ) -> Result<(), TrackerError> {
        if let Some(w) = self.worker.take() {
            w.abort();
        }
        self.copies.reset_windows();
        self.reads.clear();
        // The state is read again at every start: the initial copy writes
        // it too. What this tracker changes it stores at once.
        let mut state = SourceState::load(&self.state_dir)
            .map_err(|e| TrackerError::State(self.state_dir.clone(), e))?
            .unwrap_or_default();
        if !self.loaded {
            self.loaded = true;
            let mut types = TypeCatalog::new();
            let tables = published_tables(client, &config.publications, server_version).await?;
            // Downstream holds exactly the chunks up to `held`: the copies
            // go on from there (later marks were never handed over whole).
            state
                .copies
                .retain_mut(|stored| match stored.standing(held) {
                    Standing::After(after) => {
                        stored.after = after;
                        stored.marks.clear();
                        true
                    }
                    Standing::Complete => false,
                });
            for stored in &state.copies {
                self.copies.start(stored);
                show(&self.stats, stored);
                let Some(table) = tables.iter().find(|t| t.oid == stored.oid) else {
                    continue;
                };
                let relation = describe_table(client, &mut types, table).await?;
                let done = match (&stored.after, ChunkKey::of(&relation)) {
                    (Some(text), Some(key)) => key.parse(text),
                    _ => None,
                };
                self.copies.set_done(stored.oid, done);
            }
            self.state = Some(state);
            self.store()?;
        } else {
            self.state = Some(state);
        }
        let (jobs, to_worker) = mpsc::unbounded_channel();
        let (from_worker, events) = mpsc::unbounded_channel();
        let worker = Worker::new(
            params.clone(),
            Arc::new(config.clone()),
            server_version,
            to_worker,
            from_worker,
        );
        for (oid, table, mode, after) in self.copies.progress() {
            let _ = jobs.send(Job {
                oid,
                table: table.to_owned(),
                mode,
                after: after.cloned(),
            });
        }
        self.jobs = Some(jobs);
        self.events = Some(events);
        self.worker = Some(tokio::spawn(worker.run()));
        self.refresh(client, server_version, config).await
    }

    /// Reads the publications' tables: a table not known before is new
    /// (its rows are copied, with `copy_data`), a known one gone has left.
    pub async fn refresh(
        &mut self,
        client: &Client,
        server_version: u32,
        config: &SourceConfig,
    ) -> Result<(), TrackerError> {
        let tables = published_tables(client, &config.publications, server_version).await?;
        self.take_requests(&tables, &config.name)?;
        let current: HashSet<u32> = tables.iter().map(|t| t.oid).collect();
        let Some(state) = &mut self.state else {
            return Ok(());
        };
        let Some(known) = &state.tables else {
            // A state from before tables were kept: what is published now
            // counts as copied.
            let mut oids: Vec<u32> = current.into_iter().collect();
            oids.sort_unstable();
            state.tables = Some(oids);
            return self.store();
        };
        let known: HashSet<u32> = known.iter().copied().collect();
        let mut changed = false;
        for table in tables.iter().filter(|t| !known.contains(&t.oid)) {
            self.entered(
                table.oid,
                &format!("{}.{}", table.schema, table.name),
                config,
            );
            changed = true;
        }
        for oid in known.difference(&current) {
            self.left(*oid, &config.name);
            changed = true;
        }
        if changed { self.store() } else { Ok(()) }
    }

    /// A relation came in the stream: a table not known is new (its
    /// changes are held back from now on, until its rows are copied).
    pub fn seen(&mut self, relation: &Relation, config: &SourceConfig) -> Result<(), TrackerError> {
        let known = self
            .state
            .as_ref()
            .and_then(|s| s.tables.as_ref())
            .is_none_or(|t| t.contains(&relation.id));
        if known {
            return Ok(());
        }
        self.entered(
            relation.id,
            &format!("{}.{}", relation.schema, relation.name),
            config,
        );
        self.store()
    }

    fn entered(&mut self, oid: u32, table: &str, config: &SourceConfig) {
        let Some(state) = &mut self.state else {
            return;
        };
        if let Some(tables) = &mut state.tables {
            tables.push(oid);
        }
        if !config.copy_data {
            tracing::info!(source = %config.name, table = %table, "a table entered the publication; copy_data = false, so only its changes from now on are replicated");
            return;
        }
        tracing::info!(source = %config.name, table = %table, "a table entered the publication: copying its rows while streaming");
        self.begin(
            StoredCopy {
                oid,
                table: table.to_owned(),
                mode: CopyMode::NewTable,
                after: None,
                marks: Vec::new(),
                sink: None,
            },
            None,
        );
    }

    fn left(&mut self, oid: u32, source: &str) {
        let Some(state) = &mut self.state else {
            return;
        };
        if let Some(tables) = &mut state.tables {
            tables.retain(|t| *t != oid);
        }
        state.copies.retain(|c| c.oid != oid);
        self.copies.finish(oid);
        self.stats.set_copy(oid, None);
        tracing::info!(source = %source, oid, "a table left the publication; its rows stay on the targets");
    }

    /// Starts copying `stored`'s table (replacing a copy under way).
    fn begin(&mut self, stored: StoredCopy, after: Option<ReadKey>) {
        let Some(state) = &mut self.state else {
            return;
        };
        state.copies.retain(|c| c.oid != stored.oid);
        state.copies.push(stored.clone());
        self.copies.start(&stored);
        show(&self.stats, &stored);
        self.copies.set_done(stored.oid, after.clone());
        if let Some(jobs) = &self.jobs {
            let _ = jobs.send(Job {
                oid: stored.oid,
                table: stored.table,
                mode: stored.mode,
                after,
            });
        }
    }

    /// Takes the re-sync requests waiting (`walbridge resync`): each table
    /// named is copied again from its first row, replacing a copy under
    /// way; a table not published is refused in the log.
    fn take_requests(
        &mut self,
        tables: &[PublishedTable],
        source: &str,
    ) -> Result<(), TrackerError> {
        let state_error = |e| TrackerError::State(self.state_dir.clone(), e);
        for (asked, request) in requests(&self.state_dir).map_err(state_error)? {
            let ResyncRequest {
                table: asked,
                sink,
                truncate,
            } = asked;
            let qualified = if asked.contains('.') {
                asked.clone()
            } else {
                format!("public.{asked}")
            };
            let found = tables.iter().find(|t| {
                format!("{}.{}", t.schema, t.name) == qualified || t.quoted_name() == qualified
            });
            match found {
                Some(t) => {
                    let table = format!("{}.{}", t.schema, t.name);
                    tracing::info!(source = %source, table = %table, only_for_sink = sink.as_deref().unwrap_or(""), "re-synchronizing the table while streaming, as requested");
                    self.begin(
                        StoredCopy {
                            oid: t.oid,
                            table,
                            mode: if truncate {
                                CopyMode::Replace
                            } else {
                                CopyMode::Resync
                            },
                            after: None,
                            marks: Vec::new(),
                            sink,
                        },
                        None,
                    );
                    self.store()?;
                }
                None => {
                    tracing::error!(source = %source, "re-sync of table {asked}: source `{source}`'s publications do not cover it; name it as schema.table")
                }
            }
            std::fs::remove_file(&request)
                .map_err(|e| TrackerError::State(self.state_dir.clone(), e))?;
        }
        Ok(())
    }

    /// The next word from the worker (pending while there is no worker).
    pub async fn next_event(&mut self) -> Option<WorkerEvent> {
        match &mut self.events {
            Some(events) => events.recv().await,
            None => std::future::pending().await,
        }
    }

    /// Takes in what the worker said.
    pub fn handle(&mut self, event: WorkerEvent, source: &str) -> Result<(), TrackerError> {
        match event {
            WorkerEvent::Opening(opening) => self.copies.announce(opening),
            WorkerEvent::Chunk(read) => self.reads.push(read),
            WorkerEvent::Gone { oid } => {
                self.left(oid, source);
                self.store()?;
            }
            WorkerEvent::Refused { oid, reason } => {
                tracing::error!(source = %source, "{reason}");
                if let Some(state) = &mut self.state {
                    state.copies.retain(|c| c.oid != oid);
                }
                self.copies.finish(oid);
                self.stats.set_copy(oid, None);
                self.store()?;
            }
            WorkerEvent::Failed(e) => return Err(TrackerError::Worker(e)),
        }
        Ok(())
    }

    /// A watermark message came: true when `message` is one (it goes no
    /// further); with a chunk unit to hand downstream when it closed one.
    pub fn watermark(
        &mut self,
        message: &LogicalMessage,
        source: &str,
    ) -> Result<Option<Option<ChunkUnit>>, TrackerError> {
        if message.prefix != WATERMARK_PREFIX {
            return Ok(None);
        }
        // The worker told of the chunk before writing its watermark.
        while let Some(event) = self.events.as_mut().and_then(|e| e.try_recv().ok()) {
            self.handle(event, source)?;
        }
        let text = String::from_utf8_lossy(&message.content);
        let mut words = text.split(' ');
        let (Some(side), Some(Ok(id))) = (words.next(), words.next().map(str::parse::<u64>)) else {
            return Ok(Some(None));
        };
        match side {
            "low" => {
                self.copies.low(id);
                Ok(Some(None))
            }
            "high" => {
                let Some(pos) = self.reads.iter().position(|r| r.id == id) else {
                    return Ok(Some(None));
                };
                let read = self.reads.swap_remove(pos);
                Ok(Some(self.copies.high(read, message.lsn)))
            }
            _ => Ok(Some(None)),
        }
    }

    /// Passes a transaction's change through the copies (see
    /// [`Copies::filter`]).
    pub fn filter(
        &mut self,
        xid: u32,
        change: Change,
        out: &mut Vec<Change>,
    ) -> Result<(), TrackerError> {
        if self.copies.is_empty() {
            out.push(change);
            return Ok(());
        }
        let mut finished = Vec::new();
        self.copies.filter(xid, change, out, &mut finished);
        if finished.is_empty() {
            return Ok(());
        }
        if let Some(state) = &mut self.state {
            state.copies.retain(|c| !finished.contains(&c.oid));
        }
        for oid in finished {
            self.stats.set_copy(oid, None);
        }
        self.store()
    }

    /// A chunk unit ending at `end` is about to be handed downstream:
    /// recorded (durably) first, so a start knows whether the log holds it.
    pub fn handing(&mut self, end: Lsn, unit: &ChunkUnit) -> Result<(), TrackerError> {
        if unit.up_to.is_none() {
            self.copies.finish(unit.oid);
            self.stats.set_copy(unit.oid, None);
        } else if let Some(mut progress) = self.stats.copies_of(unit.oid) {
            progress.rows += unit
                .changes
                .iter()
                .filter(|c| matches!(c, Change::Read { .. }))
                .count() as u64;
            progress.up_to = unit.up_to.as_ref().map(|k| k.text.clone());
            self.stats.set_copy(unit.oid, Some(progress));
        }
        let Some(stored) = self
            .state
            .as_mut()
            .and_then(|s| s.copies.iter_mut().find(|c| c.oid == unit.oid))
        else {
            return Ok(());
        };
        stored.marks.push(ChunkMark {
            end: end.0,
            after: unit.up_to.as_ref().map(|k| k.text.clone()),
        });
        self.store()
    }

    /// Downstream made everything up to `durable` durable: the chunks
    /// ending there count as copied.
    pub fn durable(&mut self, durable: Lsn, source: &str) -> Result<(), TrackerError> {
        let Some(state) = &mut self.state else {
            return Ok(());
        };
        if !state
            .copies
            .iter()
            .any(|c| c.marks.first().is_some_and(|m| m.end <= durable.0))
        {
            return Ok(());
        }
        state.copies.retain_mut(|c| match c.standing(durable) {
            Standing::After(after) => {
                c.after = after;
                c.marks.retain(|m| m.end > durable.0);
                true
            }
            Standing::Complete => {
                tracing::info!(source = %source, table = %c.table, mode = c.mode.as_str(), "the table's copy is durable downstream");
                false
            }
        });
        self.store()
    }

    fn store(&self) -> Result<(), TrackerError> {
        match &self.state {
            Some(state) => state
                .store(&self.state_dir)
                .map_err(|e| TrackerError::State(self.state_dir.clone(), e)),
            None => Ok(()),
        }
    }
}

/// Shows a copy starting (or going on from the state) in status.
fn show(stats: &SourceStats, stored: &StoredCopy) {
    stats.set_copy(
        stored.oid,
        Some(CopyProgress {
            table: stored.table.clone(),
            mode: stored.mode.as_str(),
            rows: 0,
            up_to: stored.after.clone(),
            sink: stored.sink.clone(),
        }),
    );
}
