//! The configuration file: one TOML document, `${VAR}` expanded from the
//! environment.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use walbridge_core::{BearerToken, DurationText};
use walbridge_sink::{ConfigContext, SinkConfig, SinkKind};
use walbridge_sink_grpc::upstream::FeedSourceConfig;
use walbridge_source::SourceConfig;

use crate::log_config::LogConfig;

/// What is wrong with the configuration: every problem found, a line each.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

/// Fails with `message`.
macro_rules! bail {
    ($($message:tt)*) => {
        return Err(ConfigError(format!($($message)*)))
    };
}

/// The whole configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Directory for walbridge's state (slot bookkeeping, spill files, the
    /// log, the sinks' cursors).
    pub data_dir: PathBuf,
    /// How the log is kept (`[log]`).
    pub log: LogConfig,
    /// The sources (`[[source]]`).
    pub sources: Vec<SourceSpec>,
    /// The sinks (`[[sink]]`); without any, changes go to stdout as JSON lines.
    pub sinks: Vec<Arc<dyn SinkConfig>>,
    /// The schema registry walbridge serves (`[schema_registry]`).
    pub schema_registry: Option<RegistryServerConfig>,
    /// How often long work logs how far it has come.
    pub progress_interval: DurationText,
    /// The admin endpoint (`[admin]`).
    pub admin: AdminConfig,
}

/// `[admin]`: the endpoint serving `/metrics`, `/healthz`, `/readyz` and
/// `/status`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// `host:port` to listen on (default `127.0.0.1:9187`; port 0 takes
    /// any free port, which the log names); `""` serves nothing. The
    /// environment variable `WALBRIDGE_ADMIN_LISTEN` overrides it.
    #[serde(default = "default_admin_listen")]
    pub listen: String,
    /// A PEM certificate (chain) to serve the endpoint over HTTPS, with
    /// `tls_key`.
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// A bearer token every path but `/healthz` and `/readyz` requires;
    /// meant to come from the environment: `token = "${WALBRIDGE_ADMIN_TOKEN}"`.
    pub token: Option<BearerToken>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: default_admin_listen(),
            tls_cert: None,
            tls_key: None,
            token: None,
        }
    }
}

impl AdminConfig {
    fn validate(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if !self.listen.is_empty() && self.listen.parse::<std::net::SocketAddr>().is_err() {
            problems.push(format!(
                "[admin] listen = \"{}\": not an address such as 127.0.0.1:9187 (or \"\" for none)",
                self.listen
            ));
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            problems.push("[admin] tls_cert and tls_key go together: set both or neither".into());
        }
        if self.token.as_ref().is_some_and(BearerToken::is_empty) {
            problems.push(
                "[admin] token is empty (is the variable it names set?); remove it for no token"
                    .into(),
            );
        }
        problems
    }
}

fn default_admin_listen() -> String {
    "127.0.0.1:9187".to_owned()
}

/// The file as read: each `[[sink]]` table is read by its kind.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    data_dir: PathBuf,
    #[serde(default)]
    log: LogConfig,
    /// The sources (`[[source]]`), with where each starts in the file.
    #[serde(rename = "source", default)]
    sources: Vec<toml::Spanned<toml::Table>>,
    /// The sinks (`[[sink]]`), with where each starts in the file.
    #[serde(rename = "sink", default)]
    sinks: Vec<toml::Spanned<toml::Table>>,
    /// The schema registry walbridge serves (`[schema_registry]`).
    #[serde(default)]
    schema_registry: Option<RegistryServerConfig>,
    /// How often long work logs how far it has come: each table being
    /// copied, each sink catching up (default 5s).
    #[serde(default = "default_progress_interval")]
    progress_interval: DurationText,
    #[serde(default)]
    admin: AdminConfig,
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

