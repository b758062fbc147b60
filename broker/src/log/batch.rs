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

/// The smallest a v2 record can be: a one-byte length, attributes, timestamp and offset
/// deltas, key and value lengths, and a header count.
const MIN_RECORD_LEN: usize = 7;
/// How much larger than its compressed bytes a batch's records are taken to be at most when
/// they are decoded (a batch compressed better than this is not decoded).
const MAX_COMPRESSION_RATIO: usize = 64;

/// Whether `header`'s record count could be true of a batch of its size: the decoder sizes
/// its record list from the count, so a garbled or hostile count must not reach it.
/// Uncompressed, each record takes at least [`MIN_RECORD_LEN`] bytes; compressed, at most
/// [`MAX_COMPRESSION_RATIO`] times as many are allowed.
pub(crate) fn plausible_record_count(header: &BatchHeader) -> bool {
    let records_len = header.size.saturating_sub(HEADER_LEN);
    let room = if header.attributes & 7 == 0 {
        records_len
    } else {
        records_len.saturating_mul(MAX_COMPRESSION_RATIO)
    };
    usize::try_from(header.record_count).is_ok_and(|count| count <= room / MIN_RECORD_LEN)
}

/// Decodes the records of one whole, valid batch (`bytes` exactly the batch), decompressing
/// them if needed; `None` when its record count is implausible (see
/// [`plausible_record_count`]) or the records do not decode. The decoder sizes its lists from
/// the counts in the data, so the (decompressed) records are walked first with every count
/// and length checked against the bytes there are ([`check_records`]).
pub(crate) fn decode_records(bytes: &[u8]) -> Option<Vec<kafka_protocol::records::Record>> {
    use kafka_protocol::compression::{self as codec, Decompressor};
    use kafka_protocol::records::{Compression, RecordBatchDecoder};

    let header = validate(bytes).ok()?;
    if !plausible_record_count(&header) || header.base_offset > i64::MAX - i64::from(i32::MAX) {
        return None;
    }
    let count = header.record_count as usize;
    let base_timestamp = i64_at(bytes, 27);
    let checked = |buf: &mut bytes::Bytes, compression: Compression| {
        let plain = |b: &mut bytes::Bytes| Ok(b.clone());
        let records = match compression {
            Compression::None => buf.clone(),
            Compression::Gzip => codec::Gzip::decompress(buf, plain)?,
            Compression::Snappy => codec::Snappy::decompress(buf, plain)?,
            Compression::Lz4 => codec::Lz4::decompress(buf, plain)?,
            Compression::Zstd => codec::Zstd::decompress(buf, plain)?,
        };
        // The decoder adds each record's deltas to the batch's base offset and timestamp
        // unchecked: deltas that overflow them (a panic where overflow checks are on, garbage
        // where not) make the batch undecodable here.
        let raw = raw_records(&records, count).map_err(|why| anyhow::anyhow!(why))?;
        let fits = |r: &RawRecord| {
            i32::try_from(r.offset_delta)
                .ok()
                .and_then(|delta| header.base_offset.checked_add(i64::from(delta)))
                .is_some()
                && base_timestamp.checked_add(r.timestamp_delta).is_some()
        };
        if !raw.iter().all(fits) {
            anyhow::bail!("a record's offset or timestamp delta overflows the batch's");
        }
        Ok(records)
    };
    let mut buf = bytes::Bytes::copy_from_slice(&bytes[..header.size]);
    RecordBatchDecoder::decode_with_custom_compression(&mut buf, Some(checked))
        .ok()
        .map(|set| set.records)
}

/// Walks `count` v2 records in `bytes` (uncompressed), checking that every length and count
/// fits in what is left.
pub(crate) fn check_records(bytes: &[u8], count: usize) -> Result<(), &'static str> {
    raw_records(bytes, count).map(|_| ())
}

/// One v2 record, located in its batch's (decompressed) records without being copied.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RawRecord {
    /// The record's bytes, its length prefix included: copied as they are into a batch with
    /// the same base offset and base timestamp, they keep their offset and timestamp.
    pub(crate) span: std::ops::Range<usize>,
    pub(crate) offset_delta: i64,
    pub(crate) timestamp_delta: i64,
    /// Where the key's bytes are; `None` for a null key.
    pub(crate) key: Option<std::ops::Range<usize>>,
    /// The value is null: a tombstone, on a compacted topic.
    pub(crate) tombstone: bool,
}

