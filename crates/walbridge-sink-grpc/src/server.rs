//! The `ChangeFeed` service: subscriptions and durable consumers over the
//! sink's logs, and what the sink acknowledges to them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use futures_util::future::select_all;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use walbridge_core::Lsn;
use walbridge_log::ResumePoint;
use walbridge_sink::{LogPosition, SourceLog};

use crate::consumers::{Claim, Consumer, Consumers, Origin, check_name};
use crate::encode::{Encoder, respond, timestamp};
use crate::error::FeedError;
use crate::filter::Filter;
use crate::group::{DEFAULT_PARTITIONS, Groups, MAX_PARTITIONS};
use crate::metrics::SessionCounters;
use crate::pb::{self, subscribe_request, subscribe_response::Event};
use crate::session::{Flow, Membership, Session, SessionSource};
use crate::token::{Token, TokenPosition};

/// How long a subscriber has to send `open`.
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);
/// The heartbeat when a subscriber asks for none, and the least it may.
const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(1);
const MIN_HEARTBEAT: Duration = Duration::from_millis(10);
/// Messages a session may have queued for the transport.
const SESSION_QUEUE: usize = 256;
/// How often the retention bound is looked up again: a quarter of the
/// retention, within these bounds.
const RETENTION_REFRESH: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(10));

/// What the service serves: the sink's logs and its durable consumers.
pub(crate) struct Feed {
    pub sink: String,
    pub logs: Vec<SourceLog>,
    pub consumers: Arc<Consumers>,
    pub retention: Duration,
    /// The consumer groups with members connected.
    groups: Arc<Groups>,
    /// Per open session, its positions as acknowledged (or started).
    sessions: Mutex<HashMap<u64, Vec<TokenPosition>>>,
    next_session: AtomicU64,
    /// Bumped whenever a hold changes: a consumer or a session moved.
    held: watch::Sender<()>,
    /// Set when the feed stops.
    pub stopping: watch::Receiver<bool>,
}

impl Feed {
    pub fn new(
        sink: String,
        logs: Vec<SourceLog>,
        consumers: Arc<Consumers>,
        retention: Duration,
        stopping: watch::Receiver<bool>,
    ) -> Feed {
        Feed {
            sink,
            logs,
            consumers,
            retention,
            groups: Arc::default(),
            sessions: Mutex::new(HashMap::new()),
            next_session: AtomicU64::new(1),
            held: watch::Sender::new(()),
            stopping,
        }
    }

    fn sessions(&self) -> MutexGuard<'_, HashMap<u64, Vec<TokenPosition>>> {
        // Plain data, one assignment per change: consistent after a panic.
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn source_names(&self) -> Vec<String> {
        self.logs.iter().map(|l| l.context.name.clone()).collect()
    }

    fn log(&self, source: &str) -> Result<&SourceLog, FeedError> {
        self.logs
            .iter()
            .find(|l| l.context.name == source)
            .ok_or_else(|| FeedError::UnknownSource {
                source_name: source.to_owned(),
                known: self.source_names().join(", "),
            })
    }

    /// Where `origin` starts in `source`'s log now.
    fn origin_position(source: &SourceLog, origin: Origin) -> Result<TokenPosition, FeedError> {
        let log = &source.log;
        let (next, lsn) = match origin {
            Origin::Earliest => (
                log.first_seq(),
                log.start_lsn().map_err(|error| FeedError::Log {
                    source_name: source.context.name.clone(),
                    error,
                })?,
            ),
            Origin::Latest => {
                let head = log.head();
                (head.next_seq, head.last_lsn)
            }
        };
        Ok(TokenPosition {
            source: source.context.name.clone(),
            log: log.id().to_owned(),
            next,
            lsn: lsn.0,
            copied_rows: 0,
            epoch: log.epoch(),
        })
    }

