//! `walbridge resync`: copy one table again while streaming goes on (see
//! `walbridge_source::backfill`), like dropping and re-adding it to a
//! subscription without stopping anything.

use walbridge_runtime::admin::resync_sink_problem;
use walbridge_runtime::config::SourceSpec;
use walbridge_runtime::data_dir;
use walbridge_sink::reads;
use walbridge_source::backfill::{ResyncRequest, request_resync};

use crate::{EXIT_CONFIG, Failure, load};

/// Asks source `source` of the configuration at `path` to re-synchronize
/// `table` (`schema.table`), for every sink reading it or `sink` alone;
/// with `truncate`, emptied on the targets and copied whole.
pub fn resync(
    path: &std::path::Path,
    source: &str,
    table: &str,
    sink: Option<&str>,
    truncate: bool,
) -> Result<(), Failure> {
    let config = load(path)?;
    let refuse = |error: String| Failure {
        code: EXIT_CONFIG,
        error: anyhow::anyhow!(error),
    };
    match config.sources.iter().find(|s| s.name() == source) {
        Some(SourceSpec::Postgres(_)) => {}
        Some(SourceSpec::Feed(_)) => {
            return Err(refuse(format!(
                "source `{source}` reads another walbridge's feed: re-synchronize the table on the walbridge that reads the publisher"
            )));
        }
        None => {
            return Err(refuse(format!(
                "no source named `{source}` in {}",
                path.display()
            )));
        }
    }
    if let Some(sink) = sink {
        let readers: Vec<String> = config
            .sinks
            .iter()
            .filter(|s| reads(s.as_ref(), source))
            .map(|s| s.name().to_owned())
            .collect();
        if let Some(problem) = resync_sink_problem(sink, source, &readers) {
            return Err(refuse(problem));
        }
    }
    let state_dir = walbridge_source::source::state_dir(&config.data_dir, source);
    let request = ResyncRequest {
        table: table.to_owned(),
        sink: sink.map(str::to_owned),
        truncate,
    };
    request_resync(&state_dir, &request)
        .map_err(|e| anyhow::anyhow!("cannot ask for a re-sync in {}: {e}", state_dir.display()))?;
    let when = match data_dir::DataDirLock::holder(&config.data_dir) {
        Some(pid) => format!(
            "the walbridge running on this data_dir (pid {pid}) starts it at its next look at the publications (refresh_interval)"
        ),
        None => "it starts when walbridge does".to_owned(),
    };
    let how = if truncate {
        "emptied on the targets and copied whole, in one unit, while changes keep streaming"
    } else {
        "read again in chunks while changes keep streaming"
    };
    let who = match sink {
        Some(sink) => {
            format!("sink `{sink}` alone applies the rows (the other sinks pass over them)")
        }
        None => "every sink applies the rows".to_owned(),
    };
    println!(
        "re-sync of {table} requested from source `{source}`: {when}; the table is {how}, and {who}, idempotently (the log says when the copy is durable)"
    );
    Ok(())
}
