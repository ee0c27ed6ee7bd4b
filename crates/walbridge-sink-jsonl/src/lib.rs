//! The `jsonl` sink: newline-delimited JSON to standard output or a file.
//!
//! Runs on its own thread with blocking writes. Events are written in the
//! order received, and handed to the output (written, flushed for standard
//! output) whenever the queue runs dry, so a reader has each line as soon
//! as the sink does. Making them durable is dearer (an fsync of a file,
//! then the cursor stored with the file's length: two more), so it happens
//! when the queue runs dry but at most once per [`COMMIT_GAP`], and at
//! least every [`COMMIT_INTERVAL`] while busy; only then are the positions
//! acknowledged. After a crash the file is cut back
//! to the length stored with the cursor and reading resumes at the cursor:
//! every line appears exactly once. (Standard output and pipes cannot be
//! cut back: lines after the last stored cursor may appear twice.)
//!
//! The sink is given a small transaction as soon as its log has written
//! it, before the log's fsync ([`walbridge_log::Visibility::WrittenUnits`]: whole units
//! only, so nothing of a transaction is written before its end), and
//! stores a cursor only once every log holds it durably ([`Cuts`]): a
//! crash of the machine may take from a log what its fsync had not made
//! durable, and the output is then cut back to a point the logs still
//! hold (the publisher sends the rest again, the same).

mod config;
mod encoder;
mod kind;

pub use config::JsonlSinkConfig;
pub use encoder::{Encoder, Position};
pub use kind::KIND;

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use walbridge_core::{
    Change, ColumnShape, Lsn, PgTimestamp, Relation, RelationId, SourceEvent, TransactionInfo,
    carry_attnums, column_changes,
};
use walbridge_log::{CursorFile, CursorPosition, CursorState, Log, LogError};
use walbridge_sink::{LogPosition, Routed, SourceContext};

/// An error of the jsonl sink.
#[derive(Debug, thiserror::Error)]
pub enum JsonlError {
    /// The output could not be opened, written or made durable.
    #[error("{what}: {source}")]
    Output {
        /// What was being done, and to which path.
        what: String,
        /// What the system said.
        source: std::io::Error,
    },
    /// The output cannot be created where `path` says.
    #[error("{0}")]
    Path(String),
    /// The sink's cursor could not be read or stored.
    #[error(transparent)]
    Cursor(#[from] LogError),
    /// Snapshot rows in the log could not be read.
    #[error("snapshot rows of {table} in the log: {source}")]
    Rows {
        /// The table.
        table: String,
        /// What is wrong with them.
        source: walbridge_core::CopyTextError,
    },
}

/// Names what failed, for an I/O error.
fn output(what: impl FnOnce() -> String) -> impl FnOnce(std::io::Error) -> JsonlError {
    move |source| JsonlError::Output {
        what: what(),
        source,
    }
}

/// Bytes buffered before a write, also inside a burst.
const WRITE_CHUNK: usize = 1 << 20;

/// The longest the sink goes, while busy, without making its output durable
/// and storing its cursor.
pub const COMMIT_INTERVAL: Duration = Duration::from_millis(100);

/// The shortest time between two commits (output made durable, cursor
/// stored) when the queue keeps running dry: at 3,000 transactions/s a
/// commit per transaction meant 9,000 fsyncs/s, and the lines waited for
/// the disk (p95 96 ms).
pub const COMMIT_GAP: Duration = Duration::from_millis(10);

enum Output {
    Stdout(std::io::Stdout),
    /// A regular file, fsynced to make writes durable; with its length.
    File(File, u64),
    /// A device or pipe (`/dev/null`, a FIFO): nothing to fsync.
    Stream(File),
}

impl Output {
    /// Opens the output; a regular file is cut back to `resume_len` when it
    /// is longer (the tail was written after the cursor was last stored).
    fn open(path: &str, resume_len: Option<u64>) -> Result<Self, JsonlError> {
        if path == "-" {
            return Ok(Output::Stdout(std::io::stdout()));
        }
        let file = File::options()
            .create(true)
            .read(true)
            .append(true)
            .open(path)
            .map_err(output(|| format!("cannot open {path} for appending")))?;
        let meta = file
            .metadata()
            .map_err(output(|| format!("cannot stat {path}")))?;
        if !meta.is_file() {
            return Ok(Output::Stream(file));
        }
        match resume_len {
            Some(len) if meta.len() > len => {
                tracing::warn!(
                    path,
                    cut = meta.len() - len,
                    "removing output written after the sink last stored its cursor (it is written again)"
                );
                file.set_len(len)
                    .and_then(|()| file.sync_data())
                    .map_err(output(|| format!("cannot cut {path} back to {len} bytes")))?;
            }
            Some(len) if meta.len() < len => tracing::warn!(
                path,
                expected = len,
                found = meta.len(),
                "the output file is shorter than when the cursor was stored (rotated or truncated?); appending"
            ),
            Some(_) => {}
            None => cut_torn_line(&file)
                .map_err(output(|| format!("cannot repair the end of {path}")))?,
        }
        let len = file
            .metadata()
            .map_err(output(|| format!("cannot stat {path}")))?
            .len();
        Ok(Output::File(file, len))
    }

    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Output::Stdout(s) => s.lock().write_all(bytes),
            Output::File(f, len) => {
                f.write_all(bytes)?;
                *len += bytes.len() as u64;
                Ok(())
            }
            Output::Stream(f) => f.write_all(bytes),
        }
    }

    /// Makes what was written visible to a reader, not durable.
    fn hand_over(&mut self) -> std::io::Result<()> {
        match self {
            Output::Stdout(s) => s.lock().flush(),
            // The page cache serves readers of the file.
            Output::File(..) => Ok(()),
            Output::Stream(f) => f.flush(),
        }
    }

    fn make_durable(&mut self) -> std::io::Result<()> {
        match self {
            Output::Stdout(s) => s.lock().flush(),
            Output::File(f, _) => f.sync_data(),
            Output::Stream(f) => f.flush(),
        }
    }

    /// The length to resume from, for outputs that can be cut back.
    fn resume_len(&self) -> Option<u64> {
        match self {
            Output::File(_, len) => Some(*len),
            Output::Stdout(_) | Output::Stream(_) => None,
        }
    }
}

