//! The rolling writer of the `s3` and `file_roll` sinks: events go into staging files, one
//! per path (Flume's escapes, rendered per event), and a staging file is finished when it
//! rolls (by size, count, age or idleness), then published: uploaded as an object (`s3`) or
//! renamed into place (`file_roll`).
//!
//! # Staging files
//!
//! [`Staging`] names them: `<staging>/<id>.stage` in the `s3` sink's own directory,
//! `<directory>/<sink>.<id>.stage.tmp` beside `file_roll`'s finished files. One holds the
//! events of one future object or file, in its format (for Parquet, JSON lines that become
//! the Parquet file at roll). Each batch is appended as a self-contained chunk (a gzip
//! member, a zstd frame); the runner keeps several batches in flight ([`PIPELINING`]) and at
//! its flush the files written are synced (`fdatasync`, once per file) and only then
//! recorded, once for all those batches.
//!
//! # Progress
//!
//! One record in the agent's state store, under the sink's name ([`Progress`]), says which
//! staging files are open and their committed lengths, which are finished and under which
//! key they go up, and the channel sequence numbers of the batches written since the takes
//! were last committed, as runs ([`Runs`]: exactly those batches, never a span that could
//! hold another sink's events). It is saved at every flush, before the runner commits the
//! flushed batches' takes, and whenever a file finishes or is published (a roll between two
//! flushes syncs and records what was written before it). A crash leaves two kinds of
//! surplus, and the next start removes both:
//!
//! - bytes written after a file's recorded length, or files not recorded at all (their
//!   batches were not acknowledged, so the channel still holds them): cut off, deleted;
//! - batches recorded but whose takes were not committed (the channel gives them again):
//!   events whose sequence numbers fall in the recorded runs are skipped.
//!
//! A finished file's key is fixed when it finishes and recorded with it, and the file is not
//! written again: publishing it again after a crash writes the same bytes under the same key.

mod format;
mod parquet;
mod path;

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ferry_core::state::StateStore;
use ferry_core::{ComponentConfig, ConfigError, Event, Pipelining, SinkError};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

pub(crate) use format::default_suffix;
pub use format::{Compression, Format};
pub(crate) use path::{PathTemplate, TimeOptions};

/// How many batches the runner keeps in flight to a rolling sink between flushes: each flush
/// costs an `fdatasync` per file written and a state-store transaction, shared by its batches.
pub(crate) const PIPELINING: Pipelining = Pipelining {
    max_batches: 16,
    max_events: 20_000,
    max_bytes: usize::MAX,
    max_delay: Duration::from_millis(100),
};

/// What decides where events go and when a file rolls.
#[derive(Debug)]
pub(crate) struct RollSettings {
    /// Directory part of the key (escapes).
    pub(crate) path: PathTemplate,
    /// Start of the file name (escapes).
    pub(crate) file_prefix: PathTemplate,
    /// End of the file name.
    pub(crate) file_suffix: String,
    pub(crate) format: Format,
    pub(crate) compression: Compression,
    pub(crate) append_newline: bool,
    /// Bytes of events (before compression) after which a file rolls; 0: never.
    pub(crate) roll_size: u64,
    /// Events after which a file rolls; 0: never.
    pub(crate) roll_count: u64,
    /// Age after which a file rolls; zero: never.
    pub(crate) roll_interval: Duration,
    /// Idleness after which a file rolls; zero: never.
    pub(crate) idle_timeout: Duration,
    pub(crate) max_open_files: usize,
    pub(crate) time: TimeOptions,
}

/// The options every rolling sink has, as written in its configuration.
#[derive(Debug)]
pub(crate) struct RollOptions<'a> {
    /// `(option name, template)` of the directory part.
    pub(crate) path: (&'static str, &'a str),
    /// `(option name, template)` of the start of file names.
    pub(crate) file_prefix: (&'static str, &'a str),
    /// `(option name, suffix)`; `None`: the format's usual one.
    pub(crate) file_suffix: (&'static str, Option<&'a str>),
    pub(crate) format: Format,
    pub(crate) compression: Compression,
    pub(crate) append_newline: bool,
    pub(crate) roll_size: u64,
    pub(crate) roll_count: u64,
    pub(crate) roll_interval: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) max_open_files: usize,
    pub(crate) use_local_time: bool,
    pub(crate) round: Option<Duration>,
    pub(crate) time_zone: Option<&'a str>,
}