    /// Every source's position for `start`, and where a source it does
    /// not name starts.
    fn resolve(
        &self,
        start: Option<&pb::Start>,
    ) -> Result<(Origin, Vec<TokenPosition>), FeedError> {
        use pb::start::Position;
        let position = start.and_then(|s| s.position.as_ref());
        let (origin, named): (Origin, Vec<TokenPosition>) = match position {
            None | Some(Position::Latest(_)) => (Origin::Latest, Vec::new()),
            Some(Position::Earliest(_)) => (Origin::Earliest, Vec::new()),
            Some(Position::ResumeToken(bytes)) => {
                let token = Token::parse(bytes).ok_or_else(|| {
                    FeedError::Invalid("start.resume_token is not a token of this feed".into())
                })?;
                for p in &token.sources {
                    self.log(&p.source)?;
                }
                (Origin::Latest, token.sources)
            }
            Some(Position::Lsns(lsns)) => {
                let mut named = Vec::new();
                for (source, text) in &lsns.lsns {
                    let log = self.log(source)?;
                    let lsn: Lsn = text.parse().map_err(|_| {
                        FeedError::Invalid(format!(
                            "start.lsns[{source}]: {text:?} is not an LSN (write it as PostgreSQL does, e.g. 16/B374D848)"
                        ))
                    })?;
                    let next = log.log.seq_after_lsn(lsn).map_err(|error| FeedError::Log {
                        source_name: source.clone(),
                        error,
                    })?;
                    named.push(TokenPosition {
                        source: source.clone(),
                        log: log.log.id().to_owned(),
                        next,
                        lsn: lsn.0,
                        copied_rows: 0,
                        epoch: log.log.epoch(),
                    });
                }
                (Origin::Latest, named)
            }
        };
        let positions = self
            .logs
            .iter()
            .map(
                |l| match named.iter().find(|p| p.source == l.context.name) {
                    Some(p) => Ok(p.clone()),
                    None => Self::origin_position(l, origin),
                },
            )
            .collect::<Result<_, _>>()?;
        Ok((origin, positions))
    }

    /// `position` checked against its log: the same log, still held, and
    /// where it reads from now (past the end of what a crash of the
    /// machine left of the records it had read: from that end; see
    /// [`walbridge_log::Log::resume_point`]).
    fn check(&self, position: &TokenPosition, holder: &str) -> Result<TokenPosition, FeedError> {
        let source = self.log(&position.source)?;
        let log = &source.log;
        let other_log = || FeedError::OtherLog {
            holder: holder.to_owned(),
            source_name: position.source.clone(),
        };
        if position.log != log.id() {
            return Err(other_log());
        }
        let first = log.first_seq();
        let out_of_range = || FeedError::OutOfRange {
            holder: holder.to_owned(),
            source_name: position.source.clone(),
            wanted: position.lsn(),
            first_lsn: log.start_lsn().unwrap_or(Lsn::ZERO),
            first,
        };
        let resumed = match log.resume_point(position.epoch, position.next) {
            ResumePoint::Kept(_) => position.clone(),
            ResumePoint::Lost { next, last_lsn } => {
                tracing::warn!(sink = %self.sink, source = %position.source, lost_from = next, to = position.next, lsn = %last_lsn, "{holder} had read records the log lost in a crash of the machine (sent before their fsync): reading again from where the log kept them; the units from there on come again (event ids are the same)");
                position.resumed_at(next, last_lsn, log.epoch())
            }
            ResumePoint::Removed => return Err(out_of_range()),
            ResumePoint::Unknown => return Err(other_log()),
        };
        if resumed.next < first {
            return Err(out_of_range());
        }
        Ok(resumed)
    }

