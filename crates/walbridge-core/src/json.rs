//! Conversion of PostgreSQL values into JSON.
//!
//! Used by every sink that writes JSON. The mapping:
//!
//! | PostgreSQL | JSON |
//! |---|---|
//! | `int2` `int4` `int8` `oid` | number |
//! | `float4` `float8` | number, or the strings `"NaN"`, `"Infinity"`, `"-Infinity"` |
//! | `numeric` | string (lossless) |
//! | `bool` | boolean |
//! | `json` `jsonb` | the document itself, nested |
//! | `bytea` | base64 string |
//! | arrays | arrays (of converted elements; nested for multidimensional arrays) |
//! | `date` `time` `timetz` `timestamp` `timestamptz` | ISO 8601 strings |
//! | `interval` | ISO 8601 duration when the publisher session uses `IntervalStyle = iso_8601` |
//! | anything else | its text form as a string |
//! | NULL | `null` |
//!
//! Numbers keep the exact digits PostgreSQL printed (no round trip through
//! binary floating point).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Number, Value};

use crate::types::ValueKind;
use crate::value::Datum;

/// The value written for an unchanged TOASTed column (which the publisher
/// does not send) unless a sink is configured otherwise: Debezium's
/// placeholder, so existing consumers recognize it.
pub const DEFAULT_UNCHANGED_PLACEHOLDER: &str = "__debezium_unavailable_value";

/// Converts one datum to JSON. An unchanged TOASTed value becomes
/// `unchanged_placeholder`.
pub fn datum_to_json(datum: &Datum, kind: &ValueKind, unchanged_placeholder: &Value) -> Value {
    match datum {
        Datum::Null => Value::Null,
        Datum::UnchangedToast => unchanged_placeholder.clone(),
        Datum::Text(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) => text_to_json(text, kind),
            Err(_) => Value::String(String::from_utf8_lossy(bytes).into_owned()),
        },
        Datum::Binary(bytes) => binary_to_json(bytes, kind),
    }
}

/// The value as the JSON string it becomes, without building a
/// [`Value`]: for text of the kinds written as their text output as it is
/// (`None` for every other value; [`datum_to_json`] converts those).
pub fn plain_text<'a>(datum: &'a Datum, kind: &ValueKind) -> Option<&'a str> {
    match datum {
        Datum::Text(bytes) if is_plain_text(kind) => std::str::from_utf8(bytes).ok(),
        _ => None,
    }
}

/// Kinds whose JSON is their text output as a string.
fn is_plain_text(kind: &ValueKind) -> bool {
    matches!(
        kind,
        ValueKind::Numeric
            | ValueKind::Text
            | ValueKind::Interval
            | ValueKind::Uuid
            | ValueKind::Enum
            | ValueKind::Composite
            | ValueKind::Range
            | ValueKind::Time
            | ValueKind::Other
    )
}

/// Converts the text output form of a value of `kind` to JSON.
pub fn text_to_json(text: &str, kind: &ValueKind) -> Value {
    if is_plain_text(kind) {
        return Value::String(text.to_owned());
    }
    match kind {
        ValueKind::Bool => match text {
            "t" | "true" => Value::Bool(true),
            "f" | "false" => Value::Bool(false),
            _ => Value::String(text.to_owned()),
        },
        ValueKind::Int2 | ValueKind::Int4 | ValueKind::Int8 | ValueKind::Oid => integer(text),
        ValueKind::Float4 | ValueKind::Float8 => float(text),
        ValueKind::Bytea => match bytea_from_text(text) {
            Some(raw) => Value::String(BASE64.encode(raw)),
            None => Value::String(text.to_owned()),
        },
        ValueKind::Json | ValueKind::Jsonb => {
            serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
        }
        ValueKind::Date => Value::String(iso_date(text)),
        ValueKind::TimeTz => Value::String(iso_time_tz(text)),
        ValueKind::Timestamp => Value::String(iso_timestamp(text, false)),
        ValueKind::TimestampTz => Value::String(iso_timestamp(text, true)),
        ValueKind::Array { element, delimiter } => match parse_array(text, *delimiter) {
            Some(tree) => array_to_json(&tree, element),
            None => Value::String(text.to_owned()),
        },
        // The plain kinds, returned above.
        _ => Value::String(text.to_owned()),
    }
}

fn integer(text: &str) -> Value {
    let digits = text.strip_prefix('-').unwrap_or(text);
    if !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && let Ok(n) = text.parse::<Number>()
    {
        return Value::Number(n);
    }
    Value::String(text.to_owned())
}

