//! The sink writes a unit as soon as its log has written it, before the
//! log's fsync, but stores and acknowledges a position only once the log
//! holds it durably: a crash of the machine may take what was not fsynced
//! from the log, and the output is then cut back to what the log still has.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, watch};
use walbridge_core::{EventBatch, LogicalMessage, Lsn, SourceEvent};
use walbridge_log::{Appender, CursorFile, Log, LogOptions, Visibility};
use walbridge_sink::{LogPosition, Routed, SinkDelays, SinkRun, SourceContext, SourceLog};
use walbridge_sink_jsonl::{JsonlSink, JsonlSinkConfig};

fn ok<T, E: std::fmt::Display>(r: Result<T, E>) -> T {
    r.unwrap_or_else(|e| panic!("{e}"))
}

/// Waits up to 10 s for `done`.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not within 10 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn positions_are_stored_and_acknowledged_only_once_the_log_holds_them_durably() {
    let dir = ok(tempfile::tempdir());
    // The log's fsyncs wait for the gap since the last (an hour) while
    // nothing waits for them: nothing is durable before it closes.
    let options = LogOptions {
        sync_gap: Duration::from_secs(3600),
        ..LogOptions::default()
    };
    let (log, writer, _) = ok(Log::open(&dir.path().join("log"), options));
    // What the runtime's feeder reads for the sink.
    let mut reader = ok(log.reader_with(0, Visibility::WrittenUnits));
    let mut appender = Appender::new(writer);
    for i in 0..20u64 {
        appender.begin_batch(true);
        let message = LogicalMessage {
            lsn: Lsn(100 + i),
            transactional: false,
            prefix: "test".into(),
            content: Bytes::from(format!("m{i}")),
        };
        ok(appender.append(SourceEvent::Message(message)).await);
        ok(appender.end_batch().await);
    }

    let path = dir.path().join("out.jsonl");
    let config = JsonlSinkConfig {
        name: "out".into(),
        sources: None,
        path: path.display().to_string(),
        unchanged_toast_placeholder: "-".into(),
    };
    let cursors = dir.path().join("cursors");
    ok(std::fs::create_dir_all(&cursors));
    let (acked, acks) = watch::channel(LogPosition {
        next: 0,
        lsn: Lsn(0),
    });
    let context = Arc::new(SourceContext {
        name: "src".into(),
        database: "db".into(),
        log_id: log.id().to_owned(),
        acked,
        delays: SinkDelays::new("src", "out"),
    });
    let mut sink = ok(JsonlSink::open(config, &cursors));
    let logs = [SourceLog {
        context: context.clone(),
        log: log.clone(),
    }];
    assert_eq!(ok(sink.resume(&logs).await), [0]);
    let (events, input) = mpsc::channel(64);
    let run = tokio::spawn(Box::new(sink).run(input));
    for _ in 0..20 {
        let record =
            ok(reader.try_next()).unwrap_or_else(|| panic!("a unit not shown before its fsync"));
        let mut batch = EventBatch::new();
        let position = LogPosition {
            next: record.seq + 1,
            lsn: record.lsn,
        };
        record.entry.push_events(&mut batch);
        let routed = Routed {
            source: context.clone(),
            events: batch,
            position: Some(position),
            boundaries: vec![(1, position)],
        };
        ok(events.send(routed).await);
    }

    let lines = || {
        std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .count()
    };
    eventually("20 lines written", || lines() == 20).await;
    // Many commit gaps later, nothing is durable in the log: nothing stored.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(log.head().next_seq, 0);
    let stored = || {
        ok(CursorFile::new(&cursors, "out").load())
            .and_then(|cursor| cursor.positions.get("src").map(|p| p.next))
    };
    assert_eq!(stored(), None, "a position the log does not hold durably");
    assert_eq!(acks.borrow().next, 0);

    // The log makes everything durable (at its close): the sink stores and
    // acknowledges the last position without waiting for more input.
    ok(appender.close().await);
    assert_eq!(log.head().next_seq, 20);
    // Acknowledged once stored: the acknowledgement comes second.
    eventually("the position acknowledged", || acks.borrow().next == 20).await;
    assert_eq!(stored(), Some(20));
    let cursor = ok(CursorFile::new(&cursors, "out").load()).unwrap_or_default();
    let length = ok(std::fs::metadata(&path)).len();
    assert_eq!(
        cursor.consumer["output_len"], length,
        "stored with the whole output"
    );
    drop(events);
    ok(ok(run.await).map_err(|e| e.to_string()));
}
