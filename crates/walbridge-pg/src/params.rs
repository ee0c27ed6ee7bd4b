//! Connection strings: libpq `key=value` and `postgres://` URL forms.
//!
//! Only the parameters walbridge understands are accepted; anything else
//! is an error naming the key, so a typo never silently changes behaviour.
//! Unset parameters fall back to the libpq environment variables (`PGHOST`,
//! `PGPORT`, `PGUSER`, `PGPASSWORD`, `PGDATABASE`, `PGSSLMODE`, …) and then to
//! libpq's defaults.

use std::path::PathBuf;
use std::time::Duration;

/// How TLS is negotiated, with libpq's meanings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SslMode {
    /// Never use TLS.
    Disable,
    /// Use TLS when the server offers it, without verifying the certificate.
    #[default]
    Prefer,
    /// Require TLS; verify the chain only when a root certificate is configured.
    Require,
    /// Require TLS and a certificate chain signed by the root certificate.
    VerifyCa,
    /// As `VerifyCa`, and the certificate must name the host.
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<Self, ParamsError> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "allow" | "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => {
                return Err(ParamsError::InvalidValue {
                    key: "sslmode".into(),
                    expected: "disable, allow, prefer, require, verify-ca or verify-full",
                });
            }
        })
    }
}

/// Where to connect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Host {
    /// A TCP host name or address.
    Tcp(String),
    /// A directory holding the server's Unix-domain socket.
    Unix(PathBuf),
}

/// What a server must be for a connection to it to be kept
/// (`target_session_attrs`, with libpq's meanings): the hosts are tried in
/// order until one is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SessionAttrs {
    /// Any server.
    #[default]
    Any,
    /// One that takes writes by default: a primary not set
    /// `default_transaction_read_only`.
    ReadWrite,
    /// One that does not.
    ReadOnly,
    /// A server not in recovery.
    Primary,
    /// A server in recovery (a standby).
    Standby,
}

impl SessionAttrs {
    fn parse(value: &str) -> Result<Self, ParamsError> {
        Ok(match value {
            "any" => SessionAttrs::Any,
            "read-write" => SessionAttrs::ReadWrite,
            "read-only" => SessionAttrs::ReadOnly,
            "primary" => SessionAttrs::Primary,
            "standby" => SessionAttrs::Standby,
            _ => {
                return Err(ParamsError::InvalidValue {
                    key: "target_session_attrs".into(),
                    expected: "any, read-write, read-only, primary or standby",
                });
            }
        })
    }

    /// The query that tells: whether the server is in recovery, and
    /// whether its sessions are read-only by default. `None` for `Any`.
    pub fn query(self) -> Option<&'static str> {
        (self != SessionAttrs::Any).then_some(
            "SELECT pg_catalog.pg_is_in_recovery()::text, pg_catalog.current_setting('transaction_read_only')",
        )
    }

    /// Whether a server that answered [`SessionAttrs::query`] with
    /// `in_recovery` (`t`/`f`) and `read_only` (`on`/`off`) is one to keep.
    pub fn accepts(self, in_recovery: &str, read_only: &str) -> bool {
        let in_recovery = in_recovery == "t" || in_recovery == "true";
        let read_only = read_only == "on" || in_recovery;
        match self {
            SessionAttrs::Any => true,
            SessionAttrs::ReadWrite => !read_only,
            SessionAttrs::ReadOnly => read_only,
            SessionAttrs::Primary => !in_recovery,
            SessionAttrs::Standby => in_recovery,
        }
    }

    /// The name as a connection string writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionAttrs::Any => "any",
            SessionAttrs::ReadWrite => "read-write",
            SessionAttrs::ReadOnly => "read-only",
            SessionAttrs::Primary => "primary",
            SessionAttrs::Standby => "standby",
        }
    }
}

/// The keys a connection string may hold.
const KEYS: [&str; 14] = [
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "application_name",
    "connect_timeout",
    "options",
    "target_session_attrs",
];

