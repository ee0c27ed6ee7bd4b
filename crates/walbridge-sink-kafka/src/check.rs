//! `walbridge check` for a kafka sink: what `run` will need, asked of the
//! brokers before anything streams.
//!
//! In order: the configuration is usable; the brokers answer and accept
//! the client (SASL, TLS); the sink's principal may see and write every
//! topic it will write (the tables' topics, from the tables the sources
//! publish, and the sink's own) and create those that do not exist yet;
//! with `exactly_once`, the brokers give it transactions under its
//! transactional id; and the schema registry Avro or Protobuf needs
//! answers. Each refusal is one problem naming what to grant or change.
//!
//! Probing transactions claims the transactional id, which fences a
//! producer that holds it: the probe runs only when no walbridge runs on
//! the data_dir ([`CheckScope::running`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{Producer, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use walbridge_sink::{CheckScope, Health};

use crate::client::{self, TracingContext};
use crate::config::{Format, KafkaSinkConfig};
use crate::error::{SinkError, transaction_failure};
use crate::registry::client::RegistryClient;
use crate::topic::TopicNamer;

/// How long each topic's metadata request may take.
const TOPIC_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the transaction probe may take to be given the id.
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(30);

/// Checks what `run` needs (see the module's documentation). The
/// registry walbridge serves itself only runs with the pipeline: it is
/// not asked.
pub async fn health_check(config: &KafkaSinkConfig, scope: &CheckScope<'_>) -> Health {
    let problems = config.validate();
    if !problems.is_empty() {
        return Health::failed(SinkError::Config(problems.join("; ")));
    }
    // A consumer, which can be polled for what librdkafka reports while
    // it connects (an admin client cannot), and which never creates a
    // topic by asking for it.
    let probe: Arc<BaseConsumer<TracingContext>> =
        match client::connection_config(config).create_with_context(TracingContext::default()) {
            Ok(probe) => Arc::new(probe),
            Err(source) => {
                return Health::failed(SinkError::Client {
                    client: "consumer",
                    source,
                });
            }
        };
    let refusal = probe.context().refusal().clone();
    let asked = probe.clone();
    let polled = probe.clone();
    let brokers = match client::check_reachable(
        move |timeout| asked.fetch_metadata(None, timeout),
        move || {
            let _ = polled.poll(Duration::ZERO);
        },
        &refusal,
        &config.brokers,
    )
    .await
    {
        Ok(brokers) => brokers,
        Err(e) => return Health::failed(e),
    };
    let mut found = Found {
        report: format!("{brokers} Kafka broker(s) reachable at {}", config.brokers),
        problems: Vec::new(),
    };
    match topics(config, scope) {
        Ok(topics) => check_topics(config, probe, topics, &mut found).await,
        Err(e) => found.problems.push(e),
    }
    if config.exactly_once {
        let id = config.effective_transactional_id();
        if scope.running.is_none() {
            match check_transactions(config).await {
                Ok(()) => found.report.push_str(&format!(
                    "; transactions granted for transactional.id `{id}`"
                )),
                Err(e) => found.problems.push(e),
            }
        } else {
            found.report.push_str(&format!(
                "; transactions not probed: the walbridge running on this data_dir holds transactional.id `{id}`, which a probe would take from it"
            ));
        }
    }
    if let Some(registry) = config.schema_registry.as_ref().map(|r| r.config())
        && config.format != Format::Json
    {
        if config.embedded_registry.as_deref() == Some(registry.url.as_str()) {
            found
                .report
                .push_str("; schemas go to the registry walbridge serves");
        } else {
            match registry_subjects(&registry).await {
                Ok(subjects) => found.report.push_str(&format!(
                    "; schema registry at {} answers ({subjects} subjects)",
                    registry.url
                )),
                Err(e) => found.problems.push(e),
            }
        }
    }
    if found.problems.is_empty() {
        Health {
            ready: vec![found.report],
            problems: Vec::new(),
        }
    } else {
        Health {
            ready: Vec::new(),
            problems: found.problems.into_iter().map(Into::into).collect(),
        }
    }
}

/// What the check has found so far: one line of what is ready, and the
/// problems.
struct Found {
    report: String,
    problems: Vec<SinkError>,
}

async fn registry_subjects(registry: &crate::SchemaRegistryConfig) -> Result<usize, SinkError> {
    Ok(RegistryClient::new(registry)?.subjects().await?.len())
}

/// Every topic the sink will write, with the table whose changes go
/// there (`-` for the sink's own topics).
fn topics(
    config: &KafkaSinkConfig,
    scope: &CheckScope<'_>,
) -> Result<BTreeMap<String, String>, SinkError> {
    let namer = TopicNamer::new(&config.topic)?;
    let mut topics = BTreeMap::new();
    for (source, relations) in scope.tables_read_by(config) {
        for relation in relations {
            topics.insert(
                namer.topic(source, &relation.schema, &relation.name)?,
                format!("{}.{}", relation.schema, relation.name),
            );
        }
    }
    let own = [
        config.message_topic.clone(),
        config.sequence_topic.clone(),
        config.transaction_topic.clone(),
        config.exactly_once.then(|| config.positions_topic.clone()),
    ];
    for topic in own.into_iter().flatten() {
        topics.entry(topic).or_insert_with(|| "-".to_owned());
    }
    Ok(topics)
}

