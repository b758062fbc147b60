//! Sources: read events from somewhere and hand them to their channels.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use crate::ack::AckTracker;
use crate::channel::{Channel, ChannelError, PutBatch};
use crate::checkpoint::{Checkpoint, CheckpointStore, CheckpointStoreError};
use crate::event::Event;
use crate::interceptor::Interceptor;
use crate::metrics::{ComponentMetrics, Counter};
use crate::selector::{ChannelSelector, Part};
use crate::shutdown::Shutdown;

/// What ends a source's `run` with a failure. The runtime logs it and restarts the source
/// after a backoff.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// An I/O error while reading input.
    #[error("{context}: {source}")]
    Io {
        /// What the source was doing, e.g. `binding 127.0.0.1:44444`.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A channel refused a batch for good.
    #[error(transparent)]
    Channel(#[from] ChannelError),
    /// Anything else, described.
    #[error("{0}")]
    Other(String),
}

impl SourceError {
    /// An I/O error with what the source was doing.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}

/// A producer of events.
///
/// `run` reads until its input ends or [`SourceContext::shutdown`] fires, handing batches to
/// [`SourceContext::send`]. It must not acknowledge anything to its own client (an `OK`, an HTTP
/// 200, a file position) before `send` returned `Ok`.
///
/// ```
/// use ferry_core::{async_trait, Event, Source, SourceContext, SourceError};
/// struct Hello;
/// #[async_trait]
/// impl Source for Hello {
///     async fn run(self: Box<Self>, ctx: SourceContext) -> Result<(), SourceError> {
///         ctx.send(vec![Event::from_body("hello")], None).await?;
///         Ok(())
///     }
/// }
/// ```
#[async_trait]
pub trait Source: Send + 'static {
    /// The most events this source puts in one batch, if it knows; validated against the
    /// `transaction_capacity` of its channels before anything starts.
    fn max_batch_size(&self) -> Option<usize> {
        None
    }
    /// Whether the source writes each event's position into the header named by
    /// [`SourceContext::position_header`]: a stable id of where the event was read (a file
    /// and offset, a topic-partition-offset), the same when it is read again after a restart.
    /// A source that cannot is refused with a `position` interceptor. Default `false`.
    fn sets_positions(&self) -> bool {
        false
    }
    /// Reads and sends events until the input ends or shutdown is signalled.
    async fn run(self: Box<Self>, ctx: SourceContext) -> Result<(), SourceError>;
}

/// What a source uses to deliver its batches: interceptors, replicating fan-out to every
/// channel it is bound to, checkpoints and the shutdown signal. Cheap to clone.
#[derive(Clone)]
pub struct SourceContext(Arc<Inner>);

struct Inner {
    name: String,
    channels: Vec<Arc<dyn Channel>>,
    interceptors: Vec<Arc<dyn Interceptor>>,
    /// The header for each event's position, asked for by an interceptor.
    position_header: Option<String>,
    shutdown: Shutdown,
    resume: Option<Checkpoint>,
    /// Without a tracker: the checkpoint of the last batch every channel committed.
    committed: std::sync::Mutex<Option<Checkpoint>>,
    /// Where checkpoints are kept when no channel keeps them.
    store: Arc<dyn CheckpointStore>,
    /// Present when at least one channel is not durable: checkpoints then wait for delivery.
    tracker: Option<Arc<AckTracker>>,
    /// Which channels get which events.
    selector: ChannelSelector,
    /// The channel whose puts carry the checkpoint when every channel is durable: the last
    /// durable one the selector can require.
    keeper: Option<usize>,
    metrics: ComponentMetrics,
    received: Counter,
    accepted: Counter,
    accepted_bytes: Counter,
    batches_received: Counter,
    batches_accepted: Counter,
    filtered: Counter,
    unrouted: Counter,
    optional_fails: Counter,
    write_fails: Counter,
    full_wait_millis: Counter,
    full_channel_warning: Duration,
    /// Whether the warning of this stall was logged: once per stall, until a put finds room.
    stall_warned: AtomicBool,
}

/// How the runtime runs a source beyond its channels: counters that outlive a restart of the
/// source, and how long a put may wait on a full channel before a warning.
#[derive(Clone, Debug)]
pub struct SourceOptions {
    /// The source's counters.
    pub metrics: ComponentMetrics,
    /// A put that waits this long on a full channel logs one warning for the stall.
    pub full_channel_warning: Duration,
    /// Which channels get which events; default: every channel every event.
    pub selector: ChannelSelector,
}

impl SourceOptions {
    /// Fresh counters for source `name`; a warning after 10 s on a full channel.
    pub fn new(name: &str) -> Self {
        Self {
            metrics: ComponentMetrics::new("source", name),
            full_channel_warning: Duration::from_secs(10),
            selector: ChannelSelector::default(),
        }
    }
}

impl std::fmt::Debug for SourceContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceContext")
            .field("name", &self.0.name)
            .finish()
    }
}