fn float(text: &str) -> Value {
    match text {
        "NaN" | "Infinity" | "-Infinity" => Value::String(text.to_owned()),
        _ => text
            .parse::<Number>()
            .map(Value::Number)
            .unwrap_or_else(|_| Value::String(text.to_owned())),
    }
}

/// The bytes of a `bytea` in PostgreSQL's hex output form (`\x00ff`).
pub fn bytea_from_text(text: &str) -> Option<Vec<u8>> {
    let hex = text.strip_prefix("\\x")?.as_bytes();
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let nibble = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    hex.chunks_exact(2)
        .map(|pair| Some(nibble(pair[0])? << 4 | nibble(pair[1])?))
        .collect()
}

/// `0044-03-15 BC` → `-0043-03-15` (ISO 8601 uses astronomical year numbering).
fn iso_date(text: &str) -> String {
    match text.strip_suffix(" BC") {
        Some(date) => bc_to_astronomical(date),
        None => text.to_owned(),
    }
}

fn bc_to_astronomical(date: &str) -> String {
    let (year, rest) = date.split_at(date.find('-').unwrap_or(date.len()));
    match year.parse::<i64>() {
        Ok(y) => format!("-{:04}{}", y - 1, rest),
        Err(_) => date.to_owned(),
    }
}

/// Normalizes a trailing UTC offset `+05`, `+0530`-less `+05:30` or
/// `+05:30:15` so that it reads `+05:00`, `+05:30`, … and `+00` as `Z`.
fn iso_offset(offset: &str) -> String {
    let (sign, body) = offset.split_at(1);
    let mut parts = body.split(':');
    let hours = parts.next().unwrap_or("00");
    let minutes = parts.next().unwrap_or("00");
    let seconds = parts.next();
    if seconds.is_none() && hours == "00" && minutes == "00" {
        return "Z".to_owned();
    }
    match seconds {
        Some(s) => format!("{sign}{hours}:{minutes}:{s}"),
        None => format!("{sign}{hours}:{minutes}"),
    }
}

fn split_offset(text: &str) -> Option<(&str, &str)> {
    // The offset is the last '+' or '-' after the time part (dates also contain '-').
    let time_start = text.find(':')?;
    let pos = text[time_start..].rfind(['+', '-'])? + time_start;
    Some((&text[..pos], &text[pos..]))
}

fn iso_time_tz(text: &str) -> String {
    match split_offset(text) {
        Some((time, offset)) => format!("{time}{}", iso_offset(offset)),
        None => text.to_owned(),
    }
}

fn iso_timestamp(text: &str, with_zone: bool) -> String {
    if text == "infinity" || text == "-infinity" {
        return text.to_owned();
    }
    let (text, bc) = match text.strip_suffix(" BC") {
        Some(t) => (t, true),
        None => (text, false),
    };
    let (local, offset) = if with_zone {
        match split_offset(text) {
            Some((local, offset)) => (local, iso_offset(offset)),
            None => (text, String::new()),
        }
    } else {
        (text, String::new())
    };
    let local = local.replacen(' ', "T", 1);
    let local = if bc {
        bc_to_astronomical(&local)
    } else {
        local
    };
    format!("{local}{offset}")
}

/// A parsed PostgreSQL array literal.
#[derive(Debug, PartialEq)]
pub enum ArrayNode {
    /// A NULL element.
    Null,
    /// An element's text form, unquoted and unescaped.
    Element(String),
    /// A (sub)array.
    Nested(Vec<ArrayNode>),
}

/// Parses the text form of an array (`{1,2,NULL}`, `{{"a b","c\"d"}}`,
/// `[0:1]={1,2}`). Returns `None` for malformed input.
pub fn parse_array(text: &str, delimiter: u8) -> Option<ArrayNode> {
    let text = match text.strip_prefix('[') {
        Some(_) => &text[text.find('=')? + 1..],
        None => text,
    };
    let bytes = text.as_bytes();
    let mut pos = 0;
    let node = parse_array_level(bytes, &mut pos, delimiter)?;
    (pos == bytes.len()).then_some(node)
}

