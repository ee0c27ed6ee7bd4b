//! The inverse of [`crate::pgoutput::Decoder`]: writes messages in pgoutput's
//! wire format. Used to generate streams for tests, benchmarks and fuzzing
//! seeds; a server never needs it.

use bytes::{BufMut, BytesMut};
use walbridge_core::{Datum, Row};

use super::{Message, OldTupleKind, PrepareBody};

/// Appends `message` in wire format to `out`. `in_stream_block` says whether
/// the message is inside a Stream Start … Stop block (data messages then
/// carry their xid; messages whose `xid` is `None` are written with xid 0).
pub fn encode(message: &Message, in_stream_block: bool, out: &mut BytesMut) {
    let cstr = |out: &mut BytesMut, s: &str| {
        out.put_slice(s.as_bytes());
        out.put_u8(0);
    };
    let xid = |out: &mut BytesMut, xid: &Option<u32>| {
        if in_stream_block {
            out.put_u32(xid.unwrap_or(0));
        }
    };
    match message {
        Message::Begin {
            final_lsn,
            commit_time,
            xid,
        } => {
            out.put_u8(b'B');
            out.put_u64(final_lsn.0);
            out.put_i64(commit_time.0);
            out.put_u32(*xid);
        }
        Message::Commit {
            flags,
            commit_lsn,
            end_lsn,
            commit_time,
        } => {
            out.put_u8(b'C');
            out.put_u8(*flags);
            out.put_u64(commit_lsn.0);
            out.put_u64(end_lsn.0);
            out.put_i64(commit_time.0);
        }
        Message::Origin { lsn, name } => {
            out.put_u8(b'O');
            out.put_u64(lsn.0);
            cstr(out, name);
        }
        Message::Relation { xid: x, body } => {
            out.put_u8(b'R');
            xid(out, x);
            out.put_u32(body.id);
            cstr(
                out,
                if body.schema == "pg_catalog" {
                    ""
                } else {
                    &body.schema
                },
            );
            cstr(out, &body.name);
            out.put_u8(body.replica_identity.as_byte());
            out.put_i16(i16::try_from(body.columns.len()).unwrap_or(i16::MAX));
            for c in &body.columns {
                out.put_u8(u8::from(c.is_key));
                cstr(out, &c.name);
                out.put_u32(c.type_oid);
                out.put_i32(c.type_modifier);
            }
        }
        Message::Type {
            xid: x,
            oid,
            schema,
            name,
        } => {
            out.put_u8(b'Y');
            xid(out, x);
            out.put_u32(*oid);
            cstr(out, schema);
            cstr(out, name);
        }
        Message::Insert {
            xid: x,
            relation_id,
            new,
        } => {
            out.put_u8(b'I');
            xid(out, x);
            out.put_u32(*relation_id);
            out.put_u8(b'N');
            tuple(out, new);
        }
        Message::Update {
            xid: x,
            relation_id,
            old,
            new,
        } => {
            out.put_u8(b'U');
            xid(out, x);
            out.put_u32(*relation_id);
            if let Some((kind, row)) = old {
                out.put_u8(kind_byte(*kind));
                tuple(out, row);
            }
            out.put_u8(b'N');
            tuple(out, new);
        }
        Message::Delete {
            xid: x,
            relation_id,
            old: (kind, row),
        } => {
            out.put_u8(b'D');
            xid(out, x);
            out.put_u32(*relation_id);
            out.put_u8(kind_byte(*kind));
            tuple(out, row);
        }
        Message::Truncate {
            xid: x,
            cascade,
            restart_identity,
            relation_ids,
        } => {
            out.put_u8(b'T');
            xid(out, x);
            out.put_i32(i32::try_from(relation_ids.len()).unwrap_or(i32::MAX));
            out.put_u8(u8::from(*cascade) | (u8::from(*restart_identity) << 1));
            for id in relation_ids {
                out.put_u32(*id);
            }
        }
        Message::Message {
            xid: x,
            transactional,
            lsn,
            prefix,
            content,
        } => {
            out.put_u8(b'M');
            xid(out, x);
            out.put_u8(u8::from(*transactional));
            out.put_u64(lsn.0);
            cstr(out, prefix);
            out.put_i32(i32::try_from(content.len()).unwrap_or(i32::MAX));
            out.put_slice(content);
        }
        Message::StreamStart { xid, first_segment } => {
            out.put_u8(b'S');
            out.put_u32(*xid);
            out.put_u8(u8::from(*first_segment));
        }
        Message::StreamStop => out.put_u8(b'E'),
        Message::StreamCommit {
            xid,
            flags,
            commit_lsn,
            end_lsn,
            commit_time,
        } => {
            out.put_u8(b'c');
            out.put_u32(*xid);
            out.put_u8(*flags);
            out.put_u64(commit_lsn.0);
            out.put_u64(end_lsn.0);
            out.put_i64(commit_time.0);
        }
        Message::StreamAbort { xid, subxid, abort } => {
            out.put_u8(b'A');
            out.put_u32(*xid);
            out.put_u32(*subxid);
            if let Some((lsn, ts)) = abort {
                out.put_u64(lsn.0);
                out.put_i64(ts.0);
            }
        }
        Message::BeginPrepare {
            prepare_lsn,
            end_lsn,
            prepare_time,
            xid,
            gid,
        } => {
            out.put_u8(b'b');
            out.put_u64(prepare_lsn.0);
            out.put_u64(end_lsn.0);
            out.put_i64(prepare_time.0);
            out.put_u32(*xid);
            cstr(out, gid);
        }
        Message::Prepare(body) => prepare(out, b'P', body),
        Message::StreamPrepare(body) => prepare(out, b'p', body),
        Message::CommitPrepared {
            flags,
            commit_lsn,
            end_lsn,
            commit_time,
            xid,
            gid,
        } => {
            out.put_u8(b'K');
            out.put_u8(*flags);
            out.put_u64(commit_lsn.0);
            out.put_u64(end_lsn.0);
            out.put_i64(commit_time.0);
            out.put_u32(*xid);
            cstr(out, gid);
        }
        Message::RollbackPrepared {
            flags,
            prepare_end_lsn,
            rollback_end_lsn,
            prepare_time,
            rollback_time,
            xid,
            gid,
        } => {
            out.put_u8(b'r');
            out.put_u8(*flags);
            out.put_u64(prepare_end_lsn.0);
            out.put_u64(rollback_end_lsn.0);
            out.put_i64(prepare_time.0);
            out.put_i64(rollback_time.0);
            out.put_u32(*xid);
            cstr(out, gid);
        }
    }
}

fn kind_byte(kind: OldTupleKind) -> u8 {
    match kind {
        OldTupleKind::Key => b'K',
        OldTupleKind::Old => b'O',
    }
}

fn prepare(out: &mut BytesMut, tag: u8, body: &PrepareBody) {
    out.put_u8(tag);
    out.put_u8(body.flags);
    out.put_u64(body.prepare_lsn.0);
    out.put_u64(body.end_lsn.0);
    out.put_i64(body.prepare_time.0);
    out.put_u32(body.xid);
    out.put_slice(body.gid.as_bytes());
    out.put_u8(0);
}

fn tuple(out: &mut BytesMut, row: &Row) {
    out.put_i16(i16::try_from(row.len()).unwrap_or(i16::MAX));
    for datum in row {
        match datum {
            Datum::Null => out.put_u8(b'n'),
            Datum::UnchangedToast => out.put_u8(b'u'),
            Datum::Text(b) | Datum::Binary(b) => {
                out.put_u8(if matches!(datum, Datum::Text(_)) {
                    b't'
                } else {
                    b'b'
                });
                out.put_i32(i32::try_from(b.len()).unwrap_or(i32::MAX));
                out.put_slice(b);
            }
        }
    }
}
