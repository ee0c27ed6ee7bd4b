//! The wire layer: connection parameters, the backend-message codec, the
//! CopyBoth replication messages, TLS, and the connection itself.

pub mod codec;
pub mod connection;
pub mod copyboth;
pub mod params;
pub mod tls;

pub use connection::{
    ConnectionError, CopyMessage, QueryResult, ReplicationConnection, connect_sql,
    describe_pg_error,
};
pub use params::{ConnParams, Host, ParamsError, SslMode};
