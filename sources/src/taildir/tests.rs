//! Behaviour of the taildir source on real files in temporary directories, driven through a
//! real `SourceContext` into the test channel.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ferry_core::{
    Channel, Checkpoint, CheckpointStore, MemoryCheckpointStore, Shutdown, Source, SourceError,
};
use tokio::task::JoinHandle;

use super::checkpoint::{Position, decode, encode};
use super::*;
use crate::file_id::{FileKey, Fingerprint};
use ferry_core::test_support::{TestChannel, config, context_with};

struct Running {
    channel: Arc<TestChannel>,
    shutdown: Shutdown,
    task: JoinHandle<Result<(), SourceError>>,
}

impl Running {
    /// Stops the source and returns the last checkpoint it sent.
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

fn build(yaml: &str) -> Box<TaildirSource> {
    Box::new(TaildirSource::build(&config("taildir", yaml)).unwrap())
}

/// Starts a source with `yaml` options, resuming from `checkpoint`.
fn start(yaml: &str, checkpoint: Option<Checkpoint>) -> Running {
    start_on(TestChannel::new(1_000_000, 10_000), yaml, checkpoint)
}

/// Starts a source writing into `channel`.
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

/// Options tailing `dir/*.log`, with fast polling for tests.
fn options(dir: &Path, extra: &str) -> String {
    format!(
        "filegroups: {{ logs: '{}/*.log' }}\npoll_interval: 50ms\n{extra}",
        dir.display()
    )
}

/// Waits (at most 10 s) until the channel holds at least `n` events; returns their bodies.
async fn wait_for(channel: &TestChannel, n: usize) -> Vec<String> {
    for _ in 0..1000 {
        if channel.len() >= n {
            return channel.bodies();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "expected {n} events, the channel holds {:?}",
        channel.bodies()
    );
}

/// Whether this process has `path` open.
fn is_open(path: &Path) -> bool {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target == path))
}

/// Waits (at most 10 s) until this process has `path` open (`true`) or closed (`false`).
async fn wait_until_open_is(path: &Path, open: bool) {
    for _ in 0..1000 {
        if is_open(path) == open {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{} never became open={open}", path.display());
}

/// Waits (at most 10 s) until this process has `path` open: the source found it.
async fn wait_until_open(path: &Path) {
    wait_until_open_is(path, true).await;
}

fn append(path: &Path, text: &[u8]) {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    file.write_all(text).unwrap();
}

/// Offsets by path in a checkpoint.
fn offsets(checkpoint: &Checkpoint) -> BTreeMap<String, u64> {
    decode(checkpoint)
        .unwrap()
        .into_iter()
        .map(|p| (p.path.display().to_string(), p.offset))
        .collect()
}

#[tokio::test]
async fn reads_lines_with_headers_and_follows_appends() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("app.log");
    append(&log, b"one\r\ntwo\n");
    std::fs::write(dir.path().join("other.txt"), "not matched\n").unwrap();
    let running = start(
        &options(
            dir.path(),
            "file_header: true\nbyte_offset_header: true\nheaders: { logs: { topic: app } }",
        ),
        None,
    );
    wait_for(&running.channel, 2).await;
    append(&log, b"three\n");
    assert_eq!(wait_for(&running.channel, 3).await, ["one", "two", "three"]);
    let events = running.channel.events();
    let path = log.display().to_string();
    let expected_offsets = ["0", "5", "9"];
    for (event, offset) in events.iter().zip(expected_offsets) {
        assert_eq!(event.headers.value("file"), Some(path.as_str()));
        assert_eq!(event.headers.value("topic"), Some("app"));
        assert_eq!(event.headers.value("byteoffset"), Some(offset));
    }
    let checkpoint = running.stop().await.unwrap();
    assert_eq!(offsets(&checkpoint), BTreeMap::from([(path, 15)]));
}

#[tokio::test]
async fn resumes_after_restart_from_checkpoint_without_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.log");
    let b = dir.path().join("b.log");
    append(&a, b"a1\na2\n");
    append(&b, b"b1\n");
    let yaml = options(dir.path(), "batch_size: 2");
    let first = start(&yaml, None);
    wait_for(&first.channel, 3).await;
    let checkpoint = first.stop().await.unwrap();
    // Written while the agent is down.
    append(&a, b"a3\n");
    append(&b, b"b2\nb3\n");
    let second = start(&yaml, Some(checkpoint));
    let mut bodies = wait_for(&second.channel, 3).await;
    let checkpoint = second.stop().await.unwrap();
    bodies.sort();
    assert_eq!(bodies, ["a3", "b2", "b3"], "only what was not sent before");
    // Nothing new: a third run sends nothing.
    let third = start(&yaml, Some(checkpoint));
    append(&dir.path().join("c.log"), b"c1\n");
    assert_eq!(wait_for(&third.channel, 1).await, ["c1"]);
    third.stop().await;
}

