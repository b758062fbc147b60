//! The segment log of one file channel: appends with group commit, sequential reads up to the
//! committed end, take commits, deletion of taken segments, recovery and migration. Every
//! method blocks (file I/O, fsync, SQLite): call them from `spawn_blocking`.

use std::collections::{BTreeSet, VecDeque};
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use ferry_core::state::{
    Durability, JointPart, LogIndex, PutCommit, StateError, StateStore, TakeCommit,
};
use ferry_core::{Checkpoint, Event};
use std::os::unix::fs::FileExt;
use tracing::{info, warn};

use super::segment::{self, EncodedBatch};

/// Errors of the segment log. Cheap to clone: one failed group commit fails every put in it.
#[derive(Clone, Debug, thiserror::Error)]
pub(crate) enum LogError {
    /// The filesystem is full; the put waits and tries again.
    #[error("{path}: disk full")]
    DiskFull {
        /// The file being written.
        path: PathBuf,
    },
    /// A file operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        source: Arc<io::Error>,
    },
    /// Stored bytes are not what was written: nothing at or past them is served.
    #[error("{path} is damaged at byte {offset}: {message}; no event from there on is served")]
    Corrupt {
        /// The segment file.
        path: PathBuf,
        /// Where the damage starts.
        offset: u64,
        /// What is wrong.
        message: String,
    },
    /// The state store failed.
    #[error(transparent)]
    State(Arc<StateError>),
}

impl LogError {
    pub(super) fn io(path: &Path, action: &'static str, source: io::Error) -> Self {
        if source.kind() == io::ErrorKind::StorageFull {
            Self::DiskFull {
                path: path.to_owned(),
            }
        } else {
            Self::Io {
                action,
                path: path.to_owned(),
                source: Arc::new(source),
            }
        }
    }

    /// The error as the state store's, for the other parts of a joint put.
    fn to_state_error(&self) -> StateError {
        match self {
            Self::State(e) => (**e).clone(),
            Self::DiskFull { path } => StateError::DiskFull { path: path.clone() },
            other => StateError::Database {
                path: PathBuf::new(),
                message: other.to_string(),
            },
        }
    }

    pub(super) fn is_disk_full(&self) -> bool {
        match self {
            Self::DiskFull { .. } => true,
            Self::State(e) => e.is_disk_full(),
            _ => false,
        }
    }
}

impl From<StateError> for LogError {
    fn from(error: StateError) -> Self {
        Self::State(Arc::new(error))
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Critical sections leave their state consistent at every step that can panic.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// How a log is configured.
#[derive(Clone, Copy, Debug)]
pub(super) struct LogOptions {
    pub(super) durability: Durability,
    pub(super) max_file_size: u64,
    /// Most bytes of committed events kept in memory for the reader (see [`Recent`]).
    pub(super) recent_bytes: usize,
}

/// A fully taken active segment at least this large is left for a new one at the next put, so
/// that its space goes back to the filesystem without waiting for it to fill up.
const ROLL_EMPTY_AT: u64 = 1 << 20;

/// The segment being appended to.
struct Active {
    base: u64,
    file: Arc<File>,
    /// Bytes written, committed or not.
    len: u64,
}

/// The writer's side, behind `Log::write`.
struct WriteState {
    active: Option<Active>,
    /// Sequence number of the next event appended.
    next_seq: u64,
    /// Segments created since the last commit.
    new_segments: Vec<u64>,
    /// Checkpoints of the puts since the last commit, one per source (the newest).
    checkpoints: Vec<(String, Checkpoint)>,
    /// Events appended since the last commit.
    pending_events: u64,
    /// The frames appended since the last commit, with their events, for [`Recent`].
    pending_frames: Vec<RecentFrame>,
    /// Appends so far; an append is committed once `committed_gen` reaches its number.
    written_gen: u64,
    committed_gen: u64,
    /// Appends up to this number failed with `failure`.
    failed_gen: u64,
    failure: Option<LogError>,
    /// A put is committing (fsync and SQLite) without the lock.
    syncing: bool,
}

/// What one commit of a log records: every put appended since the one before.
struct Group {
    /// The appends up to this number are in it.
    generation: u64,
    next_seq: u64,
    new_segments: Vec<u64>,
    checkpoints: Vec<(String, Checkpoint)>,
    added: u64,
    /// Its frames, to serve from memory once committed.
    frames: Vec<RecentFrame>,
    /// The active segment, to sync, and the end to record.
    file: Option<Arc<File>>,
    end: (u64, u64),
    taken_seq: u64,
    durability: Durability,
}

impl Group {
    fn put_commit(&self) -> GroupCommit<'_> {
        GroupCommit {
            group: self,
            checkpoints: self
                .checkpoints
                .iter()
                .map(|(s, c)| (s.as_str(), c))
                .collect(),
        }
    }
}

/// A [`Group`] as the state store takes it.
struct GroupCommit<'a> {
    group: &'a Group,
    checkpoints: Vec<(&'a str, &'a Checkpoint)>,
}

