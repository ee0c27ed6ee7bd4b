//! walbridge's postgres sink: applies each source's committed
//! transactions, read from its log, into another PostgreSQL database —
//! in the source's commit order, exactly once, with the semantics of a
//! native logical-replication subscriber.
//!
//! * Tables are matched by name through the `table` template
//!   ([`mapping`]), columns by name in any order; target-only columns get
//!   their defaults.
//! * The initial copy goes in with `COPY`, into tables whose indexes are
//!   built after it ([`deferred`]); changes with prepared,
//!   pipelined statements ([`statement`], [`inflight`]); UPDATE and DELETE
//!   find rows by the replica identity (every column, one row among
//!   duplicates, for FULL) and count, rather than fail on, rows that are
//!   not there. Unchanged TOAST values are never written.
//! * Consecutive source transactions share one target transaction; the
//!   position of the last one is stored in the same transaction through a
//!   replication origin or a progress table ([`progress`]), which is what a
//!   restart resumes from ([`apply`] explains the argument).
//! * Conflicts stop the sink on the failing source transaction, which
//!   [`skip()`] moves past; or are skipped, or turned into upserts.
//!
//! * With `schema_changes = "apply"` and `create_tables`, the target's
//!   tables follow the publisher's: [`schema`] plans the statements, run
//!   in the target transaction of the first change under the new
//!   definition.
//!
//! Apply sessions run with `session_replication_role = replica`.

pub mod apply;
pub mod batch;
mod config;
mod connect;
pub mod deferred;
mod error;
pub mod inflight;
mod kind;
pub mod mapping;
pub mod progress;
pub mod schema;
pub mod sequences;
mod sink;
mod skip;
pub mod state;
pub mod statement;
pub mod target;

pub use config::{
    DroppedColumns, OnConflict, PostgresSinkConfig, ProgressMode, SchemaChanges, SynchronousCommit,
};
pub use connect::{check_tables, health_check};
pub use error::{SinkError, StoppedOn};
pub use kind::KIND;
pub use sink::{PostgresSink, PostgresSinkHandle};
pub use skip::skip;
