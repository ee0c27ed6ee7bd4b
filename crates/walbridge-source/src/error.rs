//! Why a source stopped, and whether reconnecting can help.

use std::path::PathBuf;

use crate::assembler::AssemblyError;
use crate::backfill::TrackerError;
use crate::catalog::CatalogError;
use crate::checks::{Finding, Outlook, Severity};
use crate::pgoutput::DecodeError;
use crate::snapshot::SnapshotError;
use crate::spill::SpillError;
use crate::wire::copyboth::CopyBothError;
use crate::wire::{ConnectionError, ParamsError};

/// A source stopped.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The connection string is malformed.
    #[error("source `{source_name}`: `connection`: {error}")]
    Params {
        /// Source name.
        source_name: String,
        /// Cause.
        error: ParamsError,
    },
    /// Prerequisite checks failed.
    #[error("{}", .0.iter().map(|f| f.message.clone()).collect::<Vec<_>>().join("\n"))]
    Prerequisites(Vec<Finding>),
    /// Connecting or talking to the publisher failed.
    #[error("{0}")]
    Connection(String, #[source] ConnectionError),
    /// The slot walbridge should use is gone or unusable.
    #[error("{0}")]
    Slot(String),
    /// The stream did not decode.
    #[error("source `{0}`: {1}")]
    Decode(String, DecodeError),
    /// The stream broke pgoutput's rules.
    #[error("source `{0}`: {1}")]
    Assembly(String, AssemblyError),
    /// A replication message was malformed.
    #[error("source `{0}`: {1}")]
    CopyBoth(String, CopyBothError),
    /// Catalog lookups failed.
    #[error("source `{0}`: {1}")]
    Catalog(String, CatalogError),
    /// The snapshot failed.
    #[error("source `{0}`: {1}")]
    Snapshot(String, SnapshotError),
    /// Copying a table while streaming failed.
    #[error("source `{0}`: {1}")]
    Backfill(String, crate::backfill::TrackerError),
    /// Spilling failed.
    #[error("source `{0}`: {1}")]
    Spill(String, SpillError),
    /// The state directory could not be used.
    #[error("source `{0}`: state in {1}: {2}")]
    State(String, PathBuf, std::io::Error),
    /// Downstream (the log) stopped taking changes; its own error says why.
    #[error("source `{0}`: the log stopped taking changes")]
    DownstreamClosed(String),
    /// A stop was requested while changes waited for room downstream.
    #[error("source `{0}`: stopped while waiting for room in the log")]
    Stopped(String),
}

impl SourceError {
    /// True for failures that may go away by reconnecting (network, server
    /// restart, a slot still held by a walsender going away): `run`
    /// retries these, at start and mid-stream alike.
    pub fn is_transient(&self) -> bool {
        match self {
            // Mid-stream, a slot still in use (55006) or no free WAL sender
            // (53300) is our own walsender going away after a broken connection.
            SourceError::Connection(_, e) => {
                e.is_transient() || e.sqlstate().is_some_and(|s| s == "55006" || s == "53300")
            }
            // Every problem is an unreachable server.
            SourceError::Prerequisites(findings) => findings
                .iter()
                .filter(|f| f.severity == Severity::Error)
                .all(|f| f.outlook == Outlook::Unreachable),
            SourceError::Snapshot(_, SnapshotError::Connection(_)) => true,
            // The copy worker's connection, or the catalog's, broke.
            SourceError::Backfill(_, TrackerError::Worker(_)) => true,
            SourceError::Backfill(_, TrackerError::Catalog(CatalogError::Query { source, .. })) => {
                source.is_closed() || source.code().is_none()
            }
            // The catalog connection broke (the server restarted, say).
            SourceError::Catalog(_, CatalogError::Query { source, .. }) => {
                source.is_closed() || source.code().is_none()
            }
            _ => false,
        }
    }

    /// True when the publisher or the configuration must change before the
    /// source can run: failed checks, a refused connection (credentials,
    /// pg_hba.conf, privileges), a lost slot. The same at start and
    /// mid-stream (a password changed on the server shows at the next
    /// reconnect).
    pub fn is_prerequisite(&self) -> bool {
        match self {
            SourceError::Slot(_) => true,
            SourceError::Prerequisites(_) => !self.is_transient(),
            SourceError::Connection(_, e) => e.is_refusal(),
            _ => false,
        }
    }
}
