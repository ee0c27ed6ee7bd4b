//! Epochs: every opening of a log for writing begins one, and a position
//! taken during an epoch says which.
//!
//! A reader of records before their fsync ([`crate::Visibility::WrittenUnits`])
//! can hand out a position past what a crash of the machine keeps. After
//! such a crash the log is reopened at the end that survived, the source
//! appends the publisher's units again from there, and the numbers of the
//! lost records go to whatever comes now (the same transactions, but
//! sequences' values and messages need not fall where they did): the old
//! position would name another place. Each epoch's first record is
//! recorded durably before anything of it is written (`epochs` in the log's
//! directory), so the end of what an epoch wrote that survived is where the
//! next one began. A position of an earlier epoch past that end is resumed
//! from that end: at least once, never a gap. (Kafka's leader epochs solve
//! the same problem for a replica's log.)
//!
//! Invariants:
//! * An epoch begins only once the records before its start are durable
//!   (the log fsyncs the recovered tail before), so no later crash takes
//!   them and every epoch ends at or after its start.
//! * Epoch 0 is every position taken before the log recorded epochs (or
//!   by a walbridge that did not): it ended where epoch 1 began.
//! * An epoch is forgotten once its end is before the log's first record:
//!   every position of it is then before the first record, or lost and
//!   resumed from before the first record, so removed either way.

use std::path::Path;

use walbridge_core::Lsn;

use crate::error::LogError;
use crate::log::write_durably;

/// The file listing each epoch's start.
const FILE: &str = "epochs";

/// Where a position taken during an epoch is read from now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResumePoint {
    /// From the position itself: every record before it is the one that
    /// was there when the position was taken.
    Kept(u64),
    /// From `next`, the end of what the position's epoch wrote that
    /// survived a crash (records before it are as they were; the ones
    /// after were lost and numbered anew): a unit boundary, with the LSN
    /// its records cover.
    Lost {
        /// Where to read from.
        next: u64,
        /// The publisher LSN covered by the records before `next`.
        last_lsn: Lsn,
    },
    /// The epoch ended before the log's first record: whatever the
    /// position, the records it needs are removed.
    Removed,
    /// The epoch is later than the log's own (its directory was restored
    /// from an older copy): the position is not one of this log.
    Unknown,
}

/// An epoch and where it began.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct EpochStart {
    epoch: u64,
    next_seq: u64,
    last_lsn: Lsn,
}

/// The log's epochs still needed, oldest first; the last is the current.
#[derive(Clone, Debug)]
pub(crate) struct Epochs {
    starts: Vec<EpochStart>,
}

