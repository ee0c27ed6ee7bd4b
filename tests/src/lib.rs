//! The test harness: throwaway PostgreSQL clusters and the walbridge binary.
//!
//! [`Cluster`] runs `initdb` and `pg_ctl` on a free loopback port with
//! `wal_level = logical`, as the `postgres` OS user when the tests run as
//! root (the server refuses to run as root), and stops the server when
//! dropped. The server binaries come from `PATH`, or — with
//! `WALBRIDGE_PG_VERSION=17` (or 14, 16, 18) — from the directory
//! `scripts/fetch-postgres.sh` fills.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub mod admin;
pub mod blocking;
pub mod connect;
pub mod disk;
pub mod feed;
pub mod fixtures;
pub mod kafka;
pub mod tls;
pub mod walbridge;

/// The OS user that runs servers when the tests run as root.
const SERVER_OS_USER: &str = "postgres";

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Where `scripts/fetch-postgres.sh` unpacks other major versions.
fn fetched_root() -> PathBuf {
    std::env::var("WALBRIDGE_PG_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            if is_root() {
                PathBuf::from("/var/cache/walbridge/pg")
            } else {
                let home = std::env::var("HOME").unwrap_or_default();
                PathBuf::from(home).join(".cache/walbridge/pg")
            }
        })
}

/// The binaries of fetched major `version`; panics with the fix when missing.
fn fetched_bin_dir(version: &str) -> PathBuf {
    let dir = fetched_root().join(version).join("bin");
    assert!(
        dir.join("postgres").exists(),
        "PostgreSQL {version} is not installed in {}: run scripts/fetch-postgres.sh {version}",
        dir.display()
    );
    dir
}

/// The directory holding `initdb`, `pg_ctl` and `postgres`, or `None` to use `PATH`.
pub fn server_bin_dir() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("WALBRIDGE_PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    let version = std::env::var("WALBRIDGE_PG_VERSION").ok()?;
    Some(fetched_bin_dir(&version))
}

/// The major version of the servers on `PATH`.
fn path_major() -> u32 {
    static MAJOR: OnceLock<u32> = OnceLock::new();
    *MAJOR.get_or_init(|| {
        Command::new("postgres")
            .arg("--version")
            .output()
            .ok()
            .and_then(|o| {
                let text = String::from_utf8_lossy(&o.stdout).into_owned();
                text.split_whitespace()
                    .find_map(|w| w.split('.').next()?.parse().ok())
            })
            .unwrap_or(0)
    })
}

/// The binaries of major `version`: those on `PATH` when they are that
/// version, else the ones `scripts/fetch-postgres.sh` installed.
pub fn bin_dir_for(version: u32) -> Option<PathBuf> {
    if path_major() == version {
        None
    } else {
        Some(fetched_bin_dir(&version.to_string()))
    }
}

fn server_command(bin_dir: Option<&Path>, program: &str) -> Command {
    let program = match bin_dir {
        Some(dir) => dir.join(program).to_string_lossy().into_owned(),
        None => program.to_owned(),
    };
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", SERVER_OS_USER, "--", &program]);
        c
    } else {
        Command::new(program)
    }
}

/// Runs `command`, which must succeed: otherwise the test fails showing
/// what it printed. Its input is empty.
pub fn succeeds(command: &mut Command) -> Output {
    let output = command.stdin(Stdio::null()).output().unwrap_or_else(|e| {
        panic!(
            "cannot run {:?} (scripts/test.sh installs what the tests run): {e}",
            command.get_program()
        )
    });
    assert!(
        output.status.success(),
        "{command:?} failed ({}):\n{}",
        output.status,
        printed(&output)
    );
    output
}

/// What a finished command printed: its standard output, then its errors.
pub fn printed(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A free TCP port on the loopback interface.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("no free port: {e}"));
    listener
        .local_addr()
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no local address: {e}"))
}

/// Settings for a new cluster.
#[derive(Clone, Debug)]
pub struct ClusterBuilder {
    settings: Vec<(String, String)>,
    hba: Vec<String>,
    ssl: bool,
    bin_dir: Option<PathBuf>,
}

