//! Behaviour of the spooldir source on real files in temporary directories, driven through a
//! real `SourceContext` into the test channel.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ferry_core::{
    Channel, Checkpoint, CheckpointStore, MemoryCheckpointStore, Shutdown, Source, SourceError,
};
use tokio::task::JoinHandle;

use super::checkpoint::{Current, SpoolState};
use super::*;
use crate::file_id::{FileKey, Fingerprint};
use ferry_core::test_support::{TestChannel, config, context_with};

struct Running {
    channel: Arc<TestChannel>,
    shutdown: Shutdown,
    task: JoinHandle<Result<(), SourceError>>,
}

impl Running {
    async fn stop(self) -> Option<Checkpoint> {
        self.shutdown.trigger();
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("the source stops promptly on shutdown")
            .expect("the source task does not panic")
            .expect("the source ends without error");
        self.channel.checkpoint()
    }
}

fn build(yaml: &str) -> Box<SpooldirSource> {
    Box::new(SpooldirSource::build(&config("spooldir", yaml)).unwrap())
}

fn start_on(channel: Arc<TestChannel>, yaml: &str, checkpoint: Option<Checkpoint>) -> Running {
    let store = Arc::new(MemoryCheckpointStore::default());
    if let Some(checkpoint) = checkpoint {
        store.save("test", &checkpoint).unwrap();
    }
    let (ctx, shutdown) = context_with(&channel, "test", store);
    let task = tokio::spawn(build(yaml).run(ctx));
    Running {
        channel,
        shutdown,
        task,
    }
}

/// Starts a source on a channel that is not durable, with checkpoints saved in `store` once
/// delivered (never, with the test channel, but for batches with no events).
fn start_volatile(yaml: &str, store: Arc<MemoryCheckpointStore>) -> Running {
    let channel = TestChannel::volatile(1_000_000, 10_000);
    let (ctx, shutdown) = context_with(&channel, "test", store);
    let task = tokio::spawn(build(yaml).run(ctx));
    Running {
        channel,
        shutdown,
        task,
    }
}

fn start(yaml: &str, checkpoint: Option<Checkpoint>) -> Running {
    start_on(TestChannel::new(1_000_000, 10_000), yaml, checkpoint)
}

fn options(dir: &Path, extra: &str) -> String {
    format!("spool_dir: '{}'\npoll_delay: 20ms\n{extra}", dir.display())
}

/// Writes a file whose modification time is `age` seconds in the past.
fn spool(dir: &Path, name: &str, text: &str, age: u64) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    let file = std::fs::File::options().write(true).open(&path).unwrap();
    file.set_modified(SystemTime::now() - Duration::from_secs(age))
        .unwrap();
    path
}

/// Waits (at most 10 s) for `condition`.
async fn until(what: &str, mut condition: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if condition() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting until {what}");
}

/// The state of a source reading `file` (as it is now, whole) up to `offset`.
fn reading(file: &Path, offset: u64) -> SpoolState {
    let handle = std::fs::File::open(file).unwrap();
    let metadata = handle.metadata().unwrap();
    SpoolState {
        current: Some(Current {
            path: file.to_owned(),
            key: FileKey::of(&metadata),
            fingerprint: Fingerprint::of(&handle, metadata.len()).unwrap(),
            offset,
        }),
        failed: Vec::new(),
        mark: None,
    }
}

fn exists(path: &Path) -> bool {
    path.exists()
}

fn completed(path: &Path) -> PathBuf {
    reader::completed_path(path, ".COMPLETED")
}

