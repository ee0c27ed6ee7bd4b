//! Transaction records written straight from the core model.
//!
//! prost encodes only its generated, owned types: through them each change
//! was copied (an allocation per change and per row, a reference count per
//! value) only to be written and dropped, the largest part of appending in
//! a profile of a catch-up. Row changes, nearly everything a log holds,
//! are written here in the protobuf wire format of
//! `walbridge.log.v1.Record` (the rare kinds of change go through the
//! generated types); records are read with the generated types, and the
//! tests check that both write the same bytes.

use walbridge_core::{Change, Datum, OldRow, OldRowKind, Row};

use super::RecordRelations;

/// Wire types.
const VARINT: u32 = 0;
const LEN: u32 = 2;

fn varint(mut value: u64, out: &mut Vec<u8>) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn varint_len(value: u64) -> usize {
    // Seven bits a byte.
    ((value | 1).ilog2() / 7 + 1) as usize
}

fn key(tag: u32, wire_type: u32, out: &mut Vec<u8>) {
    varint(u64::from(tag << 3 | wire_type), out);
}

fn key_len(tag: u32) -> usize {
    varint_len(u64::from(tag << 3))
}

/// A scalar field: left out at its default (zero), as proto3 does.
fn uint(tag: u32, value: u64, out: &mut Vec<u8>) {
    if value != 0 {
        key(tag, VARINT, out);
        varint(value, out);
    }
}

fn uint_len(tag: u32, value: u64) -> usize {
    if value == 0 {
        0
    } else {
        key_len(tag) + varint_len(value)
    }
}

/// The head of a length-delimited field (an embedded message, bytes).
fn delimited(tag: u32, len: usize, out: &mut Vec<u8>) {
    key(tag, LEN, out);
    varint(len as u64, out);
}

fn delimited_len(tag: u32, len: usize) -> usize {
    key_len(tag) + varint_len(len as u64) + len
}

/// `Datum`: one of its fields, always written (it is a oneof).
fn datum_len(datum: &Datum) -> usize {
    match datum {
        Datum::Null | Datum::UnchangedToast => 2,
        Datum::Text(b) | Datum::Binary(b) => delimited_len(3, b.len()),
    }
}

fn put_datum(datum: &Datum, out: &mut Vec<u8>) {
    match datum {
        Datum::Null => {
            key(1, VARINT, out);
            out.push(1);
        }
        Datum::UnchangedToast => {
            key(2, VARINT, out);
            out.push(1);
        }
        Datum::Text(b) => {
            delimited(3, b.len(), out);
            out.extend_from_slice(b);
        }
        Datum::Binary(b) => {
            delimited(4, b.len(), out);
            out.extend_from_slice(b);
        }
    }
}

/// `Row`: `repeated Datum values = 1`.
fn row_len(row: &Row) -> usize {
    row.iter().map(|d| delimited_len(1, datum_len(d))).sum()
}

/// Writes `row` as field `tag`; `len` is its [`row_len`].
fn put_row(tag: u32, row: &Row, len: usize, out: &mut Vec<u8>) {
    delimited(tag, len, out);
    for datum in row {
        delimited(1, datum_len(datum), out);
        put_datum(datum, out);
    }
}

/// `OldRow`: `bool full = 1; Row row = 2`, its row `row_len` long.
fn old_len(old: &OldRow, row_len: usize) -> usize {
    uint_len(1, u64::from(old.kind == OldRowKind::Full)) + delimited_len(2, row_len)
}

fn put_old(tag: u32, old: &OldRow, row_len: usize, out: &mut Vec<u8>) {
    delimited(tag, old_len(old, row_len), out);
    uint(1, u64::from(old.kind == OldRowKind::Full), out);
    put_row(2, &old.row, row_len, out);
}

/// A change ready to be written as a `Change` message.
enum Prepared<'a> {
    /// A row change, written here: its relation's index in the record,
    /// its kind's (`Insert`, `Update`, `Delete`) field and length, and the
    /// lengths of its new and old rows (each measured once).
    Row {
        change: &'a Change,
        relation: u32,
        tag: u32,
        kind_len: usize,
        new_row_len: usize,
        old_row_len: usize,
    },
    /// Another kind, encoded through the generated type.
    Encoded(Vec<u8>),
}

