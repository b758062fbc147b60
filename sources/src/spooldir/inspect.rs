//! The spooldir checkpoint, decoded for `agent state`.

use ferry_core::Checkpoint;

use super::checkpoint::SpoolState;
use crate::inspect::FilePosition;

/// The file being read (if any) and how many files were set aside as failed.
pub(crate) fn position(bytes: &[u8]) -> Result<(Option<FilePosition>, usize), String> {
    let state = SpoolState::decode(&Checkpoint::new(bytes.to_vec())).map_err(|e| e.to_string())?;
    let current = state
        .current
        .map(|c| FilePosition::now(c.path, c.key, c.offset));
    Ok((current, state.failed.len()))
}
