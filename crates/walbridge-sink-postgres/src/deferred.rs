//! Indexes deferred past the initial copy: a target table's indexes are
//! dropped before its rows are copied and built again once the whole copy
//! is in, which costs a fraction of maintaining them row by row (one sort
//! per index instead of a tree descent per row and index).
//!
//! # Invariant
//!
//! An index is dropped only in the transaction that records how to build
//! it again — a row of `walbridge_deferred_indexes`, next to the progress
//! table — and its row is deleted only in the transaction that builds it.
//! Whatever stops walbridge, the target has each index or a record of it.
//! The copy's position commits only after every recorded index of its sink
//! and source is built, so a copy that ends, in this run or a later one,
//! leaves the table as it found it; `walbridge drop` builds what an
//! abandoned copy left recorded.
//!
//! # What stays
//!
//! Only what can be built again exactly is deferred. A table keeps all of
//! its indexes when it is partitioned or a partition (their indexes hang
//! together), when the role does not own it, or when other sources' rows
//! share it (`source_column`: they keep streaming into it). An index stays
//! when something depends on it (a foreign key referencing its columns),
//! when it is the replica identity, the clustering index, invalid or not
//! ready, in a tablespace of its own, commented, or has a statistics target
//! — things its definition does not carry.

use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use futures_util::future::try_join_all;
use tokio_postgres::Client;
use walbridge_pg::{quote_literal, quote_qualified};

use crate::error::{IndexRebuildFailed, SinkError, failed};
use crate::progress::split_qualified;
use crate::target::TargetTable;

/// The table of records, in the progress table's schema.
const RECORDS: &str = "walbridge_deferred_indexes";

/// A table's indexes that can be dropped and built again, each with its
/// table's and its own name, the statements that build it, whether they end by altering the
/// table, and the statement that drops it. Empty when the table must keep
/// them all. `$1` is the table's OID.
///
/// A primary key or unique constraint is built as a unique index that
/// then becomes the constraint (`ADD CONSTRAINT … USING INDEX`): the
/// index build takes only a SHARE lock, so the table's other indexes are
/// built beside it; only the last, quick step locks the table.
const DEFERRABLE: &str = "\
SELECT quote_ident(tn.nspname) || '.' || quote_ident(t.relname), \
       quote_ident(n.nspname) || '.' || quote_ident(ic.relname), \
       CASE WHEN c.oid IS NULL THEN pg_get_indexdef(i.indexrelid) \
            WHEN c.contype = 'x' THEN format('ALTER TABLE %I.%I ADD CONSTRAINT %I %s', tn.nspname, t.relname, c.conname, pg_get_constraintdef(c.oid)) \
            ELSE pg_get_indexdef(i.indexrelid) || format('; ALTER TABLE %I.%I ADD CONSTRAINT %I %s USING INDEX %I', \
                   tn.nspname, t.relname, c.conname, CASE c.contype WHEN 'p' THEN 'PRIMARY KEY' ELSE 'UNIQUE' END, ic.relname) \
                 || CASE WHEN c.condeferrable THEN ' DEFERRABLE' ELSE '' END \
                 || CASE WHEN c.condeferred THEN ' INITIALLY DEFERRED' ELSE '' END END, \
       c.oid IS NOT NULL, \
       CASE WHEN c.oid IS NULL THEN format('DROP INDEX %I.%I', n.nspname, ic.relname) \
            ELSE format('ALTER TABLE %I.%I DROP CONSTRAINT %I', tn.nspname, t.relname, c.conname) END \
FROM pg_index i \
JOIN pg_class ic ON ic.oid = i.indexrelid \
JOIN pg_namespace n ON n.oid = ic.relnamespace \
JOIN pg_class t ON t.oid = i.indrelid \
JOIN pg_namespace tn ON tn.oid = t.relnamespace \
LEFT JOIN pg_constraint c ON c.conindid = i.indexrelid AND c.conrelid = t.oid AND c.contype IN ('p', 'u', 'x') \
WHERE i.indrelid = $1 \
  AND t.relkind = 'r' AND NOT t.relispartition AND pg_has_role(t.relowner, 'USAGE') \
  AND i.indisvalid AND i.indisready AND i.indislive \
  AND NOT i.indisreplident AND NOT i.indisclustered \
  AND ic.reltablespace = 0 \
  AND obj_description(ic.oid, 'pg_class') IS NULL \
  AND (c.oid IS NULL OR obj_description(c.oid, 'pg_constraint') IS NULL) \
  AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.refclassid = 'pg_class'::regclass AND d.refobjid = i.indexrelid AND d.deptype = 'n') \
  AND NOT EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = i.indexrelid AND a.attstattarget > 0) \
ORDER BY c.contype = 'p' DESC NULLS LAST, ic.relname";

