//! `format = "avro"`: Debezium's envelope in Avro, in the Confluent wire
//! format (magic byte 0, the schema's registry id as 4 bytes big-endian,
//! then the Avro binary encoding).
//!
//! Per topic, the schemas `<topic>.Key` and `<topic>.Envelope` (whose
//! `before` and `after` are `<topic>.Value`) are derived from the table's
//! relation descriptor and registered under `<topic>-key` / `<topic>-value`
//! (or as the subject name strategy says); a new descriptor (a column
//! added on the publisher) registers a new version. Column types:
//!
//! | PostgreSQL | Avro |
//! |---|---|
//! | `int2`, `int4` | `int` |
//! | `int8`, `oid` | `long` |
//! | `float4` / `float8` | `float` / `double` |
//! | `numeric(p,s)` | `bytes`, logical type `decimal` (precision p, scale s) |
//! | `numeric` without a precision | `string` (its exact text: any scale, `NaN`, `Infinity`) |
//! | `bool` | `boolean` |
//! | `bytea` | `bytes` |
//! | `date` | `int`, `date` |
//! | `time` | `long`, `time-micros` |
//! | `timestamp` | `long`, `local-timestamp-micros` |
//! | `timestamptz` | `long`, `timestamp-micros` |
//! | `uuid` | `string`, `uuid` |
//! | arrays | `array` of nullable elements |
//! | text types, `json`/`jsonb`, enums, anything else | `string` (the text form) |
//!
//! Columns of the replica identity are required, all others `["null", T]`
//! with default null. Dates and timestamps at ±infinity become the
//! smallest/largest value of the type. An unchanged TOASTed value is the
//! placeholder for string and bytes columns (an array of it for arrays of
//! strings) and null otherwise.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Value, json};
use walbridge_core::json::{bytea_from_text, datum_to_json};
use walbridge_core::{
    Column, Datum, LogicalMessage, PgTimestamp, Relation, ReplicaIdentity, Row, ValueKind,
};

use super::json::{CONNECTOR, VERSION};
use super::temporal;
use crate::config::{SchemaRegistryConfig, SubjectNameStrategy};
use crate::error::SinkError;
use crate::event::{
    ChangeEvent, KeyColumns, RowImage, SourceBlock, TransactionRecord, TransactionStatus,
    table_name,
};
use crate::registry::SchemaType;
use crate::registry::client::RegistryClient;

/// The Avro type of a column.
#[derive(Clone, Debug, PartialEq, Eq)]
enum AvroType {
    Int,
    Long,
    Float,
    Double,
    Boolean,
    String,
    Bytes,
    Decimal { precision: u32, scale: u32 },
    Date,
    TimeMicros,
    LocalTimestampMicros,
    TimestampMicros,
    Uuid,
    Array(Box<AvroType>),
}

impl AvroType {
    fn of(kind: &ValueKind, type_modifier: i32) -> AvroType {
        match kind {
            ValueKind::Int2 | ValueKind::Int4 => AvroType::Int,
            ValueKind::Int8 | ValueKind::Oid => AvroType::Long,
            ValueKind::Float4 => AvroType::Float,
            ValueKind::Float8 => AvroType::Double,
            ValueKind::Bool => AvroType::Boolean,
            ValueKind::Bytea => AvroType::Bytes,
            ValueKind::Numeric if type_modifier >= 4 => {
                let m = (type_modifier - 4) as u32;
                let (precision, scale) = ((m >> 16) & 0xffff, m & 0xffff);
                // PostgreSQL 15 allows negative scales and scales above the
                // precision, which Avro's decimal cannot describe.
                if scale <= precision && scale < 0x8000 {
                    AvroType::Decimal { precision, scale }
                } else {
                    AvroType::String
                }
            }
            ValueKind::Date => AvroType::Date,
            ValueKind::Time => AvroType::TimeMicros,
            ValueKind::Timestamp => AvroType::LocalTimestampMicros,
            ValueKind::TimestampTz => AvroType::TimestampMicros,
            ValueKind::Uuid => AvroType::Uuid,
            ValueKind::Array { element, .. } => {
                AvroType::Array(Box::new(AvroType::of(element, -1)))
            }
            ValueKind::Numeric
            | ValueKind::Text
            | ValueKind::TimeTz
            | ValueKind::Interval
            | ValueKind::Json
            | ValueKind::Jsonb
            | ValueKind::Enum
            | ValueKind::Composite
            | ValueKind::Range
            | ValueKind::Other => AvroType::String,
        }
    }

