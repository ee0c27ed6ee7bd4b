//! The SQL the sink runs for each kind of change, and the values it binds.
//!
//! Statements are prepared once per table mapping and shape and then only
//! executed, with values passed in PostgreSQL's own text (or binary) form
//! exactly as the publisher sent them, so nothing is converted on the way.

use std::error::Error;

use bytes::BytesMut;
use tokio_postgres::types::{Format, IsNull, ToSql, Type, to_sql_checked};
use walbridge_core::Datum;

use crate::mapping::TableMap;

/// Published columns, by position in the relation; `None` means all.
pub type ColumnSet = Option<Box<[u16]>>;

/// How a row is found for an UPDATE or DELETE.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Find {
    /// By the identity columns with `=` (REPLICA IDENTITY DEFAULT/INDEX).
    Key,
    /// By every column of the old row (REPLICA IDENTITY FULL): `=` for
    /// values, `IS NULL` for the `nulls`; columns outside `present` (an
    /// unchanged TOAST value) are not compared. Exactly one row is changed.
    Full {
        /// The columns compared.
        present: ColumnSet,
        /// Among them, those that are NULL in the old row.
        nulls: ColumnSet,
    },
}

/// How inserts treat an existing key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InsertMode {
    /// A conflict is an error.
    Plain,
    /// `ON CONFLICT DO NOTHING` (`on_conflict = "skip"`).
    OrSkip,
    /// `ON CONFLICT (key) DO UPDATE` (`on_conflict = "upsert"`).
    Upsert,
}

/// The `ON CONFLICT` clause of an insert in `mode` into `map` (empty for plain inserts).
pub fn conflict_clause(map: &TableMap, mode: InsertMode) -> String {
    match mode {
        InsertMode::Plain => String::new(),
        InsertMode::OrSkip => " ON CONFLICT DO NOTHING".to_owned(),
        InsertMode::Upsert => {
            let key = map.upsert_key.as_deref().unwrap_or_default();
            let updates: Vec<String> = map
                .columns
                .iter()
                .filter(|c| !key.contains(&c.quoted))
                .map(|c| format!("{0} = EXCLUDED.{0}", c.quoted))
                .collect();
            if updates.is_empty() {
                format!(" ON CONFLICT ({}) DO NOTHING", key.join(", "))
            } else {
                format!(
                    " ON CONFLICT ({}) DO UPDATE SET {}",
                    key.join(", "),
                    updates.join(", ")
                )
            }
        }
    }
}

/// The form of a statement; with the mapping it determines the SQL.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Shape {
    /// `INSERT`, with conflicts treated per the mode.
    Insert(InsertMode),
    /// `UPDATE` of the `set` columns (those not left out as unchanged TOAST).
    Update {
        /// The columns written.
        set: ColumnSet,
        /// How the row is found.
        find: Find,
    },
    /// `DELETE`.
    Delete {
        /// How the row is found.
        find: Find,
    },
}

fn columns<'a>(map: &'a TableMap, set: &'a ColumnSet) -> Box<dyn Iterator<Item = usize> + 'a> {
    match set {
        None => Box::new(0..map.columns.len()),
        Some(list) => Box::new(list.iter().map(|&i| usize::from(i))),
    }
}

fn contains(set: &ColumnSet, i: usize) -> bool {
    set.as_ref()
        .is_some_and(|s| s.iter().any(|&c| usize::from(c) == i))
}

/// Builds SQL with numbered parameters.
struct Sql {
    text: String,
    next_param: usize,
}

impl Sql {
    fn param(&mut self) -> String {
        self.next_param += 1;
        format!("${}", self.next_param)
    }
}