impl GroupCommit<'_> {
    fn get(&self) -> PutCommit<'_> {
        PutCommit {
            end: self.group.end,
            next_seq: self.group.next_seq,
            taken_seq: self.group.taken_seq,
            added: self.group.added,
            new_segments: &self.group.new_segments,
            checkpoints: &self.checkpoints,
            durability: self.group.durability,
        }
    }
}

/// What is committed, behind `Log::index`; readers read up to `end`.
struct IndexState {
    /// Base sequence numbers of the committed segments.
    segments: BTreeSet<u64>,
    /// The last committed segment and its committed length.
    end: Option<(u64, u64)>,
    /// One past the last committed event.
    next_seq: u64,
    /// Every event below it is taken for good.
    taken_seq: u64,
    /// Ranges taken for good above `taken_seq`.
    taken: BTreeSet<(u64, u64)>,
    /// Committed frames whose events are still in memory.
    recent: Recent,
}

/// The events of the frames committed last, as the puts gave them: a read that reaches such a
/// frame takes its events from here instead of reading and decoding the segment (the sink of a
/// channel that keeps up reads what was just put). Only committed frames are here, in log
/// order; the reader drops those it has passed. At most `max_bytes` of events: a frame that
/// does not fit is read from its segment like any other.
#[derive(Default)]
struct Recent {
    frames: VecDeque<RecentFrame>,
    bytes: usize,
    max_bytes: usize,
}

/// A frame's place in the log and its events.
struct RecentFrame {
    base: u64,
    offset: u64,
    len: u64,
    first_seq: u64,
    events: Vec<Event>,
    bytes: usize,
}

impl Recent {
    /// Keeps `frames`, just committed, as far as they fit.
    fn extend(&mut self, frames: Vec<RecentFrame>) {
        for frame in frames {
            if self.bytes + frame.bytes <= self.max_bytes {
                self.bytes += frame.bytes;
                self.frames.push_back(frame);
            }
        }
    }

    /// The frame at `offset` of segment `base`, forgetting the frames before it.
    fn take_at(&mut self, base: u64, offset: u64) -> Option<RecentFrame> {
        while let Some(front) = self.frames.front() {
            if (front.base, front.offset) >= (base, offset) {
                break;
            }
            let passed = self.frames.pop_front()?;
            self.bytes -= passed.bytes;
        }
        let front = self.frames.front()?;
        if (front.base, front.offset) != (base, offset) {
            return None;
        }
        let frame = self.frames.pop_front()?;
        self.bytes -= frame.bytes;
        Some(frame)
    }
}

/// Where takes read next, behind `Log::read`.
struct ReadState {
    /// The segment being read, its path and file, and the offset of the next frame in it.
    segment: Option<(u64, PathBuf, File)>,
    offset: u64,
    /// Events of a frame read but not handed out yet.
    leftover: std::collections::VecDeque<(u64, Event)>,
    /// Events taken for good before the last start, not to be served again.
    skip_below: u64,
    skip: Vec<(u64, u64)>,
}

impl ReadState {
    /// Queues a frame's events, numbered from `first_seq`, for the takes: those not taken for
    /// good before the last start.
    fn queue(&mut self, first_seq: u64, events: impl IntoIterator<Item = Event>) {
        for (seq, event) in (first_seq..).zip(events) {
            if seq < self.skip_below || skipped(&self.skip, seq) {
                continue;
            }
            self.leftover.push_back((seq, event));
        }
    }
}

/// A channel's segment log.
pub(super) struct Log {
    name: String,
    dir: PathBuf,
    store: StateStore,
    options: LogOptions,
    write: Mutex<WriteState>,
    committed: Condvar,
    index: Mutex<IndexState>,
    read: Mutex<ReadState>,
    /// Held by a take commit from computing the new mark to recording it.
    take_commits: Mutex<()>,
}

