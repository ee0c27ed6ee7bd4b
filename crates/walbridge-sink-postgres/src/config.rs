//! `type = "postgres"`: the sink's section of the configuration file.

use std::time::Duration;

use serde::Deserialize;
use walbridge_core::{ByteSize, DurationText};

/// What to do when a change violates a constraint on the target (a
/// duplicate key, a check constraint).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnConflict {
    /// Stop on the transaction, as a native subscriber does: nothing after
    /// it is applied until the conflict is resolved on the target or the
    /// transaction is skipped (`walbridge skip`).
    #[default]
    Error,
    /// Skip the conflicting change (counted and logged) and go on.
    Skip,
    /// Inserts become `INSERT … ON CONFLICT (identity) DO UPDATE`; other
    /// conflicts stop as with `error`.
    Upsert,
}

/// What a change of a published table's columns on the publisher does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SchemaChanges {
    /// Stop on the first change that does not fit the target (a new column
    /// it lacks), as a native subscriber does, until the target is altered
    /// by hand.
    #[default]
    Stop,
    /// Alter the target as the publisher was, in the same target
    /// transaction as the changes around it: columns added, dropped
    /// (`dropped_columns`), renamed, retyped.
    Apply,
}

/// What `schema_changes = "apply"` does with a column dropped on the publisher.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DroppedColumns {
    /// Drop it on the target too.
    #[default]
    Drop,
    /// Keep it and its values (made nullable, so new rows can leave it empty).
    Keep,
}

/// Where the applied position of each source is stored in the target.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProgressMode {
    /// A replication origin when the role may use them, else the table.
    #[default]
    Auto,
    /// A replication origin per source (as native subscribers): changes
    /// applied carry the origin, so a downstream source with `origin =
    /// "none"` does not publish them again. Needs a superuser or EXECUTE on
    /// the `pg_replication_origin_*` functions.
    Origin,
    /// A row per source in `progress_table`, written in the same
    /// transaction as the data.
    Table,
}

/// `synchronous_commit` for the sink's transactions on the target.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SynchronousCommit {
    /// Commits return before their WAL is flushed (like a native
    /// subscription's default); positions are acknowledged only once the
    /// target has flushed them, so a target crash loses nothing.
    #[default]
    Off,
    /// Local flush.
    Local,
    /// Local flush and what the target's own synchronous standbys require.
    On,
    /// As `on`, with standbys' write.
    RemoteWrite,
    /// As `on`, with standbys' apply.
    RemoteApply,
}

impl SynchronousCommit {
    /// The setting's value in SQL.
    pub fn as_sql(self) -> &'static str {
        match self {
            SynchronousCommit::Off => "off",
            SynchronousCommit::Local => "local",
            SynchronousCommit::On => "on",
            SynchronousCommit::RemoteWrite => "remote_write",
            SynchronousCommit::RemoteApply => "remote_apply",
        }
    }
}

fn default_table() -> String {
    "{schema}.{table}".to_owned()
}

fn default_progress_table() -> String {
    "public.walbridge_progress".to_owned()
}

fn default_batch_changes() -> usize {
    20_000
}

fn default_batch_bytes() -> ByteSize {
    ByteSize(32 << 20)
}

fn default_batch_time() -> DurationText {
    DurationText(Duration::from_millis(200))
}

fn default_copy_connections() -> usize {
    2
}

fn default_true() -> bool {
    true
}

fn default_pipeline_depth() -> usize {
    256
}

/// `type = "postgres"`: apply every source transaction into a PostgreSQL
/// database, in commit order, exactly once.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresSinkConfig {
    /// Unique sink name (it names the cursor file and the replication origins).
    pub name: String,
    /// Sources to read; default every source.
    #[serde(default)]
    pub sources: Option<Vec<String>>,
    /// The target database: libpq `key=value` string or `postgres://` URL.
    pub connection: String,
    /// Target table name template; `{source}`, `{schema}` and `{table}`
    /// are replaced. A name without a schema is looked up on the target's
    /// `search_path`.
    #[serde(default = "default_table")]
    pub table: String,
    /// What a constraint violation on the target does.
    #[serde(default)]
    pub on_conflict: OnConflict,
    /// A target column that receives the source's name (fan-in of
    /// identically named tables): inserted with every row and part of
    /// every row lookup, so sources never touch each other's rows.
    #[serde(default)]
    pub source_column: Option<String>,
    /// What a change of a published table's columns does to the target.
    #[serde(default)]
    pub schema_changes: SchemaChanges,
    /// With `schema_changes = "apply"`: what a column dropped on the
    /// publisher does on the target.
    #[serde(default)]
    pub dropped_columns: DroppedColumns,
    /// Create a missing target table from the publisher's description
    /// (columns, types, NOT NULL, primary key; the schema too), instead
    /// of stopping.
    #[serde(default)]
    pub create_tables: bool,
    /// Empty target tables before the initial copy (only this source's
    /// rows with `source_column`); without it a target table holding rows
    /// stops the sink.
    #[serde(default)]
    pub truncate_before_copy: bool,
    /// Connections that load the initial copy side by side, each in a
    /// transaction of its own (all commit once the whole copy is in the
    /// log; a restart copies again only what did not commit). `1` loads it
    /// in one transaction on the apply connection.
    #[serde(default = "default_copy_connections")]
    pub copy_connections: usize,
    /// Drop each target table's indexes before its initial copy and build
    /// them again after it (recorded on the target first, so a crash never
    /// loses one; see [`crate::deferred`] for the indexes that stay).
    #[serde(default = "default_true")]
    pub defer_indexes: bool,
    /// Where the applied positions are stored.
    #[serde(default)]
    pub progress: ProgressMode,
    /// The table used by `progress = "table"` (created when missing).
    #[serde(default = "default_progress_table")]
    pub progress_table: String,
    /// `synchronous_commit` for the sink's transactions.
    #[serde(default)]
    pub synchronous_commit: SynchronousCommit,
    /// Source transactions are grouped into one target transaction up to
    /// this many changes (a larger source transaction is still applied whole).
    #[serde(default = "default_batch_changes")]
    pub batch_changes: usize,
    /// … and up to about this many bytes of row data.
    #[serde(default = "default_batch_bytes")]
    pub batch_bytes: ByteSize,
    /// … and for at most this long.
    #[serde(default = "default_batch_time")]
    pub batch_time: DurationText,
    /// Statements sent ahead of their results.
    #[serde(default = "default_pipeline_depth")]
    pub pipeline_depth: usize,
}

impl PostgresSinkConfig {
    /// Problems with the values, each naming its key.
    pub fn validate(&self) -> Vec<String> {
        let at = |key: &str| format!("sink `{}`: `{key}`", self.name);
        let mut problems = Vec::new();
        if let Err(e) = walbridge_pg::ConnParams::parse(&self.connection) {
            problems.push(format!("{}: {e}", at("connection")));
        }
        if let Err(e) = crate::mapping::NameTemplate::parse(&self.table) {
            problems.push(format!("{}: {e}", at("table")));
        }
        if let Err(e) = crate::progress::split_qualified(&self.progress_table) {
            problems.push(format!("{}: {e}", at("progress_table")));
        }
        if self.source_column.as_deref() == Some("") {
            problems.push(format!("{}: must not be empty", at("source_column")));
        }
        for (key, value) in [
            ("batch_changes", self.batch_changes),
            ("copy_connections", self.copy_connections),
            ("pipeline_depth", self.pipeline_depth),
        ] {
            if value == 0 {
                problems.push(format!("{}: must be at least 1", at(key)));
            }
        }
        problems
    }
}
