//! A real Kafka-protocol broker for tests, and a third-party consumer.
//!
//! [`Broker`] runs the `tansu` broker (in-memory storage) on a free
//! loopback port and kills it when dropped. [`consume`] reads topics with
//! Python's `confluent-kafka`, so what the tests check is what an ordinary
//! Kafka client sees. `scripts/kafka-test-env.sh` installs both.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn cache_dir() -> PathBuf {
    if crate::is_root() {
        PathBuf::from("/var/cache/walbridge")
    } else {
        let home = std::env::var("HOME").unwrap_or_default();
        PathBuf::from(home).join(".cache/walbridge")
    }
}

/// The tansu binary: `$WALBRIDGE_TANSU`, else `~/.cargo/bin/tansu`.
fn tansu() -> PathBuf {
    if let Ok(path) = std::env::var("WALBRIDGE_TANSU") {
        return PathBuf::from(path);
    }
    let cargo_home = std::env::var("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cargo")
        });
    let path = cargo_home.join("bin/tansu");
    assert!(
        path.exists(),
        "the tansu broker is not installed at {}: run scripts/kafka-test-env.sh",
        path.display()
    );
    path
}

/// The Python with confluent-kafka: `$WALBRIDGE_KAFKA_VENV/bin/python`.
fn python() -> PathBuf {
    let venv = std::env::var("WALBRIDGE_KAFKA_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|_| cache_dir().join("kafka-venv"));
    let path = venv.join("bin/python");
    assert!(
        path.exists(),
        "no Python with confluent-kafka at {}: run scripts/kafka-test-env.sh",
        path.display()
    );
    path
}

/// A running tansu broker; killed when dropped.
pub struct Broker {
    child: Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Broker {
    /// Starts a broker with in-memory storage on a free port and waits
    /// until it accepts connections.
    pub fn start() -> Broker {
        let mut last = String::new();
        for _ in 0..5 {
            // Another process may take the port in between: try another.
            match Self::spawn(crate::free_port()) {
                Ok(broker) => return broker,
                Err(log) => last = log,
            }
        }
        panic!("the tansu broker did not start:\n{last}");
    }

    /// Starts a broker on `port`.
    pub fn start_on(port: u16) -> Broker {
        Self::spawn(port).unwrap_or_else(|log| panic!("the tansu broker did not start:\n{log}"))
    }

    fn spawn(port: u16) -> Result<Broker, String> {
        let dir = tempfile::Builder::new()
            .prefix("walbridge-kafka-")
            .tempdir()
            .unwrap_or_else(|e| panic!("tempdir: {e}"));
        let log = dir.path().join("broker.log");
        let url = format!("tcp://127.0.0.1:{port}");
        let output = std::fs::File::create(&log).unwrap_or_else(|e| panic!("broker log: {e}"));
        let errors = output
            .try_clone()
            .unwrap_or_else(|e| panic!("broker log: {e}"));
        let mut child = Command::new(tansu())
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            .args(["--storage-engine", "memory://tansu/"])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(output)
            .stderr(errors)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start tansu: {e}"));
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(Broker {
                    child,
                    port,
                    log,
                    _dir: dir,
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        Err(std::fs::read_to_string(&log).unwrap_or_default())
    }

    /// `127.0.0.1:port`, for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The broker's output so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Drives the schema registry at `url` with confluent-kafka's
/// `SchemaRegistryClient` (register, look up, versions, schemas by id,
/// compatibility levels, soft and permanent deletes) and returns what it saw.
pub fn exercise_registry(url: &str) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("kafka/registry_client.py");
    let output = Command::new(python())
        .arg(script)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run the registry client: {e}"));
    assert!(
        output.status.success(),
        "the registry client failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "the registry client printed no JSON ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// One message as the consumer decoded it.
#[derive(Clone, Debug)]
pub struct Consumed {
    /// Its topic.
    pub topic: String,
    /// Its partition.
    pub partition: i64,
    /// Its offset in the partition.
    pub offset: i64,
    /// The decoded key (`null` for a null key).
    pub key: Value,
    /// The decoded value (`null` for a tombstone).
    pub value: Value,
    /// Headers, as text.
    pub headers: Value,
}

/// librdkafka's mock cluster in a process of its own (the `mock-kafka`
/// binary of this package): the broker for transactional tests, which
/// tansu cannot serve. Killed when dropped.
pub struct MockKafka {
    child: Child,
    bootstrap: String,
}

impl MockKafka {
    /// Starts `binary` (the test's `env!("CARGO_BIN_EXE_mock-kafka")`).
    pub fn start(binary: &Path) -> MockKafka {
        let mut child = Command::new(binary)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let mut line = String::new();
        if let Some(stdout) = child.stdout.as_mut() {
            use std::io::BufRead;
            let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        }
        let bootstrap = line.trim().to_owned();
        assert!(!bootstrap.is_empty(), "the mock cluster did not start");
        MockKafka { child, bootstrap }
    }

    /// Its bootstrap servers.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }
}

impl Drop for MockKafka {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How [`consume`] reads.
#[derive(Clone, Debug)]
pub struct ConsumeOptions<'a> {
    /// Topics to read from the beginning.
    pub topics: &'a [&'a str],
    /// The sink's `format`.
    pub format: &'a str,
    /// Read at least this many messages (then stop once no more come).
    pub expect: usize,
    /// Give up after this long.
    pub timeout: Duration,
    /// The schema registry (Avro), whose subjects are listed too.
    pub registry: Option<&'a str>,
    /// Read only committed transactions (`isolation.level = read_committed`).
    pub read_committed: bool,
    /// Protobuf: make the message classes from this version of the
    /// subjects (else the latest), as a consumer built earlier would.
    pub schema_version: Option<u32>,
}

/// What [`consume`] read.
#[derive(Clone, Debug)]
pub struct ConsumeResult {
    /// The messages, each partition's in offset order.
    pub messages: Vec<Consumed>,
    /// With a registry: every subject and its versions.
    pub subjects: Value,
}

/// Reads `options.topics` from the cluster at `bootstrap` with Python's
/// confluent-kafka.
/// Panics with the consumer's error output if it fails, or if fewer than
/// `expect` messages arrived in time.
pub fn consume(bootstrap: &str, options: &ConsumeOptions<'_>) -> Vec<Consumed> {
    consume_with_registry(bootstrap, options).messages
}

/// As [`consume`], with the registry's subjects.
pub fn consume_with_registry(bootstrap: &str, options: &ConsumeOptions<'_>) -> ConsumeResult {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("kafka/consume.py");
    let mut command = Command::new(python());
    command
        .arg(script)
        .args(["--brokers", bootstrap, "--format", options.format])
        .args(["--expect", &options.expect.to_string()])
        .args(["--timeout", &options.timeout.as_secs_f64().to_string()]);
    for topic in options.topics {
        command.args(["--topic", topic]);
    }
    if let Some(registry) = options.registry {
        command.args(["--registry", registry]);
    }
    if options.read_committed {
        command.args(["--isolation", "read_committed"]);
    }
    if let Some(version) = options.schema_version {
        command.args(["--schema-version", &version.to_string()]);
    }
    let output = command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run the consumer: {e}"));
    assert!(
        output.status.success(),
        "the consumer failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr),
    );
    let document: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "the consumer printed no JSON ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    });
    let messages: Vec<Consumed> = document["messages"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|m| Consumed {
                    topic: m["topic"].as_str().unwrap_or_default().to_owned(),
                    partition: m["partition"].as_i64().unwrap_or(-1),
                    offset: m["offset"].as_i64().unwrap_or(-1),
                    key: m["key"].clone(),
                    value: m["value"].clone(),
                    headers: m["headers"].clone(),
                })
                .collect()
        })
        .unwrap_or_default();
    assert!(
        messages.len() >= options.expect,
        "expected at least {} messages on {:?}, read {}: {messages:#?}",
        options.expect,
        options.topics,
        messages.len()
    );
    ConsumeResult {
        messages,
        subjects: document["subjects"].clone(),
    }
}

/// An HTTPS reverse proxy demanding basic auth (`tests/kafka/auth_proxy.py`)
/// in front of a registry, with a throwaway CA; killed when dropped.
pub struct AuthProxy {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
    requests: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

/// Runs `openssl` with `args` in `dir`, failing the test on an error.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("openssl (scripts/test.sh installs it): {e}"));
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl AuthProxy {
    /// A proxy to `upstream` (`http://…`) accepting `user`/`password`,
    /// with a server certificate for 127.0.0.1 signed by a new CA.
    pub fn start(upstream: &str, user: &str, password: &str) -> Self {
        use std::io::BufRead as _;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path();
        std::fs::write(
            path.join("leaf.ext"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let new_key = ["-newkey", "rsa:2048", "-nodes", "-days", "1"];
        openssl(
            path,
            &[
                &["req", "-x509"],
                &new_key[..],
                &[
                    "-subj",
                    "/CN=walbridge test CA",
                    "-keyout",
                    "ca.key",
                    "-out",
                    "ca.pem",
                ],
            ]
            .concat(),
        );
        openssl(
            path,
            &[
                &["req"],
                &new_key[..2],
                &[
                    "-nodes",
                    "-subj",
                    "/CN=127.0.0.1",
                    "-keyout",
                    "leaf.key",
                    "-out",
                    "leaf.csr",
                ],
            ]
            .concat(),
        );
        openssl(
            path,
            &[
                "x509",
                "-req",
                "-in",
                "leaf.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "1",
                "-extfile",
                "leaf.ext",
                "-out",
                "leaf.pem",
            ],
        );
        let port = crate::free_port();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("kafka/auth_proxy.py");
        let mut child = Command::new(python())
            .arg(script)
            .args(["--port", &port.to_string(), "--upstream", upstream])
            .args(["--user", user, "--password", password])
            .arg("--cert")
            .arg(path.join("leaf.pem"))
            .arg("--key")
            .arg(path.join("leaf.key"))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("auth proxy: {e}"));
        let stdout = child
            .stdout
            .take()
            .unwrap_or_else(|| panic!("auth proxy: no stdout"));
        let mut lines = std::io::BufReader::new(stdout).lines();
        match lines.next() {
            Some(Ok(line)) if line == "ready" => {}
            other => panic!("auth proxy did not start: {other:?}"),
        }
        let requests = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = requests.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                seen.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
        AuthProxy {
            child,
            port,
            dir,
            requests,
        }
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The CA certificate the server's certificate is signed with.
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The requests served so far: `<method> <path> <status>`.
    pub fn requests(&self) -> Vec<String> {
        self.requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for AuthProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
