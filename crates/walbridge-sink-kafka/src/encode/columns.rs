//! What the schema-carrying formats (Avro and Protobuf) share: a column's
//! type in their terms, the fields of a row record, a datum parsed into
//! the value they write, and the per-topic schemas registered for a
//! relation descriptor.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde_json::Value;
use walbridge_core::json::{bytea_from_text, datum_to_json};
use walbridge_core::temporal;
use walbridge_core::{Datum, Relation, ValueKind};

use crate::config::{SchemaRegistryConfig, SubjectNameStrategy};
use crate::error::SinkError;
use crate::event::{KeyColumns, RowImage, table_name};
use crate::registry::SchemaType;
use crate::registry::client::RegistryClient;

/// A column's type as the schema formats see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum ColumnType {
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
    Array(Box<ColumnType>),
}

impl ColumnType {
    /// The type of a column of `kind` with `type_modifier`.
    pub(super) fn of(kind: &ValueKind, type_modifier: i32) -> ColumnType {
        match kind {
            ValueKind::Int2 | ValueKind::Int4 => ColumnType::Int,
            ValueKind::Int8 | ValueKind::Oid => ColumnType::Long,
            ValueKind::Float4 => ColumnType::Float,
            ValueKind::Float8 => ColumnType::Double,
            ValueKind::Bool => ColumnType::Boolean,
            ValueKind::Bytea => ColumnType::Bytes,
            ValueKind::Numeric if type_modifier >= 4 => {
                let m = (type_modifier - 4) as u32;
                let (precision, scale) = ((m >> 16) & 0xffff, m & 0xffff);
                // PostgreSQL 15 allows negative scales and scales above the
                // precision, which a decimal type cannot describe.
                if scale <= precision && scale < 0x8000 {
                    ColumnType::Decimal { precision, scale }
                } else {
                    ColumnType::String
                }
            }
            ValueKind::Date => ColumnType::Date,
            ValueKind::Time => ColumnType::TimeMicros,
            ValueKind::Timestamp => ColumnType::LocalTimestampMicros,
            ValueKind::TimestampTz => ColumnType::TimestampMicros,
            ValueKind::Uuid => ColumnType::Uuid,
            ValueKind::Array { element, .. } => {
                ColumnType::Array(Box::new(ColumnType::of(element, -1)))
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
            | ValueKind::Other => ColumnType::String,
        }
    }

    /// True for types an unchanged TOASTed value is written as the
    /// placeholder in (else it is written as null).
    fn holds_placeholder(&self) -> bool {
        match self {
            ColumnType::String | ColumnType::Bytes => true,
            ColumnType::Array(element) => **element == ColumnType::String,
            _ => false,
        }
    }
}

/// One column as a record field.
#[derive(Clone, Debug)]
pub(super) struct Field {
    /// The column's index in the relation.
    pub column: usize,
    /// The field's name: the column's, made a valid identifier.
    pub name: String,
    pub ty: ColumnType,
    pub nullable: bool,
    /// Its number in a Protobuf message (from 1 in column order, unless
    /// the format keeps earlier numbers).
    pub number: u32,
}

/// A valid Avro or Protobuf name made of `text`: letters, digits and `_`,
/// not starting with a digit.
pub(super) fn identifier(text: &str) -> String {
    let mut name: String = text
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if !name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
        name.insert(0, '_');
    }
    name
}

/// The namespace (Avro) or package (Protobuf) of a topic's records: its
/// dot-separated parts as identifiers.
pub(super) fn namespace(topic: &str) -> String {
    topic
        .split('.')
        .map(identifier)
        .collect::<Vec<_>>()
        .join(".")
}

/// The fields of the columns at `indexes`, with unique names.
pub(super) fn fields(relation: &Relation, indexes: impl Iterator<Item = usize>) -> Vec<Field> {
    let mut used = HashSet::new();
    indexes
        .filter_map(|i| relation.columns.get(i).map(|c| (i, c)))
        .zip(1..)
        .map(|((i, column), number)| {
            let base = identifier(&column.name);
            let mut name = base.clone();
            let mut n = 2;
            while !used.insert(name.clone()) {
                name = format!("{base}_{n}");
                n += 1;
            }
            Field {
                column: i,
                name,
                ty: ColumnType::of(&column.kind, column.type_modifier),
                nullable: !relation.is_never_null(i),
                number,
            }
        })
        .collect()
}

