//! Consumer groups: which member reads which partitions, and rebalancing.
//!
//! A group's changes are spread over its partitions by a hash of the row's
//! key ([`row_partition`]); each partition has its own stored position
//! (see [`crate::consumers`]). The members of a group share the
//! partitions, one member per partition, in generations:
//!
//! * A member joining or leaving starts a new generation. Every member
//!   still holding an assignment of an earlier one stops sending and
//!   drains: it waits until its subscriber has acknowledged everything it
//!   was sent and the acknowledgement is stored (its window is empty; a
//!   group member's window is freed only once stored), then says so.
//! * Once every member has drained, the partitions are assigned (member
//!   `k` of `n`, in joining order, takes those `p` with `p % n == k`) and
//!   each member reads its partitions from their stored positions.
//!
//! So a partition is never read by two members at once, and a member
//! starts a partition exactly where its previous reader's acknowledgements
//! ended: no change is lost or processed twice by members that acknowledge
//! what they process. A member that leaves without acknowledging has its
//! unacknowledged changes sent to whoever takes its partitions.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use walbridge_core::{Change, Datum, Relation, Row, update_new_row};

/// How long a member has to acknowledge what it was sent when the group
/// rebalances.
pub(crate) const REBALANCE_TIMEOUT: Duration = Duration::from_secs(30);
/// A new group's partitions when the request says none, and the most.
pub(crate) const DEFAULT_PARTITIONS: u32 = 16;
pub(crate) const MAX_PARTITIONS: u32 = 256;

/// FNV-1a: stable across processes and versions (a partition's stored
/// position depends on every key always hashing alike), and fast on the
/// short inputs keys are. Four lines; no crate needed.
fn fnv1a(hash: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(hash, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// The partition of a row of `relation`: its key columns' values (every
/// column for a table without a key) and the table's name, hashed.
pub(crate) fn row_partition(relation: &Relation, row: &Row, count: u32) -> u32 {
    let mut hash = 0xcbf2_9ce4_8422_2325;
    for part in [relation.schema.as_bytes(), b".", relation.name.as_bytes()] {
        hash = fnv1a(hash, part);
    }
    let keyed = relation.columns.iter().any(|c| c.is_key);
    for (i, column) in relation.columns.iter().enumerate() {
        if keyed && !column.is_key {
            continue;
        }
        // A tag per kind keeps NULL apart from an empty value.
        hash = match row.get(i) {
            Some(Datum::Text(bytes)) | Some(Datum::Binary(bytes)) => {
                fnv1a(fnv1a(hash, &[1]), bytes)
            }
            _ => fnv1a(hash, &[0]),
        };
    }
    (hash % u64::from(count.max(1))) as u32
}

/// The partition of a change: by the row it leaves behind (the new row of
/// an insert or update, the old key of a delete); truncates and messages
/// go to partition 0.
pub(crate) fn change_partition(change: &Change, count: u32) -> u32 {
    match change {
        Change::Insert { relation, new, .. } | Change::Read { relation, new, .. } => {
            row_partition(relation, new, count)
        }
        Change::Update {
            relation, new, old, ..
        } => row_partition(relation, &update_new_row(new, old.as_ref()), count),
        Change::Delete { relation, old, .. } => row_partition(relation, &old.row, count),
        Change::Truncate(_) | Change::ReadRange(_) | Change::Message(_) => 0,
    }
}

/// The partitions a member holds in one generation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Assignment {
    pub generation: u64,
    pub partitions: Vec<u32>,
    pub count: u32,
    pub members: u32,
}

/// What a member is to do now.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Read its partitions.
    Read(Assignment),
    /// Stop sending; once everything sent is acknowledged, call
    /// [`Groups::drained`] with this generation.
    Drain(u64),
    /// Wait for the other members to drain.
    Wait,
}

#[derive(Debug)]
struct Member {
    /// The latest generation it has drained for (or joined in).
    drained_for: u64,
    assigned: Option<Assignment>,
}

#[derive(Debug)]
struct Group {
    count: u32,
    generation: u64,
    /// By session id: joining order.
    members: BTreeMap<u64, Member>,
}

impl Group {
    /// Starts a new generation; assigns at once if every member is drained.
    fn next_generation(&mut self) {
        self.generation += 1;
        self.assign_if_drained();
    }

    fn assign_if_drained(&mut self) {
        let generation = self.generation;
        if self.members.values().any(|m| m.drained_for < generation) {
            return;
        }
        let n = self.members.len() as u32;
        for (k, member) in self.members.values_mut().enumerate() {
            member.assigned = Some(Assignment {
                generation,
                partitions: (0..self.count).filter(|p| p % n == k as u32).collect(),
                count: self.count,
                members: n,
            });
        }
    }
}

/// The groups of a feed with members connected.
#[derive(Default)]
pub(crate) struct Groups {
    groups: Mutex<HashMap<String, Group>>,
    /// Bumped on every change of any group.
    changed: watch::Sender<()>,
}

impl Groups {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Group>> {
        // Each change is made whole under the lock: consistent after a panic.
        self.groups.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn changed(&self) {
        self.changed.send_replace(());
    }

    /// Wakes on any change of any group.
    pub fn subscribe(&self) -> watch::Receiver<()> {
        self.changed.subscribe()
    }

