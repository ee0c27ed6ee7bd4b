//! The `walbridge` command: a thin CLI over the runtime
//! (`walbridge-runtime`) and the sink kinds it registers, a module per
//! command.

mod check;
mod drop;
mod pause;
mod progress;
mod resync;
mod run;
mod skip;
mod status;
mod sync_sequences;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use walbridge_core::describe;
use walbridge_runtime::{Config, data_dir};
use walbridge_sink::SinkKind;

use crate::progress::Bars;

/// Every sink kind, by its `type`: a new sink is a crate and a line here.
pub static SINK_KINDS: &[&dyn SinkKind] = &[
    &walbridge_sink_postgres::KIND,
    &walbridge_sink_kafka::KIND,
    &walbridge_sink_jsonl::KIND,
    &walbridge_sink_grpc::KIND,
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

    /// How log lines are written: `text`, for people (colored on a
    /// terminal), or `json`, one object per line with `timestamp`,
    /// `level`, `message` and the event's fields (`source`, `sink`,
    /// `table`, `lsn`, …), for log collectors.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "WALBRIDGE_LOG_FORMAT"
    )]
    log_format: LogFormat,

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
    /// Show every source and sink: state, positions, lag, last error.
    ///
    /// Asks the walbridge running on the configuration's data_dir through
    /// its admin endpoint; when none runs, shows each source's slot on the
    /// publisher and each sink's stored cursor.
    Status {
        /// The configuration file.
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
        /// Print JSON (what the admin endpoint's /status serves).
        #[arg(long)]
        json: bool,
    },
    /// Pause a sink (like ALTER SUBSCRIPTION … DISABLE).
    ///
    /// The sink stores its cursor and takes no more changes, also after a
    /// restart, until `walbridge resume`; its sources keep writing their
    /// logs meanwhile.
    Pause {
        /// The configuration file.
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
        /// The sink.
        #[arg(long, value_name = "NAME")]
        sink: String,
    },
    /// Resume a paused sink (like ALTER SUBSCRIPTION … ENABLE).
    Resume {
        /// The configuration file.
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
        /// The sink.
        #[arg(long, value_name = "NAME")]
        sink: String,
    },
    /// Copy one table again while changes keep streaming.
    ///
    /// The table is read in key order, in chunks between watermarks written
    /// to the publisher's WAL, so writers wait for nothing; each sink
    /// applies the rows idempotently (postgres: an upsert by key; kafka and
    /// jsonl: `op = "r"`; gRPC: READ). A running walbridge starts within
    /// its refresh_interval; a crash resumes at the last durable chunk.
    /// The table needs a primary key or a replica identity index.
    Resync {
        /// The configuration file.
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
        /// The source whose publication covers the table.
        #[arg(long, value_name = "NAME")]
        source: String,
        /// The table, as schema.table.
        #[arg(long, value_name = "SCHEMA.TABLE")]
        table: String,
        /// Only this sink gets the rows again (the others pass over them).
        #[arg(long, value_name = "NAME")]
        sink: Option<String>,
        /// Empty the table on the targets and copy it whole, in one unit:
        /// for a table without a primary key or replica identity index,
        /// which cannot be read in key order. The unit is held in memory.
        #[arg(long)]
        truncate: bool,
    },
    /// Set the targets' sequences to the publishers' now (for a switchover).
    ///
    /// Reads each source's sequences (the published tables' own, identity
    /// and default sequences; every sequence under FOR ALL TABLES) and sets
    /// each postgres sink's with setval, never backwards. Exits non-zero
    /// when one could not be set. With `sequences = true` on a source this
    /// also happens continuously while running.
    SyncSequences {
        /// The configuration file.
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
    },
    /// Drop sources' replication slots and state (like DROP SUBSCRIPTION),
    /// and what sinks keep for them on their targets.
    ///
    /// The next `run` starts over: a new slot and a fresh copy of the
    /// tables. A postgres sink's replication origins and progress rows for
    /// the source are removed; what cannot be is named, with the SQL that
    /// removes it.
    Drop {
        /// The configuration file.
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
        /// Only this source (default: all).
        #[arg(long, value_name = "NAME")]
        source: Option<String>,
        /// Leave the slot on the publisher and do not contact it (for a
        /// publisher that is gone): prints the slot to drop there by hand.
        #[arg(long)]
        keep_slot: bool,
    },
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum LogFormat {
    /// For people.
    Text,
    /// One JSON object per line.
    Json,
}