/// How to write a value that holds spaces, said by every syntax error.
const QUOTING: &str = "a value holding spaces, `=` or `'` must be quoted, as in password='…' (write `'` and `\\` inside as `\\'` and `\\\\`), or given in the environment (PGPASSWORD)";

/// A malformed connection string. Messages never repeat values, nor text
/// that may be part of one: a password with a space would otherwise show
/// up in logs as an "unknown parameter".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamsError {
    /// A parameter walbridge does not know.
    #[error(
        "{}; known: {}; {QUOTING}",
        match .near_miss {
            Some((given, known)) => format!("unknown connection parameter `{given}` (did you mean `{known}`?)"),
            None => format!("parameter {position} of the connection string is not one walbridge knows"),
        },
        KEYS.join(", ")
    )]
    UnknownKey {
        /// Which parameter, counting from 1.
        position: usize,
        /// The name given and the known key it is a misspelling of; only
        /// then is the name repeated.
        near_miss: Option<(String, &'static str)>,
    },
    /// A parameter with a bad value.
    #[error("connection parameter `{key}` has an invalid value: expected {expected}")]
    InvalidValue {
        /// The parameter.
        key: String,
        /// What would have been accepted.
        expected: &'static str,
    },
    /// The text is neither a URL nor `key=value` pairs.
    #[error("malformed connection string: {0}; {QUOTING}")]
    Syntax(String),
}

impl ParamsError {
    /// The error for the unknown key `given`, parameter `position`.
    fn unknown_key(position: usize, given: &str) -> Self {
        let near_miss = KEYS
            .iter()
            .filter(|known| strsim::levenshtein(given, known) <= 2 && given.len() >= 3)
            .min_by_key(|known| strsim::levenshtein(given, known))
            .map(|known| (given.to_owned(), *known));
        ParamsError::UnknownKey {
            position,
            near_miss,
        }
    }
}

/// Parsed connection parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnParams {
    /// Hosts to try, in order.
    pub hosts: Vec<Host>,
    /// Each host's port (also names the Unix socket file).
    pub ports: Vec<u16>,
    /// Database name.
    pub dbname: String,
    /// Role name.
    pub user: String,
    /// Password, if any.
    pub password: Option<String>,
    /// TLS mode.
    pub sslmode: SslMode,
    /// File of trusted root certificates (PEM).
    pub sslrootcert: Option<PathBuf>,
    /// Client certificate (PEM).
    pub sslcert: Option<PathBuf>,
    /// Client private key (PEM).
    pub sslkey: Option<PathBuf>,
    /// `application_name` reported to the server.
    pub application_name: Option<String>,
    /// Give up connecting to a host after this long.
    pub connect_timeout: Option<Duration>,
    /// Server options (`-c name=value …`) sent at start-up.
    pub options: Option<String>,
    /// What the server connected to must be.
    pub target_session_attrs: SessionAttrs,
}

