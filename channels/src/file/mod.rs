//! The `file` channel: durable, a log of segment files indexed in the agent's SQLite state
//! store (Flume's FileChannel).
//!
//! A put appends its batch to the channel's current segment file as one frame, fsyncs it, and
//! then records the log's new end in the same SQLite transaction as the source's checkpoint:
//! that transaction is the put's one commit point, so a source writing here resumes exactly
//! after what the channel holds (exactly-once into the channel). Puts that arrive while another
//! one commits share the next fsync and SQLite transaction (group commit). Each event gets a
//! sequence number that only grows, even across restarts; sinks with exactly-once delivery
//! record the last ones they delivered. Takes read the segments in order, never past the
//! committed end; the events of the last committed puts (2 MiB of them at most) stay in memory
//! as the puts gave them, and a take that reaches their frames takes them from there instead
//! of reading and decoding the file. A commit records in SQLite which sequence numbers are
//! taken for good; a rollback keeps the events in memory at the front of the queue so the next
//! take returns them again, in order.
//! On start, every event not taken for good is taken again from the oldest: those a crash
//! caught in an uncommitted take are delivered again (sinks skip them by sequence number where
//! they can).
//!
//! # On disk
//!
//! `<data_dir>/state.db` holds the index (see [`ferry_core::state`]): per channel the committed
//! end (last segment and its committed length), the next sequence number, the low-water mark
//! of taken events, ranges taken above it, the number of events stored and the list of segment
//! files. The events live in `<data_dir>/channels/<channel id>/<base>.log`, `<base>` being the
//! sequence number of the segment's first event, zero-padded to 20 digits (the id is the
//! channel's row in the `channels` table). A segment is a sequence of frames, one per put:
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 4 | magic `FCB1` |
//! | 4 | 4 | payload length N (u32, little-endian, as every number here) |
//! | 8 | 4 | CRC-32C of bytes 12 .. 24 + N |
//! | 12 | 8 | sequence number of the first event (u64) |
//! | 20 | 4 | event count (u32) |
//! | 24 | N | the events, one after the other |
//!
//! An event is its header count H (u32), then H pairs of key and value, each a length (u32) and
//! UTF-8 bytes, then the body's length (u32) and bytes. H = `0xFFFFFFFF` means "the headers of
//! the event before it in the frame" (a tailed file's events all carry the same ones).
//!
//! # Invariants
//!
//! - Bytes up to the committed end were fsynced before the end was recorded (with
//!   `durability: full`); bytes past it belong to puts that never committed and are cut at
//!   start, as are segment files the index does not list.
//! - Sequence numbers increase along the log; a frame's events are consecutive.
//! - Takes never read past the committed end. A frame whose checksum or layout is wrong is
//!   reported with its file and offset, and nothing at or past it is served.
//! - A segment is deleted once every event in it is taken for good and a later segment
//!   exists, in the take commit that made it so (the file is removed after that commit; a crash
//!   in between leaves a stray file that the next start deletes). A fully taken last segment of
//!   at least 1 MiB is left for a new one at the next put, and deleted when a put waits for disk
//!   space.
//! - A data directory written by the row format of earlier versions (events as SQLite rows) is
//!   migrated at start: the rows are written to segments, fsynced, and one SQLite transaction
//!   makes the segments the channel's and drops the rows.
//!
//! A full disk makes puts wait, logging once, until space returns; nothing is dropped.

pub mod inspect;
mod log;
mod segment;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use ferry_core::config::ByteSize;
use ferry_core::state::{Durability, JointPart, StateStore};
use ferry_core::{
    Channel, ChannelError, ComponentConfig, ConfigError, Counter, Event, PutBatch, Registry,
    TakeTransaction, async_trait,
};
use serde::Deserialize;
use tokio::sync::{Notify, Semaphore};
use tracing::{info, warn};

use self::log::{Log, LogError, LogOptions, ReadBatch};
use self::segment::EncodedBatch;

/// Options of the `file` channel.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileChannelConfig {
    /// Most events stored (Flume `capacity`, default 1,000,000).
    #[serde(default = "default_capacity")]
    pub capacity: usize,
    /// Most events in one put or take (Flume `transactionCapacity`, default 10,000).
    #[serde(default = "default_transaction_capacity")]
    pub transaction_capacity: usize,
    /// `full`: every put is fsynced before it returns (survives power loss; Flume's
    /// `fsyncPerTransaction: true`, the default). `normal`: survives a crash of the agent but
    /// not of the machine, and is faster.
    #[serde(default)]
    pub durability: Durability,
    /// Directory of the state database and the segment files; default: the agent's
    /// `data_dir` (Flume `dataDirs`). Channels in one directory share one database and never
    /// clash.
    #[serde(default)]
    pub data_dir: Option<PathBuf>,
    /// Puts wait while less than this much space is left for the channel (Flume
    /// `minimumRequiredSpace`, default 500MB there; 64MiB here). The reserve is what lets
    /// sinks commit, and so free space, when the disk is full. `0`: no check; a put whose
    /// write fails for lack of space waits the same way (keep the database on another
    /// filesystem then, or sinks may not be able to commit).
    #[serde(default = "default_minimum_free_space")]
    pub minimum_free_space: ByteSize,
    /// Size at which a segment file is closed and a new one started (Flume `maxFileSize`,
    /// about 2 GB there; 64MiB here). A segment is deleted once every event in it is taken, so
    /// smaller segments give disk space back sooner.
    #[serde(default = "default_max_file_size")]
    pub max_file_size: ByteSize,
}

fn default_minimum_free_space() -> ByteSize {
    ByteSize(64 << 20)
}

fn default_max_file_size() -> ByteSize {
    ByteSize(64 << 20)
}

fn default_capacity() -> usize {
    1_000_000
}

fn default_transaction_capacity() -> usize {
    10_000
}

/// Registers the `file` channel type.
pub fn register(registry: &mut Registry) {
    registry.register_channel("file", |cfg| {
        let options: FileChannelConfig = cfg.parse()?;
        Ok(Arc::new(FileChannel::from_config(cfg, options)?))
    });
}

/// Events read from the log, each with its sequence number.
type StoredEvents = ReadBatch;

struct Shared {
    name: String,
    capacity: usize,
    transaction_capacity: usize,
    options: LogOptions,
    data_dir: PathBuf,
    minimum_free_space: u64,
    log: OnceLock<Arc<Log>>,
    store: OnceLock<StateStore>,
    /// Events given back by rolled-back takes, oldest first, taken again before anything newer.
    returned: Mutex<VecDeque<StoredEvents>>,
    /// Serializes reads of the log so two takes never read the same events.
    reading: tokio::sync::Mutex<()>,
    /// Free event slots; empty until `start` counted what is stored.
    slots: Semaphore,
    available: Notify,
    size: Counter,
}

impl Shared {
    fn lock_returned(&self) -> MutexGuard<'_, VecDeque<StoredEvents>> {
        // Critical sections are plain queue updates; a poisoned lock holds consistent data.
        self.returned.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn log(&self) -> Result<Arc<Log>, ChannelError> {
        self.log
            .get()
            .cloned()
            .ok_or_else(|| ChannelError::Storage {
                channel: self.name.clone(),
                message: "channel used before it was started".into(),
            })
    }

    /// The state store, once the channel is started.
    fn state(&self) -> Result<&StateStore, LogError> {
        self.store.get().ok_or_else(|| {
            LogError::from(ferry_core::state::StateError::Database {
                path: self.data_dir.clone(),
                message: "channel used before it was started".into(),
            })
        })
    }

