//! A bounds-checked big-endian reader over a shared byte buffer.

use bytes::Bytes;

/// Reading past the end of the buffer, or text that is not UTF-8.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// The buffer ended before the field did.
    #[error("truncated: needed {needed} more byte(s) at offset {offset}")]
    Truncated {
        /// Offset of the field that did not fit.
        offset: usize,
        /// Bytes missing.
        needed: usize,
    },
    /// A NUL-terminated string had no terminator.
    #[error("unterminated string at offset {offset}")]
    UnterminatedString {
        /// Offset where the string starts.
        offset: usize,
    },
    /// A string was not valid UTF-8.
    #[error("string at offset {offset} is not valid UTF-8")]
    InvalidUtf8 {
        /// Offset where the string starts.
        offset: usize,
    },
    /// A length field was negative where it must not be.
    #[error("negative length {length} at offset {offset}")]
    NegativeLength {
        /// Offset of the length field.
        offset: usize,
        /// The length read.
        length: i32,
    },
}

/// Reads fields from `buf` front to back. Slices returned by [`Reader::bytes`]
/// share the buffer's memory.
pub struct Reader {
    buf: Bytes,
    pos: usize,
}

impl Reader {
    /// A reader at the start of `buf`.
    pub fn new(buf: Bytes) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Bytes not yet read.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Result<&[u8], ReadError> {
        if self.remaining() < n {
            return Err(ReadError::Truncated {
                offset: self.pos,
                needed: n - self.remaining(),
            });
        }
        let slice = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], ReadError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    /// One byte.
    pub fn u8(&mut self) -> Result<u8, ReadError> {
        Ok(self.array::<1>()?[0])
    }

    /// A big-endian Int16.
    pub fn i16(&mut self) -> Result<i16, ReadError> {
        Ok(i16::from_be_bytes(self.array()?))
    }

    /// A big-endian Int32.
    pub fn i32(&mut self) -> Result<i32, ReadError> {
        Ok(i32::from_be_bytes(self.array()?))
    }

    /// A big-endian unsigned 32-bit integer (OIDs, xids).
    pub fn u32(&mut self) -> Result<u32, ReadError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    /// A big-endian Int64.
    pub fn i64(&mut self) -> Result<i64, ReadError> {
        Ok(i64::from_be_bytes(self.array()?))
    }

    /// A big-endian unsigned 64-bit integer (LSNs).
    pub fn u64(&mut self) -> Result<u64, ReadError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    /// `n` bytes, sharing the buffer.
    pub fn bytes(&mut self, n: usize) -> Result<Bytes, ReadError> {
        if self.remaining() < n {
            return Err(ReadError::Truncated {
                offset: self.pos,
                needed: n - self.remaining(),
            });
        }
        let out = self.buf.slice(self.pos..self.pos + n);
        self.pos += n;
        Ok(out)
    }

    /// An Int32 length that must not be negative, then that many bytes.
    pub fn length_prefixed(&mut self) -> Result<Bytes, ReadError> {
        let offset = self.pos;
        let length = self.i32()?;
        let n =
            usize::try_from(length).map_err(|_| ReadError::NegativeLength { offset, length })?;
        self.bytes(n)
    }

    /// Everything not yet read.
    pub fn rest(&mut self) -> Bytes {
        let out = self.buf.slice(self.pos..);
        self.pos = self.buf.len();
        out
    }

    /// A NUL-terminated UTF-8 string.
    pub fn cstr(&mut self) -> Result<String, ReadError> {
        let offset = self.pos;
        let rest = &self.buf[self.pos..];
        let end = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(ReadError::UnterminatedString { offset })?;
        let s = std::str::from_utf8(&rest[..end])
            .map_err(|_| ReadError::InvalidUtf8 { offset })?
            .to_owned();
        self.pos += end + 1;
        Ok(s)
    }
}