impl ConnParams {
    /// Parses `text` in either form, filling unset values from the environment.
    pub fn parse(text: &str) -> Result<Self, ParamsError> {
        let text = text.trim();
        let pairs = if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            parse_url(text)?
        } else {
            parse_key_values(text)?
        };
        Self::from_pairs(pairs, |k| std::env::var(k).ok())
    }

    fn from_pairs(
        pairs: Vec<(String, String)>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ParamsError> {
        let mut get = std::collections::HashMap::new();
        for (position, (key, value)) in pairs.into_iter().enumerate() {
            if !KEYS.contains(&key.as_str()) {
                return Err(ParamsError::unknown_key(position + 1, &key));
            }
            get.insert(key, value);
        }
        let mut value = |key: &str, var: &str| {
            get.remove(key)
                .or_else(|| env(var))
                .filter(|v| !v.is_empty())
        };
        let host_text = value("hostaddr", "PGHOSTADDR").or_else(|| value("host", "PGHOST"));
        let hosts = match host_text {
            Some(h) => h
                .split(',')
                .map(|h| {
                    if h.starts_with('/') {
                        Host::Unix(PathBuf::from(h))
                    } else {
                        Host::Tcp(h.to_owned())
                    }
                })
                .collect(),
            None => vec![default_socket_dir()],
        };
        // One port for every host, or one per host (an empty one: 5432).
        let invalid_port = || ParamsError::InvalidValue {
            key: "port".into(),
            expected: "a port number, or one per host separated by `,`",
        };
        let ports: Vec<u16> = match value("port", "PGPORT") {
            Some(p) => p
                .split(',')
                .map(|p| match p.trim() {
                    "" => Ok(5432),
                    p => p.parse().map_err(|_| invalid_port()),
                })
                .collect::<Result<_, _>>()?,
            None => vec![5432],
        };
        let ports = match ports.len() {
            1 => vec![ports[0]; hosts.len()],
            n if n == hosts.len() => ports,
            _ => return Err(invalid_port()),
        };
        let user = value("user", "PGUSER")
            .or_else(|| env("USER"))
            .unwrap_or_else(|| "postgres".to_owned());
        let dbname = value("dbname", "PGDATABASE").unwrap_or_else(|| user.clone());
        let sslmode = match value("sslmode", "PGSSLMODE") {
            Some(m) => SslMode::parse(&m)?,
            None => SslMode::Prefer,
        };
        let connect_timeout = match value("connect_timeout", "PGCONNECT_TIMEOUT") {
            Some(t) => {
                let secs: u64 = t.parse().map_err(|_| ParamsError::InvalidValue {
                    key: "connect_timeout".into(),
                    expected: "a number of seconds",
                })?;
                (secs > 0).then(|| Duration::from_secs(secs.max(2)))
            }
            None => None,
        };
        let target_session_attrs = match value("target_session_attrs", "PGTARGETSESSIONATTRS") {
            Some(a) => SessionAttrs::parse(&a)?,
            None => SessionAttrs::Any,
        };
        Ok(ConnParams {
            hosts,
            ports,
            dbname,
            user,
            password: value("password", "PGPASSWORD"),
            sslmode,
            sslrootcert: value("sslrootcert", "PGSSLROOTCERT").map(PathBuf::from),
            sslcert: value("sslcert", "PGSSLCERT").map(PathBuf::from),
            sslkey: value("sslkey", "PGSSLKEY").map(PathBuf::from),
            application_name: value("application_name", "PGAPPNAME"),
            connect_timeout,
            options: value("options", "PGOPTIONS"),
            target_session_attrs,
        })
    }

    /// Each host with its port, in the order to try them.
    pub fn endpoints(&self) -> impl Iterator<Item = (&Host, u16)> {
        self.hosts.iter().zip(self.ports.iter().copied())
    }

    /// A description for messages: `host:port/dbname` without secrets.
    pub fn display_target(&self) -> String {
        let host = match self.hosts.first() {
            Some(Host::Tcp(h)) => h.clone(),
            Some(Host::Unix(dir)) => dir.display().to_string(),
            None => String::new(),
        };
        let port = self.ports.first().copied().unwrap_or(5432);
        format!("{host}:{port}/{}", self.dbname)
    }
}

/// `host:port` (or the socket file's path) for messages.
pub fn endpoint_display(host: &Host, port: u16) -> String {
    match host {
        Host::Tcp(h) => format!("{h}:{port}"),
        Host::Unix(dir) => format!("{}/.s.PGSQL.{port}", dir.display()),
    }
}

fn default_socket_dir() -> Host {
    let debian = PathBuf::from("/var/run/postgresql");
    Host::Unix(if debian.is_dir() {
        debian
    } else {
        PathBuf::from("/tmp")
    })
}

