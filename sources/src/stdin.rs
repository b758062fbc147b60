//! `stdin`: the lines of the agent's standard input, one event per line (without `\n` or
//! `\r\n`). The lines of each read are put at once, in batches of at most `batch_size`, so an
//! interactive line goes out at once and piped input goes out in full batches. The source ends
//! at end of input, after putting a last line that had no newline.
//!
//! Standard input is read by a dedicated thread: a blocking read of a terminal cannot be
//! interrupted, and a thread of the async runtime blocked in it would keep the agent from
//! exiting on shutdown. The thread is left behind on shutdown and ends with the process.

use std::io::Read as _;

use ferry_core::{
    ComponentConfig, ConfigError, Event, Source, SourceContext, SourceError, async_trait,
};
use serde::Deserialize;
use tokio::sync::mpsc;

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

/// Chunks of input as read, then the end of the sender at end of input.
type Input = mpsc::Receiver<std::io::Result<Vec<u8>>>;

/// The standard input source.
#[derive(Debug)]
pub struct StdinSource {
    batch_size: usize,
    /// Where the input comes from; `None` reads the process's standard input.
    input: Option<Input>,
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
            input: None,
        })
    }
}

/// Starts the thread that reads standard input.
fn read_standard_input() -> Result<Input, SourceError> {
    // A small queue: when the channel is full the thread stops reading (backpressure).
    let (tx, rx) = mpsc::channel(4);
    std::thread::Builder::new()
        .name("stdin-source".into())
        .spawn(move || {
            let mut stdin = std::io::stdin().lock();
            loop {
                let mut buf = vec![0; 64 * 1024];
                let chunk = match stdin.read(&mut buf) {
                    Ok(0) => return,
                    Ok(n) => {
                        buf.truncate(n);
                        Ok(buf)
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => Err(e),
                };
                let failed = chunk.is_err();
                if tx.blocking_send(chunk).is_err() || failed {
                    return;
                }
            }
        })
        .map_err(|e| SourceError::io("starting the thread reading standard input", e))?;
    Ok(rx)
}

#[async_trait]
impl Source for StdinSource {
    fn max_batch_size(&self) -> Option<usize> {
        Some(self.batch_size)
    }

    async fn run(self: Box<Self>, ctx: SourceContext) -> Result<(), SourceError> {
        let StdinSource { batch_size, input } = *self;
        let mut input = match input {
            Some(input) => input,
            None => read_standard_input()?,
        };
        let size = batch_size.min(crate::transaction_capacity(&ctx));
        let mut lines = LineBuffer::new(true);
        loop {
            let chunk = tokio::select! {
                _ = ctx.shutdown().wait() => return Ok(()),
                chunk = input.recv() => chunk,
            };
            let at_eof = match chunk {
                Some(Ok(data)) => {
                    lines.push(&data);
                    false
                }
                Some(Err(e)) => return Err(SourceError::io("reading standard input", e)),
                None => true,
            };
            let mut events: Vec<Event> = std::iter::from_fn(|| lines.next_line())
                .map(Event::from_body)
                .collect();
            if at_eof {
                events.extend(lines.take_rest().map(Event::from_body));
            }
            for batch in crate::chunks(events, size) {
                ctx.send(batch, None).await?;
            }
            if at_eof {
                tracing::info!(source = ctx.name(), "end of standard input");
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_core::test_support::{TestChannel, config, context};

    fn source(yaml: &str) -> (Box<StdinSource>, mpsc::Sender<std::io::Result<Vec<u8>>>) {
        let mut source = StdinSource::build(&config("stdin", yaml)).unwrap();
        let (tx, rx) = mpsc::channel(16);
        source.input = Some(rx);
        (Box::new(source), tx)
    }

    #[tokio::test]
    async fn reads_lines_in_batches_until_eof() {
        let channel = TestChannel::new(100, 100);
        let (ctx, _) = context(&channel);
        let (source, tx) = source("batch_size: 2");
        assert_eq!(source.max_batch_size(), Some(2));
        tx.send(Ok(b"a\r\nb\nc\nd\n".to_vec())).await.unwrap();
        tx.send(Ok(b"e".to_vec())).await.unwrap();
        drop(tx);
        source.run(ctx).await.unwrap();
        assert_eq!(channel.bodies(), ["a", "b", "c", "d", "e"]);
        assert_eq!(channel.batches(), 3, "a b, c d, e");
    }

    #[tokio::test]
    async fn sends_each_line_as_it_comes_and_stops_on_shutdown() {
        let channel = TestChannel::new(100, 100);
        let (ctx, shutdown) = context(&channel);
        let (source, tx) = source("");
        let task = tokio::spawn(source.run(ctx));
        tx.send(Ok(b"first\nsec".to_vec())).await.unwrap();
        channel.wait_for(1).await;
        tx.send(Ok(b"ond\n".to_vec())).await.unwrap();
        channel.wait_for(2).await;
        shutdown.trigger();
        task.await.unwrap().unwrap();
        assert_eq!(channel.bodies(), ["first", "second"]);
    }

    #[tokio::test]
    async fn a_read_error_ends_the_source_with_context() {
        let channel = TestChannel::new(100, 100);
        let (ctx, _) = context(&channel);
        let (source, tx) = source("");
        tx.send(Err(std::io::Error::other("boom"))).await.unwrap();
        let err = source.run(ctx).await.unwrap_err();
        assert_eq!(err.to_string(), "reading standard input: boom");
    }
}
