//! `type = "kafka"`: the sink's section of the configuration file.

use std::collections::BTreeMap;

use serde::Deserialize;
use walbridge_core::json::DEFAULT_UNCHANGED_PLACEHOLDER;
use walbridge_core::template::Template;

/// How change events are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// JSON: schemaless, or Kafka Connect's `{schema, payload}` form with
    /// `json_schemas = true`.
    #[default]
    Json,
    /// Avro in the Confluent wire format, schemas in a registry.
    Avro,
    /// Protobuf in the Confluent wire format, schemas in a registry.
    Protobuf,
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Format::Json => "json",
            Format::Avro => "avro",
            Format::Protobuf => "protobuf",
        })
    }
}

/// How the subjects schemas are registered under are named.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubjectNameStrategy {
    /// `<topic>-key` and `<topic>-value` (Confluent's TopicNameStrategy).
    #[default]
    Topic,
    /// The record's full name (RecordNameStrategy).
    Record,
    /// `<topic>-<record full name>` (TopicRecordNameStrategy).
    TopicRecord,
}

/// Where the sink registers its schemas.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchemaRegistryConfig {
    /// The registry's base URL, `http://…` or `https://…`.
    pub url: String,
    /// Basic-auth user.
    #[serde(default)]
    pub username: Option<String>,
    /// Basic-auth password.
    #[serde(default)]
    pub password: Option<String>,
    /// A PEM file of CA certificates trusted besides the system's.
    #[serde(default)]
    pub ca_cert: Option<std::path::PathBuf>,
    /// How subjects are named.
    #[serde(default)]
    pub subject_name_strategy: SubjectNameStrategy,
}

/// `schema_registry = "http://…"` or a table with the details.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum SchemaRegistrySetting {
    /// Just the URL.
    Url(String),
    /// URL, credentials, trust, subject names.
    Full(SchemaRegistryConfig),
}

impl SchemaRegistrySetting {
    /// The setting in full.
    pub fn config(&self) -> SchemaRegistryConfig {
        match self {
            SchemaRegistrySetting::Url(url) => SchemaRegistryConfig {
                url: url.clone(),
                username: None,
                password: None,
                ca_cert: None,
                subject_name_strategy: SubjectNameStrategy::default(),
            },
            SchemaRegistrySetting::Full(config) => config.clone(),
        }
    }
}

fn default_brokers() -> String {
    "localhost:9092".to_owned()
}

fn default_topic() -> String {
    "{source}.{schema}.{table}".to_owned()
}

fn default_true() -> bool {
    true
}

fn default_placeholder() -> String {
    DEFAULT_UNCHANGED_PLACEHOLDER.to_owned()
}

fn default_positions_topic() -> String {
    "walbridge.positions".to_owned()
}

fn broker_default() -> i32 {
    -1
}

/// How topics the sink writes to come into being.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicCreation {
    /// Create a missing topic through the admin API before the first
    /// message to it; `false` leaves it to the broker
    /// (`auto.create.topics.enable`) or to whoever runs the cluster.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Partitions of a created topic; `-1` takes the broker's
    /// `num.partitions`.
    #[serde(default = "broker_default")]
    pub partitions: i32,
    /// Replication factor of a created topic; `-1` takes the broker's
    /// `default.replication.factor`.
    #[serde(default = "broker_default")]
    pub replication_factor: i32,
    /// Topic configuration of created topics (`cleanup.policy`,
    /// `retention.ms`, …).
    #[serde(default)]
    pub config: BTreeMap<String, String>,
}

impl Default for TopicCreation {
    fn default() -> Self {
        TopicCreation {
            enabled: true,
            partitions: broker_default(),
            replication_factor: broker_default(),
            config: BTreeMap::new(),
        }
    }
}

