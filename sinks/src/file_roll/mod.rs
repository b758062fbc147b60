//! `file_roll`: Flume's `RollingFileSink`, with what Flume's HDFS sink adds (path escapes,
//! rolling by size, count, age and idleness, formats, compression). It writes through the
//! same rolling writer as the `s3` sink ([`crate::roll`]): the same options give the same
//! files, here in a directory, there in a bucket.
//!
//! # Files
//!
//! | file | what |
//! |------|------|
//! | `<sink>.<id>.stage.tmp` (and `.parquet.tmp`) | a file being written: never read it |
//! | `<path>/<prefix><sink>.<first>-<last><suffix>` | a finished file: complete, never written again |
//!
//! `<first>` and `<last>` are the channel sequence numbers of the file's first and last
//! events (20 digits), so sorting a sink's names sorts its files in write order and a file
//! written again after a crash has the same name and the same bytes. With a channel that
//! does not number events, the name holds the time the file was opened (milliseconds since
//! the epoch, 13 digits) and a counter (10 digits).
//!
//! # Invariants
//!
//! - A flush (the runner's, after up to [`crate::roll::PIPELINING`] batches) returns `Ok`
//!   only after every batch sent since the last one is written and, with `sync` (the
//!   default), on disk (`fdatasync`), and recorded in the state store.
//! - A batch is never split across files; a file exceeds `roll_size` only when one batch
//!   alone is larger.
//! - A failed write or flush cuts every batch since the last flush back off the files, so
//!   the retried batches are not written twice.
//! - A file is finished by an atomic rename into place (followed by a sync of its
//!   directory), so a reader never sees a partial file under a final name.
//!
//! # Exactly-once
//!
//! As the `s3` sink (see [`crate::roll`]): the progress record lists the files being
//! written with their committed lengths, the finished files with their final names, and
//! the sequence numbers of the batches whose takes are not yet committed. A start cuts surplus bytes off, removes files no
//! record names, skips a recorded batch the channel gives again, and moves finished files
//! into place (a finished file already in place was moved before the crash). With a memory
//! channel the cut-back still prevents duplicates of unacknowledged events.

mod legacy;
#[cfg(test)]
mod tests;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ferry_core::config::ByteSize;
use ferry_core::{
    ComponentConfig, ConfigError, Pipelining, Sink, SinkBatch, SinkContext, SinkError, async_trait,
};
use serde::Deserialize;

use crate::roll::{
    Compression, Format, RollOptions, RollSettings, Roller, SharedProgress, Staging, blocking,
};

/// Options of the `file_roll` sink.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileRollConfig {
    /// Directory for the files; created if missing. Required. Flume: `sink.directory`.
    pub directory: PathBuf,
    /// Subdirectory of `directory` for the files, with Flume's escapes (`%Y/%m/%d`,
    /// `%{host}`, ...). Default: `directory` itself. (Flume's HDFS sink: `hdfs.path`.)
    #[serde(default)]
    pub path: String,
    /// Start of every file name (escapes allowed). Default empty.
    /// Flume: `sink.pathManager.prefix`, `hdfs.filePrefix`.
    #[serde(default, alias = "file_prefix")]
    pub prefix: String,
    /// End of every file name, e.g. `.log`. Default: the format's and compression's (empty
    /// for `text`, `.gz`, `.jsonl`, `.parquet`, ...). Flume: `sink.pathManager.extension`
    /// (Flume adds the dot; here write it), `hdfs.fileSuffix`.
    #[serde(default, alias = "file_suffix")]
    pub suffix: Option<String>,
    /// How events are written: `text` (the body), `header_and_text` (headers as
    /// `{k=v, ...}`, a space, the body), `json` (a JSON object per line with `headers` and
    /// `body`) or `parquet` (a column per header). Default `text`. Also accepted as
    /// `serializer`. Flume: `sink.serializer` (`TEXT`, `HEADER_AND_TEXT`).
    #[serde(default, alias = "serializer")]
    pub format: Format,
    /// `none`, `gzip` or `zstd`. Default `none`. Flume's HDFS sink: `hdfs.codeC`.
    #[serde(default)]
    pub compression: Compression,
    /// Write a newline after each event (`text`, `header_and_text`). Default `true`.
    /// Flume: `sink.serializer.appendNewline`.
    #[serde(default = "default_true")]
    pub append_newline: bool,
    /// Finish a file this long after its first event; `0` never. Default `30s`.
    /// Flume: `sink.rollInterval` (30 seconds).
    #[serde(
        default = "default_roll_interval",
        with = "ferry_core::config::duration"
    )]
    pub roll_interval: Duration,
    /// Finish a file when it would grow past this size (before compression), e.g. `64MiB`.
    /// Default: no size limit. Flume's HDFS sink: `hdfs.rollSize`.
    #[serde(default)]
    pub roll_size: Option<ByteSize>,
    /// Finish a file when it holds this many events; `0` never. Default `0`.
    /// Flume's HDFS sink: `hdfs.rollCount`.
    #[serde(default)]
    pub roll_count: u64,
    /// Finish a file when no event was added to it for this long; `0` never. Default `0`.
    /// Flume's HDFS sink: `hdfs.idleTimeout`.
    #[serde(default, with = "ferry_core::config::duration")]
    pub idle_timeout: Duration,
    /// At most this many files open at once (one per distinct path); the least recently
    /// written is finished to open another. Default `100`. Flume: `hdfs.maxOpenFiles`.
    #[serde(default = "default_max_open_files")]
    pub max_open_files: usize,
    /// Time escapes use the time the sink writes the event rather than its `timestamp`
    /// header. Default `false`. Flume: `hdfs.useLocalTimeStamp`.
    #[serde(default)]
    pub use_local_time: bool,
    /// Round times down to a multiple of this (`10m`, `1h`) before the escapes use them.
    /// Flume: `hdfs.round`, `hdfs.roundValue`, `hdfs.roundUnit`.
    #[serde(default, with = "ferry_core::config::duration::option")]
    pub round: Option<Duration>,
    /// The time zone of the escapes, an IANA name. Default: the system's.
    /// Flume: `hdfs.timeZone`.
    #[serde(default)]
    pub time_zone: Option<String>,
    /// Flush the batches to disk (`fdatasync`) before acknowledging them. Default `true`.
    /// (No Flume counterpart: Flume only flushes to the operating system.)
    #[serde(default = "default_true")]
    pub sync: bool,
}

