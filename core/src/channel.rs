//! Channels: the buffers between sources and sinks, with put and take transactions.
//!
//! A source hands a batch to a channel in one **put**: all of it is stored, or none of it. A
//! sink runner **takes** a batch in a [`TakeTransaction`], delivers it, and then commits (the
//! events are gone from the channel) or rolls back (they are taken again, in the same order).
//! A channel is bounded: `put` waits while there is no room, which is how backpressure reaches
//! the sources.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::ack::Acknowledgement;
use crate::checkpoint::Checkpoint;
use crate::event::Event;
use crate::metrics::{ComponentMetrics, Counter, Latency};
use crate::state::{JointPart, StateStore};

/// One batch offered to a channel by a source.
#[derive(Debug)]
pub struct PutBatch {
    /// Name of the source that produced the batch (the key of its checkpoint).
    pub source: String,
    /// The events, in order.
    pub events: Vec<Event>,
    /// Where the source resumes once this batch is safe. A durable channel commits it in the
    /// same transaction as the events; other channels ignore it.
    pub checkpoint: Option<Checkpoint>,
    /// Delivery tracking for non-durable channels: call
    /// [`Acknowledgement::delivered`] when the events are committed by a take.
    pub ack: Option<Acknowledgement>,
    /// Present when this batch is one part of a put into several channels of one state store
    /// ([`Channel::joint_store`]), to be committed in one transaction with the other parts.
    pub joint: Option<JointPart>,
}

/// Errors of channel operations.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// No room for the batch right now (only from [`Channel::try_put`]).
    #[error("channel `{channel}` is full")]
    Full {
        /// Channel name.
        channel: String,
    },
    /// The batch can never fit: more events than `transaction_capacity` or more bytes than
    /// `byte_capacity`.
    #[error("channel `{channel}`: batch of {events} events ({bytes} bytes) exceeds {limit}")]
    BatchTooLarge {
        /// Channel name.
        channel: String,
        /// Events in the batch.
        events: usize,
        /// Bytes in the batch.
        bytes: usize,
        /// Which limit, e.g. `transaction_capacity 100`.
        limit: String,
    },
    /// The channel's storage failed (disk full, I/O error, ...).
    #[error("channel `{channel}`: {message}")]
    Storage {
        /// Channel name.
        channel: String,
        /// What failed.
        message: String,
    },
}

/// A buffer between sources and sinks.
///
/// Implementations must keep order: events come out of `take` in the order they were put,
/// and a rolled-back take returns its events to the front.
#[async_trait]
pub trait Channel: Send + Sync + 'static {
    /// The channel's name from the configuration.
    fn name(&self) -> &str;
    /// Opens storage and recovers what it holds, before any source or sink runs. Factories
    /// only validate (so that `agent validate` touches nothing); this is where files open.
    async fn start(&self) -> Result<(), ChannelError> {
        Ok(())
    }
    /// Stores a whole batch, waiting while there is no room.
    async fn put(&self, batch: PutBatch) -> Result<(), ChannelError>;
    /// Stores a whole batch if there is room now, or fails with [`ChannelError::Full`].
    async fn try_put(&self, batch: PutBatch) -> Result<(), ChannelError>;
    /// Takes up to `max` events, waiting at most `wait` for the first one. The transaction
    /// may be empty.
    async fn take(
        &self,
        max: usize,
        wait: Duration,
    ) -> Result<Box<dyn TakeTransaction>, ChannelError>;
    /// Most events one put or take may carry.
    fn transaction_capacity(&self) -> usize;
    /// Most take transactions that may be open at once, when the channel has a limit (a
    /// further `take` waits until one ends). A sink runner keeping several batches in flight
    /// ([`crate::sink::Pipelining`]) holds at most this many. Default: no limit.
    fn max_open_takes(&self) -> Option<usize> {
        None
    }
    /// Makes the take commits that returned so far survive power loss, when the channel
    /// leaves that to later (a file channel syncs them with its next put). A sink that records
    /// only its last flush's sequence numbers would otherwise deliver again, after a power
    /// loss, the events of a take whose commit was lost: the sink runner calls this before
    /// each flush, and while idle. Default: every take commit is as durable as it gets when
    /// it returns.
    async fn sync_takes(&self) -> Result<(), ChannelError> {
        Ok(())
    }
    /// Whether a put commits the source checkpoint together with the events.
    fn is_durable(&self) -> bool;
    /// Events stored now, including those held by open take transactions.
    fn len(&self) -> usize;
    /// Whether the channel holds no events at all.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Most events the channel holds.
    fn capacity(&self) -> usize;
    /// The last checkpoint `source` committed with a put, for a durable channel that keeps
    /// checkpoints itself rather than in the agent's state store (the kafka channel keeps
    /// them in Kafka). `None`: ask the state store.
    fn load_checkpoint(&self, _source: &str) -> Result<Option<Checkpoint>, ChannelError> {
        Ok(None)
    }
    /// Whether this durable channel keeps checkpoints itself ([`Self::load_checkpoint`]).
    /// The agent then also saves each committed checkpoint to its state store, the fallback
    /// when the channel's copy is gone (Kafka expires offsets of idle groups).
    fn keeps_checkpoints(&self) -> bool {
        false
    }

    /// The state store this channel commits its puts in, if it can commit a put together with
    /// other channels of the same store in one transaction (a batch carrying a
    /// [`PutBatch::joint`] part). Known once the channel is started.
    fn joint_store(&self) -> Option<StateStore> {
        None
    }

    /// Tells a channel whose storage is a remote service (the kafka channel) the metrics to
    /// report to when its client cannot reach that service ([`ComponentMetrics::unreachable`]),
    /// so that `/health` names the channel within seconds. [`MeteredChannel::new`] calls it with
    /// the channel's own metrics, before `start`. Default: nothing to report.
    fn report_to(&self, _metrics: &ComponentMetrics) {}
}