/// The `WHERE` conditions that find the row, with parameters numbered on
/// from `sql`; `prefix` qualifies column names.
fn conditions(map: &TableMap, find: &Find, sql: &mut Sql) -> Vec<String> {
    let mut out = Vec::new();
    match find {
        Find::Key => {
            for &i in &map.identity {
                let p = sql.param();
                out.push(format!("{} = {p}", map.columns[i].quoted));
            }
        }
        Find::Full { present, nulls } => {
            for i in columns(map, present) {
                let column = &map.columns[i];
                if contains(nulls, i) {
                    out.push(format!("{} IS NULL", column.quoted));
                } else {
                    let p = sql.param();
                    if column.comparable {
                        out.push(format!("{} = {p}", column.quoted));
                    } else {
                        // No equality operator (json, point, xml…): compare text forms.
                        out.push(format!("{}::text = {p}::text", column.quoted));
                    }
                }
            }
        }
    }
    if let Some((column, value)) = &map.source_tag {
        out.push(format!("{column} = {value}"));
    }
    if out.is_empty() {
        // No identity to compare (cannot happen for changes pgoutput sends).
        out.push("false".into());
    }
    out
}

/// The SQL text of `shape` on `map`. Parameters come in the order
/// [`bind_order`] gives.
pub fn sql(map: &TableMap, shape: &Shape) -> String {
    let table = map.quoted();
    let mut sql = Sql {
        text: String::new(),
        next_param: 0,
    };
    match shape {
        Shape::Insert(mode) => {
            let mut names: Vec<&str> = map.columns.iter().map(|c| c.quoted.as_str()).collect();
            let mut values: Vec<String> = map.columns.iter().map(|_| sql.param()).collect();
            if let Some((column, value)) = &map.source_tag {
                names.push(column);
                values.push(value.clone());
            }
            sql.text = format!(
                "INSERT INTO {table} ({}){} VALUES ({}){}",
                names.join(", "),
                map.target.overriding(),
                values.join(", "),
                conflict_clause(map, *mode)
            );
        }
        Shape::Update { set, find } => {
            let assignments: Vec<String> = columns(map, set)
                .map(|i| format!("{} = {}", map.columns[i].quoted, sql.param()))
                .collect();
            let conditions = conditions(map, find, &mut sql).join(" AND ");
            sql.text = match find {
                Find::Key => format!(
                    "UPDATE {table} SET {} WHERE {conditions}",
                    assignments.join(", ")
                ),
                // One row among equal ones: pick it by its physical address.
                Find::Full { .. } => format!(
                    "WITH r AS (SELECT tableoid AS o, ctid AS c FROM {table} WHERE {conditions} LIMIT 1) \
                     UPDATE {table} AS t SET {} FROM r WHERE t.tableoid = r.o AND t.ctid = r.c",
                    assignments.join(", ")
                ),
            };
        }
        Shape::Delete { find } => {
            let conditions = conditions(map, find, &mut sql).join(" AND ");
            sql.text = match find {
                Find::Key => format!("DELETE FROM {table} WHERE {conditions}"),
                Find::Full { .. } => format!(
                    "WITH r AS (SELECT tableoid AS o, ctid AS c FROM {table} WHERE {conditions} LIMIT 1) \
                     DELETE FROM {table} AS t USING r WHERE t.tableoid = r.o AND t.ctid = r.c"
                ),
            };
        }
    }
    sql.text
}

/// Which values a statement binds, in parameter order: `(from_old, column)`.
pub fn bind_order(map: &TableMap, shape: &Shape) -> Vec<(bool, usize)> {
    let mut order = Vec::new();
    let find_values = |find: &Find, order: &mut Vec<(bool, usize)>| match find {
        Find::Key => order.extend(map.identity.iter().map(|&i| (true, i))),
        Find::Full { present, nulls } => order.extend(
            columns(map, present)
                .filter(|&i| !contains(nulls, i))
                .map(|i| (true, i)),
        ),
    };
    match shape {
        Shape::Insert(_) => order.extend((0..map.columns.len()).map(|i| (false, i))),
        Shape::Update { set, find } => {
            order.extend(columns(map, set).map(|i| (false, i)));
            find_values(find, &mut order);
        }
        Shape::Delete { find } => find_values(find, &mut order),
    }
    order
}

/// A column value bound to a statement, in the form the publisher sent it.
#[derive(Clone, Debug)]
pub struct Param(pub Datum);

impl ToSql for Param {
    fn to_sql(
        &self,
        _ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        match &self.0 {
            Datum::Null => Ok(IsNull::Yes),
            Datum::Text(b) | Datum::Binary(b) => {
                out.extend_from_slice(b);
                Ok(IsNull::No)
            }
            Datum::UnchangedToast => Err("an unchanged TOAST value has no data to write".into()),
        }
    }