fn parse_key_values(text: &str) -> Result<Vec<(String, String)>, ParamsError> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(out);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return Err(ParamsError::Syntax(format!(
                "parameter {} has no `=`",
                out.len() + 1
            )));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    Some('\\') => match chars.next() {
                        Some(c) => value.push(c),
                        None => {
                            return Err(ParamsError::Syntax(format!(
                                "the quoted value of parameter {} has no closing `'`",
                                out.len() + 1
                            )));
                        }
                    },
                    Some('\'') => break,
                    Some(c) => value.push(c),
                    None => {
                        return Err(ParamsError::Syntax(format!(
                            "the quoted value of parameter {} has no closing `'`",
                            out.len() + 1
                        )));
                    }
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    if let Some(escaped) = chars.next() {
                        value.push(escaped);
                    }
                } else {
                    value.push(c);
                }
            }
        }
        out.push((key, value));
    }
}

/// Decodes `%XX` escapes of the URL's `part` (named in errors, never shown).
fn percent_decode(s: &str, part: &str) -> Result<String, ParamsError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| {
                    ParamsError::Syntax(format!("bad percent-escape in the URL's {part}"))
                })?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out)
        .map_err(|_| ParamsError::Syntax(format!("the URL's {part} is not UTF-8 after decoding")))
}