    fn storage_error(&self, error: impl std::fmt::Display) -> ChannelError {
        ChannelError::Storage {
            channel: self.name.clone(),
            message: error.to_string(),
        }
    }

    /// Puts a batch back at its place among the returned batches (ordered by sequence).
    fn give_back(&self, batch: StoredEvents) {
        if batch.events.is_empty() {
            return;
        }
        let first = batch.sequences[0];
        let mut returned = self.lock_returned();
        let at = returned
            .iter()
            .position(|b| b.sequences.first().is_some_and(|s| *s > first))
            .unwrap_or(returned.len());
        returned.insert(at, batch);
        drop(returned);
        self.available.notify_waiters();
    }

    /// Whether a put of `bytes` leaves `minimum_free_space` free, both where the segments are
    /// and where the database is; when it would not, first gives back what taken events still
    /// hold.
    fn has_room(&self, log: &Log, store: &StateStore, bytes: u64) -> Result<bool, LogError> {
        if self.minimum_free_space == 0 {
            // No reserve: the write itself finds out (ENOSPC cuts it and the put waits).
            return Ok(true);
        }
        let needed = self.minimum_free_space + bytes;
        let free = || -> Result<u64, LogError> {
            let segments = ferry_core::state::free_space(log.dir())
                .map_err(|e| LogError::io(log.dir(), "reading the free space of", e))?;
            Ok(segments.min(store.available_bytes()?))
        };
        if free()? >= needed {
            return Ok(true);
        }
        log.release_if_empty()?;
        store.reclaim_space()?;
        Ok(free()? >= needed)
    }
}

/// A durable channel: segment files indexed in the agent's SQLite database.
#[derive(Clone)]
pub struct FileChannel(Arc<Shared>);

impl FileChannel {
    /// A channel named `name` storing its events under `data_dir`.
    pub fn new(name: &str, options: &FileChannelConfig, data_dir: PathBuf) -> Self {
        Self(Arc::new(Shared {
            name: name.to_owned(),
            capacity: options.capacity,
            transaction_capacity: options.transaction_capacity,
            options: LogOptions {
                durability: options.durability,
                max_file_size: options.max_file_size.bytes().max(1),
                recent_bytes: RECENT_BYTES,
            },
            data_dir,
            minimum_free_space: options.minimum_free_space.bytes(),
            log: OnceLock::new(),
            store: OnceLock::new(),
            returned: Mutex::default(),
            reading: tokio::sync::Mutex::new(()),
            slots: Semaphore::new(0),
            available: Notify::new(),
            size: Counter::default(),
        }))
    }

    /// The channel `cfg` describes (`type: file`), validated; nothing is opened until
    /// [`Channel::start`].
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        let options: FileChannelConfig = cfg.parse()?;
        Self::from_config(cfg, options)
    }

    /// For tools, while no agent runs on the directory: takes up to `max` events whose
    /// sequence numbers are in `range`, leaving every other event where it is (a take
    /// committed here removes exactly these; one rolled back leaves the channel unchanged).
    /// Reads the log from where the last call stopped, so calls must ask for increasing
    /// ranges; call it on a started channel that nothing else takes from.
    pub async fn take_sequences(
        &self,
        range: std::ops::RangeInclusive<u64>,
        max: usize,
    ) -> Result<Box<dyn TakeTransaction>, ChannelError> {
        let log = self.0.log()?;
        let batch = tokio::task::spawn_blocking(move || {
            let mut kept = StoredEvents::default();
            while kept.events.len() < max {
                // Never more than still wanted: what is read past it would be lost to the
                // next call.
                let read = log.read(max - kept.events.len())?;
                if read.events.is_empty() {
                    break;
                }
                let past = read.sequences.last().is_some_and(|s| s > range.end());
                for (seq, event) in read.sequences.into_iter().zip(read.events) {
                    if range.contains(&seq) {
                        kept.sequences.push(seq);
                        kept.events.push(event);
                    }
                }
                if past {
                    break;
                }
            }
            Ok::<_, LogError>(kept)
        })
        .await
        .map_err(|e| self.0.storage_error(e))?
        .map_err(|e| self.0.storage_error(e))?;
        Ok(Box::new(FileTake {
            channel: Arc::clone(&self.0),
            batch: Some(batch),
            // The events are not among those a take would serve next: they must not go
            // back to the queue of returned events.
            offline: true,
        }))
    }

    fn from_config(cfg: &ComponentConfig, options: FileChannelConfig) -> Result<Self, ConfigError> {
        crate::check_capacities(cfg, options.capacity, options.transaction_capacity)?;
        let data_dir = options
            .data_dir
            .clone()
            .unwrap_or_else(|| cfg.data_dir().to_owned());
        Ok(Self::new(cfg.name(), &options, data_dir))
    }

    fn check_batch(&self, batch: &PutBatch) -> Result<usize, ChannelError> {
        let n = batch.events.len();
        if n > self.0.transaction_capacity {
            return Err(ChannelError::BatchTooLarge {
                channel: self.0.name.clone(),
                events: n,
                bytes: batch.events.iter().map(Event::byte_size).sum(),
                limit: format!("transaction_capacity {}", self.0.transaction_capacity),
            });
        }
        Ok(n)
    }

    /// Writes a batch whose slots are already reserved; waits out a full disk.
    async fn store(&self, mut batch: PutBatch) -> Result<(), ChannelError> {
        let n = batch.events.len();
        let joint = batch.joint.take();
        if n == 0 {
            return self.store_checkpoint(batch, joint).await;
        }
        let log = self.0.log()?;
        let Some(encoded) = EncodedBatch::new(&batch.events) else {
            self.0.slots.add_permits(n);
            return Err(ChannelError::BatchTooLarge {
                channel: self.0.name.clone(),
                events: n,
                bytes: batch.events.iter().map(Event::byte_size).sum(),
                limit: "4 GiB per put".into(),
            });
        };
        // The events go to the log with their frame, for the reader (see `RECENT_BYTES`).
        let mut events = batch.events;
        let (source, checkpoint) = (batch.source, batch.checkpoint);
        let mut job = Some(encoded);
        let joint_put = joint.is_some();
        let mut joint = joint;
        let mut backoff = Duration::from_millis(100);
        let mut warned = false;
        loop {
            let (log, shared) = (Arc::clone(&log), Arc::clone(&self.0));
            let (source, checkpoint) = (source.clone(), checkpoint.clone());
            let mut encoded = job
                .take()
                .ok_or_else(|| self.0.storage_error("put lost its batch"))?;
            let part = joint.take();
            let mut kept = std::mem::take(&mut events);
            let (encoded, part, kept, result) = tokio::task::spawn_blocking(move || {
                let mut part = part;
                let result = (|| {
                    let store = shared.state()?;
                    if !shared.has_room(&log, store, encoded.len())? {
                        return Err(LogError::DiskFull {
                            path: log.dir().to_owned(),
                        });
                    }
                    let appended = match part.take() {
                        // A part of a joint put commits with the others or not at all: it is
                        // not retried on its own.
                        Some(part) => log.append_joint(Some((&mut encoded, &mut kept)), part),
                        None => log.append(&mut encoded, &mut kept, &source, checkpoint.as_ref()),
                    };
                    if appended.as_ref().is_err_and(LogError::is_disk_full) {
                        // Space held by taken events goes back before the put is retried.
                        log.release_if_empty()?;
                    }
                    appended
                })();
                (encoded, part, kept, result)
            })
            .await
            .map_err(|e| self.0.storage_error(e))?;
            match result {
                Ok(_) => {
                    if warned {
                        info!(channel = %self.0.name, "disk space is back; puts resumed");
                    }
                    self.0.size.add(n as u64);
                    self.0.available.notify_waiters();
                    return Ok(());
                }
                // A joint part that was appended fails with the others; one refused before
                // (no room) waits for space like any put.
                Err(error) if error.is_disk_full() && (!joint_put || part.is_some()) => {
                    joint = part;
                    if !warned {
                        warn!(channel = %self.0.name, %error, minimum_free_space = self.0.minimum_free_space, "disk full: the source waits until space is freed");
                        warned = true;
                    }
                    job = Some(encoded);
                    events = kept;
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Err(error) => {
                    self.0.slots.add_permits(n);
                    return Err(self.0.storage_error(error));
                }
            }
        }
    }

    /// A put without events: the checkpoint alone (every event of the batch was filtered or
    /// went to other channels) is committed, in the joint put when the batch is part of one.
    async fn store_checkpoint(
        &self,
        batch: PutBatch,
        joint: Option<JointPart>,
    ) -> Result<(), ChannelError> {
        if joint.is_none() && batch.checkpoint.is_none() {
            return Ok(());
        }
        let log = self.0.log()?;
        tokio::task::spawn_blocking(move || match (joint, &batch.checkpoint) {
            (Some(part), _) => log.append_joint(None, part).map(|_| ()),
            (None, Some(checkpoint)) => log.commit_checkpoint(&batch.source, checkpoint),
            (None, None) => Ok(()),
        })
        .await
        .map_err(|e| self.0.storage_error(e))?
        .map_err(|e| self.0.storage_error(e))
    }
}

