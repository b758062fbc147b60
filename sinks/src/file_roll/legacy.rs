//! Files left by `file_roll` before it wrote through the shared rolling writer:
//! `<prefix><series>-<index><suffix>.tmp`, with a progress record naming the file being
//! written and its committed length. At the first start after an upgrade the recorded file
//! is cut back to its committed length and finished, and other such files (which hold only
//! unacknowledged events) are removed, as the earlier version did at its own start; without
//! a record they are finished as they are.

use std::fs::OpenOptions;
use std::path::Path;

use ferry_core::SinkError;
use serde::Deserialize;

use super::rename_durably;

/// The progress record of the earlier version.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Progress {
    /// Final name of the file being written.
    pub(super) file: String,
    /// Its committed length in bytes.
    pub(super) length: u64,
    /// Channel sequence numbers of the last batch written.
    pub(super) delivered: Option<(u64, u64)>,
}

const TEMPORARY_SUFFIX: &str = ".tmp";

/// Cleans up after a crashed run: the recorded file is cut back to its committed length and
/// finished; other `.tmp` files hold only unacknowledged bytes and are deleted. Without a
/// progress record every `.tmp` file is finished as it is (at-least-once).
pub(super) fn recover(
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
        rename_durably(&entry.path(), &finished, directory, true)?;
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
