//! Sizes and durations as configuration files write them: a bare number,
//! or text with a unit (`"64MiB"`, `"30s"`).

use serde::Deserialize;

/// A size in bytes, written as an integer or with a unit: `"64MiB"`, `"1GB"`, `"512kB"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub u64);

/// Splits `"64MiB"` into `64` and `"MiB"`.
fn number_and_unit(text: &str) -> Option<(u64, &str)> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    Some((number.parse().ok()?, unit.trim()))
}

impl ByteSize {
    /// Parses `64MiB`, `64MB`, `512kB`, `1G`, `100`.
    pub fn parse(text: &str) -> Option<Self> {
        let (n, unit) = number_and_unit(text)?;
        let mult: u64 = match unit.to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" | "kib" => 1 << 10,
            "m" | "mb" | "mib" => 1 << 20,
            "g" | "gb" | "gib" => 1 << 30,
            _ => return None,
        };
        n.checked_mul(mult).map(ByteSize)
    }
}

/// Deserializes a value written as a bare number (`from_number`) or as text
/// with a unit (`parse`); `hint` says what good text looks like.
fn number_or_text<'de, D: serde::Deserializer<'de>, T>(
    d: D,
    from_number: impl FnOnce(u64) -> T,
    parse: impl FnOnce(&str) -> Option<T>,
    hint: &str,
) -> Result<T, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Int(u64),
        Text(String),
    }
    match Raw::deserialize(d)? {
        Raw::Int(n) => Ok(from_number(n)),
        Raw::Text(t) => {
            parse(&t).ok_or_else(|| serde::de::Error::custom(format!("`{t}` is not {hint}")))
        }
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        number_or_text(
            d,
            ByteSize,
            ByteSize::parse,
            "a size; write e.g. 64MiB, 512kB or 1GB",
        )
    }
}

/// A duration written as `"500ms"`, `"30s"`, `"15m"`, `"24h"`, `"7d"`, or whole seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationText(pub std::time::Duration);

impl DurationText {
    /// Parses the forms above.
    pub fn parse(text: &str) -> Option<Self> {
        let (n, unit) = number_and_unit(text)?;
        let seconds = |mult: u64| n.checked_mul(mult).map(std::time::Duration::from_secs);
        let d = match unit {
            "ms" => Some(std::time::Duration::from_millis(n)),
            "" | "s" => seconds(1),
            "m" | "min" => seconds(60),
            "h" => seconds(3600),
            "d" => seconds(86_400),
            _ => None,
        }?;
        Some(DurationText(d))
    }
}

impl<'de> Deserialize<'de> for DurationText {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        number_or_text(
            d,
            |n| DurationText(std::time::Duration::from_secs(n)),
            DurationText::parse,
            "a duration; write e.g. 500ms, 30s, 15m, 24h or 7d",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(ByteSize::parse("64MiB"), Some(ByteSize(64 << 20)));
        assert_eq!(ByteSize::parse("512kB"), Some(ByteSize(512 << 10)));
        assert_eq!(ByteSize::parse("100"), Some(ByteSize(100)));
        assert_eq!(ByteSize::parse("1 GB"), Some(ByteSize(1 << 30)));
        assert_eq!(ByteSize::parse("lots"), None);
        assert_eq!(ByteSize::parse("5TB"), None);
    }

    #[test]
    fn durations() {
        use std::time::Duration;
        let secs = |s| DurationText::parse(s).map(|d| d.0);
        assert_eq!(secs("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(secs("30"), Some(Duration::from_secs(30)));
        assert_eq!(secs("15m"), Some(Duration::from_secs(900)));
        assert_eq!(secs("24h"), Some(Duration::from_secs(86_400)));
        assert_eq!(secs("7d"), Some(Duration::from_secs(604_800)));
        assert_eq!(secs("soon"), None);
        assert_eq!(secs("5w"), None);
    }
}
