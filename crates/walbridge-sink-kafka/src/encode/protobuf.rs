//! `format = "protobuf"`: Debezium's envelope as Protocol Buffers (proto3)
//! messages, in the Confluent wire format: magic byte 0, the schema's
//! registry id as 4 bytes big-endian, the message-index array (a single 0:
//! the first message of the schema), then the message.
//!
//! Per topic, a schema with the messages `Envelope` (first), `Value`,
//! `Source` and `TransactionBlock`, and one with `Key`, in the package
//! made of the topic name, are derived from the table's relation
//! descriptor and registered as `PROTOBUF` under `<topic>-value` /
//! `<topic>-key` (or as the subject name strategy says); a new descriptor
//! registers a new version. Field numbers start in column order and are
//! kept by name from the subject's latest version; new columns (and
//! columns whose type changed) take unused numbers, dropped ones are
//! reserved, so every version reads every other's data. Column types:
//!
//! | PostgreSQL | Protobuf |
//! |---|---|
//! | `int2`, `int4` | `int32` |
//! | `int8`, `oid` | `int64` |
//! | `float4` / `float8` | `float` / `double` |
//! | `numeric(p,s)` | `confluent.type.Decimal` (unscaled big-endian two's complement, precision p, scale s) |
//! | `numeric` without a precision | `string` (its exact text: any scale, `NaN`, `Infinity`) |
//! | `bool` | `bool` |
//! | `bytea` | `bytes` |
//! | `date` | `int32`, days since 1970-01-01 |
//! | `time` | `int64`, microseconds since midnight |
//! | `timestamp` | `google.protobuf.Timestamp` of its wall-clock time read as UTC |
//! | `timestamptz` | `google.protobuf.Timestamp` |
//! | `uuid`, text types, `json`/`jsonb`, enums, anything else | `string` (the text form) |
//! | one-dimensional arrays | `repeated` of the element's type |
//!
//! Columns of the replica identity are plain fields, other scalar columns
//! `optional` (explicit presence: an unset field is NULL). As in
//! Confluent's converters, a NULL array reads as an empty one, and arrays
//! with NULL elements cannot be written (`repeated` has no place for
//! them): such a row stops the sink with an error naming table and column.
//! `±infinity` timestamps become the first and last instants
//! `google.protobuf.Timestamp` allows (0001-01-01, 9999-12-31). An
//! unchanged TOASTed value is the placeholder for string and bytes columns
//! (a one-element array of it for arrays of strings) and unset otherwise.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;

use prost_types::FieldDescriptorProto;
use prost_types::field_descriptor_proto::{Label, Type as FieldType};
use walbridge_core::{LogicalMessage, PgTimestamp, Relation, Row, SequenceValue};

use super::columns::{
    ColumnType, Field, FieldValue, Part, RecordSchemas, Scalar, SchemaDocument, SchemaState,
    field_value, namespace,
};
use super::json::{CONNECTOR, VERSION};
use crate::config::SchemaRegistryConfig;
use crate::error::SinkError;
use crate::event::{
    ChangeEvent, KeyColumns, RowImage, SourceBlock, TransactionRecord, TransactionStatus,
    table_name,
};
use crate::registry::SchemaType;

/// Confluent's decimal message, built into its registry and clients.
const DECIMAL_IMPORT: &str = "confluent/type/decimal.proto";
/// Protobuf's well-known timestamp.
const TIMESTAMP_IMPORT: &str = "google/protobuf/timestamp.proto";

/// The first and last seconds `google.protobuf.Timestamp` allows.
const MIN_TIMESTAMP_SECONDS: i64 = -62_135_596_800;
const MAX_TIMESTAMP_SECONDS: i64 = 253_402_300_799;

/// The `Source` message, as Debezium's `source` block.
const SOURCE_MESSAGE: &str = "message Source {
  string version = 1;
  string connector = 2;
  string name = 3;
  int64 ts_ms = 4;
  int64 ts_us = 5;
  optional string snapshot = 6;
  string db = 7;
  optional string schema = 8;
  optional string table = 9;
  optional int64 txId = 10;
  optional int64 lsn = 11;
  optional int64 commit_lsn = 12;
}
";

/// The protobuf type of a column type (of its elements for arrays).
fn proto_type(ty: &ColumnType) -> &'static str {
    match ty {
        ColumnType::Int | ColumnType::Date => "int32",
        ColumnType::Long | ColumnType::TimeMicros => "int64",
        ColumnType::Float => "float",
        ColumnType::Double => "double",
        ColumnType::Boolean => "bool",
        ColumnType::String | ColumnType::Uuid => "string",
        ColumnType::Bytes => "bytes",
        ColumnType::Decimal { .. } => "confluent.type.Decimal",
        ColumnType::LocalTimestampMicros | ColumnType::TimestampMicros => {
            "google.protobuf.Timestamp"
        }
        ColumnType::Array(element) => proto_type(element),
    }
}

