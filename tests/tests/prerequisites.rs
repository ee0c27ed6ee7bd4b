//! Each prerequisite failure gives one actionable line and a non-zero exit,
//! from `walbridge check` and from `walbridge run`.

use std::process::Output;
use std::time::Duration;

use walbridge_tests::Cluster;
use walbridge_tests::walbridge::Deployment;

const WAIT: Duration = Duration::from_secs(60);

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn published(pg: &Cluster) {
    pg.psql("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t");
}

/// `check` fails with exit status 3 and a message containing `needle`; so does `run`.
fn assert_check_fails(wb: &Deployment, needle: &str) {
    let out = wb.command(&["check"]);
    assert_eq!(out.status.code(), Some(3), "check: {}", stderr(&out));
    assert!(
        stderr(&out).contains(needle),
        "check output lacks `{needle}`:\n{}",
        stderr(&out)
    );
    let out = wb.command(&["run"]);
    assert_eq!(out.status.code(), Some(3), "run: {}", stderr(&out));
    let last = stderr(&out).lines().last().unwrap_or_default().to_owned();
    assert!(
        last.starts_with("walbridge: ") && last.contains(needle),
        "run's last line: {last}"
    );
}

#[test]
fn wal_level_must_be_logical() {
    let pg = Cluster::builder().setting("wal_level", "replica").start();
    published(&pg);
    let wb = Deployment::new();
    wb.configure(&pg, "postgres", "pub", "");
    assert_check_fails(&wb, "wal_level is `replica`");
}

#[test]
fn publication_must_exist() {
    let pg = Cluster::start();
    let wb = Deployment::new();
    wb.configure(&pg, "postgres", "nopub", "");
    assert_check_fails(&wb, "publication \"nopub\" does not exist");
}

#[test]
fn role_needs_replication_and_select() {
    let pg = Cluster::start();
    published(&pg);
    pg.psql("CREATE ROLE plain LOGIN; GRANT SELECT ON t TO plain");
    pg.psql("CREATE ROLE blind LOGIN REPLICATION");
    let wb = Deployment::new();
    wb.configure_connection(&pg.connstr("plain", "postgres"), "pub", "");
    assert_check_fails(&wb, "lacks the REPLICATION attribute");
    wb.configure_connection(&pg.connstr("blind", "postgres"), "pub", "");
    assert_check_fails(&wb, "may not read published table public.t");
}

#[test]
fn slot_in_use_and_missing_slot() {
    let pg = Cluster::start();
    published(&pg);
    let first = Deployment::new();
    first.configure(&pg, "postgres", "pub", "");
    let running = first.start();
    // Streaming, not just created: the slot is released between its
    // creation and START_REPLICATION, during the copy.
    pg.wait_for_streaming(WAIT);
    let second = Deployment::new();
    second.configure(&pg, "postgres", "pub", "copy_data = false");
    assert_check_fails(&second, "is in use by process");
    drop(running);

    let third = Deployment::new();
    third.configure(
        &pg,
        "postgres",
        "pub",
        "slot = \"absent\"\ncreate_slot = false\ncopy_data = false",
    );
    assert_check_fails(&third, "slot \"absent\" does not exist");
}

#[test]
fn invalidated_slot_is_reported() {
    let pg = Cluster::builder()
        .setting("max_slot_wal_keep_size", "'1MB'")
        .setting("wal_keep_size", "0")
        .start();
    published(&pg);
    let wb = Deployment::new();
    wb.configure(&pg, "postgres", "pub", "");
    let running = wb.start();
    // Streaming, not just created: the slot is released between its
    // creation and START_REPLICATION, during the copy.
    pg.wait_for_streaming(WAIT);
    assert!(running.stop(WAIT).success());
    for _ in 0..20 {
        pg.psql("CREATE TABLE IF NOT EXISTS filler (pad text); INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 20000)");
        pg.psql("SELECT pg_switch_wal()");
        pg.psql("CHECKPOINT");
        if pg.psql("SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'walbridge_src'")
            == "lost"
        {
            break;
        }
    }
    assert_eq!(
        pg.psql("SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'walbridge_src'"),
        "lost"
    );
    // The cause as the server says it (PostgreSQL 17+), else as wal_status does.
    let cause = if pg.version_num() >= 170_000 {
        "was invalidated (invalidation_reason = wal_removed): the server removed WAL it still needed, as max_slot_wal_keep_size allows"
    } else {
        "was invalidated (wal_status = lost): the server removed WAL it still needed, as max_slot_wal_keep_size allows"
    };
    assert_check_fails(&wb, cause);
    assert_check_fails(&wb, "run `walbridge drop --source src` and start walbridge");
}

