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
        let shutdown = ctx.shutdown().clone();
        let mut plugin = tokio::select! {
            started = Plugin::start(&self.name, "source", &self.config, checkpoint) => {
                started.map_err(|e| SourceError::Other(e.to_string()))?
            }
            _ = shutdown.wait() => return Ok(()),
        };
        // With a memory channel an ack means "in the channel"; the program also hears when a
        // checkpoint becomes durable (its events delivered by the sinks).
        let volatile = ctx.channels().iter().any(|c| !c.is_durable());
        let mut durable = ctx.durable_checkpoint();
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut replies = Replies {
            closed: false,
            source: &self.name,
        };
        loop {
            let message = tokio::select! {
                message = plugin.receive(None) => message,
                _ = tick.tick(), if volatile => {
                    replies.durable(&mut plugin, &ctx, &mut durable).await;
                    continue;
                }
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
                    let message = format!("expected a batch, got {other:?}");
                    tracing::error!(source = %self.name, "process plugin: {message}; ignored");
                    let reply = serde_json::json!({ "type": "error", "message": message });
                    replies.send(&mut plugin, &reply).await;
                    continue;
                }
                Err(error @ PluginError::Malformed { .. }) => {
                    // Not committed; the program hears about it without an id, since none
                    // could be read.
                    tracing::error!(source = %self.name, %error, "batch not committed");
                    let reply =
                        serde_json::json!({ "type": "error", "message": error.to_string() });
                    replies.send(&mut plugin, &reply).await;
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
                replies.send(&mut plugin, &answer(id, Some(message))).await;
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
            replies.send(&mut plugin, &answer(id, result.err())).await;
            if volatile {
                replies.durable(&mut plugin, &ctx, &mut durable).await;
            }
        }
    }
}

/// Answers to the program. Once a write fails (it exited, or closed its input) nothing more
/// is written, but its output is still read to the end: batches it wrote before exiting are
/// committed, and an exit status of 0 then ends the source normally.
struct Replies<'a> {
    closed: bool,
    source: &'a str,
}

impl Replies<'_> {
    async fn send(&mut self, plugin: &mut Plugin, message: &serde_json::Value) {
        if self.closed {
            return;
        }
        if let Err(error) = plugin.send(message).await {
            tracing::info!(source = %self.source, %error, "process plugin no longer reads; reading the rest of its output");
            self.closed = true;
        }
    }

    /// Tells the program about a checkpoint that became durable since the last time.
    async fn durable(
        &mut self,
        plugin: &mut Plugin,
        ctx: &SourceContext,
        last: &mut Option<Checkpoint>,
    ) {
        let now = ctx.durable_checkpoint();
        if now == *last {
            return;
        }
        if let Some(checkpoint) = &now {
            let text = String::from_utf8_lossy(checkpoint.as_bytes()).into_owned();
            let message = serde_json::json!({ "type": "durable", "checkpoint": text });
            self.send(plugin, &message).await;
        }
        *last = now;
    }
}
