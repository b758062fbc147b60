//! Sinks: deliver batches taken from a channel to their destination.

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

/// What a sink reports when it could not deliver. The runner rolls the take back and retries
/// the same batch after a backoff, so nothing is lost.
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
    /// The destination refused or failed the delivery.
    #[error("{0}")]
    Delivery(String),
}

impl SinkError {
    /// An I/O error with what the sink was doing, e.g. `writing /var/out/1.log`.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
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

/// A destination for events.
///
/// The runtime calls `start` once, then `deliver` for each batch (`Ok` commits the take,
/// `Err` rolls it back and retries later), `idle` when no events came within the poll
/// interval, and `stop` when draining is complete.
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
    /// Called when no events arrived for a while (to roll files by time, flush, ...).
    async fn idle(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
    /// Flushes and closes, after the last batch.
    async fn stop(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
}
