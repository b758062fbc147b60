//! Damage in the log on disk: found (by the scrubber or a read), reported once, answered
//! CORRUPT_MESSAGE for its offsets while everything around it is served, and removed by the
//! repair functions behind `agent log-repair` — driven through the real broker and librdkafka.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ferry_broker::{BrokerConfig, BrokerHandle};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::Message;
use rdkafka::producer::FutureRecord;
use rdkafka::{Offset, TopicPartitionList};

use crate::common::*;

/// The damage reports logged about `topic`.
fn damage_reports(topic: &str) -> usize {
    logged()
        .lines()
        .filter(|l| l.contains("damaged record batches") && l.contains(&format!("topic={topic}")))
        .count()
}

fn broker_config(dir: &Path, scrub: bool) -> BrokerConfig {
    let mut config = config(dir);
    config.log_scrub_interval_ms = if scrub { 100 } else { 0 };
    config.log_scrub_bytes_per_sec = 100 << 20;
    config
}

/// Produces `count` records keyed by their index to partition 0, in small batches.
async fn produce(bootstrap: &str, topic: &str, count: usize) {
    let producer = producer(
        bootstrap,
        &[("acks", "all"), ("batch.size", "1000"), ("linger.ms", "1")],
    );
    let mut deliveries = Vec::new();
    for i in 0..count {
        let key = i.to_string();
        let payload = format!("value-{i:05}-{}", "x".repeat(40));
        let record = FutureRecord::to(topic)
            .partition(0)
            .key(&key)
            .payload(&payload);
        deliveries.push(producer.send_result(record).map_err(|(e, _)| e).unwrap());
    }
    for d in deliveries {
        d.await.unwrap().unwrap();
    }
}

/// (position, base offset, last offset, size) of each batch of a segment file.
fn batches(path: &Path) -> Vec<(usize, i64, i64, usize)> {
    let bytes = std::fs::read(path).unwrap();
    let mut out = Vec::new();
    let mut at = 0;
    while at + 61 <= bytes.len() {
        let base = i64::from_be_bytes(bytes[at..at + 8].try_into().unwrap());
        let size = 12 + i32::from_be_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        let delta = i32::from_be_bytes(bytes[at + 23..at + 27].try_into().unwrap());
        out.push((at, base, base + i64::from(delta), size));
        at += size;
    }
    out
}

fn first_segment(dir: &Path, topic: &str) -> PathBuf {
    dir.join(format!("{topic}-0"))
        .join(format!("{:020}.log", 0))
}

fn patch(path: &Path, at: usize, bytes: &[u8]) {
    let mut data = std::fs::read(path).unwrap();
    data[at..at + bytes.len()].copy_from_slice(bytes);
    std::fs::write(path, data).unwrap();
}

/// What a consumer reading partition 0 from `from` with CRC checks sees: the offsets of the
/// records until the first error (its code) or until `until` was read, within `timeout`.
fn read_from(
    bootstrap: &str,
    topic: &str,
    from: i64,
    until: i64,
    timeout: Duration,
) -> (Vec<i64>, Option<RDKafkaErrorCode>) {
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .set("group.id", "corruption-tests")
        .set("enable.auto.commit", "false")
        .set("check.crcs", "true")
        .create()
        .unwrap();
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, 0, Offset::Offset(from))
        .unwrap();
    consumer.assign(&assignment).unwrap();
    let deadline = Instant::now() + timeout;
    let mut offsets = Vec::new();
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let key: i64 = std::str::from_utf8(m.key().unwrap())
                    .unwrap()
                    .parse()
                    .unwrap();
                assert_eq!(key, m.offset(), "each record keeps its offset");
                offsets.push(m.offset());
                if m.offset() >= until {
                    return (offsets, None);
                }
            }
            Some(Err(e)) => return (offsets, e.rdkafka_error_code()),
            None => {}
        }
    }
    (offsets, None)
}

fn damaged_ranges(broker: &BrokerHandle, topic: &str) -> usize {
    broker
        .stats()
        .partitions
        .iter()
        .find(|p| p.topic == topic)
        .map_or(0, |p| p.damaged_ranges)
}

/// Produces 400 records to `topic` in segments of 4 KiB and stops cleanly; returns the
/// segment holding the damage-to-be and its batches.
async fn prepare(dir: &Path, topic: &str) -> (PathBuf, Vec<(usize, i64, i64, usize)>) {
    let (broker, bootstrap) = start(broker_config(dir, false)).await;
    create_topic(&bootstrap, topic, 1, &[("segment.bytes", "4096")]).await;
    produce(&bootstrap, topic, 400).await;
    broker.shutdown().await;
    let segment = first_segment(dir, topic);
    let batches = batches(&segment);
    assert!(batches.len() >= 4, "{batches:?}");
    (segment, batches)
}

