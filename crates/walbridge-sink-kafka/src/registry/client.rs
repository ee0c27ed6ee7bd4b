//! A client for a Confluent-compatible schema registry: registers the
//! sink's schemas and remembers their ids.

use std::collections::HashMap;
use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::{RegistryError, SchemaType};
use crate::config::SchemaRegistryConfig;

/// How long one request to the registry may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Registers schemas, each once per subject.
pub struct RegistryClient {
    http: reqwest::Client,
    base: String,
    credentials: Option<(String, Option<String>)>,
    ids: HashMap<(String, String), i32>,
}

#[derive(Deserialize)]
struct Registered {
    id: i32,
}

#[derive(Deserialize)]
struct SubjectVersion {
    schema: String,
}

impl RegistryClient {
    /// A client for the registry `config` describes.
    pub fn new(config: &SchemaRegistryConfig) -> Result<Self, RegistryError> {
        let remote = |reason: String| RegistryError::Remote {
            url: config.url.clone(),
            reason,
            status: None,
        };
        // rustls needs a process-wide provider; an earlier install wins.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = reqwest::Client::builder().timeout(REQUEST_TIMEOUT);
        if let Some(ca) = &config.ca_cert {
            let pem = std::fs::read(ca)
                .map_err(|e| remote(format!("cannot read `ca_cert` {}: {e}", ca.display())))?;
            let certificates = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| remote(format!("`ca_cert` {}: {e}", ca.display())))?;
            builder = builder.tls_certs_merge(certificates);
        }
        let http = builder
            .build()
            .map_err(|e| remote(format!("cannot set up the HTTP client: {e}")))?;
        Ok(RegistryClient {
            http,
            base: config.url.trim_end_matches('/').to_owned(),
            credentials: config
                .username
                .clone()
                .map(|user| (user, config.password.clone())),
            ids: HashMap::new(),
        })
    }

    /// Sends `request` to `url` with the configured credentials and reads
    /// the JSON answer; `doing` says what for in errors.
    async fn send<T: DeserializeOwned>(
        &self,
        mut request: reqwest::RequestBuilder,
        url: &str,
        doing: &str,
    ) -> Result<T, RegistryError> {
        let remote = |reason: String, status: Option<u16>| RegistryError::Remote {
            url: url.to_owned(),
            reason,
            status,
        };
        if let Some((user, password)) = &self.credentials {
            request = request.basic_auth(user, password.as_ref());
        }
        let response = request
            .send()
            .await
            .map_err(|e| remote(e.to_string(), None))?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|e| remote(e.to_string(), None))?;
        if !status.is_success() {
            return Err(remote(
                format!("{doing} answered {status}: {text}"),
                Some(status.as_u16()),
            ));
        }
        serde_json::from_str(&text)
            .map_err(|e| remote(format!("unexpected answer ({e}): {text}"), None))
    }

    /// The subjects the registry holds (a request any registry answers,
    /// whatever it stores: a reachability and credentials check).
    pub async fn subjects(&self) -> Result<Vec<String>, RegistryError> {
        let url = format!("{}/subjects", self.base);
        self.send(self.http.get(&url), &url, "listing the subjects")
            .await
    }

    /// The text of the latest schema registered under `subject`, or `None`
    /// when the subject has none.
    pub async fn latest(&self, subject: &str) -> Result<Option<String>, RegistryError> {
        let url = format!("{}/subjects/{subject}/versions/latest", self.base);
        let doing = format!("reading the latest version of subject `{subject}`");
        match self
            .send::<SubjectVersion>(self.http.get(&url), &url, &doing)
            .await
        {
            Ok(version) => Ok(Some(version.schema)),
            Err(RegistryError::Remote {
                status: Some(404), ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The id of `schema` under `subject`, registering it the first time
    /// (the registry answers with the existing id when it has it).
    pub async fn register(
        &mut self,
        subject: &str,
        schema: &str,
        schema_type: SchemaType,
    ) -> Result<i32, RegistryError> {
        let cache_key = (subject.to_owned(), schema.to_owned());
        if let Some(id) = self.ids.get(&cache_key) {
            return Ok(*id);
        }
        let url = format!("{}/subjects/{subject}/versions", self.base);
        let mut body = json!({"schema": schema});
        if schema_type != SchemaType::Avro {
            body["schemaType"] = json!(schema_type);
        }
        let request = self
            .http
            .post(&url)
            .header("Content-Type", "application/vnd.schemaregistry.v1+json")
            .body(body.to_string());
        let doing = format!("registering under subject `{subject}`");
        let registered: Registered = self.send(request, &url, &doing).await?;
        self.ids.insert(cache_key, registered.id);
        Ok(registered.id)
    }
}
