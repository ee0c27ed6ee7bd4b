//! The admin endpoint (`[admin] listen`, default `127.0.0.1:9187`):
//!
//! * `/metrics`: Prometheus text (`walbridge_` metrics, set from the
//!   pipeline's live state at each scrape, and the process's own);
//! * `/healthz`: 200 while the runtime answers (a liveness probe);
//! * `/readyz`: 200 when every source copies or streams and every sink
//!   runs, else 503 with why, a line each (a readiness probe);
//! * `/status`: everything, as JSON.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::error::RuntimeError;
use crate::status::Observed;

/// The file in `data_dir` naming the address the running process's admin
/// endpoint listens on (trusted only while that process holds the
/// data_dir's lock).
pub const ADDRESS_FILE: &str = "admin.address";

/// What the handlers share.
struct Admin {
    observed: Arc<Observed>,
    prometheus: PrometheusHandle,
    process: metrics_process::Collector,
}

/// Listens on `listen` and serves the endpoint for as long as the
/// returned task runs; writes the address into `data_dir` (for
/// `walbridge status`). Installs the process's metrics recorder.
pub async fn serve(
    listen: &str,
    data_dir: &std::path::Path,
    observed: Arc<Observed>,
) -> Result<tokio::task::JoinHandle<()>, RuntimeError> {
    let failed = |what: String| {
        move |e: std::io::Error| RuntimeError::Admin {
            what,
            error: e.into(),
        }
    };
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(failed(format!(
            "cannot listen on {listen} (set [admin] listen to a free address, or \"\" for none)"
        )))?;
    let address: SocketAddr = listener
        .local_addr()
        .map_err(failed("cannot tell its address".into()))?;
    std::fs::write(data_dir.join(ADDRESS_FILE), format!("{address}\n")).map_err(failed(
        format!("cannot write {}", data_dir.join(ADDRESS_FILE).display()),
    ))?;
    let prometheus =
        PrometheusBuilder::new()
            .install_recorder()
            .map_err(|e| RuntimeError::Admin {
                what: "cannot install the metrics recorder".into(),
                error: e.into(),
            })?;
    let process = metrics_process::Collector::default();
    process.describe();
    let admin = Arc::new(Admin {
        observed,
        prometheus,
        process,
    });
    let router = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/status", get(status))
        .with_state(admin);
    tracing::info!(listen = %address, "admin endpoint serving /metrics /healthz /readyz /status");
    Ok(tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            tracing::error!("the admin endpoint stopped: {e}");
        }
    }))
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

async fn healthz() -> &'static str {
    "ok\n"
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

/// Asks the walbridge running on `data_dir` for its `/status`.
pub async fn running_status(data_dir: &std::path::Path) -> Result<serde_json::Value, RuntimeError> {
    let file = data_dir.join(ADDRESS_FILE);
    let failed = |what: String| {
        move |e: Box<dyn std::error::Error + Send + Sync>| RuntimeError::Admin { what, error: e }
    };
    let address = std::fs::read_to_string(&file)
        .map_err(|e| failed(format!("cannot read {}", file.display()))(e.into()))?;
    let url = format!("http://{}/status", address.trim());
    // rustls needs a process-wide provider; an earlier install wins.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(10))
        .build()
        .map_err(|e| failed("cannot set up an HTTP client".into())(e.into()))?;
    let response = client
        .get(&url)
        .send()
        .await
        .map_err(|e| failed(format!("cannot reach {url}"))(e.into()))?;
    response
        .json()
        .await
        .map_err(|e| failed(format!("{url} answered no status"))(e.into()))
}
