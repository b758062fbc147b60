//! The `memory` channel: a bounded in-memory queue (Flume's MemoryChannel).
//!
//! Capacity is reserved at put and released at take commit, so events held by an open take
//! transaction still count: memory stays bounded by `capacity` and `byte_capacity` whatever the
//! sinks do. A rolled-back take puts its events back at the front, in order. Events are lost if
//! the process dies; sources writing here save their checkpoints only after delivery (see
//! `ferry_core::ack`), so they are read again rather than lost.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ferry_core::config::ByteSize;
use ferry_core::{
    Acknowledgement, Channel, ChannelError, ComponentConfig, Event, PutBatch, Registry,
    TakeTransaction, async_trait,
};
use serde::Deserialize;
use tokio::sync::{Notify, Semaphore, TryAcquireError};

/// Options of the `memory` channel.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryChannelConfig {
    /// Most events stored (Flume `capacity`, default 100).
    #[serde(default = "default_capacity")]
    pub capacity: usize,
    /// Most events in one put or take (Flume `transactionCapacity`, default 100).
    #[serde(default = "default_capacity")]
    pub transaction_capacity: usize,
    /// Most bytes of event bodies and headers stored (Flume `byteCapacity`; default: no limit).
    #[serde(default)]
    pub byte_capacity: Option<ByteSize>,
}

fn default_capacity() -> usize {
    100
}

/// Registers the `memory` channel type.
pub fn register(registry: &mut Registry) {
    registry.register_channel("memory", |cfg| {
        let options: MemoryChannelConfig = cfg.parse()?;
        Ok(Arc::new(MemoryChannel::from_config(cfg, options)?))
    });
}

struct Entry {
    event: Event,
    ack: Option<Acknowledgement>,
}

struct Shared {
    name: String,
    capacity: usize,
    transaction_capacity: usize,
    queue: Mutex<VecDeque<Entry>>,
    /// Free event slots.
    slots: Semaphore,
    /// Free bytes, when `byte_capacity` is set.
    bytes: Option<Semaphore>,
    byte_capacity: u64,
    /// Woken when events are put or returned by a rollback.
    available: Notify,
}

/// A bounded in-memory channel.
#[derive(Clone)]
pub struct MemoryChannel(Arc<Shared>);

impl MemoryChannel {
    /// A channel named `name` with the given limits.
    pub fn new(name: &str, options: &MemoryChannelConfig) -> Self {
        let byte_capacity = options
            .byte_capacity
            .map(|b| b.bytes().min(Semaphore::MAX_PERMITS as u64));
        Self(Arc::new(Shared {
            name: name.to_owned(),
            capacity: options.capacity,
            transaction_capacity: options.transaction_capacity,
            queue: Mutex::new(VecDeque::with_capacity(options.capacity.min(1 << 16))),
            slots: Semaphore::new(options.capacity),
            bytes: byte_capacity.map(|b| Semaphore::new(b as usize)),
            byte_capacity: byte_capacity.unwrap_or(u64::MAX),
            available: Notify::new(),
        }))
    }

    fn from_config(
        cfg: &ComponentConfig,
        options: MemoryChannelConfig,
    ) -> Result<Self, ferry_core::ConfigError> {
        crate::check_capacities(cfg, options.capacity, options.transaction_capacity)?;
        Ok(Self::new(cfg.name(), &options))
    }

    /// Events and bytes of a batch that fits the limits; bytes are only counted (a pass over
    /// every event) when `byte_capacity` is set.
    fn check_batch(&self, batch: &PutBatch) -> Result<(usize, usize), ChannelError> {
        let n = batch.events.len();
        let count_bytes = || batch.events.iter().map(Event::byte_size).sum::<usize>();
        let too_large = |bytes, limit| ChannelError::BatchTooLarge {
            channel: self.0.name.clone(),
            events: n,
            bytes,
            limit,
        };
        if n > self.0.transaction_capacity {
            let limit = format!("transaction_capacity {}", self.0.transaction_capacity);
            return Err(too_large(count_bytes(), limit));
        }
        if self.0.bytes.is_none() {
            return Ok((n, 0));
        }
        let bytes = count_bytes();
        if bytes as u64 > self.0.byte_capacity || bytes > u32::MAX as usize {
            let limit = format!("byte_capacity {}", ByteSize(self.0.byte_capacity));
            return Err(too_large(bytes, limit));
        }
        Ok((n, bytes))
    }

    fn store(&self, batch: PutBatch) {
        {
            let mut queue = self.0.lock_queue();
            queue.extend(batch.events.into_iter().map(|event| Entry {
                event,
                ack: batch.ack.clone(),
            }));
        }
        self.0.available.notify_waiters();
    }
}