/// Walks `count` v2 records in `bytes` (uncompressed), checking that every length and count
/// fits in what is left, and says where each record and its key are.
pub(crate) fn raw_records(bytes: &[u8], count: usize) -> Result<Vec<RawRecord>, &'static str> {
    // Each record takes at least MIN_RECORD_LEN bytes: a hostile count allocates nothing.
    if count > bytes.len() / MIN_RECORD_LEN + 1 {
        return Err("more records than the bytes hold");
    }
    let mut out = Vec::with_capacity(count);
    let mut at = 0usize;
    for _ in 0..count {
        let start = at;
        let len = varint(bytes, &mut at)?;
        let len = usize::try_from(len).map_err(|_| "negative record length")?;
        let end = at
            .checked_add(len)
            .filter(|e| *e <= bytes.len())
            .ok_or("record past the end")?;
        let record = &bytes[..end];
        at += 1; // attributes
        let timestamp_delta = varint(record, &mut at)?;
        let offset_delta = varint(record, &mut at)?;
        let key = skip_bytes(record, &mut at)?;
        let value = skip_bytes(record, &mut at)?;
        let headers = varint(record, &mut at)?;
        let headers = usize::try_from(headers).map_err(|_| "negative header count")?;
        // Each header takes at least two bytes: its key and value lengths.
        if headers > (end.saturating_sub(at)) / 2 {
            return Err("more headers than the record holds");
        }
        for _ in 0..headers {
            skip_bytes(record, &mut at)?;
            skip_bytes(record, &mut at)?;
        }
        if at > end {
            return Err("record fields past its length");
        }
        out.push(RawRecord {
            span: start..end,
            offset_delta,
            timestamp_delta,
            key,
            tombstone: value.is_none(),
        });
        at = end;
    }
    Ok(out)
}

/// A zigzag varint (up to 64 bits) at `*at`, moving `*at` past it.
fn varint(bytes: &[u8], at: &mut usize) -> Result<i64, &'static str> {
    let mut value = 0u64;
    for shift in (0..70).step_by(7) {
        let byte = *bytes.get(*at).ok_or("varint past the end")?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift.min(63);
        if byte & 0x80 == 0 {
            return Ok((value >> 1) as i64 ^ -((value & 1) as i64));
        }
    }
    Err("varint longer than 10 bytes")
}

/// Skips a length-prefixed byte string, returning where its bytes are (`None` for null, -1).
fn skip_bytes(
    bytes: &[u8],
    at: &mut usize,
) -> Result<Option<std::ops::Range<usize>>, &'static str> {
    let len = varint(bytes, at)?;
    if len < 0 {
        return Ok(None);
    }
    let len = usize::try_from(len).map_err(|_| "length too large")?;
    let start = *at;
    *at = at
        .checked_add(len)
        .filter(|e| *e <= bytes.len())
        .ok_or("bytes past the end")?;
    Ok(Some(start..*at))
}

/// Attributes bit of a batch stamped with the broker's append time (`LogAppendTime`).
pub(crate) const LOG_APPEND_TIME: i16 = 0x08;
/// Attributes bits of the codec.
const CODEC: i16 = 0x07;

/// Rewrites the whole, valid batch `bytes` for its topic's settings, keeping every other
/// header field (base offset, offset delta, base timestamp, producer id, epoch and sequence,
/// record count): with `codec`, its records re-encoded when the producer used another codec;
/// with `append_time`, stamped with the broker's time (attributes bit 3 and maxTimestamp, as
/// Kafka does for `LogAppendTime`). `Ok(None)` when nothing changes; an error names what in
/// the records does not decode.
pub(crate) fn rewrite(
    bytes: &[u8],
    codec: Option<kafka_protocol::records::Compression>,
    append_time: Option<i64>,
) -> Result<Option<Vec<u8>>, &'static str> {
    let header = validate(bytes).map_err(|_| "the batch is not valid")?;
    let attributes = header.attributes;
    let target = codec.map(|c| c as i16);
    let recode = target.is_some_and(|t| t != attributes & CODEC);
    if !recode && append_time.is_none() {
        return Ok(None);
    }
    let mut out = bytes[..HEADER_LEN].to_vec();
    let mut attributes = attributes;
    if let Some(target) = target.filter(|_| recode) {
        let records = decompress(attributes, &bytes[HEADER_LEN..header.size])?;
        let count = usize::try_from(header.record_count).map_err(|_| "negative record count")?;
        check_records(&records, count)?;
        out.extend_from_slice(&compress(target, &records)?);
        attributes = (attributes & !CODEC) | target;
    } else {
        out.extend_from_slice(&bytes[HEADER_LEN..header.size]);
    }
    if let Some(now) = append_time {
        attributes |= LOG_APPEND_TIME;
        out[35..43].copy_from_slice(&now.to_be_bytes());
    }
    out[21..23].copy_from_slice(&attributes.to_be_bytes());
    seal(&mut out)?;
    Ok(Some(out))
}

