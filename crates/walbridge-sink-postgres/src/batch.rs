//! Set-based apply: consecutive changes of one table, in one group, as one
//! statement over arrays.
//!
//! A native subscriber pays the executor's per-statement costs for every
//! row; so does a client sending one statement per change, plus a round of
//! protocol messages and a wake-up on both sides. Within a target
//! transaction the order of changes to *different* tables cannot be
//! observed — foreign keys are not checked while applying
//! (`session_replication_role = replica`) and tables whose triggers fire
//! while applying are never batched — so the sink keeps, per target table,
//! the sequence of that table's changes as batches of one kind (inserts,
//! updates of the same columns, deletes) with distinct keys, and runs each
//! batch as one statement that joins the table with `unnest` of one array
//! per column:
//!
//! ```sql
//! UPDATE t AS x SET v = u.p1::text FROM unnest($1::text[], $2::integer[]) AS u(p1, p2)
//!  WHERE x.id = u.p2::integer
//! ```
//!
//! A key that comes again starts a new batch, except that an update of the
//! same columns replaces the earlier one in its batch: the row ends up
//! exactly as applying both would leave it. The final state of every
//! table at COMMIT is the one applying the changes one by one gives.
//! Values travel as text: in arrays of the column's type where that is a
//! built-in (the server parses each element with the type's own input
//! function), else in `text[]`; either way as the column's type without its
//! modifier, so assignment still checks `varchar(n)` and the like.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use foldhash::fast::RandomState;
use tokio_postgres::types::Type;
use walbridge_core::{Datum, Oid, Row, TransactionInfo};

use crate::mapping::TableMap;
use crate::statement::{ColumnSet, InsertMode, conflict_clause};

/// Rows a batch takes before it is sent.
pub const MAX_BATCH_ROWS: usize = 5000;

/// Bytes of values a batch takes before it is sent.
pub const MAX_BATCH_BYTES: usize = 4 << 20;

/// What a batch does; with the mapping it determines the SQL.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum BatchKind {
    /// Inserts of whole rows.
    Insert(InsertMode),
    /// Updates, by key, of the `set` columns (key columns left alone).
    Update {
        /// The columns written (`None`: every non-key column).
        set: ColumnSet,
    },
    /// Deletes by key.
    Delete,
}

/// The published columns a batch binds, one array each, in parameter order:
/// an insert's every column; an update's written columns other than the
/// key, then the key; a delete's key.
pub fn bound_columns<'a>(
    map: &'a TableMap,
    kind: &'a BatchKind,
) -> impl Iterator<Item = usize> + 'a {
    let every = 0..map.columns.len();
    let (range, listed, key): (_, &[u16], &[usize]) = match kind {
        BatchKind::Insert(_) => (every, &[], &[]),
        BatchKind::Update { set: None } => (every, &[], &map.identity),
        BatchKind::Update { set: Some(list) } => (0..0, list, &map.identity),
        BatchKind::Delete => (0..0, &[], &map.identity),
    };
    let skip_key = !matches!(kind, BatchKind::Insert(_));
    range
        .chain(listed.iter().map(|&i| usize::from(i)))
        .filter(move |i| !skip_key || !map.identity.contains(i))
        .chain(key.iter().copied())
}

/// The values of `row` a batch of `kind` binds, in [`bound_columns`]
/// order, taken out of it (missing ones NULL).
pub fn bound_values(map: &TableMap, kind: &BatchKind, mut row: Row) -> Vec<Datum> {
    row.resize(map.columns.len(), Datum::Null);
    match (kind, map.identity.as_slice()) {
        // Every column in order: the row as it is.
        (BatchKind::Insert(_), _) => row,
        // One key column (most tables): its place in the row's own vector,
        // without a new one — an update's other columns in order and the key
        // at the end, a delete's key alone.
        (BatchKind::Update { set: None }, &[key]) if key < row.len() => {
            row[key..].rotate_left(1);
            row
        }
        (BatchKind::Delete, &[key]) if key < row.len() => {
            row.swap(0, key);
            row.truncate(1);
            row
        }
        _ => bound_columns(map, kind)
            .map(|i| {
                row.get_mut(i)
                    .map_or(Datum::Null, |d| std::mem::replace(d, Datum::Null))
            })
            .collect(),
    }
}

