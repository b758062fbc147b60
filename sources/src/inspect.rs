//! Source checkpoints decoded for people (`agent state`): where each file-reading source
//! resumes, set against the file as it is now, and the position of the others whose format is
//! simple. Nothing here writes or opens a file for writing.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use serde::Serialize;

use crate::file_id::FileKey;

/// Where reading of one file resumes, and what is at its path now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FilePosition {
    /// Where the file was last seen.
    pub path: PathBuf,
    /// Its device.
    pub dev: u64,
    /// Its inode.
    pub inode: u64,
    /// The byte just after the last line sent: reading resumes here.
    pub offset: u64,
    /// The file at `path` now.
    pub now: FileNow,
}

/// What is at a checkpoint's path now (by `stat`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum FileNow {
    /// The same file (device and inode), `size` bytes long: `size - offset` are not read yet.
    Present {
        /// Its size.
        size: u64,
        /// Bytes past the checkpoint's offset.
        bytes_behind: u64,
    },
    /// Another file has the path now (the checkpoint's file was rotated away).
    Replaced {
        /// The inode of the file there now.
        inode: u64,
    },
    /// Nothing is at the path.
    Gone,
}

impl FilePosition {
    /// The position of file `key` at `offset`, with a `stat` of `path`.
    pub(crate) fn now(path: PathBuf, key: FileKey, offset: u64) -> Self {
        let now = match std::fs::metadata(&path) {
            Ok(meta) if meta.dev() == key.dev && meta.ino() == key.inode => FileNow::Present {
                size: meta.len(),
                bytes_behind: meta.len().saturating_sub(offset),
            },
            Ok(meta) => FileNow::Replaced { inode: meta.ino() },
            Err(_) => FileNow::Gone,
        };
        Self {
            path,
            dev: key.dev,
            inode: key.inode,
            offset,
            now,
        }
    }
}

/// A source checkpoint, decoded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "format", rename_all = "snake_case")]
pub enum SourceCheckpoint {
    /// A `taildir` checkpoint: every tailed file.
    Taildir {
        /// The files.
        files: Vec<FilePosition>,
    },
    /// A `spooldir` checkpoint.
    Spooldir {
        /// The file being read, if one is.
        current: Option<FilePosition>,
        /// Files reported as failed and left in the directory.
        failed: usize,
    },
    /// A `seq` checkpoint: the next number to send.
    Seq {
        /// The next number.
        next: u64,
    },
}

/// Decodes `bytes` as the checkpoint of a source of type `source_type`, or, when the type is
/// not known, as the first format it reads as. `None`: not one of these formats.
pub fn describe_checkpoint(source_type: Option<&str>, bytes: &[u8]) -> Option<SourceCheckpoint> {
    let taildir = || {
        crate::taildir::inspect::positions(bytes)
            .ok()
            .map(|files| SourceCheckpoint::Taildir { files })
    };
    let spooldir = || {
        crate::spooldir::inspect::position(bytes)
            .ok()
            .map(|(current, failed)| SourceCheckpoint::Spooldir { current, failed })
    };
    let seq = || {
        let checkpoint = ferry_core::Checkpoint::new(bytes.to_vec());
        crate::seq::resume_from(Some(&checkpoint))
            .ok()
            .map(|next| SourceCheckpoint::Seq { next })
    };
    match source_type {
        Some("taildir") => taildir(),
        Some("spooldir") => spooldir(),
        Some("seq") => seq(),
        Some(_) => None,
        // Without the type, only formats that cannot be mistaken for each other: a spooldir
        // checkpoint is recognised by its `current` file.
        None => taildir()
            .or_else(|| match spooldir() {
                Some(SourceCheckpoint::Spooldir { current: None, .. }) => None,
                other => other,
            })
            .or_else(seq),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taildir_positions_are_set_against_the_file_now() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.log");
        std::fs::write(&file, "one\ntwo\nthree\n").unwrap();
        let meta = std::fs::metadata(&file).unwrap();
        let gone = dir.path().join("gone.log");
        let bytes = serde_json::json!({"v": 1, "files": [
            {"dev": meta.dev(), "inode": meta.ino(), "fp_len": 14, "fp_crc": 1, "offset": 4,
             "path": file},
            {"dev": 1, "inode": 2, "fp_len": 0, "fp_crc": 0, "offset": 9, "path": gone},
        ]})
        .to_string();
        let Some(SourceCheckpoint::Taildir { files }) = describe_checkpoint(None, bytes.as_bytes())
        else {
            panic!("not read as taildir: {bytes}");
        };
        assert_eq!(
            files[0].now,
            FileNow::Present {
                size: 14,
                bytes_behind: 10
            }
        );
        assert_eq!(files[0].offset, 4);
        assert_eq!(files[1].now, FileNow::Gone);
    }

    #[test]
    fn other_formats_are_recognised_or_left_alone() {
        assert_eq!(
            describe_checkpoint(None, b"42"),
            Some(SourceCheckpoint::Seq { next: 42 })
        );
        assert_eq!(describe_checkpoint(None, b"{\"v\":1}"), None);
        assert_eq!(describe_checkpoint(Some("taildir"), b"42"), None);
        assert_eq!(describe_checkpoint(None, &[0xff, 0x00]), None);
        let spool = br#"{"v":1,"current":{"path":"/nowhere/a.csv","dev":1,"inode":2,"fp_len":0,"fp_crc":0,"offset":7}}"#;
        let Some(SourceCheckpoint::Spooldir { current, failed }) = describe_checkpoint(None, spool)
        else {
            panic!("not read as spooldir");
        };
        assert_eq!(failed, 0);
        assert_eq!(current.map(|c| (c.offset, c.now)), Some((7, FileNow::Gone)));
    }
}