#[tokio::test]
async fn batches_are_capped_and_each_checkpoint_covers_only_sent_lines() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("app.log");
    let text: String = (0..250).map(|i| format!("line {i}\n")).collect();
    append(&log, text.as_bytes());
    let running = start(&options(dir.path(), "batch_size: 100"), None);
    let bodies = wait_for(&running.channel, 250).await;
    let expected: Vec<String> = (0..250).map(|i| format!("line {i}")).collect();
    assert_eq!(bodies, expected);
    assert_eq!(running.channel.batches(), 3, "100, 100 and 50 lines");
    let checkpoint = running.stop().await.unwrap();
    assert_eq!(
        offsets(&checkpoint).values().copied().collect::<Vec<_>>(),
        [text.len() as u64]
    );
}

#[tokio::test]
async fn follows_rename_rotation_to_the_end_then_the_new_file() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("app.log");
    append(&log, b"1\n2\n");
    let running = start(&options(dir.path(), "idle_timeout: 200ms"), None);
    wait_for(&running.channel, 2).await;
    // The application keeps its handle across the rename, as a logger does until it reopens.
    let mut writer = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    writer.write_all(b"3\n").unwrap();
    std::fs::rename(&log, dir.path().join("app.log.1")).unwrap();
    writer.write_all(b"4\n").unwrap();
    append(&log, b"5\n6\n");
    let bodies = wait_for(&running.channel, 6).await;
    let position = |line: &str| bodies.iter().position(|b| b == line).unwrap();
    let mut sorted = bodies.clone();
    sorted.sort();
    assert_eq!(sorted, ["1", "2", "3", "4", "5", "6"], "{bodies:?}");
    assert!(position("3") < position("4") && position("5") < position("6"));
    // Once idle, the rotated file is released: later checkpoints hold only the new file.
    for i in 0..500 {
        append(&log, format!("more {i}\n").as_bytes());
        tokio::time::sleep(Duration::from_millis(20)).await;
        let checkpoint = running.channel.checkpoint().unwrap();
        if offsets(&checkpoint).len() == 1 {
            running.stop().await;
            return;
        }
    }
    panic!("the rotated file was never released");
}

#[tokio::test]
async fn rotated_while_stopped_is_read_to_its_end_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("app.log");
    append(&log, b"1\n");
    let yaml = format!(
        "filegroups: {{ a_other: '{0}/*.txt', logs: '{0}/*.log' }}\n\
         headers: {{ logs: {{ kind: log }} }}\npoll_interval: 50ms",
        dir.path().display()
    );
    let first = start(&yaml, None);
    wait_for(&first.channel, 1).await;
    let checkpoint = first.stop().await;
    append(&log, b"2\n");
    std::fs::rename(&log, dir.path().join("app.log.1")).unwrap();
    append(&log, b"3\n");
    let second = start(&yaml, checkpoint);
    let mut bodies = wait_for(&second.channel, 2).await;
    let events = second.channel.events();
    assert!(
        events
            .iter()
            .all(|e| e.headers.value("kind") == Some("log")),
        "the rotated file keeps the headers of its group: {events:?}"
    );
    second.stop().await;
    bodies.sort();
    assert_eq!(bodies, ["2", "3"]);
}

#[tokio::test]
async fn copytruncate_restarts_at_zero() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("app.log");
    append(&log, b"first 1\nfirst 2\nfirst 3\n");
    let running = start(&options(dir.path(), ""), None);
    wait_for(&running.channel, 3).await;
    std::fs::copy(&log, dir.path().join("app.log.1")).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&log)
        .unwrap()
        .set_len(0)
        .unwrap();
    append(&log, b"second 1\n");
    let bodies = wait_for(&running.channel, 4).await;
    assert_eq!(bodies, ["first 1", "first 2", "first 3", "second 1"]);
    let checkpoint = running.stop().await.unwrap();
    assert_eq!(
        offsets(&checkpoint).values().copied().collect::<Vec<_>>(),
        [9]
    );
}

