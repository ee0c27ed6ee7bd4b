//! The `walbridge` command: a thin CLI over the runtime
//! (`walbridge-runtime`) and the sink kinds it registers.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use walbridge_core::Relation;
use walbridge_sink::{CheckScope, SinkKind, reads};
use walbridge_source::Source;
use walbridge_source::checks::{Outlook, Severity};

use walbridge_runtime::report::describe;
use walbridge_runtime::{Config, RuntimeError, data_dir, pipeline};

/// Every sink kind, by its `type`: a new sink is a crate and a line here.
pub static SINK_KINDS: &[&dyn SinkKind] = &[
    &walbridge_sink_postgres::KIND,
    &walbridge_sink_kafka::KIND,
    &walbridge_sink_jsonl::KIND,
];

/// Exit status for a configuration or usage error.
const EXIT_CONFIG: u8 = 2;
/// Exit status when a prerequisite check fails.
const EXIT_PREREQUISITE: u8 = 3;
/// Exit status for any other failure.
const EXIT_FAILURE: u8 = 1;

/// walbridge — change data capture from PostgreSQL.
///
/// Reads PostgreSQL publications through logical replication (pgoutput),
/// copies the existing rows once, then streams every committed change in
/// commit order to the configured sinks (JSON lines by default).
///
/// Exit status: 0 success, 1 runtime failure, 2 bad configuration or usage,
/// 3 a prerequisite check failed. Errors are one line on stderr saying what
/// is wrong and what to do.
#[derive(Parser, Debug)]
#[command(
    name = "walbridge",
    version,
    about,
    long_about,
    propagate_version = true
)]
struct Cli {
    /// Log level filter, e.g. `info`, `debug`, `walbridge_source=trace`
    /// (also RUST_LOG).
    #[arg(long, global = true, default_value = "info", env = "WALBRIDGE_LOG")]
    log: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the pipeline until SIGINT or SIGTERM.
    ///
    /// On first start each source creates its replication slot, copies the
    /// published tables, then streams changes. Later starts continue from
    /// the slot. SIGINT/SIGTERM stops streaming, flushes the sinks, confirms
    /// the position to the publisher and exits 0.
    Run {
        /// The configuration file.
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
    },
    /// Validate the configuration and every prerequisite, without streaming.
    ///
    /// Checks wal_level, the role's REPLICATION/LOGIN attributes and SELECT
    /// privileges, that the publications exist, replica identities, and the
    /// slot (in use, invalidated, missing, no free slot or WAL sender).
    Check {
        /// The configuration file.
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
    },
    /// Skip the source transaction a postgres sink is stopped on (like
    /// ALTER SUBSCRIPTION … SKIP).
    ///
    /// A postgres sink stops on a source transaction when applying it fails
    /// because of the data — a duplicate key, a value the target column
    /// cannot hold, a TRUNCATE blocked by foreign keys — and retries it
    /// until the target is fixed. This instead moves the target's stored
    /// position past that one transaction (its other changes are not
    /// applied either); a running walbridge goes on at its next retry.
    /// Without --lsn the sink must be stopped on exactly one transaction.
    Skip {
        /// The configuration file.
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
        /// The postgres sink.
        #[arg(long, value_name = "NAME")]
        sink: String,
        /// Only if the sink is stopped on the transaction with this commit
        /// LSN (as the error message shows it, e.g. 0/1A2B3C4).
        #[arg(long, value_name = "X/Y")]
        lsn: Option<walbridge_core::Lsn>,
    },
    /// Drop sources' replication slots and state (like DROP SUBSCRIPTION).
    ///
    /// The next `run` starts over: a new slot and a fresh copy of the tables.
    Drop {
        /// The configuration file.
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
        /// Only this source (default: all).
        #[arg(long, value_name = "NAME")]
        source: Option<String>,
    },
}

fn init_logging(filter: &str) {
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| filter.to_owned());
    let filter = tracing_subscriber::EnvFilter::try_new(&filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
}

struct Failure {
    code: u8,
    error: anyhow::Error,
}