/// Events taken from a channel, to be committed after delivery or rolled back.
#[async_trait]
pub trait TakeTransaction: Send {
    /// The events taken, in channel order.
    fn events(&self) -> &[Event];
    /// Stable, increasing sequence numbers of the events, one per event, when the channel is
    /// durable; sinks with exactly-once delivery record them to skip what they delivered.
    fn sequences(&self) -> Option<&[u64]> {
        None
    }
    /// Removes the events from the channel for good.
    async fn commit(self: Box<Self>) -> Result<(), ChannelError>;
    /// Removes the events from the channel for good as one part of a joint put (see
    /// [`StateStore::begin_joint_put`]): in one transaction with the puts of the other parts,
    /// so that the events leave this channel exactly when others arrive elsewhere. Only a take
    /// of a channel whose [`Channel::joint_store`] is `part`'s store can; by default the part
    /// is given up (failing the whole put) and the take stays open, to be rolled back.
    async fn commit_joint(self: Box<Self>, part: JointPart) -> Result<(), ChannelError> {
        let error = crate::state::StateError::Database {
            path: part
                .store()
                .map(|s| s.path().to_owned())
                .unwrap_or_default(),
            message: "this channel cannot commit a take in a joint put".into(),
        };
        part.abandon(error.clone());
        self.rollback().await?;
        Err(ChannelError::Storage {
            channel: String::new(),
            message: error.to_string(),
        })
    }
    /// Returns the events to the front of the channel.
    async fn rollback(self: Box<Self>) -> Result<(), ChannelError>;
    /// Joins `later`, a take of the same channel made after this one, into this take, so
    /// that one commit (one transaction, one fsync) removes the events of both, or one
    /// rollback returns them. `true` when joined: `later` then holds nothing (committing or
    /// dropping it does nothing). Default: `false`, each take commits alone.
    fn absorb(&mut self, _later: &mut dyn TakeTransaction) -> bool {
        false
    }
    /// The take as [`Any`](std::any::Any), for [`Self::absorb`] to recognise takes of its own
    /// kind. Default: `None`.
    fn as_any_mut(&mut self) -> Option<&mut (dyn std::any::Any + Send)> {
        None
    }
}

