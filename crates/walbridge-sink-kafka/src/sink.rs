//! The sink's run loop: events in, messages out, cursor stored behind the
//! deliveries.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use tokio::sync::mpsc;
use walbridge_core::{PgTimestamp, SourceEvent};
use walbridge_log::{CursorFile, CursorPosition, CursorState};
use walbridge_sink::{LogPosition, Routed, SourceContext};

use crate::client;
use crate::config::KafkaSinkConfig;
use crate::delivery::{DeliveryContext, Pending, Tracker, show_key};
use crate::error::{SinkError, transaction_failure};
use crate::event::{Emitter, Outgoing, SourceRef};
use crate::positions::{self, PositionRecord};
use crate::topic::Topics;

/// The longest the sink goes, while busy, without storing its cursor.
pub const COMMIT_INTERVAL: Duration = Duration::from_millis(100);

/// How long a stopping sink waits for its messages in flight.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a full producer queue is waited on before trying again.
const QUEUE_FULL_WAIT: Duration = Duration::from_millis(50);

/// How long a transaction commit, abort or initialization may take.
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);

/// A kafka sink ready to run.
pub struct KafkaSink {
    config: KafkaSinkConfig,
    cursor_file: CursorFile,
    cursor: CursorState,
    /// The producer, once connected (by [`KafkaSink::recover`] or
    /// [`KafkaSink::run`]).
    connected: Option<Connected>,
}

/// A producer connected to the cluster, with its delivery tracker.
struct Connected {
    producer: ThreadedProducer<DeliveryContext>,
    tracker: Arc<Tracker>,
}

/// Runs a blocking producer call off the runtime's threads.
async fn blocking<T: Send + 'static>(
    brokers: &str,
    call: impl FnOnce() -> T + Send + 'static,
) -> Result<T, SinkError> {
    tokio::task::spawn_blocking(call)
        .await
        .map_err(|e| SinkError::Unreachable {
            brokers: brokers.to_owned(),
            reason: format!("a producer call did not finish: {e}"),
        })
}

impl KafkaSink {
    /// Loads the sink's cursor from `cursor_dir` and checks the
    /// configuration. Does not connect: the cluster may be down, which
    /// [`KafkaSink::run`] reports (and the runtime retries) without holding
    /// up the sources.
    pub fn open(config: KafkaSinkConfig, cursor_dir: &Path) -> Result<Self, SinkError> {
        let problems = config.validate();
        if !problems.is_empty() {
            return Err(SinkError::Config(problems.join("; ")));
        }
        let cursor_file = CursorFile::new(cursor_dir, &config.name);
        let cursor = cursor_file.load()?.unwrap_or_default();
        Ok(KafkaSink {
            config,
            cursor_file,
            cursor,
            connected: None,
        })
    }

    /// The sink's name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The sink's cursor: where it goes on reading each source's log.
    pub fn cursor(&self) -> &CursorState {
        &self.cursor
    }

    /// Creates the producer and checks the cluster answers; a
    /// transactional producer also aborts what a predecessor left open.
    async fn connect(&mut self) -> Result<(), SinkError> {
        if self.connected.is_some() {
            return Ok(());
        }
        let context = DeliveryContext::new(&self.config.name, &self.config.brokers);
        let tracker = context.tracker.clone();
        let producer = client::producer(&self.config, context)?;
        let metadata_producer = producer.clone();
        let refusal = producer.context().reachability.refusal().clone();
        let brokers = client::check_reachable(
            move |timeout| metadata_producer.client().fetch_metadata(None, timeout),
            // The threaded producer polls on a thread of its own.
            || {},
            &refusal,
            &self.config.brokers,
        )
        .await?;
        tracing::info!(sink = %self.config.name, brokers, "Kafka cluster reachable");
        if self.config.exactly_once {
            let init = producer.clone();
            blocking(&self.config.brokers, move || {
                init.init_transactions(TRANSACTION_TIMEOUT)
            })
            .await?
            .map_err(|e| {
                transaction_failure(
                    "initializing Kafka transactions",
                    e,
                    &self.config.brokers,
                    &self.config.effective_transactional_id(),
                )
            })?;
        }
        self.connected = Some(Connected { producer, tracker });
        Ok(())
    }

