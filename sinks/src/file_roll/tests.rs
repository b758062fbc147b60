use std::time::Duration;

use ferry_core::{Event, Sink, SinkBatch};
use std::io::Write as _;

use super::*;

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
    let dir = tempfile::tempdir().unwrap();
    let mut sink = build(dir.path(), "prefix: app-\nsuffix: .log");
    sink.start(&crate::context()).await.unwrap();
    deliver(&mut sink, &["one", "two"]).await;
    deliver(&mut sink, &["three"]).await;
    let (finished, in_progress) = files(dir.path());
    assert!(finished.is_empty(), "{finished:?}");
    assert_eq!(in_progress.len(), 1);
    let name = in_progress[0].strip_suffix(".tmp").unwrap().to_owned();
    assert!(name.starts_with("app-") && name.ends_with(".log"), "{name}");
    let written = std::fs::read_to_string(dir.path().join(&in_progress[0])).unwrap();
    assert_eq!(
        written, "one\ntwo\nthree\n",
        "delivered batches are in the file"
    );
    sink.stop().await.unwrap();
    let (finished, in_progress) = files(dir.path());
    assert!(in_progress.is_empty());
    assert_eq!(finished, [name]);
    assert_eq!(finished_contents(dir.path()), "one\ntwo\nthree\n");
}

#[tokio::test]
async fn rolls_by_size_without_splitting_batches() {
    let dir = tempfile::tempdir().unwrap();
    let mut sink = build(dir.path(), "roll_size: 10");
    sink.start(&crate::context()).await.unwrap();
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
    let dir = tempfile::tempdir().unwrap();
    let mut sink = build(dir.path(), "roll_size: 8");
    sink.start(&crate::context()).await.unwrap();
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
    let dir = tempfile::tempdir().unwrap();
    let mut sink = build(dir.path(), "roll_interval: 30s");
    sink.start(&crate::context()).await.unwrap();
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
    let dir = tempfile::tempdir().unwrap();
    let mut sink = build(dir.path(), "roll_interval: \"0\"");
    sink.start(&crate::context()).await.unwrap();
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
    let dir = tempfile::tempdir().unwrap();
    let mut sink = build(dir.path(), "serializer: header_and_text");
    sink.start(&crate::context()).await.unwrap();
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
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("0000000000001-0000000001.tmp"), "old\n").unwrap();
    std::fs::write(dir.path().join("unrelated.txt"), "x").unwrap();
    std::fs::write(dir.path().join("someone-elses.tmp"), "x").unwrap();
    let mut sink = build(dir.path(), "");
    sink.start(&crate::context()).await.unwrap();
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
    let dir = tempfile::tempdir().unwrap();
    let nested = dir.path().join("a/b");
    let mut sink = build(&nested, "");
    sink.start(&crate::context()).await.unwrap();
    assert!(nested.is_dir());
    let blocked = dir.path().join("file");
    std::fs::write(&blocked, "").unwrap();
    let mut sink = build(&blocked.join("sub"), "");
    let err = sink.start(&crate::context()).await.unwrap_err();
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

async fn deliver_numbered(sink: &mut FileRollSink, seqs: std::ops::RangeInclusive<u64>) {
    let sequences: Vec<u64> = seqs.collect();
    let events: Vec<Event> = sequences
        .iter()
        .map(|s| Event::from_body(format!("e{s}")))
        .collect();
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
    std::fs::write(out.path().join("9999999999999-0000000001.tmp"), "e2\n").unwrap();
    let mut sink = build(out.path(), "");
    sink.start(&durable_context(state.path())).await.unwrap();
    deliver_numbered(&mut sink, 2..=2).await;
    sink.stop().await.unwrap();
    assert_eq!(all_contents(out.path()), "e1\ne2\n");
}
