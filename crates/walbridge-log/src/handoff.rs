//! The hand-off: records handed by the writer straight to readers that
//! have caught up (the log's tail, in memory), so they take them without
//! reading and decoding the file again.
//!
//! Invariants:
//! * A record is handed off only with what it holds as the file's
//!   decoding gives it ([`crate::Entry`]), only once it is written, and
//!   only if it is a whole unit by itself (a small transaction, a message):
//!   whatever a reader takes from the hand-off it could have read from the
//!   file, under the same rules ([`Visibility`]). A subscriber gets a record
//!   only once its end (which the writer moves for each visibility: written,
//!   durable, complete units) takes it in; until every subscriber that may
//!   be owed a record has it, the hand-off holds it.
//! * A reader subscribes only when it has read the file up to the end it
//!   may see, and only if that end is the hand-off's (nothing was handed over
//!   meanwhile). The writer hands records over before it publishes the
//!   end that makes them readable, so a reader woken by the end finds them
//!   queued.
//! * A subscriber gets every record up to its end, in order, or is
//!   dropped: when its end takes in a record not handed off (part of a
//!   large transaction, a snapshot record) or when more than
//!   [`QUEUE_BYTES`] wait for it.
//!   A dropped reader reads on from the file at its next record.

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::log::{Visibility, shows_written_units};
use crate::reader::ReadRecord;

/// Record bytes (framed, as in the file) queued for one reader before it
/// is dropped back to reading the file: enough for the jitter of a steady
/// stream, small enough that a reader that falls behind costs little
/// memory (decoded records take two to three times their framed size).
pub(crate) const QUEUE_BYTES: u64 = 1 << 20;

/// Records handed over and the readers taking them.
#[derive(Debug)]
pub(crate) struct Handoff {
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Where the records handed over end.
    ends: Ends,
    /// Records handed over that a subscriber is owed once its end moves
    /// (past the durable end or the complete units' end), in order.
    held: VecDeque<ReadRecord>,
    subscribers: Vec<Subscriber>,
    next_id: u64,
}

/// Where readable records end, for each visibility.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ends {
    /// One past the last record of complete units.
    pub head_next: u64,
    /// One past the last durable record.
    pub durable_next: u64,
    /// One past the last record [`Visibility::Written`] readers see.
    pub written_next: u64,
}

impl Ends {
    /// The same end for every visibility.
    pub(crate) fn all(next: u64) -> Self {
        Ends {
            head_next: next,
            durable_next: next,
            written_next: next,
        }
    }

    /// The end a reader of `visibility` reads to.
    fn of(self, visibility: Visibility) -> u64 {
        match visibility {
            Visibility::CompleteUnits => self.head_next,
            Visibility::Unfinished => self.durable_next,
            Visibility::Written => self.written_next,
            Visibility::WrittenUnits
                if shows_written_units(self.head_next, self.durable_next, self.written_next) =>
            {
                self.written_next
            }
            Visibility::WrittenUnits => self.head_next,
        }
    }
}

#[derive(Debug)]
struct Subscriber {
    id: u64,
    visibility: Visibility,
    /// The next record it is owed.
    next: u64,
    records: VecDeque<ReadRecord>,
    bytes: u64,
}

/// What [`Handoff::take`] found.
pub(crate) enum Taken {
    /// Still subscribed (records, if any, were moved out).
    Subscribed,
    /// Dropped: read on from the file.
    Dropped,
}

