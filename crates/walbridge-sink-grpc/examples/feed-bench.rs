//! A benchmark consumer of the change feed (`scripts/bench-feed.sh` runs
//! it): one or more concurrent subscriptions, each on its own connection,
//! that count what they receive, acknowledge every transaction as it
//! arrives, and stop after a number of transactions or a quiet spell.
//! With `--latency` each transaction's delay from its commit on the
//! publisher (`Begin.commit_time`) to the arrival of its `commit` is
//! recorded: publisher, walbridge and this client share one clock.
//!
//! It prints one JSON object: events (changes, messages and rows of the
//! copy), transactions, bytes of data, the seconds from the first data to
//! the last, and the delays' percentiles in milliseconds.
//!
//! ```sh
//! cargo run --release -p walbridge-sink-grpc --example feed-bench -- \
//!     --address http://127.0.0.1:50051 --transactions 20000
//! ```

use std::time::{Duration, Instant, SystemTime};

use clap::Parser;
use prost::Message as _;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};
use walbridge_sink_grpc::pb::{self, subscribe_request::Request, subscribe_response::Event};

#[derive(Parser, Debug, Clone)]
#[command(about = "A benchmark consumer of walbridge's change feed")]
struct Args {
    /// The feed's address.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    address: String,
    /// Concurrent subscriptions, each on its own connection.
    #[arg(long, default_value_t = 1)]
    consumers: usize,
    /// Where each subscription starts: earliest or latest.
    #[arg(long, default_value = "earliest")]
    start: String,
    /// Each subscription stops after this many transactions (0: no bound).
    #[arg(long, default_value_t = 0)]
    transactions: u64,
    /// Each subscription stops when no data (heartbeats aside) came for
    /// this many seconds after its first (0: never).
    #[arg(long, default_value_t = 0.0)]
    idle: f64,
    /// Record each transaction's delay from commit to arrival.
    #[arg(long)]
    latency: bool,
    /// Keep retrying to connect for this many seconds (the feed may still
    /// be starting).
    #[arg(long, default_value_t = 60.0)]
    connect_timeout: f64,
}

/// What one subscription received.
#[derive(Default)]
struct Received {
    events: u64,
    transactions: u64,
    bytes: u64,
    /// When the first and the last data arrived.
    first: Option<Instant>,
    last: Option<Instant>,
    /// Microseconds from commit to arrival, one per transaction.
    delays: Vec<u64>,
}

type Failure = Box<dyn std::error::Error + Send + Sync>;

async fn connect(args: &Args) -> Result<Channel, Failure> {
    let endpoint = Endpoint::from_shared(args.address.clone())?;
    let deadline = Instant::now() + Duration::from_secs_f64(args.connect_timeout);
    loop {
        match endpoint.connect().await {
            Ok(channel) => return Ok(channel),
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(format!("cannot connect to {}: {e}", args.address).into()),
        }
    }
}

fn micros_since_epoch(at: SystemTime) -> i64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

