use std::fmt;
use std::str::FromStr;

/// A position in PostgreSQL's write-ahead log (`pg_lsn`).
///
/// Displayed and parsed in PostgreSQL's `X/Y` form (two hexadecimal halves
/// of the 64-bit value). Ordering is WAL order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

impl Lsn {
    /// The invalid position `0/0`, which PostgreSQL uses for "none".
    pub const ZERO: Lsn = Lsn(0);

    /// True for `0/0`.
    pub fn is_zero(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

/// The text given to [`Lsn::from_str`] is not of the form `X/Y`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{0}` is not a WAL position; expected two hexadecimal numbers separated by a slash, like 16/B374D848"
)]
pub struct ParseLsnError(pub String);

impl FromStr for Lsn {
    type Err = ParseLsnError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseLsnError(s.to_owned());
        let (hi, lo) = s.trim().split_once('/').ok_or_else(err)?;
        let hi = u32::from_str_radix(hi, 16).map_err(|_| err())?;
        let lo = u32::from_str_radix(lo, 16).map_err(|_| err())?;
        Ok(Lsn((u64::from(hi) << 32) | u64::from(lo)))
    }
}

/// Written as PostgreSQL writes it, `"16/B374D848"`.
impl serde::Serialize for Lsn {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Lsn {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl From<u64> for Lsn {
    fn from(value: u64) -> Self {
        Lsn(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn formats_like_postgres() {
        assert_eq!(Lsn(0x16_B374_D848).to_string(), "16/B374D848");
        assert_eq!(Lsn::ZERO.to_string(), "0/0");
        assert_eq!("16/B374D848".parse::<Lsn>(), Ok(Lsn(0x16_B374_D848)));
        assert!("16B374D848".parse::<Lsn>().is_err());
        assert!("x/1".parse::<Lsn>().is_err());
        assert!("1/100000000".parse::<Lsn>().is_err());
        let json = serde_json::to_string(&Lsn(0x16_B374_D848)).unwrap_or_default();
        assert_eq!(json, "\"16/B374D848\"");
        assert_eq!(
            serde_json::from_str::<Lsn>(&json).ok(),
            Some(Lsn(0x16_B374_D848))
        );
    }

    proptest! {
        #[test]
        fn display_parse_round_trip(v: u64) {
            prop_assert_eq!(Lsn(v).to_string().parse::<Lsn>(), Ok(Lsn(v)));
        }
    }
}
