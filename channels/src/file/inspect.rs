//! A file channel's segment files as its committed index describes them, read without
//! changing anything (`agent state`): their size on disk, whether every segment the index
//! lists is there and holds the committed bytes, and the oldest event not yet taken.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use ferry_core::state::LogIndex;

use super::segment;

/// What the segment files of one channel hold.
#[derive(Clone, Debug, Default)]
pub struct ChannelFiles {
    /// The channel's directory, `<data_dir>/channels/<id>`.
    pub dir: PathBuf,
    /// Bytes of every file in the directory.
    pub size_on_disk: u64,
    /// Segment files the index lists that are missing, shorter than committed or damaged,
    /// each naming the file and what is wrong.
    pub problems: Vec<String>,
    /// The oldest event stored and not taken, if any.
    pub oldest: Option<OldestEvent>,
}

/// The oldest event of a channel not taken yet.
#[derive(Clone, Debug)]
pub struct OldestEvent {
    /// Its sequence number.
    pub seq: u64,
    /// Its `timestamp` header (milliseconds since the epoch, as Flume's timestamp interceptor
    /// writes it), when it has a readable one.
    pub timestamp_ms: Option<u64>,
    /// When the segment file holding it was last written: the event was stored no later.
    pub segment_modified: Option<SystemTime>,
}

/// Reads the files of the channel whose committed index is `index`, under `data_dir`.
pub fn inspect(data_dir: &Path, index: &LogIndex) -> ChannelFiles {
    let dir = data_dir.join("channels").join(index.id.to_string());
    let mut files = ChannelFiles {
        size_on_disk: size_of(&dir),
        ..ChannelFiles::default()
    };
    if let Some((base, _)) = index.end
        && !index.segments.contains(&base)
    {
        files.problems.push(format!(
            "{}: the committed end is in segment {base}, which the index does not list",
            dir.display()
        ));
    }
    let mut lengths = Vec::with_capacity(index.segments.len());
    for &base in &index.segments {
        let path = segment::segment_path(&dir, base);
        match std::fs::metadata(&path) {
            Ok(meta) => {
                let committed = index.end.filter(|(b, _)| *b == base).map(|(_, end)| end);
                if let Some(committed) = committed
                    && meta.len() < committed
                {
                    files.problems.push(format!(
                        "{}: {} bytes long, the state says {committed} are committed",
                        path.display(),
                        meta.len()
                    ));
                }
                // Bytes past the committed end are cut at the next start: only what was
                // committed is read.
                lengths.push((base, committed.unwrap_or(meta.len()).min(meta.len())));
            }
            Err(e) => files.problems.push(format!(
                "{}: missing, the state lists it as segment {base} of the channel ({e})",
                path.display()
            )),
        }
    }
    if index.stored > 0 && files.problems.is_empty() {
        match oldest(&dir, index, &lengths) {
            Ok(found) => files.oldest = found,
            Err(problem) => files.problems.push(problem),
        }
    }
    files.dir = dir;
    files
}