/// The type of each parameter of the statement of `kind` on `map`: the
/// column's built-in array type where it has one, else `text[]`.
pub fn param_types(map: &TableMap, kind: &BatchKind) -> Vec<Type> {
    bound_columns(map, kind)
        .map(|i| {
            map.columns
                .get(i)
                .and_then(|c| c.batch_array.clone())
                .unwrap_or(Type::TEXT_ARRAY)
        })
        .collect()
}

/// The statement of `kind` on `map`: one array parameter per bound column
/// (see [`param_types`]), its elements cast to the column's type.
pub fn batch_sql(map: &TableMap, kind: &BatchKind) -> String {
    let table = map.quoted();
    let bound: Vec<usize> = bound_columns(map, kind).collect();
    let params: Vec<String> = bound
        .iter()
        .enumerate()
        .map(|(p, &i)| {
            let column = &map.columns[i];
            match column.batch_array {
                Some(_) => format!("${}::{}[]", p + 1, column.cast_type),
                None => format!("${}::text[]", p + 1),
            }
        })
        .collect();
    let names: Vec<String> = (1..=bound.len()).map(|i| format!("p{i}")).collect();
    let from = format!("unnest({}) AS u({})", params.join(", "), names.join(", "));
    let value = |position: usize| {
        let column = &map.columns[bound[position]];
        format!("u.p{}::{}", position + 1, column.cast_type)
    };
    let key_conditions = |first_key: usize| {
        let mut conditions: Vec<String> = map
            .identity
            .iter()
            .enumerate()
            .map(|(k, &i)| format!("x.{} = {}", map.columns[i].quoted, value(first_key + k)))
            .collect();
        if let Some((column, source)) = &map.source_tag {
            conditions.push(format!("x.{column} = {source}"));
        }
        conditions.join(" AND ")
    };
    match kind {
        BatchKind::Insert(mode) => {
            let mut names: Vec<&str> = map.columns.iter().map(|c| c.quoted.as_str()).collect();
            let mut values: Vec<String> = (0..bound.len()).map(value).collect();
            if let Some((column, source)) = &map.source_tag {
                names.push(column);
                values.push(source.clone());
            }
            format!(
                "INSERT INTO {table} ({}){} SELECT {} FROM {from}{}",
                names.join(", "),
                map.target.overriding(),
                values.join(", "),
                conflict_clause(map, *mode)
            )
        }
        BatchKind::Update { .. } => {
            let written = bound.len() - map.identity.len();
            let assignments: Vec<String> = (0..written)
                .map(|p| format!("{} = {}", map.columns[bound[p]].quoted, value(p)))
                .collect();
            format!(
                "UPDATE {table} AS x SET {} FROM {from} WHERE {}",
                assignments.join(", "),
                key_conditions(written)
            )
        }
        BatchKind::Delete => format!(
            "DELETE FROM {table} AS x USING {from} WHERE {}",
            key_conditions(0)
        ),
    }
}

/// One batch: rows of one kind for one table, with distinct keys.
pub struct Batch {
    /// The mapping its rows were described with.
    pub map: Arc<TableMap>,
    /// What it does.
    pub kind: BatchKind,
    /// Per row, the bound values in [`bound_columns`] order.
    rows: Vec<Vec<Datum>>,
    /// Row index by the hash of its key ([`key`]), for repeated keys; a
    /// row whose key's hash another key has starts a new batch, so each
    /// row here has a hash of its own.
    keys: HashMap<u64, usize, RandomState>,
    bytes: usize,
    /// The last source transaction with a row in it.
    pub last_txn: Arc<TransactionInfo>,
}

