//! The sink's librdkafka clients: configuration, logging, reachability.

use std::time::Duration;

use rdkafka::ClientContext;
use rdkafka::admin::AdminClient;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::KafkaError;
use rdkafka::error::KafkaResult;
use rdkafka::metadata::Metadata;
use rdkafka::producer::ThreadedProducer;

use crate::config::KafkaSinkConfig;
use crate::delivery::DeliveryContext;
use crate::error::SinkError;

/// How long the start-up check waits for the cluster's metadata.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends librdkafka's log lines and errors to `tracing`. Connection
/// failures go to debug: librdkafka logs one per broker and retry, and the
/// producer's [`Reachability`] says once, in the sink's words, that the
/// brokers cannot be reached. A refusal (see [`Refusal`]) is noted for
/// whoever waits on the client, and logged once.
#[derive(Default)]
pub struct TracingContext {
    refusal: Refusal,
}

impl TracingContext {
    /// Why the brokers refused this client, if they did.
    pub fn refusal(&self) -> &Refusal {
        &self.refusal
    }
}

/// librdkafka's codes for a connection that failed or a cluster that
/// cannot be reached, which it retries by itself.
fn is_connection_failure(error: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        error.rdkafka_error_code(),
        Some(C::BrokerTransportFailure | C::AllBrokersDown | C::Resolve)
    )
}

/// Why the brokers refused a client, as librdkafka last reported it: SASL
/// authentication failed (a wrong password, a mechanism the broker does
/// not offer) or the TLS handshake did (a certificate not trusted).
/// librdkafka retries these forever; the sink treats them as permanent.
#[derive(Clone, Default)]
pub struct Refusal(std::sync::Arc<std::sync::Mutex<Option<String>>>);

impl Refusal {
    /// Notes `error` if it is a refusal; true when it is one not noted before.
    fn note(&self, error: &KafkaError, reason: &str) -> bool {
        use rdkafka::types::RDKafkaErrorCode as C;
        matches!(
            error.rdkafka_error_code(),
            Some(C::Authentication | C::SaslAuthenticationFailed | C::SSL)
        ) && self.set(reason)
    }

    /// Notes a connection failure librdkafka logged (facility `FAIL`) if
    /// it is a refusal; true when it is one not noted before. The log is
    /// where a client that is not polled (a metadata request, the admin
    /// client) hears of it: the error callback only runs when polled.
    fn note_log(&self, message: &str) -> bool {
        let Some(at) = ["SASL authentication error", "SSL handshake failed"]
            .iter()
            .find_map(|what| message.find(what))
        else {
            return false;
        };
        // Without the broker's address in front, and without the retry's
        // timing behind, so that each retry's line is the same.
        let reason = &message[at..];
        let reason = reason.split(" (after ").next().unwrap_or(reason);
        self.set(reason)
    }

    fn set(&self, reason: &str) -> bool {
        let mut last = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let new = last.as_deref() != Some(reason);
        *last = Some(reason.to_owned());
        new
    }

    /// The last refusal noted.
    pub fn reason(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl ClientContext for TracingContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        match level {
            // "Connect to … failed": said by the sink itself (see
            // `Reachability`); a refusal is said once.
            RDKafkaLogLevel::Error if facility == "FAIL" => {
                if self.refusal.note_log(message) {
                    tracing::warn!(target: "librdkafka", "{message}");
                } else {
                    tracing::debug!(target: "librdkafka", facility, "{message}");
                }
            }
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", facility, "{message}")
            }
            RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", facility, "{message}"),
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", facility, "{message}")
            }
            RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", facility, "{message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        // The end of a partition is how reading the positions back stops.
        if matches!(error, KafkaError::PartitionEOF(_)) {
            return;
        }
        let refused = self.refusal.note(&error, reason);
        if refused {
            tracing::warn!(target: "librdkafka", "{reason}");
        } else if is_connection_failure(&error) || self.refusal.reason().as_deref() == Some(reason)
        {
            tracing::debug!(target: "librdkafka", "{error}: {reason}");
        } else {
            tracing::warn!(target: "librdkafka", "{error}: {reason}");
        }
    }
}

/// Whether the producer reaches the brokers, said once when that changes:
/// a warning when librdkafka finds every broker down (messages then wait
/// in the producer, which keeps trying), and a line when a message is
/// delivered again.
pub struct Reachability {
    sink: String,
    brokers: String,
    unreachable: std::sync::atomic::AtomicBool,
    logs: TracingContext,
}

impl Reachability {
    /// For sink `sink` writing to `brokers`.
    pub fn new(sink: &str, brokers: &str) -> Self {
        Reachability {
            sink: sink.to_owned(),
            brokers: brokers.to_owned(),
            unreachable: std::sync::atomic::AtomicBool::new(false),
            logs: TracingContext::default(),
        }
    }

    /// Why the brokers refused the producer, if they did.
    pub fn refusal(&self) -> &Refusal {
        self.logs.refusal()
    }

