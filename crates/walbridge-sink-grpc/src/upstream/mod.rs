//! `[[source]] type = "grpc"`: another walbridge's change feed as a
//! source, so walbridges cascade across networks and fan in.
//!
//! # Exactly once into this log
//!
//! The source reads one upstream source as a durable consumer and hands
//! its units (transactions, the copy, messages) to this walbridge's log
//! with the upstream's own LSNs, so the log orders and deduplicates them
//! as it does a publisher's:
//!
//! * **Acknowledged only once durable here.** Each resume token the feed
//!   sends is acknowledged upstream only when this log's durable end has
//!   reached the LSN of the unit it closes; so the upstream position is
//!   never past this log, and after any crash on either side the feed
//!   resumes at or before this log's end.
//! * **What the log holds is skipped.** A unit ending at or before the
//!   last LSN the log holds (or this run handed on) is not handed on again.
//! * **No gap.** A subscription that would start past this log's end (the
//!   upstream consumer was moved or recreated) is refused, as is a fresh
//!   log whose upstream no longer holds the initial copy (unless `start =
//!   "latest"`).
//! * **Whole units.** A unit is handed on when its end arrives, unless it
//!   outgrows [`UNIT_BUFFER`] (or is the initial copy): then it streams
//!   into the log as it comes, and a stream broken before its end stops
//!   the source (the log cuts the partial unit back when walbridge starts
//!   again, and the unit is read again).

mod config;
mod decode;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use walbridge_core::{Lsn, SnapshotBatch, SourceEvent, TransactionInfo};
use walbridge_log::Appender;
use walbridge_source::{Backoff, Downstream, SourcePhase, SourceStats};

pub use config::{FeedSourceConfig, FeedStart};
use decode::{Malformed, Relations};

use crate::pb::{self, subscribe_response::Event};

/// A transaction up to this size (approximately, in bytes) is handed on
/// only once it is whole, so a broken stream costs nothing; a larger one
/// streams into the log.
pub const UNIT_BUFFER: usize = 16 << 20;

/// Events per batch handed to the log.
const BATCH: usize = 256;

/// How long connecting to the feed may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What stops a feed source.
#[derive(Debug, thiserror::Error)]
pub enum FeedSourceError {
    /// The feed cannot be reached or the stream broke; tried again.
    #[error("source `{source_name}`: {what}")]
    Unreachable {
        /// The source.
        source_name: String,
        /// What failed.
        what: String,
    },
    /// The feed refused the subscription or ended it with a status.
    #[error("source `{source_name}`: the feed at {url} answered {code:?}: {message}")]
    Refused {
        /// The source.
        source_name: String,
        /// The feed's URL.
        url: String,
        /// The status code.
        code: tonic::Code,
        /// The feed's message.
        message: String,
    },
    /// The subscription cannot go on without a gap, a duplicate or a guess.
    #[error("source `{source_name}`: {what}")]
    Unusable {
        /// The source.
        source_name: String,
        /// What is wrong and what to do.
        what: String,
    },
    /// This walbridge's log stopped taking events.
    #[error("source `{0}`: the log stopped taking events")]
    Closed(String),
}

impl FeedSourceError {
    /// Worth subscribing again.
    pub fn is_transient(&self) -> bool {
        match self {
            FeedSourceError::Unreachable { .. } => true,
            FeedSourceError::Refused { code, .. } => matches!(
                code,
                tonic::Code::Unavailable
                    | tonic::Code::Unknown
                    | tonic::Code::Internal
                    | tonic::Code::Aborted
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::ResourceExhausted
                    | tonic::Code::Cancelled
                    // The consumer's previous session (this walbridge,
                    // killed) may not have ended upstream yet.
                    | tonic::Code::FailedPrecondition
            ),
            FeedSourceError::Unusable { .. } | FeedSourceError::Closed(_) => false,
        }
    }
}

/// A configured feed source.
pub struct FeedSource {
    config: FeedSourceConfig,
    state_dir: PathBuf,
    stats: Arc<SourceStats>,
}

/// Resume tokens waiting for this log to make their unit durable.
#[derive(Default)]
struct Acknowledgements {
    waiting: VecDeque<(Lsn, Bytes)>,
}

impl Acknowledgements {
    /// The newest token whose unit is durable, taking it and every older one.
    fn durable(&mut self, durable: Lsn) -> Option<Bytes> {
        let mut newest = None;
        while self.waiting.front().is_some_and(|(lsn, _)| *lsn <= durable) {
            newest = self.waiting.pop_front().map(|(_, token)| token);
        }
        newest
    }
}