#[async_trait]
impl Channel for FileChannel {
    fn name(&self) -> &str {
        &self.0.name
    }

    async fn start(&self) -> Result<(), ChannelError> {
        if self.0.log.get().is_some() {
            return Ok(());
        }
        let shared = Arc::clone(&self.0);
        let (store, log, stored) = tokio::task::spawn_blocking(move || {
            let store = StateStore::open(&shared.data_dir).map_err(LogError::from)?;
            let (log, stored) = Log::open(
                store.clone(),
                &shared.data_dir,
                &shared.name,
                shared.options,
            )?;
            Ok::<_, LogError>((store, log, stored))
        })
        .await
        .map_err(|e| self.0.storage_error(e))?
        .map_err(|e| self.0.storage_error(e))?;
        let stored = stored as usize;
        if stored > 0 {
            info!(channel = %self.0.name, events = stored, "recovered stored events");
        }
        self.0.size.set(stored as u64);
        self.0
            .slots
            .add_permits(self.0.capacity.saturating_sub(stored));
        let _ = self.0.store.set(store);
        let _ = self.0.log.set(Arc::new(log));
        Ok(())
    }

    async fn put(&self, batch: PutBatch) -> Result<(), ChannelError> {
        let n = self.check_batch(&batch)?;
        self.0
            .slots
            .acquire_many(n as u32)
            .await
            .map_err(|e| self.0.storage_error(e))?
            .forget();
        self.store(batch).await
    }

    async fn try_put(&self, batch: PutBatch) -> Result<(), ChannelError> {
        let n = self.check_batch(&batch)?;
        match self.0.slots.try_acquire_many(n as u32) {
            Ok(permit) => permit.forget(),
            Err(_) => {
                return Err(ChannelError::Full {
                    channel: self.0.name.clone(),
                });
            }
        }
        self.store(batch).await
    }

    async fn take(
        &self,
        max: usize,
        wait: Duration,
    ) -> Result<Box<dyn TakeTransaction>, ChannelError> {
        let max = max.clamp(1, self.0.transaction_capacity);
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.0.available.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let batch = {
                let _reading = self.0.reading.lock().await;
                let returned = take_returned(&mut self.0.lock_returned(), max);
                match returned {
                    Some(batch) => batch,
                    None => {
                        // The events read go to the returned queue first: if this take is
                        // cancelled while the read runs (a sink runner's `select!`), the
                        // next take finds them there instead of past the reader's position.
                        let (log, shared) = (self.0.log()?, Arc::clone(&self.0));
                        tokio::task::spawn_blocking(move || {
                            log.read(max).map(|batch| shared.give_back(batch))
                        })
                        .await
                        .map_err(|e| self.0.storage_error(e))?
                        .map_err(|e| self.0.storage_error(e))?;
                        take_returned(&mut self.0.lock_returned(), max).unwrap_or_default()
                    }
                }
            };
            if !batch.events.is_empty()
                || tokio::time::timeout_at(deadline, notified).await.is_err()
            {
                return Ok(Box::new(FileTake {
                    channel: Arc::clone(&self.0),
                    batch: Some(batch),
                    offline: false,
                }));
            }
        }
    }

    fn transaction_capacity(&self) -> usize {
        self.0.transaction_capacity
    }

    fn joint_store(&self) -> Option<StateStore> {
        self.0.store.get().cloned()
    }

    /// Syncs the state store's write-ahead log when a take commit since its last sync is not
    /// durable yet (with `durability: full`, takes commit with [`Durability::Deferred`]).
    async fn sync_takes(&self) -> Result<(), ChannelError> {
        let Some(store) = self.0.store.get().filter(|s| s.sync_owed()).cloned() else {
            return Ok(());
        };
        tokio::task::spawn_blocking(move || store.sync_deferred())
            .await
            .map_err(|e| self.0.storage_error(e))?
            .map_err(|e| self.0.storage_error(e))
    }

    fn is_durable(&self) -> bool {
        true
    }

    fn len(&self) -> usize {
        self.0.size.get() as usize
    }

    fn capacity(&self) -> usize {
        self.0.capacity
    }
}

/// Up to `max` returned events from the front, joining consecutive returned batches.
fn take_returned(returned: &mut VecDeque<StoredEvents>, max: usize) -> Option<StoredEvents> {
    let mut batch = returned.pop_front()?;
    while let Some(next) = returned.front_mut() {
        let room = max.saturating_sub(batch.events.len());
        if room == 0 {
            break;
        }
        if next.events.len() <= room {
            let next = returned.pop_front()?;
            batch.sequences.extend(next.sequences);
            batch.events.extend(next.events);
        } else {
            batch.sequences.extend(next.sequences.drain(..room));
            batch.events.extend(next.events.drain(..room));
        }
    }
    if batch.events.len() > max {
        returned.push_front(StoredEvents {
            sequences: batch.sequences.split_off(max),
            events: batch.events.split_off(max),
        });
    }
    Some(batch)
}

/// Runs of consecutive numbers in increasing `sequences`, as `(first, last)`.
fn runs(sequences: &[u64]) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &seq in sequences {
        match runs.last_mut() {
            Some((_, last)) if seq == *last + 1 => *last = seq,
            _ => runs.push((seq, seq)),
        }
    }
    runs
}

