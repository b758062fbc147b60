//! Process plugins: a source, sink or interceptor implemented by any program that speaks
//! newline-delimited JSON on its standard input and output (`type: process`). The protocol is
//! specified in `docs/plugins.md`; in short:
//!
//! 1. The agent starts the program and writes `{"type":"hello","protocol":1,"role":...,
//!    "name":...,"config":{...},"checkpoint":...}`; the program answers
//!    `{"type":"hello","protocol":1}`.
//! 2. Sink: the agent writes `{"type":"batch","id":N,"events":[...]}`; the program answers
//!    `{"type":"ack","id":N}` once the events are safe, or `{"type":"error","id":N,
//!    "message":...}`. The take commits only on the ack; anything else rolls it back and the
//!    batch comes again after a backoff.
//! 3. Source: the program writes `{"type":"batch","id":N,"events":[...],"checkpoint":...}`;
//!    the agent answers `{"type":"ack","id":N}` once every channel committed the batch, or
//!    `{"type":"error","id":N,"message":...}`. The program advances its own position only
//!    after the ack.
//! 4. Interceptor: the agent writes a batch, the program answers
//!    `{"type":"batch","id":N,"events":[...]}` with the events to put.
//!
//! An event is `{"headers":{"k":"v"},"body":"text"}`, or `"body_base64"` for a body that is not
//! UTF-8. The program's standard error goes to the agent's log, a line at a time. A program that
//! dies is started again with a backoff; a malformed line is logged with the plugin's name and
//! the line, and its batch is not committed.

mod interceptor;
mod sink;
mod source;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use base64::Engine;
use ferry_core::{ComponentConfig, ConfigError, Event, Headers, Registry};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use tokio::process::{Child, ChildStdin, ChildStdout, Command};

pub use interceptor::ProcessInterceptor;
pub use sink::ProcessSink;
pub use source::ProcessSource;

/// The protocol version this agent speaks.
pub const PROTOCOL: u32 = 1;

/// Longest line read from a program (a batch of 1000 events of 1 KB is about 1 MB).
pub(crate) const MAX_LINE: usize = 64 << 20;

/// Registers `process` as a source, a sink and an interceptor type.
pub fn register(registry: &mut Registry) {
    registry
        .register_source("process", |cfg| Ok(Box::new(ProcessSource::build(cfg)?)))
        .register_sink("process", |cfg| Ok(Box::new(ProcessSink::build(cfg)?)))
        .register_interceptor("process", |cfg| {
            Ok(std::sync::Arc::new(ProcessInterceptor::build(cfg)?))
        });
}

/// Options of every process plugin.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessConfig {
    /// The program and its arguments, e.g. `[python3, plugins/sink.py]`. Required.
    pub command: Vec<String>,
    /// Anything, handed to the program in the hello message.
    #[serde(default)]
    pub config: Option<serde_json::Value>,
    /// Environment variables for the program.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// How long the program may take to answer the hello or a batch. Default `30s`.
    #[serde(default = "default_timeout", with = "ferry_core::config::duration")]
    pub timeout: Duration,
    /// Source only: most events per batch the program may send. Default `100` (the memory
    /// channel's default `transaction_capacity`).
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
}

fn default_timeout() -> Duration {
    Duration::from_secs(30)
}
fn default_batch_size() -> usize {
    100
}

impl ProcessConfig {
    fn parse(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        let config: ProcessConfig = cfg.parse()?;
        if config.command.first().is_none_or(String::is_empty) {
            return Err(cfg.error_at(
                "command",
                "`command` must name a program, e.g. `[python3, plugin.py]`",
            ));
        }
        if config.batch_size == 0 {
            return Err(cfg.error_at("batch_size", "`batch_size` must be at least 1"));
        }
        Ok(config)
    }
}

/// An event on the wire.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WireEvent {
    #[serde(default)]
    headers: Headers,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    body: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    body_base64: Option<String>,
}

impl WireEvent {
    pub(crate) fn from_event(event: &Event) -> Self {
        match std::str::from_utf8(&event.body) {
            Ok(text) => WireEvent {
                headers: event.headers.clone(),
                body: Some(text.to_owned()),
                body_base64: None,
            },
            Err(_) => WireEvent {
                headers: event.headers.clone(),
                body: None,
                body_base64: Some(base64::engine::general_purpose::STANDARD.encode(&event.body)),
            },
        }
    }

