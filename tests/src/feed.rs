//! walbridge's change feed (`type = "grpc"`) as a third-party client sees
//! it: `tests/grpc/feed_client.py`, Python's `grpcio` with stubs generated
//! from the proto by `grpcio-tools` (installed by
//! `scripts/kafka-test-env.sh`), run as a process per call.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::walbridge::Deployment;
use crate::{printed, succeeds};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("grpc/feed_client.py")
}

/// The `[[sink]]` section of a change feed named `feed` listening on
/// `listen` (`127.0.0.1:0`: any free port, see [`address`]), with more
/// keys `extra`.
pub fn sink(listen: &str, extra: &str) -> String {
    format!("[[sink]]\nname = \"feed\"\ntype = \"grpc\"\nlisten = \"{listen}\"\n{extra}\n")
}

/// The address the feed of the walbridge running in `deployment` serves
/// on, as its log says past its first `seen` bytes (0: the first start).
pub fn address(deployment: &Deployment, seen: usize, timeout: Duration) -> String {
    deployment.logged_address(seen, "change feed serving", timeout)
}

/// The Go example consumer (`examples/go-consumer`), generated from the
/// proto and built once per test run by its `build.sh`.
pub fn go_consumer() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let binary = crate::target_dir().join("go-consumer");
            let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/go-consumer");
            succeeds(Command::new(example.join("build.sh")).arg(&binary));
            binary
        })
        .clone()
}

/// A client of one feed.
#[derive(Clone, Debug)]
pub struct Client {
    address: String,
    /// Options before the command (`--ca`, `--token-env`, ...).
    options: Vec<String>,
    env: Vec<(String, String)>,
}

impl Client {
    /// A plaintext client of the feed at `address`.
    pub fn new(address: &str) -> Client {
        Client {
            address: address.to_owned(),
            options: Vec::new(),
            env: Vec::new(),
        }
    }

    /// The feed's `host:port`.
    pub fn address(&self) -> String {
        self.address.clone()
    }

    /// The same client over TLS, trusting the CA certificate `ca`.
    pub fn with_tls(&self, ca: &Path) -> Client {
        self.with_options(&["--ca".as_ref(), ca.as_os_str()])
    }

    /// The same client presenting `certificate` (TLS only).
    pub fn with_certificate(&self, certificate: &crate::tls::Issued) -> Client {
        self.with_options(&[
            "--client-cert".as_ref(),
            certificate.cert.as_os_str(),
            "--client-key".as_ref(),
            certificate.key.as_os_str(),
        ])
    }

    /// The same client sending `token` as its bearer token.
    pub fn with_token(&self, token: &str) -> Client {
        let mut client = self.with_options(&["--token-env".as_ref(), "FEED_TOKEN".as_ref()]);
        client.env.push(("FEED_TOKEN".into(), token.into()));
        client
    }

    fn with_options(&self, options: &[&std::ffi::OsStr]) -> Client {
        let mut client = self.clone();
        client
            .options
            .extend(options.iter().map(|o| o.to_string_lossy().into_owned()));
        client
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(crate::kafka::python());
        command
            .arg(script())
            .args(["--address", &self.address])
            .args(&self.options)
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null());
        command
    }

    /// Subscribes with `open` (the `Open` message as JSON) and the
    /// client's `options` (`--units N`, `--idle S`, `--ack none`, ...);
    /// returns every line it wrote once it stopped.
    pub fn subscribe(&self, open: &Value, options: &[&str]) -> Vec<Value> {
        let open = open.to_string();
        let mut args = vec!["subscribe", "--open", &open];
        args.extend(options);
        let output = succeeds(&mut self.command(&args));
        parse_lines(&String::from_utf8_lossy(&output.stdout))
    }

    /// As [`Client::subscribe`], in the background, writing to `output`.
    pub fn spawn_subscribe(&self, open: &Value, options: &[&str], output: &Path) -> Subscriber {
        let open = open.to_string();
        let output_text = output.to_string_lossy().into_owned();
        let mut args = vec!["subscribe", "--open", &open, "--output", &output_text];
        args.extend(options);
        let child = self
            .command(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the feed client: {e}"));
        Subscriber {
            child,
            output: output.to_owned(),
        }
    }

    /// A unary `ChangeFeed` RPC: its response, or `{"error": CODE, "details": ...}`.
    pub fn call(&self, method: &str, request: &Value) -> Value {
        let request = request.to_string();
        self.single(&["call", method, &request])
    }

    /// The standard health check of `service` ("" for the server).
    pub fn health(&self, service: &str) -> Value {
        self.single(&["health", service])
    }

    /// What server reflection tells: `{"services": [...], "methods": {...}}`.
    pub fn reflect(&self) -> Value {
        self.single(&["reflect"])
    }

    fn single(&self, args: &[&str]) -> Value {
        let output = succeeds(&mut self.command(args));
        parse_lines(&String::from_utf8_lossy(&output.stdout))
            .pop()
            .unwrap_or_else(|| panic!("the feed client printed nothing:\n{}", printed(&output)))
    }
}

