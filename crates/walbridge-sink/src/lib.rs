//! walbridge's sink contract: what every sink implements, and what the
//! runtime gives it.
//!
//! A sink kind ([`SinkKind`], `type = "…"` in `[[sink]]`) reads its
//! configuration into a [`SinkConfig`], which `walbridge check` asks for
//! its prerequisites ([`SinkConfig::check`]) and `walbridge run` opens
//! into a [`Sink`]: its stored cursors loaded, nothing connected. The
//! runtime registers those cursors with the logs (so retention keeps what
//! the sink still needs), then runs the sink in attempts
//! ([`Sink::start`]): each [`SinkRun`] says where to read each source's
//! log ([`SinkRun::resume`]), is fed [`Routed`] batches from there (or,
//! [`Reading::Itself`], reads the logs with as many readers as it needs,
//! as a feed serving many consumers does), and
//! acknowledges [`LogPosition`]s through each source's [`SourceContext`]
//! once what precedes them is durable at the destination and the sink's
//! cursor is stored. A failed attempt is retried from the stored cursor
//! with backoff, unless its [`SinkFailure`] is permanent; the sources and
//! the other sinks go on meanwhile.
//!
//! A sink's place in a source's log is its **cursor**: the next record it
//! reads ([`CursorPosition`] when stored, [`LogPosition`] when
//! acknowledged, with the publisher LSN it covers).
//!
//! Sink kinds are registered in one place (the binary's list); nothing
//! else names them.

mod delay;
mod feed;
mod source_block;

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::mpsc;
use walbridge_core::{Lsn, Relation, SequenceValues};

pub use delay::{DELAY_BUCKETS, DELAY_METRIC, SinkDelays, SourceDelay, describe_delay};
pub use feed::{LogPosition, Routed, SourceContext, SourceLog};
pub use source_block::SourceBlock;
pub use walbridge_log::{CursorPosition, CursorState, Log, LogError, Visibility};

/// A future a sink returns through the contract.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// An error a sink reports, shown as it is.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A kind of sink: what `type = "…"` names in a `[[sink]]` table.
pub trait SinkKind: Send + Sync {
    /// The `type` value.
    fn kind(&self) -> &'static str;

    /// Reads one `[[sink]]` table (without its `type`), as the kind's
    /// documentation describes it; the error names the key at fault.
    fn configure(
        &self,
        table: toml::Table,
        context: &ConfigContext,
    ) -> Result<Arc<dyn SinkConfig>, String>;
}

/// What the rest of the configuration tells a sink's configuration.
#[derive(Clone, Debug, Default)]
pub struct ConfigContext {
    /// The URL of the schema registry walbridge serves itself
    /// (`[schema_registry]`), if it serves one.
    pub embedded_registry: Option<String>,
}

/// One configured sink.
pub trait SinkConfig: Send + Sync + std::fmt::Debug {
    /// The sink's name (`name`), unique in the configuration.
    fn name(&self) -> &str;

    /// The sources it reads (`sources`), `None` for every source.
    fn sources(&self) -> Option<&[String]>;

    /// What is wrong with the configuration itself, one line each.
    fn validate(&self) -> Vec<String>;

