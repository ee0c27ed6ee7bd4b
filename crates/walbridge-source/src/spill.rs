//! Spill files: the changes of a large in-progress transaction, written to
//! disk in order and read back in the same order at commit.
//!
//! Record format (native to this process, never read by another version):
//! `u32 length | payload`. A payload is either a relation descriptor
//! (tag `R`, given a file-local number the first time a change uses it) or
//! a change (tag `C`) referring to descriptors by that number, so every
//! change is read back with the descriptor it was decoded with.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use walbridge_core::{
    Change, Column, Datum, KeyOrder, LogicalMessage, Lsn, OldRow, OldRowKind, ReadRange, Relation,
    ReplicaIdentity, Row, TableName, Truncate, TruncateOptions, ValueKind,
};

/// A spill file could not be written or read back.
#[derive(Debug, thiserror::Error)]
pub enum SpillError {
    /// File I/O failed.
    #[error("spill file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Cause.
        source: io::Error,
    },
    /// The file's contents do not parse (it was modified or truncated underneath us).
    #[error("spill file {path} is corrupt at offset {offset}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Offset of the bad record.
        offset: u64,
    },
}

/// An open spill file being appended to.
#[derive(Debug)]
pub struct SpillWriter {
    path: PathBuf,
    out: BufWriter<File>,
    /// Descriptors already in the file, keyed by address; the `Arc` kept
    /// here pins the address so it cannot be reused by another descriptor.
    relation_ids: HashMap<usize, (u32, Arc<Relation>)>,
    next_relation_id: u32,
    len: u64,
}