#[test]
fn out_of_replication_slots_and_wal_senders() {
    let pg = Cluster::builder()
        .setting("max_replication_slots", "1")
        .setting("max_wal_senders", "1")
        .start();
    published(&pg);
    pg.psql("SELECT pg_create_logical_replication_slot('other', 'pgoutput')");
    let wb = Deployment::new();
    wb.configure(&pg, "postgres", "pub", "");
    assert_check_fails(&wb, "no free replication slot");

    pg.psql("SELECT pg_drop_replication_slot('other')");
    let running = wb.start();
    pg.wait_for_streaming(WAIT);
    let second = Deployment::new();
    second.configure(&pg, "postgres", "pub", "slot = \"second\"");
    assert_check_fails(&second, "max_wal_senders");
    drop(running);
}

#[test]
fn missing_replica_identity_is_a_warning() {
    let pg = Cluster::start();
    pg.psql("CREATE TABLE nokey (v int); CREATE PUBLICATION pub FOR TABLE nokey");
    let wb = Deployment::new();
    wb.configure(&pg, "postgres", "pub", "");
    let out = wb.command(&["check"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("warning: source `src`: table public.nokey has no replica identity"),
        "{}",
        stderr(&out)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok: source `src` is ready"));
}

#[test]
fn configuration_errors_name_the_key() {
    let pg = Cluster::start();
    let wb = Deployment::new();
    wb.configure(&pg, "postgres", "pub", "snapshot_wrokers = 3");
    let out = wb.command(&["check"]);
    assert_eq!(out.status.code(), Some(2));
    // The parser's message as it wrote it (the line, a caret under the
    // key), then one line that sums it up.
    let err = stderr(&out);
    assert!(err.contains("| snapshot_wrokers = 3"), "{err}");
    assert!(
        err.lines()
            .any(|l| l.trim_start().starts_with("| ") && l.contains('^')),
        "{err}"
    );
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("walbridge: configuration file ") && last.ends_with("(details above)"),
        "{err}"
    );

    wb.configure_connection("host=127.0.0.1 port=1 sslmode=sometimes", "pub", "");
    let out = wb.command(&["check"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("sslmode"), "{}", stderr(&out));
}

#[test]
fn a_password_with_a_space_is_never_echoed() {
    let pg = Cluster::start();
    let wb = Deployment::new();
    wb.configure_connection(
        &format!("host=127.0.0.1 port={} password=pa55 w0rd", pg.port()),
        "pub",
        "",
    );
    for command in ["check", "run"] {
        let out = wb.command(&[command]);
        assert_eq!(out.status.code(), Some(2), "{command}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            !err.contains("pa55") && !err.contains("w0rd"),
            "{command}: {err}"
        );
        assert!(err.contains("password='…'"), "{command}: {err}");
    }
}

#[test]
fn check_and_run_report_a_data_dir_they_cannot_write() {
    let pg = Cluster::start();
    published(&pg);
    let wb = Deployment::new();
    let _read_only = walbridge_tests::disk::Tmpfs::mount(&wb.path().join("data"), "1m", true);
    wb.configure(&pg, "postgres", "pub", "");
    assert_check_fails(&wb, "Read-only file system");
    let out = wb.command(&["check"]);
    assert!(
        stderr(&out).contains("make it writable by the user walbridge runs as"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn check_and_run_report_a_jsonl_path_in_a_missing_directory() {
    let pg = Cluster::start();
    published(&pg);
    let wb = Deployment::new();
    let missing = wb.path().join("no/such/dir/out.jsonl");
    wb.configure_sinks(
        &pg.superuser(),
        &["pub"],
        "",
        &format!(
            "[[sink]]\nname = \"out\"\ntype = \"jsonl\"\npath = \"{}\"\n",
            missing.display()
        ),
    );
    assert_check_fails(&wb, "does not exist: create it (mkdir -p");
}

#[test]
fn failover_needs_postgres_17_and_a_host_that_is_what_is_asked() {
    let old = Cluster::builder().version(14).start();
    published(&old);
    let wb = Deployment::new();
    wb.configure(&old, "postgres", "pub", "failover = true");
    assert_check_fails(&wb, "failover needs PostgreSQL 17 or newer");
    // Every host answers, none is what is asked: said (and `run` waits
    // for one, as during a failover).
    wb.configure_connection(
        &format!(
            "{} target_session_attrs=standby",
            old.connstr("postgres", "postgres")
        ),
        "pub",
        "",
    );
    let check = wb.command(&["check"]);
    let said = walbridge_tests::printed(&check);
    assert!(
        !check.status.success()
            && said.contains(&format!(
                "error: source `src`: none of 127.0.0.1:{} is standby (target_session_attrs = standby)",
                old.port()
            )),
        "{said}"
    );
}
