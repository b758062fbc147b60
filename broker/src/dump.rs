//! Segment files printed as Apache Kafka's DumpLogSegments tool (`kafka-dump-log.sh`) prints
//! them, for the `dump-log-segments` command: one line per batch (and per record with
//! `print_data_log`) for a `.log`, one line per entry for an `.index`, `.timeindex` or
//! `.txnindex`.
//!
//! Every batch line carries the producer fields (id, epoch, first and last sequence) and the
//! transactional and control bits of the attributes (0x10 and 0x20). The one record of a
//! control batch (a transaction marker) is printed as `endTxnMarker: COMMIT|ABORT
//! coordinatorEpoch: N` instead of a key and payload; its key is `version i16, type i16 (0 =
//! ABORT, 1 = COMMIT)` and its value `version i16, coordinatorEpoch i32`.
//!
//! A `.txnindex` holds the aborted transactions of its segment, 34 bytes each, big-endian:
//!
//! | bytes  | field                  |
//! |--------|------------------------|
//! | 0..2   | version i16 (0)        |
//! | 2..10  | producerId i64         |
//! | 10..18 | firstOffset i64        |
//! | 18..26 | lastOffset i64         |
//! | 26..34 | lastStableOffset i64   |

use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::log::batch::{self, HEADER_LEN};
use crate::log::scan::{Found, Walk};

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
    /// The file name is not `<20-digit base offset>.log|.index|.timeindex|.txnindex`.
    #[error(
        "{0} is not a segment file (NNNNNNNNNNNNNNNNNNNN.log, .index, .timeindex or .txnindex)"
    )]
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
    dump_segment_file_verified(path, print_data_log, false, out).map(|_| ())
}

/// Writes the dump of one segment file to `out`; with `verify`, a `.log` has every batch's
/// CRC checked, each damaged range is printed (`Damaged bytes ...`) and the intact batches
/// after it are dumped too. Returns the number of damaged ranges found.
pub fn dump_segment_file_verified(
    path: &Path,
    print_data_log: bool,
    verify: bool,
    out: &mut impl Write,
) -> Result<usize, DumpError> {
    let options = DumpOptions {
        print_data_log,
        verify,
        ..DumpOptions::default()
    };
    let mut report = DumpReport::default();
    dump_segment_file_with(path, &options, out, &mut report)?;
    Ok(report.damaged)
}

/// Kafka's flags of `kafka-dump-log.sh` that shape a dump.
#[derive(Debug, Clone, Default)]
pub struct DumpOptions {
    /// Print each record of a `.log` too.
    pub print_data_log: bool,
    /// Check every batch's CRC of a `.log` (see [`dump_segment_file_verified`]).
    pub verify: bool,
    /// Read at most this many bytes of a `.log` (whole batches only; no "invalid bytes" line).
    pub max_bytes: Option<u64>,
    /// Check an `.index` or `.timeindex` against its `.log` without printing its entries.
    pub verify_index_only: bool,
}

/// What a dump found wrong: damaged ranges of `.log` files and, as Kafka's DumpLogSegments
/// collects them, index entries that disagree with their `.log` (keyed by absolute path).
#[derive(Debug, Default)]
pub struct DumpReport {
    /// Damaged ranges found by `verify`.
    pub damaged: usize,
    /// `.index` entries whose offset is not the last offset of the batch at their position:
    /// (index offset, log offset; -1 when no batch is there).
    pub index_mismatches: Vec<(String, Vec<(i64, i64)>)>,
    /// `.timeindex` entries whose timestamp is not their batch's: (index, log timestamp).
    pub time_mismatches: Vec<(String, Vec<(i64, i64)>)>,
    /// `.timeindex` entries not above the one before: (timestamp, previous timestamp).
    pub out_of_order: Vec<(String, Vec<(i64, i64)>)>,
    /// `.timeindex` offsets that end no batch: (indexed offset, log offset found or -1).
    pub not_found: Vec<(String, Vec<(i64, i64)>)>,
}

impl DumpReport {
    /// Whether any index entry disagreed with its log.
    pub fn index_problems(&self) -> bool {
        !(self.index_mismatches.is_empty()
            && self.time_mismatches.is_empty()
            && self.out_of_order.is_empty()
            && self.not_found.is_empty())
    }