impl Batch {
    /// Rows in the batch.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// True without rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Bytes of its values.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The statement's parameters: one text array literal per bound
    /// column, rows in [`Batch::send_order`].
    pub fn arrays(&self) -> Vec<Datum> {
        let width = self.rows.first().map_or(0, Vec::len);
        let mut arrays: Vec<BytesMut> = (0..width)
            .map(|_| BytesMut::with_capacity(self.bytes / width.max(1) + 3 * self.rows.len() + 2))
            .collect();
        for array in &mut arrays {
            array.put_u8(b'{');
        }
        for (r, &index) in self.send_order().iter().enumerate() {
            let Some(row) = self.rows.get(index) else {
                continue;
            };
            for (array, datum) in arrays.iter_mut().zip(row) {
                if r > 0 {
                    array.put_u8(b',');
                }
                push_element(array, datum);
            }
        }
        arrays
            .into_iter()
            .map(|mut a| {
                a.put_u8(b'}');
                Datum::Text(a.freeze())
            })
            .collect()
    }

    /// The order rows are sent in. Updates and deletes go in key order, so
    /// that the target walks its identity index and heap pages in order
    /// rather than at random (fewer cache misses; their keys are distinct
    /// in a batch, so the order cannot change the result). Inserts keep the
    /// source's order: it decides what target-only defaults such as
    /// sequences give each row.
    pub fn send_order(&self) -> Vec<usize> {
        if matches!(self.kind, BatchKind::Insert(_)) || self.keys.len() != self.rows.len() {
            return (0..self.rows.len()).collect();
        }
        let integer: Vec<bool> = self
            .map
            .identity
            .iter()
            .map(|&i| self.map.columns.get(i).is_some_and(|c| c.integer))
            .collect();
        // Every key's parts in one vector (a vector per key was an
        // allocation per row); each row sorts by its range of it.
        let mut parts = Vec::with_capacity(self.rows.len() * integer.len());
        let mut keyed: Vec<(std::ops::Range<usize>, usize)> = Vec::with_capacity(self.rows.len());
        for (row, values) in self.rows.iter().enumerate() {
            let start = parts.len();
            parts.extend(
                key(&self.map, &self.kind, values)
                    .zip(&integer)
                    .map(|(value, &integer)| KeyPart::of(value, integer)),
            );
            keyed.push((start..parts.len(), row));
        }
        keyed.sort_unstable_by(|(a, row_a), (b, row_b)| {
            parts[a.clone()]
                .cmp(&parts[b.clone()])
                .then(row_a.cmp(row_b))
        });
        keyed.into_iter().map(|(_, row)| row).collect()
    }
}

/// One key value where the target's index would put it, as near as the
/// client can tell: integers as numbers, anything else by its bytes (the
/// order of UUIDs and of ISO dates and times; text under the C collation).
#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum KeyPart {
    Integer(i64),
    Bytes(Bytes),
}

impl KeyPart {
    fn of(value: Option<&Datum>, integer: bool) -> KeyPart {
        let bytes = match value {
            Some(Datum::Text(b) | Datum::Binary(b)) => b,
            _ => return KeyPart::Bytes(Bytes::new()),
        };
        integer
            .then(|| std::str::from_utf8(bytes).ok()?.parse().ok())
            .flatten()
            .map_or_else(|| KeyPart::Bytes(bytes.clone()), KeyPart::Integer)
    }
}

/// The key of a row of a batch of `kind` among its bound `values`: an
/// insert's identity columns (it binds every column), the identity
/// values bound last by an update or a delete ([`bound_columns`]).
fn key<'a>(
    map: &'a TableMap,
    kind: &BatchKind,
    values: &'a [Datum],
) -> impl Iterator<Item = Option<&'a Datum>> + 'a {
    let (columns, last): (&[usize], usize) = match kind {
        BatchKind::Insert(_) => (&map.identity, 0),
        BatchKind::Update { .. } | BatchKind::Delete => (&[], map.identity.len()),
    };
    columns
        .iter()
        .map(|&i| values.get(i))
        .chain(values[values.len().saturating_sub(last)..].iter().map(Some))
}