/// Events read for a take.
#[derive(Debug, Default)]
pub(super) struct ReadBatch {
    pub(super) sequences: Vec<u64>,
    pub(super) events: Vec<Event>,
}

impl Log {
    /// Opens the log of channel `name` in the state store, migrating a channel of the row
    /// format and cutting bytes past the committed end. Returns it with the number of stored
    /// events.
    pub(super) fn open(
        store: StateStore,
        data_dir: &Path,
        name: &str,
        options: LogOptions,
    ) -> Result<(Self, u64), LogError> {
        let mut index = store.channel_log(name)?;
        let dir = data_dir.join("channels").join(index.id.to_string());
        std::fs::create_dir_all(&dir).map_err(|e| LogError::io(&dir, "creating", e))?;
        if index.legacy_rows {
            migrate(&store, &dir, name, &index, options)?;
            index = store.channel_log(name)?;
        }
        remove_strays(&dir, &index)?;
        let active = match index.end {
            Some((base, offset)) => Some(open_end(&dir, base, offset)?),
            None => None,
        };
        for base in &index.segments {
            let path = segment::segment_path(&dir, *base);
            if !path.exists() {
                return Err(LogError::Corrupt {
                    path,
                    offset: 0,
                    message: "the segment is in the channel's index but its file is missing".into(),
                });
            }
        }
        let start = reading_start(&index);
        let segment = match start {
            Some(base) => {
                let path = segment::segment_path(&dir, base);
                let file = File::open(&path).map_err(|e| LogError::io(&path, "opening", e))?;
                Some((base, path, file))
            }
            None => None,
        };
        let stored = index.stored;
        let log = Self {
            name: name.to_owned(),
            dir,
            store,
            options,
            write: Mutex::new(WriteState {
                active,
                next_seq: index.next_seq,
                new_segments: Vec::new(),
                checkpoints: Vec::new(),
                pending_events: 0,
                pending_frames: Vec::new(),
                written_gen: 0,
                committed_gen: 0,
                failed_gen: 0,
                failure: None,
                syncing: false,
            }),
            committed: Condvar::new(),
            index: Mutex::new(IndexState {
                segments: index.segments.iter().copied().collect(),
                end: index.end,
                next_seq: index.next_seq,
                taken_seq: index.taken_seq,
                taken: index.taken.iter().copied().collect(),
                recent: Recent {
                    max_bytes: options.recent_bytes,
                    ..Recent::default()
                },
            }),
            read: Mutex::new(ReadState {
                segment,
                offset: 0,
                leftover: Default::default(),
                skip_below: index.taken_seq,
                skip: index.taken.clone(),
            }),
            take_commits: Mutex::new(()),
        };
        Ok((log, stored))
    }

    /// The directory of the segment files.
    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Appends a batch and commits it with `checkpoint` (the checkpoint of `source`), sharing
    /// the fsync and the SQLite commit with the puts appended meanwhile. Returns the sequence
    /// number of the batch's first event once it is durable.
    ///
    /// `events` are the batch's, kept in memory for the reader once the batch is written (see
    /// [`Recent`]); a retried put may pass none.
    pub(super) fn append(
        &self,
        batch: &mut EncodedBatch,
        events: &mut Vec<Event>,
        source: &str,
        checkpoint: Option<&Checkpoint>,
    ) -> Result<u64, LogError> {
        let mut w = lock(&self.write);
        let first = w.next_seq;
        self.write_batch(&mut w, batch, events, first)?;
        let path = w
            .active
            .as_ref()
            .map(|a| segment::segment_path(&self.dir, a.base))
            .unwrap_or_else(|| self.dir.clone());
        self.commit_written(w, source, checkpoint, &path)?;
        Ok(first)
    }

    /// Commits `checkpoint` of `source` with no events (a put whose events were all filtered
    /// out still moves its source on), in the group commit of the puts appended meanwhile.
    pub(super) fn commit_checkpoint(
        &self,
        source: &str,
        checkpoint: &Checkpoint,
    ) -> Result<(), LogError> {
        let mut w = lock(&self.write);
        // The commit records the end of the active segment: there must be one.
        self.make_room(&mut w, 0)?;
        let dir = self.dir.clone();
        self.commit_written(w, source, Some(checkpoint), &dir)
    }

