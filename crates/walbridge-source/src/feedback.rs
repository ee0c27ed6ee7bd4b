//! The flush rule: which positions the source reports to the publisher,
//! and why that is safe (the durability argument).
//!
//! * `flush` = the end LSN of the last transaction downstream reported
//!   durable through [`Downstream::durable`](crate::Downstream)
//!   (walbridge's log). The publisher may discard WAL before `flush`, so it
//!   never runs ahead of durability. When nothing is open or undelivered,
//!   the keepalive's WAL end is confirmed too, as soon as a keepalive
//!   moves it, so an idle publication does not pin WAL and the slot's
//!   restart point follows the stream.
//! * `apply` = what every consumer has applied
//!   ([`Downstream::applied`](crate::Downstream)), which
//!   `synchronous_commit = remote_apply` waits for.
//! * `flush` never passes the prepare of a two-phase transaction still
//!   waiting for COMMIT PREPARED: after a restart, the publisher must send
//!   its changes again.
//! * `flush` never moves back, even when a reconnect starts over from an
//!   older position.
//! * `write` = the furthest position received.
//!
//! Exactly once downstream: the publisher resends everything after the
//! confirmed position (after a reconnect or a crash), and the source skips
//! every transaction ending at or before
//! [`Downstream::resume_after`](crate::Downstream) — the last position
//! downstream already holds — or before the last one it emitted itself
//! ([`Feedback::last_emitted_end`]).

use tokio::sync::watch;
use walbridge_core::{Lsn, PgTimestamp};

use crate::wire::copyboth::StatusUpdate;

/// The positions the stream loop tracks, from which each status update
/// is made.
#[derive(Debug)]
pub(crate) struct Feedback {
    /// The furthest position received.
    pub(crate) received: Lsn,
    /// The end of the last transaction (or message) sent downstream, or
    /// what downstream held at start.
    pub(crate) last_emitted_end: Lsn,
    /// The WAL end of the last keepalive.
    pub(crate) keepalive_end: Lsn,
    /// The last `flush` reported.
    reported_flush: Lsn,
    /// What every consumer has applied.
    pub(crate) applied: watch::Receiver<Lsn>,
    /// The current connection reached streaming (resets the reconnect backoff).
    pub(crate) streamed: bool,
}

impl Feedback {
    /// Before the first connection: downstream holds up to `resume_after`.
    pub(crate) fn new(resume_after: Lsn, applied: watch::Receiver<Lsn>) -> Self {
        Feedback {
            received: Lsn::ZERO,
            last_emitted_end: resume_after,
            keepalive_end: Lsn::ZERO,
            reported_flush: Lsn::ZERO,
            applied,
            streamed: false,
        }
    }

    /// The status update to send when downstream holds everything up to
    /// `durable`, a transaction is being received (`in_transaction`), and
    /// the oldest two-phase transaction awaiting COMMIT PREPARED was
    /// prepared at `pending_prepare`.
    pub(crate) fn status(
        &mut self,
        durable: Lsn,
        in_transaction: bool,
        pending_prepare: Option<Lsn>,
    ) -> StatusUpdate {
        let flush = self.flush(durable, in_transaction, pending_prepare);
        self.reported_flush = flush;
        let write = self.received.max(flush);
        // Consumers that applied everything durable have applied up to `flush`.
        let applied = *self.applied.borrow();
        let apply = if applied >= durable { flush } else { applied };
        StatusUpdate {
            write,
            flush,
            apply,
            time: PgTimestamp::now(),
            reply_requested: false,
        }
    }

    /// What `flush` is for [`Feedback::status`]'s arguments.
    fn flush(&self, durable: Lsn, in_transaction: bool, pending_prepare: Option<Lsn>) -> Lsn {
        let mut flush = durable;
        let idle = !in_transaction && durable >= self.last_emitted_end;
        if idle {
            flush = flush.max(self.keepalive_end);
        }
        if let Some(prepare) = pending_prepare {
            flush = flush.min(Lsn(prepare.0.saturating_sub(1)));
        }
        flush.max(self.reported_flush)
    }

