//! The sink's librdkafka clients: configuration, logging, reachability.

use std::time::Duration;

use rdkafka::ClientContext;
use rdkafka::admin::AdminClient;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::KafkaError;
use rdkafka::error::KafkaResult;
use rdkafka::metadata::Metadata;
use rdkafka::producer::ThreadedProducer;

use crate::config::{Format, KafkaSinkConfig};
use crate::delivery::DeliveryContext;
use crate::error::SinkError;
use crate::registry::client::RegistryClient;

/// How long the start-up check waits for the cluster's metadata.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends librdkafka's log lines and errors to `tracing`. Connection
/// failures go to debug: librdkafka logs one per broker and retry, and the
/// producer's [`Reachability`] says once, in the sink's words, that the
/// brokers cannot be reached.
pub struct TracingContext;

/// librdkafka's codes for a connection that failed or a cluster that
/// cannot be reached, which it retries by itself.
fn is_connection_failure(error: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        error.rdkafka_error_code(),
        Some(C::BrokerTransportFailure | C::AllBrokersDown | C::Resolve)
    )
}

impl ClientContext for TracingContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        match level {
            // "Connect to … failed": see `is_connection_failure`.
            RDKafkaLogLevel::Error if facility == "FAIL" => {
                tracing::debug!(target: "librdkafka", facility, "{message}")
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
        if is_connection_failure(&error) {
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
}

impl Reachability {
    /// For sink `sink` writing to `brokers`.
    pub fn new(sink: &str, brokers: &str) -> Self {
        Reachability {
            sink: sink.to_owned(),
            brokers: brokers.to_owned(),
            unreachable: std::sync::atomic::AtomicBool::new(false),
        }
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
        TracingContext.error(error, reason);
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

fn client_config(config: &KafkaSinkConfig) -> ClientConfig {
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
    let mut client = ClientConfig::new();
    // Only the connection properties matter to the admin client; producer
    // properties would make librdkafka warn about each of them.
    for (key, value) in config.client_properties() {
        if is_connection_property(&key) {
            client.set(key, value);
        }
    }
    client
        .create_with_context(TracingContext)
        .map_err(|source| SinkError::Client {
            client: "admin client",
            source,
        })
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

/// Fails unless the cluster answers a metadata request: the start-up
/// health check (an unreachable cluster is retried by the runtime).
/// Returns the number of brokers in the cluster.
pub async fn check_reachable(
    fetch_metadata: impl FnOnce(Duration) -> KafkaResult<Metadata> + Send + 'static,
    brokers: &str,
) -> Result<usize, SinkError> {
    let result = tokio::task::spawn_blocking(move || {
        fetch_metadata(METADATA_TIMEOUT).map(|m| m.brokers().len())
    })
    .await;
    match result {
        Ok(Ok(brokers_seen)) => Ok(brokers_seen),
        Ok(Err(e)) => Err(SinkError::Unreachable {
            brokers: brokers.to_owned(),
            reason: e.to_string(),
        }),
        Err(e) => Err(SinkError::Unreachable {
            brokers: brokers.to_owned(),
            reason: format!("the metadata request did not finish: {e}"),
        }),
    }
}

/// `walbridge check`: the configuration is usable, the cluster answers,
/// and so does the schema registry Avro or Protobuf needs — unless it is
/// `embedded_registry`, the one walbridge serves itself (`[schema_registry]`),
/// which only runs with the pipeline.
pub async fn health_check(
    config: &KafkaSinkConfig,
    embedded_registry: Option<&str>,
) -> Result<String, SinkError> {
    let problems = config.validate();
    if !problems.is_empty() {
        return Err(SinkError::Config(problems.join("; ")));
    }
    let admin = admin(config)?;
    let brokers = check_reachable(
        move |timeout| admin.inner().fetch_metadata(None, timeout),
        &config.brokers,
    )
    .await?;
    let mut report = format!("{brokers} Kafka broker(s) reachable at {}", config.brokers);
    if let Some(registry) = config.schema_registry.as_ref().map(|r| r.config())
        && config.format != Format::Json
    {
        if embedded_registry == Some(registry.url.as_str()) {
            report.push_str("; schemas go to the registry walbridge serves");
        } else {
            let subjects = RegistryClient::new(&registry)?.subjects().await?;
            report.push_str(&format!(
                "; schema registry at {} answers ({} subjects)",
                registry.url,
                subjects.len()
            ));
        }
    }
    Ok(report)
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