    fn schema(&self) -> Value {
        match self {
            AvroType::Int => json!("int"),
            AvroType::Long => json!("long"),
            AvroType::Float => json!("float"),
            AvroType::Double => json!("double"),
            AvroType::Boolean => json!("boolean"),
            AvroType::String => json!("string"),
            AvroType::Bytes => json!("bytes"),
            AvroType::Decimal { precision, scale } => {
                json!({"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale})
            }
            AvroType::Date => json!({"type": "int", "logicalType": "date"}),
            AvroType::TimeMicros => json!({"type": "long", "logicalType": "time-micros"}),
            AvroType::LocalTimestampMicros => {
                json!({"type": "long", "logicalType": "local-timestamp-micros"})
            }
            AvroType::TimestampMicros => json!({"type": "long", "logicalType": "timestamp-micros"}),
            AvroType::Uuid => json!({"type": "string", "logicalType": "uuid"}),
            AvroType::Array(element) => {
                json!({"type": "array", "items": ["null", element.schema()]})
            }
        }
    }
}

/// One column as a record field.
#[derive(Clone, Debug)]
struct Field {
    column: usize,
    name: String,
    ty: AvroType,
    nullable: bool,
}

/// A topic's schemas for one relation descriptor, with their ids.
struct TopicSchemas {
    relation: Relation,
    keys: Option<Vec<usize>>,
    value_fields: Vec<Field>,
    key_fields: Vec<Field>,
    key_id: Option<i32>,
    envelope_id: i32,
}

/// Encodes events as Avro and registers their schemas.
pub struct AvroEncoder {
    registry: RegistryClient,
    strategy: SubjectNameStrategy,
    placeholder: String,
    with_transaction: bool,
    topics: HashMap<String, Arc<TopicSchemas>>,
}

/// A valid Avro name made of `text`: letters, digits and `_`, not
/// starting with a digit.
fn avro_name(text: &str) -> String {
    let mut name: String = text
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if !name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
        name.insert(0, '_');
    }
    name
}

/// The namespace of a topic's records: its dot-separated parts as names.
fn namespace(topic: &str) -> String {
    topic
        .split('.')
        .map(avro_name)
        .collect::<Vec<_>>()
        .join(".")
}

/// Columns of a primary key or identity index are never null (with FULL
/// identity every column is flagged, NULLs included).
fn never_null(relation: &Relation, column: &Column) -> bool {
    column.is_key
        && matches!(
            relation.replica_identity,
            ReplicaIdentity::Default | ReplicaIdentity::Index
        )
}

fn fields(relation: &Relation, indexes: impl Iterator<Item = usize>) -> Vec<Field> {
    let mut used = std::collections::HashSet::new();
    indexes
        .filter_map(|i| relation.columns.get(i).map(|c| (i, c)))
        .map(|(i, column)| {
            let base = avro_name(&column.name);
            let mut name = base.clone();
            let mut n = 2;
            while !used.insert(name.clone()) {
                name = format!("{base}_{n}");
                n += 1;
            }
            Field {
                column: i,
                name,
                ty: AvroType::of(&column.kind, column.type_modifier),
                nullable: !never_null(relation, column),
            }
        })
        .collect()
}

fn record_schema(name: &str, namespace: &str, fields: &[Field]) -> Value {
    let fields: Vec<Value> = fields
        .iter()
        .map(|f| {
            if f.nullable {
                json!({"name": f.name, "type": ["null", f.ty.schema()], "default": null})
            } else {
                json!({"name": f.name, "type": f.ty.schema()})
            }
        })
        .collect();
    json!({"type": "record", "name": name, "namespace": namespace, "fields": fields})
}

fn source_schema() -> Value {
    let optional =
        |name: &str, ty: &str| json!({"name": name, "type": ["null", ty], "default": null});
    json!({
        "type": "record",
        "name": "Source",
        "namespace": "io.debezium.connector.postgresql",
        "fields": [
            {"name": "version", "type": "string"},
            {"name": "connector", "type": "string"},
            {"name": "name", "type": "string"},
            {"name": "ts_ms", "type": "long"},
            {"name": "ts_us", "type": "long"},
            optional("snapshot", "string"),
            {"name": "db", "type": "string"},
            optional("schema", "string"),
            optional("table", "string"),
            optional("txId", "long"),
            optional("lsn", "long"),
            optional("commit_lsn", "long"),
        ],
    })
}

fn envelope_schema(namespace: &str, value: Value, with_transaction: bool) -> Value {
    let mut fields = vec![
        json!({"name": "before", "type": ["null", value], "default": null}),
        json!({"name": "after", "type": ["null", format!("{namespace}.Value")], "default": null}),
        json!({"name": "source", "type": source_schema()}),
        json!({"name": "op", "type": "string"}),
        json!({"name": "ts_ms", "type": ["null", "long"], "default": null}),
        json!({"name": "ts_us", "type": ["null", "long"], "default": null}),
    ];
    if with_transaction {
        fields.push(json!({"name": "transaction", "type": ["null", {
            "type": "record",
            "name": "block",
            "namespace": "event",
            "fields": [
                {"name": "id", "type": "string"},
                {"name": "total_order", "type": "long"},
                {"name": "data_collection_order", "type": "long"},
            ],
        }], "default": null}));
    }
    json!({"type": "record", "name": "Envelope", "namespace": namespace, "fields": fields})
}

// The binary encoding.

fn write_long(out: &mut Vec<u8>, value: i64) {
    let mut z = ((value << 1) ^ (value >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

fn write_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    write_long(out, bytes.len() as i64);
    out.extend_from_slice(bytes);
}

fn write_optional_long(out: &mut Vec<u8>, value: Option<i64>) {
    match value {
        Some(v) => {
            write_long(out, 1);
            write_long(out, v);
        }
        None => write_long(out, 0),
    }
}

fn write_optional_string(out: &mut Vec<u8>, value: Option<&str>) {
    match value {
        Some(v) => {
            write_long(out, 1);
            write_bytes(out, v.as_bytes());
        }
        None => write_long(out, 0),
    }
}

fn wire_header(out: &mut Vec<u8>, id: i32) {
    out.push(0);
    out.extend_from_slice(&id.to_be_bytes());
}

/// The unscaled value of decimal `text` at `scale` as big-endian two's
/// complement, or `None` when it is not a finite decimal of that scale.
fn decimal_bytes(text: &str, scale: u32) -> Option<Vec<u8>> {
    let (negative, body) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let (integer, fraction) = body.split_once('.').unwrap_or((body, ""));
    let scale = scale as usize;
    if integer.is_empty() && fraction.is_empty()
        || !integer
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
        || fraction.len() > scale && fraction[scale..].bytes().any(|b| b != b'0')
    {
        return None;
    }
    // Base-256 magnitude, least significant byte first.
    let mut magnitude: Vec<u8> = Vec::new();
    let digits = integer
        .bytes()
        .chain(fraction.bytes().chain(std::iter::repeat(b'0')).take(scale));
    for digit in digits {
        let mut carry = u32::from(digit - b'0');
        for byte in &mut magnitude {
            let v = u32::from(*byte) * 10 + carry;
            *byte = v as u8;
            carry = v >> 8;
        }
        while carry > 0 {
            magnitude.push(carry as u8);
            carry >>= 8;
        }
    }
    if negative {
        // Two's complement: invert and add one.
        let mut carry = 1u16;
        for byte in &mut magnitude {
            let v = u16::from(!*byte) + carry;
            *byte = v as u8;
            carry = v >> 8;
        }
        if magnitude.last().is_none_or(|b| b & 0x80 == 0) {
            magnitude.push(0xff);
        }
    } else if magnitude.last().is_none_or(|b| b & 0x80 != 0) {
        magnitude.push(0);
    }
    magnitude.reverse();
    Some(magnitude)
}

/// A scalar's text: PostgreSQL's text output, or for a binary value the
/// text of its JSON conversion.
fn scalar_text<'a>(datum: &'a Datum, kind: &ValueKind) -> Result<Cow<'a, str>, String> {
    match datum {
        Datum::Text(bytes) => std::str::from_utf8(bytes)
            .map(Cow::Borrowed)
            .map_err(|e| format!("not UTF-8: {e}")),
        other => Ok(match datum_to_json(other, kind, &Value::Null) {
            Value::String(s) => Cow::Owned(s),
            v => Cow::Owned(v.to_string()),
        }),
    }
}

fn float_value(text: &str) -> Option<f64> {
    match text {
        "NaN" => Some(f64::NAN),
        "Infinity" => Some(f64::INFINITY),
        "-Infinity" => Some(f64::NEG_INFINITY),
        _ => text.parse().ok(),
    }
}

/// Writes a non-null scalar of `ty` from its text.
fn write_scalar(out: &mut Vec<u8>, ty: &AvroType, text: &str) -> Result<(), String> {
    let bad = || format!("`{text}` is not a valid {ty:?} value");
    match ty {
        AvroType::Int => write_long(out, i64::from(text.parse::<i32>().map_err(|_| bad())?)),
        AvroType::Long => write_long(out, text.parse::<i64>().map_err(|_| bad())?),
        AvroType::Float => {
            let v = float_value(text).ok_or_else(bad)? as f32;
            out.extend_from_slice(&v.to_le_bytes());
        }
        AvroType::Double => {
            out.extend_from_slice(&float_value(text).ok_or_else(bad)?.to_le_bytes())
        }
        AvroType::Boolean => out.push(match text {
            "t" | "true" => 1,
            "f" | "false" => 0,
            _ => return Err(bad()),
        }),
        AvroType::String | AvroType::Uuid => write_bytes(out, text.as_bytes()),
        AvroType::Bytes => write_bytes(out, &bytea_from_text(text).ok_or_else(bad)?),
        AvroType::Decimal { scale, .. } => {
            write_bytes(out, &decimal_bytes(text, *scale).ok_or_else(bad)?)
        }
        AvroType::Date => write_long(out, i64::from(temporal::date_days(text).ok_or_else(bad)?)),
        AvroType::TimeMicros => write_long(out, temporal::time_micros(text).ok_or_else(bad)?),
        AvroType::LocalTimestampMicros => write_long(
            out,
            temporal::timestamp_micros(text, false).ok_or_else(bad)?,
        ),
        AvroType::TimestampMicros => {
            write_long(out, temporal::timestamp_micros(text, true).ok_or_else(bad)?)
        }
        AvroType::Array(_) => return Err(bad()),
    }
    Ok(())
}

/// Writes a JSON array (an array column converted by
/// [`walbridge_core::json`]) as an Avro array of nullable elements.
fn write_array(out: &mut Vec<u8>, element: &AvroType, items: &[Value]) -> Result<(), String> {
    if !items.is_empty() {
        write_long(out, items.len() as i64);
        for item in items {
            match item {
                Value::Null => write_long(out, 0),
                Value::Array(_) => {
                    return Err(
                        "multidimensional arrays have no Avro mapping here (use format = \"json\")"
                            .to_owned(),
                    );
                }
                Value::String(s) => {
                    write_long(out, 1);
                    match element {
                        // The JSON conversion gives bytea elements as base64.
                        AvroType::Bytes => {
                            use base64::Engine as _;
                            let raw = base64::engine::general_purpose::STANDARD
                                .decode(s)
                                .map_err(|e| format!("bytea element: {e}"))?;
                            write_bytes(out, &raw);
                        }
                        other => write_scalar(out, other, s)?,
                    }
                }
                other => {
                    write_long(out, 1);
                    write_scalar(out, element, &other.to_string())?;
                }
            }
        }
    }
    write_long(out, 0);
    Ok(())
}

impl AvroEncoder {
    /// An encoder registering with the registry `registry`.
    pub fn new(
        registry: &SchemaRegistryConfig,
        placeholder: &str,
        with_transaction: bool,
    ) -> Result<Self, SinkError> {
        Ok(AvroEncoder {
            registry: RegistryClient::new(registry)?,
            strategy: registry.subject_name_strategy,
            placeholder: placeholder.to_owned(),
            with_transaction,
            topics: HashMap::new(),
        })
    }