impl FileTake {
    /// Commits the take, alone or as a part of a joint put. A full disk is waited out when
    /// alone; a joint part fails with the others (the take is given back to be taken again).
    async fn commit_in(mut self: Box<Self>, joint: Option<JointPart>) -> Result<(), ChannelError> {
        let Some(batch) = self.batch.take() else {
            return Ok(());
        };
        let mut joint = joint;
        if batch.events.is_empty() {
            if let Some(part) = joint.take() {
                // A joint put moves events; an empty take has none to move.
                let error = self
                    .channel
                    .storage_error("an empty take cannot be part of a joint put");
                if let Ok(store) = self.channel.state() {
                    part.abandon(ferry_core::state::StateError::Database {
                        path: store.path().to_owned(),
                        message: error.to_string(),
                    });
                }
                return Err(error);
            }
            return Ok(());
        }
        let n = batch.events.len();
        let runs = Arc::new(runs(&batch.sequences));
        let log = self.channel.log()?;
        let mut backoff = Duration::from_millis(100);
        let mut warned = false;
        loop {
            let (log, runs) = (Arc::clone(&log), Arc::clone(&runs));
            let joint_part = joint.take();
            let is_joint = joint_part.is_some();
            let result =
                tokio::task::spawn_blocking(move || log.commit_take(&runs, n as u64, joint_part))
                    .await;
            let error = match result {
                Ok(Ok(())) => {
                    self.channel.size.sub(n as u64);
                    self.channel.slots.add_permits(n);
                    return Ok(());
                }
                // The events were delivered: giving them back would deliver them twice, so
                // a full disk is waited out (puts keep a reserve for exactly this).
                Ok(Err(error)) if error.is_disk_full() && !is_joint => error,
                Ok(Err(error)) => {
                    self.give_back(batch);
                    return Err(self.channel.storage_error(error));
                }
                Err(error) => {
                    self.give_back(batch);
                    return Err(self.channel.storage_error(error));
                }
            };
            if !warned {
                warn!(channel = %self.channel.name, %error, "disk full: cannot record the delivered events as taken yet; retrying");
                warned = true;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }
}

/// An open take over stored events.
struct FileTake {
    channel: Arc<Shared>,
    /// `None` once committed or rolled back.
    batch: Option<StoredEvents>,
    /// Made by [`FileChannel::take_sequences`]: a rollback or failure only forgets the
    /// events (they stay in the log), rather than queueing them to be taken again.
    offline: bool,
}

impl FileTake {
    /// After a rollback or a failed commit: the events are to be taken again.
    fn give_back(&self, batch: StoredEvents) {
        if !self.offline {
            self.channel.give_back(batch);
        }
    }
}

const EMPTY: &[Event] = &[];

/// Most bytes of events (`Event::byte_size`) a channel keeps in memory after their put commits,
/// so that a take soon after reads them from there rather than from the segment file (and
/// decodes nothing). A sink that keeps up takes everything from memory; one that lags reads
/// the segments, as after a restart.
const RECENT_BYTES: usize = 2 << 20;

#[async_trait]
impl TakeTransaction for FileTake {
    fn events(&self) -> &[Event] {
        self.batch.as_ref().map_or(EMPTY, |b| &b.events)
    }

    fn sequences(&self) -> Option<&[u64]> {
        Some(self.batch.as_ref().map_or(&[], |b| &b.sequences))
    }

    async fn commit(self: Box<Self>) -> Result<(), ChannelError> {
        self.commit_in(None).await
    }

    async fn commit_joint(self: Box<Self>, part: JointPart) -> Result<(), ChannelError> {
        self.commit_in(Some(part)).await
    }

    async fn rollback(mut self: Box<Self>) -> Result<(), ChannelError> {
        if let Some(batch) = self.batch.take() {
            self.give_back(batch);
        }
        Ok(())
    }

    /// Joins a later take of this channel: one commit records the runs of both in one
    /// transaction.
    fn absorb(&mut self, later: &mut dyn TakeTransaction) -> bool {
        let Some(later) = later
            .as_any_mut()
            .and_then(|any| any.downcast_mut::<FileTake>())
        else {
            return false;
        };
        if !Arc::ptr_eq(&self.channel, &later.channel) || self.offline != later.offline {
            return false;
        }
        let Some(batch) = self.batch.as_mut().filter(|b| !b.events.is_empty()) else {
            return false;
        };
        let Some(theirs) = later.batch.take_if(|b| !b.events.is_empty()) else {
            return false;
        };
        batch.events.extend(theirs.events);
        batch.sequences.extend(theirs.sequences);
        true
    }

    fn as_any_mut(&mut self) -> Option<&mut (dyn std::any::Any + Send)> {
        Some(self)
    }
}

impl Drop for FileTake {
    /// Undecided takes (their task was cancelled) are rolled back.
    fn drop(&mut self) {
        if let Some(batch) = self.batch.take() {
            self.give_back(batch);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_core::{Checkpoint, CheckpointStore};

    fn options(capacity: usize, tx: usize) -> FileChannelConfig {
        FileChannelConfig {
            capacity,
            transaction_capacity: tx,
            durability: Durability::Normal,
            data_dir: None,
            minimum_free_space: ByteSize(0),
            max_file_size: ByteSize(64 << 20),
        }
    }

    async fn channel(dir: &std::path::Path, name: &str, capacity: usize) -> FileChannel {
        let ch = FileChannel::new(name, &options(capacity, 100), dir.to_owned());
        ch.start().await.unwrap();
        ch
    }

    fn batch(range: std::ops::Range<u32>, checkpoint: Option<&str>) -> PutBatch {
        PutBatch {
            source: "src".into(),
            events: range.map(|i| Event::from_body(i.to_string())).collect(),
            checkpoint: checkpoint.map(|c| Checkpoint::new(c.as_bytes().to_vec())),
            ack: None,
            joint: None,
        }
    }

    fn bodies(tx: &dyn TakeTransaction) -> Vec<String> {
        tx.events()
            .iter()
            .map(|e| String::from_utf8_lossy(&e.body).into_owned())
            .collect()
    }

    #[tokio::test]
    async fn put_commits_events_with_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let ch = channel(dir.path(), "c", 100).await;
        ch.put(batch(0..3, Some("after-2"))).await.unwrap();
        let store = StateStore::open(dir.path()).unwrap();
        assert_eq!(
            store.load("src").unwrap(),
            Some(Checkpoint::new(b"after-2".to_vec()))
        );
        let tx = ch.take(10, Duration::ZERO).await.unwrap();
        assert_eq!(bodies(&*tx), ["0", "1", "2"]);
        assert_eq!(tx.sequences(), Some(&[1, 2, 3][..]));
    }

    /// A source over several file channels of one directory, every channel a part of one
    /// joint put with the checkpoint.
    fn fan_out(
        dir: &std::path::Path,
        channels: &[&FileChannel],
        selector: ferry_core::ChannelSelector,
    ) -> ferry_core::SourceContext {
        let options = ferry_core::SourceOptions {
            selector,
            ..ferry_core::SourceOptions::new("src")
        };
        ferry_core::SourceContext::with_options(
            "src",
            channels
                .iter()
                .map(|c| Arc::new((*c).clone()) as Arc<dyn Channel>)
                .collect(),
            Vec::new(),
            ferry_core::Shutdown::new(),
            Arc::new(StateStore::open(dir).unwrap()),
            options,
        )
        .unwrap()
    }

    fn numbered(range: std::ops::Range<u32>) -> Vec<Event> {
        range.map(|i| Event::from_body(i.to_string())).collect()
    }

    #[tokio::test]
    async fn a_fan_out_into_file_channels_commits_every_part_and_the_checkpoint_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let a = channel(dir.path(), "a", 100).await;
        let b = channel(dir.path(), "b", 100).await;
        let ctx = fan_out(dir.path(), &[&a, &b], Default::default());
        let checkpoint = |c: &str| Some(Checkpoint::new(c.as_bytes().to_vec()));
        ctx.send(numbered(0..3), checkpoint("after-2"))
            .await
            .unwrap();
        // Everything filtered away, or routed elsewhere: the checkpoint still moves.
        ctx.send(Vec::new(), checkpoint("after-9")).await.unwrap();
        let store = StateStore::open(dir.path()).unwrap();
        assert_eq!(store.load("src").unwrap(), checkpoint("after-9"));
        for ch in [&a, &b] {
            let tx = ch.take(10, Duration::ZERO).await.unwrap();
            assert_eq!(bodies(&*tx), ["0", "1", "2"], "{}", ch.name());
            tx.commit().await.unwrap();
        }

        // A part that cannot be stored fails the whole put: no channel keeps its part, and
        // the checkpoint stays where it was.
        let small = FileChannel::new("small", &options(100, 2), dir.path().to_owned());
        small.start().await.unwrap();
        let ctx = fan_out(dir.path(), &[&a, &small], Default::default());
        let error = ctx.send(numbered(0..3), checkpoint("after-12")).await;
        assert!(
            matches!(error, Err(ChannelError::BatchTooLarge { .. })),
            "{error:?}"
        );
        assert_eq!(store.load("src").unwrap(), checkpoint("after-9"));
        assert_eq!(a.len(), 0);
        // The channels go on working.
        ctx.send(numbered(5..7), checkpoint("after-6"))
            .await
            .unwrap();
        assert_eq!(store.load("src").unwrap(), checkpoint("after-6"));
        let tx = a.take(10, Duration::ZERO).await.unwrap();
        assert_eq!(bodies(&*tx), ["5", "6"]);
    }

    /// Takes `n` events from `from` and moves them into `to` in one joint put of `from`'s
    /// store: the take commit is one part, the put the other.
    async fn move_jointly(from: &FileChannel, to: &FileChannel, n: usize, fail_put: bool) {
        let store = from.joint_store().unwrap();
        let mut parts = store.begin_joint_put(2, "mover", None).await;
        let (take_part, put_part) = (parts.pop().unwrap(), parts.pop().unwrap());
        let take = from.take(n, Duration::ZERO).await.unwrap();
        let events = take.events().to_vec();
        let put = async {
            if fail_put {
                // Refused before it was stored: the whole move fails.
                drop(put_part);
                return Err(to.0.storage_error("refused"));
            }
            to.put(PutBatch {
                source: "mover".into(),
                events,
                checkpoint: None,
                ack: None,
                joint: Some(put_part),
            })
            .await
        };
        let (put, commit) = tokio::join!(put, take.commit_joint(take_part));
        assert_eq!(put.is_ok(), !fail_put, "{put:?}");
        assert_eq!(commit.is_ok(), !fail_put, "{commit:?}");
    }

    #[tokio::test]
    async fn a_take_committed_in_a_joint_put_moves_its_events_in_one_transaction() {
        let dir = tempfile::tempdir().unwrap();
        let a = channel(dir.path(), "a", 100).await;
        let b = channel(dir.path(), "b", 100).await;
        a.put(batch(0..5, None)).await.unwrap();
        // A failed move leaves the events in `a`, to be taken again, and nothing in `b`.
        move_jointly(&a, &b, 2, true).await;
        assert_eq!((a.len(), b.len()), (5, 0));
        move_jointly(&a, &b, 2, false).await;
        assert_eq!((a.len(), b.len()), (3, 2));
        drop((a, b));
        // After a restart the move is there, whole.
        let a = channel(dir.path(), "a", 100).await;
        let b = channel(dir.path(), "b", 100).await;
        assert_eq!(drain(&a).await, ["2", "3", "4"]);
        assert_eq!(drain(&b).await, ["0", "1"]);
    }

    #[tokio::test]
    async fn take_sequences_takes_a_range_and_leaves_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let a = channel(dir.path(), "a", 100).await;
        a.put(batch(0..10, None)).await.unwrap();
        drop(a);
        let a = channel(dir.path(), "a", 100).await;
        let take = a.take_sequences(4..=6, 100).await.unwrap();
        assert_eq!(
            bodies(&*take),
            ["3", "4", "5"],
            "sequence numbers start at 1"
        );
        take.commit().await.unwrap();
        drop(a);
        let a = channel(dir.path(), "a", 100).await;
        assert_eq!(drain(&a).await, ["0", "1", "2", "6", "7", "8", "9"]);
    }

    #[tokio::test]
    async fn a_multiplexed_fan_out_puts_each_event_in_its_channel_and_survives_a_restart() {
        use ferry_core::selector::{ChannelSelector, Route};
        let dir = tempfile::tempdir().unwrap();
        let route = |c: usize| Route {
            required: vec![c],
            optional: vec![],
        };
        let selector = ChannelSelector::Multiplexing {
            header: "parity".into(),
            mapping: [("even".to_owned(), route(0)), ("odd".to_owned(), route(1))].into(),
            default: route(0),
        };
        let events = |range: std::ops::Range<u32>| {
            range
                .map(|i| {
                    let mut e = Event::from_body(i.to_string());
                    let parity = if i % 2 == 0 { "even" } else { "odd" };
                    e.headers.insert("parity".into(), parity.into());
                    e
                })
                .collect::<Vec<_>>()
        };
        {
            let even = channel(dir.path(), "even", 100).await;
            let odd = channel(dir.path(), "odd", 100).await;
            let ctx = fan_out(dir.path(), &[&even, &odd], selector.clone());
            ctx.send(events(0..6), Some(Checkpoint::new(b"6".to_vec())))
                .await
                .unwrap();
            // Only odd events: the even channel (the keeper of the checkpoint is the last
            // one, `odd`) gets nothing, and nothing is written to it.
            ctx.send(events(7..8), Some(Checkpoint::new(b"8".to_vec())))
                .await
                .unwrap();
        }
        let even = FileChannel::new("even", &options(100, 100), dir.path().to_owned());
        even.start().await.unwrap();
        let odd = FileChannel::new("odd", &options(100, 100), dir.path().to_owned());
        odd.start().await.unwrap();
        let ctx = fan_out(dir.path(), &[&even, &odd], selector);
        assert_eq!(ctx.checkpoint(), Some(&Checkpoint::new(b"8".to_vec())));
        assert_eq!(drain(&even).await, ["0", "2", "4"]);
        assert_eq!(drain(&odd).await, ["1", "3", "5", "7"]);
    }

    #[tokio::test]
    async fn a_put_without_events_still_commits_its_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        {
            let ch = channel(dir.path(), "c", 100).await;
            // On a fresh channel (no segment yet), then after events.
            ch.put(batch(0..0, Some("filtered-1"))).await.unwrap();
            let store = StateStore::open(dir.path()).unwrap();
            assert_eq!(
                store.load("src").unwrap(),
                Some(Checkpoint::new(b"filtered-1".to_vec()))
            );
            ch.put(batch(0..2, Some("after-1"))).await.unwrap();
            ch.put(batch(0..0, Some("filtered-2"))).await.unwrap();
            assert_eq!(
                store.load("src").unwrap(),
                Some(Checkpoint::new(b"filtered-2".to_vec()))
            );
        }
        let ch = FileChannel::new("c", &options(100, 100), dir.path().to_owned());
        ch.start().await.unwrap();
        assert_eq!(ch.len(), 2, "the events survive the empty commits");
        let tx = ch.take(10, Duration::ZERO).await.unwrap();
        assert_eq!(bodies(&*tx), ["0", "1"]);
    }