    /// With `exactly_once`: connects, and takes the positions committed in
    /// Kafka as where to resume (they are ahead of or equal to the cursor
    /// file, which is stored after each commit). Nothing to do otherwise.
    pub async fn recover(&mut self) -> Result<(), SinkError> {
        if !self.config.exactly_once {
            return Ok(());
        }
        self.connect().await?;
        let config = self.config.clone();
        let recovered =
            blocking(&self.config.brokers, move || positions::recover(&config)).await??;
        for (source, position) in recovered {
            tracing::info!(sink = %self.config.name, source, next = position.next, "resuming from the position committed in Kafka");
            self.cursor.positions.insert(source, position);
        }
        Ok(())
    }

    /// Produces every event from `events` until the channel closes, then
    /// waits for the deliveries and stores the cursor.
    pub async fn run(mut self, mut events: mpsc::Receiver<Routed>) -> Result<(), SinkError> {
        self.connect().await?;
        let Some(Connected { producer, tracker }) = self.connected.take() else {
            return Err(SinkError::Config("the producer is not connected".into()));
        };
        let admin = if self.config.topic_creation.enabled {
            Some(client::admin(&self.config)?)
        } else {
            None
        };
        let mut run = Run {
            emitter: Emitter::new(&self.config)?,
            topics: Topics::new(
                admin,
                self.config.topic_creation.clone(),
                self.config
                    .exactly_once
                    .then(|| self.config.positions_topic.clone()),
            ),
            producer,
            tracker,
            sources: HashMap::new(),
            outgoing: Vec::new(),
            sealing: Vec::new(),
            transaction: self.config.exactly_once.then(|| Transaction {
                id: self.config.effective_transactional_id(),
                open: false,
                reached: HashMap::new(),
                unfinished: HashSet::new(),
            }),
            brokers: self.config.brokers.clone(),
            sink: self.config.name.clone(),
            passing: HashSet::new(),
        };
        let mut last_store = Instant::now();
        let mut tick = tokio::time::interval(COMMIT_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                routed = events.recv() => match routed {
                    Some(routed) => run.produce(routed).await?,
                    None => break,
                },
                _ = tick.tick() => {}
            }
            if last_store.elapsed() >= COMMIT_INTERVAL {
                self.commit(&mut run).await?;
                last_store = Instant::now();
            }
        }
        self.commit(&mut run).await?;
        let producer = run.producer.clone();
        let flushed = blocking(&self.config.brokers, move || producer.flush(FLUSH_TIMEOUT)).await?;
        self.store_delivered(&run)?;
        flushed.map_err(|e| SinkError::Unreachable {
            brokers: self.config.brokers.clone(),
            reason: format!(
                "{} messages were not delivered within {FLUSH_TIMEOUT:?} of stopping ({e}); they are sent again at the next start",
                run.tracker.in_flight()
            ),
        })
    }

    /// Makes what was produced count: with `exactly_once`, writes the
    /// positions reached and commits the Kafka transaction; then stores
    /// the delivered positions in the cursor file and acknowledges them.
    async fn commit(&mut self, run: &mut Run) -> Result<(), SinkError> {
        if let Some(transaction) = run.transaction.as_mut()
            && transaction.open
        {
            if !transaction.unfinished.is_empty() {
                return Ok(());
            }
            let reached = std::mem::take(&mut transaction.reached);
            for (source, position) in reached {
                let Some(context) = run.sources.get(&source) else {
                    continue;
                };
                let record = PositionRecord {
                    log: context.log_id.clone(),
                    next: position.next,
                    lsn: position.lsn.to_string(),
                };
                let message = Outgoing {
                    topic: self.config.positions_topic.clone(),
                    table: "-".into(),
                    key: Some(positions::record_key(&self.config.name, &source).into_bytes()),
                    value: Some(serde_json::to_vec(&record).unwrap_or_default()),
                    lsn: position.lsn,
                    xid: None,
                };
                run.send(&source, &message).await?;
            }
            let producer = run.producer.clone();
            let committed = blocking(&self.config.brokers, move || {
                producer.commit_transaction(TRANSACTION_TIMEOUT)
            })
            .await?;
            if let Err(e) = committed {
                let producer = run.producer.clone();
                // The next run starts from what Kafka committed; aborting
                // only frees the transaction sooner.
                let _ = blocking(&self.config.brokers, move || {
                    producer.abort_transaction(TRANSACTION_TIMEOUT)
                })
                .await;
                return Err(transaction_failure(
                    "committing a Kafka transaction",
                    e,
                    &self.config.brokers,
                    &self.config.effective_transactional_id(),
                ));
            }
            if let Some(transaction) = run.transaction.as_mut() {
                transaction.open = false;
            }
        }
        self.store_delivered(run)
    }

    /// Stores the positions whose messages are all delivered, then
    /// acknowledges them to their sources.
    fn store_delivered(&mut self, run: &Run) -> Result<(), SinkError> {
        if run.transaction.as_ref().is_some_and(|t| t.open) {
            // Delivered is not committed: wait for the commit.
            return Ok(());
        }
        let released = run.tracker.take_delivered()?;
        if released.is_empty() {
            return Ok(());
        }
        let mut latest = HashMap::new();
        for released in &released {
            latest.insert(released.source.clone(), released.position);
        }
        for (name, position) in &latest {
            if let Some(source) = run.sources.get(name) {
                self.cursor.positions.insert(
                    name.clone(),
                    CursorPosition {
                        log: source.log_id.clone(),
                        next: position.next,
                    },
                );
            }
        }
        self.cursor_file.store(&self.cursor)?;
        for (name, position) in latest {
            if let Some(source) = run.sources.get(&name) {
                source.acked.send_replace(position);
            }
        }
        for released in released {
            if let Some(source) = run.sources.get(&released.source) {
                for commit_time in released.commit_times {
                    source.delays.applied(commit_time);
                }
            }
        }
        Ok(())
    }
}

