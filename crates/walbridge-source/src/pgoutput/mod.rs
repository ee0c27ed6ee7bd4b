//! Decoder for the messages of PostgreSQL's `pgoutput` plugin, protocol
//! versions 1 to 4.
//!
//! Pure: bytes in, typed messages out, no I/O and no panics on any input.
//! Column values are slices of the input buffer ([`bytes::Bytes`]), never
//! copies. The only state is whether the decoder is inside a Stream
//! Start … Stream Stop block, because inside one every data message starts
//! with the xid of the transaction it belongs to.

use bytes::Bytes;
use walbridge_core::{Datum, Lsn, Oid, PgTimestamp, ReplicaIdentity, Row};

use crate::reader::{ReadError, Reader};

/// A pgoutput message that could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The message was shorter than its fields require, or otherwise unreadable.
    #[error("malformed pgoutput message '{tag}': {source}")]
    Malformed {
        /// The message tag.
        tag: char,
        /// What went wrong.
        source: ReadError,
    },
    /// The message was empty.
    #[error("empty pgoutput message")]
    Empty,
    /// A tag this decoder does not know.
    #[error("unknown pgoutput message tag {0:#04x}")]
    UnknownTag(u8),
    /// A field held a value outside its domain.
    #[error("invalid pgoutput message '{tag}': {what}")]
    Invalid {
        /// The message tag.
        tag: char,
        /// Which field and value.
        what: String,
    },
    /// Bytes were left over after the message.
    #[error("pgoutput message '{tag}' has {count} unexpected trailing byte(s)")]
    TrailingBytes {
        /// The message tag.
        tag: char,
        /// How many.
        count: usize,
    },
}

/// One column of a Relation message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationColumn {
    /// True when the column is part of the replica identity (flag bit 1).
    pub is_key: bool,
    /// Column name.
    pub name: String,
    /// Type OID.
    pub type_oid: Oid,
    /// Type modifier (`atttypmod`).
    pub type_modifier: i32,
}

/// A Relation message: the publisher's description of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationBody {
    /// Relation OID.
    pub id: Oid,
    /// Schema name (`pg_catalog` when the publisher sends an empty string).
    pub schema: String,
    /// Table name.
    pub name: String,
    /// Replica identity setting.
    pub replica_identity: ReplicaIdentity,
    /// Columns in publisher order.
    pub columns: Vec<RelationColumn>,
}

/// Which old-row image accompanies an Update or Delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OldTupleKind {
    /// `K`: key columns only.
    Key,
    /// `O`: the whole old row (REPLICA IDENTITY FULL).
    Old,
}

/// Commit, Prepare and Stream Prepare share this shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrepareBody {
    /// Flags (currently unused, 0).
    pub flags: u8,
    /// LSN of the prepare record.
    pub prepare_lsn: Lsn,
    /// End LSN of the prepared transaction.
    pub end_lsn: Lsn,
    /// Prepare time.
    pub prepare_time: PgTimestamp,
    /// Transaction id.
    pub xid: u32,
    /// The global transaction identifier.
    pub gid: String,
}

