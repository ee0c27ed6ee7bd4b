//! PostgreSQL client plumbing shared by walbridge's source (the replication
//! connection, catalog queries, snapshot COPY) and its postgres sink (the
//! target connection): one connection-string parser ([`params`]), one TLS
//! configuration with libpq's `sslmode` semantics ([`tls`]), SQL
//! connections with walbridge's session settings ([`connect_sql`]), and
//! SQL quoting.
//!
//! The session settings matter beyond style: the source renders values in
//! text with them and the postgres sink parses the same text back, so both
//! sides must agree on date, interval, float and bytea formats.

pub mod params;
mod sql;
pub mod tls;

pub use params::{ConnParams, Host, ParamsError, SessionAttrs, SslMode, endpoint_display};
pub use sql::{
    ConnectError, SESSION_SETTINGS, connect_sql, describe_pg_error, parse_server_version,
    push_literal, quote_ident, quote_literal, quote_qualified,
};
pub use tls::{PgTls, TlsError, TlsSettings};