/// One index waiting to be built again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deferred {
    /// The target table, qualified and quoted where need be.
    pub table: String,
    /// The index, qualified and quoted where need be (a constraint's
    /// name is the same).
    pub index: String,
    /// The statements that build it.
    pub definition: String,
    /// A constraint: its last statement locks the table (`ALTER TABLE`),
    /// so two of one table are never built at once (each would wait for
    /// the other's index build to end: a deadlock).
    pub alters_table: bool,
}

/// Where one sink's copies of one source record the indexes they dropped.
#[derive(Clone, Debug)]
pub struct DeferredIndexes {
    /// The quoted records table.
    records: String,
    /// Set once this process made sure the records table exists.
    made: OnceLock<()>,
    sink: String,
    source: String,
}

impl DeferredIndexes {
    /// The records of `sink` for `source`, in the schema of `progress_table`.
    pub fn new(progress_table: &str, sink: &str, source: &str) -> Result<Self, SinkError> {
        let (schema, _) = split_qualified(progress_table).map_err(SinkError::Mapping)?;
        Ok(DeferredIndexes {
            records: quote_qualified(schema, RECORDS),
            made: OnceLock::new(),
            sink: sink.to_owned(),
            source: source.to_owned(),
        })
    }

    /// The records table's quoted name.
    pub fn records(&self) -> &str {
        &self.records
    }

    /// How to build by hand what an unfinished copy dropped.
    pub fn by_hand(&self) -> String {
        let (sink, source) = (quote_literal(&self.sink), quote_literal(&self.source));
        format!(
            "indexes an unfinished initial copy dropped, if any: run each statement of \
             SELECT definition FROM {0} WHERE sink = {sink} AND source = {source}; \
             then DELETE FROM {0} WHERE sink = {sink} AND source = {source};",
            self.records
        )
    }

