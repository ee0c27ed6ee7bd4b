//! The admin endpoint's `/`: a status page for people. Server-rendered
//! HTML with no script and no external asset (it must work where only the
//! admin port is reachable, and without JavaScript); it reloads itself.
//! Sparklines are inline SVG over [`History`]: the last 15 minutes, a
//! sample every [`History::INTERVAL`].

use std::collections::VecDeque;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use crate::status::{Observed, SinkInputStatus, SinkState, SourceStatus, Status};

/// Lag and throughput over the last 15 minutes.
#[derive(Debug, Default)]
pub struct History {
    samples: Mutex<VecDeque<Sample>>,
}

/// What one sample keeps.
#[derive(Debug, Clone)]
struct Sample {
    at: SystemTime,
    /// Per source: changes put in its log so far, and WAL bytes it is
    /// behind the publisher (when known).
    sources: Vec<(u64, Option<u64>)>,
    /// Per sink, per source it reads: its cursor and its lag in bytes.
    sinks: Vec<Vec<(u64, u64)>>,
}

impl History {
    /// Time between two samples.
    pub const INTERVAL: Duration = Duration::from_secs(10);
    /// Samples kept: 15 minutes.
    const KEPT: usize = 90;

    /// Samples `status` now.
    pub fn sample(&self, status: &Status) {
        let sample = Sample {
            at: SystemTime::now(),
            sources: status
                .sources
                .iter()
                .map(|s| {
                    let changes = s.changes.values().sum();
                    (changes, s.slot.as_ref().map(|slot| slot.lag_bytes))
                })
                .collect(),
            sinks: status
                .sinks
                .iter()
                .map(|sink| {
                    sink.sources
                        .iter()
                        .map(|input| (input.cursor, input.lag_bytes))
                        .collect()
                })
                .collect(),
        };
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        if samples.len() == Self::KEPT {
            samples.pop_front();
        }
        samples.push_back(sample);
    }

    fn samples(&self) -> Vec<Sample> {
        self.samples
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }
}

/// One series of a sparkline: (seconds before now, value).
type Series = Vec<(f64, f64)>;

/// Values over time, and rates: per second between consecutive samples.
fn series(samples: &[Sample], value: impl Fn(&Sample) -> Option<f64>) -> Series {
    let now = SystemTime::now();
    samples
        .iter()
        .filter_map(|s| {
            let ago = now.duration_since(s.at).unwrap_or_default().as_secs_f64();
            value(s).map(|v| (ago, v))
        })
        .collect()
}

fn rates(samples: &[Sample], count: impl Fn(&Sample) -> Option<u64>) -> Series {
    let now = SystemTime::now();
    samples
        .windows(2)
        .filter_map(|pair| {
            let seconds = pair[1].at.duration_since(pair[0].at).ok()?.as_secs_f64();
            let grown = count(&pair[1])?.saturating_sub(count(&pair[0])?);
            let ago = now.duration_since(pair[1].at).unwrap_or_default();
            (seconds > 0.0).then(|| (ago.as_secs_f64(), grown as f64 / seconds))
        })
        .collect()
}

/// Renders the page.
pub fn render(observed: &Observed, history: &History) -> String {
    let status = observed.status();
    let samples = history.samples();
    let mut page = String::with_capacity(16 * 1024);
    let (verdict, class) = if status.ready {
        ("ready", "good")
    } else {
        ("not ready", "bad")
    };
    let _ = write!(
        page,
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="10">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>walbridge: {verdict}</title>
<style>{STYLE}</style></head>
<body><header><h1>walbridge</h1><p class="verdict {class}" id="verdict">{verdict}</p></header>
"#
    );
    if !status.unready.is_empty() {
        page.push_str("<ul class=\"reasons\">");
        for reason in &status.unready {
            let _ = write!(page, "<li>{}</li>", escape(reason));
        }
        page.push_str("</ul>\n");
    }
    page.push_str("<h2>Sources</h2>\n");
    for (i, source) in status.sources.iter().enumerate() {
        source_section(&mut page, source, &samples, i);
    }
    page.push_str("<h2>Sinks</h2>\n");
    for (i, sink) in status.sinks.iter().enumerate() {
        let class = match sink.state {
            SinkState::Running | SinkState::Paused => "good",
            SinkState::Starting | SinkState::Retrying => "warn",
            SinkState::Stopped => "bad",
        };
        let _ = writeln!(
            page,
            r#"<section class="sink" id="sink-{name}"><h3>{name} <span class="state {class}">{state}</span></h3>"#,
            name = escape(&sink.name),
            state = sink.state.as_str(),
        );
        if let Some(error) = &sink.last_error {
            let _ = writeln!(
                page,
                "<p class=\"error\"><b>Last error</b> ({} failed attempts): {}</p>",
                sink.failures,
                escape(error)
            );
        }
        for (j, input) in sink.sources.iter().enumerate() {
            input_row(&mut page, input, &samples, i, j);
        }
        page.push_str("</section>\n");
    }
    let _ = write!(
        page,
        "<footer>A sample every {} s, the last 15 minutes; this page reloads every 10 s. \
         Also: <a href=\"status\">/status</a> (JSON), <a href=\"metrics\">/metrics</a>.</footer>\n</body></html>\n",
        History::INTERVAL.as_secs()
    );
    page
}

