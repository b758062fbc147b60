//! The record batch v2 header: the only part of a batch the broker reads or writes.
//!
//! | bytes  | field                | notes                                          |
//! |--------|----------------------|------------------------------------------------|
//! | 0..8   | baseOffset i64       | assigned by the broker (patched in place)      |
//! | 8..12  | batchLength i32      | bytes after this field                         |
//! | 12..16 | partitionLeaderEpoch | set to 0 by the broker (not under the CRC)     |
//! | 16     | magic i8             | must be 2                                      |
//! | 17..21 | crc u32              | CRC-32C of bytes 21..end                       |
//! | 21..23 | attributes i16       | compression in bits 0-2                        |
//! | 23..27 | lastOffsetDelta i32  |                                                |
//! | 27..35 | baseTimestamp i64    |                                                |
//! | 35..43 | maxTimestamp i64     |                                                |
//! | 43..61 | producer id/epoch, base sequence, record count                   |||
//! | 61..   | records              | possibly compressed, never decoded here        |

/// Size of the v2 batch header.
pub(crate) const HEADER_LEN: usize = 61;
/// Bytes before and including the batchLength field.
pub(crate) const LOG_OVERHEAD: usize = 12;

/// Why a record batch is refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum BatchError {
    #[error("batch truncated: {have} of {need} bytes present")]
    Truncated { have: usize, need: usize },
    #[error("batch length {0} is invalid")]
    BadLength(i32),
    #[error("record batch magic {0} is not supported (only v2)")]
    BadMagic(i8),
    #[error("CRC mismatch: header says {stored:#010x}, data has {computed:#010x}")]
    BadCrc { stored: u32, computed: u32 },
    #[error("lastOffsetDelta {0} is negative")]
    BadOffsetDelta(i32),
}

/// The header fields of one batch, read from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BatchHeader {
    pub(crate) base_offset: i64,
    /// Whole size of the batch in bytes, header included.
    pub(crate) size: usize,
    pub(crate) last_offset_delta: i32,
    pub(crate) max_timestamp: i64,
    pub(crate) record_count: i32,
    pub(crate) attributes: i16,
    /// -1 when the producer is not idempotent.
    pub(crate) producer_id: i64,
    pub(crate) producer_epoch: i16,
    /// Sequence number of the first record, -1 without idempotence.
    pub(crate) base_sequence: i32,
}

impl BatchHeader {
    /// Offset of the last record in the batch.
    pub(crate) fn last_offset(&self) -> i64 {
        // Saturating: a garbled base offset read back from disk must not overflow.
        self.base_offset
            .saturating_add(i64::from(self.last_offset_delta))
    }

    /// Part of a transaction (attributes bit 4).
    pub(crate) fn is_transactional(&self) -> bool {
        self.attributes & TRANSACTIONAL != 0
    }

    /// A control batch: a transaction marker (attributes bit 5).
    pub(crate) fn is_control(&self) -> bool {
        self.attributes & CONTROL != 0
    }

    /// Sequence number of the last record; sequences wrap from `i32::MAX` to 0.
    pub(crate) fn last_sequence(&self) -> i32 {
        if self.base_sequence < 0 {
            return -1;
        }
        let last = i64::from(self.base_sequence) + i64::from(self.last_offset_delta);
        (last % (i64::from(i32::MAX) + 1)) as i32
    }
}

/// Attributes bit of a batch that is part of a transaction.
pub(crate) const TRANSACTIONAL: i16 = 0x10;
/// Attributes bit of a control batch.
pub(crate) const CONTROL: i16 = 0x20;

fn i32_at(buf: &[u8], at: usize) -> i32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&buf[at..at + 4]);
    i32::from_be_bytes(b)
}

fn i16_at(buf: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([buf[at], buf[at + 1]])
}

fn i64_at(buf: &[u8], at: usize) -> i64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[at..at + 8]);
    i64::from_be_bytes(b)
}

/// Total size of the batch starting at `buf[0]`, from its first 12 bytes, if they are there.
pub(crate) fn batch_size(buf: &[u8]) -> Result<Option<usize>, BatchError> {
    if buf.len() < LOG_OVERHEAD {
        return Ok(None);
    }
    let length = i32_at(buf, 8);
    if length < (HEADER_LEN - LOG_OVERHEAD) as i32 {
        return Err(BatchError::BadLength(length));
    }
    Ok(Some(LOG_OVERHEAD + length as usize))
}

/// Reads the header of the batch at `buf[0]` without checking the CRC.
pub(crate) fn parse_header(buf: &[u8]) -> Result<BatchHeader, BatchError> {
    let size = batch_size(buf)?.ok_or(BatchError::Truncated {
        have: buf.len(),
        need: LOG_OVERHEAD,
    })?;
    if buf.len() < HEADER_LEN {
        return Err(BatchError::Truncated {
            have: buf.len(),
            need: HEADER_LEN,
        });
    }
    let magic = buf[16] as i8;
    if magic != 2 {
        return Err(BatchError::BadMagic(magic));
    }
    let last_offset_delta = i32_at(buf, 23);
    if last_offset_delta < 0 {
        return Err(BatchError::BadOffsetDelta(last_offset_delta));
    }
    Ok(BatchHeader {
        base_offset: i64_at(buf, 0),
        size,
        last_offset_delta,
        max_timestamp: i64_at(buf, 35),
        record_count: i32_at(buf, 57),
        attributes: i16_at(buf, 21),
        producer_id: i64_at(buf, 43),
        producer_epoch: i16_at(buf, 51),
        base_sequence: i32_at(buf, 53),
    })
}