async fn subscribe(args: Args) -> Result<Received, Failure> {
    let channel = connect(&args).await?;
    let mut client = pb::change_feed_client::ChangeFeedClient::new(channel)
        .max_decoding_message_size(usize::MAX);
    let (requests, requests_rx) = mpsc::channel::<pb::SubscribeRequest>(64);
    let position = match args.start.as_str() {
        "earliest" => pb::start::Position::Earliest(pb::Earliest {}),
        "latest" => pb::start::Position::Latest(pb::Latest {}),
        other => return Err(format!("--start {other}: earliest or latest").into()),
    };
    requests
        .send(pb::SubscribeRequest {
            request: Some(Request::Open(pb::Open {
                start: Some(pb::Start {
                    position: Some(position),
                }),
                ..Default::default()
            })),
        })
        .await?;
    let mut stream = client
        .subscribe(ReceiverStream::new(requests_rx))
        .await?
        .into_inner();
    let idle = (args.idle > 0.0).then(|| Duration::from_secs_f64(args.idle));
    let mut received = Received::default();
    let mut commit_time = 0i64;
    loop {
        // Quiet means no data: heartbeats (progress) keep coming.
        let next = match (idle, received.last) {
            (Some(idle), Some(last)) => {
                match tokio::time::timeout_at((last + idle).into(), stream.message()).await {
                    Ok(next) => next?,
                    Err(_) => break,
                }
            }
            _ => stream.message().await?,
        };
        let Some(message) = next else { break };
        let now = Instant::now();
        let bytes = message.encoded_len() as u64;
        let token = match message.event {
            Some(Event::Begin(begin)) => {
                received.first.get_or_insert(now);
                received.bytes += bytes;
                commit_time = begin
                    .commit_time
                    .map_or(0, |t| t.seconds * 1_000_000 + i64::from(t.nanos) / 1_000);
                continue;
            }
            Some(Event::Change(_)) => {
                received.events += 1;
                received.bytes += bytes;
                continue;
            }
            Some(Event::Commit(commit)) => {
                received.transactions += 1;
                if args.latency {
                    let delay = micros_since_epoch(SystemTime::now()) - commit_time;
                    received.delays.push(delay.max(0) as u64);
                }
                commit.resume_token
            }
            Some(Event::Rows(rows)) => {
                received.first.get_or_insert(now);
                received.events += rows.rows.len() as u64;
                rows.resume_token
            }
            Some(Event::Message(message)) => {
                received.first.get_or_insert(now);
                received.events += 1;
                message.resume_token
            }
            Some(Event::CopyComplete(done)) => done.resume_token,
            Some(Event::Progress(progress)) => {
                ack(&requests, progress.resume_token);
                continue;
            }
            _ => continue,
        };
        received.bytes += bytes;
        received.last = Some(now);
        ack(&requests, token);
        if args.transactions > 0 && received.transactions >= args.transactions {
            break;
        }
    }
    Ok(received)
}

/// Acknowledges `token`. Tokens are cumulative: when the queue is full
/// this one is dropped and the next covers it.
fn ack(requests: &mpsc::Sender<pb::SubscribeRequest>, token: bytes::Bytes) {
    if !token.is_empty() {
        let _ = requests.try_send(pb::SubscribeRequest {
            request: Some(Request::Ack(pb::Ack {
                resume_token: token,
            })),
        });
    }
}

/// The `p`th percentile of `sorted`, in milliseconds.
fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64 / 1000.0
}

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let args = Args::parse();
    let started = Instant::now();
    let subscriptions: Vec<_> = (0..args.consumers)
        .map(|_| tokio::spawn(subscribe(args.clone())))
        .collect();
    let mut all = Vec::new();
    for subscription in subscriptions {
        all.push(subscription.await??);
    }
    let first = all.iter().filter_map(|r| r.first).min();
    let last = all.iter().filter_map(|r| r.last).max();
    let seconds = match (first, last) {
        (Some(first), Some(last)) => last.duration_since(first).as_secs_f64(),
        _ => 0.0,
    };
    let mut delays: Vec<u64> = all.iter().flat_map(|r| r.delays.iter().copied()).collect();
    delays.sort_unstable();
    let events: u64 = all.iter().map(|r| r.events).sum();
    let summary = serde_json::json!({
        "consumers": args.consumers,
        "events": events,
        "transactions": all.iter().map(|r| r.transactions).sum::<u64>(),
        "bytes": all.iter().map(|r| r.bytes).sum::<u64>(),
        "seconds": seconds,
        "since_start": started.elapsed().as_secs_f64(),
        "events_per_second": if seconds > 0.0 { events as f64 / seconds } else { 0.0 },
        "latency_ms": {
            "count": delays.len(),
            "p50": percentile(&delays, 50.0),
            "p95": percentile(&delays, 95.0),
            "p99": percentile(&delays, 99.0),
            "max": percentile(&delays, 100.0),
        },
    });
    println!("{summary}");
    Ok(())
}