    /// Acknowledges to each log, per source, the lowest position a durable
    /// consumer (within retention) or an open session still needs, never
    /// past the log's durable end (sessions are sent units before their
    /// fsync). Forward only.
    fn acknowledge_holds(&self, floors: &[(u64, Lsn)]) {
        let consumers = self.consumers.list();
        let sessions = self.sessions().clone();
        for (i, source) in self.logs.iter().enumerate() {
            let name = &source.context.name;
            let id = source.log.id();
            let floor = floors.get(i).copied().unwrap_or((0, Lsn::ZERO));
            let durable = consumers
                .values()
                .flat_map(|c| c.positions.iter())
                .filter(|p| &p.source == name && p.log == id)
                .map(|p| p.place_in(&source.log))
                .map(|(next, lsn)| if next < floor.0 { floor } else { (next, lsn) });
            let open = sessions
                .values()
                .flatten()
                .filter(|p| &p.source == name && p.log == id)
                .map(|p| (p.next, p.lsn()));
            let head = source.log.head();
            let (next, lsn) = match durable.chain(open).min_by_key(|(next, _)| *next) {
                Some(least) if least.0 < head.next_seq => least,
                _ => (head.next_seq, head.last_lsn),
            };
            source.context.acked.send_if_modified(|acked| {
                let forward = next > acked.next;
                if forward {
                    *acked = LogPosition { next, lsn };
                }
                forward
            });
        }
    }

    /// Keeps the sink's acknowledgements up with consumers, sessions and
    /// the logs, until the feed stops.
    pub async fn hold(self: Arc<Self>) {
        let mut held = self.held.subscribe();
        let mut heads: Vec<_> = self.logs.iter().map(|l| l.log.subscribe()).collect();
        let mut floors = Vec::new();
        let mut refreshed = None::<Instant>;
        let mut stopping = self.stopping.clone();
        let refresh = (self.retention / 4).clamp(RETENTION_REFRESH.0, RETENTION_REFRESH.1);
        loop {
            if refreshed.is_none_or(|t| t.elapsed() >= refresh) {
                let feed = self.clone();
                floors = tokio::task::spawn_blocking(move || {
                    feed.logs
                        .iter()
                        .map(|l| {
                            l.log.written_within(feed.retention).unwrap_or_else(|e| {
                                tracing::warn!(sink = %feed.sink, source = %l.context.name, "cannot tell what retention keeps: {e}");
                                (0, Lsn::ZERO)
                            })
                        })
                        .collect()
                })
                .await
                .unwrap_or_default();
                refreshed = Some(Instant::now());
            }
            self.acknowledge_holds(&floors);
            let head_moved = select_all(heads.iter_mut().map(|h| Box::pin(h.changed())));
            tokio::select! {
                _ = held.changed() => {}
                _ = head_moved => {}
                _ = tokio::time::sleep(refresh) => {}
                _ = stopping.wait_for(|s| *s) => return,
            }
        }
    }

    pub fn session_count(&self) -> usize {
        self.sessions().len()
    }

    /// How far `consumer` is behind each source's log now (sources it has
    /// a position in that this feed still reads).
    pub fn lags(&self, consumer: &Consumer) -> Vec<Lag> {
        consumer
            .positions
            .iter()
            .filter_map(|p| {
                let head = self.log(&p.source).ok()?.log.head();
                Some(Lag {
                    source: p.source.clone(),
                    lsn: p.lsn(),
                    records: head.next_seq.saturating_sub(p.next),
                    bytes: head.last_lsn.0.saturating_sub(p.lsn),
                })
            })
            .collect()
    }

    fn consumer_message(&self, name: &str, consumer: &Consumer) -> pb::Consumer {
        pb::Consumer {
            consumer: name.to_owned(),
            connected: consumer.connected(),
            partitions: consumer.partition_count(),
            members: consumer.members,
            positions: self
                .lags(consumer)
                .into_iter()
                .map(|lag| pb::ConsumerPosition {
                    source: lag.source,
                    lsn: lag.lsn.to_string(),
                    lag_records: lag.records,
                    lag_bytes: lag.bytes,
                })
                .collect(),
            acknowledged_at: Some(timestamp(
                consumer
                    .acknowledged_at
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| d.as_micros() as i64),
            )),
        }
    }

    /// Gives every consumer a position in every source (created with a
    /// sink whose sources have changed since) and creates the configured
    /// ones.
    pub fn settle_consumers(&self, declared: &[String]) -> Result<(), FeedError> {
        for name in declared {
            if self.consumers.get(name).is_none() {
                let (origin, positions) = self.resolve(Some(&pb::Start {
                    position: Some(pb::start::Position::Earliest(pb::Earliest {})),
                }))?;
                self.consumers.create(name, origin, positions, None)?;
                tracing::info!(sink = %self.sink, consumer = %name, "durable consumer created from the configuration, at the log's start");
            }
        }
        for (name, consumer) in self.consumers.list() {
            let missing = self
                .logs
                .iter()
                .filter(|l| {
                    !consumer
                        .positions
                        .iter()
                        .any(|p| p.source == l.context.name)
                })
                .map(|l| Self::origin_position(l, consumer.origin))
                .collect::<Result<Vec<_>, _>>()?;
            if !missing.is_empty() {
                self.consumers.acknowledge(&name, &[], &missing)?;
            }
        }
        Ok(())
    }
}