    /// Kafka's messages for the index problems, in its order (for standard error).
    pub fn write_index_problems(&self, err: &mut impl Write) -> std::io::Result<()> {
        for (file, list) in &self.index_mismatches {
            writeln!(err, "Mismatches in :{file}")?;
            for (index, log) in list {
                writeln!(err, "  Index offset: {index}, log offset: {log}")?;
            }
        }
        for (file, list) in &self.time_mismatches {
            writeln!(err, "Found timestamp mismatch in :{file}")?;
            for (index, log) in list {
                writeln!(err, "  Index timestamp: {index}, log timestamp: {log}")?;
            }
        }
        for (file, list) in &self.out_of_order {
            writeln!(err, "Found out of order timestamp in :{file}")?;
            for (index, previous) in list {
                writeln!(
                    err,
                    "  Index timestamp: {index}, Previously indexed timestamp: {previous}"
                )?;
            }
        }
        for (_, list) in &self.not_found {
            writeln!(
                err,
                "The following indexed offsets are not found in the log."
            )?;
            for (index, log) in list {
                writeln!(err, "Indexed offset: {index}, found log offset: {log}")?;
            }
        }
        Ok(())
    }
}

/// Adds `entry` to the list of `file` in `lists`.
fn note(lists: &mut Vec<(String, Vec<(i64, i64)>)>, file: &str, entry: (i64, i64)) {
    match lists.iter_mut().find(|(f, _)| f == file) {
        Some((_, list)) => list.push(entry),
        None => lists.push((file.to_owned(), vec![entry])),
    }
}

