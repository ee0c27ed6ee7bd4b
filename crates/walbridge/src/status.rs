//! `walbridge status`: every source and sink, like `pg_stat_subscription`
//! and `pg_replication_slots` — asked of the running walbridge through its
//! admin endpoint, or, when none runs, read from the data_dir (the sinks'
//! stored cursors) and the publisher (each source's slot).

use serde_json::Value;
use walbridge_runtime::config::SourceSpec;
use walbridge_runtime::{Config, admin, data_dir, pipeline};
use walbridge_source::Source;

use crate::{EXIT_CONFIG, Failure, load};

/// Prints the status of the configuration at `path`; as JSON with `json`.
pub async fn status(path: &std::path::Path, json: bool) -> Result<(), Failure> {
    let config = load(path)?;
    let status = match data_dir::DataDirLock::holder(&config.data_dir) {
        Some(pid) => {
            let mut status = admin::running_status(&config.admin, &config.data_dir)
                .await
                .map_err(|e| Failure::from(anyhow::Error::new(e).context(format!(
                    "walbridge runs on this data_dir (pid {pid}) but its admin endpoint gives no status (is [admin] listen = \"\", or the token in this environment not the one it runs with?)"
                ))))?;
            status["running"] = Value::Bool(true);
            status["pid"] = pid.into();
            status
        }
        None => stopped_status(&config).await?,
    };
    if json {
        println!("{status:#}");
    } else {
        print!("{}", human(&status));
    }
    Ok(())
}

/// What can be known without the process: each source's slot, each
/// sink's stored cursor.
async fn stopped_status(config: &Config) -> Result<Value, Failure> {
    let mut sources = Vec::new();
    for spec in &config.sources {
        let source_config = match spec {
            SourceSpec::Postgres(source_config) => source_config,
            SourceSpec::Feed(feed) => {
                sources.push(serde_json::json!({
                    "name": feed.name,
                    "state": "stopped",
                    "feed": { "url": feed.url, "consumer": feed.consumer_name() },
                }));
                continue;
            }
        };
        let source = Source::new(source_config.clone(), &config.data_dir).map_err(|e| Failure {
            code: EXIT_CONFIG,
            error: e.into(),
        })?;
        let slot = match source.slot().await {
            Ok(Some(slot)) => serde_json::json!({
                "name": source_config.slot_name(),
                "active": slot.active,
                "confirmed_flush_lsn": slot.confirmed_flush.map(|l| l.to_string()),
                "wal_status": slot.wal_status,
            }),
            Ok(None) => serde_json::json!({ "name": source_config.slot_name(), "exists": false }),
            Err(e) => {
                serde_json::json!({ "name": source_config.slot_name(), "error": e.to_string() })
            }
        };
        sources.push(serde_json::json!({
            "name": source_config.name,
            "state": "stopped",
            "slot": slot,
        }));
    }
    let cursor_dir = pipeline::cursor_dir(&config.data_dir);
    let mut sinks = Vec::new();
    for sink_config in &config.sinks {
        let opened = sink_config.open(&cursor_dir);
        let inputs: Vec<Value> = config
            .sources
            .iter()
            .filter(|s| walbridge_sink::reads(sink_config.as_ref(), s.name()))
            .map(|s| {
                let cursor = opened
                    .as_ref()
                    .ok()
                    .and_then(|sink| sink.stored_cursor(s.name()));
                serde_json::json!({
                    "source": s.name(),
                    "cursor": cursor.map(|c| c.next),
                })
            })
            .collect();
        let mut sink = serde_json::json!({
            "name": sink_config.name(),
            "state": "stopped",
            "sources": inputs,
        });
        if let Err(e) = opened {
            sink["last_error"] = Value::String(e.to_string());
        }
        sinks.push(sink);
    }
    Ok(serde_json::json!({
        "running": false,
        "ready": false,
        "sources": sources,
        "sinks": sinks,
    }))
}

/// The status for people: a line per source and per sink's source.
fn human(status: &Value) -> String {
    let text = |v: &Value| match v {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut out = String::new();
    if status["running"] == true {
        out.push_str(&format!(
            "walbridge is running (pid {}): {}\n",
            text(&status["pid"]),
            if status["ready"] == true {
                "ready".to_owned()
            } else {
                let reasons: Vec<String> = status["unready"]
                    .as_array()
                    .map(|r| r.iter().map(text).collect())
                    .unwrap_or_default();
                format!("not ready: {}", reasons.join("; "))
            }
        ));
    } else {
        out.push_str("walbridge is not running on this data_dir\n");
    }
    for source in status["sources"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "source {}: {}",
            text(&source["name"]),
            text(&source["state"])
        ));
        if status["running"] == true {
            out.push_str(&format!(
                ", received {}, confirmed {}, {} transactions, log records {}..{}",
                text(&source["received_lsn"]),
                text(&source["confirmed_lsn"]),
                text(&source["transactions"]),
                text(&source["log"]["first_record"]),
                text(&source["log"]["next_record"]),
            ));
        } else {
            let slot = &source["slot"];
            out.push_str(&format!(", slot {}", text(&slot["name"])));
            if slot["exists"] == false {
                out.push_str(" does not exist");
            } else if !slot["error"].is_null() {
                out.push_str(&format!(": {}", text(&slot["error"])));
            } else {
                out.push_str(&format!(
                    ": confirmed {}, wal_status {}, {}",
                    text(&slot["confirmed_flush_lsn"]),
                    text(&slot["wal_status"]),
                    if slot["active"] == true {
                        "in use"
                    } else {
                        "not in use"
                    }
                ));
            }
        }
        out.push('\n');
        let tables = source["snapshot"]["tables"]
            .as_array()
            .into_iter()
            .flatten();
        for table in tables.filter(|t| t["state"] == "copying") {
            let estimate = match table["estimated_rows"].as_u64() {
                Some(n) => format!(" of about {n}"),
                None => String::new(),
            };
            out.push_str(&format!(
                "  copying {}: {} rows{estimate}, {} bytes\n",
                text(&table["table"]),
                text(&table["rows"]),
                text(&table["bytes"]),
            ));
        }
        for copy in source["copies"].as_array().into_iter().flatten() {
            let up_to = match copy["up_to"].as_array() {
                Some(key) => format!(
                    ", up to key ({})",
                    key.iter().map(text).collect::<Vec<_>>().join(", ")
                ),
                None => String::new(),
            };
            out.push_str(&format!(
                "  copying {} while streaming ({}): {} rows{up_to}\n",
                text(&copy["table"]),
                text(&copy["mode"]),
                text(&copy["rows"]),
            ));
        }
    }
    for sink in status["sinks"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "sink {}: {}",
            text(&sink["name"]),
            text(&sink["state"])
        ));
        if !sink["last_error"].is_null() {
            out.push_str(&format!(" ({})", text(&sink["last_error"])));
        }
        out.push('\n');
        for input in sink["sources"].as_array().into_iter().flatten() {
            out.push_str(&format!(
                "  from {}: cursor {}",
                text(&input["source"]),
                text(&input["cursor"])
            ));
            if status["running"] == true {
                out.push_str(&format!(
                    ", acknowledged {}, behind by {} records ({} bytes of WAL)",
                    text(&input["acked_lsn"]),
                    text(&input["lag_records"]),
                    text(&input["lag_bytes"])
                ));
            }
            out.push('\n');
        }
    }
    out
}
