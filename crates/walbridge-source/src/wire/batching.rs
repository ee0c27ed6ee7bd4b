//! Reading the replication stream in batches while there is a backlog.
//!
//! A walsender hands every pgoutput message to the kernel with its own
//! `send()`. When the client reads as soon as anything arrives, the receive
//! window never fills, so each of those sends goes out as a segment of its
//! own and wakes the client: on one machine the publisher then spends twice
//! the CPU its decoding needs, in the network stack (measured with the
//! postgres-sink benchmark: 0.8-0.9 CPU-s per 20,000 TPC-B transactions
//! against 0.4 for a native subscriber, which lags and so reads big chunks).
//! So while the walsender is behind, [`ReadBatching`] raises the socket's
//! receive low-water mark after each read: the kernel wakes the reader only
//! once [`LOW_WATER`] bytes wait, so the walsender's sends no longer wake it
//! one by one and it reads once per batch (with it: publisher 0.4-0.6
//! CPU-s, walbridge 0.35-0.4 instead of 0.6-1.0). A short timer
//! ([`BATCH_WAIT`]) bounds what a batch may wait: when it fires, the mark
//! drops back to one byte and what has arrived is read at once.
//!
//! On a loopback connection (walbridge on the publisher's host) that is not
//! enough: there the publisher's kernel also runs the receiving side of
//! each segment, in the walsender's `send()`, and a receive window that
//! never fills still takes every message as a segment of its own (a
//! catch-up of 100,000 TPC-B transactions: the walsender 3.4-4.8 CPU-s for
//! walbridge against 2.2-3.1 for a native subscriber, the difference in
//! the kernel's network stack). So a loopback socket's receive buffer is
//! held small ([`LOOPBACK_BATCH`]): while a batch waits, the window
//! closes, and the walsender's next sends queue in its kernel and go out
//! together when the batch is read (2.0-2.8 CPU-s, and the catch-up a
//! quarter faster: 4.0 s against 5.3, medians of 5 rounds). Over a
//! network the receive side is the other machine's, and a small window
//! would cap the throughput at the round trip: the buffer is left to the
//! kernel there.
//!
//! Batching costs latency (up to [`BATCH_WAIT`] per message), so it is
//! only for a backlog. The reader is told whether there is one
//! ([`ReadBatching::set_behind`]; the source asks [`is_backlog`] at each
//! transaction, whose commit time and send time are both the publisher's
//! clock). A caught-up stream is read eagerly, each message as it comes,
//! as a native subscriber does: at 1,000 transactions/s batching alone
//! held each one 5 ms on average.

use std::time::Duration;

use tokio::time::Instant;
use walbridge_core::PgTimestamp;

/// Bytes that must wait in the socket before a streaming reader wakes.
pub const LOW_WATER: usize = 64 * 1024;

/// A loopback socket's receive buffer (the kernel doubles it for its own
/// accounting), and so its batch: Linux caps the low-water mark of a
/// socket whose buffer is set at half the buffer. Of 32, 64 and 128 KiB,
/// 32 held the publisher's CPU lowest (2.6 CPU-s against 3.1-3.8 and 4.0
/// in single catch-ups); a window of 32 KiB on loopback still passes far
/// more than a walsender sends.
pub const LOOPBACK_BATCH: usize = 32 * 1024;

/// How long a batched read waits for [`LOW_WATER`] bytes before it takes
/// whatever has arrived: the most latency batching adds to a message, and
/// only to one that follows another within this time. Long enough for a
/// walsender decoding flat out to fill a batch (3-5 ms for 64 KiB of
/// TPC-B changes): with 2 ms the timer ended most waits, and the catch-up
/// benchmark ran 20% slower.
pub const BATCH_WAIT: Duration = Duration::from_millis(10);

/// How late a transaction must be when the walsender sends it (its send
/// time less its commit time) for the stream to count as a backlog. A
/// caught-up walsender sends a transaction well under a millisecond after
/// its commit record is flushed; the commit time is taken before that
/// flush, so a slow disk adds its flush time: 20 ms leaves room for one
/// while any real backlog (a paused reader, a big transaction, WAL made
/// faster than it is decoded) soon exceeds it.
pub const BACKLOG: Duration = Duration::from_millis(20);

/// True when a transaction committed at `commit_time` and sent at
/// `send_time` (both the publisher's clock) shows the walsender behind.
pub fn is_backlog(send_time: PgTimestamp, commit_time: PgTimestamp) -> bool {
    send_time.0.saturating_sub(commit_time.0) > BACKLOG.as_micros() as i64
}

/// Whether the connection reads in batches, and the socket whose low-water
/// mark it sets (TCP on Linux; other sockets always read eagerly).
#[derive(Debug)]
pub struct ReadBatching {
    socket: Option<low_water::Socket>,
    /// Bytes a batch waits for.
    batch: usize,
    /// The walsender is behind: batch while data keeps coming.
    behind: bool,
    streaming: bool,
    /// When the wait for the current batch ends; kept across cancelled
    /// reads, so a caller that keeps being interrupted cannot stretch it.
    deadline: Option<Instant>,
}

impl ReadBatching {
    /// Batching for a TCP connection, where the platform supports it; on
    /// loopback with a small receive buffer ([`LOOPBACK_BATCH`]).
    pub fn for_tcp(stream: &tokio::net::TcpStream) -> Self {
        let socket = low_water::Socket::of(stream);
        let loopback = stream.peer_addr().is_ok_and(|a| a.ip().is_loopback());
        let mut batch = LOW_WATER;
        if let Some(socket) = socket.as_ref().filter(|_| loopback) {
            match socket.set_receive_buffer(LOOPBACK_BATCH) {
                Ok(()) => batch = LOOPBACK_BATCH,
                // Not fatal: batches only cost the publisher more.
                Err(e) => tracing::debug!("cannot set the receive buffer: {e}"),
            }
        }
        ReadBatching {
            socket,
            batch,
            behind: false,
            streaming: false,
            deadline: None,
        }
    }

