//! Encoders: events to message keys and values in the configured format.

pub mod avro;
mod columns;
#[cfg(test)]
mod fixtures;
pub mod json;
pub mod protobuf;

use walbridge_core::{LogicalMessage, Relation, Row, SequenceValue};

use crate::config::{Format, KafkaSinkConfig};
use crate::error::SinkError;
use crate::event::{ChangeEvent, KeyColumns, SourceBlock, TransactionRecord};

/// The sink's encoder, by `format`.
pub enum Encoder {
    /// `format = "json"`.
    Json(json::JsonEncoder),
    /// `format = "avro"`.
    Avro(Box<avro::AvroEncoder>),
    /// `format = "protobuf"`.
    Protobuf(Box<protobuf::ProtobufEncoder>),
}

impl Encoder {
    /// The encoder `config` asks for.
    pub fn new(config: &KafkaSinkConfig) -> Result<Self, SinkError> {
        let with_transaction = config.transaction_topic.is_some();
        match config.format {
            Format::Json => Ok(Encoder::Json(json::JsonEncoder::new(
                &config.unchanged_toast_placeholder,
                config.json_schemas,
                with_transaction,
            ))),
            Format::Avro | Format::Protobuf => {
                let registry = config
                    .schema_registry
                    .as_ref()
                    .map(|r| r.config())
                    .ok_or_else(|| {
                        SinkError::Config(format!(
                            "format = \"{}\" needs a schema registry: set `schema_registry` on the sink, or serve one with [schema_registry] listen",
                            config.format
                        ))
                    })?;
                let placeholder = &config.unchanged_toast_placeholder;
                Ok(if config.format == Format::Avro {
                    Encoder::Avro(Box::new(avro::AvroEncoder::new(
                        &registry,
                        placeholder,
                        with_transaction,
                    )?))
                } else {
                    Encoder::Protobuf(Box::new(protobuf::ProtobufEncoder::new(
                        &registry,
                        placeholder,
                    )?))
                })
            }
        }
    }

    /// The key of a row of `relation` on `topic`.
    pub async fn key(
        &mut self,
        topic: &str,
        relation: &Relation,
        keys: &KeyColumns,
        row: &Row,
    ) -> Result<Vec<u8>, SinkError> {
        match self {
            Encoder::Json(e) => Ok(e.key(topic, relation, keys, row)),
            Encoder::Avro(e) => e.key(topic, relation, keys, row).await,
            Encoder::Protobuf(e) => e.key(topic, relation, keys, row).await,
        }
    }

    /// The value of a change event on `topic`.
    pub async fn change(
        &mut self,
        topic: &str,
        event: &ChangeEvent<'_>,
    ) -> Result<Vec<u8>, SinkError> {
        match self {
            Encoder::Json(e) => Ok(e.change(topic, event)),
            Encoder::Avro(e) => e.change(topic, event).await,
            Encoder::Protobuf(e) => e.change(topic, event).await,
        }
    }

    /// The key of a transaction-metadata record.
    pub async fn transaction_key(
        &mut self,
        topic: &str,
        source: &str,
        id: &str,
    ) -> Result<Vec<u8>, SinkError> {
        match self {
            Encoder::Json(e) => Ok(e.transaction_key(topic, source, id)),
            Encoder::Avro(e) => e.transaction_key(topic, source, id).await,
            Encoder::Protobuf(e) => e.transaction_key(topic, source, id).await,
        }
    }

    /// A transaction-metadata record.
    pub async fn transaction(
        &mut self,
        topic: &str,
        source: &str,
        record: &TransactionRecord<'_>,
    ) -> Result<Vec<u8>, SinkError> {
        match self {
            Encoder::Json(e) => Ok(e.transaction(topic, source, record)),
            Encoder::Avro(e) => e.transaction(topic, source, record).await,
            Encoder::Protobuf(e) => e.transaction(topic, source, record).await,
        }
    }

    /// The key of a logical decoding message.
    pub async fn message_key(&mut self, topic: &str, prefix: &str) -> Result<Vec<u8>, SinkError> {
        match self {
            Encoder::Json(e) => Ok(e.message_key(topic, prefix)),
            Encoder::Avro(e) => e.message_key(topic, prefix).await,
            Encoder::Protobuf(e) => e.message_key(topic, prefix).await,
        }
    }

    /// A sequence's key.
    pub async fn sequence_key(
        &mut self,
        topic: &str,
        sequence: &SequenceValue,
    ) -> Result<Vec<u8>, SinkError> {
        match self {
            Encoder::Json(e) => Ok(e.sequence_key(topic, sequence)),
            Encoder::Avro(e) => e.sequence_key(topic, sequence).await,
            Encoder::Protobuf(e) => e.sequence_key(topic, sequence).await,
        }
    }

    /// A sequence's value event.
    pub async fn sequence(
        &mut self,
        topic: &str,
        source: &SourceBlock<'_>,
        sequence: &SequenceValue,
    ) -> Result<Vec<u8>, SinkError> {
        match self {
            Encoder::Json(e) => Ok(e.sequence(topic, source, sequence)),
            Encoder::Avro(e) => e.sequence(topic, source, sequence).await,
            Encoder::Protobuf(e) => e.sequence(topic, source, sequence).await,
        }
    }

    /// A logical decoding message event.
    pub async fn message(
        &mut self,
        topic: &str,
        source: &SourceBlock<'_>,
        message: &LogicalMessage,
    ) -> Result<Vec<u8>, SinkError> {
        match self {
            Encoder::Json(e) => Ok(e.message(topic, source, message)),
            Encoder::Avro(e) => e.message(topic, source, message).await,
            Encoder::Protobuf(e) => e.message(topic, source, message).await,
        }
    }
}
