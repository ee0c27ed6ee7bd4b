//! Where and when a change was made, as the sinks that write events
//! describe it (the kafka envelope's `source` block, a jsonl line's
//! `source` object).

use walbridge_core::{Lsn, PgTimestamp, Relation, TransactionInfo};

/// Where and when a change was made.
#[derive(Clone, Debug)]
pub struct SourceBlock<'a> {
    /// The walbridge source's name.
    pub name: &'a str,
    /// The publisher's database.
    pub database: &'a str,
    /// The table's schema, if the event is about one table.
    pub schema: Option<&'a str>,
    /// The table's name, if the event is about one table.
    pub table: Option<&'a str>,
    /// WAL position of the change (the consistent point for snapshot rows).
    pub lsn: Lsn,
    /// Commit LSN of the transaction, `None` outside one.
    pub commit_lsn: Option<Lsn>,
    /// Transaction id, `None` outside one.
    pub xid: Option<u32>,
    /// Commit time (for snapshot rows and non-transactional messages, the
    /// time walbridge handled them), microseconds since the Unix epoch.
    pub ts_us: i64,
    /// True for snapshot rows.
    pub snapshot: bool,
}

impl<'a> SourceBlock<'a> {
    /// The block of a change at `lsn` of `relation` (none: an event about
    /// no one table), in `transaction` (none: outside one, stamped now).
    pub fn new(
        name: &'a str,
        database: &'a str,
        relation: Option<&'a Relation>,
        lsn: Lsn,
        transaction: Option<&TransactionInfo>,
    ) -> Self {
        SourceBlock {
            name,
            database,
            schema: relation.map(|r| r.schema.as_str()),
            table: relation.map(|r| r.name.as_str()),
            lsn,
            commit_lsn: transaction.map(|t| t.commit_lsn),
            xid: transaction.map(|t| t.xid),
            ts_us: transaction.map_or_else(
                || PgTimestamp::now().unix_micros(),
                |t| t.commit_time.unix_micros(),
            ),
            snapshot: false,
        }
    }
}
