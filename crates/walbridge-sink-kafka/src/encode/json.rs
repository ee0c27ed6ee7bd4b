//! `format = "json"`: Debezium's envelope as JSON, schemaless or in Kafka
//! Connect's `{schema, payload}` form (`json_schemas = true`).
//!
//! Values follow [`walbridge_core::json`], as in the jsonl sink. With
//! schemas, `json`/`jsonb` values are strings (Connect has no type for an
//! arbitrary document; Debezium does the same, naming them
//! `io.debezium.data.Json`), and each column's Connect type is derived from
//! its PostgreSQL type (see [`connect_type`]).

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::Serialize;
use serde_json::{Map, Value, json};
use walbridge_core::json::datum_to_json;
use walbridge_core::{
    Column, Datum, LogicalMessage, PgTimestamp, Relation, Row, SequenceValue, ValueKind,
};

use crate::event::{
    ChangeEvent, KeyColumns, RowImage, SourceBlock, TransactionBlock, TransactionRecord,
    TransactionStatus,
};

/// The connector name in every `source` block.
pub const CONNECTOR: &str = "postgresql";

/// walbridge's version, in every `source` block.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Connect schemas of one topic's key and value, for one relation descriptor.
struct TopicSchemas {
    relation: Relation,
    key: Option<(Vec<usize>, Value)>,
    value: Value,
}

/// Encodes events as JSON.
pub struct JsonEncoder {
    placeholder: Value,
    with_schemas: bool,
    with_transaction: bool,
    schemas: HashMap<String, Arc<TopicSchemas>>,
}

impl JsonEncoder {
    /// An encoder writing `placeholder` for unchanged TOASTed values;
    /// `with_schemas` for the `{schema, payload}` form; `with_transaction`
    /// when envelopes have a `transaction` field.
    pub fn new(placeholder: &str, with_schemas: bool, with_transaction: bool) -> Self {
        JsonEncoder {
            placeholder: Value::String(placeholder.to_owned()),
            with_schemas,
            with_transaction,
            schemas: HashMap::new(),
        }
    }

    fn value(&self, datum: &Datum, column: &Column) -> Value {
        if self.with_schemas && matches!(column.kind, ValueKind::Json | ValueKind::Jsonb) {
            return match datum {
                Datum::Text(text) => Value::String(String::from_utf8_lossy(text).into_owned()),
                Datum::Null => Value::Null,
                other => match datum_to_json(other, &column.kind, &self.placeholder) {
                    Value::String(s) => Value::String(s),
                    document => Value::String(document.to_string()),
                },
            };
        }
        datum_to_json(datum, &column.kind, &self.placeholder)
    }

    /// The schemas of `topic` for `relation`, made once per descriptor.
    fn schemas(
        &mut self,
        topic: &str,
        relation: &Relation,
        keys: Option<&KeyColumns>,
    ) -> Arc<TopicSchemas> {
        let key_indexes = keys.map(|k| k.0.clone());
        if let Some(cached) = self.schemas.get(topic)
            && cached.relation == *relation
            && cached.key.as_ref().map(|(k, _)| k) == key_indexes.as_ref()
        {
            return cached.clone();
        }
        let made = Arc::new(TopicSchemas {
            relation: relation.clone(),
            key: key_indexes.map(|k| {
                let schema = key_schema(topic, relation, &k);
                (k, schema)
            }),
            value: envelope_schema(topic, relation, self.with_transaction),
        });
        self.schemas.insert(topic.to_owned(), made.clone());
        made
    }

    fn framed<T: Serialize>(&self, schema: impl FnOnce() -> Value, payload: &T) -> Vec<u8> {
        // Serializing into a Vec fails only for maps with non-string
        // keys, which none of these have.
        if self.with_schemas {
            serde_json::to_vec(&Framed {
                schema: schema(),
                payload,
            })
            .unwrap_or_default()
        } else {
            serde_json::to_vec(payload).unwrap_or_default()
        }
    }

    /// The key of a row: its key columns as an object.
    pub fn key(
        &mut self,
        topic: &str,
        relation: &Relation,
        keys: &KeyColumns,
        row: &Row,
    ) -> Vec<u8> {
        let mut map = Map::with_capacity(keys.0.len());
        for &i in &keys.0 {
            if let (Some(column), Some(datum)) = (relation.columns.get(i), row.get(i)) {
                map.insert(column.name.clone(), self.value(datum, column));
            }
        }
        let schemas = self
            .with_schemas
            .then(|| self.schemas(topic, relation, Some(keys)));
        self.framed(
            || {
                schemas
                    .and_then(|s| s.key.as_ref().map(|(_, schema)| schema.clone()))
                    .unwrap_or(Value::Null)
            },
            &Value::Object(map),
        )
    }