impl RollSettings {
    /// Checks the options, naming the one that is wrong.
    pub(crate) fn new(
        cfg: &ComponentConfig,
        options: RollOptions<'_>,
    ) -> Result<Self, ConfigError> {
        let template = |(key, text): (&str, &str)| {
            PathTemplate::parse(text).map_err(|e| cfg.error_at(key, format!("`{key}`: {e}")))
        };
        let path = template(options.path)?;
        let file_prefix = template(options.file_prefix)?;
        let (suffix_key, suffix) = options.file_suffix;
        let file_suffix = suffix
            .unwrap_or_else(|| default_suffix(options.format, options.compression))
            .to_owned();
        if file_suffix.contains('/') {
            return Err(cfg.error_at(suffix_key, format!("`{suffix_key}` must not contain `/`")));
        }
        let time_zone = TimeOptions::parse_time_zone(options.time_zone)
            .map_err(|e| cfg.error_at("time_zone", e))?;
        if options.round.is_some_and(|round| round.is_zero()) {
            return Err(cfg.error_at("round", "`round` must be above 0 (or left out)"));
        }
        if options.max_open_files == 0 {
            return Err(cfg.error_at("max_open_files", "`max_open_files` must be above 0"));
        }
        Ok(Self {
            path,
            file_prefix,
            file_suffix,
            format: options.format,
            compression: options.compression,
            append_newline: options.append_newline,
            roll_size: options.roll_size,
            roll_count: options.roll_count,
            roll_interval: options.roll_interval,
            idle_timeout: options.idle_timeout,
            max_open_files: options.max_open_files,
            time: TimeOptions {
                use_local_time: options.use_local_time,
                round: options.round,
                time_zone,
            },
        })
    }
}

/// The sink's progress record (JSON in the state store).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Progress {
    /// Id of the next staging file.
    pub(crate) next_id: u64,
    /// Staging files being written.
    pub(crate) open: Vec<OpenRecord>,
    /// Finished files waiting for upload, oldest first.
    pub(crate) finished: Vec<FinishedRecord>,
    /// Channel sequence numbers of the batches written since the sink's takes were last
    /// committed (an earlier version recorded the last batch's `[first, last]`; read as one
    /// run).
    #[serde(default)]
    pub(crate) delivered: Runs,
}

/// Channel sequence numbers as increasing, disjoint runs `[first, last]`: the batches a sink
/// wrote, exactly (not their span, which may hold events another sink of the channel took).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Runs(Vec<(u64, u64)>);

impl Runs {
    /// Whether `sequence` is in a run.
    pub(crate) fn contains(&self, sequence: u64) -> bool {
        let i = self.0.partition_point(|&(_, last)| last < sequence);
        self.0.get(i).is_some_and(|&(first, _)| first <= sequence)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Adds `sequences` (increasing, as a batch holds them), joining adjacent runs.
    pub(crate) fn add(&mut self, sequences: &[u64]) {
        let ordered = self
            .0
            .last()
            .is_none_or(|&(_, last)| sequences.first().is_none_or(|&first| first > last));
        for &seq in sequences {
            match self.0.last_mut() {
                Some((_, last)) if seq == *last + 1 => *last = seq,
                _ => self.0.push((seq, seq)),
            }
        }
        if !ordered {
            self.normalize();
        }
    }

    /// Sorted, overlapping and adjacent runs joined.
    fn normalize(&mut self) {
        self.0.sort_unstable();
        let mut joined: Vec<(u64, u64)> = Vec::with_capacity(self.0.len());
        for &(first, last) in &self.0 {
            match joined.last_mut() {
                Some((_, end)) if first <= end.saturating_add(1) => *end = (*end).max(last),
                _ => joined.push((first, last)),
            }
        }
        self.0 = joined;
    }
}

impl From<Option<(u64, u64)>> for Runs {
    fn from(range: Option<(u64, u64)>) -> Self {
        Self(range.into_iter().collect())
    }
}

impl<'de> Deserialize<'de> for Runs {
    /// `null`, the earlier `[first, last]`, or `[[first, last], ...]`.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            Range(u64, u64),
            Runs(Vec<(u64, u64)>),
        }
        let mut runs = match Option::<Form>::deserialize(deserializer)? {
            None => Runs::default(),
            Some(Form::Range(first, last)) => Runs(vec![(first, last)]),
            Some(Form::Runs(runs)) => Runs(runs),
        };
        runs.normalize();
        Ok(runs)
    }
}

/// A staging file being written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct OpenRecord {
    pub(crate) id: u64,
    /// Rendered `path` and `file_prefix`: where the object goes, before its own name.
    pub(crate) place: String,
    /// Committed length of the staging file.
    pub(crate) length: u64,
    /// Bytes of events (before compression) and their number.
    pub(crate) raw: u64,
    pub(crate) events: u64,
    /// Smallest and largest channel sequence numbers in the file, if the channel numbers.
    pub(crate) first: Option<u64>,
    pub(crate) last: Option<u64>,
    /// When the file got its first event, milliseconds since the epoch.
    pub(crate) opened_ms: u64,
}

/// A finished staging file: its object key is fixed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FinishedRecord {
    pub(crate) id: u64,
    pub(crate) key: String,
    /// Bytes of the staging file (what the object holds, before a Parquet conversion).
    pub(crate) length: u64,
    pub(crate) events: u64,
    /// The multipart upload started for it, to abort if the sink stops before completing it.
    #[serde(default)]
    pub(crate) upload_id: Option<String>,
}

