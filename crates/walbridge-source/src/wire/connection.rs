//! The replication connection: TCP or Unix socket, optional TLS, start-up
//! with `replication=database`, authentication (trust, password, md5,
//! SCRAM-SHA-256), simple queries and CopyBoth.
//!
//! A logical walsender accepts replication commands and plain SQL, but only
//! through the simple-query protocol, which is all this connection speaks.

use std::collections::HashMap;
use std::io;

use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

use walbridge_pg::{
    ConnParams, ConnectError, Host, SESSION_SETTINGS, TlsError, TlsSettings, describe_pg_error,
    endpoint_display, parse_server_version,
};

use super::batching::{LOW_WATER, ReadBatching};
use super::codec::{self, AuthRequest, BackendMessage, CodecError, ServerError};

/// Free room in the read buffer before each read: more than a batch, so a
/// batched read takes all that woke it.
const READ_ROOM: usize = 2 * LOW_WATER;

/// Most bytes one drain takes without waiting; past it the next read
/// returns at once instead (a producer faster than the reader cannot keep
/// it draining forever).
const MAX_DRAIN: usize = 16 * LOW_WATER;

/// A failure to connect to or talk with the server.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    /// TLS could not be configured.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// No host could be reached.
    #[error("cannot connect to {target}: {source}")]
    Connect {
        /// `host:port`.
        target: String,
        /// The socket error.
        source: io::Error,
    },
    /// The server does not offer TLS but `sslmode` requires it.
    #[error(
        "{target} does not accept TLS connections, but sslmode requires TLS: enable ssl on the server or use sslmode=prefer"
    )]
    TlsRefused {
        /// `host:port`.
        target: String,
    },
    /// The TLS handshake failed (certificate rejected, …).
    #[error("TLS handshake with {target} failed: {source}")]
    TlsHandshake {
        /// `host:port`.
        target: String,
        /// Cause.
        source: io::Error,
    },
    /// The server asked for a password and none was configured.
    #[error(
        "{target} asks for a password for role \"{user}\": add password=… to the connection string or set PGPASSWORD"
    )]
    PasswordRequired {
        /// `host:port`.
        target: String,
        /// The role.
        user: String,
    },
    /// The server asked for an authentication method walbridge lacks.
    #[error(
        "the server requested an unsupported authentication method ({0}); use scram-sha-256, md5, password or trust in pg_hba.conf"
    )]
    UnsupportedAuth(String),
    /// SCRAM exchange failed (wrong server proof, malformed message).
    #[error("SCRAM authentication failed: {0}")]
    Scram(io::Error),
    /// The server reported an error.
    #[error("{0}")]
    Server(Box<ServerError>),
    /// The connection broke.
    #[error("connection to the server failed: {0}")]
    Io(#[from] io::Error),
    /// Unparseable bytes from the server.
    #[error("protocol error: {0}")]
    Codec(#[from] CodecError),
    /// A message that makes no sense at this point.
    #[error("protocol error: unexpected {0} from the server")]
    Unexpected(String),
    /// The server closed the connection.
    #[error("the server closed the connection")]
    Closed,
    /// Every host answered, none is what `target_session_attrs` asks for
    /// (a failover under way, say): [`ConnectError::NoSuitableHost`].
    #[error(transparent)]
    NoSuitableHost(ConnectError),
    /// A SQL connection (tokio-postgres) failed.
    #[error("{}", describe_pg_error(.0))]
    Sql(#[from] tokio_postgres::Error),
}

impl ConnectionError {
    /// The SQLSTATE when the server reported the error.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            ConnectionError::Server(e) => Some(&e.code),
            ConnectionError::Sql(e) => e.code().map(|c| c.code()),
            _ => None,
        }
    }

    /// True when connecting again may succeed without anyone changing
    /// anything: the server could not be reached or the connection broke,
    /// or the server is starting or shutting down. (Out of connections or
    /// WAL senders is not: see `SourceError::is_transient`.)
    pub fn is_transient(&self) -> bool {
        match self {
            ConnectionError::Connect { .. }
            | ConnectionError::Io(_)
            | ConnectionError::Closed
            | ConnectionError::NoSuitableHost(_) => true,
            // tokio-postgres reports unreachable servers and broken connections without a SQLSTATE.
            ConnectionError::Sql(e) if e.code().is_none() => true,
            _ => self
                .sqlstate()
                .is_some_and(|s| s.starts_with("57") || s.starts_with("08")),
        }
    }

    /// True when the server (or the TLS setup) refused walbridge in a way
    /// only a change of configuration or of the server fixes: credentials,
    /// pg_hba.conf, privileges, a missing database, certificates.
    pub fn is_refusal(&self) -> bool {
        match self {
            ConnectionError::Tls(_)
            | ConnectionError::TlsRefused { .. }
            | ConnectionError::TlsHandshake { .. }
            | ConnectionError::PasswordRequired { .. }
            | ConnectionError::UnsupportedAuth(_)
            | ConnectionError::Scram(_) => true,
            _ => self
                .sqlstate()
                .is_some_and(|s| s.starts_with("28") || s == "42501" || s == "3D000"),
        }
    }
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// The result of one statement of a simple query.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueryResult {
    /// Column names.
    pub columns: Vec<String>,
    /// Rows of text values.
    pub rows: Vec<Vec<Option<String>>>,
}