fn source_section(page: &mut String, source: &SourceStatus, samples: &[Sample], i: usize) {
    let class = match source.state {
        "copying" | "streaming" => "good",
        "starting" | "reconnecting" => "warn",
        _ => "bad",
    };
    let _ = write!(
        page,
        r#"<section class="source" id="source-{name}"><h3>{name} <span class="state {class}">{state}</span></h3>
<table><tr><th>received</th><td>{received}</td><th>confirmed</th><td>{confirmed}</td><th>transactions</th><td>{transactions}</td></tr>
"#,
        name = escape(&source.name),
        state = source.state,
        received = source.received_lsn,
        confirmed = source.confirmed_lsn,
        transactions = source.transactions,
    );
    match &source.slot {
        Some(slot) => {
            let _ = writeln!(
                page,
                "<tr><th>publisher at</th><td>{}</td><th>behind it</th><td>{}</td><th>slot</th><td>{}{}</td></tr>",
                slot.current_lsn,
                bytes(slot.lag_bytes),
                escape(slot.wal_status.as_deref().unwrap_or(if slot.exists {
                    "exists"
                } else {
                    "missing"
                })),
                slot.safe_wal_size
                    .map(|b| format!(", {} safe", bytes(b.max(0) as u64)))
                    .unwrap_or_default(),
            );
        }
        None => page.push_str("<tr><th>publisher</th><td colspan=\"5\">not polled yet</td></tr>\n"),
    }
    if source.snapshot.tables_total > 0 {
        let _ = writeln!(
            page,
            "<tr><th>copy</th><td colspan=\"5\">{} of {} tables, {} rows, {}</td></tr>",
            source.snapshot.tables_done,
            source.snapshot.tables_total,
            source.snapshot.rows,
            bytes(source.snapshot.bytes)
        );
        for table in source
            .snapshot
            .tables
            .iter()
            .filter(|t| t.state == "copying")
        {
            let share = table
                .estimated_rows
                .map(|n| format!(" of about {n} ({}%)", (table.rows * 100 / n.max(1)).min(99)))
                .unwrap_or_default();
            let _ = writeln!(
                page,
                "<tr><th>copying</th><td colspan=\"5\">{}: {} rows{share}, {}</td></tr>",
                escape(&table.table),
                table.rows,
                bytes(table.bytes)
            );
        }
    }
    let _ = write!(
        page,
        "<tr><th>log</th><td colspan=\"5\">records {}–{}, {}, segments: {}</td></tr></table>\n<div class=\"charts\">",
        source.log.first_record,
        source.log.next_record,
        bytes(source.log.bytes),
        source.log.segments
    );
    sparkline(
        page,
        "changes/s",
        &rates(samples, |s| s.sources.get(i).map(|x| x.0)),
        |v| format!("{v:.0}/s"),
    );
    sparkline(
        page,
        "behind the publisher",
        &series(samples, |s| s.sources.get(i)?.1.map(|b| b as f64)),
        |v| bytes(v as u64),
    );
    page.push_str("</div></section>\n");
}

fn input_row(page: &mut String, input: &SinkInputStatus, samples: &[Sample], i: usize, j: usize) {
    let lag_seconds = input
        .lag_seconds
        .map_or_else(|| "—".to_owned(), |s| format!("{s:.1} s"));
    let _ = write!(
        page,
        r#"<h4>from {source}</h4><table><tr><th>cursor</th><td>{cursor}</td><th>acknowledged</th><td>{acked}</td></tr>
<tr><th>lag</th><td colspan="3">{records} records, {lag_bytes}, {lag_seconds}</td></tr></table>
<div class="charts">"#,
        source = escape(&input.source),
        cursor = input.cursor,
        acked = input.acked_lsn,
        records = input.lag_records,
        lag_bytes = bytes(input.lag_bytes),
    );
    let at = |s: &Sample| s.sinks.get(i).and_then(|inputs| inputs.get(j)).copied();
    sparkline(
        page,
        "records/s",
        &rates(samples, |s| at(s).map(|x| x.0)),
        |v| format!("{v:.0}/s"),
    );
    sparkline(
        page,
        "lag",
        &series(samples, |s| at(s).map(|x| x.1 as f64)),
        |v| bytes(v as u64),
    );
    page.push_str("</div>\n");
}

