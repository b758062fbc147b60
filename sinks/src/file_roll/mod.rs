//! `file_roll`: Flume's `RollingFileSink`. Writes events to files in a directory, starting a
//! new file every `roll_interval` and, optionally, whenever a file reaches `roll_size`.
//!
//! # Files
//!
//! | file | what |
//! |------|------|
//! | `<prefix><series>-<index><suffix>.tmp` | the file being written: never read it |
//! | `<prefix><series>-<index><suffix>` | a finished file: complete, never written again |
//!
//! `<series>` is the time the sink started, in milliseconds since the Unix epoch, and
//! `<index>` counts the files of that run from `0000000001`; both have a fixed width, so
//! sorting the names sorts the files in the order they were written (across restarts too,
//! as long as the clock does not go back).
//!
//! # Invariants
//!
//! - `deliver` returns `Ok` only after the whole batch is written and, with `sync` (the
//!   default), on disk (`fdatasync`), so a crash after that loses nothing.
//! - A batch is never split across files; a file exceeds `roll_size` only when one batch
//!   alone is larger.
//! - A failed write is cut back off the file, so the retried batch is not written twice.
//! - A file is finished by an atomic rename (followed by a sync of the directory).
//!
//! # Exactly-once
//!
//! With the agent's state store, after every batch is on disk the sink records its
//! **progress** there: the file being written, its committed length and the channel sequence
//! numbers of the batch (`first..=last`). Only then does `deliver` return, and only then does
//! the runner commit the take. A crash can therefore leave two kinds of surplus, and the next
//! start removes both:
//!
//! - bytes written after the last recorded length (the batch was not acknowledged, so the
//!   channel still holds it): the recorded file is cut back to its committed length, and
//!   `.tmp` files other than the recorded one are deleted (they hold only such bytes);
//! - a batch recorded but whose take was not committed (the channel gives it again): events
//!   whose sequence numbers fall in the recorded range are skipped.
//!
//! Events from a durable channel (which numbers them) are thus written exactly once. With a
//! memory channel the cut-back still prevents duplicates of unacknowledged events; without a
//! state store (unit tests) the sink renames left-over `.tmp` files and is at-least-once.
//! - Time rolls are checked before each batch and when the runner reports the sink idle, so
//!   a quiet pipeline still finishes its file; no empty files are created.

mod serializer;
#[cfg(test)]
mod tests;

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ferry_core::config::ByteSize;
use ferry_core::state::StateStore;
use ferry_core::{
    ComponentConfig, ConfigError, Event, Sink, SinkBatch, SinkContext, SinkError, async_trait,
};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::roll::blocking;

pub use serializer::SerializerKind;

/// Options of the `file_roll` sink.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileRollConfig {
    /// Directory for the files; created if missing. Required. Flume: `sink.directory`.
    pub directory: PathBuf,
    /// Start a new file when the current one is this old; `0` never rolls by time.
    /// Default `30s`. Flume: `sink.rollInterval` (30 seconds).
    #[serde(
        default = "default_roll_interval",
        with = "ferry_core::config::duration"
    )]
    pub roll_interval: Duration,
    /// Start a new file when the current one would grow past this size, e.g. `64MiB`.
    /// Default: no size limit. (No Flume counterpart.)
    #[serde(default)]
    pub roll_size: Option<ByteSize>,
    /// Start of every file name. Default empty. Flume: `sink.pathManager.prefix`.
    #[serde(default)]
    pub prefix: String,
    /// End of every file name, e.g. `.log`. Default empty. Flume: `sink.pathManager.extension`
    /// (Flume adds the dot; here write it).
    #[serde(default)]
    pub suffix: String,
    /// How events are written: `text` (the body) or `header_and_text` (headers as
    /// `{k=v, ...}`, a space, the body). Default `text`. Flume: `sink.serializer`
    /// (`TEXT`, `HEADER_AND_TEXT`).
    #[serde(default)]
    pub serializer: SerializerKind,
    /// Write a newline after each event. Default `true`.
    /// Flume: `sink.serializer.appendNewline`.
    #[serde(default = "default_true")]
    pub append_newline: bool,
    /// Flush each batch to disk (`fdatasync`) before acknowledging it. Default `true`.
    /// (No Flume counterpart: Flume only flushes to the operating system.)
    #[serde(default = "default_true")]
    pub sync: bool,
}