    /// Session `member` joins group `consumer` of `count` partitions.
    pub fn join(&self, consumer: &str, member: u64, count: u32) {
        let mut groups = self.lock();
        let group = groups.entry(consumer.to_owned()).or_insert(Group {
            count,
            generation: 0,
            members: BTreeMap::new(),
        });
        // It has nothing to drain: it counts as drained for the generation
        // it starts.
        group.members.insert(
            member,
            Member {
                drained_for: group.generation + 1,
                assigned: None,
            },
        );
        group.next_generation();
        drop(groups);
        self.changed();
    }

    /// Session `member` has left group `consumer`.
    pub fn leave(&self, consumer: &str, member: u64) {
        let mut groups = self.lock();
        if let Some(group) = groups.get_mut(consumer) {
            group.members.remove(&member);
            if group.members.is_empty() {
                groups.remove(consumer);
            } else {
                group.next_generation();
            }
        }
        drop(groups);
        self.changed();
    }

    /// Member `member` has everything it was sent acknowledged and stored,
    /// for `generation`.
    pub fn drained(&self, consumer: &str, member: u64, generation: u64) {
        let mut groups = self.lock();
        if let Some(group) = groups.get_mut(consumer) {
            if let Some(m) = group.members.get_mut(&member) {
                m.drained_for = m.drained_for.max(generation);
            }
            group.assign_if_drained();
        }
        drop(groups);
        self.changed();
    }

    /// What member `member` of `consumer` is to do.
    pub fn turn(&self, consumer: &str, member: u64) -> Turn {
        let groups = self.lock();
        let Some(group) = groups.get(consumer) else {
            return Turn::Wait;
        };
        let Some(m) = group.members.get(&member) else {
            return Turn::Wait;
        };
        match &m.assigned {
            Some(a) if a.generation == group.generation => Turn::Read(a.clone()),
            _ if m.drained_for < group.generation => Turn::Drain(group.generation),
            _ => Turn::Wait,
        }
    }

    /// The partitions member `member` holds in `generation`, if it does.
    pub fn held(&self, consumer: &str, member: u64, generation: u64) -> Option<Vec<u32>> {
        let groups = self.lock();
        let assigned = groups
            .get(consumer)?
            .members
            .get(&member)?
            .assigned
            .as_ref()?;
        (assigned.generation == generation).then(|| assigned.partitions.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use walbridge_core::{Column, ReplicaIdentity, ValueKind};

    fn read(groups: &Groups, member: u64) -> Option<Assignment> {
        match groups.turn("g", member) {
            Turn::Read(a) => Some(a),
            _ => None,
        }
    }

    #[test]
    fn partitions_are_reassigned_only_once_every_member_drained() {
        let groups = Groups::default();
        groups.join("g", 1, 4);
        let first = read(&groups, 1).unwrap_or_else(|| panic!("a lone member reads at once"));
        assert_eq!(first.partitions, vec![0, 1, 2, 3]);

        groups.join("g", 2, 4);
        assert_eq!(groups.turn("g", 1), Turn::Drain(2));
        assert_eq!(groups.turn("g", 2), Turn::Wait);
        // A token of the first generation still names what member 1 held.
        assert_eq!(groups.held("g", 1, 1), Some(vec![0, 1, 2, 3]));
        groups.drained("g", 1, 2);
        let one = read(&groups, 1).unwrap_or_else(|| panic!("member 1 reads"));
        let two = read(&groups, 2).unwrap_or_else(|| panic!("member 2 reads"));
        assert_eq!((one.partitions, two.partitions), (vec![0, 2], vec![1, 3]));
        assert_eq!((one.generation, one.members), (2, 2));
        assert_eq!(groups.held("g", 1, 1), None);

        groups.join("g", 3, 4);
        groups.drained("g", 1, 3);
        groups.leave("g", 2);
        // Generation 4: every member drains again, even one that never read.
        assert_eq!(groups.turn("g", 1), Turn::Drain(4));
        assert_eq!(groups.turn("g", 3), Turn::Drain(4));
        groups.drained("g", 1, 4);
        assert_eq!(read(&groups, 3), None);
        groups.drained("g", 3, 4);
        assert_eq!(read(&groups, 3).map(|a| a.partitions), Some(vec![1, 3]));
        groups.leave("g", 1);
        groups.leave("g", 3);
        assert_eq!(groups.turn("g", 3), Turn::Wait);
    }

    #[test]
    fn a_row_always_falls_in_the_same_partition_by_its_key() {
        let column = |name: &str, is_key| Column {
            name: name.into(),
            type_oid: 23,
            type_modifier: -1,
            type_name: "int4".into(),
            kind: ValueKind::Int4,
            is_key,
            attnum: 0,
            not_null: false,
            missing_value: None,
        };
        let relation = Arc::new(Relation {
            id: 1,
            schema: "public".into(),
            name: "t".into(),
            replica_identity: ReplicaIdentity::Default,
            columns: vec![column("id", true), column("v", false)],
            partition_root: None,
            primary_key: vec![0],
        });
        let row = |id: &str, v: &str| {
            vec![
                Datum::Text(id.to_owned().into()),
                Datum::Text(v.to_owned().into()),
            ]
        };
        let p = row_partition(&relation, &row("7", "a"), 16);
        assert_eq!(row_partition(&relation, &row("7", "b"), 16), p);
        assert!(p < 16);
        let spread: std::collections::HashSet<u32> = (0..200)
            .map(|i| row_partition(&relation, &row(&i.to_string(), "x"), 16))
            .collect();
        assert_eq!(spread.len(), 16, "200 keys reach every partition");
    }
}
