use crate::types::{Oid, ValueKind};

/// A relation's OID on the publisher (the `relid` of pgoutput messages).
pub type RelationId = u32;

/// How a published table identifies the old row of an UPDATE or DELETE
/// (`pg_class.relreplident`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReplicaIdentity {
    /// The primary key (`d`).
    Default,
    /// No identity (`n`): UPDATE and DELETE cannot be replicated.
    Nothing,
    /// The whole row (`f`).
    Full,
    /// The columns of a chosen unique index (`i`).
    Index,
}

impl ReplicaIdentity {
    /// The identity for a `relreplident` character.
    pub fn from_byte(c: u8) -> Option<Self> {
        Some(match c {
            b'd' => ReplicaIdentity::Default,
            b'n' => ReplicaIdentity::Nothing,
            b'f' => ReplicaIdentity::Full,
            b'i' => ReplicaIdentity::Index,
            _ => return None,
        })
    }

    /// The `relreplident` character.
    pub fn as_byte(self) -> u8 {
        match self {
            ReplicaIdentity::Default => b'd',
            ReplicaIdentity::Nothing => b'n',
            ReplicaIdentity::Full => b'f',
            ReplicaIdentity::Index => b'i',
        }
    }
}

/// One published column.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    /// Column name.
    pub name: String,
    /// OID of the column's type on the publisher.
    pub type_oid: Oid,
    /// `atttypmod` (-1 when the type has no modifier).
    pub type_modifier: i32,
    /// Name of the type, schema-qualified unless it lives in `pg_catalog`
    /// (arrays as `_elem`, like `pg_type.typname`).
    pub type_name: String,
    /// How values of this column are interpreted.
    pub kind: ValueKind,
    /// True when the column is part of the replica identity.
    pub is_key: bool,
    /// Its attribute number on the publisher, 0 when unknown. A renamed
    /// column keeps its number and a dropped one's is never reused, so
    /// two descriptors of a table tell a rename from a drop and an add.
    /// Read from the catalog when the descriptor arrives (which may be
    /// after later DDL): a column gone by then has 0.
    pub attnum: i16,
    /// Declared `NOT NULL` on the publisher (as of the catalog read).
    pub not_null: bool,
    /// What rows older than the column hold in it, in text form: the
    /// constant default it was added with (`pg_attribute.attmissingval`).
    /// Such rows never pass through the stream, so a sink adding the
    /// column gives them this value.
    pub missing_value: Option<String>,
}

impl Column {
    /// The column's type as SQL would write it, with its modifier:
    /// `varchar(10)`, `numeric(12,2)`, `timestamptz(3)`; the plain type
    /// name for types without one.
    pub fn type_display(&self) -> String {
        let m = self.type_modifier;
        let modifier = match self.type_name.as_str() {
            "varchar" | "bpchar" if m >= 4 => format!("({})", m - 4),
            "numeric" if m >= 4 => {
                let m = m - 4;
                format!("({},{})", (m >> 16) & 0xffff, m & 0xffff)
            }
            "bit" | "varbit" if m >= 0 => format!("({m})"),
            "timestamp" | "timestamptz" | "time" | "timetz" if m >= 0 => format!("({m})"),
            _ => String::new(),
        };
        format!("{}{modifier}", self.type_name)
    }
}

/// A schema-qualified table name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TableName {
    /// Schema name.
    pub schema: String,
    /// Table name.
    pub name: String,
}

/// A published table as described by the publisher at one point in time.
///
/// Changes hold their relation by `Arc`, so every change is decoded with the
/// descriptor that was current when it was produced, even after a later
/// schema change replaced it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Relation {
    /// The relation's OID on the publisher.
    pub id: RelationId,
    /// Schema name (`public`, …).
    pub schema: String,
    /// Table name.
    pub name: String,
    /// Replica identity setting.
    pub replica_identity: ReplicaIdentity,
    /// Published columns, in the order the publisher sends them.
    pub columns: Vec<Column>,
    /// For a partition published on its own (`publish_via_partition_root =
    /// false`): the root of its partition tree, so a sink can route its
    /// rows into one table.
    pub partition_root: Option<TableName>,
    /// Indexes in `columns` of the table's primary key, in key order, when
    /// it has one and publishes all its columns; empty otherwise. Besides
    /// the identity because a `REPLICA IDENTITY FULL` table flags every
    /// column as key, and consumers keying rows want the primary key.
    pub primary_key: Vec<usize>,
}

impl Relation {
    /// Indexes of the replica-identity columns.
    pub fn key_columns(&self) -> impl Iterator<Item = usize> + '_ {
        self.columns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.is_key)
            .map(|(i, _)| i)
    }

    /// True when column `index` cannot hold NULL as far as the publisher
    /// tells: it belongs to the primary key or the identity index (with
    /// REPLICA IDENTITY FULL every column is flagged, NULLs included).
    pub fn is_never_null(&self, index: usize) -> bool {
        self.primary_key.contains(&index)
            || self.columns.get(index).is_some_and(|c| c.is_key)
                && matches!(
                    self.replica_identity,
                    ReplicaIdentity::Default | ReplicaIdentity::Index
                )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_display_with_their_modifiers() {
        let column = |type_name: &str, type_modifier| Column {
            name: "c".into(),
            type_oid: 0,
            type_modifier,
            type_name: type_name.into(),
            kind: ValueKind::Other,
            is_key: false,
            attnum: 0,
            not_null: false,
            missing_value: None,
        };
        assert_eq!(column("varchar", 14).type_display(), "varchar(10)");
        assert_eq!(column("varchar", -1).type_display(), "varchar");
        assert_eq!(
            column("numeric", (12 << 16 | 2) + 4).type_display(),
            "numeric(12,2)"
        );
        assert_eq!(column("timestamptz", 3).type_display(), "timestamptz(3)");
        assert_eq!(column("int4", -1).type_display(), "int4");
    }
}