fn default_roll_interval() -> Duration {
    Duration::from_secs(30)
}

fn default_true() -> bool {
    true
}

/// The rolling file sink.
#[derive(Debug)]
pub struct FileRollSink {
    config: FileRollConfig,
    /// Milliseconds since the epoch when the sink started: the first part of file names.
    series: u128,
    /// Number of the last file opened in this series.
    index: u64,
    current: Option<OpenFile>,
    /// Serialized batch, reused between batches.
    buffer: Vec<u8>,
    /// Where progress is recorded, and under which name (set by `start`).
    progress: Option<(StateStore, String)>,
    /// Sequence numbers of the last batch recorded as written: redelivered events in this
    /// range are skipped.
    delivered: Option<(u64, u64)>,
}

/// What the sink records after each batch (JSON in the state store).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Progress {
    /// Final name of the file being written.
    file: String,
    /// Its committed length in bytes.
    length: u64,
    /// Channel sequence numbers of the last batch written, if the channel numbers events.
    delivered: Option<(u64, u64)>,
}

#[derive(Debug)]
struct OpenFile {
    file: Arc<File>,
    temporary: PathBuf,
    finished: PathBuf,
    size: u64,
    opened: Instant,
}

const TEMPORARY_SUFFIX: &str = ".tmp";

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
        for (key, value) in [("prefix", &config.prefix), ("suffix", &config.suffix)] {
            if value.contains(['/', '\\']) {
                return Err(cfg.error_at(key, format!("`{key}` must not contain a path separator")));
            }
        }
        Ok(Self {
            config,
            series: 0,
            index: 0,
            current: None,
            buffer: Vec::new(),
            progress: None,
            delivered: None,
        })
    }

    /// Records that the current file holds `length` committed bytes, the last batch being
    /// `delivered`.
    async fn record_progress(&self, delivered: Option<(u64, u64)>) -> Result<(), SinkError> {
        let (Some((store, name)), Some(current)) = (&self.progress, &self.current) else {
            return Ok(());
        };
        let file = current
            .finished
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let record = Progress {
            file,
            length: current.size,
            delivered,
        };
        let bytes = serde_json::to_vec(&record)
            .map_err(|e| SinkError::Delivery(format!("encoding progress: {e}")))?;
        let (store, name) = (store.clone(), name.clone());
        blocking(move || {
            store
                .save_progress(&name, &bytes)
                .map_err(|e| SinkError::Delivery(format!("recording progress: {e}")))
        })
        .await
    }

    fn file_name(&self, index: u64) -> String {
        let FileRollConfig { prefix, suffix, .. } = &self.config;
        format!("{prefix}{:013}-{index:010}{suffix}", self.series)
    }

    fn roll_due_by_time(&self) -> bool {
        let interval = self.config.roll_interval;
        match &self.current {
            Some(current) => !interval.is_zero() && current.opened.elapsed() >= interval,
            None => false,
        }
    }

    async fn open(&mut self) -> Result<(), SinkError> {
        self.index += 1;
        let name = self.file_name(self.index);
        let finished = self.config.directory.join(&name);
        let temporary = self
            .config
            .directory
            .join(format!("{name}{TEMPORARY_SUFFIX}"));
        let path = temporary.clone();
        let file = blocking(move || {
            OpenOptions::new()
                .create_new(true)
                .append(true)
                .open(&path)
                .map_err(|e| SinkError::io(format!("creating {}", path.display()), e))
        })
        .await?;
        tracing::debug!(file = %temporary.display(), "file_roll sink opened a file");
        self.current = Some(OpenFile {
            file: Arc::new(file),
            temporary,
            finished,
            size: 0,
            opened: Instant::now(),
        });
        Ok(())
    }

    /// Finishes the current file: renames it to its final name.
    async fn roll(&mut self) -> Result<(), SinkError> {
        let Some(current) = self.current.take() else {
            return Ok(());
        };
        let (temporary, finished) = (current.temporary.clone(), current.finished.clone());
        let directory = self.config.directory.clone();
        let sync = self.config.sync;
        let result = blocking(move || finish(&temporary, &finished, &directory, sync)).await;
        match result {
            Ok(()) => {
                tracing::debug!(file = %current.finished.display(), "file_roll sink finished a file");
                Ok(())
            }
            Err(error) => {
                // Keep writing to it; the next roll tries again.
                self.current = Some(current);
                Err(error)
            }
        }
    }

    /// Appends the serialized batch to the current file, on disk once this returns `Ok`.
    async fn write_buffer(&mut self) -> Result<(), SinkError> {
        let Some(current) = &mut self.current else {
            return Err(SinkError::Delivery("file_roll sink: no open file".into()));
        };
        let file = Arc::clone(&current.file);
        let path = current.temporary.clone();
        let before = current.size;
        let sync = self.config.sync;
        let buffer = std::mem::take(&mut self.buffer);
        let (buffer, result) = blocking(move || {
            let result = append(&file, &buffer, before, sync)
                .map_err(|e| SinkError::io(format!("writing {}", path.display()), e));
            Ok((buffer, result))
        })
        .await?;
        current.size += buffer.len() as u64;
        self.buffer = buffer;
        if result.is_err() {
            current.size = before;
        }
        result
    }
}