/// Appends one array element: `NULL`, or the text double-quoted with `"`
/// and `\` escaped.
fn push_element(out: &mut BytesMut, datum: &Datum) {
    let Datum::Text(text) = datum else {
        out.put_slice(b"NULL");
        return;
    };
    out.put_u8(b'"');
    let mut start = 0;
    // memchr's vector search: most values hold neither byte, and a long
    // one (a row's text) was scanned byte by byte.
    for i in memchr::memchr2_iter(b'"', b'\\', text) {
        out.put_slice(&text[start..i]);
        out.put_u8(b'\\');
        start = i;
    }
    out.put_slice(&text[start..]);
    out.put_u8(b'"');
}

/// One target table's batches, in order.
struct TableQueue {
    batches: Vec<Batch>,
}

/// The batches of the group being built, per target table; `S` hashes
/// rows' keys.
#[derive(Default)]
pub struct Batcher<S = RandomState> {
    tables: Vec<TableQueue>,
    by_table: HashMap<Oid, usize, RandomState>,
    keys: S,
}

/// A row for [`Batcher::add`].
pub struct BatchRow {
    /// Rows of its kind must have distinct keys ([`key`]: identity values,
    /// all of them text).
    pub keyed: bool,
    /// The bound values, in [`bound_columns`] order (text only).
    pub values: Vec<Datum>,
    /// Its source transaction.
    pub txn: Arc<TransactionInfo>,
}

impl<S: BuildHasher> Batcher<S> {
    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.tables.iter().all(|t| t.batches.is_empty())
    }

    /// Adds a row to its table's batches. `replace` allows an update to
    /// overwrite an earlier update of the same key in the current batch.
    /// Returns the table's batches when they should be sent now (the
    /// current one is full).
    pub fn add(
        &mut self,
        map: &Arc<TableMap>,
        kind: BatchKind,
        row: BatchRow,
        replace: bool,
    ) -> Option<Vec<Batch>> {
        let table = map.target.oid;
        let index = *self.by_table.entry(table).or_insert_with(|| {
            self.tables.push(TableQueue {
                batches: Vec::new(),
            });
            self.tables.len() - 1
        });
        let queue = &mut self.tables[index];
        let bytes: usize = row.values.iter().map(|d| d.len() + 4).sum();
        let hash = row.keyed.then(|| {
            let mut hasher = self.keys.build_hasher();
            key(map, &kind, &row.values).for_each(|part| part.hash(&mut hasher));
            hasher.finish()
        });
        let current = queue
            .batches
            .last_mut()
            .filter(|b| Arc::ptr_eq(&b.map, map) && b.kind == kind);
        let fits = match (current, hash) {
            (Some(batch), Some(hash)) => match batch.keys.get(&hash) {
                Some(&at)
                    if replace
                        && key(map, &kind, &batch.rows[at]).eq(key(map, &kind, &row.values)) =>
                {
                    batch.bytes += bytes;
                    batch.rows[at] = row.values;
                    batch.last_txn = row.txn;
                    return None;
                }
                Some(_) => None,
                None => Some(batch),
            },
            (current, _) => current,
        };
        let batch = match fits {
            Some(batch) => batch,
            None => {
                queue.batches.push(Batch {
                    map: map.clone(),
                    kind,
                    rows: Vec::new(),
                    keys: HashMap::default(),
                    bytes: 0,
                    last_txn: row.txn.clone(),
                });
                queue.batches.last_mut()?
            }
        };
        if let Some(hash) = hash {
            batch.keys.insert(hash, batch.rows.len());
        }
        batch.rows.push(row.values);
        batch.bytes += bytes;
        batch.last_txn = row.txn;
        let full = batch.rows.len() >= MAX_BATCH_ROWS || batch.bytes >= MAX_BATCH_BYTES;
        full.then(|| std::mem::take(&mut self.tables[index].batches))
    }

    /// Every batch waiting, table by table, each table's in order.
    pub fn take_all(&mut self) -> Vec<Batch> {
        self.by_table.clear();
        self.tables.drain(..).flat_map(|t| t.batches).collect()
    }
}

