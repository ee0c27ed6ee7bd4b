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
}