    fn subject(&self, topic: &str, is_key: bool, record_name: &str) -> String {
        match self.strategy {
            SubjectNameStrategy::Topic => {
                format!("{topic}-{}", if is_key { "key" } else { "value" })
            }
            SubjectNameStrategy::Record => record_name.to_owned(),
            SubjectNameStrategy::TopicRecord => format!("{topic}-{record_name}"),
        }
    }

    async fn register(
        &mut self,
        topic: &str,
        is_key: bool,
        schema: &Value,
    ) -> Result<i32, SinkError> {
        let record_name = format!(
            "{}.{}",
            schema["namespace"].as_str().unwrap_or_default(),
            schema["name"].as_str().unwrap_or_default()
        );
        let subject = self.subject(topic, is_key, &record_name);
        Ok(self
            .registry
            .register(&subject, &schema.to_string(), SchemaType::Avro)
            .await?)
    }

    /// The schemas of `topic` for `relation`, registered the first time.
    async fn schemas(
        &mut self,
        topic: &str,
        relation: &Relation,
        keys: Option<&KeyColumns>,
    ) -> Result<Arc<TopicSchemas>, SinkError> {
        if let Some(cached) = self.topics.get(topic)
            && cached.relation == *relation
            && (keys.is_none() || cached.keys.as_ref() == keys.map(|k| &k.0))
        {
            return Ok(cached.clone());
        }
        let namespace = namespace(topic);
        let value_fields = fields(relation, 0..relation.columns.len());
        let value = record_schema("Value", &namespace, &value_fields);
        let envelope = envelope_schema(&namespace, value, self.with_transaction);
        let envelope_id = self.register(topic, false, &envelope).await?;
        let key_indexes = keys
            .map(|k| k.0.clone())
            .or_else(|| self.topics.get(topic).and_then(|c| c.keys.clone()));
        let key_fields = key_indexes
            .as_ref()
            .map(|k| fields(relation, k.iter().copied()))
            .unwrap_or_default();
        let key_id = match &key_indexes {
            Some(_) => {
                let schema = record_schema("Key", &namespace, &key_fields);
                Some(self.register(topic, true, &schema).await?)
            }
            None => None,
        };
        let made = Arc::new(TopicSchemas {
            relation: relation.clone(),
            keys: key_indexes,
            value_fields,
            key_fields,
            key_id,
            envelope_id,
        });
        self.topics.insert(topic.to_owned(), made.clone());
        Ok(made)
    }

