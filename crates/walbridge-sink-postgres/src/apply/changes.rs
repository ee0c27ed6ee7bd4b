//! Row changes into statements and batches, and TRUNCATE.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio_postgres::Statement;
use tokio_postgres::types::{ToSql, Type};
use walbridge_core::{
    Change, Datum, Oid, OldRow, OldRowKind, ReadRange, Row, TransactionInfo, Truncate,
};
use walbridge_pg::{describe_pg_error, quote_literal};

use super::{Applier, ChangeKind, Prepared, Purpose, failed, simple};
use crate::batch::{
    Batch, BatchKind, BatchRow, batch_sql, bound_columns, bound_values, param_types,
};
use crate::config::OnConflict;
use crate::error::SinkError;
use crate::inflight::{Failed, Outcome, Reply};
use crate::mapping::{BinaryForm, TableMap};
use crate::statement::{ColumnSet, Find, InsertMode, Param, Shape, bind_order, sql};

/// The columns of `row` that are not unchanged TOAST values, or `None` for all.
pub(super) fn present_columns(row: &Row) -> ColumnSet {
    row.contains(&Datum::UnchangedToast).then(|| {
        row.iter()
            .enumerate()
            .filter(|(_, d)| **d != Datum::UnchangedToast)
            .map(|(i, _)| i as u16)
            .collect()
    })
}

pub(super) fn null_columns(row: &Row) -> ColumnSet {
    row.contains(&Datum::Null).then(|| {
        row.iter()
            .enumerate()
            .filter(|(_, d)| **d == Datum::Null)
            .map(|(i, _)| i as u16)
            .collect()
    })
}

/// True when every value is text or NULL (batches carry text only).
pub(super) fn all_text(row: &Row) -> bool {
    row.iter()
        .all(|d| matches!(d, Datum::Text(_) | Datum::Null))
}

/// An array's binary form with its element type OID (bytes 8..12 of the
/// header: dimensions, flags, element type) replaced.
pub(super) fn with_element_type(array: &Bytes, element: Oid) -> Bytes {
    if array.len() < 12 {
        return array.clone();
    }
    let mut patched = BytesMut::from(&array[..]);
    patched[8..12].copy_from_slice(&element.to_be_bytes());
    patched.freeze()
}

pub(super) fn row_bytes(row: &Row) -> usize {
    row.iter().map(|d| d.len() + 8).sum()
}

/// The DELETE removing the target rows in `range` whose keys the read did
/// not find (a re-sync's chunk: they are not in the publisher's table). The
/// range is the publisher's key order, written the same way here; with
/// `source_column`, only this source's rows.
pub(super) fn stale_rows_sql(map: &TableMap, range: &ReadRange) -> String {
    let columns: Vec<&str> = range
        .key
        .iter()
        .filter_map(|(i, _)| map.columns.get(*i).map(|c| c.quoted.as_str()))
        .collect();
    let ordered: Vec<String> = range
        .key
        .iter()
        .zip(&columns)
        .map(|((_, order), column)| order.expression(column))
        .collect();
    let literals = |values: &[String]| {
        values
            .iter()
            .map(|v| quote_literal(v))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut conditions = Vec::new();
    let tuple = format!("({})", ordered.join(", "));
    if let Some(after) = &range.after {
        conditions.push(format!("{tuple} > ({})", literals(after)));
    }
    if let Some(up_to) = &range.up_to {
        conditions.push(format!("{tuple} <= ({})", literals(up_to)));
    }
    if !range.keys.is_empty() {
        // Compared as text: the values are the publisher's text forms.
        let found: Vec<String> = range
            .keys
            .iter()
            .map(|k| format!("({})", literals(k)))
            .collect();
        let as_text: Vec<String> = columns.iter().map(|c| format!("{c}::text")).collect();
        conditions.push(format!(
            "({}) NOT IN (VALUES {})",
            as_text.join(", "),
            found.join(", ")
        ));
    }
    if let Some((column, value)) = &map.source_tag {
        conditions.push(format!("{column} = {value}"));
    }
    let filter = if conditions.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conditions.join(" AND "))
    };
    format!("DELETE FROM {}{filter}", map.quoted())
}

