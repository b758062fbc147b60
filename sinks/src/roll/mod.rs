//! The rolling writer of the `s3` sink: events go into local staging files, one per path
//! (Flume's escapes, rendered per event), and a staging file becomes an object when it rolls
//! (by size, count, age or idleness).
//!
//! # Staging files
//!
//! `<staging>/<id>.stage` holds the events of one future object, in the object's format
//! (for Parquet, JSON lines that become the Parquet file at roll: `<id>.parquet`). Each batch
//! is appended as a self-contained chunk (a gzip member, a zstd frame), written to disk
//! (`fdatasync`), and only then recorded.
//!
//! # Progress
//!
//! One record in the agent's state store, under the sink's name ([`Progress`]), says which
//! staging files are open and their committed lengths, which are finished and under which
//! key they go up, and the channel sequence numbers of the last batch written. It is saved
//! after every batch, before the runner commits the batch's take, and whenever a file
//! finishes or an object is uploaded. A crash leaves two kinds of surplus, and the next start
//! removes both, as `file_roll` does:
//!
//! - bytes written after a file's recorded length, or files not recorded at all (their batch
//!   was not acknowledged, so the channel still holds it): cut off, deleted;
//! - a batch recorded but whose take was not committed (the channel gives it again): events
//!   whose sequence numbers fall in the recorded range are skipped.
//!
//! A finished file's key is fixed when it finishes and recorded with it, and the file is not
//! written again: an upload repeated after a crash writes the same bytes under the same key.

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
use ferry_core::{Event, SinkError};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

pub(crate) use format::default_suffix;
pub use format::{Compression, Format};
pub(crate) use path::{PathTemplate, TimeOptions};

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

/// The sink's progress record (JSON in the state store).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Progress {
    /// Id of the next staging file.
    pub(crate) next_id: u64,
    /// Staging files being written.
    pub(crate) open: Vec<OpenRecord>,
    /// Finished files waiting for upload, oldest first.
    pub(crate) finished: Vec<FinishedRecord>,
    /// Channel sequence numbers of the last batch written.
    pub(crate) delivered: Option<(u64, u64)>,
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

/// Writes events into staging files and finishes them; finished files are handed on through
/// the progress record (see [`SharedProgress`]).
#[derive(Debug)]
pub(crate) struct Roller {
    settings: RollSettings,
    /// The sink's name: part of every object's name.
    sink: String,
    staging: PathBuf,
    progress: Arc<SharedProgress>,
    /// Open staging files by place.
    buckets: HashMap<String, Bucket>,
    /// Encoded chunk, reused between batches.
    buffer: Vec<u8>,
    /// Sequence numbers of the last batch recorded.
    delivered: Option<(u64, u64)>,
    /// Where every event goes, when the templates have no per-event escapes.
    constant_place: Option<String>,
}

/// The path of staging file `id`.
pub(crate) fn stage_path(staging: &Path, id: u64) -> PathBuf {
    staging.join(format!("{id:020}.stage"))
}

