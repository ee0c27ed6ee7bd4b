//! Column values as the feed sends them: typed, in `Value`'s `oneof`
//! (the mapping is written in `feed.proto`, above `Value`).
//!
//! Text values (the default) are converted from PostgreSQL's text form;
//! binary ones (`binary = true` on the source) through the JSON mapping of
//! their binary form, which knows the same types.

use serde_json::Value as Json;
use walbridge_core::json::{ArrayNode, binary_to_json, bytea_from_text, parse_array};
use walbridge_core::{Datum, ValueKind, temporal};

use crate::pb::{self, value::Kind};

/// `datum` of a column of `kind`; with its form as the publisher sent it
/// (text, or binary) when `as_sent`.
pub(crate) fn value(datum: &Datum, kind: &ValueKind, as_sent: bool) -> pb::Value {
    match datum {
        Datum::Null => pb::Value {
            kind: Some(Kind::Null(true)),
            ..Default::default()
        },
        Datum::UnchangedToast => pb::Value {
            kind: Some(Kind::UnchangedToast(true)),
            ..Default::default()
        },
        Datum::Text(bytes) => {
            let text = String::from_utf8_lossy(bytes);
            pb::Value {
                kind: Some(from_text(&text, kind)),
                text: as_sent.then(|| text.into_owned()),
                binary: None,
            }
        }
        Datum::Binary(bytes) => pb::Value {
            kind: Some(match kind {
                ValueKind::Bytea => Kind::Bytes(bytes.clone()),
                _ => from_json(binary_to_json(bytes, kind), kind),
            }),
            text: None,
            binary: as_sent.then(|| bytes.clone()),
        },
    }
}

fn string(text: &str) -> Kind {
    Kind::String(text.to_owned())
}

fn timestamp(text: &str, with_zone: bool) -> Kind {
    match text {
        "infinity" | "-infinity" => string(text),
        _ => match temporal::timestamp_micros(text, with_zone) {
            Some(micros) => Kind::Timestamp(crate::encode::timestamp(micros)),
            None => string(text),
        },
    }
}

/// A value of `kind` from its PostgreSQL text form (or the ISO form the
/// JSON mapping writes dates and times in).
fn from_text(text: &str, kind: &ValueKind) -> Kind {
    match kind {
        ValueKind::Bool => match text {
            "t" | "true" => Kind::Bool(true),
            "f" | "false" => Kind::Bool(false),
            _ => string(text),
        },
        ValueKind::Int2 | ValueKind::Int4 | ValueKind::Int8 | ValueKind::Oid => {
            text.parse().map_or_else(|_| string(text), Kind::Int64)
        }
        ValueKind::Float4 | ValueKind::Float8 => match text {
            "NaN" => Kind::Double(f64::NAN),
            "Infinity" => Kind::Double(f64::INFINITY),
            "-Infinity" => Kind::Double(f64::NEG_INFINITY),
            _ => text.parse().map_or_else(|_| string(text), Kind::Double),
        },
        ValueKind::Numeric => Kind::Decimal(text.to_owned()),
        ValueKind::Bytea => match bytea_from_text(text) {
            Some(raw) => Kind::Bytes(raw.into()),
            None => string(text),
        },
        ValueKind::Json | ValueKind::Jsonb => Kind::Json(text.to_owned()),
        ValueKind::Timestamp => timestamp(text, false),
        ValueKind::TimestampTz => timestamp(text, true),
        ValueKind::Array { element, delimiter } => match parse_array(text, *delimiter) {
            Some(node) => array_node(&node, element),
            None => string(text),
        },
        ValueKind::Text
        | ValueKind::Date
        | ValueKind::Time
        | ValueKind::TimeTz
        | ValueKind::Interval
        | ValueKind::Uuid
        | ValueKind::Enum
        | ValueKind::Composite
        | ValueKind::Range
        | ValueKind::Other => string(text),
    }
}

fn array_node(node: &ArrayNode, element: &ValueKind) -> Kind {
    match node {
        ArrayNode::Null => Kind::Null(true),
        ArrayNode::Element(text) => from_text(text, element),
        ArrayNode::Nested(items) => Kind::Array(pb::Array {
            elements: items
                .iter()
                .map(|n| pb::Value {
                    kind: Some(array_node(n, element)),
                    ..Default::default()
                })
                .collect(),
        }),
    }
}

