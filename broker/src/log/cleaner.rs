//! Log compaction: the cleaner of a partition whose `cleanup.policy` includes `compact`.
//!
//! A pass rewrites the finished segments from the log start up to the *cleanable end*, keeping
//! the last record of each key, as Kafka's log cleaner does:
//!
//! - The cleanable end is the first segment that is the active one, reaches the last stable
//!   offset (an open transaction's records are never cleaned), is younger than
//!   `min.compaction.lag.ms` (by its newest timestamp) or has known damage.
//! - The *dirty* part starts at the partition's cleaner checkpoint (`cleaner-checkpoint`, the
//!   end of the last pass). A pass runs when the dirty bytes are at least
//!   `min.cleanable.dirty.ratio` of the cleanable bytes, or when the first dirty segment's first
//!   record is older than `max.compaction.lag.ms`.
//! - The newest offset of every key in the dirty part is collected (within
//!   `log_cleaner_dedupe_buffer_size`; past it the pass stops at a segment boundary and the
//!   rest waits for the next one). A record is kept when it is its key's newest; records
//!   without a key are dropped (a compacted topic refuses them on produce, older ones go).
//! - A tombstone (a null value) stays for `delete.retention.ms` after its timestamp, and is
//!   removed only by a pass after the one that first cleaned it, so a consumer reading from
//!   the start within that time sees it.
//! - Records of aborted transactions are removed. A transaction marker stays while any record
//!   of its transaction does, then for `delete.retention.ms` after its own timestamp.
//! - Offsets never change: a batch keeps its base offset, last offset delta, timestamps and
//!   producer fields and loses only records (its count, length and CRC are set again); a
//!   batch left with no record goes. The offsets removed are gaps that reads step over.
//!   Consecutive segments are merged while the result stays within `segment.bytes`.
//!
//! Crash safety. The cleaned segments are written into `<partition>/cleaning/` (the segment
//! machinery writes their indexes) and fsynced while the partition is served as before. Then,
//! holding the partition: the inputs are checked to be unchanged (retention or DeleteRecords
//! may have deleted some; the pass is then dropped), `cleaning/ready` is written and fsynced,
//! listing each cleaned segment's offset range: from that moment the swap is decided. The
//! replaced segments' files are deleted (a cleaned segment's own `.log` is replaced by a
//! rename, so it never goes missing), the cleaned files renamed into place, the directory
//! fsynced and `cleaning/` removed. A start that finds `cleaning/ready` finishes the swap (each
//! step can be done again); a `cleaning/` without it is an unfinished pass and is removed. A
//! segment whose `.index` went with a replaced one is rebuilt from its `.log` when loaded.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::batch::{self, BatchHeader, BatchRecords, HEADER_LEN};
use super::producers::AbortedTxn;
use super::segment::{self, Segment};
use super::{PartitionLog, StorageError, control, io_err};

/// The directory, in a partition's, where a pass writes its segments.
pub(crate) const CLEANING_DIR: &str = "cleaning";
/// The file in [`CLEANING_DIR`] that decides a swap: one `base end` line per cleaned segment.
const READY_FILE: &str = "ready";
/// The file in a partition's directory holding the end of the last pass, as a decimal offset.
pub(crate) const CHECKPOINT_FILE: &str = "cleaner-checkpoint";
/// Bytes of batches buffered before they are written to a cleaned segment.
const WRITE_CHUNK: usize = 1 << 20;
/// What an offset map entry costs beyond its key's bytes, roughly (the key's allocation and
/// the hash table's slot).
const MAP_ENTRY_OVERHEAD: usize = 48;

/// Settings of the cleaner, broker-wide.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Most bytes of keys (and their overhead) one pass collects (`log_cleaner_dedupe_buffer_size`).
    pub(crate) dedupe_buffer_bytes: usize,
}

/// A finished segment a pass reads, without holding the partition.
struct Input {
    base: i64,
    /// The next segment's base offset: where this one's offsets end.
    end: i64,
    size: u64,
    path: PathBuf,
    file: Arc<File>,
}

/// What a pass is to clean, taken from the partition while holding it.
pub(crate) struct Plan {
    name: String,
    dir: PathBuf,
    inputs: Vec<Input>,
    /// Offset where the dirty part starts (the previous pass's end).
    first_dirty: i64,
    aborted: Vec<AbortedTxn>,
    segment_bytes: u64,
    index_interval: u32,
    delete_retention_ms: i64,
    now: i64,
}

/// A cleaned segment in [`CLEANING_DIR`]: its base offset and the base offset after it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Output {
    base: i64,
    end: i64,
}

/// A finished pass, to swap in.
pub(crate) struct Cleaned {
    /// The inputs as they were read: (base offset, size), to check they did not change.
    inputs: Vec<(i64, u64)>,
    outputs: Vec<Output>,
    /// Where the cleaned part ends: the next pass's dirty part starts here.
    end: i64,
    /// Bytes and records before and after.
    pub(crate) bytes_before: u64,
    pub(crate) bytes_after: u64,
    pub(crate) records_removed: u64,
}

/// What the cleaner did to a partition since the broker started.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct CleanerStats {
    pub(crate) passes: u64,
    pub(crate) records_removed: u64,
    /// Where the last pass ended (the dirty part starts here).
    pub(crate) checkpoint: i64,
}

