//! Replication slot management over the replication connection, and
//! the slot's health as the publisher reports it while the source runs.

use walbridge_core::Lsn;

use crate::wire::{ConnectionError, ReplicationConnection};
use walbridge_pg::quote_literal;

/// What `pg_replication_slots` says about a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotInfo {
    /// Output plugin (`pgoutput` for ours).
    pub plugin: Option<String>,
    /// Database the slot belongs to.
    pub database: Option<String>,
    /// True while a walsender uses it.
    pub active: bool,
    /// PID of that walsender.
    pub active_pid: Option<i32>,
    /// Position confirmed by the consumer.
    pub confirmed_flush: Option<Lsn>,
    /// `reserved`, `extended`, `unreserved` or `lost`.
    pub wal_status: Option<String>,
    /// Created with two-phase decoding.
    pub two_phase: bool,
    /// Synchronized to standbys (`failover`, PostgreSQL 17+).
    pub failover: bool,
    /// Why the server invalidated the slot (`invalidation_reason`,
    /// PostgreSQL 17+: `wal_removed`, `rows_removed`,
    /// `wal_level_insufficient`, `idle_timeout`), if it did.
    pub invalidation_reason: Option<String>,
}

impl SlotInfo {
    /// Whether the server invalidated the slot: it can stream no more.
    pub fn is_lost(&self) -> bool {
        self.wal_status.as_deref() == Some("lost") || self.invalidation_reason.is_some()
    }
}

/// The one line that says a slot was invalidated: which, why, and what
/// to do.
pub fn lost_slot_message(source: &str, slot: &str, info: &SlotInfo) -> String {
    let cause = match info.invalidation_reason.as_deref() {
        Some("idle_timeout") => {
            "it was unused for longer than idle_replication_slot_timeout; raise that setting (or 0 for none) so a stopped walbridge keeps its slot"
        }
        Some("rows_removed") => {
            "catalog rows it needed were removed (on a standby: set hot_standby_feedback = on)"
        }
        Some("wal_level_insufficient") => {
            "wal_level was lowered below logical; set it back to logical"
        }
        // `wal_removed`, or a server that does not say (wal_status = lost).
        _ => {
            "the server removed WAL it still needed, as max_slot_wal_keep_size allows; raise max_slot_wal_keep_size (or -1 for no limit)"
        }
    };
    format!(
        "source `{source}`: slot \"{slot}\" was invalidated ({}): {cause}. The changes since walbridge last confirmed are gone from the publisher; to copy the tables again run `walbridge drop --source {source}` and start walbridge",
        info.invalidation_reason.as_deref().map_or_else(
            || "wal_status = lost".to_owned(),
            |r| format!("invalidation_reason = {r}")
        )
    )
}

/// The options a slot is created with (fixed then, but for `failover`,
/// which [`set_failover`] changes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotOptions {
    /// Decode prepared transactions at PREPARE (PostgreSQL 15+).
    pub two_phase: bool,
    /// Let standbys synchronize the slot, so it survives a failover
    /// (PostgreSQL 17+).
    pub failover: bool,
}

/// How a running source's slot fares, polled over an ordinary SQL
/// connection (a replication connection would take a walsender).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotHealth {
    /// The publisher's current WAL position (on a standby, the last one
    /// it received).
    pub current_lsn: Lsn,
    /// Whether the slot exists.
    pub exists: bool,
    /// The oldest WAL the slot keeps (`restart_lsn`).
    pub restart_lsn: Option<Lsn>,
    /// `reserved`, `extended`, `unreserved` or `lost` (PostgreSQL 13+).
    pub wal_status: Option<String>,
    /// WAL bytes that can still be written before the slot is at risk of
    /// being lost (PostgreSQL 13+, only with `max_slot_wal_keep_size`).
    pub safe_wal_size: Option<i64>,
}

/// Reads [`SlotHealth`] of the slot `name`; `version` is the publisher's
/// `server_version_num`.
pub async fn slot_health(
    client: &tokio_postgres::Client,
    name: &str,
    version: u32,
) -> Result<SlotHealth, tokio_postgres::Error> {
    let since_13 = if version >= 130_000 {
        "s.wal_status, s.safe_wal_size"
    } else {
        "NULL::text, NULL::bigint"
    };
    let sql = format!(
        "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_receive_lsn() ELSE pg_current_wal_lsn() END)::text, \
                s.slot_name IS NOT NULL, s.restart_lsn::text, {since_13} \
         FROM (SELECT 1) AS one LEFT JOIN pg_replication_slots s ON s.slot_name = $1"
    );
    let row = client.query_one(&sql, &[&name]).await?;
    let lsn = |i: usize| row.get::<_, Option<String>>(i).and_then(|l| l.parse().ok());
    Ok(SlotHealth {
        current_lsn: lsn(0).unwrap_or(Lsn(0)),
        exists: row.get(1),
        restart_lsn: lsn(2),
        wal_status: row.get(3),
        safe_wal_size: row.get(4),
    })
}

/// What to do with the snapshot a new slot comes with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotAction {
    /// Export it for other sessions (`SET TRANSACTION SNAPSHOT`).
    Export,
    /// Use it in the replication connection's own next transaction.
    Use,
    /// No snapshot.
    Nothing,
}

/// Permanent or temporary slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotPersistence {
    /// Survives disconnects and restarts.
    Permanent,
    /// Dropped when the connection ends.
    Temporary,
}

/// A slot just created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatedSlot {
    /// Everything committed before it is in the snapshot; after, in the stream.
    pub consistent_point: Lsn,
    /// The exported snapshot's name (with [`SnapshotAction::Export`]).
    pub snapshot_name: Option<String>,
}

