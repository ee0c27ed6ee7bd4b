//! Relations, rows and settings the encoders' unit tests share.

use bytes::Bytes;
use walbridge_core::{Column, Datum, Lsn, Relation, ReplicaIdentity, ValueKind};

use crate::config::{SchemaRegistryConfig, SubjectNameStrategy};
use crate::event::SourceBlock;

/// A column of `kind`.
pub fn column(name: &str, kind: ValueKind, type_modifier: i32, is_key: bool) -> Column {
    Column {
        name: name.into(),
        type_oid: 0,
        type_modifier,
        type_name: String::new(),
        kind,
        is_key,
        attnum: 0,
        not_null: false,
        missing_value: None,
    }
}

/// An array of `element`.
pub fn array_of(element: ValueKind) -> ValueKind {
    ValueKind::Array {
        element: Box::new(element),
        delimiter: b',',
    }
}

/// Table `public.t` with `columns` and the default identity.
pub fn relation(columns: Vec<Column>) -> Relation {
    Relation {
        id: 1,
        schema: "public".into(),
        name: "t".into(),
        replica_identity: ReplicaIdentity::Default,
        columns,
        partition_root: None,
        primary_key: Vec::new(),
    }
}

/// A value in text form.
pub fn text(s: &str) -> Datum {
    Datum::Text(Bytes::copy_from_slice(s.as_bytes()))
}

/// A registry nobody listens on (the tests never register).
pub fn registry() -> SchemaRegistryConfig {
    SchemaRegistryConfig {
        url: "http://127.0.0.1:1".into(),
        username: None,
        password: None,
        ca_cert: None,
        subject_name_strategy: SubjectNameStrategy::Topic,
    }
}

/// The source block of a change in `public.t`.
pub fn source() -> SourceBlock<'static> {
    SourceBlock {
        name: "src",
        database: "db",
        schema: Some("public"),
        table: Some("t"),
        lsn: Lsn(42),
        commit_lsn: Some(Lsn(50)),
        xid: Some(9),
        ts_us: 1_000_000,
        snapshot: false,
    }
}
