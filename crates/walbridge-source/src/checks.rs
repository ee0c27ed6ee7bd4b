//! Prerequisite checks, run by `walbridge check` and before every start.
//!
//! Each finding is one line that says what is wrong and how to fix it.

use std::fmt;

use tokio_postgres::Client;

use crate::config::{OnSlotLost, SourceConfig};
use crate::slot;
use crate::wire::{ConnParams, ConnectionError, ReplicationConnection, connect_sql};

/// How serious a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Replication works, but not fully (e.g. a table without replica identity).
    Warning,
    /// Replication cannot start.
    Error,
}

/// One problem found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Error or warning.
    pub severity: Severity,
    /// What is wrong and how to fix it.
    pub message: String,
    /// Whether it may go away without anyone fixing it.
    pub outlook: Outlook,
}

/// Whether a problem may go away by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outlook {
    /// It stays until someone fixes it.
    Lasting,
    /// It may clear within seconds: the slot (or the last free WAL
    /// sender) is still held by the walsender of a consumer that just died.
    Passing,
    /// The server could not be reached, or is starting, shutting down or
    /// out of connections: `run` waits for it as for a lost connection.
    Unreachable,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = match self.severity {
            Severity::Warning => "warning",
            Severity::Error => "error",
        };
        write!(f, "{level}: {}", self.message)
    }
}

fn error(message: String) -> Finding {
    Finding {
        severity: Severity::Error,
        message,
        outlook: Outlook::Lasting,
    }
}

fn warning(message: String) -> Finding {
    Finding {
        severity: Severity::Warning,
        message,
        outlook: Outlook::Lasting,
    }
}

/// Explains a connection failure in one actionable line.
pub fn explain_connection_error(source: &str, target: &str, e: &ConnectionError) -> String {
    let detail = e.to_string();
    match e.sqlstate() {
        Some("28P01") => format!(
            "source `{source}`: password authentication failed for {target}: check the password in `connection`"
        ),
        Some("28000") if detail.contains("pg_hba.conf") => format!(
            "source `{source}`: {target} rejects the connection ({}): add a matching `host replication` and `host <db>` line to pg_hba.conf and reload",
            e
        ),
        Some("42501") if detail.contains("replication") || detail.contains("walsender") => format!(
            "source `{source}`: the role lacks the REPLICATION attribute needed to stream: run ALTER ROLE <role> REPLICATION on {target}"
        ),
        Some("53300") => format!(
            "source `{source}`: {target} has no free connection or WAL sender ({e}): raise max_wal_senders / max_connections, or stop unused consumers"
        ),
        Some("3D000") => format!("source `{source}`: {e}: check `dbname` in `connection`"),
        _ if matches!(e, ConnectionError::NoSuitableHost(_)) => {
            format!("source `{source}`: {e}")
        }
        _ if e.is_transient() => format!(
            "source `{source}`: {}: is the server running and accepting connections there? Check host and port in `connection`",
            failed_at(target, &detail)
        ),
        _ => format!("source `{source}`: {}", failed_at(target, &detail)),
    }
}

/// "cannot connect to `target`: `detail`", unless the detail says so already.
fn failed_at(target: &str, detail: &str) -> String {
    if detail.contains(target) {
        detail.to_owned()
    } else {
        format!("cannot connect to {target}: {detail}")
    }
}

/// Runs every check for one source and returns the findings (empty when
/// everything is in order). Opens one SQL and one replication connection.
pub async fn check_source(config: &SourceConfig, params: &ConnParams) -> Vec<Finding> {
    let target = params.display_target();
    let client = match connect_sql(params, config.application_name()).await {
        Ok(c) => c,
        Err(e) => return vec![connection_failure(&config.name, &target, &e)],
    };
    let mut findings = match sql_checks(config, &client, &target).await {
        Ok(f) => f,
        Err(e) => vec![error(format!(
            "source `{}`: checking {target} failed: {}",
            config.name,
            crate::wire::describe_pg_error(&e)
        ))],
    };
    match ReplicationConnection::connect(params, config.application_name()).await {
        Ok(mut conn) => {
            findings.extend(slot_checks(config, &mut conn, &client, &target).await);
            conn.close().await;
        }
        Err(e) => findings.push(connection_failure(&config.name, &target, &e)),
    }
    findings
}

