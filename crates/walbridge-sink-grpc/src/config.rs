//! `type = "grpc"`: the sink's configuration.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use walbridge_core::{BearerToken, DurationText};

fn default_retention() -> DurationText {
    DurationText(Duration::from_secs(7 * 24 * 3600))
}

fn default_listen() -> String {
    "127.0.0.1:50051".to_owned()
}

/// `type = "grpc"`: a change feed that subscribers stream from.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpcSinkConfig {
    /// Unique sink name.
    pub name: String,
    /// Sources to read; default every source.
    #[serde(default)]
    pub sources: Option<Vec<String>>,
    /// Address the feed listens on, `host:port` (default `127.0.0.1:50051`;
    /// `0.0.0.0:50051` for every interface).
    #[serde(default = "default_listen")]
    pub listen: String,
    /// How long the log keeps records for a durable consumer that has not
    /// acknowledged them (default 7 days). Past it they may be removed: the
    /// consumer is then refused with `OUT_OF_RANGE` and must be moved
    /// (`Seek`). Without durable consumers, nothing is kept for the feed.
    #[serde(default = "default_retention")]
    pub retention: DurationText,
    /// Durable consumers created with the sink, at the log's start (the
    /// initial copy and everything after), so the log keeps everything for
    /// them from the first run: a walbridge reading this feed as a source,
    /// say. Others are created on first use or with `CreateConsumer`.
    #[serde(default)]
    pub consumers: Vec<String>,
    /// A PEM certificate (chain) to serve the feed over TLS only, with
    /// `tls_key`.
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificates: with it, a client must present a certificate
    /// one of them signed (mutual TLS).
    pub tls_client_ca: Option<PathBuf>,
    /// A bearer token every call but the health check must carry
    /// (`authorization: Bearer <token>` metadata); meant to come from the
    /// environment: `token = "${WALBRIDGE_FEED_TOKEN}"`.
    pub token: Option<BearerToken>,
}

impl GrpcSinkConfig {
    /// The address to listen on.
    pub fn listen_address(&self) -> Result<SocketAddr, String> {
        self.listen.parse().map_err(|e| {
            format!(
                "sink `{}`: listen = {:?} is not an address ({e}); write host:port, e.g. 127.0.0.1:50051",
                self.name, self.listen
            )
        })
    }

    /// What is wrong with the configuration, one line each.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Err(e) = self.listen_address() {
            problems.push(e);
        }
        if self.retention.0.is_zero() {
            problems.push(format!(
                "sink `{}`: retention must be more than 0 (e.g. 24h or 7d)",
                self.name
            ));
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            problems.push(format!(
                "sink `{}`: tls_cert and tls_key go together: set both or neither",
                self.name
            ));
        }
        if self.tls_client_ca.is_some() && self.tls_cert.is_none() {
            problems.push(format!(
                "sink `{}`: tls_client_ca needs TLS: set tls_cert and tls_key too",
                self.name
            ));
        }
        if self.token.as_ref().is_some_and(BearerToken::is_empty) {
            problems.push(format!(
                "sink `{}`: token is empty (is the variable it names set?); remove it for no token",
                self.name
            ));
        }
        for consumer in &self.consumers {
            if let Err(e) = crate::consumers::check_name(consumer) {
                problems.push(format!("sink `{}`: consumers: {e}", self.name));
            }
        }
        problems
    }
}