    pub(crate) fn into_event(self) -> Result<Event, String> {
        let body = match (self.body, self.body_base64) {
            (Some(text), None) => text.into_bytes(),
            (None, Some(encoded)) => base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map_err(|e| format!("`body_base64` is not base64: {e}"))?,
            (None, None) => Vec::new(),
            (Some(_), Some(_)) => return Err("an event has both `body` and `body_base64`".into()),
        };
        Ok(Event::new(self.headers, body))
    }
}

/// A message from the program.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum Incoming {
    Hello {
        protocol: u32,
    },
    Ack {
        id: u64,
    },
    Error {
        id: u64,
        #[serde(default)]
        message: String,
    },
    Batch {
        id: u64,
        events: Vec<WireEvent>,
        #[serde(default)]
        checkpoint: Option<String>,
    },
}

/// Why talking to a plugin failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PluginError {
    #[error("plugin `{name}`: cannot start {command:?}: {source}")]
    Spawn {
        name: String,
        command: Vec<String>,
        source: std::io::Error,
    },
    #[error("plugin `{name}` exited ({status})")]
    Exited {
        name: String,
        status: String,
        success: bool,
    },
    #[error("plugin `{name}` sent a malformed line ({reason}): {line}")]
    Malformed {
        name: String,
        reason: String,
        line: String,
    },
    #[error("plugin `{name}` did not answer within {timeout:?}")]
    Timeout { name: String, timeout: Duration },
    #[error("plugin `{name}`: {message}")]
    Protocol { name: String, message: String },
    #[error("plugin `{name}` failed batch {id}: {message}")]
    Refused {
        name: String,
        id: u64,
        message: String,
    },
    #[error("plugin `{name}`: cannot write to it: {source}")]
    Write {
        name: String,
        source: std::io::Error,
    },
}

/// A running plugin program.
pub(crate) struct Plugin {
    name: String,
    child: Child,
    stdin: ChildStdin,
    stdout: LineReader<ChildStdout>,
    timeout: Duration,
}

