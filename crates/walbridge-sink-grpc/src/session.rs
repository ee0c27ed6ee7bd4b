//! One subscription: reads its sources' logs from its positions and sends
//! whole units, within its flow-control window.
//!
//! The session is a task, as the sinks' feeders are (see the runtime's
//! pipeline: a thread of its own cost a second wake-up per transaction,
//! each of which can wait a scheduler slice on a busy machine); its log
//! reads are plain file reads, of records just written when it keeps up.
//! It takes one unit at a time from one source, round-robin over
//! the sources with something to read, so each source's commit order is
//! kept and none starves the others. Before a unit it waits for room in
//! the window ([`Flow`]); once it began a unit it sends all of it, so a
//! unit larger than the window goes alone, when nothing else is in flight.
//! Its position in a source moves only at a unit's end, and that position
//! is what the unit's token says: see the crate's documentation. It reads
//! whole units before the log's fsync ([`VISIBILITY`]).
//!
//! What counts as a unit here: a transaction (however many log records it
//! spans), one record of rows of the initial copy (the copy is written as
//! one log unit, but its rows are reads: a subscriber may resume between
//! batches of them), the copy's end, a non-transactional message.
//!
//! A group member ([`Membership`]) sends only its partitions' changes,
//! and of each partition only what comes at or after that partition's
//! stored position; it reads from the least of them. Between assignments
//! it sends nothing (see [`crate::group`]).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures_util::future::select_all;
use tokio::sync::{mpsc, watch};
use tonic::Status;
use walbridge_log::{Entry, Log, LogReader, ReadRecord, Visibility};
use walbridge_sink::{SinkDelays, SourceLog};

use crate::consumers::Consumers;
use crate::encode::{Encoder, Transaction, respond};
use crate::error::FeedError;
use crate::group::{Assignment, Groups, REBALANCE_TIMEOUT, Turn, change_partition, row_partition};
use crate::metrics::SessionCounters;
use crate::pb::{self, subscribe_response::Event};
use crate::token::{Token, TokenPosition};

/// What a session reads of its logs: whole units as soon as the log has
/// written them, before their fsync (a transaction reaches its subscriber
/// without waiting for the disk). The positions it hands out name the
/// log's epoch: one a crash of the machine took records before is resumed
/// from what the log kept ([`Log::resume_point`]).
const VISIBILITY: Visibility = Visibility::WrittenUnits;

/// The window when a subscriber asks for none.
pub(crate) const DEFAULT_MAX_EVENTS: u64 = 10_000;
pub(crate) const DEFAULT_MAX_BYTES: u64 = 16 << 20;

/// A unit sent and not yet acknowledged.
#[derive(Debug)]
struct Sent {
    source: usize,
    /// The source's next record after it.
    next: u64,
    events: u64,
    bytes: u64,
}

#[derive(Debug)]
struct FlowState {
    sent: VecDeque<Sent>,
    events: u64,
    bytes: u64,
    max_events: u64,
    max_bytes: u64,
}

/// What a session has in flight, and how much it may have.
#[derive(Debug)]
pub(crate) struct Flow {
    state: Mutex<FlowState>,
    changed: watch::Sender<()>,
}

impl Flow {
    pub fn new(limits: Option<&pb::FlowControl>) -> Flow {
        let flow = Flow {
            state: Mutex::new(FlowState {
                sent: VecDeque::new(),
                events: 0,
                bytes: 0,
                max_events: DEFAULT_MAX_EVENTS,
                max_bytes: DEFAULT_MAX_BYTES,
            }),
            changed: watch::Sender::new(()),
        };
        if let Some(limits) = limits {
            flow.set_limits(limits);
        }
        flow
    }

    fn lock(&self) -> MutexGuard<'_, FlowState> {
        // Every change under the lock is a few assignments: consistent after a panic.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the window; a zero keeps the default.
    pub fn set_limits(&self, limits: &pb::FlowControl) {
        let mut state = self.lock();
        state.max_events = match limits.max_events {
            0 => DEFAULT_MAX_EVENTS,
            n => u64::from(n),
        };
        state.max_bytes = match limits.max_bytes {
            0 => DEFAULT_MAX_BYTES,
            n => n,
        };
        drop(state);
        self.changed.send_replace(());
    }

    /// True when nothing sent is unacknowledged.
    fn is_empty(&self) -> bool {
        self.lock().sent.is_empty()
    }