    /// The value of a change event.
    pub fn change(&mut self, topic: &str, event: &ChangeEvent<'_>) -> Vec<u8> {
        let relation = event.relation;
        let schemas = self
            .with_schemas
            .then(|| self.schemas(topic, relation, None));
        let now = PgTimestamp::now().unix_micros();
        let envelope = EnvelopeJson {
            before: RowJson::of(self, relation, event.before.as_ref()),
            after: RowJson::of(self, relation, event.after.as_ref()),
            source: SourceJson::from(&event.source),
            op: event.op.code(),
            ts_ms: now.div_euclid(1000),
            ts_us: now,
            transaction: self
                .with_transaction
                .then(|| event.transaction.as_ref().map(TransactionJson::from)),
        };
        self.framed(
            || schemas.map(|s| s.value.clone()).unwrap_or(Value::Null),
            &envelope,
        )
    }

    /// The key of a transaction-metadata record.
    pub fn transaction_key(&self, topic: &str, source: &str, id: &str) -> Vec<u8> {
        self.framed(
            || {
                struct_schema(
                    &format!("{topic}.TransactionKey"),
                    false,
                    vec![
                        field("source", "string", false),
                        field("id", "string", false),
                    ],
                )
            },
            &json!({"source": source, "id": id}),
        )
    }

    /// A transaction-metadata record.
    pub fn transaction(
        &self,
        topic: &str,
        source: &str,
        record: &TransactionRecord<'_>,
    ) -> Vec<u8> {
        let collections = record.data_collections.map(|per_table| {
            per_table
                .iter()
                .map(|(table, count)| json!({"data_collection": table, "event_count": count}))
                .collect::<Vec<_>>()
        });
        self.framed(
            || {
                let collection = struct_schema(
                    &format!("{topic}.DataCollection"),
                    false,
                    vec![
                        field("data_collection", "string", false),
                        field("event_count", "int64", false),
                    ],
                );
                struct_schema(
                    &format!("{topic}.TransactionValue"),
                    false,
                    vec![
                        field("status", "string", false),
                        field("id", "string", false),
                        field("source", "string", false),
                        field("event_count", "int64", true),
                        named_field(
                            json!({"type": "array", "items": collection, "optional": true}),
                            "data_collections",
                        ),
                        field("ts_ms", "int64", false),
                    ],
                )
            },
            &json!({
                "status": match record.status {
                    TransactionStatus::Begin => "BEGIN",
                    TransactionStatus::End => "END",
                },
                "id": record.id,
                "source": source,
                "event_count": record.event_count,
                "data_collections": collections,
                "ts_ms": record.ts_ms,
            }),
        )
    }

    /// The key of a logical decoding message: its prefix.
    pub fn message_key(&self, topic: &str, prefix: &str) -> Vec<u8> {
        self.framed(
            || {
                struct_schema(
                    &format!("{topic}.MessageKey"),
                    false,
                    vec![field("prefix", "string", false)],
                )
            },
            &json!({"prefix": prefix}),
        )
    }

    /// A sequence's key: its schema and name.
    pub fn sequence_key(&self, topic: &str, sequence: &SequenceValue) -> Vec<u8> {
        self.framed(
            || {
                struct_schema(
                    &format!("{topic}.SequenceKey"),
                    false,
                    vec![
                        field("schema", "string", false),
                        field("name", "string", false),
                    ],
                )
            },
            &json!({"schema": sequence.schema, "name": sequence.name}),
        )
    }

    /// A sequence's value event (`op = "q"`).
    pub fn sequence(
        &self,
        topic: &str,
        source: &SourceBlock<'_>,
        sequence: &SequenceValue,
    ) -> Vec<u8> {
        let inner = || {
            struct_schema(
                "walbridge.Sequence",
                false,
                vec![
                    field("schema", "string", false),
                    field("name", "string", false),
                    field("last_value", "int64", false),
                ],
            )
        };
        self.side_event(
            &format!("{topic}.SequenceValue"),
            "q",
            source,
            ("sequence", inner),
            json!({"schema": sequence.schema, "name": sequence.name, "last_value": sequence.last_value}),
        )
    }