/// The progress record shared by the writer and the uploader; every change is saved before
/// it is made in memory.
#[derive(Debug)]
pub(crate) struct SharedProgress {
    store: StateStore,
    name: String,
    current: Mutex<Progress>,
}

impl SharedProgress {
    /// Loads the sink's record (empty if it has none).
    pub(crate) fn load(store: StateStore, name: &str) -> Result<Self, SinkError> {
        let progress = match store
            .load_progress(name)
            .map_err(|e| SinkError::Delivery(format!("loading progress: {e}")))?
        {
            Some(raw) => serde_json::from_slice(&raw).map_err(|e| {
                SinkError::Delivery(format!(
                    "the progress record of sink `{name}` is damaged ({e}); remove it with `agent state` to start over"
                ))
            })?,
            None => Progress::default(),
        };
        Ok(Self {
            store,
            name: name.to_owned(),
            current: Mutex::new(progress),
        })
    }

    /// The id the next staging file takes.
    fn next_id(&self) -> u64 {
        self.lock().next_id
    }

    /// Whether finished files wait to be published.
    pub(crate) fn has_finished(&self) -> bool {
        !self.lock().finished.is_empty()
    }

    /// A copy of the record.
    pub(crate) fn get(&self) -> Progress {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Changes the record: saved first, then made current. Blocking (SQLite).
    pub(crate) fn update<T>(
        &self,
        change: impl FnOnce(&mut Progress) -> T,
    ) -> Result<T, SinkError> {
        let mut current = self.lock();
        let mut next = current.clone();
        let out = change(&mut next);
        let bytes = serde_json::to_vec(&next)
            .map_err(|e| SinkError::Delivery(format!("encoding progress: {e}")))?;
        self.store
            .save_progress(&self.name, &bytes)
            .map_err(|e| SinkError::Delivery(format!("recording progress: {e}")))?;
        *current = next;
        Ok(out)
    }
}

/// A staging file of the writer.
#[derive(Debug)]
struct Bucket {
    record: OpenRecord,
    file: Arc<File>,
    opened: Instant,
    touched: Instant,
}

/// One batch's events for one place, encoded.
#[derive(Debug)]
struct Chunk {
    place: String,
    bytes: Vec<u8>,
    /// Size before compression.
    plain: u64,
    events: u64,
    /// Smallest and largest sequence numbers, if the channel numbers events.
    range: Option<(u64, u64)>,
}

/// Writes each chunk at the end of its file. Blocking.
fn write_chunks_out(jobs: &[(Arc<File>, PathBuf, Vec<u8>)]) -> Result<(), SinkError> {
    for (file, path, bytes) in jobs {
        (&**file)
            .write_all(bytes)
            .map_err(|e| SinkError::io(format!("writing {}", path.display()), e))?;
    }
    Ok(())
}

/// Writes events into staging files and finishes them; finished files are handed on through
/// the progress record (see [`SharedProgress`]).
#[derive(Debug)]
pub(crate) struct Roller {
    settings: RollSettings,
    /// The sink's name: part of every object's name.
    sink: String,
    staging: Staging,
    progress: Arc<SharedProgress>,
    /// Open staging files by place.
    buckets: HashMap<String, Bucket>,
    /// A buffer for encoded chunks, reused between batches.
    spare: Vec<u8>,
    /// The sequence numbers the progress record holds as written: a batch the channel gives
    /// again (its take was not committed) skips them.
    delivered: Runs,
    /// The sequence numbers of the batches sent since the last [`Roller::flush`]: their takes
    /// are not committed yet, so every commit until then records them all.
    sent: Runs,
    /// What was written since the last commit: synced and recorded at the next, cut back if
    /// anything fails first.
    unsynced: Unsynced,
    /// Where every event goes, when the templates have no per-event escapes.
    constant_place: Option<String>,
}

/// The files written since the last commit.
#[derive(Debug, Default)]
struct Unsynced {
    /// Places written, each with its file's length at the last commit.
    written: Vec<(String, u64)>,
    /// Places whose files were created since (removed if anything fails).
    opened: Vec<String>,
}

/// Where the writer keeps files while it writes them, and how it names them:
/// `<directory>/<stem><id>.stage<tail>`, and for Parquet `<stem><id>.parquet<tail>` (the
/// conversion, made at roll) and `<stem><id>.parquet-new<tail>` (a conversion in progress).
/// Recovery touches only names of this shape.
#[derive(Debug, Clone)]
pub(crate) struct Staging {
    pub(crate) directory: PathBuf,
    stem: String,
    tail: &'static str,
    /// Write batches to disk (`fdatasync`) before recording them.
    sync: bool,
}

/// What a staging file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Staged {
    Stage,
    Parquet,
    ParquetNew,
}

