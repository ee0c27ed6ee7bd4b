//! Progress bars of the initial copy, for `walbridge run` with text logs
//! on a terminal: a bar for each table being copied and a line for each
//! copying source, redrawn from the pipeline's counters ten times a second.
//!
//! Log lines go through [`Bars::make_writer`], which lifts the bars off the
//! screen while a line is written and draws them again under it, so lines
//! and bars never overwrite each other. The periodic "copying table" lines
//! are left out then ([`COPY_PROGRESS_TARGET`]): the bars say the same.
//! Elsewhere (a file, a pipe, JSON logs, or a terminal a sink writes its
//! own lines to) nothing here runs and those lines are written as usual.

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use indicatif::{HumanBytes, MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use walbridge_runtime::status::Observed;
use walbridge_source::SourcePhase;
pub use walbridge_source::snapshot::COPY_PROGRESS_TARGET;

/// How often the bars are brought up to date.
const REDRAW: Duration = Duration::from_millis(100);

/// The bars of one terminal (stderr).
pub struct Bars {
    multi: MultiProgress,
}

impl Bars {
    /// Bars drawn on stderr.
    pub fn new() -> Self {
        Bars {
            multi: MultiProgress::with_draw_target(ProgressDrawTarget::stderr()),
        }
    }

    /// A writer for log lines: each line is written with the bars lifted.
    pub fn make_writer(&self) -> impl Fn() -> LineWriter + Send + Sync + 'static {
        let multi = self.multi.clone();
        move || LineWriter(multi.clone())
    }

    /// Draws the copy of `observed`'s sources until the returned guard is
    /// dropped, which clears the bars.
    pub fn follow(&self, observed: Arc<Observed>) -> Following {
        let stop = Arc::new(AtomicBool::new(false));
        let drawing = Drawing {
            multi: self.multi.clone(),
            observed,
            bars: HashMap::new(),
        };
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("progress-bars".into())
            .spawn(move || drawing.run(&stopped))
            .map_err(|e| {
                tracing::warn!("cannot draw progress bars ({e}); the copy goes on without them")
            })
            .ok();
        Following { stop, thread }
    }
}

/// Writes a log line with the bars lifted off the screen.
pub struct LineWriter(MultiProgress);

impl Write for LineWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // The formatter writes each event whole, so a line is never split.
        self.0.suspend(|| std::io::stderr().write_all(buf))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// Draws bars while it lives.
pub struct Following {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Following {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What a bar shows.
#[derive(Clone, PartialEq, Eq, Hash)]
enum Shown {
    /// A source that is copying: tables done of all, rows, bytes.
    Source(String),
    /// A table being copied, of a source.
    Table(String, String),
}

struct Drawing {
    multi: MultiProgress,
    observed: Arc<Observed>,
    bars: HashMap<Shown, ProgressBar>,
}

impl Drawing {
    fn run(mut self, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            self.update();
            std::thread::sleep(REDRAW);
        }
        for (_, bar) in self.bars.drain() {
            bar.finish_and_clear();
        }
        let _ = self.multi.clear();
    }

    /// Adds bars for what began, moves them on, takes away what ended.
    fn update(&mut self) {
        let mut live = Vec::new();
        let observed = self.observed.clone();
        for source in &observed.sources {
            if source.stats.phase() != SourcePhase::Copying {
                continue;
            }
            let snapshot = &source.stats.snapshot;
            let overall = Shown::Source(source.name.clone());
            let bar = self.bar(&overall, None);
            bar.set_message(format!(
                "{} of {} tables, {} rows, {}",
                snapshot.tables_done.load(Ordering::Relaxed),
                snapshot.tables_total.load(Ordering::Relaxed),
                snapshot.rows.load(Ordering::Relaxed),
                HumanBytes(snapshot.bytes.load(Ordering::Relaxed)),
            ));
            bar.tick();
            live.push(overall);
            for table in snapshot.tables() {
                let Some(elapsed) = table.elapsed().filter(|_| !table.done()) else {
                    continue;
                };
                let shown = Shown::Table(source.name.clone(), table.table().to_owned());
                let rows = table.rows();
                // An estimate that turned out low is stretched to what was seen.
                let bar = self.bar(&shown, table.estimate().map(|e| e.max(rows)));
                bar.set_position(rows);
                let rate = table.bytes() as f64 / elapsed.as_secs_f64().max(0.001);
                let left = table
                    .seconds_left()
                    .map(|s| format!(", about {s} s left"))
                    .unwrap_or_default();
                bar.set_message(format!(
                    "{}, {}/s{left}",
                    HumanBytes(table.bytes()),
                    HumanBytes(rate as u64)
                ));
                bar.tick();
                live.push(shown);
            }
        }
        self.bars.retain(|shown, bar| {
            let keep = live.contains(shown);
            if !keep {
                bar.finish_and_clear();
                self.multi.remove(bar);
            }
            keep
        });
    }

    /// The bar of `shown`, made on first use: with a length (rows expected)
    /// a bar, without one a spinner.
    fn bar(&mut self, shown: &Shown, length: Option<u64>) -> &ProgressBar {
        let multi = &self.multi;
        let bar = self.bars.entry(shown.clone()).or_insert_with(|| {
            let bar = multi.add(ProgressBar::no_length());
            let (template, prefix) = match shown {
                Shown::Source(name) => ("{prefix} {spinner} {msg}", format!("source {name}:")),
                Shown::Table(_, table) if length.is_some() => (
                    "  {prefix} [{bar:30}] {percent:>3}% {human_pos}/{human_len} rows, {msg}",
                    table.clone(),
                ),
                Shown::Table(_, table) => (
                    "  {prefix} {spinner} {human_pos} rows, {msg}",
                    table.clone(),
                ),
            };
            // The templates are fixed: one that did not parse is a bug
            // shown as the plain default, not a reason to stop copying.
            let style = ProgressStyle::with_template(template)
                .map(|s| s.progress_chars("=> "))
                .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar.set_prefix(prefix);
            bar
        });
        if let Some(length) = length {
            bar.set_length(length);
        }
        bar
    }
}
