//! Encoders: events to message keys and values in the configured format.

pub mod json;

use walbridge_core::{LogicalMessage, Relation, Row};

use crate::config::{Format, KafkaSinkConfig};
use crate::error::SinkError;
use crate::event::{ChangeEvent, KeyColumns, SourceBlock, TransactionRecord};

/// The sink's encoder, by `format`.
pub enum Encoder {
    /// `format = "json"`.
    Json(json::JsonEncoder),
}

impl Encoder {
    /// The encoder `config` asks for.
    pub fn new(config: &KafkaSinkConfig) -> Result<Self, SinkError> {
        match config.format {
            Format::Json => Ok(Encoder::Json(json::JsonEncoder::new(
                &config.unchanged_toast_placeholder,
                config.json_schemas,
                config.transaction_topic.is_some(),
            ))),
            other => Err(SinkError::Config(format!(
                "`format` = {other:?} is not available in this build; use \"json\""
            ))),
        }
    }

    /// The key of a row of `relation` on `topic`.
    pub fn key(
        &mut self,
        topic: &str,
        relation: &Relation,
        keys: &KeyColumns,
        row: &Row,
    ) -> Result<Vec<u8>, SinkError> {
        match self {
            Encoder::Json(e) => Ok(e.key(topic, relation, keys, row)),
        }
    }

    /// The value of a change event on `topic`.
    pub fn change(&mut self, topic: &str, event: &ChangeEvent<'_>) -> Result<Vec<u8>, SinkError> {
        match self {
            Encoder::Json(e) => Ok(e.change(topic, event)),
        }
    }

    /// The key of a transaction-metadata record.
    pub fn transaction_key(
        &self,
        topic: &str,
        source: &str,
        id: &str,
    ) -> Result<Vec<u8>, SinkError> {
        match self {
            Encoder::Json(e) => Ok(e.transaction_key(topic, source, id)),
        }
    }

    /// A transaction-metadata record.
    pub fn transaction(
        &self,
        topic: &str,
        source: &str,
        record: &TransactionRecord<'_>,
    ) -> Result<Vec<u8>, SinkError> {
        match self {
            Encoder::Json(e) => Ok(e.transaction(topic, source, record)),
        }
    }

    /// The key of a logical decoding message.
    pub fn message_key(&self, topic: &str, prefix: &str) -> Result<Vec<u8>, SinkError> {
        match self {
            Encoder::Json(e) => Ok(e.message_key(topic, prefix)),
        }
    }

    /// A logical decoding message event.
    pub fn message(
        &self,
        topic: &str,
        source: &SourceBlock<'_>,
        message: &LogicalMessage,
    ) -> Result<Vec<u8>, SinkError> {
        match self {
            Encoder::Json(e) => Ok(e.message(topic, source, message)),
        }
    }
}
