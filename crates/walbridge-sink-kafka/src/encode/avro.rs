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

use serde_json::{Value, json};
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
};
use crate::registry::SchemaType;

/// The Avro schema of a column type.
fn avro_type(ty: &ColumnType) -> Value {
    match ty {
        ColumnType::Int => json!("int"),
        ColumnType::Long => json!("long"),
        ColumnType::Float => json!("float"),
        ColumnType::Double => json!("double"),
        ColumnType::Boolean => json!("boolean"),
        ColumnType::String => json!("string"),
        ColumnType::Bytes => json!("bytes"),
        ColumnType::Decimal { precision, scale } => {
            json!({"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale})
        }
        ColumnType::Date => json!({"type": "int", "logicalType": "date"}),
        ColumnType::TimeMicros => json!({"type": "long", "logicalType": "time-micros"}),
        ColumnType::LocalTimestampMicros => {
            json!({"type": "long", "logicalType": "local-timestamp-micros"})
        }
        ColumnType::TimestampMicros => json!({"type": "long", "logicalType": "timestamp-micros"}),
        ColumnType::Uuid => json!({"type": "string", "logicalType": "uuid"}),
        ColumnType::Array(element) => {
            json!({"type": "array", "items": ["null", avro_type(element)]})
        }
    }
}

/// Encodes events as Avro and registers their schemas.
pub struct AvroEncoder {
    state: SchemaState<AvroSchemas>,
}

/// The Avro schemas of a relation's rows.
struct AvroSchemas {
    with_transaction: bool,
}

impl RecordSchemas for AvroSchemas {
    // Avro resolves fields by name: a schema stands on its own.
    const FOLLOWS_PREVIOUS: bool = false;

    fn schema(
        &self,
        topic: &str,
        part: Part,
        fields: &mut [Field],
        _previous: Option<&str>,
    ) -> SchemaDocument {
        let namespace = namespace(topic);
        let text = match part {
            Part::Key => record_schema("Key", &namespace, fields),
            Part::Envelope => envelope_schema(
                &namespace,
                record_schema("Value", &namespace, fields),
                self.with_transaction,
            ),
        };
        SchemaDocument {
            name: self.record_name(topic, part),
            text: text.to_string(),
        }
    }
}

fn record_schema(name: &str, namespace: &str, fields: &[Field]) -> Value {
    let fields: Vec<Value> = fields
        .iter()
        .map(|f| {
            if f.nullable {
                json!({"name": f.name, "type": ["null", avro_type(&f.ty)], "default": null})
            } else {
                json!({"name": f.name, "type": avro_type(&f.ty)})
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

/// Writes a non-null scalar.
fn write_scalar(out: &mut Vec<u8>, value: &Scalar<'_>) {
    match value {
        Scalar::Int(v) | Scalar::Date(v) => write_long(out, i64::from(*v)),
        Scalar::Long(v) | Scalar::Micros(v) => write_long(out, *v),
        Scalar::Float(v) => out.extend_from_slice(&v.to_le_bytes()),
        Scalar::Double(v) => out.extend_from_slice(&v.to_le_bytes()),
        Scalar::Boolean(v) => out.push(u8::from(*v)),
        Scalar::Text(v) => write_bytes(out, v.as_bytes()),
        Scalar::Bytes(v) => write_bytes(out, v),
        Scalar::Decimal(v) => write_bytes(out, v),
    }
}

impl AvroEncoder {
    /// An encoder registering with the registry `registry`.
    pub fn new(
        registry: &SchemaRegistryConfig,
        placeholder: &str,
        with_transaction: bool,
    ) -> Result<Self, SinkError> {
        Ok(AvroEncoder {
            state: SchemaState::new(
                registry,
                SchemaType::Avro,
                placeholder,
                AvroSchemas { with_transaction },
            )?,
        })
    }

    /// Writes a record of `fields` from `image`.
    fn write_record(
        &self,
        out: &mut Vec<u8>,
        fields: &[Field],
        relation: &Relation,
        image: &RowImage<'_>,
    ) -> Result<(), SinkError> {
        for field in fields {
            let value = field_value(relation, field, image)?;
            if field.nullable {
                write_long(out, i64::from(value != FieldValue::Null));
            }
            match value {
                FieldValue::Null => {}
                FieldValue::Placeholder => {
                    if let ColumnType::Array(_) = field.ty {
                        write_long(out, 1);
                        write_long(out, 1);
                        write_bytes(out, self.state.placeholder.as_bytes());
                        write_long(out, 0);
                    } else {
                        write_bytes(out, self.state.placeholder.as_bytes());
                    }
                }
                FieldValue::Scalar(scalar) => write_scalar(out, &scalar),
                FieldValue::Array(elements) => {
                    if !elements.is_empty() {
                        write_long(out, elements.len() as i64);
                        for element in &elements {
                            write_long(out, i64::from(element.is_some()));
                            if let Some(scalar) = element {
                                write_scalar(out, scalar);
                            }
                        }
                    }
                    write_long(out, 0);
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
        let schemas = self.state.schemas(topic, relation, None).await?;
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
        if self.state.format.with_transaction {
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

    /// The wire header of a record of the fixed schema `record` whose
    /// fields `fields` gives.
    async fn fixed(
        &mut self,
        topic: &str,
        is_key: bool,
        record: &'static str,
        fields: impl FnOnce() -> Value,
    ) -> Result<Vec<u8>, SinkError> {
        let id = self
            .state
            .fixed_id(topic, is_key, record, |namespace| {
                json!({"type": "record", "name": record, "namespace": namespace, "fields": fields()})
                    .to_string()
            })
            .await?;
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
        let mut out = self
            .fixed(topic, true, "TransactionKey", || {
                json!([
                    {"name": "source", "type": "string"}, {"name": "id", "type": "string"}])
            })
            .await?;
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
        let mut out = self
            .fixed(topic, false, "TransactionValue", || {
                json!([
                    {"name": "status", "type": "string"},
                    {"name": "id", "type": "string"},
                    {"name": "source", "type": "string"},
                    {"name": "event_count", "type": ["null", "long"], "default": null},
                    {"name": "data_collections", "type": ["null", {"type": "array", "items": {
                        "type": "record", "name": "DataCollection", "fields": [
                            {"name": "data_collection", "type": "string"},
                            {"name": "event_count", "type": "long"}]}}], "default": null},
                    {"name": "ts_ms", "type": "long"}])
            })
            .await?;
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
        let mut out = self
            .fixed(
                topic,
                true,
                "MessageKey",
                || json!([{"name": "prefix", "type": "string"}]),
            )
            .await?;
        write_bytes(&mut out, prefix.as_bytes());
        Ok(out)
    }

    /// A sequence's key: its schema and name.
    pub async fn sequence_key(
        &mut self,
        topic: &str,
        sequence: &SequenceValue,
    ) -> Result<Vec<u8>, SinkError> {
        let mut out = self
            .fixed(topic, true, "SequenceKey", || {
                json!([{"name": "schema", "type": "string"}, {"name": "name", "type": "string"}])
            })
            .await?;
        write_bytes(&mut out, sequence.schema.as_bytes());
        write_bytes(&mut out, sequence.name.as_bytes());
        Ok(out)
    }

    /// A sequence's value event (`op = "q"`).
    pub async fn sequence(
        &mut self,
        topic: &str,
        source: &SourceBlock<'_>,
        sequence: &SequenceValue,
    ) -> Result<Vec<u8>, SinkError> {
        let inner = || {
            json!({"type": "record", "name": "Sequence", "namespace": "walbridge", "fields": [
                {"name": "schema", "type": "string"}, {"name": "name", "type": "string"},
                {"name": "last_value", "type": "long"}]})
        };
        self.side_event(
            topic,
            "SequenceValue",
            b"q",
            source,
            ("sequence", inner),
            |out| {
                write_bytes(out, sequence.schema.as_bytes());
                write_bytes(out, sequence.name.as_bytes());
                write_long(out, sequence.last_value);
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
        let inner = || {
            json!({"type": "record", "name": "Message",
                "namespace": "io.debezium.connector.postgresql", "fields": [
                {"name": "prefix", "type": "string"}, {"name": "content", "type": "bytes"}]})
        };
        self.side_event(
            topic,
            "MessageValue",
            b"m",
            source,
            ("message", inner),
            |out| {
                write_bytes(out, message.prefix.as_bytes());
                write_bytes(out, &message.content);
            },
        )
        .await
    }

    /// An event beside the tables' change events (a message, a
    /// sequence), record `record`: `op`, the times, the source, and under
    /// `name` the event's own record (`inner`: its schema), written by
    /// `write_inner`.
    async fn side_event(
        &mut self,
        topic: &str,
        record: &'static str,
        op: &[u8],
        source: &SourceBlock<'_>,
        (name, inner): (&str, impl FnOnce() -> Value),
        write_inner: impl FnOnce(&mut Vec<u8>),
    ) -> Result<Vec<u8>, SinkError> {
        let mut out = self
            .fixed(topic, false, record, || {
                json!([
                    {"name": "op", "type": "string"},
                    {"name": "ts_ms", "type": "long"},
                    {"name": "ts_us", "type": "long"},
                    {"name": "source", "type": source_schema()},
                    {"name": name, "type": inner()}])
            })
            .await?;
        let now = PgTimestamp::now().unix_micros();
        write_bytes(&mut out, op);
        write_long(&mut out, now.div_euclid(1000));
        write_long(&mut out, now);
        write_source(&mut out, source);
        write_inner(&mut out);
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
    use walbridge_core::{Datum, ValueKind};

    use super::*;
    use crate::encode::columns::fields;
    use crate::encode::fixtures::{array_of, column, registry, relation, source, text};
    use crate::event::Op;

    /// What the encoder writes is what apache-avro reads with the
    /// generated schema.
    #[test]
    fn envelopes_decode_with_their_schema() {
        let relation = relation(vec![
            column("id", ValueKind::Int4, -1, true),
            column("price", ValueKind::Numeric, (10 << 16 | 2) + 4, false),
            column("at", ValueKind::TimestampTz, -1, false),
            column("day", ValueKind::Date, -1, false),
            column("doc", ValueKind::Text, -1, false),
            column("tags", array_of(ValueKind::Int8), -1, false),
            column("data-1", ValueKind::Bytea, -1, false),
        ]);
        let namespace = namespace("src.public.t");
        let value_fields = fields(&relation, 0..relation.columns.len());
        let envelope = envelope_schema(
            &namespace,
            record_schema("Value", &namespace, &value_fields),
            false,
        );
        let schema = Schema::parse_str(&envelope.to_string()).unwrap_or_else(|e| panic!("{e}"));
        let encoder = AvroEncoder::new(&registry(), "?", false).unwrap_or_else(|e| panic!("{e}"));
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
            source: source(),
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