    /// No batching: every read returns as soon as anything arrives.
    pub fn eager() -> Self {
        ReadBatching {
            socket: None,
            batch: LOW_WATER,
            behind: false,
            streaming: false,
            deadline: None,
        }
    }

    /// True while reads wait for [`LOW_WATER`] bytes (or [`BATCH_WAIT`]).
    pub fn streaming(&self) -> bool {
        self.streaming
    }

    /// When the read of the current batch stops waiting for it: `None`
    /// when not streaming (the read waits for the first byte, however long).
    pub fn batch_deadline(&mut self) -> Option<Instant> {
        self.streaming.then(|| {
            *self
                .deadline
                .get_or_insert_with(|| Instant::now() + BATCH_WAIT)
        })
    }

    /// Whether the walsender is behind (see [`is_backlog`]). Caught up,
    /// reads are eager from now on; an error is [`ReadBatching::stop`]'s.
    pub fn set_behind(&mut self, behind: bool) -> std::io::Result<()> {
        self.behind = behind;
        if behind { Ok(()) } else { self.stop() }
    }

    /// Data has come: while behind, the next read waits for a batch.
    pub fn data_came(&mut self) {
        self.deadline = None;
        if self.streaming || !self.behind {
            return;
        }
        if let Some(socket) = &self.socket {
            match socket.set_low_water(self.batch) {
                Ok(()) => self.streaming = true,
                // Not fatal: the stream is read as before, only dearer for the publisher.
                Err(e) => {
                    tracing::debug!("cannot set the receive low-water mark: {e}");
                    self.socket = None;
                }
            }
        }
    }

    /// No batch came within [`BATCH_WAIT`], or the stream caught up: wake
    /// on every byte again.
    /// Lowering the mark makes the kernel report the bytes already waiting
    /// as readable. An error leaves the socket unusable for a reader (it
    /// would wait for a batch that may never fill): the caller drops the
    /// connection.
    pub fn stop(&mut self) -> std::io::Result<()> {
        if !self.streaming {
            return Ok(());
        }
        self.streaming = false;
        self.deadline = None;
        match &self.socket {
            Some(socket) => socket.set_low_water(1),
            None => Ok(()),
        }
    }
}

#[cfg(target_os = "linux")]
mod low_water {
    use std::io;
    use std::os::fd::{AsRawFd, RawFd};

    /// A TCP socket's descriptor, owned by the connection's stream, which
    /// outlives this handle (both are fields of the connection).
    #[derive(Debug)]
    pub struct Socket(RawFd);

    impl Socket {
        pub fn of(stream: &tokio::net::TcpStream) -> Option<Self> {
            Some(Socket(stream.as_raw_fd()))
        }

        /// Sets `SO_RCVLOWAT`. Linux (4.18 and later) signals readiness at
        /// once when the new mark is already met.
        pub fn set_low_water(&self, bytes: usize) -> io::Result<()> {
            self.set(libc::SO_RCVLOWAT, bytes)
        }

        /// Sets `SO_RCVBUF` (which also ends the kernel's tuning of it).
        pub fn set_receive_buffer(&self, bytes: usize) -> io::Result<()> {
            self.set(libc::SO_RCVBUF, bytes)
        }

        fn set(&self, option: libc::c_int, bytes: usize) -> io::Result<()> {
            let value = libc::c_int::try_from(bytes)
                .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
            // SAFETY: the descriptor is open for as long as the connection
            // that holds this handle, and `value` is a live c_int whose size
            // is passed with it.
            let rc = unsafe {
                libc::setsockopt(
                    self.0,
                    libc::SOL_SOCKET,
                    option,
                    (&raw const value).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if rc == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod low_water {
    use std::io;

    /// Elsewhere the receive low-water mark does not gate readiness the
    /// same way; reads stay eager.
    #[derive(Debug)]
    pub enum Socket {}

    impl Socket {
        pub fn of(_: &tokio::net::TcpStream) -> Option<Self> {
            None
        }

        pub fn set_low_water(&self, _: usize) -> io::Result<()> {
            match *self {}
        }

        pub fn set_receive_buffer(&self, _: usize) -> io::Result<()> {
            match *self {}
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::os::fd::AsRawFd;

    use super::{LOOPBACK_BATCH, ReadBatching};

    fn receive_buffer(stream: &tokio::net::TcpStream) -> libc::c_int {
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: the stream's descriptor is open, and `value` and `len`
        // are live and sized for the option.
        let rc = unsafe {
            libc::getsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&raw mut value).cast(),
                &raw mut len,
            )
        };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        value
    }

    #[tokio::test]
    async fn a_loopback_socket_reads_with_a_small_receive_buffer() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let address = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let stream = tokio::net::TcpStream::connect(address)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let before = receive_buffer(&stream);
        let batching = ReadBatching::for_tcp(&stream);
        assert_eq!(batching.batch, LOOPBACK_BATCH);
        // Linux keeps twice what is asked for, for its bookkeeping.
        assert_eq!(receive_buffer(&stream), 2 * LOOPBACK_BATCH as libc::c_int);
        assert!(before > 2 * LOOPBACK_BATCH as libc::c_int, "{before}");
    }
}
