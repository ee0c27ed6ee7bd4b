//! The `[log]` section: how the durable log between sources and sinks is kept.

use std::time::Duration;

use serde::Deserialize;
use walbridge_core::{ByteSize, DurationText};
use walbridge_log::{FsyncPolicy, LogOptions, WhenFull};

/// `fsync = …`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FsyncMode {
    /// fsync before acknowledging (group commit).
    #[default]
    Always,
    /// fsync every `fsync_interval`; a power failure may lose that much.
    Interval,
}

/// `when_full = …`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WhenFullMode {
    /// Stop reading from the source (the slot retains WAL on the publisher).
    #[default]
    Block,
    /// Drop the sink that is furthest behind; it needs a fresh snapshot.
    DropSink,
}

fn default_segment_size() -> ByteSize {
    ByteSize(64 << 20)
}

fn default_preallocate() -> bool {
    true
}

fn default_fsync_interval() -> DurationText {
    DurationText(Duration::from_secs(1))
}

/// `[log]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// Segment file size (default 64MiB).
    #[serde(default = "default_segment_size")]
    pub segment_size: ByteSize,
    /// `always` (default) or `interval`.
    #[serde(default)]
    pub fsync: FsyncMode,
    /// With `fsync = "interval"`: how often (default 1s).
    #[serde(default = "default_fsync_interval")]
    pub fsync_interval: DurationText,
    /// Keep what every sink has read for this long, for replay.
    #[serde(default)]
    pub retention_time: Option<DurationText>,
    /// Keep up to this much of what every sink has read, for replay.
    #[serde(default)]
    pub retention_size: Option<ByteSize>,
    /// The most each source's log may hold.
    #[serde(default)]
    pub max_size: Option<ByteSize>,
    /// At `max_size`: `block` (default) or `drop_sink`.
    #[serde(default)]
    pub when_full: WhenFullMode,
    /// Write a steady stream's segments into files zero-filled ahead (default true).
    #[serde(default = "default_preallocate")]
    pub preallocate: bool,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_size: default_segment_size(),
            fsync: FsyncMode::default(),
            fsync_interval: default_fsync_interval(),
            retention_time: None,
            retention_size: None,
            max_size: None,
            when_full: WhenFullMode::default(),
            preallocate: default_preallocate(),
        }
    }
}

impl LogConfig {
    /// The options for each source's log.
    pub fn options(&self) -> LogOptions {
        LogOptions {
            segment_size: self.segment_size.0,
            fsync: match self.fsync {
                FsyncMode::Always => FsyncPolicy::Always,
                FsyncMode::Interval => FsyncPolicy::Interval(self.fsync_interval.0),
            },
            retention_time: self.retention_time.map(|d| d.0),
            retention_size: self.retention_size.map(|s| s.0),
            max_size: self.max_size.map(|s| s.0),
            when_full: match self.when_full {
                WhenFullMode::Block => WhenFull::Block,
                WhenFullMode::DropSink => WhenFull::DropSink,
            },
            preallocate: self.preallocate,
            // Not a setting: the source's confirmations set its bound.
            ..LogOptions::default()
        }
    }

    /// Problems, each naming its key.
    pub fn validate(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.segment_size.0 < 64 << 10 {
            problems.push("[log] `segment_size`: must be at least 64kB".to_owned());
        }
        if self.fsync_interval.0.is_zero() {
            problems.push("[log] `fsync_interval`: must be more than 0".to_owned());
        }
        if let Some(max) = self.max_size
            && max.0 < 2 * self.segment_size.0
        {
            problems.push(format!(
                "[log] `max_size`: must be at least twice `segment_size` ({} bytes), since the segment being written is never removed",
                2 * self.segment_size.0
            ));
        }
        problems
    }
}