/// An inline SVG line from the oldest sample kept (at most 15 minutes
/// ago) to now, labelled with its newest and highest values.
fn sparkline(page: &mut String, title: &str, series: &Series, label: impl Fn(f64) -> String) {
    const WIDTH: f64 = 300.0;
    const HEIGHT: f64 = 48.0;
    let span = series
        .iter()
        .map(|p| p.0)
        .fold(History::INTERVAL.as_secs_f64(), f64::max);
    let _ = write!(page, "<figure><figcaption>{}", escape(title));
    if series.len() < 2 {
        page.push_str(" <i>(collecting)</i></figcaption></figure>");
        return;
    }
    let high = series.iter().map(|p| p.1).fold(0.0_f64, f64::max);
    let newest = series.last().map_or(0.0, |p| p.1);
    let _ = write!(
        page,
        " <b>{}</b> (highest {}, last {})</figcaption><svg class=\"sparkline\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" width=\"{WIDTH}\" height=\"{HEIGHT}\" role=\"img\" aria-label=\"{}\"><polyline points=\"",
        label(newest),
        label(high),
        if span < 120.0 {
            format!("{span:.0} s")
        } else {
            format!("{:.0} min", span / 60.0)
        },
        escape(title)
    );
    for (ago, value) in series {
        let x = WIDTH * (1.0 - (ago / span).min(1.0));
        let y = if high > 0.0 {
            HEIGHT - 2.0 - (HEIGHT - 4.0) * value / high
        } else {
            HEIGHT - 2.0
        };
        let _ = write!(page, "{x:.1},{y:.1} ");
    }
    page.push_str("\"/></svg></figure>");
}

/// Bytes for people.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Text made safe for HTML.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em auto;max-width:1100px;color:#222}\
header{display:flex;align-items:baseline;gap:1em}h1{margin:0}\
.verdict,.state{padding:.1em .5em;border-radius:.3em;font-weight:600}\
.good{background:#d8f3dc;color:#1b4332}.warn{background:#fff3bf;color:#5c3c00}.bad{background:#ffd6d6;color:#7a0010}\
section{border:1px solid #ddd;border-radius:.4em;padding:.2em 1em .8em;margin:.8em 0}\
table{border-collapse:collapse}th{text-align:left;font-weight:500;color:#555;padding-right:.5em}td{padding-right:1.5em;font-family:ui-monospace,monospace}\
.charts{display:flex;flex-wrap:wrap;gap:1.5em}figure{margin:.5em 0}figcaption{font-size:12px;color:#555}\
.sparkline{display:block;background:#f7f7f7}.sparkline polyline{fill:none;stroke:#1c7ed6;stroke-width:1.5}\
.error{background:#fff0f0;padding:.4em;border-left:3px solid #c92a2a;white-space:pre-wrap}footer{color:#777;font-size:12px;margin-top:2em}";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_and_bytes_read_well() {
        assert_eq!(escape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&#39;");
        assert_eq!(bytes(999), "999 B");
        assert_eq!(bytes(1_500), "1.5 kB");
        assert_eq!(bytes(2_000_000_000), "2.0 GB");
    }

    #[test]
    fn rates_are_per_second_between_samples() {
        let now = SystemTime::now();
        let at = |ago: u64, changes: u64| Sample {
            at: now - Duration::from_secs(ago),
            sources: vec![(changes, None)],
            sinks: Vec::new(),
        };
        let samples = [at(20, 100), at(10, 300), at(0, 300)];
        let r = rates(&samples, |s| Some(s.sources[0].0));
        assert_eq!(r.len(), 2);
        assert!((r[0].1 - 20.0).abs() < 0.01, "{r:?}");
        assert_eq!(r[1].1, 0.0);
    }

    #[test]
    fn a_sparkline_needs_two_points_and_scales_to_the_highest() {
        let mut page = String::new();
        sparkline(&mut page, "lag", &vec![(0.0, 5.0)], |v| v.to_string());
        assert!(page.contains("collecting") && !page.contains("<svg"));
        page.clear();
        sparkline(&mut page, "lag", &vec![(900.0, 0.0), (0.0, 10.0)], |v| {
            v.to_string()
        });
        assert!(page.contains("points=\"0.0,46.0 300.0,2.0 \""), "{page}");
    }
}