const STAGED_KINDS: [(Staged, &str); 3] = [
    (Staged::Stage, ".stage"),
    (Staged::Parquet, ".parquet"),
    (Staged::ParquetNew, ".parquet-new"),
];

impl Staging {
    /// A directory of the sink's own (`s3`): `<id>.stage`.
    pub(crate) fn private(directory: PathBuf) -> Self {
        Self {
            directory,
            stem: String::new(),
            tail: "",
            sync: true,
        }
    }

    /// The directory the finished files go to (`file_roll`): `<sink>.<id>.stage.tmp`, ending
    /// in `.tmp` as files being written do, on the same file system, so a file finishes by a
    /// rename.
    pub(crate) fn beside(directory: PathBuf, sink: &str, sync: bool) -> Self {
        let sink: String = sink
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        Self {
            directory,
            stem: format!("{sink}."),
            tail: ".tmp",
            sync,
        }
    }

    fn path(&self, id: u64, kind: Staged) -> PathBuf {
        let extension = STAGED_KINDS
            .iter()
            .find(|(k, _)| *k == kind)
            .map_or("", |(_, e)| *e);
        self.directory
            .join(format!("{}{id:020}{extension}{}", self.stem, self.tail))
    }

    /// The staging file `id`.
    pub(crate) fn stage(&self, id: u64) -> PathBuf {
        self.path(id, Staged::Stage)
    }

    /// The staging file `id` made into Parquet.
    pub(crate) fn parquet(&self, id: u64) -> PathBuf {
        self.path(id, Staged::Parquet)
    }

    /// The id and kind of a name of this shape.
    fn parse(&self, name: &str) -> Option<(u64, Staged)> {
        let rest = name.strip_prefix(&self.stem)?.strip_suffix(self.tail)?;
        let (id, extension) = rest.split_at_checked(20)?;
        if !id.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let kind = STAGED_KINDS
            .iter()
            .find(|(_, e)| *e == extension)
            .map(|(k, _)| *k)?;
        Some((id.parse().ok()?, kind))
    }

    /// The file to publish for a finished staging file: the staging file itself, or its
    /// Parquet conversion (made once, atomically). Blocking.
    pub(crate) fn finished_file(
        &self,
        record: &FinishedRecord,
        format: Format,
        compression: Compression,
    ) -> Result<PathBuf, SinkError> {
        let stage = self.stage(record.id);
        if format != Format::Parquet {
            return Ok(stage);
        }
        let target = self.parquet(record.id);
        if target.exists() {
            return Ok(target);
        }
        let temporary = self.path(record.id, Staged::ParquetNew);
        parquet::staging_to_parquet(&stage, &temporary, compression)
            .map_err(|e| SinkError::io(format!("making {} into Parquet", stage.display()), e))?;
        std::fs::rename(&temporary, &target)
            .map_err(|e| SinkError::io(format!("renaming {}", temporary.display()), e))?;
        Ok(target)
    }

    /// Removes a finished file's staging files once published. Blocking.
    pub(crate) fn remove(&self, id: u64) {
        for path in [self.stage(id), self.parquet(id)] {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %e, "could not remove a published staging file")
                }
            }
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

impl Roller {
    /// Recovers after an earlier run (blocking): cuts open staging files back to their
    /// recorded lengths, deletes files no record names, and reopens the open ones.
    pub(crate) fn recover(
        settings: RollSettings,
        sink: &str,
        staging: Staging,
        progress: Arc<SharedProgress>,
    ) -> Result<Self, SinkError> {
        let directory = &staging.directory;
        std::fs::create_dir_all(directory).map_err(|e| {
            SinkError::io(
                format!("creating the staging directory {}", directory.display()),
                e,
            )
        })?;
        let record = progress.get();
        let listing = || format!("listing {}", directory.display());
        for entry in std::fs::read_dir(directory).map_err(|e| SinkError::io(listing(), e))? {
            let entry = entry.map_err(|e| SinkError::io(listing(), e))?;
            let name = entry.file_name();
            let Some((id, kind)) = name.to_str().and_then(|name| staging.parse(name)) else {
                continue;
            };
            let open = kind == Staged::Stage && record.open.iter().any(|o| o.id == id);
            let finished = matches!(kind, Staged::Stage | Staged::Parquet)
                && record.finished.iter().any(|f| f.id == id);
            if !(open || finished) {
                std::fs::remove_file(entry.path()).map_err(|e| {
                    SinkError::io(format!("removing {}", entry.path().display()), e)
                })?;
                tracing::info!(sink, file = %entry.path().display(), "removed a staging file holding only unacknowledged events");
            }
        }
        let now = Instant::now();
        let wall = now_ms();
        let mut buckets = HashMap::new();
        for open in &record.open {
            let path = staging.stage(open.id);
            let file = reopen(&path, open.length)?;
            let age = Duration::from_millis(wall.saturating_sub(open.opened_ms));
            buckets.insert(
                open.place.clone(),
                Bucket {
                    record: open.clone(),
                    file: Arc::new(file),
                    opened: now.checked_sub(age).unwrap_or(now),
                    touched: now,
                },
            );
        }
        for finished in &record.finished {
            if !staging.stage(finished.id).exists() {
                return Err(SinkError::Delivery(format!(
                    "staging file {} of `{}` is missing from {}: it was recorded as written",
                    finished.id,
                    finished.key,
                    staging.directory.display()
                )));
            }
        }
        let mut roller = Self {
            settings,
            sink: sink.to_owned(),
            staging,
            progress,
            buckets,
            spare: Vec::new(),
            delivered: record.delivered,
            sent: Runs::default(),
            unsynced: Unsynced::default(),
            constant_place: None,
        };
        if roller.settings.path.is_constant() && roller.settings.file_prefix.is_constant() {
            roller.constant_place = Some(roller.place(&Event::from_body(Vec::new()), 0)?);
        }
        Ok(roller)
    }

