//! `exactly_once = true`: a transactional producer whose positions commit
//! with the messages, killed with SIGKILL again and again under load, read
//! back by a `read_committed` consumer (Python's confluent-kafka).
//!
//! The broker is librdkafka's mock cluster in a process of its own: tansu
//! does not support transactions, and no other Kafka broker can be
//! installed here. The mock runs the transactional protocol (ids, epochs,
//! fencing, commits) but does not hide the messages of aborted
//! transactions from `read_committed` consumers (seen with a plain Python
//! producer: 5,000 messages produced and aborted are all read back). So
//! this test checks what the mock can show — every change arrives, the
//! sink resumes from the position committed in Kafka, and whatever appears
//! twice is an identical re-send of an aborted attempt — and not the
//! absence of duplicates, which needs a broker that filters aborted
//! transactions.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use walbridge_tests::Cluster;
use walbridge_tests::fixtures::{Rng, WORKLOAD_SCHEMA, transaction, write_while_killing};
use walbridge_tests::kafka::{ConsumeOptions, MockKafka, consume};
use walbridge_tests::walbridge::Deployment;

const WAIT: Duration = Duration::from_secs(200);
const CHUNKS: u64 = 8;
const PER_CHUNK: u64 = 250;

#[test]
fn a_transactional_sink_killed_under_load_resumes_from_its_committed_positions() {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let mut rng = Rng::new(seed);
    let kafka = MockKafka::start(Path::new(env!("CARGO_BIN_EXE_mock-kafka")));
    let pg = Cluster::start();
    pg.psql(WORKLOAD_SCHEMA);
    pg.psql("CREATE PUBLICATION pub FOR TABLE t, g, big");
    let wb = Deployment::new();
    wb.configure_sinks(
        &pg.superuser(),
        &["pub"],
        "",
        &format!(
            "[[sink]]\nname = \"events\"\ntype = \"kafka\"\nbrokers = \"{}\"\nexactly_once = true\ntombstones = false\n[sink.topic_creation]\nenabled = false\n",
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
        kafka.bootstrap(),
        &ConsumeOptions {
            topics: &["src.public.t", "src.public.g", "src.public.big"],
            format: "json",
            expect: expected as usize,
            timeout: WAIT,
            registry: None,
            read_committed: true,
            schema_version: None,
        },
    );
    let status = running.stop(WAIT);
    let context = format!("seed {seed}, {kills} kills; walbridge log:\n{}", wb.log());
    assert!(status.success(), "{context}");
    assert!(kills >= 10, "{context}");
    // Every change arrived; a change seen twice is the same message again
    // (same row image, same LSN), from an attempt that was aborted.
    let mut seen: BTreeMap<(String, String, u64, String), &serde_json::Value> = BTreeMap::new();
    for m in &messages {
        let key = (
            m.topic.clone(),
            m.key.to_string(),
            m.value["source"]["lsn"].as_u64().unwrap_or_default(),
            m.value["op"].as_str().unwrap_or_default().to_owned(),
        );
        if let Some(first) = seen.get(&key) {
            assert_eq!(first["after"], m.value["after"], "{context}");
            assert_eq!(first["before"], m.value["before"], "{context}");
        } else {
            seen.insert(key, &m.value);
        }
    }
    assert_eq!(seen.len() as u64, expected, "{context}");
    assert!(
        wb.log()
            .contains("resuming from the position committed in Kafka"),
        "{context}"
    );
}