/// Why a pass did not finish.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CleanError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A batch is not intact: the partition records the damage, and cleaning stops before it.
    #[error("{path} holds no intact batch at byte {position}: {reason}")]
    Damaged {
        path: PathBuf,
        position: u64,
        reason: String,
    },
}

impl PartitionLog {
    /// What a pass would clean now, when one is due (see the module docs); `None` when the
    /// topic is not compacted or there is nothing to do yet.
    pub(crate) fn cleaning_plan(&self, now: i64) -> Result<Option<Plan>, StorageError> {
        let config = &self.config;
        if !config.cleanup_policy.compact || self.segments.len() < 2 {
            return Ok(None);
        }
        let stable = self.last_stable_offset();
        let lag_bound = now.saturating_sub(config.min_compaction_lag_ms);
        let finished = &self.segments[..self.segments.len() - 1];
        let mut cleanable = 0;
        for (i, segment) in finished.iter().enumerate() {
            let end = self.segments[i + 1].base_offset();
            if end > stable || segment.max_timestamp() > lag_bound || !segment.damaged().is_empty()
            {
                break;
            }
            cleanable = i + 1;
        }
        if cleanable == 0 {
            return Ok(None);
        }
        let end = self.segments[cleanable].base_offset();
        let first_dirty = self.cleaner.checkpoint.max(self.log_start_offset());
        if first_dirty >= end {
            return Ok(None);
        }
        let (mut clean_bytes, mut dirty_bytes) = (0u64, 0u64);
        let mut first_dirty_created = None;
        for segment in &self.segments[..cleanable] {
            if segment.base_offset() >= first_dirty {
                dirty_bytes += segment.size();
                first_dirty_created.get_or_insert(segment.created_ms());
            } else {
                clean_bytes += segment.size();
            }
        }
        let total = clean_bytes + dirty_bytes;
        let ratio_due =
            total > 0 && dirty_bytes as f64 / total as f64 >= config.min_cleanable_dirty_ratio;
        let lag_due = first_dirty_created
            .is_some_and(|created| now.saturating_sub(created) > config.max_compaction_lag_ms);
        if !(ratio_due || lag_due) {
            return Ok(None);
        }
        let mut inputs = Vec::with_capacity(cleanable);
        for (i, segment) in self.segments[..cleanable].iter().enumerate() {
            inputs.push(Input {
                base: segment.base_offset(),
                end: self.segments[i + 1].base_offset(),
                size: segment.size(),
                path: segment.log_path().to_path_buf(),
                file: segment.log_file()?,
            });
        }
        Ok(Some(Plan {
            name: self.name.clone(),
            dir: self.dir.clone(),
            inputs,
            first_dirty,
            aborted: self
                .segments
                .iter()
                .flat_map(|s| s.aborted().iter().copied())
                .collect(),
            segment_bytes: config.segment_bytes,
            index_interval: config.index_interval_bytes,
            delete_retention_ms: config.delete_retention_ms,
            now,
        }))
    }

    /// After a pass met a batch that is not intact at `position` of `path`: the damage there
    /// is found, recorded and reported (see [`PartitionLog::read_checked`]), so that the next
    /// plan stops before it.
    pub(crate) fn damage_met(&mut self, path: &Path, position: u64) {
        match self.find_damage(path, position) {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(partition = %self.name, file = %path.display(), position, "a compaction pass met a batch it cannot read")
            }
            Err(e) => {
                tracing::warn!(partition = %self.name, error = %e, "cannot check a segment for damage")
            }
        }
    }

    /// Swaps a finished pass in, if the segments it read are still there as they were (else
    /// drops it and returns false). See the module docs for the steps.
    pub(crate) fn install_cleaned(&mut self, cleaned: &Cleaned) -> Result<bool, StorageError> {
        let cleaning = self.dir.join(CLEANING_DIR);
        let unchanged = self.segments.len() > cleaned.inputs.len()
            && self
                .segments
                .iter()
                .zip(&cleaned.inputs)
                .all(|(s, (base, size))| s.base_offset() == *base && s.size() == *size);
        if !unchanged {
            tracing::info!(partition = %self.name, "the segments changed while they were cleaned: the pass is dropped");
            remove_dir(&cleaning)?;
            return Ok(false);
        }
        // Written whole under another name, then renamed: a start finds it complete or not
        // at all.
        let ready = cleaning.join(READY_FILE);
        let tmp = ready.with_extension("tmp");
        let mut text = String::new();
        for output in &cleaned.outputs {
            text.push_str(&format!("{} {}\n", output.base, output.end));
        }
        let mut file = File::create(&tmp).map_err(io_err(&tmp, "create"))?;
        file.write_all(text.as_bytes())
            .map_err(io_err(&tmp, "write"))?;
        file.sync_all().map_err(io_err(&tmp, "fsync"))?;
        fs::rename(&tmp, &ready).map_err(io_err(&ready, "rename into place"))?;
        sync_dir(&cleaning)?;
        swap(&self.dir, &cleaned.outputs)?;
        // The replaced segments' files are gone; their open handles go with them.
        let replaced = cleaned.inputs.len();
        let now = super::now_ms();
        let mut loaded = Vec::with_capacity(cleaned.outputs.len());
        for output in &cleaned.outputs {
            let (segment, _) = Segment::load(
                &self.dir,
                output.base,
                output.end,
                self.config.index_interval_bytes,
                now,
            )?;
            loaded.push(segment);
        }
        self.segments.splice(..replaced, loaded);
        self.cleaner.checkpoint = cleaned.end;
        self.cleaner.passes += 1;
        self.cleaner.records_removed += cleaned.records_removed;
        write_checkpoint(&self.dir, cleaned.end);
        Ok(true)
    }

    /// What the cleaner did to this partition since the broker started.
    pub(crate) fn cleaner_stats(&self) -> CleanerStats {
        self.cleaner
    }
}