impl SourceContext {
    /// Wires a source named `name` to its channels; loads its checkpoint from `store`.
    pub fn new(
        name: impl Into<String>,
        channels: Vec<Arc<dyn Channel>>,
        interceptors: Vec<Arc<dyn Interceptor>>,
        shutdown: Shutdown,
        store: Arc<dyn CheckpointStore>,
    ) -> Result<Self, CheckpointStoreError> {
        let name = name.into();
        let options = SourceOptions::new(&name);
        Self::with_options(name, channels, interceptors, shutdown, store, options)
    }

    /// Like [`new`](Self::new), with the counters and warning of `options`.
    pub fn with_options(
        name: impl Into<String>,
        channels: Vec<Arc<dyn Channel>>,
        interceptors: Vec<Arc<dyn Interceptor>>,
        shutdown: Shutdown,
        store: Arc<dyn CheckpointStore>,
        options: SourceOptions,
    ) -> Result<Self, CheckpointStoreError> {
        let name = name.into();
        let SourceOptions {
            metrics,
            full_channel_warning,
            selector,
        } = options;
        // The checkpoint rides with the keeper's puts (unless a memory channel makes
        // checkpoints go through acknowledgements to the store); a channel that keeps it
        // itself has the newest one.
        let all_durable = channels.iter().all(|c| c.is_durable());
        let keeper = channels
            .iter()
            .enumerate()
            .rev()
            .find(|(i, c)| c.is_durable() && selector.can_require(*i))
            .map(|(i, _)| i);
        let from_channel = match keeper {
            Some(i) if all_durable => channels[i]
                .load_checkpoint(&name)
                .map_err(|e| CheckpointStoreError(e.to_string()))?,
            _ => None,
        };
        let resume = match from_channel {
            Some(checkpoint) => Some(checkpoint),
            None => store.load(&name)?,
        };
        let tracker = channels
            .iter()
            .any(|c| !c.is_durable())
            .then(|| AckTracker::new(name.clone(), Arc::clone(&store)));
        // Counters every source has, at 0 until something happens; `EventReadFail` is counted
        // by the sources that can tell a bad input.
        metrics.counter("EventReadFail");
        Ok(Self(Arc::new(Inner {
            received: metrics.counter("EventReceivedCount"),
            accepted: metrics.counter("EventAcceptedCount"),
            accepted_bytes: metrics.counter("EventAcceptedBytes"),
            batches_received: metrics.counter("AppendBatchReceivedCount"),
            batches_accepted: metrics.counter("AppendBatchAcceptedCount"),
            filtered: metrics.counter("EventFilteredCount"),
            unrouted: metrics.counter("EventUnroutedCount"),
            optional_fails: metrics.counter("OptionalChannelWriteFail"),
            write_fails: metrics.counter("ChannelWriteFail"),
            full_wait_millis: metrics.counter("ChannelFullWaitMillis"),
            full_channel_warning,
            stall_warned: AtomicBool::new(false),
            position_header: interceptors
                .iter()
                .find_map(|i| i.position_header().map(str::to_owned)),
            name,
            channels,
            interceptors,
            shutdown,
            committed: std::sync::Mutex::new(resume.clone()),
            store: Arc::clone(&store),
            resume,
            tracker,
            selector,
            keeper,
            metrics,
        })))
    }