    /// A keepalive says the WAL ends at `wal_end`; true when a status sent
    /// now (same arguments as [`Feedback::status`]) would confirm more than
    /// the last one. An idle stream then confirms the WAL's end at once, as
    /// a native subscriber does, and the publisher moves the slot's restart
    /// point on: a walbridge stopped soon after catching up does not decode
    /// that WAL again at its next start.
    pub(crate) fn keepalive(
        &mut self,
        wal_end: Lsn,
        durable: Lsn,
        in_transaction: bool,
        pending_prepare: Option<Lsn>,
    ) -> bool {
        self.keepalive_end = self.keepalive_end.max(wal_end);
        self.received = self.received.max(wal_end);
        self.flush(durable, in_transaction, pending_prepare) > self.reported_flush
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feedback(emitted: u64, applied: u64) -> (Feedback, watch::Sender<Lsn>) {
        let (tx, rx) = watch::channel(Lsn(applied));
        let mut f = Feedback::new(Lsn(emitted), rx);
        f.received = Lsn(emitted);
        (f, tx)
    }

    #[test]
    fn flush_is_what_downstream_holds_never_what_was_only_received() {
        let (mut f, _applied) = feedback(100, 0);
        f.last_emitted_end = Lsn(300);
        f.received = Lsn(400);
        let s = f.status(Lsn(200), false, None);
        assert_eq!((s.write, s.flush), (Lsn(400), Lsn(200)));
    }

    #[test]
    fn an_idle_stream_confirms_the_keepalive_end() {
        let (mut f, _applied) = feedback(100, 0);
        f.keepalive_end = Lsn(500);
        assert_eq!(f.status(Lsn(100), false, None).flush, Lsn(500));
        // Not while a transaction is being received, nor while something
        // sent is not yet durable.
        let (mut f, _applied) = feedback(100, 0);
        f.keepalive_end = Lsn(500);
        assert_eq!(f.status(Lsn(100), true, None).flush, Lsn(100));
        f.last_emitted_end = Lsn(200);
        assert_eq!(f.status(Lsn(150), false, None).flush, Lsn(150));
    }

    #[test]
    fn a_keepalive_asks_for_a_status_only_when_it_moves_the_confirmed_end() {
        let (mut f, _applied) = feedback(100, 0);
        assert!(f.keepalive(Lsn(500), Lsn(100), false, None));
        assert_eq!(f.status(Lsn(100), false, None).flush, Lsn(500));
        assert!(
            !f.keepalive(Lsn(500), Lsn(100), false, None),
            "confirmed already"
        );
        // Not while a transaction is being received, nor while something
        // sent is not yet durable, nor past a pending prepare.
        assert!(!f.keepalive(Lsn(600), Lsn(100), true, None));
        f.last_emitted_end = Lsn(550);
        assert!(!f.keepalive(Lsn(700), Lsn(500), false, None));
        assert!(f.keepalive(Lsn(700), Lsn(550), false, None));
        assert!(!f.keepalive(Lsn(800), Lsn(550), false, Some(Lsn(400))));
    }

    #[test]
    fn flush_stays_before_a_pending_prepare_and_never_moves_back() {
        let (mut f, _applied) = feedback(100, 0);
        assert_eq!(f.status(Lsn(300), false, Some(Lsn(250))).flush, Lsn(249));
        assert_eq!(f.status(Lsn(400), false, None).flush, Lsn(400));
        // A reconnect that starts over reports no less than before.
        assert_eq!(f.status(Lsn(350), false, None).flush, Lsn(400));
    }

    #[test]
    fn apply_is_what_every_consumer_applied() {
        let (mut f, applied) = feedback(100, 150);
        assert_eq!(f.status(Lsn(300), false, None).apply, Lsn(150));
        // Everything durable applied: as far as flush, keepalive included.
        applied.send_replace(Lsn(300));
        f.keepalive_end = Lsn(500);
        assert_eq!(f.status(Lsn(300), false, None).apply, Lsn(500));
    }
}
