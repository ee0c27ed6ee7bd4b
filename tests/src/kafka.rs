//! A real Kafka-protocol broker for tests, and a third-party consumer.
//!
//! [`Broker`] runs an Apache Kafka broker (`scripts/throwaway-kafka.sh`:
//! KRaft, one node, a fresh cluster in a temporary directory) on a free
//! loopback port and stops and removes it when dropped. [`consume`] reads topics with
//! Python's `confluent-kafka`, so what the tests check is what an ordinary
//! Kafka client sees. `scripts/kafka-test-env.sh` installs both.

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

/// The tests' Python, with confluent-kafka, prometheus-client and
/// kubernetes-validate (scripts/kafka-test-env.sh):
/// `$WALBRIDGE_KAFKA_VENV/bin/python`.
pub fn python() -> PathBuf {
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

/// A running Apache Kafka broker; stopped and removed when dropped.
pub struct Broker {
    /// `scripts/throwaway-kafka.sh run`, leader of its own process group.
    child: Child,
    bootstrap: String,
    /// For a SASL_SSL broker: the CA, the user and the password.
    secured: Option<Secured>,
    log: PathBuf,
    /// Where the test keeps the broker's output (removed when dropped).
    _dir: tempfile::TempDir,
}

/// How clients reach a SASL_SSL broker.
#[derive(Clone, Debug)]
pub struct Secured {
    /// The throwaway CA that signed the broker's certificate.
    pub ca: PathBuf,
    /// The SCRAM-SHA-512 user.
    pub username: String,
    /// Its password.
    pub password: String,
    /// The password of `admin`, a super user who may set ACLs.
    pub admin_password: String,
}

impl Broker {
    /// Starts a broker whose clients must use SASL_SSL with
    /// SCRAM-SHA-512 and verify its certificate.
    pub fn start_sasl_ssl() -> Broker {
        Self::spawn(None, None, true)
            .unwrap_or_else(|log| panic!("the Kafka broker did not start:\n{log}"))
    }

    /// The librdkafka properties a client needs (none for a plaintext
    /// broker), with `password` instead of the right one when given.
    pub fn client_properties(&self, password: Option<&str>) -> Vec<(String, String)> {
        let Some(s) = &self.secured else {
            return Vec::new();
        };
        [
            ("security.protocol", "SASL_SSL".to_owned()),
            ("sasl.mechanism", "SCRAM-SHA-512".to_owned()),
            ("sasl.username", s.username.clone()),
            ("sasl.password", password.unwrap_or(&s.password).to_owned()),
            ("ssl.ca.location", s.ca.display().to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// Changes the ACLs of a SASL_SSL broker as its super user:
    /// `tests/kafka/acl.py` with `args` (`deny --principal User:walbridge
    /// --topic NAME`, …).
    pub fn acl(&self, args: &[&str]) {
        let Some(s) = &self.secured else {
            panic!("ACLs need a broker started with start_sasl_ssl");
        };
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("kafka/acl.py");
        let mut command = Command::new(python());
        command.arg(script).args(["--brokers", &self.bootstrap]);
        for (key, value) in self.client_properties(Some(&s.admin_password)) {
            let value = if key == "sasl.username" {
                "admin".to_owned()
            } else {
                value
            };
            command.arg("--property").arg(format!("{key}={value}"));
        }
        crate::succeeds(command.args(args));
    }

    /// Starts a broker on a free port and waits until it has started.
    pub fn start() -> Broker {
        let mut last = String::new();
        for _ in 0..3 {
            // Another process may take a port the script chose: try again.
            match Self::spawn(None, None, false) {
                Ok(broker) => return broker,
                Err(log) => last = log,
            }
        }
        panic!("the Kafka broker did not start:\n{last}");
    }

    /// Starts a broker on `port`.
    pub fn start_on(port: u16) -> Broker {
        Self::spawn(Some(port), None, false)
            .unwrap_or_else(|log| panic!("the Kafka broker did not start:\n{log}"))
    }

    /// Starts a broker whose data stays in `dir` when it stops: started
    /// again with the same `dir`, it is the same broker (port, topics,
    /// committed transactions) — a broker outage.
    pub fn start_keeping(dir: &Path) -> Broker {
        Self::spawn(None, Some(dir), false)
            .unwrap_or_else(|log| panic!("the Kafka broker did not start:\n{log}"))
    }

    fn spawn(port: Option<u16>, keep: Option<&Path>, sasl_ssl: bool) -> Result<Broker, String> {
        use std::io::BufRead;
        use std::os::unix::process::CommandExt;
        let dir = tempfile::Builder::new()
            .prefix("walbridge-kafka-test-")
            .tempdir()
            .unwrap_or_else(|e| panic!("tempdir: {e}"));
        let log = dir.path().join("broker.log");
        let output = std::fs::File::create(&log).unwrap_or_else(|e| panic!("broker log: {e}"));
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/throwaway-kafka.sh");
        let mut command = Command::new("bash");
        command.arg(script).arg("run");
        if sasl_ssl {
            command.arg("--sasl-ssl");
        }
        command.arg(port.map(|p| p.to_string()).unwrap_or_default());
        if let Some(keep) = keep {
            command.arg(keep);
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(output)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run scripts/throwaway-kafka.sh: {e}"));
        // The script prints the bootstrap address once the broker has
        // started (then, for SASL_SSL, `ca=`, `username=`, `password=`,
        // `admin_password=`), or exits.
        let mut lines = Vec::new();
        if let Some(stdout) = child.stdout.take() {
            let mut reader = std::io::BufReader::new(stdout);
            for _ in 0..if sasl_ssl { 5 } else { 1 } {
                let mut line = String::new();
                let _ = reader.read_line(&mut line);
                lines.push(line.trim().to_owned());
            }
        }
        let field = |name: &str| {
            lines
                .iter()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
                .unwrap_or_default()
                .to_owned()
        };
        let secured = sasl_ssl.then(|| Secured {
            ca: PathBuf::from(field("ca")),
            username: field("username"),
            password: field("password"),
            admin_password: field("admin_password"),
        });
        let broker = Broker {
            child,
            bootstrap: lines.first().cloned().unwrap_or_default(),
            secured,
            log,
            _dir: dir,
        };
        if broker.bootstrap.is_empty() {
            return Err(broker.log());
        }
        Ok(broker)
    }

    /// `127.0.0.1:port`, for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        self.bootstrap.clone()
    }

    /// The broker's output so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        // SIGTERM to the script, which stops the broker and removes its directory.
        let group = -(self.child.id() as i32);
        // SAFETY: kill(2) on our own child's process group has no memory-safety preconditions.
        unsafe {
            libc::kill(group, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        // SAFETY: as above.
        unsafe {
            libc::kill(group, libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

/// Drives the schema registry at `url` with confluent-kafka's
/// `SchemaRegistryClient` (register, look up, versions, schemas by id,
/// compatibility levels, soft and permanent deletes) and returns what it saw.
pub fn exercise_registry(url: &str) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("kafka/registry_client.py");
    let output = crate::succeeds(Command::new(python()).arg(script).arg(url));
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
    /// librdkafka connection properties (a secured broker's
    /// [`Broker::client_properties`]).
    pub properties: &'a [(String, String)],
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
    for (key, value) in options.properties {
        command.arg("--property").arg(format!("{key}={value}"));
    }
    let output = crate::succeeds(&mut command);
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
    authority: crate::tls::Authority,
    // Holds the authority's files.
    _dir: tempfile::TempDir,
    requests: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl AuthProxy {
    /// A proxy to `upstream` (`http://…`) accepting `user`/`password`,
    /// with a server certificate for 127.0.0.1 signed by a new CA.
    pub fn start(upstream: &str, user: &str, password: &str) -> Self {
        use std::io::BufRead as _;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let authority = crate::tls::Authority::new(dir.path());
        let leaf = authority.issue("leaf", crate::tls::Purpose::Server);
        let port = crate::free_port();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("kafka/auth_proxy.py");
        let mut child = Command::new(python())
            .arg(script)
            .args(["--port", &port.to_string(), "--upstream", upstream])
            .args(["--user", user, "--password", password])
            .arg("--cert")
            .arg(&leaf.cert)
            .arg("--key")
            .arg(&leaf.key)
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
            authority,
            _dir: dir,
            requests,
        }
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The CA certificate the server's certificate is signed with.
    pub fn ca_cert(&self) -> PathBuf {
        self.authority.cert()
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
