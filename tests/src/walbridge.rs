//! Running the `walbridge` binary from tests.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::Cluster;

/// The walbridge binary, built once per test process. Built for the
/// whole workspace (its only binary), so that features resolve as in the
/// build of the tests and nothing is compiled a second time: `-p walbridge`
/// resolved them for that package alone and built a second copy of its
/// dependencies. Cargo runs it without the variables it set for this test
/// (see [`set_for_a_crate`]).
pub fn binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
        let mut command = Command::new(cargo);
        command
            .args([
                "build",
                "--quiet",
                "--workspace",
                "--bins",
                "--manifest-path",
            ])
            .arg(&manifest)
            .env("CARGO_TARGET_DIR", crate::target_dir());
        for (name, _) in std::env::vars_os() {
            if name.to_str().is_some_and(set_for_a_crate) {
                command.env_remove(name);
            }
        }
        let status = command
            .status()
            .unwrap_or_else(|e| panic!("cannot run cargo build: {e}"));
        assert!(status.success(), "cargo build --workspace --bins failed");
        crate::target_dir().join("debug/walbridge")
    })
    .clone()
}

/// Whether `name` is one of the variables cargo sets for the crate it
/// builds or runs (here, the tests). A build script may watch one of them
/// (ring's watches `CARGO_MANIFEST_DIR`): a build run with them would then
/// differ from the build that made the tests, and each would build that
/// crate and everything above it again for the other.
fn set_for_a_crate(name: &str) -> bool {
    matches!(
        name,
        "CARGO_MANIFEST_DIR"
            | "CARGO_MANIFEST_PATH"
            | "CARGO_MANIFEST_LINKS"
            | "CARGO_CRATE_NAME"
            | "CARGO_BIN_NAME"
            | "CARGO_PRIMARY_PACKAGE"
            | "CARGO_TARGET_TMPDIR"
            | "CARGO_RUSTC_CURRENT_DIR"
    ) || name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_BIN_EXE_")
}

/// A working directory for one walbridge deployment: its configuration,
/// `data_dir` and JSON-lines output file. Survives restarts of the process.
pub struct Deployment {
    dir: tempfile::TempDir,
}

impl Default for Deployment {
    fn default() -> Self {
        Self::new()
    }
}