#[cfg(test)]
mod tests {
    use walbridge_core::{Lsn, PgTimestamp};

    use super::*;
    use crate::statement::tests::map;

    fn text(s: &str) -> Datum {
        Datum::Text(Bytes::copy_from_slice(s.as_bytes()))
    }

    fn txn(xid: u32) -> Arc<TransactionInfo> {
        Arc::new(TransactionInfo {
            xid,
            commit_lsn: Lsn(u64::from(xid)),
            end_lsn: Lsn(u64::from(xid) + 1),
            commit_time: PgTimestamp(0),
            origin: None,
            gid: None,
            for_sink: None,
        })
    }

    fn row(values: &[Datum], xid: u32) -> BatchRow {
        BatchRow {
            keyed: true,
            values: values.to_vec(),
            txn: txn(xid),
        }
    }

    #[test]
    fn array_elements_are_quoted_and_escaped() {
        let mut out = BytesMut::new();
        push_element(&mut out, &text("a\"b\\c,{d}"));
        out.put_u8(b',');
        push_element(&mut out, &Datum::Null);
        out.put_u8(b',');
        push_element(&mut out, &text("NULL"));
        assert_eq!(&out[..], b"\"a\\\"b\\\\c,{d}\",NULL,\"NULL\"");
        // Escapes first, last and side by side; nothing to escape at all.
        for (value, element) in [
            ("\"\\", "\"\\\"\\\\\""),
            ("x\"\"", "\"x\\\"\\\"\""),
            ("", "\"\""),
            ("plain text", "\"plain text\""),
        ] {
            let mut out = BytesMut::new();
            push_element(&mut out, &text(value));
            assert_eq!(std::str::from_utf8(&out), Ok(element), "{value}");
        }
    }

    #[test]
    fn bound_values_are_taken_from_the_row_in_bound_order() {
        let m = map(vec![0], false, true);
        let row = || vec![text("k"), text("a"), text("b")];
        // An insert binds the row as it is; a short one is padded with NULL.
        let insert = BatchKind::Insert(InsertMode::Plain);
        assert_eq!(bound_values(&m, &insert, row()), row());
        assert_eq!(
            bound_values(&m, &insert, vec![text("k")]),
            [text("k"), Datum::Null, Datum::Null]
        );
        // An update: the written columns other than the key, then the key.
        let update = BatchKind::Update { set: None };
        assert_eq!(
            bound_values(&m, &update, row()),
            [text("a"), text("b"), text("k")]
        );
        let update = BatchKind::Update {
            set: Some(vec![2, 0].into()),
        };
        assert_eq!(bound_values(&m, &update, row()), [text("b"), text("k")]);
        assert_eq!(bound_values(&m, &BatchKind::Delete, row()), [text("k")]);
    }

    /// A one-column key is moved within the row's own vector: the values
    /// are those [`bound_columns`] names, wherever the key is, for short
    /// rows too, and the same as a key of two columns takes them.
    #[test]
    fn bound_values_in_place_are_the_bound_columns_values() {
        let full = [text("x"), text("y"), text("z")];
        for identity in [vec![0], vec![1], vec![2], vec![2, 0]] {
            let m = map(identity.clone(), false, true);
            for kind in [BatchKind::Update { set: None }, BatchKind::Delete] {
                for len in [3, 2, 1] {
                    let row: Row = full[..len].to_vec();
                    let expected: Vec<Datum> = bound_columns(&m, &kind)
                        .map(|i| row.get(i).cloned().unwrap_or(Datum::Null))
                        .collect();
                    assert_eq!(
                        bound_values(&m, &kind, row),
                        expected,
                        "{kind:?}, key {identity:?}, {len} values"
                    );
                }
            }
        }
    }