    /// `walbridge check`: everything `run` will need, asked of the
    /// destination without changing it.
    fn check<'a>(&'a self, scope: &'a CheckScope<'a>) -> BoxFuture<'a, Health>;

    /// True when it writes to standard output: where that is a terminal,
    /// `run` draws no progress bars there, not to draw through its lines.
    fn writes_to_stdout(&self) -> bool {
        false
    }

    /// What `run` refuses to start without, found on this machine (a
    /// directory that does not exist): checked before anything streams.
    fn preflight(&self) -> Result<(), SinkFailure> {
        Ok(())
    }

    /// Loads the sink's state (its cursors) from `cursor_dir`. Connects to
    /// nothing: a destination that is down is reported, and retried, by
    /// [`SinkRun::resume`] without holding up the sources.
    fn open(&self, cursor_dir: &Path) -> Result<Arc<dyn Sink>, SinkFailure>;

    /// `walbridge skip`: moves the sink past the source transaction it is
    /// stopped on (the one with commit LSN `lsn`, when given) and says
    /// what was skipped; `None` for a sink that never stops on one.
    fn skip<'a>(
        &'a self,
        cursor_dir: &'a Path,
        lsn: Option<Lsn>,
    ) -> Option<BoxFuture<'a, Result<String, SinkFailure>>> {
        let _ = (cursor_dir, lsn);
        None
    }

    /// `walbridge sync-sequences`: sets the destination's sequences to
    /// `values`, just read on `source`'s publisher, never backwards; a
    /// line per sequence, and whether every one is now at least there.
    /// `None` for a sink without sequences of its own to set (it gets them
    /// through the log, from sources with `sequences = true`).
    fn sync_sequences<'a>(
        &'a self,
        source: &'a str,
        values: &'a SequenceValues,
    ) -> Option<BoxFuture<'a, Result<SequencesSynced, SinkFailure>>> {
        let _ = (source, values);
        None
    }

    /// `walbridge drop` of `source`: removes what the sink keeps for it
    /// outside `data_dir` (on its destination), and says what it removed
    /// and what is left there, with how to remove it. Nothing by default.
    fn forget<'a>(&'a self, source: &'a str) -> BoxFuture<'a, Forgotten> {
        let _ = source;
        Box::pin(async { Forgotten::default() })
    }
}

/// What [`SinkConfig::sync_sequences`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SequencesSynced {
    /// A line per sequence.
    pub lines: Vec<String>,
    /// Every sequence is now at least at the publisher's value.
    pub complete: bool,
}

/// What [`SinkConfig::forget`] did, a line each.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Forgotten {
    /// What it removed.
    pub removed: Vec<String>,
    /// What is left, and how to remove it by hand.
    pub left: Vec<String>,
}

/// What `walbridge check` knows besides a sink's configuration.
pub struct CheckScope<'a> {
    /// The tables each source publishes (a sink skips the sources it does
    /// not read).
    pub tables: Vec<(&'a str, &'a [Relation])>,
    /// The pid of the walbridge running on the data_dir, if one does: a
    /// check must not take from it what it holds (a transactional id).
    pub running: Option<u32>,
}

impl CheckScope<'_> {
    /// The tables of the sources `sink` reads.
    pub fn tables_read_by<'s>(
        &'s self,
        sink: &'s dyn SinkConfig,
    ) -> impl Iterator<Item = (&'s str, &'s [Relation])> + 's {
        self.tables
            .iter()
            .filter(move |(source, _)| reads(sink, source))
            .copied()
    }
}

/// Whether `sink` reads `source`.
pub fn reads(sink: &dyn SinkConfig, source: &str) -> bool {
    sink.sources()
        .is_none_or(|list| list.iter().any(|s| s == source))
}

/// What a check found.
#[derive(Debug, Default)]
pub struct Health {
    /// What is ready, a line each.
    pub ready: Vec<String>,
    /// Each thing `run` would fail on.
    pub problems: Vec<BoxError>,
}

impl Health {
    /// A check that found `problem` and could go no further.
    pub fn failed(problem: impl Into<BoxError>) -> Self {
        Health {
            ready: Vec::new(),
            problems: vec![problem.into()],
        }
    }
}

/// A sink opened: its state loaded, nothing connected.
pub trait Sink: Send + Sync {
    /// Where the sink's stored cursor says to go on reading `source`'s log.
    fn stored_cursor(&self, source: &str) -> Option<CursorPosition>;

    /// Which log records it is given: whole units, or also the records of
    /// units still being written (a sink that commits only at a unit's end
    /// can start on a large transaction early), or besides small units
    /// before their fsync (a sink that passes over what its target holds by
    /// LSN; see [`Visibility::Written`]).
    fn visibility(&self) -> Visibility;

    /// True when each source is applied on its own (runs, fails and is
    /// retried apart, so one source stopped never holds up the others);
    /// false when the sink takes all its sources together.
    fn per_source(&self) -> bool {
        false
    }

    /// How it gets its sources' records: fed by the runtime (most sinks),
    /// or read from the logs itself.
    fn reading(&self) -> Reading {
        Reading::Fed
    }

