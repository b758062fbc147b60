//! Options of the `taildir` source.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use ferry_core::config::ByteSize;
use ferry_core::{ComponentConfig, ConfigError};
use regex::bytes::Regex;
use serde::Deserialize;

/// Options of the `taildir` source.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaildirConfig {
    /// Files to tail: group name to a glob of paths (`*`, `?`, `[a-z]`, `**` in any part of
    /// the path), e.g. `{ app: /var/log/app/*.log }`. Required, at least one group.
    /// Flume: `filegroups` and `filegroups.<group>` (where only the file name may be a
    /// regular expression). A file matched by several groups is tailed once, in the group
    /// whose name sorts first.
    pub filegroups: BTreeMap<String, String>,
    /// Headers added to every event of a group: group name to header key to value.
    /// Default none. Flume: `headers.<group>.<key>`.
    #[serde(default)]
    pub headers: BTreeMap<String, BTreeMap<String, String>>,
    /// Add the path of the file (as its glob matched it) to every event. Default `false`.
    /// Flume: `fileHeader`.
    #[serde(default)]
    pub file_header: bool,
    /// Header key of the path. Default `file`. Flume: `fileHeaderKey`.
    #[serde(default = "default_file_header_key")]
    pub file_header_key: String,
    /// Add the byte offset of the event's first line in its file as header `byteoffset`.
    /// Default `false`. Flume: `byteOffsetHeader`.
    #[serde(default)]
    pub byte_offset_header: bool,
    /// Files that have no saved position when the source starts are read from their end
    /// (from the start of a last line still being written) instead of their start. Files that
    /// appear later (a rotated log's new file) are always read from their start. Default `false`. Flume: `skipToEnd` (which also skips the start
    /// of files appearing later).
    #[serde(default)]
    pub skip_to_end: bool,
    /// Most events per put (also capped by the channels' `transaction_capacity`).
    /// Default `100`. Flume: `batchSize`.
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// Close the handle of a file that has not grown for this long (it is reopened when it
    /// grows); a file renamed out of the globs or deleted is released after it was read to
    /// its end and stayed idle this long. Default `120s`. Flume: `idleTimeout` (120000 ms).
    #[serde(
        default = "default_idle_timeout",
        with = "ferry_core::config::duration"
    )]
    pub idle_timeout: Duration,
    /// A last line without its newline is held until the newline is written; with this set, it
    /// is sent as an event once the file has not grown for this long (what follows then starts
    /// a new line). Default: never (held until its newline). Flume: none (Flume holds it).
    #[serde(default, with = "ferry_core::config::duration::option")]
    pub partial_line_flush: Option<Duration>,
    /// A line longer than this is sent in pieces of this size, so that a file without line
    /// endings never fills memory. Default `1MiB`. Flume: none (Flume holds any line whole).
    #[serde(default = "default_max_line_length")]
    pub max_line_length: ByteSize,
    /// How often the globs are expanded again and every file checked, in addition to the
    /// filesystem notifications that make new and grown files picked up at once.
    /// Default `1s`. Flume: none (Flume only polls, backing off by `backoffSleepIncrement`,
    /// 1 s, up to `maxBackoffSleep`, 5 s).
    #[serde(
        default = "default_poll_interval",
        with = "ferry_core::config::duration"
    )]
    pub poll_interval: Duration,
    /// Join lines into one event, e.g. a stack trace. Default: one event per line.
    /// Flume: none.
    #[serde(default)]
    pub multiline: Option<MultilineConfig>,
    /// A Flume `taildir_position.json` (`[{"inode":..,"pos":..,"file":..}]`) to start from
    /// when this source has no saved position yet, to migrate from Flume without reading the
    /// files again. Ignored once the source has saved positions. Default none.
    /// Flume: `positionFile` (the file Flume wrote).
    #[serde(default)]
    pub flume_position_file: Option<PathBuf>,
}

/// How lines are joined into multi-line events. Exactly one of `start_pattern` and
/// `continuation_pattern` is given.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MultilineConfig {
    /// A line matching this regular expression starts a new event; other lines are appended
    /// to the event before them, e.g. `^\d{4}-\d{2}-\d{2} ` for timestamped logs.
    #[serde(default)]
    pub start_pattern: Option<String>,
    /// A line matching this regular expression continues the event before it; other lines
    /// start a new event, e.g. `^(\s+at |Caused by:|\s+\.\.\. )` for Java stack traces.
    #[serde(default)]
    pub continuation_pattern: Option<String>,
    /// Send the event being joined once its file has not grown for this long.
    /// Default `1s`.
    #[serde(
        default = "default_multiline_timeout",
        with = "ferry_core::config::duration"
    )]
    pub timeout: Duration,
    /// Send the event being joined once it has this many lines. Default `500`.
    #[serde(default = "default_max_lines")]
    pub max_lines: usize,
    /// Send the event being joined once it has this many bytes. Default `1MiB`.
    #[serde(default = "default_max_bytes")]
    pub max_bytes: ByteSize,
}

fn default_file_header_key() -> String {
    "file".into()
}

fn default_batch_size() -> usize {
    100
}

fn default_idle_timeout() -> Duration {
    Duration::from_secs(120)
}

fn default_poll_interval() -> Duration {
    Duration::from_secs(1)
}

fn default_max_line_length() -> ByteSize {
    ByteSize(1024 * 1024)
}

fn default_multiline_timeout() -> Duration {
    Duration::from_secs(1)
}

fn default_max_lines() -> usize {
    500
}

fn default_max_bytes() -> ByteSize {
    ByteSize(1024 * 1024)
}

/// What decides where a multi-line event starts, compiled.
#[derive(Debug, Clone)]
pub(crate) enum Joining {
    /// A line matching starts an event.
    Start(Regex),
    /// A line matching continues the event.
    Continuation(Regex),
}

/// Multi-line options, validated and compiled.
#[derive(Debug, Clone)]
pub(crate) struct Multiline {
    pub(crate) joining: Joining,
    pub(crate) timeout: Duration,
    pub(crate) max_lines: usize,
    pub(crate) max_bytes: usize,
}

impl Multiline {
    pub(crate) fn build(
        cfg: &ComponentConfig,
        config: &MultilineConfig,
    ) -> Result<Self, ConfigError> {
        let compile = |pattern: &str| {
            Regex::new(pattern).map_err(|e| {
                cfg.error_at(
                    "multiline",
                    format!("`multiline`: invalid regular expression `{pattern}`: {e}"),
                )
            })
        };
        let joining = match (&config.start_pattern, &config.continuation_pattern) {
            (Some(start), None) => Joining::Start(compile(start)?),
            (None, Some(continuation)) => Joining::Continuation(compile(continuation)?),
            _ => {
                return Err(cfg.error_at(
                    "multiline",
                    "`multiline` needs exactly one of `start_pattern` and `continuation_pattern`",
                ));
            }
        };
        if config.max_lines == 0 || config.max_bytes.bytes() == 0 {
            return Err(cfg.error_at(
                "multiline",
                "`multiline`: `max_lines` and `max_bytes` must be at least 1",
            ));
        }
        Ok(Self {
            joining,
            timeout: config.timeout,
            max_lines: config.max_lines,
            max_bytes: usize::try_from(config.max_bytes.bytes()).unwrap_or(usize::MAX),
        })
    }
}
