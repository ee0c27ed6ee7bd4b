//! The admin endpoint (`[admin] listen`, default `127.0.0.1:9187`):
//!
//! * `/metrics`: Prometheus text (`walbridge_` metrics, set from the
//!   pipeline's live state at each scrape, and the process's own);
//! * `/healthz`: 200 while the runtime answers and the pipeline's state
//!   can be read within 5 s (a liveness probe), else 503 with why;
//! * `/readyz`: 200 when every source copies or streams and every sink
//!   runs, else 503 with why, a line each (a readiness probe);
//! * `/status`: everything, as JSON;
//! * `/`: the same for people, with the last 15 minutes drawn
//!   ([`crate::page`]).
//!
//! With `tls_cert` and `tls_key` it speaks HTTPS only; with `token`, every
//! path but the two probes asks for `Authorization: Bearer <token>` (the
//! probes stay open so an orchestrator needs no secret).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::Query;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Json, Response};
use axum::routing::{get, post};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;

use walbridge_core::BearerToken;
use walbridge_log::{SYNC_TIME_BUCKETS, SYNC_TIME_METRIC, describe_sync_time};
use walbridge_sink::{DELAY_BUCKETS, DELAY_METRIC, describe_delay};
use walbridge_source::{SEND_DELAY_METRIC, describe_send_delay};

use crate::config::AdminConfig;
use crate::error::RuntimeError;
use crate::page::History;
use crate::status::Observed;

/// The file in `data_dir` naming the address the running process's admin
/// endpoint listens on (trusted only while that process holds the
/// data_dir's lock).
pub const ADDRESS_FILE: &str = "admin.address";

/// Where `POST /resync` leaves its requests: the data_dir, and the
/// sources reading a publisher (by name).
#[derive(Clone, Debug)]
pub struct Requests {
    /// The configuration's data_dir.
    pub data_dir: std::path::PathBuf,
    /// Sources that can re-synchronize a table, each with the sinks
    /// reading it.
    pub sources: Vec<(String, Vec<String>)>,
}

/// Why `sink` cannot take a re-sync of `source`'s table alone: it is not
/// one of `readers`, the sinks reading the source.
pub fn resync_sink_problem(sink: &str, source: &str, readers: &[String]) -> Option<String> {
    (!readers.iter().any(|r| r == sink)).then(|| {
        format!(
            "no sink `{sink}` reads source `{source}` (its sinks: {})",
            if readers.is_empty() {
                "none".to_owned()
            } else {
                readers.join(", ")
            }
        )
    })
}

/// What the handlers share.
struct Admin {
    observed: Arc<Observed>,
    requests: Requests,
    history: History,
    prometheus: PrometheusHandle,
    process: metrics_process::Collector,
}

/// Errors of the endpoint's set-up, as [`RuntimeError::Admin`].
fn failed<E: Into<Box<dyn std::error::Error + Send + Sync>>>(
    what: impl Into<String>,
) -> impl FnOnce(E) -> RuntimeError {
    let what = what.into();
    move |e| RuntimeError::Admin {
        what,
        error: e.into(),
    }
}

/// The endpoint bound to its address, with the process's metrics
/// recorder installed: made before any sink starts, so that every metric
/// a sink registers reaches the recorder (one registered earlier would go
/// nowhere).
pub struct Bound {
    listener: TcpListener,
    address: SocketAddr,
    tls: Option<Arc<rustls::ServerConfig>>,
    prometheus: PrometheusHandle,
    process: metrics_process::Collector,
}

/// Listens on `config.listen`, writes the address into `data_dir` (for
/// `walbridge status`) and installs the metrics recorder.
pub async fn bind(config: &AdminConfig, data_dir: &std::path::Path) -> Result<Bound, RuntimeError> {
    let listen = &config.listen;
    let tls = match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => Some(tls_config(cert, key)?),
        _ => None,
    };
    let listener = TcpListener::bind(listen).await.map_err(failed(format!(
        "cannot listen on {listen} (set [admin] listen to a free address, or \"\" for none)"
    )))?;
    let address: SocketAddr = listener
        .local_addr()
        .map_err(failed("cannot tell its address"))?;
    // Bound before the logs open, which would otherwise make the directory.
    std::fs::create_dir_all(data_dir)
        .map_err(failed(format!("cannot create {}", data_dir.display())))?;
    std::fs::write(data_dir.join(ADDRESS_FILE), format!("{address}\n")).map_err(failed(
        format!("cannot write {}", data_dir.join(ADDRESS_FILE).display()),
    ))?;
    let recorder_failed = |e: metrics_exporter_prometheus::BuildError| RuntimeError::Admin {
        what: "cannot install the metrics recorder".into(),
        error: e.into(),
    };
    let prometheus = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(DELAY_METRIC.into()), DELAY_BUCKETS)
        .map_err(recorder_failed)?
        .set_buckets_for_metric(Matcher::Full(SEND_DELAY_METRIC.into()), DELAY_BUCKETS)
        .map_err(recorder_failed)?
        .set_buckets_for_metric(Matcher::Full(SYNC_TIME_METRIC.into()), SYNC_TIME_BUCKETS)
        .map_err(recorder_failed)?
        .install_recorder()
        .map_err(recorder_failed)?;
    describe_delay();
    describe_send_delay();
    describe_sync_time();
    let process = metrics_process::Collector::default();
    process.describe();
    Observed::describe_metrics();
    Ok(Bound {
        listener,
        address,
        tls,
        prometheus,
        process,
    })
}