/// A decoded pgoutput message. `xid` fields are `Some` only for messages
/// received inside a Stream Start … Stream Stop block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// `B`: a transaction starts.
    Begin {
        /// LSN of the commit record.
        final_lsn: Lsn,
        /// Commit time.
        commit_time: PgTimestamp,
        /// Transaction id.
        xid: u32,
    },
    /// `C`: the transaction commits.
    Commit {
        /// Flags (unused).
        flags: u8,
        /// LSN of the commit record.
        commit_lsn: Lsn,
        /// End of the commit record.
        end_lsn: Lsn,
        /// Commit time.
        commit_time: PgTimestamp,
    },
    /// `O`: the transaction came from a replication origin.
    Origin {
        /// Commit LSN on the origin server.
        lsn: Lsn,
        /// Origin name.
        name: String,
    },
    /// `R`: a table's description.
    Relation {
        /// Streamed transaction, if inside a stream block.
        xid: Option<u32>,
        /// The description.
        body: RelationBody,
    },
    /// `Y`: a user-defined type's name.
    Type {
        /// Streamed transaction, if inside a stream block.
        xid: Option<u32>,
        /// Type OID.
        oid: Oid,
        /// Schema name.
        schema: String,
        /// Type name.
        name: String,
    },
    /// `I`: an inserted row.
    Insert {
        /// Streamed transaction, if inside a stream block.
        xid: Option<u32>,
        /// Relation OID.
        relation_id: Oid,
        /// The new row.
        new: Row,
    },
    /// `U`: an updated row.
    Update {
        /// Streamed transaction, if inside a stream block.
        xid: Option<u32>,
        /// Relation OID.
        relation_id: Oid,
        /// The old key or row, when sent.
        old: Option<(OldTupleKind, Row)>,
        /// The new row.
        new: Row,
    },
    /// `D`: a deleted row.
    Delete {
        /// Streamed transaction, if inside a stream block.
        xid: Option<u32>,
        /// Relation OID.
        relation_id: Oid,
        /// The old key or row.
        old: (OldTupleKind, Row),
    },
    /// `T`: one TRUNCATE of one or more tables.
    Truncate {
        /// Streamed transaction, if inside a stream block.
        xid: Option<u32>,
        /// `CASCADE` given.
        cascade: bool,
        /// `RESTART IDENTITY` given.
        restart_identity: bool,
        /// The truncated relations.
        relation_ids: Vec<Oid>,
    },
    /// `M`: a logical decoding message.
    Message {
        /// Streamed transaction, if inside a stream block.
        xid: Option<u32>,
        /// True when transactional.
        transactional: bool,
        /// LSN of the message.
        lsn: Lsn,
        /// Prefix.
        prefix: String,
        /// Content.
        content: Bytes,
    },
    /// `S`: a block of a streamed in-progress transaction starts.
    StreamStart {
        /// The streamed transaction.
        xid: u32,
        /// True for the transaction's first block.
        first_segment: bool,
    },
    /// `E`: the current stream block ends.
    StreamStop,
    /// `c`: a streamed transaction commits.
    StreamCommit {
        /// The streamed transaction.
        xid: u32,
        /// Flags (unused).
        flags: u8,
        /// LSN of the commit record.
        commit_lsn: Lsn,
        /// End of the commit record.
        end_lsn: Lsn,
        /// Commit time.
        commit_time: PgTimestamp,
    },
    /// `A`: a streamed transaction, or one of its subtransactions, aborts.
    StreamAbort {
        /// The top-level streamed transaction.
        xid: u32,
        /// The aborted (sub)transaction; equal to `xid` for the whole transaction.
        subxid: u32,
        /// Abort LSN and time (protocol 4 with parallel streaming).
        abort: Option<(Lsn, PgTimestamp)>,
    },
    /// `b`: a two-phase transaction's prepare starts.
    BeginPrepare {
        /// LSN of the prepare record.
        prepare_lsn: Lsn,
        /// End LSN of the prepared transaction.
        end_lsn: Lsn,
        /// Prepare time.
        prepare_time: PgTimestamp,
        /// Transaction id.
        xid: u32,
        /// Global transaction identifier.
        gid: String,
    },
    /// `P`: the transaction is prepared.
    Prepare(PrepareBody),
    /// `K`: COMMIT PREPARED.
    CommitPrepared {
        /// Flags (unused).
        flags: u8,
        /// LSN of the commit-prepared record.
        commit_lsn: Lsn,
        /// End of that record.
        end_lsn: Lsn,
        /// Commit time.
        commit_time: PgTimestamp,
        /// Transaction id.
        xid: u32,
        /// Global transaction identifier.
        gid: String,
    },
    /// `r`: ROLLBACK PREPARED.
    RollbackPrepared {
        /// Flags (unused).
        flags: u8,
        /// End LSN of the prepared transaction.
        prepare_end_lsn: Lsn,
        /// End LSN of the rollback record.
        rollback_end_lsn: Lsn,
        /// Prepare time.
        prepare_time: PgTimestamp,
        /// Rollback time.
        rollback_time: PgTimestamp,
        /// Transaction id.
        xid: u32,
        /// Global transaction identifier.
        gid: String,
    },
    /// `p`: a streamed transaction is prepared.
    StreamPrepare(PrepareBody),
}

/// Decodes a sequence of pgoutput messages from one replication stream.
#[derive(Debug, Default)]
pub struct Decoder {
    in_stream_block: bool,
}

impl Decoder {
    /// A decoder outside any stream block.
    pub fn new() -> Self {
        Self::default()
    }

    /// True between Stream Start and Stream Stop.
    pub fn in_stream_block(&self) -> bool {
        self.in_stream_block
    }