    /// True when another unit may be sent: the window has room, or nothing
    /// is in flight (a unit larger than the window goes alone).
    fn has_room(&self) -> bool {
        let state = self.lock();
        state.sent.is_empty() || state.events < state.max_events && state.bytes < state.max_bytes
    }

    fn sent(&self, sent: Sent) {
        let mut state = self.lock();
        state.events += sent.events;
        state.bytes += sent.bytes;
        state.sent.push_back(sent);
    }

    /// Frees what `token` acknowledges: every unit sent before it.
    pub fn acknowledged(&self, token: &Token, sources: &[String]) {
        let mut state = self.lock();
        while let Some(front) = state.sent.front() {
            let covered = sources
                .get(front.source)
                .and_then(|name| token.position(name))
                .is_some_and(|p| p.next >= front.next);
            if !covered {
                break;
            }
            if let Some(done) = state.sent.pop_front() {
                state.events -= done.events;
                state.bytes -= done.bytes;
            }
        }
        drop(state);
        self.changed.send_replace(());
    }
}

/// One source as a session reads it.
pub(crate) struct SessionSource {
    name: String,
    log: Log,
    reader: LogReader,
    /// After the last unit sent (or skipped by the filter).
    position: TokenPosition,
    /// Where transactions read and sent count their delays.
    delays: SinkDelays,
}

impl SessionSource {
    /// Reads `source` from `position`.
    pub fn open(source: &SourceLog, position: TokenPosition) -> Result<SessionSource, FeedError> {
        let reader = source
            .log
            .reader_with(position.next, VISIBILITY)
            .map_err(|error| FeedError::Log {
                source_name: source.context.name.clone(),
                error,
            })?;
        Ok(SessionSource {
            name: source.context.name.clone(),
            log: source.log.clone(),
            reader,
            position,
            delays: source.context.delays.clone(),
        })
    }
}

/// A group member's session: its group, and what it reads now.
pub(crate) struct Membership {
    pub groups: Arc<Groups>,
    pub consumers: Arc<Consumers>,
    pub consumer: String,
    /// The session's id, its member id in the group.
    pub member: u64,
    /// The assignment read now and, per partition of it, per source (the
    /// session's order), the first record that partition has not
    /// acknowledged.
    reading: Option<(Assignment, HashMap<u32, Vec<u64>>)>,
    /// Since when it has been draining for a rebalance.
    draining_since: Option<Instant>,
}

impl Membership {
    pub fn new(
        groups: Arc<Groups>,
        consumers: Arc<Consumers>,
        consumer: String,
        member: u64,
    ) -> Membership {
        Membership {
            groups,
            consumers,
            consumer,
            member,
            reading: None,
            draining_since: None,
        }
    }

    /// Whether this member sends a change of `partition` in source `i`'s
    /// unit starting at record `seq`.
    fn takes(&self, i: usize, seq: u64, partition: u32) -> bool {
        self.reading
            .as_ref()
            .and_then(|(_, from)| from.get(&partition))
            .is_some_and(|from| from.get(i).is_none_or(|next| seq >= *next))
    }

    fn count(&self) -> u32 {
        self.reading.as_ref().map_or(1, |(a, _)| a.count)
    }
}

/// Whether a session reads now, as far as its group says.
enum Go {
    Read,
    Again,
}

/// A session, ready to run.
pub(crate) struct Session {
    /// The feed's sink name (units for another sink are passed over).
    pub sink: String,
    pub sources: Vec<SessionSource>,
    pub encoder: Encoder,
    pub heartbeat: Duration,
    pub flow: Arc<Flow>,
    pub out: mpsc::Sender<Result<pb::SubscribeResponse, Status>>,
    /// Set when the subscriber is gone or the feed stops.
    pub cancel: watch::Receiver<bool>,
    /// Set when the feed stops.
    pub stopping: watch::Receiver<bool>,
    /// Set when the session is a group member.
    pub membership: Option<Membership>,
    pub counters: SessionCounters,
}

/// Why a session ended without an error to report.
struct Gone;

impl Session {
    /// The token for where the session is now.
    fn token(&self) -> bytes::Bytes {
        Token {
            sources: self.sources.iter().map(|s| s.position.clone()).collect(),
            generation: self
                .membership
                .as_ref()
                .and_then(|m| m.reading.as_ref())
                .map_or(0, |(a, _)| a.generation),
        }
        .encode()
    }

    fn positions(&self) -> Vec<pb::SourcePosition> {
        self.sources
            .iter()
            .map(|s| pb::SourcePosition {
                source: s.name.clone(),
                lsn: s.position.lsn().to_string(),
                from_beginning: false,
            })
            .collect()
    }