/// Any channel, counted: puts, takes and rollbacks with Flume's names, for every channel type
/// in one place. The agent wraps each channel of a pipeline in one, so sources and sinks
/// count without knowing.
///
/// | counter | counts |
/// |---|---|
/// | `EventPutAttemptCount` | events offered by puts |
/// | `EventPutSuccessCount` | events of committed puts |
/// | `EventTakeAttemptCount` | as Flume: one per event taken, plus one for a take that came back short (Flume asks event by event until none is left) |
/// | `EventTakeSuccessCount` | events of committed takes |
/// | `RollbackCount` | failed puts and rolled-back takes |
/// | `ChannelSize`, `ChannelCapacity` | set from [`Channel::len`] and [`Channel::capacity`] by [`MeteredChannel::refresh`] (capacity 0 when unbounded, as Flume) |
///
/// ```
/// # async fn demo(inner: std::sync::Arc<dyn ferry_core::Channel>) {
/// use ferry_core::channel::MeteredChannel;
/// let channel = MeteredChannel::new(inner);
/// channel.refresh();
/// assert_eq!(channel.metrics().counter("ChannelSize").get(), 0);
/// # }
/// ```
pub struct MeteredChannel {
    inner: Arc<dyn Channel>,
    metrics: ComponentMetrics,
    counts: Arc<ChannelCounts>,
}

struct ChannelCounts {
    put_attempts: Counter,
    put_successes: Counter,
    take_attempts: Counter,
    take_successes: Counter,
    rollbacks: Counter,
    put_latency: Latency,
    take_to_commit: Latency,
    /// When the events in the channel were put, oldest first, for `OldestEventAgeMillis`.
    ages: Mutex<VecDeque<(Instant, u64)>>,
}

impl ChannelCounts {
    /// `n` events were put now.
    fn put(&self, n: u64) {
        let mut ages = self.ages.lock().unwrap_or_else(|e| e.into_inner());
        ages.push_back((Instant::now(), n));
    }

    /// `n` events left the channel: the oldest ones, as channels hand out events in order.
    fn taken(&self, mut n: u64) {
        let mut ages = self.ages.lock().unwrap_or_else(|e| e.into_inner());
        while n > 0 {
            let Some(front) = ages.front_mut() else { break };
            let gone = front.1.min(n);
            front.1 -= gone;
            n -= gone;
            if front.1 == 0 {
                ages.pop_front();
            }
        }
    }

    /// Milliseconds since the oldest event still in the channel was put; 0 when empty.
    fn oldest_age_ms(&self, len: usize) -> u64 {
        if len == 0 {
            return 0;
        }
        let ages = self.ages.lock().unwrap_or_else(|e| e.into_inner());
        ages.front()
            .map_or(0, |(at, _)| at.elapsed().as_millis() as u64)
    }
}

impl MeteredChannel {
    /// Counts what goes through `inner`.
    pub fn new(inner: Arc<dyn Channel>) -> Self {
        let metrics = ComponentMetrics::new("channel", inner.name());
        let counts = ChannelCounts {
            put_attempts: metrics.counter("EventPutAttemptCount"),
            put_successes: metrics.counter("EventPutSuccessCount"),
            take_attempts: metrics.counter("EventTakeAttemptCount"),
            take_successes: metrics.counter("EventTakeSuccessCount"),
            rollbacks: metrics.counter("RollbackCount"),
            put_latency: metrics.latency("PutLatency"),
            take_to_commit: metrics.latency("TakeToCommitLatency"),
            ages: Mutex::default(),
        };
        inner.report_to(&metrics);
        let channel = Self {
            inner,
            metrics,
            counts: Arc::new(counts),
        };
        channel.refresh();
        channel
    }

    /// The channel's counters.
    pub fn metrics(&self) -> &ComponentMetrics {
        &self.metrics
    }

    /// Sets the gauges `ChannelSize` and `ChannelCapacity` from the channel; called before
    /// the counters are read.
    pub fn refresh(&self) {
        let capacity = match self.inner.capacity() {
            usize::MAX => 0,
            n => n as u64,
        };
        self.metrics.counter("ChannelCapacity").set(capacity);
        let len = self.inner.len();
        self.metrics.counter("ChannelSize").set(len as u64);
        self.metrics
            .counter("OldestEventAgeMillis")
            .set(self.counts.oldest_age_ms(len));
    }