    /// Writes one field's value from `row`.
    fn write_field(
        &self,
        out: &mut Vec<u8>,
        field: &Field,
        relation: &Relation,
        datum: Option<&Datum>,
    ) -> Result<(), SinkError> {
        let column = &relation.columns[field.column];
        let fail = |reason: String| SinkError::Encode {
            table: table_name(relation),
            reason: format!(
                "column {} ({}): {reason}",
                column.name,
                column.type_display()
            ),
        };
        let present = match datum {
            None | Some(Datum::Null) => None,
            Some(Datum::UnchangedToast) => match &field.ty {
                AvroType::String | AvroType::Bytes => {
                    Some(Cow::Borrowed(self.placeholder.as_str()))
                }
                AvroType::Array(element) if **element == AvroType::String => {
                    if field.nullable {
                        write_long(out, 1);
                    }
                    write_long(out, 1);
                    write_long(out, 1);
                    write_bytes(out, self.placeholder.as_bytes());
                    write_long(out, 0);
                    return Ok(());
                }
                _ => None,
            },
            Some(datum) => Some(match (&field.ty, datum) {
                (AvroType::Bytes, Datum::Binary(raw)) => {
                    if field.nullable {
                        write_long(out, 1);
                    }
                    write_bytes(out, raw);
                    return Ok(());
                }
                (AvroType::Array(element), datum) => {
                    let Value::Array(items) = datum_to_json(datum, &column.kind, &Value::Null)
                    else {
                        return Err(fail("not an array".into()));
                    };
                    if field.nullable {
                        write_long(out, 1);
                    }
                    return write_array(out, element, &items).map_err(fail);
                }
                (_, datum) => scalar_text(datum, &column.kind).map_err(fail)?,
            }),
        };
        match present {
            None if field.nullable => write_long(out, 0),
            None => return Err(fail("NULL in a column of the identity".into())),
            Some(text) => {
                if field.nullable {
                    write_long(out, 1);
                }
                if let (AvroType::Bytes, Some(Datum::UnchangedToast)) = (&field.ty, datum) {
                    write_bytes(out, text.as_bytes());
                } else {
                    write_scalar(out, &field.ty, &text).map_err(fail)?;
                }
            }
        }
        Ok(())
    }