    /// A logical decoding message event (`op = "m"`).
    pub fn message(
        &self,
        topic: &str,
        source: &SourceBlock<'_>,
        message: &LogicalMessage,
    ) -> Vec<u8> {
        let inner = || {
            struct_schema(
                "io.debezium.connector.postgresql.Message",
                false,
                vec![
                    field("prefix", "string", false),
                    field("content", "bytes", false),
                ],
            )
        };
        self.side_event(
            &format!("{topic}.MessageValue"),
            "m",
            source,
            ("message", inner),
            json!({"prefix": message.prefix, "content": BASE64.encode(&message.content)}),
        )
    }

    /// An event beside the tables' change events (a message, a sequence):
    /// `op`, the times, the source, and under `name` the event's own
    /// struct (`inner`: its schema), named `record` with its schema.
    fn side_event(
        &self,
        record: &str,
        op: &str,
        source: &SourceBlock<'_>,
        (name, inner): (&str, impl FnOnce() -> Value),
        payload: Value,
    ) -> Vec<u8> {
        let now = PgTimestamp::now().unix_micros();
        let mut event = json!({
            "op": op,
            "ts_ms": now.div_euclid(1000),
            "ts_us": now,
            "source": SourceJson::from(source),
        });
        event[name] = payload;
        self.framed(
            || {
                struct_schema(
                    record,
                    false,
                    vec![
                        field("op", "string", false),
                        field("ts_ms", "int64", false),
                        field("ts_us", "int64", false),
                        named_field(source_schema(), "source"),
                        named_field(inner(), name),
                    ],
                )
            },
            &event,
        )
    }
}

/// `{"schema": …, "payload": …}`.
#[derive(Serialize)]
struct Framed<'a, T> {
    schema: Value,
    payload: &'a T,
}

/// Debezium's envelope, serialized without building a JSON tree.
#[derive(Serialize)]
struct EnvelopeJson<'a> {
    before: Option<RowJson<'a>>,
    after: Option<RowJson<'a>>,
    source: SourceJson<'a>,
    op: &'static str,
    ts_ms: i64,
    ts_us: i64,
    /// Absent unless transaction metadata is on; then null outside a
    /// transaction.
    #[serde(skip_serializing_if = "Option::is_none")]
    transaction: Option<Option<TransactionJson<'a>>>,
}

/// A row image as an object, straight from the datums.
struct RowJson<'a> {
    encoder: &'a JsonEncoder,
    relation: &'a Relation,
    image: &'a RowImage<'a>,
}

impl<'a> RowJson<'a> {
    fn of(
        encoder: &'a JsonEncoder,
        relation: &'a Relation,
        image: Option<&'a RowImage<'a>>,
    ) -> Option<Self> {
        image.map(|image| RowJson {
            encoder,
            relation,
            image,
        })
    }
}

impl Serialize for RowJson<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.relation.columns.len()))?;
        for (column, datum) in self.relation.columns.iter().zip(self.image.row.iter()) {
            if self.image.only_keys && !column.is_key {
                map.serialize_entry(&column.name, &Value::Null)?;
            } else {
                map.serialize_entry(&column.name, &self.encoder.value(datum, column))?;
            }
        }
        map.end()
    }
}

/// The `source` block.
#[derive(Serialize)]
struct SourceJson<'a> {
    version: &'static str,
    connector: &'static str,
    name: &'a str,
    ts_ms: i64,
    ts_us: i64,
    snapshot: &'static str,
    db: &'a str,
    schema: Option<&'a str>,
    table: Option<&'a str>,
    #[serde(rename = "txId")]
    tx_id: Option<u32>,
    lsn: u64,
    commit_lsn: Option<u64>,
}

impl<'a> From<&SourceBlock<'a>> for SourceJson<'a> {
    fn from(source: &SourceBlock<'a>) -> Self {
        SourceJson {
            version: VERSION,
            connector: CONNECTOR,
            name: source.name,
            ts_ms: source.ts_us.div_euclid(1000),
            ts_us: source.ts_us,
            snapshot: if source.snapshot { "true" } else { "false" },
            db: source.database,
            schema: source.schema,
            table: source.table,
            tx_id: source.xid,
            lsn: source.lsn.0,
            commit_lsn: source.commit_lsn.map(|l| l.0),
        }
    }
}

/// The `transaction` block.
#[derive(Serialize)]
struct TransactionJson<'a> {
    id: &'a str,
    total_order: u64,
    data_collection_order: u64,
}