impl Plugin {
    /// Starts the program and shakes hands: `role` is `source`, `sink` or `interceptor`.
    pub(crate) async fn start(
        name: &str,
        role: &str,
        config: &ProcessConfig,
        checkpoint: Option<String>,
    ) -> Result<Plugin, PluginError> {
        let mut child = Command::new(&config.command[0])
            .args(&config.command[1..])
            .envs(&config.env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group: a Ctrl-C in the agent's terminal reaches the agent, which
            // stops the program in order, rather than the program at once.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| PluginError::Spawn {
                name: name.to_owned(),
                command: config.command.clone(),
                source,
            })?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(PluginError::Protocol {
                name: name.to_owned(),
                message: "no pipes to the program".into(),
            });
        };
        let plugin_name = name.to_owned();
        tokio::spawn(async move {
            let mut lines = LineReader::new(stderr, 16 << 10);
            loop {
                match lines.next_line().await {
                    Ok(Line::Complete(line)) => {
                        tracing::warn!(plugin = %plugin_name, "{}", String::from_utf8_lossy(&line));
                    }
                    Ok(Line::TooLong(start)) => {
                        tracing::warn!(plugin = %plugin_name, "{}... (line cut)", String::from_utf8_lossy(&start));
                    }
                    Ok(Line::End) | Err(_) => break,
                }
            }
        });
        tracing::info!(plugin = %name, pid = child.id(), command = ?config.command, "plugin started");
        let mut plugin = Plugin {
            name: name.to_owned(),
            child,
            stdin,
            stdout: LineReader::new(stdout, MAX_LINE),
            timeout: config.timeout,
        };
        let mut hello = serde_json::json!({
            "type": "hello",
            "protocol": PROTOCOL,
            "role": role,
            "name": name,
            "config": config.config.clone().unwrap_or(serde_json::Value::Null),
        });
        if role == "source" {
            hello["checkpoint"] = serde_json::json!(checkpoint);
            hello["batch_size"] = serde_json::json!(config.batch_size);
        }
        plugin.send(&hello).await?;
        match plugin.receive(Some(plugin.timeout)).await? {
            Incoming::Hello { protocol } if protocol == PROTOCOL => Ok(plugin),
            Incoming::Hello { protocol } => {
                Err(plugin
                    .protocol_error(format!("speaks protocol {protocol}, this agent {PROTOCOL}")))
            }
            other => Err(plugin.protocol_error(format!(
                "answered the hello with {other:?} instead of a hello"
            ))),
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn protocol_error(&self, message: String) -> PluginError {
        PluginError::Protocol {
            name: self.name.clone(),
            message,
        }
    }

    /// Writes one message line.
    pub(crate) async fn send(&mut self, message: &serde_json::Value) -> Result<(), PluginError> {
        let mut line = message.to_string();
        line.push('\n');
        let write = async {
            self.stdin.write_all(line.as_bytes()).await?;
            self.stdin.flush().await
        };
        match write.await {
            Ok(()) => Ok(()),
            Err(source) => Err(self.exited_or(PluginError::Write {
                name: self.name.clone(),
                source,
            })),
        }
    }

    /// Reads the next message, waiting at most `timeout` (forever with `None`).
    pub(crate) async fn receive(
        &mut self,
        timeout: Option<Duration>,
    ) -> Result<Incoming, PluginError> {
        let next = self.stdout.next_line();
        let read = match timeout {
            Some(timeout) => match tokio::time::timeout(timeout, next).await {
                Ok(line) => line,
                Err(_) => {
                    return Err(PluginError::Timeout {
                        name: self.name.clone(),
                        timeout,
                    });
                }
            },
            None => next.await,
        };
        let line = match read {
            Ok(Line::Complete(line)) => line,
            Ok(Line::TooLong(start)) => {
                return Err(PluginError::Malformed {
                    name: self.name.clone(),
                    reason: format!("a line longer than {MAX_LINE} bytes"),
                    line: truncate(&String::from_utf8_lossy(&start)),
                });
            }
            Ok(Line::End) | Err(_) => {
                let (status, success) =
                    match tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await {
                        Ok(Ok(status)) => (status.to_string(), status.success()),
                        _ => ("closed its output".to_owned(), false),
                    };
                return Err(PluginError::Exited {
                    name: self.name.clone(),
                    status,
                    success,
                });
            }
        };
        serde_json::from_slice(&line).map_err(|e| PluginError::Malformed {
            name: self.name.clone(),
            reason: e.to_string(),
            line: truncate(&String::from_utf8_lossy(&line)),
        })
    }

    /// The program's exit status if it has exited, else `error`.
    fn exited_or(&mut self, error: PluginError) -> PluginError {
        match self.child.try_wait() {
            Ok(Some(status)) => PluginError::Exited {
                name: self.name.clone(),
                status: status.to_string(),
                success: status.success(),
            },
            _ => error,
        }
    }

    /// Asks the program to stop (closing its input), then kills it after `grace`.
    pub(crate) async fn stop(mut self, grace: Duration) {
        // A program that stopped reading must not block this write.
        let stop = serde_json::json!({ "type": "stop" });
        let _ = tokio::time::timeout(grace, self.send(&stop)).await;
        drop(self.stdin);
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(Ok(status)) => tracing::info!(plugin = %self.name, %status, "plugin stopped"),
            _ => {
                tracing::warn!(plugin = %self.name, "plugin did not stop in time; killing it");
                let _ = self.child.kill().await;
            }
        }
    }
}

/// What [`LineReader::next_line`] read.
enum Line {
    /// A whole line, without its newline.
    Complete(Vec<u8>),
    /// A line over [`MAX_LINE`]: its first bytes; the rest of it is skipped.
    TooLong(Vec<u8>),
    /// The program closed its output.
    End,
}

/// Reads a program's output a line at a time, with a bound on the line length so that a
/// program writing without newlines cannot exhaust the agent's memory. Cancel-safe: a partly
/// read line is kept for the next call.
struct LineReader<R> {
    inner: BufReader<R>,
    max: usize,
    partial: Vec<u8>,
    /// Skipping the rest of a line that was too long.
    skipping: bool,
}

impl<R: tokio::io::AsyncRead + Unpin> LineReader<R> {
    fn new(output: R, max: usize) -> Self {
        Self {
            inner: BufReader::new(output),
            max,
            partial: Vec::new(),
            skipping: false,
        }
    }