/// A crash can leave half a line at the end of the file. Nothing in it was
/// confirmed to the publisher, so it is sent again: cut the fragment off,
/// or the next line would be glued to it.
fn cut_torn_line(file: &File) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let len = file.metadata()?.len();
    let mut reader = file;
    let mut end = len;
    let mut block = vec![0u8; 64 * 1024];
    while end > 0 {
        let start = end.saturating_sub(block.len() as u64);
        let chunk = &mut block[..(end - start) as usize];
        reader.seek(SeekFrom::Start(start))?;
        reader.read_exact(chunk)?;
        if let Some(pos) = chunk.iter().rposition(|&b| b == b'\n') {
            end = start + pos as u64 + 1;
            break;
        }
        end = start;
    }
    if end != len {
        tracing::warn!(
            cut = len - end,
            "removing a partly written last line left by a crash"
        );
        file.set_len(end)?;
        file.sync_data()?;
    }
    Ok(())
}

/// Per source: the transaction being written, and each table's
/// descriptor last written with the shapes of its columns (while this
/// process runs: after a restart a table's first change is compared with
/// nothing).
#[derive(Default)]
struct SourceCursor {
    transaction: Option<Arc<TransactionInfo>>,
    tables: Tables,
}

/// Each table's descriptor last written, with its columns' shapes.
type Tables = HashMap<RelationId, (Arc<Relation>, Vec<ColumnShape>)>;

/// Records `relation` as the one `lsn` is written with; a line first when
/// its columns differ from the one written before.
fn describe(
    tables: &mut Tables,
    encoder: &Encoder,
    out: &mut Vec<u8>,
    at: &Position<'_>,
    relation: &Arc<Relation>,
    lsn: Lsn,
) {
    let shapes = match tables.get(&relation.id) {
        Some((known, _)) if Arc::ptr_eq(known, relation) || **known == **relation => return,
        Some((_, shapes)) => shapes,
        None => {
            seen(tables, relation);
            return;
        }
    };
    let carried = carry_attnums(Some(shapes), relation);
    let described = carried.as_ref().unwrap_or(relation);
    let changes = column_changes(shapes, described);
    if !changes.is_empty() {
        encoder.schema_change(out, at, described, &changes, lsn);
    }
    let shapes = ColumnShape::all_of(described);
    tables.insert(relation.id, (relation.clone(), shapes));
}

