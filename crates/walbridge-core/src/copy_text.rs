//! Rows in PostgreSQL's COPY text format.
//!
//! The initial copy travels as the publisher wrote it with `COPY … TO
//! STDOUT`: whole lines, fields separated by tabs, `\N` for NULL,
//! backslash escapes. Keeping the text rather than splitting every row into
//! values on the way in is what lets a PostgreSQL target load it with `COPY
//! … FROM STDIN` as it is — no per-value work between the two servers —
//! while sinks that need values parse the rows as they read them.

use bytes::{BufMut, Bytes, BytesMut};

use crate::{Datum, Row};

/// COPY text that is not what PostgreSQL writes, or a value COPY text
/// cannot carry.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CopyTextError {
    /// A row has another number of fields than the table has columns.
    #[error("a COPY row has {found} fields where its table has {expected} columns")]
    FieldCount {
        /// Fields in the row.
        found: usize,
        /// Columns expected.
        expected: usize,
    },
    /// A field ends in the middle of an escape.
    #[error("a COPY field ends with a lone backslash")]
    TrailingBackslash,
    /// The text does not end at the end of a row.
    #[error("COPY text ends inside a row (no final newline)")]
    Unterminated,
    /// A value only binary or no representation has (snapshot rows never hold one).
    #[error("{0} cannot be written as COPY text")]
    Unrepresentable(&'static str),
}

/// Whole rows of one table in COPY text format, each line ending in `\n`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CopyText {
    text: Bytes,
    rows: usize,
}

impl CopyText {
    /// Rows as PostgreSQL wrote them: `text` must be empty or end with a newline.
    pub fn new(text: Bytes) -> Result<Self, CopyTextError> {
        if text.last().is_some_and(|&b| b != b'\n') {
            return Err(CopyTextError::Unterminated);
        }
        let rows = count_lines(&text);
        Ok(CopyText { text, rows })
    }

    /// `rows` written as COPY text.
    pub fn from_rows(rows: &[Row]) -> Result<Self, CopyTextError> {
        let mut out = BytesMut::new();
        for row in rows {
            encode_row(&mut out, row)?;
        }
        Ok(CopyText {
            text: out.freeze(),
            rows: rows.len(),
        })
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.rows
    }

    /// True without rows.
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// The text: whole lines, as `COPY … FROM STDIN` takes them.
    pub fn text(&self) -> &Bytes {
        &self.text
    }

    /// Each row's line, without its newline.
    pub fn lines(&self) -> impl Iterator<Item = Bytes> + '_ {
        let mut start = 0;
        std::iter::from_fn(move || {
            let end = memchr::memchr(b'\n', &self.text[start..])? + start;
            let line = self.text.slice(start..end);
            start = end + 1;
            Some(line)
        })
    }

    /// Each row's values; every row must have `columns` fields.
    pub fn rows(&self, columns: usize) -> impl Iterator<Item = Result<Row, CopyTextError>> + '_ {
        self.lines().map(move |line| parse_line(line, columns))
    }

    /// Splits the text into pieces of whole rows of about `max_bytes` each
    /// (a row longer than that is a piece of its own).
    pub fn split(self, max_bytes: usize) -> Vec<CopyText> {
        if self.text.len() <= max_bytes {
            return vec![self];
        }
        let mut pieces = Vec::new();
        let mut rest = self.text;
        while !rest.is_empty() {
            let limit = max_bytes.min(rest.len());
            let end = match memchr::memrchr(b'\n', &rest[..limit]) {
                Some(at) => at + 1,
                None => memchr::memchr(b'\n', &rest).map_or(rest.len(), |at| at + 1),
            };
            let text = rest.split_to(end);
            let rows = count_lines(&text);
            pieces.push(CopyText { text, rows });
        }
        pieces
    }
}

fn count_lines(text: &[u8]) -> usize {
    memchr::memchr_iter(b'\n', text).count()
}

/// Appends `row` as one COPY text line.
pub fn encode_row(out: &mut BytesMut, row: &Row) -> Result<(), CopyTextError> {
    for (i, datum) in row.iter().enumerate() {
        if i > 0 {
            out.put_u8(b'\t');
        }
        match datum {
            Datum::Null => out.put_slice(b"\\N"),
            Datum::Text(bytes) => escape_field(out, bytes),
            Datum::Binary(_) => return Err(CopyTextError::Unrepresentable("a binary value")),
            Datum::UnchangedToast => {
                return Err(CopyTextError::Unrepresentable("an unchanged TOAST value"));
            }
        }
    }
    out.put_u8(b'\n');
    Ok(())
}

