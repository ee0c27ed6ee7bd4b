//! The configuration file: one TOML document, `${VAR}` expanded from the
//! environment.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Deserialize;
use walbridge_core::DurationText;
use walbridge_source::SourceConfig;

use crate::log_config::LogConfig;
use walbridge_sink_kafka::{KafkaSinkConfig, SchemaRegistrySetting};
use walbridge_sink_postgres::PostgresSinkConfig;

use crate::sink::jsonl::JsonlSinkConfig;

/// The whole configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Directory for walbridge's state (slot bookkeeping, spill files, the
    /// log, the sinks' cursors).
    pub data_dir: PathBuf,
    /// How the log is kept (`[log]`).
    #[serde(default)]
    pub log: LogConfig,
    /// The sources (`[[source]]`).
    #[serde(rename = "source", default)]
    pub sources: Vec<SourceConfig>,
    /// The sinks (`[[sink]]`); without any, changes go to stdout as JSON lines.
    #[serde(rename = "sink", default)]
    pub sinks: Vec<SinkConfig>,
    /// The schema registry walbridge serves (`[schema_registry]`).
    #[serde(default)]
    pub schema_registry: Option<RegistryServerConfig>,
    /// How often long work logs how far it has come: each table being
    /// copied, each sink catching up (default 5s).
    #[serde(default = "default_progress_interval")]
    pub progress_interval: DurationText,
}

fn default_progress_interval() -> DurationText {
    DurationText(walbridge_source::config::default_progress_interval())
}

/// `[schema_registry]`: a Confluent-compatible schema registry served by
/// walbridge, kept in `data_dir`, for deployments without one. Kafka sinks
/// writing Avro or Protobuf that name no registry of their own use it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryServerConfig {
    /// Address to listen on, `host:port`.
    pub listen: std::net::SocketAddr,
}

impl RegistryServerConfig {
    /// The URL the registry is reached at from this host.
    pub fn url(&self) -> String {
        let mut address = self.listen;
        if address.ip().is_unspecified() {
            address.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        format!("http://{address}")
    }
}

/// One `[[sink]]`, by `type`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum SinkConfig {
    /// Newline-delimited JSON to stdout or a file.
    Jsonl(JsonlSinkConfig),
    /// Apply into a PostgreSQL database.
    Postgres(PostgresSinkConfig),
    /// Change events to Kafka, a topic per table.
    Kafka(Box<KafkaSinkConfig>),
}

impl SinkConfig {
    /// The sink's name.
    pub fn name(&self) -> &str {
        match self {
            SinkConfig::Jsonl(c) => &c.name,
            SinkConfig::Postgres(c) => &c.name,
            SinkConfig::Kafka(c) => &c.name,
        }
    }

    /// The sources it reads, `None` for all.
    pub fn sources(&self) -> Option<&[String]> {
        match self {
            SinkConfig::Jsonl(c) => c.sources.as_deref(),
            SinkConfig::Postgres(c) => c.sources.as_deref(),
            SinkConfig::Kafka(c) => c.sources.as_deref(),
        }
    }
}