impl SpillWriter {
    /// Creates (truncating) the file at `path`.
    pub fn create(path: PathBuf) -> Result<Self, SpillError> {
        let file = File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|source| SpillError::Io {
                path: path.clone(),
                source,
            })?;
        Ok(SpillWriter {
            path,
            out: BufWriter::with_capacity(256 * 1024, file),
            relation_ids: HashMap::new(),
            next_relation_id: 0,
            len: 0,
        })
    }

    /// Bytes written so far: the offset the next change will start at.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when nothing has been written.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn record(&mut self, payload: &[u8]) -> Result<(), SpillError> {
        let len = u32::try_from(payload.len()).map_err(|_| SpillError::Io {
            path: self.path.clone(),
            source: io::Error::new(io::ErrorKind::InvalidInput, "change larger than 4 GiB"),
        })?;
        let io = |source| SpillError::Io {
            path: self.path.clone(),
            source,
        };
        self.out.write_all(&len.to_be_bytes()).map_err(io)?;
        self.out
            .write_all(payload)
            .map_err(|source| SpillError::Io {
                path: self.path.clone(),
                source,
            })?;
        self.len += 4 + u64::from(len);
        Ok(())
    }

    fn relation_id(&mut self, relation: &Arc<Relation>) -> Result<u32, SpillError> {
        let key = Arc::as_ptr(relation) as usize;
        if let Some((id, _)) = self.relation_ids.get(&key) {
            return Ok(*id);
        }
        let id = self.next_relation_id;
        self.next_relation_id = self.next_relation_id.wrapping_add(1);
        let mut buf = BytesMut::new();
        buf.put_u8(b'R');
        buf.put_u32(id);
        encode_relation(relation, &mut buf);
        self.record(&buf)?;
        self.relation_ids.insert(key, (id, relation.clone()));
        Ok(id)
    }

    /// Appends one change.
    pub fn write(&mut self, change: &Change) -> Result<(), SpillError> {
        let mut buf = BytesMut::new();
        buf.put_u8(b'C');
        match change {
            Change::Insert { lsn, relation, new } | Change::Read { lsn, relation, new } => {
                let id = self.relation_id(relation)?;
                buf.put_u8(if matches!(change, Change::Read { .. }) {
                    b'R'
                } else {
                    b'I'
                });
                buf.put_u64(lsn.0);
                buf.put_u32(id);
                encode_row(new, &mut buf);
            }
            Change::Update {
                lsn,
                relation,
                old,
                new,
            } => {
                let id = self.relation_id(relation)?;
                buf.put_u8(b'U');
                buf.put_u64(lsn.0);
                buf.put_u32(id);
                encode_old(old.as_ref(), &mut buf);
                encode_row(new, &mut buf);
            }
            Change::Delete { lsn, relation, old } => {
                let id = self.relation_id(relation)?;
                buf.put_u8(b'D');
                buf.put_u64(lsn.0);
                buf.put_u32(id);
                encode_old(Some(old), &mut buf);
            }
            Change::Truncate(t) => {
                let ids = t
                    .relations
                    .iter()
                    .map(|r| self.relation_id(r))
                    .collect::<Result<Vec<_>, _>>()?;
                buf.put_u8(b'T');
                buf.put_u64(t.lsn.0);
                buf.put_u8(
                    u8::from(t.options.cascade) | (u8::from(t.options.restart_identity) << 1),
                );
                buf.put_u32(u32::try_from(ids.len()).unwrap_or(u32::MAX));
                for id in ids {
                    buf.put_u32(id);
                }
            }
            Change::ReadRange(r) => {
                let id = self.relation_id(&r.relation)?;
                buf.put_u8(b'G');
                buf.put_u64(r.lsn.0);
                buf.put_u32(id);
                buf.put_u32(u32::try_from(r.key.len()).unwrap_or(u32::MAX));
                for (index, order) in &r.key {
                    buf.put_u32(u32::try_from(*index).unwrap_or(u32::MAX));
                    buf.put_u8(match order {
                        KeyOrder::Value => 0,
                        KeyOrder::Bytes => 1,
                        KeyOrder::TextForm => 2,
                    });
                }
                for bound in [&r.after, &r.up_to] {
                    buf.put_u8(u8::from(bound.is_some()));
                    put_strings(&mut buf, bound.as_deref().unwrap_or_default());
                }
                buf.put_u32(u32::try_from(r.keys.len()).unwrap_or(u32::MAX));
                for key in &r.keys {
                    put_strings(&mut buf, key);
                }
            }
            Change::Message(m) => {
                buf.put_u8(b'M');
                buf.put_u64(m.lsn.0);
                buf.put_u8(u8::from(m.transactional));
                put_bytes(&mut buf, m.prefix.as_bytes());
                put_bytes(&mut buf, &m.content);
            }
        }
        self.record(&buf)
    }

    /// Cuts the file back to `offset` (a value [`SpillWriter::len`] returned),
    /// discarding everything written after it.
    pub fn truncate(&mut self, offset: u64) -> Result<(), SpillError> {
        let io = |source| SpillError::Io {
            path: self.path.clone(),
            source,
        };
        self.out.flush().map_err(io)?;
        let file = self.out.get_mut();
        file.set_len(offset).map_err(|source| SpillError::Io {
            path: self.path.clone(),
            source,
        })?;
        file.seek(SeekFrom::Start(offset))
            .map_err(|source| SpillError::Io {
                path: self.path.clone(),
                source,
            })?;
        self.len = offset;
        // Descriptors written after the cut are gone. Forgetting all of them
        // makes the next use write a fresh descriptor under a new number.
        self.relation_ids.clear();
        Ok(())
    }

    /// Finishes writing and returns a reader positioned at the start.
    pub fn into_reader(self) -> Result<SpillReader, SpillError> {
        let path = self.path.clone();
        let mut file = self.out.into_inner().map_err(|e| SpillError::Io {
            path: path.clone(),
            source: e.into_error(),
        })?;
        file.seek(SeekFrom::Start(0))
            .map_err(|source| SpillError::Io {
                path: path.clone(),
                source,
            })?;
        Ok(SpillReader {
            path,
            input: BufReader::with_capacity(256 * 1024, file),
            relations: HashMap::new(),
            offset: 0,
        })
    }
}

/// Reads a spill file back, change by change.
#[derive(Debug)]
pub struct SpillReader {
    path: PathBuf,
    input: BufReader<File>,
    relations: HashMap<u32, Arc<Relation>>,
    offset: u64,
}