impl<'a> Prepared<'a> {
    fn of(change: &'a Change, relations: &mut RecordRelations<'_>) -> Self {
        let (tag, relation) = match change {
            Change::Insert { relation, .. } => (2, relation),
            Change::Update { relation, .. } => (3, relation),
            Change::Delete { relation, .. } => (4, relation),
            Change::Read { relation, .. } => (7, relation),
            Change::Truncate(_) | Change::Message(_) | Change::ReadRange(_) => {
                return Prepared::Encoded(prost::Message::encode_to_vec(&super::change_to_pb(
                    change, relations,
                )));
            }
        };
        let relation = relations.index(relation);
        let (new, old) = rows(change);
        let new_row_len = new.map_or(0, |(_, row)| row_len(row));
        let old_row_len = old.map_or(0, |o| row_len(&o.row));
        let kind_len = uint_len(1, u64::from(relation))
            + old.map_or(0, |o| delimited_len(2, old_len(o, old_row_len)))
            + new.map_or(0, |(field, _)| delimited_len(field, new_row_len));
        Prepared::Row {
            change,
            relation,
            tag,
            kind_len,
            new_row_len,
            old_row_len,
        }
    }

    /// The `Change` message's length.
    fn len(&self) -> usize {
        match self {
            Prepared::Row {
                change,
                tag,
                kind_len,
                ..
            } => uint_len(1, change.lsn().0) + delimited_len(*tag, *kind_len),
            Prepared::Encoded(bytes) => bytes.len(),
        }
    }

    fn put(&self, out: &mut Vec<u8>) {
        match self {
            Prepared::Encoded(bytes) => out.extend_from_slice(bytes),
            Prepared::Row {
                change,
                relation,
                tag,
                kind_len,
                new_row_len,
                old_row_len,
            } => {
                uint(1, change.lsn().0, out);
                delimited(*tag, *kind_len, out);
                uint(1, u64::from(*relation), out);
                // Fields in number order, as the generated types write them.
                let (new, old) = rows(change);
                if let Some(old) = old {
                    put_old(2, old, *old_row_len, out);
                }
                if let Some((field, new)) = new {
                    put_row(field, new, *new_row_len, out);
                }
            }
        }
    }
}

/// A row change's new row, with its field number in the kind's message
/// (`Insert.new = 2`, `Update.new = 3`), and its old row (field 2).
fn rows(change: &Change) -> (Option<(u32, &Row)>, Option<&OldRow>) {
    match change {
        Change::Insert { new, .. } | Change::Read { new, .. } => (Some((2, new)), None),
        Change::Update { old, new, .. } => (Some((3, new)), old.as_ref()),
        Change::Delete { old, .. } => (None, Some(old)),
        Change::Truncate(_) | Change::Message(_) | Change::ReadRange(_) => (None, None),
    }
}

/// A `Record` holding a `TransactionChunk`: `info` (encoded), `first`,
/// `last`, and `changes`, with the relations they name.
pub(super) fn transaction(
    mut relations: RecordRelations<'_>,
    info: &[u8],
    first: bool,
    last: bool,
    changes: &[Change],
) -> Vec<u8> {
    let prepared: Vec<Prepared<'_>> = changes
        .iter()
        .map(|c| Prepared::of(c, &mut relations))
        .collect();
    let chunk_len = delimited_len(1, info.len())
        + uint_len(2, u64::from(first))
        + uint_len(3, u64::from(last))
        + prepared
            .iter()
            .map(|p| delimited_len(4, p.len()))
            .sum::<usize>();
    let format = u64::from(super::FORMAT);
    let len = uint_len(1, format)
        + relations
            .list
            .iter()
            .map(|r| delimited_len(2, r.len()))
            .sum::<usize>()
        + delimited_len(3, chunk_len);
    let mut out = Vec::with_capacity(len);
    uint(1, format, &mut out);
    for relation in &relations.list {
        delimited(2, relation.len(), &mut out);
        out.extend_from_slice(relation);
    }
    delimited(3, chunk_len, &mut out);
    delimited(1, info.len(), &mut out);
    out.extend_from_slice(info);
    uint(2, u64::from(first), &mut out);
    uint(3, u64::from(last), &mut out);
    for change in &prepared {
        delimited(4, change.len(), &mut out);
        change.put(&mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_lengths_match_their_encoding() {
        for value in [
            0,
            1,
            127,
            128,
            16_383,
            16_384,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut out = Vec::new();
            varint(value, &mut out);
            assert_eq!(out.len(), varint_len(value), "{value}");
        }
    }
}
