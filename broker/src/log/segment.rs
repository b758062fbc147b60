//! One segment: a `.log` file of record batches and its sparse `.index` and `.timeindex`.

use std::cell::{Cell, OnceCell};
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use super::batch::{self, BatchHeader, HEADER_LEN};
use super::control::{self, Marker};
use super::producers::AbortedTxn;
use super::scan::{Damage, Found, Walk};
use super::txn_index::TxnIndex;
use super::{StorageError, io_err};

const INDEX_ENTRY: usize = 8;
const TIME_ENTRY: usize = 12;

/// A segment file name: the base offset padded to 20 digits, as Kafka names them.
pub(crate) fn file_name(base_offset: i64, extension: &str) -> String {
    format!("{base_offset:020}.{extension}")
}

/// What a scan of an existing segment found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Recovery {
    /// Bytes cut off the end because they were not a whole, valid batch.
    pub(crate) truncated_bytes: u64,
}

/// A segment of a partition log. The last segment of a log is the active one, appended to.
pub(crate) struct Segment {
    base_offset: i64,
    log_path: PathBuf,
    /// The open files, opened when first needed and closed once idle
    /// ([`Segment::close_if_idle`]), so that partitions nobody uses hold no descriptors.
    handles: OnceCell<Handles>,
    /// When the files were last used.
    last_used: Cell<Instant>,
    /// Bytes of whole batches in the `.log` file.
    size: u64,
    /// Offset after the last batch (the base offset when empty).
    next_offset: i64,
    /// (offset relative to base, file position) of a batch's last record, every
    /// index.interval.bytes.
    index_entries: Vec<(u32, u32)>,
    /// (max timestamp so far, relative offset) whenever the max timestamp grew at an index point.
    time_entries: Vec<(i64, u32)>,
    bytes_since_index: u64,
    max_timestamp: i64,
    offset_of_max_timestamp: i64,
    /// Wall clock (ms) when this segment got its first batch, for `segment.ms`.
    created_ms: i64,
    /// index.interval.bytes in force.
    index_interval: u64,
    /// Transactions aborted by markers in this segment.
    txn_index: TxnIndex,
    /// Ranges of the `.log` file that hold no intact batch, by position; reads stop before
    /// them and go on after them.
    damaged: Vec<Damage>,
}

/// A segment's three files, open.
struct Handles {
    log: Arc<File>,
    index: File,
    time_index: File,
}

impl Handles {
    fn open(log_path: &Path, create: bool) -> Result<Handles, StorageError> {
        let open = |path: &Path| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(create)
                .truncate(false)
                .open(path)
                .map_err(io_err(path, "open"))
        };
        Ok(Handles {
            log: Arc::new(open(log_path)?),
            index: open(&log_path.with_extension("index"))?,
            time_index: open(&log_path.with_extension("timeindex"))?,
        })
    }
}

impl Segment {
    /// Creates the three empty files of a new segment starting at `base_offset`.
    pub(crate) fn create(
        dir: &Path,
        base_offset: i64,
        now_ms: i64,
    ) -> Result<Segment, StorageError> {
        let mut segment = Segment::open_files(dir, base_offset, true)?;
        segment.created_ms = now_ms;
        Ok(segment)
    }

    fn open_files(dir: &Path, base_offset: i64, create: bool) -> Result<Segment, StorageError> {
        let log_path = dir.join(file_name(base_offset, "log"));
        let handles = Handles::open(&log_path, create)?;
        Ok(Segment {
            base_offset,
            log_path,
            handles: OnceCell::from(handles),
            last_used: Cell::new(Instant::now()),
            size: 0,
            next_offset: base_offset,
            index_entries: Vec::new(),
            time_entries: Vec::new(),
            bytes_since_index: 0,
            max_timestamp: -1,
            offset_of_max_timestamp: base_offset,
            created_ms: 0,
            index_interval: 4096,
            txn_index: TxnIndex::empty(dir.join(file_name(base_offset, "txnindex"))),
            damaged: Vec::new(),
        })
    }

