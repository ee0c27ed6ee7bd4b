//! The feed sends units as soon as the log has written them, before its
//! fsync, and never acknowledges to the log more than it holds durably; a
//! token naming records a crash of the machine took from the log resumes
//! where the log's surviving records end. A real log, the feed served on
//! loopback, tonic's generated client.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use walbridge_core::{LogicalMessage, Lsn, SourceEvent};
use walbridge_log::{Appender, Log, LogOptions};
use walbridge_sink::{LogPosition, SinkConfig, SinkDelays, SourceContext, SourceLog};
use walbridge_sink_grpc::GrpcSinkConfig;
use walbridge_sink_grpc::pb::{self, subscribe_request, subscribe_response::Event};
use walbridge_sink_grpc::token::{Token, TokenPosition};

fn ok<T, E: std::fmt::Display>(r: Result<T, E>) -> T {
    r.unwrap_or_else(|e| panic!("{e}"))
}

/// Appends one non-transactional message per item, each a unit.
async fn append_messages(appender: &mut Appender, items: impl IntoIterator<Item = (u64, String)>) {
    for (lsn, content) in items {
        appender.begin_batch(true);
        let message = LogicalMessage {
            lsn: Lsn(lsn),
            transactional: false,
            prefix: "test".into(),
            content: Bytes::from(content),
        };
        ok(appender.append(SourceEvent::Message(message)).await);
        ok(appender.end_batch().await);
    }
}

/// The feed serving `log` as source `src` until the returned sender drops.
struct Served {
    address: String,
    acks: watch::Receiver<LogPosition>,
    _stop: mpsc::Sender<walbridge_sink::Routed>,
    run: tokio::task::JoinHandle<Result<(), walbridge_sink::SinkFailure>>,
}

async fn serve(log: &Log, cursors: &Path) -> Served {
    // A free port: the system's choice, released for the feed to take.
    let port = ok(ok(std::net::TcpListener::bind("127.0.0.1:0")).local_addr()).port();
    let config: GrpcSinkConfig = ok(toml::from_str(&format!(
        "name = \"feed\"\nlisten = \"127.0.0.1:{port}\"\n"
    )));
    let (acked, acks) = watch::channel(LogPosition {
        next: 0,
        lsn: Lsn(0),
    });
    let logs = [SourceLog {
        context: Arc::new(SourceContext {
            name: "src".into(),
            database: "db".into(),
            log_id: log.id().to_owned(),
            acked,
            delays: SinkDelays::new("src", "feed"),
        }),
        log: log.clone(),
    }];
    let sink = ok(config.open(cursors).map_err(|e| e.to_string()));
    let mut run = ok(sink.start().map_err(|e| e.to_string()));
    ok(run.resume(&logs).await.map_err(|e| e.to_string()));
    let (stop, events) = mpsc::channel(1);
    let run = tokio::spawn(run.run(events));
    Served {
        address: format!("http://127.0.0.1:{port}"),
        acks,
        _stop: stop,
        run,
    }
}

impl Served {
    async fn stop(self) {
        drop(self._stop);
        ok(ok(self.run.await).map_err(|e| e.to_string()));
    }
}

/// A subscription: its requests, and the events it receives.
struct Subscription {
    requests: mpsc::Sender<pb::SubscribeRequest>,
    events: tonic::Streaming<pb::SubscribeResponse>,
}

