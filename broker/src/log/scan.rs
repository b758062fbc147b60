//! Walking a segment file batch by batch, and finding the intact batches after damage.
//!
//! A walk reads each batch header in turn and checks that it is one (magic 2, a length that
//! fits the file, offsets that grow and stay within the segment) and, when verifying, that its
//! CRC-32C (over the attributes onward, as Kafka's v2 format defines it) matches. Where a batch
//! fails, the walk **resynchronises**: it looks forward byte by byte for the next position
//! where a batch passes every one of those checks, CRC included, and reports the bytes in
//! between as one [`Damage`] with the offsets they held. Nothing after damage is given up:
//! the batches found after it are walked as before. Damage that runs to the end of the file,
//! with no intact batch after it, is for the caller to judge: on the active segment after a
//! crash it is a torn tail to cut off; anywhere else it is lost data.
//!
//! A resynchronisation point is trusted only with a matching CRC, so a stray `2` byte in the
//! damaged records is not taken for a batch; a CRC-32C collision at a random position with a
//! plausible header and offsets is the remaining risk (about 2^-32 per candidate).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::StorageError;
use super::batch::{self, BatchError, BatchHeader, HEADER_LEN};

/// Bytes of the file searched at a time while resynchronising.
const RESYNC_CHUNK: usize = 256 * 1024;
/// Bytes read at a time to compute a batch's CRC.
const CRC_PIECE: usize = 64 * 1024;

/// Bytes of a segment file that hold no intact batch, and the offsets they held.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Damage {
    /// Where the bad bytes start in the `.log` file.
    pub(crate) position: u64,
    /// Where the next intact batch starts, or the end of the file.
    pub(crate) end: u64,
    /// The first offset lost: the one after the last intact batch before the damage.
    pub(crate) first_offset: i64,
    /// The offset of the next intact batch (exclusive end of the lost offsets); for damage at
    /// the end of a segment, the next segment's base offset when there is one.
    pub(crate) next_offset: i64,
    /// What is wrong at `position`.
    pub(crate) reason: String,
}

impl Damage {
    /// Whether `offset` is one of the offsets the damage held.
    pub(crate) fn holds_offset(&self, offset: i64) -> bool {
        offset >= self.first_offset && offset < self.next_offset
    }

    /// Bytes damaged.
    pub(crate) fn len(&self) -> u64 {
        self.end - self.position
    }

    /// The last offset lost (the first one when the range holds none).
    pub(crate) fn last_offset(&self) -> i64 {
        (self.next_offset - 1).max(self.first_offset)
    }
}

/// What a walk meets, in file order.
#[derive(Debug)]
pub(crate) enum Found {
    /// An intact batch.
    Batch { position: u64, header: BatchHeader },
    /// Damaged bytes; walking goes on at `end`.
    Damage(Damage),
}

/// A walk over one segment file.
pub(crate) struct Walk<'a> {
    pub(crate) file: &'a File,
    pub(crate) path: &'a Path,
    /// Bytes of the file to walk.
    pub(crate) len: u64,
    /// The segment's base offset: offsets must stay within u32 of it (the index format).
    pub(crate) base_offset: i64,
    /// The next segment's base offset, if any: this segment's offsets stay below it.
    pub(crate) bound: Option<i64>,
    /// Check each batch's CRC (else headers only; a resynchronisation point is always checked).
    pub(crate) verify: bool,
}