/// A durable consumer's distance from the end of one source's log.
pub(crate) struct Lag {
    pub source: String,
    /// Where the consumer is.
    pub lsn: Lsn,
    pub records: u64,
    /// WAL bytes.
    pub bytes: u64,
}

/// The gRPC service.
pub(crate) struct FeedService {
    pub feed: Arc<Feed>,
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, FeedError> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Status::internal(format!("the request's task failed: {e}")))?
        .map_err(|e| e.status())
}

/// A new group's partitions, as `group` asks; `None` when it is no group.
fn group_partitions(group: Option<&pb::Group>) -> Result<Option<u32>, FeedError> {
    match group.map(|g| g.partitions) {
        None => Ok(None),
        Some(0) => Ok(Some(DEFAULT_PARTITIONS)),
        Some(n) if n <= MAX_PARTITIONS => Ok(Some(n)),
        Some(n) => Err(FeedError::Invalid(format!(
            "group.partitions: {n} is more than {MAX_PARTITIONS}, the most a group has"
        ))),
    }
}

fn consumer_name(name: &str) -> Result<(), Status> {
    check_name(name).map_err(|e| FeedError::Invalid(format!("consumer: {e}")).status())
}

/// What a session holds until it ends: its claim on a durable consumer,
/// its place among the holds, its membership of a group.
struct SessionGuard {
    feed: Arc<Feed>,
    id: u64,
    /// The group it is a member of.
    group: Option<String>,
    _claim: Option<Claim>,
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.feed.sessions().remove(&self.id);
        if let Some(group) = &self.group {
            self.feed.groups.leave(group, self.id);
        }
        self.feed.held.send_replace(());
    }
}

/// A subscription as opened: the durable consumer claimed (none for an
/// ephemeral one), whether this open created it, its partitions when it is
/// a group, and each source's log with the position the session starts
/// from.
struct Opened {
    claim: Option<Claim>,
    created: bool,
    partitions: u32,
    sources: Vec<(SourceLog, TokenPosition)>,
}

impl FeedService {
    /// The subscription's sources, consumer and positions; the consumer
    /// claimed (and created, when new).
    fn open(&self, open: &pb::Open) -> Result<Opened, FeedError> {
        let feed = &self.feed;
        let wanted: Vec<&SourceLog> = match &open.filter {
            Some(f) if !f.sources.is_empty() => f
                .sources
                .iter()
                .map(|s| feed.log(s))
                .collect::<Result<_, _>>()?,
            _ => feed.logs.iter().collect(),
        };
        if wanted.is_empty() {
            return Err(FeedError::Invalid("this feed reads no source".into()));
        }
        let group = group_partitions(open.group.as_ref())?;
        let (claim, created, partitions, positions, holder) = if open.consumer.is_empty() {
            if group.is_some() {
                return Err(FeedError::Invalid(
                    "open.group needs open.consumer: a group is a durable consumer".into(),
                ));
            }
            let (_, positions) = feed.resolve(open.start.as_ref())?;
            (None, false, 0, positions, "the start position".to_owned())
        } else {
            let name = &open.consumer;
            check_name(name).map_err(|e| FeedError::Invalid(format!("open.consumer: {e}")))?;
            let created = match feed.consumers.get(name) {
                Some(_) => false,
                None => {
                    let (origin, positions) = feed.resolve(open.start.as_ref())?;
                    match feed.consumers.create(name, origin, positions, group) {
                        Ok(_) => true,
                        // Created meanwhile by another request: use it.
                        Err(FeedError::ConsumerExists(_)) => false,
                        Err(e) => return Err(e),
                    }
                }
            };
            let (claim, consumer) = feed.consumers.claim(name, group.is_some())?;
            let mut positions = consumer.positions.clone();
            for l in &feed.logs {
                if !positions.iter().any(|p| p.source == l.context.name) {
                    positions.push(Feed::origin_position(l, consumer.origin)?);
                }
            }
            (
                Some(claim),
                created,
                consumer.partition_count(),
                positions,
                format!("durable consumer `{name}`"),
            )
        };
        let sources = wanted
            .into_iter()
            .map(|l| {
                let position = positions
                    .iter()
                    .find(|p| p.source == l.context.name)
                    .cloned()
                    .map_or_else(|| Feed::origin_position(l, Origin::Latest), Ok)?;
                Ok((l.clone(), feed.check(&position, &holder)?))
            })
            .collect::<Result<_, FeedError>>()?;
        Ok(Opened {
            claim,
            created,
            partitions,
            sources,
        })
    }
}

