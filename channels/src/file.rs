//! The `file` channel: durable, backed by the agent's SQLite state store (Flume's FileChannel).
//!
//! A put writes the batch and, in the same SQLite transaction, the source's checkpoint, so a
//! source writing here resumes exactly after what the channel holds: exactly-once into the
//! channel. Each event gets a sequence number that only grows, even across restarts; sinks with
//! exactly-once delivery record the last one they delivered. A take reads the next events; a
//! commit deletes them; a rollback keeps them in memory at the front of the queue so the next
//! take returns them again, in order. On start, every stored event is taken again from the
//! oldest: those a crash caught in an uncommitted take are delivered again (sinks skip them by
//! sequence number where they can).
//!
//! A full disk makes puts wait, logging once, until space returns; nothing is dropped.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use ferry_core::config::ByteSize;
use ferry_core::state::{Durability, StateError, StateStore, StoredEvents};
use ferry_core::{
    Channel, ChannelError, ComponentConfig, ComponentMetrics, ConfigError, Counter, Event,
    PutBatch, Registry, TakeTransaction, async_trait,
};
use serde::Deserialize;
use tokio::sync::{Notify, Semaphore};
use tracing::{info, warn};

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
    /// Directory of the state database; default: the agent's `data_dir` (Flume `dataDirs`).
    /// Channels in one directory share one database and never clash.
    #[serde(default)]
    pub data_dir: Option<PathBuf>,
    /// Puts wait while less than this much space is left for the database (Flume
    /// `minimumRequiredSpace`, default 500MB there; 64MiB here). The reserve is what lets
    /// sinks commit, and so free space, when the disk is full.
    #[serde(default = "default_minimum_free_space")]
    pub minimum_free_space: ByteSize,
}