    /// Finishes the files due by age or idleness. Returns how many finished.
    pub(crate) async fn roll_due(&mut self) -> Result<usize, SinkError> {
        let result = self.finish_due().await;
        self.settle(result).await
    }

    /// Finishes every open file.
    pub(crate) async fn roll_all(&mut self) -> Result<usize, SinkError> {
        let all: Vec<String> = self.buckets.keys().cloned().collect();
        let result = self.finish(all).await;
        self.settle(result).await
    }

    /// Writes a batch into the staging files, not yet synced nor recorded: it is safe once
    /// [`Self::flush`] returns `Ok`. On `Err` every batch sent since the last flush is cut
    /// back off the files (the runner gives them all again). A roll on the way syncs and
    /// records what was sent before it.
    pub(crate) async fn send(
        &mut self,
        events: &[Event],
        sequences: Option<&[u64]>,
    ) -> Result<(), SinkError> {
        let result = self.send_unsettled(events, sequences).await;
        self.settle(result).await
    }

    /// Syncs the staging files written since the last flush and records them with the
    /// sequence numbers of every batch sent since (one `fdatasync` per file written and one
    /// state-store transaction for all of them). On `Err` they are cut back off the files.
    pub(crate) async fn flush(&mut self) -> Result<(), SinkError> {
        let result = self.commit(Vec::new()).await;
        self.settle(result).await?;
        // The runner commits these batches' takes now: none of them is given again.
        self.sent = Runs::default();
        Ok(())
    }

    /// After a step: on `Err`, whatever was written since the last commit is cut back, and
    /// the error names the sink.
    async fn settle<T>(&mut self, result: Result<T, SinkError>) -> Result<T, SinkError> {
        match result {
            Ok(value) => Ok(value),
            Err(error) => {
                self.undo().await;
                Err(self.named(error))
            }
        }
    }

    async fn finish_due(&mut self) -> Result<usize, SinkError> {
        let now = Instant::now();
        let RollSettings {
            roll_interval,
            idle_timeout,
            ..
        } = self.settings;
        let due: Vec<String> = self
            .buckets
            .iter()
            .filter(|(_, b)| {
                (!roll_interval.is_zero() && now.duration_since(b.opened) >= roll_interval)
                    || (!idle_timeout.is_zero() && now.duration_since(b.touched) >= idle_timeout)
            })
            .map(|(place, _)| place.clone())
            .collect();
        self.finish(due).await
    }

    async fn send_unsettled(
        &mut self,
        events: &[Event],
        sequences: Option<&[u64]>,
    ) -> Result<(), SinkError> {
        self.finish_due().await?;
        let skip = |i: usize| {
            sequences
                .and_then(|seqs| seqs.get(i))
                .is_some_and(|&s| self.delivered.contains(s))
        };
        let now = now_ms();
        // Where each fresh event goes, in batch order.
        let fresh = (0..events.len()).filter(|&i| !skip(i));
        let groups: Vec<(String, Vec<usize>)> = match &self.constant_place {
            // Every event goes to the same place: no path rendered or compared per event.
            Some(place) => {
                let fresh: Vec<usize> = fresh.collect();
                if fresh.is_empty() {
                    Vec::new()
                } else {
                    vec![(place.clone(), fresh)]
                }
            }
            None => {
                let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
                let mut last_place: Option<usize> = None;
                for i in fresh {
                    let place = self.place(&events[i], now as i64)?;
                    let group = match last_place {
                        Some(g) if groups[g].0 == place => g,
                        _ => match groups.iter().position(|(p, _)| *p == place) {
                            Some(g) => g,
                            None => {
                                groups.push((place, Vec::new()));
                                groups.len() - 1
                            }
                        },
                    };
                    groups[group].1.push(i);
                    last_place = Some(group);
                }
                groups
            }
        };
        if groups.is_empty() {
            self.sent.add(sequences.unwrap_or_default());
            return Ok(());
        }
        // Each group's chunk, encoded first: its size decides the rolls.
        let mut chunks = Vec::with_capacity(groups.len());
        for (place, indexes) in groups {
            let chosen: Vec<&Event> = indexes.iter().map(|&i| &events[i]).collect();
            // The first group takes the kept buffer; a batch is usually one group.
            let mut bytes = std::mem::take(&mut self.spare);
            bytes.clear();
            let plain = match format::encode_chunk(
                &mut bytes,
                &chosen,
                self.settings.format,
                self.settings.compression,
                self.settings.append_newline,
            ) {
                Ok(plain) => plain,
                Err(e) => {
                    return Err(SinkError::Delivery(format!("encoding a batch: {e}")));
                }
            };
            let range = sequences.and_then(|seqs| {
                let mut numbers = indexes.iter().filter_map(|&i| seqs.get(i).copied());
                let first = numbers.next()?;
                Some(numbers.fold((first, first), |(lo, hi), s| (lo.min(s), hi.max(s))))
            });
            chunks.push(Chunk {
                place,
                bytes,
                plain,
                events: indexes.len() as u64,
                range,
            });
        }
        let result = self.write_chunks(&mut chunks, sequences, now).await;
        if let Some(chunk) = chunks.into_iter().max_by_key(|c| c.bytes.capacity()) {
            self.spare = chunk.bytes;
        }
        result
    }