/// Bytes of the files in `dir` (0 when it does not exist).
fn size_of(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// The first sequence number from `seq` on that was not taken for good: past the low-water
/// mark and every taken range it falls in (one step per range, whatever their sizes).
fn first_not_taken(index: &LogIndex, seq: u64) -> u64 {
    let mut seq = seq.max(index.taken_seq);
    for (first, last) in &index.taken {
        if (*first..=*last).contains(&seq) {
            seq = last.saturating_add(1);
        }
    }
    seq
}

/// Walks the frames of the segments, `(base, readable length)` in order, to the first event
/// not taken. Only that frame's payload is read; the others' headers are skipped over.
fn oldest(
    dir: &Path,
    index: &LogIndex,
    lengths: &[(u64, u64)],
) -> Result<Option<OldestEvent>, String> {
    for &(base, limit) in lengths {
        let path = segment::segment_path(dir, base);
        let file = File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut offset = 0;
        while offset < limit {
            let header =
                segment::read_header(&file, &path, offset, limit).map_err(|e| e.to_string())?;
            // The header was read from disk: its numbers are not trusted to add up.
            let end = header.first_seq.saturating_add(header.count);
            let seq = first_not_taken(index, header.first_seq);
            if seq < end {
                let events = segment::read_events(&file, &path, offset, &header)
                    .map_err(|e| e.to_string())?;
                let event = events.get((seq - header.first_seq) as usize);
                return Ok(Some(OldestEvent {
                    seq,
                    timestamp_ms: event
                        .and_then(|e| e.headers.get("timestamp"))
                        .and_then(|t| t.trim().parse().ok()),
                    segment_modified: file.metadata().and_then(|m| m.modified()).ok(),
                }));
            }
            offset += header.frame_len();
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ferry_core::state::{Durability, StateStore};
    use ferry_core::{Channel, Event, Headers, PutBatch, config::ByteSize};

    use super::*;
    use crate::file::{FileChannel, FileChannelConfig};

    fn put(events: Vec<Event>) -> PutBatch {
        PutBatch {
            source: "src".into(),
            events,
            checkpoint: None,
            ack: None,
            joint: None,
        }
    }

    fn stamped(body: &str, ms: &str) -> Event {
        let headers: Headers = [("timestamp".to_owned(), ms.to_owned())]
            .into_iter()
            .collect();
        Event::new(headers, body.to_owned())
    }

    #[test]
    fn skips_the_mark_and_taken_ranges_without_overflow() {
        let index = LogIndex {
            taken_seq: 5,
            taken: vec![(5, 9), (10, 10), (20, u64::MAX)],
            ..LogIndex::default()
        };
        assert_eq!(first_not_taken(&index, 1), 11);
        assert_eq!(first_not_taken(&index, 12), 12);
        assert_eq!(first_not_taken(&index, 25), u64::MAX);
    }

    #[tokio::test]
    async fn finds_the_oldest_event_not_taken_and_names_damaged_segments() {
        let dir = tempfile::tempdir().unwrap();
        let options = FileChannelConfig {
            capacity: 100,
            transaction_capacity: 100,
            durability: Durability::Normal,
            data_dir: None,
            minimum_free_space: ByteSize(0),
            max_file_size: ByteSize(64 << 20),
        };
        let channel = FileChannel::new("c", &options, dir.path().to_owned());
        channel.start().await.unwrap();
        let plain = |n: u32| Event::from_body(n.to_string());
        channel.put(put(vec![plain(1), plain(2)])).await.unwrap();
        channel
            .put(put(vec![stamped("3", "1700000000000"), plain(4)]))
            .await
            .unwrap();
        channel
            .take(2, Duration::ZERO)
            .await
            .unwrap()
            .commit()
            .await
            .unwrap();
        let index = || {
            StateStore::open(dir.path())
                .unwrap()
                .channel_log("c")
                .unwrap()
        };
        let files = inspect(dir.path(), &index());
        assert!(files.problems.is_empty(), "{:?}", files.problems);
        let oldest = files.oldest.unwrap();
        assert_eq!(
            (oldest.seq, oldest.timestamp_ms),
            (3, Some(1_700_000_000_000))
        );
        let segment = segment::segment_path(&files.dir, 1);
        assert_eq!(
            files.size_on_disk,
            std::fs::metadata(&segment).unwrap().len()
        );

        std::fs::OpenOptions::new()
            .write(true)
            .open(&segment)
            .unwrap()
            .set_len(10)
            .unwrap();
        let problems = inspect(dir.path(), &index()).problems;
        assert!(
            problems.len() == 1 && problems[0].contains("10 bytes long, the state says"),
            "{problems:?}"
        );
        std::fs::remove_file(&segment).unwrap();
        let problems = inspect(dir.path(), &index()).problems;
        assert!(problems[0].contains("missing"), "{problems:?}");
    }
}