async fn subscribe(address: &str, start: pb::start::Position) -> Subscription {
    let mut client = None;
    for _ in 0..500 {
        let endpoint = ok(tonic::transport::Endpoint::from_shared(address.to_owned()));
        match endpoint.connect().await {
            Ok(channel) => {
                client = Some(pb::change_feed_client::ChangeFeedClient::new(channel));
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    let mut client = client.unwrap_or_else(|| panic!("the feed never listened on {address}"));
    let (requests, outgoing) = mpsc::channel(8);
    let open = pb::Open {
        start: Some(pb::Start {
            position: Some(start),
        }),
        filter: Some(pb::Filter {
            message_prefixes: vec!["*".into()],
            ..Default::default()
        }),
        ..Default::default()
    };
    ok(requests
        .send(pb::SubscribeRequest {
            request: Some(subscribe_request::Request::Open(open)),
        })
        .await);
    let events = ok(client.subscribe(ReceiverStream::new(outgoing)).await).into_inner();
    Subscription { requests, events }
}

impl Subscription {
    /// The next `n` messages' contents and the last one's token.
    async fn messages(&mut self, n: usize) -> (Vec<String>, Bytes) {
        let mut contents = Vec::new();
        let mut token = Bytes::new();
        // Heartbeats come meanwhile: one deadline for all of them.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while contents.len() < n {
            let next = tokio::time::timeout_at(deadline, self.events.message()).await;
            let response =
                ok(ok(next.map_err(|_| {
                    format!("{n} messages not within 10 s: {contents:?}")
                })))
                .unwrap_or_else(|| panic!("the feed ended the stream after {contents:?}"));
            if let Some(Event::Message(m)) = response.event {
                contents.push(String::from_utf8_lossy(&m.content).into_owned());
                token = m.resume_token;
            }
        }
        (contents, token)
    }

    async fn acknowledge(&self, token: Bytes) {
        let ack = pb::Ack {
            resume_token: token,
        };
        ok(self
            .requests
            .send(pb::SubscribeRequest {
                request: Some(subscribe_request::Request::Ack(ack)),
            })
            .await);
    }
}

fn position(token: &Bytes) -> TokenPosition {
    Token::parse(token)
        .and_then(|t| t.position("src").cloned())
        .unwrap_or_else(|| panic!("not a token of source src: {token:?}"))
}

fn numbered(prefix: &str, range: std::ops::Range<u64>) -> Vec<String> {
    range.map(|i| format!("{prefix}{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_receives_units_before_their_fsync_and_the_log_keeps_them_until_durable() {
    let dir = ok(tempfile::tempdir());
    // The log's fsyncs wait for the gap since the last (an hour) while
    // nothing waits for them: nothing is durable before it closes.
    let options = LogOptions {
        sync_gap: Duration::from_secs(3600),
        ..LogOptions::default()
    };
    let (log, writer, _) = ok(Log::open(&dir.path().join("log"), options));
    let mut appender = Appender::new(writer);
    let cursors = dir.path().join("cursors");
    ok(std::fs::create_dir_all(&cursors));
    let served = serve(&log, &cursors).await;
    let mut subscription = subscribe(
        &served.address,
        pb::start::Position::Earliest(pb::Earliest {}),
    )
    .await;
    // Subscribed: the session reads the log's (empty) end.
    let subscribed = tokio::time::timeout(Duration::from_secs(10), subscription.events.message());
    let first = ok(ok(subscribed
        .await
        .map_err(|_| "not subscribed within 10 s")));
    assert!(matches!(
        first.and_then(|r| r.event),
        Some(Event::Subscribed(_))
    ));
    append_messages(&mut appender, (0..5).map(|i| (100 + i, format!("m{i}")))).await;

    let (contents, token) = subscription.messages(5).await;
    assert_eq!(contents, numbered("m", 0..5));
    assert_eq!(log.head().next_seq, 0, "sent before the log's fsync");
    let at = position(&token);
    assert_eq!((at.next, at.epoch), (5, log.epoch()));

    // Acknowledged, but not durable in the log: the feed holds it.
    subscription.acknowledge(token).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(served.acks.borrow().next, 0);
    ok(appender.close().await);
    let mut acks = served.acks.clone();
    let moved = tokio::time::timeout(Duration::from_secs(10), acks.wait_for(|a| a.next == 5));
    assert!(moved.await.is_ok(), "not acknowledged once durable");
    drop(subscription);
    served.stop().await;
}

/// The segment files as they are now.
fn snapshot_segments(dir: &Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    ok(std::fs::read_dir(dir))
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .map(|p| (p.clone(), ok(std::fs::read(&p))))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_past_what_a_crash_kept_resumes_where_the_log_reopened() {
    let dir = ok(tempfile::tempdir());
    let log_dir = dir.path().join("log");
    let cursors = dir.path().join("cursors");
    ok(std::fs::create_dir_all(&cursors));
    let options = LogOptions {
        preallocate: false,
        ..LogOptions::default()
    };
    let (_, writer, _) = ok(Log::open(&log_dir, options.clone()));
    let mut appender = Appender::new(writer);
    append_messages(&mut appender, (0..6).map(|i| (100 + i, format!("m{i}")))).await;
    ok(appender.close().await);
    // What the disk holds after the last fsync of records 0..6.
    let fsynced = snapshot_segments(&log_dir);

    let (log, writer, _) = ok(Log::open(&log_dir, options.clone()));
    let mut appender = Appender::new(writer);
    append_messages(&mut appender, (6..10).map(|i| (100 + i, format!("m{i}")))).await;
    let served = serve(&log, &cursors).await;
    let mut subscription = subscribe(
        &served.address,
        pb::start::Position::Earliest(pb::Earliest {}),
    )
    .await;
    let (contents, token) = subscription.messages(10).await;
    assert_eq!(contents, numbered("m", 0..10));
    assert_eq!((position(&token).next, position(&token).epoch), (10, 2));
    drop(subscription);
    served.stop().await;
    ok(appender.close().await);
    drop(log);

    // The machine went down before records 6..10 reached the disk; the
    // publisher sends what the log lost again, and another message takes
    // a place among them (a unit that need not fall where it did).
    for (path, _) in snapshot_segments(&log_dir) {
        ok(std::fs::remove_file(path));
    }
    for (path, bytes) in &fsynced {
        ok(std::fs::write(path, bytes));
    }
    let (log, writer, _) = ok(Log::open(&log_dir, options));
    assert_eq!((log.head().next_seq, log.epoch()), (6, 3));
    let mut appender = Appender::new(writer);
    append_messages(
        &mut appender,
        (6..12).map(|i| (100 + i, format!("again{i}"))),
    )
    .await;
    let served = serve(&log, &cursors).await;
    let mut subscription =
        subscribe(&served.address, pb::start::Position::ResumeToken(token)).await;
    // From record 6, not 10: what came after the surviving end, again.
    let (contents, token) = subscription.messages(6).await;
    assert_eq!(contents, numbered("again", 6..12));
    assert_eq!((position(&token).next, position(&token).epoch), (12, 3));
    drop(subscription);
    served.stop().await;
    ok(appender.close().await);
}
