//! The partition log, laid out on disk as Apache Kafka lays it out.
//!
//! ```text
//! <data_dir>/<topic>-<partition>/
//!     00000000000000000000.log         record batches, appended as received
//!     00000000000000000000.index       sparse offset index
//!     00000000000000000000.timeindex   sparse time index
//!     00000000000000052311.log         next segment, named by its base offset
//!     ...
//! ```
//!
//! | file         | entry                                          | size      |
//! |--------------|------------------------------------------------|-----------|
//! | `.log`       | record batch v2 (see [`batch`]), back to back  | any       |
//! | `.index`     | relative offset u32 BE, file position u32 BE   | 8 bytes   |
//! | `.timeindex` | max timestamp so far i64 BE, relative offset u32 BE | 12 bytes |
//!
//! Invariants and life cycle:
//! - Offsets only grow. The broker assigns them by writing the batch's base offset into its
//!   header; the records, the compression and the CRC (which does not cover the base offset)
//!   are left exactly as the producer sent them.
//! - An index entry is written after every `index.interval.bytes` of log; it maps the last
//!   offset of a batch to the position where that batch starts, so a lookup lands at or before
//!   the wanted batch and walks forward over batch headers.
//! - The last segment is the active one. A new one is rolled when the active segment would
//!   pass `segment.bytes` or is older than `segment.ms`.
//! - Retention deletes whole segments, oldest first, never the active one: those whose newest
//!   batch is older than `retention.ms`, and those that keep the partition above
//!   `retention.bytes`. The log start offset is the base offset of the oldest segment left.
//! - When a segment stops being the active one, its newest timestamp is appended to its time
//!   index, so the last time index entry of a finished segment is its newest timestamp.
//! - Writes go to the page cache; `flush.messages`/`flush.ms` add fsyncs. On open the active
//!   segment is read batch by batch (length and CRC), anything after the last good batch (a
//!   write torn by a crash) is truncated, and its indexes are rebuilt. Finished segments load
//!   from their index files; one whose indexes are missing or do not fit its log is read batch
//!   by batch (headers only) to rebuild them.

pub(crate) mod batch;
mod segment;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::topic_config::LogConfig;
use batch::{BatchError, BatchHeader};
pub(crate) use segment::FileSlice;
use segment::Segment;

/// A storage failure, with the file it concerns.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// A file operation failed.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// A segment holds bytes that are not a valid batch where one must be.
    #[error("{path} is corrupt at byte {position}: {source}")]
    Corrupt {
        /// The segment file.
        path: PathBuf,
        /// Where the bad batch starts.
        position: u64,
        /// What is wrong with it.
        #[source]
        source: BatchError,
    },
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// What a fetch gets from a log.
pub(crate) enum Read {
    /// Nothing after the offset yet.
    Empty,
    /// Batches to read from a segment file.
    Slice(FileSlice),
}

impl Read {
    /// The bytes, read now.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> Result<bytes::Bytes, StorageError> {
        match self {
            Read::Empty => Ok(bytes::Bytes::new()),
            Read::Slice(slice) => slice.read(),
        }
    }
}

/// Result of looking up an offset by timestamp.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TimestampOffset {
    pub(crate) timestamp: i64,
    pub(crate) offset: i64,
}

/// The log of one topic partition: an ordered list of segments, the last one active.
pub(crate) struct PartitionLog {
    name: String,
    dir: PathBuf,
    segments: Vec<Segment>,
    config: LogConfig,
    unflushed_records: i64,
    last_flush: Instant,
}

impl PartitionLog {
    /// Opens (or creates) the log in `dir`, recovering a torn tail of the active segment.
    /// After a clean shutdown finished segments load from their indexes; after a crash their
    /// batch headers are walked too, so a tail the page cache never wrote is cut off.
    pub(crate) fn open(
        dir: &Path,
        name: String,
        config: LogConfig,
        clean_shutdown: bool,
    ) -> Result<PartitionLog, StorageError> {
        fs::create_dir_all(dir).map_err(|source| StorageError::Io {
            path: dir.to_path_buf(),
            action: "create",
            source,
        })?;
        let entries = fs::read_dir(dir).map_err(|source| StorageError::Io {
            path: dir.to_path_buf(),
            action: "list",
            source,
        })?;
        let mut bases = Vec::new();
        for entry in entries.flatten() {
            let file_name = entry.file_name();
            let Some(file_name) = file_name.to_str() else {
                continue;
            };
            if let Some(stem) = file_name.strip_suffix(".log")
                && let Ok(base) = stem.parse::<i64>()
            {
                bases.push(base);
            }
        }
        bases.sort_unstable();
        let now = now_ms();
        let mut segments = Vec::with_capacity(bases.len().max(1));
        for (i, base) in bases.iter().enumerate() {
            // The active segment is read batch by batch with CRCs.
            let (segment, recovery) = match bases.get(i + 1) {
                None => Segment::open(dir, *base, true, config.index_interval_bytes, now)?,
                Some(next) if clean_shutdown => {
                    Segment::load(dir, *base, *next, config.index_interval_bytes, now)?
                }
                Some(_) => Segment::open(dir, *base, false, config.index_interval_bytes, now)?,
            };
            if recovery.truncated_bytes > 0 {
                tracing::warn!(
                    partition = %name,
                    segment = %segment::file_name(*base, "log"),
                    valid_bytes = segment.size(),
                    truncated_bytes = recovery.truncated_bytes,
                    "truncated a torn or corrupt tail of the log"
                );
            }
            segments.push(segment);
        }
        if segments.is_empty() {
            segments.push(Segment::create(dir, 0, now)?);
        }
        Ok(PartitionLog {
            name,
            dir: dir.to_path_buf(),
            segments,
            config,
            unflushed_records: 0,
            last_flush: Instant::now(),
        })
    }

