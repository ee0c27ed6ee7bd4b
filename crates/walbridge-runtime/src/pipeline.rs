//! The runtime: sources, their logs, and the sinks reading them.
//!
//! ```text
//! source ──events──▶ appender ──▶ log ──▶ feeder ──▶ sink A (own task, own cursor)
//!   ▲  ▲                           │  └──▶ feeder ──▶ sink B
//!   │  └─ durable = the log's head ┘
//!   └──── applied = min(acks of A, B) ◀── acks ◀──────┘
//! ```
//!
//! The source confirms to the publisher what is durable in its log, so a
//! slow or failing sink never holds the publisher's WAL; each sink reads
//! at its own pace through its own cursor, and one sink's trouble never
//! stalls another (until the log reaches `max_size`).
//!
//! Feeders are tasks, not threads of their own: a caught-up sink's record
//! then goes from the log writer's thread to the sink in one wake-up of a
//! runtime worker, where a feeder thread cost a second one — on a busy
//! machine each wake-up can wait a scheduler slice, and the feeder's was
//! the largest share of the delay after the log's fsync. Their reads are
//! plain file reads on a worker: of records just written (the page cache)
//! when caught up, and of up to [`FEED_BYTES`] at a time when behind.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::select_all;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use walbridge_core::{EventBatch, Lsn, PgTimestamp, SourceEvent};
use walbridge_log::{Appender, Log, LogOptions, LogReader, LogWriter};
use walbridge_sink::{
    LogPosition, Reading, Routed, Sink, SinkDelays, SinkFailure, SourceContext, SourceDelay,
    SourceLog, reads, start_from_cursor,
};
use walbridge_source::Downstream;

use crate::config::Config;
use crate::error::RuntimeError;
use crate::source::AnySource;
use crate::status::{
    Observed, ObservedInput, ObservedSink, ObservedSource, SinkEvents, SinkHealth, SinkState,
};
use walbridge_core::describe;

/// Event batches (up to 256 events each) queued between a source and its log.
const QUEUE: usize = 64;

/// Batches the appender takes at once: up to this many queued transactions
/// still count as caught up (the publisher sends the transactions of one
/// WAL flush back to back), and are written with one fsync by the
/// appender; more is a backlog, written by the log's thread.
const BURST: usize = 8;

/// Hand-overs queued between a feeder and its sink: each holds up to
/// [`FEED_BATCH`] events and [`FEED_BYTES`] of records, or one log record
/// (a chunk of up to about 1 MiB).
const SINK_QUEUE: usize = 16;

/// Events a feeder gathers from consecutive records into one hand-over …
const FEED_BATCH: usize = 256;

/// … and bytes of records: with wide rows, 256 events were hundreds of MB.
const FEED_BYTES: u64 = 256 << 10;

/// The first wait before a failed sink is started again; it doubles with
/// every failure, up to a minute.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);

/// A sink run that lasted this long resets the backoff.
const BACKOFF_RESET: Duration = Duration::from_secs(60);

/// How long a sink that failed must run again, acknowledging nothing,
/// before it counts as running.
const SETTLED: Duration = Duration::from_secs(5);

/// How long a stopping pipeline lets the sinks catch up with the logs.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);

/// One source a sink reads, as its feeder needs it.
struct Input {
    log: SourceLog,
    /// What the feeder hands the sink, counted.
    events: Arc<SinkEvents>,
}

/// A source with its log, before it starts.
struct SourceRun {
    source: AnySource,
    log: Log,
    writer: LogWriter,
    applied: watch::Sender<Lsn>,
    /// Per sink reading it: the sink's name and acknowledgements.
    acks: Vec<(String, watch::Receiver<LogPosition>)>,
}

