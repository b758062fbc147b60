//! `type: process` as a source: the program writes batches (with an optional checkpoint); the
//! agent puts each into the channels and answers with an ack once every channel committed it,
//! or an error. The checkpoint comes back to the program in the hello of its next start.

use std::time::Duration;

use ferry_core::{
    Checkpoint, ComponentConfig, ConfigError, Source, SourceContext, SourceError, async_trait,
};

use crate::{Incoming, Plugin, PluginError, ProcessConfig, events_of};

/// A source implemented by a program.
pub struct ProcessSource {
    name: String,
    config: ProcessConfig,
}

impl std::fmt::Debug for ProcessSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessSource")
            .field("name", &self.name)
            .field("command", &self.config.command)
            .finish()
    }
}

impl ProcessSource {
    /// Validates the options; the program starts when the source runs.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        Ok(Self {
            name: cfg.name().to_owned(),
            config: ProcessConfig::parse(cfg)?,
        })
    }
}

fn answer(id: u64, error: Option<String>) -> serde_json::Value {
    match error {
        None => serde_json::json!({ "type": "ack", "id": id }),
        Some(message) => serde_json::json!({ "type": "error", "id": id, "message": message }),
    }
}

#[async_trait]
impl Source for ProcessSource {
    fn max_batch_size(&self) -> Option<usize> {
        Some(self.config.batch_size)
    }

    async fn run(self: Box<Self>, ctx: SourceContext) -> Result<(), SourceError> {
        let checkpoint = ctx
            .checkpoint()
            .map(|c| String::from_utf8_lossy(c.as_bytes()).into_owned());
        let mut plugin = Plugin::start(&self.name, "source", &self.config, checkpoint)
            .await
            .map_err(|e| SourceError::Other(e.to_string()))?;
        let shutdown = ctx.shutdown().clone();
        loop {
            let message = tokio::select! {
                message = plugin.receive(None) => message,
                _ = shutdown.wait() => {
                    plugin.stop(Duration::from_secs(5)).await;
                    return Ok(());
                }
            };
            let (id, events, checkpoint) = match message {
                Ok(Incoming::Batch {
                    id,
                    events,
                    checkpoint,
                }) => (id, events, checkpoint),
                Ok(other) => {
                    tracing::error!(source = %self.name, message = ?other, "process plugin sent something other than a batch; ignored");
                    continue;
                }
                Err(error @ PluginError::Malformed { .. }) => {
                    // Not committed; the program hears about it without an id, since none
                    // could be read.
                    tracing::error!(source = %self.name, %error, "batch not committed");
                    let reply =
                        serde_json::json!({ "type": "error", "message": error.to_string() });
                    plugin
                        .send(&reply)
                        .await
                        .map_err(|e| SourceError::Other(e.to_string()))?;
                    continue;
                }
                Err(PluginError::Exited { success: true, .. }) => {
                    tracing::info!(source = %self.name, "process plugin finished");
                    return Ok(());
                }
                Err(error) => return Err(SourceError::Other(error.to_string())),
            };
            if events.len() > self.config.batch_size {
                let message = format!(
                    "batch {id} has {} events, more than `batch_size` {}",
                    events.len(),
                    self.config.batch_size
                );
                tracing::error!(source = %self.name, "{message}; not committed");
                plugin
                    .send(&answer(id, Some(message)))
                    .await
                    .map_err(|e| SourceError::Other(e.to_string()))?;
                continue;
            }
            let result = match events_of(plugin.name(), events) {
                Ok(events) => ctx
                    .send(events, checkpoint.map(|c| Checkpoint::new(c.into_bytes())))
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            if let Err(message) = &result {
                tracing::error!(source = %self.name, id, error = %message, "batch not committed");
            }
            plugin
                .send(&answer(id, result.err()))
                .await
                .map_err(|e| SourceError::Other(e.to_string()))?;
        }
    }
}