impl Shared {
    fn lock_queue(&self) -> MutexGuard<'_, VecDeque<Entry>> {
        // A panic while holding this lock cannot leave the queue half-changed (every critical
        // section is a single push/drain), so a poisoned lock is safe to reuse.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn release(&self, events: usize, bytes: usize) {
        self.slots.add_permits(events);
        if let Some(sem) = &self.bytes {
            sem.add_permits(bytes);
        }
    }
}

#[async_trait]
impl Channel for MemoryChannel {
    fn name(&self) -> &str {
        &self.0.name
    }

    async fn put(&self, batch: PutBatch) -> Result<(), ChannelError> {
        let (n, bytes) = self.check_batch(&batch)?;
        let closed = || ChannelError::Storage {
            channel: self.0.name.clone(),
            message: "channel closed".into(),
        };
        // Sizes were checked against the limits above, so the casts cannot truncate.
        self.0
            .slots
            .acquire_many(n as u32)
            .await
            .map_err(|_| closed())?
            .forget();
        if let Some(sem) = &self.0.bytes {
            sem.acquire_many(bytes as u32)
                .await
                .map_err(|_| closed())?
                .forget();
        }
        self.store(batch);
        Ok(())
    }

    async fn try_put(&self, batch: PutBatch) -> Result<(), ChannelError> {
        let (n, bytes) = self.check_batch(&batch)?;
        let full = || ChannelError::Full {
            channel: self.0.name.clone(),
        };
        let slots = match self.0.slots.try_acquire_many(n as u32) {
            Ok(permit) => permit,
            Err(TryAcquireError::NoPermits | TryAcquireError::Closed) => return Err(full()),
        };
        if let Some(sem) = &self.0.bytes {
            match sem.try_acquire_many(bytes as u32) {
                Ok(permit) => permit.forget(),
                Err(_) => return Err(full()),
            }
        }
        slots.forget();
        self.store(batch);
        Ok(())
    }

    async fn take(
        &self,
        max: usize,
        wait: Duration,
    ) -> Result<Box<dyn TakeTransaction>, ChannelError> {
        let max = max.min(self.0.transaction_capacity);
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Register for wake-ups before looking, so a put between the look and the wait
            // is not missed.
            let notified = self.0.available.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let entries: Vec<Entry> = {
                let mut queue = self.0.lock_queue();
                let n = max.min(queue.len());
                queue.drain(..n).collect()
            };
            if !entries.is_empty() || tokio::time::timeout_at(deadline, notified).await.is_err() {
                let (events, acks) = entries.into_iter().map(|e| (e.event, e.ack)).unzip();
                return Ok(Box::new(MemoryTake {
                    channel: Arc::clone(&self.0),
                    acks: Some(acks),
                    events,
                }));
            }
        }
    }

    fn transaction_capacity(&self) -> usize {
        self.0.transaction_capacity
    }

    fn is_durable(&self) -> bool {
        false
    }

    fn len(&self) -> usize {
        self.0.capacity - self.0.slots.available_permits()
    }

    fn capacity(&self) -> usize {
        self.0.capacity
    }
}

/// An open take: its events left the queue but still hold their capacity.
struct MemoryTake {
    channel: Arc<Shared>,
    /// The acknowledgements of `events`, one each; `None` once committed or rolled back.
    acks: Option<Vec<Option<Acknowledgement>>>,
    events: Vec<Event>,
}

impl MemoryTake {
    fn finish(&mut self, commit: bool) {
        let Some(acks) = self.acks.take() else {
            return;
        };
        if acks.is_empty() {
            return;
        }
        let channel = &self.channel;
        if commit {
            let bytes = if channel.bytes.is_some() {
                self.events.iter().map(Event::byte_size).sum()
            } else {
                0
            };
            Acknowledgement::delivered_all(&acks);
            channel.release(acks.len(), bytes);
        } else {
            let events = std::mem::take(&mut self.events);
            let mut queue = channel.lock_queue();
            for (event, ack) in events.into_iter().zip(acks).rev() {
                queue.push_front(Entry { event, ack });
            }
            drop(queue);
            channel.available.notify_waiters();
        }
    }
}

#[async_trait]
impl TakeTransaction for MemoryTake {
    fn events(&self) -> &[Event] {
        &self.events
    }

    async fn commit(mut self: Box<Self>) -> Result<(), ChannelError> {
        self.finish(true);
        Ok(())
    }

    async fn rollback(mut self: Box<Self>) -> Result<(), ChannelError> {
        self.finish(false);
        Ok(())
    }
}