/// The file a type needs imported.
fn import_of(ty: &ColumnType) -> Option<&'static str> {
    match ty {
        ColumnType::Decimal { .. } => Some(DECIMAL_IMPORT),
        ColumnType::LocalTimestampMicros | ColumnType::TimestampMicros => Some(TIMESTAMP_IMPORT),
        ColumnType::Array(element) => import_of(element),
        _ => None,
    }
}

/// A message of `fields`, with `reserved` numbers.
fn row_message(name: &str, fields: &[Field], reserved: &BTreeSet<u32>) -> String {
    let mut text = format!("message {name} {{\n");
    if !reserved.is_empty() {
        let numbers: Vec<String> = reserved.iter().map(u32::to_string).collect();
        let _ = writeln!(text, "  reserved {};", numbers.join(", "));
    }
    for field in fields {
        let label = match &field.ty {
            ColumnType::Array(_) => "repeated ",
            // Message types have presence without `optional`.
            ty if import_of(ty).is_some() => "",
            _ if field.nullable => "optional ",
            _ => "",
        };
        let _ = writeln!(
            text,
            "  {label}{} {} = {};",
            proto_type(&field.ty),
            field.name,
            field.number
        );
    }
    text.push_str("}\n");
    text
}

/// A proto3 file in `package` with `messages`, the first being the one
/// the wire format's message index points at.
fn proto_file<'a>(
    package: &str,
    imports: impl IntoIterator<Item = &'a str>,
    messages: &[&str],
) -> String {
    let mut text = format!("syntax = \"proto3\";\npackage {package};\n");
    let imports: BTreeSet<&str> = imports.into_iter().collect();
    if !imports.is_empty() {
        text.push('\n');
        for import in imports {
            let _ = writeln!(text, "import \"{import}\";");
        }
    }
    for message in messages {
        text.push('\n');
        text.push_str(message);
    }
    text
}

/// The `Envelope` message. Its `transaction` field is declared whether or
/// not `transaction_topic` sets it, so turning that on or off does not
/// remove a message (which Protobuf compatibility forbids).
const ENVELOPE_MESSAGES: [&str; 2] = [
    "message Envelope {
  Value before = 1;
  Value after = 2;
  Source source = 3;
  string op = 4;
  optional int64 ts_ms = 5;
  optional int64 ts_us = 6;
  TransactionBlock transaction = 7;
}
",
    "message TransactionBlock {
  string id = 1;
  int64 total_order = 2;
  int64 data_collection_order = 3;
}
",
];

/// The Protobuf schemas of a relation's rows.
struct ProtobufSchemas;

impl RecordSchemas for ProtobufSchemas {
    // Protobuf identifies fields by number: numbers must outlive versions.
    const FOLLOWS_PREVIOUS: bool = true;

    fn schema(
        &self,
        topic: &str,
        part: Part,
        fields: &mut [Field],
        previous: Option<&str>,
    ) -> SchemaDocument {
        let package = namespace(topic);
        let row_name = match part {
            Part::Key => "Key",
            Part::Envelope => "Value",
        };
        let reserved = renumber(fields, row_name, previous);
        let row = row_message(row_name, fields, &reserved);
        let imports = fields.iter().filter_map(|f| import_of(&f.ty));
        let text = match part {
            Part::Key => proto_file(&package, imports, &[&row]),
            Part::Envelope => {
                let [envelope, block] = ENVELOPE_MESSAGES;
                proto_file(&package, imports, &[envelope, &row, SOURCE_MESSAGE, block])
            }
        };
        SchemaDocument {
            name: self.record_name(topic, part),
            text,
        }
    }
}

/// How a field is encoded: repeated or not, and its type (a scalar's
/// name, a message's full name).
type WireSignature = (bool, String);

fn column_signature(ty: &ColumnType) -> WireSignature {
    (
        matches!(ty, ColumnType::Array(_)),
        proto_type(ty).to_owned(),
    )
}

fn descriptor_signature(field: &FieldDescriptorProto) -> WireSignature {
    let ty = match field.r#type() {
        FieldType::Message | FieldType::Enum => {
            field.type_name().trim_start_matches('.').to_owned()
        }
        scalar => scalar
            .as_str_name()
            .trim_start_matches("TYPE_")
            .to_ascii_lowercase(),
    };
    (field.label() == Label::Repeated, ty)
}