/// Runs a pass: reads the plan's segments (without holding the partition) and writes the
/// cleaned ones into [`CLEANING_DIR`], fsynced. `progress` is called with the bytes read and
/// stops the pass when it returns false (`Ok(None)`).
pub(crate) fn clean(
    plan: &Plan,
    limits: Limits,
    progress: &mut dyn FnMut(u64) -> bool,
) -> Result<Option<Cleaned>, CleanError> {
    let cleaning = plan.dir.join(CLEANING_DIR);
    remove_dir(&cleaning)?;
    fs::create_dir(&cleaning).map_err(io_err(&cleaning, "create"))?;

    // The newest offset of each key in the dirty part.
    let aborted = |header: &BatchHeader| {
        header.is_transactional()
            && !header.is_control()
            && plan.aborted.iter().any(|a| {
                a.producer_id == header.producer_id
                    && a.first_offset <= header.base_offset
                    && header.base_offset <= a.last_offset
            })
    };
    let mut newest: HashMap<Vec<u8>, i64> = HashMap::new();
    let mut map_bytes = 0usize;
    let mut end = plan.inputs.last().map_or(plan.first_dirty, |i| i.end);
    for input in plan.inputs.iter().filter(|i| i.base >= plan.first_dirty) {
        if map_bytes > limits.dedupe_buffer_bytes && input.base > plan.first_dirty {
            end = input.base;
            break;
        }
        let mut stopped = false;
        read_batches(input, |bytes, header| {
            if !progress(header.size as u64) {
                stopped = true;
                return Ok(false);
            }
            if header.is_control() || aborted(header) {
                return Ok(true);
            }
            // A batch whose records do not read (its CRC is right) is kept as it is, below.
            let Ok(records) = BatchRecords::read(bytes) else {
                return Ok(true);
            };
            for record in &records.records {
                if let Some(key) = records.key(record) {
                    let offset = records.offset(record);
                    match newest.get_mut(key) {
                        Some(at) => *at = offset,
                        None => {
                            map_bytes += key.len() + MAP_ENTRY_OVERHEAD;
                            newest.insert(key.to_vec(), offset);
                        }
                    }
                }
            }
            Ok(true)
        })?;
        if stopped {
            remove_dir(&cleaning)?;
            return Ok(None);
        }
    }

    // The segments up to `end`, grouped while their sum stays within segment.bytes (and
    // their offsets within the index's u32 of the group's base).
    let inputs: Vec<&Input> = plan.inputs.iter().filter(|i| i.base < end).collect();
    let mut groups: Vec<Vec<&Input>> = Vec::new();
    for input in &inputs {
        match groups.last_mut() {
            Some(group)
                if group.iter().map(|i| i.size).sum::<u64>() + input.size <= plan.segment_bytes
                    && input.end - group[0].base <= i64::from(u32::MAX) =>
            {
                group.push(input)
            }
            _ => groups.push(vec![input]),
        }
    }

    let horizon = plan.now.saturating_sub(plan.delete_retention_ms);
    // The first reason a batch was kept as it is, its records not readable.
    let mut unreadable: Option<&'static str> = None;
    // Per producer: whether a record of its current transaction was kept.
    let mut kept_in_txn: HashMap<i64, bool> = HashMap::new();
    let mut outputs = Vec::with_capacity(groups.len());
    let (mut bytes_before, mut bytes_after, mut records_removed) = (0u64, 0u64, 0u64);
    for group in &groups {
        let output = Output {
            base: group[0].base,
            end: group[group.len() - 1].end,
        };
        let mut segment = Segment::create(&cleaning, output.base, plan.now)?;
        let mut chunk: Vec<u8> = Vec::new();
        let mut headers: Vec<(usize, BatchHeader)> = Vec::new();
        let mut stopped = false;
        for input in group {
            bytes_before += input.size;
            read_batches(input, |bytes, header| {
                if !progress(header.size as u64) {
                    stopped = true;
                    return Ok(false);
                }
                let kept: Option<Vec<u8>> = if header.is_control() {
                    let had_data = kept_in_txn.remove(&header.producer_id).unwrap_or(false);
                    let marker = control::parse(bytes);
                    (marker.is_none() || had_data || header.max_timestamp > horizon)
                        .then(|| bytes.to_vec())
                } else if aborted(header) {
                    records_removed += u64::try_from(header.record_count).unwrap_or(0);
                    None
                } else {
                    match BatchRecords::read(bytes) {
                        Ok(records) => {
                            let keep = keep_records(&records, &newest, plan.first_dirty, horizon);
                            records_removed += (records.records.len() - keep.len()) as u64;
                            if header.is_transactional() && !keep.is_empty() {
                                kept_in_txn.insert(header.producer_id, true);
                            }
                            if keep.is_empty() {
                                None
                            } else if keep.len() == records.records.len() {
                                Some(bytes.to_vec())
                            } else {
                                match records.rebuild(bytes, &keep) {
                                    Ok(rebuilt) => Some(rebuilt),
                                    Err(reason) => {
                                        unreadable.get_or_insert(reason);
                                        Some(bytes.to_vec())
                                    }
                                }
                            }
                        }
                        Err(reason) => {
                            unreadable.get_or_insert(reason);
                            if header.is_transactional() {
                                kept_in_txn.insert(header.producer_id, true);
                            }
                            Some(bytes.to_vec())
                        }
                    }
                };
                if let Some(kept) = kept {
                    let header = batch::parse_header(&kept).map_err(|e| CleanError::Damaged {
                        path: input.path.clone(),
                        position: 0,
                        reason: e.to_string(),
                    })?;
                    headers.push((chunk.len(), header));
                    chunk.extend_from_slice(&kept);
                    if chunk.len() >= WRITE_CHUNK {
                        segment.append(&chunk, &headers, plan.index_interval, plan.now)?;
                        chunk.clear();
                        headers.clear();
                    }
                }
                Ok(true)
            })?;
            if stopped {
                drop(segment);
                remove_dir(&cleaning)?;
                return Ok(None);
            }
        }
        if !chunk.is_empty() {
            segment.append(&chunk, &headers, plan.index_interval, plan.now)?;
        }
        segment.seal();
        segment.flush()?;
        bytes_after += segment.size();
        outputs.push(output);
    }
    sync_dir(&cleaning)?;
    if let Some(reason) = unreadable {
        tracing::warn!(partition = %plan.name, reason, "kept record batches whose records do not read as they are, uncleaned");
    }
    tracing::debug!(partition = %plan.name, segments = inputs.len(), cleaned = outputs.len(), keys = newest.len(), "cleaned segments written");
    Ok(Some(Cleaned {
        inputs: inputs.iter().map(|i| (i.base, i.size)).collect(),
        outputs,
        end,
        bytes_before,
        bytes_after,
        records_removed,
    }))
}