impl Config {
    /// Reads, expands and validates the file at `path`; `kinds` read the
    /// `[[sink]]` tables.
    pub fn load(path: &Path, kinds: &[&dyn SinkKind]) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError(format!(
                "cannot read configuration file {}: {e}",
                path.display()
            ))
        })?;
        Self::parse(&text, |name| std::env::var(name).ok(), kinds)
            .map_err(|e| ConfigError(format!("configuration file {}: {}", path.display(), e.0)))
    }

    /// Parses configuration text, expanding `${VAR}` with `env`.
    pub fn parse(
        text: &str,
        env: impl Fn(&str) -> Option<String>,
        kinds: &[&dyn SinkKind],
    ) -> Result<Config, ConfigError> {
        let expanded = expand_env(text, &env)?;
        let file: File = toml::from_str(&expanded)
            .map_err(|e| ConfigError(e.to_string().trim_end().to_owned()))?;
        let mut sources = Vec::with_capacity(file.sources.len());
        let mut problems = Vec::new();
        for table in file.sources {
            let line = expanded[..table.span().start].lines().count() + 1;
            match SourceSpec::read(table.into_inner(), &expanded) {
                Ok(SourceSpec::Postgres(mut source)) => {
                    source.progress_interval = file.progress_interval.0;
                    sources.push(SourceSpec::Postgres(source));
                }
                Ok(source) => sources.push(source),
                Err(e) => problems.push(format!("[[source]] at line {line}: {e}")),
            }
        }
        let context = ConfigContext {
            embedded_registry: file.schema_registry.as_ref().map(|r| r.url()),
        };
        let mut sinks = Vec::with_capacity(file.sinks.len());
        for table in file.sinks {
            let line = expanded[..table.span().start].lines().count() + 1;
            match configure_sink(table.into_inner(), kinds, &context) {
                Ok(sink) => sinks.push(sink),
                Err(e) => problems.push(format!("[[sink]] at line {line}: {e}")),
            }
        }
        if !problems.is_empty() {
            bail!("{}", problems.join("\n"));
        }
        if sinks.is_empty() {
            // Every source to standard output, as JSON lines.
            let mut stdout = toml::Table::new();
            stdout.insert("name".into(), "stdout".into());
            sinks.push(configure_sink_of_kind("jsonl", stdout, kinds, &context)?);
        }
        let mut admin = file.admin;
        if let Some(listen) = env("WALBRIDGE_ADMIN_LISTEN") {
            admin.listen = listen;
        }
        let config = Config {
            admin,
            data_dir: file.data_dir,
            log: file.log,
            sources,
            sinks,
            schema_registry: file.schema_registry,
            progress_interval: file.progress_interval,
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = self.log.validate();
        problems.extend(self.admin.validate());
        if self.sources.is_empty() {
            problems.push("no [[source]] is configured".to_owned());
        }
        let mut names = HashSet::new();
        let mut slots = HashSet::new();
        for source in &self.sources {
            if !names.insert(source.name().to_owned()) {
                problems.push(format!("source name `{}` is used twice", source.name()));
            }
            let s = match source {
                SourceSpec::Postgres(s) => s,
                SourceSpec::Feed(feed) => {
                    problems.extend(feed.problems());
                    continue;
                }
            };
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
            problems.extend(sink.validate());
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

/// One `[[source]]`, by its `type`.
#[derive(Debug, Clone)]
pub enum SourceSpec {
    /// `type = "postgres"` (the default): a publisher, read through logical
    /// replication.
    Postgres(SourceConfig),
    /// `type = "grpc"`: another walbridge's change feed.
    Feed(FeedSourceConfig),
}

impl SourceSpec {
    /// The source's name.
    pub fn name(&self) -> &str {
        match self {
            SourceSpec::Postgres(s) => &s.name,
            SourceSpec::Feed(f) => &f.name,
        }
    }

    /// Reads one `[[source]]` table of the configuration `text`.
    fn read(mut table: toml::Table, text: &str) -> Result<SourceSpec, ConfigError> {
        let kind = match table.remove("type") {
            None => "postgres".to_owned(),
            Some(toml::Value::String(kind)) => kind,
            Some(other) => bail!("`type` must be a string, not a {}", other.type_str()),
        };
        let invalid = |e: toml::de::Error| ConfigError(e.to_string().trim_end().to_owned());
        Ok(match kind.as_str() {
            "postgres" => SourceSpec::Postgres(table.try_into().map_err(|e| {
                // The whole file read again shows the line with a caret
                // under the key, when every source is a publisher.
                #[derive(Deserialize)]
                struct Publishers {
                    #[serde(rename = "source")]
                    _sources: Vec<SourceConfig>,
                }
                match toml::from_str::<Publishers>(text) {
                    Err(spanned) if spanned.span().is_some() => invalid(spanned),
                    _ => invalid(e),
                }
            })?),
            "grpc" => SourceSpec::Feed(table.try_into().map_err(invalid)?),
            other => bail!("unknown source `type` \"{other}\": postgres (the default) or grpc"),
        })
    }
}

/// Reads one `[[sink]]` table by its `type`.
fn configure_sink(
    mut table: toml::Table,
    kinds: &[&dyn SinkKind],
    context: &ConfigContext,
) -> Result<Arc<dyn SinkConfig>, ConfigError> {
    let kind = match table.remove("type") {
        Some(toml::Value::String(kind)) => kind,
        Some(other) => bail!("`type` must be a string, not a {}", other.type_str()),
        None => bail!(
            "missing `type`: one of {}",
            kinds
                .iter()
                .map(|k| k.kind())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    configure_sink_of_kind(&kind, table, kinds, context)
}

fn configure_sink_of_kind(
    kind: &str,
    table: toml::Table,
    kinds: &[&dyn SinkKind],
    context: &ConfigContext,
) -> Result<Arc<dyn SinkConfig>, ConfigError> {
    let Some(reader) = kinds.iter().find(|k| k.kind() == kind) else {
        bail!(
            "unknown sink `type` \"{kind}\": one of {}",
            kinds
                .iter()
                .map(|k| k.kind())
                .collect::<Vec<_>>()
                .join(", ")
        );
    };
    let name = table
        .get("name")
        .and_then(|n| n.as_str())
        .map(|n| format!("sink `{n}`: "))
        .unwrap_or_default();
    reader
        .configure(table, context)
        .map_err(|e| ConfigError(format!("{name}{}", e.trim_end())))
}

/// Replaces `${NAME}` with the variable's value (escaped for TOML basic
/// strings); `$${` stands for a literal `${`. An unset variable is an error.
pub fn expand_env(text: &str, env: impl Fn(&str) -> Option<String>) -> Result<String, ConfigError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos..];
        if let Some(tail) = after.strip_prefix("$${") {
            out.push_str("${");
            rest = tail;
        } else if let Some(tail) = after.strip_prefix("${") {
            let end = tail.find('}').ok_or_else(|| {
                ConfigError(format!(
                    "unterminated `${{` on line {}",
                    text[..text.len() - rest.len() + pos].lines().count().max(1)
                ))
            })?;
            let name = &tail[..end];
            let line = text[..text.len() - rest.len() + pos].matches('\n').count() + 1;
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                bail!(
                    "line {line}: `${{{name}}}` is not a variable reference (names are letters, digits and _)"
                );
            }
            let value = env(name).ok_or_else(|| {
                ConfigError(format!(
                    "line {line}: environment variable {name} is not set"
                ))
            })?;
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

    static KINDS: &[&dyn SinkKind] = &[
        &walbridge_sink_postgres::KIND,
        &walbridge_sink_kafka::KIND,
        &walbridge_sink_jsonl::KIND,
    ];

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
        let c = Config::parse(BASE, env, KINDS).unwrap_or_else(|e| panic!("{e:#}"));
        let SourceSpec::Postgres(source) = &c.sources[0] else {
            panic!("not a postgres source: {:?}", c.sources[0]);
        };
        assert_eq!(source.connection, "host=db1 password=se\"cret");
        assert_eq!(source.slot_name(), "walbridge_shop");
        assert_eq!(c.sinks.len(), 1);
        assert_eq!(c.sinks[0].name(), "stdout");
        assert!(format!("{:?}", c.sinks[0]).contains("path: \"-\""));
        assert_eq!(
            expand_env("a $${X} $5", env).unwrap_or_default(),
            "a ${X} $5"
        );
    }

    #[test]
    fn shipped_examples_parse() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/walbridge.toml");
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let c = Config::parse(
            &text,
            |v| matches!(v, "WALBRIDGE_PASSWORD" | "REPLICA_PASSWORD").then(|| "pw".to_owned()),
            KINDS,
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
        let SourceSpec::Postgres(source) = &c.sources[0] else {
            panic!("not a postgres source: {:?}", c.sources[0]);
        };
        assert_eq!(source.publications, ["app_pub"]);
        assert!(format!("{:?}", c.sinks[1]).contains("progress_table: \"walbridge.progress\""));
    }

    #[test]
    fn the_log_preallocates_unless_told_not_to() {
        let preallocates = |text: &str| {
            Config::parse(text, env, KINDS)
                .unwrap_or_else(|e| panic!("{e:#}"))
                .log
                .options()
                .preallocate
        };
        assert!(preallocates(BASE));
        assert!(preallocates(&format!(
            "{BASE}[log]\nsegment_size = \"16MiB\"\n"
        )));
        assert!(!preallocates(&format!(
            "{BASE}[log]\npreallocate = false\n"
        )));
    }

    #[test]
    fn errors_name_the_key() {
        let err = |text: &str| {
            format!(
                "{:#}",
                Config::parse(text, env, KINDS)
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
        let feed =
            |extra: &str| format!("{BASE}[[source]]\nname = \"up\"\ntype = \"grpc\"\n{extra}");
        let c = Config::parse(&feed("url = \"http://10.0.0.1:50051\"\n"), env, KINDS)
            .unwrap_or_else(|e| panic!("{e:#}"));
        let SourceSpec::Feed(up) = &c.sources[1] else {
            panic!("not a feed source: {:?}", c.sources[1]);
        };
        assert_eq!(up.consumer_name(), "walbridge-up");
        assert!(err(&feed("url = \"10.0.0.1:50051\"\n")).contains("http://host:port"));
        assert!(
            err(&feed("url = \"http://h:1\"\npublications = [\"p\"]\n")).contains("publications")
        );
        assert!(err(&feed("url = \"http://h:1\"\ntls_ca = \"/ca.pem\"\n")).contains("https://"));
        assert!(
            err(&BASE.replace("name = \"shop\"", "name = \"shop\"\ntype = \"mysql\""))
                .contains("mysql")
        );
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
