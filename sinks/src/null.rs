//! `null`: Flume's `NullSink`. Discards every event. (The runner counts them in
//! `EventDrainSuccessCount`, as for every sink.)

use ferry_core::{ComponentConfig, ConfigError, Sink, SinkBatch, SinkError, async_trait};
use serde::Deserialize;

/// Options of the `null` sink: none besides the runner's `batch_size`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NullConfig {}

/// The null sink.
#[derive(Debug, Default)]
pub struct NullSink;

impl NullSink {
    /// Validates the (empty) options.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        let NullConfig {} = cfg.parse()?;
        Ok(Self)
    }
}

#[async_trait]
impl Sink for NullSink {
    async fn deliver(&mut self, _batch: SinkBatch<'_>) -> Result<(), SinkError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use ferry_core::Event;

    use super::*;

    #[tokio::test]
    async fn accepts_everything_and_no_options() {
        let mut sink = NullSink::build(&crate::config("null", "")).unwrap();
        let events = vec![Event::from_body("a"), Event::from_body("b")];
        let batch = SinkBatch {
            events: &events,
            sequences: None,
        };
        sink.deliver(batch).await.unwrap();
        assert!(NullSink::build(&crate::config("null", "unknown: 1")).is_err());
    }
}