fn parse_array_level(b: &[u8], pos: &mut usize, delim: u8) -> Option<ArrayNode> {
    if b.get(*pos) != Some(&b'{') {
        return None;
    }
    *pos += 1;
    let mut items = Vec::new();
    if b.get(*pos) == Some(&b'}') {
        *pos += 1;
        return Some(ArrayNode::Nested(items));
    }
    loop {
        match b.get(*pos)? {
            b'{' => items.push(parse_array_level(b, pos, delim)?),
            b'"' => {
                *pos += 1;
                let mut value = Vec::new();
                loop {
                    match *b.get(*pos)? {
                        b'\\' => {
                            value.push(*b.get(*pos + 1)?);
                            *pos += 2;
                        }
                        b'"' => {
                            *pos += 1;
                            break;
                        }
                        c => {
                            value.push(c);
                            *pos += 1;
                        }
                    }
                }
                items.push(ArrayNode::Element(String::from_utf8(value).ok()?));
            }
            _ => {
                let start = *pos;
                while let Some(&c) = b.get(*pos) {
                    if c == delim || c == b'}' {
                        break;
                    }
                    *pos += 1;
                }
                let raw = std::str::from_utf8(&b[start..*pos]).ok()?.trim();
                items.push(if raw.eq_ignore_ascii_case("NULL") {
                    ArrayNode::Null
                } else {
                    ArrayNode::Element(raw.to_owned())
                });
            }
        }
        match *b.get(*pos)? {
            c if c == delim => *pos += 1,
            b'}' => {
                *pos += 1;
                return Some(ArrayNode::Nested(items));
            }
            _ => return None,
        }
    }
}

fn array_to_json(node: &ArrayNode, element: &ValueKind) -> Value {
    match node {
        ArrayNode::Null => Value::Null,
        ArrayNode::Element(text) => text_to_json(text, element),
        ArrayNode::Nested(items) => {
            Value::Array(items.iter().map(|n| array_to_json(n, element)).collect())
        }
    }
}

/// Converts the binary (`typsend`) form of a value. Types whose binary form
/// has no JSON mapping here are written as base64 of the raw bytes.
pub fn binary_to_json(bytes: &[u8], kind: &ValueKind) -> Value {
    binary_scalar(bytes, kind).unwrap_or_else(|| Value::String(BASE64.encode(bytes)))
}

fn binary_scalar(b: &[u8], kind: &ValueKind) -> Option<Value> {
    let text = |s: String| Some(Value::String(s));
    match kind {
        ValueKind::Bool => Some(Value::Bool(*b.first()? != 0)),
        ValueKind::Int2 => Some(Value::from(i16::from_be_bytes(b.try_into().ok()?))),
        ValueKind::Int4 => Some(Value::from(i32::from_be_bytes(b.try_into().ok()?))),
        ValueKind::Int8 => Some(Value::from(i64::from_be_bytes(b.try_into().ok()?))),
        ValueKind::Oid => Some(Value::from(u32::from_be_bytes(b.try_into().ok()?))),
        ValueKind::Float4 => Some(float_value(
            f64::from(f32::from_be_bytes(b.try_into().ok()?)),
            || f32::from_be_bytes(b.try_into().unwrap_or_default()).to_string(),
        )),
        ValueKind::Float8 => {
            let v = f64::from_be_bytes(b.try_into().ok()?);
            Some(float_value(v, || v.to_string()))
        }
        ValueKind::Bytea => text(BASE64.encode(b)),
        ValueKind::Text | ValueKind::Enum => text(std::str::from_utf8(b).ok()?.to_owned()),
        ValueKind::Json => serde_json::from_slice(b).ok(),
        ValueKind::Jsonb => match b.split_first() {
            Some((1, doc)) => serde_json::from_slice(doc).ok(),
            _ => None,
        },
        ValueKind::Uuid => {
            let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
            if h.len() != 32 {
                return None;
            }
            text(format!(
                "{}-{}-{}-{}-{}",
                &h[0..8],
                &h[8..12],
                &h[12..16],
                &h[16..20],
                &h[20..]
            ))
        }
        ValueKind::Date => {
            let days = i32::from_be_bytes(b.try_into().ok()?);
            text(match days {
                i32::MAX => "infinity".to_owned(),
                i32::MIN => "-infinity".to_owned(),
                d => format_date(i64::from(d)),
            })
        }
        ValueKind::Time => text(format_time(i64::from_be_bytes(b.try_into().ok()?))),
        ValueKind::Timestamp | ValueKind::TimestampTz => {
            let micros = i64::from_be_bytes(b.try_into().ok()?);
            let zone = if matches!(kind, ValueKind::TimestampTz) {
                "Z"
            } else {
                ""
            };
            text(match micros {
                i64::MAX => "infinity".to_owned(),
                i64::MIN => "-infinity".to_owned(),
                m => format!(
                    "{}T{}{zone}",
                    format_date(m.div_euclid(MICROS_PER_DAY)),
                    format_time(m.rem_euclid(MICROS_PER_DAY))
                ),
            })
        }
        ValueKind::Numeric => text(numeric_binary_to_string(b)?),
        ValueKind::Interval => {
            let micros = i64::from_be_bytes(b.get(0..8)?.try_into().ok()?);
            let days = i32::from_be_bytes(b.get(8..12)?.try_into().ok()?);
            let months = i32::from_be_bytes(b.get(12..16)?.try_into().ok()?);
            (b.len() == 16).then(|| Value::String(iso_interval(months, days, micros)))
        }
        ValueKind::Array { element, .. } => binary_array(b, element),
        _ => None,
    }
}

