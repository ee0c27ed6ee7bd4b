//! What goes wrong in the feed, and the gRPC status each becomes.

use tonic::{Code, Status};
use walbridge_core::Lsn;
use walbridge_log::LogError;

/// A feed error; [`FeedError::status`] is what the subscriber receives.
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    /// A request field is malformed.
    #[error("{0}")]
    Invalid(String),
    /// No durable consumer of that name.
    #[error(
        "no durable consumer `{0}` (ListConsumers lists them; a Subscribe naming it creates it)"
    )]
    UnknownConsumer(String),
    /// `CreateConsumer` of a name in use.
    #[error("durable consumer `{0}` already exists (Seek moves it; DeleteConsumer removes it)")]
    ConsumerExists(String),
    /// A durable consumer that already has a session.
    #[error(
        "durable consumer `{0}` already has a session; one session per durable consumer: end the other one first, or use another consumer name"
    )]
    ConsumerBusy(String),
    /// A group joined as a single consumer, or the other way round.
    #[error("{}", if *group {
        format!("durable consumer `{consumer}` is a consumer group: open it with `group` set, as one of its members")
    } else {
        format!("durable consumer `{consumer}` is not a consumer group: open it without `group`, or create a group under another name")
    })]
    GroupMismatch {
        /// The consumer.
        consumer: String,
        /// Whether it is a group.
        group: bool,
    },
    /// A group member that did not acknowledge what it was sent in time
    /// for a rebalance.
    #[error(
        "a member of consumer group `{consumer}` did not acknowledge what it was sent within {seconds} s of a rebalance, and was ended so the others can go on: acknowledge as you process, then reconnect"
    )]
    RebalanceTimeout {
        /// The group.
        consumer: String,
        /// The time allowed.
        seconds: u64,
    },
    /// No source of that name in the feed.
    #[error("this feed has no source `{source_name}` (it has: {known})")]
    UnknownSource {
        /// The name asked for.
        source_name: String,
        /// The feed's sources.
        known: String,
    },
    /// A position in a log that has been recreated since.
    #[error(
        "{holder} has a position in an earlier log of source `{source_name}` (its log was recreated since, by `walbridge drop`, or its directory restored from an older copy?); start again from earliest or latest (Seek, for a durable consumer)"
    )]
    OtherLog {
        /// Who holds the position: a token, a consumer.
        holder: String,
        /// The source.
        source_name: String,
    },
    /// A position before what the log still holds.
    #[error(
        "{holder} is at LSN {wanted} of source `{source_name}`, but the log now starts after LSN {first_lsn} (record {first}): the records between were removed (retention). Start again from earliest (Seek, for a durable consumer) and re-read what you need from the publisher"
    )]
    OutOfRange {
        /// Who holds the position.
        holder: String,
        /// The source.
        source_name: String,
        /// The LSN the position covers.
        wanted: Lsn,
        /// The LSN just before the oldest record held.
        first_lsn: Lsn,
        /// The oldest record held.
        first: u64,
    },
    /// The log could not be read.
    #[error("reading the log of source `{source_name}`: {error}")]
    Log {
        /// The source.
        source_name: String,
        /// What failed.
        error: LogError,
    },
    /// A consumer's file could not be read or written.
    #[error("durable consumer `{consumer}`: {error}")]
    Store {
        /// The consumer.
        consumer: String,
        /// What failed.
        error: LogError,
    },
    /// The feed is stopping.
    #[error("walbridge is stopping: reconnect and resume from your last token")]
    Stopping,
}

impl FeedError {
    /// The gRPC status a subscriber receives.
    pub fn status(&self) -> Status {
        let code = match self {
            FeedError::Invalid(_) => Code::InvalidArgument,
            FeedError::UnknownConsumer(_) | FeedError::UnknownSource { .. } => Code::NotFound,
            FeedError::ConsumerExists(_) => Code::AlreadyExists,
            FeedError::ConsumerBusy(_)
            | FeedError::OtherLog { .. }
            | FeedError::GroupMismatch { .. } => Code::FailedPrecondition,
            FeedError::RebalanceTimeout { .. } => Code::Aborted,
            FeedError::OutOfRange { .. } => Code::OutOfRange,
            FeedError::Log { .. } | FeedError::Store { .. } => Code::Internal,
            FeedError::Stopping => Code::Unavailable,
        };
        Status::new(code, self.to_string())
    }
}

impl From<FeedError> for Status {
    fn from(e: FeedError) -> Status {
        e.status()
    }
}