    /// The source's name from the configuration.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// The checkpoint to resume from, saved by an earlier run.
    pub fn checkpoint(&self) -> Option<&Checkpoint> {
        self.0.resume.as_ref()
    }

    /// The newest checkpoint that is durable: with durable channels only, that of the last batch
    /// `send` completed; with a memory channel, the last one saved once its events (and all
    /// before them) were delivered by the sinks. What a source may acknowledge upstream for
    /// good (a Kafka source commits these offsets to its group, a spooling source may delete a
    /// file). `None` before anything is durable and when no batch carried a checkpoint.
    pub fn durable_checkpoint(&self) -> Option<Checkpoint> {
        match &self.0.tracker {
            Some(tracker) => tracker.saved().or_else(|| self.0.resume.clone()),
            None => self
                .0
                .committed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        }
    }

    /// The header in which to write each event's position, when the source's interceptors
    /// ask for one (see [`Source::sets_positions`]); `None` otherwise, and then a source
    /// spends nothing on positions.
    pub fn position_header(&self) -> Option<&str> {
        self.0.position_header.as_deref()
    }

    /// The shutdown signal: stop reading when it fires.
    pub fn shutdown(&self) -> &Shutdown {
        &self.0.shutdown
    }

    /// The source's counters (`EventReceivedCount`, ... and any of its own). The context
    /// counts events and batches received and accepted, events dropped by interceptors
    /// (`EventFilteredCount`), failed puts (`ChannelWriteFail`) and the time spent waiting on
    /// full channels (`ChannelFullWaitMillis`); a source counts `EventReadFail` and
    /// `OpenConnectionCount` itself where it has such things.
    pub fn metrics(&self) -> &ComponentMetrics {
        &self.0.metrics
    }

    /// The channels this source writes to.
    pub fn channels(&self) -> &[Arc<dyn Channel>] {
        &self.0.channels
    }

    /// Puts a batch into every channel, waiting while a channel is full. Returns once every
    /// channel committed it; only then may the source acknowledge the events to its client.
    /// `checkpoint` is where the source resumes once this batch is safe.
    pub async fn send(
        &self,
        events: Vec<Event>,
        checkpoint: Option<Checkpoint>,
    ) -> Result<(), ChannelError> {
        self.put(events, checkpoint, false).await
    }

    /// Like [`send`](Self::send), but fails with [`ChannelError::Full`] instead of waiting
    /// when the first channel has no room (an HTTP source answers 503). With replicating
    /// fan-out, only the first channel is tried without waiting: once it holds the batch the
    /// others must get it too, so `try_send` then waits for them like `send`.
    pub async fn try_send(
        &self,
        events: Vec<Event>,
        checkpoint: Option<Checkpoint>,
    ) -> Result<(), ChannelError> {
        self.put(events, checkpoint, true).await
    }

    async fn put(
        &self,
        events: Vec<Event>,
        checkpoint: Option<Checkpoint>,
        try_first: bool,
    ) -> Result<(), ChannelError> {
        let inner = &*self.0;
        inner.received.add(events.len() as u64);
        inner.batches_received.inc();
        let mut events = events;
        let before = events.len();
        for interceptor in &inner.interceptors {
            events = interceptor.intercept(events);
        }
        let n = events.len();
        let bytes: usize = events.iter().map(|e| e.body.len()).sum();
        inner.filtered.add(before.saturating_sub(n) as u64);
        let (parts, unrouted) = inner.selector.split(events, inner.channels.len());
        if unrouted > 0 {
            inner.unrouted.add(unrouted as u64);
            tracing::debug!(source = %inner.name, events = unrouted, "no channel selected for these events");
        }
        // With any non-durable channel the checkpoint travels only through acknowledgements:
        // committing it with a durable put could move it past events still in memory.
        let copies: usize = parts
            .iter()
            .zip(&inner.channels)
            .filter(|(_, c)| !c.is_durable())
            .map(|(p, _)| p.events.len())
            .sum();
        let (ack, checkpoint) = match &inner.tracker {
            Some(tracker) => (Some(tracker.begin(copies, 1, checkpoint)), None),
            None => (None, checkpoint),
        };
        let mut put = FanOut {
            ctx: self,
            ack,
            outstanding: copies,
            try_next: try_first,
        };
        put.run(parts, checkpoint.clone()).await?;
        if let Some(checkpoint) = checkpoint {
            // A channel that keeps checkpoints itself may lose them (Kafka expires idle
            // groups' offsets): the store keeps a copy to fall back on.
            let keeper = inner
                .keeper
                .is_some_and(|i| inner.channels[i].keeps_checkpoints());
            if keeper && let Err(e) = inner.store.save(&inner.name, &checkpoint) {
                tracing::warn!(source = %inner.name, error = %e, "cannot keep a copy of the checkpoint in the state store");
            }
            *inner.committed.lock().unwrap_or_else(|e| e.into_inner()) = Some(checkpoint);
        }
        inner.accepted.add(n as u64);
        inner.accepted_bytes.add(bytes as u64);
        inner.batches_accepted.inc();
        inner.metrics.succeeded();
        Ok(())
    }