/// An interval as PostgreSQL's `iso_8601` IntervalStyle writes it.
fn iso_interval(months: i32, days: i32, micros: i64) -> String {
    let mut out = String::from("P");
    let (years, months) = (months / 12, months % 12);
    for (n, unit) in [
        (i64::from(years), 'Y'),
        (i64::from(months), 'M'),
        (i64::from(days), 'D'),
    ] {
        if n != 0 {
            out.push_str(&format!("{n}{unit}"));
        }
    }
    if micros != 0 {
        out.push('T');
        let (hours, rest) = (micros / 3_600_000_000, micros % 3_600_000_000);
        let (minutes, rest) = (rest / 60_000_000, rest % 60_000_000);
        if hours != 0 {
            out.push_str(&format!("{hours}H"));
        }
        if minutes != 0 {
            out.push_str(&format!("{minutes}M"));
        }
        if rest != 0 {
            let (secs, frac) = (rest / 1_000_000, (rest % 1_000_000).abs());
            let sign = if rest < 0 && secs == 0 { "-" } else { "" };
            if frac == 0 {
                out.push_str(&format!("{sign}{secs}S"));
            } else {
                let digits = format!("{frac:06}");
                out.push_str(&format!("{sign}{secs}.{}S", digits.trim_end_matches('0')));
            }
        }
    }
    if out == "P" { "PT0S".to_owned() } else { out }
}

