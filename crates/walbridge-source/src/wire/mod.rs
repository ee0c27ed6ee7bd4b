//! The wire layer: the backend-message codec, the CopyBoth replication
//! messages and the replication connection. Connection parameters and TLS
//! come from `walbridge-pg`, shared with the postgres sink.

pub mod batching;
pub mod codec;
pub mod connection;
pub mod copyboth;

pub use connection::{
    ConnectionError, CopyMessage, QueryResult, ReplicationConnection, connect_sql,
};
pub use walbridge_pg::{
    ConnParams, Host, ParamsError, SslMode, describe_pg_error, params, parse_server_version, tls,
};