impl Epochs {
    /// Begins a new epoch at `next_seq` (covering `last_lsn`), durably,
    /// forgetting those that ended before `first_seq`.
    pub(crate) fn begin(
        dir: &Path,
        next_seq: u64,
        last_lsn: Lsn,
        first_seq: u64,
    ) -> Result<Epochs, LogError> {
        let path = dir.join(FILE);
        let mut starts = match std::fs::read_to_string(&path) {
            Ok(text) => parse(&text).map_err(|problem| LogError::Segment {
                path: path.clone(),
                problem,
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(LogError::io("read", &path)(e)),
        };
        let epoch = starts.last().map_or(1, |s| s.epoch + 1);
        if starts.last().is_some_and(|s| s.next_seq > next_seq) {
            // Records that were durable are gone (removed by hand, or a
            // disk that lost what it had fsynced): every earlier epoch's
            // positions past the end are lost too.
            tracing::warn!(log = %dir.display(), end = next_seq, "the log ends before where an earlier opening began: records it held durably are gone");
            for start in starts.iter_mut().filter(|s| s.next_seq > next_seq) {
                start.next_seq = next_seq;
                start.last_lsn = last_lsn;
            }
        }
        starts.push(EpochStart {
            epoch,
            next_seq,
            last_lsn,
        });
        let mut epochs = Epochs { starts };
        epochs.forget_before(first_seq);
        write_durably(dir, FILE, epochs.to_text().as_bytes())?;
        Ok(epochs)
    }

    /// The current epoch.
    pub(crate) fn current(&self) -> u64 {
        self.starts.last().map_or(0, |s| s.epoch)
    }

    /// Where a position `next` taken during `epoch` is read from now.
    pub(crate) fn resume_point(&self, epoch: u64, next: u64) -> ResumePoint {
        if epoch >= self.current() {
            return if epoch == self.current() {
                ResumePoint::Kept(next)
            } else {
                ResumePoint::Unknown
            };
        }
        // It ended where the epoch after it began.
        match self.starts.iter().find(|s| s.epoch == epoch + 1) {
            Some(after) if next <= after.next_seq => ResumePoint::Kept(next),
            Some(after) => ResumePoint::Lost {
                next: after.next_seq,
                last_lsn: after.last_lsn,
            },
            None => ResumePoint::Removed,
        }
    }

    /// Drops the epochs whose end (the next one's start) is before
    /// `first_seq`; the current one always stays.
    fn forget_before(&mut self, first_seq: u64) {
        let ended_before = self
            .starts
            .windows(2)
            .take_while(|pair| pair[1].next_seq < first_seq)
            .count();
        self.starts.drain(..ended_before);
    }

    fn to_text(&self) -> String {
        let mut text = String::from("# epoch, first record, LSN covered before it\n");
        for s in &self.starts {
            text.push_str(&format!("{} {} {}\n", s.epoch, s.next_seq, s.last_lsn.0));
        }
        text
    }
}

fn parse(text: &str) -> Result<Vec<EpochStart>, String> {
    let mut starts: Vec<EpochStart> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let fields: Vec<u64> = line
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("line {}: {e}: {line:?}", i + 1))?;
        let &[epoch, next_seq, last_lsn] = fields.as_slice() else {
            return Err(format!(
                "line {}: not `epoch first-record lsn`: {line:?}",
                i + 1
            ));
        };
        if starts
            .last()
            .is_some_and(|s| s.epoch + 1 != epoch || s.next_seq > next_seq)
        {
            return Err(format!("line {}: epochs out of order: {line:?}", i + 1));
        }
        starts.push(EpochStart {
            epoch,
            next_seq,
            last_lsn: Lsn(last_lsn),
        });
    }
    Ok(starts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok<T, E: std::fmt::Display>(r: Result<T, E>) -> T {
        r.unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_position_past_what_its_epoch_kept_resumes_from_where_the_next_began() {
        let dir = ok(tempfile::tempdir());
        // Opened on an empty log; reopened at 6 twice (a crash took what
        // epoch 2 wrote past 6, or it wrote nothing).
        assert_eq!(ok(Epochs::begin(dir.path(), 0, Lsn(0), 0)).current(), 1);
        ok(Epochs::begin(dir.path(), 6, Lsn(60), 0));
        let epochs = ok(Epochs::begin(dir.path(), 6, Lsn(60), 0));
        assert_eq!(epochs.current(), 3);
        let lost_at_6 = ResumePoint::Lost {
            next: 6,
            last_lsn: Lsn(60),
        };
        assert_eq!(epochs.resume_point(1, 4), ResumePoint::Kept(4));
        assert_eq!(epochs.resume_point(1, 6), ResumePoint::Kept(6));
        assert_eq!(epochs.resume_point(1, 7), lost_at_6);
        assert_eq!(epochs.resume_point(2, 6), ResumePoint::Kept(6));
        assert_eq!(epochs.resume_point(2, 10), lost_at_6);
        // The current epoch has lost nothing, however far it is.
        assert_eq!(epochs.resume_point(3, 12), ResumePoint::Kept(12));
        // Before epochs were recorded: ended where epoch 1 began.
        assert_eq!(epochs.resume_point(0, 0), ResumePoint::Kept(0));
        assert_eq!(
            epochs.resume_point(0, 3),
            ResumePoint::Lost {
                next: 0,
                last_lsn: Lsn(0)
            }
        );
        assert_eq!(epochs.resume_point(4, 0), ResumePoint::Unknown);
    }

    #[test]
    fn epochs_that_ended_before_the_first_record_are_forgotten() {
        let dir = ok(tempfile::tempdir());
        ok(Epochs::begin(dir.path(), 0, Lsn(0), 0));
        ok(Epochs::begin(dir.path(), 6, Lsn(60), 0));
        ok(Epochs::begin(dir.path(), 6, Lsn(60), 0));
        // Records before 10 removed: epochs 1 and 2 ended at 6.
        let epochs = ok(Epochs::begin(dir.path(), 20, Lsn(200), 10));
        assert_eq!(epochs.current(), 4);
        assert_eq!(epochs.starts.len(), 2, "{epochs:?}");
        assert_eq!(epochs.resume_point(1, 3), ResumePoint::Removed);
        // Epoch 2 is known by the start of epoch 3, its end: resumed from
        // before the first record, which its reader finds removed.
        assert_eq!(
            epochs.resume_point(2, 8),
            ResumePoint::Lost {
                next: 6,
                last_lsn: Lsn(60)
            }
        );
        assert_eq!(epochs.resume_point(3, 15), ResumePoint::Kept(15));
        assert_eq!(
            epochs.resume_point(3, 25),
            ResumePoint::Lost {
                next: 20,
                last_lsn: Lsn(200)
            }
        );
        // Read back as written: the next opening is epoch 5.
        assert_eq!(ok(Epochs::begin(dir.path(), 20, Lsn(200), 10)).current(), 5);
    }

    #[test]
    fn a_log_that_ends_before_an_earlier_epoch_began_loses_every_position_past_its_end() {
        let dir = ok(tempfile::tempdir());
        ok(Epochs::begin(dir.path(), 0, Lsn(0), 0));
        ok(Epochs::begin(dir.path(), 6, Lsn(60), 0));
        // Records 3..6, durable, are gone.
        let epochs = ok(Epochs::begin(dir.path(), 3, Lsn(30), 0));
        let lost_at_3 = ResumePoint::Lost {
            next: 3,
            last_lsn: Lsn(30),
        };
        assert_eq!(epochs.resume_point(1, 5), lost_at_3);
        assert_eq!(epochs.resume_point(2, 7), lost_at_3);
        assert_eq!(epochs.resume_point(1, 2), ResumePoint::Kept(2));
        // Still a file that reads back.
        assert_eq!(ok(Epochs::begin(dir.path(), 3, Lsn(30), 0)).current(), 4);
    }

    #[test]
    fn a_damaged_epochs_file_is_an_error_naming_it() {
        let dir = ok(tempfile::tempdir());
        for (text, says) in [
            ("1 0 0\n2 x 0\n", "invalid digit"),
            ("1 0 0\n2 6\n", "not `epoch first-record lsn`"),
            ("1 0 0\n3 6 0\n", "out of order"),
            ("1 6 0\n2 5 0\n", "out of order"),
        ] {
            ok(std::fs::write(dir.path().join(FILE), text));
            let error = Epochs::begin(dir.path(), 6, Lsn(0), 0)
                .map(|e| e.current())
                .map_err(|e| e.to_string());
            let message = error.err().unwrap_or_default();
            assert!(
                message.contains("epochs") && message.contains(says),
                "{text:?}: {message}"
            );
        }
    }
}
