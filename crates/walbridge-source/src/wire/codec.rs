//! Framing of PostgreSQL backend messages, including those of the
//! replication sub-protocol (CopyBoth) that general-purpose clients omit.
//!
//! Pure and incremental: [`decode`] takes what has been read so far and
//! returns a message once one is complete. Frontend messages are written
//! with `postgres_protocol::message::frontend`.

use bytes::{Buf, Bytes, BytesMut};

use crate::reader::{ReadError, Reader};

/// Largest backend message accepted (1 GiB, PostgreSQL's own limit on a
/// field); anything larger means a corrupted stream.
const MAX_MESSAGE_LEN: usize = 1 << 30;

/// A backend message that could not be framed or parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// The length word is out of range.
    #[error("backend message '{tag}' has invalid length {length}")]
    BadLength {
        /// Message tag.
        tag: char,
        /// Length read.
        length: u32,
    },
    /// A field could not be read.
    #[error("malformed backend message '{tag}': {source}")]
    Malformed {
        /// Message tag.
        tag: char,
        /// Cause.
        source: ReadError,
    },
}

/// An error or notice reported by the server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerError {
    /// `ERROR`, `FATAL`, `WARNING`, ….
    pub severity: String,
    /// SQLSTATE.
    pub code: String,
    /// Primary message.
    pub message: String,
    /// Optional detail.
    pub detail: Option<String>,
    /// Optional hint.
    pub hint: Option<String>,
}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} (SQLSTATE {})",
            self.severity, self.message, self.code
        )?;
        if let Some(d) = &self.detail {
            write!(f, "; detail: {d}")?;
        }
        if let Some(h) = &self.hint {
            write!(f, "; hint: {h}")?;
        }
        Ok(())
    }
}

/// An authentication request (`R`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthRequest {
    /// Authentication succeeded.
    Ok,
    /// Send the password in clear text.
    Cleartext,
    /// Send the MD5 hash of the password with this salt.
    Md5([u8; 4]),
    /// Start SASL with one of these mechanisms.
    Sasl(Vec<String>),
    /// A SASL challenge.
    SaslContinue(Bytes),
    /// The SASL outcome.
    SaslFinal(Bytes),
    /// A method walbridge does not implement (GSS, SSPI, …), by code.
    Unsupported(i32),
}

/// A backend message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendMessage {
    /// `R`.
    Authentication(AuthRequest),
    /// `S`: a run-time parameter's value.
    ParameterStatus {
        /// Parameter name.
        name: String,
        /// Its value.
        value: String,
    },
    /// `K`: cancellation key (unused).
    BackendKeyData,
    /// `Z`: ready for a new query; the transaction status byte.
    ReadyForQuery(u8),
    /// `E`.
    ErrorResponse(ServerError),
    /// `N`.
    NoticeResponse(ServerError),
    /// `T`: column names of the result.
    RowDescription(Vec<String>),
    /// `D`: one row, text values.
    DataRow(Vec<Option<Bytes>>),
    /// `C`: command tag.
    CommandComplete(String),
    /// `I`.
    EmptyQueryResponse,
    /// `W`: the connection is now in CopyBoth mode.
    CopyBothResponse,
    /// `H`.
    CopyOutResponse,
    /// `G`.
    CopyInResponse,
    /// `d`: CopyData payload.
    CopyData(Bytes),
    /// `c`.
    CopyDone,
    /// Any other message (ignored by callers that do not expect it).
    Other(u8),
}

/// Takes one complete message off the front of `buf`, or returns `None`
/// when more bytes are needed.
pub fn decode(buf: &mut BytesMut) -> Result<Option<BackendMessage>, CodecError> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let tag = buf[0];
    let length = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]);
    let len = length as usize;
    if !(4..=MAX_MESSAGE_LEN).contains(&len) {
        return Err(CodecError::BadLength {
            tag: char::from(tag),
            length,
        });
    }
    if buf.len() < len + 1 {
        buf.reserve(len + 1 - buf.len());
        return Ok(None);
    }
    buf.advance(5);
    let body = buf.split_to(len - 4).freeze();
    parse(tag, body)
        .map(Some)
        .map_err(|source| CodecError::Malformed {
            tag: char::from(tag),
            source,
        })
}

