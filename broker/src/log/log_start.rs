//! The log start offset that DeleteRecords moves: it can lie inside a segment, so it is kept in
//! its own file (`log-start-offset`, a decimal offset, Kafka's log-start-offset checkpoint for
//! one partition), written to a temporary file, fsynced and renamed into place before the
//! request is answered, then the directory is fsynced. On open it is read back and taken when
//! it is past the oldest segment's base offset (retention deleting whole segments raises the
//! start past an older value by itself) and not past the log end.
//!
//! Reads below the start answer OFFSET_OUT_OF_RANGE; segments wholly below it are deleted, as
//! retention deletes them (never the active one).

use std::fs;
use std::path::Path;

use super::{PartitionLog, StorageError, segment};

/// The file in a partition's directory holding the offset DeleteRecords moved its start to.
pub(crate) const LOG_START_FILE: &str = "log-start-offset";

/// The start recorded in `dir`, or 0 when there is none (or it cannot be read: a lost file
/// only means the records below it are readable again until retention deletes them).
pub(super) fn read(dir: &Path) -> i64 {
    let path = dir.join(LOG_START_FILE);
    match fs::read_to_string(&path) {
        Ok(text) => match text.trim().parse::<i64>() {
            Ok(offset) if offset >= 0 => offset,
            _ => {
                tracing::warn!(path = %path.display(), "ignoring a log start offset file that holds no offset");
                0
            }
        },
        Err(_) => 0,
    }
}

/// Writes `offset` to `dir`'s start file crash-safely: a temporary file, fsynced, renamed into
/// place, the directory fsynced.
fn write(dir: &Path, offset: i64) -> Result<(), StorageError> {
    let path = dir.join(LOG_START_FILE);
    let tmp = path.with_extension("tmp");
    let io = super::io_err;
    let file = fs::File::create(&tmp).map_err(io(&tmp, "create"))?;
    std::io::Write::write_all(&mut &file, format!("{offset}\n").as_bytes())
        .map_err(io(&tmp, "write"))?;
    file.sync_data().map_err(io(&tmp, "fsync"))?;
    fs::rename(&tmp, &path).map_err(io(&path, "rename into place"))?;
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir, "fsync"))?;
    Ok(())
}

impl PartitionLog {
    /// Moves the log start to `offset` (at most the log end; the caller checks it) when that
    /// raises it, persists it, and deletes the segments wholly below it; returns the log start
    /// offset after (Kafka's low watermark).
    pub(crate) fn delete_records_before(&mut self, offset: i64) -> Result<i64, StorageError> {
        let offset = offset.min(self.log_end_offset());
        if offset <= self.log_start_offset() {
            return Ok(self.log_start_offset());
        }
        write(&self.dir, offset)?;
        self.log_start = offset;
        // Segments whose every offset is below the new start go, oldest first (never the
        // active one).
        while self.segments.len() > 1 && self.segments[0].next_offset() <= offset {
            let segment = self.segments.remove(0);
            tracing::info!(
                partition = %self.name,
                segment = %segment::file_name(segment.base_offset(), "log"),
                log_start_offset = offset,
                "deleting segment below the log start offset"
            );
            segment.delete()?;
        }
        Ok(self.log_start_offset())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;

    use super::super::{Read, batch};
    use super::*;
    use crate::config::BrokerConfig;
    use crate::topic_config::LogConfig;

    fn config(segment_bytes: u64) -> LogConfig {
        let broker = BrokerConfig {
            log_segment_bytes: segment_bytes,
            log_index_interval_bytes: 100,
            ..Default::default()
        };
        LogConfig::resolve(&broker, &BTreeMap::new()).unwrap()
    }

    fn append(log: &mut PartitionLog, count: i32) -> i64 {
        let mut bytes = batch::tests::make_batch(0, count, 1000);
        let mut headers = batch::validate_all(&bytes).unwrap();
        log.append(&mut bytes, &mut headers).unwrap()
    }

    fn open(dir: &Path) -> PartitionLog {
        PartitionLog::open(dir, "t-0".into(), config(200), false).unwrap()
    }

    #[test]
    fn a_start_inside_a_segment_hides_what_is_below_deletes_whole_segments_and_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(dir.path());
        for _ in 0..10 {
            append(&mut log, 1);
        }
        let segments = log.segment_count();
        assert!(segments > 3, "{segments} segments");
        let bases_below: Vec<i64> = log
            .segments
            .iter()
            .filter(|s| s.next_offset() <= 6)
            .map(|s| s.base_offset())
            .collect();
        assert!(!bases_below.is_empty());
        assert_eq!(log.delete_records_before(6).unwrap(), 6);
        assert_eq!(log.log_start_offset(), 6);
        for base in &bases_below {
            assert!(!dir.path().join(segment::file_name(*base, "log")).exists());
        }
        assert!(log.segments[0].base_offset() <= 6);
        assert!(log.read(5, 1000, true, i64::MAX).unwrap().is_none());
        let Some(Read::Slice(slice)) = log.read(6, 1000, true, i64::MAX).unwrap() else {
            panic!("nothing at the new start");
        };
        assert!(!slice.read().unwrap().is_empty());
        // Lowering it is no change.
        assert_eq!(log.delete_records_before(2).unwrap(), 6);
        drop(log);

        let mut log = open(dir.path());
        assert_eq!(log.log_start_offset(), 6);
        assert!(log.read(5, 1000, true, i64::MAX).unwrap().is_none());
        // Up to the log end: nothing is left to read, the active segment stays.
        assert_eq!(log.delete_records_before(10).unwrap(), 10);
        assert_eq!(log.segment_count(), 1);
        assert!(log.read(9, 1000, true, i64::MAX).unwrap().is_none());
        assert_eq!(append(&mut log, 1), 10);
        drop(log);
        assert_eq!(open(dir.path()).log_start_offset(), 10);
    }

    #[test]
    fn the_start_file_round_trips_and_a_bad_one_reads_as_none() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()), 0);
        write(dir.path(), 42).unwrap();
        assert_eq!(read(dir.path()), 42);
        assert!(!dir.path().join("log-start-offset.tmp").exists());
        fs::write(dir.path().join(LOG_START_FILE), "garbage").unwrap();
        assert_eq!(read(dir.path()), 0);
        fs::write(dir.path().join(LOG_START_FILE), "-7\n").unwrap();
        assert_eq!(read(dir.path()), 0);
    }
}
