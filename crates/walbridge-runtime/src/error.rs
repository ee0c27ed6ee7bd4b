//! Why a run stopped.

use walbridge_log::LogError;
use walbridge_sink::SinkFailure;
use walbridge_source::SourceError;

/// Why `walbridge run` stopped (a sink that cannot go on stops only itself;
/// the run reports it when it ends).
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A source stopped.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// A source reading another walbridge's feed stopped.
    #[error(transparent)]
    Feed(#[from] walbridge_sink_grpc::upstream::FeedSourceError),
    /// A source's log could not be opened or written.
    #[error("source `{source_name}`: log: {error}")]
    Log {
        /// The source.
        source_name: String,
        /// What failed.
        #[source]
        error: LogError,
    },
    /// A sink failed for good (or could not be opened).
    #[error("sink `{sink}`: {error}")]
    Sink {
        /// The sink.
        sink: String,
        /// What failed.
        #[source]
        error: SinkFailure,
    },
    /// A sink could not read a source's log: corruption, a position
    /// removed. Retrying cannot help.
    #[error("sink `{sink}`, source `{source_name}`: {error}")]
    SinkLog {
        /// The sink.
        sink: String,
        /// The source.
        source_name: String,
        /// What failed.
        #[source]
        error: LogError,
    },
    /// A sink fell behind `[log] max_size` and was dropped.
    #[error(
        "sink `{sink}` fell more than [log] max_size behind source `{source_name}` and was dropped (when_full = \"drop_sink\"); it needs a fresh start: remove its cursor file to read from the oldest record kept, or run `walbridge drop` to copy everything again"
    )]
    SinkDropped {
        /// The sink.
        sink: String,
        /// The source.
        source_name: String,
    },
    /// The schema registry walbridge serves could not start.
    #[error("[schema_registry] {what}: {error}")]
    Registry {
        /// What failed.
        what: String,
        /// Why.
        #[source]
        error: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// The admin endpoint could not start.
    #[error("[admin] {what}: {error}")]
    Admin {
        /// What failed.
        what: String,
        /// Why.
        #[source]
        error: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// A task or thread of the runtime panicked or could not start.
    #[error("{0}")]
    Task(String),
}