fn parse(tag: u8, body: Bytes) -> Result<BackendMessage, ReadError> {
    let mut r = Reader::new(body);
    Ok(match tag {
        b'R' => BackendMessage::Authentication(match r.i32()? {
            0 => AuthRequest::Ok,
            3 => AuthRequest::Cleartext,
            5 => {
                let salt = r.bytes(4)?;
                AuthRequest::Md5([salt[0], salt[1], salt[2], salt[3]])
            }
            10 => {
                let mut mechanisms = Vec::new();
                loop {
                    let m = r.cstr()?;
                    if m.is_empty() {
                        break;
                    }
                    mechanisms.push(m);
                }
                AuthRequest::Sasl(mechanisms)
            }
            11 => AuthRequest::SaslContinue(r.rest()),
            12 => AuthRequest::SaslFinal(r.rest()),
            other => AuthRequest::Unsupported(other),
        }),
        b'S' => BackendMessage::ParameterStatus {
            name: r.cstr()?,
            value: r.cstr()?,
        },
        b'K' => BackendMessage::BackendKeyData,
        b'Z' => BackendMessage::ReadyForQuery(r.u8()?),
        b'E' => BackendMessage::ErrorResponse(error_fields(&mut r)?),
        b'N' => BackendMessage::NoticeResponse(error_fields(&mut r)?),
        b'T' => {
            let n = r.i16()?;
            let mut names = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
            for _ in 0..n {
                names.push(r.cstr()?);
                // table oid, column number, type oid, type size, type modifier, format
                r.bytes(18)?;
            }
            BackendMessage::RowDescription(names)
        }
        b'D' => {
            let n = r.i16()?;
            let mut values = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
            for _ in 0..n {
                let len = r.i32()?;
                values.push(match usize::try_from(len) {
                    Ok(len) => Some(r.bytes(len)?),
                    Err(_) => None,
                });
            }
            BackendMessage::DataRow(values)
        }
        b'C' => BackendMessage::CommandComplete(r.cstr()?),
        b'I' => BackendMessage::EmptyQueryResponse,
        b'W' => BackendMessage::CopyBothResponse,
        b'H' => BackendMessage::CopyOutResponse,
        b'G' => BackendMessage::CopyInResponse,
        b'd' => BackendMessage::CopyData(r.rest()),
        b'c' => BackendMessage::CopyDone,
        other => {
            r.rest();
            BackendMessage::Other(other)
        }
    })
}

fn error_fields(r: &mut Reader) -> Result<ServerError, ReadError> {
    let mut e = ServerError::default();
    loop {
        let field = r.u8()?;
        if field == 0 {
            return Ok(e);
        }
        let value = r.cstr()?;
        match field {
            b'V' => e.severity = value,
            b'S' if e.severity.is_empty() => e.severity = value,
            b'C' => e.code = value,
            b'M' => e.message = value,
            b'D' => e.detail = Some(value),
            b'H' => e.hint = Some(value),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn frames_incrementally() {
        let mut buf = BytesMut::from(&b"Z\0\0\0\x05I"[..3]);
        assert_eq!(decode(&mut buf), Ok(None));
        buf.extend_from_slice(b"\0\x05I");
        assert_eq!(
            decode(&mut buf),
            Ok(Some(BackendMessage::ReadyForQuery(b'I')))
        );
        assert!(buf.is_empty());
    }

    #[test]
    fn parses_errors() {
        let body = b"SERROR\0C42704\0Mno such slot\0\0";
        let mut buf = BytesMut::from(&b"E"[..]);
        buf.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        buf.extend_from_slice(body);
        let Ok(Some(BackendMessage::ErrorResponse(e))) = decode(&mut buf) else {
            panic!("not an error")
        };
        assert_eq!(
            (e.severity.as_str(), e.code.as_str(), e.message.as_str()),
            ("ERROR", "42704", "no such slot")
        );
    }

    #[test]
    fn rejects_bad_lengths() {
        let mut buf = BytesMut::from(&b"d\0\0\0\x02"[..]);
        assert!(matches!(
            decode(&mut buf),
            Err(CodecError::BadLength {
                tag: 'd',
                length: 2
            })
        ));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..100)) {
            let mut buf = BytesMut::from(&data[..]);
            while let Ok(Some(_)) = decode(&mut buf) {}
        }
    }
}
