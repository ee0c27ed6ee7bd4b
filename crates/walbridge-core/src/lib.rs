//! The shared model of walbridge.
//!
//! Everything that travels between a source and a sink is defined here:
//! write-ahead-log positions ([`Lsn`]), relation and type descriptors
//! ([`Relation`], [`TypeInfo`]), column values as PostgreSQL produced them
//! ([`Datum`]), row changes ([`Change`]) and the framing of committed
//! transactions ([`SourceEvent`]). The crate does no I/O.
//!
//! Values stay in PostgreSQL's own representation (text or `typsend`
//! binary) together with the column's type, so a PostgreSQL sink can apply
//! them losslessly and other sinks convert them once, at the edge (see
//! [`json`]).

mod change;
pub mod copy_text;
mod event;
pub mod json;
mod lsn;
mod relation;
mod report;
mod schema;
mod secret;
pub mod template;
pub mod temporal;
mod time;
mod types;
mod units;
mod value;

pub use change::{
    Change, KeyOrder, LogicalMessage, OPERATIONS, OldRow, OldRowKind, ReadRange, Truncate,
    TruncateOptions, update_new_row,
};
pub use copy_text::{CopyText, CopyTextError};
pub use event::{
    EventBatch, Origin, SequenceValue, SequenceValues, SnapshotBatch, SourceEvent, TransactionInfo,
};
pub use lsn::{Lsn, ParseLsnError};
pub use relation::{Column, Relation, RelationId, ReplicaIdentity, TableName};
pub use report::describe;
pub use schema::{ColumnChange, ColumnShape, carry_attnums, column_changes};
pub use secret::BearerToken;
pub use time::PgTimestamp;
pub use types::{Oid, TypeInfo, TypeKind, ValueKind};
pub use units::{ByteSize, DurationText};
pub use value::{Datum, Row};
