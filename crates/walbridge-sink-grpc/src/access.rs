//! Who may use the feed: TLS (rustls, through tonic) with client
//! certificates when `tls_client_ca` is set, and the bearer token on every
//! call but the health check, which stays open so an orchestrator's probe
//! needs no secret (as the admin endpoint's probes do).

use std::path::Path;
use std::sync::Arc;

use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Request, Status};
use walbridge_core::BearerToken;

use crate::GrpcSinkConfig;

/// A server builder with the sink's TLS, if any; the error names the file
/// or setting at fault.
pub(crate) fn server(config: &GrpcSinkConfig) -> Result<Server, String> {
    let builder = Server::builder();
    let (Some(cert), Some(key)) = (&config.tls_cert, &config.tls_key) else {
        return Ok(builder);
    };
    let read = |path: &Path, setting: &str| {
        std::fs::read(path).map_err(|e| {
            format!(
                "sink `{}`: cannot read {setting} {}: {e}",
                config.name,
                path.display()
            )
        })
    };
    let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(
        read(cert, "tls_cert")?,
        read(key, "tls_key")?,
    ));
    if let Some(ca) = &config.tls_client_ca {
        tls = tls.client_ca_root(Certificate::from_pem(read(ca, "tls_client_ca")?));
    }
    builder.tls_config(tls).map_err(|e| {
        format!(
            "sink `{}`: TLS: {e} (tls_cert, tls_key and tls_client_ca must be PEM files: a certificate chain, its private key, CA certificates)",
            config.name
        )
    })
}

/// Lets a call through only with the sink's token, when it has one.
#[derive(Clone)]
pub(crate) struct Authorize {
    token: Option<Arc<BearerToken>>,
    sink: Arc<str>,
}

impl Authorize {
    pub fn new(config: &GrpcSinkConfig) -> Authorize {
        Authorize {
            token: config.token.clone().map(Arc::new),
            sink: config.name.as_str().into(),
        }
    }
}

impl tonic::service::Interceptor for Authorize {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(token) = &self.token else {
            return Ok(request);
        };
        let given = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        if token.authorizes(given) {
            Ok(request)
        } else {
            Err(Status::unauthenticated(format!(
                "sink `{}` needs its token: send the metadata `authorization: Bearer <token>` with the sink's `token`",
                self.sink
            )))
        }
    }
}
