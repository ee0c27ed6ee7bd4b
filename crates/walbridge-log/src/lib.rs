//! walbridge's durable, transaction-ordered log.
//!
//! Each source has its own log: a directory of append-only segment files
//! holding its committed transactions (large ones in contiguous chunks),
//! snapshot rows and messages, in commit order. Every record is framed with
//! its length and a CRC32C ([`frame`]) and is self-contained: it carries the
//! relation descriptors its rows need, so a reader starting anywhere knows
//! the schema of what it reads ([`record`], encoded as protobuf from
//! `proto/walbridge/log/v1/record.proto`).
//!
//! * [`LogWriter`] appends with group commit: every record queued while an
//!   fsync is in progress shares the next one.
//! * [`Head`] is the readable end: durable records forming complete units.
//!   It is what the source confirms to PostgreSQL, and where readers stop.
//! * [`LogReader`] reads from any position (found through each segment's
//!   sparse index) with bounded memory. A reader that has caught up takes
//!   new records from the writer in memory, as it appended them, instead
//!   of reading and decoding the file (`handoff`).
//! * Consumers keep their positions in [`CursorFile`]s and report them
//!   with [`Log::advance_cursor`]; segments every cursor has passed are
//!   removed, subject to retention and `max_size` ([`LogOptions`]).
//! * [`Log::open`] recovers from a crash: a torn end is cut back to the
//!   last complete record (and the last complete unit); damage anywhere
//!   else is an error naming the segment and offset. Each opening begins
//!   an epoch ([`Log::epoch`]); a position handed out before its records
//!   were durable names its epoch, and [`Log::resume_point`] says where it
//!   is read from after a crash of the machine took records before it.

mod append;
mod cursor;
mod epoch;
mod error;
pub mod frame;
mod log;
// Generated; `Record` itself is read through `record::RecordView`.
#[allow(missing_docs, clippy::all, dead_code)]
mod pb {
    include!(concat!(env!("OUT_DIR"), "/walbridge.log.v1.rs"));
}
mod handoff;
mod reader;
pub mod record;
pub mod segment;
mod spare;
mod sync_time;
mod writer;

pub use append::{Appender, MAX_CHUNK_BYTES};
pub use cursor::{CursorFile, CursorPosition, CursorState};
pub use epoch::ResumePoint;
pub use error::LogError;
pub use log::{FsyncPolicy, Head, Log, LogOptions, Recovery, Syncs, Visibility, WhenFull};
pub use reader::{LogReader, ReadRecord};
pub use record::{Entry, RecordDecoder, RecordEncoder, RecordError};
pub use sync_time::{SYNC_TIME_BUCKETS, SYNC_TIME_METRIC, describe_sync_time};
pub use writer::{LogWriter, WRITE_BATCH};