    fn write_record(
        &self,
        out: &mut Vec<u8>,
        fields: &[Field],
        relation: &Relation,
        image: &RowImage<'_>,
    ) -> Result<(), SinkError> {
        for field in fields {
            let column_is_key = relation.columns.get(field.column).is_some_and(|c| c.is_key);
            let datum = if image.only_keys && !column_is_key {
                None
            } else {
                image.row.get(field.column)
            };
            self.write_field(out, field, relation, datum)?;
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
        let schemas = self.schemas(topic, relation, Some(keys)).await?;
        let mut out = Vec::with_capacity(32);
        wire_header(&mut out, schemas.key_id.unwrap_or_default());
        let image = RowImage {
            row: Cow::Borrowed(row),
            only_keys: false,
        };
        self.write_record(&mut out, &schemas.key_fields, relation, &image)?;
        Ok(out)
    }

    /// The value of a change event.
    pub async fn change(
        &mut self,
        topic: &str,
        event: &ChangeEvent<'_>,
    ) -> Result<Vec<u8>, SinkError> {
        let relation = event.relation;
        let schemas = self.schemas(topic, relation, None).await?;
        let mut out = Vec::with_capacity(256);
        wire_header(&mut out, schemas.envelope_id);
        for image in [&event.before, &event.after] {
            match image {
                Some(image) => {
                    write_long(&mut out, 1);
                    self.write_record(&mut out, &schemas.value_fields, relation, image)?;
                }
                None => write_long(&mut out, 0),
            }
        }
        write_source(&mut out, &event.source);
        write_bytes(&mut out, event.op.code().as_bytes());
        let now = PgTimestamp::now().unix_micros();
        write_optional_long(&mut out, Some(now.div_euclid(1000)));
        write_optional_long(&mut out, Some(now));
        if self.with_transaction {
            match &event.transaction {
                Some(t) => {
                    write_long(&mut out, 1);
                    write_bytes(&mut out, t.id.as_bytes());
                    write_long(&mut out, t.total_order as i64);
                    write_long(&mut out, t.data_collection_order as i64);
                }
                None => write_long(&mut out, 0),
            }
        }
        Ok(out)
    }

    async fn fixed(
        &mut self,
        topic: &str,
        is_key: bool,
        schema: Value,
    ) -> Result<Vec<u8>, SinkError> {
        let id = self.register(topic, is_key, &schema).await?;
        let mut out = Vec::with_capacity(64);
        wire_header(&mut out, id);
        Ok(out)
    }

    /// The key of a transaction-metadata record.
    pub async fn transaction_key(
        &mut self,
        topic: &str,
        source: &str,
        id: &str,
    ) -> Result<Vec<u8>, SinkError> {
        let schema = json!({"type": "record", "name": "TransactionKey", "namespace": namespace(topic), "fields": [
            {"name": "source", "type": "string"}, {"name": "id", "type": "string"}]});
        let mut out = self.fixed(topic, true, schema).await?;
        write_bytes(&mut out, source.as_bytes());
        write_bytes(&mut out, id.as_bytes());
        Ok(out)
    }

    /// A transaction-metadata record.
    pub async fn transaction(
        &mut self,
        topic: &str,
        source: &str,
        record: &TransactionRecord<'_>,
    ) -> Result<Vec<u8>, SinkError> {
        let schema = json!({"type": "record", "name": "TransactionValue", "namespace": namespace(topic), "fields": [
            {"name": "status", "type": "string"},
            {"name": "id", "type": "string"},
            {"name": "source", "type": "string"},
            {"name": "event_count", "type": ["null", "long"], "default": null},
            {"name": "data_collections", "type": ["null", {"type": "array", "items": {
                "type": "record", "name": "DataCollection", "fields": [
                    {"name": "data_collection", "type": "string"},
                    {"name": "event_count", "type": "long"}]}}], "default": null},
            {"name": "ts_ms", "type": "long"}]});
        let mut out = self.fixed(topic, false, schema).await?;
        let status = match record.status {
            TransactionStatus::Begin => "BEGIN",
            TransactionStatus::End => "END",
        };
        write_bytes(&mut out, status.as_bytes());
        write_bytes(&mut out, record.id.as_bytes());
        write_bytes(&mut out, source.as_bytes());
        write_optional_long(&mut out, record.event_count.map(|c| c as i64));
        match record.data_collections {
            Some(per_table) => {
                write_long(&mut out, 1);
                if !per_table.is_empty() {
                    write_long(&mut out, per_table.len() as i64);
                    for (table, count) in per_table {
                        write_bytes(&mut out, table.as_bytes());
                        write_long(&mut out, *count as i64);
                    }
                }
                write_long(&mut out, 0);
            }
            None => write_long(&mut out, 0),
        }
        write_long(&mut out, record.ts_ms);
        Ok(out)
    }

    /// The key of a logical decoding message.
    pub async fn message_key(&mut self, topic: &str, prefix: &str) -> Result<Vec<u8>, SinkError> {
        let schema = json!({"type": "record", "name": "MessageKey", "namespace": namespace(topic),
            "fields": [{"name": "prefix", "type": "string"}]});
        let mut out = self.fixed(topic, true, schema).await?;
        write_bytes(&mut out, prefix.as_bytes());
        Ok(out)
    }

    /// A logical decoding message event.
    pub async fn message(
        &mut self,
        topic: &str,
        source: &SourceBlock<'_>,
        message: &LogicalMessage,
    ) -> Result<Vec<u8>, SinkError> {
        let schema = json!({"type": "record", "name": "MessageValue", "namespace": namespace(topic), "fields": [
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": "long"},
            {"name": "ts_us", "type": "long"},
            {"name": "source", "type": source_schema()},
            {"name": "message", "type": {"type": "record", "name": "Message",
                "namespace": "io.debezium.connector.postgresql", "fields": [
                {"name": "prefix", "type": "string"}, {"name": "content", "type": "bytes"}]}}]});
        let mut out = self.fixed(topic, false, schema).await?;
        let now = PgTimestamp::now().unix_micros();
        write_bytes(&mut out, b"m");
        write_long(&mut out, now.div_euclid(1000));
        write_long(&mut out, now);
        write_source(&mut out, source);
        write_bytes(&mut out, message.prefix.as_bytes());
        write_bytes(&mut out, &message.content);
        Ok(out)
    }
}

fn write_source(out: &mut Vec<u8>, source: &SourceBlock<'_>) {
    write_bytes(out, VERSION.as_bytes());
    write_bytes(out, CONNECTOR.as_bytes());
    write_bytes(out, source.name.as_bytes());
    write_long(out, source.ts_us.div_euclid(1000));
    write_long(out, source.ts_us);
    write_optional_string(out, Some(if source.snapshot { "true" } else { "false" }));
    write_bytes(out, source.database.as_bytes());
    write_optional_string(out, source.schema);
    write_optional_string(out, source.table);
    write_optional_long(out, source.xid.map(i64::from));
    write_optional_long(out, Some(source.lsn.0 as i64));
    write_optional_long(out, source.commit_lsn.map(|l| l.0 as i64));
}

#[cfg(test)]
mod tests {
    use apache_avro::Schema;
    use apache_avro::types::Value as Avro;
    use bytes::Bytes;
    use walbridge_core::Lsn;

