//! walbridge's gRPC change feed (`type = "grpc"`): subscribers stream the
//! committed transactions of the sink's sources from walbridge's log
//! (`proto/walbridge/feed/v1/feed.proto`, service `walbridge.feed.v1.ChangeFeed`).
//!
//! The sink reads the logs itself ([`walbridge_sink::Reading::Itself`]):
//! every subscription is a session with its own log reader per source,
//! starting where its consumer says.
//!
//! # What a subscriber can rely on
//!
//! * **Whole transactions, in commit order per source.** A session sends a
//!   log unit (a transaction, a batch of rows of the copy, a message) only
//!   whole: once it began a unit it sends all of it, whatever the
//!   flow-control window says. A stream cut in the middle of one leaves
//!   the subscriber without its `commit`; it discards it and receives it
//!   again on resume.
//! * **Tokens name positions between units.** A resume token holds, per
//!   source, the log's identity and the next record after the last unit
//!   sent ([`token`]). It is issued only at a unit's end, so resuming after
//!   it neither repeats nor skips a unit; a token of another log (the
//!   source's log was recreated) is refused, never reinterpreted.
//! * **Units are sent as soon as the log has written them**, before its
//!   fsync. A crash of the machine can take the last of them from the log
//!   (the source never confirmed them to the publisher, which sends them
//!   again); a token naming a position past what the log kept resumes
//!   where the log's surviving records end (tokens carry the log's epoch,
//!   see [`walbridge_log::Log::resume_point`]): the units since come
//!   again, with the same event ids, never a gap.
//! * **Durable consumers resume after their last acknowledgement.** An
//!   acknowledged token is stored in the consumer's file under `data_dir`
//!   (atomically replaced, fsynced; coalesced while acknowledgements
//!   arrive faster than the disk takes them) before anything depends on it:
//!   after a crash a consumer resumes at or before what it acknowledged
//!   (at least once; event ids let it drop what it saw twice).
//! * **Nothing is removed that a consumer still needs, within retention.**
//!   The sink acknowledges to the log, per source, the lowest position any
//!   durable consumer or open session still needs, except that a durable
//!   consumer holds records for at most `retention`: past it, the log may
//!   remove them, and the consumer is refused with `OUT_OF_RANGE` naming
//!   the earliest position left, never given a silent gap.
//! * **A slow consumer holds back only itself.** What a session has sent
//!   and not had acknowledged is bounded by its window (events and bytes);
//!   the log's other readers are unaffected.

// Generated from the proto.
#[allow(missing_docs, clippy::all)]
pub mod pb {
    tonic::include_proto!("walbridge.feed.v1");

    /// The encoded descriptors of `feed.proto` and its imports, for server
    /// reflection.
    pub const DESCRIPTORS: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/feed_descriptors.bin"));
}

mod access;
mod config;
mod consumers;
mod encode;
mod error;
mod filter;
mod group;
mod kind;
mod metrics;
mod server;
mod session;
pub mod token;
pub mod upstream;
mod value;

pub use config::GrpcSinkConfig;
pub use error::FeedError;
pub use kind::KIND;