impl Config {
    /// Reads, expands and validates the file at `path`.
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read configuration file {}", path.display()))?;
        Self::parse(&text, |name| std::env::var(name).ok())
            .with_context(|| format!("configuration file {}", path.display()))
    }

    /// Parses configuration text, expanding `${VAR}` with `env`.
    pub fn parse(text: &str, env: impl Fn(&str) -> Option<String>) -> anyhow::Result<Config> {
        let expanded = expand_env(text, env)?;
        let mut config: Config = toml::from_str(&expanded)
            .map_err(|e| anyhow::anyhow!("{}", e.to_string().trim_end()))?;
        for source in &mut config.sources {
            source.progress_interval = config.progress_interval.0;
        }
        if config.sinks.is_empty() {
            config
                .sinks
                .push(SinkConfig::Jsonl(JsonlSinkConfig::stdout()));
        }
        if let Some(registry) = &config.schema_registry {
            let url = registry.url();
            for sink in &mut config.sinks {
                if let SinkConfig::Kafka(k) = sink
                    && k.schema_registry.is_none()
                {
                    k.schema_registry = Some(SchemaRegistrySetting::Url(url.clone()));
                }
            }
        }
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> anyhow::Result<()> {
        let mut problems = self.log.validate();
        if self.sources.is_empty() {
            problems.push("no [[source]] is configured".to_owned());
        }
        let mut names = HashSet::new();
        let mut slots = HashSet::new();
        for s in &self.sources {
            if !names.insert(s.name.clone()) {
                problems.push(format!("source name `{}` is used twice", s.name));
            }
            if !slots.insert(s.slot_name()) {
                problems.push(format!(
                    "source `{}`: slot `{}` is used by another source",
                    s.name,
                    s.slot_name()
                ));
            }
            problems.extend(s.validate());
        }
        let mut sink_names = HashSet::new();
        for sink in &self.sinks {
            if !sink_names.insert(sink.name().to_owned()) {
                problems.push(format!("sink name `{}` is used twice", sink.name()));
            }
            if sink.name().is_empty()
                || !sink
                    .name()
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                problems.push(format!(
                    "sink name `{}`: use letters, digits, `_` and `-` (it names the sink's cursor file)",
                    sink.name()
                ));
            }
            match sink {
                SinkConfig::Postgres(c) => problems.extend(c.validate()),
                SinkConfig::Kafka(c) => problems.extend(c.validate()),
                SinkConfig::Jsonl(_) => {}
            }
            for wanted in sink.sources().unwrap_or_default() {
                if !names.contains(wanted) {
                    problems.push(format!(
                        "sink `{}`: `sources` names `{wanted}`, which is not a configured source",
                        sink.name()
                    ));
                }
            }
        }
        if !problems.is_empty() {
            bail!("{}", problems.join("\n"));
        }
        Ok(())
    }
}

/// Replaces `${NAME}` with the variable's value (escaped for TOML basic
/// strings); `$${` stands for a literal `${`. An unset variable is an error.
pub fn expand_env(text: &str, env: impl Fn(&str) -> Option<String>) -> anyhow::Result<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos..];
        if let Some(tail) = after.strip_prefix("$${") {
            out.push_str("${");
            rest = tail;
        } else if let Some(tail) = after.strip_prefix("${") {
            let end = tail.find('}').with_context(|| {
                format!(
                    "unterminated `${{` on line {}",
                    text[..text.len() - rest.len() + pos].lines().count().max(1)
                )
            })?;
            let name = &tail[..end];
            let line = text[..text.len() - rest.len() + pos].matches('\n').count() + 1;
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                bail!(
                    "line {line}: `${{{name}}}` is not a variable reference (names are letters, digits and _)"
                );
            }
            let value = env(name)
                .with_context(|| format!("line {line}: environment variable {name} is not set"))?;
            out.push_str(&value.replace('\\', "\\\\").replace('"', "\\\""));
            rest = &tail[end + 1..];
        } else {
            out.push('$');
            rest = &after[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "PW" => Some("se\"cret".into()),
            "HOST" => Some("db1".into()),
            _ => None,
        }
    }

    const BASE: &str = r#"
