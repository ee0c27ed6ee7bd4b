//! Dates and times from PostgreSQL's text output (`DateStyle = ISO`) or
//! the ISO 8601 forms [`crate::json`] writes, as numbers since the Unix
//! epoch (what Avro's logical types and protobuf timestamps hold).
//! `infinity` and `-infinity` become the largest and smallest
//! representable values.

/// Microseconds per day.
const DAY_MICROS: i64 = 86_400_000_000;

/// Days from 1970-01-01 to the proleptic Gregorian date (year may be ≤ 0).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Splits a trailing ` BC` off; returns the text and whether it was there.
fn strip_bc(text: &str) -> (&str, bool) {
    match text.strip_suffix(" BC") {
        Some(rest) => (rest, true),
        None => (text, false),
    }
}

/// `YYYY-MM-DD` (year possibly negative or longer than four digits) at
/// the start of `text`: the day number and the rest of the text.
fn date_prefix(text: &str, bc: bool) -> Option<(i64, &str)> {
    let (negative, body) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let year_end = body.find('-')?;
    let year: i64 = body[..year_end].parse().ok()?;
    let rest = &body[year_end + 1..];
    let month: i64 = rest.get(..2)?.parse().ok()?;
    let day: i64 = rest.get(3..5)?.parse().ok()?;
    if rest.as_bytes().get(2) != Some(&b'-')
        || !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
    {
        return None;
    }
    // ISO uses astronomical years (0 = 1 BC); PostgreSQL writes `0044 BC`.
    let year = match (negative, bc) {
        (true, _) => -year,
        (false, true) => 1 - year,
        (false, false) => year,
    };
    Some((days_from_civil(year, month, day), &rest[5..]))
}

/// A `date` as days since 1970-01-01.
pub fn date_days(text: &str) -> Option<i32> {
    match text {
        "infinity" => return Some(i32::MAX),
        "-infinity" => return Some(i32::MIN),
        _ => {}
    }
    let (text, bc) = strip_bc(text);
    let (days, rest) = date_prefix(text, bc)?;
    if !rest.is_empty() {
        return None;
    }
    i32::try_from(days).ok()
}

/// `HH:MM:SS[.ffffff]` at the start of `text`: microseconds since midnight
/// and the rest.
fn time_prefix(text: &str) -> Option<(i64, &str)> {
    let bytes = text.as_bytes();
    if bytes.len() < 8 || bytes[2] != b':' || bytes[5] != b':' {
        return None;
    }
    let hours: i64 = text[..2].parse().ok()?;
    let minutes: i64 = text[3..5].parse().ok()?;
    let seconds: i64 = text[6..8].parse().ok()?;
    let mut rest = &text[8..];
    let mut micros = 0;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 6 {
            return None;
        }
        let value: i64 = fraction[..digits].parse().ok()?;
        micros = value * 10_i64.pow(6 - digits as u32);
        rest = &fraction[digits..];
    }
    if hours > 24 || minutes > 59 || seconds > 60 {
        return None;
    }
    Some((
        ((hours * 60 + minutes) * 60 + seconds) * 1_000_000 + micros,
        rest,
    ))
}

/// A `time` as microseconds since midnight.
pub fn time_micros(text: &str) -> Option<i64> {
    match time_prefix(text)? {
        (micros, "") => Some(micros),
        _ => None,
    }
}

/// A UTC offset `Z`, `±HH`, `±HH:MM` or `±HH:MM:SS`, in microseconds.
fn offset_micros(text: &str) -> Option<i64> {
    if text == "Z" {
        return Some(0);
    }
    let (sign, body) = match text.as_bytes().first()? {
        b'+' => (1, &text[1..]),
        b'-' => (-1, &text[1..]),
        _ => return None,
    };
    let mut seconds = 0;
    for (i, part) in body.split(':').enumerate() {
        let value: i64 = part.parse().ok()?;
        seconds += value * [3600, 60, 1].get(i)?;
    }
    Some(sign * seconds * 1_000_000)
}

/// A `timestamp` (`with_zone = false`) or `timestamptz` as microseconds
/// since 1970-01-01 00:00 (UTC for `timestamptz`; a `timestamp` as if UTC).
pub fn timestamp_micros(text: &str, with_zone: bool) -> Option<i64> {
    match text {
        "infinity" => return Some(i64::MAX),
        "-infinity" => return Some(i64::MIN),
        _ => {}
    }
    let (text, bc) = strip_bc(text);
    let (days, rest) = date_prefix(text, bc)?;
    let rest = rest.strip_prefix([' ', 'T'])?;
    let (micros, zone) = time_prefix(rest)?;
    let offset = match (zone, with_zone) {
        ("", _) => 0,
        (zone, true) => offset_micros(zone)?,
        (_, false) => return None,
    };
    days.checked_mul(DAY_MICROS)?
        .checked_add(micros)?
        .checked_sub(offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(date_days("1970-01-01"), Some(0));
        assert_eq!(date_days("2024-05-06"), Some(19_849));
        assert_eq!(date_days("1969-12-31"), Some(-1));
        assert_eq!(date_days("0001-01-01 BC"), date_days("0000-01-01"));
        assert_eq!(date_days("0044-03-15 BC"), date_days("-0043-03-15"));
        assert_eq!(date_days("infinity"), Some(i32::MAX));
        assert_eq!(date_days("2024-13-01"), None);
        assert_eq!(date_days("yesterday"), None);
    }

    #[test]
    fn times_and_timestamps() {
        assert_eq!(time_micros("00:00:00"), Some(0));
        assert_eq!(time_micros("07:08:09.5"), Some(25_689_500_000));
        assert_eq!(time_micros("24:00:00"), Some(DAY_MICROS));
        assert_eq!(time_micros("7:08"), None);
        let t = 1_714_979_289_123_456;
        assert_eq!(
            timestamp_micros("2024-05-06 07:08:09.123456", false),
            Some(t)
        );
        assert_eq!(
            timestamp_micros("2024-05-06T07:08:09.123456", false),
            Some(t)
        );
        assert_eq!(
            timestamp_micros("2024-05-06 07:08:09.123456+00", true),
            Some(t)
        );
        assert_eq!(
            timestamp_micros("2024-05-06T07:08:09.123456Z", true),
            Some(t)
        );
        assert_eq!(
            timestamp_micros("2024-05-06 09:38:09.123456+02:30", true),
            Some(t)
        );
        assert_eq!(timestamp_micros("2024-05-06 07:08:09+00", false), None);
        assert_eq!(timestamp_micros("-infinity", true), Some(i64::MIN));
        assert!(timestamp_micros("0100-01-01 00:00:00 BC", false).is_some_and(|m| m < 0));
    }
}