    /// Records `checkpoint` with what was written and waits until a group commit made both
    /// durable (running it if no other put is).
    fn commit_written<'a>(
        &'a self,
        mut w: MutexGuard<'a, WriteState>,
        source: &str,
        checkpoint: Option<&Checkpoint>,
        path: &Path,
    ) -> Result<(), LogError> {
        if let Some(checkpoint) = checkpoint {
            match w.checkpoints.iter_mut().find(|(s, _)| s == source) {
                Some(entry) => entry.1 = checkpoint.clone(),
                None => w.checkpoints.push((source.to_owned(), checkpoint.clone())),
            }
        }
        w.written_gen += 1;
        let mine = w.written_gen;
        loop {
            if w.committed_gen >= mine {
                return Ok(());
            }
            if w.failed_gen >= mine {
                return Err(w.failure.clone().unwrap_or_else(|| {
                    LogError::io(path, "committing", io::Error::other("commit failed"))
                }));
            }
            if w.syncing {
                w = self.committed.wait(w).unwrap_or_else(|e| e.into_inner());
            } else {
                w = self.commit_group(w);
            }
        }
    }

    /// Writes `batch` as the frame of events numbered from `first` at the end of the log;
    /// takes `events` (the batch's) for [`Recent`].
    fn write_batch(
        &self,
        w: &mut WriteState,
        batch: &mut EncodedBatch,
        events: &mut Vec<Event>,
        first: u64,
    ) -> Result<(), LogError> {
        self.make_room(w, batch.len())?;
        let Some(active) = w.active.as_mut() else {
            return Err(LogError::io(
                &self.dir,
                "appending to",
                io::Error::other("no active segment"),
            ));
        };
        let at = active.len;
        if let Err(e) = active.file.write_all_at(batch.seal(first), at) {
            // Nothing of a failed write may stay in the middle of the log.
            let _ = active.file.set_len(at);
            let path = segment::segment_path(&self.dir, active.base);
            return Err(LogError::io(&path, "writing", e));
        }
        active.len += batch.len();
        let base = active.base;
        w.next_seq += batch.count();
        w.pending_events += batch.count();
        if events.len() as u64 == batch.count() {
            let events = std::mem::take(events);
            w.pending_frames.push(RecentFrame {
                base,
                offset: at,
                len: batch.len(),
                first_seq: first,
                bytes: events.iter().map(Event::byte_size).sum(),
                events,
            });
        }
        Ok(())
    }

    /// Makes sure an active segment with room for `len` more bytes exists: the first one, or a
    /// new one when the current one is full (or fully taken and worth giving back).
    fn make_room(&self, w: &mut WriteState, len: u64) -> Result<(), LogError> {
        let roll = match &w.active {
            None => true,
            Some(active) if active.len == 0 => false,
            Some(active) => {
                active.len + len > self.options.max_file_size
                    || (active.len >= ROLL_EMPTY_AT && self.fully_taken(w))
            }
        };
        if !roll {
            return Ok(());
        }
        if let Some(old) = &w.active
            && self.options.durability == Durability::Full
        {
            // The old segment's last bytes are committed with the new segment's first.
            old.file.sync_data().map_err(|e| {
                LogError::io(&segment::segment_path(&self.dir, old.base), "syncing", e)
            })?;
        }
        let base = w.next_seq;
        w.active = Some(create_segment(&self.dir, base)?);
        if self.options.durability == Durability::Full {
            sync_dir(&self.dir)?;
        }
        info!(channel = %self.name, segment = base, "rolled a new segment file");
        w.new_segments.push(base);
        Ok(())
    }

    /// Whether every event written was committed and taken.
    fn fully_taken(&self, w: &WriteState) -> bool {
        w.committed_gen == w.written_gen && lock(&self.index).taken_seq >= w.next_seq
    }

    /// Leads one group commit: fsyncs what was appended so far and records the new end with
    /// the checkpoints in one SQLite transaction, without holding the lock meanwhile.
    fn commit_group<'a>(&'a self, mut w: MutexGuard<'a, WriteState>) -> MutexGuard<'a, WriteState> {
        let group = self.begin_group(&mut w);
        drop(w);
        let result = self.sync_group(&group).and_then(|()| {
            Ok(self
                .store
                .commit_put(&self.name, &group.put_commit().get())?)
        });
        let mut w = lock(&self.write);
        self.end_group(&mut w, group, result.map(|_| ()));
        w
    }

    /// Takes what was appended since the last commit, to be committed by the caller, and
    /// marks the log as committing: other puts wait until [`end_group`](Self::end_group).
    fn begin_group(&self, w: &mut WriteState) -> Group {
        w.syncing = true;
        let next_seq = w.next_seq;
        let (file, end) = match &w.active {
            Some(a) => (Some(Arc::clone(&a.file)), (a.base, a.len)),
            None => (None, (next_seq, 0)),
        };
        Group {
            generation: w.written_gen,
            next_seq,
            new_segments: std::mem::take(&mut w.new_segments),
            checkpoints: std::mem::take(&mut w.checkpoints),
            added: std::mem::take(&mut w.pending_events),
            frames: std::mem::take(&mut w.pending_frames),
            file,
            end,
            taken_seq: lock(&self.index).taken_seq,
            durability: self.options.durability,
        }
    }

    /// Makes the group's bytes durable (with `durability: full`).
    fn sync_group(&self, group: &Group) -> Result<(), LogError> {
        if let Some(file) = &group.file
            && self.options.durability == Durability::Full
        {
            file.sync_data().map_err(|e| {
                LogError::io(&segment::segment_path(&self.dir, group.end.0), "syncing", e)
            })?;
        }
        Ok(())
    }

    /// Publishes a committed group to readers, or cuts a failed one; wakes the waiting puts.
    fn end_group(&self, w: &mut WriteState, group: Group, result: Result<(), LogError>) {
        w.syncing = false;
        match result {
            Ok(()) => {
                w.committed_gen = group.generation;
                let mut index = lock(&self.index);
                index.segments.extend(group.new_segments.iter().copied());
                index.end = Some(group.end);
                index.next_seq = group.next_seq;
                index.recent.extend(group.frames);
            }
            Err(error) => {
                self.discard_uncommitted(w, &group.new_segments);
                w.failed_gen = w.written_gen;
                w.failure = Some(error);
            }
        }
        self.committed.notify_all();
    }

    /// Appends a batch as one part of a joint put (a fan-out into several channels of one
    /// state store): commits what this log holds so far together with the other parts and
    /// the source's checkpoint, in the one transaction `part` leads to. An empty batch still
    /// takes part, so a checkpoint travels even when this channel gets no events of it.
    /// Returns the sequence number of the batch's first event once it is durable.
    pub(super) fn append_joint(
        &self,
        batch: Option<(&mut EncodedBatch, &mut Vec<Event>)>,
        part: JointPart,
    ) -> Result<u64, LogError> {
        let mut w = lock(&self.write);
        // Joint puts of one store run one at a time; a group commit of this log ends on its
        // own.
        while w.syncing {
            w = self.committed.wait(w).unwrap_or_else(|e| e.into_inner());
        }
        let first = w.next_seq;
        if let Some((batch, events)) = batch {
            if let Err(error) = self.write_batch(&mut w, batch, events, first) {
                part.abandon(error.to_state_error());
                return Err(error);
            }
            w.written_gen += 1;
        }
        let group = self.begin_group(&mut w);
        drop(w);
        let result = match self.sync_group(&group) {
            Ok(()) => part
                .commit(&self.name, &group.put_commit().get())
                .map_err(LogError::from),
            Err(error) => {
                part.abandon(error.to_state_error());
                Err(error)
            }
        };
        let mut w = lock(&self.write);
        self.end_group(&mut w, group, result.clone());
        result.map(|()| first)
    }

    /// After a failed commit: cuts every byte and segment past the committed end, so that the
    /// next put continues from it (the failed puts are retried by their sources).
    fn discard_uncommitted(&self, w: &mut WriteState, failed_segments: &[u64]) {
        let index = lock(&self.index);
        for base in failed_segments.iter().chain(&w.new_segments) {
            let _ = std::fs::remove_file(segment::segment_path(&self.dir, *base));
        }
        w.new_segments.clear();
        w.checkpoints.clear();
        w.pending_events = 0;
        w.pending_frames.clear();
        w.next_seq = index.next_seq;
        w.active = index.end.and_then(|(base, offset)| {
            let path = segment::segment_path(&self.dir, base);
            let file = OpenOptions::new().read(true).write(true).open(&path).ok()?;
            file.set_len(offset).ok()?;
            Some(Active {
                base,
                file: Arc::new(file),
                len: offset,
            })
        });
    }

    /// Reads up to `max` committed events after those read so far.
    pub(super) fn read(&self, max: usize) -> Result<ReadBatch, LogError> {
        let mut r = lock(&self.read);
        let mut out = ReadBatch::default();
        while out.events.len() < max {
            if let Some((seq, event)) = r.leftover.pop_front() {
                out.sequences.push(seq);
                out.events.push(event);
                continue;
            }
            let (end, next_segment) = {
                let index = lock(&self.index);
                let current = r.segment.as_ref().map(|(base, _, _)| *base);
                let next = match current {
                    Some(base) => index.segments.range(base + 1..).next().copied(),
                    None => index.segments.iter().next().copied(),
                };
                (index.end, next)
            };
            let Some((end_base, end_offset)) = end else {
                break;
            };
            let Some((base, path, file)) = &r.segment else {
                match next_segment {
                    Some(base) => {
                        self.open_for_reading(&mut r, base)?;
                        continue;
                    }
                    None => break,
                }
            };
            let limit = if *base == end_base {
                end_offset
            } else {
                file.metadata()
                    .map_err(|e| LogError::io(path, "reading", e))?
                    .len()
            };
            if r.offset >= limit {
                match next_segment {
                    Some(next) if *base != end_base => {
                        self.open_for_reading(&mut r, next)?;
                        continue;
                    }
                    _ => break,
                }
            }
            let recent = lock(&self.index).recent.take_at(*base, r.offset);
            if let Some(frame) = recent {
                r.offset += frame.len;
                r.queue(frame.first_seq, frame.events);
                continue;
            }
            let header = segment::read_header(file, path, r.offset, limit)?;
            if header.end_seq() <= r.skip_below {
                r.offset += header.frame_len();
                continue;
            }
            let events = segment::read_events(file, path, r.offset, &header)?;
            r.offset += header.frame_len();
            r.queue(header.first_seq, events);
        }
        Ok(out)
    }

    fn open_for_reading(&self, r: &mut ReadState, base: u64) -> Result<(), LogError> {
        let path = segment::segment_path(&self.dir, base);
        let file = File::open(&path).map_err(|e| LogError::io(&path, "opening", e))?;
        r.segment = Some((base, path, file));
        r.offset = 0;
        Ok(())
    }

    /// Commits a take of the events in `runs` (consecutive sequence numbers `(first, last)`,
    /// `count` events in all): they are gone for good. Deletes the segments that leaves wholly
    /// taken.
    pub(super) fn commit_take(
        &self,
        runs: &[(u64, u64)],
        count: u64,
        joint: Option<JointPart>,
    ) -> Result<(), LogError> {
        // One take commit at a time computes and records the mark (two at once could each
        // record a mark that misses the other's events); reads and puts go on meanwhile.
        let _committing = lock(&self.take_commits);
        let (mut taken, mut taken_seq, segments) = {
            let index = lock(&self.index);
            (index.taken.clone(), index.taken_seq, index.segments.clone())
        };
        taken.extend(runs.iter().copied());
        while let Some(&(a, b)) = taken.first() {
            if a > taken_seq {
                break;
            }
            taken_seq = taken_seq.max(b + 1);
            taken.pop_first();
        }
        let dropped = wholly_taken(&segments, taken_seq);
        // Losing a take commit only gives its events again, and the sink runner syncs the
        // store before the sink's next flush (`sync_takes`): the fsync is left to the next put
        // or that sync. Not when segment files go: they must not go before the record does.
        let durability = match self.options.durability {
            Durability::Full if dropped.is_empty() => Durability::Deferred,
            durability => durability,
        };
        let commit = TakeCommit {
            ranges: runs,
            removed: count,
            taken_seq,
            dropped_segments: &dropped,
            log_emptied: false,
            durability,
        };
        match joint {
            // In the transaction of the puts that receive these events elsewhere.
            Some(part) => part.commit_take(&self.name, &commit)?,
            None => self.store.commit_take(&self.name, &commit)?,
        }
        {
            let mut index = lock(&self.index);
            index.taken = taken;
            index.taken_seq = taken_seq;
            for base in &dropped {
                index.segments.remove(base);
            }
        }
        self.delete_segments(&dropped);
        Ok(())
    }

    /// When every event is taken, deletes the active segment too, so that its space goes
    /// back to the filesystem (a full disk waits for this); the next put starts a new one.
    pub(super) fn release_if_empty(&self) -> Result<(), LogError> {
        let mut w = lock(&self.write);
        if w.syncing || !self.fully_taken(&w) {
            return Ok(());
        }
        let Some(active) = &w.active else {
            return Ok(());
        };
        let base = active.base;
        let _committing = lock(&self.take_commits);
        // The reader's handle goes too, or the deleted file would keep its space.
        let mut read = lock(&self.read);
        let mut index = lock(&self.index);
        let dropped: Vec<u64> = index.segments.iter().copied().collect();
        self.store.commit_take(
            &self.name,
            &TakeCommit {
                ranges: &[],
                removed: 0,
                taken_seq: index.taken_seq,
                dropped_segments: &dropped,
                log_emptied: true,
                durability: self.options.durability,
            },
        )?;
        index.segments.clear();
        index.end = None;
        drop(index);
        read.segment = None;
        read.offset = 0;
        drop(read);
        w.active = None;
        drop(w);
        self.delete_segments(&dropped);
        info!(channel = %self.name, segment = base, "every event is taken: the segment file is deleted");
        Ok(())
    }

    fn delete_segments(&self, bases: &[u64]) {
        for base in bases {
            let path = segment::segment_path(&self.dir, *base);
            if let Err(e) = std::fs::remove_file(&path)
                && e.kind() != io::ErrorKind::NotFound
            {
                // Not in the index any more: the next start deletes it.
                warn!(channel = %self.name, path = %path.display(), error = %e, "cannot delete a taken segment");
            }
        }
    }
}