/// Runs until SIGINT/SIGTERM (exit cleanly) or a permanent failure.
/// `watch` is given what the pipeline shows of itself (what the admin
/// endpoint serves) once every source and sink is set up, before any runs.
pub async fn run(config: Config, watch: impl FnOnce(Arc<Observed>)) -> Result<(), RuntimeError> {
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let signals = tokio::spawn(wait_for_signal(shutdown_tx.clone()));
    let options = config.log.options();
    let cursor_dir = cursor_dir(&config.data_dir);
    // Serving before any sink starts: sinks register their schemas here.
    let _registry = match &config.schema_registry {
        Some(registry) => Some(serve_registry(registry, &config.data_dir).await?),
        None => None,
    };

    // Bound (and its recorder installed) before any log opens (its fsync
    // times are kept from then on) and any sink starts.
    let admin = match config.admin.listen.as_str() {
        "" => None,
        _ => Some(crate::admin::bind(&config.admin, &config.data_dir).await?),
    };
    let mut runs = Vec::new();
    for source_config in &config.sources {
        if !config
            .sinks
            .iter()
            .any(|s| reads(s.as_ref(), source_config.name()))
        {
            tracing::warn!(source = %source_config.name(), "no sink reads this source; it is not started");
            continue;
        }
        let source = AnySource::new(source_config, &config.data_dir)?;
        let dir = source.state_dir().join("log");
        let options = LogOptions {
            source: source_config.name().to_owned(),
            ..options.clone()
        };
        let (log, writer, _) = Log::open(&dir, options).map_err(|error| RuntimeError::Log {
            source_name: source_config.name().to_owned(),
            error,
        })?;
        runs.push(SourceRun {
            source,
            log,
            writer,
            applied: watch::Sender::new(Lsn::ZERO),
            acks: Vec::new(),
        });
    }

    let mut observed = Observed {
        sources: runs
            .iter()
            .map(|r| ObservedSource {
                name: r.source.name().to_owned(),
                stats: r.source.stats(),
                log: r.log.clone(),
                log_max_bytes: config.log.max_size.map(|s| s.0),
                spill_dir: r.source.spill_dir(),
            })
            .collect(),
        sinks: Vec::new(),
    };

    // Sinks open (and register their cursors) before any source appends,
    // so retention never removes what a sink still needs.
    let (closing_tx, closing_rx) = watch::channel(false);
    let mut sinks = Vec::new();
    for sink_config in &config.sinks {
        let name = sink_config.name();
        let sink: Arc<dyn Sink> =
            sink_config
                .open(&cursor_dir)
                .map_err(|error| RuntimeError::Sink {
                    sink: name.to_owned(),
                    error,
                })?;
        let mut inputs = Vec::new();
        let mut observed_inputs = Vec::new();
        for run in runs
            .iter_mut()
            .filter(|r| reads(sink_config.as_ref(), r.source.name()))
        {
            let source = run.source.name();
            let start =
                start_from_cursor(name, source, sink.stored_cursor(source).as_ref(), &run.log);
            run.log.register_cursor(sink_config.name(), start);
            let head = run.log.head();
            let lsn = if start >= head.next_seq {
                head.last_lsn
            } else {
                Lsn::ZERO
            };
            let (acked, ack_rx) = watch::channel(LogPosition { next: start, lsn });
            run.acks.push((sink_config.name().to_owned(), ack_rx));
            let events = Arc::new(SinkEvents::default());
            observed_inputs.push(ObservedInput {
                source: source.to_owned(),
                acked: acked.subscribe(),
                log: run.log.clone(),
                events: events.clone(),
            });
            inputs.push(Input {
                log: SourceLog {
                    log: run.log.clone(),
                    context: Arc::new(SourceContext {
                        name: source.to_owned(),
                        database: run.source.database().to_owned(),
                        log_id: run.log.id().to_owned(),
                        acked,
                        delays: SinkDelays::new(source, sink_config.name()),
                    }),
                },
                events,
            });
        }
        // The parts that run, fail and are retried on their own.
        let units: Vec<Vec<Input>> = if sink.per_source() {
            inputs.into_iter().map(|input| vec![input]).collect()
        } else {
            vec![inputs]
        };
        let mut healths = Vec::new();
        for inputs in units {
            let health = Arc::new(SinkHealth::default());
            healths.push(health.clone());
            sinks.push((
                name.to_owned(),
                tokio::spawn(supervise(
                    sink.clone(),
                    name.to_owned(),
                    inputs,
                    health,
                    Watches {
                        closing: closing_rx.clone(),
                        paused: crate::pause::watch(&config.data_dir, name),
                    },
                    config.progress_interval.0,
                )),
            ));
        }
        observed.sinks.push(ObservedSink {
            name: name.to_owned(),
            units: healths,
            inputs: observed_inputs,
        });
    }
    let observed = Arc::new(observed);
    watch(observed.clone());
    let requests = crate::admin::Requests {
        data_dir: config.data_dir.clone(),
        sources: config
            .sources
            .iter()
            .filter(|s| matches!(s, crate::config::SourceSpec::Postgres(_)))
            .map(|s| {
                let readers = config
                    .sinks
                    .iter()
                    .filter(|k| walbridge_sink::reads(k.as_ref(), s.name()))
                    .map(|k| k.name().to_owned())
                    .collect();
                (s.name().to_owned(), readers)
            })
            .collect(),
    };
    let admin_server = admin.map(|bound| {
        AbortOnDrop(crate::admin::serve(
            bound,
            &config.admin,
            observed,
            requests,
        ))
    });

    let mut sources = JoinSet::new();
    let mut appenders = Vec::new();
    for run in runs {
        let SourceRun {
            source,
            log,
            writer,
            applied,
            acks,
        } = run;
        let applied_rx = applied.subscribe();
        tokio::spawn(track_acks(log.clone(), acks, applied));
        let head = log.head();
        let (events_tx, events_rx) = mpsc::channel::<EventBatch>(QUEUE);
        let name = source.name().to_owned();
        let received = SourceDelay::new(&name);
        appenders.push((
            name,
            tokio::spawn(append(events_rx, Appender::new(writer), received)),
        ));
        let downstream = Downstream {
            events: events_tx,
            durable: log.subscribe_last_lsn(),
            applied: applied_rx,
            resume_after: head.last_lsn,
        };
        let shutdown = shutdown_rx.clone();
        let watched = admin_server.is_some();
        sources.spawn(async move { source.run(downstream, shutdown, watched).await });
    }

    let mut failure = None;
    while let Some(joined) = sources.join_next().await {
        let result = joined
            .map_err(|e| RuntimeError::Task(format!("a source's task failed: {e}")))
            .and_then(|r| r);
        if let Err(e) = result
            && failure.is_none()
        {
            failure = Some(e);
            let _ = shutdown_tx.send(true);
        }
    }
    // The sources are done: each log takes what is queued, fsyncs, closes.
    for (name, task) in appenders {
        let result = task
            .await
            .map_err(|e| {
                RuntimeError::Task(format!("the log appender of source `{name}` panicked: {e}"))
            })
            .and_then(|r| {
                r.map_err(|error| RuntimeError::Log {
                    source_name: name.clone(),
                    error,
                })
            });
        if let Err(e) = result {
            // A log failure is the root cause of the source's "output closed".
            failure = Some(e);
        }
    }
    // The sinks read to the end of the logs, store their cursors and stop.
    let _ = closing_tx.send(true);
    let drained = async {
        let mut sink_failure = None;
        for (name, task) in sinks {
            let result = task
                .await
                .map_err(|e| RuntimeError::Task(format!("sink `{name}` panicked: {e}")))
                .and_then(|r| r);
            if let Err(e) = result {
                sink_failure.get_or_insert(e);
            }
        }
        sink_failure
    };
    match tokio::time::timeout(DRAIN_TIMEOUT, drained).await {
        Ok(Some(e)) => failure = failure.or(Some(e)),
        Ok(None) => {}
        Err(_) => tracing::warn!(
            "the sinks did not reach the end of the logs within {DRAIN_TIMEOUT:?}; they go on from their cursors next time"
        ),
    }
    signals.abort();
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Appends a source's events to its log, then closes the log. A writer
/// failure ends it at once, which closes the source's queue: the source
/// stops without waiting for its next change.
async fn append(
    mut events: mpsc::Receiver<EventBatch>,
    mut appender: Appender,
    received: SourceDelay,
) -> Result<(), walbridge_log::LogError> {
    let mut burst: Vec<EventBatch> = Vec::with_capacity(BURST);
    loop {
        let batch = tokio::select! {
            batch = events.recv() => batch,
            failure = appender.failed() => return Err(failure),
        };
        let Some(batch) = batch else { break };
        burst.push(batch);
        while burst.len() < BURST
            && let Ok(batch) = events.try_recv()
        {
            burst.push(batch);
        }
        // A caught-up stream's transactions (one, or the few the publisher
        // sent together) are written here, with one fsync, not by the log's
        // thread; a backlog, a copy's rows, a large transaction's chunks are not.
        let whole_transactions = burst.iter().all(|batch| {
            batch
                .iter()
                .filter(|e| matches!(e, SourceEvent::Commit(_)))
                .count()
                == 1
        });
        appender.begin_batch(whole_transactions && events.is_empty());
        for event in burst.drain(..).flatten() {
            if let SourceEvent::Commit(info) = &event {
                received.received(info.commit_time);
            }
            appender.append(event).await?;
        }
        appender.end_batch().await?;
    }
    appender.close().await
}

/// Moves a position forward, never back, waking its receivers only when it moves.
fn advance(position: &watch::Sender<Lsn>, lsn: Lsn) {
    position.send_if_modified(|current| {
        let forward = lsn > *current;
        if forward {
            *current = lsn;
        }
        forward
    });
}

/// Follows the sinks' acknowledgements of one source: each moves its
/// cursor in the log (letting retention remove what all have passed), and
/// the lowest LSN is what the source reports as applied.
async fn track_acks(
    log: Log,
    mut acks: Vec<(String, watch::Receiver<LogPosition>)>,
    applied: watch::Sender<Lsn>,
) {
    loop {
        let mut lowest = None::<Lsn>;
        for (sink, ack) in &mut acks {
            let position = *ack.borrow_and_update();
            if let Err(e) = log.advance_cursor(sink, position.next) {
                tracing::error!(sink = %sink, "{e}");
            }
            lowest = Some(lowest.map_or(position.lsn, |l| l.min(position.lsn)));
        }
        if let Some(lsn) = lowest {
            advance(&applied, lsn);
        }
        if acks.is_empty() {
            return;
        }
        let (changed, ..) = select_all(acks.iter_mut().map(|(_, a)| Box::pin(a.changed()))).await;
        if changed.is_err() {
            return;
        }
    }
}

/// Starts the embedded schema registry; it serves until the returned
/// guard is dropped.
async fn serve_registry(
    registry: &crate::config::RegistryServerConfig,
    data_dir: &Path,
) -> Result<AbortOnDrop, RuntimeError> {
    let failed = |what: String| {
        move |e: std::io::Error| RuntimeError::Registry {
            what,
            error: e.into(),
        }
    };
    let listener = tokio::net::TcpListener::bind(registry.listen)
        .await
        .map_err(failed(format!("cannot listen on {}", registry.listen)))?;
    std::fs::create_dir_all(data_dir)
        .map_err(failed(format!("cannot create {}", data_dir.display())))?;
    let path = data_dir.join("schema-registry.json");
    let router = walbridge_sink_kafka::registry::server::router(&path).map_err(|e| {
        RuntimeError::Registry {
            what: "cannot load its schemas".into(),
            error: e.into(),
        }
    })?;
    tracing::info!(listen = %registry.listen, "schema registry serving");
    let task = tokio::spawn(async move {
        if let Err(e) = walbridge_sink_kafka::registry::server::serve(listener, router).await {
            tracing::error!("the schema registry stopped: {e}");
        }
    });
    Ok(AbortOnDrop(task))
}

/// Aborts a background task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What a sink's supervisor watches besides the sink.
struct Watches {
    /// The logs are closing: read to their end and stop.
    closing: watch::Receiver<bool>,
    /// `walbridge pause` / `resume`.
    paused: watch::Receiver<bool>,
}

/// Why one run of a sink ended.
enum SinkStop {
    /// Reading the log failed: corruption, a position removed, the sink dropped. Retrying cannot help.
    Log(RuntimeError),
    /// The sink failed; it is retried unless the failure is permanent.
    Sink(SinkFailure),
}

/// Runs a sink, restarting it from its stored cursor with exponential
/// backoff when it fails; gives up only on failures a retry cannot cure.
async fn supervise(
    sink: Arc<dyn Sink>,
    name: String,
    inputs: Vec<Input>,
    health: Arc<SinkHealth>,
    watches: Watches,
    progress_interval: Duration,
) -> Result<(), RuntimeError> {
    let Watches {
        closing,
        mut paused,
    } = watches;
    let mut backoff = FIRST_BACKOFF;
    loop {
        if *paused.borrow_and_update() {
            let before = health.state();
            health.set(SinkState::Paused);
            tracing::info!(sink = %name, "paused (walbridge resume goes on); its sources keep writing their logs");
            let mut closing = closing.clone();
            tokio::select! {
                _ = paused.wait_for(|p| !*p) => {}
                _ = closing.wait_for(|c| *c) => return Ok(()),
            }
            tracing::info!(sink = %name, "resumed");
            // Running again as soon as it resumes, unless it was failing.
            health.set(if before == SinkState::Retrying {
                SinkState::Retrying
            } else {
                SinkState::Starting
            });
        }
        let started = std::time::Instant::now();
        // Starting may block (a FIFO waits for its reader): not on a runtime thread.
        let starting = sink.clone();
        let outcome = match tokio::task::spawn_blocking(move || starting.start()).await {
            Ok(Ok(run)) => {
                run_sink(
                    run,
                    sink.as_ref(),
                    &name,
                    &inputs,
                    &health,
                    Watches {
                        closing: closing.clone(),
                        paused: paused.clone(),
                    },
                    progress_interval,
                )
                .await
            }
            Ok(Err(e)) => Err(SinkStop::Sink(e)),
            Err(e) => Err(SinkStop::Sink(SinkFailure::transient(format!(
                "starting the sink panicked: {e}"
            )))),
        };
        let e = match outcome {
            // Paused while running: it stored its cursor; wait for resume.
            Ok(()) if *paused.borrow() && !*closing.borrow() => continue,
            Ok(()) => return Ok(()),
            Err(SinkStop::Log(e)) => return Err(stopped_for_good(&name, &health, e)),
            Err(SinkStop::Sink(error)) => {
                let permanent = error.is_permanent();
                let e = RuntimeError::Sink {
                    sink: name.clone(),
                    error,
                };
                if permanent {
                    return Err(stopped_for_good(&name, &health, e));
                }
                health.failed(SinkState::Retrying, describe(&e));
                e
            }
        };
        if *closing.borrow() {
            stopped_while_retrying(&name, &e);
            return Ok(());
        }
        if started.elapsed() >= BACKOFF_RESET {
            // It ran well for a while: this is a new problem.
            backoff = FIRST_BACKOFF;
        }
        tracing::warn!(sink = %name, "{}; retrying in {backoff:?}", describe(&e));
        let mut closing = closing.clone();
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = closing.wait_for(|c| *c) => {
                stopped_while_retrying(&name, &e);
                return Ok(());
            }
        }
        backoff = (backoff * 2).min(Duration::from_secs(60));
    }
}