    /// A new attempt: the first, and one after each failure. May block
    /// (a FIFO waits for its reader); the runtime calls it off its threads.
    fn start(&self) -> Result<Box<dyn SinkRun>, SinkFailure>;
}

/// How a sink gets the records of its sources' logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// The runtime reads each log from where [`SinkRun::resume`] says and
    /// hands the records to [`SinkRun::run`] as [`Routed`] batches.
    Fed,
    /// The sink reads the logs itself, from the [`SourceLog`]s
    /// [`SinkRun::resume`] is given, with as many readers as it needs (a
    /// feed serving many consumers, each at its own place). It acknowledges
    /// through each source's [`SourceContext`] the lowest position any of
    /// its readers still needs: that is its cursor, which keeps the log's
    /// retention from removing what one of them has not read. `run`'s
    /// channel carries nothing and closes when the sink is to stop; what
    /// `resume` returns is not used.
    Itself,
}

/// One attempt of a sink.
pub trait SinkRun: Send {
    /// Connects as needed and says where to read each of `logs` (in
    /// order): the sink's stored cursor, or where its destination says it is.
    fn resume<'a>(
        &'a mut self,
        logs: &'a [SourceLog],
    ) -> BoxFuture<'a, Result<Vec<u64>, SinkFailure>>;

    /// Consumes `events` until the channel closes; acknowledges positions
    /// as they become durable.
    fn run(
        self: Box<Self>,
        events: mpsc::Receiver<Routed>,
    ) -> BoxFuture<'static, Result<(), SinkFailure>>;
}

/// A sink that keeps its cursors in a cursor file, opened: the cursors as
/// stored when the run began, and how an attempt starts (it loads the
/// file again, as the last attempt left it).
pub struct CursorFileSink {
    cursor: CursorState,
    visibility: Visibility,
    start: Box<dyn Fn() -> Result<Box<dyn SinkRun>, SinkFailure> + Send + Sync>,
}

impl CursorFileSink {
    /// Loads sink `name`'s cursor file from `cursor_dir`.
    pub fn open(
        cursor_dir: &Path,
        name: &str,
        visibility: Visibility,
        start: impl Fn() -> Result<Box<dyn SinkRun>, SinkFailure> + Send + Sync + 'static,
    ) -> Result<Self, SinkFailure> {
        let cursor = walbridge_log::CursorFile::new(cursor_dir, name)
            .load()
            .map_err(SinkFailure::transient)?
            .unwrap_or_default();
        Ok(CursorFileSink {
            cursor,
            visibility,
            start: Box::new(start),
        })
    }
}

impl Sink for CursorFileSink {
    fn stored_cursor(&self, source: &str) -> Option<CursorPosition> {
        self.cursor.positions.get(source).cloned()
    }

    fn visibility(&self) -> Visibility {
        self.visibility
    }

    fn start(&self) -> Result<Box<dyn SinkRun>, SinkFailure> {
        (self.start)()
    }
}

/// Where sink `sink` starts reading each of `logs`, from `cursor` (see
/// [`start_from_cursor`]).
pub fn starts_from_cursor(sink: &str, cursor: &CursorState, logs: &[SourceLog]) -> Vec<u64> {
    logs.iter()
        .map(|l| {
            start_from_cursor(
                sink,
                &l.context.name,
                cursor.positions.get(&l.context.name),
                &l.log,
            )
        })
        .collect()
}

/// Where a sink starts reading `log` from its stored cursor: the stored
/// position when it is this log's (the log's end when past it), else the
/// oldest record kept (saying why when that is not what the sink
/// expects).
///
/// A position past the end is one taken before a crash of the machine
/// took the records before it from the log (a feed's consumer is sent
/// units before their fsync): the log was just opened, at the end that
/// survived, and the publisher sends what it lost again from there.
pub fn start_from_cursor(
    sink: &str,
    source: &str,
    stored: Option<&CursorPosition>,
    log: &Log,
) -> u64 {
    let first = log.first_seq();
    match stored {
        Some(p) if p.log == log.id() => {
            let end = log.head().next_seq;
            if p.next > end {
                tracing::warn!(
                    sink,
                    source,
                    stored = p.next,
                    end,
                    "the sink's cursor is past the end of the log: records before it were lost with the machine before their fsync; reading from the end (the publisher sends them again)"
                );
            }
            p.next.min(end)
        }
        Some(_) => {
            tracing::warn!(
                sink,
                source,
                "the source's log was recreated since the sink stored its cursor (walbridge drop?): reading the new log from its start"
            );
            first
        }
        None => {
            if first > 0 {
                tracing::warn!(
                    sink,
                    source,
                    first,
                    "new sink: the log no longer holds the source's oldest records (retention removed them); this sink starts without them"
                );
            }
            first
        }
    }
}

