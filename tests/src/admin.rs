//! The admin endpoint as a client sees it: plain HTTP GETs, and `/metrics`
//! read by Prometheus's own Python parser (`tests/admin/parse_metrics.py`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// GETs `path` from `address` (`host:port`): the status code and the body.
pub fn get(address: &str, path: &str) -> (u16, String) {
    let mut stream =
        TcpStream::connect(address).unwrap_or_else(|e| panic!("connect {address}: {e}"));
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let response = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("GET {path}: no status in {head:?}"));
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        unchunk(body)
    } else {
        body.to_owned()
    };
    (status, body)
}

/// The body of a chunked response.
fn unchunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// One sample of `/metrics`.
#[derive(Clone, Debug)]
pub struct Sample {
    /// The metric's name (with `_total` for counters).
    pub name: String,
    /// Its labels.
    pub labels: Value,
    /// Its value.
    pub value: f64,
}

/// Scrapes `/metrics` at `address` and parses it with prometheus_client.
pub fn metrics(address: &str) -> Vec<Sample> {
    let (status, text) = get(address, "/metrics");
    assert_eq!(status, 200, "{text}");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("admin/parse_metrics.py");
    let mut child = Command::new(crate::kafka::python())
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run parse_metrics.py: {e}"));
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(text.as_bytes())
            .unwrap_or_else(|e| panic!("parse_metrics.py: {e}"));
    }
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("parse_metrics.py: {e}"));
    assert!(
        out.status.success(),
        "the Prometheus parser refused /metrics: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let samples: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("parse_metrics.py printed no JSON: {e}"));
    samples
        .as_array()
        .map(|list| {
            list.iter()
                .map(|s| Sample {
                    name: s["name"].as_str().unwrap_or_default().to_owned(),
                    labels: s["labels"].clone(),
                    value: s["value"].as_f64().unwrap_or(f64::NAN),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The value of the sample named `name` whose labels include `labels`.
pub fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels[*k].as_str() == Some(*v))
        })
        .map(|s| s.value)
}
