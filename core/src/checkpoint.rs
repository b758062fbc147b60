//! Source checkpoints and where they are kept.
//!
//! A checkpoint is the position a source can safely resume from once the batch it came with is
//! safe (taildir: inode and offset per file; kafka source: next offset per partition). It is
//! opaque to everyone but the source that wrote it.
//!
//! How a checkpoint becomes durable depends on the channels the source writes to (see
//! `DESIGN.md`, "the one rule of delivery"):
//! - a durable channel commits it in the same transaction as the events;
//! - otherwise the checkpoint is saved to the [`CheckpointStore`] only once every event up to it
//!   has been delivered by the sinks (see [`crate::ack`]), so a crash repeats events but never
//!   loses one.

use std::collections::HashMap;
use std::sync::Mutex;

/// An opaque, source-defined resume position.
///
/// ```
/// use ferry_core::Checkpoint;
/// let checkpoint = Checkpoint::new(b"offset=42".to_vec());
/// assert_eq!(checkpoint.as_bytes(), b"offset=42");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint(Vec<u8>);

impl Checkpoint {
    /// Wraps the bytes a source wants back when it resumes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Self(bytes.into())
    }

    /// The bytes the source stored.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Error of a [`CheckpointStore`].
#[derive(Debug, thiserror::Error)]
#[error("checkpoint store: {0}")]
pub struct CheckpointStoreError(pub String);

/// Durable storage of source checkpoints, keyed by source name.
pub trait CheckpointStore: Send + Sync {
    /// The last checkpoint saved for `source`, if any.
    fn load(&self, source: &str) -> Result<Option<Checkpoint>, CheckpointStoreError>;
    /// Replaces the checkpoint of `source`.
    fn save(&self, source: &str, checkpoint: &Checkpoint) -> Result<(), CheckpointStoreError>;
}

/// A checkpoint store that lives only as long as the process (for tests and for agents
/// configured without a data directory).
#[derive(Default, Debug)]
pub struct MemoryCheckpointStore {
    checkpoints: Mutex<HashMap<String, Checkpoint>>,
}

impl CheckpointStore for MemoryCheckpointStore {
    fn load(&self, source: &str) -> Result<Option<Checkpoint>, CheckpointStoreError> {
        let map = self
            .checkpoints
            .lock()
            .map_err(|_| CheckpointStoreError("lock poisoned".into()))?;
        Ok(map.get(source).cloned())
    }

    fn save(&self, source: &str, checkpoint: &Checkpoint) -> Result<(), CheckpointStoreError> {
        let mut map = self
            .checkpoints
            .lock()
            .map_err(|_| CheckpointStoreError("lock poisoned".into()))?;
        map.insert(source.to_owned(), checkpoint.clone());
        Ok(())
    }
}