    fn active(&mut self) -> &mut Segment {
        let last = self.segments.len() - 1;
        &mut self.segments[last]
    }

    /// First offset still stored.
    pub(crate) fn log_start_offset(&self) -> i64 {
        self.segments.first().map_or(0, Segment::base_offset)
    }

    /// Offset the next appended record will get (also the high watermark: one replica).
    pub(crate) fn log_end_offset(&self) -> i64 {
        self.segments.last().map_or(0, Segment::next_offset)
    }

    /// Bytes stored across all segments.
    pub(crate) fn size_bytes(&self) -> u64 {
        self.segments.iter().map(Segment::size).sum()
    }

    /// Number of segments (the active one included).
    pub(crate) fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// Replaces the topic settings in force.
    pub(crate) fn set_config(&mut self, config: LogConfig) {
        self.config = config;
    }

    /// Largest batch this log accepts.
    pub(crate) fn max_message_bytes(&self) -> i32 {
        self.config.max_message_bytes
    }

    /// Appends validated batches (`headers` from [`batch::validate_all`]) after assigning their
    /// offsets in place; returns the base offset of the first.
    pub(crate) fn append(
        &mut self,
        bytes: &mut [u8],
        headers: &mut [(usize, BatchHeader)],
    ) -> Result<i64, StorageError> {
        let now = now_ms();
        let first_offset = self.log_end_offset();
        let mut next = first_offset;
        for (start, header) in headers.iter_mut() {
            batch::assign_offset(&mut bytes[*start..], next);
            header.base_offset = next;
            next = header.last_offset().saturating_add(1);
        }
        let active = self
            .segments
            .last()
            .map(|s| (s.size(), s.created_ms(), s.base_offset()));
        if let Some((size, created, base)) = active {
            let too_big = size + bytes.len() as u64 > self.config.segment_bytes;
            let too_old = now.saturating_sub(created) >= self.config.segment_ms;
            // Relative offsets in the indexes are u32.
            let too_far = next - base > i64::from(u32::MAX);
            if size > 0 && (too_big || too_old || too_far) {
                self.roll(first_offset, now)?;
            }
        }
        let interval = self.config.index_interval_bytes;
        self.active().append(bytes, headers, interval, now)?;
        self.unflushed_records += headers
            .iter()
            .map(|(_, h)| i64::from(h.record_count))
            .sum::<i64>();
        if self.unflushed_records >= self.config.flush_messages
            || self.last_flush.elapsed().as_millis() as i64 >= self.config.flush_ms
        {
            self.flush()?;
        }
        Ok(first_offset)
    }

    fn roll(&mut self, base_offset: i64, now: i64) -> Result<(), StorageError> {
        // The finished segment's data must not be lost to a later crash only if a flush
        // policy asks for it; rolling itself does not fsync (Kafka flushes it asynchronously).
        let segment = Segment::create(&self.dir, base_offset, now)?;
        self.active().seal();
        tracing::debug!(partition = %self.name, base_offset, "rolled a new segment");
        self.segments.push(segment);
        Ok(())
    }

    /// Where to read whole batches from the one containing `offset` (see [`Segment::slice`] for
    /// `min_one`):
    /// `None` when the offset is outside [log start, log end], an empty read at the log end.
    pub(crate) fn read(
        &self,
        offset: i64,
        max_bytes: usize,
        min_one: bool,
    ) -> Result<Option<Read>, StorageError> {
        if offset < self.log_start_offset() || offset > self.log_end_offset() {
            return Ok(None);
        }
        let slot = self.segments.partition_point(|s| s.base_offset() <= offset);
        // The segment holding the offset, or the next non-empty one (an offset can fall in a
        // gap left by a rolled empty segment).
        for segment in self.segments.iter().skip(slot.saturating_sub(1)) {
            if let Some(slice) =
                segment.slice(offset.max(segment.base_offset()), max_bytes, min_one)?
            {
                return Ok(Some(Read::Slice(slice)));
            }
        }
        Ok(Some(Read::Empty))
    }

