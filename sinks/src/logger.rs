//! `logger`: Flume's `LoggerSink`. Logs every event at INFO through `tracing`, in Flume's
//! format: headers as a Java map and the first `max_bytes_to_log` bytes of the body as a hex
//! dump followed by the printable characters (Flume's `EventHelper.dumpEvent`):
//!
//! ```text
//! Event: { headers:{host=web-1} body: 48 65 6C 6C 6F 0D                                Hello. }
//! ```

use std::fmt::Write as _;

use ferry_core::{
    ComponentConfig, ConfigError, Event, Sink, SinkBatch, SinkContext, SinkError, async_trait,
};
use serde::Deserialize;

/// Options of the `logger` sink.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoggerConfig {
    /// Bytes of each body to show. Default `16`. Flume: `maxBytesToLog`.
    #[serde(default = "default_max_bytes_to_log")]
    pub max_bytes_to_log: usize,
}

fn default_max_bytes_to_log() -> usize {
    16
}

/// The logger sink.
#[derive(Debug)]
pub struct LoggerSink {
    max_bytes_to_log: usize,
    name: String,
}

impl LoggerSink {
    /// Validates the options.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        let config: LoggerConfig = cfg.parse()?;
        Ok(Self {
            max_bytes_to_log: config.max_bytes_to_log,
            name: cfg.name().to_owned(),
        })
    }
}

#[async_trait]
impl Sink for LoggerSink {
    async fn start(&mut self, ctx: &SinkContext) -> Result<(), SinkError> {
        self.name.clone_from(&ctx.name);
        Ok(())
    }

    async fn deliver(&mut self, batch: SinkBatch<'_>) -> Result<(), SinkError> {
        for event in batch.events {
            tracing::info!(sink = %self.name, "Event: {}", dump_event(event, self.max_bytes_to_log));
        }
        Ok(())
    }
}

/// Flume's `EventHelper.dumpEvent`: `{ headers:{k=v, ...} body: <hex dump> }`.
fn dump_event(event: &Event, max_bytes: usize) -> String {
    let mut headers = Vec::new();
    crate::push_java_map(&mut headers, &event.headers);
    let mut out = format!("{{ headers:{} body:", String::from_utf8_lossy(&headers));
    let shown = &event.body[..event.body.len().min(max_bytes)];
    let dump = hex_dump(shown);
    // As Flume: the offset of the first line says nothing for so little data.
    let dump = dump.strip_prefix("00000000").unwrap_or(&dump);
    out.push_str(dump.strip_suffix('\n').unwrap_or(dump));
    out.push_str(" }");
    out
}

/// Apache Commons IO's `HexDump.dump`: per 16 bytes, the offset, the bytes in hex and the
/// printable characters (others as `.`), one line each.
fn hex_dump(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(16) * 76);
    for (line, chunk) in data.chunks(16).enumerate() {
        let _ = write!(out, "{:08X} ", line * 16);
        for slot in 0..16 {
            match chunk.get(slot) {
                Some(byte) => {
                    let _ = write!(out, "{byte:02X} ");
                }
                None => out.push_str("   "),
            }
        }
        out.extend(chunk.iter().map(|&b| {
            if (b' '..127).contains(&b) {
                b as char
            } else {
                '.'
            }
        }));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dumps_like_flume() {
        let event = Event::from_body("Hello world!\r");
        assert_eq!(
            dump_event(&event, 16),
            "{ headers:{} body: 48 65 6C 6C 6F 20 77 6F 72 6C 64 21 0D          Hello world!. }"
        );
    }

    #[test]
    fn shows_headers_as_a_java_map_and_cuts_the_body() {
        let mut event = Event::from_body("123456");
        event.headers.insert("b".into(), "2".into());
        event.headers.insert("a".into(), "1".into());
        let padding = " ".repeat(3 * 13);
        assert_eq!(
            dump_event(&event, 3),
            format!("{{ headers:{{a=1, b=2}} body: 31 32 33 {padding}123 }}")
        );
        assert_eq!(dump_event(&Event::default(), 16), "{ headers:{} body: }");
    }

    #[test]
    fn longer_dumps_keep_later_offsets() {
        let event = Event::from_body(vec![b'x'; 20]);
        let dump = dump_event(&event, 100);
        let lines: Vec<&str> = dump.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[1].starts_with("00000010 78 78 78 78 "), "{dump}");
        assert!(lines[1].ends_with("xxxx }"), "{dump}");
    }

    #[tokio::test]
    async fn delivers_every_batch() {
        let mut sink = LoggerSink::build(&crate::config("logger", "max_bytes_to_log: 4")).unwrap();
        sink.start(&crate::context()).await.unwrap();
        let events = [Event::from_body("abc")];
        let batch = SinkBatch {
            events: &events,
            sequences: None,
        };
        sink.deliver(batch).await.unwrap();
    }
}
