//! walbridge's runtime: what `walbridge run` does, as a library.
//!
//! * [`config`]: the configuration file (`${VAR}` expanded; each
//!   `[[sink]]` read by the sink kind its `type` names, from the kinds the
//!   caller registers).
//! * [`data_dir`]: one process per data_dir (an exclusive lock).
//! * [`pipeline`]: each source appends to its own durable log; each sink
//!   reads the logs through its own cursor, supervised (retried with
//!   backoff, stopped for good on a permanent failure); a source confirms
//!   to the publisher what its log holds, and reports as applied the
//!   lowest position every sink has acknowledged.
//! * [`status`] and the admin endpoint (`[admin] listen`): what the
//!   pipeline shows of itself — `/metrics`, `/healthz`, `/readyz`,
//!   `/status`, and `/` for people (a status page).
//! * [`source`]: a source of either kind: a publisher, or another
//!   walbridge's change feed (`type = "grpc"`).
//! * [`pause`]: sinks paused and resumed, across restarts.

pub mod admin;
pub mod config;
pub mod data_dir;
mod error;
mod log_config;
mod page;
pub mod pause;
pub mod pipeline;
pub mod source;
pub mod status;

pub use config::{Config, ConfigError};
pub use error::RuntimeError;
