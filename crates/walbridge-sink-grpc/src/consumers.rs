//! Durable consumers: named positions in the feed's logs, stored under
//! `data_dir`, one file each, and whether a session reads as each.
//!
//! A consumer's file is a cursor file ([`CursorFile`]: replaced atomically,
//! fsynced): per source, the log's identity and the next record after the
//! last unit acknowledged, with the LSN covered and (inside the copy) the
//! rows before it. A source the file does not name yet (one added to the
//! configuration since) is read from where the consumer was created to
//! start: the log's beginning or its end at the time.
//!
//! A consumer group's file also holds each partition's positions; the
//! cursor positions are then, per source, the least advanced partition's,
//! so what the log keeps for the consumer is what its slowest partition
//! needs.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use walbridge_log::{CursorFile, CursorPosition, CursorState};

use crate::error::FeedError;
use crate::token::TokenPosition;

/// Where a consumer reads a source it has no position in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Origin {
    /// The log's oldest record.
    Earliest,
    /// The log's end when the source is first read.
    Latest,
}

/// What a consumer's file holds besides the cursor positions.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Extra {
    origin: Origin,
    /// Per source: the LSN covered, and rows of the copy before `next`.
    #[serde(default)]
    lsn: BTreeMap<String, u64>,
    #[serde(default)]
    copied_rows: BTreeMap<String, u64>,
    /// Per source, the log's epoch when the position was taken (absent:
    /// 0, before epochs).
    #[serde(default)]
    epoch: BTreeMap<String, u64>,
    /// Unix microseconds of the last acknowledgement (or creation, or seek).
    acknowledged_at: i64,
    /// A group's positions, per partition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    partitions: Option<Vec<Vec<TokenPosition>>>,
}

/// One durable consumer.
#[derive(Clone, Debug)]
pub(crate) struct Consumer {
    /// Per source, where it resumes (a group: its least advanced partition).
    pub positions: Vec<TokenPosition>,
    /// A group's positions, per partition and source.
    pub partitions: Option<Vec<Vec<TokenPosition>>>,
    /// Where it reads a source it has no position in.
    pub origin: Origin,
    /// When it last acknowledged (or was created, or moved).
    pub acknowledged_at: SystemTime,
    /// The sessions reading as it: at most one, unless it is a group.
    pub members: u32,
}

impl Consumer {
    /// True while a session reads as it.
    pub fn connected(&self) -> bool {
        self.members > 0
    }

    /// A group's partition count; 0 when it is not a group.
    pub fn partition_count(&self) -> u32 {
        self.partitions.as_ref().map_or(0, |p| p.len() as u32)
    }

    /// Where partition `partition` of a group resumes.
    pub fn partition(&self, partition: u32) -> &[TokenPosition] {
        self.partitions
            .as_ref()
            .and_then(|p| p.get(partition as usize))
            .map_or(&[], Vec::as_slice)
    }

    /// Moves `into` forward to `acked`, source by source.
    fn advance(into: &mut Vec<TokenPosition>, acked: &[TokenPosition]) {
        for position in acked {
            match into.iter_mut().find(|p| p.source == position.source) {
                Some(p) if p.log == position.log && p.next >= position.next => {}
                Some(p) => *p = position.clone(),
                None => into.push(position.clone()),
            }
        }
    }

    /// A group's positions: per source, the least advanced partition's.
    fn least(partitions: &[Vec<TokenPosition>]) -> Vec<TokenPosition> {
        let mut least: Vec<TokenPosition> = Vec::new();
        for position in partitions.iter().flatten() {
            match least.iter_mut().find(|p| p.source == position.source) {
                Some(p) if p.next <= position.next => {}
                Some(p) => *p = position.clone(),
                None => least.push(position.clone()),
            }
        }
        least
    }
}

/// A consumer name: letters, digits, `_`, `-`, `.`, not starting with a
/// dot, at most 100 characters (it names a file).
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    let fine = !name.is_empty()
        && name.len() <= 100
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if fine {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a consumer name: use 1 to 100 letters, digits, `_`, `-` or `.`, not starting with `.`"
        ))
    }
}

/// The durable consumers of one feed.
pub(crate) struct Consumers {
    dir: PathBuf,
    known: Mutex<BTreeMap<String, Consumer>>,
    /// Per consumer, held while its file is read, changed and written
    /// back, so two changes at once (a group's members acknowledging)
    /// never undo each other.
    writers: Mutex<HashMap<String, Arc<Mutex<()>>>>,
}

/// A session's claim on a durable consumer; released when dropped.
pub(crate) struct Claim {
    consumers: Arc<Consumers>,
    name: String,
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(c) = self.consumers.lock().get_mut(&self.name) {
            c.members = c.members.saturating_sub(1);
        }
    }
}