/// The path of staging file `id` made into Parquet.
pub(crate) fn parquet_path(staging: &Path, id: u64) -> PathBuf {
    staging.join(format!("{id:020}.parquet"))
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
        staging: PathBuf,
        progress: Arc<SharedProgress>,
    ) -> Result<Self, SinkError> {
        std::fs::create_dir_all(&staging).map_err(|e| {
            SinkError::io(
                format!("creating the staging directory {}", staging.display()),
                e,
            )
        })?;
        let record = progress.get();
        let listing = || format!("listing {}", staging.display());
        for entry in std::fs::read_dir(&staging).map_err(|e| SinkError::io(listing(), e))? {
            let entry = entry.map_err(|e| SinkError::io(listing(), e))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let id = name
                .split_once('.')
                .and_then(|(id, _)| id.parse::<u64>().ok());
            let known = id.is_some_and(|id| {
                let open = record.open.iter().any(|o| o.id == id) && name.ends_with(".stage");
                let finished = record.finished.iter().any(|f| f.id == id)
                    && (name.ends_with(".stage") || name.ends_with(".parquet"));
                open || finished
            });
            if !known {
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
            let path = stage_path(&staging, open.id);
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
            if !stage_path(&staging, finished.id).exists() {
                return Err(SinkError::Delivery(format!(
                    "staging file {} of object `{}` is missing from {}: it was recorded as written",
                    finished.id,
                    finished.key,
                    staging.display()
                )));
            }
        }
        let mut roller = Self {
            settings,
            sink: sink.to_owned(),
            staging,
            progress,
            buckets,
            buffer: Vec::new(),
            delivered: record.delivered,
            constant_place: None,
        };
        if roller.settings.path.is_constant() && roller.settings.file_prefix.is_constant() {
            roller.constant_place = Some(roller.place(&Event::from_body(Vec::new()), 0)?);
        }
        Ok(roller)
    }

    /// Finishes the files due by age or idleness. Returns how many finished.
    pub(crate) async fn roll_due(&mut self) -> Result<usize, SinkError> {
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

    /// Finishes every open file.
    pub(crate) async fn roll_all(&mut self) -> Result<usize, SinkError> {
        let all: Vec<String> = self.buckets.keys().cloned().collect();
        self.finish(all).await
    }

    /// Writes a batch: returns once it is on disk and recorded.
    pub(crate) async fn write(
        &mut self,
        events: &[Event],
        sequences: Option<&[u64]>,
    ) -> Result<(), SinkError> {
        self.roll_due().await?;
        let skip = |i: usize| match (sequences, self.delivered) {
            (Some(seqs), Some((first, last))) => {
                seqs.get(i).is_some_and(|s| (first..=last).contains(s))
            }
            _ => false,
        };
        // Where each fresh event goes, in batch order.
        let reads_time = self.settings.path.uses_time() || self.settings.file_prefix.uses_time();
        let now = if reads_time { now_ms() as i64 } else { 0 };
        let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
        let mut last_place: Option<usize> = None;
        for (i, event) in events.iter().enumerate() {
            if skip(i) {
                continue;
            }
            let place = self.place(event, now)?;
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
        let delivered = sequences.and_then(|seqs| Some((*seqs.first()?, *seqs.last()?)));
        if groups.is_empty() {
            return Ok(());
        }
        // Roll what this batch would take past its size, and make room for new places.
        let limit = self.settings.roll_size;
        let mut to_finish = Vec::new();
        for (place, indexes) in &groups {
            if let Some(bucket) = self.buckets.get(place) {
                let raw: u64 = indexes.iter().map(|&i| events[i].byte_size() as u64).sum();
                let count = indexes.len() as u64;
                let over_size = limit > 0 && bucket.record.raw + raw > limit;
                let over_count = self.settings.roll_count > 0
                    && bucket.record.events + count > self.settings.roll_count;
                if bucket.record.events > 0 && (over_size || over_count) {
                    to_finish.push(place.clone());
                }
            }
        }
        self.finish(to_finish).await?;
        let new_places = groups
            .iter()
            .filter(|(place, _)| !self.buckets.contains_key(place))
            .count();
        let max = self.settings.max_open_files.max(1);
        if self.buckets.len() + new_places > max {
            let mut by_age: Vec<(Instant, String)> = self
                .buckets
                .iter()
                .filter(|(place, _)| !groups.iter().any(|(p, _)| p == *place))
                .map(|(place, b)| (b.touched, place.clone()))
                .collect();
            by_age.sort();
            let excess = (self.buckets.len() + new_places).saturating_sub(max);
            let oldest = by_age.into_iter().take(excess).map(|(_, p)| p).collect();
            self.finish(oldest).await?;
        }

        // Append each group's chunk to its file.
        let mut written: Vec<(String, u64)> = Vec::new(); // place, length before
        let mut opened: Vec<String> = Vec::new();
        let result = self
            .append_groups(
                events,
                sequences,
                &groups,
                now as u64,
                &mut written,
                &mut opened,
            )
            .await;
        let result = match result {
            Ok(()) => {
                // Record lengths and the batch, then it is acknowledged.
                let open = self.open_records();
                let progress = Arc::clone(&self.progress);
                blocking(move || {
                    progress.update(|p| {
                        p.open = open;
                        p.delivered = delivered;
                        if let Some(max_id) = p.open.iter().map(|o| o.id).max() {
                            p.next_id = p.next_id.max(max_id + 1);
                        }
                    })
                })
                .await
            }
            Err(error) => Err(error),
        };
        if let Err(error) = result {
            self.undo(&written, &opened).await;
            return Err(error);
        }
        self.delivered = delivered;
        let full: Vec<String> = self
            .buckets
            .iter()
            .filter(|(_, b)| {
                (limit > 0 && b.record.raw >= limit)
                    || (self.settings.roll_count > 0 && b.record.events >= self.settings.roll_count)
            })
            .map(|(place, _)| place.clone())
            .collect();
        self.finish(full).await?;
        Ok(())
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

    async fn append_groups(
        &mut self,
        events: &[Event],
        sequences: Option<&[u64]>,
        groups: &[(String, Vec<usize>)],
        now_ms: u64,
        written: &mut Vec<(String, u64)>,
        opened: &mut Vec<String>,
    ) -> Result<(), SinkError> {
        let mut next_id = self.progress.get().next_id;
        for bucket in self.buckets.values() {
            next_id = next_id.max(bucket.record.id + 1);
        }
        let mut files: Vec<Arc<File>> = Vec::new();
        for (place, indexes) in groups {
            if !self.buckets.contains_key(place) {
                let id = next_id;
                next_id += 1;
                let path = stage_path(&self.staging, id);
                let file = blocking({
                    let path = path.clone();
                    move || {
                        OpenOptions::new()
                            .create_new(true)
                            .append(true)
                            .open(&path)
                            .map_err(|e| SinkError::io(format!("creating {}", path.display()), e))
                    }
                })
                .await?;
                let now = Instant::now();
                self.buckets.insert(
                    place.clone(),
                    Bucket {
                        record: OpenRecord {
                            id,
                            place: place.clone(),
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
                opened.push(place.clone());
            }
            let chosen: Vec<&Event> = indexes.iter().map(|&i| &events[i]).collect();
            self.buffer.clear();
            format::encode_chunk(
                &mut self.buffer,
                &chosen,
                self.settings.format,
                self.settings.compression,
                self.settings.append_newline,
            )
            .map_err(|e| SinkError::Delivery(format!("encoding a batch: {e}")))?;
            let Some(bucket) = self.buckets.get_mut(place) else {
                continue;
            };
            let before = bucket.record.length;
            written.push((place.clone(), before));
            let file = Arc::clone(&bucket.file);
            let path = stage_path(&self.staging, bucket.record.id);
            let buffer = std::mem::take(&mut self.buffer);
            let (buffer, result) = blocking(move || {
                let result = (&*file)
                    .write_all(&buffer)
                    .map_err(|e| SinkError::io(format!("writing {}", path.display()), e));
                Ok((buffer, result))
            })
            .await?;
            bucket.record.length += buffer.len() as u64;
            self.buffer = buffer;
            result?;
            let raw: u64 = chosen.iter().map(|e| e.byte_size() as u64).sum();
            bucket.record.raw += raw;
            bucket.record.events += chosen.len() as u64;
            if let Some(seqs) = sequences {
                for &i in indexes {
                    if let Some(&s) = seqs.get(i) {
                        bucket.record.first = Some(bucket.record.first.map_or(s, |f| f.min(s)));
                        bucket.record.last = Some(bucket.record.last.map_or(s, |l| l.max(s)));
                    }
                }
            }
            bucket.touched = Instant::now();
            files.push(Arc::clone(&bucket.file));
        }
        blocking(move || {
            for file in files {
                file.sync_data()
                    .map_err(|e| SinkError::io("syncing a staging file", e))?;
            }
            Ok(())
        })
        .await
    }

    /// Takes a failed batch back off: files cut back, files opened for it removed.
    async fn undo(&mut self, written: &[(String, u64)], opened: &[String]) {
        for (place, before) in written {
            if let Some(bucket) = self.buckets.get_mut(place) {
                let file = Arc::clone(&bucket.file);
                let before = *before;
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
            if let Some(bucket) = self.buckets.remove(place) {
                let path = stage_path(&self.staging, bucket.record.id);
                let _ = std::fs::remove_file(path);
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
    /// written again.
    async fn finish(&mut self, places: Vec<String>) -> Result<usize, SinkError> {
        let mut finished = Vec::new();
        for place in &places {
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
        if finished.is_empty() {
            return Ok(0);
        }
        let ids: Vec<u64> = finished.iter().map(|f| f.id).collect();
        let count = finished.len();
        let progress = Arc::clone(&self.progress);
        let remaining: Vec<OpenRecord> = self
            .open_records()
            .into_iter()
            .filter(|o| !ids.contains(&o.id))
            .collect();
        blocking(move || {
            progress.update(|p| {
                p.open = remaining;
                p.finished.extend(finished);
            })
        })
        .await?;
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

/// Makes the file to upload for a finished staging file: the staging file itself, or its
/// Parquet conversion (made once, atomically). Blocking.
pub(crate) fn upload_file(
    staging: &Path,
    record: &FinishedRecord,
    format: Format,
    compression: Compression,
) -> Result<PathBuf, SinkError> {
    let stage = stage_path(staging, record.id);
    if format != Format::Parquet {
        return Ok(stage);
    }
    let target = parquet_path(staging, record.id);
    if target.exists() {
        return Ok(target);
    }
    let temporary = staging.join(format!("{:020}.parquet.tmp", record.id));
    parquet::staging_to_parquet(&stage, &temporary, compression)
        .map_err(|e| SinkError::io(format!("making {} into Parquet", stage.display()), e))?;
    std::fs::rename(&temporary, &target)
        .map_err(|e| SinkError::io(format!("renaming {}", temporary.display()), e))?;
    Ok(target)
}

/// Removes a finished file's staging files once uploaded. Blocking.
pub(crate) fn remove_staged(staging: &Path, id: u64) {
    for path in [stage_path(staging, id), parquet_path(staging, id)] {
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "could not remove an uploaded staging file")
            }
        }
    }
}

/// Runs blocking file and state-store work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, SinkError> + Send + 'static,
) -> Result<T, SinkError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| SinkError::Delivery(format!("blocking task failed: {e}")))?
}
