//! walbridge's PostgreSQL source.

pub mod pgoutput;
mod reader;
mod send_delay;

pub use reader::ReadError;
pub mod assembler;
pub mod backfill;
pub mod catalog;
pub mod checks;
pub mod config;
mod error;
mod feedback;
pub mod sequences;
pub mod slot;
pub mod snapshot;
pub mod source;
pub mod spill;
mod state;
pub mod wire;

pub use config::SourceConfig;
pub use send_delay::{SEND_DELAY_METRIC, describe_send_delay};
pub use source::{
    Backoff, Downstream, HEARTBEAT_PREFIX, Source, SourceError, SourcePhase, SourceStats,
};