/// Records `relation` as a table's descriptor, with no line.
fn seen(tables: &mut Tables, relation: &Arc<Relation>) {
    let shapes = ColumnShape::all_of(relation);
    tables.insert(relation.id, (relation.clone(), shapes));
}

/// What the sink stores next to its positions (`consumer` in the cursor).
#[derive(serde::Deserialize)]
struct ResumeData {
    output_len: u64,
}

/// What `walbridge check` reports: whether the output can be opened for
/// appending, without creating or changing it.
pub fn health_check(config: &JsonlSinkConfig) -> Result<String, JsonlError> {
    if config.path == "-" {
        return Ok("writes to standard output".into());
    }
    let path = Path::new(&config.path);
    if path.exists() {
        File::options()
            .append(true)
            .open(path)
            .map_err(output(|| format!("cannot open {} for appending (make it writable by the user walbridge runs as, or change `path`)", path.display())))?;
        return Ok(format!("appends to {}", path.display()));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(JsonlError::Path(format!(
            "the directory of `path` {} does not exist: create it (mkdir -p {}) or change `path`",
            path.display(),
            dir.display()
        )));
    }
    walbridge_sink::probe_writable(dir).map_err(output(|| {
        format!(
            "cannot create {} (make {} writable by the user walbridge runs as, or change `path`)",
            path.display(),
            dir.display()
        )
    }))?;
    Ok(format!("will create {}", path.display()))
}

/// A jsonl sink ready to run.
pub struct JsonlSink {
    config: JsonlSinkConfig,
    output: Output,
    cursor_file: CursorFile,
    cursor: CursorState,
    /// The transactions whose last line is in the buffer, not yet written:
    /// their source and commit time, for their delays.
    unwritten: Vec<(Arc<SourceContext>, PgTimestamp)>,
    /// Each source's log, given at resume: what of it is durable.
    logs: HashMap<String, Log>,
}

impl JsonlSink {
    /// Loads the cursor stored in `cursor_dir` and opens the output,
    /// cutting off what was written after the cursor was stored (the
    /// health check: a path that cannot be opened fails here).
    pub fn open(config: JsonlSinkConfig, cursor_dir: &Path) -> Result<Self, JsonlError> {
        let cursor_file = CursorFile::new(cursor_dir, &config.name);
        let cursor = cursor_file.load()?.unwrap_or_default();
        let resume_len = serde_json::from_value::<ResumeData>(cursor.consumer.clone())
            .ok()
            .map(|r| r.output_len);
        let output = Output::open(&config.path, resume_len)?;
        Ok(JsonlSink {
            config,
            output,
            cursor_file,
            cursor,
            unwritten: Vec::new(),
            logs: HashMap::new(),
        })
    }

