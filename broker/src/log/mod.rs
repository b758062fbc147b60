//! The partition log, laid out on disk as Apache Kafka lays it out.
//!
//! ```text
//! <data_dir>/<topic>-<partition>/
//!     00000000000000000000.log         record batches, appended as received
//!     00000000000000000000.index       sparse offset index
//!     00000000000000000000.timeindex   sparse time index
//!     00000000000000000000.txnindex    aborted transactions (only once there is one)
//!     00000000000000052311.log         next segment, named by its base offset
//!     00000000000000052311.snapshot    producer state as of that offset
//!     ...
//! ```
//!
//! | file         | entry                                          | size      |
//! |--------------|------------------------------------------------|-----------|
//! | `.log`       | record batch v2 (see [`batch`]), back to back  | any       |
//! | `.index`     | relative offset u32 BE, file position u32 BE   | 8 bytes   |
//! | `.timeindex` | max timestamp so far i64 BE, relative offset u32 BE | 12 bytes |
//! | `.txnindex`  | an aborted transaction (see `txn_index`)       | 34 bytes  |
//! | `.snapshot`  | every producer's state (see `producers`)       | any       |
//!
//! Idempotent and transactional producers: each partition keeps its producers' state
//! (`producers`), checks every batch of an idempotent producer against it (retries are
//! acknowledged without a second append) and tracks open transactions, whose oldest first
//! offset is the last stable offset. Transaction markers are control batches (`control`)
//! appended by the transaction coordinator. The state is snapshotted when a segment rolls and
//! on clean shutdown (the two newest snapshots are kept); on open the newest snapshot not past
//! the log end is loaded and the batches after it replayed, which also restores `.txnindex`
//! entries a crash lost.
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
//!   `retention.bytes`. The log start offset is the base offset of the oldest segment left,
//!   or the offset DeleteRecords moved it to inside that segment (`log-start-offset`, see
//!   `log_start`), whichever is larger.
//! - When a segment stops being the active one, its newest timestamp is appended to its time
//!   index, so the last time index entry of a finished segment is its newest timestamp.
//! - Writes go to the page cache; `flush.messages`/`flush.ms` add fsyncs, and a rolled segment
//!   is fsynced in the background (`sync_finished_segments`, every second). The **recovery
//!   point** (`recovery-point`, not itself fsynced: an older one only means more checking) is
//!   the offset before which everything was fsynced.
//! - On open the active segment is read batch by batch (length and CRC); after a crash so is
//!   every segment reaching past the recovery point. Damage (see [`scan`]) is skipped up to the
//!   next intact batch and kept; only a torn tail (bytes at the end that are no whole batch
//!   and hold no offset a later segment has) is truncated. Indexes are rebuilt. Other finished
//!   segments load from their index files; one whose indexes are missing or do not fit its log
//!   is read batch by batch (headers only) to rebuild them.
//! - Damaged ranges are reported once when found (by recovery, a read that meets a bad header,
//!   or the scrubber); reads of their offsets get [`StorageError::Damaged`], reads before them
//!   stop at them, and the batches after them are served.

pub(crate) mod batch;
pub(crate) mod cleaner;
pub(crate) mod control;
mod log_start;
mod producers;
pub(crate) mod scan;
mod segment;
mod txn_index;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::topic_config::LogConfig;
use batch::{BatchError, BatchHeader};
use control::Marker;
pub(crate) use producers::{ActiveProducer, ProducerError};
use producers::{Check, ProducerStates};
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
    /// A read asked for offsets whose batches are damaged (known, and reported once when found).
    #[error(
        "{path} is damaged from byte {position} to {end}: offsets {first_offset} to {last_offset} \
         cannot be read"
    )]
    Damaged {
        /// The segment file.
        path: PathBuf,
        /// Where the damaged bytes start.
        position: u64,
        /// Where the next intact batch starts.
        end: u64,
        /// The first offset lost.
        first_offset: i64,
        /// The last offset lost.
        last_offset: i64,
    },
}

