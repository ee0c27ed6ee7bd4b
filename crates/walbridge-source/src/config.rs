//! The `[[source]]` section of the configuration file.

use serde::Deserialize;
use walbridge_core::ByteSize;

/// What a source does when its slot is lost (invalidated by
/// `max_slot_wal_keep_size` or `idle_replication_slot_timeout`, or dropped)
/// after its tables were copied: the changes since it last confirmed are
/// gone from the publisher.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnSlotLost {
    /// Stop with one line saying what happened and what to do.
    #[default]
    Stop,
    /// Create the slot again and copy every table again while streaming
    /// (a re-sync of each): sinks apply the rows idempotently, and rows
    /// the targets hold that the publisher no longer has are removed.
    Recopy,
}

/// Which changes to receive by their replication origin (PostgreSQL 16+).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OriginFilter {
    /// Every change, whatever its origin.
    #[default]
    Any,
    /// Only changes made locally on the publisher — not those it applied
    /// as a subscriber (or as a walbridge postgres sink). Breaks loops in
    /// bidirectional setups.
    None,
}

fn yes() -> bool {
    true
}

fn default_workers() -> usize {
    2
}

fn default_spill() -> ByteSize {
    ByteSize(32 << 20)
}

fn default_chunk() -> ByteSize {
    ByteSize(256 << 20)
}

fn default_status_interval() -> u64 {
    10
}

fn default_backfill_chunk_rows() -> u64 {
    32_768
}

fn default_backfill_chunk_bytes() -> ByteSize {
    ByteSize(32 << 20)
}

/// One PostgreSQL database to replicate from.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    /// Unique name of the source; names its slot, state and output.
    pub name: String,
    /// libpq connection string (`key=value` or `postgres://` URL). The role
    /// needs the REPLICATION attribute (or superuser) and SELECT on the
    /// published tables.
    pub connection: String,
    /// Publications to replicate (`CREATE PUBLICATION …` on the publisher).
    pub publications: Vec<String>,
    /// Replication slot name; default `walbridge_<name>`.
    #[serde(default)]
    pub slot: Option<String>,
    /// Create the slot on first start (default true). With `false` the slot
    /// must exist, and `copy_data` must be false.
    #[serde(default = "yes")]
    pub create_slot: bool,
    /// Copy the tables' existing rows before streaming (default true).
    #[serde(default = "yes")]
    pub copy_data: bool,
    /// Ask for values in binary (`typsend`) form where the type has one.
    #[serde(default)]
    pub binary: bool,
    /// Receive large in-progress transactions as they run (PostgreSQL 14+).
    #[serde(default = "yes")]
    pub streaming: bool,
    /// Receive logical decoding messages (`pg_logical_emit_message`).
    #[serde(default = "yes")]
    pub messages: bool,
    /// Decode prepared transactions at PREPARE, deliver them at COMMIT
    /// PREPARED (PostgreSQL 15+; fixed when the slot is created).
    #[serde(default)]
    pub two_phase: bool,
    /// Create the slot so standbys synchronize it and it survives a
    /// failover (PostgreSQL 17+; an existing slot is switched over).
    #[serde(default)]
    pub failover: bool,
    /// Replicate sequences: the published tables' (owned, identity, or
    /// used by a column default) — every sequence with a `FOR ALL TABLES`
    /// publication — read every `refresh_interval` and at shutdown, and
    /// handed on when they moved.
    #[serde(default)]
    pub sequences: bool,
    /// What to do when the slot was invalidated or dropped after the
    /// initial copy: `stop` (the default) or `recopy`.
    #[serde(default)]
    pub on_slot_lost: OnSlotLost,
    /// `any` or `none` (PostgreSQL 16+).
    #[serde(default)]
    pub origin: OriginFilter,
    /// `application_name` on the publisher (default: the source name); the
    /// name to list in `synchronous_standby_names`.
    #[serde(default)]
    pub application_name: Option<String>,
    /// Parallel connections for the initial copy (default 2).
    #[serde(default = "default_workers")]
    pub snapshot_workers: usize,
    /// Tables larger than this are copied in chunks of this size, in
    /// parallel (default 256MiB).
    #[serde(default = "default_chunk")]
    pub snapshot_chunk_size: ByteSize,
    /// Open transactions may hold this much memory together; above it the
    /// largest goes to a spill file under `data_dir` (default 32MiB).
    #[serde(default = "default_spill")]
    pub spill_threshold: ByteSize,
    /// Seconds between status updates to the publisher (default 10).
    #[serde(default = "default_status_interval")]
    pub status_interval: u64,
    /// Seconds between heartbeats: a tiny non-transactional logical message
    /// (`pg_logical_emit_message`) that moves the slot forward on a
    /// database whose published tables are quiet, and shows the source is
    /// alive. Off unless set; the messages are not passed downstream.
    #[serde(default)]
    pub heartbeat_interval: Option<u64>,
    /// Rows per chunk at most when a table is copied while streaming (a
    /// table added to the publication, a re-sync; default 32768): the rows
    /// of one chunk are held in memory, and writers wait for nothing.
    #[serde(default = "default_backfill_chunk_rows")]
    pub backfill_chunk_rows: u64,
    /// … and about this many bytes at most (default 32 MiB), by the
    /// table's average row size sampled when its copy starts: wide rows
    /// make smaller chunks.
    #[serde(default = "default_backfill_chunk_bytes")]
    pub backfill_chunk_bytes: ByteSize,
    /// Seconds between two readings of the publications' tables, to find
    /// tables added (their rows are then copied, if `copy_data`) or
    /// removed (default 10). A table's first change is noticed at once.
    #[serde(default = "default_status_interval")]
    pub refresh_interval: u64,
    /// How often a table being copied logs how far it has come: the
    /// configuration file's top-level `progress_interval`, not a source key.
    #[serde(skip, default = "default_progress_interval")]
    pub progress_interval: std::time::Duration,
}