    async fn counted_put(&self, batch: PutBatch, wait: bool) -> Result<(), ChannelError> {
        let n = batch.events.len() as u64;
        self.counts.put_attempts.add(n);
        let started = Instant::now();
        let result = if wait {
            self.inner.put(batch).await
        } else {
            self.inner.try_put(batch).await
        };
        match &result {
            Ok(()) => {
                self.counts.put_successes.add(n);
                self.counts.put_latency.observe(started.elapsed());
                self.counts.put(n);
            }
            Err(_) => self.counts.rollbacks.inc(),
        }
        result
    }
}

#[async_trait]
impl Channel for MeteredChannel {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn start(&self) -> Result<(), ChannelError> {
        let result = self.inner.start().await;
        // Events kept from before (a file channel's): their age counts from this start.
        let kept = self.inner.len() as u64;
        if kept > 0 {
            self.counts.put(kept);
        }
        self.refresh();
        result
    }
    async fn put(&self, batch: PutBatch) -> Result<(), ChannelError> {
        self.counted_put(batch, true).await
    }
    async fn try_put(&self, batch: PutBatch) -> Result<(), ChannelError> {
        self.counted_put(batch, false).await
    }
    async fn take(
        &self,
        max: usize,
        wait: Duration,
    ) -> Result<Box<dyn TakeTransaction>, ChannelError> {
        let take = self.inner.take(max, wait).await?;
        let n = take.events().len();
        self.counts.take_attempts.add(n as u64 + u64::from(n < max));
        Ok(Box::new(MeteredTake {
            inner: take,
            counts: Arc::clone(&self.counts),
            taken: Instant::now(),
        }))
    }
    fn transaction_capacity(&self) -> usize {
        self.inner.transaction_capacity()
    }
    fn max_open_takes(&self) -> Option<usize> {
        self.inner.max_open_takes()
    }
    async fn sync_takes(&self) -> Result<(), ChannelError> {
        self.inner.sync_takes().await
    }
    fn is_durable(&self) -> bool {
        self.inner.is_durable()
    }
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn capacity(&self) -> usize {
        self.inner.capacity()
    }
    fn load_checkpoint(&self, source: &str) -> Result<Option<Checkpoint>, ChannelError> {
        self.inner.load_checkpoint(source)
    }

    fn joint_store(&self) -> Option<StateStore> {
        self.inner.joint_store()
    }
    fn keeps_checkpoints(&self) -> bool {
        self.inner.keeps_checkpoints()
    }
}

struct MeteredTake {
    inner: Box<dyn TakeTransaction>,
    counts: Arc<ChannelCounts>,
    taken: Instant,
}

#[async_trait]
impl TakeTransaction for MeteredTake {
    fn events(&self) -> &[Event] {
        self.inner.events()
    }
    fn sequences(&self) -> Option<&[u64]> {
        self.inner.sequences()
    }
    async fn commit(self: Box<Self>) -> Result<(), ChannelError> {
        let n = self.inner.events().len() as u64;
        let (counts, taken) = (self.counts, self.taken);
        self.inner.commit().await?;
        counts.take_successes.add(n);
        counts.take_to_commit.observe(taken.elapsed());
        counts.taken(n);
        Ok(())
    }
    async fn commit_joint(self: Box<Self>, part: JointPart) -> Result<(), ChannelError> {
        let n = self.inner.events().len() as u64;
        let (counts, taken) = (self.counts, self.taken);
        if let Err(error) = self.inner.commit_joint(part).await {
            counts.rollbacks.inc();
            return Err(error);
        }
        counts.take_successes.add(n);
        counts.take_to_commit.observe(taken.elapsed());
        counts.taken(n);
        Ok(())
    }
    async fn rollback(self: Box<Self>) -> Result<(), ChannelError> {
        self.counts.rollbacks.inc();
        self.inner.rollback().await
    }
    fn absorb(&mut self, later: &mut dyn TakeTransaction) -> bool {
        match later
            .as_any_mut()
            .and_then(|any| any.downcast_mut::<MeteredTake>())
        {
            Some(later) => self.inner.absorb(later.inner.as_mut()),
            None => false,
        }
    }
    fn as_any_mut(&mut self) -> Option<&mut (dyn std::any::Any + Send)> {
        Some(self)
    }
}
