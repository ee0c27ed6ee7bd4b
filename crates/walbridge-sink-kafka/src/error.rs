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
        "cannot create topic `{topic}`: {reason} (create it yourself and set `topic_creation.enabled = false`, or grant the sink's principal CREATE on the cluster)"
    )]
    TopicCreation {
        /// The topic.
        topic: String,
        /// What the broker or client said.
        reason: String,
        /// The error code, when there is one.
        code: Option<RDKafkaErrorCode>,
    },
    /// A message could not be produced or was not delivered.
    #[error("cannot deliver to topic `{topic}` (table {table}, key {key}): {reason}")]
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
            | SinkError::Refused { .. } => true,
            SinkError::Unreachable { .. } | SinkError::Cursor(_) => false,
            SinkError::Registry(e) => e.is_permanent(),
            SinkError::TopicCreation { code, .. } | SinkError::Delivery { code, .. } => {
                code.is_some_and(is_permanent_code)
            }
        }
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