/// Why an append was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AppendError {
    /// The producer state refuses the batch.
    #[error(transparent)]
    Producer(#[from] ProducerError),
    /// The log could not be written.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// A segment file to fsync, and its path.
pub(crate) type SyncHandle = (PathBuf, fs::File);

/// Finished segments fsynced at a time by [`sync_finished_segments`].
const SYNC_BATCH: usize = 16;

/// Producer state snapshots kept per partition (older ones are deleted).
const SNAPSHOTS_KEPT: usize = 2;

/// A closure turning an I/O error into a [`StorageError`] naming `path` and what was done.
pub(crate) fn io_err(
    path: &Path,
    action: &'static str,
) -> impl FnOnce(std::io::Error) -> StorageError {
    let path = path.to_path_buf();
    move |source| StorageError::Io {
        path,
        action,
        source,
    }
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
    producers: ProducerStates,
    /// Producer states forgotten past `max_producer_ids_per_partition`, not yet counted.
    forgotten_producers: u64,
    /// Offset below which everything was fsynced (persisted in [`RECOVERY_POINT_FILE`]): after
    /// a crash, the segments reaching past it have every batch's CRC checked.
    recovery_point: i64,
    /// What compaction did (see [`cleaner`]), and where its last pass ended: the dirty part
    /// starts there.
    cleaner: cleaner::CleanerStats,
    /// The start DeleteRecords moved the log to (see [`log_start`]), 0 when it never did: the
    /// log start offset is the larger of it and the oldest segment's base offset.
    log_start: i64,
}

/// The file in a partition's directory holding its recovery point, as a decimal offset.
pub(crate) const RECOVERY_POINT_FILE: &str = "recovery-point";

/// A finished segment to scrub: its file, read without holding the partition.
pub(crate) struct ScrubTarget {
    pub(crate) base_offset: i64,
    pub(crate) next_offset: i64,
    pub(crate) path: PathBuf,
    pub(crate) file: std::sync::Arc<fs::File>,
    pub(crate) len: u64,
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
        // A compaction pass a stop interrupted is finished or undone before the segments open.
        cleaner::recover(dir, &name)?;
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
        let recorded_point = read_recovery_point(dir);
        // After a clean shutdown everything was fsynced, whatever the file says.
        let recovery_point = if clean_shutdown {
            i64::MAX
        } else {
            recorded_point
        };
        let interval = config.index_interval_bytes;
        let mut segments = Vec::with_capacity(bases.len().max(1));
        for (i, base) in bases.iter().enumerate() {
            // The active segment is read batch by batch with CRCs; after a crash, so is every
            // segment past the recovery point (what may not have reached the disk whole).
            let (segment, recovery) = match bases.get(i + 1) {
                None => Segment::open(dir, *base, true, interval, now, None)?,
                Some(next) if *next <= recovery_point => {
                    Segment::load(dir, *base, *next, interval, now)?
                }
                Some(next) => Segment::open(dir, *base, true, interval, now, Some(*next))?,
            };
            for damage in segment.damaged() {
                report_damage(&name, segment.log_path(), damage, "recovery");
            }
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
        let mut log = PartitionLog {
            name,
            dir: dir.to_path_buf(),
            segments,
            config,
            unflushed_records: 0,
            last_flush: Instant::now(),
            producers: ProducerStates::default(),
            forgotten_producers: 0,
            recovery_point: recorded_point,
            cleaner: cleaner::CleanerStats {
                checkpoint: cleaner::read_checkpoint(dir),
                ..Default::default()
            },
            log_start: 0,
        };
        log.log_start = log_start::read(dir).min(log.log_end_offset());
        log.recover_producers()?;
        Ok(log)
    }

    /// Damaged ranges known and their bytes, over every segment.
    pub(crate) fn damage_summary(&self) -> (usize, u64) {
        self.segments
            .iter()
            .flat_map(Segment::damaged)
            .fold((0, 0), |(n, bytes), d| (n + 1, bytes + d.len()))
    }

    /// The finished segments, to scrub (the active one is checked on open and written to).
    pub(crate) fn scrub_targets(&self) -> Vec<ScrubTarget> {
        let finished = self.segments.len().saturating_sub(1);
        self.segments[..finished]
            .iter()
            .filter_map(|s| match s.log_file() {
                Ok(file) => Some(ScrubTarget {
                    base_offset: s.base_offset(),
                    next_offset: s.next_offset(),
                    path: s.log_path().to_path_buf(),
                    file,
                    len: s.size(),
                }),
                Err(e) => {
                    tracing::warn!(partition = %self.name, error = %e, "cannot open a segment to scrub it");
                    None
                }
            })
            .collect()
    }

    /// Records damage a scrub found in the segment starting at `base_offset` (if it is still
    /// there), reporting what was not known.
    pub(crate) fn add_damage(&mut self, base_offset: i64, found: Vec<scan::Damage>) {
        let Some(segment) = self
            .segments
            .iter_mut()
            .find(|s| s.base_offset() == base_offset)
        else {
            return;
        };
        for damage in found {
            let report = damage.clone();
            if segment.add_damage(damage) {
                report_damage(&self.name, segment.log_path(), &report, "scrub");
            }
        }
    }

    /// After a read met bytes that are not a batch at `position` of `path`: finds the damage
    /// there (checking CRCs from the segment's start) and records it; false when none is found.
    fn find_damage(&mut self, path: &Path, position: u64) -> Result<bool, StorageError> {
        let Some(segment) = self.segments.iter_mut().find(|s| s.log_path() == path) else {
            return Ok(false);
        };
        let found = segment.find_damage(position)?;
        let mut added = false;
        for damage in found {
            let report = damage.clone();
            if segment.add_damage(damage) {
                report_damage(&self.name, segment.log_path(), &report, "read");
                added = true;
            }
        }
        Ok(added)
    }

    /// The snapshot files in the directory, by offset, oldest first.
    fn snapshots(&self) -> Result<Vec<(i64, PathBuf)>, StorageError> {
        let entries = fs::read_dir(&self.dir).map_err(|source| StorageError::Io {
            path: self.dir.clone(),
            action: "list",
            source,
        })?;
        let mut found: Vec<(i64, PathBuf)> = entries
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name();
                let offset = name.to_str()?.strip_suffix(".snapshot")?.parse().ok()?;
                Some((offset, entry.path()))
            })
            .collect();
        found.sort_unstable();
        Ok(found)
    }

    /// Rebuilds the producer state: the newest snapshot not past the log end, then every
    /// batch after it (re-adding abort markers the `.txnindex` files lost to a crash).
    fn recover_producers(&mut self) -> Result<(), StorageError> {
        let end = self.log_end_offset();
        let mut from = self.log_start_offset();
        let mut states = ProducerStates::default();
        for (offset, path) in self.snapshots()?.into_iter().rev() {
            let loaded = (offset <= end)
                .then(|| fs::read(&path).ok())
                .flatten()
                .and_then(|bytes| ProducerStates::decode(&bytes));
            match loaded {
                Some(loaded) => {
                    states = loaded;
                    from = from.max(offset);
                    break;
                }
                None => {
                    tracing::warn!(partition = %self.name, snapshot = %path.display(), "ignoring a producer state snapshot past the log end or damaged");
                    let _ = fs::remove_file(&path);
                }
            }
        }
        let mut replayed = 0usize;
        for segment in &mut self.segments {
            if segment.next_offset() <= from {
                continue;
            }
            // Headers first, applied once the walk went through: a bad header no walk met yet
            // (a segment loaded from its indexes) is found with CRCs, then walked around.
            let mut batches = Vec::new();
            let mut walked = segment.for_each_batch(from, |h, m| batches.push((*h, m)));
            if let Err(StorageError::Corrupt { .. }) = walked {
                for damage in segment.find_damage(u64::MAX)? {
                    let report = damage.clone();
                    if segment.add_damage(damage) {
                        report_damage(&self.name, segment.log_path(), &report, "recovery");
                    }
                }
                batches.clear();
                walked = segment.for_each_batch(from, |h, m| batches.push((*h, m)));
            }
            walked?;
            let mut aborted = Vec::new();
            for (header, marker) in batches {
                let header = &header;
                if header.producer_id < 0 || header.last_offset() < from {
                    continue;
                }
                replayed += 1;
                match (header.is_control(), marker) {
                    (false, _) => states.record(header),
                    (true, Some(marker)) => aborted.extend(states.apply_marker(
                        header.producer_id,
                        header.producer_epoch,
                        marker,
                        header.base_offset,
                        header.max_timestamp,
                    )),
                    (true, None) => {}
                }
            }
            for entry in aborted {
                segment.add_aborted(entry)?;
            }
        }
        if replayed > 0 {
            tracing::info!(partition = %self.name, from, batches = replayed, producers = states.len(), "rebuilt the producer state from the log");
        }
        self.producers = states;
        Ok(())
    }

    /// Writes the producer state as of the log end to `<log end>.snapshot` (fsynced, then
    /// renamed into place) and deletes all but the newest snapshots.
    pub(crate) fn write_snapshot(&mut self) -> Result<(), StorageError> {
        let offset = self.log_end_offset();
        let path = self.dir.join(segment::file_name(offset, "snapshot"));
        let tmp = path.with_extension("snapshot.tmp");
        let io = io_err;
        // The snapshot stands for everything before it: the aborted transactions recorded so
        // far must be on disk before it is (earlier segments' were synced by earlier snapshots).
        self.active().flush_txn_index()?;
        let bytes = self.producers.encode();
        let file = fs::File::create(&tmp).map_err(io(&tmp, "create"))?;
        std::io::Write::write_all(&mut &file, &bytes).map_err(io(&tmp, "write"))?;
        file.sync_data().map_err(io(&tmp, "fsync"))?;
        fs::rename(&tmp, &path).map_err(io(&path, "rename into place"))?;
        let snapshots = self.snapshots()?;
        let start = self.log_start_offset();
        for (i, (at, old)) in snapshots.iter().enumerate() {
            if i + SNAPSHOTS_KEPT < snapshots.len() || (*at < start && *at != offset) {
                let _ = fs::remove_file(old);
            }
        }
        Ok(())
    }

    fn active(&mut self) -> &mut Segment {
        let last = self.segments.len() - 1;
        &mut self.segments[last]
    }

    /// First offset still readable: the oldest segment's base offset, or the start
    /// DeleteRecords moved the log to when that is past it.
    pub(crate) fn log_start_offset(&self) -> i64 {
        self.segments
            .first()
            .map_or(0, Segment::base_offset)
            .max(self.log_start)
    }

    /// Offset the next appended record will get (also the high watermark: one replica).
    pub(crate) fn log_end_offset(&self) -> i64 {
        self.segments.last().map_or(0, Segment::next_offset)
    }

    /// The producers this partition knows.
    pub(crate) fn active_producers(&self) -> Vec<ActiveProducer> {
        self.producers.active()
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

    /// The topic settings in force.
    pub(crate) fn config(&self) -> &LogConfig {
        &self.config
    }

    /// Largest batch this log accepts.
    /// Whether `cleanup.policy` includes `compact`: such a topic refuses keyless records.
    pub(crate) fn compacted(&self) -> bool {
        self.config.cleanup_policy.compact
    }

    pub(crate) fn max_message_bytes(&self) -> i32 {
        self.config.max_message_bytes
    }

    /// The last stable offset: the first offset of the oldest open transaction, or the log end.
    /// read_committed consumers read up to it.
    pub(crate) fn last_stable_offset(&self) -> i64 {
        self.producers
            .first_unstable_offset()
            .unwrap_or_else(|| self.log_end_offset())
    }

    /// The aborted transactions a read_committed consumer needs to drop the records of, when
    /// reading from `from` up to `upper`: (producer id, first offset), in marker order.
    pub(crate) fn aborted_transactions(&self, from: i64, upper: i64) -> Vec<(i64, i64)> {
        self.segments
            .iter()
            .filter(|s| s.next_offset() > from)
            .flat_map(|s| s.aborted())
            .filter(|a| a.last_offset >= from && a.first_offset < upper)
            .map(|a| (a.producer_id, a.first_offset))
            .collect()
    }

    /// Appends a client's validated batches (`headers` from [`batch::validate_all`]) after
    /// assigning their offsets in place; returns the base offset of the first. A batch of an
    /// idempotent producer is checked against its producer state first (it must come alone):
    /// a retry of a batch already in the log is not appended again, and the original's base
    /// offset is returned.
    pub(crate) fn append(
        &mut self,
        bytes: &mut [u8],
        headers: &mut [(usize, BatchHeader)],
    ) -> Result<i64, AppendError> {
        if headers
            .iter()
            .any(|(_, h)| h.producer_id >= 0 || h.is_control())
        {
            if headers.len() != 1 {
                return Err(ProducerError::SeveralBatches(headers.len()).into());
            }
            if let Check::Duplicate { base_offset } = self.producers.check(&headers[0].1)? {
                tracing::debug!(partition = %self.name, producer_id = headers[0].1.producer_id, base_offset, "acknowledged a retried batch without appending it");
                return Ok(base_offset);
            }
        }
        let first = self.append_batches(bytes, headers)?;
        for (_, header) in headers.iter() {
            if header.producer_id >= 0 {
                self.producers.record(header);
            }
        }
        let forgotten = self.producers.bound(self.config.max_producer_ids);
        if forgotten > 0 {
            self.forgotten_producers += forgotten as u64;
        }
        Ok(first)
    }

    /// Producer states forgotten since the last call because the partition held more than
    /// `max_producer_ids_per_partition`.
    pub(crate) fn take_forgotten_producers(&mut self) -> u64 {
        std::mem::take(&mut self.forgotten_producers)
    }

    /// Appends a transaction marker (COMMIT or ABORT control batch) for the producer; returns
    /// its offset. Refused when the partition saw a newer epoch of the producer.
    pub(crate) fn append_marker(
        &mut self,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
    ) -> Result<i64, AppendError> {
        self.producers.check_marker(producer_id, producer_epoch)?;
        let marker = Marker {
            commit,
            coordinator_epoch,
        };
        let now = now_ms();
        let mut bytes = control::marker_batch(producer_id, producer_epoch, marker, now);
        let header = batch::parse_header(&bytes).map_err(|source| StorageError::Corrupt {
            path: self.dir.clone(),
            position: 0,
            source,
        })?;
        let mut headers = [(0, header)];
        let offset = self.append_batches(&mut bytes, &mut headers)?;
        if let Some(aborted) =
            self.producers
                .apply_marker(producer_id, producer_epoch, marker, offset, now)
            && let Err(e) = self.active().add_aborted(aborted)
        {
            // The marker is in the log: replaying it after a restart restores the entry.
            tracing::error!(partition = %self.name, error = %e, "cannot record an aborted transaction in the transaction index");
        }
        Ok(offset)
    }

    /// Assigns offsets to validated batches and writes them.
    fn append_batches(
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
        // The producer state as of the new segment's start, so a restart replays only it.
        if let Err(e) = self.write_snapshot() {
            tracing::warn!(partition = %self.name, error = %e, "cannot write a producer state snapshot");
        }
        tracing::info!(partition = %self.name, base_offset, "rolled a new segment");
        self.segments.push(segment);
        Ok(())
    }

    /// Where to read whole batches from the one containing `offset`, stopping before `upper`
    /// (the log end, or the last stable offset for read_committed; see [`Segment::slice`] for
    /// `min_one`): `None` when the offset is outside [log start, log end], an empty read at
    /// `upper` or after it.
    #[cfg(test)]
    pub(crate) fn read(
        &self,
        offset: i64,
        max_bytes: usize,
        min_one: bool,
        upper: i64,
    ) -> Result<Option<Read>, StorageError> {
        self.read_known(offset, max_bytes, min_one, upper)
    }

    /// Reads as [`PartitionLog::read`] does; when the read meets bytes that are not a batch,
    /// finds and records the damage there (see [`scan`]) and reads again: offsets in damage get
    /// [`StorageError::Damaged`], and a read before it stops at it.
    pub(crate) fn read_checked(
        &mut self,
        offset: i64,
        max_bytes: usize,
        min_one: bool,
        upper: i64,
    ) -> Result<Option<Read>, StorageError> {
        loop {
            match self.read_known(offset, max_bytes, min_one, upper) {
                Err(StorageError::Corrupt {
                    path,
                    position,
                    source,
                }) => {
                    if !self.find_damage(&path, position)? {
                        return Err(StorageError::Corrupt {
                            path,
                            position,
                            source,
                        });
                    }
                }
                other => return other,
            }
        }
    }

    /// A read that stops at the damage known, and fails on any it meets.
    fn read_known(
        &self,
        offset: i64,
        max_bytes: usize,
        min_one: bool,
        upper: i64,
    ) -> Result<Option<Read>, StorageError> {
        if offset < self.log_start_offset() || offset > self.log_end_offset() {
            return Ok(None);
        }
        if offset >= upper {
            return Ok(Some(Read::Empty));
        }
        let slot = self.segments.partition_point(|s| s.base_offset() <= offset);
        // The segment holding the offset, or the next non-empty one (an offset can fall in a
        // gap left by a rolled empty segment).
        for segment in self.segments.iter().skip(slot.saturating_sub(1)) {
            if segment.base_offset() >= upper {
                break;
            }
            if let Some(slice) =
                segment.slice(offset.max(segment.base_offset()), max_bytes, min_one, upper)?
            {
                return Ok(Some(Read::Slice(slice)));
            }
        }
        Ok(Some(Read::Empty))
    }

    /// The largest timestamp of any record (by the batches' max timestamps); `None` when empty.
    pub(crate) fn max_timestamp(&self) -> Option<i64> {
        self.segments
            .iter()
            .filter(|s| s.size() > 0)
            .map(Segment::max_timestamp)
            .max()
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
            let exact = batch::decode_records(&batch_bytes).and_then(|records| {
                records
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
        let expired = self
            .producers
            .expire(now, self.config.producer_id_expiration_ms);
        if expired > 0 {
            tracing::debug!(partition = %self.name, expired, "forgot idle producers");
        }
        let mut deleted = 0;
        let mut total = self.size_bytes() as i64;
        while self.segments.len() > 1 {
            let oldest = &self.segments[0];
            // A compacted topic without `delete` in its policy keeps its segments: the
            // latest value of every key must stay readable.
            let deletes = self.config.cleanup_policy.delete;
            let expired = deletes
                && self.config.retention_ms >= 0
                && oldest.max_timestamp() >= 0
                && now - oldest.max_timestamp() > self.config.retention_ms;
            let over_size = deletes
                && self.config.retention_bytes >= 0
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

    /// Closes the files of the segments not read or written for `idle` (they open again when
    /// next needed); returns how many segments it closed.
    pub(crate) fn close_idle_files(&mut self, idle: std::time::Duration) -> usize {
        self.segments
            .iter_mut()
            .filter_map(|segment| segment.close_if_idle(idle).then_some(()))
            .count()
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

    /// The files of the finished segments not yet fsynced, to fsync without holding the
    /// partition, and the recovery point they make once they are (the active segment's base
    /// offset); `None` when there are none. Kafka flushes a rolled segment the same way, so
    /// that a crash recovery checks little more than the active segment.
    pub(crate) fn unsynced_segments(&self) -> Result<Option<(Vec<SyncHandle>, i64)>, StorageError> {
        let mut files = Vec::new();
        let mut point = self.recovery_point;
        for pair in self.segments.windows(2) {
            if pair[0].next_offset() <= self.recovery_point {
                continue;
            }
            // A bounded number of open handles at once; the next look goes on from here.
            if files.len() >= SYNC_BATCH * 3 {
                break;
            }
            files.extend(pair[0].sync_handles()?);
            point = pair[1].base_offset();
        }
        Ok((point > self.recovery_point).then_some((files, point)))
    }

    /// Fsyncs every segment's files.
    pub(crate) fn flush(&mut self) -> Result<(), StorageError> {
        for segment in &self.segments {
            segment.flush()?;
        }
        self.unflushed_records = 0;
        self.last_flush = Instant::now();
        self.advance_recovery_point(self.log_end_offset());
        Ok(())
    }

    /// Records that everything before `end` is on disk (it was fsynced), unless the recovery
    /// point is already there or past it.
    pub(crate) fn advance_recovery_point(&mut self, end: i64) {
        if end > self.recovery_point {
            // Not fsynced itself: a recovery point lost to a crash is an older one, which only
            // makes the next recovery check more.
            let path = self.dir.join(RECOVERY_POINT_FILE);
            let tmp = path.with_extension("tmp");
            let written =
                fs::write(&tmp, format!("{end}\n")).and_then(|()| fs::rename(&tmp, &path));
            match written {
                Ok(()) => self.recovery_point = end,
                Err(e) => {
                    tracing::warn!(partition = %self.name, path = %path.display(), error = %e, "cannot record the recovery point")
                }
            }
        }
    }
}

/// Fsyncs the finished segments of a partition that are not yet, holding the partition (`lock`)
/// only to find them and then to move its recovery point past them.
pub(crate) fn sync_finished_segments<G>(lock: impl Fn() -> G) -> Result<(), StorageError>
where
    G: std::ops::DerefMut<Target = PartitionLog>,
{
    let Some((files, point)) = lock().unsynced_segments()? else {
        return Ok(());
    };
    for (path, file) in files {
        file.sync_data().map_err(|source| StorageError::Io {
            path,
            action: "fsync",
            source,
        })?;
    }
    lock().advance_recovery_point(point);
    Ok(())
}

/// The recovery point recorded in `dir`; 0 (check everything) when missing or unreadable.
fn read_recovery_point(dir: &Path) -> i64 {
    fs::read_to_string(dir.join(RECOVERY_POINT_FILE))
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(0)
}

/// Reports damage once, where it was found: the partition, the file, the bytes and the
/// offsets lost.
fn report_damage(partition: &str, path: &Path, damage: &scan::Damage, found_by: &str) {
    let (topic, index) = partition.rsplit_once('-').unwrap_or((partition, ""));
    let lost = if damage.next_offset > damage.first_offset {
        format!(
            "offsets {} to {} cannot be read (fetches get CORRUPT_MESSAGE)",
            damage.first_offset,
            damage.last_offset()
        )
    } else {
        "no offsets are lost with them".to_owned()
    };
    tracing::error!(
        topic = %topic,
        partition = %index,
        file = %path.display(),
        position = damage.position,
        end = damage.end,
        first_offset = damage.first_offset,
        last_offset = damage.last_offset(),
        reason = %damage.reason,
        found_by = %found_by,
        "damaged record batches: {lost}; the intact batches after them are served; \
         `agent log-repair` removes them",
    );
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

    /// The offsets a fetched range spans, for the consumer traffic counters, whichever way the
    /// range ends: at its first batch, in the middle of the segment, at the segment's end, at
    /// the upper bound.
    #[test]
    fn a_read_range_knows_how_many_offsets_it_spans() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = PartitionLog::open(dir.path(), "t-0".into(), config(1 << 20), true).unwrap();
        for i in 0..10 {
            append(&mut log, 3, 1000 + i);
        }
        let size = log.size_bytes() as usize / 10;
        let spans = |offset, max_bytes, upper| match log.read(offset, max_bytes, true, upper) {
            Ok(Some(Read::Slice(slice))) => (slice.len() / size, slice.offsets()),
            _ => panic!("nothing at {offset}"),
        };
        assert_eq!(spans(0, 1, i64::MAX), (1, 3), "the first batch alone");
        assert_eq!(
            spans(4, size * 3, i64::MAX),
            (3, 9),
            "three batches mid-segment"
        );
        assert_eq!(
            spans(3, usize::MAX, i64::MAX),
            (9, 27),
            "to the segment's end"
        );
        assert_eq!(spans(0, usize::MAX, 15), (5, 15), "to the upper bound");
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
            let bytes = log
                .read(offset, 1, true, i64::MAX)
                .unwrap()
                .unwrap()
                .bytes()
                .unwrap();
            let header = batch::validate(&bytes).unwrap();
            assert_eq!(header.base_offset, offset / 3 * 3);
            assert_eq!(bytes.len(), header.size);
        }
        assert!(
            log.read(150, 100, true, i64::MAX)
                .unwrap()
                .unwrap()
                .bytes()
                .unwrap()
                .is_empty()
        );
        assert!(log.read(151, 100, true, i64::MAX).unwrap().is_none());
        // Past the response's first batch, a batch larger than the limit is not sent.
        assert!(
            log.read(0, 1, false, i64::MAX)
                .unwrap()
                .unwrap()
                .bytes()
                .unwrap()
                .is_empty()
        );
        let several = log
            .read(0, 300, false, i64::MAX)
            .unwrap()
            .unwrap()
            .bytes()
            .unwrap();
        assert!(!several.is_empty() && several.len() <= 300);
        assert_eq!(
            batch::validate_all(&several).unwrap().len() * batch::validate(&several).unwrap().size,
            several.len()
        );
        let found = log.offset_for_timestamp(1020).unwrap().unwrap();
        assert_eq!(found.offset, 60);
        assert!(log.offset_for_timestamp(5000).unwrap().is_none());

        let before: Vec<Bytes> = (0..150)
            .map(|o| {
                log.read(o, 1000, true, i64::MAX)
                    .unwrap()
                    .unwrap()
                    .bytes()
                    .unwrap()
            })
            .collect();
        let segments = log.segment_count();
        drop(log);

        // Finished segments load from their index files; the same bytes come back.
        let log = PartitionLog::open(dir.path(), "t-0".into(), config(500), true).unwrap();
        assert_eq!(log.log_end_offset(), 150);
        assert_eq!(log.segment_count(), segments);
        for (offset, bytes) in before.iter().enumerate() {
            assert_eq!(
                &log.read(offset as i64, 1000, true, i64::MAX)
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
                &log.read(offset as i64, 1000, true, i64::MAX)
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
            &log.read(start, 1000, true, i64::MAX)
                .unwrap()
                .unwrap()
                .bytes()
                .unwrap(),
            &before[start as usize]
        );
    }

    fn log_bases(dir: &Path) -> Vec<i64> {
        let mut bases: Vec<i64> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_suffix(".log")?.parse().ok())
            .collect();
        bases.sort_unstable();
        bases
    }

    fn produce(
        log: &mut PartitionLog,
        pid: i64,
        epoch: i16,
        seq: i32,
        count: i32,
        txn: bool,
    ) -> Result<i64, AppendError> {
        let mut bytes = batch::tests::make_producer_batch(pid, epoch, seq, count, txn);
        let mut headers = batch::validate_all(&bytes).unwrap();
        log.append(&mut bytes, &mut headers)
    }

    fn committed_offsets(log: &PartitionLog, from: i64) -> Vec<i64> {
        // What a read_committed consumer keeps: records up to the LSO, minus aborted ones.
        let upper = log.last_stable_offset();
        let aborted = log.aborted_transactions(from, upper);
        let Some(Read::Slice(slice)) = log.read(from, 1 << 20, true, upper).unwrap() else {
            return Vec::new();
        };
        let mut bytes = slice.read().unwrap();
        let mut out = Vec::new();
        let mut open_aborts: Vec<(i64, i64)> = aborted.clone();
        while !bytes.is_empty() {
            let header = batch::validate(&bytes).unwrap();
            let this = bytes.split_to(header.size);
            if header.is_control() {
                open_aborts.retain(|(pid, _)| *pid != header.producer_id);
                let _ = this;
                continue;
            }
            let dropped = header.is_transactional()
                && open_aborts
                    .iter()
                    .any(|(pid, first)| *pid == header.producer_id && *first <= header.base_offset);
            if !dropped {
                out.extend(header.base_offset..=header.last_offset());
            }
        }
        out
    }

    #[test]
    fn idempotent_retries_are_not_appended_twice_even_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        for clean in [true, false] {
            let _ = std::fs::remove_dir_all(dir.path());
            let mut log = PartitionLog::open(dir.path(), "p-0".into(), config(400), true).unwrap();
            let mut offsets = Vec::new();
            for i in 0..30 {
                offsets.push(produce(&mut log, 5, 0, i * 2, 2, false).unwrap());
            }
            assert!(log.segment_count() > 3);
            assert_eq!(produce(&mut log, 5, 0, 58, 2, false).unwrap(), offsets[29]);
            assert!(matches!(
                produce(&mut log, 5, 0, 70, 2, false),
                Err(AppendError::Producer(
                    ProducerError::OutOfOrderSequence { .. }
                ))
            ));
            if clean {
                log.flush().unwrap();
                log.write_snapshot().unwrap();
            }
            let end = log.log_end_offset();
            drop(log);
            // A torn write after the last batch: recovery cuts it and replays from a snapshot.
            let mut log = PartitionLog::open(dir.path(), "p-0".into(), config(400), clean).unwrap();
            assert_eq!(log.log_end_offset(), end);
            for (i, offset) in offsets.iter().enumerate().skip(25) {
                assert_eq!(
                    produce(&mut log, 5, 0, i as i32 * 2, 2, false).unwrap(),
                    *offset
                );
            }
            assert_eq!(produce(&mut log, 5, 0, 60, 2, false).unwrap(), end);
            assert!(matches!(
                produce(&mut log, 5, 0, 0, 2, false),
                Err(AppendError::Producer(
                    ProducerError::OutOfOrderSequence { .. }
                ))
            ));
            let snapshots = log.snapshots().unwrap();
            assert!(snapshots.len() <= SNAPSHOTS_KEPT, "{snapshots:?}");
        }
    }

    #[test]
    fn retention_deletes_no_segment_of_a_compacted_topic_unless_its_policy_says_delete() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config(300);
        config.retention_ms = 1;
        config.cleanup_policy = crate::topic_config::CleanupPolicy {
            compact: true,
            delete: false,
        };
        let mut log = PartitionLog::open(dir.path(), "t-0".into(), config.clone(), true).unwrap();
        for _ in 0..10 {
            append(&mut log, 3, 1_000);
        }
        let segments = log.segment_count();
        assert!(segments > 2);
        // Every segment is from 1970: far past retention.ms, yet compact alone keeps them.
        assert_eq!(log.enforce_retention(now_ms()).unwrap(), 0);
        assert_eq!(log.segment_count(), segments);
        config.cleanup_policy.delete = true;
        log.set_config(config);
        assert_eq!(log.enforce_retention(now_ms()).unwrap(), segments - 1);
    }

    #[test]
    fn read_committed_stops_at_the_open_transaction_and_skips_aborted_ones() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = PartitionLog::open(dir.path(), "t-0".into(), config(300), true).unwrap();
        // Producer 1 commits 0..4; producer 2 aborts 4..6 (interleaved); producer 3 stays open.
        produce(&mut log, 1, 0, 0, 2, true).unwrap();
        produce(&mut log, 2, 0, 0, 2, true).unwrap();
        produce(&mut log, 1, 0, 2, 2, true).unwrap();
        assert_eq!(log.last_stable_offset(), 0);
        assert_eq!(committed_offsets(&log, 0), Vec::<i64>::new());
        assert_eq!(log.append_marker(1, 0, true, 0).unwrap(), 6);
        assert_eq!(log.last_stable_offset(), 2);
        assert_eq!(committed_offsets(&log, 0), vec![0, 1]);
        produce(&mut log, 3, 0, 0, 3, true).unwrap();
        // A fencing abort with a bumped epoch.
        assert_eq!(log.append_marker(2, 1, false, 0).unwrap(), 10);
        assert_eq!(log.last_stable_offset(), 7);
        assert_eq!(committed_offsets(&log, 0), vec![0, 1, 4, 5]);
        assert_eq!(log.aborted_transactions(0, 7), vec![(2, 2)]);
        assert_eq!(log.aborted_transactions(11, 20), vec![]);
        assert!(matches!(
            produce(&mut log, 2, 0, 2, 1, true),
            Err(AppendError::Producer(
                ProducerError::InvalidProducerEpoch { .. }
            ))
        ));
        assert!(log.append_marker(2, 0, false, 0).is_err());
        let snapshot_at = log.log_end_offset();
        log.write_snapshot().unwrap();
        // After the snapshot: another abort, in a later segment.
        for seq in 3..40 {
            produce(&mut log, 3, 0, seq, 1, true).unwrap();
        }
        let abort_at = log.append_marker(3, 0, false, 0).unwrap();
        assert!(abort_at > snapshot_at);
        let end = log.log_end_offset();
        assert_eq!(log.last_stable_offset(), end);
        let expected = committed_offsets(&log, 0);
        assert_eq!(expected, vec![0, 1, 4, 5]);
        drop(log);
        // A crash that lost the active segment's transaction index: replay restores it.
        let active_base = log_bases(dir.path()).pop().unwrap();
        assert!(abort_at >= active_base);
        std::fs::remove_file(dir.path().join(segment::file_name(active_base, "txnindex"))).unwrap();
        let mut log = PartitionLog::open(dir.path(), "t-0".into(), config(300), false).unwrap();
        assert_eq!(log.last_stable_offset(), end);
        assert_eq!(committed_offsets(&log, 0), expected);
        assert_eq!(log.aborted_transactions(0, end).len(), 2);
        // Producer 3 goes on after its sequence, in a new transaction.
        assert!(produce(&mut log, 3, 0, 20, 1, true).is_err());
        assert!(produce(&mut log, 3, 0, 40, 1, true).is_ok());
        assert_eq!(log.append_marker(3, 0, true, 0).unwrap(), end + 1);
        // The deduplication state came back too.
        assert_eq!(produce(&mut log, 1, 0, 2, 2, true).unwrap(), 4);
    }

    /// Positions and base offsets of the batches of a segment file.
    fn batches_of(path: &Path) -> Vec<(usize, i64, usize)> {
        let bytes = std::fs::read(path).unwrap();
        let mut out = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let header = batch::parse_header(&bytes[at..]).unwrap();
            out.push((at, header.base_offset, header.size));
            at += header.size;
        }
        out
    }

    fn flip(path: &Path, at: usize, mask: u8) {
        let mut bytes = std::fs::read(path).unwrap();
        bytes[at] ^= mask;
        std::fs::write(path, bytes).unwrap();
    }

    /// What a consumer gets reading from every offset: the batch's base offset, or the error.
    fn read_all(log: &mut PartitionLog, end: i64) -> Vec<Result<i64, String>> {
        (0..end)
            .map(|o| match log.read_checked(o, 1, true, i64::MAX) {
                Ok(Some(read)) => Ok(batch::validate(&read.bytes().unwrap()).unwrap().base_offset),
                Ok(None) => Err("out of range".into()),
                Err(StorageError::Damaged { .. }) => Err("damaged".into()),
                Err(e) => Err(e.to_string()),
            })
            .collect()
    }

    #[test]
    fn a_crash_recovery_checks_crcs_and_serves_the_batches_around_a_damaged_one() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = PartitionLog::open(dir.path(), "t-0".into(), config(500), true).unwrap();
        for i in 0..30 {
            append(&mut log, 3, 1000 + i);
        }
        assert!(log.segment_count() > 3);
        let end = log.log_end_offset();
        drop(log);
        // A record byte of the second batch of the first (finished) segment.
        let first = dir.path().join(segment::file_name(0, "log"));
        let batches = batches_of(&first);
        assert!(batches.len() > 3);
        let (at, base, size) = batches[1];
        flip(&first, at + size - 2, 0x40);

        let mut log = PartitionLog::open(dir.path(), "t-0".into(), config(500), false).unwrap();
        assert_eq!(log.damage_summary(), (1, size as u64));
        assert_eq!(log.log_end_offset(), end, "nothing cut");
        let reads = read_all(&mut log, end);
        for (offset, read) in reads.iter().enumerate() {
            let offset = offset as i64;
            if (base..base + 3).contains(&offset) {
                assert_eq!(read, &Err("damaged".to_owned()), "offset {offset}");
            } else {
                assert_eq!(read, &Ok(offset / 3 * 3), "offset {offset}");
            }
        }
        // A read from the start stops before the damage.
        let Some(Read::Slice(slice)) = log.read_checked(0, 1 << 20, true, i64::MAX).unwrap() else {
            panic!("nothing read");
        };
        assert_eq!(slice.len(), at);
        assert_eq!(slice.offsets(), base as u64);
    }

    #[test]
    fn a_damaged_length_met_by_a_read_is_recorded_once_and_the_log_goes_on_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = PartitionLog::open(dir.path(), "t-0".into(), config(500), true).unwrap();
        for i in 0..30 {
            append(&mut log, 3, 1000 + i);
        }
        let end = log.log_end_offset();
        log.flush().unwrap();
        drop(log);
        let first = dir.path().join(segment::file_name(0, "log"));
        let (at, base, size) = batches_of(&first)[2];
        flip(&first, at + 8, 0x7f);

        // A clean start loads finished segments from their indexes: the first read finds it.
        let mut log = PartitionLog::open(dir.path(), "t-0".into(), config(500), true).unwrap();
        assert_eq!(log.damage_summary(), (0, 0));
        let reads = read_all(&mut log, end);
        assert_eq!(log.damage_summary(), (1, size as u64));
        for (offset, read) in reads.iter().enumerate() {
            let offset = offset as i64;
            if (base..base + 3).contains(&offset) {
                assert_eq!(read, &Err("damaged".to_owned()), "offset {offset}");
            } else {
                assert_eq!(read, &Ok(offset / 3 * 3), "offset {offset}");
            }
        }
    }

    #[test]
    fn an_unclean_stop_cuts_only_a_torn_tail_never_intact_batches_after_damage() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = PartitionLog::open(dir.path(), "t-0".into(), config(1 << 20), true).unwrap();
        for i in 0..10 {
            append(&mut log, 2, 1000 + i);
        }
        let end = log.log_end_offset();
        drop(log);
        let active = dir.path().join(segment::file_name(0, "log"));
        let (at, base, _) = batches_of(&active)[4];
        flip(&active, at + 30, 0x01);
        // Half a batch written when the process died.
        let mut torn = std::fs::read(&active).unwrap();
        let good_len = torn.len();
        torn.extend_from_slice(&batch::tests::make_batch(end, 2, 5)[..40]);
        std::fs::write(&active, torn).unwrap();

        let mut log = PartitionLog::open(dir.path(), "t-0".into(), config(1 << 20), false).unwrap();
        assert_eq!(
            log.log_end_offset(),
            end,
            "the batches after the damage are kept"
        );
        assert_eq!(std::fs::metadata(&active).unwrap().len(), good_len as u64);
        assert_eq!(log.damage_summary().0, 1);
        let reads = read_all(&mut log, end);
        assert_eq!(reads[base as usize], Err("damaged".to_owned()));
        assert_eq!(reads[end as usize - 1], Ok(end - 2));
        // Appends go on after the intact batches.
        assert_eq!(append(&mut log, 1, 2000), end);
    }

    #[test]
    fn a_flush_records_the_recovery_point_and_a_crash_checks_only_what_is_past_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = PartitionLog::open(dir.path(), "t-0".into(), config(500), true).unwrap();
        for i in 0..20 {
            append(&mut log, 3, 1000 + i);
        }
        log.flush().unwrap();
        let point = log.log_end_offset();
        assert_eq!(read_recovery_point(dir.path()), point);
        for i in 0..20 {
            append(&mut log, 3, 2000 + i);
        }
        let end = log.log_end_offset();
        drop(log);
        let bases = log_bases(dir.path());
        // Damage before the recovery point (the scrubber's to find) and after it.
        let before = dir.path().join(segment::file_name(bases[0], "log"));
        let (at, _, size) = batches_of(&before)[1];
        flip(&before, at + size - 1, 0x10);
        let after_base = *bases.iter().rev().nth(1).unwrap();
        assert!(after_base >= point);
        let after = dir.path().join(segment::file_name(after_base, "log"));
        let (at, _, size) = batches_of(&after)[1];
        flip(&after, at + size - 1, 0x10);

        let log = PartitionLog::open(dir.path(), "t-0".into(), config(500), false).unwrap();
        assert_eq!(log.log_end_offset(), end);
        assert_eq!(log.damage_summary(), (1, size as u64));
    }

    #[test]
    fn a_replay_from_the_log_start_walks_around_a_damaged_header_instead_of_failing_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = PartitionLog::open(dir.path(), "p-0".into(), config(400), true).unwrap();
        for i in 0..20 {
            produce(&mut log, 5, 0, i * 2, 2, false).unwrap();
        }
        log.flush().unwrap();
        drop(log);
        let first = dir.path().join(segment::file_name(0, "log"));
        let (at, base, size) = batches_of(&first)[1];
        flip(&first, at + 16, 0x07);
        // Without a snapshot the producer state is replayed from the first segment.
        for (_, path) in PartitionLog::open(dir.path(), "p-0".into(), config(400), true)
            .unwrap()
            .snapshots()
            .unwrap()
        {
            std::fs::remove_file(path).unwrap();
        }
        let mut log = PartitionLog::open(dir.path(), "p-0".into(), config(400), true).unwrap();
        assert_eq!(log.damage_summary(), (1, size as u64));
        assert!(matches!(
            log.read_checked(base, 1000, true, i64::MAX),
            Err(StorageError::Damaged { .. })
        ));
        // The producer's sequence went on from its last batch.
        assert_eq!(produce(&mut log, 5, 0, 40, 2, false).unwrap(), 40);
    }

    #[test]
    fn rolled_segments_are_fsynced_in_the_background_and_move_the_recovery_point() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = PartitionLog::open(dir.path(), "t-0".into(), config(300), true).unwrap();
        for i in 0..150 {
            append(&mut log, 1, 1000 + i);
        }
        let active = log_bases(dir.path()).pop().unwrap();
        assert_eq!(read_recovery_point(dir.path()), 0, "nothing fsynced yet");
        let log = std::sync::Mutex::new(log);
        // A bounded number of segments per look, until the active one.
        sync_finished_segments(|| log.lock().unwrap()).unwrap();
        let first = read_recovery_point(dir.path());
        assert!(first > 0 && first < active, "{first} of {active}");
        sync_finished_segments(|| log.lock().unwrap()).unwrap();
        sync_finished_segments(|| log.lock().unwrap()).unwrap();
        assert_eq!(read_recovery_point(dir.path()), active);
        assert!(log.lock().unwrap().unsynced_segments().unwrap().is_none());
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
                // Garbage in a finished segment is damage, answered as such.
                for offset in [0, 1, 1000, end - 1] {
                    match log.read_checked(offset, 1000, true, i64::MAX) {
                        Ok(_) | Err(StorageError::Damaged { .. }) => {}
                        // A bad header that no CRC walk explains stays a storage error.
                        Err(StorageError::Corrupt { .. }) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
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
                        let _ = crate::dump_segment_file_verified(
                            &dir.path().join(segment::file_name(base, ext)),
                            true,
                            true,
                            &mut out,
                        );
                    }
                }
            }
        }
    }
}
