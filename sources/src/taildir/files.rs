//! The set of tailed files: finding them (globs), telling them apart (device, inode,
//! fingerprint), following rotation and truncation, and releasing them.
//!
//! Everything here does blocking file I/O; the source runs it on a blocking thread, one round
//! (scan, then read up to a batch) at a time.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io;
use std::os::unix::fs::{DirEntryExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ferry_core::{Event, Headers};

use super::checkpoint::{FlumePosition, Position};
use super::reader::{Batch, EventOptions, ReadEnd, TailedFile};
use crate::file_id::{FileKey, Fingerprint, read_range};

/// One file group: a glob and the headers of its events.
#[derive(Debug, Clone)]
pub(crate) struct Group {
    pub(crate) name: String,
    pub(crate) pattern: String,
}

/// What a round produced.
pub(crate) struct Round {
    pub(crate) events: Vec<Event>,
    /// The batch filled up: more is probably waiting.
    pub(crate) more: bool,
}

/// Every file the source knows, and where reading of each resumes.
pub(crate) struct TailedFiles {
    source: String,
    groups: Vec<Group>,
    group_headers: Vec<Headers>,
    options: EventOptions,
    idle_timeout: Duration,
    skip_to_end: bool,
    files: BTreeMap<FileKey, TailedFile>,
    /// Positions from the checkpoint of files not found yet (only until the first scan).
    restored: HashMap<FileKey, Position>,
    /// Positions imported from a Flume position file, by inode (only until the first scan).
    flume: HashMap<u64, FlumePosition>,
    scanned: bool,
    /// Where the next round starts reading, so that a busy file does not starve the others.
    cursor: Option<FileKey>,
}

impl TailedFiles {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        source: String,
        groups: Vec<Group>,
        group_headers: Vec<Headers>,
        options: EventOptions,
        idle_timeout: Duration,
        skip_to_end: bool,
        restored: Vec<Position>,
        flume: Vec<FlumePosition>,
    ) -> Self {
        Self {
            source,
            groups,
            group_headers,
            options,
            idle_timeout,
            skip_to_end,
            files: BTreeMap::new(),
            restored: restored.into_iter().map(|p| (p.key, p)).collect(),
            flume: flume.into_iter().map(|p| (p.inode, p)).collect(),
            scanned: false,
            cursor: None,
        }
    }

    /// Per known file, the bytes written to it that are not yet committed to the channel
    /// (its size minus its committed offset): how far behind the source is.
    pub(crate) fn bytes_behind(&self) -> Vec<(String, u64)> {
        self.files
            .values()
            .map(|f| {
                let size = std::fs::metadata(f.path()).map_or(f.committed, |m| m.len());
                (
                    f.path().display().to_string(),
                    size.saturating_sub(f.committed),
                )
            })
            .collect()
    }

    /// The positions to save with the events of the latest round: every known file.
    pub(crate) fn positions(&self) -> Vec<Position> {
        self.files
            .values()
            .map(|f| Position {
                key: f.key,
                fingerprint: f.fingerprint,
                offset: f.committed,
                path: f.path().to_owned(),
            })
            .collect()
    }

    /// Expands the globs; starts tailing new files, notices renamed, truncated, replaced and
    /// vanished ones.
    pub(crate) fn scan(&mut self, now: Instant) {
        let mut seen: BTreeMap<FileKey, (PathBuf, usize, std::fs::Metadata)> = BTreeMap::new();
        for (index, group) in self.groups.iter().enumerate() {
            let paths = match glob::glob(&group.pattern) {
                Ok(paths) => paths,
                Err(error) => {
                    tracing::warn!(source = self.source, group = group.name, %error, "bad glob");
                    continue;
                }
            };
            for path in paths {
                let path = match path {
                    Ok(path) => path,
                    Err(error) => {
                        tracing::debug!(source = self.source, %error, "glob skipped a path");
                        continue;
                    }
                };
                // Follows symbolic links: the target is tailed.
                let Ok(metadata) = std::fs::metadata(&path) else {
                    continue;
                };
                if metadata.is_file() {
                    seen.entry(FileKey::of(&metadata))
                        .or_insert((path, index, metadata));
                }
            }
        }
        for file in self.files.values_mut() {
            file.in_view = false;
        }
        for (key, (path, group, metadata)) in seen {
            match self.files.get_mut(&key) {
                Some(file) => {
                    file.in_view = true;
                    if file.path() != path {
                        tracing::info!(source = self.source, from = %file.path().display(), to = %path.display(), "file renamed");
                        file.set_path(path);
                    }
                    if let Err(error) = self.check_known(key, metadata.len(), now) {
                        self.drop_file(key, "checking", &error);
                    }
                }
                None => {
                    if let Err(error) = self.start(key, path.clone(), group, now) {
                        tracing::warn!(source = self.source, path = %path.display(), %error, "cannot tail file");
                    }
                }
            }
        }
        if !self.scanned {
            self.scanned = true;
            self.flume.clear();
            for (_, position) in std::mem::take(&mut self.restored) {
                self.find_rotated(position, None, now);
            }
        }
        // Closed files that no glob matches any more: renamed in their directory while closed
        // (read them to the end), or gone.
        let lost: Vec<FileKey> = self
            .files
            .values()
            .filter(|f| !f.in_view && !f.is_open())
            .map(|f| f.key)
            .collect();
        for key in lost {
            if let Some(file) = self.files.remove(&key) {
                self.find_rotated(
                    Position {
                        key,
                        fingerprint: file.fingerprint,
                        offset: file.committed,
                        path: file.path().to_owned(),
                    },
                    Some(file.group),
                    now,
                );
            }
        }
    }

    /// Starts tailing a file found by a glob, at its saved position if it has one.
    fn start(&mut self, key: FileKey, path: PathBuf, group: usize, now: Instant) -> io::Result<()> {
        let handle = File::open(&path)?;
        let metadata = handle.metadata()?;
        if FileKey::of(&metadata) != key {
            // Replaced between the glob and the open: the next scan sees the new file.
            return Ok(());
        }
        let size = metadata.len();
        let restored = self.restored.remove(&key);
        let offset = match restored {
            Some(position) => match position.fingerprint.verify(&handle, size)? {
                Some(_) if position.offset <= size => position.offset,
                Some(_) => {
                    tracing::info!(source = self.source, path = %path.display(), "file is shorter than its saved position (truncated): reading it from the start");
                    0
                }
                None => {
                    tracing::info!(source = self.source, path = %path.display(), "file has the inode of a saved position but other content: reading it as a new file");
                    0
                }
            },
            None => match self.flume.remove(&key.inode) {
                Some(flume) if flume.pos <= size => {
                    tracing::info!(source = self.source, path = %path.display(), pos = flume.pos, "starting from the Flume position file");
                    flume.pos
                }
                Some(_) => 0,
                None if !self.scanned && self.skip_to_end => end_of_last_line(&handle, size)?,
                None => 0,
            },
        };
        let fingerprint = Fingerprint::of(&handle, size)?;
        tracing::debug!(source = self.source, path = %path.display(), offset, "tailing file");
        let file = TailedFile::open(key, fingerprint, path, group, handle, offset, now)?;
        self.files.insert(key, file);
        Ok(())
    }

    /// Looks for a file of a saved position that no glob matches, in the directory where it
    /// was last seen (a rotated log renamed out of the globs): if it is there, it is read to
    /// its end and then released. Otherwise its position is forgotten.
    /// `group` is the file's group, if known; otherwise the group whose glob matches where the
    /// file was last seen.
    fn find_rotated(&mut self, position: Position, group: Option<usize>, now: Instant) {
        let found = position
            .path
            .parent()
            .and_then(|dir| find_in_dir(dir, position.key));
        let Some(path) = found else {
            tracing::debug!(source = self.source, path = %position.path.display(), "file is gone; forgetting its position");
            return;
        };
        let opened = File::open(&path).and_then(|handle| {
            let metadata = handle.metadata()?;
            let size = metadata.len();
            let same = FileKey::of(&metadata) == position.key
                && position.fingerprint.verify(&handle, size)?.is_some()
                && position.offset <= size;
            Ok(same.then_some(handle))
        });
        match opened {
            Ok(Some(handle)) => {
                tracing::info!(source = self.source, path = %path.display(), "reading a rotated file to its end");
                let group = group.unwrap_or_else(|| {
                    self.groups
                        .iter()
                        .position(|g| {
                            glob::Pattern::new(&g.pattern)
                                .is_ok_and(|p| p.matches_path(&position.path))
                        })
                        .unwrap_or(0)
                });
                match TailedFile::open(
                    position.key,
                    position.fingerprint,
                    path,
                    group,
                    handle,
                    position.offset,
                    now,
                ) {
                    Ok(mut file) => {
                        file.in_view = false;
                        self.files.insert(position.key, file);
                    }
                    Err(error) => {
                        tracing::warn!(source = self.source, path = %position.path.display(), %error, "cannot read rotated file")
                    }
                }
            }
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(source = self.source, path = %path.display(), %error, "cannot read rotated file")
            }
        }
    }

    /// A known file found by a glob, whose size is now `size`: reopens it if it changed while
    /// closed (the next read checks what changed).
    fn check_known(&mut self, key: FileKey, size: u64, now: Instant) -> io::Result<()> {
        let Some(file) = self.files.get_mut(&key) else {
            return Ok(());
        };
        if file.is_open() || size == file.read_position() {
            return Ok(());
        }
        let handle = File::open(file.path())?;
        if FileKey::of(&handle.metadata()?) == key {
            file.reopen(handle, now)?;
        }
        Ok(())
    }

    fn drop_file(&mut self, key: FileKey, doing: &str, error: &io::Error) {
        if let Some(file) = self.files.remove(&key) {
            tracing::warn!(source = self.source, path = %file.path().display(), %error, "{doing} file; it is read again from its saved position at the next scan");
            // Found again by the next scan: starts from the position it had.
            self.restored.insert(
                key,
                Position {
                    key,
                    fingerprint: file.fingerprint,
                    offset: file.committed,
                    path: file.path().to_owned(),
                },
            );
        }
    }

    /// Reads the files, rotated-away ones first, then starting at the one the last round
    /// stopped at, until `capacity`
    /// events are ready or every file is at its end; flushes what timed out; closes idle
    /// files and releases those deleted or rotated away and read to the end.
    pub(crate) fn read(&mut self, capacity: usize, now: Instant) -> Round {
        // Files rotated away or deleted first, least recently modified first: a rotated log
        // is read to its end before the file that took its name.
        let mut draining: Vec<(Option<std::time::SystemTime>, FileKey)> = self
            .files
            .values()
            .filter(|f| !f.in_view)
            .map(|f| {
                (
                    f.handle().and_then(|h| h.metadata().ok()?.modified().ok()),
                    f.key,
                )
            })
            .collect();
        draining.sort();
        let mut active: Vec<FileKey> = self
            .files
            .values()
            .filter(|f| f.in_view)
            .map(|f| f.key)
            .collect();
        if let Some(cursor) = self.cursor {
            let at = active.partition_point(|k| *k < cursor);
            active.rotate_left(at);
        }
        let keys = draining.into_iter().map(|(_, key)| key).chain(active);
        let mut batch = Batch::new(capacity, &self.options, &self.group_headers);
        let mut more = false;
        let mut release = Vec::new();
        let mut failed = Vec::new();
        for key in keys {
            if batch.is_full() {
                more = true;
                self.cursor = Some(key);
                break;
            }
            let Some(file) = self.files.get_mut(&key) else {
                continue;
            };
            if let Err(error) = check_size(&self.source, file) {
                failed.push((key, error));
                continue;
            }
            match file.read(&mut batch, now) {
                Ok(ReadEnd::BatchFull) => {
                    more = true;
                    self.cursor = Some(key);
                    break;
                }
                Ok(ReadEnd::EndOfFile) => {}
                Err(error) => {
                    failed.push((key, error));
                    continue;
                }
            }
            let idle = now.saturating_duration_since(file.last_growth) >= self.idle_timeout;
            let deleted = file
                .handle()
                .and_then(|h| h.metadata().ok())
                .is_some_and(|m| m.nlink() == 0);
            let finished = !file.in_view && (deleted || idle || !file.is_open());
            file.flush_expired(&mut batch, now, finished);
            if finished && file.is_drained() {
                release.push(key);
            } else if idle && file.is_open() && file.is_drained() {
                tracing::debug!(source = self.source, path = %file.path().display(), "closing idle file");
                file.close();
            }
        }
        if !more {
            self.cursor = None;
        }
        let events = batch.events;
        for key in release {
            if let Some(file) = self.files.remove(&key) {
                tracing::info!(source = self.source, path = %file.path().display(), "file read to its end and rotated away or deleted: released");
            }
        }
        for (key, error) in failed {
            self.drop_file(key, "reading", &error);
        }
        Round { events, more }
    }

    /// The next moment a round has something to do without new data: a flush or an idle
    /// file to close or release.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.files
            .values()
            .flat_map(|f| {
                // An idle file is closed (or released) only once nothing is held back in
                // it; a file out of view has what it holds flushed then.
                let closable = (f.is_open() && f.is_drained()) || !f.in_view;
                let idle = closable.then(|| f.last_growth + self.idle_timeout);
                f.next_flush(&self.options).into_iter().chain(idle)
            })
            .min()
    }
}

