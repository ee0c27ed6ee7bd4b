//! The runtime: sources, sinks, and the routing between them.
//!
//! ```text
//! source ──events──▶ dispatcher ──▶ sink A (own task, own queue)
//!    ▲                          └──▶ sink B
//!    └── flushed = min(acks of A, B) ◀── combiner ◀── acks
//! ```
//!
//! Every queue is bounded, so a slow sink slows its sources down instead
//! of filling memory. A source's confirmed position is the minimum of what
//! all its sinks acknowledged.

use std::sync::Arc;

use anyhow::anyhow;
use futures_util::future::select_all;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use walbridge_core::{EventBatch, Lsn};
use walbridge_source::Source;

use crate::config::{Config, SinkConfig};
use crate::sink::jsonl::JsonlSink;
use crate::sink::{Routed, SourceContext};

/// Event batches queued between stages. A batch holds up to 256 changes,
/// so this bounds each queue to about 16k changes.
const QUEUE: usize = 64;

/// Runs until SIGINT/SIGTERM (exit cleanly) or a permanent failure.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let signals = tokio::spawn(wait_for_signal(shutdown_tx.clone()));

    let mut sink_queues = Vec::new();
    let mut sink_tasks = Vec::new();
    for sink in &config.sinks {
        let (tx, rx) = mpsc::channel::<Routed>(QUEUE);
        match sink {
            SinkConfig::Jsonl(c) => {
                let sink = JsonlSink::open(c.clone())?;
                sink_tasks.push((
                    c.name.clone(),
                    tokio::task::spawn_blocking(move || sink.run(rx)),
                ));
            }
        }
        sink_queues.push((sink, tx));
    }

    let mut sources = JoinSet::new();
    for source_config in &config.sources {
        let source = Source::new(source_config.clone(), &config.data_dir)?;
        let (flushed_tx, flushed_rx) = watch::channel(Lsn::ZERO);
        let mut targets = Vec::new();
        let mut acks = Vec::new();
        for (sink, queue) in &sink_queues {
            if sink
                .sources()
                .is_some_and(|s| !s.contains(&source_config.name))
            {
                continue;
            }
            let (ack_tx, ack_rx) = watch::channel(Lsn::ZERO);
            let context = Arc::new(SourceContext {
                name: source_config.name.clone(),
                database: source.database().to_owned(),
                flushed: ack_tx,
            });
            targets.push((queue.clone(), context));
            acks.push(ack_rx);
        }
        if targets.is_empty() {
            tracing::warn!(source = %source_config.name, "no sink reads this source; it is not started");
            continue;
        }
        let (events_tx, events_rx) = mpsc::channel::<EventBatch>(QUEUE);
        tokio::spawn(dispatch(events_rx, targets));
        tokio::spawn(combine(acks, flushed_tx));
        let shutdown = shutdown_rx.clone();
        sources.spawn(async move {
            source
                .run(events_tx, flushed_rx, shutdown)
                .await
                .map_err(|e| anyhow!(e))
        });
    }
    drop(sink_queues);

    let mut failure = None;
    while let Some(joined) = sources.join_next().await {
        let result = joined
            .map_err(|e| anyhow!("source task failed: {e}"))
            .and_then(|r| r);
        if let Err(e) = result
            && failure.is_none()
        {
            failure = Some(e);
            let _ = shutdown_tx.send(true);
        }
    }
    // The sources are done: the queues close and each sink finishes writing.
    for (name, task) in sink_tasks {
        let result = task
            .await
            .map_err(|e| anyhow!("sink `{name}` panicked: {e}"))
            .and_then(|r| r);
        if let Err(e) = result {
            // A sink failure is the root cause of the sources' "output closed".
            failure = Some(e);
        }
    }
    signals.abort();
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Copies each batch to every sink reading the source, in order.
async fn dispatch(
    mut events: mpsc::Receiver<EventBatch>,
    targets: Vec<(mpsc::Sender<Routed>, Arc<SourceContext>)>,
) {
    while let Some(batch) = events.recv().await {
        let Some(((last_queue, last_context), others)) = targets.split_last() else {
            return;
        };
        for (queue, context) in others {
            if queue
                .send(Routed {
                    source: context.clone(),
                    events: batch.clone(),
                })
                .await
                .is_err()
            {
                return;
            }
        }
        if last_queue
            .send(Routed {
                source: last_context.clone(),
                events: batch,
            })
            .await
            .is_err()
        {
            return;
        }
    }
}

/// The source's flushed position: the minimum its sinks acknowledged.
async fn combine(mut acks: Vec<watch::Receiver<Lsn>>, flushed: watch::Sender<Lsn>) {
    loop {
        let min = acks.iter().map(|a| *a.borrow()).min().unwrap_or(Lsn::ZERO);
        flushed.send_if_modified(|current| {
            let advance = min > *current;
            if advance {
                *current = min;
            }
            advance
        });
        let changed = select_all(acks.iter_mut().map(|a| Box::pin(a.changed()))).await;
        if changed.0.is_err() {
            return;
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
