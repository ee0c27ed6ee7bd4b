//! What `deploy/` ships, checked by the tools its users run: the
//! Kubernetes base rendered by kustomize and validated against
//! Kubernetes' schemas, the alert rules and their unit tests by promtool,
//! the dashboard's and the alerts' queries against what `/metrics`
//! exports — and the binary run the way the image runs it: as a non-root
//! user, with nothing writable but `data_dir`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use walbridge_tests::Cluster;
use walbridge_tests::admin::{get, metrics, value};
use walbridge_tests::walbridge::Deployment;

const WAIT: Duration = Duration::from_secs(90);

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// Runs `command`, which must succeed; returns what it printed.
fn succeeds(command: &mut Command) -> String {
    walbridge_tests::printed(&walbridge_tests::succeeds(command))
}

/// `kubectl kustomize DIR`, or `kustomize build DIR` where there is no
/// kubectl (scripts/machine.sh builds kustomize then).
fn kustomize(dir: &Path) -> String {
    let on_path = |program: &str| {
        Command::new(program)
            .args(["version", "--client"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok()
    };
    let mut command = if on_path("kubectl") {
        let mut c = Command::new("kubectl");
        c.arg("kustomize");
        c
    } else {
        let gopath = succeeds(Command::new("go").args(["env", "GOPATH"]));
        let built = Path::new(gopath.trim()).join("bin/kustomize");
        let mut c = Command::new(if on_path("kustomize") {
            PathBuf::from("kustomize")
        } else {
            built
        });
        c.arg("build");
        c
    };
    let out = command
        .arg(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run kustomize (scripts/test.sh installs it): {e}"));
    assert!(
        out.status.success(),
        "kustomize: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_kubernetes_base_renders_and_passes_the_kubernetes_schemas() {
    let rendered = kustomize(&deploy_dir().join("kubernetes"));
    let file = tempfile::NamedTempFile::new().unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(file.path(), &rendered).unwrap_or_else(|e| panic!("{e}"));
    let validator = walbridge_tests::kafka::python()
        .parent()
        .map(|bin| bin.join("kubernetes-validate"))
        .unwrap_or_default();
    let said = succeeds(Command::new(&validator).arg("--strict").arg(file.path()));
    for kind in [
        "configmap/walbridge-config",
        "secret/walbridge-passwords",
        "service/walbridge",
        "statefulset/walbridge",
    ] {
        assert!(
            said.contains(&format!("passed for resource {kind}")),
            "{said}"
        );
    }
    // What the base promises, as rendered.
    for expected in [
        "kind: StatefulSet",
        "replicas: 1",
        "runAsNonRoot: true",
        "runAsUser: 10001",
        "readOnlyRootFilesystem: true",
        "allowPrivilegeEscalation: false",
        "path: /healthz",
        "path: /readyz",
        "mountPath: /var/lib/walbridge",
        "mountPath: /etc/walbridge",
        "- ReadWriteOnce",
        "name: walbridge-passwords-",
        "password=${WALBRIDGE_PASSWORD}",
        "token = \"${WALBRIDGE_ADMIN_TOKEN}\"",
        "value: 0.0.0.0:9187",
        "port: 9187",
    ] {
        assert!(rendered.contains(expected), "{expected} not in\n{rendered}");
    }
    // The configuration it ships is one walbridge reads: `check` gets as
    // far as the database hosts, which do not exist here.
    let shipped = std::fs::read_to_string(deploy_dir().join("kubernetes/walbridge.toml"))
        .unwrap_or_else(|e| panic!("{e}"));
    let wb = Deployment::new();
    let data = wb.path().join("data").display().to_string();
    wb.write_config(&shipped.replace("/var/lib/walbridge", &data));
    let out = wb.command_with_env(
        &["check"],
        &[
            ("WALBRIDGE_PASSWORD", "p"),
            ("REPLICA_PASSWORD", "p"),
            ("WALBRIDGE_ADMIN_TOKEN", "t"),
        ],
    );
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{said}");
    assert!(
        said.contains("source `app`: cannot connect to publisher.databases.svc:5432/app")
            && said.contains("sink `replica`: cannot connect to the target replica.databases.svc")
            && said.contains("2 prerequisite check(s) failed"),
        "{said}"
    );
}

#[test]
fn the_alert_rules_pass_promtool_and_their_unit_tests() {
    let dir = deploy_dir().join("prometheus");
    let said = succeeds(
        Command::new("promtool")
            .arg("check")
            .arg("rules")
            .arg(dir.join("alerts.yml")),
    );
    assert!(said.contains("SUCCESS: 11 rules found"), "{said}");
    let said = succeeds(
        Command::new("promtool")
            .arg("test")
            .arg("rules")
            .arg(dir.join("alerts_test.yml")),
    );
    assert!(said.contains("SUCCESS"), "{said}");
    // The scrape configuration, beside a token file as it expects one.
    let copy = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    for file in ["scrape.yml", "alerts.yml"] {
        std::fs::copy(dir.join(file), copy.path().join(file)).unwrap_or_else(|e| panic!("{e}"));
    }
    std::fs::write(copy.path().join("walbridge-admin-token"), "t\n")
        .unwrap_or_else(|e| panic!("{e}"));
    let said = succeeds(
        Command::new("promtool")
            .args(["check", "config"])
            .arg(copy.path().join("scrape.yml")),
    );
    assert!(said.contains("SUCCESS: 11 rules found"), "{said}");
}

/// The metric names a PromQL text uses (walbridge's and the process's).
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for prefix in ["walbridge_", "process_"] {
        let mut rest = text;
        while let Some(at) = rest.find(prefix) {
            let name: String = rest[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest = &rest[at + name.len()..];
            names.insert(name);
        }
    }
    names
}

#[test]
fn the_dashboard_and_the_alerts_name_only_metrics_walbridge_exports() {
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(deploy_dir().join("grafana/walbridge.json"))
            .unwrap_or_else(|e| panic!("{e}")),
    )
    .unwrap_or_else(|e| panic!("the dashboard is not JSON: {e}"));
    let mut queries = String::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            queries.push_str(target["expr"].as_str().unwrap_or_default());
            queries.push('\n');
        }
    }
    let rules = std::fs::read_to_string(deploy_dir().join("prometheus/alerts.yml"))
        .unwrap_or_else(|e| panic!("{e}"));
    let exprs: String = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr:"))
        .collect::<Vec<_>>()
        .join("\n");
    let used: BTreeSet<String> = metric_names(&queries)
        .into_iter()
        .chain(metric_names(&exprs))
        .collect();
    assert!(used.len() > 20, "{used:?}");

    // A walbridge exporting everything: a copy done, a slot with a WAL
    // limit, a log with a max_size, a sink of every kind.
    let pg = Cluster::start();
    pg.psql("ALTER SYSTEM SET max_slot_wal_keep_size = '1GB'");
    let ddl = "CREATE TABLE t (id int PRIMARY KEY)";
    pg.psql(&format!(
        "SELECT pg_reload_conf();
         {ddl}; INSERT INTO t VALUES (1), (2);
         CREATE PUBLICATION pub FOR TABLE t;"
    ));
    let target = Cluster::start();
    target.psql(ddl);
    let broker = walbridge_tests::kafka::Broker::start();
    let wb = Deployment::new();
    wb.configure(&pg, "postgres", "pub", "");
    let mut config = std::fs::read_to_string(wb.config_path()).unwrap_or_default();
    config.push_str(&format!(
        "\n[[sink]]\nname = \"replica\"\ntype = \"postgres\"\nconnection = \"{}\"\n\n\
         [[sink]]\nname = \"events\"\ntype = \"kafka\"\nbrokers = \"{}\"\n\n\
         [log]\nmax_size = \"256MiB\"\n",
        target.superuser(),
        broker.bootstrap()
    ));
    wb.write_config(&config);
    let running = wb.start();
    let admin = wb.admin_address(WAIT);
    pg.wait_for_streaming(WAIT);
    pg.psql("INSERT INTO t VALUES (3)");
    let deadline = Instant::now() + WAIT;
    let exported: BTreeSet<String> = loop {
        let samples = metrics(&admin);
        let polled = value(
            &samples,
            "walbridge_slot_safe_wal_size_bytes",
            &[("source", "src")],
        );
        let delivered = ["out", "replica", "events"].iter().all(|sink| {
            value(
                &samples,
                "walbridge_sink_lag_records",
                &[("sink", sink), ("source", "src")],
            ) == Some(0.0)
        });
        if polled.is_some() && delivered {
            break samples.into_iter().map(|s| s.name).collect();
        }
        assert!(Instant::now() < deadline, "{samples:#?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let missing: Vec<&String> = used.iter().filter(|n| !exported.contains(*n)).collect();
    assert!(
        missing.is_empty(),
        "deploy/ queries metrics /metrics does not export: {missing:?}\nexported: {exported:?}"
    );
    assert!(running.stop(WAIT).success(), "{}", wb.log());
}

/// The user the image runs as (deploy/Dockerfile, deploy/kubernetes).
const IMAGE_UID: &str = "10001";

#[test]
fn it_runs_as_the_image_runs_it_non_root_with_only_data_dir_writable() {
    assert!(
        unsafe { libc::geteuid() } == 0,
        "this test makes a mount namespace with a read-only root and drops to uid {IMAGE_UID}: run it as root (scripts/test.sh does on the project's machines)"
    );
    let pg = Cluster::start();
    pg.psql(
        "CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1), (2);
         CREATE PUBLICATION pub FOR TABLE t;",
    );
    let wb = Deployment::new();
    let data = wb.path().join("data");
    let out = data.join("out.jsonl");
    wb.write_config(&format!(
        "data_dir = \"{}\"\n\n[[source]]\nname = \"src\"\nconnection = \"{}\"\npublications = [\"pub\"]\n\n\
         [[sink]]\nname = \"out\"\ntype = \"jsonl\"\npath = \"{}\"\n",
        data.display(),
        pg.connstr("postgres", "postgres"),
        out.display()
    ));
    std::fs::create_dir_all(&data).unwrap_or_else(|e| panic!("{e}"));
    succeeds(
        Command::new("chown")
            .arg(format!("{IMAGE_UID}:{IMAGE_UID}"))
            .arg(&data),
    );
    // The deployment's directory is root's (0700 as made): let the user in.
    succeeds(Command::new("chmod").arg("755").arg(wb.path()));

    // As readOnlyRootFilesystem does: everything read-only but data_dir;
    // the wrapper refuses to go on if the user could write elsewhere.
    let confine = format!(
        "set -e
         mount --bind -o ro / /
         mount -o remount,bind,ro /
         for m in $(awk '$4 ~ /^rw/ && $2 != \"/\" && $2 !~ \"^/(proc|sys|dev)\" {{print $2}}' /proc/self/mounts); do
           mount -o remount,bind,ro \"$m\" 2>/dev/null || true
         done
         mount --bind \"$DATA\" \"$DATA\"
         mount -o remount,bind,rw \"$DATA\"
         as_user() {{ setpriv --reuid={IMAGE_UID} --regid={IMAGE_UID} --clear-groups \"$@\"; }}
         for place in /tmp /var/tmp \"$(dirname \"$DATA\")\" \"$HOME\"; do
           if as_user touch \"$place/walbridge-writable\" 2>/dev/null; then
             echo \"not confined: $place is writable\" >&2; exit 99
           fi
         done
         exec setpriv --reuid={IMAGE_UID} --regid={IMAGE_UID} --clear-groups \"$@\""
    );
    let data_text = data.display().to_string();
    let running = wb.start_wrapped(
        &[
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            &confine,
            "confine",
        ],
        &[
            ("DATA", &data_text),
            ("HOME", "/nonexistent"),
            ("WALBRIDGE_LOG_FORMAT", "json"),
        ],
    );
    let admin = wb.admin_address(WAIT);
    pg.wait_for_streaming(WAIT);
    pg.psql("INSERT INTO t VALUES (3)");
    let deadline = Instant::now() + WAIT;
    loop {
        let lines = std::fs::read_to_string(&out).unwrap_or_default();
        if lines.lines().count() >= 3 {
            break;
        }
        assert!(Instant::now() < deadline, "{lines}\n{}", wb.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(get(&admin, "/readyz"), (200, "ready\n".to_owned()));
    // It runs as the image's user, and what it made is that user's.
    let status = std::fs::read_to_string(format!("/proc/{}/status", running.pid()))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some(IMAGE_UID)),
        "{status}"
    );
    assert!(!wb.log().contains("\"level\":\"ERROR\""), "{}", wb.log());
    assert!(running.stop(WAIT).success(), "{}", wb.log());
}