    /// Opens an existing segment, walking its batches to rebuild the indexes. With `verify`
    /// every batch's CRC is checked, else only headers. Damaged bytes are skipped up to the
    /// next intact batch and kept in [`Segment::damaged`]; `next_base` is the next segment's
    /// base offset, `None` for the active segment, where damage with no intact batch after it
    /// is a torn tail and is truncated.
    pub(crate) fn open(
        dir: &Path,
        base_offset: i64,
        verify: bool,
        index_interval_bytes: u32,
        now_ms: i64,
        next_base: Option<i64>,
    ) -> Result<(Segment, Recovery), StorageError> {
        let mut segment = Segment::open_files(dir, base_offset, true)?;
        segment.index_interval = u64::from(index_interval_bytes);
        let file_len = segment
            .log()?
            .metadata()
            .map_err(io_err(&segment.log_path, "stat"))?
            .len();
        let log = Arc::clone(segment.log()?);
        let path = segment.log_path.clone();
        let walk = Walk {
            file: &log,
            path: &path,
            len: file_len,
            base_offset,
            bound: next_base,
            verify,
        };
        walk.run(
            0,
            base_offset,
            |found| match found {
                Found::Batch { position, header } => {
                    segment.track(&header, position, &mut Vec::new(), &mut Vec::new());
                    segment.size = position + header.size as u64;
                }
                Found::Damage(damage) => {
                    segment.size = damage.end;
                    segment.damaged.push(damage);
                }
            },
            |_| true,
        )?;
        // A torn tail: bytes at the end that are no whole batch and hold no offset a later
        // segment does not have (on the active segment, any such bytes).
        if let Some(tail) = segment.damaged.pop_if(|d| {
            d.end == file_len && (next_base.is_none() || d.next_offset <= d.first_offset)
        }) {
            segment.size = tail.position;
        }
        if let Some(last) = segment.damaged.last()
            && last.end == file_len
        {
            segment.next_offset = segment.next_offset.max(last.next_offset);
        }
        let truncated_bytes = file_len - segment.size;
        if truncated_bytes > 0 {
            segment
                .log()?
                .set_len(segment.size)
                .map_err(io_err(&segment.log_path, "truncate"))?;
        }
        segment.rewrite_indexes()?;
        segment.txn_index = TxnIndex::open(
            segment.log_path.with_extension("txnindex"),
            segment.next_offset,
        )?;
        segment.created_ms = if segment.size == 0 {
            now_ms
        } else {
            segment.first_timestamp_or(now_ms)
        };
        Ok((segment, Recovery { truncated_bytes }))
    }

