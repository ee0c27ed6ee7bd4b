//! Making a target table fit a new descriptor before its first change
//! (see [`crate::schema`] for what is planned and why it is safe to
//! plan it again).

use std::sync::Arc;

use walbridge_core::Relation;

use walbridge_pg::describe_pg_error;

use super::Applier;
use super::failure::transient;
use crate::config::SchemaChanges;
use crate::error::{SchemaChangeFailed, SinkError};
use walbridge_core::ColumnShape;

use crate::schema::{self, Step};

impl Applier {
    /// Runs the statements `relation`'s descriptor needs on the target:
    /// while streaming, in the open target transaction after everything
    /// before it; during the initial copy (loaded over several
    /// connections), committed on their own first.
    pub(super) async fn change_schema(
        &mut self,
        relation: &Arc<Relation>,
    ) -> Result<(), SinkError> {
        if self.config.schema_changes != SchemaChanges::Apply && !self.config.create_tables {
            return Ok(());
        }
        let target = self.mapper.target_of(&mut self.catalog, relation).await?;
        let previous = self.published.get(&relation.id).map(Vec::as_slice);
        let carried = walbridge_core::carry_attnums(previous, relation);
        let relation = carried.as_ref().unwrap_or(relation);
        let steps = match &target.table {
            Some(table) => schema::alter_table(&self.config, previous, relation, table),
            None if self.config.create_tables => schema::create_table(
                relation,
                target.schema.as_deref(),
                &target.name,
                self.config.source_column.as_deref(),
            ),
            // The mapping says what is missing.
            None => Vec::new(),
        };
        let columns = ColumnShape::all_of(relation);
        if self.published.get(&relation.id) != Some(&columns) {
            self.published.insert(relation.id, columns);
            self.group.published_changed = true;
        }
        if steps.is_empty() {
            return Ok(());
        }
        let via = if self.in_snapshot {
            self.catalog.client().clone()
        } else {
            self.send_batches_all().await?;
            self.ensure_open().await?;
            // A statement before it that failed must report itself, not
            // the aborted transaction this would then meet.
            self.drain().await?;
            self.client.clone()
        };
        let source_table = format!("{}.{}", relation.schema, relation.name);
        let table = match &target.schema {
            Some(s) => format!("{s}.{}", target.name),
            None => target.name.clone(),
        };
        for Step {
            column,
            action,
            sql,
        } in steps
        {
            if let Err(source) = via.batch_execute(&sql).await {
                let code = source.code().map(|c| c.code().to_owned());
                if transient(code.as_deref()) {
                    return Err(SinkError::Target {
                        what: format!("{action} on target table {table}: `{sql}`"),
                        source,
                    });
                }
                // As a change that does not fit: everything before it is
                // applied, nothing after it, until the target is fixed.
                let stopped = self
                    .txn
                    .clone()
                    .map(|txn| *self.stop_on(&txn, describe_pg_error(&source)));
                return Err(SinkError::SchemaChange(Box::new(SchemaChangeFailed {
                    stopped,
                    action,
                    table,
                    column,
                    source_table,
                    statement: sql,
                    source,
                })));
            }
            tracing::info!(
                sink = %self.sink,
                source = %self.source.name,
                table = %source_table,
                target = %table,
                column = column.as_deref().unwrap_or(""),
                commit_lsn = %self.txn.as_ref().map(|t| t.commit_lsn.to_string()).unwrap_or_default(),
                statement = %sql,
                "{action} on the target, as on the publisher"
            );
            if action == "add column"
                && let Some(c) = relation
                    .columns
                    .iter()
                    .find(|c| Some(&c.name) == column.as_ref())
                && c.not_null
                && c.missing_value.is_none()
            {
                tracing::warn!(
                    sink = %self.sink,
                    source = %self.source.name,
                    table = %source_table,
                    column = %c.name,
                    "column \"{}\" is NOT NULL on the publisher but was added without a stored default (a volatile default rewrote the table there, or the publisher's table was rewritten since): rows the target already held are NULL in it and the stream will not fill them; run `walbridge resync --source {} --table {source_table}` to copy their values",
                    c.name,
                    self.source.name
                );
            }
        }
        self.catalog
            .refresh(&via, target.schema.as_deref(), &target.name)
            .await?;
        Ok(())
    }
}
