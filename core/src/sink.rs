//! Sinks: deliver batches taken from a channel to their destination.
//!
//! The runner drives a sink in one of two ways, chosen by the sink's [`Sink::pipelining`]:
//!
//! - **one batch at a time** (the default): take, [`Sink::send`] (which by default is
//!   [`Sink::deliver`]), commit the take; the next take waits.
//! - **pipelined**: take, `send`, take the next batch and `send` it while the earlier ones are
//!   still on their way, ..., then [`Sink::flush`] once a bound of [`Pipelining`] is reached
//!   (or the channel has nothing more right now), then commit every take, oldest first. If a
//!   `send` or the `flush` fails, every take since the last flush is rolled back (newest first,
//!   so the events return in channel order) and sent again after a backoff.

use std::time::Duration;

use async_trait::async_trait;

use crate::event::Event;
use crate::metrics::ComponentMetrics;
use crate::state::StateStore;

/// A batch handed to a sink: the events of one take transaction.
#[derive(Clone, Copy, Debug)]
pub struct SinkBatch<'a> {
    /// The events, in channel order.
    pub events: &'a [Event],
    /// Per-event channel sequence numbers when the channel is durable.
    pub sequences: Option<&'a [u64]>,
}

/// What a sink reports when it could not deliver.
///
/// A failure is **transient** (the default: [`SinkError::io`], [`SinkError::Delivery`]) when
/// the same batch may succeed later: the runner rolls the take back and retries it after a
/// backoff, so nothing is lost. It is **permanent** ([`SinkError::permanent`]) when the
/// destination refuses the events themselves and will refuse them again (an HTTP 400, a record
/// larger than the topic accepts): the runner then splits the batch to find the events at
/// fault and moves them to the sink's `dead_letter` channel, or, without one, keeps retrying
/// and says that the failure is permanent.
///
/// ```
/// use ferry_core::SinkError;
/// let refused = SinkError::permanent("POST http://127.0.0.1:8080/: 400 Bad Request");
/// assert!(refused.is_permanent());
/// assert!(!SinkError::Delivery("connection refused".into()).is_permanent());
/// ```
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// An I/O error at the destination.
    #[error("{context}: {source}")]
    Io {
        /// What the sink was doing.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The destination refused or failed the delivery; it may succeed later.
    #[error("{0}")]
    Delivery(String),
    /// The destination refused the events for good: sending them again will not help.
    #[error("{0}")]
    Permanent(String),
}

impl SinkError {
    /// An I/O error with what the sink was doing, e.g. `writing /var/out/1.log`.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }

    /// A failure that retrying the same events cannot cure, e.g. `POST ...: 400 Bad Request`.
    pub fn permanent(reason: impl Into<String>) -> Self {
        Self::Permanent(reason.into())
    }

    /// Whether the destination refused the events for good ([`SinkError::permanent`]).
    pub fn is_permanent(&self) -> bool {
        matches!(self, Self::Permanent(_))
    }
}

/// Runtime services available to a sink.
#[derive(Clone, Debug)]
pub struct SinkContext {
    /// The sink's name from the configuration.
    pub name: String,
    /// The sink's counters.
    pub metrics: ComponentMetrics,
    /// The agent's state store, where a sink with exactly-once delivery keeps its progress
    /// ([`StateStore::save_progress`]). `None` when the agent runs without state (tests).
    pub state: Option<StateStore>,
}

/// How many batches a sink lets the runner keep in flight: sent with [`Sink::send`] but not
/// yet made safe by [`Sink::flush`]. The runner flushes as soon as any bound is reached.
///
/// The default, [`Pipelining::ONE_BATCH`], flushes after every batch: each take is committed
/// before the next is taken.
///
/// ```
/// use std::time::Duration;
/// use ferry_core::Pipelining;
/// let pipelining = Pipelining {
///     max_batches: 16,
///     max_events: 10_000,
///     max_bytes: 16 << 20,
///     max_delay: Duration::from_millis(100),
/// };
/// assert!(pipelining.max_batches > Pipelining::ONE_BATCH.max_batches);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pipelining {
    /// Most batches in flight (at least 1). The channel may allow fewer open takes
    /// ([`crate::Channel::max_open_takes`]); the smaller number applies.
    pub max_batches: usize,
    /// Most events in flight: the runner flushes once the batches sent hold this many.
    pub max_events: usize,
    /// Most bytes in flight, as [`crate::Event::byte_size`] counts them: the runner flushes
    /// once the batches sent hold this many. `usize::MAX`: no bound (events are not
    /// measured).
    pub max_bytes: usize,
    /// Longest time between the first `send` after a flush and the next flush.
    pub max_delay: Duration,
}