/// A sink's failure, and whether retrying can cure it.
#[derive(Debug)]
pub struct SinkFailure {
    error: BoxError,
    permanent: bool,
}

impl SinkFailure {
    /// A failure a retry may cure (a destination down, a conflict someone
    /// will fix).
    pub fn transient(error: impl Into<BoxError>) -> Self {
        SinkFailure {
            error: error.into(),
            permanent: false,
        }
    }

    /// A failure no retry cures: the sink stops until the configuration or
    /// the destination is fixed.
    pub fn permanent(error: impl Into<BoxError>) -> Self {
        SinkFailure {
            error: error.into(),
            permanent: true,
        }
    }

    /// `error`, permanent or not.
    pub fn new(error: impl Into<BoxError>, permanent: bool) -> Self {
        SinkFailure {
            error: error.into(),
            permanent,
        }
    }

    /// True when retrying cannot help.
    pub fn is_permanent(&self) -> bool {
        self.permanent
    }
}

impl std::fmt::Display for SinkFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for SinkFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

/// Whether this process may create files in `dir`, or, when `dir` does
/// not exist yet, create it: tried for real (a file created and removed in
/// `dir` or its nearest existing parent), since permission bits tell
/// nothing of read-only mounts, ACLs or a full inode table.
pub fn probe_writable(dir: &Path) -> std::io::Result<()> {
    let mut existing = dir;
    while !existing.exists() {
        match existing.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => existing = parent,
            _ => {
                existing = Path::new(".");
                break;
            }
        }
    }
    if !existing.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotADirectory,
            format!("{} is not a directory", existing.display()),
        ));
    }
    let probe = existing.join(format!(".walbridge-probe-{}", std::process::id()));
    std::fs::File::options()
        .write(true)
        .create_new(true)
        .open(&probe)
        .map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("cannot create a file in {}: {e}", existing.display()),
            )
        })?;
    std::fs::remove_file(&probe)
}

#[cfg(test)]
mod tests {
    use super::*;
    use walbridge_log::LogOptions;

    fn ok<T, E: std::fmt::Display>(r: Result<T, E>) -> T {
        r.unwrap_or_else(|e| panic!("{e}"))
    }

    #[tokio::test]
    async fn a_cursor_starts_where_it_is_stored_or_at_the_end_of_a_log_that_lost_its_records() {
        let dir = ok(tempfile::tempdir());
        let (log, writer, _) = ok(Log::open(dir.path(), LogOptions::default()));
        for i in 0..6u64 {
            let message = walbridge_core::LogicalMessage {
                lsn: walbridge_core::Lsn(100 + i),
                transactional: false,
                prefix: "test".into(),
                content: Default::default(),
            };
            let payload = walbridge_log::RecordEncoder::default().message(&message);
            ok(writer
                .append(payload, walbridge_core::Lsn(100 + i), true)
                .await);
        }
        ok(writer.close().await);
        let at = |next| CursorPosition {
            log: log.id().to_owned(),
            next,
        };
        let start = |stored: Option<&CursorPosition>| start_from_cursor("s", "src", stored, &log);
        assert_eq!(start(Some(&at(4))), 4);
        assert_eq!(start(Some(&at(6))), 6);
        assert_eq!(start(Some(&at(9))), 6, "past the end: from the end");
        let other = CursorPosition {
            log: "another".into(),
            next: 4,
        };
        assert_eq!(start(Some(&other)), 0);
        assert_eq!(start(None), 0);
    }
}
