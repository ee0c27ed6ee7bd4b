//! Copying a table's rows while streaming goes on: a table that entered
//! the publication (its existing rows), or one re-synchronized on request.
//!
//! The watermark method of Netflix's DBLog and Debezium's incremental
//! snapshots, made exact with the read's own snapshot:
//!
//! * A table is read in chunks in key order ([`key`]): `(after, up_to]`,
//!   `up_to` the key a chunk's worth of rows on (none: to the end).
//! * Low watermark: a non-transactional logical decoding message, then the
//!   publisher's snapshot; the copy waits until the transactions that
//!   snapshot shows running have ended, so every transaction that committed
//!   before the watermark in the WAL is visible to the read.
//! * The read, in a REPEATABLE READ transaction whose snapshot `S` is
//!   recorded (`pg_current_snapshot()`: xmin, xmax, running xids).
//! * High watermark: a second message, sent once the rows are handed to
//!   the stream. Between the two (the window) the stream carries
//!   transactions that `S` shows (their effect is in the rows) and some it
//!   does not (their effect is not); their xids tell which.
//!
//! At the high watermark the chunk goes downstream as one unit, positioned
//! at the watermark: the rows as `S` shows them ([`Change::Read`]), then
//! what the window changed after `S`.
//!
//! At the high watermark the window's changes to the chunk's keys that `S`
//! does not show follow the rows (those it shows, the rows hold). Changes to keys already copied stream
//! as usual. Two modes, by what the targets hold of the keys not read yet:
//!
//! * [`CopyMode::NewTable`]: nothing. A change to a key not copied yet is
//!   left out (the chunk that covers the key reads its outcome), and one
//!   in the window is kept aside for after the rows. Consumers see each
//!   row once, read, and then its changes: no gap, no duplicate. A crash
//!   before the chunk is durable loses what was kept aside, and nothing
//!   else: the chunk is read again, after those changes.
//! * [`CopyMode::Resync`]: the table, maybe damaged. Every change streams
//!   as usual; those in the window are also applied again after the rows
//!   (a row the target lacked is then right). Consumers see a window's
//!   late changes twice, the second time after the row's read.
//!
//! An update moving a row between those parts is split into its leaving
//! (a delete) and its arriving (an insert, or for a re-sync a read, since
//! the target may hold the key): each goes where its key says.
//!
//! A chunk's progress is stored in the source's state once the unit is
//! durable downstream; after a crash the copy goes on from the last such
//! chunk (a chunk read again is applied again: sinks apply reads
//! idempotently). A truncate of the table ends its copy: the table is then
//! empty on both sides.

mod key;
mod request;
mod snapshot;
mod tracker;
mod worker;

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use walbridge_core::{
    Change, Datum, KeyOrder, Lsn, OldRow, ReadRange, Relation, RelationId, Row, Truncate,
    TruncateOptions,
};

pub use key::{ChunkKey, Key, KeyPart, ReadKey, in_range};
pub use request::{ResyncRequest, request_resync, requests};
pub use snapshot::PgSnapshot;
pub use tracker::{Tracker, TrackerError};
pub use worker::{Job, Worker, WorkerEvent};

/// Prefix of the watermark messages; they are not passed downstream.
pub const WATERMARK_PREFIX: &str = "walbridge.backfill";

/// What the targets hold of a table being copied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CopyMode {
    /// Nothing: the table entered the publication while streaming.
    NewTable,
    /// The table, to be re-synchronized.
    Resync,
    /// The table, to be emptied on the targets and copied whole in one
    /// unit (`walbridge resync --truncate`: a table without a key, which
    /// cannot be read in key order).
    Replace,
}

impl CopyMode {
    /// How logs and status name it.
    pub fn as_str(self) -> &'static str {
        match self {
            CopyMode::NewTable => "new table",
            CopyMode::Resync => "re-sync",
            CopyMode::Replace => "truncate and copy",
        }
    }
}

