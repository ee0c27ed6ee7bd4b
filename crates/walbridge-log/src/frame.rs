//! Record framing: a fixed header with length and CRC32C, then the payload.
//!
//! ```text
//! offset  size  field
//! 0       4     payload length (u32, little endian)
//! 4       4     CRC32C of bytes 8.. (header rest and payload)
//! 8       8     sequence number of the record (u64)
//! 16      8     the record's LSN: where its source may resume after it (u64)
//! 24      1     flags: bit 0 = the record ends a unit (a whole transaction,
//!               its last chunk, or a record that stands alone)
//! 25      len   payload: a protobuf `walbridge.log.v1.Record`
//! ```
//!
//! The sequence number and LSN live in the header so that recovery, index
//! building and seeks never decode payloads.

use walbridge_core::Lsn;

/// Bytes before the payload.
pub const HEADER_LEN: usize = 25;

/// Flag bit: the record completes a unit and may be read.
const UNIT_END: u8 = 1;

/// The header fields of one frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// Payload length.
    pub len: u32,
    /// Sequence number.
    pub seq: u64,
    /// The record's LSN.
    pub lsn: Lsn,
    /// True when the record completes a unit.
    pub unit_end: bool,
}

impl FrameHeader {
    /// Total bytes of the frame on disk.
    pub fn frame_len(&self) -> u64 {
        HEADER_LEN as u64 + u64::from(self.len)
    }
}

/// Appends a frame holding `payload` to `out`.
pub fn encode(out: &mut Vec<u8>, seq: u64, lsn: Lsn, unit_end: bool, payload: &[u8]) {
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    let start = out.len();
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&lsn.0.to_le_bytes());
    out.push(if unit_end { UNIT_END } else { 0 });
    out.extend_from_slice(payload);
    let crc = crc32c::crc32c(&out[start + 8..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// Why bytes are not a valid frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Fewer bytes than the header, or than the length it declares.
    #[error("incomplete frame: {needed} bytes needed, {available} present")]
    Incomplete {
        /// Bytes the frame needs.
        needed: u64,
        /// Bytes present.
        available: u64,
    },
    /// The checksum does not match.
    #[error("checksum mismatch (stored {stored:08x}, computed {computed:08x})")]
    Checksum {
        /// CRC in the header.
        stored: u32,
        /// CRC of the bytes read.
        computed: u32,
    },
}

/// Reads the header at the start of `bytes` without checking the CRC.
pub fn parse_header(bytes: &[u8]) -> Result<(FrameHeader, u32), FrameError> {
    let Some(h) = bytes.get(..HEADER_LEN) else {
        return Err(FrameError::Incomplete {
            needed: HEADER_LEN as u64,
            available: bytes.len() as u64,
        });
    };
    let u32_at = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    let u64_at = |i: usize| {
        let mut b = [0; 8];
        b.copy_from_slice(&h[i..i + 8]);
        u64::from_le_bytes(b)
    };
    Ok((
        FrameHeader {
            len: u32_at(0),
            seq: u64_at(8),
            lsn: Lsn(u64_at(16)),
            unit_end: h[24] & UNIT_END != 0,
        },
        u32_at(4),
    ))
}

/// Checks a whole frame (header + payload) whose header was parsed.
pub fn verify(frame: &[u8], stored_crc: u32) -> Result<(), FrameError> {
    let computed = crc32c::crc32c(frame.get(8..).unwrap_or_default());
    if computed != stored_crc {
        return Err(FrameError::Checksum {
            stored: stored_crc,
            computed,
        });
    }
    Ok(())
}

/// Checks a frame read as its header bytes and its payload.
pub fn verify_parts(header: &[u8], payload: &[u8], stored_crc: u32) -> Result<(), FrameError> {
    let computed =
        crc32c::crc32c_append(crc32c::crc32c(header.get(8..).unwrap_or_default()), payload);
    if computed != stored_crc {
        return Err(FrameError::Checksum {
            stored: stored_crc,
            computed,
        });
    }
    Ok(())
}

/// Parses and verifies the frame at the start of `bytes`, returning its
/// header and payload.
pub fn decode(bytes: &[u8]) -> Result<(FrameHeader, &[u8]), FrameError> {
    let (header, crc) = parse_header(bytes)?;
    let total = header.frame_len();
    let Some(frame) = bytes.get(..total as usize) else {
        return Err(FrameError::Incomplete {
            needed: total,
            available: bytes.len() as u64,
        });
    };
    verify(frame, crc)?;
    Ok((header, &frame[HEADER_LEN..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn frames_round_trip(seq: u64, lsn: u64, unit_end: bool, payload in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut out = Vec::new();
            encode(&mut out, seq, Lsn(lsn), unit_end, &payload);
            let (header, body) = decode(&out).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(header, FrameHeader { len: payload.len() as u32, seq, lsn: Lsn(lsn), unit_end });
            prop_assert_eq!(body, &payload[..]);
        }

        #[test]
        fn any_flipped_bit_is_detected(payload in proptest::collection::vec(any::<u8>(), 1..256), bit in 0usize..2048) {
            let mut out = Vec::new();
            encode(&mut out, 7, Lsn(9), true, &payload);
            let bit = bit % ((out.len() - 4) * 8);
            // Flip a bit anywhere but in the length field (a changed length is
            // caught as an incomplete or mismatching frame, tested below).
            let byte = 4 + bit / 8;
            out[byte] ^= 1 << (bit % 8);
            prop_assert!(decode(&out).is_err());
        }

        #[test]
        fn every_truncation_is_incomplete(payload in proptest::collection::vec(any::<u8>(), 0..256), cut in 0usize..300) {
            let mut out = Vec::new();
            encode(&mut out, 1, Lsn(2), false, &payload);
            let cut = cut % out.len();
            let is_incomplete = matches!(decode(&out[..cut]), Err(FrameError::Incomplete { .. }));
            prop_assert!(is_incomplete);
        }
    }
}
