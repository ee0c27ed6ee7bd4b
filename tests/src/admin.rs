//! The admin endpoint as clients see it: curl, Prometheus's own Python
//! parser (`tests/admin/parse_metrics.py`) and linter (`promtool check
//! metrics`), and a headless Chromium.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

/// GETs `url` with curl, `extra` being further curl arguments (headers,
/// certificates): the status code and the body. A request that gets no
/// answer at all (refused, TLS failure) gives status 0 and curl's message.
pub fn curl(url: &str, extra: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "30", "-o", "-", "-w", "\n%{http_code}"])
        .args(extra)
        .arg(url)
        .output()
        .unwrap_or_else(|e| panic!("cannot run curl: {e}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    match status.trim().parse() {
        Ok(status) if out.status.success() => (status, body.to_owned()),
        _ => (0, String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

/// GETs `path` from `address` (`host:port`) over plain HTTP.
pub fn get(address: &str, path: &str) -> (u16, String) {
    curl(&format!("http://{address}{path}"), &[])
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
    parse_metrics(&text)
}

/// Runs `command` with `text` on its standard input; what it printed.
fn fed(command: &mut Command, text: &str) -> std::process::Output {
    let what = format!("{command:?}");
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what} (scripts/test.sh installs it): {e}"));
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(text.as_bytes())
            .unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// What `promtool check metrics` says of a scrape of `/metrics` at
/// `address`: nothing when it accepts it.
pub fn lint_metrics(address: &str) -> String {
    let (status, text) = get(address, "/metrics");
    assert_eq!(status, 200, "{text}");
    let out = fed(Command::new("promtool").args(["check", "metrics"]), &text);
    if out.status.success() {
        String::new()
    } else {
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }
}

/// Parses Prometheus text with prometheus_client.
fn parse_metrics(text: &str) -> Vec<Sample> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("admin/parse_metrics.py");
    let out = fed(Command::new(crate::kafka::python()).arg(script), text);
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

/// What headless Chromium makes of the page at `url`: the DOM after
/// rendering, and a screenshot kept at `screenshot`.
pub fn chromium(url: &str, screenshot: &Path) -> String {
    let profile = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    // The flags keep Chromium off the network it would otherwise reach for.
    let run = |extra: &[String]| {
        let out = crate::succeeds(
            Command::new("chromium")
                .args([
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-quic",
                    "--no-first-run",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    "--hide-scrollbars",
                    "--window-size=1200,1400",
                ])
                .arg(format!("--user-data-dir={}", profile.path().display()))
                .args(extra)
                .arg(url),
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    if let Some(dir) = screenshot.parent() {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    }
    run(&[format!("--screenshot={}", screenshot.display())]);
    run(&["--dump-dom".to_owned()])
}

/// Where tests keep what a person may want to look at afterwards
/// (screenshots): `target/test-artifacts`.
pub fn artifacts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-artifacts")
}