/// A copy as the source's state keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredCopy {
    /// The table's OID on the publisher.
    pub oid: u32,
    /// `schema.name`, for messages.
    pub table: String,
    /// What the targets hold.
    pub mode: CopyMode,
    /// The key of the last row durable downstream, as text; none before
    /// the first chunk.
    #[serde(default)]
    pub after: Option<Vec<String>>,
    /// Chunks handed downstream but not yet durable there, in order. Each
    /// is recorded before it is handed over, so at a start the log's end
    /// tells exactly which of them it holds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub marks: Vec<ChunkMark>,
    /// A re-sync for this sink only (`walbridge resync --sink`): its
    /// chunks are units every other sink passes over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sink: Option<String>,
}

/// A chunk handed downstream: where its unit ends, and the key copied up
/// to with it (none: the copy is complete).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkMark {
    /// The unit's end position.
    pub end: u64,
    /// The key copied up to; none when the unit completed the copy.
    pub after: Option<Vec<String>>,
}

/// Where a copy stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Copied up to this key (text); from the first row when none.
    After(Option<Vec<String>>),
    /// Every row is copied.
    Complete,
}

impl StoredCopy {
    /// Where the copy stands given that downstream holds everything up to
    /// `held`: the last mark within it, else the durable key.
    pub fn standing(&self, held: Lsn) -> Standing {
        match self.marks.iter().rev().find(|m| m.end <= held.0) {
            Some(ChunkMark { after: None, .. }) => Standing::Complete,
            Some(ChunkMark { after, .. }) => Standing::After(after.clone()),
            None => Standing::After(self.after.clone()),
        }
    }
}

/// An open window: between a chunk's low and high watermarks.
#[derive(Debug)]
struct Window {
    id: u64,
    up_to: Option<Key>,
    /// The window's changes to the chunk's keys, with their transaction's
    /// xid, in stream order.
    kept: Vec<(u32, Change)>,
}

/// One table being copied, as the stream sees it.
#[derive(Debug)]
struct TableCopy {
    table: String,
    mode: CopyMode,
    sink: Option<String>,
    /// Keys up to this one are on the targets (handed downstream).
    done: Option<ReadKey>,
    key: Option<(Arc<Relation>, Option<ChunkKey>)>,
    window: Option<Window>,
}

/// Where a key is for a new table's copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// Handed downstream: changes go on as usual.
    Copied,
    /// In the open window's chunk.
    Window,
    /// Not read yet: the chunk that covers it will read its outcome.
    Ahead,
}

/// A chunk announced by the copy worker before its low watermark.
#[derive(Debug)]
pub struct Opening {
    /// The chunk's id, as its watermarks carry it.
    pub id: u64,
    /// The table's OID.
    pub oid: u32,
    /// The chunk's upper key; none for the last chunk.
    pub up_to: Option<Key>,
}

/// A chunk read, handed over before its high watermark.
#[derive(Debug)]
pub struct ChunkRead {
    /// The chunk's id.
    pub id: u64,
    /// The table's OID.
    pub oid: u32,
    /// The table as read.
    pub relation: Arc<Relation>,
    /// The rows, in key order, with their keys.
    pub rows: Vec<(ReadKey, Row)>,
    /// The read's snapshot.
    pub snapshot: PgSnapshot,
    /// The chunk's upper key; none for the last chunk.
    pub up_to: Option<ReadKey>,
    /// The key's columns and how the read ordered them.
    pub key: Vec<(usize, KeyOrder)>,
    /// Told once the chunk went downstream (true) or was dropped (false).
    pub done: tokio::sync::oneshot::Sender<bool>,
}

/// The changes of a chunk unit, and what it makes durable.
#[derive(Debug)]
pub struct ChunkUnit {
    /// The table's OID.
    pub oid: u32,
    /// The rows, then the window's later changes.
    pub changes: Vec<Change>,
    /// The key copied up to once the unit is durable; none when the copy
    /// is then complete.
    pub up_to: Option<ReadKey>,
    /// The only sink the unit is for (`resync --sink`).
    pub sink: Option<String>,
}

