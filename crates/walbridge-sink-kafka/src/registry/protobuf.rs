//! Protobuf schemas in the embedded registry. Clients register them as
//! `.proto` text or, as Confluent's serializers do, as a base64-encoded
//! `FileDescriptorProto`; deserializers ask for the latter
//! (`?format=serialized`). Both are compiled here, with the schemas they
//! import (by reference, or built in: `google/protobuf/*.proto` and
//! `confluent/type/decimal.proto`), which also rejects invalid schemas.

use std::collections::HashMap;

use base64::Engine as _;
use prost::Message as _;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FieldDescriptorProto, FileDescriptorProto, FileDescriptorSet};
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

/// The messages of `file`, nested ones included, by full name.
fn messages(file: &FileDescriptorProto) -> HashMap<String, &DescriptorProto> {
    fn add<'a>(
        scope: &str,
        list: &'a [DescriptorProto],
        into: &mut HashMap<String, &'a DescriptorProto>,
    ) {
        for message in list {
            let name = format!("{scope}.{}", message.name());
            add(&name, &message.nested_type, into);
            into.insert(name, message);
        }
    }
    let mut all = HashMap::new();
    let scope = if file.package().is_empty() {
        String::new()
    } else {
        format!(".{}", file.package())
    };
    add(&scope, &file.message_type, &mut all);
    all
}

/// Field types whose encodings read as one another: varints, zigzag
/// varints, the fixed widths, and the length-delimited kinds.
fn wire_group(ty: Type) -> u8 {
    match ty {
        Type::Int32 | Type::Uint32 | Type::Int64 | Type::Uint64 | Type::Bool => 0,
        Type::Sint32 | Type::Sint64 => 1,
        Type::Fixed32 | Type::Sfixed32 => 2,
        Type::Fixed64 | Type::Sfixed64 => 3,
        Type::Float => 4,
        Type::Double => 5,
        Type::String | Type::Bytes => 6,
        Type::Message => 7,
        Type::Group => 8,
        Type::Enum => 9,
    }
}

fn type_display(field: &FieldDescriptorProto) -> String {
    match field.r#type() {
        Type::Message | Type::Enum => field.type_name().trim_start_matches('.').to_owned(),
        scalar => scalar
            .as_str_name()
            .trim_start_matches("TYPE_")
            .to_ascii_lowercase(),
    }
}

/// Whether data written with `writer` reads with `reader`, by the core of
/// Confluent's rules for Protobuf (oneof and proto2 `required` changes are
/// not checked): the package is the same, every
/// message of the writer is in the reader, and each field number both
/// use is encoded compatibly (one wire group, the same message or enum
/// type; repeated and singular mix only for length-delimited types).
/// Fields only one of them has are skipped or left unset by readers.
pub fn can_read(reader: &FileDescriptorProto, writer: &FileDescriptorProto) -> Result<(), String> {
    if reader.package() != writer.package() {
        return Err(format!(
            "the package differs (`{}`, `{}`)",
            writer.package(),
            reader.package()
        ));
    }
    let readers = messages(reader);
    for (name, written) in messages(writer) {
        let name = name.trim_start_matches('.');
        let Some(read) = readers.get(&format!(".{name}")) else {
            return Err(format!("message `{name}` is missing"));
        };
        for w in &written.field {
            let Some(r) = read.field.iter().find(|r| r.number() == w.number()) else {
                continue;
            };
            let (wt, rt) = (w.r#type(), r.r#type());
            let repeated = (w.label() == Label::Repeated, r.label() == Label::Repeated);
            let why = if wire_group(wt) != wire_group(rt)
                || matches!(wt, Type::Message | Type::Enum) && w.type_name() != r.type_name()
            {
                format!(
                    "its type is `{}` in one and `{}` in the other",
                    type_display(w),
                    type_display(r)
                )
            } else if repeated.0 != repeated.1 && !matches!(wire_group(wt), 6 | 7) {
                "it is repeated in one and not in the other".to_owned()
            } else {
                continue;
            };
            return Err(format!(
                "field {} of `{name}` (`{}`, `{}`): {why}",
                w.number(),
                w.name(),
                r.name()
            ));
        }
    }
    Ok(())
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

    #[test]
    fn wire_compatibility() {
        let none = HashMap::new();
        let compile = |text: &str| descriptor(text, &none).unwrap_or_else(|e| panic!("{e}"));
        let v1 = compile(
            "syntax = \"proto3\"; package p; message E { V after = 1; } message V { int32 id = 1; string s = 2; repeated int64 n = 3; }",
        );
        let check = |text: &str| {
            let new = compile(text);
            (can_read(&new, &v1), can_read(&v1, &new))
        };
        // A field added, one removed (and reserved), a compatible widening.
        let (backward, forward) = check(
            "syntax = \"proto3\"; package p; message E { V after = 1; } message V { reserved 2; int64 id = 1; repeated int64 n = 3; optional bytes t = 4; }",
        );
        assert_eq!((backward.is_ok(), forward.is_ok()), (true, true));
        for breaking in [
            "syntax = \"proto3\"; package q; message E { V after = 1; } message V { int32 id = 1; }",
            "syntax = \"proto3\"; package p; message V { int32 id = 1; }",
            "syntax = \"proto3\"; package p; message E { V after = 1; } message V { string id = 1; }",
            "syntax = \"proto3\"; package p; message E { V after = 1; } message V { int32 id = 1; int64 n = 3; }",
        ] {
            let (backward, _) = check(breaking);
            assert!(backward.is_err(), "{breaking}");
        }
        // Removing a message breaks readers of old data, not writers of new.
        let (backward, forward) =
            check("syntax = \"proto3\"; package p; message V { int32 id = 1; }");
        assert!(backward.is_err_and(|e| e.contains("`p.E` is missing")));
        assert!(forward.is_ok());
    }
}