    #[test]
    fn updates_join_unnest_on_the_key_and_cast_without_modifiers() {
        let m = map(vec![0], false, true);
        let kind = BatchKind::Update { set: None };
        assert_eq!(bound_columns(&m, &kind).collect::<Vec<_>>(), [1, 2, 0]);
        assert_eq!(
            batch_sql(&m, &kind),
            "UPDATE \"s\".\"t\" AS x SET \"doc\" = u.p1::integer, \"n\" = u.p2::integer \
             FROM unnest($1::text[], $2::integer[], $3::integer[]) AS u(p1, p2, p3) \
             WHERE x.\"id\" = u.p3::integer AND x.\"src\" = 'shop'"
        );
        assert_eq!(
            param_types(&m, &kind),
            [Type::TEXT_ARRAY, Type::INT4_ARRAY, Type::INT4_ARRAY]
        );
        assert_eq!(
            batch_sql(&m, &BatchKind::Delete),
            "DELETE FROM \"s\".\"t\" AS x USING unnest($1::integer[]) AS u(p1) WHERE x.\"id\" = u.p1::integer AND x.\"src\" = 'shop'"
        );
    }

    #[test]
    fn a_repeated_key_replaces_an_update_but_starts_a_new_insert_batch() {
        let m = Arc::new(map(vec![0], false, false));
        let update = BatchKind::Update { set: None };
        let insert = BatchKind::Insert(InsertMode::Plain);
        let mut batcher: Batcher = Batcher::default();
        // (kind, values with the key, xid, replace): none fills a batch.
        let rows = [
            (&update, vec![text("a"), text("1")], 1, true),
            (&update, vec![text("b"), text("2")], 2, true),
            (&update, vec![text("c"), text("1")], 3, true),
            (&insert, vec![text("9")], 4, false),
            (&insert, vec![text("9")], 5, false),
        ];
        for (kind, values, xid, replace) in rows {
            let full = batcher.add(&m, kind.clone(), row(&values, xid), replace);
            assert!(full.is_none(), "row {xid} filled a batch");
        }
        let batches = batcher.take_all();
        assert!(batcher.is_empty());
        let shapes: Vec<(BatchKind, usize, u32)> = batches
            .iter()
            .map(|b| (b.kind.clone(), b.len(), b.last_txn.xid))
            .collect();
        assert_eq!(
            shapes,
            [
                (BatchKind::Update { set: None }, 2, 3),
                (BatchKind::Insert(InsertMode::Plain), 1, 4),
                (BatchKind::Insert(InsertMode::Plain), 1, 5),
            ]
        );
        // The later update of key 1 replaced the earlier one in place.
        assert_eq!(
            batches[0].arrays(),
            [
                Datum::Text(Bytes::from_static(b"{\"c\",\"b\"}")),
                Datum::Text(Bytes::from_static(b"{\"1\",\"2\"}"))
            ]
        );
    }

    /// Hashes everything alike: every key's hash is every other's.
    #[derive(Default)]
    struct Alike;

    impl Hasher for Alike {
        fn finish(&self) -> u64 {
            7
        }
        fn write(&mut self, _: &[u8]) {}
    }