/// Every table being copied while streaming, stream side.
#[derive(Debug, Default)]
pub struct Copies {
    tables: HashMap<RelationId, TableCopy>,
    /// Chunks announced whose low watermark has not come yet.
    openings: Vec<Opening>,
}

impl Copies {
    /// True when `oid` is being copied.
    pub fn contains(&self, oid: u32) -> bool {
        self.tables.contains_key(&oid)
    }

    /// True when nothing is being copied.
    pub fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }

    /// Starts (or goes on with) the copy of `stored`.
    pub fn start(&mut self, stored: &StoredCopy) {
        self.tables.insert(
            stored.oid,
            TableCopy {
                table: stored.table.clone(),
                mode: stored.mode,
                sink: stored.sink.clone(),
                done: None,
                key: None,
                window: None,
            },
        );
    }

    /// Sets how far the copy of `oid` has come (from the state, or a
    /// worker starting over after a reconnect).
    pub fn set_done(&mut self, oid: u32, done: Option<ReadKey>) {
        if let Some(copy) = self.tables.get_mut(&oid) {
            copy.done = done;
            copy.window = None;
        }
    }

    /// How far each copy has come (handed downstream), for a new worker.
    pub fn progress(&self) -> impl Iterator<Item = (u32, &str, CopyMode, Option<&ReadKey>)> {
        self.tables
            .iter()
            .map(|(oid, c)| (*oid, c.table.as_str(), c.mode, c.done.as_ref()))
    }

    /// Ends the copy of `oid` (complete, truncated, or the table left the
    /// publication).
    pub fn finish(&mut self, oid: u32) {
        self.tables.remove(&oid);
        self.openings.retain(|o| o.oid != oid);
    }

    /// Drops open windows and announced chunks: the stream starts over
    /// from the slot and the worker with it.
    pub fn reset_windows(&mut self) {
        self.openings.clear();
        for copy in self.tables.values_mut() {
            copy.window = None;
        }
    }

    /// Records a chunk announced by the worker.
    pub fn announce(&mut self, opening: Opening) {
        self.openings.push(opening);
    }

    /// A low watermark came: opens the window of the chunk it names.
    /// Watermarks of chunks not announced (an earlier run's, read again
    /// from the slot) are ignored.
    pub fn low(&mut self, id: u64) -> bool {
        let Some(pos) = self.openings.iter().position(|o| o.id == id) else {
            return false;
        };
        let opening = self.openings.swap_remove(pos);
        let Some(copy) = self.tables.get_mut(&opening.oid) else {
            return false;
        };
        copy.window = Some(Window {
            id,
            up_to: opening.up_to,
            kept: Vec::new(),
        });
        true
    }

    /// A high watermark came with its chunk read: the unit to hand
    /// downstream, or none when the chunk is not the one open (then it
    /// is read again).
    pub fn high(&mut self, chunk: ChunkRead, at: Lsn) -> Option<ChunkUnit> {
        let copy = self.tables.get_mut(&chunk.oid)?;
        let window = copy.window.take_if(|w| w.id == chunk.id)?;
        let mut changes = Vec::with_capacity(chunk.rows.len() + window.kept.len() + 1);
        if copy.mode == CopyMode::Replace {
            // Everything the targets hold of the table goes; the rows and
            // the window's changes the read does not show make it again.
            changes.push(Change::Truncate(Truncate {
                lsn: at,
                relations: vec![chunk.relation.clone()],
                options: TruncateOptions::default(),
            }));
        }
        if copy.mode == CopyMode::Resync {
            // Rows a damaged target holds in the range and the read did not
            // find go first (the window's late changes come again after).
            changes.push(Change::ReadRange(ReadRange {
                lsn: at,
                relation: chunk.relation.clone(),
                key: chunk.key.clone(),
                after: copy.done.as_ref().map(|d| d.text.clone()),
                up_to: chunk.up_to.as_ref().map(|u| u.text.clone()),
                keys: chunk.rows.iter().map(|(k, _)| k.text.clone()).collect(),
            }));
        }
        let read = |new: Row| Change::Read {
            lsn: at,
            relation: chunk.relation.clone(),
            new,
        };
        changes.extend(chunk.rows.into_iter().map(|(_, row)| read(row)));
        changes.extend(
            window
                .kept
                .into_iter()
                .filter(|(xid, _)| !chunk.snapshot.shows(*xid))
                .map(|(_, change)| change),
        );
        copy.done = chunk.up_to.clone();
        let _ = chunk.done.send(true);
        Some(ChunkUnit {
            oid: chunk.oid,
            changes,
            up_to: chunk.up_to,
            sink: copy.sink.clone(),
        })
    }

    /// Passes `change` of transaction `xid` through the copies: pushes
    /// onto `out` what goes downstream now. Tables not being copied pass
    /// unchanged. A truncate ends the copies of its tables (both sides are
    /// then empty); their oids are returned in `finished`.
    pub fn filter(
        &mut self,
        xid: u32,
        change: Change,
        out: &mut Vec<Change>,
        finished: &mut Vec<u32>,
    ) {
        let relation = match &change {
            Change::Insert { relation, .. }
            | Change::Update { relation, .. }
            | Change::Delete { relation, .. } => relation.clone(),
            Change::Truncate(t) => {
                for r in &t.relations {
                    if self.tables.remove(&r.id).is_some() {
                        finished.push(r.id);
                    }
                }
                out.push(change);
                return;
            }
            Change::Read { .. } | Change::ReadRange(_) | Change::Message(_) => {
                out.push(change);
                return;
            }
        };
        let Some(copy) = self.tables.get_mut(&relation.id) else {
            out.push(change);
            return;
        };
        if copy.mode == CopyMode::Replace {
            // Every change streams; one inside the window comes again,
            // as it was, after the unit's truncate and rows unless the read
            // shows it.
            if let Some(w) = &mut copy.window {
                w.kept.push((xid, change.clone()));
            }
            out.push(change);
            return;
        }
        let fresh = copy
            .key
            .as_ref()
            .is_none_or(|(r, _)| !Arc::ptr_eq(r, &relation));
        if fresh {
            copy.key = Some((relation.clone(), ChunkKey::of(&relation)));
        }
        let Some((_, Some(chunk_key))) = &copy.key else {
            // No key (yet: a table created by CREATE TABLE AS gets its
            // primary key after its rows). Before its copy begins, a new
            // table's changes wait like any; a copy cannot go on without a
            // key (the worker refuses it), so otherwise they stream.
            if copy.mode == CopyMode::Resync || copy.done.is_some() || copy.window.is_some() {
                out.push(change);
            }
            return;
        };
        let chunk_key = chunk_key.clone();
        copy.route(&chunk_key, xid, change, out);
    }
}

