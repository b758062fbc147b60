//! `seq`: Flume's `SequenceGeneratorSource`. Emits events whose bodies are the decimal numbers
//! 0, 1, 2, ... (as Flume does), `batch_size` per put, until `total_events` were sent.
//!
//! The checkpoint of each batch is the next number to send, in decimal; a restarted source
//! resumes from the saved checkpoint, so with a durable channel no number is sent twice and
//! with a memory channel none is lost.

use ferry_core::{
    Checkpoint, ComponentConfig, ConfigError, Event, Source, SourceContext, SourceError,
    async_trait,
};
use serde::Deserialize;

/// Options of the `seq` source.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeqConfig {
    /// Events per put. Default `1`. Flume: `batchSize`.
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// Number of events to send in total (counting those sent before a restart); the source
    /// ends after it. Default: unlimited. Flume: `totalEvents`.
    #[serde(default)]
    pub total_events: Option<u64>,
}

fn default_batch_size() -> usize {
    1
}

/// The sequence generator source.
#[derive(Debug)]
pub struct SeqSource {
    batch_size: usize,
    total_events: u64,
}

impl SeqSource {
    /// Validates the options.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        let config: SeqConfig = cfg.parse()?;
        if config.batch_size == 0 {
            return Err(cfg.error_at("batch_size", "`batch_size` must be at least 1"));
        }
        Ok(Self {
            batch_size: config.batch_size,
            total_events: config.total_events.unwrap_or(u64::MAX),
        })
    }
}

/// The number to resume from, from a checkpoint written by [`SeqSource`].
pub(crate) fn resume_from(checkpoint: Option<&Checkpoint>) -> Result<u64, SourceError> {
    let Some(checkpoint) = checkpoint else {
        return Ok(0);
    };
    std::str::from_utf8(checkpoint.as_bytes())
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| {
            SourceError::Other(format!(
                "checkpoint {:?} is not a sequence number",
                String::from_utf8_lossy(checkpoint.as_bytes())
            ))
        })
}

#[async_trait]
impl Source for SeqSource {
    fn max_batch_size(&self) -> Option<usize> {
        Some(self.batch_size)
    }

    /// The position of an event is its number.
    fn sets_positions(&self) -> bool {
        true
    }

    async fn run(self: Box<Self>, ctx: SourceContext) -> Result<(), SourceError> {
        let mut next = resume_from(ctx.checkpoint())?;
        if next > 0 {
            tracing::info!(
                source = ctx.name(),
                next,
                "seq source resumes after its checkpoint"
            );
        }
        while next < self.total_events && !ctx.shutdown().is_triggered() {
            let n = (self.total_events - next).min(self.batch_size as u64);
            let events: Vec<Event> = (next..next + n)
                .map(|i| {
                    let mut event = Event::from_body(i.to_string());
                    if let Some(key) = ctx.position_header() {
                        event.headers.set(key.to_owned(), i.to_string());
                    }
                    event
                })
                .collect();
            next += n;
            ctx.send(events, Some(Checkpoint::new(next.to_string())))
                .await?;
            // A channel with room completes a put without suspending: let other tasks run.
            tokio::task::yield_now().await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ferry_core::{Channel, CheckpointStore, MemoryCheckpointStore, Shutdown};

    use super::*;
    use ferry_core::test_support::{TestChannel, config, context};

    fn build(yaml: &str) -> Box<SeqSource> {
        Box::new(SeqSource::build(&config("seq", yaml)).unwrap())
    }

    #[tokio::test]
    async fn sends_decimal_counter_in_batches_until_total() {
        let channel = TestChannel::new(100, 100);
        let (ctx, _) = context(&channel);
        let source = build("batch_size: 3\ntotal_events: 7");
        assert_eq!(source.max_batch_size(), Some(3));
        source.run(ctx).await.unwrap();
        assert_eq!(channel.bodies(), ["0", "1", "2", "3", "4", "5", "6"]);
        assert_eq!(channel.batches(), 3, "batches of 3, 3 and 1");
        assert_eq!(channel.checkpoint(), Some(Checkpoint::new("7")));
    }

    #[tokio::test]
    async fn resumes_after_its_checkpoint() {
        let channel = TestChannel::new(100, 100);
        let store = Arc::new(MemoryCheckpointStore::default());
        store.save("test", &Checkpoint::new("5")).unwrap();
        let ctx = SourceContext::new(
            "test",
            vec![channel.clone() as Arc<dyn Channel>],
            vec![],
            Shutdown::new(),
            store,
        )
        .unwrap();
        build("total_events: 8").run(ctx).await.unwrap();
        assert_eq!(channel.bodies(), ["5", "6", "7"]);
    }

    #[tokio::test]
    async fn unlimited_source_stops_on_shutdown() {
        let channel = TestChannel::new(1_000_000, 100);
        let (ctx, shutdown) = context(&channel);
        let task = tokio::spawn(build("batch_size: 10").run(ctx));
        channel.wait_for(50).await;
        shutdown.trigger();
        task.await.unwrap().unwrap();
        let bodies = channel.bodies();
        let expected: Vec<String> = (0..bodies.len()).map(|i| i.to_string()).collect();
        assert_eq!(bodies, expected);
    }

    #[test]
    fn rejects_zero_batch_size_and_unknown_options() {
        assert!(SeqSource::build(&config("seq", "batch_size: 0")).is_err());
        let err = SeqSource::build(&config("seq", "totalEvents: 3")).unwrap_err();
        assert!(err.message.contains("total_events"), "{}", err.message);
    }
}
