//! Chunk keys: which columns order a table's chunks, how the publisher
//! orders them, and the same order in Rust, so a change's key can be
//! placed against a chunk's bounds without asking the publisher.

use std::cmp::Ordering;

use bytes::Bytes;
use walbridge_core::{Datum, KeyOrder, Relation, ReplicaIdentity, Row};
use walbridge_pg::{quote_ident, quote_literal};

/// How one key column is compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    /// `int2`, `int4`, `int8`, `oid`: by value (the table's index serves it).
    Integer,
    /// `uuid`: by its 16 bytes, which its text form keeps in order.
    Uuid,
    /// `text`, `varchar`: byte order (`COLLATE "C"`), which Rust reproduces
    /// whatever the database's collation.
    Text,
    /// Any other type: by its text form, byte order (`::text COLLATE "C"`).
    /// Changes must then carry text values (`binary = false`).
    TextForm,
}

impl KeyKind {
    fn of(type_name: &str) -> Self {
        match type_name {
            "int2" | "int4" | "int8" | "oid" => KeyKind::Integer,
            "uuid" => KeyKind::Uuid,
            "text" | "varchar" => KeyKind::Text,
            _ => KeyKind::TextForm,
        }
    }

    /// How the publisher orders it.
    fn order(self) -> KeyOrder {
        match self {
            KeyKind::Integer | KeyKind::Uuid => KeyOrder::Value,
            KeyKind::Text => KeyOrder::Bytes,
            KeyKind::TextForm => KeyOrder::TextForm,
        }
    }

    /// The comparable form of a value as the publisher sent it: text, or
    /// binary for the orders whose binary form is known.
    fn part(self, datum: &Datum) -> Option<KeyPart> {
        match (self, datum) {
            (KeyKind::Integer, Datum::Text(t)) => std::str::from_utf8(t)
                .ok()?
                .parse()
                .ok()
                .map(KeyPart::Integer),
            (KeyKind::Integer, Datum::Binary(b)) => Some(KeyPart::Integer(match b.len() {
                2 => i64::from(i16::from_be_bytes([b[0], b[1]])),
                4 => i64::from(i32::from_be_bytes([b[0], b[1], b[2], b[3]])),
                8 => i64::from_be_bytes(b[..8].try_into().ok()?),
                _ => return None,
            })),
            (KeyKind::Uuid, Datum::Text(t)) => {
                let hex: Vec<u8> = t.iter().copied().filter(|c| *c != b'-').collect();
                if hex.len() != 32 {
                    return None;
                }
                let bytes = (0..16)
                    .map(|i| {
                        std::str::from_utf8(&hex[2 * i..2 * i + 2])
                            .ok()
                            .and_then(|h| u8::from_str_radix(h, 16).ok())
                    })
                    .collect::<Option<Vec<u8>>>()?;
                Some(KeyPart::Bytes(Bytes::from(bytes)))
            }
            (KeyKind::Uuid, Datum::Binary(b)) if b.len() == 16 => Some(KeyPart::Bytes(b.clone())),
            // The binary form of text is its bytes.
            (KeyKind::Text, Datum::Text(t) | Datum::Binary(t))
            | (KeyKind::TextForm, Datum::Text(t)) => Some(KeyPart::Bytes(t.clone())),
            _ => None,
        }
    }
}

/// One column's value in comparable form.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KeyPart {
    /// An integer.
    Integer(i64),
    /// Bytes compared as unsigned, in order.
    Bytes(Bytes),
}

/// A row's key: its columns in order, compared lexicographically as the
/// publisher's `ORDER BY` does.
pub type Key = Vec<KeyPart>;

/// A key as read from the publisher: comparable, and its text for SQL
/// (empty for a row of a table read whole, in no order).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadKey {
    /// Comparable form.
    pub parts: Key,
    /// The values' text, as the publisher wrote them.
    pub text: Vec<String>,
}

/// The columns that order a table's chunks and identify its rows in the
/// stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkKey {
    /// Indexes in the relation's columns.
    pub columns: Vec<usize>,
    /// Their quoted names.
    quoted: Vec<String>,
    /// How each is ordered.
    orders: Vec<KeyKind>,
}

impl ChunkKey {
    /// The key of `relation`: its replica identity (the columns every
    /// change carries, deletes included), or its primary key under
    /// REPLICA IDENTITY FULL; `None` for a table without either.
    pub fn of(relation: &Relation) -> Option<Self> {
        let columns: Vec<usize> = match relation.replica_identity {
            ReplicaIdentity::Default | ReplicaIdentity::Index => relation.key_columns().collect(),
            ReplicaIdentity::Full => relation.primary_key.clone(),
            ReplicaIdentity::Nothing => Vec::new(),
        };
        if columns.is_empty() {
            return None;
        }
        let column = |i: usize| &relation.columns[i];
        Some(ChunkKey {
            quoted: columns
                .iter()
                .map(|&i| quote_ident(&column(i).name))
                .collect(),
            orders: columns
                .iter()
                .map(|&i| KeyKind::of(&column(i).type_name))
                .collect(),
            columns,
        })
    }