/// The open Kafka transaction of an `exactly_once` sink.
struct Transaction {
    /// The producer's transactional id.
    id: String,
    open: bool,
    /// Per source, the position the messages produced so far reach.
    reached: HashMap<String, LogPosition>,
    /// Sources whose last messages are part of a unit still coming: the
    /// transaction cannot commit before the unit is whole.
    unfinished: HashSet<String>,
}

/// The state of one run.
struct Run {
    emitter: Emitter,
    topics: Topics,
    producer: ThreadedProducer<DeliveryContext>,
    tracker: Arc<Tracker>,
    sources: HashMap<String, Arc<SourceContext>>,
    /// Messages of the event being handled (reused).
    outgoing: Vec<Outgoing>,
    /// Commit times of the transactions produced since the last sealed epoch.
    sealing: Vec<PgTimestamp>,
    /// With `exactly_once`: the Kafka transaction.
    transaction: Option<Transaction>,
    /// The bootstrap servers, for messages.
    brokers: String,
    /// The sink's name.
    sink: String,
    /// Sources inside a unit meant for another sink (passed over).
    passing: HashSet<String>,
}

impl Run {
    /// Produces the messages of a batch of events; seals the epoch when the
    /// batch ends a unit.
    async fn produce(&mut self, routed: Routed) -> Result<(), SinkError> {
        let source = routed.source.clone();
        self.sources
            .entry(source.name.clone())
            .or_insert_with(|| source.clone());
        let from = SourceRef {
            source: &source.name,
            database: &source.database,
        };
        for event in routed.events {
            self.outgoing.clear();
            // A unit for another sink (`resync --sink`): nothing of it.
            match &event {
                SourceEvent::Begin(info) if info.passes_over(&self.sink) => {
                    self.passing.insert(source.name.clone());
                    continue;
                }
                // (Empty but for such a unit: no hashing per change.)
                SourceEvent::Change(_)
                    if !self.passing.is_empty() && self.passing.contains(&source.name) =>
                {
                    continue;
                }
                SourceEvent::Commit(_)
                    if !self.passing.is_empty() && self.passing.remove(&source.name) =>
                {
                    continue;
                }
                _ => {}
            }
            match event {
                SourceEvent::Snapshot(batch) => {
                    self.emitter
                        .snapshot(from, &batch, &mut self.outgoing)
                        .await?
                }
                SourceEvent::SnapshotComplete { .. } => {}
                SourceEvent::Begin(info) => {
                    self.emitter.begin(from, info, &mut self.outgoing).await?
                }
                SourceEvent::Change(change) => {
                    self.emitter
                        .change(from, &change, &mut self.outgoing)
                        .await?
                }
                SourceEvent::Commit(info) => {
                    self.sealing.push(info.commit_time);
                    self.emitter.commit(from, &mut self.outgoing).await?
                }
                SourceEvent::Message(message) => {
                    self.emitter
                        .message(from, &message, &mut self.outgoing)
                        .await?
                }
                SourceEvent::Sequences(values) => {
                    self.emitter
                        .sequences(from, &values, &mut self.outgoing)
                        .await?
                }
            }
            let outgoing = std::mem::take(&mut self.outgoing);
            for message in &outgoing {
                self.send(&source.name, message).await?;
            }
            self.outgoing = outgoing;
        }
        match routed.position {
            Some(position) => {
                let commit_times = std::mem::take(&mut self.sealing);
                self.tracker.seal(&source.name, position, commit_times);
                if let Some(transaction) = self.transaction.as_mut() {
                    transaction.reached.insert(source.name.clone(), position);
                    transaction.unfinished.remove(&source.name);
                }
            }
            None => {
                if let Some(transaction) = self.transaction.as_mut() {
                    transaction.unfinished.insert(source.name.clone());
                }
            }
        }
        Ok(())
    }