fn default_roll_interval() -> Duration {
    Duration::from_secs(30)
}

fn default_max_open_files() -> usize {
    100
}

fn default_true() -> bool {
    true
}

/// The rolling file sink.
#[derive(Debug)]
pub struct FileRollSink {
    config: FileRollConfig,
    settings: Option<RollSettings>,
    running: Option<Running>,
}

/// What a started sink holds.
#[derive(Debug)]
struct Running {
    roller: Roller,
    progress: Arc<SharedProgress>,
    staging: Staging,
}

impl FileRollSink {
    /// Validates the options.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        let config: FileRollConfig = cfg.parse()?;
        if config.directory.as_os_str().is_empty() {
            return Err(cfg.error_at("directory", "`directory` must not be empty"));
        }
        if config.roll_size == Some(ByteSize(0)) {
            return Err(cfg.error_at("roll_size", "`roll_size` must be above 0"));
        }
        if config.path.starts_with('/') || config.path.split('/').any(|part| part == "..") {
            return Err(cfg.error_at(
                "path",
                "`path` is a subdirectory of `directory`: it must not start with `/` or go up with `..`",
            ));
        }
        if config.prefix.contains(['/', '\\']) {
            return Err(cfg.error_at(
                "prefix",
                "`prefix` must not contain a path separator: write directories in `path`",
            ));
        }
        let settings = RollSettings::new(
            cfg,
            RollOptions {
                path: ("path", &config.path),
                file_prefix: ("prefix", &config.prefix),
                file_suffix: ("suffix", config.suffix.as_deref()),
                format: config.format,
                compression: config.compression,
                append_newline: config.append_newline,
                roll_size: config.roll_size.map_or(0, ByteSize::bytes),
                roll_count: config.roll_count,
                roll_interval: config.roll_interval,
                idle_timeout: config.idle_timeout,
                max_open_files: config.max_open_files,
                use_local_time: config.use_local_time,
                round: config.round,
                time_zone: config.time_zone.as_deref(),
            },
        )?;
        Ok(Self {
            config,
            settings: Some(settings),
            running: None,
        })
    }

    /// Moves the finished files into place.
    async fn publish(&self) -> Result<(), SinkError> {
        let Some(running) = &self.running else {
            return Ok(());
        };
        if !running.progress.has_finished() {
            return Ok(());
        }
        let (progress, staging) = (Arc::clone(&running.progress), running.staging.clone());
        let (directory, format, compression, sync) = (
            self.config.directory.clone(),
            self.config.format,
            self.config.compression,
            self.config.sync,
        );
        blocking(move || publish(&progress, &staging, &directory, format, compression, sync)).await
    }
}

/// Moves every finished file to its final name and drops it from the record. A file whose
/// final name exists was moved before a crash. Blocking.
fn publish(
    progress: &SharedProgress,
    staging: &Staging,
    directory: &Path,
    format: Format,
    compression: Compression,
    sync: bool,
) -> Result<(), SinkError> {
    for record in progress.get().finished {
        let target = directory.join(&record.key);
        if !target.exists() {
            let file = staging.finished_file(&record, format, compression)?;
            let parent = target.parent().unwrap_or(directory);
            make_directories(directory, parent, sync)?;
            rename_durably(&file, &target, parent, sync)?;
            tracing::debug!(file = %target.display(), "file_roll sink finished a file");
        }
        staging.remove(record.id);
        progress.update(|p| p.finished.retain(|f| f.id != record.id))?;
    }
    Ok(())
}