impl Deployment {
    /// A fresh, empty deployment directory.
    pub fn new() -> Self {
        Deployment {
            dir: tempfile::Builder::new()
                .prefix("walbridge-e2e-")
                .tempdir()
                .unwrap_or_else(|e| panic!("tempdir: {e}")),
        }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The configuration file.
    pub fn config_path(&self) -> PathBuf {
        self.path().join("walbridge.toml")
    }

    /// The jsonl output file.
    pub fn output_path(&self) -> PathBuf {
        self.path().join("out.jsonl")
    }

    /// Writes a configuration with one source `src` reading `publication`
    /// from `dbname` on `cluster`, extra source keys `source_extra`, and a
    /// jsonl sink writing to [`Deployment::output_path`].
    pub fn configure(
        &self,
        cluster: &Cluster,
        dbname: &str,
        publication: &str,
        source_extra: &str,
    ) {
        self.configure_connection(
            &cluster.connstr("postgres", dbname),
            publication,
            source_extra,
        );
    }

    /// As [`Deployment::configure`], with an explicit connection string.
    pub fn configure_connection(&self, connection: &str, publication: &str, source_extra: &str) {
        let text = format!(
            "data_dir = \"{data}\"\n\n[[source]]\nname = \"src\"\nconnection = \"{connection}\"\npublications = [\"{publication}\"]\n{source_extra}\n\n[[sink]]\nname = \"out\"\ntype = \"jsonl\"\npath = \"{out}\"\n",
            data = self.path().join("data").display(),
            out = self.output_path().display(),
        );
        self.write_config(&text);
    }

    /// Writes a configuration with one source `src` (connection string,
    /// publications, extra source keys) and the sink sections `sinks`
    /// verbatim (e.g. a `[[sink]]` of `type = "postgres"`).
    pub fn configure_sinks(
        &self,
        connection: &str,
        publications: &[&str],
        source_extra: &str,
        sinks: &str,
    ) {
        let publications: Vec<String> = publications.iter().map(|p| format!("\"{p}\"")).collect();
        let text = format!(
            "data_dir = \"{data}\"\n\n[[source]]\nname = \"src\"\nconnection = \"{connection}\"\npublications = [{}]\n{source_extra}\n\n{sinks}\n",
            publications.join(", "),
            data = self.path().join("data").display(),
        );
        self.write_config(&text);
    }

    /// Writes the configuration file verbatim.
    pub fn write_config(&self, text: &str) {
        std::fs::write(self.config_path(), text).unwrap_or_else(|e| panic!("write config: {e}"));
    }

    /// Starts `walbridge run`.
    pub fn start(&self) -> Running {
        self.start_with_env(&[])
    }

    /// Starts `walbridge run` with more environment variables.
    pub fn start_with_env(&self, env: &[(&str, &str)]) -> Running {
        self.start_wrapped(&[], env)
    }

    /// Starts `walbridge run` through the command `wrapper` (which ends by
    /// running its arguments: the binary and its own), with more
    /// environment variables.
    pub fn start_wrapped(&self, wrapper: &[&str], env: &[(&str, &str)]) -> Running {
        let stderr = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.path().join("stderr.log"))
            .unwrap_or_else(|e| panic!("stderr log: {e}"));
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(binary());
                command
            }
            None => Command::new(binary()),
        };
        let child = command
            .args(["run", "-c"])
            .arg(self.config_path())
            .env("RUST_LOG", "info")
            // Tests run side by side: any free port (see `admin_address`).
            .env("WALBRIDGE_ADMIN_LISTEN", "127.0.0.1:0")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start walbridge: {e}"));
        Running { child: Some(child) }
    }

    /// Runs a walbridge subcommand (`check`, `drop`, …) against the configuration.
    pub fn command(&self, args: &[&str]) -> Output {
        self.command_with_env(args, &[])
    }

    /// As [`Deployment::command`], with more environment variables.
    pub fn command_with_env(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut full = vec![args[0], "-c"];
        let config = self.config_path();
        let config = config.to_string_lossy().into_owned();
        full.push(&config);
        full.extend(&args[1..]);
        Command::new(binary())
            .args(&full)
            // `run` through here too: any free port.
            .env("WALBRIDGE_ADMIN_LISTEN", "127.0.0.1:0")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run walbridge: {e}"))
    }

    /// The address the admin endpoint of the running walbridge listens
    /// on, as its log says.
    pub fn admin_address(&self, timeout: Duration) -> String {
        self.admin_address_after(0, timeout)
    }

    /// As [`Deployment::admin_address`], for the process that logs past
    /// the log's first `seen` bytes (one started again).
    pub fn admin_address_after(&self, seen: usize, timeout: Duration) -> String {
        self.logged_address(seen, "admin endpoint serving", timeout)
    }

    /// The `listen` address of the last log line saying `message`, past
    /// the log's first `seen` bytes.
    pub fn logged_address(&self, seen: usize, message: &str, timeout: Duration) -> String {
        let log = self.wait_for_log_after(seen, message, timeout);
        // Plain text (`listen=ADDRESS`) or JSON (`"listen":"ADDRESS"`).
        log.lines()
            .rev()
            .find(|l| l.contains(message))
            .and_then(|l| {
                let text = l.split("listen=").nth(1);
                let json = l.split("\"listen\":\"").nth(1);
                text.or(json)
            })
            .and_then(|rest| rest.split(|c: char| c.is_whitespace() || c == '"').next())
            .unwrap_or_else(|| panic!("no address after `{message}` in the log:\n{log}"))
            .to_owned()
    }

    /// Bytes of records in the durable log of source `src` (its segment
    /// files, less the zeros written ahead of the records).
    pub fn log_bytes(&self) -> u64 {
        let dir = self.path().join("data/sources/src/log");
        std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok())
                    .filter(|e| e.path().extension().is_some_and(|x| x == "seg"))
                    .map(|e| segment_bytes(&e.path()))
                    .sum()
            })
            .unwrap_or(0)
    }

    /// Waits until the log or the output file grows (walbridge is
    /// writing), for at most `timeout`.
    pub fn wait_for_growth(&self, timeout: Duration) {
        let size =
            || self.log_bytes() + std::fs::metadata(self.output_path()).map_or(0, |m| m.len());
        let before = size();
        let deadline = Instant::now() + timeout;
        while size() == before && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// walbridge's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.path().join("stderr.log")).unwrap_or_default()
    }

    /// Waits until walbridge's log contains `text` and returns the log;
    /// panics with the log after `timeout`.
    pub fn wait_for_log(&self, text: &str, timeout: Duration) -> String {
        self.wait_for_log_after(0, text, timeout);
        self.log()
    }

    /// Waits until the log, past its first `seen` bytes, contains `text`;
    /// returns that part of the log.
    pub fn wait_for_log_after(&self, seen: usize, text: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let log = self.log().get(seen..).unwrap_or_default().to_owned();
            if log.contains(text) {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "`{text}` not logged within {timeout:?}:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every complete output line, parsed (a line still being written is left out).
    pub fn lines(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(self.output_path()).unwrap_or_default();
        let complete = text.rfind('\n').map_or("", |end| &text[..end]);
        complete
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| {
                serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("output line is not JSON ({e}): {l}"))
            })
            .collect()
    }

    /// Waits until at least `n` lines were written, or panics with the log after `timeout`.
    pub fn wait_for_lines(&self, n: usize, timeout: Duration) -> Vec<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let lines = self.lines();
            if lines.len() >= n {
                return lines;
            }
            assert!(
                Instant::now() < deadline,
                "expected {n} output lines, got {} after {timeout:?}; walbridge log:\n{}",
                lines.len(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The `after.id` of every output line with operation `op`, in order.
pub fn ids_with_op(lines: &[Value], op: &str) -> Vec<i64> {
    lines
        .iter()
        .filter(|l| l["op"] == op)
        .filter_map(|l| l["after"]["id"].as_i64())
        .collect()
}

/// A running `walbridge run` process; killed (SIGKILL) when dropped.
pub struct Running {
    child: Option<Child>,
}

impl Running {
    fn signal(&self, signal: i32) {
        if let Some(child) = &self.child {
            // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
            unsafe {
                libc::kill(child.id() as i32, signal);
            }
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Sends SIGTERM and waits for the exit status (panics after `timeout`).
    pub fn stop(mut self, timeout: Duration) -> ExitStatus {
        self.signal(libc::SIGTERM);
        self.wait(timeout)
    }

    /// Kills the process with SIGKILL, as a crash would.
    pub fn kill(mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits for the process to exit by itself.
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        let Some(child) = self.child.as_mut() else {
            panic!("process already reaped")
        };
        loop {
            if let Some(status) = child.try_wait().unwrap_or_else(|e| panic!("wait: {e}")) {
                self.child = None;
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("walbridge did not exit within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The process's peak resident memory so far (`VmHWM`), in bytes.
    pub fn peak_rss(&self) -> u64 {
        let Some(child) = &self.child else {
            return 0;
        };
        std::fs::read_to_string(format!("/proc/{}/status", child.id()))
            .ok()
            .and_then(|status| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix("VmHWM:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            })
            .map_or(0, |kib| kib * 1024)
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Where the records of a log segment end: past the last frame whose
/// header is not all zeros, walking the frames by their lengths (the
/// layout of crates/walbridge-log/src/segment.rs and frame.rs: a 24-byte
/// segment header, then frames of a 25-byte header, whose first 4 bytes
/// are the payload's length, and the payload). A segment zero-filled
/// ahead is longer than its records; any other ends where they do.
fn segment_bytes(path: &Path) -> u64 {
    use std::os::unix::fs::FileExt;
    const SEGMENT_HEADER: u64 = 24;
    const FRAME_HEADER: usize = 25;
    let Ok(file) = std::fs::File::open(path) else {
        return 0;
    };
    let len = file.metadata().map_or(0, |m| m.len());
    let mut header = [0u8; FRAME_HEADER];
    let mut pos = SEGMENT_HEADER;
    while pos + FRAME_HEADER as u64 <= len
        && file.read_exact_at(&mut header, pos).is_ok()
        && header != [0; FRAME_HEADER]
    {
        let payload = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        pos += FRAME_HEADER as u64 + u64::from(payload);
    }
    pos.min(len)
}