    /// Drops `table`'s deferrable indexes, recording them in the same
    /// transaction; returns their names (none when the table keeps them).
    /// Runs on a connection outside any transaction: its statements commit
    /// as one. Keeps the indexes, saying why, when the records table
    /// cannot be made.
    pub async fn defer(
        &self,
        client: &Client,
        table: &TargetTable,
    ) -> Result<Vec<String>, SinkError> {
        let shown = table.display();
        let found = client
            .query(DEFERRABLE, &[&table.oid])
            .await
            .map_err(failed(format!("reading the indexes of {shown}")))?;
        if found.is_empty() {
            return Ok(Vec::new());
        }
        if self.made.get().is_none()
            && let Err(e) = client
                .batch_execute(&format!(
                    "CREATE TABLE IF NOT EXISTS {} (\
                   sink text NOT NULL, source text NOT NULL, table_name text NOT NULL, \
                   index_name text NOT NULL, definition text NOT NULL, \
                   alters_table boolean NOT NULL, deferred_at timestamptz NOT NULL DEFAULT now(), \
                   PRIMARY KEY (sink, source, index_name))",
                    self.records
                ))
                .await
        {
            let error = failed(format!("creating {}", self.records))(e);
            tracing::info!(sink = %self.sink, source = %self.source, table = %shown, %error, "copying into the table with its indexes: the indexes cannot be deferred without a table to record them in (the role needs CREATE on the progress table's schema)");
            return Ok(Vec::new());
        }
        let _ = self.made.set(());
        // One simple query: the records and the drops commit together.
        // Without waiting for the flush: whatever later depends on the
        // drop (a lane's rows, the copy's position) commits after it and
        // flushes it too; lost in a crash, it is lost with its records.
        let mut statement = String::from("SET LOCAL synchronous_commit = off; ");
        let mut names = Vec::with_capacity(found.len());
        for row in &found {
            let (table_name, index, definition, alters_table, drop): (
                String,
                String,
                String,
                bool,
                String,
            ) = (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
            statement.push_str(&format!(
                "INSERT INTO {} (sink, source, table_name, index_name, definition, alters_table) VALUES ({}, {}, {}, {}, {}, {alters_table}); {drop}; ",
                self.records,
                quote_literal(&self.sink),
                quote_literal(&self.source),
                quote_literal(&table_name),
                quote_literal(&index),
                quote_literal(&definition),
            ));
            names.push(index);
        }
        client
            .batch_execute(&statement)
            .await
            .map_err(failed(format!(
                "dropping the indexes of {shown} for the initial copy"
            )))?;
        Ok(names)
    }

    /// Every index recorded for this sink and source, those of the largest
    /// tables first (the longest builds start first), else in the order
    /// recorded.
    pub async fn pending(&self, client: &Client) -> Result<Vec<Deferred>, SinkError> {
        let exists: bool = client
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&self.records])
            .await
            .map_err(failed(format!("looking for {}", self.records)))?
            .get(0);
        if !exists {
            return Ok(Vec::new());
        }
        let rows = client
            .query(
                &format!(
                    "SELECT table_name, index_name, definition, alters_table FROM {} \
                     WHERE sink = $1 AND source = $2 \
                     ORDER BY pg_relation_size(to_regclass(table_name)) DESC NULLS LAST, deferred_at, ctid",
                    self.records
                ),
                &[&self.sink, &self.source],
            )
            .await
            .map_err(failed(format!("reading {}", self.records)))?;
        Ok(rows
            .into_iter()
            .map(|row| Deferred {
                table: row.get(0),
                index: row.get(1),
                definition: row.get(2),
                alters_table: row.get(3),
            })
            .collect())
    }

    /// Builds `index` again and deletes its record, in one transaction —
    /// or, inside a transaction, as part of it. An index of that name that
    /// exists already (made by hand), or a table that is gone, only
    /// removes the record.
    pub async fn build(&self, client: &Client, index: &Deferred) -> Result<(), SinkError> {
        let forget = format!(
            "DELETE FROM {} WHERE sink = {} AND source = {} AND index_name = {}",
            self.records,
            quote_literal(&self.sink),
            quote_literal(&self.source),
            quote_literal(&index.index)
        );
        let present: (bool, bool) = client
            .query_one(
                "SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL",
                &[&index.table, &index.index],
            )
            .await
            .map(|row| (row.get(0), row.get(1)))
            .map_err(failed(format!("looking for {}", index.table)))?;
        let statement = match present {
            (true, false) => format!("{}; {forget}", index.definition),
            (false, _) => {
                tracing::warn!(sink = %self.sink, source = %self.source, table = %index.table, index = %index.index, "the table whose index was deferred past the initial copy is gone: forgetting the index");
                forget
            }
            (true, true) => {
                tracing::info!(sink = %self.sink, source = %self.source, table = %index.table, index = %index.index, "an index deferred past the initial copy exists again (made by hand?): keeping it");
                forget
            }
        };
        client.batch_execute(&statement).await.map_err(|source| {
            SinkError::IndexRebuild(Box::new(IndexRebuildFailed {
                table: index.table.clone(),
                index: index.index.clone(),
                definition: index.definition.clone(),
                records: self.records.clone(),
                sink: self.sink.clone(),
                source_name: self.source.clone(),
                source,
            }))
        })
    }

    /// Builds every recorded index over `clients`, one at a time on each,
    /// taking the next index it may build: never two constraints of one
    /// table at once. While there are at least as many indexes left as
    /// connections, a build runs without parallel maintenance workers —
    /// the connections are the parallelism, as they were for the copy;
    /// the last builds use the target's workers. Each index commits on its
    /// own, or with the transaction its client is in.
    pub async fn build_all(
        &self,
        clients: &[&Client],
        pending: Vec<Deferred>,
    ) -> Result<(), SinkError> {
        let start = Instant::now();
        let count = pending.len();
        let plan = Mutex::new(Plan {
            waiting: pending,
            building: 0,
            altering: Vec::new(),
        });
        let connections = clients.len();
        try_join_all(clients.iter().map(|client| async {
            loop {
                let (index, left) = {
                    let mut plan = plan.lock().unwrap_or_else(|p| p.into_inner());
                    let Some(index) = plan.take() else {
                        // Nothing left, or only constraints of tables
                        // another connection is altering: that connection
                        // takes them once it is done.
                        return Ok::<_, SinkError>(());
                    };
                    (index, plan.waiting.len() + plan.building)
                };
                let workers = if connections > 1 && left >= connections {
                    "SET max_parallel_maintenance_workers = 0"
                } else {
                    "RESET max_parallel_maintenance_workers"
                };
                client
                    .batch_execute(workers)
                    .await
                    .map_err(failed("setting max_parallel_maintenance_workers"))?;
                self.build(client, &index).await?;
                plan.lock().unwrap_or_else(|p| p.into_inner()).built(&index);
            }
        }))
        .await?;
        tracing::info!(sink = %self.sink, source = %self.source, indexes = count, seconds = format!("{:.2}", start.elapsed().as_secs_f64()), "built the indexes deferred past the initial copy");
        Ok(())
    }
}

/// The indexes left to build, and those being built.
struct Plan {
    waiting: Vec<Deferred>,
    /// Builds running, this one included.
    building: usize,
    /// The tables whose constraint is being built.
    altering: Vec<String>,
}

impl Plan {
    /// The first waiting index that may be built now.
    fn take(&mut self) -> Option<Deferred> {
        let at = self
            .waiting
            .iter()
            .position(|i| !i.alters_table || !self.altering.contains(&i.table))?;
        let index = self.waiting.remove(at);
        self.building += 1;
        if index.alters_table {
            self.altering.push(index.table.clone());
        }
        Some(index)
    }

    fn built(&mut self, index: &Deferred) {
        self.building -= 1;
        if index.alters_table {
            self.altering.retain(|t| *t != index.table);
        }
    }
}