/// The default of `progress_interval`.
pub fn default_progress_interval() -> std::time::Duration {
    std::time::Duration::from_secs(5)
}

impl SourceConfig {
    /// The slot name in use.
    pub fn slot_name(&self) -> String {
        self.slot.clone().unwrap_or_else(|| {
            format!(
                "walbridge_{}",
                self.name.to_ascii_lowercase().replace('-', "_")
            )
        })
    }

    /// The application name in use.
    pub fn application_name(&self) -> &str {
        self.application_name.as_deref().unwrap_or(&self.name)
    }

    /// Problems that make the configuration unusable, each naming its key.
    pub fn validate(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let at = |key: &str| format!("source `{}`: `{key}`", self.name);
        if self.name.is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            problems.push(format!(
                "{}: use letters, digits, `_` and `-` only",
                at("name")
            ));
        }
        if let Err(e) = walbridge_pg::ConnParams::parse(&self.connection) {
            problems.push(format!("{}: {e}", at("connection")));
        }
        let slot = self.slot_name();
        if slot.is_empty()
            || slot.len() > 63
            || !slot
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            problems.push(format!(
                "{}: `{slot}` is not a valid slot name (lower-case letters, digits and `_`, at most 63)",
                at("slot")
            ));
        }
        if self.publications.is_empty() {
            problems.push(format!(
                "{}: name at least one publication",
                at("publications")
            ));
        }
        if !self.create_slot && self.copy_data {
            problems.push(format!(
                "{}: an existing slot has no consistent snapshot to copy from; set copy_data = false, or let walbridge create the slot",
                at("create_slot = false")
            ));
        }
        if self.snapshot_workers == 0 {
            problems.push(format!("{}: must be at least 1", at("snapshot_workers")));
        }
        if self.heartbeat_interval == Some(0) {
            problems.push(format!(
                "{}: must be at least 1 second (leave it out to turn heartbeats off)",
                at("heartbeat_interval")
            ));
        }
        if self.backfill_chunk_bytes.0 == 0 {
            problems.push(format!(
                "{}: must be at least 1",
                at("backfill_chunk_bytes")
            ));
        }
        if self.backfill_chunk_rows == 0 {
            problems.push(format!("{}: must be at least 1", at("backfill_chunk_rows")));
        }
        if self.refresh_interval == 0 {
            problems.push(format!(
                "{}: must be at least 1 second",
                at("refresh_interval")
            ));
        }
        if self.status_interval == 0 {
            problems.push(format!(
                "{}: must be at least 1 second",
                at("status_interval")
            ));
        }
        problems
    }
}