/// `array_send` format: ndim, has-null flag, element type, (size, lower
/// bound) per dimension, then each element as length (-1 for NULL) and bytes.
fn binary_array(b: &[u8], element: &ValueKind) -> Option<Value> {
    let int = |at: usize| -> Option<i32> {
        Some(i32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
    };
    let ndim = usize::try_from(int(0)?).ok()?;
    if ndim == 0 {
        return Some(Value::Array(Vec::new()));
    }
    if ndim > 6 {
        return None;
    }
    let dims: Vec<usize> = (0..ndim)
        .map(|d| usize::try_from(int(12 + 8 * d)?).ok())
        .collect::<Option<_>>()?;
    let mut pos = 12 + 8 * ndim;
    let total = dims.iter().try_fold(1usize, |acc, d| acc.checked_mul(*d))?;
    let mut flat = Vec::with_capacity(total.min(b.len()));
    for _ in 0..total {
        let len = int(pos)?;
        pos += 4;
        flat.push(match usize::try_from(len) {
            Ok(len) => {
                let data = b.get(pos..pos + len)?;
                pos += len;
                binary_scalar(data, element).unwrap_or_else(|| Value::String(BASE64.encode(data)))
            }
            Err(_) => Value::Null,
        });
    }
    if pos != b.len() {
        return None;
    }
    // Nest the flat, row-major elements by dimension, innermost first.
    let mut level = flat;
    for &size in dims.iter().skip(1).rev() {
        let mut rows = Vec::with_capacity(level.len() / size.max(1));
        let mut items = level.into_iter();
        loop {
            let row: Vec<Value> = items.by_ref().take(size).collect();
            if row.is_empty() {
                break;
            }
            rows.push(Value::Array(row));
        }
        level = rows;
    }
    Some(Value::Array(level))
}

fn float_value(v: f64, shortest: impl Fn() -> String) -> Value {
    if v.is_nan() {
        Value::String("NaN".into())
    } else if v.is_infinite() {
        Value::String(if v > 0.0 { "Infinity" } else { "-Infinity" }.into())
    } else {
        shortest()
            .parse::<Number>()
            .map(Value::Number)
            .unwrap_or(Value::Null)
    }
}

const MICROS_PER_DAY: i64 = 86_400_000_000;

/// Formats days since 2000-01-01 as an ISO 8601 date (proleptic Gregorian,
/// astronomical years).
fn format_date(days_since_2000: i64) -> String {
    // Howard Hinnant's civil_from_days, shifted to the PostgreSQL epoch.
    let z = days_since_2000 + 10_957 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    if year < 0 {
        format!("-{:04}-{month:02}-{day:02}", -year)
    } else {
        format!("{year:04}-{month:02}-{day:02}")
    }
}

fn format_time(micros: i64) -> String {
    let secs = micros / 1_000_000;
    let frac = micros % 1_000_000;
    let base = format!("{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60);
    if frac == 0 {
        base
    } else {
        let digits = format!("{frac:06}");
        format!("{base}.{}", digits.trim_end_matches('0'))
    }
}

/// Decodes numeric's binary form: ndigits, weight, sign, dscale, base-10000 digits.
fn numeric_binary_to_string(b: &[u8]) -> Option<String> {
    let word = |i: usize| -> Option<i16> { Some(i16::from_be_bytes([*b.get(i)?, *b.get(i + 1)?])) };
    let ndigits = usize::try_from(word(0)?).ok()?;
    let weight = i64::from(word(2)?);
    let sign = u16::from_be_bytes([*b.get(4)?, *b.get(5)?]);
    let dscale = usize::try_from(word(6)?).ok()?;
    match sign {
        0xC000 => return Some("NaN".into()),
        0xD000 => return Some("Infinity".into()),
        0xF000 => return Some("-Infinity".into()),
        0x0000 | 0x4000 => {}
        _ => return None,
    }
    let digits: Vec<i64> = (0..ndigits)
        .map(|i| word(8 + 2 * i).map(i64::from))
        .collect::<Option<_>>()?;
    let digit_at = |idx: i64| -> i64 {
        usize::try_from(idx)
            .ok()
            .and_then(|i| digits.get(i).copied())
            .unwrap_or(0)
    };
    let mut out = String::new();
    if sign == 0x4000 {
        out.push('-');
    }
    if weight < 0 {
        out.push('0');
    } else {
        for idx in 0..=weight {
            let d = digit_at(idx);
            if idx == 0 {
                out.push_str(&d.to_string());
            } else {
                out.push_str(&format!("{d:04}"));
            }
        }
    }
    if dscale > 0 {
        out.push('.');
        let mut frac = String::new();
        let mut idx = weight + 1;
        while frac.len() < dscale {
            frac.push_str(&format!("{:04}", digit_at(idx)));
            idx += 1;
        }
        frac.truncate(dscale);
        out.push_str(&frac);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn t(text: &str, kind: ValueKind) -> Value {
        text_to_json(text, &kind)
    }

    #[test]
    fn scalars() {
        assert_eq!(t("t", ValueKind::Bool), json!(true));
        assert_eq!(t("-32768", ValueKind::Int2), json!(-32768));
        assert_eq!(
            t("9223372036854775807", ValueKind::Int8).to_string(),
            "9223372036854775807"
        );
        assert_eq!(t("0.1", ValueKind::Float4).to_string(), "0.1");
        assert_eq!(
            t("1.7976931348623157e+308", ValueKind::Float8).to_string(),
            "1.7976931348623157e+308"
        );
        assert_eq!(t("NaN", ValueKind::Float8), json!("NaN"));
        assert_eq!(t("-Infinity", ValueKind::Float4), json!("-Infinity"));
        assert_eq!(
            t("123456789012345678901234567890.123", ValueKind::Numeric),
            json!("123456789012345678901234567890.123")
        );
        assert_eq!(t("\\xdeadbeef", ValueKind::Bytea), json!("3q2+7w=="));
        assert_eq!(
            t(r#"{"a": [1, 2.50]}"#, ValueKind::Jsonb).to_string(),
            r#"{"a":[1,2.50]}"#
        );
    }

    #[test]
    fn dates_and_times_are_iso_8601() {
        assert_eq!(t("2024-02-29", ValueKind::Date), json!("2024-02-29"));
        assert_eq!(t("0044-03-15 BC", ValueKind::Date), json!("-0043-03-15"));
        assert_eq!(
            t("2024-02-29 13:14:15.5", ValueKind::Timestamp),
            json!("2024-02-29T13:14:15.5")
        );
        assert_eq!(
            t("2024-02-29 13:14:15.5+00", ValueKind::TimestampTz),
            json!("2024-02-29T13:14:15.5Z")
        );
        assert_eq!(
            t("2024-02-29 13:14:15-05:30", ValueKind::TimestampTz),
            json!("2024-02-29T13:14:15-05:30")
        );
        assert_eq!(t("13:14:15+02", ValueKind::TimeTz), json!("13:14:15+02:00"));
        assert_eq!(t("infinity", ValueKind::TimestampTz), json!("infinity"));
    }

    #[test]
    fn arrays_nest_and_convert_elements() {
        let ints = ValueKind::Array {
            element: Box::new(ValueKind::Int4),
            delimiter: b',',
        };
        assert_eq!(t("{1,2,NULL}", ints.clone()), json!([1, 2, null]));
        assert_eq!(t("{{1,2},{3,4}}", ints.clone()), json!([[1, 2], [3, 4]]));
        assert_eq!(t("[0:1]={5,6}", ints.clone()), json!([5, 6]));
        assert_eq!(t("{}", ints), json!([]));
        let texts = ValueKind::Array {
            element: Box::new(ValueKind::Text),
            delimiter: b',',
        };
        assert_eq!(
            t(r#"{"a b","c\"d",NULL,"NULL"}"#, texts.clone()),
            json!(["a b", "c\"d", null, "NULL"])
        );
        assert_eq!(t("{unterminated", texts), json!("{unterminated"));
    }

    #[test]
    fn binary_forms() {
        assert_eq!(
            binary_to_json(&42i32.to_be_bytes(), &ValueKind::Int4),
            json!(42)
        );
        assert_eq!(
            binary_to_json(&0i32.to_be_bytes(), &ValueKind::Date),
            json!("2000-01-01")
        );
        assert_eq!(
            binary_to_json(&(-1i32).to_be_bytes(), &ValueKind::Date),
            json!("1999-12-31")
        );
        let ts = 86_400_000_000i64 + 1_500_000;
        assert_eq!(
            binary_to_json(&ts.to_be_bytes(), &ValueKind::TimestampTz),
            json!("2000-01-02T00:00:01.5Z")
        );
        // numeric 12345.678: ndigits 3, weight 1, sign +, dscale 3, digits 1 2345 6780
        let mut n = Vec::new();
        for w in [3i16, 1, 0, 3, 1, 2345, 6780] {
            n.extend_from_slice(&w.to_be_bytes());
        }
        assert_eq!(binary_to_json(&n, &ValueKind::Numeric), json!("12345.678"));
        assert_eq!(binary_to_json(&[1, 2, 3], &ValueKind::Int4), json!("AQID"));
        // interval '1 year 2 months 3 days 04:05:06.5'
        let mut iv = Vec::new();
        iv.extend_from_slice(&14_706_500_000i64.to_be_bytes());
        iv.extend_from_slice(&3i32.to_be_bytes());
        iv.extend_from_slice(&14i32.to_be_bytes());
        assert_eq!(
            binary_to_json(&iv, &ValueKind::Interval),
            json!("P1Y2M3DT4H5M6.5S")
        );
        assert_eq!(iso_interval(0, 0, 0), "PT0S");
        assert_eq!(iso_interval(0, -1, -500_000), "P-1DT-0.5S");
        // int4[][] '{{1,NULL},{3,4}}'
        let mut arr = Vec::new();
        for w in [2i32, 1, 23, 2, 1, 2, 1] {
            arr.extend_from_slice(&w.to_be_bytes());
        }
        for v in [Some(1i32), None, Some(3), Some(4)] {
            match v {
                Some(v) => {
                    arr.extend_from_slice(&4i32.to_be_bytes());
                    arr.extend_from_slice(&v.to_be_bytes());
                }
                None => arr.extend_from_slice(&(-1i32).to_be_bytes()),
            }
        }
        let ints = ValueKind::Array {
            element: Box::new(ValueKind::Int4),
            delimiter: b',',
        };
        assert_eq!(binary_to_json(&arr, &ints), json!([[1, null], [3, 4]]));
        assert_eq!(
            binary_to_json(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 23], &ints),
            json!([])
        );
        assert_eq!(
            binary_to_json(&arr[..arr.len() - 1], &ints),
            json!(BASE64.encode(&arr[..arr.len() - 1]))
        );
    }
}