    /// The earliest record whose timestamp is at or after `timestamp`.
    pub(crate) fn offset_for_timestamp(
        &self,
        timestamp: i64,
    ) -> Result<Option<TimestampOffset>, StorageError> {
        for segment in &self.segments {
            let Some((position, header, batch_bytes)) = segment.batch_for_timestamp(timestamp)?
            else {
                continue;
            };
            // The exact record needs the records themselves, so this rare path decodes one batch
            // (decompressing it if needed); falls back to the batch when that fails.
            let mut buf = batch_bytes;
            let exact = kafka_protocol::records::RecordBatchDecoder::decode(&mut buf)
                .ok()
                .and_then(|set| {
                    set.records
                        .iter()
                        .find(|r| r.timestamp >= timestamp)
                        .map(|r| TimestampOffset {
                            timestamp: r.timestamp,
                            offset: r.offset,
                        })
                });
            if exact.is_none() {
                tracing::debug!(partition = %self.name, position, "could not decode batch for timestamp lookup");
            }
            return Ok(Some(exact.unwrap_or(TimestampOffset {
                timestamp: header.max_timestamp,
                offset: header.base_offset,
            })));
        }
        Ok(None)
    }

    /// Deletes segments that retention no longer keeps; returns how many were deleted.
    pub(crate) fn enforce_retention(&mut self, now: i64) -> Result<usize, StorageError> {
        let mut deleted = 0;
        let mut total = self.size_bytes() as i64;
        while self.segments.len() > 1 {
            let oldest = &self.segments[0];
            let expired = self.config.retention_ms >= 0
                && oldest.max_timestamp() >= 0
                && now - oldest.max_timestamp() > self.config.retention_ms;
            let over_size = self.config.retention_bytes >= 0
                && total - oldest.size() as i64 >= self.config.retention_bytes;
            let empty = oldest.size() == 0;
            if !(expired || over_size || empty) {
                break;
            }
            let segment = self.segments.remove(0);
            total -= segment.size() as i64;
            tracing::info!(
                partition = %self.name,
                segment = %segment::file_name(segment.base_offset(), "log"),
                expired, over_size,
                "deleting segment for retention"
            );
            segment.delete()?;
            deleted += 1;
        }
        Ok(deleted)
    }

    /// Fsyncs when records are waiting and the last fsync is older than `flush.ms`.
    pub(crate) fn flush_if_due(&mut self) -> Result<(), StorageError> {
        if self.unflushed_records > 0
            && self.last_flush.elapsed().as_millis() as i64 >= self.config.flush_ms
        {
            self.flush()?;
        }
        Ok(())
    }

