/// Microseconds between the Unix epoch and PostgreSQL's epoch (2000-01-01 UTC).
const PG_EPOCH_OFFSET_MICROS: i64 = 946_684_800_000_000;

/// A timestamp as PostgreSQL's replication protocol sends it: microseconds
/// since 2000-01-01 00:00:00 UTC.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PgTimestamp(pub i64);

impl PgTimestamp {
    /// Microseconds since the Unix epoch.
    pub fn unix_micros(self) -> i64 {
        self.0.saturating_add(PG_EPOCH_OFFSET_MICROS)
    }

    /// The timestamp for `micros` microseconds since the Unix epoch.
    pub fn from_unix_micros(micros: i64) -> Self {
        PgTimestamp(micros.saturating_sub(PG_EPOCH_OFFSET_MICROS))
    }

    /// The current wall-clock time.
    pub fn now() -> Self {
        let micros = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        Self::from_unix_micros(micros)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_between_epochs() {
        assert_eq!(PgTimestamp(0).unix_micros(), 946_684_800_000_000);
        assert_eq!(
            PgTimestamp::from_unix_micros(946_684_800_000_001),
            PgTimestamp(1)
        );
    }
}