#[tokio::test]
async fn content_rewritten_in_place_beyond_the_offset_is_read_from_zero() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("app.log");
    append(&log, b"old\n");
    let running = start(&options(dir.path(), ""), None);
    wait_for(&running.channel, 1).await;
    // Truncated and refilled past the old offset before the source looks again.
    let mut file = std::fs::OpenOptions::new().write(true).open(&log).unwrap();
    file.write_all(b"new 1\nnew 2\n").unwrap();
    drop(file);
    assert_eq!(
        wait_for(&running.channel, 3).await,
        ["old", "new 1", "new 2"]
    );
    running.stop().await;
}

#[tokio::test]
async fn reused_inode_with_different_content_is_a_new_file() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("app.log");
    append(&log, b"new file line 1\nnew file line 2\n");
    let metadata = std::fs::metadata(&log).unwrap();
    // A position saved for a deleted file whose inode the new file got.
    let old = Position {
        key: FileKey::of(&metadata),
        fingerprint: Fingerprint {
            len: 16,
            crc: crc32c::crc32c(b"old file line 1\n"),
        },
        offset: 16,
        path: log.clone(),
    };
    let running = start(&options(dir.path(), ""), Some(encode([&old].into_iter())));
    assert_eq!(
        wait_for(&running.channel, 2).await,
        ["new file line 1", "new file line 2"]
    );
    running.stop().await;
    // The same position with the right fingerprint resumes after the first line.
    let same = Position {
        fingerprint: Fingerprint {
            len: 16,
            crc: crc32c::crc32c(b"new file line 1\n"),
        },
        ..old
    };
    let running = start(&options(dir.path(), ""), Some(encode([&same].into_iter())));
    assert_eq!(wait_for(&running.channel, 1).await, ["new file line 2"]);
    running.stop().await;
}

#[tokio::test]
async fn partial_line_waits_for_newline() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("app.log");
    append(&log, b"a\nb");
    let running = start(&options(dir.path(), ""), None);
    assert_eq!(wait_for(&running.channel, 1).await, ["a"]);
    // A round that reads another file has looked at this one too.
    append(&dir.path().join("other.log"), b"c\n");
    assert_eq!(wait_for(&running.channel, 2).await, ["a", "c"]);
    let checkpoint = running.channel.checkpoint().unwrap();
    assert_eq!(
        offsets(&checkpoint).get(&log.display().to_string()),
        Some(&2),
        "the held partial line is not covered by the checkpoint"
    );
    append(&log, b"b\n");
    assert_eq!(wait_for(&running.channel, 3).await, ["a", "c", "bb"]);
    running.stop().await;
}

#[tokio::test]
async fn partial_line_is_sent_after_partial_line_flush() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("app.log");
    append(&log, b"a\nno newline");
    let running = start(&options(dir.path(), "partial_line_flush: 100ms"), None);
    assert_eq!(wait_for(&running.channel, 2).await, ["a", "no newline"]);
    append(&log, b" rest\n");
    assert_eq!(
        wait_for(&running.channel, 3).await,
        ["a", "no newline", " rest"]
    );
    running.stop().await;
}

const STACK_TRACE: &[u8] = b"2024-01-01 ERROR boom\n\
java.lang.IllegalStateException: bad\n\
\tat com.example.A.run(A.java:10)\n\
\tat com.example.B.main(B.java:5)\n\
Caused by: java.io.IOException: disk\n\
\t... 2 more\n\
2024-01-01 INFO fine\n";

#[tokio::test]
async fn multiline_joins_stack_traces() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("app.log");
    append(&log, STACK_TRACE);
    let running = start(
        &options(
            dir.path(),
            "multiline: { start_pattern: '^\\d{4}-\\d{2}-\\d{2} ', timeout: 100ms }\nbyte_offset_header: true",
        ),
        None,
    );
    let bodies = wait_for(&running.channel, 2).await;
    let text = String::from_utf8_lossy(STACK_TRACE);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(bodies, [lines[..6].join("\n"), lines[6].to_string()]);
    let events = running.channel.events();
    let second_offset = STACK_TRACE.len() - lines[6].len() - 1;
    assert_eq!(
        events[1].headers.value("byteoffset"),
        Some(second_offset.to_string().as_str())
    );
    let checkpoint = running.stop().await.unwrap();
    assert_eq!(
        offsets(&checkpoint).values().copied().collect::<Vec<_>>(),
        [STACK_TRACE.len() as u64]
    );
}

