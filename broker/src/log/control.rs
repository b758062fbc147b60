//! Transaction markers: the control batches that end a transaction in a partition.
//!
//! A marker is a record batch v2 with attributes bits 4 (transactional) and 5 (control) set,
//! the producer's id and epoch, base sequence -1 and one uncompressed record:
//!
//! | part  | bytes                                                  |
//! |-------|--------------------------------------------------------|
//! | key   | version i16 (0), type i16 (0 = ABORT, 1 = COMMIT)      |
//! | value | version i16 (0), coordinator epoch i32                 |
//!
//! Consumers never see markers as records; read_committed consumers use them to end the
//! transaction of that producer, dropping its records when it was aborted.

use super::batch::{self, CONTROL, HEADER_LEN, LOG_OVERHEAD, TRANSACTIONAL};

/// What a marker says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Marker {
    pub(crate) commit: bool,
    pub(crate) coordinator_epoch: i32,
}

/// Bytes of the one record of a marker, its length prefix included.
const RECORD_LEN: usize = 1 + 16;

/// A marker batch with base offset 0 (the log assigns the real one).
pub(crate) fn marker_batch(
    producer_id: i64,
    producer_epoch: i16,
    marker: Marker,
    timestamp: i64,
) -> Vec<u8> {
    let mut b = Vec::with_capacity(HEADER_LEN + RECORD_LEN);
    b.extend_from_slice(&0i64.to_be_bytes());
    b.extend_from_slice(&((HEADER_LEN - LOG_OVERHEAD + RECORD_LEN) as i32).to_be_bytes());
    b.extend_from_slice(&0i32.to_be_bytes());
    b.push(2);
    b.extend_from_slice(&[0; 4]);
    b.extend_from_slice(&(TRANSACTIONAL | CONTROL).to_be_bytes());
    b.extend_from_slice(&0i32.to_be_bytes()); // lastOffsetDelta
    b.extend_from_slice(&timestamp.to_be_bytes());
    b.extend_from_slice(&timestamp.to_be_bytes());
    b.extend_from_slice(&producer_id.to_be_bytes());
    b.extend_from_slice(&producer_epoch.to_be_bytes());
    b.extend_from_slice(&(-1i32).to_be_bytes()); // base sequence
    b.extend_from_slice(&1i32.to_be_bytes()); // record count
    // The record (varints are zigzag encoded): length 16, attributes, timestamp delta 0,
    // offset delta 0, key length 4, key, value length 6, value, no headers.
    b.extend_from_slice(&[32, 0, 0, 0, 8]);
    b.extend_from_slice(&0i16.to_be_bytes());
    b.extend_from_slice(&i16::from(marker.commit).to_be_bytes());
    b.push(12);
    b.extend_from_slice(&0i16.to_be_bytes());
    b.extend_from_slice(&marker.coordinator_epoch.to_be_bytes());
    b.push(0);
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

/// Reads a zigzag varint at `at`, returning it and the position after it.
fn varint(buf: &[u8], mut at: usize) -> Option<(i64, usize)> {
    let mut value: u64 = 0;
    for shift in (0..64).step_by(7) {
        let byte = *buf.get(at)?;
        at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some((((value >> 1) as i64) ^ -((value & 1) as i64), at));
        }
    }
    None
}

/// Bytes to read from a control batch's start to parse its marker with [`parse`].
pub(crate) const PARSE_LEN: usize = HEADER_LEN + 32;

/// The marker of a control batch (`buf` starts at the batch and holds at least its first record,
/// or the whole batch if shorter); `None` when the control record is not a marker Kafka
/// defines (a future control type is skipped, as Kafka skips it).
pub(crate) fn parse(buf: &[u8]) -> Option<Marker> {
    let header = batch::parse_header(buf).ok()?;
    if !header.is_control() {
        return None;
    }
    let (_, at) = varint(buf, HEADER_LEN)?; // record length
    let at = at + 1; // attributes
    let (_, at) = varint(buf, at)?; // timestamp delta
    let (_, at) = varint(buf, at)?; // offset delta
    let (key_len, at) = varint(buf, at)?;
    if key_len < 4 {
        return None;
    }
    let key = buf.get(at..at + 4)?;
    let kind = i16::from_be_bytes([key[2], key[3]]);
    let at = at + usize::try_from(key_len).ok()?;
    let (value_len, at) = varint(buf, at)?;
    let coordinator_epoch = if value_len >= 6 {
        let v = buf.get(at..at + 6)?;
        i32::from_be_bytes([v[2], v[3], v[4], v[5]])
    } else {
        0
    };
    match kind {
        0 | 1 => Some(Marker {
            commit: kind == 1,
            coordinator_epoch,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use kafka_protocol::records::RecordBatchDecoder;

    #[test]
    fn a_marker_is_a_valid_control_batch_that_reads_back() {
        for commit in [true, false] {
            let marker = Marker {
                commit,
                coordinator_epoch: 7,
            };
            let mut b = marker_batch(1234, 3, marker, 1_700_000_000_000);
            batch::assign_offset(&mut b, 99);
            let header = batch::validate(&b).unwrap();
            assert!(header.is_control() && header.is_transactional());
            assert_eq!(header.producer_id, 1234);
            assert_eq!(header.producer_epoch, 3);
            assert_eq!(header.base_sequence, -1);
            assert_eq!(header.record_count, 1);
            assert_eq!(header.size, b.len());
            assert_eq!(parse(&b), Some(marker));
            // The codec of the wire protocol reads it as Kafka's control record.
            let mut bytes = Bytes::from(b);
            let set = RecordBatchDecoder::decode(&mut bytes).unwrap();
            let record = &set.records[0];
            assert!(record.control && record.transactional);
            assert_eq!(record.offset, 99);
            let key = record.key.as_ref().unwrap();
            assert_eq!(key.as_ref(), [0, 0, 0, u8::from(commit)]);
            assert_eq!(record.value.as_ref().unwrap().len(), 6);
        }
        assert_eq!(parse(&batch::tests::make_batch(0, 1, 5)), None);
        let b = marker_batch(
            1,
            0,
            Marker {
                commit: true,
                coordinator_epoch: 0,
            },
            5,
        );
        for cut in 0..b.len() {
            let _ = parse(&b[..cut]);
        }
    }
}
