//! `exactly_once = true`: a transactional producer whose positions commit
//! with the messages, killed with SIGKILL again and again under load, read
//! back by a `read_committed` consumer (Python's confluent-kafka).
//!
//! The broker is a real Apache Kafka (`scripts/throwaway-kafka.sh`), so
//! what aborted transactions wrote is hidden from the consumer: every
//! change must arrive exactly once, each key's changes in commit order.

use std::collections::BTreeMap;
use std::time::Duration;

use walbridge_tests::Cluster;
use walbridge_tests::fixtures::{Rng, WORKLOAD_SCHEMA, transaction, write_while_killing};
use walbridge_tests::kafka::{Broker, ConsumeOptions, consume};
use walbridge_tests::walbridge::Deployment;

const WAIT: Duration = Duration::from_secs(200);
const CHUNKS: u64 = 8;
const PER_CHUNK: u64 = 250;

#[test]
fn a_transactional_sink_killed_under_load_delivers_every_change_exactly_once() {
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
            "[[sink]]\nname = \"events\"\ntype = \"kafka\"\nbrokers = \"{}\"\nexactly_once = true\ntombstones = false\n",
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
    // Every change once: (topic, key, LSN, op) names a change; the
    // consumer reads each partition in order, so a key's changes must come
    // in commit order.
    let mut seen: BTreeMap<(String, String, u64, String), &serde_json::Value> = BTreeMap::new();
    let mut last_lsn: BTreeMap<(String, String), u64> = BTreeMap::new();
    for m in &messages {
        let lsn = m.value["source"]["lsn"].as_u64().unwrap_or_default();
        let key = (
            m.topic.clone(),
            m.key.to_string(),
            lsn,
            m.value["op"].as_str().unwrap_or_default().to_owned(),
        );
        if let Some(first) = seen.insert(key, &m.value) {
            panic!("seen twice: {first} and {}; {context}", m.value);
        }
        let previous = last_lsn.insert((m.topic.clone(), m.key.to_string()), lsn);
        assert!(
            previous.is_none_or(|p| p < lsn),
            "out of commit order for key {}: {} after {previous:?}; {context}",
            m.key,
            lsn
        );
    }
    assert_eq!(messages.len() as u64, expected, "{context}");
    assert!(
        wb.log()
            .contains("resuming from the position committed in Kafka"),
        "{context}"
    );
}
