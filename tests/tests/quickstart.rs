//! `scripts/quickstart.sh` leaves nothing behind, however it is stopped:
//! Ctrl-C (SIGINT to the whole process group) or SIGTERM to the script
//! alone (as `timeout` sends it), while the server starts or while
//! walbridge streams.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use walbridge_tests::walbridge::binary;

const WAIT: Duration = Duration::from_secs(120);

/// Where the quickstart stops.
#[derive(Clone, Copy, Debug)]
enum Moment {
    /// As it says it starts PostgreSQL (`pg_ctl start` is under way).
    ServerStarting,
    /// Once walbridge printed the first change.
    Streaming,
}

/// Processes whose command line mentions `path`.
fn processes_using(path: &Path) -> Vec<String> {
    let needle = path.to_string_lossy().into_owned();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if text.contains(&needle) {
            found.push(format!("{}: {text}", entry.file_name().to_string_lossy()));
        }
    }
    found
}

fn stop_quickstart(moment: Moment, signal: i32, whole_group: bool) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/quickstart.sh");
    let mut command = Command::new("bash");
    // As from a terminal: a process started in the background by a
    // non-interactive shell (a CI step, a test runner) has SIGINT ignored,
    // which its children inherit and a shell cannot trap again — the
    // script would sleep through Ctrl-C.
    // SAFETY: signal(2) is async-signal-safe, as pre_exec requires.
    unsafe {
        command.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut child = command
        .arg(&script)
        .env("WALBRIDGE_BIN", binary())
        .env("WALBRIDGE_ADMIN_LISTEN", "127.0.0.1:0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run the quickstart: {e}"));
    let pid = child.id() as i32;
    // Both streams, line by line, tagged.
    let (tx, rx) = mpsc::channel::<(bool, String)>();
    for (is_stdout, stream) in [
        (
            true,
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        ),
        (
            false,
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        ),
    ] {
        let tx = tx.clone();
        let Some(stream) = stream else { continue };
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                if tx.send((is_stdout, line)).is_err() {
                    return;
                }
            }
        });
    }
    drop(tx);
    let deadline = Instant::now() + WAIT;
    let mut work: Option<PathBuf> = None;
    let mut seen = String::new();
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let (is_stdout, line) = rx
            .recv_timeout(remaining)
            .unwrap_or_else(|_| panic!("the quickstart did not reach {moment:?}:\n{seen}"));
        seen.push_str(&line);
        seen.push('\n');
        if let Some(rest) = line.split("(data in ").nth(1) {
            work = Some(PathBuf::from(rest.trim_end_matches(')')));
            if matches!(moment, Moment::ServerStarting) {
                break;
            }
        }
        if is_stdout && matches!(moment, Moment::Streaming) && line.contains("\"op\":\"c\"") {
            break;
        }
    }
    let work =
        work.unwrap_or_else(|| panic!("the quickstart did not say where its server is:\n{seen}"));
    let target = if whole_group { -pid } else { pid };
    // SAFETY: kill(2) on our own child (or its process group) has no memory-safety preconditions.
    unsafe {
        libc::kill(target, signal);
    }
    let stopped = Instant::now() + WAIT;
    while child.try_wait().ok().flatten().is_none() {
        if Instant::now() >= stopped {
            // What it printed since, and what still runs, say where it hung.
            seen.extend(rx.try_iter().map(|(_, line)| line + "\n"));
            panic!(
                "the quickstart did not stop; it printed:\n{seen}\nstill running:\n{}",
                processes_using(&work).join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Anything it started is gone with it (the server stops asynchronously
    // after pg_ctl's fast shutdown: give it a moment).
    let settled = Instant::now() + Duration::from_secs(30);
    loop {
        let left = processes_using(&work);
        if left.is_empty() && !work.exists() {
            break;
        }
        assert!(
            Instant::now() < settled,
            "{moment:?}: left behind: {} exists: {}; processes: {left:#?}\noutput:\n{seen}",
            work.display(),
            work.exists()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn ctrl_c_while_streaming_removes_the_server() {
    stop_quickstart(Moment::Streaming, libc::SIGINT, true);
}

#[test]
fn sigterm_while_streaming_removes_the_server() {
    stop_quickstart(Moment::Streaming, libc::SIGTERM, false);
}

#[test]
fn ctrl_c_while_the_server_starts_removes_it() {
    stop_quickstart(Moment::ServerStarting, libc::SIGINT, true);
}

#[test]
fn sigterm_while_the_server_starts_removes_it() {
    stop_quickstart(Moment::ServerStarting, libc::SIGTERM, false);
}
