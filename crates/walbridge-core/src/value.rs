use bytes::Bytes;

/// One column value exactly as PostgreSQL sent it.
///
/// The bytes are shared slices of the received message; cloning a datum
/// does not copy column data.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Datum {
    /// SQL NULL.
    Null,
    /// A TOASTed value that the change did not touch and the publisher did
    /// not send: the subscriber keeps its current value.
    UnchangedToast,
    /// The type's text output form (UTF-8 in a UTF-8 database).
    Text(Bytes),
    /// The type's binary (`typsend`) form.
    Binary(Bytes),
}

impl Datum {
    /// The number of data bytes carried.
    pub fn len(&self) -> usize {
        match self {
            Datum::Null | Datum::UnchangedToast => 0,
            Datum::Text(b) | Datum::Binary(b) => b.len(),
        }
    }

    /// True when no data bytes are carried.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The values of one row, in the order of the relation's columns.
pub type Row = Vec<Datum>;