/// One subscription's state.
struct Reading<'a> {
    name: &'a str,
    events: &'a mpsc::Sender<Vec<SourceEvent>>,
    stats: &'a SourceStats,
    relations: Relations,
    /// The unit being received: its events not yet handed on.
    unit: Vec<SourceEvent>,
    unit_bytes: usize,
    /// The transaction being received, unless the log holds it already.
    transaction: Option<Arc<TransactionInfo>>,
    /// A transaction the log holds already, being passed over.
    skipping: bool,
    /// Part of the current unit is in the log already.
    partial: bool,
    /// The end of the last unit handed on (or held by the log at start).
    handed: &'a mut Lsn,
    acks: Acknowledgements,
}

impl FeedSource {
    /// Prepares a feed source; `data_dir` is walbridge's state directory.
    pub fn new(config: FeedSourceConfig, data_dir: &Path) -> FeedSource {
        let state_dir = data_dir.join("sources").join(&config.name);
        FeedSource {
            config,
            state_dir,
            stats: Arc::new(SourceStats::default()),
        }
    }

    /// The source's configuration.
    pub fn config(&self) -> &FeedSourceConfig {
        &self.config
    }

    /// Live counters.
    pub fn stats(&self) -> Arc<SourceStats> {
        self.stats.clone()
    }