/// Reads at most `limit` bytes of `path` (all without a limit).
fn read_file(path: &Path, limit: Option<u64>) -> Result<Vec<u8>, DumpError> {
    use std::io::Read as _;
    let read = |path: &Path| -> std::io::Result<Vec<u8>> {
        let file = std::fs::File::open(path)?;
        let mut data = Vec::new();
        match limit {
            Some(n) => file.take(n).read_to_end(&mut data)?,
            None => (&file).read_to_end(&mut data)?,
        };
        Ok(data)
    };
    read(path).map_err(|source| DumpError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes the dump of one segment file to `out` as `options` ask, adding what is wrong to
/// `report`.
pub fn dump_segment_file_with(
    path: &Path,
    options: &DumpOptions,
    out: &mut impl Write,
    report: &mut DumpReport,
) -> Result<(), DumpError> {
    let print_data_log = options.print_data_log;
    let verify = options.verify;
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
    let limit = match extension {
        "log" => options.max_bytes,
        _ => None,
    };
    let data = read_file(path, limit)?;
    writeln!(out, "Dumping {}", path.display())?;
    let absolute = std::path::absolute(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .display()
        .to_string();
    // The segment's `.log` (and `.index`), read only to check an index against it.
    let sibling = |ext: &str| read_file(&path.with_extension(ext), None);
    let log_for_index = || match sibling("log") {
        Ok(log) => Ok(Some(log)),
        Err(e) if options.verify_index_only => Err(e),
        Err(_) => Ok(None),
    };
    match extension {
        "log" if verify => {
            let cut = options
                .max_bytes
                .is_some_and(|n| std::fs::metadata(path).is_ok_and(|m| m.len() > n));
            report.damaged += verify_log(path, &data, base_offset, print_data_log, cut, out)?;
        }
        "log" => dump_log(
            &data,
            base_offset,
            print_data_log,
            options.max_bytes.is_none(),
            out,
        )?,
        "index" => {
            let entries = offset_index_entries(&data, base_offset);
            if entries.is_empty() {
                writeln!(out, "{} is empty.", path.display())?;
                return Ok(());
            }
            let log = log_for_index()?;
            for (offset, position) in entries {
                if let Some(log) = &log {
                    let found = batch::parse_header(log.get(position as usize..).unwrap_or(&[]))
                        .map_or(-1, |h| h.last_offset());
                    if found != offset {
                        note(&mut report.index_mismatches, &absolute, (offset, found));
                    }
                }
                if !options.verify_index_only {
                    writeln!(out, "offset: {offset} position: {position}")?;
                }
            }
        }
        "timeindex" => {
            let log = log_for_index()?;
            let index = sibling("index")
                .map(|i| offset_index_entries(&i, base_offset))
                .unwrap_or_default();
            let mut previous = -1i64;
            for (i, entry) in data.chunks_exact(12).enumerate() {
                let timestamp = i64_at(entry, 0);
                let offset = base_offset + i64::from(i32_at(entry, 8) as u32);
                // A zero entry after the first: the unwritten rest of a preallocated file.
                if offset == base_offset && i > 0 {
                    break;
                }
                if let Some(log) = &log {
                    let start = index
                        .iter()
                        .rev()
                        .find(|(o, _)| *o <= offset)
                        .map_or(0, |(_, p)| *p as usize);
                    match batch_ending_at_or_after(log, start, offset) {
                        None => note(&mut report.not_found, &absolute, (offset, -1)),
                        Some((last, _)) if last != offset => {
                            note(&mut report.not_found, &absolute, (offset, last))
                        }
                        Some((_, max_timestamp)) => {
                            if max_timestamp != timestamp {
                                note(
                                    &mut report.time_mismatches,
                                    &absolute,
                                    (timestamp, max_timestamp),
                                );
                            }
                            if previous >= timestamp {
                                note(&mut report.out_of_order, &absolute, (timestamp, previous));
                            }
                        }
                    }
                }
                if !options.verify_index_only {
                    writeln!(out, "timestamp: {timestamp} offset: {offset}")?;
                }
                previous = timestamp;
            }
        }
        "txnindex" => {
            for entry in data.chunks_exact(TXN_INDEX_ENTRY_LEN) {
                writeln!(
                    out,
                    "version: {} producerId: {} firstOffset: {} lastOffset: {} lastStableOffset: {}",
                    i16_at(entry, 0),
                    i64_at(entry, 2),
                    i64_at(entry, 10),
                    i64_at(entry, 18),
                    i64_at(entry, 26),
                )?;
            }
            let trailing = data.len() % TXN_INDEX_ENTRY_LEN;
            if trailing > 0 {
                writeln!(
                    out,
                    "Found {trailing} invalid bytes at the end of the file (position {})",
                    data.len() - trailing
                )?;
            }
        }
        _ => return Err(DumpError::NotASegment(path.to_path_buf())),
    }
    Ok(())
}

/// The (offset, position) entries of an `.index`, up to the first zero entry after the first
/// (the unwritten rest of a preallocated file, as Kafka reads it).
fn offset_index_entries(data: &[u8], base_offset: i64) -> Vec<(i64, u32)> {
    let mut entries = Vec::new();
    for (i, entry) in data.chunks_exact(8).enumerate() {
        let offset = base_offset + i64::from(i32_at(entry, 0) as u32);
        if offset == base_offset && i > 0 {
            break;
        }
        entries.push((offset, i32_at(entry, 4) as u32));
    }
    entries
}

/// From the batch at `start`, the first batch whose last offset is at least `offset`: its
/// last offset and the largest timestamp of its records (as Kafka reads them).
fn batch_ending_at_or_after(log: &[u8], start: usize, offset: i64) -> Option<(i64, i64)> {
    let mut position = start;
    while let Ok(header) = batch::parse_header(log.get(position..)?) {
        let end = position.checked_add(header.size)?;
        if header.last_offset() >= offset {
            let b = log.get(position..end)?;
            let log_append_time = i16_at(b, 21) & 0x08 != 0;
            let from_records = if log_append_time {
                None
            } else {
                batch::decode_records(b).and_then(|r| r.iter().map(|r| r.timestamp).max())
            };
            return Some((
                header.last_offset(),
                from_records.unwrap_or(header.max_timestamp),
            ));
        }
        position = end;
    }
    None
}

/// Bytes of one aborted transaction in a `.txnindex`.
const TXN_INDEX_ENTRY_LEN: usize = 34;

/// `sequence + delta` as Kafka counts sequences: after `i32::MAX` comes 0.
fn add_to_sequence(sequence: i32, delta: i32) -> i32 {
    if sequence < 0 {
        return -1;
    }
    ((i64::from(sequence) + i64::from(delta)) % (i64::from(i32::MAX) + 1)) as i32
}

/// What the one record of a control batch says, as DumpLogSegments prints it.
fn control_record(key: Option<&Bytes>, value: Option<&Bytes>) -> String {
    let Some(key) = key.filter(|k| k.len() >= 4) else {
        return "controlType: UNKNOWN(-1)".to_owned();
    };
    let kind = i16_at(key, 2);
    let name = match kind {
        0 => "ABORT",
        1 => "COMMIT",
        _ => return format!("controlType: UNKNOWN({kind})"),
    };
    match value.filter(|v| v.len() >= 6) {
        Some(value) => format!(
            "endTxnMarker: {name} coordinatorEpoch: {}",
            i32_at(value, 2)
        ),
        None => format!("endTxnMarker: {name} (invalid marker value)"),
    }
}

fn dump_log(
    data: &[u8],
    base_offset: i64,
    print_data_log: bool,
    report_trailing: bool,
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
        dump_batch(data, position, &header, print_data_log, out)?;
        position += header.size;
    }
    // Not after --max-bytes, whose limit may cut a batch (as Kafka).
    if report_trailing && position < data.len() {
        writeln!(
            out,
            "Found {} invalid bytes at the end of the file (position {position})",
            data.len() - position
        )?;
    }
    Ok(())
}

/// The `--verify` dump of a `.log`: every CRC checked, damage printed and walked past (see
/// `log::scan`). With `cut` (`data` is the start of the file, cut by --max-bytes), a range
/// running to the cut is not counted as damage: the batch may go on after it.
fn verify_log(
    path: &Path,
    data: &[u8],
    base_offset: i64,
    print_data_log: bool,
    cut: bool,
    out: &mut impl Write,
) -> Result<usize, DumpError> {
    writeln!(out, "Log starting offset: {base_offset}")?;
    let file = std::fs::File::open(path).map_err(|source| DumpError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let walk = Walk {
        file: &file,
        path,
        len: data.len() as u64,
        base_offset,
        bound: None,
        verify: true,
    };
    let mut damaged = 0;
    let mut written = Ok(());
    let walked = walk.run(
        0,
        base_offset,
        |found| {
            if written.is_err() {
                return;
            }
            written = match found {
                Found::Batch { position, header } => {
                    dump_batch(data, position as usize, &header, print_data_log, out)
                }
                Found::Damage(d) if cut && d.end >= data.len() as u64 => Ok(()),
                Found::Damage(d) => {
                    damaged += 1;
                    let lost = if d.next_offset > d.first_offset {
                        format!("offsets {} to {} lost", d.first_offset, d.last_offset())
                    } else {
                        format!("offsets from {} lost", d.first_offset)
                    };
                    writeln!(
                        out,
                        "Damaged bytes at position {} to {} ({} bytes, {lost}): {}",
                        d.position,
                        d.end,
                        d.len(),
                        d.reason
                    )
                    .map_err(DumpError::Write)
                }
            };
        },
        |_| true,
    );
    written?;
    walked.map_err(|e| DumpError::Read {
        path: path.to_path_buf(),
        source: std::io::Error::other(e.to_string()),
    })?;
    writeln!(
        out,
        "Verified {}: {damaged} damaged range(s)",
        path.display()
    )?;
    Ok(damaged)
}

/// Prints one batch (and its records with `print_data_log`) as DumpLogSegments does.
fn dump_batch(
    data: &[u8],
    position: usize,
    header: &batch::BatchHeader,
    print_data_log: bool,
    out: &mut impl Write,
) -> Result<(), DumpError> {
    {
        let b = &data[position..position + header.size];
        let attributes = i16_at(b, 21);
        let base_sequence = i32_at(b, 53);
        let last_sequence = add_to_sequence(base_sequence, header.last_offset_delta);
        let is_control = attributes & 0x20 != 0;
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
            is_control,
            header.max_timestamp,
            header.size,
            CODECS
                .get((attributes & 7) as usize)
                .copied()
                .unwrap_or("unknown"),
            i32_at(b, 17) as u32,
            batch::validate(b).is_ok(),
        )?;
        // Records are decoded only from intact batches whose offsets cannot overflow and
        // whose record count could be true (see `batch::decode_records`).
        if print_data_log
            && batch::validate(b).is_ok()
            && header.base_offset <= i64::MAX - i64::from(i32::MAX)
        {
            match batch::decode_records(b)
                .ok_or("a record count the batch cannot hold, or records that do not decode")
            {
                Ok(records) => {
                    for r in &records {
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
                            add_to_sequence(base_sequence, (r.offset - header.base_offset) as i32),
                            keys.join(",")
                        )?;
                        if is_control {
                            // A marker's key and value are binary: printed decoded, as Kafka does.
                            write!(out, " {}", control_record(r.key.as_ref(), r.value.as_ref()))?;
                        } else {
                            if let Some(key) = &r.key {
                                write!(out, " key: {}", String::from_utf8_lossy(key))?;
                            }
                            if let Some(value) = &r.value {
                                write!(out, " payload: {}", String::from_utf8_lossy(value))?;
                            }
                        }
                        writeln!(out)?;
                    }
                }
                Err(e) => writeln!(out, "| cannot decode the records of this batch: {e}")?,
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use kafka_protocol::indexmap::IndexMap;
    use kafka_protocol::records::{Compression, Record, TimestampType};

    use super::*;

    type KeyValue = (Option<Vec<u8>>, Option<Vec<u8>>);

    /// A batch of `records` at `base_offset` from producer 7 epoch 2, written as a broker
    /// stores it.
    fn batch(
        base_offset: i64,
        records: &[KeyValue],
        base_sequence: i32,
        transactional: bool,
        control: bool,
    ) -> Vec<u8> {
        let records: Vec<Record> = records
            .iter()
            .enumerate()
            .map(|(i, (key, value))| Record {
                transactional,
                control,
                delete_horizon: false,
                partition_leader_epoch: 0,
                producer_id: 7,
                producer_epoch: 2,
                timestamp_type: TimestampType::Creation,
                offset: base_offset + i as i64,
                sequence: if base_sequence < 0 {
                    -1
                } else {
                    add_to_sequence(base_sequence, i as i32)
                },
                timestamp: 1000,
                key: key.clone().map(Bytes::from),
                value: value.clone().map(Bytes::from),
                headers: IndexMap::new(),
            })
            .collect();
        crate::log::batch::tests::encode(&records, Compression::None)
    }

    /// A transaction marker: key `version 0, type`, value `version 0, coordinator epoch`.
    fn marker(base_offset: i64, commit: bool, coordinator_epoch: i32) -> Vec<u8> {
        let key = [0i16.to_be_bytes(), i16::from(commit).to_be_bytes()].concat();
        let mut value = 0i16.to_be_bytes().to_vec();
        value.extend_from_slice(&coordinator_epoch.to_be_bytes());
        batch(base_offset, &[(Some(key), Some(value))], -1, true, true)
    }

    fn dump(dir: &Path, name: &str, bytes: &[u8], print_data_log: bool) -> Vec<String> {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        let mut out = Vec::new();
        dump_segment_file(&path, print_data_log, &mut out).unwrap();
        String::from_utf8(out)
            .unwrap()
            .lines()
            .skip(1)
            .map(str::to_owned)
            .collect()
    }

    fn field<'a>(line: &'a str, name: &str) -> &'a str {
        let at = line
            .find(&format!(" {name}: "))
            .unwrap_or_else(|| panic!("no {name} in {line}"));
        line[at + name.len() + 3..].split(' ').next().unwrap()
    }

    #[test]
    fn prints_producer_fields_and_markers_of_a_transaction() {
        let dir = tempfile::tempdir().unwrap();
        let kv = |k: &str, v: &str| (Some(k.as_bytes().to_vec()), Some(v.as_bytes().to_vec()));
        let mut log = batch(
            0,
            &[kv("a", "one"), kv("b", "two"), kv("c", "three")],
            5,
            true,
            false,
        );
        log.extend(marker(3, true, 4));
        log.extend(marker(4, false, 0));
        let lines = dump(dir.path(), "00000000000000000000.log", &log, true);
        assert_eq!(lines[0], "Log starting offset: 0");
        let batch_line = &lines[1];
        // Kafka's field order, from baseOffset to isControl.
        assert!(
            batch_line.starts_with(
                "baseOffset: 0 lastOffset: 2 count: 3 baseSequence: 5 lastSequence: 7 \
                 producerId: 7 producerEpoch: 2 partitionLeaderEpoch: 0 isTransactional: true \
                 isControl: false deleteHorizonMs: OptionalLong.empty position: 0 CreateTime: 1000"
            ),
            "{batch_line}"
        );
        assert!(batch_line.ends_with("isvalid: true"), "{batch_line}");
        assert_eq!(field(&lines[2], "sequence"), "5");
        assert!(lines[2].ends_with(" key: a payload: one"), "{}", lines[2]);
        assert_eq!(field(&lines[4], "sequence"), "7");
        let commit_batch = &lines[5];
        assert!(
            commit_batch.starts_with(
                "baseOffset: 3 lastOffset: 3 count: 1 baseSequence: -1 lastSequence: -1 \
                 producerId: 7 producerEpoch: 2 partitionLeaderEpoch: 0 isTransactional: true \
                 isControl: true "
            ),
            "{commit_batch}"
        );
        assert_eq!(
            lines[6],
            "| offset: 3 CreateTime: 1000 keySize: 4 valueSize: 6 sequence: -1 headerKeys: [] \
             endTxnMarker: COMMIT coordinatorEpoch: 4"
        );
        assert!(lines[7].contains("isControl: true"), "{}", lines[7]);
        assert!(
            lines[8].ends_with(" endTxnMarker: ABORT coordinatorEpoch: 0"),
            "{}",
            lines[8]
        );
        assert_eq!(lines.len(), 9, "{lines:#?}");
        // Without --print-data-log only the batch lines.
        let lines = dump(dir.path(), "00000000000000000000.log", &log, false);
        assert_eq!(lines.len(), 4, "{lines:#?}");
    }

    #[test]
    fn a_plain_batch_has_no_producer_and_sequences_wrap_after_i32_max() {
        let dir = tempfile::tempdir().unwrap();
        let v = |s: &str| (None, Some(s.as_bytes().to_vec()));
        let mut log = batch(0, &[v("x")], -1, false, false);
        // The codec counts sequences as wrapping i32s, so the base sequence is set afterwards.
        let mut wrapping = batch(1, &[v("y"), v("z")], 0, false, false);
        wrapping[53..57].copy_from_slice(&i32::MAX.to_be_bytes());
        let crc = crc32c::crc32c(&wrapping[21..]);
        wrapping[17..21].copy_from_slice(&crc.to_be_bytes());
        log.extend(wrapping);
        let lines = dump(dir.path(), "00000000000000000000.log", &log, true);
        assert_eq!(field(&lines[1], "baseSequence"), "-1");
        assert_eq!(field(&lines[1], "lastSequence"), "-1");
        assert_eq!(field(&lines[1], "isTransactional"), "false");
        assert_eq!(field(&lines[1], "isControl"), "false");
        assert_eq!(field(&lines[2], "sequence"), "-1");
        assert!(
            lines[2].ends_with("headerKeys: [] payload: x"),
            "{}",
            lines[2]
        );
        assert_eq!(field(&lines[3], "baseSequence"), &i32::MAX.to_string());
        assert_eq!(field(&lines[3], "lastSequence"), "0");
        assert_eq!(field(&lines[5], "sequence"), "0");
    }

    #[test]
    fn an_unknown_control_record_is_named_by_its_type() {
        let key = [0i16.to_be_bytes(), 5i16.to_be_bytes()].concat();
        let log = batch(0, &[(Some(key), Some(vec![0; 6]))], -1, true, true);
        let dir = tempfile::tempdir().unwrap();
        let lines = dump(dir.path(), "00000000000000000000.log", &log, true);
        assert!(
            lines[2].ends_with(" controlType: UNKNOWN(5)"),
            "{}",
            lines[2]
        );
    }

    #[test]
    fn checks_indexes_against_their_log_as_kafka() {
        let dir = tempfile::tempdir().unwrap();
        let v = |s: &str| (None, Some(s.as_bytes().to_vec()));
        // Batches: offsets 0..=1 at 0, 2 at `second`, 3..=4 at `third`; all timestamps 1000.
        // (Sequences given, so that the codec keeps the records of a batch together.)
        let mut log = batch(0, &[v("a"), v("b")], 0, false, false);
        let second = log.len() as u32;
        log.extend(batch(2, &[v("c")], 2, false, false));
        let third = log.len() as u32;
        log.extend(batch(3, &[v("d"), v("e")], 3, false, false));
        std::fs::write(dir.path().join("00000000000000000000.log"), &log).unwrap();
        let index_entry = |relative: u32, position: u32| {
            [relative.to_be_bytes(), position.to_be_bytes()].concat()
        };
        // Right, wrong (offset 3 where offset 2 ends), then a zero entry: the end.
        let mut index = index_entry(2, second);
        index.extend(index_entry(3, second));
        index.extend(index_entry(0, 0));
        index.extend(index_entry(4, third));
        let time_entry = |ts: i64, relative: u32| {
            let mut e = ts.to_be_bytes().to_vec();
            e.extend_from_slice(&relative.to_be_bytes());
            e
        };
        // Right, a wrong timestamp (out of order too), an offset that ends no batch.
        let mut time = time_entry(1000, 1);
        time.extend(time_entry(999, 2));
        time.extend(time_entry(2000, 3));
        let run = |name: &str, bytes: &[u8], verify_index_only: bool| {
            let path = dir.path().join(name);
            std::fs::write(&path, bytes).unwrap();
            let options = DumpOptions {
                verify_index_only,
                ..DumpOptions::default()
            };
            let mut out = Vec::new();
            let mut report = DumpReport::default();
            dump_segment_file_with(&path, &options, &mut out, &mut report).unwrap();
            let mut err = Vec::new();
            report.write_index_problems(&mut err).unwrap();
            let absolute = std::path::absolute(&path).unwrap().display().to_string();
            (
                String::from_utf8(out).unwrap(),
                String::from_utf8(err).unwrap(),
                absolute,
            )
        };
        let (out, err, path) = run("00000000000000000000.index", &index, true);
        assert_eq!(out.lines().count(), 1, "{out}");
        assert_eq!(
            err,
            format!("Mismatches in :{path}\n  Index offset: 3, log offset: 2\n")
        );
        let (out, _, _) = run("00000000000000000000.index", &index, false);
        assert_eq!(
            out.lines().skip(1).collect::<Vec<_>>(),
            [
                format!("offset: 2 position: {second}"),
                format!("offset: 3 position: {second}")
            ]
        );
        let (out, err, path) = run("00000000000000000000.timeindex", &time, true);
        assert_eq!(out.lines().count(), 1, "{out}");
        assert_eq!(
            err,
            format!(
                "Found timestamp mismatch in :{path}\n  Index timestamp: 999, log timestamp: 1000\n\
                 Found out of order timestamp in :{path}\n  Index timestamp: 999, Previously indexed timestamp: 1000\n\
                 The following indexed offsets are not found in the log.\nIndexed offset: 3, found log offset: 4\n"
            )
        );
        let (out, _, _) = run("00000000000000000000.index", &[], false);
        assert!(
            out.ends_with("00000000000000000000.index is empty.\n"),
            "{out}"
        );
        // --max-bytes: whole batches only, no trailing-bytes line.
        let path = dir.path().join("00000000000000000000.log");
        let options = DumpOptions {
            max_bytes: Some(u64::from(third) + 3),
            ..DumpOptions::default()
        };
        let mut out = Vec::new();
        dump_segment_file_with(&path, &options, &mut out, &mut DumpReport::default()).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert_eq!(out.matches("baseOffset:").count(), 2, "{out}");
        assert!(!out.contains("invalid bytes"), "{out}");
    }

    #[test]
    fn prints_aborted_transactions_of_a_txnindex() {
        let entry = |pid: i64, first: i64, last: i64, lso: i64| {
            let mut e = 0i16.to_be_bytes().to_vec();
            for x in [pid, first, last, lso] {
                e.extend_from_slice(&x.to_be_bytes());
            }
            assert_eq!(e.len(), TXN_INDEX_ENTRY_LEN);
            e
        };
        let mut index = entry(1, 5, 9, 10);
        index.extend(entry(3, 12, 20, 12));
        let dir = tempfile::tempdir().unwrap();
        let lines = dump(dir.path(), "00000000000000000000.txnindex", &index, false);
        assert_eq!(
            lines,
            [
                "version: 0 producerId: 1 firstOffset: 5 lastOffset: 9 lastStableOffset: 10",
                "version: 0 producerId: 3 firstOffset: 12 lastOffset: 20 lastStableOffset: 12",
            ]
        );
        index.extend([0; 10]);
        let lines = dump(dir.path(), "00000000000000000000.txnindex", &index, false);
        assert_eq!(
            lines[2],
            "Found 10 invalid bytes at the end of the file (position 68)"
        );
    }
}