/// Numbers `fields` of message `message` as the `previous` schema did, so
/// data written with any version reads with any other: a field keeps its
/// number while its name and encoding stay; a new field, or one whose type
/// changed, takes a number never used before. Returns the numbers to
/// reserve: the previous version's reserved ones and those no field keeps.
fn renumber(fields: &mut [Field], message: &str, previous: Option<&str>) -> BTreeSet<u32> {
    let Some(old) = previous
        .and_then(|text| crate::registry::protobuf::descriptor(text, &HashMap::new()).ok())
        .and_then(|file| file.message_type.into_iter().find(|m| m.name() == message))
    else {
        return BTreeSet::new();
    };
    // Ranges are end-exclusive; `reserved 9 to max` is not taken apart.
    let mut reserved: BTreeSet<u32> = old
        .reserved_range
        .iter()
        .filter(|r| r.end() - r.start() <= 1_000)
        .flat_map(|r| r.start() as u32..r.end() as u32)
        .collect();
    let known: HashMap<&str, (u32, WireSignature)> = old
        .field
        .iter()
        .map(|f| (f.name(), (f.number() as u32, descriptor_signature(f))))
        .collect();
    let mut next = old
        .field
        .iter()
        .map(|f| f.number())
        .chain(old.reserved_range.iter().map(|r| r.end() - 1))
        .filter(|&n| n < 1 << 20)
        .max()
        .map_or(1, |n| n as u32 + 1);
    let mut kept = BTreeSet::new();
    for field in fields.iter_mut() {
        match known.get(field.name.as_str()) {
            Some((number, signature)) if *signature == column_signature(&field.ty) => {
                field.number = *number;
                kept.insert(*number);
            }
            _ => {
                field.number = next;
                next += 1;
            }
        }
    }
    reserved.extend(
        known
            .values()
            .map(|(n, _)| *n)
            .filter(|n| !kept.contains(n)),
    );
    reserved
}

// The binary encoding.

const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const LENGTH_DELIMITED: u32 = 2;
const FIXED32: u32 = 5;

/// The varint encoding of `value`: its bytes and how many there are.
fn varint_bytes(mut value: u64) -> ([u8; 10], usize) {
    let mut bytes = [0u8; 10];
    let mut n = 0;
    while value >= 0x80 {
        bytes[n] = (value as u8) | 0x80;
        value >>= 7;
        n += 1;
    }
    bytes[n] = value as u8;
    (bytes, n + 1)
}

fn write_varint(out: &mut Vec<u8>, value: u64) {
    let (bytes, n) = varint_bytes(value);
    out.extend_from_slice(&bytes[..n]);
}

fn write_tag(out: &mut Vec<u8>, number: u32, wire_type: u32) {
    write_varint(out, u64::from(number << 3 | wire_type));
}

/// An `int32`/`int64`/`bool` field (negative numbers as ten-byte varints,
/// as protobuf encodes them).
fn write_int(out: &mut Vec<u8>, number: u32, value: i64) {
    write_tag(out, number, VARINT);
    write_varint(out, value as u64);
}

