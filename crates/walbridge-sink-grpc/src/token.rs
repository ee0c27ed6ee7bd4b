//! Resume tokens: per source, where a subscription is between two units of
//! the log.
//!
//! A token is opaque to subscribers. It holds, for each source the
//! subscription reads, the log's identity (a token never applies to a log
//! recreated since), the next record to read, the publisher LSN covered,
//! and, inside a source's initial copy, how many rows of it came before
//! (so the rows' event ids are the same however a subscriber resumes),
//! and the log's epoch then (a position taken before its records were
//! durable is resumed from what a crash of the machine left of them).
//! It is the protobuf encoding of [`Token`], so it only ever gains fields.

use prost::Message;
use walbridge_core::Lsn;
use walbridge_log::{Log, ResumePoint};

/// A subscription's place, per source.
#[derive(Clone, PartialEq, Message)]
pub struct Token {
    /// One entry per source, in the feed's source order.
    #[prost(message, repeated, tag = "1")]
    pub sources: Vec<TokenPosition>,
    /// A group member's assignment it was issued under; 0 otherwise.
    #[prost(uint64, tag = "2")]
    pub generation: u64,
}

/// A place in one source's log.
#[derive(Clone, PartialEq, Eq, Message, serde::Serialize, serde::Deserialize)]
pub struct TokenPosition {
    /// The source's name.
    #[prost(string, tag = "1")]
    pub source: String,
    /// The log's identity.
    #[prost(string, tag = "2")]
    pub log: String,
    /// The next record to read.
    #[prost(uint64, tag = "3")]
    pub next: u64,
    /// The publisher LSN covered by the records before `next`.
    #[prost(uint64, tag = "4")]
    pub lsn: u64,
    /// Rows of the initial copy before `next`, while `next` is inside it.
    #[prost(uint64, tag = "5")]
    pub copied_rows: u64,
    /// The log's epoch when the position was taken: a session sends units
    /// before the log's fsync, and a crash of the machine can take them
    /// from the log (see [`walbridge_log::Log::resume_point`]). 0 in
    /// tokens issued before epochs were.
    #[prost(uint64, tag = "6")]
    #[serde(default)]
    pub epoch: u64,
}

impl TokenPosition {
    /// The publisher LSN covered.
    pub fn lsn(&self) -> Lsn {
        Lsn(self.lsn)
    }

    /// Where the position reads from in `log` now, `(next, lsn)`: from
    /// what the log kept of the records before it, when a crash of the
    /// machine took some (see [`Log::resume_point`]); itself otherwise (a
    /// position whose records are removed is refused where it is read).
    /// Allocates nothing: the feed asks it of every durable consumer each
    /// time a log's end moves.
    pub(crate) fn place_in(&self, log: &Log) -> (u64, Lsn) {
        match log.resume_point(self.epoch, self.next) {
            ResumePoint::Lost { next, last_lsn } => (next, last_lsn),
            ResumePoint::Kept(_) | ResumePoint::Removed | ResumePoint::Unknown => {
                (self.next, self.lsn())
            }
        }
    }

    /// The position as `log` reads it now (see [`TokenPosition::place_in`]).
    pub(crate) fn resumed_in(&self, log: &Log) -> TokenPosition {
        match self.place_in(log) {
            (next, _) if next == self.next => self.clone(),
            (next, lsn) => self.resumed_at(next, lsn, log.epoch()),
        }
    }

    /// The same source's position at `next` (a unit boundary) in `epoch`,
    /// covering `lsn`.
    pub(crate) fn resumed_at(&self, next: u64, lsn: Lsn, epoch: u64) -> TokenPosition {
        TokenPosition {
            next,
            lsn: lsn.0,
            copied_rows: 0,
            epoch,
            ..self.clone()
        }
    }
}

impl Token {
    /// The token's bytes, as subscribers see them.
    pub fn encode(&self) -> bytes::Bytes {
        self.encode_to_vec().into()
    }

    /// Reads a token a subscriber sent back; `None` when the bytes are not
    /// one.
    pub fn parse(bytes: &[u8]) -> Option<Token> {
        let token = Token::decode(bytes).ok()?;
        token
            .sources
            .iter()
            .all(|p| !p.source.is_empty() && !p.log.is_empty())
            .then_some(token)
    }

    /// The position for `source`.
    pub fn position(&self, source: &str) -> Option<&TokenPosition> {
        self.sources.iter().find(|p| p.source == source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_reads_back_as_written_and_garbage_is_refused() {
        let token = Token {
            sources: vec![TokenPosition {
                source: "shop".into(),
                log: "log-1".into(),
                next: 42,
                lsn: 0x16_B374_D848,
                copied_rows: 0,
                epoch: 2,
            }],
            generation: 3,
        };
        let bytes = token.encode();
        assert_eq!(Token::parse(&bytes), Some(token.clone()));
        assert_eq!(
            token.position("shop").map(|p| p.lsn()),
            Some(Lsn(0x16_B374_D848))
        );
        assert_eq!(Token::parse(b"\xff\xff\xff"), None);
        // Well-formed protobuf, but no log: not a token of ours.
        let foreign = Token {
            sources: vec![TokenPosition {
                source: "shop".into(),
                ..Default::default()
            }],
            generation: 0,
        };
        assert_eq!(Token::parse(&foreign.encode()), None);
    }
}