fn default_minimum_free_space() -> ByteSize {
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

/// Events given back by rolled-back takes, waiting to be taken again before anything newer.
#[derive(Default)]
struct Queue {
    /// Sequence number of the next event not yet read from the database.
    next_read: u64,
    /// Sequence number the next put gets (one past the newest stored event).
    next_seq: u64,
    /// Rolled-back batches, oldest first.
    returned: VecDeque<StoredEvents>,
}

struct Shared {
    name: String,
    capacity: usize,
    transaction_capacity: usize,
    durability: Durability,
    data_dir: PathBuf,
    minimum_free_space: u64,
    store: OnceLock<StateStore>,
    queue: Mutex<Queue>,
    /// Serializes reads from the database so two takes never read the same events.
    reading: tokio::sync::Mutex<()>,
    /// Free event slots; empty until `start` counted what is stored.
    slots: Semaphore,
    available: Notify,
    metrics: ComponentMetrics,
    size: Counter,
    put_attempts: Counter,
    put_successes: Counter,
    take_attempts: Counter,
    take_successes: Counter,
}

impl Shared {
    fn lock_queue(&self) -> MutexGuard<'_, Queue> {
        // Critical sections are plain field updates; a poisoned lock holds consistent data.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn store(&self) -> Result<StateStore, ChannelError> {
        self.store
            .get()
            .cloned()
            .ok_or_else(|| ChannelError::Storage {
                channel: self.name.clone(),
                message: "channel used before it was started".into(),
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
        let mut queue = self.lock_queue();
        let at = queue
            .returned
            .iter()
            .position(|b| b.sequences.first().is_some_and(|s| *s > first))
            .unwrap_or(queue.returned.len());
        queue.returned.insert(at, batch);
        drop(queue);
        self.available.notify_waiters();
    }
}

/// A durable channel stored in the agent's SQLite database.
#[derive(Clone)]
pub struct FileChannel(Arc<Shared>);

impl FileChannel {
    /// A channel named `name` storing its events under `data_dir`.
    pub fn new(name: &str, options: &FileChannelConfig, data_dir: PathBuf) -> Self {
        let metrics = ComponentMetrics::new("channel", name);
        metrics
            .counter("ChannelCapacity")
            .set(options.capacity as u64);
        Self(Arc::new(Shared {
            name: name.to_owned(),
            capacity: options.capacity,
            transaction_capacity: options.transaction_capacity,
            durability: options.durability,
            data_dir,
            minimum_free_space: options.minimum_free_space.bytes(),
            store: OnceLock::new(),
            queue: Mutex::default(),
            reading: tokio::sync::Mutex::new(()),
            slots: Semaphore::new(0),
            available: Notify::new(),
            size: metrics.counter("ChannelSize"),
            put_attempts: metrics.counter("EventPutAttemptCount"),
            put_successes: metrics.counter("EventPutSuccessCount"),
            take_attempts: metrics.counter("EventTakeAttemptCount"),
            take_successes: metrics.counter("EventTakeSuccessCount"),
            metrics,
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
    async fn store(&self, batch: PutBatch) -> Result<(), ChannelError> {
        let n = batch.events.len();
        let store = self.0.store()?;
        let shared = Arc::clone(&self.0);
        let batch = Arc::new(batch);
        let mut backoff = Duration::from_millis(100);
        let mut warned = false;
        loop {
            let (store, shared2, batch2) = (store.clone(), Arc::clone(&shared), Arc::clone(&batch));
            let result = tokio::task::spawn_blocking(move || {
                let needed = shared2.minimum_free_space
                    + batch2.events.iter().map(Event::byte_size).sum::<usize>() as u64;
                if store.available_bytes()? < needed {
                    store.reclaim_space()?;
                    if store.available_bytes()? < needed {
                        return Err(StateError::DiskFull {
                            path: store.path().to_owned(),
                        });
                    }
                }
                let checkpoint = batch2
                    .checkpoint
                    .as_ref()
                    .map(|c| (batch2.source.as_str(), c));
                store.append(
                    &shared2.name,
                    &batch2.events,
                    checkpoint,
                    shared2.durability,
                )
            })
            .await
            .map_err(|e| self.0.storage_error(e))?;
            match result {
                Ok(first) => {
                    if warned {
                        info!(channel = %self.0.name, "disk space is back; puts resumed");
                    }
                    let mut queue = self.0.lock_queue();
                    queue.next_seq = queue.next_seq.max(first + n as u64);
                    drop(queue);
                    self.0.size.add(n as u64);
                    self.0.put_successes.add(n as u64);
                    self.0.available.notify_waiters();
                    return Ok(());
                }
                Err(error @ StateError::DiskFull { .. }) => {
                    if !warned {
                        warn!(channel = %self.0.name, %error, minimum_free_space = self.0.minimum_free_space, "disk full: the source waits until space is freed");
                        warned = true;
                    }
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
}

#[async_trait]
impl Channel for FileChannel {
    fn name(&self) -> &str {
        &self.0.name
    }

    async fn start(&self) -> Result<(), ChannelError> {
        if self.0.store.get().is_some() {
            return Ok(());
        }
        let shared = Arc::clone(&self.0);
        let (store, state) = tokio::task::spawn_blocking(move || {
            let store = StateStore::open(&shared.data_dir)?;
            let state = store.channel_state(&shared.name)?;
            Ok::<_, StateError>((store, state))
        })
        .await
        .map_err(|e| self.0.storage_error(e))?
        .map_err(|e| self.0.storage_error(e))?;
        {
            let mut queue = self.0.lock_queue();
            queue.next_read = state.first_seq;
            queue.next_seq = state.next_seq;
        }
        let stored = state.len as usize;
        if stored > 0 {
            info!(channel = %self.0.name, events = stored, "recovered stored events");
        }
        self.0.size.set(stored as u64);
        self.0
            .slots
            .add_permits(self.0.capacity.saturating_sub(stored));
        let _ = self.0.store.set(store);
        Ok(())
    }

    async fn put(&self, batch: PutBatch) -> Result<(), ChannelError> {
        self.0.put_attempts.add(batch.events.len() as u64);
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
        self.0.put_attempts.add(batch.events.len() as u64);
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
                let (returned, from, next_seq) = {
                    let mut queue = self.0.lock_queue();
                    let returned = take_returned(&mut queue.returned, max);
                    (returned, queue.next_read, queue.next_seq)
                };
                match returned {
                    Some(batch) => batch,
                    None if from < next_seq => {
                        let store = self.0.store()?;
                        let name = self.0.name.clone();
                        let read =
                            tokio::task::spawn_blocking(move || store.read(&name, from, max))
                                .await
                                .map_err(|e| self.0.storage_error(e))?
                                .map_err(|e| self.0.storage_error(e))?;
                        let mut queue = self.0.lock_queue();
                        queue.next_read = read.sequences.last().map_or(next_seq, |s| s + 1);
                        read
                    }
                    None => StoredEvents::default(),
                }
            };
            if !batch.events.is_empty()
                || tokio::time::timeout_at(deadline, notified).await.is_err()
            {
                self.0.take_attempts.inc();
                self.0.take_successes.add(batch.events.len() as u64);
                return Ok(Box::new(FileTake {
                    channel: Arc::clone(&self.0),
                    batch: Some(batch),
                }));
            }
        }
    }

    fn transaction_capacity(&self) -> usize {
        self.0.transaction_capacity
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

    fn metrics(&self) -> Option<&ComponentMetrics> {
        Some(&self.0.metrics)
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

/// An open take over stored events.
struct FileTake {
    channel: Arc<Shared>,
    /// `None` once committed or rolled back.
    batch: Option<StoredEvents>,
}

const EMPTY: &[Event] = &[];

#[async_trait]
impl TakeTransaction for FileTake {
    fn events(&self) -> &[Event] {
        self.batch.as_ref().map_or(EMPTY, |b| &b.events)
    }

    fn sequences(&self) -> Option<&[u64]> {
        Some(self.batch.as_ref().map_or(&[], |b| &b.sequences))
    }

    async fn commit(mut self: Box<Self>) -> Result<(), ChannelError> {
        let Some(batch) = self.batch.take() else {
            return Ok(());
        };
        let (Some(first), Some(last)) = (batch.sequences.first(), batch.sequences.last()) else {
            return Ok(());
        };
        let (first, last, n) = (*first, *last, batch.events.len());
        let store = self.channel.store()?;
        let mut backoff = Duration::from_millis(100);
        let mut warned = false;
        loop {
            let (store, name) = (store.clone(), self.channel.name.clone());
            let result =
                tokio::task::spawn_blocking(move || store.remove(&name, first..=last)).await;
            let error = match result {
                Ok(Ok(())) => {
                    self.channel.size.sub(n as u64);
                    self.channel.slots.add_permits(n);
                    return Ok(());
                }
                // The events were delivered: giving them back would deliver them twice, so
                // a full disk is waited out (puts keep a reserve for exactly this).
                Ok(Err(error @ StateError::DiskFull { .. })) => error,
                Ok(Err(error)) => {
                    self.channel.give_back(batch);
                    return Err(self.channel.storage_error(error));
                }
                Err(error) => {
                    self.channel.give_back(batch);
                    return Err(self.channel.storage_error(error));
                }
            };
            if !warned {
                warn!(channel = %self.channel.name, %error, "disk full: cannot remove delivered events yet; retrying");
                warned = true;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }

    async fn rollback(mut self: Box<Self>) -> Result<(), ChannelError> {
        if let Some(batch) = self.batch.take() {
            self.channel.give_back(batch);
        }
        Ok(())
    }
}

impl Drop for FileTake {
    /// Undecided takes (their task was cancelled) are rolled back.
    fn drop(&mut self) {
        if let Some(batch) = self.batch.take() {
            self.channel.give_back(batch);
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
}