impl From<anyhow::Error> for Failure {
    fn from(error: anyhow::Error) -> Self {
        Failure {
            code: EXIT_FAILURE,
            error,
        }
    }
}

fn load(path: &std::path::Path) -> Result<Config, Failure> {
    Config::load(path, SINK_KINDS).map_err(|error| Failure {
        code: EXIT_CONFIG,
        error: error.into(),
    })
}

async fn check(path: &std::path::Path) -> Result<(), Failure> {
    let config = load(path)?;
    let mut errors = 0;
    let data_dir = &config.data_dir;
    match walbridge_sink::probe_writable(data_dir) {
        Ok(()) => println!("ok: data_dir {} is writable", data_dir.display()),
        Err(e) => {
            eprintln!(
                "error: data_dir {}: {e}: make it writable by the user walbridge runs as, or choose another data_dir",
                data_dir.display()
            );
            errors += 1;
        }
    }
    let running = data_dir::DataDirLock::holder(data_dir);
    if let Some(pid) = running {
        println!(
            "note: data_dir {} is in use by a running walbridge (pid {pid}); `run` and `drop` refuse to start until it stops",
            data_dir.display()
        );
    }
    // The tables each source publishes, for the sinks' checks.
    let mut published = Vec::new();
    for source_config in &config.sources {
        let source = Source::new(source_config.clone(), &config.data_dir).map_err(|e| Failure {
            code: EXIT_CONFIG,
            error: e.into(),
        })?;
        let mut findings = source.check().await;
        if let Some(pid) = running {
            // The slot in use is the running instance's own.
            findings.retain(|f| {
                let own = f.outlook == Outlook::Passing;
                if own {
                    println!(
                        "note: {} (the walbridge running on this data_dir, pid {pid}, presumably)",
                        f.message
                    );
                }
                !own
            });
        }
        for f in &findings {
            eprintln!("{f}");
        }
        let source_errors = findings
            .iter()
            .filter(|f| f.severity == Severity::Error)
            .count();
        if source_errors == 0 {
            println!("ok: source `{}` is ready to replicate", source_config.name);
            match published_relations(&config, &source).await {
                Some(relations) => published.push((source_config.name.clone(), relations)),
                None => errors += 1,
            }
        }
        errors += source_errors;
    }
    let scope = CheckScope {
        tables: published
            .iter()
            .map(|(source, relations)| (source.as_str(), relations.as_slice()))
            .collect(),
        running,
    };
    for sink in &config.sinks {
        let health = sink.check(&scope).await;
        for line in &health.ready {
            println!("ok: sink `{}`: {line}", sink.name());
        }
        errors += health.problems.len();
        for problem in health.problems {
            eprintln!(
                "error: sink `{}`: {}",
                sink.name(),
                describe(problem.as_ref())
            );
        }
    }
    if errors > 0 {
        return Err(Failure {
            code: EXIT_PREREQUISITE,
            error: anyhow::anyhow!("{errors} prerequisite check(s) failed"),
        });
    }
    Ok(())
}

/// The tables `source` publishes, which the sinks' checks look at (a
/// postgres sink maps them onto its target, a kafka sink probes their
/// topics); `None` once an error is reported.
async fn published_relations(config: &Config, source: &Source) -> Option<Vec<Relation>> {
    let name = &source.config().name;
    if !config.sinks.iter().any(|s| reads(s.as_ref(), name)) {
        return Some(Vec::new());
    }
    match source.published_relations().await {
        Ok(relations) => Some(relations),
        Err(e) => {
            eprintln!("error: source `{name}`: cannot list the published tables: {e}");
            None
        }
    }
}

/// Locks `data_dir` for this process (see [`data_dir`]).
fn lock(config: &Config) -> Result<data_dir::DataDirLock, Failure> {
    data_dir::DataDirLock::acquire(&config.data_dir).map_err(|e| Failure {
        code: EXIT_PREREQUISITE,
        error: e.into(),
    })
}