    /// Puts a batch, waiting for room. A channel without room for it when the put begins is
    /// full: the wait is counted in `ChannelFullWaitMillis`, and a wait longer than the
    /// warning time logs one warning for the whole stall (until a put finds room again).
    async fn put_waiting(
        &self,
        channel: &dyn Channel,
        batch: PutBatch,
    ) -> Result<(), ChannelError> {
        let inner = &*self.0;
        let full = channel.len().saturating_add(batch.events.len()) > channel.capacity();
        if !full {
            if inner.stall_warned.swap(false, Ordering::Relaxed) {
                tracing::info!(source = %inner.name, channel = %channel.name(), "the channel has room again");
            }
            return channel.put(batch).await;
        }
        let started = tokio::time::Instant::now();
        let put = channel.put(batch);
        tokio::pin!(put);
        let result = tokio::select! {
            result = &mut put => result,
            _ = tokio::time::sleep(inner.full_channel_warning) => {
                if !inner.stall_warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        source = %inner.name,
                        channel = %channel.name(),
                        waited = ?inner.full_channel_warning,
                        "the source is waiting on a full channel: its sinks do not keep up"
                    );
                }
                put.await
            }
        };
        inner
            .full_wait_millis
            .add(started.elapsed().as_millis() as u64);
        result
    }
}

/// One batch on its way into a source's channels.
///
/// The required parts go first, one channel after the other; then the keeper's part with the
/// checkpoint, together, in one transaction, with the parts of every other required channel of
/// its state store (a joint put: a fan-out into several file channels is exactly-once); last
/// the optional parts, each tried once without waiting. A crash before the keeper's commit
/// repeats the batch only in the channels written before it (those of another kind or store),
/// never loses it.
struct FanOut<'a> {
    ctx: &'a SourceContext,
    ack: Option<crate::ack::Acknowledgement>,
    /// Copies in non-durable channels not yet put: released if the put fails, so that this
    /// batch does not hold back the checkpoints of later ones.
    outstanding: usize,
    /// Whether the next put is tried without waiting (`try_send`).
    try_next: bool,
}

