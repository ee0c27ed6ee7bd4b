//! Segment files: naming, the file header, the sparse index, and scanning.
//!
//! A segment is `<base>.seg`, where `<base>` is the sequence number of its
//! first record (20 digits, so names sort). It starts with a 24-byte
//! header (magic, layout version, 4 bytes unused, the LSN before its first
//! record) followed by frames; in a segment of [`VERSION_PREALLOCATED`]
//! zeros may follow them (see `crate::spare`). Its sparse index
//! `<base>.idx` holds an entry every [`INDEX_INTERVAL`] bytes; it is written
//! when the segment is sealed and rebuilt by a scan when missing or
//! damaged, so it never needs an fsync of its own.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom, Take, Write};
use std::path::{Path, PathBuf};

use walbridge_core::Lsn;

use crate::frame::{self, FrameError, FrameHeader, HEADER_LEN};

/// The first bytes of every segment.
pub const MAGIC: [u8; 8] = *b"WBRGLOG\0";
/// The segment layout version of a segment grown by its appends.
pub const VERSION: u32 = 1;
/// The layout version of a segment written into zeros made ahead (see
/// `crate::spare`): zeros after its records are room, not damage. A
/// version of its own, so that a walbridge that predates it refuses the
/// segment by name rather than take the zeros for a corrupt record.
pub const VERSION_PREALLOCATED: u32 = 2;
/// Bytes before the first frame.
pub const SEGMENT_HEADER_LEN: u64 = 24;
/// Bytes between sparse index entries.
pub const INDEX_INTERVAL: u64 = 64 * 1024;
/// Bytes of one index entry on disk.
const INDEX_ENTRY_LEN: usize = 24;

/// The segment file for `base`.
pub fn segment_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:020}.seg"))
}

/// The index file for `base`.
pub fn index_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:020}.idx"))
}

/// The base of a segment file name, if it is one.
pub fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".seg")?;
    (digits.len() == 20).then(|| digits.parse().ok())?
}

/// The header of a segment whose preceding records end at `start_lsn`.
pub fn header(start_lsn: Lsn, preallocated: bool) -> [u8; SEGMENT_HEADER_LEN as usize] {
    let mut h = [0u8; SEGMENT_HEADER_LEN as usize];
    h[..8].copy_from_slice(&MAGIC);
    let version = if preallocated {
        VERSION_PREALLOCATED
    } else {
        VERSION
    };
    h[8..12].copy_from_slice(&version.to_le_bytes());
    h[16..24].copy_from_slice(&start_lsn.0.to_le_bytes());
    h
}

/// Whether a (checked) segment header says the file was zero-filled ahead.
fn is_preallocated(header: &[u8]) -> bool {
    u32::from_le_bytes([header[8], header[9], header[10], header[11]]) == VERSION_PREALLOCATED
}

/// A segment header that is not ours, or is from a newer walbridge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderProblem {
    /// Too short or wrong magic.
    NotASegment,
    /// A layout version this build does not read.
    Version(u32),
}

/// Checks a segment header and returns its start LSN.
pub fn check_header(bytes: &[u8]) -> Result<Lsn, HeaderProblem> {
    if bytes.len() < SEGMENT_HEADER_LEN as usize || bytes[..8] != MAGIC {
        return Err(HeaderProblem::NotASegment);
    }
    let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    if version != VERSION && version != VERSION_PREALLOCATED {
        return Err(HeaderProblem::Version(version));
    }
    let mut lsn = [0u8; 8];
    lsn.copy_from_slice(&bytes[16..24]);
    Ok(Lsn(u64::from_le_bytes(lsn)))
}

/// One sparse index entry: where record `seq` starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    /// The record's sequence number.
    pub seq: u64,
    /// Byte offset of its frame in the segment.
    pub pos: u64,
    /// The record's LSN.
    pub lsn: Lsn,
}

/// Builds a sparse index as frames are appended.
#[derive(Clone, Debug, Default)]
pub struct IndexBuilder {
    /// The entries so far.
    pub entries: Vec<IndexEntry>,
    last_pos: Option<u64>,
}

impl IndexBuilder {
    /// Notes a frame at `pos`; it gets an entry if it is the first or far enough from the last.
    pub fn note(&mut self, seq: u64, pos: u64, lsn: Lsn) {
        if self
            .last_pos
            .is_none_or(|last| pos >= last + INDEX_INTERVAL)
        {
            self.entries.push(IndexEntry { seq, pos, lsn });
            self.last_pos = Some(pos);
        }
    }

    /// Drops entries at or after `pos` (the segment was cut there).
    pub fn truncate(&mut self, pos: u64) {
        self.entries.retain(|e| e.pos < pos);
        self.last_pos = self.entries.last().map(|e| e.pos);
    }
}