impl QueryResult {
    /// The value of `column` in row `row`, if both exist and it is not NULL.
    pub fn get(&self, row: usize, column: &str) -> Option<&str> {
        let index = self.columns.iter().position(|c| c == column)?;
        self.rows.get(row)?.get(index)?.as_deref()
    }
}

/// What a CopyBoth stream yields.
#[derive(Debug)]
pub enum CopyMessage {
    /// A CopyData payload.
    Data(Bytes),
    /// The server ended the stream (CopyDone, or the command completed).
    Done,
}

/// A connection in replication mode (`replication=database`).
pub struct ReplicationConnection {
    io: Box<dyn Io>,
    batching: ReadBatching,
    read_buf: BytesMut,
    write_buf: BytesMut,
    parameters: HashMap<String, String>,
    target: String,
}

impl std::fmt::Debug for ReplicationConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicationConnection")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

async fn open_socket(
    params: &ConnParams,
    host: &Host,
    port: u16,
    tls: Option<&TlsSettings>,
) -> Result<(Box<dyn Io>, ReadBatching), ConnectionError> {
    let target = endpoint_display(host, port);
    let connect = async {
        match host {
            Host::Tcp(h) => TcpStream::connect((h.as_str(), port)).await.map(|s| {
                // Status updates are small and latency-sensitive.
                let _ = s.set_nodelay(true);
                let batching = ReadBatching::for_tcp(&s);
                (Box::new(s) as Box<dyn Io>, batching)
            }),
            Host::Unix(dir) => UnixStream::connect(dir.join(format!(".s.PGSQL.{port}")))
                .await
                .map(|s| (Box::new(s) as Box<dyn Io>, ReadBatching::eager())),
        }
    };
    let stream = match params.connect_timeout {
        Some(t) => tokio::time::timeout(t, connect).await.unwrap_or_else(|_| {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "connect_timeout expired",
            ))
        }),
        None => connect.await,
    }
    .map_err(|source| ConnectionError::Connect {
        target: target.clone(),
        source,
    })?;
    let (Host::Tcp(name), Some(tls)) = (host, tls) else {
        // libpq never uses TLS on Unix-domain sockets either.
        return Ok(stream);
    };
    let (mut stream, batching) = stream;
    let mut request = BytesMut::new();
    frontend::ssl_request(&mut request);
    stream.write_all(&request).await?;
    let mut answer = [0u8; 1];
    stream.read_exact(&mut answer).await?;
    match answer[0] {
        b'S' => {
            let tls_stream = tls
                .connect(name, stream)
                .await
                .map_err(|source| ConnectionError::TlsHandshake { target, source })?;
            Ok((Box::new(tls_stream), batching))
        }
        b'N' if !tls.required() => Ok((stream, batching)),
        b'N' => Err(ConnectionError::TlsRefused { target }),
        other => Err(ConnectionError::Unexpected(format!(
            "answer {other:#04x} to the TLS request"
        ))),
    }
}