impl Drop for MemoryTake {
    /// A take dropped without a decision (its task was cancelled) is rolled back: the events
    /// were not delivered as far as anyone knows.
    fn drop(&mut self) {
        self.finish(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_core::{AckTracker, Checkpoint, CheckpointStore, MemoryCheckpointStore};

    fn channel(capacity: usize, tx: usize) -> MemoryChannel {
        MemoryChannel::new(
            "mem",
            &MemoryChannelConfig {
                capacity,
                transaction_capacity: tx,
                byte_capacity: None,
            },
        )
    }

    fn batch(range: std::ops::Range<u32>) -> PutBatch {
        PutBatch {
            source: "src".into(),
            events: range.map(|i| Event::from_body(i.to_string())).collect(),
            checkpoint: None,
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
    async fn rollback_returns_events_to_the_front_in_order() {
        let ch = channel(10, 5);
        ch.put(batch(0..5)).await.unwrap();
        ch.put(batch(5..8)).await.unwrap();
        let tx = ch.take(3, Duration::ZERO).await.unwrap();
        assert_eq!(bodies(&*tx), ["0", "1", "2"]);
        tx.rollback().await.unwrap();
        let tx = ch.take(5, Duration::ZERO).await.unwrap();
        assert_eq!(bodies(&*tx), ["0", "1", "2", "3", "4"]);
        tx.commit().await.unwrap();
        assert_eq!(ch.len(), 3);
    }

    #[tokio::test]
    async fn full_channel_makes_put_wait_until_a_take_commits() {
        let ch = channel(4, 4);
        ch.put(batch(0..4)).await.unwrap();
        assert!(matches!(
            ch.try_put(batch(4..5)).await,
            Err(ChannelError::Full { .. })
        ));
        let waiting = tokio::spawn({
            let ch = ch.clone();
            async move { ch.put(batch(4..6)).await }
        });
        let tx = ch.take(2, Duration::ZERO).await.unwrap();
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "taken events still hold capacity");
        tx.commit().await.unwrap();
        waiting.await.unwrap().unwrap();
        assert_eq!(ch.len(), 4);
    }

    #[tokio::test]
    async fn oversized_batches_are_refused() {
        let ch = channel(10, 2);
        let err = ch.put(batch(0..3)).await.unwrap_err();
        assert!(err.to_string().contains("transaction_capacity 2"), "{err}");
        let small = MemoryChannel::new(
            "b",
            &MemoryChannelConfig {
                capacity: 10,
                transaction_capacity: 10,
                byte_capacity: Some(ByteSize(4)),
            },
        );
        let err = small.put(batch(10..13)).await.unwrap_err();
        assert!(err.to_string().contains("byte_capacity"), "{err}");
    }

    #[tokio::test]
    async fn take_waits_for_a_put() {
        let ch = channel(10, 10);
        let taker = tokio::spawn({
            let ch = ch.clone();
            async move {
                let tx = ch.take(10, Duration::from_secs(30)).await.unwrap();
                bodies(&*tx)
            }
        });
        tokio::task::yield_now().await;
        ch.put(batch(0..2)).await.unwrap();
        assert_eq!(taker.await.unwrap(), ["0", "1"]);
    }

    #[tokio::test]
    async fn commit_acknowledges_and_saves_the_checkpoint() {
        let store = Arc::new(MemoryCheckpointStore::default());
        let tracker = AckTracker::new("src", store.clone());
        let ch = channel(10, 10);
        let mut b = batch(0..3);
        b.ack = Some(tracker.begin(3, 1, Some(Checkpoint::new(b"3".to_vec()))));
        ch.put(b).await.unwrap();
        let tx = ch.take(2, Duration::ZERO).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(store.load("src").unwrap(), None);
        let tx = ch.take(2, Duration::ZERO).await.unwrap();
        drop(tx); // dropped undecided: rolled back, not acknowledged
        assert_eq!(store.load("src").unwrap(), None);
        let tx = ch.take(2, Duration::ZERO).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(
            store.load("src").unwrap(),
            Some(Checkpoint::new(b"3".to_vec()))
        );
    }

    #[test]
    fn transaction_capacity_above_capacity_is_a_config_error() {
        let cfg = ComponentConfig::from_yaml(
            ferry_core::ComponentKind::Channel,
            "c",
            "memory",
            "capacity: 10\ntransaction_capacity: 20",
        )
        .unwrap();
        let mut registry = Registry::new();
        register(&mut registry);
        let factory = registry.channel("memory").unwrap();
        let err = factory(&cfg).err().unwrap();
        assert_eq!(err.location.unwrap().line, 2);
        assert!(err.message.contains("larger than `capacity`"), "{err:?}");
    }
}