fn parse_url(text: &str) -> Result<Vec<(String, String)>, ParamsError> {
    let rest = text.split_once("://").map_or(text, |(_, r)| r);
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut out = Vec::new();
    let hostport = match authority.rsplit_once('@') {
        Some((userinfo, hostport)) => {
            let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
            if !user.is_empty() {
                out.push(("user".into(), percent_decode(user, "user")?));
            }
            if !password.is_empty() {
                out.push(("password".into(), percent_decode(password, "password")?));
            }
            hostport
        }
        None => authority,
    };
    if !hostport.is_empty() {
        let mut hosts = Vec::new();
        let mut ports = Vec::new();
        for hp in hostport.split(',') {
            let (host, p) = if let Some(v6) = hp.strip_prefix('[') {
                let (h, after) = v6.split_once(']').ok_or_else(|| {
                    ParamsError::Syntax("a host in the URL has an unclosed `[`".into())
                })?;
                (h.to_owned(), after.strip_prefix(':'))
            } else {
                match hp.rsplit_once(':') {
                    Some((h, p)) => (h.to_owned(), Some(p)),
                    None => (hp.to_owned(), None),
                }
            };
            if !host.is_empty() {
                hosts.push(percent_decode(&host, "host")?);
            }
            ports.push(p.unwrap_or_default().to_owned());
        }
        if !hosts.is_empty() {
            out.push(("host".into(), hosts.join(",")));
        }
        if ports.iter().any(|p| !p.is_empty()) {
            out.push(("port".into(), ports.join(",")));
        }
    }
    if !path.is_empty() {
        out.push(("dbname".into(), percent_decode(path, "database name")?));
    }
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').ok_or_else(|| {
            ParamsError::Syntax(format!("query parameter {} has no `=`", out.len() + 1))
        })?;
        out.push((
            percent_decode(k, "query parameter names")?,
            percent_decode(v, "query parameter values")?,
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ConnParams, ParamsError> {
        let pairs = if text.starts_with("postgres") {
            parse_url(text)?
        } else {
            parse_key_values(text)?
        };
        ConnParams::from_pairs(pairs, |_| None)
    }

    #[test]
    fn key_value_form() {
        let p = parse(r"host=db1 port = 5433 dbname=shop user=walbridge password='it\'s x' sslmode=verify-full")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.hosts, vec![Host::Tcp("db1".into())]);
        assert_eq!(p.ports, [5433]);
        assert_eq!(p.dbname, "shop");
        assert_eq!(p.user, "walbridge");
        assert_eq!(p.password.as_deref(), Some("it's x"));
        assert_eq!(p.sslmode, SslMode::VerifyFull);
    }

    #[test]
    fn url_form() {
        let p = parse(
            "postgresql://wal%40b:s%3Acret@[::1]:6000/my%20db?sslmode=require&application_name=x",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.user, "wal@b");
        assert_eq!(p.password.as_deref(), Some("s:cret"));
        assert_eq!(p.hosts, vec![Host::Tcp("::1".into())]);
        assert_eq!(p.ports, [6000]);
        assert_eq!(p.dbname, "my db");
        assert_eq!(p.sslmode, SslMode::Require);
        assert_eq!(p.application_name.as_deref(), Some("x"));
    }

    #[test]
    fn several_hosts_with_their_ports_and_what_the_server_must_be() {
        let p = parse("host=a,b port=5433,5434 target_session_attrs=read-write")
            .unwrap_or_else(|e| panic!("{e}"));
        let endpoints: Vec<_> = p.endpoints().collect();
        assert_eq!(
            endpoints,
            [
                (&Host::Tcp("a".into()), 5433),
                (&Host::Tcp("b".into()), 5434)
            ]
        );
        assert_eq!(p.target_session_attrs, SessionAttrs::ReadWrite);
        let one_port = parse("host=a,b port=6000").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(one_port.ports, [6000, 6000]);
        let url = parse("postgres://a:5433,b/db?target_session_attrs=primary")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(url.ports, [5433, 5432]);
        assert_eq!(url.target_session_attrs, SessionAttrs::Primary);
        for wrong in ["host=a,b port=1,2,3", "target_session_attrs=prefer-standby"] {
            assert!(
                matches!(parse(wrong), Err(ParamsError::InvalidValue { .. })),
                "{wrong}"
            );
        }
        // A standby is read-only whatever default_transaction_read_only says.
        assert!(!SessionAttrs::ReadWrite.accepts("t", "off"));
        assert!(SessionAttrs::ReadWrite.accepts("f", "off"));
        assert!(!SessionAttrs::ReadWrite.accepts("f", "on"));
        assert!(SessionAttrs::Primary.accepts("f", "on"));
        assert!(SessionAttrs::Standby.accepts("t", "on"));
        assert!(SessionAttrs::ReadOnly.accepts("t", "off"));
    }

    #[test]
    fn unix_sockets_and_defaults() {
        let p = parse("host=/tmp/sock user=u").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.hosts, vec![Host::Unix("/tmp/sock".into())]);
        assert_eq!(p.dbname, "u");
        assert_eq!(p.ports, [5432]);
        assert_eq!(p.sslmode, SslMode::Prefer);
    }

    #[test]
    fn errors_name_the_key() {
        assert_eq!(
            parse("hots=x"),
            Err(ParamsError::UnknownKey {
                position: 1,
                near_miss: Some(("hots".into(), "host"))
            })
        );
        assert!(
            matches!(parse("sslmode=maybe"), Err(ParamsError::InvalidValue { key, .. }) if key == "sslmode")
        );
        assert!(
            matches!(parse("port=http"), Err(ParamsError::InvalidValue { key, .. }) if key == "port")
        );
        assert!(matches!(parse("host"), Err(ParamsError::Syntax(_))));
        // A password with a space: neither half is repeated, the fix is.
        for text in [
            "host=db password=pa55 w0rd",
            "host=db password=pa55 w0rd=x",
            "host=db password='pa55 w0rd",
            "postgres://u:pa55%zzw0rd@db/x",
            "host=db port=pa55w0rd",
        ] {
            let message = parse(text).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(
                !message.contains("pa55") && !message.contains("w0rd"),
                "{text}: {message}"
            );
            assert!(!message.is_empty(), "{text} was accepted");
        }
        assert!(
            parse("host=db password=pa55 w0rd=x")
                .err()
                .is_some_and(|e| e.to_string().contains("password='…'"))
        );
        assert!(matches!(
            parse("password='open"),
            Err(ParamsError::Syntax(_))
        ));
    }
}