/// `type = "kafka"`: change events to Kafka, one topic per table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSinkConfig {
    /// Unique sink name (it names the cursor file).
    pub name: String,
    /// Sources to read; default every source.
    #[serde(default)]
    pub sources: Option<Vec<String>>,
    /// Bootstrap brokers, `host:port[,host:port…]` (librdkafka's
    /// `bootstrap.servers`).
    #[serde(default = "default_brokers")]
    pub brokers: String,
    /// How events are written.
    #[serde(default)]
    pub format: Format,
    /// With `format = "json"`: write Kafka Connect's `{schema, payload}`
    /// form (what its JsonConverter reads with `schemas.enable = true`).
    #[serde(default)]
    pub json_schemas: bool,
    /// Topic name template: `{source}`, `{schema}` and `{table}` are
    /// replaced; characters Kafka does not allow become `_`.
    #[serde(default = "default_topic")]
    pub topic: String,
    /// Per table (`schema.table`): the columns that make the message key,
    /// instead of the replica identity (a table without one otherwise gets
    /// null keys).
    #[serde(default)]
    pub key_columns: BTreeMap<String, Vec<String>>,
    /// Follow every delete with a tombstone (null value, same key), so
    /// log compaction can remove the row's messages.
    #[serde(default = "default_true")]
    pub tombstones: bool,
    /// Send TRUNCATE as an event (`op = "t"`, null key) to each truncated
    /// table's topic.
    #[serde(default = "default_true")]
    pub truncate_events: bool,
    /// Topic for logical decoding messages (`pg_logical_emit_message`);
    /// without it they are not sent.
    #[serde(default)]
    pub message_topic: Option<String>,
    /// Topic for sequences' values (sources with `sequences = true`): an
    /// `op = "q"` event per sequence that moved, keyed by its schema and
    /// name; without it they are not sent.
    #[serde(default)]
    pub sequence_topic: Option<String>,
    /// Topic for transaction metadata: a BEGIN and an END record per
    /// source transaction (END with per-table event counts); with it, each
    /// change event also carries a `transaction` block. Without it neither
    /// is written.
    #[serde(default)]
    pub transaction_topic: Option<String>,
    /// Value written for an unchanged TOASTed column, which the publisher
    /// does not send.
    #[serde(default = "default_placeholder")]
    pub unchanged_toast_placeholder: String,
    /// How topics are created.
    #[serde(default)]
    pub topic_creation: TopicCreation,
    /// The schema registry Avro and Protobuf schemas are registered in;
    /// without it, the registry walbridge itself serves
    /// (`[schema_registry] listen`).
    #[serde(default)]
    pub schema_registry: Option<SchemaRegistrySetting>,
    /// Deliver exactly once: a transactional producer, one Kafka
    /// transaction per batch of source transactions, the sink's positions
    /// committed in the same transaction (on `positions_topic`) and read
    /// back from Kafka at start. Consumers read with
    /// `isolation.level = read_committed`.
    #[serde(default)]
    pub exactly_once: bool,
    /// With `exactly_once`: the producer's `transactional.id`; one
    /// running instance per id (a second one fences the first). Default
    /// `walbridge-<sink name>`.
    #[serde(default)]
    pub transactional_id: Option<String>,
    /// With `exactly_once`: the compacted topic holding the positions.
    #[serde(default = "default_positions_topic")]
    pub positions_topic: String,
    /// librdkafka properties passed through as they are (security, SASL,
    /// compression, batching, …); they override walbridge's defaults.
    #[serde(default)]
    pub kafka_properties: BTreeMap<String, String>,
    /// The URL of the registry walbridge serves itself (`[schema_registry]`),
    /// when it serves one: not a key of the sink's table.
    #[serde(skip)]
    pub embedded_registry: Option<String>,
}

/// Properties walbridge sets unless `kafka_properties` says otherwise:
/// no loss and no reordering on retries, and batches worth compressing.
pub const DEFAULT_PRODUCER_PROPERTIES: &[(&str, &str)] = &[
    ("enable.idempotence", "true"),
    ("acks", "all"),
    ("compression.type", "lz4"),
    ("linger.ms", "20"),
    ("batch.size", "1000000"),
    // Keys hash to the partition the Java client would choose, so other
    // producers and Kafka Streams agree on where a row lives.
    ("partitioner", "murmur2_random"),
];

/// Properties walbridge owns: setting them would break its guarantees.
const RESERVED_PROPERTIES: &[&str] = &[
    "bootstrap.servers",
    "metadata.broker.list",
    "transactional.id",
    "enable.idempotence",
];

