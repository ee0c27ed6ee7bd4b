//! Snapshot rows in COPY's text format.
//!
//! The source reads the initial copy with `COPY … TO STDOUT` (text) and
//! keeps each value's text form; the sink writes the same form back with
//! `COPY … FROM STDIN`, escaping what the format requires.

use bytes::{BufMut, BytesMut};
use walbridge_core::{Datum, Row};

/// Appends one row as a COPY text line: tab-separated, `\N` for NULL, and
/// `extra` (the quoted-free source name of `source_column`) as a last field.
/// Returns an error for values COPY text cannot carry (binary or unchanged
/// TOAST), which snapshot rows never hold.
pub fn encode_row(out: &mut BytesMut, row: &Row, extra: Option<&str>) -> Result<(), &'static str> {
    for (i, datum) in row.iter().enumerate() {
        if i > 0 {
            out.put_u8(b'\t');
        }
        match datum {
            Datum::Null => out.put_slice(b"\\N"),
            Datum::Text(bytes) => escape(out, bytes),
            Datum::Binary(_) => return Err("a binary value in a snapshot row"),
            Datum::UnchangedToast => return Err("an unchanged TOAST value in a snapshot row"),
        }
    }
    if let Some(extra) = extra {
        if !row.is_empty() {
            out.put_u8(b'\t');
        }
        escape(out, extra.as_bytes());
    }
    out.put_u8(b'\n');
    Ok(())
}

fn escape(out: &mut BytesMut, bytes: &[u8]) {
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escaped: &[u8] = match b {
            b'\\' => b"\\\\",
            b'\t' => b"\\t",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            _ => continue,
        };
        out.put_slice(&bytes[start..i]);
        out.put_slice(escaped);
        start = i + 1;
    }
    out.put_slice(&bytes[start..]);
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use proptest::prelude::*;

    use super::*;

    /// COPY text decoding as PostgreSQL does it, for the round trip.
    fn decode_field(field: &[u8]) -> Option<Vec<u8>> {
        if field == b"\\N" {
            return None;
        }
        let mut out = Vec::new();
        let mut it = field.iter();
        while let Some(&b) = it.next() {
            if b == b'\\' {
                match it.next() {
                    Some(b't') => out.push(b'\t'),
                    Some(b'n') => out.push(b'\n'),
                    Some(b'r') => out.push(b'\r'),
                    Some(&other) => out.push(other),
                    None => {}
                }
            } else {
                out.push(b);
            }
        }
        Some(out)
    }

    proptest! {
        #[test]
        fn text_values_round_trip(values in proptest::collection::vec(proptest::option::of(".*"), 1..6)) {
            let row: Row = values
                .iter()
                .map(|v| v.as_ref().map_or(Datum::Null, |s| Datum::Text(Bytes::copy_from_slice(s.as_bytes()))))
                .collect();
            let mut out = BytesMut::new();
            prop_assert!(encode_row(&mut out, &row, Some("src")).is_ok());
            prop_assert_eq!(out.last(), Some(&b'\n'));
            let line = &out[..out.len() - 1];
            let fields: Vec<Option<Vec<u8>>> = line.split(|&b| b == b'\t').map(decode_field).collect();
            let mut expected: Vec<Option<Vec<u8>>> = values.iter().map(|v| v.as_ref().map(|s| s.as_bytes().to_vec())).collect();
            expected.push(Some(b"src".to_vec()));
            prop_assert_eq!(fields, expected);
        }
    }

    #[test]
    fn refuses_values_copy_text_cannot_carry() {
        let mut out = BytesMut::new();
        assert!(encode_row(&mut out, &vec![Datum::UnchangedToast], None).is_err());
        assert!(encode_row(&mut out, &vec![Datum::Binary(Bytes::new())], None).is_err());
    }
}