    /// Writes the batch's chunks, rolling files before and after as the limits say.
    async fn write_chunks(
        &mut self,
        chunks: &mut [Chunk],
        sequences: Option<&[u64]>,
        now_ms: u64,
    ) -> Result<(), SinkError> {
        // Roll what this batch would take past the limits, and make room for new places.
        let (size_limit, count_limit) = (self.settings.roll_size, self.settings.roll_count);
        let to_finish: Vec<String> = chunks
            .iter()
            .filter(|chunk| {
                self.buckets.get(&chunk.place).is_some_and(|bucket| {
                    let record = &bucket.record;
                    record.events > 0
                        && ((size_limit > 0 && record.raw + chunk.plain > size_limit)
                            || (count_limit > 0 && record.events + chunk.events > count_limit))
                })
            })
            .map(|chunk| chunk.place.clone())
            .collect();
        self.finish(to_finish).await?;
        let new_places = chunks
            .iter()
            .filter(|chunk| !self.buckets.contains_key(&chunk.place))
            .count();
        let max = self.settings.max_open_files.max(1);
        if self.buckets.len() + new_places > max {
            let mut by_age: Vec<(Instant, String)> = self
                .buckets
                .iter()
                .filter(|(place, _)| !chunks.iter().any(|c| c.place == **place))
                .map(|(place, b)| (b.touched, place.clone()))
                .collect();
            by_age.sort();
            let excess = (self.buckets.len() + new_places).saturating_sub(max);
            let oldest = by_age.into_iter().take(excess).map(|(_, p)| p).collect();
            self.finish(oldest).await?;
        }
        self.append_chunks(chunks, now_ms).await?;
        // Written: from here on every commit records the batch (never before: a crash would
        // then skip events that are not in any file).
        self.sent.add(sequences.unwrap_or_default());
        let full: Vec<String> = self
            .buckets
            .iter()
            .filter(|(_, b)| {
                (size_limit > 0 && b.record.raw >= size_limit)
                    || (count_limit > 0 && b.record.events >= count_limit)
            })
            .map(|(place, _)| place.clone())
            .collect();
        self.finish(full).await?;
        Ok(())
    }

    /// `error` saying which sink it is of.
    fn named(&self, error: SinkError) -> SinkError {
        let sink = &self.sink;
        match error {
            SinkError::Io { context, source } => SinkError::Io {
                context: format!("sink `{sink}`: {context}"),
                source,
            },
            SinkError::Delivery(message) if !message.starts_with("sink `") => {
                SinkError::Delivery(format!("sink `{sink}`: {message}"))
            }
            other => other,
        }
    }

    /// Renders where an event goes.
    fn place(&self, event: &Event, now: i64) -> Result<String, SinkError> {
        if let Some(place) = &self.constant_place {
            return Ok(place.clone());
        }
        let render = |template: &PathTemplate| {
            template
                .render(&event.headers, now, &self.settings.time)
                .map_err(|e| SinkError::permanent(format!("sink `{}`: {e}", self.sink)))
        };
        let mut place = render(&self.settings.path)?;
        if !place.is_empty() && !place.ends_with('/') {
            place.push('/');
        }
        place.push_str(&render(&self.settings.file_prefix)?);
        Ok(place)
    }

