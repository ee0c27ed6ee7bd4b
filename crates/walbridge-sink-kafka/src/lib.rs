//! walbridge's kafka sink: every change as a Debezium-compatible event on
//! a topic per table.
//!
//! * topics are named by a template (default `{source}.{schema}.{table}`)
//!   and created through the admin API before their first message;
//! * the key is the row's replica identity (or configured `key_columns`),
//!   so every change of a row lands on one partition, in commit order;
//! * the value is Debezium's envelope (`before`, `after`, `source`, `op`,
//!   `ts_ms`), deletes are followed by tombstones, a key change is a delete
//!   and a create; headers carry the source, LSN and transaction id;
//! * delivery is at least once: an idempotent producer (`acks = all`), and
//!   the sink's cursor moves only past messages the brokers acknowledged,
//!   so after a crash a consumer sees at most the unacknowledged tail
//!   again, recognizable by its LSN.

mod check;
mod client;
pub mod config;
mod delivery;
pub mod encode;
mod error;
pub mod event;
mod kind;
mod positions;
pub mod registry;
mod sink;
pub mod topic;

pub use check::health_check;
pub use config::{
    Format, KafkaSinkConfig, SchemaRegistryConfig, SchemaRegistrySetting, SubjectNameStrategy,
    TopicCreation,
};
pub use error::SinkError;
pub use kind::KIND;
pub use sink::{COMMIT_INTERVAL, KafkaSink};
