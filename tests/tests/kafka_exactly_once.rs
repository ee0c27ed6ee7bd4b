//! The kafka sink killed with SIGKILL again and again under load, read
//! back by Python's confluent-kafka from a real Apache Kafka broker
//! (`scripts/throwaway-kafka.sh`).
//!
//! With `exactly_once = true` (a transactional producer whose positions
//! commit with the messages) a `read_committed` consumer sees every change
//! exactly once, each table's in commit order. In the default at-least-once
//! mode nothing is lost, and whatever arrives twice is an identical
//! re-send, recognizable by its LSN. Either way, the changes replayed give
//! the publisher's tables.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use walbridge_tests::Cluster;
use walbridge_tests::fixtures::{
    Rng, WORKLOAD_SCHEMA, assert_replays_to_publisher, transaction, write_while_killing,
};
use walbridge_tests::kafka::{Broker, ConsumeOptions, consume};
use walbridge_tests::walbridge::Deployment;

const WAIT: Duration = Duration::from_secs(200);
const CHUNKS: u64 = 8;
const PER_CHUNK: u64 = 250;
const TOPICS: [&str; 3] = ["src.public.t", "src.public.g", "src.public.big"];

/// Runs the workload while killing walbridge, then reads every topic.
/// Returns the events in each topic's order (one partition each: commit
/// order), the number expected, and the context for messages.
fn killed_under_load(exactly_once: bool) -> (Cluster, Vec<Value>, u64, String) {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let mut rng = Rng::new(seed);
    let kafka = Broker::start();
    let pg = Cluster::start();
    pg.psql(WORKLOAD_SCHEMA);
    pg.psql("CREATE PUBLICATION pub FOR TABLE t, g, big");
    let wb = Deployment::new();
    wb.configure_sinks(
        &pg.superuser(),
        &["pub"],
        "",
        &format!(
            "[[sink]]\nname = \"events\"\ntype = \"kafka\"\nbrokers = \"{}\"\nexactly_once = {exactly_once}\ntombstones = false\n",
            kafka.bootstrap()
        ),
    );
    let running = wb.start();
    pg.wait_for_streaming(WAIT);
    let (running, kills, written) = write_while_killing(
        &pg,
        &wb,
        running,
        (CHUNKS, PER_CHUNK),
        &mut rng,
        1200,
        || {},
        || true,
    );
    let expected: u64 = (0..written).map(|i| transaction(i).1).sum();
    let messages = consume(
        &kafka.bootstrap(),
        &ConsumeOptions {
            topics: &TOPICS,
            format: "json",
            expect: expected as usize,
            timeout: WAIT,
            registry: None,
            read_committed: exactly_once,
            schema_version: None,
            properties: &[],
        },
    );
    let status = running.stop(WAIT);
    let context = format!("seed {seed}, {kills} kills; walbridge log:\n{}", wb.log());
    assert!(status.success(), "{context}");
    assert!(kills >= 10, "{context}");
    if exactly_once {
        assert!(
            wb.log()
                .contains("resuming from the position committed in Kafka"),
            "{context}"
        );
    }
    let events = messages.into_iter().map(|m| m.value).collect();
    (pg, events, expected, context)
}

/// `(table, LSN, op, key)`: one change.
fn change_id(event: &Value) -> (String, u64, String, String) {
    (
        event["source"]["table"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        event["source"]["lsn"].as_u64().unwrap_or_default(),
        event["op"].as_str().unwrap_or_default().to_owned(),
        format!("{}/{}", event["before"]["id"], event["after"]["id"]),
    )
}

#[test]
fn a_transactional_sink_killed_under_load_delivers_every_change_exactly_once() {
    let (pg, events, expected, context) = killed_under_load(true);
    let mut seen = BTreeMap::new();
    let mut last_commit: BTreeMap<String, u64> = BTreeMap::new();
    for event in &events {
        if let Some(first) = seen.insert(change_id(event), event) {
            panic!("seen twice: {first} and {event}; {context}");
        }
        let table = event["source"]["table"].as_str().unwrap_or_default();
        let commit = event["source"]["commit_lsn"].as_u64().unwrap_or_default();
        let previous = last_commit.insert(table.to_owned(), commit);
        assert!(
            previous.is_none_or(|p| p <= commit),
            "out of commit order in {table}: {event} after commit {previous:?}; {context}"
        );
    }
    assert_eq!(events.len() as u64, expected, "{context}");
    let ordered: Vec<&Value> = events.iter().collect();
    assert_replays_to_publisher(&pg, &ordered, &context);
}

#[test]
fn an_at_least_once_sink_killed_under_load_loses_nothing_and_repeats_recognizably() {
    let (pg, events, expected, context) = killed_under_load(false);
    // A change seen again is the same message (same row images, same LSN),
    // re-sent from the sink's last stored position: replaying only the
    // first copy of each gives the publisher's tables.
    let mut seen: BTreeMap<_, &Value> = BTreeMap::new();
    let mut first_copies = Vec::new();
    for event in &events {
        match seen.get(&change_id(event)) {
            Some(first) => {
                assert_eq!(first["before"], event["before"], "{context}");
                assert_eq!(first["after"], event["after"], "{context}");
            }
            None => {
                seen.insert(change_id(event), event);
                first_copies.push(event);
            }
        }
    }
    assert_eq!(first_copies.len() as u64, expected, "{context}");
    eprintln!(
        "{} events, {} re-sent after kills",
        events.len(),
        events.len() - first_copies.len()
    );
    assert_replays_to_publisher(&pg, &first_copies, &context);
}
