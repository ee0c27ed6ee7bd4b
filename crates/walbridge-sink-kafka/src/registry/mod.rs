//! Schema registry: the client the sink registers its schemas with, and an
//! embedded registry speaking the Confluent REST API, for deployments
//! without one.

pub mod client;
pub mod protobuf;
pub mod server;
pub mod store;

use std::collections::HashMap;
use std::path::PathBuf;

use apache_avro::Schema;
use apache_avro::schema_compatibility::SchemaCompatibility;
use serde::{Deserialize, Serialize};

use store::StoredSchema;

/// The kinds of schema the registry holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum SchemaType {
    /// Apache Avro (the default when a request names none).
    #[default]
    Avro,
    /// Protocol Buffers.
    Protobuf,
    /// JSON Schema.
    Json,
}

/// Compatibility levels, as Confluent's registry names them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Compatibility {
    /// No check.
    None,
    /// A new schema can read data written with the latest one.
    #[default]
    Backward,
    /// … with every earlier one.
    BackwardTransitive,
    /// The latest schema can read data written with the new one.
    Forward,
    /// … every earlier one can.
    ForwardTransitive,
    /// Both directions with the latest.
    Full,
    /// Both directions with every earlier one.
    FullTransitive,
}

/// A registry request that cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// No such subject.
    #[error("Subject '{0}' not found.")]
    SubjectNotFound(String),
    /// No such version.
    #[error("Version {version} not found for subject '{subject}'.")]
    VersionNotFound {
        /// The subject.
        subject: String,
        /// The version asked for (-1: the latest).
        version: i32,
    },
    /// No schema with that id.
    #[error("Schema {0} not found")]
    SchemaNotFound(i32),
    /// A permanent delete of a subject or version not soft-deleted first.
    #[error("Subject '{subject}'{} was not deleted first before being permanently deleted", version.map(|v| format!(" Version {v}")).unwrap_or_default())]
    NotSoftDeleted {
        /// The subject.
        subject: String,
        /// The version, when one was named.
        version: Option<i32>,
    },
    /// The schema is not registered under the subject.
    #[error("Schema not found")]
    SchemaNotRegistered,
    /// The schema does not parse.
    #[error("Invalid schema: {0}")]
    InvalidSchema(String),
    /// The schema breaks the subject's compatibility level.
    #[error("Schema being registered is incompatible with an earlier schema for subject: {0}")]
    Incompatible(String),
    /// The registry's file cannot be read or written.
    #[error("schema registry storage {path}: {reason}")]
    Storage {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// An external registry refused or failed a request.
    #[error("schema registry {url}: {reason}")]
    Remote {
        /// The request's URL.
        url: String,
        /// What went wrong.
        reason: String,
        /// The HTTP status, when the registry answered.
        status: Option<u16>,
    },
}

impl RegistryError {
    /// True when asking again cannot help: the registry refused the
    /// schema or the request (not a connection failure or a server error).
    pub fn is_permanent(&self) -> bool {
        match self {
            RegistryError::Remote { status, .. } => {
                status.is_some_and(|s| (400..500).contains(&s) && s != 408 && s != 429)
            }
            RegistryError::Storage { .. } => false,
            _ => true,
        }
    }

    /// Confluent's HTTP status and error code for the error.
    pub fn codes(&self) -> (u16, u32) {
        match self {
            RegistryError::SubjectNotFound(_) => (404, 40401),
            RegistryError::VersionNotFound { .. } => (404, 40402),
            RegistryError::SchemaNotFound(_) => (404, 40403),
            RegistryError::SchemaNotRegistered => (404, 40403),
            RegistryError::NotSoftDeleted { version: None, .. } => (404, 40405),
            RegistryError::NotSoftDeleted { .. } => (404, 40407),
            RegistryError::InvalidSchema(_) => (422, 42201),
            RegistryError::Incompatible(_) => (409, 409),
            RegistryError::Storage { .. } | RegistryError::Remote { .. } => (500, 50001),
        }
    }
}

/// The form two schemas are compared in: Avro's parsing canonical form,
/// Protobuf's serialized descriptor (compiled with `imports`, the schemas
/// it imports by name), JSON schemas' text without surrounding space.
pub fn normalize(
    schema: &StoredSchema,
    imports: &HashMap<String, String>,
) -> Result<String, RegistryError> {
    match schema.schema_type {
        SchemaType::Avro => parse_avro(&schema.schema).map(|s| s.canonical_form()),
        SchemaType::Protobuf => protobuf::serialized(&schema.schema, imports),
        SchemaType::Json => Ok(schema.schema.trim().to_owned()),
    }
}