/// Writes an index file (not fsynced: it can always be rebuilt).
pub fn store_index(path: &Path, entries: &[IndexEntry]) -> std::io::Result<()> {
    let mut bytes = Vec::with_capacity(entries.len() * INDEX_ENTRY_LEN);
    for e in entries {
        bytes.extend_from_slice(&e.seq.to_le_bytes());
        bytes.extend_from_slice(&e.pos.to_le_bytes());
        bytes.extend_from_slice(&e.lsn.0.to_le_bytes());
    }
    let mut f = File::create(path)?;
    f.write_all(&bytes)
}

/// Reads an index file; `None` when it is missing or does not fit the segment.
pub fn load_index(path: &Path, base: u64, segment_len: u64) -> Option<Vec<IndexEntry>> {
    let bytes = std::fs::read(path).ok()?;
    if bytes.is_empty() || bytes.len() % INDEX_ENTRY_LEN != 0 {
        return None;
    }
    let u64_at = |c: &[u8], i: usize| {
        let mut b = [0; 8];
        b.copy_from_slice(&c[i..i + 8]);
        u64::from_le_bytes(b)
    };
    let entries: Vec<IndexEntry> = bytes
        .chunks_exact(INDEX_ENTRY_LEN)
        .map(|c| IndexEntry {
            seq: u64_at(c, 0),
            pos: u64_at(c, 8),
            lsn: Lsn(u64_at(c, 16)),
        })
        .collect();
    let ordered = entries
        .windows(2)
        .all(|w| w[0].seq < w[1].seq && w[0].pos < w[1].pos);
    let fits = entries.first().is_some_and(|e| e.seq == base)
        && entries
            .last()
            .is_some_and(|e| e.pos + HEADER_LEN as u64 <= segment_len);
    (ordered && fits).then_some(entries)
}

/// The last entry at or before `seq`.
pub fn lookup(entries: &[IndexEntry], seq: u64) -> Option<IndexEntry> {
    let i = entries.partition_point(|e| e.seq <= seq);
    i.checked_sub(1).map(|i| entries[i])
}

/// The last entry whose LSN is at or before `lsn`.
pub fn lookup_lsn(entries: &[IndexEntry], lsn: Lsn) -> Option<IndexEntry> {
    let i = entries.partition_point(|e| e.lsn <= lsn);
    i.checked_sub(1).map(|i| entries[i])
}

/// What a scan of a segment found.
#[derive(Debug, Default)]
pub struct Scan {
    /// Offset just past the last valid frame.
    pub valid_end: u64,
    /// The file's length.
    pub file_len: u64,
    /// Offset past the last byte written: the file's length, less, in a
    /// preallocated segment, the zeros after its last byte that is not zero.
    pub written_end: u64,
    /// The segment was zero-filled ahead of its records ([`VERSION_PREALLOCATED`]).
    pub preallocated: bool,
    /// One past the last valid record's sequence number.
    pub next_seq: u64,
    /// Offset past, next sequence number and LSN of the last valid frame that ends a unit.
    pub last_unit_end: Option<(u64, u64, Lsn)>,
    /// The sparse index of the valid frames.
    pub index: IndexBuilder,
    /// The first invalid frame: its offset, the problem, and the length its header declares.
    pub bad: Option<(u64, FrameError, u64)>,
    /// The LSN in the segment header.
    pub start_lsn: Lsn,
}

/// How a scan failed before reaching frames.
#[derive(Debug)]
pub enum ScanError {
    /// Reading failed.
    Io(std::io::Error),
    /// The header is wrong.
    Header(HeaderProblem),
    /// A frame's sequence number is not the next one.
    Sequence {
        /// Where.
        offset: u64,
        /// Expected.
        expected: u64,
        /// Found.
        found: u64,
    },
}

impl From<std::io::Error> for ScanError {
    fn from(e: std::io::Error) -> Self {
        ScanError::Io(e)
    }
}