/// A sink stopped by a failure no retry cures: said once, as an error; the
/// run's exit status reports it when the process stops.
fn stopped_for_good(name: &str, health: &SinkHealth, e: RuntimeError) -> RuntimeError {
    health.failed(SinkState::Stopped, describe(&e));
    tracing::error!(sink = %name, "{}; the sink stopped (sources and other sinks go on)", describe(&e));
    e
}

/// A stop requested while a sink waits to retry is a clean stop: the sink
/// resumes from its stored position at the next start.
fn stopped_while_retrying(name: &str, e: &RuntimeError) {
    tracing::warn!(sink = %name, "stopping while the sink retries ({}); it resumes from its stored position at the next start", describe(e));
}

/// One run of a sink: a feeder task per source reads the log from the
/// sink's cursor into the sink's queue.
async fn run_sink(
    mut run: Box<dyn walbridge_sink::SinkRun>,
    sink: &dyn Sink,
    name: &str,
    inputs: &[Input],
    health: &Arc<SinkHealth>,
    watches: Watches,
    progress_interval: Duration,
) -> Result<(), SinkStop> {
    let Watches {
        closing,
        mut paused,
    } = watches;
    let logs: Vec<SourceLog> = inputs.iter().map(|i| i.log.clone()).collect();
    let starts = run.resume(&logs).await.map_err(SinkStop::Sink)?;
    let _settle = AbortOnDrop(tokio::spawn(settle(
        health.clone(),
        logs.iter().map(|l| l.context.acked.subscribe()).collect(),
    )));
    let (tx, rx) = mpsc::channel::<Routed>(SINK_QUEUE);
    let abort = Arc::new(watch::Sender::new(false));
    // Paused: the feeders stop, the sink takes what it was given, stores
    // its cursor and ends.
    let pausing = abort.clone();
    let _pause = AbortOnDrop(tokio::spawn(async move {
        if paused.wait_for(|p| *p).await.is_ok() {
            pausing.send_replace(true);
        }
    }));
    let mut feeders = Vec::new();
    let reading = sink.reading();
    // A sink reading the logs itself is fed nothing: its channel closes
    // when it is to stop (the logs closing, a pause).
    let _stopper = (reading == Reading::Itself).then(|| {
        let queue = tx.clone();
        let mut closing = closing.clone();
        let mut abort = abort.subscribe();
        AbortOnDrop(tokio::spawn(async move {
            tokio::select! {
                _ = closing.wait_for(|c| *c) => {}
                _ = abort.wait_for(|a| *a) => {}
            }
            drop(queue);
        }))
    });
    let fed = inputs
        .iter()
        .zip(starts)
        .filter(|_| reading == Reading::Fed);
    for (input, start) in fed {
        let reader = input
            .log
            .log
            .reader_with(start, sink.visibility())
            .map_err(|error| {
                SinkStop::Log(RuntimeError::SinkLog {
                    sink: name.to_owned(),
                    source_name: input.log.context.name.clone(),
                    error,
                })
            })?;
        let feeder = Feeder {
            reader,
            log: input.log.log.clone(),
            sink: name.to_owned(),
            context: input.log.context.clone(),
            events: input.events.clone(),
            queue: tx.clone(),
            closing: closing.clone(),
            abort: abort.clone(),
            reported: (None, false),
            progress_interval,
            commits: Vec::new(),
        };
        feeders.push(tokio::spawn(feeder.run()));
    }
    drop(tx);
    let sink_result = run.run(rx).await;
    abort.send_replace(true);
    for feeder in feeders {
        feeder
            .await
            .map_err(|e| RuntimeError::Task(format!("a feeder failed: {e}")))
            .and_then(|r| r)
            .map_err(SinkStop::Log)?;
    }
    sink_result.map_err(SinkStop::Sink)
}

