//! Connections to the target, set up for applying, and the sink's health
//! check.

use tokio_postgres::Client;
use walbridge_pg::{ConnParams, connect_sql};

use crate::config::PostgresSinkConfig;
use crate::error::SinkError;

/// The parsed connection string of `config`.
pub fn params(config: &PostgresSinkConfig) -> Result<ConnParams, SinkError> {
    ConnParams::parse(&config.connection).map_err(|source| SinkError::Params {
        sink: config.name.clone(),
        source,
    })
}

/// Opens a connection to the target with walbridge's session settings.
pub async fn connect(
    config: &PostgresSinkConfig,
    params: &ConnParams,
) -> Result<Client, SinkError> {
    connect_sql(params, &format!("walbridge_{}", config.name))
        .await
        .map_err(|source| SinkError::Connect {
            target: params.display_target(),
            source,
        })
}

/// Opens a connection for applying: `session_replication_role = replica`
/// (ordinary triggers and foreign-key checks do not fire; `ENABLE REPLICA`
/// and `ENABLE ALWAYS` triggers do, as on a native subscriber), the
/// configured `synchronous_commit`, and generic plans for the sink's
/// prepared statements.
///
/// Why generic plans: a custom plan for a batch (`… FROM unnest($1, …)`)
/// sees the arrays' real length, and for a few thousand keys the planner,
/// costing index probes as random reads, prefers hashing the whole table
/// (measured: 0.5 s for 5,000 updates of a 1,000,000-row table, against
/// 50 ms through its primary key). A generic plan assumes a few rows: an
/// index probe per row where the target has an index on the identity, one
/// scan of the table with the batch hashed where it has none — the right
/// plan in both cases — and it is planned once instead of on every batch.
pub async fn connect_for_apply(
    config: &PostgresSinkConfig,
    params: &ConnParams,
) -> Result<Client, SinkError> {
    let client = connect(config, params).await?;
    client
        .batch_execute("SET session_replication_role = replica")
        .await
        .map_err(|source| match source.code().map(|c| c.code()) {
            // 42501 insufficient_privilege
            Some("42501") => SinkError::Privilege {
                what: format!(
                    "role \"{}\" may not set session_replication_role, which applying needs (so ordinary triggers and foreign-key checks do not fire twice)",
                    params.user
                ),
                fix: format!(
                    "connect as a superuser, or on PostgreSQL 15+ run GRANT SET ON PARAMETER session_replication_role TO \"{}\"",
                    params.user
                ),
            },
            _ => SinkError::Target {
                what: "setting session_replication_role".into(),
                source,
            },
        })?;
    client
        .batch_execute(&format!(
            "SET synchronous_commit = {}; SET plan_cache_mode = force_generic_plan",
            config.synchronous_commit.as_sql()
        ))
        .await
        .map_err(|source| SinkError::Target {
            what: "setting synchronous_commit and plan_cache_mode".into(),
            source,
        })?;
    Ok(client)
}

/// What `walbridge check` reports for the sink: the target answers and
/// the role may do what applying needs. Returns a line describing the
/// target on success.
pub async fn health_check(config: &PostgresSinkConfig) -> Result<String, SinkError> {
    let params = params(config)?;
    let client = connect_for_apply(config, &params).await?;
    let version: String = client
        .query_one("SHOW server_version", &[])
        .await
        .map_err(|source| SinkError::Target {
            what: "reading the server version".into(),
            source,
        })?
        .get(0);
    let in_recovery: bool = client
        .query_one("SELECT pg_is_in_recovery()", &[])
        .await
        .map_err(|source| SinkError::Target {
            what: "checking for a standby".into(),
            source,
        })?
        .get(0);
    if in_recovery {
        return Err(SinkError::Mapping(format!(
            "the target {} is a standby (in recovery) and cannot be written: point the sink at the primary",
            params.display_target()
        )));
    }
    crate::progress::check_privileges(&client, config.progress, &config.progress_table).await?;
    Ok(format!(
        "target {} (PostgreSQL {version}) accepts writes as \"{}\"",
        params.display_target(),
        params.user
    ))
}

/// Maps every table `source` publishes onto the target, as applying will:
/// one line per table that would stop the sink (missing table or column
/// the sink is not to make, a generated column, a view, no key for upserts).
pub async fn check_tables(
    config: &PostgresSinkConfig,
    source: &str,
    relations: &[walbridge_core::Relation],
) -> Result<Vec<String>, SinkError> {
    let params = params(config)?;
    let mut catalog = crate::target::TargetCatalog::new(connect(config, &params).await?);
    let mut mapper = crate::mapping::Mapper::new(config, source).map_err(SinkError::Mapping)?;
    let mut problems = Vec::new();
    for relation in relations {
        let relation = std::sync::Arc::new(relation.clone());
        match mapper.map(&mut catalog, &relation).await {
            Ok(_) => {}
            Err(e @ (SinkError::Connect { .. } | SinkError::Target { .. })) => return Err(e),
            // Made on the target when applying.
            Err(SinkError::MissingTable { .. }) if config.create_tables => {}
            Err(SinkError::MissingColumn { .. })
                if config.schema_changes == crate::config::SchemaChanges::Apply => {}
            Err(e) => problems.push(e.to_string()),
        }
    }
    Ok(problems)
}
