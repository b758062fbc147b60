//! Two components written against the plugin API of `ferry-core` only, registered next to the
//! built-ins (see `main.rs`):
//!
//! - `ticker`, a source: `count` events whose body is `message` and a number, `batch_size` per
//!   put. Its checkpoint is the next number, so with a file channel a restart goes on where
//!   the last committed batch ended, and with a memory channel where the last delivered one
//!   did. It counts its batches in the `TickBatches` counter and stops on the shutdown signal.
//! - `jsonl`, a sink: appends each event as a JSON line (`{"headers":{...},"body":"..."}`) to
//!   `path` and fsyncs before acknowledging the batch: at-least-once (a crash between the fsync
//!   and the take commit writes the batch again).

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use ferry_core::{
    Checkpoint, ComponentConfig, ConfigError, Counter, Event, Registry, Sink, SinkBatch,
    SinkContext, SinkError, Source, SourceContext, SourceError, async_trait,
};
use serde::Deserialize;

/// Registers `ticker` and `jsonl`.
pub fn register(registry: &mut Registry) {
    registry
        .register_source("ticker", |cfg| Ok(Box::new(Ticker::build(cfg)?)))
        .register_sink("jsonl", |cfg| Ok(Box::new(JsonLines::build(cfg)?)));
}

/// Options of `ticker`, parsed with the same error reporting as the built-ins (line, column,
/// the closest known option).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TickerConfig {
    /// The body of every event, before its number.
    message: String,
    /// How many events in all (counting those sent before a restart).
    count: u64,
    /// Events per put.
    #[serde(default = "default_batch_size")]
    batch_size: usize,
    /// Pause between puts.
    #[serde(default, with = "ferry_core::config::duration")]
    interval: Duration,
}

fn default_batch_size() -> usize {
    10
}

/// The `ticker` source.
#[derive(Debug)]
pub struct Ticker {
    config: TickerConfig,
}

impl Ticker {
    fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        let config: TickerConfig = cfg.parse()?;
        if config.batch_size == 0 {
            return Err(cfg.error_at("batch_size", "`batch_size` must be at least 1"));
        }
        Ok(Self { config })
    }
}

#[async_trait]
impl Source for Ticker {
    fn max_batch_size(&self) -> Option<usize> {
        Some(self.config.batch_size)
    }

    async fn run(self: Box<Self>, ctx: SourceContext) -> Result<(), SourceError> {
        let mut next: u64 = match ctx.checkpoint() {
            Some(checkpoint) => std::str::from_utf8(checkpoint.as_bytes())
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| SourceError::Other("checkpoint is not a number".into()))?,
            None => 0,
        };
        let batches: Counter = ctx.metrics().counter("TickBatches");
        while next < self.config.count && !ctx.shutdown().is_triggered() {
            let end = (next + self.config.batch_size as u64).min(self.config.count);
            let events = (next..end)
                .map(|n| {
                    let mut event = Event::from_body(format!("{} {n}", self.config.message));
                    event.headers.set("n", n.to_string());
                    event
                })
                .collect();
            // Returns once every channel holds the batch; the checkpoint goes with it.
            ctx.send(events, Some(Checkpoint::new(end.to_string())))
                .await?;
            batches.inc();
            next = end;
            tokio::select! {
                _ = tokio::time::sleep(self.config.interval) => {}
                _ = ctx.shutdown().wait() => {}
            }
        }
        Ok(())
    }
}

/// Options of `jsonl`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonLinesConfig {
    /// The file to append to.
    path: PathBuf,
}

/// The `jsonl` sink.
#[derive(Debug)]
pub struct JsonLines {
    path: PathBuf,
    file: Option<std::fs::File>,
    written: Option<Counter>,
}

impl JsonLines {
    fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        let config: JsonLinesConfig = cfg.parse()?;
        Ok(Self {
            path: config.path,
            file: None,
            written: None,
        })
    }
}

#[async_trait]
impl Sink for JsonLines {
    async fn start(&mut self, ctx: &SinkContext) -> Result<(), SinkError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(|e| SinkError::io(format!("opening {}", self.path.display()), e))?;
        self.file = Some(file);
        self.written = Some(ctx.metrics.counter("LinesWritten"));
        Ok(())
    }

    async fn deliver(&mut self, batch: SinkBatch<'_>) -> Result<(), SinkError> {
        let Some(file) = self.file.as_mut() else {
            return Err(SinkError::Delivery("jsonl used before start".into()));
        };
        let mut out = Vec::new();
        for event in batch.events {
            let line = serde_json::json!({
                "headers": event.headers,
                "body": String::from_utf8_lossy(&event.body),
            });
            out.extend_from_slice(line.to_string().as_bytes());
            out.push(b'\n');
        }
        let context = || format!("writing {}", self.path.display());
        file.write_all(&out)
            .and_then(|()| file.sync_data())
            .map_err(|e| SinkError::io(context(), e))?;
        if let Some(written) = &self.written {
            written.add(batch.events.len() as u64);
        }
        Ok(())
    }
}