/// Marks a sink that resumed as running: at once on its first attempt;
/// after a failure once it acknowledges something or has run for
/// [`SETTLED`] (an attempt that fails again at its first transaction
/// never looks well).
async fn settle(health: Arc<SinkHealth>, mut acks: Vec<watch::Receiver<LogPosition>>) {
    if health.state() == SinkState::Starting {
        health.set(SinkState::Running);
        return;
    }
    let acked = async {
        if acks.is_empty() {
            return std::future::pending().await;
        }
        let _ = select_all(acks.iter_mut().map(|a| Box::pin(a.changed()))).await;
    };
    tokio::select! {
        _ = acked => {}
        _ = tokio::time::sleep(SETTLED) => {}
    }
    health.set(SinkState::Running);
}

/// Reads one source's log into one sink's queue.
struct Feeder {
    reader: LogReader,
    log: Log,
    sink: String,
    context: Arc<SourceContext>,
    /// What it hands the sink, counted.
    events: Arc<SinkEvents>,
    queue: mpsc::Sender<Routed>,
    /// The logs are closed: read to the end, then stop.
    closing: watch::Receiver<bool>,
    /// The sink stopped (or another feeder failed): stop now.
    abort: Arc<watch::Sender<bool>>,
    /// When progress was last reported (never yet: `None`), and whether
    /// the sink was behind then.
    reported: (Option<std::time::Instant>, bool),
    /// How often progress is reported.
    progress_interval: Duration,
    /// The commit times of the transactions in the hand-over under way.
    commits: Vec<PgTimestamp>,
}