/// Which records of a batch stay: each key's newest (by `newest`, the dirty part's), and
/// tombstones until they expire: one goes once a pass already kept it (it lies before
/// `first_dirty`, in the clean part) and its timestamp is at or before `horizon`
/// (delete.retention.ms ago). Records without a key go.
fn keep_records<'a>(
    records: &'a BatchRecords,
    newest: &HashMap<Vec<u8>, i64>,
    first_dirty: i64,
    horizon: i64,
) -> Vec<&'a batch::RawRecord> {
    records
        .records
        .iter()
        .filter(|record| {
            let Some(key) = records.key(record) else {
                return false;
            };
            let offset = records.offset(record);
            let newest_here = newest.get(key).is_none_or(|at| *at <= offset);
            let expired =
                record.tombstone && offset < first_dirty && records.timestamp(record) <= horizon;
            newest_here && !expired
        })
        .collect()
}

/// Calls `f` with every batch of a finished segment, CRC checked, in order, until it returns
/// false; a batch that is not intact is [`CleanError::Damaged`].
fn read_batches(
    input: &Input,
    mut f: impl FnMut(&[u8], &BatchHeader) -> Result<bool, CleanError>,
) -> Result<(), CleanError> {
    let damaged = |position: u64, reason: String| CleanError::Damaged {
        path: input.path.clone(),
        position,
        reason,
    };
    let mut position = 0u64;
    let mut head = [0u8; HEADER_LEN];
    let mut buf = Vec::new();
    while position < input.size {
        if input.size - position < HEADER_LEN as u64 {
            return Err(damaged(
                position,
                "fewer bytes left than a batch header".into(),
            ));
        }
        input
            .file
            .read_exact_at(&mut head, position)
            .map_err(io_err(&input.path, "read"))?;
        let header = batch::parse_header(&head).map_err(|e| damaged(position, e.to_string()))?;
        if position + header.size as u64 > input.size {
            return Err(damaged(position, "the batch runs past the segment".into()));
        }
        buf.resize(header.size, 0);
        input
            .file
            .read_exact_at(&mut buf, position)
            .map_err(io_err(&input.path, "read"))?;
        let header = batch::validate(&buf).map_err(|e| damaged(position, e.to_string()))?;
        match f(&buf, &header) {
            Ok(true) => {}
            Ok(false) => return Ok(()),
            Err(CleanError::Damaged {
                path,
                position: 0,
                reason,
            }) => {
                return Err(CleanError::Damaged {
                    path,
                    position,
                    reason,
                });
            }
            Err(e) => return Err(e),
        }
        position += header.size as u64;
    }
    Ok(())
}