/// Creates `parent` (inside `directory`) if missing; with `sync` the new directories'
/// entries are made durable.
fn make_directories(directory: &Path, parent: &Path, sync: bool) -> Result<(), SinkError> {
    if parent.is_dir() {
        return Ok(());
    }
    std::fs::create_dir_all(parent)
        .map_err(|e| SinkError::io(format!("creating directory {}", parent.display()), e))?;
    if sync {
        let mut dir = parent;
        while let Some(up) = dir.parent() {
            sync_directory(up)?;
            if up == directory {
                break;
            }
            dir = up;
        }
    }
    Ok(())
}

fn sync_directory(directory: &Path) -> Result<(), SinkError> {
    File::open(directory)
        .and_then(|d| d.sync_all())
        .map_err(|e| SinkError::io(format!("syncing directory {}", directory.display()), e))
}

/// Renames `from` to `to` (both in `directory`'s file system) and makes the rename durable.
fn rename_durably(from: &Path, to: &Path, directory: &Path, sync: bool) -> Result<(), SinkError> {
    std::fs::rename(from, to).map_err(|e| {
        SinkError::io(
            format!("renaming {} to {}", from.display(), to.display()),
            e,
        )
    })?;
    if sync {
        sync_directory(directory)?;
    }
    Ok(())
}

#[async_trait]
impl Sink for FileRollSink {
    async fn start(&mut self, ctx: &SinkContext) -> Result<(), SinkError> {
        let Some(store) = ctx.state.clone() else {
            return Err(SinkError::Delivery(
                "the file_roll sink keeps its progress in the agent's state store, and there is none"
                    .into(),
            ));
        };
        let Some(settings) = self.settings.take() else {
            return Err(SinkError::Delivery(
                "the file_roll sink was started twice".into(),
            ));
        };
        let config = self.config.clone();
        let name = ctx.name.clone();
        let staging = Staging::beside(config.directory.clone(), &name, config.sync);
        let (running, recovered) = blocking(move || {
            let directory = &config.directory;
            std::fs::create_dir_all(directory).map_err(|e| {
                SinkError::io(format!("creating directory {}", directory.display()), e)
            })?;
            // Files of the version before the shared writer: finish them, once.
            let raw = store
                .load_progress(&name)
                .map_err(|e| SinkError::Delivery(format!("loading progress: {e}")))?;
            let earlier = raw
                .as_deref()
                .and_then(|raw| serde_json::from_slice::<legacy::Progress>(raw).ok());
            let mut recovered = 0;
            if raw.is_none() || earlier.is_some() {
                let suffix = config.suffix.as_deref().unwrap_or_default();
                recovered = legacy::recover(directory, &config.prefix, suffix, earlier.as_ref())?;
            }
            if let Some(earlier) = earlier {
                let record = crate::roll::Progress {
                    delivered: earlier.delivered.into(),
                    ..Default::default()
                };
                let bytes = serde_json::to_vec(&record)
                    .map_err(|e| SinkError::Delivery(format!("encoding progress: {e}")))?;
                store
                    .save_progress(&name, &bytes)
                    .map_err(|e| SinkError::Delivery(format!("recording progress: {e}")))?;
            }
            let progress = Arc::new(SharedProgress::load(store, &name)?);
            recovered += progress.get().finished.len();
            publish(
                &progress,
                &staging,
                directory,
                config.format,
                config.compression,
                config.sync,
            )?;
            let roller = Roller::recover(settings, &name, staging.clone(), Arc::clone(&progress))?;
            Ok((
                Running {
                    roller,
                    progress,
                    staging,
                },
                recovered,
            ))
        })
        .await?;
        if recovered > 0 {
            tracing::warn!(
                sink = ctx.name,
                recovered,
                "finished files left in progress by an earlier run"
            );
        }
        self.running = Some(running);
        Ok(())
    }

    async fn deliver(&mut self, batch: SinkBatch<'_>) -> Result<(), SinkError> {
        self.send(batch).await?;
        self.flush().await
    }

    async fn send(&mut self, batch: SinkBatch<'_>) -> Result<(), SinkError> {
        let Some(running) = &mut self.running else {
            return Err(SinkError::Delivery(
                "the file_roll sink is not started".into(),
            ));
        };
        if batch.events.is_empty() {
            return Ok(());
        }
        running.roller.send(batch.events, batch.sequences).await
    }

    /// One `fdatasync` per file written and one state-store transaction for every batch
    /// sent since the last flush; then finished files move into place.
    async fn flush(&mut self) -> Result<(), SinkError> {
        let Some(running) = &mut self.running else {
            return Ok(());
        };
        running.roller.flush().await?;
        self.publish().await
    }

    fn pipelining(&self) -> Pipelining {
        crate::roll::PIPELINING
    }

    async fn idle(&mut self) -> Result<(), SinkError> {
        let Some(running) = &mut self.running else {
            return Ok(());
        };
        running.roller.roll_due().await?;
        self.publish().await
    }

    async fn stop(&mut self) -> Result<(), SinkError> {
        let Some(running) = &mut self.running else {
            return Ok(());
        };
        running.roller.roll_all().await?;
        self.publish().await
    }
}