/// A value of `kind` from the JSON mapping of its binary form.
fn from_json(json: Json, kind: &ValueKind) -> Kind {
    match (json, kind) {
        (Json::Null, _) => Kind::Null(true),
        (json, ValueKind::Json | ValueKind::Jsonb) => Kind::Json(json.to_string()),
        (Json::Bool(b), _) => Kind::Bool(b),
        (Json::Number(n), ValueKind::Numeric) => Kind::Decimal(n.to_string()),
        (Json::Number(n), ValueKind::Float4 | ValueKind::Float8) => n
            .as_f64()
            .map_or_else(|| string(&n.to_string()), Kind::Double),
        (Json::Number(n), _) => n
            .as_i64()
            .map_or_else(|| string(&n.to_string()), Kind::Int64),
        (Json::String(s), _) => from_text(&s, kind),
        (Json::Array(items), ValueKind::Array { element, .. }) => Kind::Array(pb::Array {
            elements: items
                .into_iter()
                .map(|item| pb::Value {
                    kind: Some(from_json(item, element)),
                    ..Default::default()
                })
                .collect(),
        }),
        (other, _) => Kind::String(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(t: &str, kind: ValueKind) -> Option<Kind> {
        value(
            &Datum::Text(bytes::Bytes::copy_from_slice(t.as_bytes())),
            &kind,
            false,
        )
        .kind
    }

    #[test]
    fn text_values_map_to_their_typed_case() {
        assert_eq!(text("t", ValueKind::Bool), Some(Kind::Bool(true)));
        assert_eq!(text("-42", ValueKind::Int8), Some(Kind::Int64(-42)));
        assert_eq!(text("1.5", ValueKind::Float8), Some(Kind::Double(1.5)));
        assert!(matches!(text("NaN", ValueKind::Float4), Some(Kind::Double(d)) if d.is_nan()));
        assert_eq!(
            text("12345678901234567890.01", ValueKind::Numeric),
            Some(Kind::Decimal("12345678901234567890.01".into()))
        );
        assert_eq!(
            text("\\x00ff", ValueKind::Bytea),
            Some(Kind::Bytes(bytes::Bytes::from_static(&[0, 255])))
        );
        assert_eq!(
            text("2024-02-29 12:00:00.5+01", ValueKind::TimestampTz),
            Some(Kind::Timestamp(prost_types::Timestamp {
                seconds: 1_709_204_400,
                nanos: 500_000_000
            }))
        );
        // Before 1970: nanos stay positive.
        assert_eq!(
            text("1969-12-31 23:59:59.75", ValueKind::Timestamp),
            Some(Kind::Timestamp(prost_types::Timestamp {
                seconds: -1,
                nanos: 750_000_000
            }))
        );
        assert_eq!(
            text("infinity", ValueKind::Timestamp),
            Some(string("infinity"))
        );
        assert_eq!(
            text("{\"a\": 1}", ValueKind::Jsonb),
            Some(Kind::Json("{\"a\": 1}".into()))
        );
        assert_eq!(
            text(
                "{{1,NULL},{3,4}}",
                ValueKind::Array {
                    element: Box::new(ValueKind::Int4),
                    delimiter: b','
                }
            ),
            Some(Kind::Array(pb::Array {
                elements: [
                    [Kind::Int64(1), Kind::Null(true)],
                    [Kind::Int64(3), Kind::Int64(4)]
                ]
                .into_iter()
                .map(|row| pb::Value {
                    kind: Some(Kind::Array(pb::Array {
                        elements: row
                            .into_iter()
                            .map(|k| pb::Value {
                                kind: Some(k),
                                ..Default::default()
                            })
                            .collect()
                    })),
                    ..Default::default()
                })
                .collect()
            }))
        );
        assert_eq!(
            text("2024-01-01", ValueKind::Date),
            Some(string("2024-01-01"))
        );
        let with_text = value(
            &Datum::Text(bytes::Bytes::from_static(b"42")),
            &ValueKind::Int4,
            true,
        );
        assert_eq!(with_text.text.as_deref(), Some("42"));
    }

    #[test]
    fn binary_values_map_like_text_ones() {
        let binary = |b: &'static [u8], kind: ValueKind| {
            value(&Datum::Binary(bytes::Bytes::from_static(b)), &kind, true)
        };
        let seven = binary(&[0, 0, 0, 7], ValueKind::Int4);
        assert_eq!(seven.kind, Some(Kind::Int64(7)));
        // As sent, for consumers that want the publisher's own form.
        assert_eq!(seven.binary.as_deref(), Some(&[0u8, 0, 0, 7][..]));
        assert_eq!(seven.text, None);
        assert_eq!(binary(&[1], ValueKind::Bool).kind, Some(Kind::Bool(true)));
        assert_eq!(
            binary(&[0, 255], ValueKind::Bytea).kind,
            Some(Kind::Bytes(bytes::Bytes::from_static(&[0, 255])))
        );
        // 2000-01-01 00:00:01 UTC, as microseconds since 2000.
        assert_eq!(
            binary(&[0, 0, 0, 0, 0, 0x0f, 0x42, 0x40], ValueKind::TimestampTz).kind,
            Some(Kind::Timestamp(prost_types::Timestamp {
                seconds: 946_684_801,
                nanos: 0
            }))
        );
        assert_eq!(binary(&[0, 0, 0, 7], ValueKind::Int4).text, None);
    }
}