/// Sets the length and CRC of a batch whose other fields and records are written.
fn seal(batch: &mut [u8]) -> Result<(), &'static str> {
    let length = i32::try_from(batch.len() - LOG_OVERHEAD).map_err(|_| "the batch is too large")?;
    batch[8..12].copy_from_slice(&length.to_be_bytes());
    let crc = crc32c::crc32c(&batch[21..]);
    batch[17..21].copy_from_slice(&crc.to_be_bytes());
    Ok(())
}

/// The records of a batch (`stored`: its bytes after the header), decompressed for the codec
/// in its `attributes`.
pub(crate) fn decompress(attributes: i16, stored: &[u8]) -> Result<bytes::Bytes, &'static str> {
    use kafka_protocol::compression::{self as compressor, Decompressor};

    let mut stored = bytes::Bytes::copy_from_slice(stored);
    let plain = |b: &mut bytes::Bytes| Ok(b.clone());
    match attributes & CODEC {
        0 => Ok(stored),
        1 => compressor::Gzip::decompress(&mut stored, plain),
        2 => compressor::Snappy::decompress(&mut stored, plain),
        3 => compressor::Lz4::decompress(&mut stored, plain),
        4 => compressor::Zstd::decompress(&mut stored, plain),
        _ => return Err("the batch's codec is unknown"),
    }
    .map_err(|_| "the records do not decompress")
}

/// `records` compressed with the codec of attributes bits `codec` (0 leaves them as they are).
fn compress(codec: i16, records: &[u8]) -> Result<bytes::BytesMut, &'static str> {
    use bytes::BufMut;
    use kafka_protocol::compression::{self as compressor, Compressor};

    let mut encoded = bytes::BytesMut::new();
    let copy = |into: &mut bytes::BytesMut| {
        into.put_slice(records);
        Ok(())
    };
    match codec & CODEC {
        0 => copy(&mut encoded),
        1 => compressor::Gzip::compress(&mut encoded, copy),
        2 => compressor::Snappy::compress(&mut encoded, copy),
        3 => compressor::Lz4::compress(&mut encoded, copy),
        4 => compressor::Zstd::compress(&mut encoded, copy),
        _ => return Err("the batch's codec is unknown"),
    }
    .map_err(|_| "the records do not compress")?;
    Ok(encoded)
}

/// The records of the whole, valid batch `bytes`, decompressed and located, for the cleaner.
pub(crate) struct BatchRecords {
    pub(crate) header: BatchHeader,
    /// The batch's base timestamp: a record's timestamp is it plus the record's delta.
    pub(crate) base_timestamp: i64,
    /// The decompressed records.
    pub(crate) bytes: bytes::Bytes,
    pub(crate) records: Vec<RawRecord>,
}

