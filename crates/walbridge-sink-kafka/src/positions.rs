//! With `exactly_once`, the sink's log positions live in Kafka: every Kafka
//! transaction ends with a record per source on the positions topic
//! (key `<sink>/<source>`, value the position), so the position commits
//! or aborts together with the messages before it. On start, after
//! `init_transactions` has aborted whatever a crashed predecessor left
//! open, the last committed record of each source is where to resume.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use walbridge_log::CursorPosition;

use crate::client::TracingContext;
use crate::config::KafkaSinkConfig;
use crate::error::SinkError;

/// How long reading the positions topic back may take.
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(60);

/// A position record's value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PositionRecord {
    /// The source's log identity.
    pub log: String,
    /// The next log record to read.
    pub next: u64,
    /// The publisher LSN covered, for people reading the topic.
    pub lsn: String,
}

/// The key of `source`'s position record for sink `sink`.
pub fn record_key(sink: &str, source: &str) -> String {
    format!("{sink}/{source}")
}

/// Reads the positions topic to its end (committed records only) and
/// returns this sink's last position per source.
pub fn recover(config: &KafkaSinkConfig) -> Result<BTreeMap<String, CursorPosition>, SinkError> {
    let mut client = crate::client::connection_config(config);
    client
        .set("group.id", format!("walbridge-{}-recovery", config.name))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed");
    let consumer: BaseConsumer<TracingContext> = client
        .create_with_context(TracingContext::default())
        .map_err(|source| SinkError::Client {
            client: "positions consumer",
            source,
        })?;
    let unreachable = |reason: String| SinkError::Unreachable {
        brokers: config.brokers.clone(),
        reason,
    };
    let topic = &config.positions_topic;
    let metadata = consumer
        .fetch_metadata(Some(topic), RECOVERY_TIMEOUT)
        .map_err(|e| unreachable(format!("reading the metadata of `{topic}`: {e}")))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic && t.error().is_none())
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    let mut positions = BTreeMap::new();
    if partitions.is_empty() {
        return Ok(positions);
    }
    let mut assignment = TopicPartitionList::new();
    for &p in &partitions {
        assignment
            .add_partition_offset(topic, p, Offset::Beginning)
            .map_err(|e| unreachable(e.to_string()))?;
    }
    consumer
        .assign(&assignment)
        .map_err(|e| unreachable(format!("reading `{topic}`: {e}")))?;
    let prefix = format!("{}/", config.name);
    let mut at_end: HashSet<i32> = HashSet::new();
    let deadline = Instant::now() + RECOVERY_TIMEOUT;
    while at_end.len() < partitions.len() {
        if Instant::now() > deadline {
            return Err(unreachable(format!(
                "reading `{topic}` to its end took longer than {RECOVERY_TIMEOUT:?}"
            )));
        }
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => return Err(unreachable(format!("reading `{topic}`: {e}"))),
            Some(Ok(message)) => {
                let key = message.key().and_then(|k| std::str::from_utf8(k).ok());
                let Some(source) = key.and_then(|k| k.strip_prefix(&prefix)) else {
                    continue;
                };
                let Some(value) = message.payload() else {
                    continue;
                };
                let record: PositionRecord =
                    serde_json::from_slice(value).map_err(|e| SinkError::Encode {
                        table: topic.clone(),
                        reason: format!("a position record of `{source}` is not walbridge's: {e}"),
                    })?;
                positions.insert(
                    source.to_owned(),
                    CursorPosition {
                        log: record.log,
                        next: record.next,
                    },
                );
            }
        }
    }
    Ok(positions)
}
