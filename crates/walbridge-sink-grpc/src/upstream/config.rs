//! `[[source]] type = "grpc"`: the configuration of a source that reads
//! another walbridge's change feed.

use std::path::PathBuf;

use serde::Deserialize;
use walbridge_core::BearerToken;

/// Where a new durable consumer starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum FeedStart {
    /// The upstream source's initial copy and everything after it.
    #[default]
    Earliest,
    /// What is committed upstream from the first subscription on.
    Latest,
}

/// `[[source]] type = "grpc"`: another walbridge's feed, read as a durable
/// consumer into this walbridge's log.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedSourceConfig {
    /// Unique source name.
    pub name: String,
    /// The feed's URL: `http://host:port`, or `https://host:port` for TLS.
    pub url: String,
    /// The upstream walbridge's source to read (one per source here, so
    /// each log keeps one publisher's commit order); may be left out when
    /// the feed serves one source.
    pub upstream_source: Option<String>,
    /// The durable consumer to read as (default `walbridge-<name>`). List
    /// it in the upstream sink's `consumers` so its log is kept from the
    /// start.
    pub consumer: Option<String>,
    /// Where the consumer starts when it is new: `earliest` (default; the
    /// initial copy and everything after) or `latest`.
    #[serde(default)]
    pub start: FeedStart,
    /// The database name sinks report for this source (the `db` field of
    /// JSON lines and Kafka events); default the upstream source's name.
    pub database: Option<String>,
    /// PEM CA certificates to verify the feed with (https); default the
    /// system's trusted roots.
    pub tls_ca: Option<PathBuf>,
    /// A PEM client certificate, for a feed that requires one, with `tls_key`.
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// The feed's bearer token; take it from the environment:
    /// `token = "${WALBRIDGE_FEED_TOKEN}"`.
    pub token: Option<BearerToken>,
}

impl FeedSourceConfig {
    /// The durable consumer's name.
    pub fn consumer_name(&self) -> String {
        self.consumer
            .clone()
            .unwrap_or_else(|| format!("walbridge-{}", self.name))
    }

    /// The database name reported to sinks.
    pub fn database_name(&self) -> &str {
        self.database
            .as_deref()
            .or(self.upstream_source.as_deref())
            .unwrap_or(&self.name)
    }

    /// True for a `https://` URL.
    pub fn tls(&self) -> bool {
        self.url.starts_with("https://")
    }

    /// What is wrong with the configuration, one line each.
    pub fn problems(&self) -> Vec<String> {
        let name = &self.name;
        let mut problems = Vec::new();
        if !(self.url.starts_with("http://") || self.tls())
            || self.url.parse::<tonic::transport::Uri>().is_err()
        {
            problems.push(format!(
                "source `{name}`: url = {:?} is not a feed URL; write http://host:port, or https://host:port for TLS",
                self.url
            ));
        }
        if let Err(e) = crate::consumers::check_name(&self.consumer_name()) {
            problems.push(format!("source `{name}`: consumer: {e}"));
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            problems.push(format!(
                "source `{name}`: tls_cert and tls_key go together: set both or neither"
            ));
        }
        if !self.tls() && (self.tls_ca.is_some() || self.tls_cert.is_some()) {
            problems.push(format!(
                "source `{name}`: tls_ca and tls_cert need an https:// url"
            ));
        }
        if self.token.as_ref().is_some_and(BearerToken::is_empty) {
            problems.push(format!(
                "source `{name}`: token is empty (is the variable it names set?); remove it for no token"
            ));
        }
        problems
    }
}