fn parse_avro(text: &str) -> Result<Schema, RegistryError> {
    Schema::parse_str(text).map_err(|e| RegistryError::InvalidSchema(e.to_string()))
}

/// The schema as Avro's schema resolution sees it: logical types are
/// annotations on their underlying types, which alone decide whether data
/// can be read (as in the Java implementation Confluent's registry uses;
/// apache-avro's own check does not know `decimal`).
fn parse_for_resolution(text: &str) -> Result<Schema, RegistryError> {
    fn strip(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                if map.remove("logicalType").is_some() {
                    map.remove("precision");
                    map.remove("scale");
                }
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut json: serde_json::Value =
        serde_json::from_str(text).map_err(|e| RegistryError::InvalidSchema(e.to_string()))?;
    strip(&mut json);
    Schema::parse(&json).map_err(|e| RegistryError::InvalidSchema(e.to_string()))
}

/// Checks `new` against the `previous` versions of a subject (oldest
/// first) at `level`, with `can_read(reader, writer)` telling whether data
/// written with one schema reads with the other.
fn check_levels<T>(
    level: Compatibility,
    new: &T,
    previous: &[T],
    can_read: impl Fn(&T, &T) -> Result<(), String>,
) -> Result<(), RegistryError> {
    let against: &[T] = match level {
        Compatibility::None => return Ok(()),
        Compatibility::Backward | Compatibility::Forward | Compatibility::Full => {
            previous.last().map_or(&[], std::slice::from_ref)
        }
        Compatibility::BackwardTransitive
        | Compatibility::ForwardTransitive
        | Compatibility::FullTransitive => previous,
    };
    let backward = matches!(
        level,
        Compatibility::Backward
            | Compatibility::BackwardTransitive
            | Compatibility::Full
            | Compatibility::FullTransitive
    );
    let forward = matches!(
        level,
        Compatibility::Forward
            | Compatibility::ForwardTransitive
            | Compatibility::Full
            | Compatibility::FullTransitive
    );
    for old in against {
        if backward && let Err(e) = can_read(new, old) {
            return Err(RegistryError::Incompatible(format!(
                "the new schema cannot read data written with an earlier one: {e}"
            )));
        }
        if forward && let Err(e) = can_read(old, new) {
            return Err(RegistryError::Incompatible(format!(
                "an earlier schema cannot read data written with the new one: {e}"
            )));
        }
    }
    Ok(())
}

/// Checks the Avro schema `new` against the `previous` Avro versions of a
/// subject at `level`, by schema resolution.
pub fn check_avro(
    level: Compatibility,
    new: &StoredSchema,
    previous: &[&StoredSchema],
) -> Result<(), RegistryError> {
    if level == Compatibility::None {
        return Ok(());
    }
    let new = parse_for_resolution(&new.schema)?;
    let previous = previous
        .iter()
        .map(|s| parse_for_resolution(&s.schema))
        .collect::<Result<Vec<_>, _>>()?;
    check_levels(level, &new, &previous, |reader, writer| {
        SchemaCompatibility::can_read(writer, reader).map_err(|e| e.to_string())
    })
}

/// Checks the Protobuf descriptor `new` against the `previous` versions'
/// at `level`, by the wire compatibility of their messages.
pub fn check_protobuf(
    level: Compatibility,
    new: &prost_types::FileDescriptorProto,
    previous: &[prost_types::FileDescriptorProto],
) -> Result<(), RegistryError> {
    check_levels(level, new, previous, protobuf::can_read)
}

#[cfg(test)]
mod tests {
    use super::store::Store;
    use super::*;

    fn avro(text: &str) -> StoredSchema {
        StoredSchema {
            schema: text.to_owned(),
            schema_type: SchemaType::Avro,
            references: Vec::new(),
        }
    }

    const V1: &str = r#"{"type":"record","name":"R","fields":[{"name":"id","type":"int"},{"name":"d","type":["null",{"type":"bytes","logicalType":"decimal","precision":9,"scale":2}]}]}"#;
    const V2: &str = r#"{"type":"record","name":"R","fields":[{"name":"id","type":"int"},{"name":"d","type":["null",{"type":"bytes","logicalType":"decimal","precision":9,"scale":2}]},{"name":"v","type":["null","string"],"default":null}]}"#;
    const V3_BREAKS: &str = r#"{"type":"record","name":"R","fields":[{"name":"id","type":"int"},{"name":"w","type":"string"}]}"#;

    #[test]
    fn versions_ids_and_backward_compatibility_persist() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("registry.json");
        let mut store = Store::open(&path).unwrap_or_else(|e| panic!("{e}"));
        let first = store
            .register("t-value", avro(V1))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((first.id, first.version), (1, 1));
        // The same schema, spelled differently: the same version.
        let again = store
            .register("t-value", avro(&V1.replace(':', " : ")))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(again, first);
        let second = store
            .register("t-value", avro(V2))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((second.id, second.version), (2, 2));
        assert!(matches!(
            store.register("t-value", avro(V3_BREAKS)),
            Err(RegistryError::Incompatible(_))
        ));
        // An identical schema under another subject keeps its id.
        let other = store
            .register("u-value", avro(V1))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((other.id, other.version), (1, 1));
        store
            .set_compatibility(Some("t-value"), Compatibility::None)
            .unwrap_or_else(|e| panic!("{e}"));
        let third = store
            .register("t-value", avro(V3_BREAKS))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(third.version, 3);
        drop(store);
        let reopened = Store::open(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(reopened.subjects(), ["t-value", "u-value"]);
        assert_eq!(reopened.compatibility(Some("t-value")), Compatibility::None);
        assert_eq!(
            reopened.compatibility(Some("u-value")),
            Compatibility::Backward
        );
        assert_eq!(
            reopened.version("t-value", None).map(|v| v.id).ok(),
            Some(third.id)
        );
        assert!(matches!(
            reopened.version("nope", None),
            Err(RegistryError::SubjectNotFound(_))
        ));
        assert!(matches!(
            Store::open(&path).and_then(|mut s| s.register("x", avro("{not avro"))),
            Err(RegistryError::InvalidSchema(_))
        ));
    }

    #[test]
    fn soft_then_permanent_deletes() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let mut store =
            Store::open(&dir.path().join("registry.json")).unwrap_or_else(|e| panic!("{e}"));
        fn ok<T>(r: Result<T, RegistryError>) -> T {
            r.unwrap_or_else(|e| panic!("{e}"))
        }
        let first = ok(store.register("t-value", avro(V1)));
        ok(store.register("t-value", avro(V2)));
        assert!(matches!(
            store.delete("t-value", Some(1), true),
            Err(RegistryError::NotSoftDeleted {
                version: Some(1),
                ..
            })
        ));
        assert_eq!(ok(store.delete("t-value", Some(1), false)), [1]);
        assert_eq!(ok(store.delete("t-value", Some(1), true)), [1]);
        assert_eq!(
            ok(store.versions("t-value"))
                .iter()
                .map(|v| v.version)
                .collect::<Vec<_>>(),
            [2]
        );
        assert_eq!(ok(store.delete("t-value", None, false)), [2]);
        assert!(store.subjects().is_empty());
        assert!(matches!(
            store.delete("t-value", None, false),
            Err(RegistryError::SubjectNotFound(_))
        ));
        // Soft-deleted version numbers are not reused.
        assert_eq!(ok(store.register("t-value", avro(V1))).version, 3);
        assert_eq!(ok(store.delete("t-value", None, false)), [3]);
        assert_eq!(ok(store.delete("t-value", None, true)), [2, 3]);
        // Gone for good: versions start again, the schema keeps its id.
        assert_eq!(ok(store.register("t-value", avro(V1))), first);
    }

    #[test]
    fn protobuf_schemas_are_checked_by_wire_compatibility() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let mut store =
            Store::open(&dir.path().join("registry.json")).unwrap_or_else(|e| panic!("{e}"));
        let proto = |text: &str| StoredSchema {
            schema: text.to_owned(),
            schema_type: SchemaType::Protobuf,
            references: Vec::new(),
        };
        let v1 = "syntax = \"proto3\"; package p; message V { int32 id = 1; string s = 2; }";
        let v2 = "syntax = \"proto3\"; package p; message V { reserved 2; int32 id = 1; optional bytes t = 3; }";
        let breaks = "syntax = \"proto3\"; package p; message V { string id = 1; }";
        assert_eq!(
            store.register("p-value", proto(v1)).map(|r| r.version).ok(),
            Some(1)
        );
        assert_eq!(
            store.register("p-value", proto(v2)).map(|r| r.version).ok(),
            Some(2)
        );
        assert!(matches!(
            store.register("p-value", proto(breaks)),
            Err(RegistryError::Incompatible(e)) if e.contains("field 1")
        ));
        assert!(matches!(
            store.register("p-value", proto("syntax = \"proto3\"; message {")),
            Err(RegistryError::InvalidSchema(_))
        ));
    }
}
