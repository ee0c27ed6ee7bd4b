//! What a careless operator or an unlucky machine does to a running
//! walbridge: a second instance on the same `data_dir`, a full disk, a log
//! that cannot be written, a publisher that is down at start. Each ends
//! with nothing lost or duplicated, the exit status the README's table
//! gives, and a message that says what to do.

use std::time::Duration;

use walbridge_tests::Cluster;
use walbridge_tests::disk::Tmpfs;
use walbridge_tests::walbridge::{Deployment, ids_with_op};

const WAIT: Duration = Duration::from_secs(120);

fn publish(pg: &Cluster) {
    pg.psql("CREATE TABLE t (id int PRIMARY KEY, pad text); CREATE PUBLICATION pub FOR TABLE t");
}

/// Inserts rows `from..=to` with `pad` bytes each, `per_transaction` rows at a time.
fn insert(pg: &Cluster, (from, to): (i64, i64), pad: usize, per_transaction: i64) {
    let mut start = from;
    while start <= to {
        let end = (start + per_transaction - 1).min(to);
        pg.psql(&format!(
            "INSERT INTO t SELECT g, repeat('x', {pad}) FROM generate_series({start}, {end}) g"
        ));
        start = end + 1;
    }
}

/// Waits for `n` output lines, lets anything trailing arrive, and checks
/// that they are the inserts of rows `1..=n`, each once, in order.
fn assert_inserted_once(wb: &Deployment, n: i64) {
    wb.wait_for_lines(n as usize, WAIT);
    std::thread::sleep(Duration::from_secs(1));
    let lines = wb.lines();
    assert_eq!(
        ids_with_op(&lines, "c"),
        (1..=n).collect::<Vec<_>>(),
        "log:\n{}",
        wb.log()
    );
    assert_eq!(lines.len() as i64, n, "log:\n{}", wb.log());
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The last line a command printed on stderr.
fn last_line(out: &std::process::Output) -> String {
    stderr(out).lines().last().unwrap_or_default().to_owned()
}

#[test]
fn a_second_instance_on_the_same_data_dir_is_refused_and_the_first_goes_on() {
    let pg = Cluster::start();
    publish(&pg);
    let wb = Deployment::new();
    wb.configure(
        &pg,
        "postgres",
        "pub",
        "copy_data = false\nstatus_interval = 1",
    );
    let first = wb.start();
    pg.wait_for_streaming(WAIT);
    insert(&pg, (1, 1000), 10, 100);
    wb.wait_for_lines(1000, WAIT);

    // The publisher goes away for a while: the first instance waits to
    // reconnect, holding no slot, while a second one is started.
    pg.stop();
    wb.wait_for_log("retrying in", WAIT);
    std::thread::sleep(Duration::from_secs(2));
    let holder = format!("in use by another walbridge process (pid {})", first.pid());
    for command in ["run", "drop"] {
        let out = wb.command(&[command]);
        assert_eq!(out.status.code(), Some(3), "{command}: {}", stderr(&out));
        let last = last_line(&out);
        assert!(
            last.starts_with("walbridge: ") && last.contains(&holder),
            "{command}: {last}"
        );
    }
    pg.start_again();
    insert(&pg, (1001, 2000), 10, 100);
    assert_inserted_once(&wb, 2000);

    // Read-only commands still work beside the running instance.
    let out = wb.command(&["check"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("(pid {})", first.pid())),
        "check names the running instance: {}",
        String::from_utf8_lossy(&out.stdout)
    );

    // The connection streamed again, so the next outage starts the backoff over.
    let seen = wb.log().len();
    pg.stop();
    let after = wb.wait_for_log_after(seen, "retrying in", WAIT);
    let first_retry = after
        .lines()
        .find(|l| l.contains("retrying in"))
        .unwrap_or_default();
    assert!(first_retry.contains("retrying in 500ms"), "{first_retry}");
    pg.start_again();
    insert(&pg, (2001, 2100), 10, 100);
    assert_inserted_once(&wb, 2100);
    let status = first.stop(WAIT);
    assert_eq!(status.code(), Some(0), "log:\n{}", wb.log());
}

#[test]
fn a_full_disk_pauses_reading_from_the_publisher_until_there_is_room() {
    let pg = Cluster::start();
    publish(&pg);
    let wb = Deployment::new();
    // data_dir (the log, the cursors) on a small file system; the output beside it.
    let disk = Tmpfs::mount(&wb.path().join("data"), "3m", false);
    wb.configure(
        &pg,
        "postgres",
        "pub",
        "copy_data = false\nstatus_interval = 1",
    );
    // Zeros made ahead cannot fit either (a spare is 4 MiB, asked for
    // once a segment has been written to for half a second at a rate that
    // fills it within an hour: 20 kB at first is far more than that asks
    // for, however slow the machine): the log goes on without them.
    let config = std::fs::read_to_string(wb.config_path()).unwrap_or_default();
    wb.write_config(&format!(
        "{config}\n[log]\npreallocate = true\nsegment_size = \"4MiB\"\n"
    ));
    let running = wb.start();
    pg.wait_for_streaming(WAIT);
    insert(&pg, (1, 20), 1000, 20);
    wb.wait_for_lines(20, WAIT);
    std::thread::sleep(Duration::from_millis(600));
    insert(&pg, (21, 21), 1000, 1);
    wb.wait_for_log("cannot preallocate the log's next segment", WAIT);
    // About 6 MB of changes: twice what the file system holds.
    insert(&pg, (22, 6000), 1000, 500);
    wb.wait_for_log("the file system holding the log is full", WAIT);
    // What is not in the log is not confirmed: the publisher keeps it.
    let behind = pg.query_scalar(
        "SELECT confirmed_flush_lsn < pg_current_wal_lsn() FROM pg_replication_slots",
    );
    assert_eq!(behind, "t");

    disk.resize("64m");
    assert_inserted_once(&wb, 6000);
    let log = wb.wait_for_log("the disk has room again", WAIT);
    assert!(
        log.contains(
            "Free space there, or keep the log below the space there is with [log] max_size"
        ),
        "the warning says what to do:\n{log}"
    );
    let status = running.stop(WAIT);
    assert_eq!(status.code(), Some(0), "log:\n{}", wb.log());
}

/// A directory no one may change, root included (`chattr +i`), until dropped.
struct Immutable(std::path::PathBuf);

impl Immutable {
    fn new(dir: &std::path::Path) -> Immutable {
        let status = std::process::Command::new("chattr")
            .arg("+i")
            .arg(dir)
            .status()
            .unwrap_or_else(|e| panic!("chattr: {e}"));
        assert!(status.success(), "chattr +i {}", dir.display());
        Immutable(dir.to_owned())
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = std::process::Command::new("chattr")
            .arg("-i")
            .arg(&self.0)
            .status();
    }
}

#[test]
fn a_log_that_cannot_be_written_stops_walbridge_at_once() {
    let pg = Cluster::start();
    publish(&pg);
    let wb = Deployment::new();
    wb.configure(&pg, "postgres", "pub", "copy_data = false");
    let config = std::fs::read_to_string(wb.config_path()).unwrap_or_default();
    wb.write_config(&format!("{config}\n[log]\nsegment_size = \"64kB\"\n"));
    let mut running = wb.start();
    pg.wait_for_streaming(WAIT);
    // More than a segment: the next record starts a new segment file.
    insert(&pg, (1, 100), 1000, 100);
    wb.wait_for_lines(100, WAIT);
    // ... which cannot be created: the log fails, for a reason other than a full disk.
    let frozen = Immutable::new(&wb.path().join("data/sources/src/log"));
    // One change, then a quiet database: walbridge must not wait for the
    // next change to learn that its log is broken.
    insert(&pg, (101, 101), 10, 1);
    let deadline = std::time::Instant::now() + WAIT;
    while running.is_running() {
        assert!(
            std::time::Instant::now() < deadline,
            "walbridge went on with a broken log:\n{}",
            wb.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = running.wait(WAIT);
    assert_eq!(status.code(), Some(1), "log:\n{}", wb.log());
    let log = wb.log();
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("walbridge: ")
            && last.contains("cannot create")
            && last.contains("Operation not permitted"),
        "{last}"
    );
    drop(frozen);
    // The change that did not reach the log was not confirmed: it comes again, once.
    let running = wb.start();
    assert_inserted_once(&wb, 101);
    assert_eq!(running.stop(WAIT).code(), Some(0), "log:\n{}", wb.log());
}

#[test]
fn an_unreachable_publisher_is_waited_for_at_start_as_mid_stream() {
    let pg = Cluster::start();
    publish(&pg);
    let wb = Deployment::new();
    wb.configure(&pg, "postgres", "pub", "copy_data = false");
    // The test clusters commit asynchronously: make the publication survive an immediate stop.
    pg.psql("CHECKPOINT");
    pg.stop();
    let running = wb.start();
    let log = wb.wait_for_log("retrying in", WAIT);
    let line = log
        .lines()
        .find(|l| l.contains("retrying in"))
        .unwrap_or_default();
    // One cause, said once, and what to check.
    assert_eq!(line.matches("Connection refused").count(), 1, "{line}");
    assert!(
        line.contains("is the server running") && line.contains("`connection`"),
        "{line}"
    );
    pg.start_again();
    let streaming = pg.wait_for(
        "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'",
        "1",
        WAIT,
    );
    assert_eq!(streaming, "1", "log:\n{}", wb.log());
    insert(&pg, (1, 10), 10, 10);
    assert_inserted_once(&wb, 10);
    assert_eq!(running.stop(WAIT).code(), Some(0), "log:\n{}", wb.log());
}

#[test]
fn a_password_refused_mid_stream_exits_as_at_start() {
    let pg = Cluster::builder()
        .hba(&[
            "local all all trust",
            "host all postgres 127.0.0.1/32 trust",
            "host all all 127.0.0.1/32 scram-sha-256",
            "host replication all 127.0.0.1/32 scram-sha-256",
        ])
        .start();
    publish(&pg);
    pg.psql("CREATE ROLE shipper LOGIN REPLICATION PASSWORD 'right'; GRANT SELECT ON t TO shipper");
    let wb = Deployment::new();
    let connection = |password: &str| {
        format!(
            "host=127.0.0.1 port={} dbname=postgres user=shipper password={password}",
            pg.port()
        )
    };
    wb.configure_connection(&connection("wrong"), "pub", "copy_data = false");
    let out = wb.command(&["run"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let at_start = last_line(&out);
    assert!(
        at_start.contains("password authentication failed"),
        "{at_start}"
    );

    wb.configure_connection(&connection("right"), "pub", "copy_data = false");
    let mut running = wb.start();
    pg.wait_for_streaming(WAIT);
    // The password changes on the server; the next reconnect is refused.
    pg.psql(
        "ALTER ROLE shipper PASSWORD 'changed';
         SELECT pg_terminate_backend(pid) FROM pg_stat_replication",
    );
    let status = running.wait(WAIT);
    assert_eq!(status.code(), Some(3), "log:\n{}", wb.log());
    let log = wb.log();
    let mid_stream = log.lines().last().unwrap_or_default();
    assert!(
        mid_stream.starts_with("walbridge: ")
            && mid_stream.contains("password authentication failed")
            && mid_stream.contains("check the password in `connection`"),
        "{mid_stream}"
    );
}

#[test]
fn stopping_while_a_sink_retries_is_a_clean_stop() {
    let pg = Cluster::start();
    publish(&pg);
    let target = Cluster::start();
    target.psql("CREATE TABLE t (id int PRIMARY KEY, pad text)");
    let wb = Deployment::new();
    wb.configure_sinks(
        &pg.superuser(),
        &["pub"],
        "copy_data = false",
        &format!(
            "[[sink]]\nname = \"replica\"\ntype = \"postgres\"\nconnection = \"{}\"\n",
            target.superuser()
        ),
    );
    let running = wb.start();
    pg.wait_for_streaming(WAIT);
    insert(&pg, (1, 10), 10, 10);
    target.wait_for("SELECT count(*) FROM t", "10", WAIT);
    target.stop();
    insert(&pg, (11, 20), 10, 10);
    wb.wait_for_log("retrying in", WAIT);
    let status = running.stop(WAIT);
    assert_eq!(status.code(), Some(0), "log:\n{}", wb.log());
    let log = wb.log();
    let last = log.lines().last().unwrap_or_default();
    assert!(!last.starts_with("walbridge: "), "{last}");
    assert!(log.contains("stopping while the sink retries"), "{log}");
    // Nothing is lost: the next run applies the rest.
    target.start_again();
    let running = wb.start();
    target.wait_for("SELECT count(*) FROM t", "20", WAIT);
    assert_eq!(running.stop(WAIT).code(), Some(0), "log:\n{}", wb.log());
}

#[test]
fn long_work_says_how_far_it_has_come() {
    let pg = Cluster::start();
    publish(&pg);
    pg.psql("INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1, 100000) g");
    let wb = Deployment::new();
    let late = wb.path().join("late.jsonl");
    let configure = |late_sink: bool| {
        wb.configure(&pg, "postgres", "pub", "");
        let config = std::fs::read_to_string(wb.config_path()).unwrap_or_default();
        let extra = if late_sink {
            format!(
                "\n[[sink]]\nname = \"late\"\ntype = \"jsonl\"\npath = \"{}\"\n",
                late.display()
            )
        } else {
            String::new()
        };
        // One segment for everything: with a spare made ahead (the 20,000
        // transactions below can take longer than the 8 s that asks for
        // one on a busy machine) the log would move to it, and retention
        // would drop the first segment, the copy the late sink reads.
        wb.write_config(&format!(
            "progress_interval = \"1ms\"\n{config}{extra}\n[log]\npreallocate = false\n"
        ));
    };
    configure(false);
    let running = wb.start();
    wb.wait_for_lines(100_000, WAIT);
    // The copy of the table said how far it had come before it finished.
    let log = wb.log();
    let copying = log.find("copying table: ");
    let finished = log.find("snapshot of table finished");
    assert!(
        copying.is_some() && copying < finished,
        "no progress before the end of the copy:\n{log}"
    );
    assert!(
        log.contains("copying table: ") && log.contains("table=\"public\".\"t\""),
        "{log}"
    );
    // 20,000 transactions more, then a new sink that starts with all of
    // the log to read: it says it is catching up.
    pg.psql(
        "DO $$ BEGIN FOR i IN 100001..120000 LOOP INSERT INTO t VALUES (i, 'y'); COMMIT; END LOOP; END $$",
    );
    wb.wait_for_lines(120_000, WAIT);
    assert_eq!(running.stop(WAIT).code(), Some(0), "log:\n{}", wb.log());
    configure(true);
    let running = wb.start();
    // (`out` may have said so too, while the 20,000 went by.)
    let log = wb.wait_for_log("to go sink=late", WAIT);
    let line = log
        .lines()
        .find(|l| l.contains("sink=late"))
        .unwrap_or_default();
    assert!(line.contains("catching up: at record"), "{line}");
    let deadline = std::time::Instant::now() + WAIT;
    while std::fs::read_to_string(&late).map_or(0, |t| t.lines().count()) < 120_000 {
        assert!(std::time::Instant::now() < deadline, "log:\n{}", wb.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(running.stop(WAIT).code(), Some(0), "log:\n{}", wb.log());
}

/// The text of `transcript` as drawn piece by piece: escape sequences
/// (colours, cursor moves, line clearing) left out, split where the cursor
/// went back to the start of a line (`\r`) or down to a new one.
fn drawn_pieces(transcript: &str) -> Vec<String> {
    let mut plain = String::new();
    let mut chars = transcript.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters, ended by a letter.
            if chars.next_if_eq(&'[').is_some() {
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        plain.push(c);
    }
    plain
        .split(['\r', '\n'])
        .filter(|piece| !piece.trim().is_empty())
        .map(str::to_owned)
        .collect()
}

/// Copies `rows` rows of `t` into a paused jsonl sink writing to a file,
/// or to standard output (`to_stdout`), with `progress_interval = "1ms"`
/// (off a terminal that logs many progress lines), with walbridge in a
/// pseudo-terminal; returns what it drew there, from its start to a clean
/// stop after the copy.
fn copy_in_a_terminal(rows: u32, to_stdout: bool) -> String {
    let pg = Cluster::start();
    publish(&pg);
    pg.psql(&format!(
        "INSERT INTO t SELECT g, 'row ' || g FROM generate_series(1, {rows}) g; ANALYZE t"
    ));
    let wb = Deployment::new();
    wb.configure(&pg, "postgres", "pub", "");
    let mut config = std::fs::read_to_string(wb.config_path()).unwrap_or_default();
    if to_stdout {
        config = config.replace(&wb.output_path().display().to_string(), "-");
    }
    wb.write_config(&format!("progress_interval = \"1ms\"\n{config}"));
    // The sink waits: what is drawn is the copy into the log alone.
    let out = wb.command(&["pause", "--sink", "out"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let transcript = wb.path().join("terminal.txt");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("terminal/in_a_terminal.py");
    let wrapper = [
        "python3",
        script.to_str().unwrap_or_default(),
        transcript.to_str().unwrap_or_default(),
        "--",
    ];
    let running = wb.start_wrapped(&wrapper, &[]);
    let read =
        || String::from_utf8_lossy(&std::fs::read(&transcript).unwrap_or_default()).into_owned();
    let deadline = std::time::Instant::now() + WAIT;
    while !read().contains("initial copy finished") {
        assert!(
            std::time::Instant::now() < deadline,
            "{}\n{}",
            read(),
            wb.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The bars are redrawn every 100 ms: they go once the copy is done.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        running.stop(WAIT).code(),
        Some(0),
        "{}\n{}",
        read(),
        wb.log()
    );
    read()
}

#[test]
fn on_a_terminal_the_copy_draws_progress_bars_and_log_lines_pass_between_them() {
    let shown = copy_in_a_terminal(1_000_000, false);
    let pieces = drawn_pieces(&shown);
    let all = || pieces.join("\n");
    // The table's bar, against the planner's estimate, and the source's line.
    assert!(
        pieces.iter().any(|p| p.contains("  \"public\".\"t\" [")
            && p.contains("% ")
            && p.contains("/1,000,000 rows, ")
            && p.contains(" s left")),
        "no bar for the table:\n{}",
        all()
    );
    assert!(
        pieces
            .iter()
            .any(|p| p.starts_with("source src: ") && p.contains(" of 1 tables, ")),
        "no line for the source:\n{}",
        all()
    );
    // The bars took the progress lines' place; other lines are written
    // whole, from the start of a line of their own, between the bars.
    assert!(!shown.contains("copying table"), "{}", all());
    for said in [
        "snapshot of table finished",
        "initial copy finished",
        "SIGTERM received",
    ] {
        let piece = pieces.iter().find(|p| p.contains(said));
        assert!(
            piece.is_some_and(|p| p.starts_with("20")
                && p.contains(" INFO ")
                && !p.contains(" rows, ")
                && !p.contains("source src:")),
            "{said}: {piece:?}\n{}",
            all()
        );
    }
    // The bars' last act is to clear themselves (or there were none left).
    assert!(
        shown.ends_with("\r\n") || shown.ends_with("\u{1b}[2K"),
        "{:?}",
        shown
            .chars()
            .skip(shown.chars().count().saturating_sub(300))
            .collect::<String>()
    );
}

#[test]
fn a_sink_writing_to_the_terminal_keeps_the_bars_off_it() {
    // The jsonl sink writes to standard output, the same terminal: bars
    // would be drawn through its lines, so the copy logs lines instead.
    let shown = copy_in_a_terminal(100_000, true);
    let pieces = drawn_pieces(&shown);
    assert!(
        pieces.iter().any(|p| p.contains(" INFO copying table: ")),
        "{}",
        pieces.join("\n")
    );
    assert!(
        !pieces
            .iter()
            .any(|p| p.starts_with("source src: ") || p.contains("\"public\".\"t\" [")),
        "{}",
        pieces.join("\n")
    );
}

#[test]
fn logs_for_containers_are_json_lines_with_their_fields() {
    let pg = Cluster::start();
    publish(&pg);
    let wb = Deployment::new();
    wb.configure(&pg, "postgres", "pub", "copy_data = false");
    let running = wb.start_with_env(&[("WALBRIDGE_LOG_FORMAT", "json")]);
    pg.wait_for_streaming(WAIT);
    insert(&pg, (1, 10), 10, 10);
    assert_inserted_once(&wb, 10);
    assert_eq!(running.stop(WAIT).code(), Some(0), "{}", wb.log());
    let log = wb.log();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    for line in &lines {
        assert!(
            line["timestamp"].is_string()
                && line["level"].is_string()
                && line["message"].is_string(),
            "{line}"
        );
    }
    let streaming = lines
        .iter()
        .find(|l| l["message"] == "streaming changes")
        .unwrap_or_else(|| panic!("no `streaming changes` line:\n{log}"));
    assert_eq!(streaming["level"], "INFO", "{streaming}");
    assert_eq!(streaming["source"], "src", "{streaming}");
    assert_eq!(streaming["slot"], "walbridge_src", "{streaming}");

    // A log filter that does not parse is refused, not replaced.
    let out = std::process::Command::new(walbridge_tests::walbridge::binary())
        .args(["--log", "walbridge_source=loudly", "check", "-c"])
        .arg(wb.config_path())
        .env_remove("RUST_LOG")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        last_line(&out).contains("--log = \"walbridge_source=loudly\" is not a log filter"),
        "{}",
        stderr(&out)
    );
}
