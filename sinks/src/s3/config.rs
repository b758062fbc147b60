//! Options of the `s3` sink.

use std::path::PathBuf;
use std::time::Duration;

use ferry_core::config::ByteSize;
use serde::Deserialize;

use crate::roll::{Compression, Format};

/// Options of the `s3` sink. Flume's `hdfs.*` counterpart in brackets where there is one.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct S3Config {
    /// The bucket. Required.
    pub bucket: String,
    /// Where in the bucket objects go: a key prefix with Flume's escapes (`%Y/%m/%d`,
    /// `%{header}`, ...), without the bucket. Default: the bucket's root. [`hdfs.path`]
    #[serde(default)]
    pub path: String,
    /// Start of every object's name, after `path` (escapes allowed). Default empty.
    /// [`hdfs.filePrefix`]
    #[serde(default)]
    pub file_prefix: String,
    /// End of every object's name, e.g. `.log.gz`. Default: the format's and compression's
    /// (`.gz`, `.zst`, `.jsonl`, `.jsonl.gz`, `.parquet`, ...). [`hdfs.fileSuffix`]
    #[serde(default)]
    pub file_suffix: Option<String>,

    /// The store's URL, for an S3-compatible store (`http://127.0.0.1:9000`). Default: AWS.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// The region. Default: `AWS_REGION`, `AWS_DEFAULT_REGION`, else `us-east-1`.
    #[serde(default)]
    pub region: Option<String>,
    /// Address the bucket in the path (`endpoint/bucket/key`) rather than in the host name
    /// (`bucket.endpoint/key`). Default `true`, which every S3-compatible store understands.
    #[serde(default = "default_true")]
    pub force_path_style: bool,
    /// Credentials. Default: the environment (`AWS_ACCESS_KEY_ID`, ...), then the profile
    /// file (`~/.aws/credentials`, `AWS_SHARED_CREDENTIALS_FILE`), then the instance's or
    /// container's role. Write secrets as `${ENV}`.
    #[serde(default)]
    pub access_key_id: Option<String>,
    /// See `access_key_id`.
    #[serde(default)]
    pub secret_access_key: Option<String>,
    /// See `access_key_id`.
    #[serde(default)]
    pub session_token: Option<String>,
    /// The profile of the profile file. Default: `AWS_PROFILE`, else `default`.
    #[serde(default)]
    pub profile: Option<String>,

    /// How events become bytes: `text` (the body, Flume's `DataStream`), `header_and_text`,
    /// `json` (a JSON object per line with `headers` and `body`) or `parquet` (a column per
    /// header). Default `text`. [`hdfs.fileType`, `serializer`]
    #[serde(default)]
    pub format: Format,
    /// `none`, `gzip` or `zstd`. Default `none`. [`hdfs.codeC` with `CompressedStream`]
    #[serde(default)]
    pub compression: Compression,
    /// Write a newline after each event (`text`, `header_and_text`). Default `true`.
    #[serde(default = "default_true")]
    pub append_newline: bool,

    /// Finish an object when it holds this many bytes (before compression); `0` never.
    /// Default `128MiB`. [`hdfs.rollSize`]
    #[serde(default = "default_roll_size")]
    pub roll_size: ByteSize,
    /// Finish an object when it holds this many events; `0` never. Default `0`.
    /// [`hdfs.rollCount`]
    #[serde(default)]
    pub roll_count: u64,
    /// Finish an object this long after its first event; `0` never. Default `5m`.
    /// [`hdfs.rollInterval`]
    #[serde(
        default = "default_roll_interval",
        with = "ferry_core::config::duration"
    )]
    pub roll_interval: Duration,
    /// Finish an object when no event was added to it for this long; `0` never. Default `0`.
    /// [`hdfs.idleTimeout`]
    #[serde(default, with = "ferry_core::config::duration")]
    pub idle_timeout: Duration,
    /// At most this many objects open at once (one per distinct path); the oldest is
    /// finished to open another. Default `5000`. [`hdfs.maxOpenFiles`]
    #[serde(default = "default_max_open_files")]
    pub max_open_files: usize,

    /// Time escapes use the time the sink writes the event rather than its `timestamp`
    /// header. Default `false`. [`hdfs.useLocalTimeStamp`]
    #[serde(default)]
    pub use_local_time: bool,
    /// Round times down to a multiple of this (`10m`, `1h`) before the escapes use them.
    /// Default: no rounding. [`hdfs.round`, `hdfs.roundValue`, `hdfs.roundUnit`]
    #[serde(default, with = "ferry_core::config::duration::option")]
    pub round: Option<Duration>,
    /// The time zone of the escapes, an IANA name (`Europe/Paris`, `UTC`). Default: the
    /// system's. [`hdfs.timeZone`]
    #[serde(default)]
    pub time_zone: Option<String>,

    /// Objects larger than this go up as multipart uploads of parts of this size (at least
    /// `5MiB`, S3's smallest part). Default `8MiB`.
    #[serde(default = "default_part_size")]
    pub part_size: ByteSize,
    /// Parts of one object uploaded at once: memory is bounded by `part_size` times this.
    /// Default `4`.
    #[serde(default = "default_parts_in_flight")]
    pub parts_in_flight: usize,
    /// Finished objects waiting for upload may take this much local disk; past it the sink
    /// takes no more events (they wait in the channel) until uploads catch up. Default `1GiB`.
    #[serde(default = "default_max_staged")]
    pub max_staged: ByteSize,
    /// Where objects are written before they go up. Default `<data_dir>/staging/<sink>`.
    #[serde(default)]
    pub staging_directory: Option<PathBuf>,
    /// A request to the store that takes longer than this fails (and is retried). Default `30s`.
    #[serde(
        default = "default_request_timeout",
        with = "ferry_core::config::duration"
    )]
    pub request_timeout: Duration,
}

fn default_true() -> bool {
    true
}

fn default_roll_size() -> ByteSize {
    ByteSize(128 << 20)
}

fn default_roll_interval() -> Duration {
    Duration::from_secs(300)
}

fn default_max_open_files() -> usize {
    5000
}

fn default_part_size() -> ByteSize {
    ByteSize(8 << 20)
}

fn default_parts_in_flight() -> usize {
    4
}

fn default_max_staged() -> ByteSize {
    ByteSize(1 << 30)
}

fn default_request_timeout() -> Duration {
    Duration::from_secs(30)
}