    /// Appends each chunk to its place's file (opening files for new places), not synced:
    /// the next commit syncs them.
    async fn append_chunks(&mut self, chunks: &mut [Chunk], now_ms: u64) -> Result<(), SinkError> {
        let mut next_id = self.progress.next_id();
        for bucket in self.buckets.values() {
            next_id = next_id.max(bucket.record.id + 1);
        }
        for chunk in chunks.iter() {
            if self.buckets.contains_key(&chunk.place) {
                continue;
            }
            let id = next_id;
            next_id += 1;
            let path = self.staging.stage(id);
            let file = blocking(move || {
                OpenOptions::new()
                    .create_new(true)
                    .append(true)
                    .open(&path)
                    .map_err(|e| SinkError::io(format!("creating {}", path.display()), e))
            })
            .await?;
            let now = Instant::now();
            self.buckets.insert(
                chunk.place.clone(),
                Bucket {
                    record: OpenRecord {
                        id,
                        place: chunk.place.clone(),
                        length: 0,
                        raw: 0,
                        events: 0,
                        first: None,
                        last: None,
                        opened_ms: now_ms,
                    },
                    file: Arc::new(file),
                    opened: now,
                    touched: now,
                },
            );
            self.unsynced.opened.push(chunk.place.clone());
        }
        // Every write of the batch in one blocking task.
        let mut jobs = Vec::with_capacity(chunks.len());
        for chunk in chunks.iter_mut() {
            let Some(bucket) = self.buckets.get(&chunk.place) else {
                continue;
            };
            if !self.unsynced.written.iter().any(|(p, _)| *p == chunk.place) {
                self.unsynced
                    .written
                    .push((chunk.place.clone(), bucket.record.length));
            }
            jobs.push((
                Arc::clone(&bucket.file),
                self.staging.stage(bucket.record.id),
                std::mem::take(&mut chunk.bytes),
            ));
        }
        let (jobs, result) = blocking(move || {
            let result = write_chunks_out(&jobs);
            Ok((jobs, result))
        })
        .await?;
        for (chunk, (_, _, bytes)) in chunks.iter_mut().zip(jobs) {
            chunk.bytes = bytes;
        }
        result?;
        let touched = Instant::now();
        for chunk in chunks.iter() {
            let Some(bucket) = self.buckets.get_mut(&chunk.place) else {
                continue;
            };
            let record = &mut bucket.record;
            record.length += chunk.bytes.len() as u64;
            record.raw += chunk.plain;
            record.events += chunk.events;
            if let Some((lo, hi)) = chunk.range {
                record.first = Some(record.first.map_or(lo, |f| f.min(lo)));
                record.last = Some(record.last.map_or(hi, |l| l.max(hi)));
            }
            bucket.touched = touched;
        }
        Ok(())
    }

    /// Takes everything written since the last commit back off: files cut back to their
    /// recorded lengths, files created since removed; the batches sent since are forgotten
    /// (the runner gives them again) except those a commit recorded.
    async fn undo(&mut self) {
        let Unsynced { written, opened } = std::mem::take(&mut self.unsynced);
        self.sent = self.delivered.clone();
        for (place, before) in written {
            if let Some(bucket) = self.buckets.get_mut(&place) {
                let file = Arc::clone(&bucket.file);
                // The record's counters are restored from the saved progress below.
                bucket.record.length = before;
                let _ = blocking(move || {
                    file.set_len(before)
                        .map_err(|e| SinkError::io("cutting a staging file back", e))
                })
                .await;
            }
        }
        let saved = self.progress.get();
        for place in opened {
            if let Some(bucket) = self.buckets.remove(&place) {
                let _ = std::fs::remove_file(self.staging.stage(bucket.record.id));
            }
        }
        for bucket in self.buckets.values_mut() {
            if let Some(record) = saved.open.iter().find(|o| o.id == bucket.record.id) {
                bucket.record = record.clone();
            }
        }
    }

    fn open_records(&self) -> Vec<OpenRecord> {
        let mut open: Vec<OpenRecord> = self.buckets.values().map(|b| b.record.clone()).collect();
        open.sort_by_key(|o| o.id);
        open
    }

    /// The object key of a finished file.
    fn key(&self, record: &OpenRecord) -> String {
        let unique = match (record.first, record.last) {
            (Some(first), Some(last)) => format!("{first:020}-{last:020}"),
            _ => format!("{:013}-{:010}", record.opened_ms, record.id),
        };
        let raw = format!(
            "{}{}.{unique}{}",
            record.place, self.sink, self.settings.file_suffix
        );
        // As the store will name it: empty segments dropped, characters S3 advises against
        // percent-encoded.
        object_store::path::Path::from(raw.as_str()).to_string()
    }

    /// Finishes the files of `places`: their keys are fixed and recorded; they are never
    /// written again. What was written before is synced and recorded with them.
    async fn finish(&mut self, places: Vec<String>) -> Result<usize, SinkError> {
        let any = places
            .iter()
            .any(|place| self.buckets.get(place).is_some_and(|b| b.record.events > 0));
        if !any {
            return Ok(0);
        }
        self.commit(places).await
    }