    /// Hands one message to the producer, waiting while its queue is full.
    async fn send(&mut self, source: &str, message: &Outgoing) -> Result<(), SinkError> {
        self.topics.ensure(&message.topic, &message.table).await?;
        if let Some(transaction) = self.transaction.as_mut()
            && !transaction.open
        {
            self.producer.begin_transaction().map_err(|e| {
                transaction_failure(
                    "beginning a Kafka transaction",
                    e,
                    &self.brokers,
                    &transaction.id,
                )
            })?;
            transaction.open = true;
        }
        let epoch = self.tracker.track();
        let table: Arc<str> = Arc::from(message.table.as_str());
        let lsn = message.lsn.to_string();
        let xid = message.xid.map(|x| x.to_string());
        loop {
            let mut headers = OwnedHeaders::new_with_capacity(3)
                .insert(Header {
                    key: "walbridge.source",
                    value: Some(source),
                })
                .insert(Header {
                    key: "walbridge.lsn",
                    value: Some(&lsn),
                });
            if let Some(xid) = &xid {
                headers = headers.insert(Header {
                    key: "walbridge.xid",
                    value: Some(xid),
                });
            }
            let mut record = BaseRecord::<[u8], [u8], Box<Pending>>::with_opaque_to(
                &message.topic,
                Box::new(Pending {
                    epoch,
                    table: table.clone(),
                }),
            )
            .headers(headers);
            if let Some(key) = &message.key {
                record = record.key(key.as_slice());
            }
            if let Some(value) = &message.value {
                record = record.payload(value.as_slice());
            }
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    let _ = tokio::time::timeout(QUEUE_FULL_WAIT, self.tracker.changed()).await;
                }
                Err((error, _)) => {
                    self.tracker.untrack(epoch);
                    return Err(SinkError::Delivery {
                        topic: message.topic.clone(),
                        table: message.table.clone(),
                        key: show_key(message.key.as_deref()),
                        reason: error.to_string(),
                        code: error.rdkafka_error_code(),
                    });
                }
            }
        }
    }
}