fn write_len(out: &mut Vec<u8>, number: u32, bytes: &[u8]) {
    write_tag(out, number, LENGTH_DELIMITED);
    write_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Starts a message field: its tag. The body follows in `out`; then
/// [`end_message`] puts its length in front of it (written in place: no
/// buffer per nested message).
fn start_message(out: &mut Vec<u8>, number: u32) -> usize {
    write_tag(out, number, LENGTH_DELIMITED);
    out.len()
}

/// Ends the message field whose body starts at `start`.
fn end_message(out: &mut Vec<u8>, start: usize) {
    let (prefix, n) = varint_bytes((out.len() - start) as u64);
    out.splice(start..start, prefix[..n].iter().copied());
}

/// A message field whose body `body` writes.
fn write_message(out: &mut Vec<u8>, number: u32, body: impl FnOnce(&mut Vec<u8>)) {
    let start = start_message(out, number);
    body(out);
    end_message(out, start);
}

/// `google.protobuf.Timestamp` of microseconds since 1970-01-01 UTC.
fn write_timestamp(out: &mut Vec<u8>, micros: i64) {
    let (seconds, nanos) = match micros {
        i64::MAX => (MAX_TIMESTAMP_SECONDS, 999_999_999),
        i64::MIN => (MIN_TIMESTAMP_SECONDS, 0),
        _ => (
            micros.div_euclid(1_000_000),
            micros.rem_euclid(1_000_000) * 1000,
        ),
    };
    if seconds != 0 {
        write_int(out, 1, seconds);
    }
    if nanos != 0 {
        write_int(out, 2, nanos);
    }
}

/// True for element types `repeated` packs into one length-delimited run.
fn packed(ty: &ColumnType) -> bool {
    matches!(
        ty,
        ColumnType::Int
            | ColumnType::Long
            | ColumnType::Float
            | ColumnType::Double
            | ColumnType::Boolean
            | ColumnType::Date
            | ColumnType::TimeMicros
    )
}

/// The bytes of a packable scalar, without tag.
fn write_packed_value(out: &mut Vec<u8>, value: &Scalar<'_>) {
    match value {
        Scalar::Int(v) | Scalar::Date(v) => write_varint(out, i64::from(*v) as u64),
        Scalar::Long(v) | Scalar::Micros(v) => write_varint(out, *v as u64),
        Scalar::Boolean(v) => write_varint(out, u64::from(*v)),
        Scalar::Float(v) => out.extend_from_slice(&v.to_le_bytes()),
        Scalar::Double(v) => out.extend_from_slice(&v.to_le_bytes()),
        Scalar::Text(_) | Scalar::Bytes(_) | Scalar::Decimal(_) => {}
    }
}

/// One field holding a non-null scalar of `ty`.
fn write_scalar(out: &mut Vec<u8>, number: u32, ty: &ColumnType, value: &Scalar<'_>) {
    match (ty, value) {
        (ColumnType::Float, Scalar::Float(_)) => {
            write_tag(out, number, FIXED32);
            write_packed_value(out, value);
        }
        (ColumnType::Double, Scalar::Double(_)) => {
            write_tag(out, number, FIXED64);
            write_packed_value(out, value);
        }
        (ColumnType::LocalTimestampMicros | ColumnType::TimestampMicros, Scalar::Micros(v)) => {
            write_message(out, number, |m| write_timestamp(m, *v));
        }
        (ColumnType::Decimal { precision, scale }, Scalar::Decimal(unscaled)) => {
            write_message(out, number, |m| {
                write_len(m, 1, unscaled);
                write_int(m, 2, i64::from(*precision));
                write_int(m, 3, i64::from(*scale));
            });
        }
        (_, Scalar::Text(text)) => write_len(out, number, text.as_bytes()),
        (_, Scalar::Bytes(bytes)) => write_len(out, number, bytes),
        (_, _) => {
            write_tag(out, number, VARINT);
            write_packed_value(out, value);
        }
    }
}

fn write_wire_header(out: &mut Vec<u8>, id: i32) {
    out.push(0);
    out.extend_from_slice(&id.to_be_bytes());
    // The message-index array [0], which Confluent's format shortens to a
    // single zero.
    out.push(0);
}

fn write_source(out: &mut Vec<u8>, number: u32, source: &SourceBlock<'_>) {
    write_message(out, number, |m| {
        write_len(m, 1, VERSION.as_bytes());
        write_len(m, 2, CONNECTOR.as_bytes());
        write_len(m, 3, source.name.as_bytes());
        write_int(m, 4, source.ts_us.div_euclid(1000));
        write_int(m, 5, source.ts_us);
        write_len(m, 6, if source.snapshot { b"true" } else { b"false" });
        write_len(m, 7, source.database.as_bytes());
        if let Some(schema) = source.schema {
            write_len(m, 8, schema.as_bytes());
        }
        if let Some(table) = source.table {
            write_len(m, 9, table.as_bytes());
        }
        if let Some(xid) = source.xid {
            write_int(m, 10, i64::from(xid));
        }
        write_int(m, 11, source.lsn.0 as i64);
        if let Some(commit_lsn) = source.commit_lsn {
            write_int(m, 12, commit_lsn.0 as i64);
        }
    });
}

/// Encodes events as Protobuf and registers their schemas.
pub struct ProtobufEncoder {
    state: SchemaState<ProtobufSchemas>,
}

impl ProtobufEncoder {
    /// An encoder registering with the registry `registry`. (Events carry
    /// a `transaction` block when the emitter gives them one.)
    pub fn new(registry: &SchemaRegistryConfig, placeholder: &str) -> Result<Self, SinkError> {
        Ok(ProtobufEncoder {
            state: SchemaState::new(registry, SchemaType::Protobuf, placeholder, ProtobufSchemas)?,
        })
    }

    /// The fields of a row message of `fields` from `image`.
    fn write_row(
        &self,
        out: &mut Vec<u8>,
        fields: &[Field],
        relation: &Relation,
        image: &RowImage<'_>,
    ) -> Result<(), SinkError> {
        for field in fields {
            let number = field.number;
            match field_value(relation, field, image)? {
                FieldValue::Null => {}
                FieldValue::Placeholder => {
                    write_len(out, number, self.state.placeholder.as_bytes())
                }
                FieldValue::Scalar(scalar) => write_scalar(out, number, &field.ty, &scalar),
                FieldValue::Array(elements) => {
                    let ColumnType::Array(element) = &field.ty else {
                        continue;
                    };
                    let elements: Vec<Scalar<'_>> =
                        elements.into_iter().collect::<Option<_>>().ok_or_else(|| {
                            let column = &relation.columns[field.column];
                            SinkError::Encode {
                                table: table_name(relation),
                                reason: format!(
                                    "column {} ({}): an array with NULL elements has no Protobuf form (`repeated` cannot hold NULL); use format = \"avro\" or \"json\" for this table",
                                    column.name,
                                    column.type_display()
                                ),
                            }
                        })?;
                    if elements.is_empty() {
                    } else if packed(element) {
                        write_message(out, number, |m| {
                            elements.iter().for_each(|e| write_packed_value(m, e))
                        });
                    } else {
                        for e in &elements {
                            write_scalar(out, number, element, e);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The key of a row.
    pub async fn key(
        &mut self,
        topic: &str,
        relation: &Relation,
        keys: &KeyColumns,
        row: &Row,
    ) -> Result<Vec<u8>, SinkError> {
        let schemas = self.state.schemas(topic, relation, Some(keys)).await?;
        let mut out = Vec::with_capacity(32);
        write_wire_header(&mut out, schemas.key_id.unwrap_or_default());
        let image = RowImage {
            row: std::borrow::Cow::Borrowed(row),
            only_keys: false,
        };
        self.write_row(&mut out, &schemas.key_fields, relation, &image)?;
        Ok(out)
    }

    /// The value of a change event.
    pub async fn change(
        &mut self,
        topic: &str,
        event: &ChangeEvent<'_>,
    ) -> Result<Vec<u8>, SinkError> {
        let relation = event.relation;
        let schemas = self.state.schemas(topic, relation, None).await?;
        let mut out = Vec::with_capacity(256);
        write_wire_header(&mut out, schemas.envelope_id);
        for (number, image) in [(1, &event.before), (2, &event.after)] {
            if let Some(image) = image {
                let start = start_message(&mut out, number);
                self.write_row(&mut out, &schemas.value_fields, relation, image)?;
                end_message(&mut out, start);
            }
        }
        write_source(&mut out, 3, &event.source);
        write_len(&mut out, 4, event.op.code().as_bytes());
        let now = PgTimestamp::now().unix_micros();
        write_int(&mut out, 5, now.div_euclid(1000));
        write_int(&mut out, 6, now);
        if let Some(t) = &event.transaction {
            write_message(&mut out, 7, |m| {
                write_len(m, 1, t.id.as_bytes());
                write_int(m, 2, t.total_order as i64);
                write_int(m, 3, t.data_collection_order as i64);
            });
        }
        Ok(out)
    }

    /// The wire header of message `record`, the first of the fixed
    /// schema made of `messages` in the topic's package.
    async fn fixed(
        &mut self,
        topic: &str,
        is_key: bool,
        record: &'static str,
        messages: &[&str],
    ) -> Result<Vec<u8>, SinkError> {
        let id = self
            .state
            .fixed_id(topic, is_key, record, |package| {
                proto_file(package, [], messages)
            })
            .await?;
        let mut out = Vec::with_capacity(64);
        write_wire_header(&mut out, id);
        Ok(out)
    }

    /// The key of a transaction-metadata record.
    pub async fn transaction_key(
        &mut self,
        topic: &str,
        source: &str,
        id: &str,
    ) -> Result<Vec<u8>, SinkError> {
        let message = "message TransactionKey {\n  string source = 1;\n  string id = 2;\n}\n";
        let mut out = self
            .fixed(topic, true, "TransactionKey", &[message])
            .await?;
        write_len(&mut out, 1, source.as_bytes());
        write_len(&mut out, 2, id.as_bytes());
        Ok(out)
    }

    /// A transaction-metadata record.
    pub async fn transaction(
        &mut self,
        topic: &str,
        source: &str,
        record: &TransactionRecord<'_>,
    ) -> Result<Vec<u8>, SinkError> {
        let value = "message TransactionValue {
  string status = 1;
  string id = 2;
  string source = 3;
  optional int64 event_count = 4;
  repeated DataCollection data_collections = 5;
  int64 ts_ms = 6;
}
";
        let collection = "message DataCollection {
  string data_collection = 1;
  int64 event_count = 2;
}
";
        let mut out = self
            .fixed(topic, false, "TransactionValue", &[value, collection])
            .await?;
        let status = match record.status {
            TransactionStatus::Begin => "BEGIN",
            TransactionStatus::End => "END",
        };
        write_len(&mut out, 1, status.as_bytes());
        write_len(&mut out, 2, record.id.as_bytes());
        write_len(&mut out, 3, source.as_bytes());
        if let Some(count) = record.event_count {
            write_int(&mut out, 4, count as i64);
        }
        for (table, count) in record.data_collections.into_iter().flatten() {
            write_message(&mut out, 5, |m| {
                write_len(m, 1, table.as_bytes());
                write_int(m, 2, *count as i64);
            });
        }
        write_int(&mut out, 6, record.ts_ms);
        Ok(out)
    }

    /// The key of a logical decoding message.
    pub async fn message_key(&mut self, topic: &str, prefix: &str) -> Result<Vec<u8>, SinkError> {
        let message = "message MessageKey {\n  string prefix = 1;\n}\n";
        let mut out = self.fixed(topic, true, "MessageKey", &[message]).await?;
        write_len(&mut out, 1, prefix.as_bytes());
        Ok(out)
    }

    /// A sequence's key: its schema and name.
    pub async fn sequence_key(
        &mut self,
        topic: &str,
        sequence: &SequenceValue,
    ) -> Result<Vec<u8>, SinkError> {
        let message = "message SequenceKey {\n  string schema = 1;\n  string name = 2;\n}\n";
        let mut out = self.fixed(topic, true, "SequenceKey", &[message]).await?;
        write_len(&mut out, 1, sequence.schema.as_bytes());
        write_len(&mut out, 2, sequence.name.as_bytes());
        Ok(out)
    }

    /// A sequence's value event (`op = "q"`).
    pub async fn sequence(
        &mut self,
        topic: &str,
        source: &SourceBlock<'_>,
        sequence: &SequenceValue,
    ) -> Result<Vec<u8>, SinkError> {
        let inner = "message Sequence {\n  string schema = 1;\n  string name = 2;\n  int64 last_value = 3;\n}\n";
        self.side_event(
            topic,
            "SequenceValue",
            b"q",
            source,
            ("Sequence", "sequence", inner),
            |m| {
                write_len(m, 1, sequence.schema.as_bytes());
                write_len(m, 2, sequence.name.as_bytes());
                write_int(m, 3, sequence.last_value);
            },
        )
        .await
    }

    /// A logical decoding message event.
    pub async fn message(
        &mut self,
        topic: &str,
        source: &SourceBlock<'_>,
        message: &LogicalMessage,
    ) -> Result<Vec<u8>, SinkError> {
        let inner = "message Message {\n  string prefix = 1;\n  bytes content = 2;\n}\n";
        self.side_event(
            topic,
            "MessageValue",
            b"m",
            source,
            ("Message", "message", inner),
            |m| {
                write_len(m, 1, message.prefix.as_bytes());
                write_len(m, 2, &message.content);
            },
        )
        .await
    }

    /// An event beside the tables' change events (a message, a
    /// sequence), message `record`: `op`, the times, the source, and field
    /// `name` of the event's own message type (`inner`: its definition),
    /// written by `write_inner`.
    async fn side_event(
        &mut self,
        topic: &str,
        record: &'static str,
        op: &[u8],
        source: &SourceBlock<'_>,
        (inner_type, name, inner): (&str, &str, &str),
        write_inner: impl FnOnce(&mut Vec<u8>),
    ) -> Result<Vec<u8>, SinkError> {
        let value = format!(
            "message {record} {{\n  string op = 1;\n  int64 ts_ms = 2;\n  int64 ts_us = 3;\n  Source source = 4;\n  {inner_type} {name} = 5;\n}}\n"
        );
        let mut out = self
            .fixed(topic, false, record, &[&value, SOURCE_MESSAGE, inner])
            .await?;
        let now = PgTimestamp::now().unix_micros();
        write_len(&mut out, 1, op);
        write_int(&mut out, 2, now.div_euclid(1000));
        write_int(&mut out, 3, now);
        write_source(&mut out, 4, source);
        write_message(&mut out, 5, write_inner);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::collections::HashMap;

    use bytes::Bytes;
    use prost::Message as _;
    use prost_reflect::{DescriptorPool, DynamicMessage, ReflectMessage, Value};
    use walbridge_core::{Column, Datum, ValueKind};

    use super::*;
    use crate::encode::columns::fields;
    use crate::encode::fixtures::{array_of, column, registry, relation, source, text};
    use crate::registry::protobuf::descriptor_set;

    fn kinds() -> Relation {
        relation(vec![
            column("id", ValueKind::Int4, -1, true),
            column("price", ValueKind::Numeric, (10 << 16 | 2) + 4, false),
            column("at", ValueKind::TimestampTz, -1, false),
            column("day", ValueKind::Date, -1, false),
            column("doc", ValueKind::Text, -1, false),
            column("tags", array_of(ValueKind::Int8), -1, false),
            column("names", array_of(ValueKind::Text), -1, false),
            column("data-1", ValueKind::Bytea, -1, false),
            column("ratio", ValueKind::Float8, -1, false),
            column("gone", ValueKind::Int2, -1, false),
        ])
    }

    fn encoder() -> ProtobufEncoder {
        ProtobufEncoder::new(&registry(), "?").unwrap_or_else(|e| panic!("{e}"))
    }

    fn field(message: &DynamicMessage, name: &str) -> Option<Value> {
        let descriptor = message.descriptor().get_field_by_name(name)?;
        message
            .has_field(&descriptor)
            .then(|| message.get_field(&descriptor).into_owned())
    }

    /// What the encoder writes is what a protobuf implementation reads
    /// with the generated schema, compiled by a protobuf compiler.
    #[test]
    fn envelopes_decode_with_their_compiled_schema() {
        let relation = kinds();
        let mut value_fields = fields(&relation, 0..relation.columns.len());
        let schema =
            ProtobufSchemas.schema("src.public.t", Part::Envelope, &mut value_fields, None);
        assert_eq!(schema.name, "src.public.t.Envelope");
        let set = descriptor_set(&schema.text, &HashMap::new())
            .unwrap_or_else(|e| panic!("{e}\n{}", schema.text));
        let pool = DescriptorPool::from_file_descriptor_set(set).unwrap_or_else(|e| panic!("{e}"));
        let envelope = pool
            .get_message_by_name("src.public.t.Envelope")
            .unwrap_or_else(|| panic!("no Envelope in\n{}", schema.text));

        let encoder = encoder();
        let row = vec![
            text("-7"),
            text("-12.34"),
            text("2024-05-06 07:08:09.123456+00"),
            text("2024-05-06"),
            Datum::UnchangedToast,
            text("{1,-2,3}"),
            Datum::UnchangedToast,
            text("\\x00ff"),
            text("-Infinity"),
            Datum::Null,
        ];
        let image = RowImage {
            row: Cow::Borrowed(&row),
            only_keys: false,
        };
        let mut value = Vec::new();
        encoder
            .write_row(&mut value, &value_fields, &relation, &image)
            .unwrap_or_else(|e| panic!("{e}"));
        let source = source();
        let mut out = Vec::new();
        write_len(&mut out, 2, &value);
        write_source(&mut out, 3, &source);
        write_len(&mut out, 4, b"c");

        let decoded =
            DynamicMessage::decode(envelope, out.as_slice()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(field(&decoded, "before"), None);
        assert_eq!(field(&decoded, "op"), Some(Value::String("c".into())));
        let Some(Value::Message(source)) = field(&decoded, "source") else {
            panic!("no source: {decoded:?}")
        };
        assert_eq!(field(&source, "lsn"), Some(Value::I64(42)));
        assert_eq!(field(&source, "txId"), Some(Value::I64(9)));
        let Some(Value::Message(after)) = field(&decoded, "after") else {
            panic!("no after: {decoded:?}")
        };
        assert_eq!(field(&after, "id"), Some(Value::I32(-7)));
        let Some(Value::Message(price)) = field(&after, "price") else {
            panic!("price: {after:?}")
        };
        assert_eq!(
            field(&price, "value"),
            Some(Value::Bytes(Bytes::from_static(&[0xfb, 0x2e])))
        );
        assert_eq!(field(&price, "precision"), Some(Value::U32(10)));
        assert_eq!(field(&price, "scale"), Some(Value::I32(2)));
        let Some(Value::Message(at)) = field(&after, "at") else {
            panic!("at: {after:?}")
        };
        assert_eq!(field(&at, "seconds"), Some(Value::I64(1_714_979_289)));
        assert_eq!(field(&at, "nanos"), Some(Value::I32(123_456_000)));
        assert_eq!(field(&after, "day"), Some(Value::I32(19_849)));
        assert_eq!(field(&after, "doc"), Some(Value::String("?".into())));
        assert_eq!(
            field(&after, "tags"),
            Some(Value::List(vec![
                Value::I64(1),
                Value::I64(-2),
                Value::I64(3)
            ]))
        );
        assert_eq!(
            field(&after, "names"),
            Some(Value::List(vec![Value::String("?".into())]))
        );
        assert_eq!(
            field(&after, "data_1"),
            Some(Value::Bytes(Bytes::from_static(&[0, 255])))
        );
        assert_eq!(field(&after, "ratio"), Some(Value::F64(f64::NEG_INFINITY)));
        assert_eq!(field(&after, "gone"), None);
        // Every byte was a known field, written as protobuf writes it.
        assert_eq!(after.encode_to_vec(), value);
    }

    /// Lengths written in front of a nested body in place, including
    /// ones that take more than one byte.
    #[test]
    fn nested_messages_get_their_length_in_front() {
        let mut out = vec![];
        write_message(&mut out, 1, |m| write_len(m, 1, &[7u8; 300]));
        assert_eq!(out[..6], [0x0a, 0xaf, 0x02, 0x0a, 0xac, 0x02]);
        assert_eq!(out.len(), 306);
    }

    #[test]
    fn arrays_with_null_elements_are_refused_naming_the_column() {
        let relation = kinds();
        let value_fields = fields(&relation, 0..relation.columns.len());
        let mut row = vec![Datum::Null; relation.columns.len()];
        row[0] = text("1");
        row[5] = text("{1,NULL}");
        let image = RowImage {
            row: Cow::Borrowed(&row),
            only_keys: false,
        };
        let error = encoder()
            .write_row(&mut Vec::new(), &value_fields, &relation, &image)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            error.contains("public.t") && error.contains("tags") && error.contains("NULL"),
            "{error}"
        );
    }

    #[test]
    fn keys_and_fixed_schemas_compile() {
        let relation = kinds();
        let key = ProtobufSchemas.schema(
            "src.public.t",
            Part::Key,
            &mut fields(&relation, [0, 2].into_iter()),
            None,
        );
        let set = descriptor_set(&key.text, &HashMap::new()).unwrap_or_else(|e| panic!("{e}"));
        let main = set.file.last().unwrap_or_else(|| panic!("empty set"));
        assert_eq!(main.message_type[0].name(), "Key");
        assert_eq!(main.dependency, ["google/protobuf/timestamp.proto"]);
        let message = proto_file("a.b", [], &[SOURCE_MESSAGE]);
        assert!(descriptor_set(&message, &HashMap::new()).is_ok());
    }

    /// Field numbers survive versions: kept while name and encoding stay,
    /// never reused once given up.
    #[test]
    fn field_numbers_follow_the_previous_version() {
        let format = ProtobufSchemas;
        let version = |columns: Vec<Column>, previous: Option<&str>| {
            let relation = relation(columns);
            let mut fields = fields(&relation, 0..relation.columns.len());
            let schema = format.schema("src.public.t", Part::Envelope, &mut fields, previous);
            assert!(
                descriptor_set(&schema.text, &HashMap::new()).is_ok(),
                "{}",
                schema.text
            );
            let numbers: Vec<(String, u32)> =
                fields.into_iter().map(|f| (f.name, f.number)).collect();
            (schema.text, numbers)
        };
        let named = |pairs: &[(&str, u32)]| -> Vec<(String, u32)> {
            pairs.iter().map(|(n, i)| ((*n).to_owned(), *i)).collect()
        };
        let (v1, numbers) = version(
            vec![
                column("id", ValueKind::Int4, -1, true),
                column("a", ValueKind::Int4, -1, false),
                column("b", ValueKind::Text, -1, false),
                column("c", ValueKind::Int4, -1, false),
            ],
            None,
        );
        assert_eq!(numbers, named(&[("id", 1), ("a", 2), ("b", 3), ("c", 4)]));
        // `a` dropped, `c` now int8, `d` added.
        let (v2, numbers) = version(
            vec![
                column("id", ValueKind::Int4, -1, true),
                column("b", ValueKind::Text, -1, false),
                column("c", ValueKind::Int8, -1, false),
                column("d", array_of(ValueKind::Text), -1, false),
            ],
            Some(&v1),
        );
        assert_eq!(numbers, named(&[("id", 1), ("b", 3), ("c", 5), ("d", 6)]));
        assert!(v2.contains("reserved 2, 4;"), "{v2}");
        // `a` again: a new number; the reserved ones stay reserved.
        let (v3, numbers) = version(
            vec![
                column("a", ValueKind::Int4, -1, false),
                column("id", ValueKind::Int4, -1, true),
                column("b", ValueKind::Text, -1, false),
                column("c", ValueKind::Int8, -1, false),
                column("d", array_of(ValueKind::Text), -1, false),
            ],
            Some(&v2),
        );
        assert_eq!(
            numbers,
            named(&[("a", 7), ("id", 1), ("b", 3), ("c", 5), ("d", 6)])
        );
        assert!(v3.contains("reserved 2, 4;"), "{v3}");
    }

    /// Decodes `bytes` (Confluent framing, message index [0]) with the
    /// schema the embedded registry at `store` holds for their id.
    fn decode_registered(store: &std::path::Path, bytes: &[u8], message: &str) -> DynamicMessage {
        assert_eq!((bytes[0], bytes[5]), (0, 0), "magic byte and message index");
        let id = i32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
        let store = crate::registry::store::Store::open(store).unwrap_or_else(|e| panic!("{e}"));
        let schema = store
            .schema(id)
            .unwrap_or_else(|| panic!("schema {id} not registered"));
        let set = descriptor_set(&schema.schema, &HashMap::new()).unwrap_or_else(|e| panic!("{e}"));
        let pool = DescriptorPool::from_file_descriptor_set(set).unwrap_or_else(|e| panic!("{e}"));
        let descriptor = pool
            .get_message_by_name(message)
            .unwrap_or_else(|| panic!("no {message} in\n{}", schema.schema));
        DynamicMessage::decode(descriptor, &bytes[6..]).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Transaction-metadata records and logical messages: registered with
    /// the embedded registry, decoded with what it holds.
    #[tokio::test]
    async fn fixed_records_register_and_decode() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("registry.json");
        let router = crate::registry::server::router(&path).unwrap_or_else(|e| panic!("{e}"));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut config = registry();
        config.url = format!(
            "http://{}",
            listener.local_addr().unwrap_or_else(|e| panic!("{e}"))
        );
        tokio::spawn(crate::registry::server::serve(listener, router));
        let mut encoder = ProtobufEncoder::new(&config, "?").unwrap_or_else(|e| panic!("{e}"));

        let counts = std::collections::BTreeMap::from([("public.t".to_owned(), 3_u64)]);
        let end = TransactionRecord {
            status: TransactionStatus::End,
            id: "9:50",
            event_count: Some(3),
            data_collections: Some(&counts),
            ts_ms: 1_000,
        };
        let bytes = encoder
            .transaction("src.transactions", "src", &end)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let record = decode_registered(&path, &bytes, "src.transactions.TransactionValue");
        assert_eq!(field(&record, "status"), Some(Value::String("END".into())));
        assert_eq!(field(&record, "event_count"), Some(Value::I64(3)));
        let Some(Value::List(collections)) = field(&record, "data_collections") else {
            panic!("{record:?}")
        };
        let Value::Message(collection) = &collections[0] else {
            panic!("{collections:?}")
        };
        assert_eq!(
            field(collection, "data_collection"),
            Some(Value::String("public.t".into()))
        );
        let key = encoder
            .transaction_key("src.transactions", "src", "9:50")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let key = decode_registered(&path, &key, "src.transactions.TransactionKey");
        assert_eq!(field(&key, "id"), Some(Value::String("9:50".into())));

        let message = LogicalMessage {
            lsn: walbridge_core::Lsn(42),
            transactional: false,
            prefix: "audit".into(),
            content: Bytes::from_static(b"\x00hello"),
        };
        let bytes = encoder
            .message("src.messages", &source(), &message)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let event = decode_registered(&path, &bytes, "src.messages.MessageValue");
        assert_eq!(field(&event, "op"), Some(Value::String("m".into())));
        let Some(Value::Message(body)) = field(&event, "message") else {
            panic!("{event:?}")
        };
        assert_eq!(
            field(&body, "content"),
            Some(Value::Bytes(Bytes::from_static(b"\x00hello")))
        );
        let Some(Value::Message(block)) = field(&event, "source") else {
            panic!("{event:?}")
        };
        assert_eq!(field(&block, "commit_lsn"), Some(Value::I64(50)));
    }
}