    /// Runs until the subscriber goes or the feed stops; an error is sent
    /// to the subscriber as its status.
    pub async fn run(mut self) {
        if let Err(e) = self.serve().await {
            let _ = self.out.send(Err(e.status())).await;
        }
    }

    fn cancelled(&self) -> bool {
        *self.cancel.borrow() || self.out.is_closed()
    }

    async fn serve(&mut self) -> Result<(), FeedError> {
        let mut last_sent = Instant::now();
        let mut turn = 0;
        let mut flow_changed = self.flow.changed.subscribe();
        loop {
            if *self.stopping.borrow() {
                return Err(FeedError::Stopping);
            }
            if self.cancelled() {
                return Ok(());
            }
            match self.take_turn().await {
                Ok(Go::Read) => {}
                Ok(Go::Again) => {
                    last_sent = Instant::now();
                    continue;
                }
                Err(Ok(Gone)) => return Ok(()),
                Err(Err(e)) => return Err(e),
            }
            let due = last_sent + self.heartbeat;
            if Instant::now() >= due {
                let progress = respond(Event::Progress(pb::Progress {
                    resume_token: self.token(),
                    sources: self.positions(),
                }));
                match self.send(vec![progress]).await {
                    Ok(_) => last_sent = Instant::now(),
                    Err(Gone) => return Ok(()),
                }
                continue;
            }
            if !self.flow.has_room() {
                flow_changed.mark_unchanged();
                if self.flow.has_room() {
                    continue;
                }
                tokio::select! {
                    _ = flow_changed.changed() => {}
                    _ = self.cancel.wait_for(|c| *c) => {}
                    _ = tokio::time::sleep_until(due.into()) => {}
                }
                continue;
            }
            let mut sent_any = None;
            for k in 0..self.sources.len() {
                let i = (turn + k) % self.sources.len();
                match self.unit(i).await {
                    Ok(Some(sent)) => {
                        sent_any = Some(sent);
                        turn = i + 1;
                        break;
                    }
                    Ok(None) => {}
                    Err(Ok(Gone)) => return Ok(()),
                    Err(Err(e)) => return Err(e),
                }
            }
            match sent_any {
                Some(true) => last_sent = Instant::now(),
                Some(false) => {}
                None => {
                    let Session {
                        sources, cancel, ..
                    } = self;
                    let readable =
                        select_all(sources.iter_mut().map(|s| Box::pin(s.reader.wait())));
                    tokio::select! {
                        _ = readable => {}
                        _ = cancel.wait_for(|c| *c) => {}
                        _ = tokio::time::sleep_until(due.into()) => {}
                    }
                }
            }
        }
    }

    /// What a group member is to do before reading on: nothing (not a
    /// member, or reading its assignment), start a new assignment, drain,
    /// or wait for the others.
    async fn take_turn(&mut self) -> Result<Go, Result<Gone, FeedError>> {
        let Some(membership) = &mut self.membership else {
            return Ok(Go::Read);
        };
        // Subscribed before looking, so a change in between still wakes
        // us (an acknowledgement emptying the flow after the look would
        // otherwise hold the rebalance up to REBALANCE_TIMEOUT).
        let mut changed = membership.groups.subscribe();
        let mut flow_changed = self.flow.changed.subscribe();
        let deadline = match membership
            .groups
            .turn(&membership.consumer, membership.member)
        {
            Turn::Read(assignment) => {
                membership.draining_since = None;
                let current = membership.reading.as_ref().map(|(a, _)| a.generation);
                if current == Some(assignment.generation) {
                    return Ok(Go::Read);
                }
                self.start_reading(assignment).await?;
                return Ok(Go::Again);
            }
            Turn::Drain(generation) => {
                if self.flow.is_empty() {
                    membership
                        .groups
                        .drained(&membership.consumer, membership.member, generation);
                    return Ok(Go::Again);
                }
                let since = *membership.draining_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= REBALANCE_TIMEOUT {
                    return Err(Err(FeedError::RebalanceTimeout {
                        consumer: membership.consumer.clone(),
                        seconds: REBALANCE_TIMEOUT.as_secs(),
                    }));
                }
                since + REBALANCE_TIMEOUT
            }
            // The others are draining; a member that leaves wakes us too.
            Turn::Wait => Instant::now() + REBALANCE_TIMEOUT,
        };
        tokio::select! {
            _ = changed.changed() => {}
            _ = flow_changed.changed() => {}
            _ = self.cancel.wait_for(|c| *c) => {}
            _ = tokio::time::sleep_until(deadline.into()) => {}
        }
        Ok(Go::Again)
    }