    /// librdkafka logged a line.
    pub fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        self.logs.log(level, facility, message);
    }

    /// librdkafka reported `error`.
    pub fn error(&self, error: KafkaError, reason: &str) {
        use rdkafka::types::RDKafkaErrorCode as C;
        let all_down = error.rdkafka_error_code() == Some(C::AllBrokersDown);
        if all_down
            && !self
                .unreachable
                .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::warn!(
                sink = %self.sink,
                "cannot reach the Kafka brokers {} ({reason}): messages wait in the producer, which keeps trying (a message still unsent after message.timeout.ms makes the sink retry from its stored position); the sources and the other sinks go on",
                self.brokers
            );
        }
        self.logs.error(error, reason);
    }

    /// A message was delivered.
    pub fn delivered(&self) {
        if self
            .unreachable
            .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::info!(sink = %self.sink, "the Kafka brokers {} answer again", self.brokers);
        }
    }
}

pub(crate) fn client_config(config: &KafkaSinkConfig) -> ClientConfig {
    let mut client = ClientConfig::new();
    for (key, value) in config.client_properties() {
        client.set(key, value);
    }
    client
}

/// The sink's producer, reporting deliveries to `context`.
pub fn producer(
    config: &KafkaSinkConfig,
    context: DeliveryContext,
) -> Result<ThreadedProducer<DeliveryContext>, SinkError> {
    client_config(config)
        .create_with_context(context)
        .map_err(|source| SinkError::Client {
            client: "producer",
            source,
        })
}

/// The admin client that creates topics.
pub fn admin(config: &KafkaSinkConfig) -> Result<AdminClient<TracingContext>, SinkError> {
    connection_config(config)
        .create_with_context(TracingContext::default())
        .map_err(|source| SinkError::Client {
            client: "admin client",
            source,
        })
}

/// The configuration of a client that is not the producer: only the
/// connection properties matter to it (producer properties would make
/// librdkafka warn about each of them).
pub(crate) fn connection_config(config: &KafkaSinkConfig) -> ClientConfig {
    let mut client = ClientConfig::new();
    for (key, value) in config.client_properties() {
        if is_connection_property(&key) {
            client.set(key, value);
        }
    }
    client
}

/// Properties of any client (not only producers): where and how to connect.
pub(crate) fn is_connection_property(key: &str) -> bool {
    key == "bootstrap.servers"
        || key == "client.id"
        || key.starts_with("security.")
        || key.starts_with("ssl.")
        || key.starts_with("sasl.")
        || key.starts_with("socket.")
        || key.starts_with("broker.")
        || key.starts_with("reconnect.")
        || key.starts_with("metadata.")
        || key.starts_with("topic.metadata.")
        || key.starts_with("api.version")
        || key.starts_with("enable.ssl")
        || key.starts_with("enable.sasl")
        || key.starts_with("client.")
        || key == "debug"
}

impl rdkafka::consumer::ConsumerContext for TracingContext {}

impl rdkafka::producer::ProducerContext for TracingContext {
    type DeliveryOpaque = ();

    // Only `walbridge check`'s transaction probe, which sends nothing.
    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: ()) {}
}

/// Fails unless the cluster answers a metadata request: the start-up
/// health check (an unreachable cluster is retried by the runtime; one
/// that refuses the client, as `refusal` tells, is a permanent error).
/// `fetch_metadata` is asked again, a second at a time, until a refusal
/// is noted or [`METADATA_TIMEOUT`] passes; `poll` lets a client that has
/// no thread of its own hand librdkafka's errors and logs to its context
/// in between. Returns the number of brokers in the cluster.
pub async fn check_reachable(
    fetch_metadata: impl Fn(Duration) -> KafkaResult<Metadata> + Send + 'static,
    poll: impl Fn() + Send + 'static,
    refusal: &Refusal,
    brokers: &str,
) -> Result<usize, SinkError> {
    let noted = refusal.clone();
    let result = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + METADATA_TIMEOUT;
        loop {
            match fetch_metadata(Duration::from_secs(1)) {
                Ok(metadata) => return Ok(metadata.brokers().len()),
                Err(e) => {
                    poll();
                    if noted.reason().is_some() || std::time::Instant::now() >= deadline {
                        return Err(e);
                    }
                }
            }
        }
    })
    .await;
    let reason = match result {
        Ok(Ok(brokers_seen)) => return Ok(brokers_seen),
        Ok(Err(e)) => e.to_string(),
        Err(e) => format!("the metadata request did not finish: {e}"),
    };
    Err(match refusal.reason() {
        Some(reason) => SinkError::Refused {
            brokers: brokers.to_owned(),
            reason,
        },
        None => SinkError::Unreachable {
            brokers: brokers.to_owned(),
            reason,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_admin_client_gets_connection_properties_only() {
        assert!(is_connection_property("sasl.mechanism"));
        assert!(is_connection_property("security.protocol"));
        assert!(is_connection_property("bootstrap.servers"));
        assert!(!is_connection_property("linger.ms"));
        assert!(!is_connection_property("compression.type"));
    }
}