impl Consumers {
    /// Loads every consumer stored in `dir`.
    pub fn load(dir: &Path) -> Result<Consumers, FeedError> {
        let mut known = BTreeMap::new();
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries.collect::<Result<Vec<_>, _>>(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(e),
        }
        .map_err(|e| FeedError::Store {
            consumer: "*".into(),
            error: walbridge_log::LogError::io("list", dir)(e),
        })?;
        for entry in entries {
            let file_name = entry.file_name();
            let Some(name) = file_name.to_str().and_then(|n| n.strip_suffix(".json")) else {
                continue;
            };
            if check_name(name).is_err() {
                continue;
            }
            let stored = CursorFile::new(dir, name)
                .load()
                .map_err(|error| FeedError::Store {
                    consumer: name.to_owned(),
                    error,
                })?;
            if let Some(state) = stored {
                known.insert(name.to_owned(), from_state(name, dir, state)?);
            }
        }
        Ok(Consumers {
            dir: dir.to_owned(),
            known: Mutex::new(known),
            writers: Mutex::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Consumer>> {
        // A panic while holding it leaves the map consistent: every
        // change to it is one assignment.
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Consumer `name`'s writer lock.
    fn writer(&self, name: &str) -> Arc<Mutex<()>> {
        // A map of locks: consistent after a panic.
        let mut writers = self.writers.lock().unwrap_or_else(|p| p.into_inner());
        writers.entry(name.to_owned()).or_default().clone()
    }

    /// Every consumer, by name.
    pub fn list(&self) -> BTreeMap<String, Consumer> {
        self.lock().clone()
    }

    /// One consumer.
    pub fn get(&self, name: &str) -> Option<Consumer> {
        self.lock().get(name).cloned()
    }

    /// Creates consumer `name` at `positions` (a group of `partitions`
    /// partitions, each there, when given), stored before it counts.
    pub fn create(
        &self,
        name: &str,
        origin: Origin,
        positions: Vec<TokenPosition>,
        partitions: Option<u32>,
    ) -> Result<Consumer, FeedError> {
        check_name(name).map_err(FeedError::Invalid)?;
        // Held while stored: members of a new group subscribing at once
        // all try to create it, and two writes of one cursor file race
        // (one rename finds the other's temporary file gone).
        let writer = self.writer(name);
        let _writing = writer.lock().unwrap_or_else(|p| p.into_inner());
        if self.lock().contains_key(name) {
            return Err(FeedError::ConsumerExists(name.to_owned()));
        }
        let consumer = Consumer {
            partitions: partitions.map(|n| vec![positions.clone(); n as usize]),
            positions,
            origin,
            acknowledged_at: SystemTime::now(),
            members: 0,
        };
        self.store(name, &consumer)?;
        self.lock().insert(name.to_owned(), consumer.clone());
        Ok(consumer)
    }

    /// Takes consumer `name` for a session: a member of its group when
    /// `member`, else its only session (refused while another has it).
    pub fn claim(
        self: &Arc<Self>,
        name: &str,
        member: bool,
    ) -> Result<(Claim, Consumer), FeedError> {
        let mut known = self.lock();
        let consumer = known
            .get_mut(name)
            .ok_or_else(|| FeedError::UnknownConsumer(name.to_owned()))?;
        if member != consumer.partitions.is_some() {
            return Err(FeedError::GroupMismatch {
                consumer: name.to_owned(),
                group: consumer.partitions.is_some(),
            });
        }
        if consumer.connected() && !member {
            return Err(FeedError::ConsumerBusy(name.to_owned()));
        }
        consumer.members += 1;
        let snapshot = consumer.clone();
        Ok((
            Claim {
                consumers: self.clone(),
                name: name.to_owned(),
            },
            snapshot,
        ))
    }

    /// Stores what consumer `name` acknowledged (a group: for
    /// `partitions`; a source new to the consumer: for all of them): each
    /// position moves forward only.
    pub fn acknowledge(
        &self,
        name: &str,
        partitions: &[u32],
        acked: &[TokenPosition],
    ) -> Result<(), FeedError> {
        let writer = self.writer(name);
        let _writing = writer.lock().unwrap_or_else(|p| p.into_inner());
        let Some(mut consumer) = self.get(name) else {
            return Err(FeedError::UnknownConsumer(name.to_owned()));
        };
        match &mut consumer.partitions {
            None => Consumer::advance(&mut consumer.positions, acked),
            Some(all) => {
                for (p, positions) in all.iter_mut().enumerate() {
                    let unknown: Vec<TokenPosition> = acked
                        .iter()
                        .filter(|a| !positions.iter().any(|p| p.source == a.source))
                        .cloned()
                        .collect();
                    if partitions.contains(&(p as u32)) {
                        Consumer::advance(positions, acked);
                    } else {
                        positions.extend(unknown);
                    }
                }
                consumer.positions = Consumer::least(all);
            }
        }
        consumer.acknowledged_at = SystemTime::now();
        self.store(name, &consumer)?;
        if let Some(c) = self.lock().get_mut(name) {
            c.positions = consumer.positions;
            c.partitions = consumer.partitions;
            c.acknowledged_at = consumer.acknowledged_at;
        }
        Ok(())
    }

    /// Moves consumer `name`, which must have no session, to `positions`.
    pub fn seek(
        &self,
        name: &str,
        origin: Origin,
        positions: Vec<TokenPosition>,
    ) -> Result<Consumer, FeedError> {
        let writer = self.writer(name);
        let _writing = writer.lock().unwrap_or_else(|p| p.into_inner());
        let mut consumer = self
            .get(name)
            .ok_or_else(|| FeedError::UnknownConsumer(name.to_owned()))?;
        if consumer.connected() {
            return Err(FeedError::ConsumerBusy(name.to_owned()));
        }
        if let Some(all) = &mut consumer.partitions {
            all.fill(positions.clone());
        }
        consumer.positions = positions;
        consumer.origin = origin;
        consumer.acknowledged_at = SystemTime::now();
        self.store(name, &consumer)?;
        self.lock().insert(name.to_owned(), consumer.clone());
        Ok(consumer)
    }

    /// Deletes consumer `name`, which must have no session.
    pub fn delete(&self, name: &str) -> Result<(), FeedError> {
        let mut known = self.lock();
        match known.get(name) {
            None => return Err(FeedError::UnknownConsumer(name.to_owned())),
            Some(c) if c.connected() => return Err(FeedError::ConsumerBusy(name.to_owned())),
            Some(_) => {}
        }
        CursorFile::new(&self.dir, name)
            .remove()
            .map_err(|error| FeedError::Store {
                consumer: name.to_owned(),
                error,
            })?;
        known.remove(name);
        Ok(())
    }

    fn store(&self, name: &str, consumer: &Consumer) -> Result<(), FeedError> {
        let micros = consumer
            .acknowledged_at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64);
        let extra = Extra {
            origin: consumer.origin,
            lsn: consumer
                .positions
                .iter()
                .map(|p| (p.source.clone(), p.lsn))
                .collect(),
            copied_rows: consumer
                .positions
                .iter()
                .filter(|p| p.copied_rows > 0)
                .map(|p| (p.source.clone(), p.copied_rows))
                .collect(),
            epoch: consumer
                .positions
                .iter()
                .map(|p| (p.source.clone(), p.epoch))
                .collect(),
            acknowledged_at: micros,
            partitions: consumer.partitions.clone(),
        };
        let state = CursorState {
            positions: consumer
                .positions
                .iter()
                .map(|p| {
                    (
                        p.source.clone(),
                        CursorPosition {
                            log: p.log.clone(),
                            next: p.next,
                        },
                    )
                })
                .collect(),
            consumer: serde_json::to_value(&extra).map_err(|e| FeedError::Store {
                consumer: name.to_owned(),
                error: walbridge_log::LogError::io("serialize", &self.dir)(std::io::Error::other(
                    e,
                )),
            })?,
        };
        CursorFile::new(&self.dir, name)
            .store(&state)
            .map_err(|error| FeedError::Store {
                consumer: name.to_owned(),
                error,
            })
    }
}

fn from_state(name: &str, dir: &Path, state: CursorState) -> Result<Consumer, FeedError> {
    let extra: Extra = serde_json::from_value(state.consumer).map_err(|e| FeedError::Store {
        consumer: name.to_owned(),
        error: walbridge_log::LogError::io("parse", dir.join(format!("{name}.json")))(
            std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        ),
    })?;
    let positions = state
        .positions
        .into_iter()
        .map(|(source, p)| TokenPosition {
            lsn: extra.lsn.get(&source).copied().unwrap_or(0),
            copied_rows: extra.copied_rows.get(&source).copied().unwrap_or(0),
            epoch: extra.epoch.get(&source).copied().unwrap_or(0),
            source,
            log: p.log,
            next: p.next,
        })
        .collect();
    Ok(Consumer {
        positions,
        partitions: extra.partitions,
        origin: extra.origin,
        acknowledged_at: SystemTime::UNIX_EPOCH
            + std::time::Duration::from_micros(extra.acknowledged_at.max(0) as u64),
        members: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn position(next: u64) -> TokenPosition {
        TokenPosition {
            source: "shop".into(),
            log: "log-1".into(),
            next,
            lsn: next * 100,
            copied_rows: 0,
            epoch: 1,
        }
    }

    /// Members of a new group subscribing at once each try to create it:
    /// one does, the others find it (never a failed write of its file).
    #[test]
    fn consumers_created_at_once_are_created_once() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let consumers = Arc::new(Consumers::load(dir.path()).unwrap_or_else(|e| panic!("{e}")));
        for round in 0..20 {
            let name = format!("group{round}");
            let outcomes: Vec<Result<Consumer, FeedError>> = std::thread::scope(|s| {
                let tries: Vec<_> = (0..4)
                    .map(|_| {
                        s.spawn(|| {
                            consumers.create(&name, Origin::Earliest, vec![position(1)], Some(3))
                        })
                    })
                    .collect();
                tries
                    .into_iter()
                    .map(|t| t.join().unwrap_or_else(|_| panic!("a create panicked")))
                    .collect()
            });
            let created = outcomes.iter().filter(|o| o.is_ok()).count();
            assert_eq!(created, 1, "{outcomes:?}");
            assert!(
                outcomes
                    .iter()
                    .all(|o| matches!(o, Ok(_) | Err(FeedError::ConsumerExists(_)))),
                "{outcomes:?}"
            );
        }
    }

    #[test]
    fn consumers_survive_a_reload_move_forward_only_and_take_one_session() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let consumers = Arc::new(Consumers::load(dir.path()).unwrap_or_else(|e| panic!("{e}")));
        assert!(consumers.list().is_empty());
        assert!(matches!(
            consumers.create("bad/name", Origin::Earliest, vec![], None),
            Err(FeedError::Invalid(_))
        ));
        consumers
            .create("app", Origin::Earliest, vec![position(3)], None)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            consumers.create("app", Origin::Latest, vec![], None),
            Err(FeedError::ConsumerExists(_))
        ));
        let (claim, _) = consumers
            .claim("app", false)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            consumers.claim("app", false),
            Err(FeedError::ConsumerBusy(_))
        ));
        assert!(matches!(
            consumers.delete("app"),
            Err(FeedError::ConsumerBusy(_))
        ));
        consumers
            .acknowledge("app", &[], &[position(9)])
            .unwrap_or_else(|e| panic!("{e}"));
        // An older acknowledgement (a late duplicate) moves nothing back.
        consumers
            .acknowledge("app", &[], &[position(5)])
            .unwrap_or_else(|e| panic!("{e}"));
        drop(claim);