impl<'a> From<&'a TransactionBlock> for TransactionJson<'a> {
    fn from(t: &'a TransactionBlock) -> Self {
        TransactionJson {
            id: &t.id,
            total_order: t.total_order,
            data_collection_order: t.data_collection_order,
        }
    }
}

fn field(name: &str, kind: &str, optional: bool) -> Value {
    json!({"type": kind, "optional": optional, "field": name})
}

fn named_field(mut schema: Value, name: &str) -> Value {
    schema["field"] = Value::String(name.to_owned());
    schema
}

fn struct_schema(name: &str, optional: bool, fields: Vec<Value>) -> Value {
    json!({"type": "struct", "fields": fields, "optional": optional, "name": name})
}

fn source_schema() -> Value {
    struct_schema(
        "io.debezium.connector.postgresql.Source",
        false,
        vec![
            field("version", "string", false),
            field("connector", "string", false),
            field("name", "string", false),
            field("ts_ms", "int64", false),
            field("ts_us", "int64", false),
            field("snapshot", "string", true),
            field("db", "string", false),
            field("schema", "string", true),
            field("table", "string", true),
            field("txId", "int64", true),
            field("lsn", "int64", true),
            field("commit_lsn", "int64", true),
        ],
    )
}

/// The Connect schema of a column's values: type, and Debezium's semantic
/// name where the string or number means more than itself.
pub fn connect_type(kind: &ValueKind) -> Value {
    let plain = |t: &str| json!({"type": t});
    let named = |t: &str, name: &str| json!({"type": t, "name": name});
    match kind {
        ValueKind::Bool => plain("boolean"),
        ValueKind::Int2 => plain("int16"),
        ValueKind::Int4 => plain("int32"),
        ValueKind::Int8 | ValueKind::Oid => plain("int64"),
        ValueKind::Float4 => plain("float"),
        ValueKind::Float8 => plain("double"),
        ValueKind::Bytea => plain("bytes"),
        ValueKind::Json | ValueKind::Jsonb => named("string", "io.debezium.data.Json"),
        ValueKind::Uuid => named("string", "io.debezium.data.Uuid"),
        ValueKind::Enum => named("string", "io.debezium.data.Enum"),
        ValueKind::TimestampTz => named("string", "io.debezium.time.ZonedTimestamp"),
        ValueKind::TimeTz => named("string", "io.debezium.time.ZonedTime"),
        ValueKind::Interval => named("string", "io.debezium.time.Interval"),
        ValueKind::Array { element, .. } => {
            let mut items = connect_type(element);
            items["optional"] = Value::Bool(true);
            json!({"type": "array", "items": items})
        }
        ValueKind::Numeric
        | ValueKind::Text
        | ValueKind::Date
        | ValueKind::Time
        | ValueKind::Timestamp
        | ValueKind::Composite
        | ValueKind::Range
        | ValueKind::Other => plain("string"),
    }
}

fn column_field(column: &Column, optional: bool) -> Value {
    let mut schema = connect_type(&column.kind);
    schema["optional"] = Value::Bool(optional);
    schema["field"] = Value::String(column.name.clone());
    schema
}

fn key_schema(topic: &str, relation: &Relation, keys: &[usize]) -> Value {
    let fields = keys
        .iter()
        .filter_map(|&i| relation.columns.get(i).map(|c| (i, c)))
        .map(|(i, c)| column_field(c, !relation.is_never_null(i)))
        .collect();
    struct_schema(&format!("{topic}.Key"), false, fields)
}

/// The envelope: `before` and `after` are the table's `Value` struct (every
/// column optional but the identity's, which old images always carry).
fn envelope_schema(topic: &str, relation: &Relation, with_transaction: bool) -> Value {
    let value_fields: Vec<Value> = relation
        .columns
        .iter()
        .enumerate()
        .map(|(i, c)| column_field(c, !relation.is_never_null(i)))
        .collect();
    let value = struct_schema(&format!("{topic}.Value"), true, value_fields);
    let mut fields = vec![
        named_field(value.clone(), "before"),
        named_field(value, "after"),
        named_field(source_schema(), "source"),
        field("op", "string", false),
        field("ts_ms", "int64", true),
        field("ts_us", "int64", true),
    ];
    if with_transaction {
        fields.push(named_field(
            struct_schema(
                "event.block",
                true,
                vec![
                    field("id", "string", false),
                    field("total_order", "int64", false),
                    field("data_collection_order", "int64", false),
                ],
            ),
            "transaction",
        ));
    }
    struct_schema(&format!("{topic}.Envelope"), false, fields)
}
