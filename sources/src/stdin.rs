//! `stdin`: the lines of the agent's standard input, one event per line (without `\n` or
//! `\r\n`). The lines of each read are put at once, in batches of at most `batch_size`, so an
//! interactive line goes out at once and piped input goes out in full batches. The source ends
//! at end of input, after putting a last line that had no newline.
//!
//! Note: tokio reads standard input on a blocking thread that cannot be interrupted, so on
//! shutdown the source returns at once but that thread lives until the next line or EOF.

use ferry_core::{
    ComponentConfig, ConfigError, Event, Source, SourceContext, SourceError, async_trait,
};
use serde::Deserialize;
use tokio::io::AsyncRead;

use crate::lines::LineBuffer;

/// Options of the `stdin` source.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StdinConfig {
    /// Most lines per put. Default `100`. (No Flume counterpart.)
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
}

fn default_batch_size() -> usize {
    100
}

/// The standard input source.
pub struct StdinSource {
    batch_size: usize,
    input: Box<dyn AsyncRead + Send + Unpin>,
}

impl std::fmt::Debug for StdinSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StdinSource")
            .field("batch_size", &self.batch_size)
            .finish()
    }
}

impl StdinSource {
    /// Validates the options.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        let config: StdinConfig = cfg.parse()?;
        if config.batch_size == 0 {
            return Err(cfg.error_at("batch_size", "`batch_size` must be at least 1"));
        }
        Ok(Self {
            batch_size: config.batch_size,
            input: Box::new(tokio::io::stdin()),
        })
    }
}

#[async_trait]
impl Source for StdinSource {
    fn max_batch_size(&self) -> Option<usize> {
        Some(self.batch_size)
    }

    async fn run(self: Box<Self>, ctx: SourceContext) -> Result<(), SourceError> {
        let StdinSource {
            batch_size,
            mut input,
        } = *self;
        let size = batch_size.min(crate::transaction_capacity(&ctx));
        let mut lines = LineBuffer::new(true);
        loop {
            let read = tokio::select! {
                _ = ctx.shutdown().wait() => return Ok(()),
                read = lines.fill(&mut input) => {
                    read.map_err(|e| SourceError::io("reading standard input", e))?
                }
            };
            let mut events: Vec<Event> = std::iter::from_fn(|| lines.next_line())
                .map(Event::from_body)
                .collect();
            if read == 0 {
                events.extend(lines.take_rest().map(Event::from_body));
            }
            for batch in crate::chunks(events, size) {
                ctx.send(batch, None).await?;
            }
            if read == 0 {
                tracing::info!(source = ctx.name(), "end of standard input");
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;

    use super::*;
    use crate::test_channel::{TestChannel, config, context};

    #[tokio::test]
    async fn reads_lines_in_batches_until_eof() {
        let channel = TestChannel::new(100, 100);
        let (ctx, _) = context(&channel);
        let mut source = StdinSource::build(&config("stdin", "batch_size: 2")).unwrap();
        source.input = Box::new(&b"a\r\nb\nc\nd\ne"[..]);
        Box::new(source).run(ctx).await.unwrap();
        assert_eq!(channel.bodies(), ["a", "b", "c", "d", "e"]);
        assert_eq!(channel.batches(), 3);
    }

    #[tokio::test]
    async fn sends_each_line_as_it_comes_and_stops_on_shutdown() {
        let channel = TestChannel::new(100, 100);
        let (ctx, shutdown) = context(&channel);
        let mut source = StdinSource::build(&config("stdin", "")).unwrap();
        let (mut tx, rx) = tokio::io::duplex(1024);
        source.input = Box::new(rx);
        let task = tokio::spawn(Box::new(source).run(ctx));
        tx.write_all(b"first\n").await.unwrap();
        channel.wait_for(1).await;
        tx.write_all(b"second\n").await.unwrap();
        channel.wait_for(2).await;
        shutdown.trigger();
        task.await.unwrap().unwrap();
        assert_eq!(channel.bodies(), ["first", "second"]);
    }
}
