//! `walbridge check`: every prerequisite, without streaming.

use walbridge_core::Relation;
use walbridge_core::describe;
use walbridge_runtime::config::SourceSpec;
use walbridge_runtime::{Config, data_dir};
use walbridge_sink::{CheckScope, reads};
use walbridge_sink_grpc::upstream::FeedSource;
use walbridge_source::Source;
use walbridge_source::checks::{Outlook, Severity};

use crate::{EXIT_CONFIG, EXIT_PREREQUISITE, Failure, load};

/// Checks the data_dir, each source, then each sink with what the sources
/// publish; prints a line per finding and fails when any is an error.
pub async fn check(path: &std::path::Path) -> Result<(), Failure> {
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
    for spec in &config.sources {
        let source_config = match spec {
            SourceSpec::Postgres(source_config) => source_config,
            SourceSpec::Feed(feed) => {
                match FeedSource::new(feed.clone(), &config.data_dir)
                    .check()
                    .await
                {
                    Ok(line) => println!("ok: {line}"),
                    Err(e) => {
                        eprintln!("error: {e}");
                        errors += 1;
                    }
                }
                continue;
            }
        };
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
