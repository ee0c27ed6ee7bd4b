//! What can go wrong, each with what to do about it.

use walbridge_core::Lsn;
use walbridge_pg::describe_pg_error;

/// The source transaction an error stopped on.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoppedOn {
    /// The source.
    pub source: String,
    /// Its transaction id on the publisher.
    pub xid: u32,
    /// The commit position (what `walbridge skip --lsn` takes, like
    /// `ALTER SUBSCRIPTION … SKIP (lsn = …)`).
    pub commit_lsn: Lsn,
    /// The position after the commit: where the sink resumes once it is skipped.
    pub end_lsn: Lsn,
    /// The error.
    pub error: String,
}

impl std::fmt::Display for StoppedOn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "transaction {} of source `{}` (commit LSN {})",
            self.xid, self.source, self.commit_lsn
        )
    }
}

/// A schema change the target refused.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot {action} on target table {table}{} to follow source table {source_table} (schema_changes = \"apply\"): {}; make the target fit by hand, e.g. `{statement}`, then the sink resumes",
    .column.as_ref().map(|c| format!(", column \"{c}\"")).unwrap_or_default(),
    describe_pg_error(.source)
)]
pub struct SchemaChangeFailed {
    /// What was being done (`add column`, …).
    pub action: &'static str,
    /// Target table.
    pub table: String,
    /// The column.
    pub column: Option<String>,
    /// The source table.
    pub source_table: String,
    /// The statement that failed.
    pub statement: String,
    /// Cause.
    pub source: tokio_postgres::Error,
    /// The source transaction whose change needed it (none during the
    /// initial copy).
    pub stopped: Option<StoppedOn>,
}

/// An index dropped for the initial copy that could not be built again.
#[derive(Debug, thiserror::Error)]
#[error(
    "building index {index} of target table {table} again after the initial copy of source `{source_name}`: {}; the copied rows are in the table and the copy's position is not stored yet, so each start tries this again: make the rows fit (delete duplicates the index refuses), or drop the index from the plan with `DELETE FROM {records} WHERE sink = '{sink}' AND source = '{source_name}' AND index_name = '{index}'` and build it by hand later: {definition}",
    describe_pg_error(.source)
)]
pub struct IndexRebuildFailed {
    /// Target table.
    pub table: String,
    /// The index.
    pub index: String,
    /// The statements that build it.
    pub definition: String,
    /// The records table.
    pub records: String,
    /// The sink.
    pub sink: String,
    /// The source.
    pub source_name: String,
    /// Cause.
    pub source: tokio_postgres::Error,
}

