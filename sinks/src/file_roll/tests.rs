use std::time::Duration;

use ferry_core::{Event, Sink, SinkBatch};
use std::io::Write as _;

use super::*;
use ferry_core::state::StateStore;
use std::fs::OpenOptions;

fn build(dir: &Path, extra: &str) -> FileRollSink {
    let yaml = format!("directory: {}\n{extra}", dir.display());
    FileRollSink::build(&crate::config("file_roll", &yaml)).unwrap()
}

async fn deliver(sink: &mut FileRollSink, bodies: &[&str]) {
    let events: Vec<Event> = bodies
        .iter()
        .map(|b| Event::from_body(b.to_string()))
        .collect();
    let batch = SinkBatch {
        events: &events,
        sequences: None,
    };
    sink.deliver(batch).await.unwrap();
}

/// File names in the directory, sorted, split into finished and in-progress ones.
fn files(dir: &Path) -> (Vec<String>, Vec<String>) {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names.into_iter().partition(|n| !n.ends_with(".tmp"))
}

/// The finished files' contents, concatenated in name order.
fn finished_contents(dir: &Path) -> String {
    files(dir)
        .0
        .iter()
        .map(|n| std::fs::read_to_string(dir.join(n)).unwrap())
        .collect()
}

#[tokio::test]
async fn writes_in_progress_then_renames_on_stop() {
    let (dir, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut sink = build(dir.path(), "prefix: app-\nsuffix: .log");
    sink.start(&durable_context(state.path())).await.unwrap();
    deliver(&mut sink, &["one", "two"]).await;
    deliver(&mut sink, &["three"]).await;
    let (finished, in_progress) = files(dir.path());
    assert!(finished.is_empty(), "{finished:?}");
    assert_eq!(in_progress.len(), 1);
    let written = std::fs::read_to_string(dir.path().join(&in_progress[0])).unwrap();
    assert_eq!(
        written, "one\ntwo\nthree\n",
        "delivered batches are in the file"
    );
    sink.stop().await.unwrap();
    let (finished, in_progress) = files(dir.path());
    assert!(in_progress.is_empty());
    assert_eq!(finished.len(), 1);
    let name = &finished[0];
    assert!(
        name.starts_with("app-files.") && name.ends_with(".log"),
        "prefix, sink, suffix: {name}"
    );
    assert_eq!(finished_contents(dir.path()), "one\ntwo\nthree\n");
}

#[tokio::test]
async fn rolls_by_size_without_splitting_batches() {
    let (dir, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut sink = build(dir.path(), "roll_size: 10");
    sink.start(&durable_context(state.path())).await.unwrap();
    let mut expected = String::new();
    for i in 0..12 {
        let body = format!("e{i:02}");
        deliver(&mut sink, &[&body]).await;
        expected.push_str(&body);
        expected.push('\n');
    }
    sink.stop().await.unwrap();
    let (finished, in_progress) = files(dir.path());
    assert!(in_progress.is_empty());
    assert_eq!(
        finished.len(),
        6,
        "two 4-byte events per 10-byte file: {finished:?}"
    );
    for name in &finished {
        assert!(std::fs::metadata(dir.path().join(name)).unwrap().len() <= 10);
    }
    assert_eq!(
        finished_contents(dir.path()),
        expected,
        "names sort in write order"
    );
}

#[tokio::test]
async fn a_batch_larger_than_roll_size_gets_a_file_of_its_own() {
    let (dir, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut sink = build(dir.path(), "roll_size: 8");
    sink.start(&durable_context(state.path())).await.unwrap();
    deliver(&mut sink, &["a"]).await;
    deliver(&mut sink, &["bbbb", "cccc", "dddd"]).await;
    deliver(&mut sink, &["e"]).await;
    sink.stop().await.unwrap();
    let (finished, _) = files(dir.path());
    let contents: Vec<String> = finished
        .iter()
        .map(|n| std::fs::read_to_string(dir.path().join(n)).unwrap())
        .collect();
    assert_eq!(contents, ["a\n", "bbbb\ncccc\ndddd\n", "e\n"]);
}

#[tokio::test(start_paused = true)]
async fn rolls_by_time_when_idle_and_before_a_batch() {
    let (dir, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut sink = build(dir.path(), "roll_interval: 30s");
    sink.start(&durable_context(state.path())).await.unwrap();
    deliver(&mut sink, &["first"]).await;
    tokio::time::advance(Duration::from_secs(10)).await;
    sink.idle().await.unwrap();
    assert_eq!(files(dir.path()).0.len(), 0, "not due yet");
    tokio::time::advance(Duration::from_secs(21)).await;
    sink.idle().await.unwrap();
    let (finished, in_progress) = files(dir.path());
    assert_eq!((finished.len(), in_progress.len()), (1, 0));
    sink.idle().await.unwrap();
    assert_eq!(files(dir.path()).0.len(), 1, "no empty files");
    deliver(&mut sink, &["second"]).await;
    tokio::time::advance(Duration::from_secs(31)).await;
    deliver(&mut sink, &["third"]).await;
    sink.stop().await.unwrap();
    let (finished, _) = files(dir.path());
    assert_eq!(finished.len(), 3);
    assert_eq!(finished_contents(dir.path()), "first\nsecond\nthird\n");
}

#[tokio::test(start_paused = true)]
async fn zero_interval_never_rolls_by_time() {
    let (dir, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut sink = build(dir.path(), "roll_interval: \"0\"");
    sink.start(&durable_context(state.path())).await.unwrap();
    deliver(&mut sink, &["a"]).await;
    tokio::time::advance(Duration::from_secs(3600)).await;
    sink.idle().await.unwrap();
    deliver(&mut sink, &["b"]).await;
    assert_eq!(files(dir.path()).1.len(), 1);
    sink.stop().await.unwrap();
    assert_eq!(finished_contents(dir.path()), "a\nb\n");
}

#[tokio::test]
async fn header_and_text_serializer_writes_headers_like_flume() {
    let (dir, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut sink = build(dir.path(), "serializer: header_and_text");
    sink.start(&durable_context(state.path())).await.unwrap();
    let mut event = Event::from_body("body");
    event.headers.insert("host".into(), "web-1".into());
    event.headers.insert("a".into(), "1".into());
    let events = [event, Event::from_body("bare")];
    let batch = SinkBatch {
        events: &events,
        sequences: None,
    };
    sink.deliver(batch).await.unwrap();
    sink.stop().await.unwrap();
    assert_eq!(
        finished_contents(dir.path()),
        "{a=1, host=web-1} body\n{} bare\n"
    );
}

#[tokio::test]
async fn start_finishes_files_left_in_progress() {
    let (dir, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    std::fs::write(dir.path().join("0000000000001-0000000001.tmp"), "old\n").unwrap();
    std::fs::write(dir.path().join("unrelated.txt"), "x").unwrap();
    std::fs::write(dir.path().join("someone-elses.tmp"), "x").unwrap();
    let mut sink = build(dir.path(), "");
    sink.start(&durable_context(state.path())).await.unwrap();
    deliver(&mut sink, &["new"]).await;
    sink.stop().await.unwrap();
    let (finished, in_progress) = files(dir.path());
    assert_eq!(
        in_progress,
        ["someone-elses.tmp"],
        "only our own files are touched"
    );
    assert_eq!(finished.len(), 3, "{finished:?}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("0000000000001-0000000001")).unwrap(),
        "old\n"
    );
}

#[tokio::test]
async fn creates_the_directory_and_reports_where_it_failed() {
    let (dir, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let nested = dir.path().join("a/b");
    let mut sink = build(&nested, "");
    sink.start(&durable_context(state.path())).await.unwrap();
    assert!(nested.is_dir());
    let blocked = dir.path().join("file");
    std::fs::write(&blocked, "").unwrap();
    let mut sink = build(&blocked.join("sub"), "");
    let err = sink
        .start(&durable_context(state.path()))
        .await
        .unwrap_err();
    assert!(err.to_string().starts_with("creating directory "), "{err}");
}

#[test]
fn rejects_bad_options() {
    let bad = |yaml: &str| FileRollSink::build(&crate::config("file_roll", yaml)).is_err();
    assert!(bad("roll_interval: 30s"), "directory is required");
    assert!(bad("directory: /tmp\nroll_size: \"0\""));
    assert!(bad("directory: /tmp\nprefix: a/b"));
    assert!(bad("directory: /tmp\nserializer: avro"));
    assert!(!bad(
        "directory: /tmp\nroll_size: 64MiB\nserializer: text\nsync: false"
    ));
}

/// A sink context with a real state store in `state_dir`.
fn durable_context(state_dir: &Path) -> SinkContext {
    SinkContext {
        name: "files".into(),
        metrics: ferry_core::ComponentMetrics::new("sink", "files"),
        state: Some(StateStore::open(state_dir).unwrap()),
    }
}

/// Events `e<seq>` numbered `seqs`, as a file channel gives them.
fn numbered(seqs: std::ops::RangeInclusive<u64>) -> (Vec<Event>, Vec<u64>) {
    let sequences: Vec<u64> = seqs.collect();
    let events = sequences
        .iter()
        .map(|s| Event::from_body(format!("e{s}")))
        .collect();
    (events, sequences)
}

async fn deliver_numbered(sink: &mut FileRollSink, seqs: std::ops::RangeInclusive<u64>) {
    let (events, sequences) = numbered(seqs);
    sink.deliver(SinkBatch {
        events: &events,
        sequences: Some(&sequences),
    })
    .await
    .unwrap();
}

fn all_contents(dir: &Path) -> String {
    let (finished, in_progress) = files(dir);
    assert!(in_progress.is_empty(), "left in progress: {in_progress:?}");
    finished
        .iter()
        .map(|n| std::fs::read_to_string(dir.join(n)).unwrap())
        .collect()
}

#[tokio::test]
async fn a_batch_redelivered_after_a_crash_is_not_written_twice() {
    let (out, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut sink = build(out.path(), "");
    sink.start(&durable_context(state.path())).await.unwrap();
    deliver_numbered(&mut sink, 1..=2).await;
    deliver_numbered(&mut sink, 3..=4).await;
    drop(sink); // crash: the take of 3..=4 was never committed
    let mut sink = build(out.path(), "");
    sink.start(&durable_context(state.path())).await.unwrap();
    deliver_numbered(&mut sink, 3..=5).await; // the channel gives 3 and 4 again
    sink.stop().await.unwrap();
    assert_eq!(all_contents(out.path()), "e1\ne2\ne3\ne4\ne5\n");
}

async fn send_numbered(sink: &mut FileRollSink, seqs: std::ops::RangeInclusive<u64>) {
    let (events, sequences) = numbered(seqs);
    sink.send(SinkBatch {
        events: &events,
        sequences: Some(&sequences),
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn batches_sent_but_not_flushed_are_cut_off_and_flushed_ones_skipped_at_start() {
    let (out, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut sink = build(out.path(), "");
    sink.start(&durable_context(state.path())).await.unwrap();
    send_numbered(&mut sink, 1..=2).await;
    send_numbered(&mut sink, 3..=4).await;
    sink.flush().await.unwrap();
    // Another sink of the channel took 5..=6; this one goes on with 7..=8, not flushed.
    send_numbered(&mut sink, 7..=8).await;
    let (_, in_progress) = files(out.path());
    let written = std::fs::read_to_string(out.path().join(&in_progress[0])).unwrap();
    assert_eq!(
        written,
        "e1
e2
e3
e4
e7
e8
",
        "sent batches reach the file"
    );
    drop(sink); // crash: no take was committed; 7..=8 was never acknowledged
    let mut sink = build(out.path(), "");
    sink.start(&durable_context(state.path())).await.unwrap();
    // The channel gives every take again, with 5..=6 the other sink gave back.
    deliver_numbered(&mut sink, 1..=8).await;
    sink.stop().await.unwrap();
    assert_eq!(
        all_contents(out.path()),
        "e1\ne2\ne3\ne4\ne5\ne6\ne7\ne8\n",
        "what was flushed is skipped, what was not is written once, and the other sink's events between them are not skipped"
    );
}

#[tokio::test]
async fn a_roll_between_flushes_records_every_batch_sent_before_it() {
    let (out, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut sink = build(out.path(), "roll_count: 3");
    sink.start(&durable_context(state.path())).await.unwrap();
    send_numbered(&mut sink, 1..=1).await;
    send_numbered(&mut sink, 2..=2).await;
    send_numbered(&mut sink, 3..=4).await; // rolls: 1 and 2 are synced and recorded first
    drop(sink); // crash before the runner's flush: none of the three takes committed
    let (finished, _) = files(out.path());
    assert_eq!(finished.len(), 0, "not yet moved into place: {finished:?}");
    let mut sink = build(out.path(), "");
    sink.start(&durable_context(state.path())).await.unwrap();
    deliver_numbered(&mut sink, 1..=4).await;
    sink.stop().await.unwrap();
    assert_eq!(all_contents(out.path()), "e1\ne2\ne3\ne4\n");
}

#[tokio::test]
async fn bytes_written_but_not_recorded_are_cut_off_at_start() {
    let (out, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut sink = build(out.path(), "");
    sink.start(&durable_context(state.path())).await.unwrap();
    deliver_numbered(&mut sink, 1..=2).await;
    drop(sink);
    // The crash came after the next batch reached the file but before it was recorded.
    let (_, in_progress) = files(out.path());
    let tmp = out.path().join(&in_progress[0]);
    let mut file = OpenOptions::new().append(true).open(&tmp).unwrap();
    file.write_all(b"e3\ne4").unwrap();
    drop(file);
    let mut sink = build(out.path(), "");
    sink.start(&durable_context(state.path())).await.unwrap();
    deliver_numbered(&mut sink, 3..=4).await;
    sink.stop().await.unwrap();
    assert_eq!(all_contents(out.path()), "e1\ne2\ne3\ne4\n");
}

#[tokio::test]
async fn files_holding_only_unrecorded_bytes_are_removed_at_start() {
    let (out, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut sink = build(out.path(), "roll_size: 3");
    sink.start(&durable_context(state.path())).await.unwrap();
    deliver_numbered(&mut sink, 1..=1).await; // fills and finishes the first file
    drop(sink);
    // A crash right after a new file got its first, unrecorded batch.
    std::fs::write(
        out.path().join("files.00000000000000000099.stage.tmp"),
        "e2\n",
    )
    .unwrap();
    let mut sink = build(out.path(), "");
    sink.start(&durable_context(state.path())).await.unwrap();
    deliver_numbered(&mut sink, 2..=2).await;
    sink.stop().await.unwrap();
    assert_eq!(all_contents(out.path()), "e1\ne2\n");
}

fn event_at(day: &str, host: &str, body: &str) -> Event {
    let millis = format!("{day}T12:00:00Z")
        .parse::<jiff::Timestamp>()
        .unwrap()
        .as_millisecond();
    let mut event = Event::from_body(body.to_owned());
    event.headers.set("timestamp", millis.to_string());
    event.headers.insert("host".into(), host.into());
    event
}

/// Every file under `dir` (recursively), by path relative to it, hidden files left out.
fn tree(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(at) = pending.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if !path.file_name().unwrap().to_string_lossy().starts_with('.') {
                found.push(path.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    found.sort();
    found
}

#[tokio::test]
async fn path_escapes_make_directories_and_json_gzip_reads_back() {
    use std::io::Read as _;
    let (dir, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut sink = build(
        dir.path(),
        "path: \"%Y-%m-%d/%{host}\"\ntime_zone: UTC\nformat: json\ncompression: gzip\nprefix: \"%H-\"",
    );
    sink.start(&durable_context(state.path())).await.unwrap();
    let events = [
        event_at("2026-12-01", "web-1", "a"),
        event_at("2026-12-02", "web-1", "b"),
        event_at("2026-12-01", "web-2", "c"),
        event_at("2026-12-01", "web-1", "d"),
    ];
    let sequences = [1, 2, 3, 4];
    sink.deliver(SinkBatch {
        events: &events,
        sequences: Some(&sequences),
    })
    .await
    .unwrap();
    sink.stop().await.unwrap();
    let files = tree(dir.path());
    assert_eq!(
        files,
        [
            "2026-12-01/web-1/12-files.00000000000000000001-00000000000000000004.jsonl.gz",
            "2026-12-01/web-2/12-files.00000000000000000003-00000000000000000003.jsonl.gz",
            "2026-12-02/web-1/12-files.00000000000000000002-00000000000000000002.jsonl.gz",
        ]
    );
    let mut text = String::new();
    flate2::read::MultiGzDecoder::new(File::open(dir.path().join(&files[0])).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    let bodies: Vec<String> = text
        .lines()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(value["headers"]["host"], "web-1", "{line}");
            value["body"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(bodies, ["a", "d"]);
}

#[tokio::test]
async fn an_earlier_versions_file_in_progress_is_cut_back_and_finished_at_the_upgrade() {
    let (out, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let store = StateStore::open(state.path()).unwrap();
    // The earlier version recorded e1 in this file, then wrote e2 and crashed.
    store
        .save_progress(
            "files",
            br#"{"file":"0000000000001-0000000001","length":3,"delivered":[1,1]}"#,
        )
        .unwrap();
    drop(store);
    std::fs::write(out.path().join("0000000000001-0000000001.tmp"), "e1\ne2\n").unwrap();
    std::fs::write(out.path().join("0000000000001-0000000002.tmp"), "e9\n").unwrap();
    let mut sink = build(out.path(), "");
    sink.start(&durable_context(state.path())).await.unwrap();
    deliver_numbered(&mut sink, 1..=2).await; // the take of e1 was not committed either
    sink.stop().await.unwrap();
    assert_eq!(all_contents(out.path()), "e1\ne2\n");
}

#[tokio::test]
async fn a_file_moved_into_place_before_a_crash_is_not_moved_again() {
    let (out, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut sink = build(out.path(), "roll_count: 2");
    sink.start(&durable_context(state.path())).await.unwrap();
    deliver_numbered(&mut sink, 1..=2).await;
    deliver_numbered(&mut sink, 3..=3).await;
    let progress = Arc::clone(&sink.running.as_ref().unwrap().progress);
    drop(sink);
    // As if the crash came after the rename of the first file but before its record went:
    // the record lists it as finished again.
    let (published, _) = files(out.path());
    assert_eq!(published.len(), 1);
    let staged = Staging::beside(out.path().to_owned(), "files", true);
    std::fs::copy(out.path().join(&published[0]), staged.stage(7)).unwrap();
    progress
        .update(|p| {
            p.finished.push(crate::roll::FinishedRecord {
                id: 7,
                key: published[0].clone(),
                length: 6,
                events: 2,
                upload_id: None,
            })
        })
        .unwrap();
    drop(progress);
    let mut sink = build(out.path(), "roll_count: 2");
    sink.start(&durable_context(state.path())).await.unwrap();
    deliver_numbered(&mut sink, 3..=4).await;
    sink.stop().await.unwrap();
    assert_eq!(all_contents(out.path()), "e1\ne2\ne3\ne4\n");
    assert!(!staged.stage(7).exists(), "its staging copy is removed");
}