#[tonic::async_trait]
impl pb::change_feed_server::ChangeFeed for FeedService {
    type SubscribeStream = ReceiverStream<Result<pb::SubscribeResponse, Status>>;

    async fn subscribe(
        &self,
        request: Request<Streaming<pb::SubscribeRequest>>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let mut requests = request.into_inner();
        let first = tokio::time::timeout(OPEN_TIMEOUT, requests.message())
            .await
            .map_err(|_| {
                Status::deadline_exceeded(format!(
                    "no `open` within {OPEN_TIMEOUT:?} of subscribing"
                ))
            })??;
        let Some(pb::SubscribeRequest {
            request: Some(subscribe_request::Request::Open(open)),
        }) = first
        else {
            return Err(Status::invalid_argument(
                "the first message of Subscribe must be `open`",
            ));
        };
        let filter = Filter::new(open.filter.clone())?;
        let heartbeat = match open.heartbeat_interval_ms {
            0 => DEFAULT_HEARTBEAT,
            ms => Duration::from_millis(u64::from(ms)).max(MIN_HEARTBEAT),
        };
        let service = FeedService {
            feed: self.feed.clone(),
        };
        let opened = open.clone();
        let Opened {
            claim,
            created,
            partitions,
            sources,
        } = blocking(move || service.open(&opened)).await?;
        let member = partitions > 0;
        let feed = self.feed.clone();
        let id = feed.next_session.fetch_add(1, Ordering::Relaxed);
        let names: Vec<String> = sources
            .iter()
            .map(|(l, _)| l.context.name.clone())
            .collect();
        feed.sessions()
            .insert(id, sources.iter().map(|(_, p)| p.clone()).collect());
        feed.held.send_replace(());
        let guard = SessionGuard {
            feed: feed.clone(),
            id,
            group: member.then(|| open.consumer.clone()),
            _claim: claim,
        };
        if member {
            feed.groups.join(&open.consumer, id, partitions);
        }
        let session_sources = sources
            .iter()
            .map(|(l, p)| SessionSource::open(l, p.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        let (out, stream) = mpsc::channel(SESSION_QUEUE);
        let subscribed = pb::Subscribed {
            consumer: open.consumer.clone(),
            created,
            sources: sources
                .iter()
                .map(|(_, p)| pb::SourcePosition {
                    source: p.source.clone(),
                    lsn: p.lsn().to_string(),
                    from_beginning: p.next == 0,
                })
                .collect(),
        };
        out.send(Ok(respond(Event::Subscribed(subscribed))))
            .await
            .map_err(|_| Status::cancelled("the subscriber went away"))?;
        tracing::info!(sink = %feed.sink, consumer = %open.consumer, sources = ?names, "subscriber connected");

        let flow = Arc::new(Flow::new(open.flow.as_ref()));
        let (cancel, cancelled) = watch::channel(false);
        let counters = SessionCounters::new(&feed.sink, &open.consumer);
        let session = Session {
            sink: feed.sink.clone(),
            sources: session_sources,
            encoder: Encoder::new(filter, open.text_values),
            heartbeat,
            flow: flow.clone(),
            out: out.clone(),
            cancel: cancelled,
            stopping: feed.stopping.clone(),
            membership: member.then(|| {
                Membership::new(
                    feed.groups.clone(),
                    feed.consumers.clone(),
                    open.consumer.clone(),
                    id,
                )
            }),
            counters: counters.clone(),
        };
        tokio::spawn(session.run());
        tokio::spawn(follow(
            requests,
            FollowState {
                guard,
                consumer: open.consumer.clone(),
                member,
                names,
                flow,
                cancel,
                out,
                counters,
            },
        ));
        Ok(Response::new(ReceiverStream::new(stream)))
    }

    async fn create_consumer(
        &self,
        request: Request<pb::CreateConsumerRequest>,
    ) -> Result<Response<pb::Consumer>, Status> {
        let request = request.into_inner();
        consumer_name(&request.consumer)?;
        let feed = self.feed.clone();
        let consumer = blocking(move || {
            let (origin, positions) = feed.resolve(request.start.as_ref())?;
            let partitions = group_partitions(request.group.as_ref())?;
            let consumer =
                feed.consumers
                    .create(&request.consumer, origin, positions, partitions)?;
            feed.held.send_replace(());
            Ok(feed.consumer_message(&request.consumer, &consumer))
        })
        .await?;
        Ok(Response::new(consumer))
    }

    async fn delete_consumer(
        &self,
        request: Request<pb::DeleteConsumerRequest>,
    ) -> Result<Response<pb::DeleteConsumerResponse>, Status> {
        let name = request.into_inner().consumer;
        consumer_name(&name)?;
        let feed = self.feed.clone();
        blocking(move || {
            feed.consumers.delete(&name)?;
            feed.held.send_replace(());
            tracing::info!(sink = %feed.sink, consumer = %name, "durable consumer deleted");
            Ok(())
        })
        .await?;
        Ok(Response::new(pb::DeleteConsumerResponse {}))
    }

    async fn list_consumers(
        &self,
        _: Request<pb::ListConsumersRequest>,
    ) -> Result<Response<pb::ListConsumersResponse>, Status> {
        let consumers = self
            .feed
            .consumers
            .list()
            .iter()
            .map(|(name, c)| self.feed.consumer_message(name, c))
            .collect();
        Ok(Response::new(pb::ListConsumersResponse { consumers }))
    }

    async fn seek(
        &self,
        request: Request<pb::SeekRequest>,
    ) -> Result<Response<pb::Consumer>, Status> {
        let request = request.into_inner();
        consumer_name(&request.consumer)?;
        let feed = self.feed.clone();
        let consumer = blocking(move || {
            let (origin, positions) = feed.resolve(request.start.as_ref())?;
            let consumer = feed.consumers.seek(&request.consumer, origin, positions)?;
            feed.held.send_replace(());
            Ok(feed.consumer_message(&request.consumer, &consumer))
        })
        .await?;
        Ok(Response::new(consumer))
    }
}

/// An acknowledgement to store.
#[derive(Clone)]
struct Pending {
    partitions: Vec<u32>,
    positions: Vec<TokenPosition>,
    frees: Option<Token>,
}

/// What [`follow`] works with.
struct FollowState {
    guard: SessionGuard,
    /// The durable consumer, empty when ephemeral.
    consumer: String,
    /// Whether the session is a member of the consumer's group.
    member: bool,
    /// The session's sources, in its order.
    names: Vec<String>,
    flow: Arc<Flow>,
    cancel: watch::Sender<bool>,
    out: mpsc::Sender<Result<pb::SubscribeResponse, Status>>,
    counters: SessionCounters,
}

/// Follows a subscriber's requests: acknowledgements free its window,
/// move its hold and (durable) are stored; ends the session when the
/// subscriber or the feed goes. A group member's acknowledgement frees
/// its window only once stored, so an empty window means its partitions'
/// positions are on disk (what a rebalance waits for); one of an earlier
/// assignment is ignored.
async fn follow(mut requests: Streaming<pb::SubscribeRequest>, state: FollowState) {
    let FollowState {
        guard,
        consumer,
        member,
        names,
        flow,
        cancel,
        out,
        counters,
    } = state;
    let feed = guard.feed.clone();
    let mut stopping = feed.stopping.clone();
    // The latest acknowledgement not stored yet: stored one at a time,
    // the newest first, so a fast subscriber waits on no fsync. With the
    // partitions it covers (a group member's) and, for a member, the token
    // whose window to free once stored.
    let (store_tx, mut store_rx) = watch::channel(None::<Pending>);
    let storing = (!consumer.is_empty()).then(|| {
        let feed = feed.clone();
        let consumer = consumer.clone();
        let (flow, names) = (flow.clone(), names.clone());
        tokio::spawn(async move {
            loop {
                let closed = store_rx.changed().await.is_err();
                let pending = store_rx.borrow_and_update().clone();
                if let Some(Pending {
                    partitions,
                    positions,
                    frees,
                }) = pending
                {
                    let (consumers, name) = (feed.consumers.clone(), consumer.clone());
                    let stored = tokio::task::spawn_blocking(move || {
                        consumers.acknowledge(&name, &partitions, &positions)
                    })
                    .await;
                    if let (Ok(Ok(())), Some(token)) = (&stored, frees) {
                        flow.acknowledged(&token, &names);
                    }
                    match stored {
                        Ok(Ok(())) => feed.held.send_replace(()),
                        Ok(Err(e)) => tracing::error!(sink = %feed.sink, "{e}"),
                        Err(e) => tracing::error!(sink = %feed.sink, consumer = %consumer, "storing the acknowledgement failed: {e}"),
                    }
                }
                if closed {
                    return;
                }
            }
        })
    });
    let failure = loop {
        let message = tokio::select! {
            m = requests.message() => m,
            _ = stopping.wait_for(|s| *s) => break None,
            _ = out.closed() => break None,
        };
        let request = match message {
            Ok(Some(pb::SubscribeRequest { request: Some(r) })) => r,
            Ok(Some(pb::SubscribeRequest { request: None })) => {
                break Some(Status::invalid_argument(
                    "an empty request: send `ack` or `flow`",
                ));
            }
            Ok(None) | Err(_) => break None,
        };
        match request {
            subscribe_request::Request::Ack(ack) => {
                counters.acknowledgements.increment(1);
                let Some(token) = Token::parse(&ack.resume_token) else {
                    break Some(Status::invalid_argument(
                        "ack.resume_token is not a token of this feed",
                    ));
                };
                let partitions = if member {
                    match feed.groups.held(&consumer, guard.id, token.generation) {
                        Some(partitions) => partitions,
                        None => continue,
                    }
                } else {
                    Vec::new()
                };
                let positions: Vec<TokenPosition> = token
                    .sources
                    .iter()
                    .filter(|p| names.contains(&p.source))
                    .cloned()
                    .collect();
                if !member {
                    flow.acknowledged(&token, &names);
                }
                if let Some(held) = feed.sessions().get_mut(&guard.id) {
                    for p in &positions {
                        if let Some(h) = held
                            .iter_mut()
                            .find(|h| h.source == p.source && h.next < p.next)
                        {
                            *h = p.clone();
                        }
                    }
                }
                feed.held.send_replace(());
                if storing.is_some() {
                    store_tx.send_replace(Some(Pending {
                        partitions,
                        positions,
                        frees: member.then_some(token),
                    }));
                }
            }
            subscribe_request::Request::Flow(limits) => flow.set_limits(&limits),
            subscribe_request::Request::Open(_) => {
                break Some(Status::invalid_argument(
                    "`open` was sent twice: a stream opens once",
                ));
            }
        }
    };
    cancel.send_replace(true);
    if let Some(status) = failure {
        let _ = out.send(Err(status)).await;
    }
    drop(store_tx);
    if let Some(storing) = storing {
        let _ = storing.await;
    }
    tracing::info!(sink = %feed.sink, consumer = %consumer, "subscriber disconnected");
    drop(guard);
}