/// Reads a whole segment, verifying every frame, and stops at the first
/// invalid one (reported in [`Scan::bad`]).
pub fn scan(path: &Path, base: u64) -> Result<Scan, ScanError> {
    let file = File::open(path)?;
    let file_len = file.metadata()?.len();
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let mut header_bytes = [0u8; SEGMENT_HEADER_LEN as usize];
    if reader.read_exact(&mut header_bytes).is_err() {
        return Err(ScanError::Header(HeaderProblem::NotASegment));
    }
    let start_lsn = check_header(&header_bytes).map_err(ScanError::Header)?;
    let mut scan = Scan {
        start_lsn,
        valid_end: SEGMENT_HEADER_LEN,
        file_len,
        written_end: file_len,
        preallocated: is_preallocated(&header_bytes),
        next_seq: base,
        ..Scan::default()
    };
    let mut frame_buf = Vec::new();
    let mut pos = SEGMENT_HEADER_LEN;
    while pos < file_len {
        let available = file_len - pos;
        frame_buf.resize(HEADER_LEN.min(available as usize), 0);
        reader.read_exact(&mut frame_buf)?;
        let (header, crc) = match frame::parse_header(&frame_buf) {
            Ok(h) => h,
            Err(e) => {
                scan.bad = Some((pos, e, available));
                break;
            }
        };
        let total = header.frame_len();
        if total > available {
            scan.bad = Some((
                pos,
                FrameError::Incomplete {
                    needed: total,
                    available,
                },
                total,
            ));
            break;
        }
        frame_buf.resize(total as usize, 0);
        reader.read_exact(&mut frame_buf[HEADER_LEN..])?;
        if let Err(e) = frame::verify(&frame_buf, crc) {
            scan.bad = Some((pos, e, total));
            break;
        }
        if header.seq != scan.next_seq {
            return Err(ScanError::Sequence {
                offset: pos,
                expected: scan.next_seq,
                found: header.seq,
            });
        }
        note_frame(&mut scan, &header, pos);
        pos += total;
    }
    if let Some((offset, ..)) = scan.bad
        && scan.preallocated
    {
        scan.written_end = written_end(reader.get_ref(), offset, file_len)?;
    }
    Ok(scan)
}

/// Offset past the last byte of `file` (from `from` to `len`) that is not zero; `from` if none is.
fn written_end(file: &File, from: u64, len: u64) -> std::io::Result<u64> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; 1 << 20];
    let mut end = from;
    let mut pos = from;
    while pos < len {
        let want = (len - pos).min(buf.len() as u64) as usize;
        let n = file.read_at(&mut buf[..want], pos)?;
        if n == 0 {
            break;
        }
        if let Some(last) = last_nonzero(&buf[..n]) {
            end = pos + last as u64 + 1;
        }
        pos += n as u64;
    }
    Ok(end)
}

/// The index of the last byte of `bytes` that is not zero. Blocks of zeros
/// are passed over with one OR per block, which the compiler vectorizes: a
/// segment's zeros made ahead are tens of MiB, read at every open, and a
/// byte-by-byte search of them took longer than the rest of a restart.
fn last_nonzero(bytes: &[u8]) -> Option<usize> {
    const BLOCK: usize = 4096;
    let mut end = bytes.len();
    while end > 0 {
        let start = end.saturating_sub(BLOCK);
        let block = &bytes[start..end];
        if block.iter().fold(0u8, |any, &b| any | b) != 0 {
            return block.iter().rposition(|&b| b != 0).map(|i| start + i);
        }
        end = start;
    }
    None
}

fn note_frame(scan: &mut Scan, header: &FrameHeader, pos: u64) {
    scan.index.note(header.seq, pos, header.lsn);
    let end = pos + header.frame_len();
    scan.valid_end = end;
    scan.next_seq = header.seq + 1;
    if header.unit_end {
        scan.last_unit_end = Some((end, header.seq + 1, header.lsn));
    }
}

/// Opens a segment for reading at byte `pos`, reading nothing until
/// allowed to ([`Take::set_limit`]): past the readable end of the segment
/// being written lie zeros made ahead (see `crate::spare`), which a read
/// buffer must never hold when records are written over them.
pub fn open_at(path: &Path, pos: u64) -> std::io::Result<BufReader<Take<File>>> {
    let mut file = File::open(path)?;
    file.seek(SeekFrom::Start(pos))?;
    Ok(BufReader::with_capacity(256 * 1024, file.take(0)))
}

#[cfg(test)]
mod tests {
    use super::last_nonzero;

    #[test]
    fn the_last_nonzero_byte_is_found_wherever_it_lies_among_blocks_of_zeros() {
        assert_eq!(last_nonzero(&[]), None);
        assert_eq!(last_nonzero(&[0; 10_000]), None);
        for len in [1usize, 4095, 4096, 4097, 12_288, 70_000] {
            for at in [
                0,
                len / 2,
                len - 1,
                len.saturating_sub(4096),
                4095.min(len - 1),
            ] {
                let mut bytes = vec![0u8; len];
                bytes[at] = 7;
                // A byte before it never hides it, nor is it taken for the last.
                if at > 0 {
                    bytes[0] = 1;
                }
                assert_eq!(last_nonzero(&bytes), Some(at), "len {len}, at {at}");
            }
        }
    }
}