impl Walk<'_> {
    /// Walks from `position`, where a batch starts whose first offset is at least
    /// `next_offset`, calling `found` for each batch and each damaged range, and `progress`
    /// with the bytes read (false stops the walk, as for a scrub asked to stop).
    pub(crate) fn run(
        &self,
        mut position: u64,
        mut next_offset: i64,
        mut found: impl FnMut(Found),
        mut progress: impl FnMut(u64) -> bool,
    ) -> Result<(), StorageError> {
        let mut buf = Vec::new();
        while position < self.len {
            match self.check(position, next_offset, self.verify, &mut buf)? {
                Ok(header) => {
                    found(Found::Batch { position, header });
                    position += header.size as u64;
                    next_offset = header.last_offset().saturating_add(1);
                    if !progress(header.size as u64) {
                        return Ok(());
                    }
                }
                Err(reason) => {
                    let (end, next) = match self.resync(position + 1, next_offset, &mut buf)? {
                        Some((at, header)) => (at, header.base_offset),
                        None => (self.len, self.bound.unwrap_or(next_offset).max(next_offset)),
                    };
                    found(Found::Damage(Damage {
                        position,
                        end,
                        first_offset: next_offset,
                        next_offset: next,
                        reason,
                    }));
                    if !progress(end - position) {
                        return Ok(());
                    }
                    position = end;
                    next_offset = next;
                }
            }
        }
        Ok(())
    }

    /// Whether an intact batch starts at `position`: its header, or what is wrong.
    fn check(
        &self,
        position: u64,
        next_offset: i64,
        verify: bool,
        buf: &mut Vec<u8>,
    ) -> Result<Result<BatchHeader, String>, StorageError> {
        let remaining = self.len - position;
        if remaining < HEADER_LEN as u64 {
            return Ok(Err(format!(
                "{remaining} bytes left, fewer than a batch header"
            )));
        }
        let mut header_buf = [0u8; HEADER_LEN];
        self.read(&mut header_buf, position)?;
        let header = match batch::parse_header(&header_buf) {
            Ok(header) => header,
            Err(e) => return Ok(Err(e.to_string())),
        };
        if header.size as u64 > remaining {
            return Ok(Err(format!(
                "batch length {} runs past the end of the file ({remaining} bytes left)",
                header.size
            )));
        }
        if verify {
            let stored = u32::from_be_bytes([
                header_buf[17],
                header_buf[18],
                header_buf[19],
                header_buf[20],
            ]);
            let computed = self.crc(position + 21, header.size as u64 - 21, buf)?;
            if stored != computed {
                return Ok(Err(BatchError::BadCrc { stored, computed }.to_string()));
            }
        }
        if let Some(why) = self.implausible_offsets(&header, next_offset) {
            return Ok(Err(why));
        }
        Ok(Ok(header))
    }

    fn implausible_offsets(&self, header: &BatchHeader, next_offset: i64) -> Option<String> {
        let last = header.last_offset();
        if header.base_offset < next_offset {
            return Some(format!(
                "base offset {} is below the expected {next_offset}",
                header.base_offset
            ));
        }
        if last - self.base_offset > i64::from(u32::MAX) || last == i64::MAX {
            return Some(format!("last offset {last} is out of the segment's range"));
        }
        if self.bound.is_some_and(|bound| last >= bound) {
            return Some(format!(
                "last offset {last} reaches the next segment's base offset"
            ));
        }
        None
    }

    /// The first position at or after `from` where an intact batch (CRC checked) with
    /// plausible offsets starts.
    fn resync(
        &self,
        from: u64,
        next_offset: i64,
        buf: &mut Vec<u8>,
    ) -> Result<Option<(u64, BatchHeader)>, StorageError> {
        let mut chunk = vec![0u8; RESYNC_CHUNK];
        let mut start = from;
        while start + HEADER_LEN as u64 <= self.len {
            let want = usize::try_from(self.len - start)
                .unwrap_or(usize::MAX)
                .min(RESYNC_CHUNK);
            let chunk = &mut chunk[..want];
            self.read(chunk, start)?;
            // Candidates whose whole header is in this chunk; the next chunk starts at the
            // first one that is not.
            let candidates = want + 1 - HEADER_LEN;
            for i in 0..candidates {
                if chunk[i + 16] != 2 {
                    continue;
                }
                let Ok(header) = batch::parse_header(&chunk[i..]) else {
                    continue;
                };
                let at = start + i as u64;
                if header.size as u64 > self.len - at
                    || self.implausible_offsets(&header, next_offset).is_some()
                {
                    continue;
                }
                if let Ok(header) = self.check(at, next_offset, true, buf)? {
                    return Ok(Some((at, header)));
                }
            }
            start += candidates as u64;
        }
        Ok(None)
    }

    /// CRC-32C of `len` bytes from `position`, read a piece at a time (a garbled length must
    /// not make the walk allocate it).
    fn crc(&self, mut position: u64, mut len: u64, buf: &mut Vec<u8>) -> Result<u32, StorageError> {
        buf.resize(CRC_PIECE, 0);
        let mut crc = 0;
        while len > 0 {
            let n = usize::try_from(len).unwrap_or(CRC_PIECE).min(CRC_PIECE);
            self.read(&mut buf[..n], position)?;
            crc = crc32c::crc32c_append(crc, &buf[..n]);
            position += n as u64;
            len -= n as u64;
        }
        Ok(crc)
    }

    fn read(&self, buf: &mut [u8], position: u64) -> Result<(), StorageError> {
        self.file
            .read_exact_at(buf, position)
            .map_err(|source| StorageError::Io {
                path: self.path.to_path_buf(),
                action: "read",
                source,
            })
    }
}
