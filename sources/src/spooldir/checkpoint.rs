//! The checkpoint of the `spooldir` source, as JSON:
//!
//! ```json
//! {"v":1,
//!  "current":{"path":"/spool/a.csv","dev":64769,"inode":1312,"fp_len":1024,"fp_crc":305419896,
//!             "offset":40960},
//!  "failed":[{"path":"/spool/b.csv","dev":64769,"inode":1313}],
//!  "mark":{"ctime_s":1764412800,"ctime_ns":123456789,"keys":[{"dev":64769,"inode":1311}]}}
//! ```
//!
//! | field     | meaning                                                                   |
//! |-----------|---------------------------------------------------------------------------|
//! | `current` | the file being read: its identity (device, inode, fingerprint of its first bytes) and the byte just after the last line sent; `offset` equal to the file's size means every event was sent and only the rename (or delete) may be missing |
//! | `failed`  | files reported as errors (changed while read, name already completed) that stay in the directory and are not read again while they are the same file |
//! | `mark`    | the change time of the newest completed file when the batch was sent (see [`CompletionMark`]) |

use std::path::PathBuf;

use ferry_core::{Checkpoint, SourceError};
use serde::{Deserialize, Serialize};

use crate::file_id::{FileKey, Fingerprint};

/// The version written in `v`.
const VERSION: u32 = 1;

/// The file being read and where reading resumes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Current {
    pub(crate) path: PathBuf,
    #[serde(flatten)]
    pub(crate) key: FileKey,
    #[serde(flatten)]
    pub(crate) fingerprint: Fingerprint,
    pub(crate) offset: u64,
}

/// A file that was reported and is left alone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Failed {
    pub(crate) path: PathBuf,
    #[serde(flatten)]
    pub(crate) key: FileKey,
}

/// When the newest completion known to a checkpoint happened, as the change time (`ctime`)
/// the kernel gave the completed file (or, before any completion, the spool directory when the
/// source first started). A `.COMPLETED` file changed later was completed after the checkpoint
/// was sent: with a channel that saves checkpoints only once the sinks delivered, its events
/// may not have been delivered.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct CompletionMark {
    pub(crate) ctime_s: i64,
    pub(crate) ctime_ns: i64,
    /// Files completed at exactly this time (the clock is coarse); `None` for the start mark,
    /// where a file of the same time is older.
    pub(crate) keys: Option<Vec<FileKey>>,
}

impl CompletionMark {
    /// Whether the completed file `key`, of change time `ctime`, was completed after the mark.
    pub(crate) fn completed_after(&self, key: FileKey, ctime: (i64, i64)) -> bool {
        match ctime.cmp(&(self.ctime_s, self.ctime_ns)) {
            std::cmp::Ordering::Greater => true,
            std::cmp::Ordering::Less => false,
            std::cmp::Ordering::Equal => self.keys.as_ref().is_some_and(|k| !k.contains(&key)),
        }
    }

    /// The mark after completing file `key` at `ctime`.
    pub(crate) fn advance(&mut self, key: FileKey, ctime: (i64, i64)) {
        if ctime < (self.ctime_s, self.ctime_ns) {
            return;
        }
        if ctime == (self.ctime_s, self.ctime_ns)
            && let Some(keys) = &mut self.keys
        {
            keys.push(key);
            return;
        }
        *self = Self {
            ctime_s: ctime.0,
            ctime_ns: ctime.1,
            keys: Some(vec![key]),
        };
    }
}

/// Everything the source resumes from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SpoolState {
    pub(crate) current: Option<Current>,
    #[serde(default)]
    pub(crate) failed: Vec<Failed>,
    #[serde(default)]
    pub(crate) mark: Option<CompletionMark>,
}

#[derive(Serialize)]
struct Encoded<'a> {
    v: u32,
    #[serde(flatten)]
    state: &'a SpoolState,
}

#[derive(Deserialize)]
struct Decoded {
    v: u32,
    #[serde(flatten)]
    state: SpoolState,
}

impl SpoolState {
    pub(crate) fn encode(&self) -> Checkpoint {
        // Serializing numbers and paths cannot fail; an empty checkpoint would only mean
        // reading the current file again, never skipping.
        Checkpoint::new(
            serde_json::to_vec(&Encoded {
                v: VERSION,
                state: self,
            })
            .unwrap_or_default(),
        )
    }

    pub(crate) fn decode(checkpoint: &Checkpoint) -> Result<Self, SourceError> {
        let decoded: Decoded = serde_json::from_slice(checkpoint.as_bytes()).map_err(|e| {
            SourceError::Other(format!(
                "spooldir checkpoint is not readable ({e}): {}",
                String::from_utf8_lossy(checkpoint.as_bytes())
            ))
        })?;
        if decoded.v != VERSION {
            return Err(SourceError::Other(format!(
                "spooldir checkpoint has version {}, this agent reads version {VERSION}",
                decoded.v
            )));
        }
        Ok(decoded.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let state = SpoolState {
            current: Some(Current {
                path: "/s/a".into(),
                key: FileKey { dev: 1, inode: 2 },
                fingerprint: Fingerprint { len: 3, crc: 4 },
                offset: 5,
            }),
            failed: vec![Failed {
                path: "/s/b".into(),
                key: FileKey { dev: 1, inode: 6 },
            }],
            mark: Some(CompletionMark {
                ctime_s: 7,
                ctime_ns: 8,
                keys: Some(vec![FileKey { dev: 1, inode: 9 }]),
            }),
        };
        let checkpoint = state.encode();
        assert_eq!(
            std::str::from_utf8(checkpoint.as_bytes()).unwrap(),
            r#"{"v":1,"current":{"path":"/s/a","dev":1,"inode":2,"fp_len":3,"fp_crc":4,"offset":5},"failed":[{"path":"/s/b","dev":1,"inode":6}],"mark":{"ctime_s":7,"ctime_ns":8,"keys":[{"dev":1,"inode":9}]}}"#
        );
        assert_eq!(SpoolState::decode(&checkpoint).unwrap(), state);
        assert!(SpoolState::decode(&Checkpoint::new(r#"{"v":9}"#)).is_err());
    }

    #[test]
    fn completion_mark_orders_completions_with_ties() {
        let a = FileKey { dev: 1, inode: 1 };
        let b = FileKey { dev: 1, inode: 2 };
        let start = CompletionMark {
            ctime_s: 10,
            ctime_ns: 5,
            keys: None,
        };
        assert!(
            !start.completed_after(a, (10, 5)),
            "same time as the start: older"
        );
        assert!(start.completed_after(a, (10, 6)));
        let mut mark = start.clone();
        mark.advance(a, (10, 5));
        assert!(!mark.completed_after(a, (10, 5)));
        assert!(
            mark.completed_after(b, (10, 5)),
            "a tie completed after the mark"
        );
        mark.advance(b, (10, 5));
        assert!(!mark.completed_after(b, (10, 5)));
        mark.advance(a, (9, 0));
        assert_eq!((mark.ctime_s, mark.ctime_ns), (10, 5), "never goes back");
    }
}