/// Reads the header of the batch at `buf[0]` and checks that the whole batch is present and its
/// CRC-32C matches.
pub(crate) fn validate(buf: &[u8]) -> Result<BatchHeader, BatchError> {
    let header = parse_header(buf)?;
    if buf.len() < header.size {
        return Err(BatchError::Truncated {
            have: buf.len(),
            need: header.size,
        });
    }
    let stored = i32_at(buf, 17) as u32;
    let computed = crc32c::crc32c(&buf[21..header.size]);
    if stored != computed {
        return Err(BatchError::BadCrc { stored, computed });
    }
    Ok(header)
}

/// Splits a produce request's record set into validated batches: (start, header) pairs.
pub(crate) fn validate_all(records: &[u8]) -> Result<Vec<(usize, BatchHeader)>, BatchError> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < records.len() {
        let header = validate(&records[at..])?;
        out.push((at, header));
        at += header.size;
    }
    Ok(out)
}

/// Writes the broker-assigned base offset (and leader epoch 0) into a batch header. Neither
/// field is covered by the CRC, so the batch stays valid.
pub(crate) fn assign_offset(batch: &mut [u8], base_offset: i64) {
    batch[0..8].copy_from_slice(&base_offset.to_be_bytes());
    batch[12..16].copy_from_slice(&0i32.to_be_bytes());
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal valid uncompressed batch with `count` empty-valued records, for tests.
    pub(crate) fn make_batch(base_offset: i64, count: i32, timestamp: i64) -> Vec<u8> {
        let mut records = Vec::new();
        for i in 0..count {
            // length, attributes, timestampDelta, offsetDelta, key -1, value len 1 "x", headers 0
            let body = [0u8, 0, (i as u8) << 1, 1, 2, b'x', 0];
            records.push((body.len() as u8) << 1);
            records.extend_from_slice(&body);
        }
        let mut b = Vec::new();
        b.extend_from_slice(&base_offset.to_be_bytes());
        b.extend_from_slice(&((HEADER_LEN - LOG_OVERHEAD + records.len()) as i32).to_be_bytes());
        b.extend_from_slice(&0i32.to_be_bytes());
        b.push(2);
        b.extend_from_slice(&[0; 4]);
        b.extend_from_slice(&0i16.to_be_bytes());
        b.extend_from_slice(&(count - 1).to_be_bytes());
        b.extend_from_slice(&timestamp.to_be_bytes());
        b.extend_from_slice(&timestamp.to_be_bytes());
        b.extend_from_slice(&(-1i64).to_be_bytes());
        b.extend_from_slice(&(-1i16).to_be_bytes());
        b.extend_from_slice(&(-1i32).to_be_bytes());
        b.extend_from_slice(&count.to_be_bytes());
        b.extend_from_slice(&records);
        let crc = crc32c::crc32c(&b[21..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        b
    }

    /// A batch of an idempotent (and, with `transactional`, transactional) producer.
    pub(crate) fn make_producer_batch(
        producer_id: i64,
        epoch: i16,
        base_sequence: i32,
        count: i32,
        transactional: bool,
    ) -> Vec<u8> {
        let mut b = make_batch(0, count, 1000);
        let attributes = if transactional { TRANSACTIONAL } else { 0 };
        b[21..23].copy_from_slice(&attributes.to_be_bytes());
        b[43..51].copy_from_slice(&producer_id.to_be_bytes());
        b[51..53].copy_from_slice(&epoch.to_be_bytes());
        b[53..57].copy_from_slice(&base_sequence.to_be_bytes());
        let crc = crc32c::crc32c(&b[21..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        b
    }

    #[test]
    fn assigning_an_offset_keeps_the_crc_valid() {
        let mut batch = make_batch(0, 3, 1000);
        assign_offset(&mut batch, 42);
        let header = validate(&batch).unwrap();
        assert_eq!(header.base_offset, 42);
        assert_eq!(header.last_offset(), 44);
        assert_eq!(header.record_count, 3);
    }

    #[test]
    fn corrupt_and_truncated_batches_are_refused() {
        let mut batch = make_batch(0, 2, 1000);
        let last = batch.len() - 1;
        batch[last] ^= 0xff;
        assert!(matches!(validate(&batch), Err(BatchError::BadCrc { .. })));
        let batch = make_batch(0, 2, 1000);
        assert!(matches!(
            validate(&batch[..batch.len() - 1]),
            Err(BatchError::Truncated { .. })
        ));
        assert!(matches!(
            validate(&batch[..20]),
            Err(BatchError::Truncated { .. })
        ));
        let mut batch = make_batch(0, 2, 1000);
        batch[16] = 1;
        assert_eq!(validate(&batch), Err(BatchError::BadMagic(1)));
    }
}
