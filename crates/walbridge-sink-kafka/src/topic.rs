//! Topic names (template, Kafka's legal characters) and creating topics
//! on demand through the admin API.

use std::collections::HashSet;
use std::time::Duration;

use crate::client::TracingContext;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::types::RDKafkaErrorCode;
use walbridge_core::template::{Template, TemplateValues};

use crate::config::TopicCreation;
use crate::error::SinkError;

/// Kafka's limit on a topic name's length.
const MAX_TOPIC_LENGTH: usize = 249;

/// How long a topic creation may take before it is reported as failed.
const CREATE_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether `name` is a legal topic name as it stands.
pub fn check_topic_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name == "." || name == ".." {
        return Err(format!("`{name}` is not a legal topic name"));
    }
    if name.len() > MAX_TOPIC_LENGTH {
        return Err(format!(
            "topic `{name}` is longer than Kafka's {MAX_TOPIC_LENGTH} characters"
        ));
    }
    match name.chars().find(|c| !is_legal(*c)) {
        Some(c) => Err(format!(
            "topic `{name}`: `{c}` is not allowed (letters, digits, `.`, `_` and `-`)"
        )),
        None => Ok(()),
    }
}

fn is_legal(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// Makes topic names from the `topic` template.
#[derive(Clone, Debug)]
pub struct TopicNamer {
    template: Template,
}

impl TopicNamer {
    /// A namer for `template` (already validated).
    pub fn new(template: &str) -> Result<Self, SinkError> {
        Template::parse(template)
            .map(|template| TopicNamer { template })
            .map_err(|e| SinkError::Config(format!("`topic`: {e}")))
    }

    /// The topic of `schema.table` from `source`: the template rendered,
    /// every character Kafka does not allow replaced by `_`.
    pub fn topic(&self, source: &str, schema: &str, table: &str) -> Result<String, SinkError> {
        let rendered = self.template.render(TemplateValues {
            source,
            schema,
            table,
        });
        let name: String = rendered
            .chars()
            .map(|c| if is_legal(c) { c } else { '_' })
            .collect();
        check_topic_name(&name).map_err(|e| {
            SinkError::Config(format!(
                "`topic` = \"{}\" for table {schema}.{table}: {e}",
                self.template
            ))
        })?;
        Ok(name)
    }
}

/// Creates topics the first time the sink writes to them (when so
/// configured) and remembers which exist.
pub struct Topics {
    admin: Option<AdminClient<TracingContext>>,
    creation: TopicCreation,
    /// Topics that only need each key's last record (the positions topic).
    compacted: HashSet<String>,
    known: HashSet<String>,
}

impl Topics {
    /// Topics created with `admin` as `creation` says (`compacted` ones
    /// with `cleanup.policy = compact`); `None` leaves creation to the
    /// broker.
    pub fn new(
        admin: Option<AdminClient<TracingContext>>,
        creation: TopicCreation,
        compacted: impl IntoIterator<Item = String>,
    ) -> Self {
        Topics {
            admin,
            creation,
            compacted: compacted.into_iter().collect(),
            known: HashSet::new(),
        }
    }

    /// Makes sure `topic` exists before a message about `table` (`-` for
    /// none) is sent to it.
    pub async fn ensure(&mut self, topic: &str, table: &str) -> Result<(), SinkError> {
        if self.known.contains(topic) {
            return Ok(());
        }
        if let Some(admin) = &self.admin {
            let mut new = NewTopic::new(
                topic,
                self.creation.partitions,
                TopicReplication::Fixed(self.creation.replication_factor),
            );
            for (key, value) in &self.creation.config {
                new = new.set(key, value);
            }
            if self.compacted.contains(topic) {
                new = new.set("cleanup.policy", "compact");
            }
            let options = AdminOptions::new().operation_timeout(Some(CREATE_TIMEOUT));
            let results = admin.create_topics([&new], &options).await.map_err(|e| {
                SinkError::TopicCreation {
                    topic: topic.to_owned(),
                    table: table.to_owned(),
                    reason: e.to_string(),
                    code: e.rdkafka_error_code(),
                }
            })?;
            for result in results {
                match result {
                    Ok(_) => tracing::info!(topic, "created topic"),
                    Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                    Err((_, code)) => {
                        return Err(SinkError::TopicCreation {
                            topic: topic.to_owned(),
                            table: table.to_owned(),
                            reason: code.to_string(),
                            code: Some(code),
                        });
                    }
                }
            }
        }
        self.known.insert(topic.to_owned());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_rendered_and_sanitized() {
        let namer = TopicNamer::new("{source}.{schema}.{table}").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            namer.topic("shop", "public", "orders").ok().as_deref(),
            Some("shop.public.orders")
        );
        assert_eq!(
            namer.topic("shop", "My Schema", "ordrés$2").ok().as_deref(),
            Some("shop.My_Schema.ordr_s_2")
        );
        let long = "x".repeat(300);
        assert!(namer.topic("s", "public", &long).is_err());
        let fixed = TopicNamer::new("all-changes").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            fixed.topic("a", "b", "c").ok().as_deref(),
            Some("all-changes")
        );
    }

    #[test]
    fn illegal_names_are_explained() {
        assert!(check_topic_name("cdc.messages").is_ok());
        for bad in ["", ".", "..", "a b", "a/b"] {
            assert!(check_topic_name(bad).is_err(), "{bad} accepted");
        }
    }
}