impl Default for ClusterBuilder {
    fn default() -> Self {
        ClusterBuilder {
            settings: vec![
                ("wal_level".into(), "logical".into()),
                ("max_replication_slots".into(), "20".into()),
                ("max_wal_senders".into(), "20".into()),
                ("max_prepared_transactions".into(), "10".into()),
                ("fsync".into(), "off".into()),
                ("synchronous_commit".into(), "off".into()),
                ("shared_buffers".into(), "64MB".into()),
                ("log_min_messages".into(), "warning".into()),
                ("log_line_prefix".into(), "'%m [%p] %a '".into()),
            ],
            hba: vec![
                "local all all trust".into(),
                "local replication all trust".into(),
                "host all all 127.0.0.1/32 trust".into(),
                "host replication all 127.0.0.1/32 trust".into(),
            ],
            ssl: false,
            bin_dir: server_bin_dir(),
        }
    }
}

impl ClusterBuilder {
    /// Adds or overrides a `postgresql.conf` setting (value as written in the file).
    pub fn setting(mut self, name: &str, value: &str) -> Self {
        self.settings.retain(|(n, _)| n != name);
        self.settings.push((name.into(), value.into()));
        self
    }

    /// Replaces `pg_hba.conf`.
    pub fn hba(mut self, lines: &[&str]) -> Self {
        self.hba = lines.iter().map(|l| (*l).to_owned()).collect();
        self
    }

    /// Enables TLS with a fresh CA and a server certificate for `localhost`
    /// and 127.0.0.1 (see [`Cluster::ca_cert`]).
    pub fn ssl(mut self) -> Self {
        self.ssl = true;
        self
    }

    /// Runs PostgreSQL major `version` instead of the default (see [`bin_dir_for`]).
    pub fn version(mut self, version: u32) -> Self {
        self.bin_dir = bin_dir_for(version);
        self
    }

    /// Runs at least PostgreSQL `version`: the default server when it is
    /// recent enough, else PostgreSQL 17 (which the test script fetches).
    pub fn at_least(self, version: u32) -> Self {
        let default_major = match &self.bin_dir {
            None => path_major(),
            Some(dir) => dir
                .parent()
                .and_then(|d| d.file_name())
                .and_then(|n| n.to_str())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0),
        };
        if default_major >= version {
            self
        } else {
            self.version(17)
        }
    }

    /// Initializes and starts the cluster.
    pub fn start(self) -> Cluster {
        Cluster::create(self)
    }
}

/// A running throwaway PostgreSQL cluster.
pub struct Cluster {
    dir: tempfile::TempDir,
    port: u16,
    version_num: u32,
    bin_dir: Option<PathBuf>,
}

impl Cluster {
    /// A cluster with the default settings.
    pub fn start() -> Cluster {
        ClusterBuilder::default().start()
    }

    /// A builder for custom settings.
    pub fn builder() -> ClusterBuilder {
        ClusterBuilder::default()
    }