/// How a batch's statement is run.
enum Run {
    Prepared(Statement),
    /// Unnamed, with the statement's text and parameter types (while the
    /// statement is being prepared).
    Unnamed(String, Vec<Type>),
}

impl Applier {
    pub(super) async fn change(&mut self, change: Change) -> Result<(), SinkError> {
        let Some(txn) = self.txn.clone() else {
            return Err(SinkError::Mapping(
                "the log delivered a change outside a transaction".into(),
            ));
        };
        match change {
            Change::Read { relation, new, .. } => {
                let map = self.map(&relation).await?;
                if map.upsert_key.is_none() && self.truncated.contains(&map.target.oid) {
                    // Emptied earlier in this unit (a truncate-and-copy of a
                    // table without a key): the rows go in as they are.
                    return self
                        .insert(map, new, txn, ChangeKind::Insert, InsertMode::Plain)
                        .await;
                }
                if map.upsert_key.is_none() {
                    return Err(SinkError::Mapping(format!(
                        "rows of source table {} are being read while streaming (a table added to the publication, or a re-sync) and are applied as upserts, but target table {} has no primary key or unique index on the source's key: add one, then resume",
                        map.source_table,
                        map.target.display()
                    )));
                }
                self.insert(map, new, txn, ChangeKind::Insert, InsertMode::Upsert)
                    .await
            }
            Change::Insert { relation, new, .. } => {
                let map = self.map(&relation).await?;
                let (kind, mode) = match self.config.on_conflict {
                    OnConflict::Error => (ChangeKind::Insert, InsertMode::Plain),
                    OnConflict::Skip => (ChangeKind::InsertOrSkip, InsertMode::OrSkip),
                    OnConflict::Upsert => (ChangeKind::Insert, InsertMode::Upsert),
                };
                self.insert(map, new, txn, kind, mode).await
            }
            Change::Update {
                relation, old, new, ..
            } => {
                let map = self.map(&relation).await?;
                self.group.bytes += row_bytes(&new);
                let set = present_columns(&new);
                let kind = BatchKind::Update { set: set.clone() };
                if old.is_none()
                    && self.batchable(&map, &txn)
                    && !map.full_identity
                    && !map.identity.is_empty()
                    && all_text(&new)
                    && bound_columns(&map, &kind).count() > map.identity.len()
                {
                    // Nothing observes the row in between: a later update replaces an earlier one.
                    return self.batch(&map, kind, true, new, txn, true).await;
                }
                let (find, old) = self.find(&map, old.as_ref(), &new)?;
                self.execute(
                    &txn,
                    &map,
                    Shape::Update { set, find },
                    ChangeKind::Update,
                    &new,
                    Some(old),
                )
                .await
            }
            Change::Delete { relation, old, .. } => {
                let map = self.map(&relation).await?;
                self.group.bytes += row_bytes(&old.row);
                if self.batchable(&map, &txn)
                    && !map.full_identity
                    && !map.identity.is_empty()
                    && map
                        .identity
                        .iter()
                        .all(|&i| matches!(old.row.get(i), Some(Datum::Text(_))))
                {
                    return self
                        .batch(&map, BatchKind::Delete, true, old.row, txn, false)
                        .await;
                }
                let (find, old) = self.find(&map, Some(&old), &old.row)?;
                self.execute(
                    &txn,
                    &map,
                    Shape::Delete { find },
                    ChangeKind::Delete,
                    old,
                    Some(old),
                )
                .await
            }
            Change::Truncate(truncate) => {
                self.send_batches_all().await?;
                self.truncate(&txn, truncate).await
            }
            Change::ReadRange(range) => {
                let map = self.map(&range.relation).await?;
                if map.routed_partition {
                    // The target table holds the other partitions' rows in
                    // the same key range: nothing can be told stale.
                    return Ok(());
                }
                self.send_batches_all().await?;
                self.ensure_open().await?;
                self.group.changes += 1;
                let purpose = Purpose::Stale {
                    txn: txn.clone(),
                    table: map.target.display(),
                };
                let sql = stale_rows_sql(&map, &range);
                self.send(purpose, simple(&self.client, sql)).await
            }
            Change::Message(_) => Ok(()),
        }
    }

