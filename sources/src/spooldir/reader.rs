//! Choosing the next file of the spool directory, reading it in batches of lines, and
//! completing it. Blocking file I/O: the source calls these on a blocking thread.

use std::collections::hash_map::RandomState;
use std::fs::File;
use std::hash::BuildHasher;
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use bytes::Bytes;
use regex::Regex;

use super::checkpoint::{CompletionMark, Current, Failed};
use super::config::{ConsumeOrder, DeletePolicy};
use crate::file_id::{FileKey, Fingerprint};
use crate::lines::LineBuffer;

/// Which files of the directory are read, and in what order.
#[derive(Debug, Clone)]
pub(crate) struct Selection {
    pub(crate) dir: PathBuf,
    pub(crate) suffix: String,
    pub(crate) include: Regex,
    pub(crate) ignore: Regex,
    pub(crate) order: ConsumeOrder,
}

/// What the directory offers next.
pub(crate) enum Next {
    /// A file to read.
    Read(SpoolFile),
    /// A file that must not be read, and why.
    Reject(Failed, String),
}

/// The path `path` gets once completed.
pub(crate) fn completed_path(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

impl Selection {
    /// The next file to read, if any. Drops from `failed` the files that are gone or were
    /// replaced (a new file under the name is read).
    pub(crate) fn next(&self, failed: &mut Vec<Failed>) -> io::Result<Option<Next>> {
        failed.retain(|f| std::fs::metadata(&f.path).is_ok_and(|m| FileKey::of(&m) == f.key));
        let mut candidates: Vec<(SystemTime, PathBuf, FileKey)> = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.')
                || name.ends_with(&self.suffix)
                || !self.include.is_match(&name)
                || self.ignore.is_match(&name)
            {
                continue;
            }
            let path = entry.path();
            let Ok(metadata) = std::fs::metadata(&path) else {
                continue;
            };
            let key = FileKey::of(&metadata);
            if !metadata.is_file() || failed.iter().any(|f| f.key == key && f.path == path) {
                continue;
            }
            let modified = metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            candidates.push((modified, path, key));
        }
        let chosen = match self.order {
            ConsumeOrder::Oldest => candidates.into_iter().min(),
            ConsumeOrder::Youngest => candidates
                .into_iter()
                .max_by(|a, b| a.0.cmp(&b.0).then_with(|| b.1.cmp(&a.1))),
            ConsumeOrder::Random if candidates.is_empty() => None,
            ConsumeOrder::Random => {
                let pick = RandomState::new().hash_one(candidates.len()) as usize;
                let at = pick % candidates.len();
                Some(candidates.swap_remove(at))
            }
        };
        let Some((_, path, key)) = chosen else {
            return Ok(None);
        };
        let completed = completed_path(&path, &self.suffix);
        if let Ok(metadata) = std::fs::metadata(&completed) {
            if FileKey::of(&metadata) == key {
                // Completed, but the agent stopped between linking the new name and
                // removing the old one: finish that.
                std::fs::remove_file(&path)?;
                return self.next(failed);
            }
            return Ok(Some(Next::Reject(
                Failed { path, key },
                format!(
                    "a file of this name was already completed ({} exists); spooled file names must not be reused",
                    completed.display()
                ),
            )));
        }
        Ok(Some(match SpoolFile::open(&path, 0) {
            Ok(file) => Next::Read(file),
            Err(error) => Next::Reject(Failed { path, key }, format!("it cannot be read: {error}")),
        }))
    }

    /// The mark before any completion: the directory's change time now.
    pub(crate) fn start_mark(&self) -> io::Result<CompletionMark> {
        let (ctime_s, ctime_ns) = change_time(&std::fs::metadata(&self.dir)?);
        Ok(CompletionMark {
            ctime_s,
            ctime_ns,
            keys: None,
        })
    }

    /// The completed files (under their completed names) completed after `mark`, oldest
    /// completion first, except `current`.
    pub(crate) fn completed_since(
        &self,
        mark: &CompletionMark,
        current: Option<FileKey>,
    ) -> io::Result<Vec<PathBuf>> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') || !name.ends_with(&self.suffix) {
                continue;
            }
            let path = entry.path();
            let Ok(metadata) = std::fs::metadata(&path) else {
                continue;
            };
            let key = FileKey::of(&metadata);
            let ctime = change_time(&metadata);
            if metadata.is_file() && Some(key) != current && mark.completed_after(key, ctime) {
                found.push((ctime, path));
            }
        }
        found.sort();
        Ok(found.into_iter().map(|(_, path)| path).collect())
    }

    /// A completed file to read again from its start.
    pub(crate) fn reopen_completed(&self, completed: &Path) -> io::Result<SpoolFile> {
        let mut file = SpoolFile::open(completed, 0)?;
        let name = completed.as_os_str().to_string_lossy();
        let original = name.strip_suffix(&self.suffix).unwrap_or(&name);
        file.name = PathBuf::from(original);
        file.already_completed = true;
        Ok(file)
    }

    /// The file of a saved position, positioned where reading resumes: under its name, or
    /// under its completed name if the agent stopped after completing it but before its last
    /// events were known to be delivered. `None` if it is gone or is another file now.
    pub(crate) fn resume(&self, current: &Current) -> Option<SpoolFile> {
        let completed = completed_path(&current.path, &self.suffix);
        [(&current.path, false), (&completed, true)]
            .into_iter()
            .find_map(|(path, already_completed)| {
                let mut file = SpoolFile::open(path, current.offset).ok()?;
                let same = file.key == current.key
                    && current.offset <= file.size
                    && current
                        .fingerprint
                        .verify(&file.handle, file.size)
                        .ok()
                        .flatten()
                        .is_some();
                if !same {
                    return None;
                }
                file.name = current.path.clone();
                file.already_completed = already_completed;
                Some(file)
            })
    }
}