/// The keys a change leaves and reaches: (old, new); a side is none when
/// the change has none (an insert leaves nothing) or its key is unknown.
fn change_keys(key: &ChunkKey, change: &Change) -> [Option<Key>; 2] {
    match change {
        Change::Insert { new, .. } | Change::Read { new, .. } => [None, key.key_of(new)],
        Change::Delete { old, .. } => [key.key_of(&old.row), None],
        Change::Update { old, new, .. } => {
            let arrival = key.key_of(new);
            let departure = match old {
                Some(old) => key.key_of(&old.row),
                None => arrival.clone(),
            };
            [departure, arrival]
        }
        Change::Truncate(_) | Change::ReadRange(_) | Change::Message(_) => [None, None],
    }
}

impl TableCopy {
    fn place(&self, key: &Key) -> Place {
        let done = self.done.as_ref().map(|d| &d.parts);
        if done.is_some_and(|d| key <= d) {
            return Place::Copied;
        }
        match &self.window {
            Some(w) if in_range(key, done, w.up_to.as_ref()) => Place::Window,
            _ => Place::Ahead,
        }
    }

    /// A change goes downstream if its keys are copied, is kept aside if
    /// they are in the window, and if they are ahead is left out (a new
    /// table) or goes downstream (a re-sync). An update moving a row
    /// between those places is split into its leaving and its arriving.
    fn route(&mut self, chunk_key: &ChunkKey, xid: u32, change: Change, out: &mut Vec<Change>) {
        let [departure, arrival] = change_keys(chunk_key, &change);
        let (Some(from), Some(to)) = (
            departure.as_ref().map(|k| self.place(k)),
            arrival.as_ref().map(|k| self.place(k)),
        ) else {
            // An insert or a delete has one side; a key that cannot be read
            // (malformed) streams as it is.
            let side = departure.or(arrival);
            match side.map(|k| self.place(&k)) {
                Some(place) => self.send(place, xid, change, out),
                None => out.push(change),
            }
            return;
        };
        if from == to {
            self.send(from, xid, change, out);
            return;
        }
        let Change::Update {
            lsn,
            relation,
            old,
            new,
        } = change
        else {
            return;
        };
        if let Some(old) = old {
            let leaving = Change::Delete {
                lsn,
                relation: relation.clone(),
                old: OldRow {
                    kind: old.kind,
                    row: old.row,
                },
            };
            self.send(from, xid, leaving, out);
        }
        let new = if to == Place::Ahead {
            new
        } else {
            self.whole(new, lsn)
        };
        let arriving = match self.mode {
            CopyMode::NewTable => Change::Insert { lsn, relation, new },
            // (A copy that replaces the table never routes by key.)
            CopyMode::Resync | CopyMode::Replace => Change::Read { lsn, relation, new },
        };
        self.send(to, xid, arriving, out);
    }