#[tokio::test]
async fn renames_completed_files() {
    let dir = tempfile::tempdir().unwrap();
    let a = spool(dir.path(), "a.csv", "a1\na2\n", 20);
    let b = spool(dir.path(), "b.csv", "b1\r\nb2\nb3", 10);
    let c = spool(dir.path(), "c.csv", "long line\n", 5);
    let running = start(
        &options(
            dir.path(),
            "batch_size: 2\nfile_header: true\nbasename_header: true\nmax_line_length: 4",
        ),
        None,
    );
    until("the files are completed", || {
        [&a, &b, &c].iter().all(|f| exists(&completed(f)))
    })
    .await;
    assert!(!exists(&a) && !exists(&b) && !exists(&c));
    assert_eq!(
        running.channel.bodies(),
        ["a1", "a2", "b1", "b2", "b3", "long", " lin", "e"]
    );
    let events = running.channel.events();
    assert_eq!(events[2].headers.value("file"), Some(b.to_str().unwrap()));
    assert_eq!(events[2].headers.value("basename"), Some("b.csv"));
    // The start mark alone; a: one full batch; b: a batch of 2 and one of 1; c: 2 and 1.
    assert_eq!(running.channel.batches(), 6);
    let state = SpoolState::decode(&running.stop().await.unwrap()).unwrap();
    let current = state.current.unwrap();
    assert_eq!((current.path, current.offset), (c, 10), "the whole file");
}

#[tokio::test]
async fn resumes_partly_read_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = spool(dir.path(), "data.txt", "1\n2\n3\n4\n5\n", 0);
    let yaml = options(dir.path(), "batch_size: 2");
    // Room for one batch only: the source waits in its second put, and dies there.
    let first = start_on(TestChannel::new(2, 10), &yaml, None);
    until("the first batch is put", || first.channel.len() == 2).await;
    first.task.abort();
    let checkpoint = first.channel.checkpoint();
    assert!(
        exists(&file),
        "not completed before all its events were put"
    );
    let second = start(&yaml, checkpoint);
    until("the file is completed", || exists(&completed(&file))).await;
    assert_eq!(second.channel.bodies(), ["3", "4", "5"]);
    second.stop().await;
}

#[tokio::test]
async fn resumes_from_the_completed_name_when_stopped_right_after_completing() {
    let dir = tempfile::tempdir().unwrap();
    let file = spool(dir.path(), "data.txt", "1\n2\n3\n", 0);
    let state = reading(&file, 2);
    // Completed, but with a memory channel the last batch was not delivered yet.
    std::fs::rename(&file, completed(&file)).unwrap();
    let running = start(&options(dir.path(), ""), Some(state.encode()));
    until("the rest is sent", || running.channel.len() == 2).await;
    assert_eq!(running.channel.bodies(), ["2", "3"]);
    spool(dir.path(), "next.txt", "n\n", 0);
    until("the next file is read", || running.channel.len() == 3).await;
    assert!(exists(&completed(&file)) && !exists(&file));
    running.stop().await;
}

#[tokio::test]
async fn a_completion_stopped_between_its_link_and_its_removal_is_finished_on_resume() {
    let dir = tempfile::tempdir().unwrap();
    let file = spool(dir.path(), "data.txt", "1\n2\n3\n", 0);
    let state = reading(&file, 6);
    // Every event was sent and the completed name linked; the agent died before removing the
    // old name, and its checkpoint still names the file at its end.
    std::fs::hard_link(&file, completed(&file)).unwrap();
    let running = start(&options(dir.path(), ""), Some(state.encode()));
    until("the old name is removed", || !exists(&file)).await;
    assert!(exists(&completed(&file)));
    spool(dir.path(), "next.txt", "n\n", 0);
    until("the next file is read", || running.channel.len() == 1).await;
    assert_eq!(running.channel.bodies(), ["n"]);
    let checkpoint = running.stop().await.unwrap();
    let state = SpoolState::decode(&checkpoint).unwrap();
    assert!(state.failed.is_empty(), "nothing reported as failed");
}