/// Serves the endpoint `bound` over what `observed` shows, for as long as
/// the returned task runs.
pub fn serve(
    bound: Bound,
    config: &AdminConfig,
    observed: Arc<Observed>,
    requests: Requests,
) -> tokio::task::JoinHandle<()> {
    let Bound {
        listener,
        address,
        tls,
        prometheus,
        process,
    } = bound;
    let admin = Arc::new(Admin {
        observed,
        requests,
        history: History::default(),
        prometheus,
        process,
    });
    let mut guarded = Router::new()
        .route("/metrics", get(metrics))
        .route("/status", get(status))
        .route("/resync", post(resync))
        .route("/", get(page));
    if let Some(token) = config.token.clone() {
        guarded = guarded.route_layer(axum::middleware::from_fn_with_state(
            Arc::new(token),
            authorize,
        ));
    }
    let router = guarded
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(admin.clone());
    tracing::info!(
        listen = %address,
        tls = tls.is_some(),
        token = config.token.is_some(),
        "admin endpoint serving /metrics /healthz /readyz /status /resync"
    );
    tokio::spawn(async move {
        let serving = async {
            match tls {
                Some(tls) => axum::serve(TlsListener::new(listener, tls), router).await,
                None => axum::serve(listener, router).await,
            }
        };
        let sampling = async {
            let mut every = tokio::time::interval(History::INTERVAL);
            loop {
                every.tick().await;
                admin.history.sample(&admin.observed.status());
            }
        };
        tokio::select! {
            served = serving => {
                if let Err(e) = served {
                    tracing::error!("the admin endpoint stopped: {e}");
                }
            }
            never = sampling => match never {},
        }
    })
}

/// The server side of TLS from the PEM files `cert` (a chain) and `key`.
fn tls_config(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> Result<Arc<rustls::ServerConfig>, RuntimeError> {
    let chain = read_chain(cert)?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(failed(format!(
        "cannot read [admin] tls_key {}",
        key.display()
    )))?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .and_then(|builder| builder.with_no_client_auth().with_single_cert(chain, key))
    .map_err(failed(
        "[admin] tls_cert and tls_key do not make a TLS server",
    ))?;
    Ok(Arc::new(config))
}

/// The certificates of the PEM file `[admin] tls_cert`.
fn read_chain(cert: &std::path::Path) -> Result<Vec<CertificateDer<'static>>, RuntimeError> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(failed(format!(
            "cannot read [admin] tls_cert {}",
            cert.display()
        )))?;
    if chain.is_empty() {
        return Err(failed(format!("[admin] tls_cert {}", cert.display()))(
            "no PEM certificate in the file",
        ));
    }
    Ok(chain)
}

/// HTTPS for `axum::serve`: each handshake runs in a task of its own,
/// bounded by a timeout, so a client that stalls mid-handshake holds no
/// other back.
struct TlsListener {
    address: SocketAddr,
    handshaken: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
}

impl TlsListener {
    const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

    fn new(listener: TcpListener, config: Arc<rustls::ServerConfig>) -> TlsListener {
        let address = listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let (handshaken_tx, handshaken) = mpsc::channel(16);
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    () = handshaken_tx.closed() => return,
                };
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of descriptors, say: let some close.
                        tracing::warn!("admin endpoint: cannot accept a connection: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let (acceptor, handshaken_tx) = (acceptor.clone(), handshaken_tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(Self::HANDSHAKE_TIMEOUT, acceptor.accept(stream))
                        .await
                    {
                        Ok(Ok(tls)) => {
                            let _ = handshaken_tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, "admin endpoint: TLS handshake failed: {e}")
                        }
                        Err(_) => tracing::debug!(%peer, "admin endpoint: TLS handshake timed out"),
                    }
                });
            }
        });
        TlsListener {
            address,
            handshaken,
        }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.handshaken.recv().await {
            Some(handshaken) => handshaken,
            // The accepting task ended: nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.address)
    }
}