/// Whether `seq` lies in one of the ranges (sorted by start).
fn skipped(ranges: &[(u64, u64)], seq: u64) -> bool {
    let i = ranges.partition_point(|(first, _)| *first <= seq);
    i > 0 && ranges[i - 1].1 >= seq
}

/// The segments (all but the last) whose events are all below `taken_seq`.
fn wholly_taken(segments: &BTreeSet<u64>, taken_seq: u64) -> Vec<u64> {
    let bases: Vec<u64> = segments.iter().copied().collect();
    bases
        .windows(2)
        .take_while(|pair| pair[1] <= taken_seq)
        .map(|pair| pair[0])
        .collect()
}

/// The segment where reading starts after a restart: the last one starting at or before the
/// low-water mark (earlier ones are wholly taken), or the first.
fn reading_start(index: &LogIndex) -> Option<u64> {
    index
        .segments
        .iter()
        .rev()
        .find(|base| **base <= index.taken_seq)
        .or(index.segments.first())
        .copied()
}

/// Opens the last segment for appending, cut back to its committed length: bytes past it
/// belong to puts that never committed.
fn open_end(dir: &Path, base: u64, offset: u64) -> Result<Active, LogError> {
    let path = segment::segment_path(dir, base);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| LogError::io(&path, "opening", e))?;
    let len = file
        .metadata()
        .map_err(|e| LogError::io(&path, "reading", e))?
        .len();
    if len < offset {
        return Err(LogError::Corrupt {
            path,
            offset: len,
            message: format!(
                "the file ends before its committed length of {offset} bytes: the disk lost \
                 bytes it had acknowledged"
            ),
        });
    }
    if len > offset {
        info!(path = %path.display(), bytes = len - offset, "cutting bytes of an uncommitted put");
        file.set_len(offset)
            .and_then(|()| file.sync_all())
            .map_err(|e| LogError::io(&path, "truncating", e))?;
    }
    Ok(Active {
        base,
        file: Arc::new(file),
        len: offset,
    })
}