impl Handoff {
    /// A hand-off whose records begin at `next` (the log's end when opened).
    pub(crate) fn new(next: u64) -> Self {
        Handoff {
            inner: Mutex::new(Inner {
                ends: Ends::all(next),
                held: VecDeque::new(),
                subscribers: Vec::new(),
                next_id: 0,
            }),
        }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind; go on with it.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Subscribes a reader whose next record is `next`, if that is where
    /// the hand-off's records for its visibility begin. Returns its id.
    pub(crate) fn subscribe(&self, next: u64, visibility: Visibility) -> Option<u64> {
        let mut inner = self.inner();
        if inner.ends.of(visibility) != next {
            return None;
        }
        let id = inner.next_id;
        inner.next_id += 1;
        inner.subscribers.push(Subscriber {
            id,
            visibility,
            next,
            records: VecDeque::new(),
            bytes: 0,
        });
        Some(id)
    }

    /// Ends a subscription (a reader dropped).
    pub(crate) fn unsubscribe(&self, id: u64) {
        let mut inner = self.inner();
        if let Some(i) = inner.subscribers.iter().position(|s| s.id == id) {
            inner.subscribers.swap_remove(i);
        }
    }

    /// Moves what waits for subscriber `id` into `into` (empty).
    pub(crate) fn take(&self, id: u64, into: &mut VecDeque<ReadRecord>) -> Taken {
        let mut inner = self.inner();
        match inner.subscribers.iter_mut().find(|s| s.id == id) {
            Some(s) => {
                std::mem::swap(&mut s.records, into);
                s.bytes = 0;
                Taken::Subscribed
            }
            None => Taken::Dropped,
        }
    }

    /// Hands over `records` (written, in order, each a whole unit; some
    /// of those before the new ends may be missing) as the writer publishes
    /// the new `ends`.
    pub(crate) fn hand_over(&self, records: &mut Vec<ReadRecord>, ends: Ends) {
        let mut inner = self.inner();
        inner.ends = ends;
        if inner.subscribers.is_empty() {
            records.clear();
            inner.held.clear();
            return;
        }
        let Inner {
            subscribers, held, ..
        } = &mut *inner;
        held.extend(records.drain(..));
        let whole = |from: u64, to: u64| {
            from >= to
                || held.binary_search_by_key(&from, |r| r.seq).is_ok_and(|i| {
                    held.get(i + (to - from - 1) as usize)
                        .is_some_and(|r| r.seq == to - 1)
                })
        };
        subscribers.retain(|s| whole(s.next, ends.of(s.visibility)));
        // Every record goes to each subscriber owed it now: cloned, but
        // taken by the last when no subscriber is owed it later.
        let owed = |s: &Subscriber, seq: u64| s.next == seq && seq < ends.of(s.visibility);
        let later = |s: &Subscriber, seq: u64| s.next <= seq && seq >= ends.of(s.visibility);
        let mut kept = VecDeque::new();
        for record in held.drain(..) {
            let seq = record.seq;
            if subscribers.iter().any(|s| later(s, seq)) {
                for s in subscribers.iter_mut().filter(|s| owed(s, seq)) {
                    s.push(record.clone());
                }
                kept.push_back(record);
                continue;
            }
            let Some(last) = subscribers.iter().rposition(|s| owed(s, seq)) else {
                continue;
            };
            for s in &mut subscribers[..last] {
                if owed(s, seq) {
                    s.push(record.clone());
                }
            }
            subscribers[last].push(record);
        }
        *held = kept;
        subscribers.retain(|s| s.bytes <= QUEUE_BYTES);
    }
}

impl Subscriber {
    fn push(&mut self, record: ReadRecord) {
        self.next = record.seq + 1;
        self.bytes += record.size;
        self.records.push_back(record);
    }
}

#[cfg(test)]
mod tests {
    use walbridge_core::Lsn;

    use super::*;
    use crate::record::Entry;

    fn record(seq: u64, size: u64) -> ReadRecord {
        ReadRecord {
            seq,
            lsn: Lsn(seq * 10),
            unit_end: true,
            size,
            entry: Entry::SnapshotComplete {
                consistent_point: Lsn(seq),
            },
        }
    }

    fn ends(head_next: u64, durable_next: u64, written_next: u64) -> Ends {
        Ends {
            head_next,
            durable_next,
            written_next,
        }
    }

    fn taken(handoff: &Handoff, id: u64) -> Option<Vec<u64>> {
        let mut into = VecDeque::new();
        match handoff.take(id, &mut into) {
            Taken::Subscribed => Some(into.iter().map(|r| r.seq).collect()),
            Taken::Dropped => None,
        }
    }

