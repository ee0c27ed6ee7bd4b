//! A publisher snapshot (`pg_current_snapshot()`), and which transactions
//! of the stream it shows.

/// `xmin:xmax:xip,…` as `pg_snapshot`'s text form writes it, with full
/// (epoch-extended) transaction ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgSnapshot {
    /// Every transaction before it had ended.
    pub xmin: u64,
    /// No transaction from it on had ended.
    pub xmax: u64,
    /// Transactions in between that were still running.
    pub running: Vec<u64>,
}

impl PgSnapshot {
    /// Parses the text form; `None` when malformed.
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.trim().splitn(3, ':');
        let xmin = parts.next()?.parse().ok()?;
        let xmax = parts.next()?.parse().ok()?;
        let running = match parts.next()? {
            "" => Vec::new(),
            list => list
                .split(',')
                .map(|x| x.parse().ok())
                .collect::<Option<Vec<u64>>>()?,
        };
        Some(PgSnapshot {
            xmin,
            xmax,
            running,
        })
    }

    /// True when the snapshot shows the effects of top-level transaction
    /// `xid` (32 bits, as the stream gives it), assuming it committed:
    /// it had ended before the snapshot was taken.
    pub fn shows(&self, xid: u32) -> bool {
        // Place the 32-bit xid in the epoch that puts it closest below
        // xmax: the transaction was assigned before the snapshot or not
        // long after it, never 2^31 transactions away.
        let epoch = self.xmax >> 32;
        let mut full = (epoch << 32) | u64::from(xid);
        if full > self.xmax.saturating_add(1 << 31) && full >= 1 << 32 {
            full -= 1 << 32;
        }
        full < self.xmin || (full < self.xmax && !self.running.contains(&full))
    }

    /// The text form, for SQL.
    pub fn text(&self) -> String {
        let running: Vec<String> = self.running.iter().map(u64::to_string).collect();
        format!("{}:{}:{}", self.xmin, self.xmax, running.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_tells_what_it_shows() {
        let s = PgSnapshot::parse("100:105:101,103").unwrap_or_else(|| panic!("parse"));
        assert_eq!(s.running, vec![101, 103]);
        assert_eq!(s.text(), "100:105:101,103");
        assert!(s.shows(99));
        assert!(s.shows(100), "ended before, below xmax and not running");
        assert!(!s.shows(101));
        assert!(s.shows(102));
        assert!(!s.shows(103));
        assert!(!s.shows(105));
        assert!(!s.shows(200));
        assert_eq!(PgSnapshot::parse("7:7:").map(|s| s.running.len()), Some(0));
        assert!(PgSnapshot::parse("7:x:").is_none());
    }

    #[test]
    fn places_32_bit_xids_in_the_right_epoch() {
        // xmax just past a wraparound of the 32-bit counter.
        let base = 3u64 << 32;
        let s = PgSnapshot {
            xmin: base - 10,
            xmax: base + 5,
            running: vec![base - 2, base + 1],
        };
        assert!(s.shows((base - 11) as u32), "before xmin, previous epoch");
        assert!(!s.shows((base - 2) as u32), "running, previous epoch");
        assert!(s.shows((base - 1) as u32));
        assert!(!s.shows(1), "running, this epoch");
        assert!(s.shows(2));
        assert!(!s.shows(5), "at xmax");
    }
}
