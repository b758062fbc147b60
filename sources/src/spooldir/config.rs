//! Options of the `spooldir` source.

use std::path::PathBuf;
use std::time::Duration;

use ferry_core::config::ByteSize;
use serde::Deserialize;

/// Options of the `spooldir` source.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpooldirConfig {
    /// The directory files are dropped into, complete and never changed afterwards.
    /// Required. Flume: `spoolDir`.
    pub spool_dir: PathBuf,
    /// Appended to the name of a file once all its events were sent. Default `.COMPLETED`.
    /// Flume: `fileSuffix`.
    #[serde(default = "default_file_suffix")]
    pub file_suffix: String,
    /// `never`: completed files are renamed with `file_suffix`; `immediate`: deleted.
    /// Default `never`. Flume: `deletePolicy`. With a memory channel, a file is deleted once
    /// its last events are in the channel, before the sinks delivered them: if the agent dies
    /// then, they are lost. Use a file channel with `immediate` (with `never` the completed
    /// file is read again where the delivered events end).
    #[serde(default)]
    pub delete_policy: DeletePolicy,
    /// File names matching this regular expression are not read. Default `^$`.
    /// Flume: `ignorePattern`.
    #[serde(default = "default_ignore_pattern")]
    pub ignore_pattern: String,
    /// Only file names matching this regular expression are read. Default `^.*$`.
    /// Flume: `includePattern`.
    #[serde(default = "default_include_pattern")]
    pub include_pattern: String,
    /// Which file is read next: `oldest` or `youngest` by modification time (then by name),
    /// or `random`. Default `oldest`. Flume: `consumeOrder`.
    #[serde(default)]
    pub consume_order: ConsumeOrder,
    /// Add the absolute path of the file to every event. Default `false`.
    /// Flume: `fileHeader`.
    #[serde(default)]
    pub file_header: bool,
    /// Header key of the path. Default `file`. Flume: `fileHeaderKey`.
    #[serde(default = "default_file_header_key")]
    pub file_header_key: String,
    /// Add the file name (without directory) to every event. Default `false`.
    /// Flume: `basenameHeader`.
    #[serde(default)]
    pub basename_header: bool,
    /// Header key of the file name. Default `basename`. Flume: `basenameHeaderKey`.
    #[serde(default = "default_basename_header_key")]
    pub basename_header_key: String,
    /// A line longer than this is sent in pieces of this size. Default `1MiB`.
    /// Flume: `deserializer.maxLineLength` (2048, and Flume drops the rest of the line).
    #[serde(default = "default_max_line_length")]
    pub max_line_length: ByteSize,
    /// Most events per put (also capped by the channels' `transaction_capacity`).
    /// Default `100`. Flume: `batchSize`.
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// How long to wait before looking at the directory again when it has no file to read.
    /// Default `500ms`. Flume: `pollDelay` (500 ms).
    #[serde(default = "default_poll_delay", with = "ferry_core::config::duration")]
    pub poll_delay: Duration,
}

/// What happens to a file once its events were sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeletePolicy {
    /// Renamed with `file_suffix`.
    #[default]
    Never,
    /// Deleted.
    Immediate,
}

/// Which file of the spool directory is read next.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConsumeOrder {
    /// Least recently modified first.
    #[default]
    Oldest,
    /// Most recently modified first.
    Youngest,
    /// Any.
    Random,
}

fn default_file_suffix() -> String {
    ".COMPLETED".into()
}

fn default_ignore_pattern() -> String {
    "^$".into()
}

fn default_include_pattern() -> String {
    "^.*$".into()
}

fn default_file_header_key() -> String {
    "file".into()
}

fn default_basename_header_key() -> String {
    "basename".into()
}

fn default_max_line_length() -> ByteSize {
    ByteSize(1024 * 1024)
}

fn default_batch_size() -> usize {
    100
}

fn default_poll_delay() -> Duration {
    Duration::from_millis(500)
}