    fn create(builder: ClusterBuilder) -> Cluster {
        let dir = tempfile::Builder::new()
            .prefix("walbridge-pg-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temporary directory: {e}"));
        let data = dir.path().join("data");
        let sockets = dir.path().join("sockets");
        std::fs::create_dir(&sockets).unwrap_or_else(|e| panic!("mkdir: {e}"));
        if is_root() {
            succeeds(
                Command::new("chown")
                    .args(["-R", SERVER_OS_USER])
                    .arg(dir.path()),
            );
            std::fs::set_permissions(
                dir.path(),
                std::os::unix::fs::PermissionsExt::from_mode(0o755),
            )
            .unwrap_or_else(|e| panic!("chmod: {e}"));
        }
        let bin_dir = builder.bin_dir.clone();
        let mut initdb = server_command(bin_dir.as_deref(), "initdb");
        initdb.args(["-D"]).arg(&data).args([
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ]);
        succeeds(&mut initdb);
        let version_text = std::fs::read_to_string(data.join("PG_VERSION")).unwrap_or_default();
        let major: u32 = version_text.trim().parse().unwrap_or(0);
        let mut conf = String::new();
        for (name, value) in &builder.settings {
            conf.push_str(&format!("{name} = {value}\n"));
        }
        conf.push_str(&format!(
            "unix_socket_directories = '{}'\nlisten_addresses = '127.0.0.1'\n",
            sockets.display()
        ));
        if builder.ssl {
            make_certificates(dir.path(), &data);
            conf.push_str("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n");
        }
        append(&data.join("postgresql.conf"), &conf);
        std::fs::write(data.join("pg_hba.conf"), builder.hba.join("\n") + "\n")
            .unwrap_or_else(|e| panic!("pg_hba: {e}"));
        let mut last_error = String::new();
        for _ in 0..5 {
            let port = free_port();
            match pg_ctl_start(bin_dir.as_deref(), dir.path(), port) {
                Ok(()) => {
                    let mut cluster = Cluster {
                        dir,
                        port,
                        version_num: major * 10_000,
                        bin_dir: bin_dir.clone(),
                    };
                    cluster.version_num = cluster
                        .query_scalar("SHOW server_version_num")
                        .parse()
                        .unwrap_or(0);
                    return cluster;
                }
                // Another process may have taken the port in between.
                Err(e) => last_error = e,
            }
        }
        panic!("PostgreSQL did not start: {last_error}");
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The directory of the server's Unix-domain socket.
    pub fn socket_dir(&self) -> PathBuf {
        self.dir.path().join("sockets")
    }

    /// The server log.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// The server log's contents.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `server_version_num`, e.g. 150004.
    pub fn version_num(&self) -> u32 {
        self.version_num
    }

    /// The major version, e.g. 15.
    pub fn major(&self) -> u32 {
        self.version_num / 10_000
    }