#[tokio::test]
async fn multiline_event_being_joined_is_not_in_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("app.log");
    append(&log, b"first\n  more\nsecond\n  more 2\n");
    // No timeout within the test: the second event stays open.
    let yaml = options(
        dir.path(),
        "multiline: { continuation_pattern: '^\\s', timeout: 1h }",
    );
    let running = start(&yaml, None);
    assert_eq!(wait_for(&running.channel, 1).await, ["first\n  more"]);
    let checkpoint = running.stop().await.unwrap();
    assert_eq!(
        offsets(&checkpoint).values().copied().collect::<Vec<_>>(),
        [13]
    );
    let running = start(&yaml, Some(checkpoint));
    append(&log, b"third\n");
    assert_eq!(
        wait_for(&running.channel, 1).await,
        ["second\n  more 2"],
        "read again after the restart"
    );
    running.stop().await;
}

#[tokio::test]
async fn multiline_caps_lines_per_event() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("app.log");
    append(&log, b"s\n c1\n c2\n c3\n c4\n c5\n");
    let running = start(
        &options(
            dir.path(),
            "multiline: { continuation_pattern: '^ ', timeout: 50ms, max_lines: 3 }",
        ),
        None,
    );
    assert_eq!(
        wait_for(&running.channel, 2).await,
        ["s\n c1\n c2", " c3\n c4\n c5"]
    );
    running.stop().await;
}

#[tokio::test]
async fn binary_bodies_pass_through() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("app.log");
    let mut data = vec![0u8, 0xff, 0xfe, b'x', 0x80];
    data.push(b'\n');
    data.extend_from_slice(&[0xc3, 0x28, b'\n']);
    append(&log, &data);
    let running = start(&options(dir.path(), ""), None);
    wait_for(&running.channel, 2).await;
    let events = running.channel.events();
    assert_eq!(&events[0].body[..], &[0u8, 0xff, 0xfe, b'x', 0x80]);
    assert_eq!(&events[1].body[..], &[0xc3, 0x28]);
    running.stop().await;
}

#[tokio::test]
async fn long_lines_come_in_pieces_of_max_line_length() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("app.log");
    append(&log, format!("{}\nshort\n", "x".repeat(25)).as_bytes());
    let running = start(&options(dir.path(), "max_line_length: 10"), None);
    assert_eq!(
        wait_for(&running.channel, 4).await,
        [
            "x".repeat(10),
            "x".repeat(10),
            "x".repeat(5),
            "short".into()
        ]
    );
    let checkpoint = running.stop().await.unwrap();
    assert_eq!(
        offsets(&checkpoint).values().copied().collect::<Vec<_>>(),
        [32]
    );
}

#[tokio::test]
async fn imports_flume_position_file() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("app.log");
    append(&log, b"sent by flume\nnot yet\n");
    let inode = FileKey::of(&std::fs::metadata(&log).unwrap()).inode;
    let positions = dir.path().join("taildir_position.json");
    std::fs::write(
        &positions,
        format!(
            r#"[{{"inode":{inode},"pos":14,"file":"{}"}}]"#,
            log.display()
        ),
    )
    .unwrap();
    let yaml = options(
        dir.path(),
        &format!("flume_position_file: '{}'", positions.display()),
    );
    let running = start(&yaml, None);
    assert_eq!(wait_for(&running.channel, 1).await, ["not yet"]);
    let checkpoint = running.stop().await;
    // With a checkpoint of its own the Flume file is not used any more.
    std::fs::write(&positions, "not even json").unwrap();
    append(&log, b"later\n");
    let running = start(&yaml, checkpoint);
    assert_eq!(wait_for(&running.channel, 1).await, ["later"]);
    running.stop().await;
}

#[tokio::test]
async fn skip_to_end_skips_only_files_present_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old.log");
    append(&old, b"old 1\nold 2 being wri");
    let running = start(&options(dir.path(), "skip_to_end: true"), None);
    wait_until_open(&old).await;
    append(&old, b"tten\n");
    assert_eq!(wait_for(&running.channel, 1).await, ["old 2 being written"]);
    append(&dir.path().join("new.log"), b"new 1\n");
    assert_eq!(
        wait_for(&running.channel, 2).await,
        ["old 2 being written", "new 1"]
    );
    running.stop().await;
}

#[tokio::test]
async fn idle_files_are_closed_and_reopened_when_they_grow() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("app.log");
    append(&log, b"1\n");
    let running = start(&options(dir.path(), "idle_timeout: 100ms"), None);
    wait_for(&running.channel, 1).await;
    wait_until_open_is(&log, false).await;
    // Read through a new handle.
    append(&log, b"2\n");
    assert_eq!(wait_for(&running.channel, 2).await, ["1", "2"]);
    running.stop().await;
}