    /// Starts reading `assignment`: each source from the least advanced of
    /// its partitions' stored positions; tells the subscriber.
    async fn start_reading(
        &mut self,
        assignment: Assignment,
    ) -> Result<(), Result<Gone, FeedError>> {
        let Some(membership) = &mut self.membership else {
            return Ok(());
        };
        let consumer = membership
            .consumers
            .get(&membership.consumer)
            .ok_or_else(|| Err(FeedError::UnknownConsumer(membership.consumer.clone())))?;
        let mut from: HashMap<u32, Vec<u64>> = HashMap::new();
        for source in &mut self.sources {
            let held = assignment.partitions.iter().map(|p| {
                (
                    *p,
                    consumer
                        .partition(*p)
                        .iter()
                        .find(|t| t.source == source.name && t.log == source.log.id()),
                )
            });
            let mut least: Option<TokenPosition> = None;
            for (p, position) in held {
                // A partition without a position in this source has read
                // nothing of it: from where the session is.
                let position = position.map(|t| t.resumed_in(&source.log));
                let next = position.as_ref().map_or(source.position.next, |t| t.next);
                from.entry(p).or_default().push(next);
                if let Some(t) = position
                    && least.as_ref().is_none_or(|l| t.next < l.next)
                {
                    least = Some(t);
                }
            }
            if let Some(least) = least {
                source.reader =
                    source
                        .log
                        .reader_with(least.next, VISIBILITY)
                        .map_err(|error| {
                            Err(FeedError::Log {
                                source_name: source.name.clone(),
                                error,
                            })
                        })?;
                source.position = least;
            }
        }
        let event = Event::Assignment(pb::Assignment {
            generation: assignment.generation,
            partitions: assignment.partitions.clone(),
            partition_count: assignment.count,
            members: assignment.members,
        });
        tracing::info!(consumer = %membership.consumer, generation = assignment.generation, partitions = ?assignment.partitions, members = assignment.members, "group member assigned");
        membership.reading = Some((assignment, from));
        self.send(vec![respond(event)]).await.map_err(Ok)?;
        Ok(())
    }

    /// Sends `messages`; what they count against the window.
    async fn send(&self, messages: Vec<pb::SubscribeResponse>) -> Result<(u64, u64), Gone> {
        let mut events = 0;
        let mut bytes = 0;
        for message in messages {
            events += match &message.event {
                Some(Event::Change(_)) | Some(Event::Message(_)) => 1,
                Some(Event::Rows(rows)) => rows.rows.len() as u64,
                _ => 0,
            };
            bytes += prost::Message::encoded_len(&message) as u64;
            self.out.send(Ok(message)).await.map_err(|_| Gone)?;
        }
        self.counters.events.increment(events);
        self.counters.bytes.increment(bytes);
        Ok((events, bytes))
    }

    /// Sends what `out` holds, adding what it counts against the window to `sent`.
    async fn flush(
        &self,
        out: &mut Vec<pb::SubscribeResponse>,
        sent: &mut (u64, u64),
    ) -> Result<(), Result<Gone, FeedError>> {
        let (events, bytes) = self.send(std::mem::take(out)).await.map_err(Ok)?;
        sent.0 += events;
        sent.1 += bytes;
        Ok(())
    }

