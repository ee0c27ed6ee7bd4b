//! TLS for both kinds of connection (replication and SQL), with rustls and
//! libpq's `sslmode` semantics:
//!
//! * `prefer`, `require`: encrypt, accept any certificate — unless a root
//!   certificate file is configured or present at `~/.postgresql/root.crt`,
//!   in which case `require` verifies the chain like `verify-ca` (as libpq).
//! * `verify-ca`: the chain must lead to a configured root.
//! * `verify-full`: and the certificate must name the host.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::params::{ConnParams, SslMode};

/// TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A certificate or key file could not be read.
    #[error("cannot read {what} `{path}`: {reason}")]
    File {
        /// Which file (root certificate, client certificate, client key).
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// `verify-ca` / `verify-full` without a root certificate.
    #[error(
        "sslmode={0} needs a root certificate: set sslrootcert=/path/to/ca.pem in the connection string (or place it at ~/.postgresql/root.crt)"
    )]
    NoRootCertificate(&'static str),
    /// rustls rejected the configuration.
    #[error("TLS configuration rejected: {0}")]
    Config(#[from] rustls::Error),
    /// The host is not a valid TLS server name.
    #[error("`{0}` is not a valid TLS server name")]
    ServerName(String),
}

/// The TLS settings of one connection target.
#[derive(Clone)]
pub struct TlsSettings {
    config: Arc<ClientConfig>,
    mode: SslMode,
}

impl std::fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSettings")
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn default_root_cert() -> Option<PathBuf> {
    let home = std::env::var_os("HOME")?;
    let path = Path::new(&home).join(".postgresql/root.crt");
    path.is_file().then_some(path)
}

impl TlsSettings {
    /// Builds the settings for `params`, or `None` for `sslmode=disable`.
    pub fn new(params: &ConnParams) -> Result<Option<Self>, TlsError> {
        let mode = params.sslmode;
        if mode == SslMode::Disable {
            return Ok(None);
        }
        let root_path = params.sslrootcert.clone().or_else(default_root_cert);
        let verify_chain = matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull)
            || (mode == SslMode::Require && root_path.is_some());
        let provider = provider();
        let chain = if verify_chain {
            let path = root_path.ok_or(TlsError::NoRootCertificate(match mode {
                SslMode::VerifyFull => "verify-full",
                _ => "verify-ca",
            }))?;
            let mut roots = RootCertStore::empty();
            for cert in read_certs(&path, "root certificate")? {
                roots.add(cert).map_err(|e| TlsError::File {
                    what: "root certificate",
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            }
            let verifier =
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .map_err(|e| TlsError::File {
                        what: "root certificate",
                        path,
                        reason: e.to_string(),
                    })?;
            Some(verifier)
        } else {
            None
        };
        let verifier = Arc::new(Verifier {
            acceptance: SslModeAcceptance {
                chain,
                check_host: mode == SslMode::VerifyFull,
            },
            provider: provider.clone(),
        });
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match (&params.sslcert, &params.sslkey) {
            (Some(cert), Some(key)) => {
                let certs = read_certs(cert, "client certificate")?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::File {
                    what: "client key",
                    path: key.clone(),
                    reason: e.to_string(),
                })?;
                builder.with_client_auth_cert(certs, key)?
            }
            _ => builder.with_no_client_auth(),
        };
        Ok(Some(TlsSettings {
            config: Arc::new(config),
            mode,
        }))
    }

    /// True when a server that refuses TLS must be refused in turn.
    pub fn required(&self) -> bool {
        self.mode != SslMode::Prefer
    }

    /// Wraps `stream` in TLS for `host`.
    pub async fn connect<S>(
        &self,
        host: &str,
        stream: S,
    ) -> Result<tokio_rustls::client::TlsStream<S>, std::io::Error>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let name = ServerName::try_from(host.to_owned()).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                TlsError::ServerName(host.to_owned()),
            )
        })?;
        tokio_rustls::TlsConnector::from(self.config.clone())
            .connect(name, stream)
            .await
    }
}

fn read_certs(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsError::File {
            what,
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::File {
            what,
            path: path.to_owned(),
            reason: "no PEM certificate in the file".into(),
        });
    }
    Ok(certs)
}

/// What a client accepts of a server's certificate; [`Verifier`] checks
/// the handshake's signatures whatever it says.
trait Acceptance: std::fmt::Debug + Send + Sync {
    fn accept(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error>;
}

/// Per `sslmode`: the chain when roots are configured, the host name only
/// for `verify-full`.
#[derive(Debug)]
struct SslModeAcceptance {
    chain: Option<Arc<WebPkiServerVerifier>>,
    check_host: bool,
}

impl Acceptance for SslModeAcceptance {
    fn accept(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName))
            | Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForNameContext { .. },
            )) if !self.check_host => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }
}

/// Exactly these certificates, whatever signed them and whatever names
/// they hold.
#[derive(Debug)]
struct Pinned(Vec<CertificateDer<'static>>);

impl Acceptance for Pinned {
    fn accept(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if self.0.iter().any(|c| c.as_ref() == end_entity.as_ref()) {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }
}

/// A client configuration that trusts exactly the certificates in the
/// PEM file `path`: for a peer whose own certificate walbridge is
/// configured with (`walbridge status` asking the running process).
pub fn pinned_client_config(path: &Path) -> Result<ClientConfig, TlsError> {
    let provider = provider();
    let verifier = Arc::new(Verifier {
        acceptance: Pinned(read_certs(path, "certificate")?),
        provider: provider.clone(),
    });
    Ok(ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth())
}

/// Accepts a certificate as `acceptance` says; verifies handshake
/// signatures always.
#[derive(Debug)]
struct Verifier<A> {
    acceptance: A,
    provider: Arc<CryptoProvider>,
}

impl<A: Acceptance> ServerCertVerifier for Verifier<A> {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.acceptance
            .accept(end_entity, intermediates, server_name, ocsp, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// [`TlsSettings`] as a `tokio_postgres` TLS connector, so SQL connections
/// (catalog queries, snapshot COPY) encrypt exactly like the replication one.
#[derive(Clone, Debug)]
pub struct PgTls(pub TlsSettings);

impl<S> tokio_postgres::tls::MakeTlsConnect<S> for PgTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type TlsConnect = PgTlsConnect;
    type Error = std::io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> Result<PgTlsConnect, std::io::Error> {
        Ok(PgTlsConnect {
            settings: self.0.clone(),
            host: domain.to_owned(),
        })
    }
}

/// One pending TLS handshake for `tokio_postgres`.
pub struct PgTlsConnect {
    settings: TlsSettings,
    host: String,
}

impl<S> tokio_postgres::tls::TlsConnect<S> for PgTlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<PgTlsStream<S>, std::io::Error>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            self.settings
                .connect(&self.host, stream)
                .await
                .map(PgTlsStream)
        })
    }
}

/// An encrypted stream for `tokio_postgres`.
pub struct PgTlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> tokio_postgres::tls::TlsStream for PgTlsStream<S> {
    fn channel_binding(&self) -> tokio_postgres::tls::ChannelBinding {
        tokio_postgres::tls::ChannelBinding::none()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for PgTlsStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for PgTlsStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}