/// Before reading a file whose size changed: if it is shorter than what was read or its
/// first bytes changed (copytruncate, or content replaced in place), it is read again from the
/// start. An unchanged file costs one `fstat`.
fn check_size(source: &str, file: &mut TailedFile) -> io::Result<()> {
    let Some(handle) = file.handle() else {
        return Ok(());
    };
    let size = handle.metadata()?.len();
    if size == file.read_position() {
        return Ok(());
    }
    match file.fingerprint.verify(handle, size)? {
        Some(grown) if size > file.read_position() => file.fingerprint = grown,
        _ => {
            let fingerprint = Fingerprint::of(handle, size)?;
            tracing::info!(source, path = %file.path().display(), size, "file was truncated or rewritten: reading it again from the start");
            file.restart_at_zero(fingerprint)?;
        }
    }
    Ok(())
}

/// Where `skip_to_end` starts: just after the last `\n` in the last 64 KiB of the file (so a
/// line being written is read whole), or the end if there is none.
fn end_of_last_line(file: &File, size: u64) -> io::Result<u64> {
    let start = size.saturating_sub(64 * 1024);
    let tail = read_range(file, start, size - start)?;
    Ok(tail
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(size, |at| start + at as u64 + 1))
}

/// The path of the file `key` in `dir`, if it is there.
fn find_in_dir(dir: &Path, key: FileKey) -> Option<PathBuf> {
    let entries = std::fs::read_dir(dir).ok()?;
    entries
        .flatten()
        .filter(|entry| entry.ino() == key.inode)
        .map(|entry| entry.path())
        .find(|path| std::fs::metadata(path).is_ok_and(|m| m.is_file() && FileKey::of(&m) == key))
}