impl SpillReader {
    /// The next change, or `None` at the end of the file.
    pub fn next_change(&mut self) -> Result<Option<Change>, SpillError> {
        loop {
            let mut len = [0u8; 4];
            match self.input.read_exact(&mut len) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
                Err(source) => {
                    return Err(SpillError::Io {
                        path: self.path.clone(),
                        source,
                    });
                }
            }
            let len = u32::from_be_bytes(len) as usize;
            let mut payload = vec![0u8; len];
            self.input
                .read_exact(&mut payload)
                .map_err(|source| SpillError::Io {
                    path: self.path.clone(),
                    source,
                })?;
            let offset = self.offset;
            self.offset += 4 + len as u64;
            let corrupt = || SpillError::Corrupt {
                path: self.path.clone(),
                offset,
            };
            let mut buf = Bytes::from(payload);
            match take_u8(&mut buf).ok_or_else(corrupt)? {
                b'R' => {
                    let id = take_u32(&mut buf).ok_or_else(corrupt)?;
                    let relation = decode_relation(&mut buf).ok_or_else(corrupt)?;
                    self.relations.insert(id, Arc::new(relation));
                }
                b'C' => {
                    return decode_change(&mut buf, &self.relations)
                        .map(Some)
                        .ok_or_else(corrupt);
                }
                _ => return Err(corrupt()),
            }
        }
    }

    /// Removes the file.
    pub fn remove(self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Removes every spill file left in `dir` by an earlier process.
pub fn clear_dir(dir: &Path) -> Result<(), SpillError> {
    let io = |source| SpillError::Io {
        path: dir.to_owned(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    for entry in std::fs::read_dir(dir).map_err(|source| SpillError::Io {
        path: dir.to_owned(),
        source,
    })? {
        let path = entry
            .map_err(|source| SpillError::Io {
                path: dir.to_owned(),
                source,
            })?
            .path();
        if path.extension().is_some_and(|e| e == "spill") {
            std::fs::remove_file(&path).map_err(|source| SpillError::Io { path, source })?;
        }
    }
    Ok(())
}

fn put_bytes(buf: &mut BytesMut, b: &[u8]) {
    buf.put_u32(u32::try_from(b.len()).unwrap_or(u32::MAX));
    buf.put_slice(b);
}

fn put_strings(buf: &mut BytesMut, values: &[String]) {
    buf.put_u32(u32::try_from(values.len()).unwrap_or(u32::MAX));
    for v in values {
        put_bytes(buf, v.as_bytes());
    }
}

fn take_strings(buf: &mut Bytes) -> Option<Vec<String>> {
    let n = take_u32(buf)?;
    (0..n).map(|_| take_string(buf)).collect()
}

fn take_u8(buf: &mut Bytes) -> Option<u8> {
    (buf.remaining() >= 1).then(|| buf.get_u8())
}

fn take_i16(buf: &mut Bytes) -> Option<i16> {
    (buf.remaining() >= 2).then(|| buf.get_i16())
}

fn take_u32(buf: &mut Bytes) -> Option<u32> {
    (buf.remaining() >= 4).then(|| buf.get_u32())
}

fn take_u64(buf: &mut Bytes) -> Option<u64> {
    (buf.remaining() >= 8).then(|| buf.get_u64())
}

fn take_bytes(buf: &mut Bytes) -> Option<Bytes> {
    let len = take_u32(buf)? as usize;
    (buf.remaining() >= len).then(|| buf.split_to(len))
}

fn take_string(buf: &mut Bytes) -> Option<String> {
    String::from_utf8(take_bytes(buf)?.to_vec()).ok()
}

fn encode_kind(kind: &ValueKind, buf: &mut BytesMut) {
    let tag = match kind {
        ValueKind::Bool => 0,
        ValueKind::Int2 => 1,
        ValueKind::Int4 => 2,
        ValueKind::Int8 => 3,
        ValueKind::Oid => 4,
        ValueKind::Float4 => 5,
        ValueKind::Float8 => 6,
        ValueKind::Numeric => 7,
        ValueKind::Text => 8,
        ValueKind::Bytea => 9,
        ValueKind::Date => 10,
        ValueKind::Time => 11,
        ValueKind::TimeTz => 12,
        ValueKind::Timestamp => 13,
        ValueKind::TimestampTz => 14,
        ValueKind::Interval => 15,
        ValueKind::Uuid => 16,
        ValueKind::Json => 17,
        ValueKind::Jsonb => 18,
        ValueKind::Enum => 19,
        ValueKind::Composite => 20,
        ValueKind::Range => 21,
        ValueKind::Other => 22,
        ValueKind::Array { element, delimiter } => {
            buf.put_u8(23);
            buf.put_u8(*delimiter);
            encode_kind(element, buf);
            return;
        }
    };
    buf.put_u8(tag);
}

fn decode_kind(buf: &mut Bytes) -> Option<ValueKind> {
    Some(match take_u8(buf)? {
        0 => ValueKind::Bool,
        1 => ValueKind::Int2,
        2 => ValueKind::Int4,
        3 => ValueKind::Int8,
        4 => ValueKind::Oid,
        5 => ValueKind::Float4,
        6 => ValueKind::Float8,
        7 => ValueKind::Numeric,
        8 => ValueKind::Text,
        9 => ValueKind::Bytea,
        10 => ValueKind::Date,
        11 => ValueKind::Time,
        12 => ValueKind::TimeTz,
        13 => ValueKind::Timestamp,
        14 => ValueKind::TimestampTz,
        15 => ValueKind::Interval,
        16 => ValueKind::Uuid,
        17 => ValueKind::Json,
        18 => ValueKind::Jsonb,
        19 => ValueKind::Enum,
        20 => ValueKind::Composite,
        21 => ValueKind::Range,
        22 => ValueKind::Other,
        23 => {
            let delimiter = take_u8(buf)?;
            ValueKind::Array {
                element: Box::new(decode_kind(buf)?),
                delimiter,
            }
        }
        _ => return None,
    })
}

fn encode_relation(r: &Relation, buf: &mut BytesMut) {
    buf.put_u32(r.id);
    put_bytes(buf, r.schema.as_bytes());
    put_bytes(buf, r.name.as_bytes());
    buf.put_u8(r.replica_identity.as_byte());
    buf.put_u32(u32::try_from(r.columns.len()).unwrap_or(u32::MAX));
    for c in &r.columns {
        put_bytes(buf, c.name.as_bytes());
        buf.put_u32(c.type_oid);
        buf.put_i32(c.type_modifier);
        put_bytes(buf, c.type_name.as_bytes());
        encode_kind(&c.kind, buf);
        buf.put_u8(u8::from(c.is_key));
        buf.put_i16(c.attnum);
        buf.put_u8(u8::from(c.not_null));
        match &c.missing_value {
            Some(value) => {
                buf.put_u8(1);
                put_bytes(buf, value.as_bytes());
            }
            None => buf.put_u8(0),
        }
    }
    match &r.partition_root {
        Some(root) => {
            buf.put_u8(1);
            put_bytes(buf, root.schema.as_bytes());
            put_bytes(buf, root.name.as_bytes());
        }
        None => buf.put_u8(0),
    }
    buf.put_u32(u32::try_from(r.primary_key.len()).unwrap_or(u32::MAX));
    for &i in &r.primary_key {
        buf.put_u32(u32::try_from(i).unwrap_or(u32::MAX));
    }
}

fn decode_relation(buf: &mut Bytes) -> Option<Relation> {
    let id = take_u32(buf)?;
    let schema = take_string(buf)?;
    let name = take_string(buf)?;
    let replica_identity = ReplicaIdentity::from_byte(take_u8(buf)?)?;
    let n = take_u32(buf)?;
    let mut columns = Vec::new();
    for _ in 0..n {
        columns.push(Column {
            name: take_string(buf)?,
            type_oid: take_u32(buf)?,
            type_modifier: take_u32(buf)? as i32,
            type_name: take_string(buf)?,
            kind: decode_kind(buf)?,
            is_key: take_u8(buf)? == 1,
            attnum: take_i16(buf)?,
            not_null: take_u8(buf)? == 1,
            missing_value: match take_u8(buf)? {
                1 => Some(take_string(buf)?),
                _ => None,
            },
        });
    }
    let partition_root = match take_u8(buf)? {
        1 => Some(TableName {
            schema: take_string(buf)?,
            name: take_string(buf)?,
        }),
        _ => None,
    };
    let mut primary_key = Vec::new();
    for _ in 0..take_u32(buf)? {
        primary_key.push(take_u32(buf)? as usize);
    }
    Some(Relation {
        id,
        schema,
        name,
        replica_identity,
        columns,
        partition_root,
        primary_key,
    })
}

fn encode_row(row: &Row, buf: &mut BytesMut) {
    buf.put_u32(u32::try_from(row.len()).unwrap_or(u32::MAX));
    for d in row {
        match d {
            Datum::Null => buf.put_u8(b'n'),
            Datum::UnchangedToast => buf.put_u8(b'u'),
            Datum::Text(b) => {
                buf.put_u8(b't');
                put_bytes(buf, b);
            }
            Datum::Binary(b) => {
                buf.put_u8(b'b');
                put_bytes(buf, b);
            }
        }
    }
}

fn decode_row(buf: &mut Bytes) -> Option<Row> {
    let n = take_u32(buf)?;
    let mut row = Vec::with_capacity((n as usize).min(buf.remaining()));
    for _ in 0..n {
        row.push(match take_u8(buf)? {
            b'n' => Datum::Null,
            b'u' => Datum::UnchangedToast,
            b't' => Datum::Text(take_bytes(buf)?),
            b'b' => Datum::Binary(take_bytes(buf)?),
            _ => return None,
        });
    }
    Some(row)
}

fn encode_old(old: Option<&OldRow>, buf: &mut BytesMut) {
    match old {
        None => buf.put_u8(0),
        Some(o) => {
            buf.put_u8(match o.kind {
                OldRowKind::Key => b'K',
                OldRowKind::Full => b'O',
            });
            encode_row(&o.row, buf);
        }
    }
}

fn decode_old(buf: &mut Bytes) -> Option<Option<OldRow>> {
    let kind = match take_u8(buf)? {
        0 => return Some(None),
        b'K' => OldRowKind::Key,
        b'O' => OldRowKind::Full,
        _ => return None,
    };
    Some(Some(OldRow {
        kind,
        row: decode_row(buf)?,
    }))
}

fn decode_change(buf: &mut Bytes, relations: &HashMap<u32, Arc<Relation>>) -> Option<Change> {
    let tag = take_u8(buf)?;
    let lsn = Lsn(take_u64(buf)?);
    let relation = |buf: &mut Bytes| relations.get(&take_u32(buf)?).cloned();
    Some(match tag {
        b'I' => Change::Insert {
            lsn,
            relation: relation(buf)?,
            new: decode_row(buf)?,
        },
        b'R' => Change::Read {
            lsn,
            relation: relation(buf)?,
            new: decode_row(buf)?,
        },
        b'U' => {
            let relation = relation(buf)?;
            let old = decode_old(buf)?;
            Change::Update {
                lsn,
                relation,
                old,
                new: decode_row(buf)?,
            }
        }
        b'D' => Change::Delete {
            lsn,
            relation: relation(buf)?,
            old: decode_old(buf)??,
        },
        b'T' => {
            let flags = take_u8(buf)?;
            let n = take_u32(buf)?;
            let rels = (0..n).map(|_| relation(buf)).collect::<Option<Vec<_>>>()?;
            Change::Truncate(Truncate {
                lsn,
                relations: rels,
                options: TruncateOptions {
                    cascade: flags & 1 != 0,
                    restart_identity: flags & 2 != 0,
                },
            })
        }
        b'G' => {
            let relation = relation(buf)?;
            let columns = take_u32(buf)?;
            let key = (0..columns)
                .map(|_| {
                    let index = take_u32(buf)? as usize;
                    let order = match take_u8(buf)? {
                        0 => KeyOrder::Value,
                        1 => KeyOrder::Bytes,
                        2 => KeyOrder::TextForm,
                        _ => return None,
                    };
                    Some((index, order))
                })
                .collect::<Option<Vec<_>>>()?;
            let bound = |buf: &mut Bytes| {
                let present = take_u8(buf)? == 1;
                let values = take_strings(buf)?;
                Some(present.then_some(values))
            };
            let after = bound(buf)?;
            let up_to = bound(buf)?;
            let n = take_u32(buf)?;
            let keys = (0..n)
                .map(|_| take_strings(buf))
                .collect::<Option<Vec<_>>>()?;
            Change::ReadRange(ReadRange {
                lsn,
                relation,
                key,
                after,
                up_to,
                keys,
            })
        }
        b'M' => Change::Message(LogicalMessage {
            lsn,
            transactional: take_u8(buf)? == 1,
            prefix: take_string(buf)?,
            content: take_bytes(buf)?,
        }),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relation(id: u32) -> Arc<Relation> {
        Arc::new(Relation {
            id,
            schema: "public".into(),
            name: format!("t{id}"),
            replica_identity: ReplicaIdentity::Full,
            columns: vec![Column {
                name: "a".into(),
                type_oid: 1007,
                type_modifier: -1,
                type_name: "_int4".into(),
                kind: ValueKind::Array {
                    element: Box::new(ValueKind::Int4),
                    delimiter: b',',
                },
                is_key: true,
                attnum: 3,
                not_null: true,
                missing_value: Some("it's 5".into()),
            }],
            partition_root: Some(TableName {
                schema: "s".into(),
                name: "root".into(),
            }),
            primary_key: vec![0],
        })
    }

    #[test]
    fn round_trips_changes_and_truncates() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let (r1, r2) = (relation(1), relation(2));
        let changes = vec![
            Change::Insert {
                lsn: Lsn(1),
                relation: r1.clone(),
                new: vec![Datum::Text(Bytes::from_static(b"{1}"))],
            },
            Change::Update {
                lsn: Lsn(2),
                relation: r2.clone(),
                old: Some(OldRow {
                    kind: OldRowKind::Full,
                    row: vec![Datum::Null],
                }),
                new: vec![Datum::UnchangedToast],
            },
            Change::Delete {
                lsn: Lsn(3),
                relation: r1.clone(),
                old: OldRow {
                    kind: OldRowKind::Key,
                    row: vec![Datum::Binary(Bytes::from_static(b"\x01"))],
                },
            },
            Change::Read {
                lsn: Lsn(3),
                relation: r2.clone(),
                new: vec![Datum::Text(Bytes::from_static(b"{2}"))],
            },
            Change::ReadRange(ReadRange {
                lsn: Lsn(3),
                relation: r2.clone(),
                key: vec![(0, KeyOrder::TextForm)],
                after: Some(vec!["{1}".into()]),
                up_to: None,
                keys: vec![vec!["{2}".into()], vec![String::new()]],
            }),
            Change::Truncate(Truncate {
                lsn: Lsn(4),
                relations: vec![r1, r2],
                options: TruncateOptions {
                    cascade: true,
                    restart_identity: false,
                },
            }),
            Change::Message(LogicalMessage {
                lsn: Lsn(5),
                transactional: true,
                prefix: "p".into(),
                content: Bytes::from_static(b"x"),
            }),
        ];
        let mut w =
            SpillWriter::create(dir.path().join("t.spill")).unwrap_or_else(|e| panic!("{e}"));
        for c in &changes {
            w.write(c).unwrap_or_else(|e| panic!("{e}"));
        }
        let mut r = w.into_reader().unwrap_or_else(|e| panic!("{e}"));
        let mut back = Vec::new();
        while let Some(c) = r.next_change().unwrap_or_else(|e| panic!("{e}")) {
            back.push(c);
        }
        assert_eq!(back, changes);
    }

    #[test]
    fn truncation_discards_later_changes() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let r1 = relation(1);
        let insert = |lsn| Change::Insert {
            lsn: Lsn(lsn),
            relation: r1.clone(),
            new: vec![],
        };
        let mut w =
            SpillWriter::create(dir.path().join("t.spill")).unwrap_or_else(|e| panic!("{e}"));
        w.write(&insert(1)).unwrap_or_else(|e| panic!("{e}"));
        let cut = w.len();
        w.write(&insert(2)).unwrap_or_else(|e| panic!("{e}"));
        w.truncate(cut).unwrap_or_else(|e| panic!("{e}"));
        w.write(&insert(3)).unwrap_or_else(|e| panic!("{e}"));
        let mut r = w.into_reader().unwrap_or_else(|e| panic!("{e}"));
        let lsns: Vec<_> = std::iter::from_fn(|| r.next_change().ok().flatten())
            .map(|c| c.lsn())
            .collect();
        assert_eq!(lsns, vec![Lsn(1), Lsn(3)]);
    }
}