/// Logs to stderr, filtered by `filter` (or RUST_LOG), in `format`; a
/// filter that does not parse is refused, not replaced. With `bars`, lines
/// are written around them, and the copy's progress lines left to them.
fn init_logging(filter: &str, format: LogFormat, bars: Option<&Bars>) -> Result<(), String> {
    let (filter, from) = match std::env::var("RUST_LOG") {
        Ok(f) => (f, "RUST_LOG"),
        Err(_) => (filter.to_owned(), "--log"),
    };
    let mut filter = tracing_subscriber::EnvFilter::try_new(&filter).map_err(|e| {
        format!("{from} = \"{filter}\" is not a log filter ({e}): write e.g. info, debug or walbridge_source=trace")
    })?;
    if bars.is_some() {
        let quiet = format!("{}=off", progress::COPY_PROGRESS_TARGET);
        filter = filter.add_directive(quiet.parse().map_err(|e| format!("{quiet}: {e}"))?);
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    match (format, bars) {
        (LogFormat::Text, Some(bars)) => builder
            .with_writer(bars.make_writer())
            .with_ansi(true)
            .init(),
        (LogFormat::Text, None) => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        (LogFormat::Json, _) => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .init(),
    }
    Ok(())
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

/// Locks `data_dir` for this process (see [`data_dir`]).
fn lock(config: &Config) -> Result<data_dir::DataDirLock, Failure> {
    data_dir::DataDirLock::acquire(&config.data_dir).map_err(|e| Failure {
        code: EXIT_PREREQUISITE,
        error: e.into(),
    })
}

/// Progress bars for `run` with `config`, only where someone watches the
/// copy: text logs on a terminal, and no sink writing its lines to that
/// terminal. (A configuration that does not load gets none: `run` says
/// what is wrong with it.)
fn bars_for(config: &std::path::Path, format: LogFormat) -> Option<Bars> {
    use std::io::IsTerminal;
    if !matches!(format, LogFormat::Text) || !std::io::stderr().is_terminal() {
        return None;
    }
    let config = load(config).ok()?;
    let crowded =
        std::io::stdout().is_terminal() && config.sinks.iter().any(|s| s.writes_to_stdout());
    (!crowded).then(Bars::new)
}

/// Reads the configuration file (exit status 2 when it is wrong).
fn load(path: &std::path::Path) -> Result<Config, Failure> {
    Config::load(path, SINK_KINDS).map_err(|error| Failure {
        code: EXIT_CONFIG,
        error: error.into(),
    })
}

/// jemalloc, not glibc's malloc: walbridge allocates a change's values on
/// the source's task and frees them on a sink's (or the log's writer
/// thread), and glibc's per-thread arenas made malloc and free about a
/// fifth of its CPU in a catch-up; with jemalloc the catch-up takes a
/// quarter less CPU, and peak RSS stays about the same (README,
/// Benchmarks).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

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
    let bars = match &cli.command {
        Command::Run { config } => bars_for(config, cli.log_format),
        _ => None,
    };
    if let Err(e) = init_logging(&cli.log, cli.log_format, bars.as_ref()) {
        eprintln!("walbridge: {e}");
        return ExitCode::from(EXIT_CONFIG);
    }
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
            Command::Run { config } => run::run_pipeline(config, bars.as_ref()).await,
            Command::Check { config } => check::check(config).await,
            Command::Drop {
                config,
                source,
                keep_slot,
            } => drop::drop_sources(config, source.as_deref(), *keep_slot).await,
            Command::Skip { config, sink, lsn } => skip::skip(config, sink, *lsn).await,
            Command::Status { config, json } => status::status(config, *json).await,
            Command::Resync {
                config,
                source,
                table,
                sink,
                truncate,
            } => resync::resync(config, source, table, sink.as_deref(), *truncate),
            Command::SyncSequences { config } => sync_sequences::sync_sequences(config).await,
            Command::Pause { config, sink } => pause::set_paused(config, sink, true),
            Command::Resume { config, sink } => pause::set_paused(config, sink, false),
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