/// Deletes segment files the index does not list: created by puts or a migration that never
/// committed, or taken segments whose deletion a crash interrupted.
fn remove_strays(dir: &Path, index: &LogIndex) -> Result<(), LogError> {
    let entries = std::fs::read_dir(dir).map_err(|e| LogError::io(dir, "listing", e))?;
    for entry in entries {
        let entry = entry.map_err(|e| LogError::io(dir, "listing", e))?;
        let name = entry.file_name();
        let Some(base) = name.to_str().and_then(segment::parse_segment_name) else {
            continue;
        };
        if !index.segments.contains(&base) {
            let path = entry.path();
            std::fs::remove_file(&path).map_err(|e| LogError::io(&path, "deleting", e))?;
        }
    }
    Ok(())
}

/// A new, empty segment file whose first event will have sequence number `base` (a stray file
/// of that name, never committed, is emptied).
fn create_segment(dir: &Path, base: u64) -> Result<Active, LogError> {
    let path = segment::segment_path(dir, base);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .map_err(|e| LogError::io(&path, "creating", e))?;
    Ok(Active {
        base,
        file: Arc::new(file),
        len: 0,
    })
}

fn sync_dir(dir: &Path) -> Result<(), LogError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| LogError::io(dir, "syncing", e))
}

/// Moves the events of a channel of the row format (schema version 1) into segments: writes
/// them, fsyncs, then one SQLite transaction makes the segments the channel's and drops the
/// rows. A crash before that transaction leaves the rows as they were (the stray segments are
/// deleted at the next start, which migrates again).
fn migrate(
    store: &StateStore,
    dir: &Path,
    name: &str,
    index: &LogIndex,
    options: LogOptions,
) -> Result<(), LogError> {
    remove_strays(dir, &LogIndex::default())?;
    let mut segments: Vec<u64> = Vec::new();
    let mut active: Option<Active> = None;
    let mut gaps: Vec<(u64, u64)> = Vec::new();
    let mut first_seq: Option<u64> = None;
    let mut expected: Option<u64> = None;
    let mut moved = 0u64;
    loop {
        let from = expected.unwrap_or(0);
        let rows = store.legacy_events(name, from, 1000)?;
        if rows.events.is_empty() {
            break;
        }
        // One frame per run of consecutive sequence numbers.
        let mut start = 0;
        while start < rows.sequences.len() {
            let mut end = start + 1;
            while end < rows.sequences.len() && rows.sequences[end] == rows.sequences[end - 1] + 1 {
                end += 1;
            }
            let seq = rows.sequences[start];
            if let Some(expected) = expected
                && seq > expected
            {
                gaps.push((expected, seq - 1));
            }
            first_seq.get_or_insert(seq);
            let mut batch = EncodedBatch::new(&rows.events[start..end]).ok_or_else(|| {
                LogError::io(
                    dir,
                    "migrating",
                    io::Error::other("a run of events is too large"),
                )
            })?;
            let roll = match &active {
                None => true,
                Some(a) => a.len > 0 && a.len + batch.len() > options.max_file_size,
            };
            if roll {
                if let Some(old) = &active {
                    old.file
                        .sync_data()
                        .map_err(|e| LogError::io(dir, "syncing", e))?;
                }
                segments.push(seq);
                active = Some(create_segment(dir, seq)?);
            }
            if let Some(a) = active.as_mut() {
                let path = segment::segment_path(dir, a.base);
                a.file
                    .write_all_at(batch.seal(seq), a.len)
                    .map_err(|e| LogError::io(&path, "writing", e))?;
                a.len += batch.len();
            }
            moved += batch.count();
            expected = Some(rows.sequences[end - 1] + 1);
            start = end;
        }
    }
    if let Some(a) = &active {
        a.file
            .sync_data()
            .map_err(|e| LogError::io(dir, "syncing", e))?;
        sync_dir(dir)?;
    }
    if let Some(expected) = expected
        && expected < index.next_seq
    {
        gaps.push((expected, index.next_seq - 1));
    }
    let end = active.as_ref().map_or((0, 0), |a| (a.base, a.len));
    store.finish_migration(
        name,
        &PutCommit {
            end,
            next_seq: index.next_seq.max(expected.unwrap_or(0)),
            taken_seq: first_seq.unwrap_or(index.next_seq),
            added: moved,
            new_segments: &segments,
            checkpoints: &[],
            durability: Durability::Full,
        },
        &gaps,
    )?;
    info!(channel = %name, events = moved, segments = segments.len(), "moved the channel's events from the row format into segment files");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_taken_above_the_mark_are_skipped() {
        let ranges = [(5, 7), (10, 10)];
        assert!(!skipped(&ranges, 4));
        assert!(skipped(&ranges, 5) && skipped(&ranges, 7) && skipped(&ranges, 10));
        assert!(!skipped(&ranges, 8) && !skipped(&ranges, 11));
    }

    #[test]
    fn only_segments_below_the_mark_are_wholly_taken() {
        let segments: BTreeSet<u64> = [1, 100, 200].into_iter().collect();
        assert_eq!(wholly_taken(&segments, 50), Vec::<u64>::new());
        assert_eq!(wholly_taken(&segments, 100), vec![1]);
        assert_eq!(wholly_taken(&segments, 1000), vec![1, 100]);
    }
}
