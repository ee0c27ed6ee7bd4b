//! `walbridge resync`: copy one table again while streaming goes on (see
//! `walbridge_source::backfill`), like dropping and re-adding it to a
//! subscription without stopping anything.

use walbridge_runtime::config::SourceSpec;
use walbridge_runtime::data_dir;
use walbridge_source::backfill::request_resync;

use crate::{EXIT_CONFIG, Failure, load};

/// Asks source `source` of the configuration at `path` to re-synchronize
/// `table` (`schema.table`).
pub fn resync(path: &std::path::Path, source: &str, table: &str) -> Result<(), Failure> {
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
    let state_dir = walbridge_source::source::state_dir(&config.data_dir, source);
    request_resync(&state_dir, table)
        .map_err(|e| anyhow::anyhow!("cannot ask for a re-sync in {}: {e}", state_dir.display()))?;
    let when = match data_dir::DataDirLock::holder(&config.data_dir) {
        Some(pid) => format!(
            "the walbridge running on this data_dir (pid {pid}) starts it at its next look at the publications (refresh_interval)"
        ),
        None => "it starts when walbridge does".to_owned(),
    };
    println!(
        "re-sync of {table} requested from source `{source}`: {when}; the table is read again in chunks while changes keep streaming, and every sink applies the rows idempotently (its log says when the copy is durable)"
    );
    Ok(())
}