impl FanOut<'_> {
    async fn run(
        &mut self,
        parts: Vec<Part>,
        checkpoint: Option<Checkpoint>,
    ) -> Result<(), ChannelError> {
        let inner = &*self.ctx.0;
        let keeper = inner.keeper.filter(|_| inner.tracker.is_none());
        let keeper_store = keeper.and_then(|k| inner.channels[k].joint_store());
        let mut joint = Vec::new();
        let mut optional = Vec::new();
        for (i, part) in parts.into_iter().enumerate() {
            let channel = &inner.channels[i];
            let is_keeper = Some(i) == keeper;
            if !part.required {
                if !part.events.is_empty() {
                    optional.push((i, part));
                }
                continue;
            }
            if part.events.is_empty() && !(is_keeper && checkpoint.is_some()) {
                continue;
            }
            let same_store = match (&keeper_store, channel.joint_store()) {
                (Some(k), Some(c)) => k.path() == c.path(),
                _ => false,
            };
            if is_keeper || same_store {
                joint.push((i, part));
            } else if let Err(error) = self.put_one(i, part.events, None).await {
                return Err(self.failed(error));
            }
        }
        match joint.len() {
            0 => {}
            1 => {
                let (i, part) = joint.pop().unwrap_or_default();
                if let Err(error) = self.put_one(i, part.events, checkpoint).await {
                    return Err(self.failed(error));
                }
            }
            _ => {
                if let Some(store) = &keeper_store
                    && let Err(error) = self.put_joint(store, joint, checkpoint).await
                {
                    return Err(self.failed(error));
                }
            }
        }
        for (i, part) in optional {
            let count = part.events.len();
            let channel = &inner.channels[i];
            if let Err(error) = channel.try_put(self.batch(i, part.events, None)).await {
                inner.optional_fails.inc();
                tracing::debug!(source = %inner.name, channel = %channel.name(), %error, "an optional channel did not take its events");
                if !channel.is_durable()
                    && let Some(ack) = &self.ack
                {
                    ack.failed(count);
                }
            }
            if !channel.is_durable() {
                self.outstanding = self.outstanding.saturating_sub(count);
            }
        }
        Ok(())
    }

    fn batch(&self, i: usize, events: Vec<Event>, checkpoint: Option<Checkpoint>) -> PutBatch {
        let inner = &*self.ctx.0;
        let channel = &inner.channels[i];
        PutBatch {
            source: inner.name.clone(),
            events,
            checkpoint,
            ack: (!channel.is_durable()).then(|| self.ack.clone()).flatten(),
            joint: None,
        }
    }

    /// Puts one part, waiting for room unless it is the first one of a `try_send`.
    async fn put_one(
        &mut self,
        i: usize,
        events: Vec<Event>,
        checkpoint: Option<Checkpoint>,
    ) -> Result<(), ChannelError> {
        let channel = &self.ctx.0.channels[i];
        let count = events.len();
        let batch = self.batch(i, events, checkpoint);
        let result = if std::mem::take(&mut self.try_next) {
            channel.try_put(batch).await
        } else {
            self.ctx.put_waiting(channel.as_ref(), batch).await
        };
        if result.is_ok() && !channel.is_durable() {
            self.outstanding = self.outstanding.saturating_sub(count);
        }
        result
    }

    /// Puts the parts of one state store's channels in one transaction with the checkpoint.
    /// The parts run at once (each waits for the others before the commit), as tasks of
    /// their own: a source cancelled meanwhile cannot leave a channel waiting half-way.
    async fn put_joint(
        &mut self,
        store: &crate::state::StateStore,
        parts: Vec<(usize, Part)>,
        checkpoint: Option<Checkpoint>,
    ) -> Result<(), ChannelError> {
        let inner = &*self.ctx.0;
        let joints = store
            .begin_joint_put(parts.len(), &inner.name, checkpoint)
            .await;
        let try_first = std::mem::take(&mut self.try_next);
        let mut tasks = tokio::task::JoinSet::new();
        for (n, ((i, part), joint)) in parts.into_iter().zip(joints).enumerate() {
            let mut batch = self.batch(i, part.events, None);
            batch.joint = Some(joint);
            let ctx = self.ctx.clone();
            tasks.spawn(async move {
                let channel = Arc::clone(&ctx.0.channels[i]);
                if try_first && n == 0 {
                    channel.try_put(batch).await
                } else {
                    ctx.put_waiting(channel.as_ref(), batch).await
                }
            });
        }
        let mut first_error = None;
        while let Some(result) = tasks.join_next().await {
            let result = result.unwrap_or_else(|e| {
                Err(ChannelError::Storage {
                    channel: inner.name.clone(),
                    message: format!("a put of the fan-out failed: {e}"),
                })
            });
            if let Err(error) = result {
                // The error of the part that gave up, rather than the others' echo of it.
                let echo = matches!(error, ChannelError::Storage { .. });
                if first_error.is_none() || !echo {
                    first_error = Some(error);
                }
            }
        }
        match first_error {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// Counts a failed put and releases the copies that will never be delivered.
    fn failed(&mut self, error: ChannelError) -> ChannelError {
        self.ctx.0.write_fails.inc();
        if let Some(ack) = &self.ack {
            ack.failed(std::mem::take(&mut self.outstanding));
        }
        error
    }
}