/// A non-null value of a [`ColumnType`] other than an array.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Scalar<'a> {
    Int(i32),
    Long(i64),
    Float(f32),
    Double(f64),
    Boolean(bool),
    /// Strings and UUIDs.
    Text(Cow<'a, str>),
    Bytes(Cow<'a, [u8]>),
    /// The unscaled value, big-endian two's complement.
    Decimal(Vec<u8>),
    /// Days since 1970-01-01.
    Date(i32),
    /// Microseconds since midnight (time) or since 1970-01-01 (timestamps).
    Micros(i64),
}

/// A field's value in a row image.
#[derive(Debug, PartialEq)]
pub(super) enum FieldValue<'a> {
    /// NULL, an unknown old value, or an unchanged TOASTed value of a type
    /// that cannot hold the placeholder.
    Null,
    /// An unchanged TOASTed value, written as the placeholder (a
    /// one-element array of it for arrays of strings).
    Placeholder,
    Scalar(Scalar<'a>),
    /// A one-dimensional array; `None` elements are NULL.
    Array(Vec<Option<Scalar<'static>>>),
}

fn float_value(text: &str) -> Option<f64> {
    match text {
        "NaN" => Some(f64::NAN),
        "Infinity" => Some(f64::INFINITY),
        "-Infinity" => Some(f64::NEG_INFINITY),
        _ => text.parse().ok(),
    }
}

/// The unscaled value of decimal `text` at `scale` as big-endian two's
/// complement, or `None` when it is not a finite decimal of that scale.
pub(super) fn decimal_bytes(text: &str, scale: u32) -> Option<Vec<u8>> {
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

/// Parses the text of a non-null value of scalar type `ty`.
fn parse_scalar<'a>(ty: &ColumnType, text: Cow<'a, str>) -> Result<Scalar<'a>, String> {
    let bad = || format!("`{text}` is not a valid {ty:?} value");
    Ok(match ty {
        ColumnType::Int => Scalar::Int(text.parse().map_err(|_| bad())?),
        ColumnType::Long => Scalar::Long(text.parse().map_err(|_| bad())?),
        ColumnType::Float => Scalar::Float(float_value(&text).ok_or_else(bad)? as f32),
        ColumnType::Double => Scalar::Double(float_value(&text).ok_or_else(bad)?),
        ColumnType::Boolean => Scalar::Boolean(match text.as_ref() {
            "t" | "true" => true,
            "f" | "false" => false,
            _ => return Err(bad()),
        }),
        ColumnType::Bytes => Scalar::Bytes(Cow::Owned(bytea_from_text(&text).ok_or_else(bad)?)),
        ColumnType::Decimal { scale, .. } => {
            Scalar::Decimal(decimal_bytes(&text, *scale).ok_or_else(bad)?)
        }
        ColumnType::Date => Scalar::Date(temporal::date_days(&text).ok_or_else(bad)?),
        ColumnType::TimeMicros => Scalar::Micros(temporal::time_micros(&text).ok_or_else(bad)?),
        ColumnType::LocalTimestampMicros => {
            Scalar::Micros(temporal::timestamp_micros(&text, false).ok_or_else(bad)?)
        }
        ColumnType::TimestampMicros => {
            Scalar::Micros(temporal::timestamp_micros(&text, true).ok_or_else(bad)?)
        }
        ColumnType::Array(_) => return Err(bad()),
        ColumnType::String | ColumnType::Uuid => Scalar::Text(text),
    })
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

/// The elements of an array column (as [`walbridge_core::json`] converts
/// it) as scalars of `element`.
fn array_elements(
    element: &ColumnType,
    items: Vec<Value>,
) -> Result<Vec<Option<Scalar<'static>>>, String> {
    items
        .into_iter()
        .map(|item| match item {
            Value::Null => Ok(None),
            Value::Array(_) => Err(
                "multidimensional arrays have no mapping in this format (use format = \"json\")"
                    .to_owned(),
            ),
            // The JSON conversion gives bytea elements as base64.
            Value::String(s) if *element == ColumnType::Bytes => {
                use base64::Engine as _;
                base64::engine::general_purpose::STANDARD
                    .decode(s)
                    .map(|raw| Some(Scalar::Bytes(Cow::Owned(raw))))
                    .map_err(|e| format!("bytea element: {e}"))
            }
            Value::String(s) => parse_scalar(element, Cow::Owned(s)).map(Some),
            other => parse_scalar(element, Cow::Owned(other.to_string())).map(Some),
        })
        .collect()
}

/// The value of `field` in `image`, failing with an error that names the
/// table and column.
pub(super) fn field_value<'a>(
    relation: &Relation,
    field: &Field,
    image: &'a RowImage<'_>,
) -> Result<FieldValue<'a>, SinkError> {
    let column = &relation.columns[field.column];
    let datum = if image.only_keys && !column.is_key {
        None
    } else {
        image.row.get(field.column)
    };
    let fail = |reason: String| SinkError::Encode {
        table: table_name(relation),
        reason: format!(
            "column {} ({}): {reason}",
            column.name,
            column.type_display()
        ),
    };
    let value = match (datum, &field.ty) {
        (None | Some(Datum::Null), _) => FieldValue::Null,
        (Some(Datum::UnchangedToast), ty) if ty.holds_placeholder() => FieldValue::Placeholder,
        (Some(Datum::UnchangedToast), _) => FieldValue::Null,
        (Some(Datum::Binary(raw)), ColumnType::Bytes) => {
            FieldValue::Scalar(Scalar::Bytes(Cow::Borrowed(raw)))
        }
        (Some(datum), ColumnType::Array(element)) => {
            let Value::Array(items) = datum_to_json(datum, &column.kind, &Value::Null) else {
                return Err(fail("not an array".into()));
            };
            FieldValue::Array(array_elements(element, items).map_err(fail)?)
        }
        (Some(datum), ty) => {
            let text = scalar_text(datum, &column.kind).map_err(fail)?;
            FieldValue::Scalar(parse_scalar(ty, text).map_err(fail)?)
        }
    };
    if value == FieldValue::Null && !field.nullable {
        return Err(fail("NULL in a column of the identity".into()));
    }
    Ok(value)
}

