//! Protobuf schemas in the embedded registry. Clients register them as
//! `.proto` text or, as Confluent's serializers do, as a base64-encoded
//! `FileDescriptorProto`; deserializers ask for the latter
//! (`?format=serialized`). Both are compiled here, with the schemas they
//! import (by reference, or built in: `google/protobuf/*.proto` and
//! `confluent/type/decimal.proto`), which also rejects invalid schemas.

use std::collections::HashMap;

use base64::Engine as _;
use prost::Message as _;
use prost_types::{FileDescriptorProto, FileDescriptorSet};
use protox::Compiler;
use protox::file::{ChainFileResolver, File, FileResolver, GoogleFileResolver};

use super::RegistryError;

/// The name the schema being compiled goes by.
const SCHEMA_FILE: &str = "schema.proto";

/// Confluent's decimal, which its registry and clients know without a
/// reference.
const DECIMAL_FILE: &str = "confluent/type/decimal.proto";
const DECIMAL_SOURCE: &str = "syntax = \"proto3\";
package confluent.type;

message Decimal {
  bytes value = 1;
  uint32 precision = 2;
  int32 scale = 3;
}
";

/// A `.proto` text or a base64 serialized descriptor, as the file `name`.
fn file(name: &str, schema: &str) -> Result<File, protox::Error> {
    match File::from_source(name, schema) {
        Ok(file) => Ok(file),
        Err(parse_error) => {
            let Some(mut descriptor) = base64::engine::general_purpose::STANDARD
                .decode(schema.trim())
                .ok()
                .and_then(|bytes| FileDescriptorProto::decode(bytes.as_slice()).ok())
            else {
                return Err(parse_error);
            };
            descriptor.name = Some(name.to_owned());
            Ok(File::from_file_descriptor_proto(descriptor))
        }
    }
}

/// The schema being compiled and what it imports.
struct Sources {
    schema: String,
    imports: HashMap<String, String>,
}

impl FileResolver for Sources {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        match name {
            SCHEMA_FILE => file(name, &self.schema),
            DECIMAL_FILE if !self.imports.contains_key(name) => file(name, DECIMAL_SOURCE),
            _ => match self.imports.get(name) {
                Some(schema) => file(name, schema),
                None => Err(protox::Error::file_not_found(name)),
            },
        }
    }
}

/// The descriptors of `schema` and of every file it imports (dependencies
/// first); `imports` are the schemas it imports by reference, by the names
/// it imports them as.
pub fn descriptor_set(
    schema: &str,
    imports: &HashMap<String, String>,
) -> Result<FileDescriptorSet, RegistryError> {
    let mut resolver = ChainFileResolver::new();
    // The compiler keeps its resolvers for its lifetime: they own copies.
    resolver.add(Sources {
        schema: schema.to_owned(),
        imports: imports.clone(),
    });
    resolver.add(GoogleFileResolver::new());
    let mut compiler = Compiler::with_file_resolver(resolver);
    compiler
        .include_imports(true)
        .open_file(SCHEMA_FILE)
        .map_err(|e| RegistryError::InvalidSchema(e.to_string()))?;
    Ok(compiler.file_descriptor_set())
}

/// The descriptor of `schema` alone (see [`descriptor_set`]).
pub fn descriptor(
    schema: &str,
    imports: &HashMap<String, String>,
) -> Result<FileDescriptorProto, RegistryError> {
    descriptor_set(schema, imports)?
        .file
        .into_iter()
        .find(|f| f.name() == SCHEMA_FILE)
        .ok_or_else(|| RegistryError::InvalidSchema("the schema did not compile".into()))
}

/// `schema` as a base64 serialized descriptor: the form deserializers ask
/// for, and the one two schemas are compared in.
pub fn serialized(
    schema: &str,
    imports: &HashMap<String, String>,
) -> Result<String, RegistryError> {
    let descriptor = descriptor(schema, imports)?;
    Ok(base64::engine::general_purpose::STANDARD.encode(descriptor.encode_to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"
        syntax = "proto3";
        package shop.public.orders;
        import "google/protobuf/timestamp.proto";
        import "confluent/type/decimal.proto";
        message Envelope { Value after = 1; }
        message Value {
          int32 id = 1;
          optional string note = 2;
          google.protobuf.Timestamp at = 3;
          confluent.type.Decimal price = 4;
        }
    "#;

    #[test]
    fn text_and_serialized_forms_compile_to_one_descriptor() {
        let none = HashMap::new();
        let from_text = serialized(TEXT, &none).unwrap_or_else(|e| panic!("{e}"));
        // Spacing and comments do not matter; the serialized form compiles
        // to itself.
        let respaced = format!("// the same\n{}", TEXT.replace("  ", " "));
        assert_eq!(serialized(&respaced, &none).ok(), Some(from_text.clone()));
        assert_eq!(serialized(&from_text, &none).ok(), Some(from_text.clone()));
        let parsed = descriptor(&from_text, &none).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(parsed.package(), "shop.public.orders");
        assert_eq!(parsed.message_type[1].field.len(), 4);
    }

    #[test]
    fn imports_resolve_through_references_and_errors_are_invalid_schemas() {
        let importer = "syntax = \"proto3\"; import \"other.proto\"; message A { B b = 1; }";
        let imports = HashMap::from([(
            "other.proto".to_owned(),
            "syntax = \"proto3\"; message B { string s = 1; }".to_owned(),
        )]);
        assert!(descriptor(importer, &imports).is_ok());
        for broken in [
            importer,
            "syntax = \"proto3\"; message A { int32 a = 1 }",
            "syntax = \"proto3\"; message A { Missing m = 1; }",
        ] {
            assert!(matches!(
                descriptor(broken, &HashMap::new()),
                Err(RegistryError::InvalidSchema(_))
            ));
        }
    }
}