    /// Writes every event from `events` until the channel closes.
    pub fn run(mut self, mut events: mpsc::Receiver<Routed>) -> Result<(), JsonlError> {
        let encoder = Encoder::new(&self.config.unchanged_toast_placeholder);
        let mut sources: HashMap<String, (Arc<SourceContext>, SourceCursor)> = HashMap::new();
        let mut positions: HashMap<String, LogPosition> = HashMap::new();
        let mut cuts = Cuts::default();
        let mut buffer = Vec::with_capacity(2 * WRITE_CHUNK);
        let mut last_commit = Instant::now();
        // Run on a blocking thread of the runtime: its timers are at hand.
        let runtime = tokio::runtime::Handle::current();
        loop {
            let routed = match events.try_recv() {
                Ok(r) => r,
                Err(mpsc::error::TryRecvError::Empty) => {
                    self.write_out(&mut buffer)?;
                    // Commit once the queue stays dry for what is left of
                    // the gap, and again every gap while cuts wait for the
                    // logs' fsyncs.
                    let next = loop {
                        if cuts.is_empty() {
                            break events.blocking_recv();
                        }
                        let gap = COMMIT_GAP.saturating_sub(last_commit.elapsed());
                        if !gap.is_zero()
                            && let Ok(next) =
                                runtime.block_on(tokio::time::timeout(gap, events.recv()))
                        {
                            break next;
                        }
                        self.commit(&mut buffer, cuts.take_durable(&self.logs), &sources)?;
                        last_commit = Instant::now();
                    };
                    match next {
                        Some(r) => r,
                        None => break,
                    }
                }
                Err(mpsc::error::TryRecvError::Disconnected) => break,
            };
            let (source, cursor) = sources
                .entry(routed.source.name.clone())
                .or_insert_with(|| (routed.source.clone(), SourceCursor::default()));
            for event in routed.events {
                if let SourceEvent::Commit(info) = &event {
                    self.unwritten.push((source.clone(), info.commit_time));
                }
                write_event(
                    &self.config.name,
                    &encoder,
                    &mut buffer,
                    source,
                    cursor,
                    event,
                )?;
            }
            if let Some(position) = routed.position {
                positions.insert(routed.source.name.clone(), position);
                // A cut the cursor can describe: no source is inside a transaction.
                if sources.values().all(|(_, c)| c.transaction.is_none()) {
                    cuts.push(NextCursor {
                        output_len: self.output.resume_len().map(|l| l + buffer.len() as u64),
                        positions: positions.clone(),
                    });
                }
            }
            if buffer.len() >= WRITE_CHUNK {
                self.write(&mut buffer)?;
            }
            if last_commit.elapsed() >= COMMIT_INTERVAL {
                self.commit(&mut buffer, cuts.take_durable(&self.logs), &sources)?;
                last_commit = Instant::now();
            }
        }
        self.commit(&mut buffer, cuts.take_durable(&self.logs), &sources)
    }

    fn write(&mut self, buffer: &mut Vec<u8>) -> Result<(), JsonlError> {
        let path = &self.config.path;
        self.output
            .write_all(buffer)
            .map_err(output(|| format!("cannot write to {path}")))?;
        buffer.clear();
        for (source, commit_time) in self.unwritten.drain(..) {
            source.delays.applied(commit_time);
        }
        Ok(())
    }

    /// Writes `buffer` and hands it to the reader (flushed, not fsynced).
    fn write_out(&mut self, buffer: &mut Vec<u8>) -> Result<(), JsonlError> {
        self.write(buffer)?;
        let path = &self.config.path;
        self.output
            .hand_over()
            .map_err(output(|| format!("cannot flush {path}")))
    }

    /// Makes everything written durable, stores `next_cursor`,
    /// then acknowledges its positions.
    fn commit(
        &mut self,
        buffer: &mut Vec<u8>,
        next_cursor: Option<NextCursor>,
        sources: &HashMap<String, (Arc<SourceContext>, SourceCursor)>,
    ) -> Result<(), JsonlError> {
        if buffer.is_empty() && next_cursor.is_none() {
            return Ok(());
        }
        self.write(buffer)?;
        let path = &self.config.path;
        self.output
            .make_durable()
            .map_err(output(|| format!("cannot flush {path}")))?;
        let Some(next_cursor) = next_cursor else {
            return Ok(());
        };
        for (name, position) in &next_cursor.positions {
            if let Some((source, _)) = sources.get(name) {
                self.cursor.positions.insert(
                    name.clone(),
                    CursorPosition {
                        log: source.log_id.clone(),
                        next: position.next,
                    },
                );
            }
        }
        self.cursor.consumer = match next_cursor.output_len {
            Some(output_len) => serde_json::json!({ "output_len": output_len }),
            None => serde_json::Value::Null,
        };
        self.cursor_file.store(&self.cursor)?;
        for (name, position) in next_cursor.positions {
            if let Some((source, _)) = sources.get(&name) {
                source.acked.send_replace(position);
            }
        }
        Ok(())
    }
}

/// A cursor the sink may store: a point in the output it can describe.
struct NextCursor {
    /// Bytes of output up to the point (for a file).
    output_len: Option<u64>,
    /// Every source's position at the point.
    positions: HashMap<String, LogPosition>,
}