/// The `CREATE_REPLICATION_SLOT` command for a server version: the option
/// list syntax from PostgreSQL 15 on, the keyword syntax before.
pub fn create_slot_command(
    name: &str,
    persistence: SlotPersistence,
    snapshot: SnapshotAction,
    options: SlotOptions,
    server_version: u32,
) -> String {
    let temporary = if persistence == SlotPersistence::Temporary {
        " TEMPORARY"
    } else {
        ""
    };
    if server_version >= 150_000 {
        let action = match snapshot {
            SnapshotAction::Export => "export",
            SnapshotAction::Use => "use",
            SnapshotAction::Nothing => "nothing",
        };
        let two_phase = if options.two_phase {
            ", TWO_PHASE true"
        } else {
            ""
        };
        let failover = if options.failover {
            ", FAILOVER true"
        } else {
            ""
        };
        format!(
            "CREATE_REPLICATION_SLOT \"{name}\"{temporary} LOGICAL pgoutput (SNAPSHOT '{action}'{two_phase}{failover})"
        )
    } else {
        let action = match snapshot {
            SnapshotAction::Export => "EXPORT_SNAPSHOT",
            SnapshotAction::Use => "USE_SNAPSHOT",
            SnapshotAction::Nothing => "NOEXPORT_SNAPSHOT",
        };
        format!("CREATE_REPLICATION_SLOT \"{name}\"{temporary} LOGICAL pgoutput {action}")
    }
}

/// Creates a logical slot for pgoutput.
pub async fn create_slot(
    conn: &mut ReplicationConnection,
    name: &str,
    persistence: SlotPersistence,
    snapshot: SnapshotAction,
    options: SlotOptions,
) -> Result<CreatedSlot, ConnectionError> {
    let command = create_slot_command(
        name,
        persistence,
        snapshot,
        options,
        conn.server_version_num(),
    );
    let results = conn.simple_query(&command).await?;
    let result = results
        .first()
        .ok_or_else(|| ConnectionError::Unexpected("no reply to CREATE_REPLICATION_SLOT".into()))?;
    let consistent_point = result
        .get(0, "consistent_point")
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            ConnectionError::Unexpected(
                "CREATE_REPLICATION_SLOT reply without consistent_point".into(),
            )
        })?;
    Ok(CreatedSlot {
        consistent_point,
        snapshot_name: result.get(0, "snapshot_name").map(str::to_owned),
    })
}

/// Makes an existing slot one standbys synchronize (PostgreSQL 17+).
pub async fn set_failover(
    conn: &mut ReplicationConnection,
    name: &str,
) -> Result<(), ConnectionError> {
    conn.simple_query(&format!(
        "ALTER_REPLICATION_SLOT \"{name}\" ( FAILOVER true )"
    ))
    .await
    .map(|_| ())
}

/// Drops a slot; with `wait`, waits for a walsender still using it to go.
pub async fn drop_slot(
    conn: &mut ReplicationConnection,
    name: &str,
    wait: bool,
) -> Result<(), ConnectionError> {
    let wait = if wait { " WAIT" } else { "" };
    conn.simple_query(&format!("DROP_REPLICATION_SLOT \"{name}\"{wait}"))
        .await
        .map(|_| ())
}

/// Looks a slot up by name.
pub async fn slot_info(
    conn: &mut ReplicationConnection,
    name: &str,
) -> Result<Option<SlotInfo>, ConnectionError> {
    let version = conn.server_version_num();
    let two_phase = if version >= 140_000 {
        "two_phase"
    } else {
        "false"
    };
    let (failover, invalidation_reason) = if version >= 170_000 {
        ("failover", "invalidation_reason")
    } else {
        ("false", "NULL")
    };
    let sql = format!(
        "SELECT plugin, database, active, active_pid, confirmed_flush_lsn, wal_status, {two_phase} AS two_phase, {failover} AS failover, {invalidation_reason} AS invalidation_reason \
         FROM pg_replication_slots WHERE slot_name = {}",
        quote_literal(name)
    );
    let results = conn.simple_query(&sql).await?;
    let Some(r) = results.first().filter(|r| !r.rows.is_empty()) else {
        return Ok(None);
    };
    Ok(Some(SlotInfo {
        plugin: r.get(0, "plugin").map(str::to_owned),
        database: r.get(0, "database").map(str::to_owned),
        active: r.get(0, "active") == Some("t"),
        active_pid: r.get(0, "active_pid").and_then(|p| p.parse().ok()),
        confirmed_flush: r.get(0, "confirmed_flush_lsn").and_then(|l| l.parse().ok()),
        wal_status: r.get(0, "wal_status").map(str::to_owned),
        two_phase: r.get(0, "two_phase") == Some("t"),
        failover: r.get(0, "failover") == Some("t"),
        invalidation_reason: r.get(0, "invalidation_reason").map(str::to_owned),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_syntax_follows_the_server_version() {
        assert_eq!(
            create_slot_command(
                "s",
                SlotPersistence::Permanent,
                SnapshotAction::Export,
                SlotOptions {
                    two_phase: true,
                    failover: true
                },
                170_000
            ),
            "CREATE_REPLICATION_SLOT \"s\" LOGICAL pgoutput (SNAPSHOT 'export', TWO_PHASE true, FAILOVER true)"
        );
        assert_eq!(
            create_slot_command(
                "s",
                SlotPersistence::Temporary,
                SnapshotAction::Nothing,
                SlotOptions::default(),
                140_005
            ),
            "CREATE_REPLICATION_SLOT \"s\" TEMPORARY LOGICAL pgoutput NOEXPORT_SNAPSHOT"
        );
    }
}