    /// Decodes one message (the payload of one XLogData).
    pub fn decode(&mut self, data: Bytes) -> Result<Message, DecodeError> {
        let &tag = data.first().ok_or(DecodeError::Empty)?;
        let mut r = Reader::new(data);
        r.u8().map_err(|source| DecodeError::Malformed {
            tag: char::from(tag),
            source,
        })?;
        let message = self.decode_body(tag, &mut r)?;
        if r.remaining() != 0 {
            return Err(DecodeError::TrailingBytes {
                tag: char::from(tag),
                count: r.remaining(),
            });
        }
        match message {
            Message::StreamStart { .. } => self.in_stream_block = true,
            Message::StreamStop => self.in_stream_block = false,
            _ => {}
        }
        Ok(message)
    }

    fn decode_body(&self, tag: u8, r: &mut Reader) -> Result<Message, DecodeError> {
        let tag_char = char::from(tag);
        let malformed = |source| DecodeError::Malformed {
            tag: tag_char,
            source,
        };
        let invalid = |what: String| DecodeError::Invalid {
            tag: tag_char,
            what,
        };
        let lsn = |r: &mut Reader| r.u64().map(Lsn);
        let ts = |r: &mut Reader| r.i64().map(PgTimestamp);
        let stream_xid = |r: &mut Reader| -> Result<Option<u32>, ReadError> {
            if self.in_stream_block {
                r.u32().map(Some)
            } else {
                Ok(None)
            }
        };
        let body = (|| -> Result<Result<Message, DecodeError>, ReadError> {
            Ok(Ok(match tag {
                b'B' => Message::Begin {
                    final_lsn: lsn(r)?,
                    commit_time: ts(r)?,
                    xid: r.u32()?,
                },
                b'C' => Message::Commit {
                    flags: r.u8()?,
                    commit_lsn: lsn(r)?,
                    end_lsn: lsn(r)?,
                    commit_time: ts(r)?,
                },
                b'O' => Message::Origin {
                    lsn: lsn(r)?,
                    name: r.cstr()?,
                },
                b'R' => {
                    let xid = stream_xid(r)?;
                    let id = r.u32()?;
                    let schema = r.cstr()?;
                    let name = r.cstr()?;
                    let identity_byte = r.u8()?;
                    let Some(replica_identity) = ReplicaIdentity::from_byte(identity_byte) else {
                        return Ok(Err(invalid(format!(
                            "replica identity {identity_byte:#04x}"
                        ))));
                    };
                    let ncols = r.i16()?;
                    let Ok(ncols) = usize::try_from(ncols) else {
                        return Ok(Err(invalid(format!("column count {ncols}"))));
                    };
                    let mut columns = Vec::with_capacity(ncols.min(r.remaining()));
                    for _ in 0..ncols {
                        columns.push(RelationColumn {
                            is_key: r.u8()? & 1 == 1,
                            name: r.cstr()?,
                            type_oid: r.u32()?,
                            type_modifier: r.i32()?,
                        });
                    }
                    let schema = if schema.is_empty() {
                        "pg_catalog".to_owned()
                    } else {
                        schema
                    };
                    Message::Relation {
                        xid,
                        body: RelationBody {
                            id,
                            schema,
                            name,
                            replica_identity,
                            columns,
                        },
                    }
                }
                b'Y' => Message::Type {
                    xid: stream_xid(r)?,
                    oid: r.u32()?,
                    schema: r.cstr()?,
                    name: r.cstr()?,
                },
                b'I' => {
                    let xid = stream_xid(r)?;
                    let relation_id = r.u32()?;
                    match r.u8()? {
                        b'N' => {}
                        other => {
                            return Ok(Err(invalid(format!(
                                "tuple marker {other:#04x}, expected 'N'"
                            ))));
                        }
                    }
                    match tuple(r)? {
                        Ok(new) => Message::Insert {
                            xid,
                            relation_id,
                            new,
                        },
                        Err(e) => return Ok(Err(invalid(e))),
                    }
                }
                b'U' => {
                    let xid = stream_xid(r)?;
                    let relation_id = r.u32()?;
                    let mut marker = r.u8()?;
                    let mut old = None;
                    if let Some(kind) = old_kind(marker) {
                        match tuple(r)? {
                            Ok(row) => old = Some((kind, row)),
                            Err(e) => return Ok(Err(invalid(e))),
                        }
                        marker = r.u8()?;
                    }
                    if marker != b'N' {
                        return Ok(Err(invalid(format!(
                            "tuple marker {marker:#04x}, expected 'N'"
                        ))));
                    }
                    match tuple(r)? {
                        Ok(new) => Message::Update {
                            xid,
                            relation_id,
                            old,
                            new,
                        },
                        Err(e) => return Ok(Err(invalid(e))),
                    }
                }
                b'D' => {
                    let xid = stream_xid(r)?;
                    let relation_id = r.u32()?;
                    let marker = r.u8()?;
                    let Some(kind) = old_kind(marker) else {
                        return Ok(Err(invalid(format!(
                            "tuple marker {marker:#04x}, expected 'K' or 'O'"
                        ))));
                    };
                    match tuple(r)? {
                        Ok(row) => Message::Delete {
                            xid,
                            relation_id,
                            old: (kind, row),
                        },
                        Err(e) => return Ok(Err(invalid(e))),
                    }
                }
                b'T' => {
                    let xid = stream_xid(r)?;
                    let count = r.i32()?;
                    let Ok(count) = usize::try_from(count) else {
                        return Ok(Err(invalid(format!("relation count {count}"))));
                    };
                    let options = r.u8()?;
                    let mut relation_ids = Vec::with_capacity(count.min(r.remaining() / 4));
                    for _ in 0..count {
                        relation_ids.push(r.u32()?);
                    }
                    Message::Truncate {
                        xid,
                        cascade: options & 1 != 0,
                        restart_identity: options & 2 != 0,
                        relation_ids,
                    }
                }
                b'M' => Message::Message {
                    xid: stream_xid(r)?,
                    transactional: r.u8()? & 1 == 1,
                    lsn: lsn(r)?,
                    prefix: r.cstr()?,
                    content: r.length_prefixed()?,
                },
                b'S' => Message::StreamStart {
                    xid: r.u32()?,
                    first_segment: r.u8()? == 1,
                },
                b'E' => Message::StreamStop,
                b'c' => Message::StreamCommit {
                    xid: r.u32()?,
                    flags: r.u8()?,
                    commit_lsn: lsn(r)?,
                    end_lsn: lsn(r)?,
                    commit_time: ts(r)?,
                },
                b'A' => {
                    let xid = r.u32()?;
                    let subxid = r.u32()?;
                    let abort = if r.remaining() >= 16 {
                        Some((lsn(r)?, ts(r)?))
                    } else {
                        None
                    };
                    Message::StreamAbort { xid, subxid, abort }
                }
                b'b' => Message::BeginPrepare {
                    prepare_lsn: lsn(r)?,
                    end_lsn: lsn(r)?,
                    prepare_time: ts(r)?,
                    xid: r.u32()?,
                    gid: r.cstr()?,
                },
                b'P' => Message::Prepare(prepare_body(r)?),
                b'p' => Message::StreamPrepare(prepare_body(r)?),
                b'K' => Message::CommitPrepared {
                    flags: r.u8()?,
                    commit_lsn: lsn(r)?,
                    end_lsn: lsn(r)?,
                    commit_time: ts(r)?,
                    xid: r.u32()?,
                    gid: r.cstr()?,
                },
                b'r' => Message::RollbackPrepared {
                    flags: r.u8()?,
                    prepare_end_lsn: lsn(r)?,
                    rollback_end_lsn: lsn(r)?,
                    prepare_time: ts(r)?,
                    rollback_time: ts(r)?,
                    xid: r.u32()?,
                    gid: r.cstr()?,
                },
                other => return Ok(Err(DecodeError::UnknownTag(other))),
            }))
        })();
        body.map_err(malformed)?
    }
}