/// Points of the output the cursor can describe, oldest first, until their
/// logs hold them durably: only then is one stored and acknowledged.
#[derive(Default)]
struct Cuts {
    pending: VecDeque<NextCursor>,
}

impl Cuts {
    /// At most this many wait (a few hundred transactions' worth: a log's
    /// fsync comes every few milliseconds); past it, the newest takes the
    /// place of the one before it, so a log whose fsyncs stall only makes
    /// the cursor stored next older.
    const MAX: usize = 256;

    fn push(&mut self, cut: NextCursor) {
        if self.pending.len() >= Self::MAX {
            self.pending.pop_back();
        }
        self.pending.push_back(cut);
    }

    fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Takes the newest cut every log holds durably, and those before it.
    fn take_durable(&mut self, logs: &HashMap<String, Log>) -> Option<NextCursor> {
        let durable = |cut: &NextCursor| {
            cut.positions.iter().all(|(source, position)| {
                // Every source the sink is given was resumed with its log.
                logs.get(source)
                    .is_none_or(|log| log.head().next_seq >= position.next)
            })
        };
        let mut newest = None;
        while self.pending.front().is_some_and(durable) {
            newest = self.pending.pop_front();
        }
        newest
    }
}

/// Where an event outside any transaction is: its source.
fn outside(source: &SourceContext) -> Position<'_> {
    Position {
        source: &source.name,
        database: &source.database,
        transaction: None,
    }
}

fn write_event(
    sink: &str,
    encoder: &Encoder,
    out: &mut Vec<u8>,
    source: &SourceContext,
    cursor: &mut SourceCursor,
    event: SourceEvent,
) -> Result<(), JsonlError> {
    match event {
        SourceEvent::Snapshot(batch) => {
            seen(&mut cursor.tables, &batch.relation);
            encoder
                .snapshot_rows(out, &outside(source), &batch)
                .map_err(|source| JsonlError::Rows {
                    table: format!("{}.{}", batch.relation.schema, batch.relation.name),
                    source,
                })?;
        }
        SourceEvent::SnapshotComplete { .. } => {}
        SourceEvent::Begin(info) => cursor.transaction = Some(info),
        SourceEvent::Change(change) => {
            let SourceCursor {
                transaction,
                tables,
            } = cursor;
            // A unit for another sink (`resync --sink`): nothing of it.
            if transaction.as_ref().is_some_and(|t| t.passes_over(sink)) {
                return Ok(());
            }
            let at = Position {
                source: &source.name,
                database: &source.database,
                transaction: transaction.as_deref(),
            };
            if let Change::Insert { relation, .. }
            | Change::Update { relation, .. }
            | Change::Delete { relation, .. }
            | Change::Read { relation, .. } = &change
            {
                describe(tables, encoder, out, &at, relation, change.lsn());
            }
            encoder.change(out, &at, &change);
        }
        SourceEvent::Commit(_) => cursor.transaction = None,
        SourceEvent::Message(m) => encoder.message(out, &outside(source), &m),
        SourceEvent::Sequences(values) => encoder.sequences(out, &outside(source), &values),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut(content: &[u8]) -> Vec<u8> {
        let dir = std::env::temp_dir().join(format!(
            "walbridge-cut-{}-{}",
            std::process::id(),
            content.len()
        ));
        std::fs::write(&dir, content).unwrap_or_else(|e| panic!("{e}"));
        let file = File::options()
            .read(true)
            .append(true)
            .open(&dir)
            .unwrap_or_else(|e| panic!("{e}"));
        cut_torn_line(&file).unwrap_or_else(|e| panic!("{e}"));
        let out = std::fs::read(&dir).unwrap_or_default();
        let _ = std::fs::remove_file(&dir);
        out
    }

    #[test]
    fn torn_last_lines_are_cut() {
        assert_eq!(cut(b"{\"a\":1}\n{\"b\":"), b"{\"a\":1}\n");
        assert_eq!(cut(b"{\"a\":1}\n"), b"{\"a\":1}\n");
        assert_eq!(cut(b"no newline at all"), b"");
        assert_eq!(cut(b""), b"");
        let mut long = vec![b'x'; 200_000];
        long.insert(10, b'\n');
        assert_eq!(cut(&long), &long[..11]);
    }
}