/// The finding for a connection that failed.
fn connection_failure(source: &str, target: &str, e: &ConnectionError) -> Finding {
    Finding {
        outlook: if e.is_transient() {
            Outlook::Unreachable
        } else if e.sqlstate() == Some("53300") {
            // No free connection or WAL sender: perhaps held by the walsender
            // of a consumer that just died, like a slot still in use.
            Outlook::Passing
        } else {
            Outlook::Lasting
        },
        ..error(explain_connection_error(source, target, e))
    }
}

async fn sql_checks(
    config: &SourceConfig,
    client: &Client,
    target: &str,
) -> Result<Vec<Finding>, tokio_postgres::Error> {
    let name = &config.name;
    let mut findings = Vec::new();
    let wal_level: String = client.query_one("SHOW wal_level", &[]).await?.get(0);
    if wal_level != "logical" {
        findings.push(error(format!(
            "source `{name}`: wal_level is `{wal_level}` on {target}; logical replication needs `logical`: run ALTER SYSTEM SET wal_level = logical and restart the server"
        )));
    }
    let version: i32 = client
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await?
        .get(0);
    if version < 140_000 {
        findings.push(error(format!(
            "source `{name}`: {target} runs PostgreSQL {version}; walbridge needs 14 or newer"
        )));
    }
    if config.two_phase && version < 150_000 {
        findings.push(error(format!("source `{name}`: two_phase needs PostgreSQL 15 or newer on the publisher; set two_phase = false")));
    }
    if config.failover {
        if version < 170_000 {
            findings.push(error(format!("source `{name}`: failover needs PostgreSQL 17 or newer on the publisher (slots synchronized to standbys); set failover = false")));
        } else {
            findings.extend(failover_checks(name, client, target).await?);
        }
    }
    if config.origin == crate::config::OriginFilter::None && version < 160_000 {
        findings.push(error(format!("source `{name}`: origin = \"none\" needs PostgreSQL 16 or newer on the publisher; remove it")));
    }
    let role = client
        .query_one("SELECT current_user::text, rolsuper, rolreplication, rolcanlogin FROM pg_roles WHERE rolname = current_user", &[])
        .await?;
    let (user, superuser, replication, login): (String, bool, bool, bool) =
        (role.get(0), role.get(1), role.get(2), role.get(3));
    if !superuser && !replication {
        findings.push(error(format!(
            "source `{name}`: role \"{user}\" lacks the REPLICATION attribute: run ALTER ROLE \"{user}\" REPLICATION on {target}"
        )));
    }
    if !login {
        findings.push(error(format!("source `{name}`: role \"{user}\" cannot log in: run ALTER ROLE \"{user}\" LOGIN on {target}")));
    }
    let existing: Vec<String> = client
        .query(
            "SELECT pubname::text FROM pg_publication WHERE pubname = ANY($1)",
            &[&config.publications],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    for missing in config.publications.iter().filter(|p| !existing.contains(p)) {
        findings.push(error(format!(
            "source `{name}`: publication \"{missing}\" does not exist in database {target}: create it with CREATE PUBLICATION \"{missing}\" FOR TABLE …"
        )));
    }
    let tables = client
        .query(
            "SELECT DISTINCT format('%I.%I', p.schemaname, p.tablename), has_table_privilege(c.oid, 'SELECT'), c.relreplident::text, \
                    EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary), \
                    bool_or(pub.pubupdate OR pub.pubdelete) OVER (PARTITION BY c.oid) \
             FROM pg_publication_tables p JOIN pg_publication pub ON pub.pubname = p.pubname \
             JOIN pg_namespace n ON n.nspname = p.schemaname JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename \
             WHERE p.pubname = ANY($1) ORDER BY 1",
            &[&config.publications],
        )
        .await?;
    for t in &tables {
        let (table, select, identity, has_pk, updates): (String, bool, String, bool, bool) =
            (t.get(0), t.get(1), t.get(2), t.get(3), t.get(4));
        if !select {
            findings.push(error(format!(
                "source `{name}`: role \"{user}\" may not read published table {table}: run GRANT SELECT ON {table} TO \"{user}\""
            )));
        }
        if updates && (identity == "n" || (identity == "d" && !has_pk)) {
            findings.push(warning(format!(
                "source `{name}`: table {table} has no replica identity, so its UPDATEs and DELETEs cannot be replicated (the publisher rejects them): add a primary key or run ALTER TABLE {table} REPLICA IDENTITY FULL"
            )));
        }
    }
    Ok(findings)
}

/// What a failover slot needs of the primary and its standbys (the
/// standbys' settings cannot be read from here: they are named).
async fn failover_checks(
    name: &str,
    client: &Client,
    target: &str,
) -> Result<Vec<Finding>, tokio_postgres::Error> {
    const STANDBY: &str = "on each standby that may be promoted: sync_replication_slots = on, hot_standby_feedback = on, primary_slot_name set to its physical slot, and dbname=… in primary_conninfo";
    let row = client
        .query_one(
            "SELECT current_setting('synchronized_standby_slots'), \
                    (SELECT string_agg(slot_name::text, ', ') FROM pg_replication_slots WHERE slot_type = 'physical' AND active)",
            &[],
        )
        .await?;
    let (synchronized, physical): (String, Option<String>) = (row.get(0), row.get(1));
    let mut findings = Vec::new();
    match physical {
        None => findings.push(warning(format!(
            "source `{name}`: failover = true, but no standby streams from {target} through a physical slot, so none can take the slot over: set up a standby with a physical slot and, {STANDBY}"
        ))),
        Some(physical) if synchronized.trim().is_empty() => findings.push(warning(format!(
            "source `{name}`: failover = true, but synchronized_standby_slots is empty on {target}: walbridge may then receive changes a standby has not, and lose them when it is promoted; run ALTER SYSTEM SET synchronized_standby_slots = '{physical}' and reload; and {STANDBY}"
        ))),
        Some(_) => {}
    }
    Ok(findings)
}

async fn slot_checks(
    config: &SourceConfig,
    conn: &mut ReplicationConnection,
    client: &Client,
    target: &str,
) -> Vec<Finding> {
    let name = &config.name;
    let slot_name = config.slot_name();
    let info = match slot::slot_info(conn, &slot_name).await {
        Ok(info) => info,
        Err(e) => {
            return vec![error(format!(
                "source `{name}`: cannot read pg_replication_slots on {target}: {e}"
            ))];
        }
    };
    let mut findings = Vec::new();
    match info {
        Some(slot) => {
            if slot.plugin.as_deref() != Some("pgoutput") {
                findings.push(error(format!(
                    "source `{name}`: slot \"{slot_name}\" exists but is not a pgoutput logical slot: choose another `slot` name or drop it"
                )));
            }
            if slot.is_lost() {
                let message = slot::lost_slot_message(name, &slot_name, &slot);
                findings.push(if config.on_slot_lost == OnSlotLost::Recopy {
                    warning(format!("{message} (on_slot_lost = \"recopy\": walbridge does so itself at start)"))
                } else {
                    error(message)
                });
            }
            if slot.active {
                let pid = slot.active_pid.map_or_else(|| "another process".to_owned(), |p| format!("process {p}"));
                findings.push(Finding {
                    outlook: Outlook::Passing,
                    ..error(format!(
                        "source `{name}`: slot \"{slot_name}\" is in use by {pid} on {target}: stop the other consumer (another walbridge?) or set a different `slot`"
                    ))
                });
            }
        }
        None if !config.create_slot => findings.push(error(format!(
            "source `{name}`: slot \"{slot_name}\" does not exist on {target} and create_slot = false: create it (SELECT pg_create_logical_replication_slot('{slot_name}', 'pgoutput')) or set create_slot = true"
        ))),
        None => {
            let capacity = client
                .query_one(
                    "SELECT (SELECT count(*) FROM pg_replication_slots)::int, current_setting('max_replication_slots')::int, \
                            (SELECT count(*) FROM pg_stat_replication)::int, current_setting('max_wal_senders')::int",
                    &[],
                )
                .await;
            match capacity {
                Ok(row) => {
                    let (slots, max_slots, senders, max_senders): (i32, i32, i32, i32) = (row.get(0), row.get(1), row.get(2), row.get(3));
                    if slots >= max_slots {
                        findings.push(error(format!(
                            "source `{name}`: {target} has no free replication slot ({slots} of max_replication_slots = {max_slots} in use): raise max_replication_slots and restart, or drop unused slots"
                        )));
                    }
                    // This check's own replication connection is one of the senders.
                    if senders > max_senders {
                        findings.push(error(format!(
                            "source `{name}`: {target} has no free WAL sender (max_wal_senders = {max_senders}): raise max_wal_senders and restart"
                        )));
                    }
                }
                Err(e) => findings.push(error(format!(
                    "source `{name}`: cannot read slot capacity on {target}: {}",
                    crate::wire::describe_pg_error(&e)
                ))),
            }
        }
    }
    findings
}