/// Lets a request through only with the bearer token.
async fn authorize(
    State(token): State<Arc<BearerToken>>,
    request: Request,
    next: Next,
) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok());
    if token.authorizes(given) {
        next.run(request).await
    } else {
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "this path needs the admin token ([admin] token): Authorization: Bearer <token>\n",
        )
            .into_response()
    }
}

async fn metrics(State(admin): State<Arc<Admin>>) -> Response {
    admin.observed.record_metrics();
    admin.process.collect();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        admin.prometheus.render(),
    )
        .into_response()
}

/// `POST /resync?source=NAME&table=SCHEMA.TABLE[&sink=NAME][&truncate=true]`:
/// as `walbridge resync`.
async fn resync(
    State(admin): State<Arc<Admin>>,
    Query(query): Query<std::collections::HashMap<String, String>>,
) -> Response {
    let (Some(source), Some(table)) = (query.get("source"), query.get("table")) else {
        return (
            StatusCode::BAD_REQUEST,
            "POST /resync?source=NAME&table=SCHEMA.TABLE[&sink=NAME][&truncate=true]\n",
        )
            .into_response();
    };
    let Some((_, readers)) = admin.requests.sources.iter().find(|(s, _)| s == source) else {
        return (
            StatusCode::NOT_FOUND,
            format!("no source `{source}` reading a publisher\n"),
        )
            .into_response();
    };
    let sink = query.get("sink");
    if let Some(problem) = sink.and_then(|sink| resync_sink_problem(sink, source, readers)) {
        return (StatusCode::NOT_FOUND, format!("{problem}\n")).into_response();
    }
    let state_dir = walbridge_source::source::state_dir(&admin.requests.data_dir, source);
    let truncate = match query.get("truncate").map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("truncate={other}: true or false\n"),
            )
                .into_response();
        }
    };
    let request = walbridge_source::backfill::ResyncRequest {
        table: table.clone(),
        sink: sink.cloned(),
        truncate,
    };
    let only = sink
        .map(|s| format!(", for sink `{s}` only"))
        .unwrap_or_default();
    match walbridge_source::backfill::request_resync(&state_dir, &request) {
        Ok(()) => (
            StatusCode::ACCEPTED,
            format!("re-sync of {table} requested from source `{source}`{only}: it starts within the source's refresh_interval\n"),
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot ask for a re-sync in {}: {e}\n", state_dir.display()),
        )
            .into_response(),
    }
}

async fn page(State(admin): State<Arc<Admin>>) -> Html<String> {
    Html(crate::page::render(&admin.observed, &admin.history))
}

/// How long `/healthz` waits for the pipeline's state.
const LIVENESS_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

async fn healthz(State(admin): State<Arc<Admin>>) -> Response {
    match admin.observed.alive(LIVENESS_DEADLINE).await {
        Ok(()) => (StatusCode::OK, "ok\n".to_owned()).into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

async fn readyz(State(admin): State<Arc<Admin>>) -> Response {
    let reasons = admin.observed.unready();
    if reasons.is_empty() {
        (StatusCode::OK, "ready\n".to_owned()).into_response()
    } else {
        let mut body = reasons.join("\n");
        body.push('\n');
        (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
    }
}

async fn status(State(admin): State<Arc<Admin>>) -> Json<crate::status::Status> {
    Json(admin.observed.status())
}

/// Asks the walbridge running on `data_dir`, whose endpoint `config`
/// describes, for its `/status`. Over TLS it trusts the certificate of
/// `tls_cert` and no other, whatever signed it and whatever names it
/// holds: it dials the address the process itself wrote into `data_dir`.
pub async fn running_status(
    config: &AdminConfig,
    data_dir: &std::path::Path,
) -> Result<serde_json::Value, RuntimeError> {
    let file = data_dir.join(ADDRESS_FILE);
    let address = std::fs::read_to_string(&file)
        .map_err(failed(format!("cannot read {}", file.display())))?;
    let scheme = if config.tls_cert.is_some() {
        "https"
    } else {
        "http"
    };
    let url = format!("{scheme}://{}/status", address.trim());
    // rustls needs a process-wide provider; an earlier install wins.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut client = reqwest::Client::builder().timeout(std::time::Duration::from_secs(10));
    if let Some(cert) = &config.tls_cert {
        let tls =
            walbridge_pg::tls::pinned_client_config(cert).map_err(failed("[admin] tls_cert"))?;
        client = client.tls_backend_preconfigured(tls);
    }
    let client = client
        .build()
        .map_err(failed("cannot set up an HTTP client"))?;
    let mut request = client.get(&url);
    if let Some(token) = &config.token {
        request = request.bearer_auth(token.reveal());
    }
    let response = request
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(failed(format!("cannot get {url}")))?;
    response
        .json()
        .await
        .map_err(failed(format!("{url} answered no status")))
}