    #[tokio::test]
    async fn uncommitted_events_are_taken_again_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        {
            let ch = channel(dir.path(), "restart", 100).await;
            ch.put(batch(0..5, None)).await.unwrap();
            let tx = ch.take(2, Duration::ZERO).await.unwrap();
            tx.commit().await.unwrap();
            let tx = ch.take(2, Duration::ZERO).await.unwrap();
            assert_eq!(bodies(&*tx), ["2", "3"]);
            std::mem::forget(tx); // the process dies with this take open
        }
        // A new channel object over the same directory stands for the restarted agent.
        let ch = FileChannel::new("restart", &options(100, 100), dir.path().to_owned());
        ch.start().await.unwrap();
        assert_eq!(ch.len(), 3);
        let tx = ch.take(10, Duration::ZERO).await.unwrap();
        assert_eq!(bodies(&*tx), ["2", "3", "4"]);
        assert_eq!(tx.sequences(), Some(&[3, 4, 5][..]));
    }

    #[tokio::test]
    async fn rollback_returns_events_before_newer_ones() {
        let dir = tempfile::tempdir().unwrap();
        let ch = channel(dir.path(), "rb", 100).await;
        ch.put(batch(0..6, None)).await.unwrap();
        let first = ch.take(2, Duration::ZERO).await.unwrap();
        let second = ch.take(2, Duration::ZERO).await.unwrap();
        second.rollback().await.unwrap();
        first.rollback().await.unwrap();
        let tx = ch.take(3, Duration::ZERO).await.unwrap();
        assert_eq!(
            bodies(&*tx),
            ["0", "1", "2"],
            "returned batches join, in order"
        );
        tx.commit().await.unwrap();
        let tx = ch.take(10, Duration::ZERO).await.unwrap();
        assert_eq!(bodies(&*tx), ["3"], "the rest of a split batch comes next");
        drop(tx);
        let tx = ch.take(10, Duration::ZERO).await.unwrap();
        assert_eq!(bodies(&*tx), ["3"], "a dropped take is rolled back");
        tx.commit().await.unwrap();
        let tx = ch.take(10, Duration::ZERO).await.unwrap();
        assert_eq!(bodies(&*tx), ["4", "5"]);
    }

    #[tokio::test]
    async fn full_channel_blocks_put_until_a_commit() {
        let dir = tempfile::tempdir().unwrap();
        let ch = channel(dir.path(), "full", 4).await;
        ch.put(batch(0..4, None)).await.unwrap();
        assert!(matches!(
            ch.try_put(batch(4..5, None)).await,
            Err(ChannelError::Full { .. })
        ));
        let waiting = tokio::spawn({
            let ch = ch.clone();
            async move { ch.put(batch(4..6, None)).await }
        });
        let tx = ch.take(2, Duration::ZERO).await.unwrap();
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        tx.commit().await.unwrap();
        waiting.await.unwrap().unwrap();
        assert_eq!(ch.len(), 4);
    }

    #[tokio::test]
    async fn two_channels_share_a_directory_without_clashing() {
        let dir = tempfile::tempdir().unwrap();
        let a = channel(dir.path(), "a", 100).await;
        let b = channel(dir.path(), "b", 100).await;
        a.put(batch(0..2, None)).await.unwrap();
        b.put(batch(10..13, None)).await.unwrap();
        assert_eq!(
            bodies(&*a.take(10, Duration::ZERO).await.unwrap()),
            ["0", "1"]
        );
        assert_eq!(
            bodies(&*b.take(10, Duration::ZERO).await.unwrap()),
            ["10", "11", "12"]
        );
    }

    #[tokio::test]
    async fn take_waits_for_a_put() {
        let dir = tempfile::tempdir().unwrap();
        let ch = channel(dir.path(), "w", 100).await;
        let taker = tokio::spawn({
            let ch = ch.clone();
            async move { bodies(&*ch.take(10, Duration::from_secs(30)).await.unwrap()) }
        });
        tokio::task::yield_now().await;
        ch.put(batch(0..1, None)).await.unwrap();
        assert_eq!(taker.await.unwrap(), ["0"]);
    }

    fn segment_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
        let mut files: Vec<_> = std::fs::read_dir(dir.join("channels/1"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        files
    }

    async fn drain(ch: &FileChannel) -> Vec<String> {
        let mut out = Vec::new();
        loop {
            let tx = ch.take(1000, Duration::ZERO).await.unwrap();
            if tx.events().is_empty() {
                return out;
            }
            out.extend(bodies(&*tx));
            tx.commit().await.unwrap();
        }
    }

    fn numbers(range: std::ops::Range<u32>) -> Vec<String> {
        range.map(|i| i.to_string()).collect()
    }

    #[tokio::test]
    async fn segments_roll_and_are_deleted_once_taken() {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = options(10_000, 100);
        opts.max_file_size = ByteSize(2000);
        let ch = FileChannel::new("roll", &opts, dir.path().to_owned());
        ch.start().await.unwrap();
        for i in 0..20 {
            ch.put(batch(i * 50..(i + 1) * 50, None)).await.unwrap();
        }
        let before = segment_files(dir.path()).len();
        assert!(before >= 5, "{before} segments");
        assert_eq!(drain(&ch).await, numbers(0..1000));
        let after = segment_files(dir.path());
        assert_eq!(after.len(), 1, "only the last segment stays: {after:?}");
        // Reopened, the channel is empty and numbers on.
        drop(ch);
        let ch = FileChannel::new("roll", &opts, dir.path().to_owned());
        ch.start().await.unwrap();
        assert_eq!(ch.len(), 0);
        ch.put(batch(5000..5001, None)).await.unwrap();
        let tx = ch.take(10, Duration::ZERO).await.unwrap();
        assert_eq!(tx.sequences(), Some(&[1001][..]));
    }

    #[tokio::test]
    async fn bytes_of_a_put_that_never_committed_are_cut_at_start() {
        let dir = tempfile::tempdir().unwrap();
        {
            let ch = channel(dir.path(), "torn", 100).await;
            ch.put(batch(0..3, Some("after-2"))).await.unwrap();
        }
        // A crash in the middle of the next put's write: half a frame past the committed end.
        let segment = segment_files(dir.path()).pop().unwrap();
        let committed = std::fs::metadata(&segment).unwrap().len();
        let mut torn = segment::EncodedBatch::new(&[Event::from_body("never committed")]).unwrap();
        let frame = torn.seal(4).to_vec();
        let mut bytes = std::fs::read(&segment).unwrap();
        bytes.extend_from_slice(&frame[..frame.len() / 2]);
        std::fs::write(&segment, bytes).unwrap();

        let ch = channel(dir.path(), "torn", 100).await;
        assert_eq!(std::fs::metadata(&segment).unwrap().len(), committed);
        ch.put(batch(3..5, Some("after-4"))).await.unwrap();
        assert_eq!(drain(&ch).await, numbers(0..5));
    }

    #[tokio::test]
    async fn a_segment_shorter_than_committed_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        {
            let ch = channel(dir.path(), "cut", 100).await;
            ch.put(batch(0..3, None)).await.unwrap();
            ch.put(batch(3..6, None)).await.unwrap();
        }
        // The disk lost the end of a committed batch.
        let segment = segment_files(dir.path()).pop().unwrap();
        let len = std::fs::metadata(&segment).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&segment)
            .unwrap()
            .set_len(len - 5)
            .unwrap();
        let ch = FileChannel::new("cut", &options(100, 100), dir.path().to_owned());
        let err = ch.start().await.unwrap_err().to_string();
        assert!(err.contains(&segment.display().to_string()), "{err}");
        assert!(err.contains("committed length"), "{err}");
    }

    #[tokio::test]
    async fn a_damaged_batch_is_reported_and_nothing_past_it_is_served() {
        let dir = tempfile::tempdir().unwrap();
        {
            let ch = channel(dir.path(), "crc", 100).await;
            ch.put(batch(0..3, None)).await.unwrap();
            ch.put(batch(3..6, None)).await.unwrap();
            ch.put(batch(6..9, None)).await.unwrap();
        }
        let segment = segment_files(dir.path()).pop().unwrap();
        let mut bytes = std::fs::read(&segment).unwrap();
        let frame_len = bytes.len() / 3;
        // A bit flips in the body of the second batch's last event.
        let damaged_at = 2 * frame_len - 1;
        bytes[damaged_at] ^= 0x10;
        std::fs::write(&segment, bytes).unwrap();

        let ch = channel(dir.path(), "crc", 100).await;
        let tx = ch.take(3, Duration::ZERO).await.unwrap();
        assert_eq!(bodies(&*tx), ["0", "1", "2"]);
        tx.commit().await.unwrap();
        for _ in 0..2 {
            let err = match ch.take(100, Duration::ZERO).await {
                Err(e) => e.to_string(),
                Ok(tx) => panic!("served {:?}", bodies(&*tx)),
            };
            assert!(err.contains(&segment.display().to_string()), "{err}");
            assert!(err.contains(&format!("byte {frame_len}")), "{err}");
            assert!(err.contains("checksum"), "{err}");
        }
    }

    /// The events of the puts that fit in `RECENT_BYTES` are taken from memory: a frame damaged
    /// on disk after its put is still served whole by the channel that put it (a read of the
    /// file would refuse it), while the frames past that much are read from the file, damage
    /// and all; after a restart every frame is read from the file.
    #[tokio::test]
    async fn takes_soon_after_the_puts_read_their_events_from_memory_up_to_a_bound() {
        let dir = tempfile::tempdir().unwrap();
        let body = |i: u32| format!("{i:010000}");
        let big = |batch: u32| PutBatch {
            source: "src".into(),
            events: (batch * 100..(batch + 1) * 100)
                .map(|i| Event::from_body(body(i)))
                .collect(),
            checkpoint: None,
            ack: None,
            joint: None,
        };
        // Puts of 1,000,000 bytes of events: `fit` of them fit in memory, two more do not.
        let fit = RECENT_BYTES / 1_000_000;
        assert!(fit >= 2);
        let puts = fit as u32 + 2;
        let ch = FileChannel::new(
            "recent",
            &options(100 * puts as usize, 100),
            dir.path().to_owned(),
        );
        ch.start().await.unwrap();
        for batch in 0..puts {
            ch.put(big(batch)).await.unwrap();
        }
        let segment = segment_files(dir.path()).pop().unwrap();
        let mut bytes = std::fs::read(&segment).unwrap();
        let frame_len = bytes.len() / puts as usize;
        // A bit flips in the last event of the second frame and of the first not in memory.
        bytes[2 * frame_len - 1] ^= 0x10;
        bytes[(fit + 1) * frame_len - 1] ^= 0x10;
        std::fs::write(&segment, bytes).unwrap();

        let mut served = Vec::new();
        let err = loop {
            match ch.take(100, Duration::ZERO).await {
                Ok(tx) => {
                    assert!(
                        !tx.events().is_empty(),
                        "the damage past memory went unseen"
                    );
                    served.extend(bodies(&*tx));
                    tx.commit().await.unwrap();
                }
                Err(e) => break e.to_string(),
            }
        };
        let numbers: Vec<u32> = served.iter().map(|b| b.parse().unwrap()).collect();
        let in_memory = 100 * fit as u32;
        assert_eq!(
            numbers,
            (0..in_memory).collect::<Vec<_>>(),
            "the events served"
        );
        assert!(served.iter().zip(0..).all(|(b, i)| *b == body(i)));
        assert!(err.contains(&format!("byte {}", fit * frame_len)), "{err}");
        assert!(err.contains("checksum"), "{err}");
        drop(ch);

        // After a restart nothing is in memory: a damaged frame is refused.
        let dir = tempfile::tempdir().unwrap();
        {
            let ch = channel(dir.path(), "restart", 100).await;
            ch.put(batch(0..3, None)).await.unwrap();
            ch.put(batch(3..6, None)).await.unwrap();
        }
        let segment = segment_files(dir.path()).pop().unwrap();
        let mut bytes = std::fs::read(&segment).unwrap();
        let frame_len = bytes.len() / 2;
        bytes[frame_len - 1] ^= 0x10;
        std::fs::write(&segment, bytes).unwrap();
        let ch = channel(dir.path(), "restart", 100).await;
        let err = match ch.take(100, Duration::ZERO).await {
            Err(e) => e.to_string(),
            Ok(tx) => panic!("served {:?} after a restart", bodies(&*tx)),
        };
        assert!(err.contains("byte 0"), "{err}");
    }

    #[tokio::test]
    async fn takes_committed_out_of_order_are_not_served_again_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        {
            let ch = channel(dir.path(), "ooo", 100).await;
            ch.put(batch(0..9, None)).await.unwrap();
            let first = ch.take(3, Duration::ZERO).await.unwrap();
            let second = ch.take(3, Duration::ZERO).await.unwrap();
            assert_eq!(bodies(&*second), ["3", "4", "5"]);
            second.commit().await.unwrap();
            std::mem::forget(first); // the process dies with the first take open
        }
        let ch = channel(dir.path(), "ooo", 100).await;
        assert_eq!(ch.len(), 6);
        assert_eq!(drain(&ch).await, ["0", "1", "2", "6", "7", "8"]);
    }

    #[tokio::test]
    async fn takes_joined_commit_in_one_transaction_and_roll_back_together() {
        let dir = tempfile::tempdir().unwrap();
        {
            let ch = channel(dir.path(), "join", 100).await;
            ch.put(batch(0..9, None)).await.unwrap();
            let mut first = ch.take(2, Duration::ZERO).await.unwrap();
            let other = ch.take(2, Duration::ZERO).await.unwrap(); // another sink's
            let mut third = ch.take(2, Duration::ZERO).await.unwrap();
            assert!(first.absorb(third.as_mut()), "takes of one channel join");
            assert!(
                third.events().is_empty(),
                "the joined take holds nothing more"
            );
            drop(third);
            assert_eq!(bodies(&*first), ["0", "1", "4", "5"]);
            assert_eq!(first.sequences(), Some(&[1, 2, 5, 6][..]));
            let elsewhere = channel(dir.path(), "elsewhere", 100).await;
            elsewhere.put(batch(0..1, None)).await.unwrap();
            let mut foreign = elsewhere.take(1, Duration::ZERO).await.unwrap();
            assert!(
                !first.absorb(foreign.as_mut()),
                "a take of another channel stays apart"
            );
            assert_eq!(bodies(&*foreign), ["0"]);
            first.rollback().await.unwrap();
            other.rollback().await.unwrap();
            let again = ch.take(10, Duration::ZERO).await.unwrap();
            let mut returned = bodies(&*again);
            returned.sort();
            assert_eq!(
                returned,
                ["0", "1", "2", "3", "4", "5"],
                "a joined rollback returns the events of both"
            );
            again.rollback().await.unwrap();
            let mut first = ch.take(4, Duration::ZERO).await.unwrap();
            let mut second = ch.take(2, Duration::ZERO).await.unwrap();
            assert!(first.absorb(second.as_mut()));
            first.commit().await.unwrap();
            assert_eq!(ch.len(), 3);
            drop(second);
        }
        let ch = channel(dir.path(), "join", 100).await;
        assert_eq!(ch.len(), 3, "the joined commit is durable");
        assert_eq!(drain(&ch).await, ["6", "7", "8"]);
    }

    #[tokio::test]
    async fn with_full_durability_a_take_commit_is_synced_later_unless_it_deletes_a_segment() {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = options(1000, 100);
        opts.durability = Durability::Full;
        // A segment per put.
        opts.max_file_size = ByteSize(1);
        let ch = FileChannel::new("deferred", &opts, dir.path().to_owned());
        ch.start().await.unwrap();
        let store = ch.joint_store().unwrap();
        ch.put(batch(0..10, None)).await.unwrap();
        ch.put(batch(10..20, None)).await.unwrap();
        assert!(!store.sync_owed());
        let take = |n| ch.take(n, Duration::ZERO);
        // Half of the first segment: nothing is deleted, the fsync is left for later.
        take(5).await.unwrap().commit().await.unwrap();
        assert!(store.sync_owed());
        ch.sync_takes().await.unwrap();
        assert!(!store.sync_owed());
        // The rest of it: the segment file goes, after a commit synced at once.
        take(5).await.unwrap().commit().await.unwrap();
        assert!(!store.sync_owed());
        let segments = dir.path().join("channels").join("1");
        assert!(segment::segment_path(&segments, 11).exists());
        assert!(!segment::segment_path(&segments, 1).exists());
        // The next put's fsync covers a take committed before it.
        take(5).await.unwrap().commit().await.unwrap();
        assert!(store.sync_owed());
        ch.put(batch(20..30, None)).await.unwrap();
        assert!(!store.sync_owed());
        drop(ch);
        let ch = channel(dir.path(), "deferred", 1000).await;
        assert_eq!(drain(&ch).await.len(), 15);

        // With `durability: normal` nothing is ever owed.
        let other = tempfile::tempdir().unwrap();
        let ch = FileChannel::new("normal", &options(1000, 100), other.path().to_owned());
        ch.start().await.unwrap();
        ch.put(batch(0..10, None)).await.unwrap();
        ch.take(5, Duration::ZERO)
            .await
            .unwrap()
            .commit()
            .await
            .unwrap();
        assert!(!ch.joint_store().unwrap().sync_owed());
    }

    #[tokio::test]
    async fn concurrent_puts_share_commits_and_every_event_gets_one_number() {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = options(100_000, 100);
        opts.durability = Durability::Full;
        let ch = FileChannel::new("group", &opts, dir.path().to_owned());
        ch.start().await.unwrap();
        let mut puts = tokio::task::JoinSet::new();
        for p in 0..8u32 {
            let ch = ch.clone();
            puts.spawn(async move {
                for b in 0..20u32 {
                    let from = p * 10_000 + b * 10;
                    let mut put = batch(from..from + 10, Some(&format!("{p}-{b}")));
                    put.source = format!("src-{p}");
                    ch.put(put).await.unwrap();
                }
            });
        }
        while let Some(done) = puts.join_next().await {
            done.unwrap();
        }
        let mut seen = Vec::new();
        let mut sequences = Vec::new();
        loop {
            let tx = ch.take(1000, Duration::ZERO).await.unwrap();
            if tx.events().is_empty() {
                break;
            }
            sequences.extend_from_slice(tx.sequences().unwrap());
            seen.extend(bodies(&*tx));
            tx.commit().await.unwrap();
        }
        assert_eq!(sequences, (1..=1600).collect::<Vec<u64>>());
        seen.sort();
        let mut expected: Vec<String> = (0..8u32)
            .flat_map(|p| (0..200).map(move |i| (p * 10_000 + i).to_string()))
            .collect();
        expected.sort();
        assert_eq!(seen, expected);
        let store = StateStore::open(dir.path()).unwrap();
        for p in 0..8 {
            assert_eq!(
                ferry_core::CheckpointStore::load(&store, &format!("src-{p}")).unwrap(),
                Some(Checkpoint::new(format!("{p}-19").into_bytes()))
            );
        }
    }

    #[tokio::test]
    async fn a_channel_of_the_row_format_is_migrated_and_drains_exactly_once() {
        let dir = tempfile::tempdir().unwrap();
        {
            // The schema and encoding of version 1: one row per event.
            let conn = rusqlite::Connection::open(dir.path().join("state.db")).unwrap();
            conn.execute_batch(
                "CREATE TABLE checkpoints (source TEXT PRIMARY KEY, checkpoint BLOB NOT NULL);
                 CREATE TABLE sink_progress (sink TEXT PRIMARY KEY, progress BLOB NOT NULL);
                 CREATE TABLE channels (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE,
                                        next_seq INTEGER NOT NULL);
                 CREATE TABLE channel_1 (seq INTEGER PRIMARY KEY, headers BLOB NOT NULL,
                                         body BLOB NOT NULL);
                 INSERT INTO channels VALUES (1, 'old', 3001);
                 INSERT INTO checkpoints VALUES ('src', x'6f6c64');
                 PRAGMA user_version = 1;",
            )
            .unwrap();
            let mut header = Vec::new();
            for (k, v) in [("file", "/var/log/a.log"), ("host", "h")] {
                header.extend_from_slice(&(k.len() as u32).to_le_bytes());
                header.extend_from_slice(k.as_bytes());
                header.extend_from_slice(&(v.len() as u32).to_le_bytes());
                header.extend_from_slice(v.as_bytes());
            }
            let headers = [&2u32.to_le_bytes()[..], &header].concat();
            // 1..=1000 were taken, 1500..=1999 too (another sink), 2990..=3000 as well.
            conn.execute_batch("BEGIN").unwrap();
            for seq in (1001..1500).chain(2000..2990) {
                conn.execute(
                    "INSERT INTO channel_1 VALUES (?1, ?2, ?3)",
                    rusqlite::params![seq, &headers, seq.to_string().into_bytes()],
                )
                .unwrap();
            }
            conn.execute_batch("COMMIT").unwrap();
        }
        let mut opts = options(10_000, 1000);
        opts.max_file_size = ByteSize(16 << 10);
        let ch = FileChannel::new("old", &opts, dir.path().to_owned());
        ch.start().await.unwrap();
        assert_eq!(ch.len(), 1489);
        let tx = ch.take(1, Duration::ZERO).await.unwrap();
        assert_eq!(
            tx.events()[0].headers.get("file").unwrap(),
            "/var/log/a.log"
        );
        assert_eq!(tx.sequences(), Some(&[1001][..]));
        tx.commit().await.unwrap();
        // Half of it is taken, then the agent dies and starts again.
        let taken = ch.take(700, Duration::ZERO).await.unwrap();
        let expected: Vec<String> = numbers(1002..1500)
            .into_iter()
            .chain(numbers(2000..2202))
            .collect();
        assert_eq!(bodies(&*taken), expected);
        taken.commit().await.unwrap();
        drop(ch);
        let ch = FileChannel::new("old", &opts, dir.path().to_owned());
        ch.start().await.unwrap();
        assert_eq!(ch.len(), 788);
        assert_eq!(drain(&ch).await, numbers(2202..2990));
        ch.put(batch(0..1, None)).await.unwrap();
        let tx = ch.take(1, Duration::ZERO).await.unwrap();
        assert_eq!(
            tx.sequences(),
            Some(&[3001][..]),
            "numbers go on after the old ones"
        );
        let store = StateStore::open(dir.path()).unwrap();
        assert_eq!(
            ferry_core::CheckpointStore::load(&store, "src").unwrap(),
            Some(Checkpoint::new(b"old".to_vec()))
        );
    }

    #[tokio::test]
    async fn a_take_cancelled_while_it_reads_loses_nothing() {
        use std::future::Future;
        let dir = tempfile::tempdir().unwrap();
        let ch = channel(dir.path(), "cancel", 1000).await;
        ch.put(batch(0..100, None)).await.unwrap();
        // Each take is polled until it waits for its read, then dropped, as a runner's
        // `select!` may; the read it started finishes without anyone to hand the events to.
        for _ in 0..5 {
            let mut take = Box::pin(ch.take(10, Duration::from_secs(1)));
            std::future::poll_fn(|cx| {
                let _ = take.as_mut().poll(cx);
                std::task::Poll::Ready(())
            })
            .await;
            drop(take);
            // Real time: the read runs on a blocking thread.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(drain(&ch).await, numbers(0..100));
    }
}