impl Feeder {
    /// How far the sink has read, when it is behind the log by more than a
    /// steady stream keeps in flight: at its first hand-over (a sink that
    /// starts with a backlog says so at once), then every
    /// `progress_interval`; and once when it has caught up.
    fn report_progress(&mut self) {
        let (last, was_behind) = self.reported;
        if last.is_some_and(|t| t.elapsed() < self.progress_interval) {
            return;
        }
        let next = self.reader.next_seq();
        let head = self.log.head();
        let behind = head.next_seq.saturating_sub(next);
        let catching_up = behind > (FEED_BATCH * SINK_QUEUE) as u64;
        if catching_up {
            tracing::info!(
                sink = %self.sink,
                source = %self.context.name,
                "catching up: at record {next} of {}, {behind} to go",
                head.next_seq
            );
        } else if was_behind {
            tracing::info!(sink = %self.sink, source = %self.context.name, "caught up with the log");
        }
        self.reported = (Some(std::time::Instant::now()), catching_up);
    }

    async fn run(mut self) -> Result<(), RuntimeError> {
        let result = self.feed().await;
        if result.is_err() {
            // The sink cannot go on with a source missing; stop it too.
            self.abort.send_replace(true);
        }
        result
    }

    async fn feed(&mut self) -> Result<(), RuntimeError> {
        let mut abort = self.abort.subscribe();
        loop {
            if *abort.borrow() {
                return Ok(());
            }
            if self.log.is_dropped(&self.sink) {
                return Err(RuntimeError::SinkDropped {
                    sink: self.sink.clone(),
                    source_name: self.context.name.clone(),
                });
            }
            let failed = |error| RuntimeError::SinkLog {
                sink: self.sink.clone(),
                source_name: self.context.name.clone(),
                error,
            };
            match self.reader.try_next().map_err(failed)? {
                Some(record) => {
                    let mut routed = Routed {
                        source: self.context.clone(),
                        position: None,
                        boundaries: Vec::new(),
                        events: Vec::new(),
                    };
                    let mut next = Some(record);
                    let (mut bytes, mut records) = (0, 0);
                    // Small records travel together: one hand-over per batch, not per transaction.
                    while let Some(record) = next.take() {
                        bytes += record.size;
                        records += 1;
                        record.entry.push_events(&mut routed.events);
                        routed.position = record.unit_end.then_some(LogPosition {
                            next: record.seq + 1,
                            lsn: record.lsn,
                        });
                        if let Some(position) = routed.position {
                            routed.boundaries.push((routed.events.len(), position));
                        }
                        if routed.events.len() < FEED_BATCH && bytes < FEED_BYTES {
                            next = self.reader.try_next().map_err(failed)?;
                            if next.is_some() && records == 1 {
                                // A backlog: room for a whole hand-over at once,
                                // not a vector grown (and copied) record by record.
                                let per_record = routed.events.len().max(1);
                                routed.events.reserve(FEED_BATCH);
                                routed.boundaries.reserve(FEED_BATCH / per_record);
                            }
                        }
                    }
                    let handed = SinkEvents::tally(&routed.events);
                    // The delays of the transactions ending here, read and delivered.
                    self.commits.clear();
                    self.commits
                        .extend(routed.events.iter().filter_map(|event| match event {
                            SourceEvent::Commit(info) => Some(info.commit_time),
                            _ => None,
                        }));
                    for &commit_time in &self.commits {
                        self.context.delays.read(commit_time);
                    }
                    if self.queue.send(routed).await.is_err() {
                        return Ok(());
                    }
                    for &commit_time in &self.commits {
                        self.context.delays.delivered(commit_time);
                    }
                    self.events.add(handed);
                    self.report_progress();
                }
                None if *self.closing.borrow() => return Ok(()),
                None => {
                    tokio::select! {
                        _ = self.reader.wait() => {}
                        _ = self.closing.changed() => {}
                        _ = abort.changed() => {}
                        _ = self.queue.closed() => {}
                    }
                }
            }
        }
    }
}

