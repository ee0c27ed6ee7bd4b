//! How a table's columns changed between two of its descriptors: what
//! sinks that follow schema changes need (the postgres sink alters its
//! target, jsonl writes a schema-change line).
//!
//! Columns are matched by attribute number when both descriptors know it
//! (a rename keeps it, a dropped column's is never reused), else by name;
//! so a rename is told from a drop and an add whenever the number was
//! read.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::relation::{Column, Relation};
use crate::types::Oid;

/// A column as far as comparing descriptors goes; small enough to be
/// kept (stored) for every published table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnShape {
    /// Its name.
    pub name: String,
    /// Its attribute number on the publisher (0: unknown).
    pub attnum: i16,
    /// Its type's OID on the publisher.
    pub type_oid: Oid,
    /// Its type modifier.
    pub type_modifier: i32,
    /// Its type as SQL writes it, with the modifier.
    #[serde(default)]
    pub type_display: String,
}

impl ColumnShape {
    /// The shape of `column`.
    pub fn of(column: &Column) -> ColumnShape {
        ColumnShape {
            name: column.name.clone(),
            attnum: column.attnum,
            type_oid: column.type_oid,
            type_modifier: column.type_modifier,
            type_display: column.type_display(),
        }
    }

    /// The shapes of `relation`'s columns.
    pub fn all_of(relation: &Relation) -> Vec<ColumnShape> {
        relation.columns.iter().map(ColumnShape::of).collect()
    }

    fn same_column(&self, column: &Column) -> bool {
        if self.attnum != 0 && column.attnum != 0 {
            self.attnum == column.attnum
        } else {
            self.name == column.name
        }
    }
}

/// `relation` with the attribute numbers the catalog could not give
/// (0) taken from the columns applied before under the same name, when
/// any is missing. The source reads them when a descriptor arrives, and
/// the walsender, decoding behind the publisher, sends descriptors of
/// transactions older than DDL already made: a descriptor naming a column
/// renamed since finds no such name in the catalog.
pub fn carry_attnums(
    previous: Option<&[ColumnShape]>,
    relation: &Relation,
) -> Option<Arc<Relation>> {
    let previous = previous?;
    let known = |c: &Column| {
        previous
            .iter()
            .find(|p| p.name == c.name && p.attnum != 0)
            .map(|p| p.attnum)
    };
    if !relation
        .columns
        .iter()
        .any(|c| c.attnum == 0 && known(c).is_some())
    {
        return None;
    }
    let mut carried = relation.clone();
    for column in &mut carried.columns {
        if column.attnum == 0 {
            column.attnum = known(column).unwrap_or(0);
        }
    }
    Some(Arc::new(carried))
}

/// One difference between a table's columns before and after.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ColumnChange<'a> {
    /// A column that was not there.
    Added(&'a Column),
    /// A column no longer there (dropped, or out of the column list).
    Dropped(&'a ColumnShape),
    /// The same column under another name.
    Renamed {
        /// As it was.
        from: &'a ColumnShape,
        /// As it is.
        to: &'a Column,
    },
    /// The same column with another type (or modifier); it may also be
    /// renamed, which comes first.
    Retyped {
        /// As it was.
        from: &'a ColumnShape,
        /// As it is.
        to: &'a Column,
    },
}

/// What changed from `before` to `after`'s columns: renames first, then
/// type changes, additions and drops, each in column order.
pub fn column_changes<'a>(before: &'a [ColumnShape], after: &'a Relation) -> Vec<ColumnChange<'a>> {
    let mut matched = vec![false; before.len()];
    let mut renames = Vec::new();
    let mut retypes = Vec::new();
    let mut added = Vec::new();
    for column in &after.columns {
        let found = before
            .iter()
            .enumerate()
            .find(|(i, b)| !matched[*i] && b.same_column(column));
        match found {
            Some((i, from)) => {
                matched[i] = true;
                if from.name != column.name {
                    renames.push(ColumnChange::Renamed { from, to: column });
                }
                if from.type_oid != column.type_oid || from.type_modifier != column.type_modifier {
                    retypes.push(ColumnChange::Retyped { from, to: column });
                }
            }
            None => added.push(ColumnChange::Added(column)),
        }
    }
    let dropped = before
        .iter()
        .zip(&matched)
        .filter(|(_, m)| !**m)
        .map(|(b, _)| ColumnChange::Dropped(b));
    renames
        .into_iter()
        .chain(retypes)
        .chain(added)
        .chain(dropped)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relation::ReplicaIdentity;
    use crate::types::ValueKind;

    fn column(name: &str, attnum: i16, type_oid: Oid) -> Column {
        Column {
            name: name.into(),
            type_oid,
            type_modifier: -1,
            type_name: if type_oid == 20 { "int8" } else { "text" }.into(),
            kind: ValueKind::Other,
            is_key: false,
            attnum,
            not_null: false,
            missing_value: None,
        }
    }

    fn relation(columns: Vec<Column>) -> Relation {
        Relation {
            id: 1,
            schema: "s".into(),
            name: "t".into(),
            replica_identity: ReplicaIdentity::Default,
            columns,
            partition_root: None,
            primary_key: Vec::new(),
        }
    }

    #[test]
    fn renames_retypes_adds_and_drops_are_told_apart() {
        let before = ColumnShape::all_of(&relation(vec![
            column("id", 1, 20),
            column("a", 2, 25),
            column("b", 3, 25),
            column("c", 4, 20),
        ]));
        let after = relation(vec![
            column("id", 1, 20),
            column("renamed", 2, 25),
            column("c", 4, 25),
            column("new", 5, 20),
        ]);
        let changes = column_changes(&before, &after);
        assert_eq!(
            changes,
            [
                ColumnChange::Renamed {
                    from: &before[1],
                    to: &after.columns[1]
                },
                ColumnChange::Retyped {
                    from: &before[3],
                    to: &after.columns[2]
                },
                ColumnChange::Added(&after.columns[3]),
                ColumnChange::Dropped(&before[2]),
            ]
        );
        // Without attribute numbers, names decide: a rename is a drop and an add.
        let unnumbered = relation(vec![column("id", 0, 20), column("renamed", 0, 25)]);
        let before = ColumnShape::all_of(&relation(vec![column("id", 0, 20), column("a", 0, 25)]));
        assert_eq!(
            column_changes(&before, &unnumbered),
            [
                ColumnChange::Added(&unnumbered.columns[1]),
                ColumnChange::Dropped(&before[1])
            ]
        );
        assert!(column_changes(&ColumnShape::all_of(&after), &after).is_empty());
    }
}
