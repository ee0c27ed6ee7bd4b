//! Sequences on the target (a source with `sequences = true`, and
//! `walbridge sync-sequences`): each set with `setval` to the publisher's
//! last value, never backwards — a value read on the publisher is ahead
//! of the rows around it, and one read earlier may arrive again.
//!
//! `setval` does not roll back, so each runs on the lookup connection in
//! a statement of its own: one the target refuses (no such sequence, a
//! value past its bounds, no privilege) does not touch the apply
//! transaction, and is reported by name.

use tokio_postgres::Client;
use walbridge_core::SequenceValues;
use walbridge_pg::{quote_ident, quote_qualified};

use crate::mapping::NameTemplate;

/// What became of one sequence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SequenceOutcome {
    /// Set to the value.
    Set,
    /// The target's was already there or past it.
    Ahead,
    /// No such sequence on the target.
    Missing,
    /// The target refused: the reason.
    Refused(String),
}

/// One sequence's place on the target and what became of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SequenceResult {
    /// `schema.name` on the target.
    pub target: String,
    /// The publisher's value.
    pub value: i64,
    /// What happened.
    pub outcome: SequenceOutcome,
}

/// Sets each of `values`' sequences, named on the target through
/// `template`, unless the target's is already there (for a descending
/// sequence: already below).
pub async fn set_sequences(
    client: &Client,
    template: &NameTemplate,
    source: &str,
    values: &SequenceValues,
) -> Vec<SequenceResult> {
    let mut results = Vec::with_capacity(values.sequences.len());
    for sequence in &values.sequences {
        let (schema, name) = template.render(source, &sequence.schema, &sequence.name);
        let (quoted, target) = match &schema {
            Some(s) => (quote_qualified(s, &name), format!("{s}.{name}")),
            None => (quote_ident(&name), name.clone()),
        };
        let outcome = match client
            .query_one(
                "SELECT CASE \
                   WHEN q.seqrelid IS NULL THEN 'missing' \
                   WHEN CASE WHEN q.seqincrement > 0 \
                             THEN coalesce(pg_sequence_last_value(q.seqrelid) < $2, true) \
                             ELSE coalesce(pg_sequence_last_value(q.seqrelid) > $2, true) END \
                     THEN CASE WHEN setval(q.seqrelid, $2) IS NOT NULL THEN 'set' END \
                   ELSE 'ahead' END \
                 FROM (SELECT to_regclass($1) AS relid) r \
                 LEFT JOIN pg_sequence q ON q.seqrelid = r.relid",
                &[&quoted, &sequence.last_value],
            )
            .await
        {
            Ok(row) => match row.get::<_, Option<String>>(0).as_deref() {
                Some("set") => SequenceOutcome::Set,
                Some("missing") => SequenceOutcome::Missing,
                _ => SequenceOutcome::Ahead,
            },
            Err(e) => SequenceOutcome::Refused(walbridge_pg::describe_pg_error(&e)),
        };
        results.push(SequenceResult {
            target,
            value: sequence.last_value,
            outcome,
        });
    }
    results
}