    #[test]
    fn a_subscriber_gets_every_record_up_to_its_end_or_is_dropped() {
        let handoff = Handoff::new(5);
        // Only a reader at the hand-off's end subscribes.
        assert_eq!(handoff.subscribe(4, Visibility::CompleteUnits), None);
        let complete = handoff.subscribe(5, Visibility::CompleteUnits).unwrap();
        let unfinished = handoff.subscribe(5, Visibility::Unfinished).unwrap();

        handoff.hand_over(&mut vec![record(5, 10), record(6, 10)], ends(7, 7, 7));
        assert_eq!(taken(&handoff, complete), Some(vec![5, 6]));
        assert_eq!(taken(&handoff, unfinished), Some(vec![5, 6]));
        assert_eq!(handoff.subscribe(6, Visibility::CompleteUnits), None);

        // Durable past the head: only the reader of unfinished units is owed 7.
        handoff.hand_over(&mut vec![record(7, 10)], ends(7, 8, 8));
        assert_eq!(taken(&handoff, complete), Some(vec![]));
        assert_eq!(taken(&handoff, unfinished), Some(vec![7]));
        assert_eq!(handoff.subscribe(8, Visibility::CompleteUnits), None);
        let late = handoff.subscribe(8, Visibility::Unfinished).unwrap();

        // Records 7 and 8 were not handed off: whoever is owed them is dropped.
        handoff.hand_over(&mut vec![record(9, 10)], ends(10, 10, 10));
        assert_eq!(taken(&handoff, complete), None);
        assert_eq!(taken(&handoff, unfinished), None);
        assert_eq!(taken(&handoff, late), None);

        // More than a queue's bytes waiting: dropped too.
        let slow = handoff.subscribe(10, Visibility::CompleteUnits).unwrap();
        let quick = handoff.subscribe(10, Visibility::CompleteUnits).unwrap();
        handoff.hand_over(&mut vec![record(10, QUEUE_BYTES / 2)], ends(11, 11, 11));
        assert_eq!(taken(&handoff, quick), Some(vec![10]));
        handoff.hand_over(&mut vec![record(11, QUEUE_BYTES / 2 + 1)], ends(12, 12, 12));
        assert_eq!(taken(&handoff, slow), None);
        assert_eq!(taken(&handoff, quick), Some(vec![11]));

        handoff.unsubscribe(quick);
        assert_eq!(taken(&handoff, quick), None);
    }

    #[test]
    fn records_written_ahead_of_the_durable_end_are_held_for_who_is_owed_them_later() {
        let handoff = Handoff::new(5);
        let written = handoff.subscribe(5, Visibility::Written).unwrap();
        let units = handoff.subscribe(5, Visibility::WrittenUnits).unwrap();
        let unfinished = handoff.subscribe(5, Visibility::Unfinished).unwrap();
        let complete = handoff.subscribe(5, Visibility::CompleteUnits).unwrap();

        // Written, not yet durable: only the readers of written records have them.
        handoff.hand_over(&mut vec![record(5, 10), record(6, 10)], ends(5, 5, 7));
        assert_eq!(taken(&handoff, written), Some(vec![5, 6]));
        assert_eq!(taken(&handoff, units), Some(vec![5, 6]));
        assert_eq!(taken(&handoff, unfinished), Some(vec![]));
        assert_eq!(taken(&handoff, complete), Some(vec![]));
        // A reader of durable records subscribes at the durable end.
        let late = handoff.subscribe(5, Visibility::Unfinished).unwrap();
        assert_eq!(handoff.subscribe(5, Visibility::Written), None);

        // Durable: the others get them from what was held, nothing handed again.
        handoff.hand_over(&mut Vec::new(), ends(7, 7, 7));
        assert_eq!(taken(&handoff, written), Some(vec![]));
        assert_eq!(taken(&handoff, unfinished), Some(vec![5, 6]));
        assert_eq!(taken(&handoff, complete), Some(vec![5, 6]));
        assert_eq!(taken(&handoff, late), Some(vec![5, 6]));
        assert_eq!(taken(&handoff, units), Some(vec![]));
        assert!(handoff.inner().held.is_empty());

        // Nobody owed a record later: nothing is held.
        handoff.unsubscribe(unfinished);
        handoff.unsubscribe(complete);
        handoff.unsubscribe(late);
        handoff.hand_over(&mut vec![record(7, 10)], ends(7, 7, 8));
        assert_eq!(taken(&handoff, written), Some(vec![7]));
        assert_eq!(taken(&handoff, units), Some(vec![7]));
        assert!(handoff.inner().held.is_empty());

        // Durable past the head (a unit not ended): a reader of written
        // units waits for the head, as one of complete units.
        handoff.hand_over(&mut vec![record(8, 10)], ends(8, 9, 9));
        assert_eq!(taken(&handoff, written), Some(vec![8]));
        assert_eq!(taken(&handoff, units), Some(vec![]));
    }
}