    /// The CA certificate that signed the server certificate (clusters built with `ssl()`).
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// A libpq connection string for `user` on `dbname` over TCP.
    pub fn connstr(&self, user: &str, dbname: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user={user} dbname={dbname} sslmode=disable",
            self.port
        )
    }

    /// The superuser connection string for database `postgres`.
    pub fn superuser(&self) -> String {
        self.connstr("postgres", "postgres")
    }

    fn psql_command(&self, dbname: &str, sql: &str) -> Command {
        let mut c = Command::new("psql");
        c.args([
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-A",
            "-t",
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-p",
        ])
        .arg(self.port.to_string())
        .args(["-d", dbname, "-c", sql])
        .stdin(Stdio::null());
        c
    }

    /// Runs SQL with `psql` (a third-party client) as the superuser on
    /// `dbname`; panics on any error. Returns unaligned, tuples-only output.
    pub fn psql_db(&self, dbname: &str, sql: &str) -> String {
        let out = succeeds(&mut self.psql_command(dbname, sql));
        String::from_utf8_lossy(&out.stdout).trim_end().to_owned()
    }

    /// [`Cluster::psql_db`] on database `postgres`.
    pub fn psql(&self, sql: &str) -> String {
        self.psql_db("postgres", sql)
    }

    /// Runs SQL with `psql`, returning its error text when it fails.
    pub fn psql_result(&self, sql: &str) -> Result<String, String> {
        let out = self
            .psql_command("postgres", sql)
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// The single value a query returns.
    pub fn query_scalar(&self, sql: &str) -> String {
        self.psql(sql)
    }

    /// A tokio-postgres client as the superuser on `dbname`.
    pub async fn client(&self, dbname: &str) -> tokio_postgres::Client {
        let (client, conn) =
            tokio_postgres::connect(&self.connstr("postgres", dbname), tokio_postgres::NoTls)
                .await
                .unwrap_or_else(|e| panic!("connect: {e}"));
        tokio::spawn(conn);
        client
    }

    /// An ordered digest of a table's contents in `dbname`: equal digests
    /// mean equal rows (compared in their text form, with the columns
    /// listed in `columns` — `*` for all — sorted by their text). `table`
    /// may carry a `WHERE` clause.
    pub fn table_digest(&self, dbname: &str, table: &str, columns: &str) -> String {
        self.psql_db(dbname, &digest_query(table, columns))
    }

    /// Waits until [`Cluster::table_digest`] is `expected` or `timeout`
    /// passes; returns the last digest.
    pub fn wait_for_digest(
        &self,
        dbname: &str,
        table: &str,
        columns: &str,
        expected: &str,
        timeout: Duration,
    ) -> String {
        self.wait_for_db(dbname, &digest_query(table, columns), expected, timeout)
    }

    /// Waits until `sql` on `dbname` returns `expected` or `timeout` passes; returns the last value.
    pub fn wait_for_db(
        &self,
        dbname: &str,
        sql: &str,
        expected: &str,
        timeout: Duration,
    ) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let value = self.psql_db(dbname, sql);
            if value == expected || Instant::now() > deadline {
                return value;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Rewrites `pg_hba.conf` and reloads the configuration.
    pub fn set_hba(&self, lines: &[&str]) {
        std::fs::write(self.data_dir().join("pg_hba.conf"), lines.join("\n") + "\n")
            .unwrap_or_else(|e| panic!("pg_hba: {e}"));
        self.psql("SELECT pg_reload_conf()");
        // The postmaster rereads the file asynchronously.
        std::thread::sleep(Duration::from_millis(300));
    }

    /// Waits until `sql` returns `expected` or `timeout` passes; returns the last value.
    pub fn wait_for(&self, sql: &str, expected: &str, timeout: Duration) -> String {
        self.wait_for_db("postgres", sql, expected, timeout)
    }

    /// Waits until a walsender is streaming changes (past slot creation and
    /// the initial copy, whose snapshot would otherwise include what a test
    /// writes next); panics after `timeout`.
    pub fn wait_for_streaming(&self, timeout: Duration) {
        let sql = "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'";
        let value = self.wait_for(sql, "1", timeout);
        assert_eq!(value, "1", "no walsender streaming after {timeout:?}");
    }

    /// Restarts the server (fast shutdown: connections are terminated).
    pub fn restart(&self) {
        let mut c = server_command(self.bin_dir.as_deref(), "pg_ctl");
        c.args(["-D"])
            .arg(self.data_dir())
            .args(["-l"])
            .arg(self.log_path())
            .args(["-m", "fast", "-w", "-t", "60", "-o"])
            .arg(format!("-p {}", self.port))
            .arg("restart");
        succeeds(&mut c);
    }

    /// Starts the server again after [`Cluster::stop`], on the same port.
    pub fn start_again(&self) {
        pg_ctl_start(self.bin_dir.as_deref(), self.dir.path(), self.port)
            .unwrap_or_else(|e| panic!("PostgreSQL did not start again: {e}"));
    }

    /// A physical standby of this cluster streaming through physical slot
    /// `slot` (created here), with `settings` added to its configuration.
    /// Made from a copy of the data directory taken while this server is
    /// stopped cleanly (pg_basebackup of the server's own major is not
    /// always at hand), then both are started.
    pub fn standby(&self, slot: &str, settings: &[(&str, &str)]) -> Cluster {
        self.psql(&format!(
            "SELECT pg_create_physical_replication_slot('{slot}', true)"
        ));
        let mut c = server_command(self.bin_dir.as_deref(), "pg_ctl");
        c.args(["-D"])
            .arg(self.data_dir())
            .args(["-m", "fast", "-w", "stop"]);
        succeeds(&mut c);
        let dir = tempfile::Builder::new()
            .prefix("walbridge-pg-standby-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temporary directory: {e}"));
        let sockets = dir.path().join("sockets");
        std::fs::create_dir(&sockets).unwrap_or_else(|e| panic!("mkdir: {e}"));
        // `cp -a` keeps the owner and the modes the server insists on.
        succeeds(
            Command::new("cp")
                .arg("-a")
                .arg(self.data_dir())
                .arg(dir.path().join("data")),
        );
        if is_root() {
            succeeds(
                Command::new("chown")
                    .args([SERVER_OS_USER])
                    .arg(dir.path())
                    .arg(&sockets),
            );
        }
        let mut conf = format!(
            "unix_socket_directories = '{}'\nprimary_conninfo = 'host=127.0.0.1 port={} user=postgres dbname=postgres application_name=standby'\nprimary_slot_name = '{slot}'\nhot_standby_feedback = on\n",
            sockets.display(),
            self.port
        );
        for (name, value) in settings {
            conf.push_str(&format!("{name} = {value}\n"));
        }
        let data = dir.path().join("data");
        append(&data.join("postgresql.conf"), &conf);
        let signal = data.join("standby.signal");
        std::fs::write(&signal, "").unwrap_or_else(|e| panic!("standby.signal: {e}"));
        if is_root() {
            succeeds(Command::new("chown").args([SERVER_OS_USER]).arg(&signal));
        }
        self.start_again();
        let port = free_port();
        pg_ctl_start(self.bin_dir.as_deref(), dir.path(), port)
            .unwrap_or_else(|e| panic!("the standby did not start: {e}"));
        Cluster {
            dir,
            port,
            version_num: self.version_num,
            bin_dir: self.bin_dir.clone(),
        }
    }

    /// Promotes this standby to a primary and waits until it is one.
    pub fn promote(&self) {
        let mut c = server_command(self.bin_dir.as_deref(), "pg_ctl");
        c.args(["-D"]).arg(self.data_dir()).args(["-w", "promote"]);
        succeeds(&mut c);
    }

    /// Stops the server immediately.
    pub fn stop(&self) {
        let mut c = server_command(self.bin_dir.as_deref(), "pg_ctl");
        c.args(["-D"])
            .arg(self.data_dir())
            .args(["-m", "immediate", "-w", "stop"]);
        let _ = c
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The query of [`Cluster::table_digest`].
fn digest_query(table: &str, columns: &str) -> String {
    format!(
        "SELECT count(*) || ':' || coalesce(md5(string_agg(r::text, '|' ORDER BY r::text)), '') FROM (SELECT {columns} FROM {table}) r"
    )
}

fn pg_ctl_start(bin_dir: Option<&Path>, dir: &Path, port: u16) -> Result<(), String> {
    let log = dir.join("server.log");
    let mut c = server_command(bin_dir, "pg_ctl");
    c.args(["-D"])
        .arg(dir.join("data"))
        .args(["-l"])
        .arg(&log)
        .args(["-w", "-t", "60", "-o"])
        .arg(format!("-p {port}"))
        .arg("start");
    let out = c.stdin(Stdio::null()).output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&log).unwrap_or_default()
        ))
    }
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {path:?}: {e}"));
    f.write_all(text.as_bytes())
        .unwrap_or_else(|e| panic!("write {path:?}: {e}"));
}

/// A CA and a server certificate for localhost/127.0.0.1 (see [`tls`]);
/// key and certificate are copied into the data directory.
fn make_certificates(dir: &Path, data: &Path) {
    let server = tls::Authority::new(dir).issue("server", tls::Purpose::Server);
    for (from, file) in [(&server.cert, "server.crt"), (&server.key, "server.key")] {
        std::fs::copy(from, data.join(file)).unwrap_or_else(|e| panic!("copy {file}: {e}"));
    }
    if is_root() {
        let mut c = Command::new("chown");
        c.args([SERVER_OS_USER])
            .arg(data.join("server.crt"))
            .arg(data.join("server.key"));
        succeeds(&mut c);
    }
    std::fs::set_permissions(
        data.join("server.key"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap_or_else(|e| panic!("chmod: {e}"));
}

/// The cargo target directory of this workspace.
pub fn target_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Ok(dir) = std::env::var("CARGO_TARGET_DIR") {
            return PathBuf::from(dir);
        }
        // Test executables live in target/<profile>/deps/.
        std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent()?.parent()?.parent().map(Path::to_path_buf))
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"))
    })
    .clone()
}
