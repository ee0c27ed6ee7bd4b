//! Ordinary SQL connections (tokio-postgres) with walbridge's parameters,
//! TLS and session settings; error descriptions; quoting.

use crate::params::{ConnParams, Host};
use crate::tls::{PgTls, TlsError, TlsSettings};

/// Session settings sent at start-up to every connection walbridge opens,
/// so values are rendered the same way by the walsender and by snapshot
/// COPY, and parsed back the same way by the postgres sink: ISO dates,
/// ISO 8601 intervals, UTC offsets, shortest exact floats, hex bytea.
pub const SESSION_SETTINGS: [(&str, &str); 6] = [
    ("client_encoding", "UTF8"),
    ("DateStyle", "ISO"),
    ("IntervalStyle", "iso_8601"),
    ("TimeZone", "UTC"),
    ("extra_float_digits", "3"),
    ("bytea_output", "hex"),
];

/// An SQL connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// TLS could not be configured.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The server refused or no host could be reached.
    #[error("{}", describe_pg_error(.0))]
    Sql(#[from] tokio_postgres::Error),
    /// The connection string names no host.
    #[error("the connection string names no host")]
    NoHost,
    /// Every host answered, none is what `target_session_attrs` asks for.
    #[error(
        "none of {tried} is {attrs} (target_session_attrs = {attrs}): after a failover, wait for a standby to be promoted, or list the new primary's host"
    )]
    NoSuitableHost {
        /// The `target_session_attrs` asked for.
        attrs: &'static str,
        /// The hosts tried, `host:port` separated by `, `.
        tried: String,
    },
}

impl ConnectError {
    /// The SQLSTATE when the server refused the connection.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            ConnectError::Sql(e) => e.code().map(|c| c.code()),
            _ => None,
        }
    }
}

/// The full text of a tokio-postgres error: the server's message, SQLSTATE,
/// detail and hint, or the client-side cause.
pub fn describe_pg_error(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut text = format!(
            "{}: {} (SQLSTATE {})",
            db.severity(),
            db.message(),
            db.code().code()
        );
        if let Some(d) = db.detail() {
            text.push_str(&format!("; detail: {d}"));
        }
        if let Some(h) = db.hint() {
            text.push_str(&format!("; hint: {h}"));
        }
        if let Some(w) = db.where_() {
            text.push_str(&format!("; context: {}", w.replace('\n', " / ")));
        }
        return text;
    }
    // tokio-postgres prints its cause in its own message, most of the time.
    let text = e.to_string();
    match std::error::Error::source(e).map(|c| c.to_string()) {
        Some(cause) if !text.contains(&cause) => format!("{text}: {cause}"),
        _ => text,
    }
}

/// `15.4 (Debian 15.4-1)` → 150004; `9.6.24` → 90624; `17beta1` → 170000.
pub fn parse_server_version(text: &str) -> u32 {
    let numeric: String = text
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let mut parts = numeric.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let major = parts.next().unwrap_or(0);
    if major >= 10 {
        major * 10_000 + parts.next().unwrap_or(0)
    } else {
        major * 10_000 + parts.next().unwrap_or(0) * 100 + parts.next().unwrap_or(0)
    }
}

/// Quotes an SQL identifier.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Quotes a schema-qualified name.
pub fn quote_qualified(schema: &str, name: &str) -> String {
    format!("{}.{}", quote_ident(schema), quote_ident(name))
}

/// Quotes an SQL string literal.
pub fn quote_literal(value: &str) -> String {
    let mut quoted = String::with_capacity(value.len() + 2);
    push_literal(&mut quoted, value);
    quoted
}

/// Appends `value` to `sql` as a string literal: quotes doubled, and with
/// a backslash in it as an escape string (`E'…'`, backslashes doubled),
/// which reads the same whatever `standard_conforming_strings` says (as
/// PostgreSQL's own `quote_literal` writes it).
pub fn push_literal(sql: &mut String, value: &str) {
    let backslash = value.contains('\\');
    if backslash {
        sql.push('E');
    }
    sql.push('\'');
    let mut rest = value;
    while let Some(at) = rest.find(|c| c == '\'' || (backslash && c == '\\')) {
        // The character itself, then again (both are one byte).
        sql.push_str(&rest[..=at]);
        sql.push_str(&rest[at..=at]);
        rest = &rest[at + 1..];
    }
    sql.push_str(rest);
    sql.push('\'');
}