    fn accepts(_ty: &Type) -> bool {
        true
    }

    fn encode_format(&self, _ty: &Type) -> Format {
        match self.0 {
            Datum::Binary(_) => Format::Binary,
            _ => Format::Text,
        }
    }

    to_sql_checked!();
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::mapping::MappedColumn;
    use crate::target::TargetTable;

    /// A mapping of `s.t (id int, doc, n)` with the given identity, FULL
    /// or not, and a `source_column` `src` = 'shop' when `tag`.
    pub(crate) fn map(identity: Vec<usize>, full: bool, tag: bool) -> TableMap {
        let column = |name: &str, comparable| MappedColumn {
            quoted: format!("\"{name}\""),
            target_type: "integer".into(),
            cast_type: "integer".into(),
            source_type: "int4".into(),
            comparable,
            binary: crate::mapping::BinaryForm::AsIs,
            integer: true,
            // `doc` stands for a type that is not built in: bound as text.
            batch_array: (name != "doc").then_some(Type::INT4_ARRAY),
        };
        TableMap {
            id: 1,
            source_table: "public.t".into(),
            target: Arc::new(TargetTable {
                oid: 1,
                schema: "s".into(),
                name: "t".into(),
                partitioned: false,
                columns: Vec::new(),
                unique_keys: vec![vec!["id".into()]],
                has_primary_key: true,
                has_apply_triggers: false,
                has_always_identity: false,
            }),
            columns: vec![column("id", true), column("doc", false), column("n", true)],
            identity,
            full_identity: full,
            source_tag: tag.then(|| ("\"src\"".into(), "'shop'".into())),
            upsert_key: Some(vec!["\"id\"".into()]),
            routed_partition: false,
        }
    }

    #[test]
    fn inserts_and_upserts() {
        let m = map(vec![0], false, true);
        assert_eq!(
            sql(&m, &Shape::Insert(InsertMode::Plain)),
            "INSERT INTO \"s\".\"t\" (\"id\", \"doc\", \"n\", \"src\") VALUES ($1, $2, $3, 'shop')"
        );
        assert!(sql(&m, &Shape::Insert(InsertMode::OrSkip)).ends_with("ON CONFLICT DO NOTHING"));
        assert!(sql(&m, &Shape::Insert(InsertMode::Upsert)).ends_with(
            "ON CONFLICT (\"id\") DO UPDATE SET \"doc\" = EXCLUDED.\"doc\", \"n\" = EXCLUDED.\"n\""
        ));
        assert_eq!(
            bind_order(&m, &Shape::Insert(InsertMode::Plain)),
            [(false, 0), (false, 1), (false, 2)]
        );
    }

    #[test]
    fn updates_by_key_leave_unchanged_columns_out() {
        let m = map(vec![0], false, false);
        let shape = Shape::Update {
            set: Some(vec![0, 2].into_boxed_slice()),
            find: Find::Key,
        };
        assert_eq!(
            sql(&m, &shape),
            "UPDATE \"s\".\"t\" SET \"id\" = $1, \"n\" = $2 WHERE \"id\" = $3"
        );
        assert_eq!(bind_order(&m, &shape), [(false, 0), (false, 2), (true, 0)]);
    }

    #[test]
    fn full_identity_changes_exactly_one_row() {
        let m = map(vec![0, 1, 2], true, true);
        let shape = Shape::Delete {
            find: Find::Full {
                present: None,
                nulls: Some(vec![2].into_boxed_slice()),
            },
        };
        assert_eq!(
            sql(&m, &shape),
            "WITH r AS (SELECT tableoid AS o, ctid AS c FROM \"s\".\"t\" WHERE \"id\" = $1 AND \"doc\"::text = $2::text AND \"n\" IS NULL AND \"src\" = 'shop' LIMIT 1) \
             DELETE FROM \"s\".\"t\" AS t USING r WHERE t.tableoid = r.o AND t.ctid = r.c"
        );
        assert_eq!(bind_order(&m, &shape), [(true, 0), (true, 1)]);
    }
}
