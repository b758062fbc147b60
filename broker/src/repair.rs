//! Finding and removing damaged ranges of a stopped broker's data directory, for
//! `agent log-repair`.
//!
//! Every `.log` of every partition directory (`<topic>-<partition>/`) is walked with CRC
//! checks (see `log::scan`), as recovery and the scrubber walk them. Removing a damaged range
//! rewrites its segment without those bytes (into a temporary file, fsynced, then renamed over
//! the segment) and deletes the segment's `.index` and `.timeindex`, which the broker rebuilds
//! on its next start. The intact batches keep their offsets: the offsets the damage held no
//! longer exist, as after compaction, and consumers read on past them.
//!
//! The broker must be stopped: a running broker holds the segment files open and would go on
//! serving the old ones. Removing is refused without the clean-shutdown marker, which a
//! running broker has removed (after a crash, start the broker once and stop it).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::log::StorageError;
use crate::log::scan::{Found, Walk};

/// Why the data directory could not be checked or repaired.
#[derive(Debug, thiserror::Error)]
pub enum RepairError {
    /// A file operation failed.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// A segment could not be read.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The data directory has no clean-shutdown marker: a broker runs on it, or stopped
    /// without finishing its writes.
    #[error(
        "{0} has no clean-shutdown marker: a broker is running on it or did not stop cleanly; \
         stop it (or start it once and stop it) before removing damage"
    )]
    NotStopped(PathBuf),
}

fn io(path: &Path, action: &'static str) -> impl FnOnce(std::io::Error) -> RepairError {
    let path = path.to_path_buf();
    move |source| RepairError::Io {
        path,
        action,
        source,
    }
}

/// A damaged range of a segment file.
#[derive(Debug, Clone, PartialEq)]
pub struct DamagedRange {
    /// The segment's `.log` file.
    pub file: PathBuf,
    /// Where the damaged bytes start.
    pub position: u64,
    /// Where the next intact batch starts, or the end of the file.
    pub end: u64,
    /// The first offset lost.
    pub first_offset: i64,
    /// The last offset lost; `None` when no offset is known lost: the bytes lie between
    /// batches with consecutive offsets, or run to the end of the partition's last segment
    /// (a torn tail, which the broker cuts when it starts).
    pub last_offset: Option<i64>,
    /// What is wrong at `position`.
    pub reason: String,
}

impl std::fmt::Display for DamagedRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let lost = match self.last_offset {
            Some(last) => format!("offsets {} to {last}", self.first_offset),
            None => format!("no offset known lost, from {}", self.first_offset),
        };
        write!(
            f,
            "{}: bytes {} to {} ({} bytes, {lost}): {}",
            self.file.display(),
            self.position,
            self.end,
            self.end - self.position,
            self.reason
        )
    }
}

/// The segment files of one partition directory, by base offset.
fn segments(dir: &Path) -> Result<Vec<(i64, PathBuf)>, RepairError> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).map_err(io(dir, "list"))?.flatten() {
        let name = entry.file_name();
        let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".log")) else {
            continue;
        };
        if stem.len() == 20
            && let Ok(base) = stem.parse::<i64>()
        {
            found.push((base, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

/// The partition directories of `data_dir` (those holding segment files), by name.
fn partition_dirs(data_dir: &Path) -> Result<Vec<PathBuf>, RepairError> {
    let mut dirs = Vec::new();
    for entry in fs::read_dir(data_dir)
        .map_err(io(data_dir, "list"))?
        .flatten()
    {
        let path = entry.path();
        if path.is_dir() && !segments(&path)?.is_empty() {
            dirs.push(path);
        }
    }
    dirs.sort();
    Ok(dirs)
}

/// Every damaged range of every segment in `data_dir`, by partition and position.
pub fn find_damage(data_dir: &Path) -> Result<Vec<DamagedRange>, RepairError> {
    let mut out = Vec::new();
    for dir in partition_dirs(data_dir)? {
        let segments = segments(&dir)?;
        for (i, (base, path)) in segments.iter().enumerate() {
            let bound = segments.get(i + 1).map(|(next, _)| *next);
            let file = fs::File::open(path).map_err(io(path, "open"))?;
            let len = file.metadata().map_err(io(path, "stat"))?.len();
            let walk = Walk {
                file: &file,
                path,
                len,
                base_offset: *base,
                bound,
                verify: true,
            };
            walk.run(
                0,
                *base,
                |found| {
                    if let Found::Damage(d) = found {
                        out.push(DamagedRange {
                            file: path.clone(),
                            position: d.position,
                            end: d.end,
                            first_offset: d.first_offset,
                            last_offset: (d.next_offset > d.first_offset).then(|| d.last_offset()),
                            reason: d.reason,
                        });
                    }
                },
                |_| true,
            )?;
        }
    }
    Ok(out)
}

/// Rewrites each segment named in `ranges` without those bytes (see the module docs); the
/// ranges must come from [`find_damage`] on `data_dir`, unchanged since. Refused unless the
/// broker stopped cleanly (its marker is there).
pub fn remove_damage(data_dir: &Path, ranges: &[DamagedRange]) -> Result<(), RepairError> {
    if !data_dir.join(crate::server::CLEAN_SHUTDOWN_MARKER).exists() {
        return Err(RepairError::NotStopped(data_dir.to_path_buf()));
    }
    let mut files: Vec<&Path> = ranges.iter().map(|r| r.file.as_path()).collect();
    files.dedup();
    for file in files {
        let mut cut: Vec<(u64, u64)> = ranges
            .iter()
            .filter(|r| r.file == file)
            .map(|r| (r.position, r.end))
            .collect();
        cut.sort_unstable();
        let data = fs::read(file).map_err(io(file, "read"))?;
        let mut kept = Vec::with_capacity(data.len());
        let mut at = 0usize;
        for (start, end) in cut {
            let start = usize::try_from(start).unwrap_or(usize::MAX).min(data.len());
            let end = usize::try_from(end).unwrap_or(usize::MAX).min(data.len());
            if start > at {
                kept.extend_from_slice(&data[at..start]);
            }
            at = at.max(end);
        }
        kept.extend_from_slice(&data[at.min(data.len())..]);
        let tmp = file.with_extension("log.repair");
        let mut out = fs::File::create(&tmp).map_err(io(&tmp, "create"))?;
        out.write_all(&kept).map_err(io(&tmp, "write"))?;
        out.sync_all().map_err(io(&tmp, "fsync"))?;
        fs::rename(&tmp, file).map_err(io(file, "replace"))?;
        // The indexes point at the old positions: the broker rebuilds them from the log.
        for ext in ["index", "timeindex"] {
            let index = file.with_extension(ext);
            match fs::remove_file(&index) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(&index, "delete")(e)),
            }
        }
        if let Some(dir) = file.parent() {
            fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io(dir, "fsync"))?;
        }
    }
    Ok(())
}
