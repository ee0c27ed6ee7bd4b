//! What can go wrong in the kafka sink, and whether a retry can cure it.

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

/// An error of the kafka sink.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The configuration cannot work.
    #[error("{0}")]
    Config(String),
    /// librdkafka refused the client configuration.
    #[error(
        "cannot create the Kafka {client}: {source} (check `kafka_properties`: names and values are librdkafka's)"
    )]
    Client {
        /// Which client.
        client: &'static str,
        /// What librdkafka said.
        source: KafkaError,
    },
    /// No broker answered.
    #[error("cannot reach the Kafka brokers {brokers}: {reason}; retrying")]
    Unreachable {
        /// The bootstrap servers.
        brokers: String,
        /// What failed.
        reason: String,
    },
    /// The brokers refused the client: SASL authentication or the TLS
    /// handshake failed. Retrying cannot help.
    #[error(
        "the Kafka brokers {brokers} refuse walbridge: {reason}: check security.protocol, sasl.mechanism, sasl.username, sasl.password and ssl.ca.location in [sink.kafka_properties]"
    )]
    Refused {
        /// The bootstrap servers.
        brokers: String,
        /// What librdkafka reported.
        reason: String,
    },
    /// A topic could not be created.
    #[error(
        "cannot create topic `{topic}` (table {table}): {reason} (grant the sink's principal CREATE on the topic or the cluster, or create the topic yourself, grant WRITE on it and set `topic_creation.enabled = false`)"
    )]
    TopicCreation {
        /// The topic.
        topic: String,
        /// The table whose changes go there, `-` for the sink's own topics.
        table: String,
        /// What the broker or client said.
        reason: String,
        /// The error code, when there is one.
        code: Option<RDKafkaErrorCode>,
    },
    /// The brokers deny the sink's principal a topic it writes.
    #[error(
        "the Kafka brokers {brokers} deny the sink's principal topic `{topic}` (table {table}): {reason}: grant it DESCRIBE and WRITE on the topic (and CREATE, unless the topic exists)"
    )]
    TopicDenied {
        /// The bootstrap servers.
        brokers: String,
        /// The topic.
        topic: String,
        /// The table whose changes go there, `-` for the sink's own topics.
        table: String,
        /// What the brokers said.
        reason: String,
    },
    /// The brokers will not give the sink the transactions `exactly_once`
    /// needs. Retrying cannot help.
    #[error(
        "{what} (transactional.id `{transactional_id}`) at the Kafka brokers {brokers} failed: {reason}: {remedy}"
    )]
    Transactions {
        /// The call that failed.
        what: &'static str,
        /// The producer's transactional id.
        transactional_id: String,
        /// The bootstrap servers.
        brokers: String,
        /// What librdkafka or the brokers said.
        reason: String,
        /// What to do.
        remedy: &'static str,
    },
    /// A message could not be produced or was not delivered.
    #[error("cannot deliver to topic `{topic}` (table {table}, key {key}): {reason}{}", delivery_remedy(*.code))]
    Delivery {
        /// The topic.
        topic: String,
        /// The source table, `-` for messages not about one table.
        table: String,
        /// The message key, shown as text.
        key: String,
        /// What failed.
        reason: String,
        /// The error code.
        code: Option<RDKafkaErrorCode>,
    },
    /// A change cannot be turned into a message.
    #[error("table {table}: {reason}")]
    Encode {
        /// The source table.
        table: String,
        /// What is wrong.
        reason: String,
    },
    /// A schema could not be registered.
    #[error(transparent)]
    Registry(#[from] crate::registry::RegistryError),
    /// The sink's cursor could not be read or stored.
    #[error(transparent)]
    Cursor(#[from] walbridge_log::LogError),
}

impl SinkError {
    /// True when retrying cannot help: the sink stops until the cause is
    /// fixed (sources and other sinks go on).
    pub fn is_permanent(&self) -> bool {
        match self {
            SinkError::Config(_)
            | SinkError::Client { .. }
            | SinkError::Encode { .. }
            | SinkError::Refused { .. }
            | SinkError::TopicDenied { .. }
            | SinkError::Transactions { .. } => true,
            SinkError::Unreachable { .. } | SinkError::Cursor(_) => false,
            SinkError::Registry(e) => e.is_permanent(),
            SinkError::TopicCreation { code, .. } | SinkError::Delivery { code, .. } => {
                code.is_some_and(is_permanent_code)
            }
        }
    }
}

/// What to do about a delivery that failed with `code`, when the code says.
fn delivery_remedy(code: Option<RDKafkaErrorCode>) -> &'static str {
    match code {
        Some(RDKafkaErrorCode::TopicAuthorizationFailed) => {
            ": grant the sink's principal WRITE and DESCRIBE on the topic"
        }
        Some(RDKafkaErrorCode::MessageSizeTooLarge) => {
            ": raise the topic's max.message.bytes (and the producer's message.max.bytes in [sink.kafka_properties])"
        }
        _ => "",
    }
}