    /// Inserts `new` into `map`'s table, conflicts treated per `mode`.
    async fn insert(
        &mut self,
        map: Arc<TableMap>,
        new: Row,
        txn: Arc<TransactionInfo>,
        kind: ChangeKind,
        mode: InsertMode,
    ) -> Result<(), SinkError> {
        self.group.bytes += row_bytes(&new);
        if self.batchable(&map, &txn) && all_text(&new) {
            let keyed = !map.full_identity && !map.identity.is_empty();
            return self
                .batch(&map, BatchKind::Insert(mode), keyed, new, txn, false)
                .await;
        }
        self.execute(&txn, &map, Shape::Insert(mode), kind, &new, None)
            .await
    }

    /// Whether a change of `map` in `txn` may join a batch: not when
    /// triggers fire on the table, nor while finding or applying alone the
    /// transaction the sink stopped on.
    pub(super) fn batchable(&self, map: &TableMap, txn: &TransactionInfo) -> bool {
        !map.target.has_apply_triggers
            && !self.group.isolated
            && self
                .one_by_one_until
                .is_none_or(|until| txn.end_lsn > until)
    }

    /// Adds a row to its table's batches, sending them when full.
    pub(super) async fn batch(
        &mut self,
        map: &Arc<TableMap>,
        kind: BatchKind,
        keyed: bool,
        row: Row,
        txn: Arc<TransactionInfo>,
        replace: bool,
    ) -> Result<(), SinkError> {
        // Its BEGIN goes with the first statement sent.
        self.open_group();
        self.group.changes += 1;
        let values = bound_values(map, &kind, row);
        let row = BatchRow { keyed, values, txn };
        if let Some(full) = self.batcher.add(map, kind, row, replace) {
            self.send_batches(full).await?;
        }
        Ok(())
    }

    pub(super) async fn send_batches_all(&mut self) -> Result<(), SinkError> {
        let batches = self.batcher.take_all();
        self.send_batches(batches).await
    }

    pub(super) async fn send_batches(&mut self, batches: Vec<Batch>) -> Result<(), SinkError> {
        for batch in batches {
            if batch.is_empty() {
                continue;
            }
            self.ensure_open().await?;
            let statement = self.batch_statement(&batch.map, &batch.kind).await?;
            let params: Vec<Param> = batch.arrays().into_iter().map(Param).collect();
            let bytes = params.iter().map(|p| p.0.len()).sum();
            let run = match statement {
                Some(statement) => Run::Prepared(statement),
                None => Run::Unnamed(
                    batch_sql(&batch.map, &batch.kind),
                    param_types(&batch.map, &batch.kind),
                ),
            };
            let purpose = Purpose::Batch {
                rows: batch.len(),
                last_txn: batch.last_txn.clone(),
                map: batch.map,
                kind: batch.kind,
            };
            let client = self.client.clone();
            let request = async move {
                let result = match run {
                    Run::Prepared(statement) => client.execute_raw(&statement, params.iter()).await,
                    Run::Unnamed(sql, types) => {
                        let typed: Vec<(&(dyn ToSql + Sync), Type)> = params
                            .iter()
                            .map(|p| p as &(dyn ToSql + Sync))
                            .zip(types)
                            .collect();
                        client.execute_typed(&sql, &typed).await
                    }
                };
                match result {
                    Ok(rows) => Ok(Reply::Rows(rows)),
                    Err(error) => Err(Failed { error, params }),
                }
            };
            self.send_sized(purpose, bytes, request).await?;
        }
        Ok(())
    }