impl Pipelining {
    /// One batch in flight: every batch is flushed and its take committed before the next
    /// take, which is how a sink that only implements [`Sink::deliver`] is run.
    pub const ONE_BATCH: Pipelining = Pipelining {
        max_batches: 1,
        max_events: usize::MAX,
        max_bytes: usize::MAX,
        max_delay: Duration::MAX,
    };
}

impl Default for Pipelining {
    fn default() -> Self {
        Self::ONE_BATCH
    }
}

/// A destination for events.
///
/// The runtime calls `start` once, then `send` for each batch and `flush` to make the batches
/// sent safe (`Ok` commits their takes, `Err` rolls them back and retries later), `idle` when
/// no events came within the poll interval, and `stop` when draining is complete. A sink that
/// only implements `deliver` is run one batch at a time: `send` delivers, `flush` has nothing
/// left to do.
///
/// ```
/// use ferry_core::{async_trait, Sink, SinkBatch, SinkError};
/// struct Count(usize);
/// #[async_trait]
/// impl Sink for Count {
///     async fn deliver(&mut self, batch: SinkBatch<'_>) -> Result<(), SinkError> {
///         self.0 += batch.events.len();
///         Ok(())
///     }
/// }
/// ```
///
/// A sink that pipelines keeps what it was sent until the runner asks it to flush:
///
/// ```
/// use std::time::Duration;
/// use ferry_core::{async_trait, Pipelining, Sink, SinkBatch, SinkError};
/// struct Buffered { pending: Vec<u8>, written: Vec<u8> }
/// #[async_trait]
/// impl Sink for Buffered {
///     async fn deliver(&mut self, batch: SinkBatch<'_>) -> Result<(), SinkError> {
///         self.send(batch).await?;
///         self.flush().await
///     }
///     async fn send(&mut self, batch: SinkBatch<'_>) -> Result<(), SinkError> {
///         for event in batch.events {
///             self.pending.extend_from_slice(&event.body);
///         }
///         Ok(())
///     }
///     async fn flush(&mut self) -> Result<(), SinkError> {
///         self.written.append(&mut self.pending);
///         Ok(())
///     }
///     fn pipelining(&self) -> Pipelining {
///         Pipelining {
///             max_batches: 8,
///             max_events: 10_000,
///             max_bytes: usize::MAX,
///             max_delay: Duration::from_millis(50),
///         }
///     }
/// }
/// ```
#[async_trait]
pub trait Sink: Send + 'static {
    /// Whether the sink needs the channel's sequence numbers (exactly-once delivery that
    /// skips what an earlier run delivered). `agent validate` then refuses a channel that
    /// does not number its events (a memory channel).
    fn needs_sequence_numbers(&self) -> bool {
        false
    }
    /// Opens connections or files and recovers state, before the first batch.
    async fn start(&mut self, _ctx: &SinkContext) -> Result<(), SinkError> {
        Ok(())
    }
    /// Delivers a batch; returns only once it is safe at the destination.
    async fn deliver(&mut self, batch: SinkBatch<'_>) -> Result<(), SinkError>;
    /// Starts delivering a batch; it need not be safe yet when this returns, only once
    /// [`Self::flush`] returns `Ok`. The sink must not keep borrows of the batch (copy what it
    /// still needs). On `Err` the sink must have discarded everything sent since the last
    /// flush, as for a failed flush. Default: [`Self::deliver`].
    async fn send(&mut self, batch: SinkBatch<'_>) -> Result<(), SinkError> {
        self.deliver(batch).await
    }
    /// Makes every batch sent since the last flush safe at the destination. On `Err` the sink
    /// must have discarded or aborted all of them: the runner rolls their takes back and
    /// sends the same events again. Default: nothing to do (`send` delivered).
    async fn flush(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
    /// How many batches may be in flight between flushes. Asked once after `start`.
    /// Default: [`Pipelining::ONE_BATCH`].
    fn pipelining(&self) -> Pipelining {
        Pipelining::ONE_BATCH
    }
    /// Called when no events arrived for a while (to roll files by time, flush, ...).
    async fn idle(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
    /// Flushes and closes, after the last batch.
    async fn stop(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
}
