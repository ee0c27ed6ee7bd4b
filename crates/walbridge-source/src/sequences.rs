//! Sequences (`sequences = true`): logical decoding carries no trace of
//! them, so they are read from the catalog — the published tables'
//! sequences, or every sequence under a `FOR ALL TABLES` publication.
//! A value read is at least every value any row written so far holds
//! (`pg_sequences.last_value` counts what sessions cached), so handing it
//! on ahead of the stream is safe for consumers that never go backwards.

use std::collections::HashMap;

use tokio_postgres::Client;
use walbridge_core::{PgTimestamp, SequenceValue, SequenceValues};

use crate::catalog::CatalogError;

/// The sequences `publications` cover, with their last values (those
/// never used are left out), ordered by schema and name. `lsn` is where
/// the stream hands them on.
pub async fn read_sequences(
    client: &Client,
    publications: &[String],
    lsn: walbridge_core::Lsn,
) -> Result<SequenceValues, CatalogError> {
    let rows = client
        .query(
            "WITH published AS ( \
                 SELECT format('%I.%I', schemaname, tablename)::regclass::oid AS oid \
                 FROM pg_publication_tables WHERE pubname = ANY($1)), \
             covered AS ( \
                 SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE c.relkind = 'S' AND n.nspname NOT IN ('pg_catalog', 'information_schema') \
                   AND EXISTS (SELECT 1 FROM pg_publication WHERE pubname = ANY($1) AND puballtables) \
                 UNION \
                 SELECT d.objid FROM pg_depend d JOIN published p ON p.oid = d.refobjid \
                 WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i') \
                 UNION \
                 SELECT d.refobjid FROM pg_attrdef a JOIN published p ON p.oid = a.adrelid \
                 JOIN pg_depend d ON d.classid = 'pg_attrdef'::regclass AND d.objid = a.oid AND d.refclassid = 'pg_class'::regclass \
                 JOIN pg_class s ON s.oid = d.refobjid AND s.relkind = 'S') \
             SELECT s.schemaname::text, s.sequencename::text, s.last_value, (extract(epoch FROM now()) * 1000000)::int8 \
             FROM pg_sequences s \
             WHERE format('%I.%I', s.schemaname, s.sequencename)::regclass::oid IN (SELECT oid FROM covered) \
               AND s.last_value IS NOT NULL \
             ORDER BY 1, 2",
            &[&publications],
        )
        .await
        .map_err(|source| CatalogError::Query {
            what: "sequences (pg_sequences; the role needs SELECT or USAGE on them)".into(),
            source,
        })?;
    let read_time = rows
        .first()
        .map(|r| PgTimestamp::from_unix_micros(r.get(3)))
        .unwrap_or_else(PgTimestamp::now);
    Ok(SequenceValues {
        lsn,
        read_time,
        sequences: rows
            .iter()
            .map(|r| SequenceValue {
                schema: r.get(0),
                name: r.get(1),
                last_value: r.get(2),
            })
            .collect(),
    })
}

/// The sequences' values last handed on, to hand on only those that
/// moved since (a quiet database's log does not fill with the same
/// values; a sink sets a thousand sequences only when they all move).
#[derive(Default)]
pub struct SequenceReader {
    last: HashMap<(String, String), i64>,
    failing: Option<String>,
}

impl SequenceReader {
    /// Reads the sequences; `Some` with those whose value differs from
    /// the one handed on last (all of them the first time). A failed read
    /// is logged (once until it works again) and skipped: streaming goes
    /// on.
    pub async fn moved(
        &mut self,
        source: &str,
        client: &Client,
        publications: &[String],
        lsn: walbridge_core::Lsn,
    ) -> Option<SequenceValues> {
        match read_sequences(client, publications, lsn).await {
            Ok(mut values) => {
                if self.failing.take().is_some() {
                    tracing::info!(source, "sequences are read again");
                }
                values.sequences.retain(|s| {
                    let name = (s.schema.clone(), s.name.clone());
                    self.last.insert(name, s.last_value) != Some(s.last_value)
                });
                (!values.sequences.is_empty()).then_some(values)
            }
            Err(e) => {
                let text = e.to_string();
                if self.failing.as_ref() != Some(&text) {
                    tracing::warn!(
                        source,
                        "cannot read the sequences, they are not replicated until this is fixed: {text}"
                    );
                    self.failing = Some(text);
                }
                None
            }
        }
    }
}