    use super::*;
    use crate::event::Op;

    fn column(name: &str, kind: ValueKind, type_modifier: i32, is_key: bool) -> Column {
        Column {
            name: name.into(),
            type_oid: 0,
            type_modifier,
            type_name: String::new(),
            kind,
            is_key,
        }
    }

    fn text(s: &str) -> Datum {
        Datum::Text(Bytes::copy_from_slice(s.as_bytes()))
    }

    #[test]
    fn decimals_are_twos_complement_unscaled() {
        assert_eq!(decimal_bytes("1.50", 2), Some(vec![0x00, 0x96]));
        assert_eq!(decimal_bytes("-1.50", 2), Some(vec![0xff, 0x6a]));
        assert_eq!(decimal_bytes("0", 2), Some(vec![0x00]));
        assert_eq!(decimal_bytes("-128", 0), Some(vec![0x80]));
        assert_eq!(decimal_bytes("128", 0), Some(vec![0x00, 0x80]));
        assert_eq!(decimal_bytes("1.5", 0), None);
        assert_eq!(decimal_bytes("NaN", 2), None);
    }

    /// What the encoder writes is what apache-avro reads with the
    /// generated schema.
    #[test]
    fn envelopes_decode_with_their_schema() {
        let relation = Relation {
            id: 1,
            schema: "public".into(),
            name: "t".into(),
            replica_identity: ReplicaIdentity::Default,
            columns: vec![
                column("id", ValueKind::Int4, -1, true),
                column("price", ValueKind::Numeric, (10 << 16 | 2) + 4, false),
                column("at", ValueKind::TimestampTz, -1, false),
                column("day", ValueKind::Date, -1, false),
                column("doc", ValueKind::Text, -1, false),
                column(
                    "tags",
                    ValueKind::Array {
                        element: Box::new(ValueKind::Int8),
                        delimiter: b',',
                    },
                    -1,
                    false,
                ),
                column("data-1", ValueKind::Bytea, -1, false),
            ],
            partition_root: None,
        };
        let namespace = namespace("src.public.t");
        let value_fields = fields(&relation, 0..relation.columns.len());
        let envelope = envelope_schema(
            &namespace,
            record_schema("Value", &namespace, &value_fields),
            false,
        );
        let schema = Schema::parse_str(&envelope.to_string()).unwrap_or_else(|e| panic!("{e}"));
        let encoder = AvroEncoder {
            registry: RegistryClient::new(&SchemaRegistryConfig {
                url: "http://127.0.0.1:1".into(),
                username: None,
                password: None,
                ca_cert: None,
                subject_name_strategy: SubjectNameStrategy::Topic,
            })
            .unwrap_or_else(|e| panic!("{e}")),
            strategy: SubjectNameStrategy::Topic,
            placeholder: "?".into(),
            with_transaction: false,
            topics: HashMap::new(),
        };
        let row = vec![
            text("7"),
            text("-12.34"),
            text("2024-05-06 07:08:09.123456+00"),
            text("2024-05-06"),
            Datum::UnchangedToast,
            text("{1,NULL,3}"),
            text("\\x00ff"),
        ];
        let event = ChangeEvent {
            op: Op::Update,
            relation: &relation,
            before: Some(RowImage {
                row: Cow::Borrowed(&row),
                only_keys: true,
            }),
            after: Some(RowImage {
                row: Cow::Borrowed(&row),
                only_keys: false,
            }),
            source: SourceBlock {
                name: "src",
                database: "db",
                schema: Some("public"),
                table: Some("t"),
                lsn: Lsn(42),
                commit_lsn: Some(Lsn(50)),
                xid: Some(9),
                ts_us: 1_000_000,
                snapshot: false,
            },
            transaction: None,
        };
        let mut out = Vec::new();
        write_long(&mut out, 1);
        encoder
            .write_record(
                &mut out,
                &value_fields,
                &relation,
                event.after.as_ref().unwrap_or_else(|| unreachable!()),
            )
            .unwrap_or_else(|e| panic!("{e}"));
        let mut full = Vec::new();
        write_long(&mut full, 1);
        encoder
            .write_record(
                &mut full,
                &value_fields,
                &relation,
                event.before.as_ref().unwrap_or_else(|| unreachable!()),
            )
            .unwrap_or_else(|e| panic!("{e}"));
        full.extend_from_slice(&out);
        write_source(&mut full, &event.source);
        write_bytes(&mut full, b"u");
        write_optional_long(&mut full, Some(5));
        write_optional_long(&mut full, None);
        let decoded = apache_avro::from_avro_datum(&schema, &mut full.as_slice(), None)
            .unwrap_or_else(|e| panic!("{e}"));
        let Avro::Record(fields) = decoded else {
            panic!("not a record: {decoded:?}")
        };
        let after = &fields[1].1;
        let Avro::Union(1, after) = after else {
            panic!("after: {after:?}")
        };
        let Avro::Record(after) = after.as_ref() else {
            panic!("after: {after:?}")
        };
        let get = |name: &str| {
            after
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
                .unwrap_or(Avro::Null)
        };
        assert_eq!(get("id"), Avro::Int(7));
        assert_eq!(
            get("at"),
            Avro::Union(1, Box::new(Avro::TimestampMicros(1_714_979_289_123_456)))
        );
        assert_eq!(get("day"), Avro::Union(1, Box::new(Avro::Date(19_849))));
        assert_eq!(
            get("doc"),
            Avro::Union(1, Box::new(Avro::String("?".into())))
        );
        assert_eq!(
            get("tags"),
            Avro::Union(
                1,
                Box::new(Avro::Array(vec![
                    Avro::Union(1, Box::new(Avro::Long(1))),
                    Avro::Union(0, Box::new(Avro::Null)),
                    Avro::Union(1, Box::new(Avro::Long(3))),
                ]))
            )
        );
        assert_eq!(
            get("data_1"),
            Avro::Union(1, Box::new(Avro::Bytes(vec![0, 255])))
        );
        let Avro::Union(1, before) = &fields[0].1 else {
            panic!("before: {:?}", fields[0].1)
        };
        let Avro::Record(before) = before.as_ref() else {
            panic!()
        };
        assert_eq!(before[1].1, Avro::Union(0, Box::new(Avro::Null)));
        assert_eq!(fields[3].1, Avro::String("u".into()));
    }
}
