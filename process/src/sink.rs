//! `type: process` as a sink: each take is sent to the program, which answers with an ack (the
//! take commits) or an error (it rolls back and comes again after a backoff). A program that
//! dies, times out or writes a malformed line is stopped and started again for the retry.

use ferry_core::{
    ComponentConfig, ConfigError, Sink, SinkBatch, SinkContext, SinkError, async_trait,
};

use crate::{Incoming, Plugin, PluginError, ProcessConfig, batch_message};

/// A sink implemented by a program.
pub struct ProcessSink {
    name: String,
    config: ProcessConfig,
    plugin: Option<Plugin>,
    next_id: u64,
}

impl std::fmt::Debug for ProcessSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessSink")
            .field("name", &self.name)
            .field("command", &self.config.command)
            .finish()
    }
}

impl ProcessSink {
    /// Validates the options; the program starts with the first batch.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        Ok(Self {
            name: cfg.name().to_owned(),
            config: ProcessConfig::parse(cfg)?,
            plugin: None,
            next_id: 0,
        })
    }

    async fn exchange(&mut self, batch: SinkBatch<'_>) -> Result<(), PluginError> {
        if self.plugin.is_none() {
            self.plugin = Some(Plugin::start(&self.name, "sink", &self.config, None).await?);
        }
        let Some(plugin) = self.plugin.as_mut() else {
            return Ok(());
        };
        self.next_id += 1;
        let id = self.next_id;
        // The write has the same deadline as the answer: a program that stops reading its input
        // must not block the agent once the pipe is full.
        let timeout = self.config.timeout;
        match tokio::time::timeout(timeout, plugin.send(&batch_message(id, batch.events))).await {
            Ok(sent) => sent?,
            Err(_) => {
                return Err(PluginError::Timeout {
                    name: self.name.clone(),
                    timeout,
                });
            }
        }
        match plugin.receive(Some(self.config.timeout)).await? {
            Incoming::Ack { id: acked } if acked == id => Ok(()),
            Incoming::Error {
                id: failed,
                message,
            } if failed == id => Err(PluginError::Refused {
                name: self.name.clone(),
                id,
                message,
            }),
            other => Err(plugin.protocol_error(format!(
                "answered batch {id} with {other:?} instead of its ack or error"
            ))),
        }
    }
}

#[async_trait]
impl Sink for ProcessSink {
    async fn start(&mut self, _ctx: &SinkContext) -> Result<(), SinkError> {
        // The program starts with the first batch, so a program that cannot start is retried
        // like a failed delivery (and never holds up a shutdown).
        Ok(())
    }

    async fn deliver(&mut self, batch: SinkBatch<'_>) -> Result<(), SinkError> {
        match self.exchange(batch).await {
            Ok(()) => Ok(()),
            // The program reported the failure itself: it is still in a known state.
            Err(error @ PluginError::Refused { .. }) => Err(SinkError::Delivery(error.to_string())),
            Err(error) => {
                // Its state is unknown (dead, hung, or talking nonsense): start it again for
                // the retry.
                if let Some(plugin) = self.plugin.take() {
                    plugin.stop(std::time::Duration::from_secs(1)).await;
                }
                tracing::error!(sink = %self.name, %error, "process plugin failed; it is restarted for the retry");
                Err(SinkError::Delivery(error.to_string()))
            }
        }
    }

    async fn stop(&mut self) -> Result<(), SinkError> {
        if let Some(plugin) = self.plugin.take() {
            plugin.stop(std::time::Duration::from_secs(5)).await;
        }
        Ok(())
    }
}