    async fn next_line(&mut self) -> std::io::Result<Line> {
        loop {
            let buf = self.inner.fill_buf().await?;
            if buf.is_empty() {
                return Ok(Line::End);
            }
            let (chunk, newline) = match buf.iter().position(|b| *b == b'\n') {
                Some(i) => (&buf[..i], true),
                None => (buf, false),
            };
            let used = chunk.len() + usize::from(newline);
            if !self.skipping {
                self.partial.extend_from_slice(chunk);
            }
            self.inner.consume(used);
            if !self.skipping && self.partial.len() > self.max {
                // The rest of the line, if any is still to come, is skipped.
                self.skipping = !newline;
                let mut start = std::mem::take(&mut self.partial);
                start.truncate(500);
                return Ok(Line::TooLong(start));
            }
            if newline {
                if std::mem::take(&mut self.skipping) {
                    continue;
                }
                return Ok(Line::Complete(std::mem::take(&mut self.partial)));
            }
        }
    }
}

/// A line cut to a readable length for the log.
pub(crate) fn truncate(line: &str) -> String {
    const MAX: usize = 500;
    if line.len() <= MAX {
        return line.to_owned();
    }
    let mut end = MAX;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &line[..end], line.len())
}

/// The wire form of a batch of events.
pub(crate) fn batch_message(id: u64, events: &[Event]) -> serde_json::Value {
    let events: Vec<WireEvent> = events.iter().map(WireEvent::from_event).collect();
    serde_json::json!({ "type": "batch", "id": id, "events": events })
}

/// Events from their wire form; the first bad one fails the whole batch.
pub(crate) fn events_of(plugin: &str, events: Vec<WireEvent>) -> Result<Vec<Event>, PluginError> {
    events
        .into_iter()
        .map(WireEvent::into_event)
        .collect::<Result<_, _>>()
        .map_err(|message| PluginError::Protocol {
            name: plugin.to_owned(),
            message,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_that_are_not_text_travel_as_base64() {
        let mut text = Event::from_body("héllo");
        text.headers.insert("k".into(), "v".into());
        let binary = Event::from_body(vec![0xffu8, 0, 1]);
        for event in [text, binary] {
            let wire = WireEvent::from_event(&event);
            let json = serde_json::to_string(&wire).unwrap();
            let back: WireEvent = serde_json::from_str(&json).unwrap();
            assert_eq!(back.into_event().unwrap(), event);
        }
        let both: WireEvent = serde_json::from_str(r#"{"body":"a","body_base64":"YQ=="}"#).unwrap();
        assert!(both.into_event().is_err());
        assert!(serde_json::from_str::<Incoming>(r#"{"type":"ack"}"#).is_err());
        assert!(matches!(
            serde_json::from_str::<Incoming>(r#"{"type":"ack","id":3}"#),
            Ok(Incoming::Ack { id: 3 })
        ));
    }
}

#[cfg(test)]
mod line_tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_split_and_an_endless_one_is_cut_and_skipped() {
        let mut input = Vec::new();
        input.extend_from_slice(b"first\n");
        input.extend(std::iter::repeat_n(b'x', 100));
        input.extend_from_slice(b"\nsecond\nlast without newline");
        let mut reader = LineReader::new(&input[..], 50);
        assert!(matches!(reader.next_line().await.unwrap(), Line::Complete(l) if l == b"first"));
        assert!(
            matches!(reader.next_line().await.unwrap(), Line::TooLong(start) if start.len() <= 500)
        );
        assert!(matches!(reader.next_line().await.unwrap(), Line::Complete(l) if l == b"second"));
        assert!(matches!(reader.next_line().await.unwrap(), Line::End));

        // Longer than the reader's buffer: cut once, the rest skipped up to its newline.
        let mut input: Vec<u8> = std::iter::repeat_n(b'y', 100_000).collect();
        input.extend_from_slice(b"\n{}\n");
        let mut reader = LineReader::new(&input[..], 50);
        assert!(matches!(
            reader.next_line().await.unwrap(),
            Line::TooLong(_)
        ));
        assert!(matches!(reader.next_line().await.unwrap(), Line::Complete(l) if l == b"{}"));
        assert!(matches!(reader.next_line().await.unwrap(), Line::End));
    }
}

/// Entry points for the fuzz targets in `fuzz/` and their regression tests; not an API.
#[doc(hidden)]
pub mod fuzzing {
    /// One line from a plugin program, through what the agent does with it: the JSON message,
    /// then a batch's events. Any input must give a value or an error, never a panic.
    pub fn plugin_line(line: &[u8]) {
        if let Ok(super::Incoming::Batch { events, .. }) =
            serde_json::from_slice::<super::Incoming>(line)
        {
            let _ = super::events_of("fuzz", events);
        }
    }
}
