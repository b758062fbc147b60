//! How events become bytes in a rolled file or object (stub: being written).

use serde::Deserialize;

/// How events are written.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// The body (Flume's `TEXT`, `DataStream`).
    #[default]
    Text,
    /// Headers as `{k=v, ...}`, a space, the body (Flume's `HEADER_AND_TEXT`).
    HeaderAndText,
    /// A JSON object per line: `{"headers":{...},"body":"..."}`.
    Json,
    /// Apache Parquet: a column per header and one for the body.
    Parquet,
}

/// How a file or object is compressed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Compression {
    /// Not compressed.
    #[default]
    None,
    /// gzip.
    Gzip,
    /// Zstandard.
    Zstd,
}