/// Writes `data` at the end of `file` (of `before` bytes) and syncs it; on failure cuts the
/// file back to `before` bytes so a retry does not leave a partial copy behind.
fn append(mut file: &File, data: &[u8], before: u64, sync: bool) -> std::io::Result<()> {
    let written = file
        .write_all(data)
        .and_then(|()| if sync { file.sync_data() } else { Ok(()) });
    if written.is_err() {
        let _ = file.set_len(before);
    }
    written
}

/// Renames a finished file into place and makes the rename durable.
fn finish(
    temporary: &Path,
    finished: &Path,
    directory: &Path,
    sync: bool,
) -> Result<(), SinkError> {
    std::fs::rename(temporary, finished).map_err(|e| {
        SinkError::io(
            format!("renaming {} to {}", temporary.display(), finished.display()),
            e,
        )
    })?;
    if sync {
        File::open(directory)
            .and_then(|d| d.sync_all())
            .map_err(|e| SinkError::io(format!("syncing directory {}", directory.display()), e))?;
    }
    Ok(())
}

/// Cleans up after a crashed run: the recorded file is cut back to its committed length and
/// finished; other `.tmp` files hold only unacknowledged bytes and are deleted. Without a
/// progress record every `.tmp` file is finished as it is (at-least-once).
fn recover(
    directory: &Path,
    prefix: &str,
    suffix: &str,
    progress: Option<&Progress>,
) -> Result<usize, SinkError> {
    let context = || format!("listing {}", directory.display());
    let mut recovered = 0;
    for entry in std::fs::read_dir(directory).map_err(|e| SinkError::io(context(), e))? {
        let entry = entry.map_err(|e| SinkError::io(context(), e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(final_name) = name.strip_suffix(TEMPORARY_SUFFIX) else {
            continue;
        };
        let ours = final_name
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix(suffix))
            .is_some_and(is_series_and_index);
        if !ours {
            continue;
        }
        let finished = directory.join(final_name);
        if finished.exists() {
            tracing::warn!(file = %entry.path().display(), "left-over file has a finished twin; leaving it alone");
            continue;
        }
        match progress {
            Some(progress) if progress.file == final_name => {
                cut_back(&entry.path(), progress.length)?;
            }
            Some(_) => {
                std::fs::remove_file(entry.path()).map_err(|e| {
                    SinkError::io(format!("removing {}", entry.path().display()), e)
                })?;
                tracing::info!(file = %entry.path().display(), "removed a file holding only unacknowledged events");
                continue;
            }
            None => {}
        }
        finish(&entry.path(), &finished, directory, true)?;
        recovered += 1;
    }
    Ok(recovered)
}

/// Cuts `path` back to `length` bytes (what was committed), durably.
fn cut_back(path: &Path, length: u64) -> Result<(), SinkError> {
    let context = || format!("cutting {} back to {length} bytes", path.display());
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| SinkError::io(context(), e))?;
    let actual = file
        .metadata()
        .map_err(|e| SinkError::io(context(), e))?
        .len();
    if actual > length {
        file.set_len(length)
            .and_then(|()| file.sync_all())
            .map_err(|e| SinkError::io(context(), e))?;
        tracing::info!(file = %path.display(), removed = actual - length, "cut unacknowledged bytes off the end of a file");
    }
    Ok(())
}