    /// The key columns and how the publisher orders each.
    pub fn ordered(&self) -> Vec<(usize, KeyOrder)> {
        self.columns
            .iter()
            .zip(&self.orders)
            .map(|(&i, kind)| (i, kind.order()))
            .collect()
    }

    /// The key values of a row read from the publisher, as text.
    pub fn text_of(&self, row: &Row) -> Option<Vec<String>> {
        self.columns
            .iter()
            .map(|&i| match row.get(i) {
                Some(Datum::Text(t)) => std::str::from_utf8(t).ok().map(str::to_owned),
                _ => None,
            })
            .collect()
    }

    /// True when every key column can be compared in binary form (a
    /// `binary = true` source sends changes so).
    pub fn binary_comparable(&self) -> bool {
        !self.orders.contains(&KeyKind::TextForm)
    }

    /// The key of `row`; `None` when a key value is missing or malformed.
    pub fn key_of(&self, row: &Row) -> Option<Key> {
        self.columns
            .iter()
            .zip(&self.orders)
            .map(|(&i, order)| order.part(row.get(i)?))
            .collect()
    }

    /// The key of a row read from the publisher (text values).
    pub fn read_key(&self, row: &Row) -> Option<ReadKey> {
        Some(ReadKey {
            parts: self.key_of(row)?,
            text: self.text_of(row)?,
        })
    }

    /// The comparable key for stored text values.
    pub fn parse(&self, text: &[String]) -> Option<ReadKey> {
        if text.len() != self.columns.len() {
            return None;
        }
        let parts = self
            .orders
            .iter()
            .zip(text)
            .map(|(order, t)| order.part(&Datum::Text(Bytes::from(t.clone()))))
            .collect::<Option<Key>>()?;
        Some(ReadKey {
            parts,
            text: text.to_vec(),
        })
    }

    /// `ORDER BY` list.
    pub fn order_by(&self) -> String {
        self.expressions().join(", ")
    }

    fn expressions(&self) -> Vec<String> {
        self.quoted
            .iter()
            .zip(&self.orders)
            .map(|(c, o)| o.order().expression(c))
            .collect()
    }

    /// `(columns) > (values)`: the rows after `key` in chunk order.
    pub fn after(&self, key: &ReadKey) -> String {
        self.compare(">", key)
    }

    /// `(columns) <= (values)`: the rows up to `key` in chunk order.
    pub fn up_to(&self, key: &ReadKey) -> String {
        self.compare("<=", key)
    }

    fn compare(&self, op: &str, key: &ReadKey) -> String {
        let values: Vec<String> = key.text.iter().map(|t| quote_literal(t)).collect();
        format!(
            "({}) {op} ({})",
            self.expressions().join(", "),
            values.join(", ")
        )
    }
}

/// Where a key lies against a range `(after, up_to]` of chunk order.
pub fn in_range(key: &Key, after: Option<&Key>, up_to: Option<&Key>) -> bool {
    after.is_none_or(|a| key.cmp(a) == Ordering::Greater)
        && up_to.is_none_or(|u| key.cmp(u) != Ordering::Greater)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Datum {
        Datum::Text(Bytes::from(s.to_owned()))
    }

    #[test]
    fn integers_order_by_value_in_text_and_binary() {
        let o = KeyKind::Integer;
        let nine = o.part(&text("9"));
        let ten = o.part(&text("10"));
        assert!(nine < ten);
        assert_eq!(
            o.part(&Datum::Binary(Bytes::from_static(&[
                0xff, 0xff, 0xff, 0xf6
            ]))),
            o.part(&text("-10"))
        );
        assert!(o.part(&text("-10")) < o.part(&text("-9")));
    }

    #[test]
    fn uuids_order_by_bytes_in_text_and_binary() {
        let o = KeyKind::Uuid;
        let a = o.part(&text("00000000-0000-0000-0000-0000000000ff"));
        let b = o.part(&text("00000000-0000-0000-0000-000000000100"));
        assert!(a < b);
        let mut raw = [0u8; 16];
        raw[15] = 0xff;
        assert_eq!(o.part(&Datum::Binary(Bytes::copy_from_slice(&raw))), a);
    }

    #[test]
    fn text_orders_by_bytes_and_ranges_are_half_open() {
        let o = KeyKind::Text;
        let key = |s: &str| vec![o.part(&text(s)).unwrap_or(KeyPart::Integer(0))];
        assert!(key("B") < key("a"), "byte order, as COLLATE \"C\"");
        let (b, d) = (key("b"), key("d"));
        assert!(!in_range(&key("b"), Some(&b), Some(&d)));
        assert!(in_range(&key("c"), Some(&b), Some(&d)));
        assert!(in_range(&key("d"), Some(&b), Some(&d)));
        assert!(!in_range(&key("e"), Some(&b), Some(&d)));
        assert!(in_range(&key("zzz"), Some(&b), None));
        assert!(in_range(&key(""), None, Some(&b)));
    }

    #[test]
    fn composite_keys_compare_column_by_column() {
        let a = vec![KeyPart::Integer(1), KeyPart::Integer(9)];
        let b = vec![KeyPart::Integer(2), KeyPart::Integer(0)];
        assert!(a < b);
    }
}