        let reloaded = Consumers::load(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        let app = reloaded
            .get("app")
            .unwrap_or_else(|| panic!("app was not stored"));
        assert_eq!(app.positions, vec![position(9)]);
        assert_eq!(app.origin, Origin::Earliest);
        assert!(!app.connected());
        reloaded.delete("app").unwrap_or_else(|e| panic!("{e}"));
        assert!(
            Consumers::load(dir.path())
                .unwrap_or_else(|e| panic!("{e}"))
                .list()
                .is_empty()
        );
    }

    #[test]
    fn a_group_keeps_a_position_per_partition_and_takes_many_members() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let consumers = Arc::new(Consumers::load(dir.path()).unwrap_or_else(|e| panic!("{e}")));
        consumers
            .create("workers", Origin::Earliest, vec![position(3)], Some(4))
            .unwrap_or_else(|e| panic!("{e}"));
        let (one, _) = consumers
            .claim("workers", true)
            .unwrap_or_else(|e| panic!("{e}"));
        let (two, _) = consumers
            .claim("workers", true)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            consumers.claim("workers", false),
            Err(FeedError::GroupMismatch { group: true, .. })
        ));
        consumers
            .acknowledge("workers", &[0, 2], &[position(9)])
            .unwrap_or_else(|e| panic!("{e}"));
        consumers
            .acknowledge("workers", &[1, 3], &[position(7)])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(consumers.get("workers").map(|c| c.members), Some(2));
        drop((one, two));

        let reloaded = Consumers::load(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        let workers = reloaded
            .get("workers")
            .unwrap_or_else(|| panic!("workers was not stored"));
        assert_eq!(workers.partition_count(), 4);
        assert_eq!(workers.partition(0), [position(9)]);
        assert_eq!(workers.partition(1), [position(7)]);
        // What the log keeps for it: its least advanced partition.
        assert_eq!(workers.positions, vec![position(7)]);
        reloaded
            .seek("workers", Origin::Latest, vec![position(20)])
            .unwrap_or_else(|e| panic!("{e}"));
        let moved = reloaded.get("workers").unwrap_or_else(|| panic!("gone"));
        assert!((0..4).all(|p| moved.partition(p) == [position(20)]));
    }
}