/// A schema to register.
pub(super) struct SchemaDocument {
    /// The fully qualified name of its (first) record or message, for the
    /// record-name subject strategies.
    pub name: String,
    /// Its text.
    pub text: String,
}

/// Which of a topic's schemas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Part {
    Key,
    Envelope,
}

impl Part {
    /// The name of the schema's first record or message.
    fn record(self) -> &'static str {
        match self {
            Part::Key => "Key",
            Part::Envelope => "Envelope",
        }
    }
}

/// Registers a format's schemas under the subjects the strategy names.
struct Registrar {
    registry: RegistryClient,
    strategy: SubjectNameStrategy,
    schema_type: SchemaType,
}

impl Registrar {
    /// A registrar of `schema_type` schemas with `config`'s registry.
    fn new(config: &SchemaRegistryConfig, schema_type: SchemaType) -> Result<Self, SinkError> {
        Ok(Registrar {
            registry: RegistryClient::new(config)?,
            strategy: config.subject_name_strategy,
            schema_type,
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

    /// The latest schema registered for `part` of `topic`, whose first
    /// record is `record_name`.
    async fn latest(
        &self,
        topic: &str,
        part: Part,
        record_name: &str,
    ) -> Result<Option<String>, SinkError> {
        let subject = self.subject(topic, part == Part::Key, record_name);
        Ok(self.registry.latest(&subject).await?)
    }

    /// The id of `schema`, the key's or value's of `topic`.
    async fn register(
        &mut self,
        topic: &str,
        is_key: bool,
        schema: &SchemaDocument,
    ) -> Result<i32, SinkError> {
        let subject = self.subject(topic, is_key, &schema.name);
        Ok(self
            .registry
            .register(&subject, &schema.text, self.schema_type)
            .await?)
    }
}

/// A topic's schemas for one relation descriptor, with their ids.
pub(super) struct TopicSchemas {
    relation: Relation,
    keys: Option<Vec<usize>>,
    /// The fields of `before` and `after`.
    pub value_fields: Vec<Field>,
    /// The fields of the key.
    pub key_fields: Vec<Field>,
    /// The key schema's id (none until a key was asked for).
    pub key_id: Option<i32>,
    /// The envelope schema's id.
    pub envelope_id: i32,
}

/// What a format derives from a relation's fields.
pub(super) trait RecordSchemas {
    /// True when a new schema depends on the one registered before
    /// (`previous` below); else the registry is not asked for it.
    const FOLLOWS_PREVIOUS: bool;
    /// The fully qualified name of `part`'s first record on `topic`.
    fn record_name(&self, topic: &str, part: Part) -> String {
        format!("{}.{}", namespace(topic), part.record())
    }
    /// The schema of `part` on `topic` made of `fields` (every column for
    /// the envelope's rows, the key's columns for the key), which it may
    /// renumber; `previous` is the latest schema registered for it.
    fn schema(
        &self,
        topic: &str,
        part: Part,
        fields: &mut [Field],
        previous: Option<&str>,
    ) -> SchemaDocument;
}

/// What an encoder of a schema format keeps: where it registers, the
/// format's schemas, the TOAST placeholder, and the schemas registered per
/// topic for the latest relation descriptor.
pub(super) struct SchemaState<F> {
    registrar: Registrar,
    /// The format's schemas.
    pub format: F,
    /// Written for unchanged TOASTed values.
    pub placeholder: String,
    topics: HashMap<String, Arc<TopicSchemas>>,
    /// Ids of the fixed schemas by topic and record name.
    fixed: HashMap<String, HashMap<&'static str, i32>>,
}

impl<F: RecordSchemas> SchemaState<F> {
    /// The state of an encoder of `format`, registering `schema_type`
    /// schemas with `config`'s registry.
    pub(super) fn new(
        config: &SchemaRegistryConfig,
        schema_type: SchemaType,
        placeholder: &str,
        format: F,
    ) -> Result<Self, SinkError> {
        Ok(SchemaState {
            registrar: Registrar::new(config, schema_type)?,
            format,
            placeholder: placeholder.to_owned(),
            topics: HashMap::new(),
            fixed: HashMap::new(),
        })
    }

    /// The id of the fixed schema whose first record is `record` (the
    /// transaction and message topics'), its text made by `text` from the
    /// topic's namespace and registered the first time `topic` needs it.
    pub(super) async fn fixed_id(
        &mut self,
        topic: &str,
        is_key: bool,
        record: &'static str,
        text: impl FnOnce(&str) -> String,
    ) -> Result<i32, SinkError> {
        if let Some(id) = self.fixed.get(topic).and_then(|ids| ids.get(record)) {
            return Ok(*id);
        }
        let namespace = namespace(topic);
        let document = SchemaDocument {
            name: format!("{namespace}.{record}"),
            text: text(&namespace),
        };
        let id = self.registrar.register(topic, is_key, &document).await?;
        self.fixed
            .entry(topic.to_owned())
            .or_default()
            .insert(record, id);
        Ok(id)
    }

    /// Registers the schema of `part` of `topic` made of `fields`.
    async fn register_part(
        &mut self,
        topic: &str,
        part: Part,
        fields: &mut [Field],
    ) -> Result<i32, SinkError> {
        let previous = if F::FOLLOWS_PREVIOUS {
            let name = self.format.record_name(topic, part);
            self.registrar.latest(topic, part, &name).await?
        } else {
            None
        };
        let schema = self.format.schema(topic, part, fields, previous.as_deref());
        self.registrar
            .register(topic, part == Part::Key, &schema)
            .await
    }

    /// The schemas of `topic` for `relation` (with a key schema when
    /// `keys` is given), registered the first time and again when the
    /// descriptor changes.
    pub(super) async fn schemas(
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
        let mut value_fields = fields(relation, 0..relation.columns.len());
        let envelope_id = self
            .register_part(topic, Part::Envelope, &mut value_fields)
            .await?;
        let key_indexes = keys
            .map(|k| k.0.clone())
            .or_else(|| self.topics.get(topic).and_then(|c| c.keys.clone()));
        let mut key_fields = key_indexes
            .as_ref()
            .map(|k| fields(relation, k.iter().copied()))
            .unwrap_or_default();
        let key_id = match &key_indexes {
            Some(_) => Some(
                self.register_part(topic, Part::Key, &mut key_fields)
                    .await?,
            ),
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
