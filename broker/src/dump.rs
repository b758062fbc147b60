//! Segment files printed as Apache Kafka's DumpLogSegments tool (`kafka-dump-log.sh`) prints
//! them, for the `dump-log-segments` command: one line per batch (and per record with
//! `print_data_log`) for a `.log`, one line per entry for an `.index` or `.timeindex`.

use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use kafka_protocol::records::RecordBatchDecoder;

use crate::log::batch::{self, HEADER_LEN};

/// Why a segment file could not be dumped.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    /// The file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The output cannot be written.
    #[error("cannot write the dump: {0}")]
    Write(#[from] std::io::Error),
    /// The file name is not `<20-digit base offset>.log|.index|.timeindex`.
    #[error("{0} is not a segment file (NNNNNNNNNNNNNNNNNNNN.log, .index or .timeindex)")]
    NotASegment(PathBuf),
}

const CODECS: [&str; 5] = ["none", "gzip", "snappy", "lz4", "zstd"];

fn i16_at(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}

fn i32_at(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn i64_at(b: &[u8], at: usize) -> i64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    i64::from_be_bytes(x)
}

/// Writes the dump of one segment file to `out`.
pub fn dump_segment_file(
    path: &Path,
    print_data_log: bool,
    out: &mut impl Write,
) -> Result<(), DumpError> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let (stem, extension) = name
        .rsplit_once('.')
        .ok_or_else(|| DumpError::NotASegment(path.to_path_buf()))?;
    let base_offset: i64 = stem
        .parse()
        .map_err(|_| DumpError::NotASegment(path.to_path_buf()))?;
    let data = std::fs::read(path).map_err(|source| DumpError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    writeln!(out, "Dumping {}", path.display())?;
    match extension {
        "log" => dump_log(&data, base_offset, print_data_log, out)?,
        "index" => {
            for entry in data.chunks_exact(8) {
                let offset = base_offset + i64::from(i32_at(entry, 0) as u32);
                writeln!(
                    out,
                    "offset: {offset} position: {}",
                    i32_at(entry, 4) as u32
                )?;
            }
        }
        "timeindex" => {
            for entry in data.chunks_exact(12) {
                let offset = base_offset + i64::from(i32_at(entry, 8) as u32);
                writeln!(out, "timestamp: {} offset: {offset}", i64_at(entry, 0))?;
            }
        }
        _ => return Err(DumpError::NotASegment(path.to_path_buf())),
    }
    Ok(())
}

fn dump_log(
    data: &[u8],
    base_offset: i64,
    print_data_log: bool,
    out: &mut impl Write,
) -> Result<(), DumpError> {
    writeln!(out, "Log starting offset: {base_offset}")?;
    let mut position = 0usize;
    while position + HEADER_LEN <= data.len() {
        let Ok(header) = batch::parse_header(&data[position..]) else {
            break;
        };
        if position + header.size > data.len() {
            break;
        }
        let b = &data[position..position + header.size];
        let attributes = i16_at(b, 21);
        let base_sequence = i32_at(b, 53);
        let last_sequence = if base_sequence < 0 {
            -1
        } else {
            base_sequence.wrapping_add(header.last_offset_delta)
        };
        let timestamp_kind = if attributes & 0x08 != 0 {
            "LogAppendTime"
        } else {
            "CreateTime"
        };
        let delete_horizon = if attributes & 0x40 != 0 {
            format!("OptionalLong[{}]", i64_at(b, 27))
        } else {
            "OptionalLong.empty".to_owned()
        };
        writeln!(
            out,
            "baseOffset: {} lastOffset: {} count: {} baseSequence: {base_sequence} lastSequence: {last_sequence} \
             producerId: {} producerEpoch: {} partitionLeaderEpoch: {} isTransactional: {} isControl: {} \
             deleteHorizonMs: {delete_horizon} position: {position} {timestamp_kind}: {} size: {} magic: 2 \
             compresscodec: {} crc: {} isvalid: {}",
            header.base_offset,
            header.last_offset(),
            header.record_count,
            i64_at(b, 43),
            i16_at(b, 51),
            i32_at(b, 12),
            attributes & 0x10 != 0,
            attributes & 0x20 != 0,
            header.max_timestamp,
            header.size,
            CODECS
                .get((attributes & 7) as usize)
                .copied()
                .unwrap_or("unknown"),
            i32_at(b, 17) as u32,
            batch::validate(b).is_ok(),
        )?;
        // Records are decoded only from intact batches whose offsets cannot overflow.
        if print_data_log
            && batch::validate(b).is_ok()
            && header.base_offset <= i64::MAX - i64::from(i32::MAX)
        {
            let mut bytes = Bytes::copy_from_slice(b);
            match RecordBatchDecoder::decode(&mut bytes) {
                Ok(set) => {
                    for r in &set.records {
                        let size = |v: &Option<Bytes>| v.as_ref().map_or(-1, |v| v.len() as i64);
                        let keys: Vec<&str> = r.headers.keys().map(|k| k.as_str()).collect();
                        write!(
                            out,
                            "| offset: {} {timestamp_kind}: {} keySize: {} valueSize: {} sequence: {} headerKeys: [{}]",
                            r.offset,
                            r.timestamp,
                            size(&r.key),
                            size(&r.value),
                            // Kafka's rule; the codec counts up from -1 for non-idempotent batches.
                            if base_sequence < 0 {
                                -1
                            } else {
                                base_sequence.wrapping_add((r.offset - header.base_offset) as i32)
                            },
                            keys.join(",")
                        )?;
                        if let Some(key) = &r.key {
                            write!(out, " key: {}", String::from_utf8_lossy(key))?;
                        }
                        if let Some(value) = &r.value {
                            write!(out, " payload: {}", String::from_utf8_lossy(value))?;
                        }
                        writeln!(out)?;
                    }
                }
                Err(e) => writeln!(out, "| cannot decode the records of this batch: {e}")?,
            }
        }
        position += header.size;
    }
    if position < data.len() {
        writeln!(
            out,
            "Found {} invalid bytes at the end of the file (position {position})",
            data.len() - position
        )?;
    }
    Ok(())
}