    /// The new row of an update moving a row into the copied part, where
    /// it arrives as a whole row: unchanged TOASTed values it leaves out
    /// cannot be had, and are NULL (said in the log).
    fn whole(&self, new: Row, lsn: Lsn) -> Row {
        if !new.contains(&Datum::UnchangedToast) {
            return new;
        }
        tracing::warn!(table = %self.table, %lsn, "an update moved a row into the copied part of the table leaving its unchanged TOASTed values out; they arrive as NULL: re-sync the table once its copy is done");
        new.into_iter()
            .map(|d| {
                if d == Datum::UnchangedToast {
                    Datum::Null
                } else {
                    d
                }
            })
            .collect()
    }

    fn send(&mut self, place: Place, xid: u32, change: Change, out: &mut Vec<Change>) {
        match (place, self.mode) {
            (Place::Copied, _) | (Place::Ahead, CopyMode::Resync | CopyMode::Replace) => {
                out.push(change)
            }
            (Place::Ahead, CopyMode::NewTable) => {}
            (Place::Window, CopyMode::NewTable) => {
                if let Some(w) = &mut self.window {
                    w.kept.push((xid, change));
                }
            }
            // The target holds the row (or should): the change goes on, and
            // is applied again after the rows if the read does not show it,
            // so a row the target's copy lacked comes out right. Applied
            // again over the read row, an insert is an upsert and a moved
            // row leaves and arrives whole.
            (Place::Window, CopyMode::Resync | CopyMode::Replace) => {
                let again = self.again(&change);
                out.push(change);
                if let Some(w) = &mut self.window {
                    w.kept.extend(again.into_iter().map(|c| (xid, c)));
                }
            }
        }
    }

    /// A re-sync's change as applied again after the chunk's rows.
    fn again(&self, change: &Change) -> Vec<Change> {
        match change {
            Change::Insert { lsn, relation, new } => vec![Change::Read {
                lsn: *lsn,
                relation: relation.clone(),
                new: new.clone(),
            }],
            Change::Update {
                lsn,
                relation,
                old: Some(old),
                new,
            } if old.kind == walbridge_core::OldRowKind::Key => vec![
                Change::Delete {
                    lsn: *lsn,
                    relation: relation.clone(),
                    old: old.clone(),
                },
                Change::Read {
                    lsn: *lsn,
                    relation: relation.clone(),
                    new: self.whole(new.clone(), *lsn),
                },
            ],
            other => vec![other.clone()],
        }
    }
}

#[cfg(test)]
mod tests;