/// A failure of the postgres sink.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The connection string is malformed.
    #[error("sink `{sink}`: connection: {source}")]
    Params {
        /// The sink.
        sink: String,
        /// Cause.
        source: walbridge_pg::ParamsError,
    },
    /// The target cannot be reached or refused the connection.
    #[error("cannot connect to the target {target}: {source}")]
    Connect {
        /// Where.
        target: String,
        /// Cause.
        source: walbridge_pg::ConnectError,
    },
    /// A statement on the target failed for a reason other than the data.
    #[error("target database: {what}: {}", describe_pg_error(.source))]
    Target {
        /// What was being done.
        what: String,
        /// Cause.
        source: tokio_postgres::Error,
    },
    /// The role lacks a privilege the sink needs.
    #[error("target database: {what}; {fix}")]
    Privilege {
        /// What failed.
        what: String,
        /// How to grant it.
        fix: String,
    },
    /// A replicated table has no counterpart on the target.
    #[error(
        "target table {target} does not exist (it receives source table {source_table}): create it on the target (e.g. from pg_dump --schema-only of the publisher) or change the sink's `table` template"
    )]
    MissingTable {
        /// The target name looked for.
        target: String,
        /// The source table.
        source_table: String,
    },
    /// The target name is a view or another non-table relation.
    #[error("target {table} is {kind}; only tables can be replicated into")]
    NotATable {
        /// The target name.
        table: String,
        /// What it is.
        kind: &'static str,
    },
    /// A published column has no counterpart on the target.
    #[error(
        "target table {table} has no column \"{column}\" ({source_type} on the publisher, in source table {source_table}): add it to the target table (ALTER TABLE {table} ADD COLUMN …), as a native subscriber requires"
    )]
    MissingColumn {
        /// Target table.
        table: String,
        /// The column.
        column: String,
        /// Its type on the publisher.
        source_type: String,
        /// The source table.
        source_table: String,
    },
    /// A schema change could not be made on the target.
    #[error(transparent)]
    SchemaChange(Box<SchemaChangeFailed>),
    /// Another reason a source table cannot be mapped.
    #[error("{0}")]
    Mapping(String),
    /// A published column maps to a generated column on the target.
    #[error(
        "column \"{column}\" of target table {table} is generated and cannot receive the published values of source table {source_table}: make it an ordinary column or leave it out of the publication's column list"
    )]
    GeneratedColumn {
        /// Target table.
        table: String,
        /// The column.
        column: String,
        /// The source table.
        source_table: String,
    },
    /// Values arrive in binary form for a column whose target type differs.
    #[error(
        "column \"{column}\" of target table {table} has type {target_type} but the source sends {source_type} in binary form, which only the identical built-in type can take: set `binary = false` on the source"
    )]
    BinaryMismatch {
        /// Target table.
        table: String,
        /// The column.
        column: String,
        /// Publisher type.
        source_type: String,
        /// Target type.
        target_type: String,
    },
    /// `on_conflict = "upsert"` needs a unique index to name.
    #[error(
        "on_conflict = \"upsert\": target table {table} has no primary key or unique index on ({columns}), the replica identity of source table {source_table}: add one, or use on_conflict = \"error\" or \"skip\""
    )]
    NoUpsertKey {
        /// Target table.
        table: String,
        /// The identity columns.
        columns: String,
        /// The source table.
        source_table: String,
    },
    /// The initial copy found rows already in the target table.
    #[error(
        "target table {table} already holds rows{scope}, so the initial copy of source table {source_table} would mix with them: empty it, or set truncate_before_copy = true on the sink"
    )]
    TargetNotEmpty {
        /// Target table.
        table: String,
        /// `" of source `x`"` with `source_column`.
        scope: String,
        /// The source table.
        source_table: String,
    },
    /// An index dropped for the initial copy could not be built again.
    #[error(transparent)]
    IndexRebuild(Box<IndexRebuildFailed>),
    /// A change violated a constraint on the target.
    #[error(
        "conflict on target table {table}: {message}{key}; stopped on {stopped}: nothing after it is applied until the conflicting row is changed on the target or the transaction is skipped with `walbridge skip --sink {sink}`"
    )]
    Conflict {
        /// The sink.
        sink: String,
        /// Target table.
        table: String,
        /// The server's message with constraint and detail.
        message: String,
        /// `"; key (id)=(5)"` when known.
        key: String,
        /// The source transaction.
        stopped: Box<StoppedOn>,
    },
    /// A value does not fit the target column.
    #[error(
        "value does not fit the target: {message}; stopped on {stopped}: change the target column's type, or skip the transaction with `walbridge skip --sink {sink}`"
    )]
    Value {
        /// The sink.
        sink: String,
        /// Which column, with both types, and the server's message.
        message: String,
        /// The source transaction.
        stopped: Box<StoppedOn>,
    },
    /// A TRUNCATE would have to reach tables the sink does not receive.
    #[error(
        "TRUNCATE of {tables} failed on the target: {message}; the target has foreign keys from tables outside the replicated set, which walbridge does not truncate (as a native subscriber). Truncate or fix those tables on the target, or skip the transaction with `walbridge skip --sink {sink}`; stopped on {stopped}"
    )]
    Truncate {
        /// The sink.
        sink: String,
        /// The tables.
        tables: String,
        /// The server's message.
        message: String,
        /// The source transaction.
        stopped: Box<StoppedOn>,
    },
    /// A TRUNCATE of a partition whose rows go into a table shared with
    /// other partitions.
    #[error(
        "TRUNCATE of partition {partition} cannot be applied: its rows go into {table}, which also holds other partitions' rows. Publish with publish_via_partition_root = true (a TRUNCATE of the whole table then arrives as such), or skip the transaction with `walbridge skip --sink {sink}`; stopped on {stopped}"
    )]
    TruncatePartition {
        /// The sink.
        sink: String,
        /// The source partition.
        partition: String,
        /// The target table.
        table: String,
        /// The source transaction.
        stopped: Box<StoppedOn>,
    },
    /// A statement applying a batch of changes failed; the next attempt
    /// applies them one by one to find the transaction at fault.
    #[error(
        "applying {rows} changes to {table} together failed: {message}; the next attempt applies them one by one to find the source transaction at fault"
    )]
    Batch {
        /// Target table.
        table: String,
        /// Rows in the batch.
        rows: usize,
        /// The server's message.
        message: String,
    },
    /// Another statement of a source transaction failed.
    #[error("applying {stopped} to {table}: {message}")]
    Apply {
        /// Target table.
        table: String,
        /// The server's message.
        message: String,
        /// The source transaction.
        stopped: Box<StoppedOn>,
    },
    /// The target's stored position is not in the source's log any more.
    #[error(
        "the target has applied source `{source_name}` up to {applied}, but its log now starts after {log_start}: the changes in between were removed (retention, or `walbridge drop`); recopy into an empty target, e.g. `walbridge drop --source {source_name}` and start again"
    )]
    PositionGone {
        /// The source.
        source_name: String,
        /// The target's position.
        applied: Lsn,
        /// What the log holds.
        log_start: Lsn,
    },
    /// A new target, but the log no longer holds the initial copy.
    #[error(
        "the target has no stored position for source `{source_name}`, and the source's log no longer holds the initial copy (it starts after {log_start}): run `walbridge drop --source {source_name}` to copy the tables again"
    )]
    CopyGone {
        /// The source.
        source_name: String,
        /// What the log holds.
        log_start: Lsn,
    },
    /// The log could not be read or the cursor not stored.
    #[error("sink `{sink}`: {source}")]
    Log {
        /// The sink.
        sink: String,
        /// Cause.
        source: walbridge_log::LogError,
    },
}

/// Maps a failed statement to [`SinkError::Target`], saying what it was doing.
pub(crate) fn failed(what: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> SinkError {
    let what = what.into();
    move |source| SinkError::Target { what, source }
}

impl SinkError {
    /// The source transaction the error stopped on, if it is one that
    /// `walbridge skip` can skip.
    pub fn stopped_on(&self) -> Option<&StoppedOn> {
        match self {
            SinkError::Conflict { stopped, .. }
            | SinkError::Value { stopped, .. }
            | SinkError::Truncate { stopped, .. }
            | SinkError::TruncatePartition { stopped, .. }
            | SinkError::Apply { stopped, .. } => Some(stopped),
            SinkError::SchemaChange(failed) => failed.stopped.as_ref(),
            _ => None,
        }
    }

    /// True when retrying cannot help: the log no longer holds what the
    /// target needs. (Everything else is retried, as a native apply worker
    /// retries, also conflicts: they resolve once the target is fixed.)
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            SinkError::PositionGone { .. } | SinkError::CopyGone { .. } | SinkError::Log { .. }
        )
    }
}