async fn drop_sources(path: &std::path::Path, only: Option<&str>) -> Result<(), Failure> {
    let config = load(path)?;
    if let Some(name) = only
        && !config.sources.iter().any(|s| s.name == name)
    {
        return Err(Failure {
            code: EXIT_CONFIG,
            error: anyhow::anyhow!("no source named `{name}` in {}", path.display()),
        });
    }
    let _lock = lock(&config)?;
    for source_config in config
        .sources
        .iter()
        .filter(|s| only.is_none_or(|n| n == s.name))
    {
        let source = Source::new(source_config.clone(), &config.data_dir).map_err(|e| Failure {
            code: EXIT_CONFIG,
            error: e.into(),
        })?;
        let existed = source
            .drop_slot_and_state()
            .await
            .with_context(|| format!("cannot drop source `{}`", source_config.name))?;
        let slot = source_config.slot_name();
        if existed {
            println!(
                "dropped slot `{slot}` and the state of source `{}`",
                source_config.name
            );
        } else {
            println!(
                "source `{}`: slot `{slot}` did not exist; state removed",
                source_config.name
            );
        }
    }
    Ok(())
}

async fn skip(
    path: &std::path::Path,
    sink: &str,
    lsn: Option<walbridge_core::Lsn>,
) -> Result<(), Failure> {
    let config = load(path)?;
    let usage = |error: anyhow::Error| Failure {
        code: EXIT_CONFIG,
        error,
    };
    let Some(sink_config) = config.sinks.iter().find(|s| s.name() == sink) else {
        return Err(usage(anyhow::anyhow!(
            "no sink named `{sink}` in {}",
            path.display()
        )));
    };
    let cursor_dir = pipeline::cursor_dir(&config.data_dir);
    let Some(skipping) = sink_config.skip(&cursor_dir, lsn) else {
        return Err(usage(anyhow::anyhow!(
            "sink `{sink}` never stops on a transaction; only postgres sinks do"
        )));
    };
    let skipped = skipping.await.with_context(|| format!("sink `{sink}`"))?;
    println!("{skipped}");
    Ok(())
}

async fn run_pipeline(path: &std::path::Path) -> Result<(), Failure> {
    let config = load(path)?;
    let _lock = lock(&config)?;
    // What `check` finds wrong on this machine stops `run` the same way.
    for sink in &config.sinks {
        sink.preflight().map_err(|e| Failure {
            code: EXIT_PREREQUISITE,
            error: anyhow::Error::new(e).context(format!("sink `{}`", sink.name())),
        })?;
    }
    pipeline::run(config).await.map_err(|error| Failure {
        code: match &error {
            RuntimeError::Source(e) if e.is_prerequisite() => EXIT_PREREQUISITE,
            _ => EXIT_FAILURE,
        },
        error: error.into(),
    })
}

fn main() -> ExitCode {
    // A write past the file-size limit (RLIMIT_FSIZE) then fails with EFBIG,
    // which walbridge reports and handles like any write error, instead of
    // SIGXFSZ killing the process without a word (PostgreSQL does the same).
    // SAFETY: setting a signal's disposition to SIG_IGN before any other
    // thread exists has no memory-safety preconditions.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    let cli = Cli::parse();
    init_logging(&cli.log);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("walbridge: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    let result = runtime.block_on(async {
        match &cli.command {
            Command::Run { config } => run_pipeline(config).await,
            Command::Check { config } => check(config).await,
            Command::Drop { config, source } => drop_sources(config, source.as_deref()).await,
            Command::Skip { config, sink, lsn } => skip(config, sink, *lsn).await,
        }
    });
    // A sink stuck in a blocking write (a pipe nobody reads) must not keep
    // the process alive: it resumes from its stored cursor next time.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure { code, error }) => {
            let message = describe(error.as_ref());
            // A message of several lines (the TOML parser's, with the place
            // it points at; several configuration problems) is shown as
            // written, then summed up in the one final line.
            let mut lines = message.lines();
            let first = lines.next().unwrap_or_default();
            let rest: Vec<&str> = lines.collect();
            if rest.is_empty() {
                eprintln!("walbridge: {first}");
            } else {
                eprintln!("{message}");
                eprintln!("walbridge: {first} (details above)");
            }
            ExitCode::from(code)
        }
    }
}