/// A Kafka transaction call (`what`) that failed: a refusal retrying
/// cannot cure (a transactional id the principal may not use, brokers
/// without transactions, a producer fenced by another) stops the sink
/// with what to do; anything else is retried.
pub(crate) fn transaction_failure(
    what: &'static str,
    error: KafkaError,
    brokers: &str,
    transactional_id: &str,
) -> SinkError {
    use RDKafkaErrorCode as C;
    let fatal = matches!(&error, KafkaError::Transaction(e) if e.is_fatal());
    let remedy = match error.rdkafka_error_code() {
        Some(C::TransactionalIdAuthorizationFailed) => Some(
            "grant the sink's principal WRITE and DESCRIBE on this TransactionalId, or set `exactly_once = false`",
        ),
        Some(C::ClusterAuthorizationFailed) => Some(
            "grant the sink's principal IDEMPOTENT_WRITE on the cluster, or set `exactly_once = false`",
        ),
        Some(C::UnsupportedFeature | C::UnsupportedVersion) => Some(
            "these brokers do not support Kafka transactions: set `exactly_once = false` (at least once: a message sent again carries the same walbridge.lsn header) or use brokers that do",
        ),
        Some(C::ProducerFenced | C::InvalidProducerEpoch) => Some(
            "another producer took over this transactional id: give each sink its own `transactional_id`, and run one walbridge per data_dir",
        ),
        _ if fatal => Some(
            "the producer cannot go on (is another walbridge running with the same `transactional_id`?)",
        ),
        _ => None,
    };
    match remedy {
        Some(remedy) => SinkError::Transactions {
            what,
            transactional_id: transactional_id.to_owned(),
            brokers: brokers.to_owned(),
            reason: error.to_string(),
            remedy,
        },
        None => SinkError::Unreachable {
            brokers: brokers.to_owned(),
            reason: format!("{what} failed: {error}"),
        },
    }
}

/// Codes a resend of the same message meets again.
fn is_permanent_code(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        C::MessageSizeTooLarge
            | C::MessageBatchTooLarge
            | C::InvalidMessageSize
            | C::InvalidMessage
            | C::InvalidRecord
            | C::InvalidTopic
            | C::InvalidPartitions
            | C::InvalidReplicationFactor
            | C::InvalidConfig
            | C::PolicyViolation
            | C::TopicAuthorizationFailed
            | C::ClusterAuthorizationFailed
            | C::TransactionalIdAuthorizationFailed
            | C::SaslAuthenticationFailed
            | C::Authentication
            | C::Fatal
            | C::UnsupportedForMessageFormat
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oversized_and_unauthorized_stop_transport_retries() {
        let delivery = |code| SinkError::Delivery {
            topic: "t".into(),
            table: "public.t".into(),
            key: "{\"id\":1}".into(),
            reason: String::new(),
            code: Some(code),
        };
        assert!(delivery(RDKafkaErrorCode::MessageSizeTooLarge).is_permanent());
        assert!(delivery(RDKafkaErrorCode::TopicAuthorizationFailed).is_permanent());
        assert!(!delivery(RDKafkaErrorCode::MessageTimedOut).is_permanent());
        assert!(!delivery(RDKafkaErrorCode::AllBrokersDown).is_permanent());
        assert!(
            !SinkError::Unreachable {
                brokers: "b:9092".into(),
                reason: String::new()
            }
            .is_permanent()
        );
    }
}

/// Brokers without transactions, as librdkafka's mock cluster can play
/// them (an API switched off); the real broker's refusals are in the
/// integration tests.
#[cfg(test)]
mod without_transactions {
    use std::time::Duration;

    use rdkafka::config::ClientConfig;
    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
    use rdkafka::types::RDKafkaApiKey;

    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(10);

    fn producer(
        cluster: &MockCluster<'_, DefaultProducerContext>,
    ) -> ThreadedProducer<DefaultProducerContext> {
        ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .set("transactional.id", "walbridge-events")
            .create()
            .unwrap_or_else(|e| panic!("producer: {e}"))
    }

    fn assert_says_no_transactions(error: KafkaError) {
        let failure = transaction_failure("a call", error, "mock", "walbridge-events");
        assert!(failure.is_permanent(), "{failure}");
        assert!(
            failure
                .to_string()
                .contains("do not support Kafka transactions"),
            "{failure}"
        );
    }

    #[test]
    fn a_commit_the_brokers_cannot_do_stops_the_sink() {
        let cluster = MockCluster::new(1).unwrap_or_else(|e| panic!("mock cluster: {e}"));
        cluster
            .apiversion(RDKafkaApiKey::EndTxn, None, None)
            .unwrap_or_else(|e| panic!("{e}"));
        let producer = producer(&cluster);
        producer
            .init_transactions(TIMEOUT)
            .unwrap_or_else(|e| panic!("init: {e}"));
        producer
            .begin_transaction()
            .unwrap_or_else(|e| panic!("begin: {e}"));
        producer
            .send(BaseRecord::<(), [u8]>::to("t").payload(b"x".as_slice()))
            .unwrap_or_else(|(e, _)| panic!("send: {e}"));
        let error = producer
            .commit_transaction(TIMEOUT)
            .err()
            .unwrap_or_else(|| panic!("the commit went through without EndTxn"));
        assert_says_no_transactions(error);
    }

    #[test]
    fn brokers_that_give_no_producer_id_stop_the_sink() {
        let cluster = MockCluster::new(1).unwrap_or_else(|e| panic!("mock cluster: {e}"));
        cluster
            .apiversion(RDKafkaApiKey::InitProducerId, None, None)
            .unwrap_or_else(|e| panic!("{e}"));
        let error = producer(&cluster)
            .init_transactions(TIMEOUT)
            .err()
            .unwrap_or_else(|| panic!("transactions initialized without InitProducerId"));
        assert_says_no_transactions(error);
    }
}
