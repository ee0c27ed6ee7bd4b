//! The sink's own file: its positions in the sources' logs (for log
//! retention; the target's stored position is what the sink resumes
//! from) and the transactions it is stopped on (for `walbridge skip`).

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use walbridge_core::Lsn;
use walbridge_log::{CursorFile, CursorPosition, CursorState};
use walbridge_sink::{LogPosition, SourceContext};

use crate::error::{SinkError, StoppedOn};

/// How often the cursor file is rewritten while positions advance.
const STORE_INTERVAL: Duration = Duration::from_secs(1);

/// What the sink keeps next to its positions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ResumeData {
    /// Per source, the transaction the sink stopped on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stopped_on: Vec<StoppedOn>,
    /// Per source: a batched statement failed; changes up to this position
    /// are applied one by one, to find the transaction at fault.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub one_by_one_until: BTreeMap<String, Lsn>,
    /// Per source, per table (its OID on the publisher): the published
    /// columns as of the last target commit, which the next descriptor of
    /// the table is compared with to tell columns dropped and renamed
    /// (`schema_changes = "apply"`). Stored after the commit, so it may
    /// lag the target, never lead it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub published: BTreeMap<String, Published>,
}

/// A source's published columns per table OID.
pub type Published = BTreeMap<u32, Vec<walbridge_core::ColumnShape>>;

struct Inner {
    file: CursorFile,
    cursor: CursorState,
    data: ResumeData,
    stored: Instant,
    dirty: bool,
}

/// The sink's state, shared by its appliers.
pub struct SinkState {
    sink: String,
    inner: Mutex<Inner>,
}

impl SinkState {
    /// Loads the state of `sink` from `file`.
    pub fn load(sink: &str, file: CursorFile) -> Result<Self, SinkError> {
        let cursor = file
            .load()
            .map_err(|source| SinkError::Log {
                sink: sink.to_owned(),
                source,
            })?
            .unwrap_or_default();
        let data = serde_json::from_value(cursor.consumer.clone()).unwrap_or_default();
        Ok(SinkState {
            sink: sink.to_owned(),
            inner: Mutex::new(Inner {
                file,
                cursor,
                data,
                stored: Instant::now(),
                dirty: false,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind; go on with it.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cursor stored for `source`.
    pub fn cursor(&self, source: &str) -> Option<CursorPosition> {
        self.lock().cursor.positions.get(source).cloned()
    }

    /// The transaction the sink is stopped on for `source`.
    pub fn stopped_on(&self, source: &str) -> Option<StoppedOn> {
        self.lock()
            .data
            .stopped_on
            .iter()
            .find(|s| s.source == source)
            .cloned()
    }

    /// Every transaction the sink is stopped on.
    pub fn all_stopped(&self) -> Vec<StoppedOn> {
        self.lock().data.stopped_on.clone()
    }

    /// Records (and stores at once) that the sink stopped on `stopped`.
    pub fn set_stopped(&self, stopped: &StoppedOn) {
        let mut inner = self.lock();
        inner.data.stopped_on.retain(|s| s.source != stopped.source);
        inner.data.stopped_on.push(stopped.clone());
        self.store(&mut inner);
    }

    /// Forgets (and stores at once) what `source` was stopped on.
    pub fn clear_stopped(&self, source: &str) {
        let mut inner = self.lock();
        let before = inner.data.stopped_on.len();
        inner.data.stopped_on.retain(|s| s.source != source);
        if inner.data.stopped_on.len() != before {
            self.store(&mut inner);
        }
    }

    /// Up to where `source`'s changes are applied one by one.
    pub fn one_by_one_until(&self, source: &str) -> Option<Lsn> {
        self.lock().data.one_by_one_until.get(source).copied()
    }

    /// Records (and stores at once) that `source`'s changes up to `lsn`
    /// are to be applied one by one; `None` ends that.
    pub fn set_one_by_one_until(&self, source: &str, lsn: Option<Lsn>) {
        let mut inner = self.lock();
        let changed = match lsn {
            Some(lsn) => inner.data.one_by_one_until.insert(source.to_owned(), lsn) != Some(lsn),
            None => inner.data.one_by_one_until.remove(source).is_some(),
        };
        if changed {
            self.store(&mut inner);
        }
    }

    /// The published columns stored for `source`.
    pub fn published(&self, source: &str) -> Published {
        self.lock()
            .data
            .published
            .get(source)
            .cloned()
            .unwrap_or_default()
    }

    /// Records (and stores at once) `source`'s published columns.
    pub fn set_published(&self, source: &str, published: Published) {
        let mut inner = self.lock();
        if inner.data.published.get(source) != Some(&published) {
            inner.data.published.insert(source.to_owned(), published);
            self.store(&mut inner);
        }
    }

    /// Records that everything up to `position` of `source` is durable on
    /// the target; stored at most every [`STORE_INTERVAL`].
    pub fn advanced(&self, source: &SourceContext, position: LogPosition) {
        let mut inner = self.lock();
        inner.cursor.positions.insert(
            source.name.clone(),
            CursorPosition {
                log: source.log_id.clone(),
                next: position.next,
            },
        );
        inner.dirty = true;
        if inner.stored.elapsed() >= STORE_INTERVAL {
            self.store(&mut inner);
        }
    }

    /// Stores what changed since the last store.
    pub fn flush(&self) {
        let mut inner = self.lock();
        if inner.dirty {
            self.store(&mut inner);
        }
    }

    fn store(&self, inner: &mut Inner) {
        inner.cursor.consumer = serde_json::to_value(&inner.data).unwrap_or_default();
        // At most once a second, plus once per stop: a short blocking write is fine.
        match inner.file.store(&inner.cursor) {
            Ok(()) => {
                inner.dirty = false;
                inner.stored = Instant::now();
            }
            // The target holds the truth; a cursor that lags only delays log retention.
            Err(e) => tracing::warn!(sink = %self.sink, "cannot store the sink's cursor: {e}"),
        }
    }
}
