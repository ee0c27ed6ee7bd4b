//! The initial copy into the target with `COPY`.

use bytes::{Bytes, BytesMut};
use futures_util::SinkExt;
use tokio_postgres::CopyInSink;
use walbridge_core::{Oid, SnapshotBatch};

use super::{Applier, failed};
use crate::copy::encode_row;
use crate::error::SinkError;
use crate::mapping::TableMap;

/// COPY data is sent in chunks of about this size.
const COPY_CHUNK: usize = 256 << 10;

/// Snapshot rows being copied into one table.
pub(super) struct CopyIn {
    table: Oid,
    display: String,
    sink: std::pin::Pin<Box<CopyInSink<Bytes>>>,
    buffer: BytesMut,
    rows: u64,
}

impl Applier {
    pub(super) async fn snapshot_rows(&mut self, batch: SnapshotBatch) -> Result<(), SinkError> {
        let map = self.map(&batch.relation).await?;
        if self.copy.as_ref().map(|c| c.table) != Some(map.target.oid) {
            self.finish_copy().await?;
            self.ensure_open().await?;
            self.drain().await?;
            if self.copied.insert(map.target.oid) {
                self.prepare_copy_target(&map).await?;
            }
            self.start_copy(&map).await?;
        }
        let extra = self
            .config
            .source_column
            .is_some()
            .then_some(self.source.name.as_str());
        let Some(copy) = self.copy.as_mut() else {
            return Ok(());
        };
        for row in &batch.rows {
            encode_row(&mut copy.buffer, row, extra).map_err(|e| {
                SinkError::Mapping(format!("snapshot of {}: {e}", map.source_table))
            })?;
        }
        copy.rows += batch.rows.len() as u64;
        self.group.changes += batch.rows.len();
        if copy.buffer.len() >= COPY_CHUNK {
            let chunk = copy.buffer.split().freeze();
            copy.sink
                .send(chunk)
                .await
                .map_err(failed(format!("copying rows into {}", copy.display)))?;
        }
        Ok(())
    }

    /// Before the first rows of the initial copy go into a table: it must
    /// be empty (of this source's rows), or be emptied when configured.
    pub(super) async fn prepare_copy_target(&mut self, map: &TableMap) -> Result<(), SinkError> {
        let filter = map
            .source_tag
            .as_ref()
            .map(|(c, v)| format!(" WHERE {c} = {v}"))
            .unwrap_or_default();
        let table = map.quoted();
        let has_rows: bool = self
            .client
            .query_one(
                &format!("SELECT EXISTS (SELECT 1 FROM {table}{filter})"),
                &[],
            )
            .await
            .map_err(failed(format!(
                "checking that {} is empty",
                map.target.display()
            )))?
            .get(0);
        if !has_rows {
            return Ok(());
        }
        if !self.config.truncate_before_copy {
            return Err(SinkError::TargetNotEmpty {
                table: map.target.display(),
                scope: match &map.source_tag {
                    Some(_) => format!(" of source `{}`", self.source.name),
                    None => String::new(),
                },
                source_table: map.source_table.clone(),
            });
        }
        let empty = match &map.source_tag {
            Some(_) => format!("DELETE FROM {table}{filter}"),
            None => format!("TRUNCATE {table}"),
        };
        tracing::info!(sink = %self.sink, table = %map.target.display(), "emptying the target table before the initial copy (truncate_before_copy)");
        self.client
            .batch_execute(&empty)
            .await
            .map_err(failed(format!("emptying {}", map.target.display())))
    }

    pub(super) async fn start_copy(&mut self, map: &TableMap) -> Result<(), SinkError> {
        let mut columns: Vec<&str> = map.columns.iter().map(|c| c.quoted.as_str()).collect();
        if let Some((column, _)) = &map.source_tag {
            columns.push(column);
        }
        let statement = format!("COPY {} ({}) FROM STDIN", map.quoted(), columns.join(", "));
        let sink = self
            .client
            .copy_in::<_, Bytes>(statement.as_str())
            .await
            .map_err(failed(format!(
                "starting to copy rows into {}",
                map.target.display()
            )))?;
        self.copy = Some(CopyIn {
            table: map.target.oid,
            display: map.target.display(),
            sink: Box::pin(sink),
            buffer: BytesMut::with_capacity(COPY_CHUNK * 2),
            rows: 0,
        });
        Ok(())
    }

    pub(super) async fn finish_copy(&mut self) -> Result<(), SinkError> {
        let Some(mut copy) = self.copy.take() else {
            return Ok(());
        };
        let what = || format!("copying rows into {}", copy.display);
        if !copy.buffer.is_empty() {
            let chunk = copy.buffer.split().freeze();
            copy.sink.send(chunk).await.map_err(failed(what()))?;
        }
        let rows = copy.sink.as_mut().finish().await.map_err(failed(what()))?;
        self.totals.rows_copied += rows;
        tracing::info!(sink = %self.sink, source = %self.source.name, table = %copy.display, rows, "copied snapshot rows");
        Ok(())
    }
}
