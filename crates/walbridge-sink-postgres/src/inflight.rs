//! Statements sent ahead of their results (pipelining).
//!
//! tokio-postgres sends a request the first time its future is polled, and
//! the server answers requests in the order they arrive. [`InFlight::push`]
//! polls each new future once, so requests leave in the order they are
//! pushed; results are taken in the same order. Bounding the queue bounds
//! memory and keeps the server's and our socket buffers from filling up.

use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::task::Poll;

use crate::statement::Param;

/// Why a statement failed, with the values it was given (for diagnostics).
pub struct Failed {
    /// The server's (or client's) error.
    pub error: tokio_postgres::Error,
    /// The bound values, for statements that had any.
    pub params: Vec<Param>,
}

/// What a request returned.
#[derive(Clone, Debug)]
pub enum Reply {
    /// The rows a statement affected.
    Rows(u64),
    /// The target's WAL positions after a commit: written (inserted) and flushed.
    Wal {
        /// `pg_current_wal_insert_lsn()`.
        written: walbridge_core::Lsn,
        /// `pg_current_wal_flush_lsn()`.
        flushed: walbridge_core::Lsn,
    },
    /// A statement prepared.
    Prepared(tokio_postgres::Statement),
    /// A group in one query: the rows each of its batches affected, and
    /// what its COMMIT returned.
    Group {
        /// Per batch, in order.
        rows: Vec<u64>,
        /// [`Reply::Wal`], or [`Reply::Rows`] when it read no positions.
        commit: Box<Reply>,
    },
}

/// What a request returned, or why it failed.
pub type Outcome = Result<Reply, Failed>;

type Pending = Pin<Box<dyn Future<Output = Outcome> + Send>>;

/// Bytes of parameters in flight before [`InFlight::is_full`] says so.
pub const MAX_BYTES: usize = 16 << 20;

/// Requests sent and not yet answered, each with what it was for.
pub struct InFlight<T> {
    queue: VecDeque<(T, usize, Pending)>,
    limit: usize,
    bytes: usize,
}

impl<T> InFlight<T> {
    /// A queue of at most `limit` requests (and about [`MAX_BYTES`]).
    pub fn new(limit: usize) -> Self {
        InFlight {
            queue: VecDeque::with_capacity(limit),
            limit: limit.max(1),
            bytes: 0,
        }
    }

    /// True when nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// True when the next [`InFlight::push`] must first take a result.
    pub fn is_full(&self) -> bool {
        self.queue.len() >= self.limit || self.bytes >= MAX_BYTES
    }

    /// Sends the request behind `request` (carrying about `bytes` of
    /// values) now and queues it with `tag`. Call [`InFlight::next`] first
    /// while [`InFlight::is_full`].
    pub async fn push<F>(&mut self, tag: T, bytes: usize, request: F)
    where
        F: Future<Output = Outcome> + Send + 'static,
    {
        let mut request: Pending = Box::pin(request);
        let first = poll_fn(|cx| Poll::Ready(request.as_mut().poll(cx))).await;
        let request: Pending = match first {
            Poll::Pending => request,
            Poll::Ready(outcome) => Box::pin(std::future::ready(outcome)),
        };
        self.bytes += bytes;
        self.queue.push_back((tag, bytes, request));
    }

    /// The oldest request's tag and outcome, `None` when nothing is in
    /// flight. Cancel-safe: a request is only taken off the queue with its
    /// outcome, so one awaited in a `select!` that another branch wins is
    /// still there, half-read, for the next call.
    pub async fn next(&mut self) -> Option<(T, Outcome)> {
        let (_, _, request) = self.queue.front_mut()?;
        let outcome = request.await;
        let (tag, bytes, _) = self.queue.pop_front()?;
        self.bytes -= bytes;
        Some((tag, outcome))
    }
}