async fn wait_for_signal(shutdown: watch::Sender<bool>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received, stopping"),
        _ = int.recv() => tracing::info!("SIGINT received, stopping"),
    }
    let _ = shutdown.send(true);
}

/// The directory holding the sinks' cursors.
pub fn cursor_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("cursors")
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use walbridge_core::LogicalMessage;
    use walbridge_log::{LogOptions, RecordEncoder, Syncs};
    use walbridge_sink::{BoxFuture, CursorPosition, SinkRun, Visibility};

    use super::*;

    fn ok<T, E: std::fmt::Display>(r: Result<T, E>) -> T {
        r.unwrap_or_else(|e| panic!("{e}"))
    }

    /// A sink reading its source's log itself with two readers, as a feed
    /// with two consumers does: one reads all of it, the other one record.
    struct TwoReaders {
        /// Events the runtime handed it (there should be none).
        handed: Arc<AtomicUsize>,
        /// Records the faster reader read.
        read: Arc<AtomicUsize>,
    }

    struct TwoReadersRun {
        logs: Vec<SourceLog>,
        handed: Arc<AtomicUsize>,
        read: Arc<AtomicUsize>,
    }

    impl Sink for TwoReaders {
        fn stored_cursor(&self, _source: &str) -> Option<CursorPosition> {
            None
        }

        fn visibility(&self) -> walbridge_log::Visibility {
            Visibility::CompleteUnits
        }

        fn reading(&self) -> Reading {
            Reading::Itself
        }

        fn start(&self) -> Result<Box<dyn SinkRun>, SinkFailure> {
            Ok(Box::new(TwoReadersRun {
                logs: Vec::new(),
                handed: self.handed.clone(),
                read: self.read.clone(),
            }))
        }
    }

    impl SinkRun for TwoReadersRun {
        fn resume<'a>(
            &'a mut self,
            logs: &'a [SourceLog],
        ) -> BoxFuture<'a, Result<Vec<u64>, SinkFailure>> {
            self.logs = logs.to_vec();
            Box::pin(async move { Ok(logs.iter().map(|l| l.log.first_seq()).collect()) })
        }

        fn run(
            self: Box<Self>,
            mut events: mpsc::Receiver<Routed>,
        ) -> BoxFuture<'static, Result<(), SinkFailure>> {
            Box::pin(async move {
                let source = &self.logs[0];
                let first = source.log.first_seq();
                let mut fast = source.log.reader(first).map_err(SinkFailure::transient)?;
                let mut slow = source.log.reader(first).map_err(SinkFailure::transient)?;
                while fast.try_next().map_err(SinkFailure::transient)?.is_some() {
                    self.read.fetch_add(1, Ordering::Relaxed);
                }
                let Some(record) = slow.try_next().map_err(SinkFailure::transient)? else {
                    return Err(SinkFailure::permanent("the log is empty"));
                };
                // The slower reader has what it read: that is the cursor.
                source.context.acked.send_replace(LogPosition {
                    next: record.seq + 1,
                    lsn: record.lsn,
                });
                while let Some(routed) = events.recv().await {
                    self.handed
                        .fetch_add(routed.events.len(), Ordering::Relaxed);
                }
                Ok(())
            })
        }
    }

    /// Transaction `i` as the source hands it over: one batch, `Begin`, a
    /// message, `Commit`.
    fn transaction(i: u64) -> EventBatch {
        let info = Arc::new(walbridge_core::TransactionInfo {
            xid: i as u32,
            commit_lsn: Lsn(i * 100),
            end_lsn: Lsn(i * 100 + 8),
            commit_time: PgTimestamp(i as i64),
            origin: None,
            gid: None,
            for_sink: None,
        });
        let message = LogicalMessage {
            lsn: Lsn(i * 100 - 50),
            transactional: true,
            prefix: format!("t{i}"),
            content: Default::default(),
        };
        vec![
            SourceEvent::Begin(info.clone()),
            SourceEvent::Change(walbridge_core::Change::Message(message)),
            SourceEvent::Commit(info),
        ]
    }

    /// Runs the appender over `count` transactions all queued before it
    /// starts; returns the log's fsyncs (by the appender, by the writer
    /// thread) once every transaction is readable, in order.
    async fn append_queued(count: u64) -> Syncs {
        let dir = ok(tempfile::tempdir());
        let (log, writer, _) = ok(Log::open(dir.path(), LogOptions::default()));
        let (events, queued) = mpsc::channel(QUEUE);
        for i in 1..=count {
            ok(events.send(transaction(i)).await);
        }
        drop(events);
        ok(append(queued, Appender::new(writer), SourceDelay::new("test")).await);
        let mut reader = ok(log.reader(log.first_seq()));
        let mut lsns = Vec::new();
        while let Some(record) = ok(reader.try_next()) {
            lsns.push(record.lsn);
        }
        let expected: Vec<Lsn> = (1..=count).map(|i| Lsn(i * 100 + 8)).collect();
        assert_eq!(lsns, expected, "every transaction, in order");
        log.syncs()
    }

    /// The few transactions a publisher sends back to back (one WAL flush)
    /// are a caught-up stream's: the appender writes them with one fsync
    /// of its own (nothing reads them before they are durable), no wake-up
    /// of the writer thread. More than [`BURST`] is a backlog, which the
    /// thread writes while the next batches are read.
    #[tokio::test]
    async fn transactions_that_came_together_are_written_with_one_fsync_by_the_appender() {
        let alone = Syncs {
            appender: 1,
            ..Syncs::default()
        };
        assert_eq!(append_queued(3).await, alone);
        assert_eq!(append_queued(BURST as u64).await, alone);
        let backlog = append_queued(3 * BURST as u64).await;
        assert!(backlog.writer >= 1, "a backlog goes to the writer thread");
    }

    #[tokio::test]
    async fn a_sink_reading_the_logs_itself_is_fed_nothing_and_acknowledges_for_its_slowest_reader()
    {
        let dir = ok(tempfile::tempdir());
        let (log, writer, _) = ok(Log::open(dir.path(), LogOptions::default()));
        for i in 1..=3 {
            let message = LogicalMessage {
                lsn: Lsn(i * 10),
                transactional: false,
                prefix: format!("m{i}"),
                content: Default::default(),
            };
            let record = RecordEncoder::default().message(&message);
            ok(writer.append(record, Lsn(i * 10), true).await);
        }
        // Readable once durable.
        let mut head = log.subscribe();
        ok(tokio::time::timeout(Duration::from_secs(10), head.wait_for(|h| h.next_seq >= 3)).await)
            .unwrap_or_else(|e| panic!("{e}"));
        let first = log.first_seq();
        let (acked, mut acks) = watch::channel(LogPosition {
            next: first,
            lsn: Lsn::ZERO,
        });
        let inputs = [Input {
            log: SourceLog {
                context: Arc::new(SourceContext {
                    name: "src".into(),
                    database: "db".into(),
                    log_id: log.id().to_owned(),
                    acked,
                    delays: SinkDelays::none(),
                }),
                log: log.clone(),
            },
            events: Arc::default(),
        }];
        let sink = TwoReaders {
            handed: Arc::default(),
            read: Arc::default(),
        };
        let (closing_tx, closing) = watch::channel(false);
        let (_paused_tx, paused) = watch::channel(false);
        let health = Arc::new(SinkHealth::default());
        let run = ok(sink.start());
        let running = run_sink(
            run,
            &sink,
            "feed",
            &inputs,
            &health,
            Watches { closing, paused },
            Duration::from_secs(5),
        );
        let acknowledged = async {
            let waited =
                tokio::time::timeout(Duration::from_secs(10), acks.wait_for(|p| p.next > first));
            let position = waited.await.ok().and_then(|p| p.ok().map(|p| *p));
            closing_tx.send_replace(true);
            position
        };
        let (result, position) = tokio::time::timeout(Duration::from_secs(20), async {
            tokio::join!(running, acknowledged)
        })
        .await
        .unwrap_or_else(|_| panic!("the sink did not stop when the logs closed"));
        assert!(result.is_ok(), "the run failed");
        assert_eq!(
            position,
            Some(LogPosition {
                next: first + 1,
                lsn: Lsn(10)
            })
        );
        assert_eq!(sink.read.load(Ordering::Relaxed), 3);
        assert_eq!(sink.handed.load(Ordering::Relaxed), 0);
        assert_eq!(inputs[0].events.get(), [0; 6]);
    }
}