impl BatchRecords {
    /// Reads the batch: its CRC and every record length checked.
    pub(crate) fn read(bytes: &[u8]) -> Result<BatchRecords, &'static str> {
        let header = validate(bytes).map_err(|_| "the batch is not valid")?;
        if !plausible_record_count(&header) {
            return Err("the batch's record count does not fit its size");
        }
        let count = usize::try_from(header.record_count).map_err(|_| "negative record count")?;
        let records = decompress(header.attributes, &bytes[HEADER_LEN..header.size])?;
        let located = raw_records(&records, count)?;
        Ok(BatchRecords {
            header,
            base_timestamp: i64_at(bytes, 27),
            bytes: records,
            records: located,
        })
    }

    /// The offset of a record.
    pub(crate) fn offset(&self, record: &RawRecord) -> i64 {
        self.header.base_offset.saturating_add(record.offset_delta)
    }

    /// The timestamp of a record (the batch's, when the broker stamped it: LogAppendTime).
    pub(crate) fn timestamp(&self, record: &RawRecord) -> i64 {
        if self.header.attributes & LOG_APPEND_TIME != 0 {
            self.header.max_timestamp
        } else {
            self.base_timestamp.saturating_add(record.timestamp_delta)
        }
    }

    /// The key of a record, `None` when null.
    pub(crate) fn key(&self, record: &RawRecord) -> Option<&[u8]> {
        record.key.clone().map(|range| &self.bytes[range])
    }

    /// The batch `original` (which these records were read from) with only the records
    /// `kept` (in order, a subset of [`BatchRecords::records`]), compressed as it was. Its
    /// header stays as it was but for the record count, length and CRC: base offset, last
    /// offset delta, timestamps and producer fields are kept, as Kafka's cleaner keeps them.
    pub(crate) fn rebuild(
        &self,
        original: &[u8],
        kept: &[&RawRecord],
    ) -> Result<Vec<u8>, &'static str> {
        let mut plain = Vec::with_capacity(kept.iter().map(|r| r.span.len()).sum());
        for record in kept {
            plain.extend_from_slice(&self.bytes[record.span.clone()]);
        }
        let mut out = original[..HEADER_LEN].to_vec();
        out.extend_from_slice(&compress(self.header.attributes, &plain)?);
        let count = i32::try_from(kept.len()).map_err(|_| "too many records")?;
        out[57..61].copy_from_slice(&count.to_be_bytes());
        seal(&mut out)?;
        Ok(out)
    }
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

    /// `records` encoded as one batch by the codec (their offsets, producer fields and
    /// timestamps as given), compressed with `compression`.
    pub(crate) fn encode(
        records: &[kafka_protocol::records::Record],
        compression: kafka_protocol::records::Compression,
    ) -> Vec<u8> {
        use kafka_protocol::records::{RecordBatchEncoder, RecordEncodeOptions};
        let mut buf = bytes::BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            records,
            &RecordEncodeOptions {
                version: 2,
                compression,
            },
        )
        .unwrap();
        buf.to_vec()
    }

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

    /// Records are decoded only where their counts fit their bytes: a hostile header count
    /// or record count once made the decoder reserve gigabytes and abort the process.
    #[test]
    fn records_decode_only_when_their_counts_fit_their_bytes() {
        let good = make_batch(0, 3, 1000);
        assert_eq!(decode_records(&good).map(|r| r.len()), Some(3));
        // The first record's header count (its last byte) says 2^31.
        let mut headers = make_batch(0, 1, 1000);
        let last = headers.len() - 1;
        headers.splice(last.., [0xfe, 0xff, 0xff, 0xff, 0x0f]);
        headers[62 - 1] = 11 << 1; // the record's length grows by the four bytes
        let len = (headers.len() - LOG_OVERHEAD) as i32;
        headers[8..12].copy_from_slice(&len.to_be_bytes());
        let crc = crc32c::crc32c(&headers[21..]);
        headers[17..21].copy_from_slice(&crc.to_be_bytes());
        assert!(validate(&headers).is_ok());
        assert_eq!(decode_records(&headers), None);
        // A record count no batch of this size can hold.
        let mut count = make_batch(0, 1, 1000);
        count[57..61].copy_from_slice(&i32::MAX.to_be_bytes());
        count[23..27].copy_from_slice(&(i32::MAX - 1).to_be_bytes());
        let crc = crc32c::crc32c(&count[21..]);
        count[17..21].copy_from_slice(&crc.to_be_bytes());
        let header = validate(&count).unwrap();
        assert!(!plausible_record_count(&header));
        assert_eq!(decode_records(&count), None);
    }

    /// A topic's codec re-encodes a batch's records and keeps every other header field; the
    /// broker's append time stamps it; a batch already in the codec is left alone.
    #[test]
    fn rewriting_changes_the_codec_and_keeps_the_header() {
        use kafka_protocol::records::Compression;
        let plain = make_producer_batch(7, 2, 40, 5, true);
        let original = validate(&plain).unwrap();
        let records = decode_records(&plain).unwrap();
        let mut bytes = plain.clone();
        for codec in [
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
            Compression::None,
        ] {
            let rewritten = match rewrite(&bytes, Some(codec), None).unwrap() {
                Some(rewritten) => rewritten,
                None => {
                    // Only the codec the batch already has is left alone.
                    assert_eq!(codec, Compression::None);
                    continue;
                }
            };
            let header = validate(&rewritten).unwrap();
            assert_eq!(header.attributes & CODEC, codec as i16);
            assert_eq!(header.attributes & !CODEC, original.attributes & !CODEC);
            assert_eq!(
                (
                    header.base_offset,
                    header.last_offset_delta,
                    header.record_count
                ),
                (
                    original.base_offset,
                    original.last_offset_delta,
                    original.record_count
                )
            );
            assert_eq!(
                (
                    header.producer_id,
                    header.producer_epoch,
                    header.base_sequence
                ),
                (7, 2, 40)
            );
            assert_eq!(rewritten[27..43], plain[27..43], "timestamps kept");
            assert_eq!(decode_records(&rewritten).unwrap(), records);
            assert_eq!(rewrite(&rewritten, Some(codec), None).unwrap(), None);
            bytes = rewritten;
        }
        let stamped = rewrite(&plain, None, Some(1_234_567)).unwrap().unwrap();
        let header = validate(&stamped).unwrap();
        assert_eq!(header.max_timestamp, 1_234_567);
        assert_ne!(header.attributes & LOG_APPEND_TIME, 0);
        // Records that do not decompress are refused, not stored.
        let mut garbled = rewrite(&plain, Some(Compression::Lz4), None)
            .unwrap()
            .unwrap();
        let len = garbled.len();
        garbled[HEADER_LEN..len].fill(0x55);
        let crc = crc32c::crc32c(&garbled[21..]);
        garbled[17..21].copy_from_slice(&crc.to_be_bytes());
        assert!(rewrite(&garbled, Some(Compression::Gzip), None).is_err());
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