    /// The prepared statement for batches of `kind` on `map`; `None` while
    /// it is being prepared (the first time, it is sent for preparing
    /// ahead of the batch, which then runs unnamed).
    async fn batch_statement(
        &mut self,
        map: &Arc<TableMap>,
        kind: &BatchKind,
    ) -> Result<Option<Statement>, SinkError> {
        let key = (map.id, kind.clone());
        if let Some(statement) = self.batch_statements.get(&key) {
            return Ok(statement.clone());
        }
        self.batch_statements.insert(key.clone(), None);
        let sql = batch_sql(map, kind);
        let client = self.client.clone();
        let text = sql.clone();
        let request = async move {
            client
                .prepare(&text)
                .await
                .map(Reply::Prepared)
                .map_err(|error| Failed {
                    error,
                    params: Vec::new(),
                })
        };
        let purpose = Purpose::Prepare {
            key,
            sql,
            table: map.target.display(),
        };
        self.send(purpose, request).await?;
        Ok(None)
    }

    /// How to find the changed row, and the row holding the values to find it by.
    pub(super) fn find<'a>(
        &self,
        map: &TableMap,
        old: Option<&'a OldRow>,
        new: &'a Row,
    ) -> Result<(Find, &'a Row), SinkError> {
        if map.full_identity {
            let old = old.filter(|o| o.kind == OldRowKind::Full).ok_or_else(|| {
                SinkError::Mapping(format!(
                    "source table {} has REPLICA IDENTITY FULL but a change came without its old row",
                    map.source_table
                ))
            })?;
            let find = Find::Full {
                present: present_columns(&old.row),
                nulls: null_columns(&old.row),
            };
            return Ok((find, &old.row));
        }
        // The old key when it changed (or came whole), else the new row's key.
        Ok((Find::Key, old.map_or(new, |o| &o.row)))
    }

    pub(super) async fn prepared(
        &mut self,
        map: &Arc<TableMap>,
        shape: Shape,
    ) -> Result<Prepared, SinkError> {
        let key = (map.id, shape);
        if let Some(p) = self.statements.get(&key) {
            return Ok(p.clone());
        }
        let text = sql(map, &key.1);
        let statement = match self.client.prepare(&text).await {
            Ok(s) => s,
            Err(e) => {
                // An earlier statement may have aborted the transaction: report that one.
                self.drain().await?;
                return Err(SinkError::Target {
                    what: format!(
                        "preparing `{text}` for target table {}",
                        map.target.display()
                    ),
                    source: e,
                });
            }
        };
        let prepared = Prepared {
            statement,
            binds: bind_order(map, &key.1).into(),
        };
        self.statements.insert(key, prepared.clone());
        Ok(prepared)
    }

    pub(super) async fn execute(
        &mut self,
        txn: &Arc<TransactionInfo>,
        map: &Arc<TableMap>,
        shape: Shape,
        kind: ChangeKind,
        new: &Row,
        old: Option<&Row>,
    ) -> Result<(), SinkError> {
        self.ensure_open().await?;
        // Order within the table (and with triggers) must hold: what waits goes first.
        self.send_batches_all().await?;
        let prepared = self.prepared(map, shape).await?;
        let mut params = Vec::with_capacity(prepared.binds.len());
        for &(from_old, i) in prepared.binds.iter() {
            let row = if from_old { old.unwrap_or(new) } else { new };
            let mut datum = row.get(i).cloned().unwrap_or(Datum::Null);
            if let Datum::Binary(bytes) = &datum {
                let column = &map.columns[i];
                match column.binary {
                    BinaryForm::AsIs => {}
                    BinaryForm::ArrayOf(element) => {
                        datum = Datum::Binary(with_element_type(bytes, element));
                    }
                    BinaryForm::Refused => {
                        return Err(SinkError::BinaryMismatch {
                            table: map.target.display(),
                            column: column.quoted.trim_matches('"').to_owned(),
                            source_type: column.source_type.clone(),
                            target_type: column.target_type.clone(),
                        });
                    }
                }
            }
            params.push(Param(datum));
        }
        self.group.changes += 1;
        let bytes = params.iter().map(|p| p.0.len()).sum();
        let purpose = Purpose::Change {
            txn: txn.clone(),
            map: map.clone(),
            kind,
            binds: prepared.binds.clone(),
        };
        let client = self.client.clone();
        let statement = prepared.statement;
        let request = async move {
            match client.execute_raw(&statement, params.iter()).await {
                Ok(rows) => Ok(Reply::Rows(rows)),
                Err(error) => Err(Failed { error, params }),
            }
        };
        if self.group.isolated && self.config.on_conflict == OnConflict::Skip {
            return self.execute_or_skip(purpose, request).await;
        }
        self.send_sized(purpose, bytes, request).await
    }

    /// Runs one change of the transaction being applied alone under a
    /// savepoint: a conflict rolls back just that change, which is skipped.
    pub(super) async fn execute_or_skip(
        &mut self,
        purpose: Purpose,
        request: impl Future<Output = Outcome> + Send + 'static,
    ) -> Result<(), SinkError> {
        self.drain().await?;
        let client = self.client.clone();
        let savepoint = |sql: &'static str| {
            let client = client.clone();
            async move { client.batch_execute(sql).await.map_err(failed(sql)) }
        };
        savepoint("SAVEPOINT walbridge_change").await?;
        match request.await {
            Ok(reply) => {
                self.completed(purpose, reply);
                savepoint("RELEASE SAVEPOINT walbridge_change").await
            }
            Err(f) if f.error.code().is_some_and(|c| c.code().starts_with("23")) => {
                savepoint("ROLLBACK TO SAVEPOINT walbridge_change").await?;
                if let Purpose::Change { map, .. } = &purpose {
                    tracing::warn!(sink = %self.sink, source = %self.source.name, table = %map.target.display(), "skipped a conflicting change (on_conflict = \"skip\"): {}", describe_pg_error(&f.error));
                    self.misses
                        .example
                        .get_or_insert_with(|| map.target.display());
                }
                self.misses.skipped_conflicts += 1;
                Ok(())
            }
            Err(f) => Err(self.failure(purpose, f).await),
        }
    }

    pub(super) async fn truncate(
        &mut self,
        txn: &Arc<TransactionInfo>,
        truncate: Truncate,
    ) -> Result<(), SinkError> {
        self.ensure_open().await?;
        let mut tables: Vec<String> = Vec::new();
        let mut deletes = Vec::new();
        let mut names = Vec::new();
        for relation in &truncate.relations {
            let map = self.map(relation).await?;
            if map.routed_partition {
                let stopped =
                    self.stop_on(txn, format!("TRUNCATE of partition {}", map.source_table));
                return Err(SinkError::TruncatePartition {
                    sink: self.sink.clone(),
                    partition: map.source_table.clone(),
                    table: map.target.display(),
                    stopped,
                });
            }
            names.push(map.target.display());
            self.truncated.insert(map.target.oid);
            match &map.source_tag {
                // The table holds other sources' rows too: remove only this source's.
                Some((column, value)) => deletes.push(format!(
                    "DELETE FROM {} WHERE {column} = {value}",
                    map.quoted()
                )),
                None if !tables.contains(&map.quoted()) => tables.push(map.quoted()),
                None => {}
            }
        }
        let mut statements = deletes;
        if !tables.is_empty() {
            // RESTRICT, as a native subscriber: never reach tables outside the set.
            statements.insert(
                0,
                format!(
                    "TRUNCATE {}{}",
                    tables.join(", "),
                    if truncate.options.restart_identity {
                        " RESTART IDENTITY"
                    } else {
                        ""
                    }
                ),
            );
        }
        self.group.changes += 1;
        let purpose = Purpose::Truncate {
            txn: txn.clone(),
            tables: names.join(", "),
        };
        self.send(purpose, simple(&self.client, statements.join("; ")))
            .await
    }
}