    /// Fsyncs every segment's files.
    pub(crate) fn flush(&mut self) -> Result<(), StorageError> {
        for segment in &self.segments {
            segment.flush()?;
        }
        self.unflushed_records = 0;
        self.last_flush = Instant::now();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BrokerConfig;
    use bytes::Bytes;
    use std::collections::BTreeMap;

    fn config(segment_bytes: u64) -> LogConfig {
        let broker = BrokerConfig {
            log_segment_bytes: segment_bytes,
            log_index_interval_bytes: 100,
            ..Default::default()
        };
        LogConfig::resolve(&broker, &BTreeMap::new()).unwrap()
    }

    fn append(log: &mut PartitionLog, count: i32, ts: i64) -> i64 {
        let mut bytes = batch::tests::make_batch(0, count, ts);
        let mut headers = batch::validate_all(&bytes).unwrap();
        log.append(&mut bytes, &mut headers).unwrap()
    }

    #[test]
    fn reads_back_whole_batches_from_any_offset_across_segments() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = PartitionLog::open(dir.path(), "t-0".into(), config(500), true).unwrap();
        for i in 0..50 {
            assert_eq!(append(&mut log, 3, 1000 + i), i * 3);
        }
        assert!(log.segment_count() > 3);
        assert_eq!(log.log_end_offset(), 150);
        for offset in [0, 1, 2, 3, 77, 149] {
            let bytes = log.read(offset, 1, true).unwrap().unwrap().bytes().unwrap();
            let header = batch::validate(&bytes).unwrap();
            assert_eq!(header.base_offset, offset / 3 * 3);
            assert_eq!(bytes.len(), header.size);
        }
        assert!(
            log.read(150, 100, true)
                .unwrap()
                .unwrap()
                .bytes()
                .unwrap()
                .is_empty()
        );
        assert!(log.read(151, 100, true).unwrap().is_none());
        // Past the response's first batch, a batch larger than the limit is not sent.
        assert!(
            log.read(0, 1, false)
                .unwrap()
                .unwrap()
                .bytes()
                .unwrap()
                .is_empty()
        );
        let several = log.read(0, 300, false).unwrap().unwrap().bytes().unwrap();
        assert!(!several.is_empty() && several.len() <= 300);
        assert_eq!(
            batch::validate_all(&several).unwrap().len() * batch::validate(&several).unwrap().size,
            several.len()
        );
        let found = log.offset_for_timestamp(1020).unwrap().unwrap();
        assert_eq!(found.offset, 60);
        assert!(log.offset_for_timestamp(5000).unwrap().is_none());

        let before: Vec<Bytes> = (0..150)
            .map(|o| log.read(o, 1000, true).unwrap().unwrap().bytes().unwrap())
            .collect();
        let segments = log.segment_count();
        drop(log);

        // Finished segments load from their index files; the same bytes come back.
        let log = PartitionLog::open(dir.path(), "t-0".into(), config(500), true).unwrap();
        assert_eq!(log.log_end_offset(), 150);
        assert_eq!(log.segment_count(), segments);
        for (offset, bytes) in before.iter().enumerate() {
            assert_eq!(
                &log.read(offset as i64, 1000, true)
                    .unwrap()
                    .unwrap()
                    .bytes()
                    .unwrap(),
                bytes
            );
        }
        assert_eq!(log.offset_for_timestamp(1020).unwrap().unwrap().offset, 60);
        drop(log);

        // A garbled index is rebuilt from the log.
        let first_index = dir.path().join(segment::file_name(0, "index"));
        std::fs::write(&first_index, [0xff; 20]).unwrap();
        let mut log = PartitionLog::open(dir.path(), "t-0".into(), config(500), true).unwrap();
        for (offset, bytes) in before.iter().enumerate() {
            assert_eq!(
                &log.read(offset as i64, 1000, true)
                    .unwrap()
                    .unwrap()
                    .bytes()
                    .unwrap(),
                bytes
            );
        }
        assert_ne!(std::fs::read(&first_index).unwrap(), vec![0xff; 20]);

        // Retention sees each finished segment's newest timestamp (all are from 1970).
        assert_eq!(log.enforce_retention(now_ms()).unwrap(), segments - 1);
        assert_eq!(log.segment_count(), 1);
        let start = log.log_start_offset();
        assert!(start > 0);
        assert_eq!(
            &log.read(start, 1000, true)
                .unwrap()
                .unwrap()
                .bytes()
                .unwrap(),
            &before[start as usize]
        );
    }

    #[test]
    fn garbage_segment_files_open_without_panicking_and_the_log_stays_usable() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut noise = |n: usize| -> Vec<u8> {
            (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect()
        };
        for round in 0..40 {
            let dir = tempfile::tempdir().unwrap();
            let mut log_bytes = if round % 2 == 0 {
                batch::tests::make_batch(0, 2, 5)
            } else {
                Vec::new()
            };
            if round % 3 == 0 {
                // A batch claiming an offset near i64::MAX.
                let mut b = batch::tests::make_batch(i64::MAX - 1, 5, 5);
                b[23..27].copy_from_slice(&i32::MAX.to_be_bytes());
                log_bytes.extend(b);
            }
            log_bytes.extend(noise(round * 37));
            for base in [0i64, 1000] {
                std::fs::write(dir.path().join(segment::file_name(base, "log")), &log_bytes)
                    .unwrap();
                std::fs::write(
                    dir.path().join(segment::file_name(base, "index")),
                    noise(round * 8),
                )
                .unwrap();
                std::fs::write(
                    dir.path().join(segment::file_name(base, "timeindex")),
                    noise(round * 12),
                )
                .unwrap();
            }
            for clean in [true, false] {
                let mut log =
                    PartitionLog::open(dir.path(), "g-0".into(), config(500), clean).unwrap();
                let end = log.log_end_offset();
                let _ = log.read(0, 1000, true).unwrap();
                let _ = log.offset_for_timestamp(0).unwrap();
                if end < i64::MAX - 10 {
                    let next = append(&mut log, 1, 7);
                    assert_eq!(next, end);
                }
                for base in [0i64, 1000] {
                    for ext in ["log", "index", "timeindex"] {
                        let mut out = Vec::new();
                        let _ = crate::dump_segment_file(
                            &dir.path().join(segment::file_name(base, ext)),
                            true,
                            &mut out,
                        );
                    }
                }
            }
        }
    }
}