/// A spooled file being read.
pub(crate) struct SpoolFile {
    /// Its name in the spool directory (without the completed suffix).
    pub(crate) name: PathBuf,
    /// Where it is read from: `name`, or the completed name when resuming.
    path: PathBuf,
    pub(crate) key: FileKey,
    pub(crate) fingerprint: Fingerprint,
    handle: File,
    lines: LineBuffer,
    /// Just after the last line taken.
    pub(crate) offset: u64,
    /// Size and modification time when opened: a spooled file must not change.
    size: u64,
    modified: Option<SystemTime>,
    /// Every line was taken.
    pub(crate) at_end: bool,
    /// Read under its completed name: nothing to do at the end.
    pub(crate) already_completed: bool,
}

impl SpoolFile {
    fn open(path: &Path, offset: u64) -> io::Result<Self> {
        let mut handle = File::open(path)?;
        let metadata = handle.metadata()?;
        let size = metadata.len();
        handle.seek(SeekFrom::Start(offset))?;
        Ok(Self {
            name: path.to_owned(),
            path: path.to_owned(),
            key: FileKey::of(&metadata),
            fingerprint: Fingerprint::of(&handle, size)?,
            handle,
            lines: LineBuffer::new(true),
            offset,
            size,
            modified: metadata.modified().ok(),
            at_end: false,
            already_completed: false,
        })
    }

    /// The saved position after the lines taken so far.
    pub(crate) fn position(&self) -> Current {
        Current {
            path: self.name.clone(),
            key: self.key,
            fingerprint: self.fingerprint,
            offset: self.offset,
        }
    }

    /// Takes up to `max` lines (line endings removed; longer than `max_length`, in pieces),
    /// each with the offset it starts at; at the end of the file, a last line without `\n`
    /// is taken too. Reads are 64 KiB.
    pub(crate) fn next_lines(
        &mut self,
        max: usize,
        max_length: usize,
    ) -> io::Result<Vec<(u64, Bytes)>> {
        let mut lines = Vec::with_capacity(max);
        while lines.len() < max {
            if let Some((line, size)) = self.lines.next_line_within(max_length) {
                lines.push((self.offset, line));
                self.offset += size as u64;
                continue;
            }
            if self.lines.fill_from(&mut self.handle)? > 0 {
                continue;
            }
            if let Some((mut line, size)) = self.lines.take_partial() {
                if line.last() == Some(&b'\r') {
                    line.truncate(line.len() - 1);
                }
                lines.push((self.offset, line));
                self.offset += size as u64;
            }
            self.at_end = true;
            break;
        }
        Ok(lines)
    }

    /// Why the file is not the one that was opened any more, if it changed.
    pub(crate) fn changed(&self) -> io::Result<Option<String>> {
        let metadata = self.handle.metadata()?;
        if metadata.len() != self.size || self.offset != self.size {
            return Ok(Some(format!(
                "its size changed from {} to {} bytes while it was read",
                self.size,
                metadata.len()
            )));
        }
        if metadata.modified().ok() != self.modified {
            return Ok(Some("it was modified while it was read".into()));
        }
        Ok(None)
    }

    /// The change time of the file under its completed name, once completed.
    pub(crate) fn completion_time(&self, suffix: &str) -> Option<(i64, i64)> {
        let completed = if self.already_completed {
            self.path.clone()
        } else {
            completed_path(&self.path, suffix)
        };
        std::fs::metadata(completed).ok().map(|m| change_time(&m))
    }

    /// Renames the file with `suffix` (never replacing a file of that name) or deletes it.
    pub(crate) fn complete(&self, policy: DeletePolicy, suffix: &str) -> io::Result<()> {
        if policy == DeletePolicy::Immediate {
            return std::fs::remove_file(&self.path);
        }
        let completed = completed_path(&self.path, suffix);
        // A hard link fails if the name exists, where a rename would replace it; a crash
        // between the two steps leaves both names, which the next listing (or, for the file
        // a checkpoint names, its completion on resume) finishes.
        match std::fs::hard_link(&self.path, &completed) {
            Ok(()) => std::fs::remove_file(&self.path),
            // This file's own completion, interrupted between the link and the removal (and
            // resumed from a checkpoint naming it): finish that.
            Err(e)
                if e.kind() == io::ErrorKind::AlreadyExists
                    && std::fs::metadata(&completed).is_ok_and(|m| FileKey::of(&m) == self.key) =>
            {
                std::fs::remove_file(&self.path)
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{} exists: a file of this name was already completed",
                    completed.display()
                ),
            )),
            // Filesystems without hard links.
            Err(_) if !completed.exists() => std::fs::rename(&self.path, &completed),
            Err(e) => Err(e),
        }
    }
}

/// A file's change time (`ctime`): seconds and nanoseconds.
fn change_time(metadata: &std::fs::Metadata) -> (i64, i64) {
    (metadata.ctime(), metadata.ctime_nsec())
}
