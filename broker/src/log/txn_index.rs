//! A segment's `.txnindex`: the transactions aborted by markers in that segment, as Kafka keeps
//! them, so a read_committed fetch can tell consumers which records to drop.
//!
//! Entries are 34 bytes, big-endian, in marker order: version i16 (0), producer id i64, first
//! offset i64, last offset i64 (the abort marker), last stable offset i64. The file exists only
//! once a segment holds an abort marker. On open, entries past the end of the segment's log (a
//! torn tail cut off by recovery) are dropped.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use super::producers::AbortedTxn;
use super::{StorageError, io_err};

const ENTRY: usize = 34;

/// The aborted transactions of one segment.
pub(crate) struct TxnIndex {
    path: PathBuf,
    file: Option<File>,
    entries: Vec<AbortedTxn>,
}

impl TxnIndex {
    /// An index with no entries and no file yet.
    pub(crate) fn empty(path: PathBuf) -> TxnIndex {
        TxnIndex {
            path,
            file: None,
            entries: Vec::new(),
        }
    }

    /// Reads `path` if it exists, keeping the entries whose marker is before `next_offset`.
    pub(crate) fn open(path: PathBuf, next_offset: i64) -> Result<TxnIndex, StorageError> {
        let mut index = TxnIndex::empty(path);
        let bytes = match std::fs::read(&index.path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(index),
            Err(e) => return Err(io_err(&index.path, "read")(e)),
        };
        let i64_at = |e: &[u8], at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&e[at..at + 8]);
            i64::from_be_bytes(b)
        };
        for e in bytes.chunks_exact(ENTRY) {
            let entry = AbortedTxn {
                producer_id: i64_at(e, 2),
                first_offset: i64_at(e, 10),
                last_offset: i64_at(e, 18),
                last_stable_offset: i64_at(e, 26),
            };
            let ordered = index
                .entries
                .last()
                .is_none_or(|l| l.last_offset < entry.last_offset);
            if e[..2] != [0, 0]
                || !ordered
                || entry.last_offset >= next_offset
                || entry.first_offset > entry.last_offset
            {
                break;
            }
            index.entries.push(entry);
        }
        if index.entries.len() * ENTRY != bytes.len() {
            tracing::warn!(
                index = %index.path.display(),
                kept = index.entries.len(),
                "dropped transaction index entries past the end of the log"
            );
            let len = (index.entries.len() * ENTRY) as u64;
            index
                .file()?
                .set_len(len)
                .map_err(io_err(&index.path, "truncate"))?;
        }
        Ok(index)
    }

    fn file(&mut self) -> Result<&File, StorageError> {
        if self.file.is_none() {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&self.path)
                .map_err(io_err(&self.path, "open"))?;
            self.file = Some(file);
        }
        self.file
            .as_ref()
            .ok_or_else(|| io_err(&self.path, "open")(std::io::ErrorKind::NotFound.into()))
    }

    /// Adds an entry unless one for the same marker (or a later one) is there already, as when
    /// the log is replayed after a crash.
    pub(crate) fn append(&mut self, entry: AbortedTxn) -> Result<(), StorageError> {
        if self
            .entries
            .last()
            .is_some_and(|l| l.last_offset >= entry.last_offset)
        {
            return Ok(());
        }
        let mut bytes = Vec::with_capacity(ENTRY);
        bytes.extend_from_slice(&0i16.to_be_bytes());
        for v in [
            entry.producer_id,
            entry.first_offset,
            entry.last_offset,
            entry.last_stable_offset,
        ] {
            bytes.extend_from_slice(&v.to_be_bytes());
        }
        let at = (self.entries.len() * ENTRY) as u64;
        // Kept in memory even if the write fails: replaying the log after a restart writes it.
        self.entries.push(entry);
        let path = self.path.clone();
        self.file()?
            .write_all_at(&bytes, at)
            .map_err(io_err(&path, "append to"))
    }

    /// The entries, in marker order.
    pub(crate) fn entries(&self) -> &[AbortedTxn] {
        &self.entries
    }

    /// Fsyncs the file, if there is one.
    pub(crate) fn flush(&self) -> Result<(), StorageError> {
        match &self.file {
            Some(file) => file.sync_data().map_err(io_err(&self.path, "fsync")),
            None => Ok(()),
        }
    }

    /// Removes the file.
    pub(crate) fn delete(self) -> Result<(), StorageError> {
        match std::fs::remove_file(&self.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err(&self.path, "delete")(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(first: i64, last: i64) -> AbortedTxn {
        AbortedTxn {
            producer_id: 3,
            first_offset: first,
            last_offset: last,
            last_stable_offset: last + 1,
        }
    }

    #[test]
    fn entries_survive_a_reopen_and_those_past_the_log_end_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("00000000000000000000.txnindex");
        let mut index = TxnIndex::open(path.clone(), 100).unwrap();
        assert!(!path.exists());
        index.append(entry(1, 5)).unwrap();
        index.append(entry(6, 9)).unwrap();
        index.append(entry(6, 9)).unwrap();
        index.append(entry(10, 20)).unwrap();
        drop(index);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 3 * 34);
        let index = TxnIndex::open(path.clone(), 100).unwrap();
        assert_eq!(index.entries(), &[entry(1, 5), entry(6, 9), entry(10, 20)]);
        let index = TxnIndex::open(path.clone(), 15).unwrap();
        assert_eq!(index.entries(), &[entry(1, 5), entry(6, 9)]);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 2 * 34);
        std::fs::write(&path, [7u8; 50]).unwrap();
        assert!(
            TxnIndex::open(path.clone(), 100)
                .unwrap()
                .entries()
                .is_empty()
        );
        index.delete().unwrap();
        assert!(!path.exists());
    }
}
