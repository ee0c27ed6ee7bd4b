//! The `jsonl` sink: newline-delimited JSON to standard output or a file.
//!
//! Runs on its own thread with blocking writes. Events are written in the
//! order received; after each burst the output is flushed (and, for a
//! file, fsynced), and only then is each source's position acknowledged —
//! so a position is confirmed to the publisher only once its lines are
//! durable.

mod config;
mod encoder;

pub use config::JsonlSinkConfig;
pub use encoder::{Encoder, Position};

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::sync::Arc;

use anyhow::Context;
use tokio::sync::mpsc;
use walbridge_core::{Lsn, SourceEvent, TransactionInfo};

use super::{Routed, SourceContext};

/// Bytes buffered before a write, also inside a burst.
const WRITE_CHUNK: usize = 1 << 20;

enum Output {
    Stdout(std::io::Stdout),
    /// A regular file, fsynced to make writes durable.
    File(File),
    /// A device or pipe (`/dev/null`, a FIFO): nothing to fsync.
    Stream(File),
}

impl Output {
    fn open(path: &str) -> anyhow::Result<Self> {
        if path == "-" {
            return Ok(Output::Stdout(std::io::stdout()));
        }
        let file = File::options()
            .create(true)
            .read(true)
            .append(true)
            .open(path)
            .with_context(|| format!("cannot open {path} for appending"))?;
        let regular = file
            .metadata()
            .with_context(|| format!("cannot stat {path}"))?
            .is_file();
        if !regular {
            return Ok(Output::Stream(file));
        }
        cut_torn_line(&file).with_context(|| format!("cannot repair the end of {path}"))?;
        Ok(Output::File(file))
    }

    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Output::Stdout(s) => s.lock().write_all(bytes),
            Output::File(f) | Output::Stream(f) => f.write_all(bytes),
        }
    }

    fn make_durable(&mut self) -> std::io::Result<()> {
        match self {
            Output::Stdout(s) => s.lock().flush(),
            Output::File(f) => f.sync_data(),
            Output::Stream(f) => f.flush(),
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

/// Per source: the transaction being written and the last position written.
#[derive(Default)]
struct SourceCursor {
    transaction: Option<Arc<TransactionInfo>>,
    written: Lsn,
}

/// A jsonl sink ready to run.
pub struct JsonlSink {
    config: JsonlSinkConfig,
    output: Output,
}

impl JsonlSink {
    /// Opens the output (the health check: a path that cannot be opened fails here).
    pub fn open(config: JsonlSinkConfig) -> anyhow::Result<Self> {
        let output =
            Output::open(&config.path).with_context(|| format!("sink `{}`", config.name))?;
        Ok(JsonlSink { config, output })
    }

    /// Writes every event from `events` until the channel closes.
    pub fn run(mut self, mut events: mpsc::Receiver<Routed>) -> anyhow::Result<()> {
        let encoder = Encoder::new(&self.config.unchanged_toast_placeholder);
        let mut cursors: HashMap<usize, (Arc<SourceContext>, SourceCursor)> = HashMap::new();
        let mut buffer = Vec::with_capacity(2 * WRITE_CHUNK);
        let name = self.config.name.clone();
        while let Some(first) = events.blocking_recv() {
            let mut next = Some(first);
            while let Some(routed) = next.take() {
                // The context lives as long as the map holds it, so its address is a stable key.
                let key = Arc::as_ptr(&routed.source) as usize;
                let (source, cursor) = cursors
                    .entry(key)
                    .or_insert_with(|| (routed.source.clone(), SourceCursor::default()));
                for event in routed.events {
                    write_event(&encoder, &mut buffer, source, cursor, event);
                }
                if buffer.len() >= WRITE_CHUNK {
                    self.output
                        .write_all(&buffer)
                        .with_context(|| format!("sink `{name}`: write failed"))?;
                    buffer.clear();
                }
                next = events.try_recv().ok();
            }
            self.output
                .write_all(&buffer)
                .with_context(|| format!("sink `{name}`: write failed"))?;
            buffer.clear();
            self.output
                .make_durable()
                .with_context(|| format!("sink `{name}`: flush failed"))?;
            for (source, cursor) in cursors.values() {
                source.flushed.send_if_modified(|acked| {
                    let advance = cursor.written > *acked;
                    if advance {
                        *acked = cursor.written;
                    }
                    advance
                });
            }
        }
        Ok(())
    }
}

fn write_event(
    encoder: &Encoder,
    out: &mut Vec<u8>,
    source: &SourceContext,
    cursor: &mut SourceCursor,
    event: SourceEvent,
) {
    match event {
        SourceEvent::Snapshot(batch) => {
            let at = Position {
                source: &source.name,
                database: &source.database,
                transaction: None,
            };
            for row in &batch.rows {
                encoder.snapshot_row(out, &at, &batch.relation, row, batch.consistent_point);
            }
        }
        SourceEvent::SnapshotComplete { consistent_point } => {
            cursor.written = cursor.written.max(consistent_point)
        }
        SourceEvent::Begin(info) => cursor.transaction = Some(info),
        SourceEvent::Change(change) => {
            let at = Position {
                source: &source.name,
                database: &source.database,
                transaction: cursor.transaction.as_deref(),
            };
            encoder.change(out, &at, &change);
        }
        SourceEvent::Commit(info) => {
            cursor.written = cursor.written.max(info.end_lsn);
            cursor.transaction = None;
        }
        SourceEvent::Message(m) => {
            let at = Position {
                source: &source.name,
                database: &source.database,
                transaction: None,
            };
            encoder.message(out, &at, &m);
        }
    }
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