/// Whether `text` is `<13 digits>-<10 digits>`, the middle of the names this sink writes.
fn is_series_and_index(text: &str) -> bool {
    text.split_once('-').is_some_and(|(series, index)| {
        series.len() == 13
            && index.len() == 10
            && series
                .bytes()
                .chain(index.bytes())
                .all(|b| b.is_ascii_digit())
    })
}

#[async_trait]
impl Sink for FileRollSink {
    async fn start(&mut self, ctx: &SinkContext) -> Result<(), SinkError> {
        self.series = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
        let FileRollConfig {
            directory,
            prefix,
            suffix,
            ..
        } = self.config.clone();
        self.progress = ctx.state.clone().map(|store| (store, ctx.name.clone()));
        let recorded = match &self.progress {
            Some((store, name)) => {
                let (store, name) = (store.clone(), name.clone());
                let raw = blocking(move || {
                    store
                        .load_progress(&name)
                        .map_err(|e| SinkError::Delivery(format!("loading progress: {e}")))
                })
                .await?;
                match raw {
                    Some(raw) => Some(serde_json::from_slice::<Progress>(&raw).map_err(|e| {
                        SinkError::Delivery(format!("progress record is damaged: {e}"))
                    })?),
                    None => None,
                }
            }
            None => None,
        };
        self.delivered = recorded.as_ref().and_then(|p| p.delivered);
        let recovered = blocking(move || {
            std::fs::create_dir_all(&directory).map_err(|e| {
                SinkError::io(format!("creating directory {}", directory.display()), e)
            })?;
            recover(&directory, &prefix, &suffix, recorded.as_ref())
        })
        .await?;
        if recovered > 0 {
            tracing::warn!(
                sink = ctx.name,
                recovered,
                "finished files left in progress by an earlier run"
            );
        }
        Ok(())
    }

    async fn deliver(&mut self, batch: SinkBatch<'_>) -> Result<(), SinkError> {
        if batch.events.is_empty() {
            return Ok(());
        }
        if self.roll_due_by_time() {
            self.roll().await?;
        }
        // Skip what an earlier run recorded as written but could not commit.
        let skip = |i: usize| match (batch.sequences, self.delivered) {
            (Some(seqs), Some((first, last))) => {
                seqs.get(i).is_some_and(|s| (first..=last).contains(s))
            }
            _ => false,
        };
        let fresh: Vec<&Event> = (0..batch.events.len())
            .filter(|i| !skip(*i))
            .map(|i| &batch.events[i])
            .collect();
        if fresh.is_empty() {
            return Ok(());
        }
        let delivered = batch
            .sequences
            .and_then(|seqs| Some((*seqs.first()?, *seqs.last()?)));
        self.buffer.clear();
        serializer::write_batch(
            &mut self.buffer,
            fresh,
            self.config.serializer,
            self.config.append_newline,
        );
        let limit = self.config.roll_size.map_or(u64::MAX, ByteSize::bytes);
        let size = self.current.as_ref().map_or(0, |current| current.size);
        if size > 0 && size.saturating_add(self.buffer.len() as u64) > limit {
            self.roll().await?;
        }
        if self.current.is_none() {
            self.open().await?;
        }
        let before = self.current.as_ref().map_or(0, |current| current.size);
        self.write_buffer().await?;
        if let Err(error) = self.record_progress(delivered).await {
            // Not recorded, so not acknowledged: take the bytes back off so that the retry
            // does not write them twice.
            if let Some(current) = &mut self.current {
                let (file, path) = (Arc::clone(&current.file), current.temporary.clone());
                current.size = before;
                blocking(move || {
                    file.set_len(before)
                        .map_err(|e| SinkError::io(format!("truncating {}", path.display()), e))
                })
                .await?;
            }
            return Err(error);
        }
        self.delivered = delivered;
        if self
            .current
            .as_ref()
            .is_some_and(|current| current.size >= limit)
        {
            self.roll().await?;
        }
        Ok(())
    }

    async fn idle(&mut self) -> Result<(), SinkError> {
        if self.roll_due_by_time() {
            self.roll().await?;
        }
        Ok(())
    }

    async fn stop(&mut self) -> Result<(), SinkError> {
        self.roll().await
    }
}