#[tokio::test]
async fn with_a_memory_channel_files_completed_after_the_saved_checkpoint_are_read_again() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old.csv.COMPLETED");
    std::fs::write(&old, "delivered long ago\n").unwrap();
    let first = spool(dir.path(), "first.csv", "1\n2\n", 20);
    let second = spool(dir.path(), "second.csv", "3\n", 10);
    let yaml = options(dir.path(), "");
    let store = Arc::new(MemoryCheckpointStore::default());
    let running = start_volatile(&yaml, store.clone());
    until("both files are completed", || {
        exists(&completed(&first)) && exists(&completed(&second))
    })
    .await;
    assert_eq!(running.channel.bodies(), ["1", "2", "3"]);
    // The agent dies before the sinks delivered anything.
    running.task.abort();
    let saved = store.load("test").unwrap();
    assert!(saved.is_some(), "the start mark is saved at once");
    let store = Arc::new(MemoryCheckpointStore::default());
    store.save("test", &saved.unwrap()).unwrap();
    let running = start_volatile(&yaml, store);
    until("the events are sent again", || running.channel.len() >= 3).await;
    let third = spool(dir.path(), "third.csv", "4\n", 0);
    until("the next file is completed", || exists(&completed(&third))).await;
    assert_eq!(
        running.channel.bodies(),
        ["1", "2", "3", "4"],
        "the undelivered files again, in order, and not the file completed before"
    );
    running.stop().await;
    assert!(exists(&old));
    assert!(!exists(&first) && !exists(&second));
}

#[tokio::test]
async fn reused_name_is_reported_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let reused = dir.path().join("day.log");
    std::fs::write(completed(&reused), "from yesterday\n").unwrap();
    spool(dir.path(), "day.log", "from today\n", 20);
    let other = spool(dir.path(), "other.log", "other\n", 10);
    let yaml = options(dir.path(), "");
    let running = start(&yaml, None);
    until("the other file is completed", || exists(&completed(&other))).await;
    assert_eq!(running.channel.bodies(), ["other"]);
    assert!(
        exists(&reused),
        "the file with the reused name is left in place"
    );
    assert!(!running.task.is_finished(), "the source keeps running");
    let checkpoint = running.stop().await.unwrap();
    let state = SpoolState::decode(&checkpoint).unwrap();
    assert_eq!(state.failed.len(), 1);
    assert_eq!(state.failed[0].path, reused);
    // After a restart it is still left alone, while new files are read.
    let running = start(&yaml, Some(checkpoint));
    let late = spool(dir.path(), "late.log", "late\n", 0);
    until("the late file is completed", || exists(&completed(&late))).await;
    assert_eq!(running.channel.bodies(), ["late"]);
    running.stop().await;
}

#[tokio::test]
async fn file_modified_while_read_is_reported_and_left_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let growing = spool(dir.path(), "growing.txt", "1\n2\n3\n", 20);
    let yaml = options(dir.path(), "batch_size: 1");
    let channel = TestChannel::new(1, 10);
    let running = start_on(channel.clone(), &yaml, None);
    until("the first line is put", || channel.len() == 1).await;
    std::fs::OpenOptions::new()
        .append(true)
        .open(&growing)
        .unwrap()
        .write_all_at_end(b"4\n");
    let mut bodies = Vec::new();
    until("the file is reported", || {
        bodies.extend(channel.drain().into_iter().map(|e| e.body));
        channel
            .checkpoint()
            .is_some_and(|c| !SpoolState::decode(&c).unwrap().failed.is_empty())
    })
    .await;
    let checkpoint = running.stop().await.unwrap();
    bodies.extend(channel.drain().into_iter().map(|e| e.body));
    assert_eq!(bodies, ["1", "2", "3", "4"]);
    assert!(exists(&growing) && !exists(&completed(&growing)));
    let state = SpoolState::decode(&checkpoint).unwrap();
    assert_eq!(state.failed.len(), 1);
    assert_eq!(state.failed[0].path, growing);
    // After a restart it is left alone (not resumed), even though it grew again; the source
    // goes on with other files.
    std::fs::OpenOptions::new()
        .append(true)
        .open(&growing)
        .unwrap()
        .write_all_at_end(b"5\n");
    let running = start(&yaml, Some(checkpoint));
    let next = spool(dir.path(), "next.txt", "next\n", 0);
    until("the next file is completed", || exists(&completed(&next))).await;
    assert_eq!(running.channel.bodies(), ["next"]);
    assert!(exists(&growing) && !exists(&completed(&growing)));
    running.stop().await;
}