    /// Opens a finished (not active) segment from its index files, as Kafka does, so a start
    /// does not read every batch header of every segment; `next_base` is the base offset of
    /// the segment after it. Falls back to rebuilding the indexes from the log when they are
    /// missing or do not fit the log.
    pub(crate) fn load(
        dir: &Path,
        base_offset: i64,
        next_base: i64,
        index_interval_bytes: u32,
        now_ms: i64,
    ) -> Result<(Segment, Recovery), StorageError> {
        let mut segment = Segment::open_files(dir, base_offset, true)?;
        segment.index_interval = u64::from(index_interval_bytes);
        let log_len = segment
            .log()?
            .metadata()
            .map_err(io_err(&segment.log_path, "stat"))?
            .len();
        let read_all = |file: &File| -> Option<Vec<u8>> {
            let len = file.metadata().ok()?.len();
            let mut buf = vec![0u8; usize::try_from(len).ok()?];
            file.read_exact_at(&mut buf, 0).ok()?;
            Some(buf)
        };
        let span = next_base - base_offset;
        let index: Option<Vec<(u32, u32)>> = read_all(segment.index()?).and_then(|bytes| {
            let entries: Vec<(u32, u32)> = bytes
                .chunks_exact(INDEX_ENTRY)
                .map(|e| {
                    (
                        u32::from_be_bytes([e[0], e[1], e[2], e[3]]),
                        u32::from_be_bytes([e[4], e[5], e[6], e[7]]),
                    )
                })
                .collect();
            let sane = bytes.len() % INDEX_ENTRY == 0
                && entries
                    .windows(2)
                    .all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1)
                && entries
                    .iter()
                    .all(|(rel, pos)| i64::from(*rel) < span && u64::from(*pos) < log_len);
            sane.then_some(entries)
        });
        let time: Option<Vec<(i64, u32)>> = read_all(segment.time_index()?).and_then(|bytes| {
            let entries: Vec<(i64, u32)> = bytes
                .chunks_exact(TIME_ENTRY)
                .map(|e| {
                    let mut ts = [0u8; 8];
                    ts.copy_from_slice(&e[..8]);
                    (
                        i64::from_be_bytes(ts),
                        u32::from_be_bytes([e[8], e[9], e[10], e[11]]),
                    )
                })
                .collect();
            let sane = bytes.len() % TIME_ENTRY == 0
                && entries
                    .windows(2)
                    .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1)
                && entries.iter().all(|(_, rel)| i64::from(*rel) < span);
            sane.then_some(entries)
        });
        // Without a time entry the segment's newest timestamp is unknown: read the batches.
        match (index, time) {
            (Some(index), Some(time)) if log_len > 0 && !time.is_empty() => {
                let (max_timestamp, relative) = time[time.len() - 1];
                segment.index_entries = index;
                segment.time_entries = time;
                segment.size = log_len;
                segment.next_offset = next_base;
                segment.max_timestamp = max_timestamp;
                segment.offset_of_max_timestamp = base_offset + i64::from(relative);
                segment.created_ms = segment.first_timestamp_or(now_ms);
                segment.txn_index =
                    TxnIndex::open(segment.log_path.with_extension("txnindex"), next_base)?;
                Ok((segment, Recovery { truncated_bytes: 0 }))
            }
            _ => {
                drop(segment);
                Segment::open(
                    dir,
                    base_offset,
                    false,
                    index_interval_bytes,
                    now_ms,
                    Some(next_base),
                )
            }
        }
    }

    /// Called when a newer segment takes over: records the segment's newest timestamp in the
    /// time index, so that [`Segment::load`] finds it there (Kafka does the same).
    pub(crate) fn seal(&mut self) {
        if self.size == 0
            || self
                .time_entries
                .last()
                .is_some_and(|(ts, _)| *ts >= self.max_timestamp)
        {
            return;
        }
        let relative = (self.offset_of_max_timestamp - self.base_offset) as u32;
        let mut entry = Vec::with_capacity(TIME_ENTRY);
        entry.extend_from_slice(&self.max_timestamp.to_be_bytes());
        entry.extend_from_slice(&relative.to_be_bytes());
        let at = (self.time_entries.len() * TIME_ENTRY) as u64;
        match self.time_index().and_then(|file| {
            file.write_all_at(&entry, at)
                .map_err(io_err(&self.log_path.with_extension("timeindex"), "write"))
        }) {
            Ok(()) => self.time_entries.push((self.max_timestamp, relative)),
            Err(e) => {
                tracing::warn!(segment = %self.log_path.display(), error = %e, "cannot seal the time index")
            }
        }
    }

    fn first_timestamp_or(&self, now_ms: i64) -> i64 {
        let mut header = [0u8; HEADER_LEN];
        let Ok(log) = self.log() else {
            return now_ms;
        };
        match log.read_exact_at(&mut header, 0) {
            Ok(()) => batch::parse_header(&header).map_or(now_ms, |h| h.max_timestamp.min(now_ms)),
            Err(_) => now_ms,
        }
    }

    fn rewrite_indexes(&mut self) -> Result<(), StorageError> {
        let mut index = Vec::with_capacity(self.index_entries.len() * INDEX_ENTRY);
        for (relative, position) in &self.index_entries {
            index.extend_from_slice(&relative.to_be_bytes());
            index.extend_from_slice(&position.to_be_bytes());
        }
        let mut time = Vec::with_capacity(self.time_entries.len() * TIME_ENTRY);
        for (timestamp, relative) in &self.time_entries {
            time.extend_from_slice(&timestamp.to_be_bytes());
            time.extend_from_slice(&relative.to_be_bytes());
        }
        let index_path = self.log_path.with_extension("index");
        let time_path = self.log_path.with_extension("timeindex");
        let handles = self.handles()?;
        handles
            .index
            .set_len(0)
            .map_err(io_err(&index_path, "truncate"))?;
        handles
            .index
            .write_all_at(&index, 0)
            .map_err(io_err(&index_path, "write"))?;
        handles
            .time_index
            .set_len(0)
            .map_err(io_err(&time_path, "truncate"))?;
        handles
            .time_index
            .write_all_at(&time, 0)
            .map_err(io_err(&time_path, "write"))?;
        Ok(())
    }

    /// Updates offsets, timestamps and index entries for a batch written at `position`;
    /// the new index entries' bytes are added to `index_out`/`time_out`.
    fn track(
        &mut self,
        header: &BatchHeader,
        position: u64,
        index_out: &mut Vec<u8>,
        time_out: &mut Vec<u8>,
    ) {
        if header.max_timestamp > self.max_timestamp {
            self.max_timestamp = header.max_timestamp;
            self.offset_of_max_timestamp = header.last_offset();
        }
        let relative = (header.last_offset() - self.base_offset) as u32;
        if self.bytes_since_index > 0 && self.bytes_since_index >= self.index_interval {
            self.index_entries.push((relative, position as u32));
            index_out.extend_from_slice(&relative.to_be_bytes());
            index_out.extend_from_slice(&(position as u32).to_be_bytes());
            let time_relative = (self.offset_of_max_timestamp - self.base_offset) as u32;
            if self
                .time_entries
                .last()
                .is_none_or(|(ts, _)| self.max_timestamp > *ts)
            {
                self.time_entries.push((self.max_timestamp, time_relative));
                time_out.extend_from_slice(&self.max_timestamp.to_be_bytes());
                time_out.extend_from_slice(&time_relative.to_be_bytes());
            }
            self.bytes_since_index = 0;
        }
        self.bytes_since_index += header.size as u64;
        self.next_offset = header.last_offset().saturating_add(1);
    }

    /// Appends already validated batches with assigned offsets (`headers` gives each batch's
    /// start in `bytes`), writing to the page cache.
    pub(crate) fn append(
        &mut self,
        bytes: &[u8],
        headers: &[(usize, BatchHeader)],
        index_interval_bytes: u32,
        now_ms: i64,
    ) -> Result<(), StorageError> {
        if self.size == 0 {
            self.created_ms = now_ms;
        }
        self.log()?
            .write_all_at(bytes, self.size)
            .map_err(io_err(&self.log_path, "append to"))?;
        let mut index_out = Vec::new();
        let mut time_out = Vec::new();
        self.index_interval = u64::from(index_interval_bytes);
        for (start, header) in headers {
            self.track(
                header,
                self.size + *start as u64,
                &mut index_out,
                &mut time_out,
            );
        }
        self.size += bytes.len() as u64;
        // The batches are in the log now. The index files are rebuilt from the log when the
        // segment is opened, so failing to extend them only costs lookup speed until then.
        if !index_out.is_empty() {
            let at = ((self.index_entries.len() * INDEX_ENTRY) - index_out.len()) as u64;
            if let Err(e) = self.index().and_then(|file| {
                file.write_all_at(&index_out, at)
                    .map_err(io_err(&self.log_path.with_extension("index"), "write"))
            }) {
                tracing::warn!(segment = %self.log_path.display(), error = %e, "cannot extend the offset index");
            }
        }
        if !time_out.is_empty() {
            let at = ((self.time_entries.len() * TIME_ENTRY) - time_out.len()) as u64;
            if let Err(e) = self.time_index().and_then(|file| {
                file.write_all_at(&time_out, at)
                    .map_err(io_err(&self.log_path.with_extension("timeindex"), "write"))
            }) {
                tracing::warn!(segment = %self.log_path.display(), error = %e, "cannot extend the time index");
            }
        }
        Ok(())
    }

    /// Offset of the first batch; segment files are named after it.
    pub(crate) fn base_offset(&self) -> i64 {
        self.base_offset
    }

    /// Offset after the last batch.
    pub(crate) fn next_offset(&self) -> i64 {
        self.next_offset
    }

    /// Bytes in the `.log` file.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// Largest batch timestamp, -1 when empty.
    pub(crate) fn max_timestamp(&self) -> i64 {
        self.max_timestamp
    }

    /// When the first batch was appended (ms since the epoch).
    pub(crate) fn created_ms(&self) -> i64 {
        self.created_ms
    }

    /// Position of the batch containing `offset`, if this segment holds it.
    fn position_of(&self, offset: i64) -> Result<Option<(u64, BatchHeader)>, StorageError> {
        if offset < self.base_offset || offset >= self.next_offset {
            return Ok(None);
        }
        let relative = (offset - self.base_offset) as u32;
        // Largest index entry at or below the target; the batch there ends at or before it.
        let slot = self
            .index_entries
            .partition_point(|(rel, _)| *rel <= relative);
        let mut position = if slot == 0 {
            0
        } else {
            u64::from(self.index_entries[slot - 1].1)
        };
        while position < self.size {
            if let Some(damage) = self.damage_around(position) {
                position = damage.end;
                continue;
            }
            let header = self.header_at(position)?;
            if header.last_offset() >= offset {
                return Ok(Some((position, header)));
            }
            position += header.size as u64;
        }
        Ok(None)
    }

    /// The header of the batch at `position`, which must be whole within the segment.
    fn header_at(&self, position: u64) -> Result<BatchHeader, StorageError> {
        let corrupt = |source| StorageError::Corrupt {
            path: self.log_path.clone(),
            position,
            source,
        };
        let left = self.size - position;
        let mut header_buf = [0u8; HEADER_LEN];
        let have = usize::try_from(left).unwrap_or(HEADER_LEN).min(HEADER_LEN);
        self.log()?
            .read_exact_at(&mut header_buf[..have], position)
            .map_err(io_err(&self.log_path, "read"))?;
        let header = batch::parse_header(&header_buf[..have]).map_err(corrupt)?;
        if header.size as u64 > left {
            return Err(corrupt(batch::BatchError::Truncated {
                have: usize::try_from(left).unwrap_or(usize::MAX),
                need: header.size,
            }));
        }
        Ok(header)
    }

    /// The damaged range that `position` is in, if any.
    fn damage_around(&self, position: u64) -> Option<&Damage> {
        self.damaged
            .iter()
            .find(|d| position >= d.position && position < d.end)
    }

    /// The damaged ranges known, by position.
    pub(crate) fn damaged(&self) -> &[Damage] {
        &self.damaged
    }

    /// The `.log` file's path.
    pub(crate) fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The open `.log` file, to read it without holding the partition (a scrub).
    pub(crate) fn log_file(&self) -> Result<Arc<File>, StorageError> {
        self.log().map(Arc::clone)
    }

    /// The files, opened again if they were closed.
    fn handles(&self) -> Result<&Handles, StorageError> {
        self.last_used.set(Instant::now());
        if let Some(handles) = self.handles.get() {
            return Ok(handles);
        }
        let handles = Handles::open(&self.log_path, true)?;
        Ok(self.handles.get_or_init(|| handles))
    }

    fn log(&self) -> Result<&Arc<File>, StorageError> {
        self.handles().map(|h| &h.log)
    }

    fn index(&self) -> Result<&File, StorageError> {
        self.handles().map(|h| &h.index)
    }

    fn time_index(&self) -> Result<&File, StorageError> {
        self.handles().map(|h| &h.time_index)
    }

    /// Closes the files when they were not used for `idle`; true when it closed them. Reads
    /// in flight keep the `.log` open through their own handle on it.
    pub(crate) fn close_if_idle(&mut self, idle: Duration) -> bool {
        if self.handles.get().is_some() && self.last_used.get().elapsed() >= idle {
            self.handles.take();
            return true;
        }
        false
    }

    /// Records damage found by a walk of this segment's file; false when it was known.
    pub(crate) fn add_damage(&mut self, damage: Damage) -> bool {
        if damage.end > self.size
            || self
                .damaged
                .iter()
                .any(|d| d.position < damage.end && damage.position < d.end)
        {
            return false;
        }
        let at = self
            .damaged
            .partition_point(|d| d.position < damage.position);
        self.damaged.insert(at, damage);
        true
    }

    /// Walks the segment from its start, checking every CRC, until past `position` (where a
    /// read found something that is not a batch): the damage found on the way that was not
    /// known yet.
    pub(crate) fn find_damage(&self, position: u64) -> Result<Vec<Damage>, StorageError> {
        let walk = Walk {
            file: self.log()?,
            path: &self.log_path,
            len: self.size,
            base_offset: self.base_offset,
            bound: Some(self.next_offset),
            verify: true,
        };
        let found = std::cell::RefCell::new(Vec::new());
        let mut at = 0u64;
        walk.run(
            0,
            self.base_offset,
            |f| {
                if let Found::Damage(damage) = f
                    && !self.damaged.iter().any(|d| d.position == damage.position)
                {
                    found.borrow_mut().push(damage);
                }
            },
            |bytes| {
                at += bytes;
                at <= position || found.borrow().is_empty()
            },
        )?;
        Ok(found.into_inner())
    }

    /// The error a read of damaged offsets gets.
    fn damaged_error(&self, damage: &Damage) -> StorageError {
        StorageError::Damaged {
            path: self.log_path.clone(),
            position: damage.position,
            end: damage.end,
            first_offset: damage.first_offset,
            last_offset: damage.last_offset(),
        }
    }

    /// Where the batches from the one containing `offset` lie: the whole batches that fit in
    /// `max_bytes` and start before `upper` (a batch boundary: the log end or the last stable
    /// offset). When the first alone is larger, it is returned whole if `min_one` (so a
    /// consumer always makes progress, KIP-74), else nothing.
    pub(crate) fn slice(
        &self,
        offset: i64,
        max_bytes: usize,
        min_one: bool,
        upper: i64,
    ) -> Result<Option<FileSlice>, StorageError> {
        if let Some(damage) = self.damaged.iter().find(|d| d.holds_offset(offset)) {
            return Err(self.damaged_error(damage));
        }
        let Some((position, first)) = self.position_of(offset)? else {
            return Ok(None);
        };
        let stop = if upper >= self.next_offset {
            self.size
        } else if upper <= self.base_offset {
            0
        } else {
            self.position_of(upper)?.map_or(self.size, |(stop, _)| stop)
        };
        // A range ends before damage: the next read, at its offsets, gets the error.
        let next_damage = self.damaged.iter().find(|d| d.position > position);
        let stop = next_damage.map_or(stop, |d| d.position.min(stop));
        let first_end = position + first.size as u64;
        let end = if first_end > stop {
            position
        } else if first.size <= max_bytes {
            let limit = position.saturating_add(max_bytes as u64).min(stop);
            self.whole_batches_end(first_end, limit)?
        } else if min_one {
            first_end
        } else {
            position
        };
        // The offset after the range, for the consumer traffic counters: known without a read
        // but where the range stops before the segment's end after more than one batch.
        let next = if end == position {
            first.base_offset
        } else if end == first_end {
            first.last_offset() + 1
        } else if end == self.size {
            self.next_offset
        } else if let Some(damage) = next_damage.filter(|d| d.position == end) {
            damage.first_offset
        } else {
            self.base_offset_at(end)?
        };
        Ok(Some(FileSlice {
            file: Arc::clone(self.log()?),
            path: self.log_path.clone(),
            position,
            len: (end - position) as usize,
            offsets: u64::try_from(next - first.base_offset).unwrap_or(0),
        }))
    }

    /// The base offset of the batch at `position`.
    fn base_offset_at(&self, position: u64) -> Result<i64, StorageError> {
        let mut base = [0u8; 8];
        self.log()?
            .read_exact_at(&mut base, position)
            .map_err(io_err(&self.log_path, "read"))?;
        Ok(i64::from_be_bytes(base))
    }

    /// The end of the last whole batch that ends at or before `limit`, walking batch headers
    /// from `from` (a batch boundary at or before `limit`). The walk starts at the last index
    /// entry before `limit` when that is further on, so it reads at most an index interval's
    /// worth of headers, however many batches the range holds.
    fn whole_batches_end(&self, from: u64, limit: u64) -> Result<u64, StorageError> {
        if limit == self.size || limit == from {
            return Ok(limit);
        }
        let slot = self
            .index_entries
            .partition_point(|(_, pos)| u64::from(*pos) <= limit);
        let mut end = match slot {
            0 => from,
            _ => from.max(u64::from(self.index_entries[slot - 1].1)),
        };
        // Up to the magic byte: a length that lands anywhere but on a batch ends the range.
        let mut length = [0u8; batch::LOG_OVERHEAD + 5];
        while limit - end >= length.len() as u64 {
            self.log()?
                .read_exact_at(&mut length, end)
                .map_err(io_err(&self.log_path, "read"))?;
            // A bad length ends the range there, like the end of the limit does.
            match batch::batch_size(&length) {
                Ok(Some(size)) if size as u64 <= limit - end && length[16] == 2 => {
                    end += size as u64
                }
                _ => break,
            }
        }
        Ok(end)
    }

    /// The first batch (offset, header, bytes) whose max timestamp is at or after `timestamp`.
    pub(crate) fn batch_for_timestamp(
        &self,
        timestamp: i64,
    ) -> Result<Option<(u64, BatchHeader, Bytes)>, StorageError> {
        if self.max_timestamp < timestamp {
            return Ok(None);
        }
        // Largest time index entry below the target: everything before its offset is older.
        let slot = self.time_entries.partition_point(|(ts, _)| *ts < timestamp);
        let start_offset = if slot == 0 {
            self.base_offset
        } else {
            self.base_offset + i64::from(self.time_entries[slot - 1].1)
        };
        let Some((mut position, _)) = self.position_of(start_offset)? else {
            return Ok(None);
        };
        while position < self.size {
            if let Some(damage) = self.damage_around(position) {
                position = damage.end;
                continue;
            }
            let header = self.header_at(position)?;
            if header.max_timestamp >= timestamp {
                let mut buf = BytesMut::zeroed(header.size);
                self.log()?
                    .read_exact_at(&mut buf, position)
                    .map_err(io_err(&self.log_path, "read"))?;
                return Ok(Some((position, header, buf.freeze())));
            }
            position += header.size as u64;
        }
        Ok(None)
    }

    /// Handles on the `.log`, `.index` and `.timeindex` (with their paths), to fsync them
    /// without holding the partition.
    pub(crate) fn sync_handles(&self) -> Result<Vec<(PathBuf, File)>, StorageError> {
        let dup = |file: &File, path: PathBuf| match file.try_clone() {
            Ok(file) => Ok((path, file)),
            Err(e) => Err(io_err(&path, "open")(e)),
        };
        let handles = self.handles()?;
        Ok(vec![
            dup(&handles.log, self.log_path.clone())?,
            dup(&handles.index, self.log_path.with_extension("index"))?,
            dup(
                &handles.time_index,
                self.log_path.with_extension("timeindex"),
            )?,
        ])
    }

    /// Fsyncs the log and its indexes.
    pub(crate) fn flush(&self) -> Result<(), StorageError> {
        // Closed files are opened again: an fsync through a new descriptor writes out what
        // was written through the old one.
        let handles = self.handles()?;
        handles
            .log
            .sync_data()
            .map_err(io_err(&self.log_path, "fsync"))?;
        handles
            .index
            .sync_data()
            .map_err(io_err(&self.log_path.with_extension("index"), "fsync"))?;
        handles
            .time_index
            .sync_data()
            .map_err(io_err(&self.log_path.with_extension("timeindex"), "fsync"))?;
        self.txn_index.flush()
    }

    /// Removes the segment's files.
    pub(crate) fn delete(self) -> Result<(), StorageError> {
        for ext in ["log", "index", "timeindex"] {
            let path = self.log_path.with_extension(ext);
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(&path, "delete")(e)),
            }
        }
        self.txn_index.delete()
    }

    /// Fsyncs the `.txnindex`, if there is one.
    pub(crate) fn flush_txn_index(&self) -> Result<(), StorageError> {
        self.txn_index.flush()
    }

    /// The transactions aborted by markers in this segment, in marker order.
    pub(crate) fn aborted(&self) -> &[AbortedTxn] {
        self.txn_index.entries()
    }

    /// Records a transaction aborted by a marker in this segment (once per marker).
    pub(crate) fn add_aborted(&mut self, entry: AbortedTxn) -> Result<(), StorageError> {
        self.txn_index.append(entry)
    }

    /// Calls `f` with the header (and, for a control batch, the marker) of every batch from
    /// the one containing `offset` to the end of the segment.
    pub(crate) fn for_each_batch(
        &self,
        offset: i64,
        mut f: impl FnMut(&BatchHeader, Option<Marker>),
    ) -> Result<(), StorageError> {
        let Some((mut position, _)) = self.position_of(offset.max(self.base_offset))? else {
            return Ok(());
        };
        let mut buf = [0u8; control::PARSE_LEN];
        while position < self.size {
            if let Some(damage) = self.damage_around(position) {
                position = damage.end;
                continue;
            }
            let len = usize::try_from(self.size - position)
                .unwrap_or(usize::MAX)
                .min(buf.len());
            self.log()?
                .read_exact_at(&mut buf[..len], position)
                .map_err(io_err(&self.log_path, "read"))?;
            let header =
                batch::parse_header(&buf[..len]).map_err(|source| StorageError::Corrupt {
                    path: self.log_path.clone(),
                    position,
                    source,
                })?;
            let marker = if header.is_control() {
                control::parse(&buf[..len.min(header.size)])
            } else {
                None
            };
            f(&header, marker);
            position += header.size as u64;
        }
        Ok(())
    }
}

