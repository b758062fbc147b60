//! The checkpoint of the `taildir` source: every tailed file's position, as JSON.
//!
//! ```json
//! {"v":1,"files":[
//!   {"dev":64769,"inode":1312,"fp_len":1024,"fp_crc":305419896,"offset":40960,
//!    "path":"/var/log/app.log"}
//! ]}
//! ```
//!
//! | field    | meaning                                                                  |
//! |----------|--------------------------------------------------------------------------|
//! | `dev`, `inode` | the file's identity while it exists                                |
//! | `fp_len`, `fp_crc` | CRC-32C of its first `fp_len` bytes (at most 1 KiB): tells a reused inode from the file |
//! | `offset` | the byte just after the last line sent: reading resumes here             |
//! | `path`   | where the file was last seen (informational; used to find a rotated file again) |
//!
//! Each batch carries the positions of all files the source knows, so the newest checkpoint
//! replaces the one before it.

use std::path::{Path, PathBuf};

use ferry_core::{Checkpoint, SourceError};
use serde::{Deserialize, Serialize};

use crate::file_id::{FileKey, Fingerprint};

/// The version written in `v`.
const VERSION: u32 = 1;

/// Where reading of one file resumes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Position {
    #[serde(flatten)]
    pub(crate) key: FileKey,
    #[serde(flatten)]
    pub(crate) fingerprint: Fingerprint,
    pub(crate) offset: u64,
    pub(crate) path: PathBuf,
}

#[derive(Serialize)]
struct Encoded<'a> {
    v: u32,
    files: Vec<&'a Position>,
}

#[derive(Deserialize)]
struct Decoded {
    v: u32,
    files: Vec<Position>,
}

/// Encodes the positions of every known file.
pub(crate) fn encode<'a>(positions: impl Iterator<Item = &'a Position>) -> Checkpoint {
    let encoded = Encoded {
        v: VERSION,
        files: positions.collect(),
    };
    // Serializing plain numbers and paths cannot fail; an empty checkpoint would only mean
    // reading again from the start, never skipping.
    Checkpoint::new(serde_json::to_vec(&encoded).unwrap_or_default())
}

/// Decodes a checkpoint written by [`encode`].
pub(crate) fn decode(checkpoint: &Checkpoint) -> Result<Vec<Position>, SourceError> {
    let decoded: Decoded = serde_json::from_slice(checkpoint.as_bytes()).map_err(|e| {
        SourceError::Other(format!(
            "taildir checkpoint is not readable ({e}): {}",
            String::from_utf8_lossy(checkpoint.as_bytes())
        ))
    })?;
    if decoded.v != VERSION {
        return Err(SourceError::Other(format!(
            "taildir checkpoint has version {}, this agent reads version {VERSION}",
            decoded.v
        )));
    }
    Ok(decoded.files)
}

/// One entry of Flume's `taildir_position.json`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub(crate) struct FlumePosition {
    pub(crate) inode: u64,
    pub(crate) pos: u64,
    pub(crate) file: PathBuf,
}

/// Reads a Flume `taildir_position.json`.
pub(crate) fn read_flume_positions(path: &Path) -> Result<Vec<FlumePosition>, SourceError> {
    let text = std::fs::read(path).map_err(|e| {
        SourceError::io(format!("reading Flume position file {}", path.display()), e)
    })?;
    serde_json::from_slice(&text).map_err(|e| {
        SourceError::Other(format!(
            "Flume position file {}: expected [{{\"inode\":..,\"pos\":..,\"file\":..}}]: {e}",
            path.display()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_other_versions() {
        let position = Position {
            key: FileKey { dev: 1, inode: 2 },
            fingerprint: Fingerprint { len: 3, crc: 4 },
            offset: 5,
            path: "/x/a.log".into(),
        };
        let checkpoint = encode([&position].into_iter());
        assert_eq!(
            std::str::from_utf8(checkpoint.as_bytes()).unwrap(),
            r#"{"v":1,"files":[{"dev":1,"inode":2,"fp_len":3,"fp_crc":4,"offset":5,"path":"/x/a.log"}]}"#
        );
        assert_eq!(decode(&checkpoint).unwrap(), vec![position]);
        assert!(decode(&Checkpoint::new(r#"{"v":2,"files":[]}"#)).is_err());
        assert!(decode(&Checkpoint::new("7")).is_err());
    }
}