/// Asks for each topic's metadata (a topic the principal may not see is
/// one it may not write), then has the brokers validate creating the
/// missing ones when the sink creates its topics.
async fn check_topics(
    config: &KafkaSinkConfig,
    probe: Arc<BaseConsumer<TracingContext>>,
    topics: BTreeMap<String, String>,
    found: &mut Found,
) {
    let names: Vec<String> = topics.keys().cloned().collect();
    let answers = tokio::task::spawn_blocking(move || {
        names
            .into_iter()
            .map(|topic| {
                let answer = probe
                    .fetch_metadata(Some(&topic), TOPIC_TIMEOUT)
                    .map(|metadata| {
                        metadata
                            .topics()
                            .first()
                            .and_then(|t| t.error())
                            .map(RDKafkaErrorCode::from)
                    });
                (topic, answer)
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap_or_default();
    let mut missing = Vec::new();
    let mut denied = 0;
    for (topic, answer) in answers {
        let table = topics.get(&topic).cloned().unwrap_or_default();
        match answer {
            Ok(Some(
                RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic,
            )) => missing.push(topic),
            Ok(Some(code @ RDKafkaErrorCode::TopicAuthorizationFailed)) => {
                denied += 1;
                found.problems.push(SinkError::TopicDenied {
                    brokers: config.brokers.clone(),
                    topic,
                    table,
                    reason: code.to_string(),
                });
            }
            // It exists (a leader being elected is not for `check` to judge).
            Ok(_) => {}
            Err(e) => {
                denied += 1;
                found.problems.push(SinkError::Unreachable {
                    brokers: config.brokers.clone(),
                    reason: format!("the metadata of topic `{topic}`: {e}"),
                });
            }
        }
    }
    if config.topic_creation.enabled && !missing.is_empty() {
        denied += validate_creation(config, &missing, &topics, found).await;
    }
    if denied == 0 {
        let mut line = format!("; the sink may write its {} topic(s)", topics.len());
        if !missing.is_empty() {
            line.push_str(&format!(
                " ({} to be created{})",
                missing.len(),
                if config.topic_creation.enabled {
                    ""
                } else {
                    " by the brokers, if auto.create.topics.enable is on"
                }
            ));
        }
        found.report.push_str(&line);
    }
}

/// Has the brokers validate creating `missing` (nothing is created);
/// returns how many they refuse.
async fn validate_creation(
    config: &KafkaSinkConfig,
    missing: &[String],
    topics: &BTreeMap<String, String>,
    found: &mut Found,
) -> usize {
    let admin = match client::admin(config) {
        Ok(admin) => admin,
        Err(e) => {
            found.problems.push(e);
            return 1;
        }
    };
    let new: Vec<NewTopic<'_>> = missing
        .iter()
        .map(|topic| {
            NewTopic::new(
                topic,
                config.topic_creation.partitions,
                TopicReplication::Fixed(config.topic_creation.replication_factor),
            )
        })
        .collect();
    let options = AdminOptions::new()
        .validate_only(true)
        .operation_timeout(Some(TOPIC_TIMEOUT));
    let results = match admin.create_topics(&new, &options).await {
        Ok(results) => results,
        Err(e) => {
            found.problems.push(SinkError::TopicCreation {
                topic: missing.join(", "),
                table: "-".to_owned(),
                reason: e.to_string(),
                code: e.rdkafka_error_code(),
            });
            return 1;
        }
    };
    let mut refused = 0;
    for result in results {
        if let Err((topic, code)) = result
            && code != RDKafkaErrorCode::TopicAlreadyExists
        {
            refused += 1;
            found.problems.push(SinkError::TopicCreation {
                table: topics.get(&topic).cloned().unwrap_or_default(),
                topic,
                reason: code.to_string(),
                code: Some(code),
            });
        }
    }
    refused
}

/// Initializes transactions under the sink's transactional id, as `run`
/// will (which also aborts a transaction a killed predecessor left open,
/// as `run` would at its start).
async fn check_transactions(config: &KafkaSinkConfig) -> Result<(), SinkError> {
    let producer: ThreadedProducer<TracingContext> = client::client_config(config)
        .create_with_context(TracingContext::default())
        .map_err(|source| SinkError::Client {
            client: "producer",
            source,
        })?;
    let initialized =
        tokio::task::spawn_blocking(move || producer.init_transactions(TRANSACTION_TIMEOUT)).await;
    match initialized {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(transaction_failure(
            "initializing Kafka transactions",
            e,
            &config.brokers,
            &config.effective_transactional_id(),
        )),
        Err(e) => Err(SinkError::Unreachable {
            brokers: config.brokers.clone(),
            reason: format!("the transaction probe did not finish: {e}"),
        }),
    }
}