#[tokio::test]
async fn deleted_file_is_read_to_its_end_and_released() {
    let dir = tempfile::tempdir().unwrap();
    let doomed = dir.path().join("doomed.log");
    let keep = dir.path().join("keep.log");
    append(&doomed, b"d1\n");
    append(&keep, b"k1\n");
    let running = start(&options(dir.path(), ""), None);
    wait_for(&running.channel, 2).await;
    let mut writer = std::fs::OpenOptions::new()
        .append(true)
        .open(&doomed)
        .unwrap();
    std::fs::remove_file(&doomed).unwrap();
    writer.write_all(b"d2\n").unwrap();
    drop(writer);
    wait_for(&running.channel, 3).await;
    for i in 0..500 {
        append(&keep, format!("k{}\n", i + 2).as_bytes());
        tokio::time::sleep(Duration::from_millis(20)).await;
        let bodies = running.channel.bodies();
        let checkpoint = running.channel.checkpoint().unwrap();
        if offsets(&checkpoint).len() == 1 {
            assert!(bodies.contains(&"d2".to_string()), "{bodies:?}");
            running.stop().await;
            return;
        }
    }
    panic!("the deleted file was never released");
}

#[tokio::test]
async fn new_files_are_picked_up_without_waiting_for_the_poll() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "filegroups: {{ logs: '{}/*.log' }}\npoll_interval: 1h",
        dir.path().display()
    );
    append(&dir.path().join("first.log"), b"first\n");
    let running = start(&yaml, None);
    // Read by the first scan: the file below can only be found through a notification.
    wait_for(&running.channel, 1).await;
    append(&dir.path().join("late.log"), b"hello\n");
    assert_eq!(wait_for(&running.channel, 2).await, ["first", "hello"]);
    append(&dir.path().join("late.log"), b"again\n");
    assert_eq!(
        wait_for(&running.channel, 3).await,
        ["first", "hello", "again"]
    );
    running.stop().await;
}

#[tokio::test]
async fn globs_in_directories_match_files_in_new_directories() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "filegroups: {{ logs: '{}/*/app.log' }}\npoll_interval: 50ms",
        dir.path().display()
    );
    let running = start(&yaml, None);
    std::fs::create_dir(dir.path().join("svc")).unwrap();
    append(&dir.path().join("svc/app.log"), b"from svc\n");
    assert_eq!(wait_for(&running.channel, 1).await, ["from svc"]);
    running.stop().await;
}

#[test]
fn options_are_checked() {
    let bad = |yaml: &str| TaildirSource::build(&config("taildir", yaml)).unwrap_err();
    assert!(bad("filegroups: {}").message.contains("at least one group"));
    assert!(
        bad("filegroups: { a: 'x/*.log' }\nheaders: { b: { k: v } }")
            .message
            .contains("unknown file group `b`")
    );
    assert!(
        bad("filegroups: { a: 'x/*.log' }\nmultiline: { timeout: 1s }")
            .message
            .contains("exactly one of")
    );
    assert!(
        bad("filegroups: { a: 'x/*.log' }\nmultiline: { start_pattern: '(' }")
            .message
            .contains("invalid regular expression")
    );
    assert!(
        bad("filegroups: { a: 'x/[.log' }")
            .message
            .contains("invalid glob")
    );
    assert!(
        bad("filegroups: { a: 'x' }\nskipToEnd: true")
            .message
            .contains("skip_to_end")
    );
}

#[test]
fn defaults_follow_flume() {
    let source = build("filegroups: { a: 'x/*.log' }");
    let config = &source.config;
    assert_eq!(config.batch_size, 100);
    assert_eq!(config.idle_timeout, Duration::from_secs(120));
    assert_eq!(config.file_header_key, "file");
    assert!(!config.file_header && !config.byte_offset_header && !config.skip_to_end);
    assert_eq!(config.partial_line_flush, None);
    assert_eq!(config.max_line_length.bytes(), 1024 * 1024);
    assert_eq!(source.max_batch_size(), Some(100));
}

#[test]
fn watches_the_directory_before_the_first_wildcard() {
    use notify::RecursiveMode::{NonRecursive, Recursive};
    assert_eq!(
        watch_root("/var/log/*.log"),
        ("/var/log".into(), NonRecursive)
    );
    assert_eq!(
        watch_root("/var/log/*/app.log"),
        ("/var/log".into(), Recursive)
    );
    assert_eq!(
        watch_root("/var/log/app.log"),
        ("/var/log".into(), NonRecursive)
    );
    assert_eq!(watch_root("*.log"), (".".into(), NonRecursive));
}