/// The swap's file steps, which can all be done again: for each output, the files of the
/// segments it replaces deleted (but its own `.log`, which a rename replaces), then its files
/// renamed into place; the directory fsynced; [`CLEANING_DIR`] removed.
fn swap(dir: &Path, outputs: &[Output]) -> Result<(), StorageError> {
    let cleaning = dir.join(CLEANING_DIR);
    let mut bases = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err(dir, "list"))?.flatten() {
        if let Some(base) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.strip_suffix(".log"))
            .and_then(|stem| stem.parse::<i64>().ok())
        {
            bases.push(base);
        }
    }
    for output in outputs {
        for base in bases
            .iter()
            .filter(|b| output.base <= **b && **b < output.end)
        {
            let own = *base == output.base;
            for ext in ["log", "index", "timeindex", "txnindex"] {
                if own && ext == "log" {
                    continue;
                }
                remove_file(&dir.join(segment::file_name(*base, ext)))?;
            }
        }
        let log = cleaning.join(segment::file_name(output.base, "log"));
        if log.exists() {
            for ext in ["index", "timeindex"] {
                let from = cleaning.join(segment::file_name(output.base, ext));
                if from.exists() {
                    let to = dir.join(segment::file_name(output.base, ext));
                    fs::rename(&from, &to).map_err(io_err(&to, "rename into place"))?;
                }
            }
            let to = dir.join(segment::file_name(output.base, "log"));
            fs::rename(&log, &to).map_err(io_err(&to, "rename into place"))?;
        }
    }
    sync_dir(dir)?;
    remove_dir(&cleaning)
}

/// Before a partition's segments are opened: finishes a swap a crash interrupted, or removes
/// an unfinished pass (see the module docs).
pub(crate) fn recover(dir: &Path, name: &str) -> Result<(), StorageError> {
    let cleaning = dir.join(CLEANING_DIR);
    if !cleaning.exists() {
        return Ok(());
    }
    let ready = cleaning.join(READY_FILE);
    let text = match fs::read_to_string(&ready) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io_err(&ready, "read")(e)),
    };
    let outputs = text.map(|text| {
        text.lines()
            .map(|line| {
                let (base, end) = line.split_once(' ')?;
                let output = Output {
                    base: base.parse().ok()?,
                    end: end.parse().ok()?,
                };
                (output.base < output.end).then_some(output)
            })
            .collect::<Option<Vec<Output>>>()
            .ok_or_else(|| {
                // Written whole and renamed into place, it can only be damaged from outside:
                // nothing is touched, and the partition does not open.
                io_err(&ready, "read")(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "not lines of `base end` offsets; a compaction swap was decided but its \
                     segments are not known: look at the directory before removing cleaning/",
                ))
            })
    });
    match outputs.transpose()? {
        Some(outputs) => {
            tracing::info!(partition = %name, segments = outputs.len(), "finishing the swap of cleaned segments a stop interrupted");
            swap(dir, &outputs)
        }
        None => {
            tracing::info!(partition = %name, "removing an unfinished cleaning pass");
            remove_dir(&cleaning)
        }
    }
}

/// The end of the last pass recorded in `dir`; 0 (everything dirty) when missing.
pub(crate) fn read_checkpoint(dir: &Path) -> i64 {
    fs::read_to_string(dir.join(CHECKPOINT_FILE))
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(0)
}

/// Records the end of a pass (not fsynced: an older one only makes the next pass clean more).
fn write_checkpoint(dir: &Path, end: i64) {
    let path = dir.join(CHECKPOINT_FILE);
    let tmp = path.with_extension("tmp");
    if let Err(e) = fs::write(&tmp, format!("{end}\n")).and_then(|()| fs::rename(&tmp, &path)) {
        tracing::warn!(path = %path.display(), error = %e, "cannot record the cleaner checkpoint");
    }
}

fn remove_file(path: &Path) -> Result<(), StorageError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err(path, "delete")(e)),
    }
}

fn remove_dir(path: &Path) -> Result<(), StorageError> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err(path, "delete")(e)),
    }
}

