//! The checkpoint of the `spooldir` source, as JSON:
//!
//! ```json
//! {"v":1,
//!  "current":{"path":"/spool/a.csv","dev":64769,"inode":1312,"fp_len":1024,"fp_crc":305419896,
//!             "offset":40960},
//!  "failed":[{"path":"/spool/b.csv","dev":64769,"inode":1313}]}
//! ```
//!
//! | field     | meaning                                                                   |
//! |-----------|---------------------------------------------------------------------------|
//! | `current` | the file being read: its identity (device, inode, fingerprint of its first bytes) and the byte just after the last line sent; `offset` equal to the file's size means every event was sent and only the rename (or delete) may be missing |
//! | `failed`  | files reported as errors (changed while read, name already completed) that stay in the directory and are not read again while they are the same file |

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

/// Everything the source resumes from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SpoolState {
    pub(crate) current: Option<Current>,
    #[serde(default)]
    pub(crate) failed: Vec<Failed>,
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
        };
        let checkpoint = state.encode();
        assert_eq!(
            std::str::from_utf8(checkpoint.as_bytes()).unwrap(),
            r#"{"v":1,"current":{"path":"/s/a","dev":1,"inode":2,"fp_len":3,"fp_crc":4,"offset":5},"failed":[{"path":"/s/b","dev":1,"inode":6}]}"#
        );
        assert_eq!(SpoolState::decode(&checkpoint).unwrap(), state);
        assert!(SpoolState::decode(&Checkpoint::new(r#"{"v":9}"#)).is_err());
    }
}