    /// A key whose hash another key has is not taken for it: the row
    /// starts a new batch, and the update of the same key later still
    /// comes after both.
    #[test]
    fn a_key_whose_hash_is_taken_starts_a_new_batch_and_replaces_nothing() {
        let m = Arc::new(map(vec![0], false, false));
        let update = BatchKind::Update { set: None };
        let mut batcher: Batcher<std::hash::BuildHasherDefault<Alike>> = Batcher::default();
        for (values, xid) in [
            (vec![text("a"), text("1")], 1),
            (vec![text("b"), text("2")], 2),
            (vec![text("c"), text("1")], 3),
        ] {
            assert!(
                batcher
                    .add(&m, update.clone(), row(&values, xid), true)
                    .is_none()
            );
        }
        let arrays: Vec<Vec<Datum>> = batcher.take_all().iter().map(Batch::arrays).collect();
        let one = |v: &'static [u8], k: &'static [u8]| {
            vec![
                Datum::Text(Bytes::from_static(v)),
                Datum::Text(Bytes::from_static(k)),
            ]
        };
        assert_eq!(
            arrays,
            [
                one(b"{\"a\"}", b"{\"1\"}"),
                one(b"{\"b\"}", b"{\"2\"}"),
                one(b"{\"c\"}", b"{\"1\"}"),
            ]
        );
    }

    #[test]
    fn updates_and_deletes_go_in_key_order_inserts_in_source_order() {
        let m = Arc::new(map(vec![0], false, false));
        let mut batcher: Batcher = Batcher::default();
        let kinds = [
            BatchKind::Update { set: None },
            BatchKind::Delete,
            BatchKind::Insert(InsertMode::Plain),
        ];
        for kind in &kinds {
            for key in ["10", "9", "-3", "200"] {
                let values = vec![text(key)];
                assert!(
                    batcher
                        .add(&m, kind.clone(), row(&values, 1), false)
                        .is_none()
                );
            }
        }
        let arrays: Vec<Vec<Datum>> = batcher.take_all().iter().map(Batch::arrays).collect();
        let sorted = Datum::Text(Bytes::from_static(b"{\"-3\",\"9\",\"10\",\"200\"}"));
        let as_sent = Datum::Text(Bytes::from_static(b"{\"10\",\"9\",\"-3\",\"200\"}"));
        assert_eq!(arrays, [vec![sorted.clone()], vec![sorted], vec![as_sent]]);
    }

    #[test]
    fn keys_of_several_columns_go_in_order_of_their_first_then_next_column() {
        let m = Arc::new(map(vec![0, 2], false, false));
        let mut batcher: Batcher = Batcher::default();
        for (id, n) in [("2", "20"), ("10", "1"), ("2", "3"), ("-1", "99")] {
            let row = row(&[text(id), text(n)], 1);
            assert!(batcher.add(&m, BatchKind::Delete, row, false).is_none());
        }
        let arrays: Vec<Vec<Datum>> = batcher.take_all().iter().map(Batch::arrays).collect();
        let ids = Datum::Text(Bytes::from_static(b"{\"-1\",\"2\",\"2\",\"10\"}"));
        let ns = Datum::Text(Bytes::from_static(b"{\"99\",\"3\",\"20\",\"1\"}"));
        assert_eq!(arrays, [vec![ids, ns]]);
    }

    #[test]
    fn a_full_batch_is_handed_back_with_the_tables_earlier_batches() {
        let m = Arc::new(map(vec![0], false, false));
        let mut batcher: Batcher = Batcher::default();
        let delete = BatchKind::Delete;
        assert!(
            batcher
                .add(&m, delete, row(&[text("0")], 1), false)
                .is_none()
        );
        let insert = BatchKind::Insert(InsertMode::Plain);
        let mut handed = None;
        for i in 0..MAX_BATCH_ROWS {
            let key = i.to_string();
            handed = batcher.add(&m, insert.clone(), row(&[text(&key)], 2), false);
            if handed.is_some() {
                break;
            }
        }
        let handed = handed.unwrap_or_default();
        assert_eq!(
            handed.len(),
            2,
            "the delete first, then the full insert batch"
        );
        assert_eq!(handed[0].kind, BatchKind::Delete);
        assert_eq!(handed[1].len(), MAX_BATCH_ROWS);
        assert!(batcher.is_empty());
    }
}