fn sync_dir(path: &Path) -> Result<(), StorageError> {
    File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(io_err(path, "fsync"))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use bytes::Bytes;
    use kafka_protocol::indexmap::IndexMap;
    use kafka_protocol::records::{Compression, Record, TimestampType};

    use super::*;
    use crate::config::BrokerConfig;
    use crate::log::Read;
    use crate::topic_config::LogConfig;

    const NOW: i64 = 1_700_000_000_000;
    const RETENTION: i64 = 60_000;

    fn config(segment_bytes: u64) -> LogConfig {
        let broker = BrokerConfig {
            log_segment_bytes: segment_bytes,
            log_index_interval_bytes: 100,
            ..Default::default()
        };
        let overrides: BTreeMap<String, String> = [
            ("cleanup.policy", "compact"),
            ("min.cleanable.dirty.ratio", "0.01"),
            ("delete.retention.ms", "60000"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        LogConfig::resolve(&broker, &overrides).unwrap()
    }

    /// A record: key, value (`None`: a tombstone).
    type Kv<'a> = (Option<&'a str>, Option<&'a str>);

    /// A batch of `records` (timestamp `ts`), from producer `producer` (id, epoch, first
    /// sequence, transactional) or none, compressed with `compression`.
    fn batch(
        records: &[Kv<'_>],
        ts: i64,
        producer: Option<(i64, i16, i32, bool)>,
        compression: Compression,
    ) -> Vec<u8> {
        let (pid, epoch, seq, txn) = producer.unwrap_or((-1, -1, -1, false));
        let records: Vec<Record> = records
            .iter()
            .enumerate()
            .map(|(i, (key, value))| Record {
                transactional: txn,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 0,
                producer_id: pid,
                producer_epoch: epoch,
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                sequence: if seq < 0 { -1 } else { seq + i as i32 },
                timestamp: ts,
                key: key.map(|k| Bytes::copy_from_slice(k.as_bytes())),
                value: value.map(|v| Bytes::copy_from_slice(v.as_bytes())),
                headers: IndexMap::new(),
            })
            .collect();
        batch::tests::encode(&records, compression)
    }

    fn append(log: &mut PartitionLog, mut bytes: Vec<u8>) -> i64 {
        let mut headers = batch::validate_all(&bytes).unwrap();
        log.append(&mut bytes, &mut headers).unwrap()
    }

    /// `count` single-record batches of `key`, valued `{prefix}{i}`, at timestamp `ts`.
    fn updates(log: &mut PartitionLog, key: &str, prefix: &str, count: usize, ts: i64) {
        for i in 0..count {
            let value = format!("{prefix}{i}");
            let records = [(Some(key), Some(value.as_str()))];
            append(log, batch(&records, ts, None, Compression::None));
        }
    }

    /// Every record from the log start: (offset, key, value), control batches left out.
    fn records(log: &mut PartitionLog) -> Vec<(i64, Option<String>, Option<String>)> {
        let end = log.log_end_offset();
        let mut out = Vec::new();
        let mut at = log.log_start_offset();
        while at < end {
            let Some(Read::Slice(slice)) = log.read_checked(at, 1 << 20, true, end).unwrap() else {
                break;
            };
            let mut bytes = slice.read().unwrap();
            while !bytes.is_empty() {
                let header = batch::validate(&bytes).unwrap();
                let this = bytes.split_to(header.size);
                at = header.last_offset() + 1;
                if header.is_control() {
                    continue;
                }
                for record in batch::decode_records(&this).unwrap() {
                    let text = |b: Option<Bytes>| b.map(|b| String::from_utf8(b.to_vec()).unwrap());
                    out.push((record.offset, text(record.key), text(record.value)));
                }
            }
        }
        out
    }

    /// One pass, at `now`; whether one was due.
    fn pass(log: &mut PartitionLog, now: i64) -> bool {
        let Some(plan) = log.cleaning_plan(now).unwrap() else {
            return false;
        };
        let limits = Limits {
            dedupe_buffer_bytes: 1 << 20,
        };
        let cleaned = clean(&plan, limits, &mut |_| true).unwrap().unwrap();
        assert!(log.install_cleaned(&cleaned).unwrap());
        true
    }

    fn open(dir: &Path, segment_bytes: u64) -> PartitionLog {
        PartitionLog::open(dir, "t-0".into(), config(segment_bytes), false).unwrap()
    }

    /// 300 updates of 7 keys, in batches of 3 over many segments, some compressed: one pass
    /// leaves, of the cleaned part, only each key's newest record, at the offset it was
    /// written at, and a restart reads the same.
    #[test]
    fn many_updates_to_few_keys_compact_to_each_keys_last_value_at_its_offset() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(dir.path(), 600);
        let mut written = Vec::new();
        for b in 0..100 {
            let values: Vec<(String, String)> = (0..3)
                .map(|i| {
                    let n = b * 3 + i;
                    (format!("k{}", n % 7), format!("v{n}"))
                })
                .collect();
            let kv: Vec<Kv<'_>> = values
                .iter()
                .map(|(k, v)| (Some(k.as_str()), Some(v.as_str())))
                .collect();
            let codec = if b % 2 == 0 {
                Compression::None
            } else {
                Compression::Lz4
            };
            let base = append(&mut log, batch(&kv, NOW, None, codec));
            for (i, (k, v)) in values.into_iter().enumerate() {
                written.push((base + i as i64, k, v));
            }
        }
        let segments_before = log.segment_count();
        assert!(segments_before > 10, "{segments_before} segments");
        let (start, end) = (log.log_start_offset(), log.log_end_offset());

        assert!(pass(&mut log, NOW + 1));
        assert_eq!((log.log_start_offset(), log.log_end_offset()), (start, end));
        let active_base = log.segments.last().unwrap().base_offset();
        let got = records(&mut log);
        // Offsets kept: each record is the one written at its offset.
        for (offset, key, value) in &got {
            let (_, k, v) = &written[*offset as usize];
            assert_eq!((key.as_ref(), value.as_ref()), (Some(k), Some(v)));
        }
        // The cleaned part holds each key once, its newest value within that part.
        let cleaned: Vec<_> = got.iter().filter(|(o, ..)| *o < active_base).collect();
        for key in 0..7 {
            let key = format!("k{key}");
            let newest = written
                .iter()
                .filter(|(o, k, _)| *o < active_base && *k == key)
                .map(|(o, ..)| *o)
                .max()
                .unwrap();
            let kept: Vec<i64> = cleaned
                .iter()
                .filter(|(_, k, _)| k.as_deref() == Some(key.as_str()))
                .map(|(o, ..)| *o)
                .collect();
            assert_eq!(kept, vec![newest], "{key}");
        }
        // The active segment is left as it was.
        let active: Vec<_> = got.iter().filter(|(o, ..)| *o >= active_base).collect();
        assert_eq!(active.len() as i64, end - active_base);
        // Nothing new to clean: no pass is due.
        assert!(!pass(&mut log, NOW + 2));
        // The next pass merges the small cleaned segments (within segment.bytes).
        let cleaned_segments = log.segment_count();
        for n in 300..330 {
            let (k, v) = (format!("k{}", n % 7), format!("v{n}"));
            let base = append(
                &mut log,
                batch(&[(Some(&k), Some(&v))], NOW, None, Compression::None),
            );
            written.push((base, k, v));
        }
        let grown = log.segment_count();
        assert!(pass(&mut log, NOW + 3));
        assert!(
            log.segment_count() < cleaned_segments.min(grown),
            "{segments_before} segments, {cleaned_segments} after a pass, {grown} with more data, {} after the next",
            log.segment_count()
        );
        let got = records(&mut log);
        for (offset, key, value) in &got {
            let (_, k, v) = &written[*offset as usize];
            assert_eq!((key.as_ref(), value.as_ref()), (Some(k), Some(v)));
        }

        drop(log);
        let mut log = open(dir.path(), 600);
        assert_eq!(records(&mut log), got, "the same after a restart");
        assert!(!dir.path().join(CLEANING_DIR).exists());
    }

    /// A tombstone stays while delete.retention.ms has not passed since it was written, and
    /// through the pass that first cleans it; a later pass after that removes it.
    #[test]
    fn tombstones_stay_for_delete_retention_ms_then_go() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(dir.path(), 300);
        append(
            &mut log,
            batch(&[(Some("a"), Some("1"))], NOW, None, Compression::None),
        );
        append(
            &mut log,
            batch(&[(Some("b"), Some("2"))], NOW, None, Compression::None),
        );
        let tombstone = append(
            &mut log,
            batch(&[(Some("a"), None)], NOW, None, Compression::None),
        );
        updates(&mut log, "c", "", 20, NOW);
        assert!(pass(&mut log, NOW + 1));
        let got = records(&mut log);
        assert!(
            got.iter()
                .all(|(o, k, _)| *o != 0 || k.as_deref() != Some("a")),
            "a=1 superseded"
        );
        assert!(
            got.contains(&(tombstone, Some("a".into()), None)),
            "the tombstone stays: {got:?}"
        );

        // Past delete.retention.ms, but the tombstone is cleaned again only with new data.
        updates(&mut log, "d", "again ", 20, NOW);
        assert!(pass(&mut log, NOW + RETENTION - 1));
        assert!(
            records(&mut log).contains(&(tombstone, Some("a".into()), None)),
            "not yet"
        );
        updates(&mut log, "e", "more ", 20, NOW);
        assert!(pass(&mut log, NOW + RETENTION + 1));
        let got = records(&mut log);
        assert!(
            got.iter().all(|(_, k, _)| k.as_deref() != Some("a")),
            "gone: {got:?}"
        );
        assert!(
            got.iter()
                .any(|(o, k, _)| *o == 1 && k.as_deref() == Some("b")),
            "b stays"
        );
    }

    /// The records of an aborted transaction are removed, a committed one's stay with its
    /// marker; the abort marker stays for delete.retention.ms, then goes.
    #[test]
    fn aborted_transactions_are_removed_and_their_markers_go_after_delete_retention_ms() {
        // Markers are stamped with the wall clock: so is everything here.
        let now = crate::log::now_ms();
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(dir.path(), 400);
        let aborted = append(
            &mut log,
            batch(
                &[(Some("x"), Some("aborted"))],
                now,
                Some((1, 0, 0, true)),
                Compression::None,
            ),
        );
        let committed = append(
            &mut log,
            batch(
                &[(Some("y"), Some("committed"))],
                now,
                Some((2, 0, 0, true)),
                Compression::None,
            ),
        );
        let abort_marker = log.append_marker(1, 0, false, 0).unwrap();
        let commit_marker = log.append_marker(2, 0, true, 0).unwrap();
        updates(&mut log, "z", "", 20, now);
        let markers = |log: &PartitionLog| {
            let mut found = Vec::new();
            for segment in &log.segments {
                segment
                    .for_each_batch(0, |h, _| {
                        if h.is_control() {
                            found.push(h.base_offset);
                        }
                    })
                    .unwrap();
            }
            found
        };
        assert!(pass(&mut log, now + 1000));
        let got = records(&mut log);
        assert!(
            got.iter().all(|(o, ..)| *o != aborted),
            "aborted data removed: {got:?}"
        );
        assert!(got.contains(&(committed, Some("y".into()), Some("committed".into()))));
        assert_eq!(markers(&log), vec![abort_marker, commit_marker]);

        updates(&mut log, "w", "later ", 20, now);
        assert!(pass(&mut log, crate::log::now_ms() + RETENTION + 1));
        assert_eq!(
            markers(&log),
            vec![commit_marker],
            "the abort marker went, the commit stays"
        );
        assert!(records(&mut log).contains(&(
            committed,
            Some("y".into()),
            Some("committed".into())
        )));
    }

    /// What a stop leaves at each step of a pass opens consistent: an unfinished pass is
    /// removed and the log read as before; a decided swap (`ready` written), whole or partly
    /// done, is finished.
    #[test]
    fn a_stop_at_any_step_of_a_pass_leaves_a_consistent_log() {
        let build = |dir: &Path| {
            let mut log = open(dir, 300);
            for i in 0..60 {
                let (k, v) = (format!("k{}", i % 3), format!("v{i}"));
                append(
                    &mut log,
                    batch(&[(Some(&k), Some(&v))], NOW, None, Compression::None),
                );
            }
            log
        };
        let limits = Limits {
            dedupe_buffer_bytes: 1 << 20,
        };
        // The expected outcomes: as before, and as after a whole pass.
        let dir = tempfile::tempdir().unwrap();
        let mut log = build(dir.path());
        let before = records(&mut log);
        assert!(pass(&mut log, NOW + 1));
        let after = records(&mut log);
        assert!(after.len() < before.len());

        // Stopped while writing: no `ready`.
        let dir = tempfile::tempdir().unwrap();
        let log = build(dir.path());
        let plan = log.cleaning_plan(NOW + 1).unwrap().unwrap();
        clean(&plan, limits, &mut |_| true).unwrap().unwrap();
        drop(log);
        let mut log = open(dir.path(), 300);
        assert_eq!(records(&mut log), before);
        assert!(!dir.path().join(CLEANING_DIR).exists());

        // Stopped right after `ready`, and stopped half-way through the swap (the replaced
        // segments' files deleted, nothing renamed yet; then the indexes moved, not the log).
        for step in 0..3 {
            let dir = tempfile::tempdir().unwrap();
            let log = build(dir.path());
            let plan = log.cleaning_plan(NOW + 1).unwrap().unwrap();
            let cleaned = clean(&plan, limits, &mut |_| true).unwrap().unwrap();
            let cleaning = dir.path().join(CLEANING_DIR);
            let mut text = String::new();
            for output in &cleaned.outputs {
                text.push_str(&format!("{} {}\n", output.base, output.end));
            }
            fs::write(cleaning.join(READY_FILE), text).unwrap();
            let first = cleaned.outputs[0];
            if step >= 1 {
                for (base, _) in &cleaned.inputs {
                    if *base > first.base && *base < first.end {
                        for ext in ["log", "index", "timeindex"] {
                            remove_file(&dir.path().join(segment::file_name(*base, ext))).unwrap();
                        }
                    }
                }
            }
            if step >= 2 {
                for ext in ["index", "timeindex"] {
                    let name = segment::file_name(first.base, ext);
                    fs::rename(cleaning.join(&name), dir.path().join(&name)).unwrap();
                }
            }
            drop(log);
            let mut log = open(dir.path(), 300);
            assert_eq!(records(&mut log), after, "step {step}");
            assert!(!cleaning.exists());
        }
    }

    /// A `ready` file damaged from outside is refused with its path, and nothing is touched.
    #[test]
    fn a_damaged_ready_file_is_refused_and_nothing_is_touched() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(dir.path(), 300);
        updates(&mut log, "k", "v", 40, NOW);
        let before = records(&mut log);
        drop(log);
        let cleaning = dir.path().join(CLEANING_DIR);
        fs::create_dir(&cleaning).unwrap();
        fs::write(cleaning.join(READY_FILE), "0 12\n40 3").unwrap();
        let Err(e) = PartitionLog::open(dir.path(), "t-0".into(), config(300), false) else {
            panic!("a damaged ready file opens");
        };
        assert!(e.to_string().contains("cleaning/ready"), "{e}");
        fs::remove_dir_all(&cleaning).unwrap();
        let mut log = open(dir.path(), 300);
        assert_eq!(records(&mut log), before);
    }

    /// A pass stopped by shutdown leaves the log as it was.
    #[test]
    fn a_pass_asked_to_stop_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(dir.path(), 300);
        updates(&mut log, "k", "v", 40, NOW);
        let before = records(&mut log);
        let plan = log.cleaning_plan(NOW + 1).unwrap().unwrap();
        let mut budget = 5;
        let limits = Limits {
            dedupe_buffer_bytes: 1 << 20,
        };
        let outcome = clean(&plan, limits, &mut |_| {
            budget -= 1;
            budget > 0
        });
        assert!(matches!(outcome, Ok(None)));
        assert!(!dir.path().join(CLEANING_DIR).exists());
        assert_eq!(records(&mut log), before);
    }

    /// A flipped byte in a segment stops the pass before it: the damage is recorded (the
    /// next plan stops before that segment) and nothing is swapped.
    #[test]
    fn damage_met_by_a_pass_is_recorded_and_cleaning_stops_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(dir.path(), 300);
        updates(&mut log, "k", "v", 40, NOW);
        let second = log.segments[1].log_path().to_path_buf();
        let mut bytes = fs::read(&second).unwrap();
        bytes[70] ^= 0xff;
        fs::write(&second, bytes).unwrap();
        let plan = log.cleaning_plan(NOW + 1).unwrap().unwrap();
        let limits = Limits {
            dedupe_buffer_bytes: 1 << 20,
        };
        let Err(CleanError::Damaged { path, position, .. }) = clean(&plan, limits, &mut |_| true)
        else {
            panic!("the damage is met");
        };
        assert_eq!(path, second);
        log.damage_met(&path, position);
        assert_eq!(log.damage_summary().0, 1);
        let plan = log.cleaning_plan(NOW + 1).unwrap().unwrap();
        assert_eq!(plan.inputs.len(), 1, "only the segment before the damage");
    }
}