/// Drives a tokio-postgres connection in the background until it ends.
fn spawn_connection<F>(connection: F)
where
    F: Future<Output = Result<(), tokio_postgres::Error>> + Send + 'static,
{
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!("SQL connection ended: {e}");
        }
    });
}

/// Opens an ordinary SQL connection with `params`, their TLS settings and
/// [`SESSION_SETTINGS`], trying the hosts in order. `application_name`
/// applies unless the connection string sets one. The connection task is
/// spawned on the current runtime.
pub async fn connect_sql(
    params: &ConnParams,
    application_name: &str,
) -> Result<tokio_postgres::Client, ConnectError> {
    let tls = TlsSettings::new(params)?;
    let mut last_error = None;
    let mut unsuitable = Vec::new();
    for (host, port) in params.endpoints() {
        let mut config = tokio_postgres::Config::new();
        match host {
            Host::Tcp(h) => config.host(h),
            Host::Unix(dir) => config.host_path(dir),
        };
        config
            .port(port)
            .user(&params.user)
            .dbname(&params.dbname)
            .application_name(
                params
                    .application_name
                    .as_deref()
                    .unwrap_or(application_name),
            );
        if let Some(p) = &params.password {
            config.password(p);
        }
        if let Some(t) = params.connect_timeout {
            config.connect_timeout(t);
        }
        let mut options: Vec<String> = SESSION_SETTINGS
            .iter()
            .map(|(k, v)| format!("-c {k}={v}"))
            .collect();
        options.extend(params.options.clone());
        config.options(options.join(" "));
        let result = match &tls {
            Some(settings) => {
                config.ssl_mode(if settings.required() {
                    tokio_postgres::config::SslMode::Require
                } else {
                    tokio_postgres::config::SslMode::Prefer
                });
                config
                    .connect(PgTls(settings.clone()))
                    .await
                    .map(|(client, conn)| {
                        spawn_connection(conn);
                        client
                    })
            }
            None => {
                config.ssl_mode(tokio_postgres::config::SslMode::Disable);
                config
                    .connect(tokio_postgres::NoTls)
                    .await
                    .map(|(client, conn)| {
                        spawn_connection(conn);
                        client
                    })
            }
        };
        let client = match result {
            Ok(client) => client,
            Err(e) if e.code().is_some() => return Err(e.into()),
            Err(e) => {
                last_error = Some(e);
                continue;
            }
        };
        let Some(query) = params.target_session_attrs.query() else {
            return Ok(client);
        };
        let row = client.query_one(query, &[]).await?;
        let (in_recovery, read_only): (String, String) = (row.try_get(0)?, row.try_get(1)?);
        if params
            .target_session_attrs
            .accepts(&in_recovery, &read_only)
        {
            return Ok(client);
        }
        unsuitable.push(crate::params::endpoint_display(host, port));
    }
    if !unsuitable.is_empty() {
        return Err(ConnectError::NoSuitableHost {
            attrs: params.target_session_attrs.as_str(),
            tried: unsuitable.join(", "),
        });
    }
    Err(last_error.map_or(ConnectError::NoHost, ConnectError::Sql))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_versions() {
        assert_eq!(
            parse_server_version("15.4 (Debian 15.4-1.pgdg120+1)"),
            150004
        );
        assert_eq!(parse_server_version("17beta1"), 170000);
        assert_eq!(parse_server_version("9.6.24"), 90624);
        assert_eq!(parse_server_version("18.4"), 180004);
    }

    #[test]
    fn quotes() {
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(quote_qualified("s", "t"), "\"s\".\"t\"");
        assert_eq!(quote_literal("it's"), "'it''s'");
        assert_eq!(quote_literal("''a'"), "'''''a'''");
        assert_eq!(quote_literal(r#"{"\\'"}"#), r#"E'{"\\\\''"}'"#);
        assert_eq!(quote_literal(r"a\"), r"E'a\\'");
        let mut sql = "EXECUTE s(".to_owned();
        push_literal(&mut sql, "");
        sql.push(')');
        assert_eq!(sql, "EXECUTE s('')");
    }
}
