//! The taildir checkpoint, decoded for `agent state`.

use ferry_core::Checkpoint;

use super::checkpoint;
use crate::inspect::FilePosition;

/// Every file position of a taildir checkpoint, with what the file is now.
pub(crate) fn positions(bytes: &[u8]) -> Result<Vec<FilePosition>, String> {
    let positions =
        checkpoint::decode(&Checkpoint::new(bytes.to_vec())).map_err(|e| e.to_string())?;
    Ok(positions
        .into_iter()
        .map(|p| FilePosition::now(p.path, p.key, p.offset))
        .collect())
}
