//! The log on disk: segment roll, retention, restart, torn-tail recovery — driven through the
//! real broker and librdkafka.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::FutureRecord;

use crate::common::*;

fn segment_files(dir: &Path, topic_partition: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join(topic_partition))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".log"))
        .collect();
    names.sort();
    names
}

fn value(i: usize) -> Vec<u8> {
    format!("record-{i:06}-{}", "x".repeat(100)).into_bytes()
}

/// Produces `values` to partition 0, each batch small (so segments fill), waiting for acks.
async fn produce(
    bootstrap: &str,
    topic: &str,
    range: std::ops::Range<usize>,
    timestamp: Option<i64>,
) {
    let producer = producer(
        bootstrap,
        &[("acks", "all"), ("batch.size", "2000"), ("linger.ms", "1")],
    );
    let mut deliveries = Vec::new();
    for i in range {
        let payload = value(i);
        let key = i.to_string();
        let mut record = FutureRecord::to(topic)
            .partition(0)
            .key(&key)
            .payload(&payload);
        if let Some(ts) = timestamp {
            record = record.timestamp(ts);
        }
        deliveries.push(producer.send_result(record).map_err(|(e, _)| e).unwrap());
    }
    for d in deliveries {
        d.await.unwrap().unwrap();
    }
}

fn watermarks(bootstrap: &str, topic: &str) -> (i64, i64) {
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    consumer
        .fetch_watermarks(topic, 0, Duration::from_secs(10))
        .unwrap()
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segments_roll_by_size_and_retention_deletes_whole_old_segments() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.log_retention_check_interval_ms = 50;
    let (broker, bootstrap) = start(config).await;

    // Size-based: segments of ~8 KiB, keep ~20 KiB.
    create_topic(
        &bootstrap,
        "by-size",
        1,
        &[("segment.bytes", "8192"), ("retention.bytes", "20000")],
    )
    .await;
    produce(&bootstrap, "by-size", 0..1000, None).await;
    // Retention runs while the records arrive too, so a log start past 0 does not mean the
    // last pass is done. Wait until a pass has nothing left to delete (the segments after the
    // oldest hold less than retention.bytes); nothing is appended any more, so it stays so.
    let sizes = |files: &[String]| -> Option<Vec<u64>> {
        files
            .iter()
            .map(|f| std::fs::metadata(dir.path().join("by-size-0").join(f)).ok())
            .map(|m| m.map(|m| m.len()))
            .collect()
    };
    let (mut files, mut total) = (Vec::new(), 0);
    wait_for("size retention", Duration::from_secs(10), || {
        files = segment_files(dir.path(), "by-size-0");
        let Some(sizes) = sizes(&files) else {
            return false; // a segment went while we looked
        };
        total = sizes.iter().sum::<u64>();
        total - sizes.first().copied().unwrap_or(0) < 20000
    })
    .await;
    let (low, high) = watermarks(&bootstrap, "by-size");
    assert_eq!(high, 1000);
    assert!(files.len() >= 3, "several segments remain: {files:?}");
    assert!(
        total <= 20000 + 8192,
        "retention.bytes honoured: {total} bytes in {files:?}"
    );
    // The log starts at the oldest remaining segment, named by its base offset.
    assert_eq!(files[0], format!("{low:020}.log"));
    let consumed = tokio::task::spawn_blocking({
        let b = bootstrap.clone();
        move || {
            consume(
                &b,
                "by-size",
                1,
                (high - low) as usize,
                Duration::from_secs(20),
            )
        }
    })
    .await
    .unwrap();
    assert_eq!(consumed.len() as i64, high - low);
    assert_eq!(
        consumed[0].offset, low,
        "consuming from the beginning starts at the log start"
    );
    for r in &consumed {
        assert_eq!(
            r.value.as_deref(),
            Some(value(r.offset as usize).as_slice())
        );
    }

    // Time-based: records stamped an hour ago, retention 10 minutes: all but the active
    // segment go.
    create_topic(
        &bootstrap,
        "by-time",
        1,
        &[("segment.bytes", "8192"), ("retention.ms", "600000")],
    )
    .await;
    produce(&bootstrap, "by-time", 0..500, Some(now_ms() - 3_600_000)).await;
    let d = dir.path().to_path_buf();
    wait_for("time retention", Duration::from_secs(10), || {
        segment_files(&d, "by-time-0").len() == 1
    })
    .await;
    let (low, high) = watermarks(&bootstrap, "by-time");
    assert_eq!(high, 500);
    assert!(
        low > 0 && low < 500,
        "log start moved to the active segment: {low}"
    );
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_records_and_offsets_continue() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, bootstrap) = start(config(dir.path())).await;
    create_topic(&bootstrap, "durable", 1, &[("segment.bytes", "16384")]).await;
    produce(&bootstrap, "durable", 0..600, None).await;
    broker.shutdown().await;

    let (broker, bootstrap) = start(config(dir.path())).await;
    produce(&bootstrap, "durable", 600..700, None).await;
    let consumed = tokio::task::spawn_blocking({
        let b = bootstrap.clone();
        move || consume(&b, "durable", 1, 700, Duration::from_secs(20))
    })
    .await
    .unwrap();
    assert_eq!(consumed.len(), 700);
    for (i, r) in consumed.iter().enumerate() {
        assert_eq!(r.offset, i as i64);
        assert_eq!(r.value.as_deref(), Some(value(i).as_slice()));
    }
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_tail_is_truncated_on_start_and_appends_continue() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, bootstrap) = start(config(dir.path())).await;
    create_topic(&bootstrap, "torn", 1, &[]).await;
    produce(&bootstrap, "torn", 0..300, None).await;
    broker.shutdown().await;

    // A crash mid-write: half a batch (a plausible header, then nothing) at the end.
    let log_path = dir.path().join("torn-0/00000000000000000000.log");
    let good_len = std::fs::metadata(&log_path).unwrap().len();
    let mut log = std::fs::read(&log_path).unwrap();
    let first_batch_len = 12 + i32::from_be_bytes(log[8..12].try_into().unwrap()) as usize;
    let torn: Vec<u8> = log[..first_batch_len / 2].to_vec();
    log.extend_from_slice(&torn);
    std::fs::write(&log_path, &log).unwrap();

    let (broker, bootstrap) = start(config(dir.path())).await;
    assert_eq!(
        std::fs::metadata(&log_path).unwrap().len(),
        good_len,
        "torn tail truncated"
    );
    produce(&bootstrap, "torn", 300..310, None).await;
    let consumed = tokio::task::spawn_blocking({
        let b = bootstrap.clone();
        move || consume(&b, "torn", 1, 310, Duration::from_secs(20))
    })
    .await
    .unwrap();
    assert_eq!(consumed.len(), 310);
    for (i, r) in consumed.iter().enumerate() {
        assert_eq!(r.offset, i as i64);
        assert_eq!(r.value.as_deref(), Some(value(i).as_slice()));
    }
    broker.shutdown().await;

    // A corrupt last batch (bad CRC) is cut off too: the records before it survive.
    let mut log = std::fs::read(&log_path).unwrap();
    let len = log.len();
    log[len - 3] ^= 0x55;
    std::fs::write(&log_path, &log).unwrap();
    let (broker, bootstrap) = start(config(dir.path())).await;
    let (_, high) = watermarks(&bootstrap, "torn");
    assert!(
        (300..310).contains(&high),
        "the corrupt last batch is gone: high watermark {high}"
    );
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dump_shows_batches_records_and_index_entries_as_kafka_does() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, bootstrap) = start(config(dir.path())).await;
    create_topic(&bootstrap, "dumped", 1, &[("index.interval.bytes", "200")]).await;
    produce(&bootstrap, "dumped", 0..300, Some(1_700_000_000_000)).await;
    broker.shutdown().await;

    let segment = dir.path().join("dumped-0/00000000000000000000.log");
    let mut out = Vec::new();
    ferry_broker::dump_segment_file(&segment, true, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some(format!("Dumping {}", segment.display()).as_str())
    );
    assert_eq!(lines.next(), Some("Log starting offset: 0"));
    let batches: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("baseOffset: "))
        .collect();
    assert!(batches.len() > 1, "several batches");
    assert!(
        batches[0].starts_with("baseOffset: 0 lastOffset: "),
        "{}",
        batches[0]
    );
    assert!(
        batches
            .iter()
            .all(|b| b.contains("isvalid: true") && b.contains("compresscodec: none"))
    );
    assert!(
        batches[0].contains("position: 0 CreateTime: 1700000000000 size: "),
        "{}",
        batches[0]
    );
    let records: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("| offset: "))
        .collect();
    assert_eq!(records.len(), 300);
    for (i, line) in records.iter().enumerate() {
        let value = String::from_utf8(value(i)).unwrap();
        let expected = format!(
            "| offset: {i} CreateTime: 1700000000000 keySize: {} valueSize: {} sequence: -1 headerKeys: [] key: {i} payload: {value}",
            i.to_string().len(),
            value.len()
        );
        assert_eq!(*line, expected);
    }

    let mut out = Vec::new();
    ferry_broker::dump_segment_file(&segment.with_extension("index"), false, &mut out).unwrap();
    let index = String::from_utf8(out).unwrap();
    let entries: Vec<&str> = index.lines().skip(1).collect();
    assert!(!entries.is_empty());
    // Each entry points at the start of a batch listed above, ending at the offset it names.
    for entry in entries {
        let fields: Vec<&str> = entry.split(' ').collect();
        let (offset, position) = (fields[1], fields[3]);
        assert!(
            batches
                .iter()
                .any(|b| b.contains(&format!(" lastOffset: {offset} "))
                    && b.contains(&format!(" position: {position} "))),
            "index entry {entry} matches a batch"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_topic_does_not_inherit_files_left_by_an_interrupted_delete() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, bootstrap) = start(config(dir.path())).await;
    create_topic(&bootstrap, "old", 1, &[]).await;
    produce(&bootstrap, "old", 0..50, None).await;
    broker.shutdown().await;
    // As if a topic `ghost` had been removed from the catalog but not from disk.
    let ghost = dir.path().join("ghost-0");
    std::fs::create_dir(&ghost).unwrap();
    let segment = "00000000000000000000.log";
    std::fs::copy(dir.path().join("old-0").join(segment), ghost.join(segment)).unwrap();

    let (broker, bootstrap) = start(config(dir.path())).await;
    create_topic(&bootstrap, "ghost", 1, &[]).await;
    assert_eq!(watermarks(&bootstrap, "ghost"), (0, 0));
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_crash_finished_segments_are_checked_and_after_a_clean_stop_they_are_not() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join(".kafka_cleanshutdown");
    let (broker, bootstrap) = start(config(dir.path())).await;
    create_topic(&bootstrap, "crashy", 1, &[("segment.bytes", "4096")]).await;
    produce(&bootstrap, "crashy", 0..200, None).await;
    broker.shutdown().await;
    assert!(marker.exists(), "a clean shutdown leaves the marker");

    let (broker, bootstrap) = start(config(dir.path())).await;
    assert!(
        !marker.exists(),
        "the marker is removed while the broker runs"
    );
    // Segments past the recovery point (the log end at the clean stop, when all was fsynced).
    produce(&bootstrap, "crashy", 200..400, None).await;
    // A crash: no shutdown, no marker.
    drop(broker);
    let files = segment_files(dir.path(), "crashy-0");
    let past: Vec<&String> = files
        .iter()
        .filter(|f| f.trim_end_matches(".log").parse::<i64>().unwrap() >= 200)
        .collect();
    assert!(past.len() > 2, "{files:?}");
    // The broker fsyncs rolled segments in the background and moves the recovery point past
    // them; as if the crash came before it did.
    std::fs::write(dir.path().join("crashy-0").join("recovery-point"), "200\n").unwrap();
    // A finished segment past it got a torn tail that the page cache never completed.
    let first = dir.path().join("crashy-0").join(past[0]);
    let good_len = std::fs::metadata(&first).unwrap().len();
    let mut bytes = std::fs::read(&first).unwrap();
    bytes.extend_from_slice(&[0; 100]);
    std::fs::write(&first, &bytes).unwrap();

    let (broker, bootstrap) = start(config(dir.path())).await;
    assert_eq!(
        std::fs::metadata(&first).unwrap().len(),
        good_len,
        "the torn tail was cut"
    );
    let consumed = tokio::task::spawn_blocking({
        let b = bootstrap.clone();
        move || consume(&b, "crashy", 1, 400, Duration::from_secs(20))
    })
    .await
    .unwrap();
    assert_eq!(consumed.len(), 400);
    for (i, r) in consumed.iter().enumerate() {
        assert_eq!(r.offset, i as i64);
        assert_eq!(r.value.as_deref(), Some(value(i).as_slice()));
    }
    broker.shutdown().await;
}