trait AppendAll {
    fn write_all_at_end(self, data: &[u8]);
}

impl AppendAll for std::fs::File {
    fn write_all_at_end(mut self, data: &[u8]) {
        std::io::Write::write_all(&mut self, data).unwrap();
    }
}

#[tokio::test]
async fn delete_policy_immediate_deletes_and_patterns_choose_files() {
    let dir = tempfile::tempdir().unwrap();
    let wanted = spool(dir.path(), "wanted.csv", "w\n", 30);
    let ignored = spool(dir.path(), "ignored.tmp.csv", "i\n", 20);
    let excluded = spool(dir.path(), "excluded.txt", "e\n", 20);
    let hidden = spool(dir.path(), ".hidden.csv", "h\n", 20);
    let empty = spool(dir.path(), "empty.csv", "", 10);
    let running = start(
        &options(
            dir.path(),
            "delete_policy: immediate\ninclude_pattern: '\\.csv$'\nignore_pattern: '\\.tmp\\.'",
        ),
        None,
    );
    until("the wanted files are deleted", || {
        !exists(&wanted) && !exists(&empty)
    })
    .await;
    assert_eq!(running.channel.bodies(), ["w"]);
    assert!(exists(&ignored) && exists(&excluded) && exists(&hidden));
    assert!(!exists(&completed(&wanted)));
    running.stop().await;
}

#[tokio::test]
async fn consume_order_youngest_reads_the_newest_first() {
    let dir = tempfile::tempdir().unwrap();
    spool(dir.path(), "old.txt", "old\n", 30);
    spool(dir.path(), "new.txt", "new\n", 10);
    spool(dir.path(), "mid.txt", "mid\n", 20);
    let running = start(&options(dir.path(), "consume_order: youngest"), None);
    until("all files are read", || running.channel.len() == 3).await;
    assert_eq!(running.channel.bodies(), ["new", "mid", "old"]);
    running.stop().await;
}

#[tokio::test]
async fn a_missing_directory_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let channel = TestChannel::new(10, 10);
    let running = start_on(channel, &options(&missing, ""), None);
    let error = running.task.await.unwrap().unwrap_err();
    assert!(
        error.to_string().contains(&missing.display().to_string()),
        "{error}"
    );
}

#[test]
fn options_are_checked_and_default_to_flume() {
    let source = build("spool_dir: /tmp/x");
    let options = &source.config;
    assert_eq!(options.file_suffix, ".COMPLETED");
    assert_eq!(options.delete_policy, DeletePolicy::Never);
    assert_eq!(options.consume_order, ConsumeOrder::Oldest);
    assert_eq!(options.batch_size, 100);
    assert_eq!(options.poll_delay, Duration::from_millis(500));
    assert_eq!(options.max_line_length.bytes(), 1024 * 1024);
    assert_eq!(
        (
            options.file_header_key.as_str(),
            options.basename_header_key.as_str()
        ),
        ("file", "basename")
    );
    let bad = |yaml: &str| SpooldirSource::build(&config("spooldir", yaml)).unwrap_err();
    assert!(
        bad("spool_dir: x\nignore_pattern: '('")
            .message
            .contains("invalid regular expression")
    );
    assert!(
        bad("spool_dir: x\nconsume_order: newest")
            .message
            .contains("consume_order")
    );
    assert!(
        bad("spool_dir: x\nfile_suffix: ''")
            .message
            .contains("empty")
    );
    assert!(bad("spoolDir: x").message.contains("spool_dir"));
}