/// The checks after damage to batch 2 of the first segment: reported once, everything before
/// and after it served, CORRUPT_MESSAGE at it; then repaired, and read whole with offsets kept.
async fn serves_around_the_damage_then_repairs(
    dir: &Path,
    topic: &str,
    scrub: bool,
    damaged: (i64, i64),
) {
    let (broker, bootstrap) = start(broker_config(dir, scrub)).await;
    if scrub {
        wait_for("the scrubber", Duration::from_secs(10), || {
            damaged_ranges(&broker, topic) == 1
        })
        .await;
    }
    let (first_lost, last_lost) = damaged;
    let b = bootstrap.clone();
    let t = topic.to_owned();
    let (before, error) =
        tokio::task::spawn_blocking(move || read_from(&b, &t, 0, 399, Duration::from_secs(20)))
            .await
            .unwrap();
    assert_eq!(before, (0..first_lost).collect::<Vec<_>>());
    assert_eq!(error, Some(RDKafkaErrorCode::InvalidMessage));
    assert_eq!(damaged_ranges(&broker, topic), 1);
    // After the damage, everything is served.
    let b = bootstrap.clone();
    let t = topic.to_owned();
    let (after, error) = tokio::task::spawn_blocking(move || {
        read_from(&b, &t, last_lost + 1, 399, Duration::from_secs(20))
    })
    .await
    .unwrap();
    assert_eq!(error, None);
    assert_eq!(after, (last_lost + 1..400).collect::<Vec<_>>());
    // Fetches of the damaged offsets go on failing, reported once only.
    let b = bootstrap.clone();
    let t = topic.to_owned();
    let (none, error) = tokio::task::spawn_blocking(move || {
        read_from(&b, &t, first_lost, 399, Duration::from_secs(20))
    })
    .await
    .unwrap();
    assert!(none.is_empty());
    assert_eq!(error, Some(RDKafkaErrorCode::InvalidMessage));
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(damage_reports(topic), 1);
    broker.shutdown().await;

    // The repair lists the range (changing nothing), then removes it.
    let segment = first_segment(dir, topic);
    let before_repair = std::fs::read(&segment).unwrap();
    let ranges = ferry_broker::find_damage(dir).unwrap();
    assert_eq!(ranges.len(), 1, "{ranges:?}");
    assert_eq!(ranges[0].file, segment);
    assert_eq!(
        (ranges[0].first_offset, ranges[0].last_offset),
        (first_lost, Some(last_lost))
    );
    assert_eq!(std::fs::read(&segment).unwrap(), before_repair);
    ferry_broker::remove_damage(dir, &ranges).unwrap();
    assert!(ferry_broker::find_damage(dir).unwrap().is_empty());

    let (broker, bootstrap) = start(broker_config(dir, scrub)).await;
    let b = bootstrap.clone();
    let t = topic.to_owned();
    let (all, error) =
        tokio::task::spawn_blocking(move || read_from(&b, &t, 0, 399, Duration::from_secs(20)))
            .await
            .unwrap();
    assert_eq!(error, None);
    let expected: Vec<i64> = (0..400)
        .filter(|o| !(first_lost..=last_lost).contains(o))
        .collect();
    assert_eq!(all, expected);
    assert_eq!(damaged_ranges(&broker, topic), 0);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipped_bytes_after_a_clean_stop_are_found_by_the_scrubber_and_served_around() {
    let dir = tempfile::tempdir().unwrap();
    let topic = "flipped-clean";
    let (segment, batches) = prepare(dir.path(), topic).await;
    let (at, first, last, size) = batches[2];
    // A byte of the last record's value.
    let mut data = std::fs::read(&segment).unwrap();
    data[at + size - 3] ^= 0x20;
    std::fs::write(&segment, data).unwrap();
    // The scrubber finds it (a read alone would not: the header is intact).
    serves_around_the_damage_then_repairs(dir.path(), topic, true, (first, last)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_batch_length_after_a_clean_stop_is_reported_once_and_read_around() {
    let dir = tempfile::tempdir().unwrap();
    let topic = "length-clean";
    let (segment, batches) = prepare(dir.path(), topic).await;
    let (at, first, last, _) = batches[2];
    patch(&segment, at + 8, &0x7fff_ff00i32.to_be_bytes());
    // No scrubber: the first fetch that meets it finds it.
    serves_around_the_damage_then_repairs(dir.path(), topic, false, (first, last)).await;
}