impl ReplicationConnection {
    /// Connects and authenticates, trying each host in turn.
    /// `application_name` is used unless the connection string sets one.
    pub async fn connect(
        params: &ConnParams,
        application_name: &str,
    ) -> Result<Self, ConnectionError> {
        let tls = TlsSettings::new(params)?;
        let mut last_error = None;
        let mut unsuitable = Vec::new();
        for (host, port) in params.endpoints() {
            let mut conn = match Self::connect_host(
                params,
                host,
                port,
                tls.as_ref(),
                application_name,
            )
            .await
            {
                Ok(conn) => conn,
                Err(e @ (ConnectionError::Connect { .. } | ConnectionError::Io(_))) => {
                    last_error = Some(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let Some(query) = params.target_session_attrs.query() else {
                return Ok(conn);
            };
            let answer = conn.simple_query(query).await?;
            let value = |column: usize| {
                answer
                    .first()
                    .and_then(|r| r.rows.first())
                    .and_then(|row| row.get(column).cloned().flatten())
                    .unwrap_or_default()
            };
            if params.target_session_attrs.accepts(&value(0), &value(1)) {
                return Ok(conn);
            }
            unsuitable.push(endpoint_display(host, port));
            conn.close().await;
        }
        if !unsuitable.is_empty() {
            return Err(ConnectionError::NoSuitableHost(
                ConnectError::NoSuitableHost {
                    attrs: params.target_session_attrs.as_str(),
                    tried: unsuitable.join(", "),
                },
            ));
        }
        Err(last_error.unwrap_or(ConnectionError::Closed))
    }

    async fn connect_host(
        params: &ConnParams,
        host: &Host,
        port: u16,
        tls: Option<&TlsSettings>,
        application_name: &str,
    ) -> Result<Self, ConnectionError> {
        let (io, batching) = open_socket(params, host, port, tls).await?;
        let mut conn = ReplicationConnection {
            io,
            batching,
            read_buf: BytesMut::with_capacity(64 * 1024),
            write_buf: BytesMut::new(),
            parameters: HashMap::new(),
            target: endpoint_display(host, port),
        };
        let app = params
            .application_name
            .as_deref()
            .unwrap_or(application_name);
        let mut startup: Vec<(&str, &str)> = vec![
            ("user", &params.user),
            ("database", &params.dbname),
            ("replication", "database"),
            ("application_name", app),
        ];
        startup.extend(SESSION_SETTINGS);
        if let Some(options) = &params.options {
            startup.push(("options", options));
        }
        frontend::startup_message(startup, &mut conn.write_buf)?;
        conn.flush().await?;
        conn.authenticate(params).await?;
        Ok(conn)
    }

    async fn authenticate(&mut self, params: &ConnParams) -> Result<(), ConnectionError> {
        let target = self.target.clone();
        let password = || {
            params
                .password
                .clone()
                .ok_or_else(|| ConnectionError::PasswordRequired {
                    target: target.clone(),
                    user: params.user.clone(),
                })
        };
        let mut scram: Option<ScramSha256> = None;
        loop {
            match self.recv().await? {
                BackendMessage::Authentication(AuthRequest::Ok) => {}
                BackendMessage::Authentication(AuthRequest::Cleartext) => {
                    frontend::password_message(password()?.as_bytes(), &mut self.write_buf)?;
                    self.flush().await?;
                }
                BackendMessage::Authentication(AuthRequest::Md5(salt)) => {
                    let hash = postgres_protocol::authentication::md5_hash(
                        params.user.as_bytes(),
                        password()?.as_bytes(),
                        salt,
                    );
                    frontend::password_message(hash.as_bytes(), &mut self.write_buf)?;
                    self.flush().await?;
                }
                BackendMessage::Authentication(AuthRequest::Sasl(mechanisms)) => {
                    if !mechanisms.iter().any(|m| m == "SCRAM-SHA-256") {
                        return Err(ConnectionError::UnsupportedAuth(format!(
                            "SASL {}",
                            mechanisms.join(", ")
                        )));
                    }
                    let s = ScramSha256::new(password()?.as_bytes(), ChannelBinding::unsupported());
                    frontend::sasl_initial_response(
                        "SCRAM-SHA-256",
                        s.message(),
                        &mut self.write_buf,
                    )?;
                    self.flush().await?;
                    scram = Some(s);
                }
                BackendMessage::Authentication(AuthRequest::SaslContinue(data)) => {
                    let s = scram
                        .as_mut()
                        .ok_or_else(|| ConnectionError::Unexpected("SASL continue".into()))?;
                    s.update(&data).map_err(ConnectionError::Scram)?;
                    frontend::sasl_response(s.message(), &mut self.write_buf)?;
                    self.flush().await?;
                }
                BackendMessage::Authentication(AuthRequest::SaslFinal(data)) => {
                    let s = scram
                        .as_mut()
                        .ok_or_else(|| ConnectionError::Unexpected("SASL final".into()))?;
                    s.finish(&data).map_err(ConnectionError::Scram)?;
                }
                BackendMessage::Authentication(AuthRequest::Unsupported(code)) => {
                    return Err(ConnectionError::UnsupportedAuth(format!("code {code}")));
                }
                BackendMessage::ParameterStatus { name, value } => {
                    self.parameters.insert(name, value);
                }
                BackendMessage::BackendKeyData | BackendMessage::NoticeResponse(_) => {}
                BackendMessage::ReadyForQuery(_) => return Ok(()),
                BackendMessage::ErrorResponse(e) => {
                    return Err(ConnectionError::Server(Box::new(e)));
                }
                other => {
                    return Err(ConnectionError::Unexpected(format!(
                        "{other:?} during start-up"
                    )));
                }
            }
        }
    }

    /// A run-time parameter the server reported at start-up (`server_version`, …).
    pub fn parameter(&self, name: &str) -> Option<&str> {
        self.parameters.get(name).map(String::as_str)
    }

    /// The server's version as `server_version_num` (e.g. 150004), parsed
    /// from the `server_version` start-up parameter.
    pub fn server_version_num(&self) -> u32 {
        self.parameter("server_version")
            .map_or(0, parse_server_version)
    }

    /// `host:port` (or socket path) of the server.
    pub fn target(&self) -> &str {
        &self.target
    }

    async fn flush(&mut self) -> io::Result<()> {
        if !self.write_buf.is_empty() {
            self.io.write_all(&self.write_buf).await?;
            self.write_buf.clear();
        }
        self.io.flush().await
    }

    /// Reads the next backend message. Cancel-safe: bytes already read stay
    /// buffered for the next call.
    pub async fn recv(&mut self) -> Result<BackendMessage, ConnectionError> {
        // Replies outside the stream are small: wake on every byte.
        self.batching.stop()?;
        loop {
            if let Some(message) = codec::decode(&mut self.read_buf)? {
                return Ok(message);
            }
            self.read_more().await?;
        }
    }

    /// Reads what the socket holds (at least one byte, waiting for it)
    /// into the read buffer; returns the number of bytes read.
    async fn read_more(&mut self) -> Result<usize, ConnectionError> {
        self.read_buf.reserve(READ_ROOM);
        match self.io.read_buf(&mut self.read_buf).await? {
            0 => Err(ConnectionError::Closed),
            n => Ok(n),
        }
    }

    /// Takes what the socket already holds without waiting, until it is
    /// empty: only then does the next read wait for the kernel's signal
    /// (the low-water mark) instead of returning the few bytes that
    /// arrived in the meantime.
    fn drain(&mut self) -> Result<(), ConnectionError> {
        let mut taken = 0;
        while taken < MAX_DRAIN {
            self.read_buf.reserve(READ_ROOM);
            match self.io.read_buf(&mut self.read_buf).now_or_never() {
                None => break,
                Some(Ok(0)) => return Err(ConnectionError::Closed),
                Some(read) => taken += read?,
            }
        }
        Ok(())
    }

    /// Reads more of the CopyBoth stream: in batches while there is a
    /// backlog (see [`super::batching`]), else as soon as anything arrives.
    async fn fill_copy(&mut self) -> Result<(), ConnectionError> {
        let Some(deadline) = self.batching.batch_deadline() else {
            self.read_more().await?;
            self.batching.data_came();
            return Ok(());
        };
        match tokio::time::timeout_at(deadline, self.read_more()).await {
            Ok(read) => {
                read?;
                self.drain()?;
                self.batching.data_came();
            }
            Err(_) => self.batching.stop()?,
        }
        Ok(())
    }

    /// Runs `sql` with the simple-query protocol and returns one result per
    /// statement that returned rows (or completed).
    pub async fn simple_query(&mut self, sql: &str) -> Result<Vec<QueryResult>, ConnectionError> {
        frontend::query(sql, &mut self.write_buf)?;
        self.flush().await?;
        let mut results = Vec::new();
        let mut current = QueryResult::default();
        let mut error = None;
        loop {
            match self.recv().await? {
                BackendMessage::RowDescription(columns) => current.columns = columns,
                BackendMessage::DataRow(values) => current.rows.push(
                    values
                        .into_iter()
                        .map(|v| v.map(|b| String::from_utf8_lossy(&b).into_owned()))
                        .collect(),
                ),
                BackendMessage::CommandComplete(_) | BackendMessage::EmptyQueryResponse => {
                    results.push(std::mem::take(&mut current));
                }
                BackendMessage::ErrorResponse(e) => error = Some(e),
                BackendMessage::ReadyForQuery(_) => {
                    return match error {
                        Some(e) => Err(ConnectionError::Server(Box::new(e))),
                        None => Ok(results),
                    };
                }
                BackendMessage::NoticeResponse(n) => {
                    tracing::debug!(target: "walbridge::server", "{n}")
                }
                BackendMessage::ParameterStatus { name, value } => {
                    self.parameters.insert(name, value);
                }
                BackendMessage::CopyBothResponse
                | BackendMessage::CopyOutResponse
                | BackendMessage::CopyInResponse => {
                    return Err(ConnectionError::Unexpected(format!(
                        "COPY mode after `{sql}`"
                    )));
                }
                _ => {}
            }
        }
    }

    /// Sends `command` (normally `START_REPLICATION …`) and waits until the
    /// server switches to CopyBoth mode.
    pub async fn start_copy_both(&mut self, command: &str) -> Result<(), ConnectionError> {
        frontend::query(command, &mut self.write_buf)?;
        self.flush().await?;
        loop {
            match self.recv().await? {
                BackendMessage::CopyBothResponse => return Ok(()),
                BackendMessage::ErrorResponse(e) => {
                    // Drain to ReadyForQuery so the connection stays usable.
                    loop {
                        if let BackendMessage::ReadyForQuery(_) = self.recv().await? {
                            break;
                        }
                    }
                    return Err(ConnectionError::Server(Box::new(e)));
                }
                BackendMessage::NoticeResponse(n) => {
                    tracing::debug!(target: "walbridge::server", "{n}")
                }
                BackendMessage::ParameterStatus { .. } => {}
                other => {
                    return Err(ConnectionError::Unexpected(format!(
                        "{other:?} after `{command}`"
                    )));
                }
            }
        }
    }

    /// True while the CopyBoth stream is read in batches: the walsender is
    /// behind and data came within the last [`super::batching::BATCH_WAIT`]
    /// (see [`super::batching`]).
    pub fn reads_in_batches(&self) -> bool {
        self.batching.streaming()
    }

    /// Tells the reader whether the walsender is behind
    /// ([`super::batching::is_backlog`]): reads are batched only then.
    pub fn set_behind(&mut self, behind: bool) -> Result<(), ConnectionError> {
        Ok(self.batching.set_behind(behind)?)
    }

    /// Reads the next CopyBoth message. Cancel-safe.
    pub async fn recv_copy(&mut self) -> Result<CopyMessage, ConnectionError> {
        loop {
            if let Some(message) = self.try_recv_copy()? {
                return Ok(message);
            }
            self.fill_copy().await?;
        }
    }

    /// The next CopyBoth message if it has already been received whole,
    /// without waiting: lets a caller take a burst of messages in one go.
    pub fn try_recv_copy(&mut self) -> Result<Option<CopyMessage>, ConnectionError> {
        while let Some(message) = codec::decode(&mut self.read_buf)? {
            match message {
                // A buffer of its own: datums sliced from it keep their reference
                // count away from the rest of the read buffer's, which other
                // threads drop.
                BackendMessage::CopyData(data) => {
                    return Ok(Some(CopyMessage::Data(own_buffer(&data))));
                }
                BackendMessage::CopyDone | BackendMessage::CommandComplete(_) => {
                    return Ok(Some(CopyMessage::Done));
                }
                BackendMessage::ErrorResponse(e) => {
                    return Err(ConnectionError::Server(Box::new(e)));
                }
                BackendMessage::NoticeResponse(n) => {
                    tracing::debug!(target: "walbridge::server", "{n}")
                }
                _ => {}
            }
        }
        Ok(None)
    }

    /// Sends one CopyData message and flushes it.
    pub async fn send_copy_data(&mut self, payload: Bytes) -> Result<(), ConnectionError> {
        frontend::CopyData::new(payload)?.write(&mut self.write_buf);
        Ok(self.flush().await?)
    }

    /// Ends CopyBoth from our side and waits (briefly) for the server to
    /// finish, so a final status update is not lost.
    pub async fn finish_copy_both(&mut self) -> Result<(), ConnectionError> {
        frontend::copy_done(&mut self.write_buf);
        self.flush().await?;
        let drain = async {
            loop {
                match self.recv().await {
                    Ok(BackendMessage::ReadyForQuery(_)) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        };
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), drain).await;
        Ok(())
    }

    /// Closes the connection politely.
    pub async fn close(mut self) {
        frontend::terminate(&mut self.write_buf);
        let _ = self.flush().await;
        let _ = self.io.shutdown().await;
    }
}

impl From<ConnectError> for ConnectionError {
    fn from(e: ConnectError) -> Self {
        match e {
            ConnectError::Tls(e) => ConnectionError::Tls(e),
            ConnectError::Sql(e) => ConnectionError::Sql(e),
            ConnectError::NoHost => ConnectionError::Closed,
            e @ ConnectError::NoSuitableHost { .. } => ConnectionError::NoSuitableHost(e),
        }
    }
}

/// Opens an ordinary SQL connection (catalog queries, snapshot COPY) with
/// the same parameters, TLS and session settings as the replication one.
pub async fn connect_sql(
    params: &ConnParams,
    application_name: &str,
) -> Result<tokio_postgres::Client, ConnectionError> {
    Ok(walbridge_pg::connect_sql(params, application_name).await?)
}

/// `data` in a buffer of its own that is shared from the start: a message
/// of up to 512 bytes lies in the same allocation as the reference count
/// its slices share (one allocation and one free per message, where a
/// copied vector takes a second for the count when its first value is
/// sliced). Sizes go in steps of 32 bytes up to 192, then of 64: at most
/// 63 bytes of a buffer are unused, which with the count's 24 stays within
/// what `Change::approximate_size` counts for the message around a change's
/// values (96 bytes; the second allocation and the vector's rounding took
/// about as much). A longer message is copied: its two allocations are
/// little next to its bytes.
fn own_buffer(data: &[u8]) -> Bytes {
    match data.len() {
        0..=64 => inline::<64>(data),
        65..=96 => inline::<96>(data),
        97..=128 => inline::<128>(data),
        129..=160 => inline::<160>(data),
        161..=192 => inline::<192>(data),
        193..=256 => inline::<256>(data),
        257..=320 => inline::<320>(data),
        321..=384 => inline::<384>(data),
        385..=448 => inline::<448>(data),
        449..=512 => inline::<512>(data),
        _ => Bytes::copy_from_slice(data),
    }
}

/// Up to `N` bytes held inline (see [`own_buffer`]).
struct Inline<const N: usize> {
    len: usize,
    bytes: [u8; N],
}

impl<const N: usize> AsRef<[u8]> for Inline<N> {
    fn as_ref(&self) -> &[u8] {
        self.bytes.get(..self.len).unwrap_or(&self.bytes)
    }
}

/// `data` (at most `N` bytes) as an [`Inline`] owner.
fn inline<const N: usize>(data: &[u8]) -> Bytes {
    let mut bytes = [0; N];
    let len = data.len().min(N);
    bytes[..len].copy_from_slice(&data[..len]);
    Bytes::from_owner(Inline { len, bytes })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_buffers_hold_the_message_and_outlive_it_in_their_slices() {
        for len in 0..=2100 {
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let own = own_buffer(&data);
            assert_eq!(&own[..], &data[..], "length {len}");
            if len >= 2 {
                let tail = own.slice(len / 2..);
                drop(own);
                assert_eq!(&tail[..], &data[len / 2..], "length {len}");
            }
        }
    }
}