    /// Reads and sends source `i`'s next unit: `None` when it has none
    /// yet, else whether anything was sent (the filter may leave nothing).
    async fn unit(&mut self, i: usize) -> Result<Option<bool>, Result<Gone, FeedError>> {
        let failed = |name: &str| {
            let source_name = name.to_owned();
            move |error| Err(FeedError::Log { source_name, error })
        };
        let source = &mut self.sources[i];
        let Some(record) = source.reader.try_next().map_err(failed(&source.name))? else {
            return Ok(None);
        };
        let name = source.name.clone();
        let mut out = Vec::new();
        let mut sent = (0u64, 0u64);
        let ReadRecord {
            seq, lsn, entry, ..
        } = record;
        match entry {
            Entry::Transaction {
                info,
                first,
                last,
                changes,
            } => {
                if !first {
                    return Err(Err(self.torn(i, seq)));
                }
                let mut transaction = Transaction::default();
                let (mut changes, mut last, mut at) = (changes, last, (seq, lsn));
                let passed_over = info.passes_over(&self.sink);
                loop {
                    for change in &changes {
                        if passed_over
                            || self.membership.as_ref().is_some_and(|m| {
                                !m.takes(i, seq, change_partition(change, m.count()))
                            })
                        {
                            transaction.skip();
                            continue;
                        }
                        self.encoder
                            .change((i, &name), &info, &mut transaction, change, &mut out);
                    }
                    self.flush(&mut out, &mut sent).await?;
                    if last {
                        break;
                    }
                    let source = &mut self.sources[i];
                    match source.reader.try_next().map_err(failed(&name))? {
                        Some(ReadRecord {
                            seq,
                            lsn,
                            entry:
                                Entry::Transaction {
                                    first: false,
                                    last: is_last,
                                    changes: more,
                                    ..
                                },
                            ..
                        }) => {
                            (changes, last, at) = (more, is_last, (seq, lsn));
                        }
                        _ => return Err(Err(self.torn(i, at.0 + 1))),
                    }
                }
                self.advance(i, at.0 + 1, at.1, 0);
                self.sources[i].delays.read(info.commit_time);
                let token = self.token();
                let commit = Encoder::commit(&name, &info, &transaction, token);
                let committed = commit.is_some();
                out.extend(commit);
                self.flush(&mut out, &mut sent).await?;
                if committed {
                    self.sources[i].delays.applied(info.commit_time);
                }
            }
            Entry::Snapshot(batch) => {
                let rows = batch
                    .rows
                    .rows(batch.relation.columns.len())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| {
                        Err(FeedError::Log {
                            source_name: name.clone(),
                            error: walbridge_log::LogError::Segment {
                                path: self.sources[i].log.dir().to_owned(),
                                problem: format!("record {seq}: rows of the copy unreadable: {e}"),
                            },
                        })
                    })?;
                let first = self.sources[i].position.copied_rows;
                let copied = first + rows.len() as u64;
                self.advance(i, seq + 1, lsn, copied);
                let token = self.token();
                let numbered = (first..).zip(rows);
                let rows = match &self.membership {
                    None => numbered.collect(),
                    Some(m) => numbered
                        .filter(|(_, row)| {
                            m.takes(i, seq, row_partition(&batch.relation, row, m.count()))
                        })
                        .collect(),
                };
                self.encoder.rows(
                    (i, &name),
                    &batch.relation,
                    batch.consistent_point,
                    rows,
                    token,
                    &mut out,
                );
                self.flush(&mut out, &mut sent).await?;
            }
            Entry::SnapshotComplete { consistent_point } => {
                self.advance(i, seq + 1, lsn, 0);
                out.push(respond(Event::CopyComplete(pb::CopyComplete {
                    source: name.clone(),
                    lsn: consistent_point.to_string(),
                    resume_token: self.token(),
                })));
                self.flush(&mut out, &mut sent).await?;
            }
            Entry::Message(message) => {
                self.advance(i, seq + 1, lsn, 0);
                if self.membership.as_ref().is_none_or(|m| m.takes(i, seq, 0)) {
                    out.extend(self.encoder.message(&name, &message, self.token()));
                }
                self.flush(&mut out, &mut sent).await?;
            }
            Entry::Sequences(values) => {
                self.advance(i, seq + 1, lsn, 0);
                if self.membership.as_ref().is_none_or(|m| m.takes(i, seq, 0)) {
                    out.push(crate::encode::sequences(&name, &values, self.token()));
                }
                self.flush(&mut out, &mut sent).await?;
            }
        }
        if sent.0 > 0 || sent.1 > 0 {
            self.flow.sent(Sent {
                source: i,
                next: self.sources[i].position.next,
                events: sent.0,
                bytes: sent.1,
            });
        }
        Ok(Some(sent.1 > 0))
    }

    fn advance(&mut self, i: usize, next: u64, lsn: walbridge_core::Lsn, copied_rows: u64) {
        let source = &mut self.sources[i];
        let position = &mut source.position;
        position.next = next;
        position.lsn = lsn.0;
        position.copied_rows = copied_rows;
        // Read in this epoch, maybe before its fsync.
        position.epoch = source.log.epoch();
    }

    /// A transaction's chunks are not contiguous at record `seq`: the log
    /// is damaged.
    fn torn(&self, i: usize, seq: u64) -> FeedError {
        let source = &self.sources[i];
        FeedError::Log {
            source_name: source.name.clone(),
            error: walbridge_log::LogError::Segment {
                path: source.log.dir().to_owned(),
                problem: format!("record {seq} does not continue the transaction before it"),
            },
        }
    }
}
