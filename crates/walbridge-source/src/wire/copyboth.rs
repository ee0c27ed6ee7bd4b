//! The messages exchanged inside CopyData once `START_REPLICATION` has put
//! the connection into CopyBoth mode.

use bytes::{BufMut, Bytes, BytesMut};
use walbridge_core::{Lsn, PgTimestamp};

use crate::reader::{ReadError, Reader};

/// A message from the walsender.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerMessage {
    /// `w`: WAL data, here one pgoutput message.
    XLogData {
        /// WAL position of the data.
        wal_start: Lsn,
        /// The server's current end of WAL.
        wal_end: Lsn,
        /// When the server sent it.
        send_time: PgTimestamp,
        /// The pgoutput message.
        data: Bytes,
    },
    /// `k`: primary keepalive.
    Keepalive {
        /// The server's current end of WAL.
        wal_end: Lsn,
        /// When the server sent it.
        send_time: PgTimestamp,
        /// The server wants a status update now (or it will disconnect us).
        reply_requested: bool,
    },
}

/// CopyData from the walsender that is not a replication message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CopyBothError {
    /// An unknown message kind.
    #[error("unknown replication message kind {0:#04x}")]
    UnknownKind(u8),
    /// A short or unreadable message.
    #[error("malformed replication message: {0}")]
    Malformed(#[from] ReadError),
}

impl ServerMessage {
    /// Parses one CopyData payload.
    pub fn parse(payload: Bytes) -> Result<Self, CopyBothError> {
        let mut r = Reader::new(payload);
        match r.u8()? {
            b'w' => Ok(ServerMessage::XLogData {
                wal_start: Lsn(r.u64()?),
                wal_end: Lsn(r.u64()?),
                send_time: PgTimestamp(r.i64()?),
                data: r.rest(),
            }),
            b'k' => Ok(ServerMessage::Keepalive {
                wal_end: Lsn(r.u64()?),
                send_time: PgTimestamp(r.i64()?),
                reply_requested: r.u8()? == 1,
            }),
            other => Err(CopyBothError::UnknownKind(other)),
        }
    }
}

/// The standby status update (`r`) a client sends: how far it has written,
/// made durable and applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusUpdate {
    /// Last position received and written.
    pub write: Lsn,
    /// Last position durable downstream; becomes the slot's `confirmed_flush_lsn`.
    pub flush: Lsn,
    /// Last position applied downstream.
    pub apply: Lsn,
    /// Client clock.
    pub time: PgTimestamp,
    /// Ask the server to answer with a keepalive at once.
    pub reply_requested: bool,
}

impl StatusUpdate {
    /// The CopyData payload.
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(34);
        out.put_u8(b'r');
        out.put_u64(self.write.0);
        out.put_u64(self.flush.0);
        out.put_u64(self.apply.0);
        out.put_i64(self.time.0);
        out.put_u8(u8::from(self.reply_requested));
        out.freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_keepalive_and_xlogdata() {
        let mut k = BytesMut::new();
        k.put_u8(b'k');
        k.put_u64(0x1_0000_0010);
        k.put_i64(5);
        k.put_u8(1);
        assert_eq!(
            ServerMessage::parse(k.freeze()),
            Ok(ServerMessage::Keepalive {
                wal_end: Lsn(0x1_0000_0010),
                send_time: PgTimestamp(5),
                reply_requested: true
            })
        );
        let mut w = BytesMut::new();
        w.put_u8(b'w');
        w.put_u64(1);
        w.put_u64(2);
        w.put_i64(3);
        w.put_slice(b"E");
        let Ok(ServerMessage::XLogData { data, .. }) = ServerMessage::parse(w.freeze()) else {
            panic!("not xlogdata")
        };
        assert_eq!(&data[..], b"E");
        assert!(ServerMessage::parse(Bytes::from_static(b"k\0")).is_err());
        assert_eq!(
            ServerMessage::parse(Bytes::from_static(b"q")),
            Err(CopyBothError::UnknownKind(b'q'))
        );
    }

    #[test]
    fn encodes_status_update() {
        let s = StatusUpdate {
            write: Lsn(1),
            flush: Lsn(2),
            apply: Lsn(3),
            time: PgTimestamp(4),
            reply_requested: false,
        };
        let b = s.encode();
        assert_eq!(b.len(), 34);
        assert_eq!(b[0], b'r');
        assert_eq!(&b[9..17], &2u64.to_be_bytes());
    }
}