fn old_kind(marker: u8) -> Option<OldTupleKind> {
    match marker {
        b'K' => Some(OldTupleKind::Key),
        b'O' => Some(OldTupleKind::Old),
        _ => None,
    }
}

fn prepare_body(r: &mut Reader) -> Result<PrepareBody, ReadError> {
    Ok(PrepareBody {
        flags: r.u8()?,
        prepare_lsn: Lsn(r.u64()?),
        end_lsn: Lsn(r.u64()?),
        prepare_time: PgTimestamp(r.i64()?),
        xid: r.u32()?,
        gid: r.cstr()?,
    })
}

/// TupleData. The outer error is a read failure, the inner one a bad column kind.
fn tuple(r: &mut Reader) -> Result<Result<Row, String>, ReadError> {
    let ncols = r.i16()?;
    let Ok(ncols) = usize::try_from(ncols) else {
        return Ok(Err(format!("tuple column count {ncols}")));
    };
    let mut row = Vec::with_capacity(ncols.min(r.remaining()));
    for _ in 0..ncols {
        row.push(match r.u8()? {
            b'n' => Datum::Null,
            b'u' => Datum::UnchangedToast,
            b't' => Datum::Text(r.length_prefixed()?),
            b'b' => Datum::Binary(r.length_prefixed()?),
            other => return Ok(Err(format!("tuple column kind {other:#04x}"))),
        });
    }
    Ok(Ok(row))
}

pub mod encode;

#[cfg(test)]
mod tests;