data_dir = "/tmp/wb"
[[source]]
name = "shop"
connection = "host=${HOST} password=${PW}"
publications = ["p"]
"#;

    #[test]
    fn expands_variables_and_defaults_to_stdout() {
        let c = Config::parse(BASE, env).unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(c.sources[0].connection, "host=db1 password=se\"cret");
        assert_eq!(c.sources[0].slot_name(), "walbridge_shop");
        assert!(matches!(&c.sinks[..], [SinkConfig::Jsonl(j)] if j.path == "-"));
        assert_eq!(
            expand_env("a $${X} $5", env).unwrap_or_default(),
            "a ${X} $5"
        );
    }

    #[test]
    fn shipped_examples_parse() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/walbridge.toml");
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let c = Config::parse(&text, |v| {
            matches!(v, "WALBRIDGE_PASSWORD" | "REPLICA_PASSWORD").then(|| "pw".to_owned())
        })
        .unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(c.sources[0].publications, ["app_pub"]);
        assert!(
            matches!(&c.sinks[1], SinkConfig::Postgres(p) if p.progress_table == "walbridge.progress")
        );
    }

    #[test]
    fn kafka_sinks_parse_with_their_defaults() {
        let c = Config::parse(
            &format!(
                "{BASE}[[sink]]\nname = \"events\"\ntype = \"kafka\"\nbrokers = \"k1:9092,k2:9092\"\n[sink.kafka_properties]\n\"compression.type\" = \"zstd\"\n"
            ),
            env,
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
        let [SinkConfig::Kafka(k)] = &c.sinks[..] else {
            panic!("not one kafka sink: {:?}", c.sinks);
        };
        assert_eq!(k.topic, "{source}.{schema}.{table}");
        assert!(k.tombstones && k.topic_creation.enabled);
        let properties = k.client_properties();
        assert_eq!(properties["compression.type"], "zstd");
        assert_eq!(properties["enable.idempotence"], "true");
        assert_eq!(properties["bootstrap.servers"], "k1:9092,k2:9092");
    }

    #[test]
    fn errors_name_the_key() {
        let err = |text: &str| {
            format!(
                "{:#}",
                Config::parse(text, env)
                    .err()
                    .unwrap_or_else(|| panic!("accepted: {text}"))
            )
        };
        assert!(err(&BASE.replace("${HOST}", "${NOPE}")).contains("NOPE is not set"));
        assert!(err(&format!("{BASE}colour = 1\n")).contains("colour"));
        assert!(err(&BASE.replace("publications = [\"p\"]", "")).contains("publications"));
        assert!(
            err(&format!(
                "{BASE}[[sink]]\nname = \"k\"\ntype = \"kafkaa\"\n"
            ))
            .contains("kafkaa")
        );
        assert!(
            err(&format!(
                "{BASE}[[sink]]\nname = \"j\"\ntype = \"jsonl\"\nsources = [\"other\"]\n"
            ))
            .contains("not a configured source")
        );
        assert!(
            err(&BASE.replace(
                "publications = [\"p\"]",
                "publications = [\"p\"]\nsnapshot_workers = \"two\""
            ))
            .contains("snapshot_workers")
        );
        assert!(
            err(&BASE.replace(
                "publications = [\"p\"]",
                "publications = [\"p\"]\nspill_threshold = \"lots\""
            ))
            .contains("spill_threshold")
        );
        assert!(err(&format!("{BASE}[log]\nfsync = \"sometimes\"\n")).contains("sometimes"));
        let kafka =
            |extra: &str| format!("{BASE}[[sink]]\nname = \"k\"\ntype = \"kafka\"\n{extra}");
        assert!(err(&kafka("topic = \"{nope}\"\n")).contains("`topic`"));
        assert!(
            err(&kafka(
                "[sink.kafka_properties]\n\"enable.idempotence\" = \"false\"\n"
            ))
            .contains("enable.idempotence")
        );
        assert!(err(&kafka("[sink.key_columns]\nevents = [\"id\"]\n")).contains("schema.table"));
        assert!(err(&kafka("message_topic = \"a b\"\n")).contains("message_topic"));
        assert!(
            err(&format!(
                "{BASE}[log]\nsegment_size = \"1MiB\"\nmax_size = \"1MiB\"\n"
            ))
            .contains("max_size")
        );
        assert!(
            err(&format!(
                "{BASE}[[source]]\nname = \"shop\"\nconnection = \"\"\npublications = [\"p\"]\n"
            ))
            .contains("used twice")
        );
    }
}