/// A small deterministic generator for crash delays (the seed is printed to replay a run).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

#[tokio::test]
async fn crashes_at_random_moments_lose_and_repeat_nothing_through_rotations() {
    const LINES: usize = 6000;
    let seed = std::env::var("CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    println!("CRASH_SEED={seed}");
    let mut rng = Lcg(seed);
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().to_owned();
    // The channel stores events and checkpoint together, as the file channel does; it
    // outlives the crashed sources.
    let channel = TestChannel::new(1_000_000, 10_000);
    let watcher = channel.clone();
    let writer = std::thread::spawn(move || {
        let mut writer_rng = Lcg(seed ^ 0x5eed);
        let mut rotations = 0;
        // Waits until the source sent `line`. A source runs (crashing and restarting) for
        // as long as this thread writes, so a line never sent is the source's failure, not
        // a reason to rotate a file it has not found (whose lines would then be lost).
        let sent = |line: &str| {
            for _ in 0..6000 {
                if watcher.bodies().iter().rev().any(|b| b == line) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            panic!("the source did not send `{line}` within 30 s");
        };
        let mut first_of_a = 0;
        for i in 0..LINES {
            for name in ["a", "b", "c"] {
                append(
                    &logs.join(format!("{name}.log")),
                    format!("{name} {i:05}\n").as_bytes(),
                );
            }
            if i % 100 == 99 {
                std::thread::sleep(Duration::from_millis(5));
                match writer_rng.below(10) {
                    // Rename rotation: the old file keeps a name the glob does not match.
                    // A file created and renamed away between two looks at the directory is
                    // invisible to any tailer: rename only a file the source has found.
                    0 | 1 => {
                        sent(&format!("a {first_of_a:05}"));
                        first_of_a = i + 1;
                        rotations += 1;
                        std::fs::rename(
                            logs.join("a.log"),
                            logs.join(format!("a.log.{rotations}")),
                        )
                        .unwrap();
                    }
                    // copytruncate loses what the reader has not read yet, with any tool:
                    // truncate only once the source caught up.
                    2 => {
                        sent(&format!("b {i:05}"));
                        let b = logs.join("b.log");
                        std::fs::copy(&b, logs.join("b.copy")).unwrap();
                        std::fs::OpenOptions::new()
                            .write(true)
                            .open(&b)
                            .unwrap()
                            .set_len(0)
                            .unwrap();
                    }
                    _ => {}
                }
            }
        }
    });
    let yaml = options(dir.path(), "batch_size: 50");
    // At least 12 crashes, and crashes for as long as the writer writes: it waits for the
    // source before each rotation, and on a busy machine it outlasts 12 of them.
    let mut crashes = 0;
    while crashes < 12 || !writer.is_finished() {
        let running = start_on(channel.clone(), &yaml, channel.checkpoint());
        tokio::time::sleep(Duration::from_millis(20 + rng.below(150))).await;
        running.task.abort();
        let _ = running.task.await;
        crashes += 1;
    }
    writer.join().unwrap();
    let running = start_on(channel.clone(), &yaml, channel.checkpoint());
    for _ in 0..1000 {
        if channel.len() >= 3 * LINES {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    running.stop().await;
    let bodies = channel.bodies();
    for name in ["a", "b", "c"] {
        let lines: Vec<&String> = bodies
            .iter()
            .filter(|b| b.starts_with(&format!("{name} ")))
            .collect();
        let expected: Vec<String> = (0..LINES).map(|i| format!("{name} {i:05}")).collect();
        let distinct: std::collections::BTreeSet<&String> = lines.iter().copied().collect();
        let missing: Vec<&String> = expected.iter().filter(|e| !distinct.contains(e)).collect();
        let first_wrong = lines.iter().zip(&expected).position(|(l, e)| *l != e);
        assert!(
            first_wrong.is_none() && lines.len() == LINES,
            "CRASH_SEED={seed}: file {name}: {} lines, {} duplicates, {} missing (first {:?}), \
             first out of place at {first_wrong:?}: {:?}",
            lines.len(),
            lines.len() - distinct.len(),
            missing.len(),
            missing.first(),
            first_wrong.map(|at| &lines[at.saturating_sub(2)..(at + 3).min(lines.len())]),
        );
    }
    assert_eq!(bodies.len(), 3 * LINES, "CRASH_SEED={seed}");
}