/// A subscription running in the background.
pub struct Subscriber {
    child: Child,
    output: PathBuf,
}

impl Subscriber {
    /// Every complete line written so far.
    pub fn lines(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.output).unwrap_or_default();
        let complete = text.rfind('\n').map_or("", |end| &text[..end]);
        parse_lines(complete)
    }

    /// Waits until the client wrote its last line (`end`) and exited;
    /// returns every line.
    pub fn finish(mut self, timeout: Duration) -> Vec<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self
                .child
                .try_wait()
                .unwrap_or_else(|e| panic!("wait: {e}"))
            {
                let mut errors = String::new();
                if let Some(mut stderr) = self.child.stderr.take() {
                    use std::io::Read;
                    let _ = stderr.read_to_string(&mut errors);
                }
                assert!(
                    status.success(),
                    "the feed client failed ({status}):\n{errors}"
                );
                return self.lines();
            }
            assert!(
                Instant::now() < deadline,
                "the feed client did not finish within {timeout:?}; its lines:\n{:?}",
                self.lines()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until `enough` holds for the lines written so far.
    pub fn wait_for(&self, timeout: Duration, mut enough: impl FnMut(&[Value]) -> bool) {
        let deadline = Instant::now() + timeout;
        loop {
            let lines = self.lines();
            if enough(&lines) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the subscriber did not see what was expected within {timeout:?}; its lines:\n{lines:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn parse_lines(text: &str) -> Vec<Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("not JSON from the client ({e}): {l}"))
        })
        .collect()
}

/// `{"start": {"earliest": {}}}`-style start positions, for `open`.
pub fn earliest() -> Value {
    json!({"earliest": {}})
}

/// The lines of one kind of event (`change`, `commit`, `rows`, ...).
pub fn events<'a>(lines: &'a [Value], kind: &str) -> Vec<&'a Value> {
    lines.iter().filter(|l| l["event"] == kind).collect()
}

/// How the client's stream ended: its last line.
pub fn end(lines: &[Value]) -> &Value {
    lines
        .iter()
        .rev()
        .find(|l| l.get("end").is_some())
        .unwrap_or_else(|| panic!("the client's lines have no end: {lines:?}"))
}

/// A value as its plain JSON (`{"int64": 5}` → `5`, `{"string": "a"}` →
/// `"a"`), for comparing rows with what another sink writes.
pub fn plain(value: &Value) -> Value {
    match value {
        Value::Object(o) if o.len() == 1 => match o.iter().next() {
            Some((kind, inner)) if kind == "array" => Value::Array(
                inner
                    .as_array()
                    .map(|a| a.iter().map(plain).collect())
                    .unwrap_or_default(),
            ),
            Some((_, inner)) => inner.clone(),
            None => Value::Null,
        },
        other => other.clone(),
    }
}

/// A row's values as plain JSON (see [`plain`]).
pub fn plain_row(row: &Value) -> Value {
    match row {
        Value::Object(o) => Value::Object(o.iter().map(|(k, v)| (k.clone(), plain(v))).collect()),
        other => other.clone(),
    }
}

/// Every change and row of the copy the lines hold, as the Debezium-style
/// envelopes (`op`, `before`, `after`, `source.table`) the jsonl sink
/// writes, in the order received: for [`crate::fixtures::assert_replays_to_publisher`].
pub fn envelopes(lines: &[Value]) -> Vec<Value> {
    let mut out = Vec::new();
    for line in lines {
        let decoded = &line["decoded"];
        match line["event"].as_str() {
            Some("rows") => {
                let table = short_table(&decoded["table"]);
                for row in decoded["rows"].as_array().into_iter().flatten() {
                    out.push(json!({"op": "r", "before": null, "after": plain_row(row), "source": {"table": table}}));
                }
            }
            Some("change") => {
                let op = match decoded["operation"].as_str() {
                    Some("INSERT") => "c",
                    Some("UPDATE") => "u",
                    Some("DELETE") => "d",
                    _ => continue,
                };
                out.push(json!({
                    "op": op,
                    "before": plain_row(&decoded["old"]),
                    "after": plain_row(&decoded["new"]),
                    "source": {"table": short_table(&decoded["table"])},
                }));
            }
            _ => {}
        }
    }
    out
}

fn short_table(qualified: &Value) -> String {
    let text = qualified.as_str().unwrap_or_default();
    text.rsplit('.').next().unwrap_or(text).to_owned()
}