/// Appends `bytes` as a COPY text field: backslash, tab, newline and
/// carriage return escaped.
pub fn escape_field(out: &mut BytesMut, bytes: &[u8]) {
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

/// Parses one line (without its newline) into `expected` values. Fields
/// without escapes share the line's memory.
pub fn parse_line(line: Bytes, expected: usize) -> Result<Row, CopyTextError> {
    let mut row = Vec::with_capacity(expected);
    let mut start = 0;
    loop {
        let end = memchr::memchr(b'\t', &line[start..]).map_or(line.len(), |p| p + start);
        let field = line.slice(start..end);
        row.push(if &field[..] == b"\\N" {
            Datum::Null
        } else if field.contains(&b'\\') {
            Datum::Text(unescape(&field)?)
        } else {
            Datum::Text(field)
        });
        if end == line.len() {
            break;
        }
        start = end + 1;
    }
    if row.len() != expected {
        return Err(CopyTextError::FieldCount {
            found: row.len(),
            expected,
        });
    }
    Ok(row)
}

fn unescape(field: &[u8]) -> Result<Bytes, CopyTextError> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let b = field[i];
        if b != b'\\' {
            out.push(b);
            i += 1;
            continue;
        }
        let Some(&next) = field.get(i + 1) else {
            return Err(CopyTextError::TrailingBackslash);
        };
        i += 2;
        match next {
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(11),
            b'x' => {
                let digits = field[i..]
                    .iter()
                    .take(2)
                    .take_while(|c| c.is_ascii_hexdigit())
                    .count();
                if digits == 0 {
                    out.push(b'x');
                } else {
                    let value = field[i..i + digits]
                        .iter()
                        .fold(0u8, |v, &c| (v << 4) | hex_value(c));
                    out.push(value);
                    i += digits;
                }
            }
            b'0'..=b'7' => {
                let mut value = u32::from(next - b'0');
                let mut n = 1;
                while n < 3 && field.get(i).is_some_and(|c| (b'0'..=b'7').contains(c)) {
                    value = value * 8 + u32::from(field[i] - b'0');
                    i += 1;
                    n += 1;
                }
                out.push((value & 0xff) as u8);
            }
            other => out.push(other),
        }
    }
    Ok(Bytes::from(out))
}

fn hex_value(digit: u8) -> u8 {
    match digit {
        b'0'..=b'9' => digit - b'0',
        b'a'..=b'f' => digit - b'a' + 10,
        _ => digit - b'A' + 10,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn text(s: &str) -> Datum {
        Datum::Text(Bytes::copy_from_slice(s.as_bytes()))
    }

    #[test]
    fn parses_what_postgres_writes() {
        let row = parse_line(Bytes::from_static(b"1\t\\N\ta\\tb\\\\c\\nd\t\\101\\x42"), 4)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            row,
            vec![text("1"), Datum::Null, text("a\tb\\c\nd"), text("AB")]
        );
        assert_eq!(
            parse_line(Bytes::from_static(b"1\t2"), 3),
            Err(CopyTextError::FieldCount {
                found: 2,
                expected: 3
            })
        );
        assert_eq!(parse_line(Bytes::from_static(b""), 1), Ok(vec![text("")]));
        assert_eq!(
            parse_line(Bytes::from_static(b"a\\"), 1),
            Err(CopyTextError::TrailingBackslash)
        );
    }

    #[test]
    fn counts_and_splits_whole_rows() {
        let copy = CopyText::new(Bytes::from_static(b"1\ta\n2\tbb\n3\tccc\n"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(copy.len(), 3);
        let pieces = copy.clone().split(9);
        let texts: Vec<&[u8]> = pieces.iter().map(|p| &p.text()[..]).collect();
        assert_eq!(texts, [&b"1\ta\n2\tbb\n"[..], b"3\tccc\n"]);
        assert_eq!(pieces.iter().map(CopyText::len).sum::<usize>(), 3);
        // A row longer than the limit is a piece of its own.
        let pieces = copy.split(2);
        assert_eq!(pieces.len(), 3);
        assert_eq!(
            CopyText::new(Bytes::from_static(b"1\t2")),
            Err(CopyTextError::Unterminated)
        );
        assert!(CopyText::new(Bytes::new()).is_ok_and(|c| c.is_empty()));
    }

    #[test]
    fn refuses_values_copy_text_cannot_carry() {
        assert!(CopyText::from_rows(&[vec![Datum::UnchangedToast]]).is_err());
        assert!(CopyText::from_rows(&[vec![Datum::Binary(Bytes::new())]]).is_err());
    }

    proptest! {
        #[test]
        fn rows_round_trip(rows in proptest::collection::vec(
            proptest::collection::vec(proptest::option::of(proptest::collection::vec(any::<u8>(), 0..12)), 3),
            0..6,
        )) {
            let rows: Vec<Row> = rows
                .iter()
                .map(|r| r.iter().map(|v| v.as_ref().map_or(Datum::Null, |b| Datum::Text(Bytes::copy_from_slice(b)))).collect())
                .collect();
            let copy = CopyText::from_rows(&rows).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(copy.len(), rows.len());
            let parsed: Result<Vec<Row>, _> = copy.rows(3).collect();
            prop_assert_eq!(parsed, Ok(rows));
            let pieces = copy.clone().split(7);
            let joined: Vec<u8> = pieces.iter().flat_map(|p| p.text().to_vec()).collect();
            prop_assert_eq!(&joined[..], &copy.text()[..]);
        }
    }
}