    /// The source's directory under `data_dir` (its log).
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// Removes the source's directory.
    pub fn remove_state(&self) -> std::io::Result<()> {
        match std::fs::remove_dir_all(&self.state_dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    fn unreachable(&self, what: impl std::fmt::Display) -> FeedSourceError {
        FeedSourceError::Unreachable {
            source_name: self.config.name.clone(),
            what: format!("the feed at {}: {what}", self.config.url),
        }
    }

    fn refused(&self, status: tonic::Status) -> FeedSourceError {
        FeedSourceError::Refused {
            source_name: self.config.name.clone(),
            url: self.config.url.clone(),
            code: status.code(),
            message: status.message().to_owned(),
        }
    }

    fn unusable(&self, what: impl Into<String>) -> FeedSourceError {
        FeedSourceError::Unusable {
            source_name: self.config.name.clone(),
            what: what.into(),
        }
    }

    /// A channel to the feed.
    pub async fn connect(&self) -> Result<Channel, FeedSourceError> {
        let mut endpoint = Endpoint::from_shared(self.config.url.clone())
            .map_err(|e| self.unusable(format!("url {:?}: {e}", self.config.url)))?
            .connect_timeout(CONNECT_TIMEOUT)
            .http2_keep_alive_interval(Duration::from_secs(20))
            .keep_alive_timeout(Duration::from_secs(20));
        if self.config.tls() {
            let read = |path: &Path| {
                std::fs::read(path).map_err(|e| self.unusable(format!("{}: {e}", path.display())))
            };
            let mut tls = ClientTlsConfig::new();
            tls = match &self.config.tls_ca {
                Some(ca) => tls.ca_certificate(Certificate::from_pem(read(ca)?)),
                None => tls.with_native_roots(),
            };
            if let (Some(cert), Some(key)) = (&self.config.tls_cert, &self.config.tls_key) {
                tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
            }
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| self.unusable(format!("TLS settings: {e}")))?;
        }
        endpoint
            .connect()
            .await
            .map_err(|e| self.unreachable(walbridge_core::describe(&e)))
    }

    /// Whether the feed answers its health check, as a line to show.
    pub async fn check(&self) -> Result<String, FeedSourceError> {
        let channel = self.connect().await?;
        let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
        let answer = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: "walbridge.feed.v1.ChangeFeed".into(),
            })
            .await
            .map_err(|s| self.refused(s))?;
        Ok(format!(
            "source `{}`: the feed at {} answers ({:?})",
            self.config.name,
            self.config.url,
            answer.into_inner().status()
        ))
    }

    /// Deletes the durable consumer upstream, so the feed keeps nothing
    /// more for it; false when it did not exist.
    pub async fn delete_consumer(&self) -> Result<bool, FeedSourceError> {
        let channel = self.connect().await?;
        let mut client = pb::change_feed_client::ChangeFeedClient::new(channel);
        let request = self.authorized(pb::DeleteConsumerRequest {
            consumer: self.config.consumer_name(),
        })?;
        match client.delete_consumer(request).await {
            Ok(_) => Ok(true),
            Err(status) if status.code() == tonic::Code::NotFound => Ok(false),
            Err(status) => Err(self.refused(status)),
        }
    }

    /// `message` as a request carrying the token, if there is one.
    fn authorized<T>(&self, message: T) -> Result<tonic::Request<T>, FeedSourceError> {
        let mut request = tonic::Request::new(message);
        if let Some(token) = &self.config.token {
            let value = format!("Bearer {}", token.reveal())
                .parse()
                .map_err(|_| self.unusable("token holds characters a header cannot carry"))?;
            request.metadata_mut().insert("authorization", value);
        }
        Ok(request)
    }

    /// Runs until `shutdown` turns true or a permanent error; transient
    /// failures are retried with exponential backoff.
    pub async fn run(
        &self,
        downstream: Downstream,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<(), FeedSourceError> {
        let Downstream {
            events,
            mut durable,
            resume_after,
            ..
        } = downstream;
        let mut handed = resume_after;
        let mut backoff = Backoff::default();
        let result = loop {
            self.stats.set_phase(SourcePhase::Starting);
            let mut streamed = false;
            let result = self
                .subscribe(
                    &events,
                    &mut durable,
                    &mut shutdown,
                    &mut handed,
                    &mut streamed,
                )
                .await;
            if streamed {
                backoff.reset();
            }
            match result {
                Ok(()) => break Ok(()),
                Err(e) if e.is_transient() && !*shutdown.borrow() => {
                    if !backoff
                        .wait(&self.stats, &self.config.name, e, &mut shutdown)
                        .await
                    {
                        break Ok(());
                    }
                }
                Err(e) => break Err(e),
            }
        };
        self.stats.set_phase(SourcePhase::Stopped);
        result
    }

    async fn subscribe(
        &self,
        events: &mpsc::Sender<Vec<SourceEvent>>,
        durable: &mut watch::Receiver<Lsn>,
        shutdown: &mut watch::Receiver<bool>,
        handed: &mut Lsn,
        streamed: &mut bool,
    ) -> Result<(), FeedSourceError> {
        let channel = self.connect().await?;
        let mut client = pb::change_feed_client::ChangeFeedClient::new(channel)
            .max_decoding_message_size(usize::MAX);
        let (requests, requests_rx) = mpsc::channel::<pb::SubscribeRequest>(16);
        let open = pb::Open {
            consumer: self.config.consumer_name(),
            start: Some(pb::Start {
                position: Some(match self.config.start {
                    FeedStart::Earliest => pb::start::Position::Earliest(pb::Earliest {}),
                    FeedStart::Latest => pb::start::Position::Latest(pb::Latest {}),
                }),
            }),
            filter: self.config.upstream_source.as_ref().map(|s| pb::Filter {
                sources: vec![s.clone()],
                ..Default::default()
            }),
            text_values: true,
            // Acknowledgements wait for this log, which takes the initial
            // copy as one unit: a window would close in the middle of it
            // for good. The stream's own (HTTP/2) flow control holds the
            // feed back while the log is slower.
            flow: Some(pb::FlowControl {
                max_events: u32::MAX,
                max_bytes: u64::MAX,
            }),
            ..Default::default()
        };
        let opened = requests
            .send(pb::SubscribeRequest {
                request: Some(pb::subscribe_request::Request::Open(open)),
            })
            .await;
        if opened.is_err() {
            return Err(self.unreachable("the request stream closed"));
        }
        let request = self.authorized(ReceiverStream::new(requests_rx))?;
        let mut stream = client
            .subscribe(request)
            .await
            .map_err(|s| self.refused(s))?
            .into_inner();
        let subscribed = match stream.message().await.map_err(|s| self.refused(s))? {
            Some(pb::SubscribeResponse {
                event: Some(Event::Subscribed(s)),
            }) => s,
            _ => return Err(self.unreachable("the stream ended before `subscribed`")),
        };
        self.check_start(&subscribed, *handed)?;
        tracing::info!(source = %self.config.name, consumer = %subscribed.consumer, created = subscribed.created, after = %handed, "subscribed to the feed at {}", self.config.url);
        self.stats.set_phase(SourcePhase::Streaming);
        *streamed = true;

        let mut reading = Reading {
            name: &self.config.name,
            events,
            stats: &self.stats,
            relations: Relations::default(),
            unit: Vec::new(),
            unit_bytes: 0,
            transaction: None,
            skipping: false,
            partial: false,
            handed,
            acks: Acknowledgements::default(),
        };
        let result = loop {
            tokio::select! {
                message = stream.message() => match message {
                    Ok(Some(pb::SubscribeResponse { event: Some(event) })) => {
                        if let Err(e) = reading.take(event).await {
                            break Err(e.into_error(self));
                        }
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => break Err(self.unreachable("the feed ended the stream")),
                    Err(status) => break Err(self.refused(status)),
                },
                changed = durable.changed() => {
                    if changed.is_err() {
                        break Err(FeedSourceError::Closed(self.config.name.clone()));
                    }
                }
                _ = shutdown.changed() => break Ok(()),
            }
            let lsn = *durable.borrow_and_update();
            if let Some(token) = reading.acks.durable(lsn) {
                let ack = pb::SubscribeRequest {
                    request: Some(pb::subscribe_request::Request::Ack(pb::Ack {
                        resume_token: token,
                    })),
                };
                if requests.send(ack).await.is_err() {
                    break Err(self.unreachable("the request stream closed"));
                }
                self.stats.confirmed.fetch_max(lsn.0, Ordering::Relaxed);
            }
        };
        if result.is_err() && reading.partial {
            return Err(self.unusable(format!(
                "{}; the stream broke in the middle of a unit already partly in the log, so the source stops: when walbridge starts again the log cuts the partial unit back and the feed sends it again",
                result.err().map(|e| e.to_string()).unwrap_or_default()
            )));
        }
        result
    }

    /// Refuses a subscription that would leave a gap in this log.
    fn check_start(&self, subscribed: &pb::Subscribed, handed: Lsn) -> Result<(), FeedSourceError> {
        let names: Vec<&str> = subscribed
            .sources
            .iter()
            .map(|s| s.source.as_str())
            .collect();
        let position = match (&self.config.upstream_source, subscribed.sources.as_slice()) {
            (Some(wanted), sources) => sources.iter().find(|s| &s.source == wanted).ok_or_else(|| {
                self.unusable(format!(
                    "the feed at {} has no source `{wanted}` (it has: {}); set upstream_source to one of them",
                    self.config.url,
                    names.join(", ")
                ))
            })?,
            (None, [only]) => only,
            (None, _) => {
                return Err(self.unusable(format!(
                    "the feed at {} serves the sources {}: set upstream_source to the one this source reads (one [[source]] each)",
                    self.config.url,
                    names.join(", ")
                )));
            }
        };
        let starts_after = decode::lsn(&position.lsn, "subscribed.sources.lsn")
            .map_err(|Malformed(e)| self.unusable(e))?;
        let consumer = self.config.consumer_name();
        if handed == Lsn::ZERO
            && self.config.start == FeedStart::Earliest
            && !position.from_beginning
        {
            return Err(self.unusable(format!(
                "the feed no longer holds the initial copy of `{}` (its consumer `{consumer}` starts after {starts_after}), and this log is empty: list `{consumer}` in the upstream sink's `consumers` (and start the upstream afresh) so its log is kept from the copy on, or set start = \"latest\" to begin with what is committed from now on",
                position.source
            )));
        }
        if handed != Lsn::ZERO && starts_after > handed {
            return Err(self.unusable(format!(
                "consumer `{consumer}` of the feed at {} starts after {starts_after}, but this log ends at {handed}: what lies between would be missing. Move the consumer back (Seek to {handed} of `{}`), or `walbridge drop --source {}` to start over",
                self.config.url, position.source, self.config.name
            )));
        }
        Ok(())
    }
}

/// Why reading an event failed.
enum TakeError {
    Malformed(Malformed),
    Closed,
}

impl TakeError {
    fn into_error(self, source: &FeedSource) -> FeedSourceError {
        match self {
            TakeError::Malformed(Malformed(what)) => source.unusable(format!(
                "the feed at {} sent what this walbridge cannot take: {what}",
                source.config.url
            )),
            TakeError::Closed => FeedSourceError::Closed(source.config.name.clone()),
        }
    }
}

impl From<Malformed> for TakeError {
    fn from(e: Malformed) -> Self {
        TakeError::Malformed(e)
    }
}

impl Reading<'_> {
    /// Takes one event of the feed.
    async fn take(&mut self, event: Event) -> Result<(), TakeError> {
        match event {
            Event::Relation(d) => self.relations.describe(d),
            Event::Begin(begin) => {
                let info = Arc::new(decode::transaction(&begin)?);
                self.skipping = info.end_lsn <= *self.handed;
                if !self.skipping {
                    self.push(SourceEvent::Begin(info.clone()), 0).await?;
                    self.transaction = Some(info);
                }
            }
            Event::Change(change) => {
                if !self.skipping {
                    let change = decode::change(change, &self.relations)?;
                    self.stats.count(&change);
                    let size = change.approximate_size();
                    self.push(SourceEvent::Change(change), size).await?;
                }
            }
            Event::Commit(commit) => {
                let end = decode::lsn(&commit.end_lsn, "commit.end_lsn")?;
                if let Some(info) = self.transaction.take() {
                    self.push(SourceEvent::Commit(info), 0).await?;
                    self.stats.transactions.fetch_add(1, Ordering::Relaxed);
                    self.end_unit(end).await?;
                }
                self.skipping = false;
                self.wait_for(end, commit.resume_token);
            }
            Event::Rows(rows) => {
                let at = decode::lsn(&rows.first_id.unwrap_or_default().lsn, "rows.first_id.lsn")?;
                if at > *self.handed {
                    let relation = self.relations.get(rows.relation)?.clone();
                    let count = rows.rows.len() as u64;
                    let batch = SnapshotBatch {
                        rows: decode::copy_rows(rows.rows, &relation)?,
                        relation,
                        consistent_point: at,
                    };
                    self.stats.set_phase(SourcePhase::Copying);
                    self.stats.snapshot.rows.fetch_add(count, Ordering::Relaxed);
                    // The copy is one unit however large: it streams in.
                    self.partial = true;
                    self.send(vec![SourceEvent::Snapshot(batch)]).await?;
                }
                if !rows.resume_token.is_empty() {
                    self.wait_for(at, rows.resume_token);
                }
            }
            Event::CopyComplete(complete) => {
                let at = decode::lsn(&complete.lsn, "copy_complete.lsn")?;
                if at > *self.handed {
                    self.send(vec![SourceEvent::SnapshotComplete {
                        consistent_point: at,
                    }])
                    .await?;
                    self.stats.set_phase(SourcePhase::Streaming);
                    self.partial = false;
                    *self.handed = at;
                }
                self.wait_for(at, complete.resume_token);
            }
            Event::Message(message) => {
                let token = message.resume_token.clone();
                let message = decode::message(message)?;
                let at = Appender::message_lsn(message.lsn);
                if at > *self.handed {
                    self.send(vec![SourceEvent::Message(message)]).await?;
                    *self.handed = at;
                }
                self.wait_for(at, token);
            }
            Event::Sequences(sequences) => {
                let token = sequences.resume_token.clone();
                let values = decode::sequences(sequences)?;
                let at = values.lsn;
                // Handed on again after a reconnect at the same place:
                // harmless, as a sequence never goes backwards.
                if at >= *self.handed {
                    self.send(vec![SourceEvent::Sequences(values)]).await?;
                    *self.handed = at;
                }
                self.wait_for(at, token);
            }
            Event::Progress(progress) => {
                // It covers units the feed sent nothing of (transactions
                // without changes), so it is acknowledged only once the
                // log's end is past where it is: the consumer's position
                // upstream never passes this log's end.
                let mut at = *self.handed;
                for position in progress.sources {
                    at = at.max(decode::lsn(&position.lsn, "progress.sources.lsn")?);
                }
                self.wait_for(at, progress.resume_token);
            }
            Event::Subscribed(_) | Event::Assignment(_) => {}
        }
        Ok(())
    }

    /// Holds `token` until the log has made `lsn` durable.
    fn wait_for(&mut self, lsn: Lsn, token: Bytes) {
        if !token.is_empty() {
            self.acks.waiting.push_back((lsn, token));
        }
    }

    /// Adds an event to the unit, streaming the unit on once it outgrows
    /// the buffer.
    async fn push(&mut self, event: SourceEvent, size: usize) -> Result<(), TakeError> {
        self.unit.push(event);
        self.unit_bytes += size;
        if self.unit_bytes >= UNIT_BUFFER || (self.partial && self.unit.len() >= BATCH) {
            self.partial = true;
            self.unit_bytes = 0;
            let events = std::mem::take(&mut self.unit);
            self.send(events).await?;
        }
        Ok(())
    }

    /// Hands the whole unit on; it ends at `end`.
    async fn end_unit(&mut self, end: Lsn) -> Result<(), TakeError> {
        let mut events = std::mem::take(&mut self.unit);
        self.unit_bytes = 0;
        while !events.is_empty() {
            let rest = events.split_off(events.len().min(BATCH));
            self.send(events).await?;
            events = rest;
        }
        self.partial = false;
        *self.handed = end;
        self.stats.received.fetch_max(end.0, Ordering::Relaxed);
        Ok(())
    }

    async fn send(&self, events: Vec<SourceEvent>) -> Result<(), TakeError> {
        self.events.send(events).await.map_err(|_| {
            tracing::debug!(source = %self.name, "the log's queue closed");
            TakeError::Closed
        })
    }
}