/// A range of whole batches of a segment file to hand to a consumer; sent after the partition
/// lock is released, so producers are not held up by consumers. The file stays readable even
/// if retention deletes the segment meanwhile: the open handle keeps its data.
pub(crate) struct FileSlice {
    file: Arc<File>,
    path: PathBuf,
    position: u64,
    len: usize,
    /// Offsets its batches span (records, control records included).
    offsets: u64,
}

impl FileSlice {
    /// Bytes in the range.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// How many offsets its batches span: the records, control records included.
    pub(crate) fn offsets(&self) -> u64 {
        self.offsets
    }

    /// The file and where the range starts in it, to send it with `sendfile`.
    pub(crate) fn file_range(&self) -> (&File, u64) {
        (&self.file, self.position)
    }

    /// Reads `buf.len()` bytes of the range, from `skip` bytes into it.
    pub(crate) fn read_at(&self, skip: usize, buf: &mut [u8]) -> Result<(), StorageError> {
        debug_assert!(skip + buf.len() <= self.len);
        self.file
            .read_exact_at(buf, self.position + skip as u64)
            .map_err(io_err(&self.path, "read"))
    }

    /// The whole range, read now.
    #[cfg(test)]
    pub(crate) fn read(&self) -> Result<Bytes, StorageError> {
        let mut buf = BytesMut::zeroed(self.len);
        self.read_at(0, &mut buf)?;
        Ok(buf.freeze())
    }
}