    /// Syncs the files written since the last commit and records, in one state-store
    /// transaction, their lengths, the files of `finishing` as finished, and the sequence
    /// numbers sent since the last flush. Returns how many files finished.
    async fn commit(&mut self, finishing: Vec<String>) -> Result<usize, SinkError> {
        let mut finished = Vec::new();
        for place in &finishing {
            if let Some(bucket) = self.buckets.get(place) {
                if bucket.record.events == 0 {
                    continue;
                }
                finished.push(FinishedRecord {
                    id: bucket.record.id,
                    key: self.key(&bucket.record),
                    length: bucket.record.length,
                    events: bucket.record.events,
                    upload_id: None,
                });
            }
        }
        if finished.is_empty() && self.unsynced.written.is_empty() {
            return Ok(0);
        }
        let ids: Vec<u64> = finished.iter().map(|f| f.id).collect();
        let count = finished.len();
        let files: Vec<(Arc<File>, PathBuf)> = if self.staging.sync {
            self.unsynced
                .written
                .iter()
                .filter_map(|(place, _)| self.buckets.get(place))
                .map(|b| (Arc::clone(&b.file), self.staging.stage(b.record.id)))
                .collect()
        } else {
            Vec::new()
        };
        let open: Vec<OpenRecord> = self
            .open_records()
            .into_iter()
            .filter(|o| !ids.contains(&o.id))
            .collect();
        let next_id = self
            .buckets
            .values()
            .map(|b| b.record.id + 1)
            .max()
            .unwrap_or_default();
        let delivered = (!self.sent.is_empty()).then(|| self.sent.clone());
        let progress = Arc::clone(&self.progress);
        let recorded = delivered.clone();
        blocking(move || {
            for (file, path) in &files {
                file.sync_data()
                    .map_err(|e| SinkError::io(format!("syncing {}", path.display()), e))?;
            }
            progress.update(|p| {
                p.open = open;
                p.finished.extend(finished);
                p.next_id = p.next_id.max(next_id);
                if let Some(delivered) = recorded {
                    p.delivered = delivered;
                }
            })
        })
        .await?;
        if let Some(delivered) = delivered {
            self.delivered = delivered;
        }
        self.unsynced = Unsynced::default();
        self.buckets.retain(|_, b| !ids.contains(&b.record.id));
        Ok(count)
    }
}

/// Opens a staging file for appending, cut back to `length` bytes.
fn reopen(path: &Path, length: u64) -> Result<File, SinkError> {
    let context = || format!("reopening {}", path.display());
    let file = OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(|e| SinkError::io(context(), e))?;
    let actual = file
        .metadata()
        .map_err(|e| SinkError::io(context(), e))?
        .len();
    if actual < length {
        return Err(SinkError::Delivery(format!(
            "{} holds {actual} bytes, fewer than the {length} recorded as written",
            path.display()
        )));
    }
    if actual > length {
        file.set_len(length)
            .and_then(|()| file.sync_all())
            .map_err(|e| SinkError::io(context(), e))?;
        tracing::info!(file = %path.display(), removed = actual - length, "cut unacknowledged bytes off the end of a staging file");
    }
    Ok(file)
}

/// Runs blocking file and state-store work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, SinkError> + Send + 'static,
) -> Result<T, SinkError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| SinkError::Delivery(format!("blocking task failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_read_every_recorded_form_and_hold_exactly_their_numbers() {
        let read = |json: &str| serde_json::from_str::<Runs>(json).unwrap();
        assert_eq!(read("null"), Runs::default());
        assert_eq!(
            read("[3,7]"),
            Runs(vec![(3, 7)]),
            "the earlier `[first, last]`"
        );
        assert_eq!(read("[[8,9],[1,2],[3,4]]"), Runs(vec![(1, 4), (8, 9)]));
        let runs = read("[[1,4],[8,9]]");
        assert_eq!(serde_json::to_string(&runs).unwrap(), "[[1,4],[8,9]]");
        for (seq, held) in [
            (0, false),
            (1, true),
            (4, true),
            (5, false),
            (7, false),
            (9, true),
            (10, false),
        ] {
            assert_eq!(runs.contains(seq), held, "{seq}");
        }
        let old: Progress =
            serde_json::from_str(r#"{"next_id":2,"open":[],"finished":[],"delivered":[5,6]}"#)
                .unwrap();
        assert_eq!(old.delivered, Runs(vec![(5, 6)]));
    }

    #[test]
    fn runs_join_batches_in_any_order() {
        let mut runs = Runs::default();
        runs.add(&[1, 2, 3]);
        runs.add(&[4, 5]);
        runs.add(&[9, 10]);
        assert_eq!(runs, Runs(vec![(1, 5), (9, 10)]));
        runs.add(&[6, 7, 8]); // events given back by another sink, taken after
        assert_eq!(runs, Runs(vec![(1, 10)]));
        runs.add(&[]);
        assert_eq!(runs, Runs(vec![(1, 10)]));
    }
}