impl KafkaSinkConfig {
    /// Problems with the values, each naming its key.
    pub fn validate(&self) -> Vec<String> {
        let at = |key: &str| format!("sink `{}`: `{key}`", self.name);
        let mut problems = Vec::new();
        if self.brokers.trim().is_empty() {
            problems.push(format!("{}: must name at least one broker", at("brokers")));
        }
        match Template::parse(&self.topic) {
            Ok(t) if t.is_empty() => problems.push(format!("{}: must not be empty", at("topic"))),
            Ok(_) => {}
            Err(e) => problems.push(format!("{}: {e}", at("topic"))),
        }
        if self.json_schemas && self.format != Format::Json {
            problems.push(format!(
                "{}: only applies to format = \"json\" (Avro and Protobuf always carry their schemas in the registry)",
                at("json_schemas")
            ));
        }
        if self.format != Format::Json && self.schema_registry.is_none() {
            problems.push(format!(
                "{}: format = \"{}\" needs a schema registry: set it to the registry's URL, or serve one with [schema_registry] listen = \"127.0.0.1:8081\"",
                at("schema_registry"),
                self.format
            ));
        }
        if let Some(registry) = &self.schema_registry {
            let url = registry.config().url;
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                problems.push(format!(
                    "{}: `{url}` is not an http:// or https:// URL",
                    at("schema_registry")
                ));
            }
        }
        for (table, columns) in &self.key_columns {
            if !table.contains('.') {
                problems.push(format!(
                    "{}: `{table}`: name the table as `schema.table`",
                    at("key_columns")
                ));
            }
            if columns.is_empty() {
                problems.push(format!(
                    "{}: `{table}`: list at least one column",
                    at("key_columns")
                ));
            }
        }
        if let Err(e) = crate::topic::check_topic_name(&self.positions_topic) {
            problems.push(format!("{}: {e}", at("positions_topic")));
        }
        if self.transactional_id.is_some() && !self.exactly_once {
            problems.push(format!(
                "{}: only applies with `exactly_once = true`",
                at("transactional_id")
            ));
        }
        for (key, topic) in [
            ("message_topic", &self.message_topic),
            ("sequence_topic", &self.sequence_topic),
            ("transaction_topic", &self.transaction_topic),
        ] {
            if let Some(topic) = topic
                && let Err(e) = crate::topic::check_topic_name(topic)
            {
                problems.push(format!("{}: {e}", at(key)));
            }
        }
        let creation = &self.topic_creation;
        if creation.partitions == 0 || creation.partitions < -1 {
            problems.push(format!(
                "{}: must be at least 1, or -1 for the broker's default",
                at("topic_creation.partitions")
            ));
        }
        if creation.replication_factor == 0 || creation.replication_factor < -1 {
            problems.push(format!(
                "{}: must be at least 1, or -1 for the broker's default",
                at("topic_creation.replication_factor")
            ));
        }
        for reserved in RESERVED_PROPERTIES {
            if self.kafka_properties.contains_key(*reserved) {
                problems.push(format!(
                    "{}: `{reserved}` is set by walbridge (use `brokers` for the bootstrap servers)",
                    at("kafka_properties")
                ));
            }
        }
        problems
    }

    /// The librdkafka configuration of the sink's clients: walbridge's
    /// defaults, then `kafka_properties`, then the brokers.
    pub fn client_properties(&self) -> BTreeMap<String, String> {
        let mut properties: BTreeMap<String, String> = DEFAULT_PRODUCER_PROPERTIES
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        properties.insert("client.id".into(), format!("walbridge-{}", self.name));
        properties.extend(self.kafka_properties.clone());
        properties.insert("bootstrap.servers".into(), self.brokers.clone());
        if self.exactly_once {
            properties.insert("transactional.id".into(), self.effective_transactional_id());
        }
        properties
    }

    /// The producer's `transactional.id` with `exactly_once`:
    /// `transactional_id`, or `walbridge-<sink name>`.
    pub fn effective_transactional_id(&self) -> String {
        self.transactional_id
            .clone()
            .unwrap_or_else(|| format!("walbridge-{}", self.name))
    }
}
