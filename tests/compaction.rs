//! Log compaction on the bundled broker (`agent run` of a broker-only file), read by librdkafka:
//! each key's last value at the offset it was written at, tombstones until
//! `delete.retention.ms`, and a broker SIGKILLed while it cleans that restarts with a
//! consistent log.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::harness::{Agent, Lcg, crash_seed, free_port, http_address, http_get, wait_until};

const TOPIC: &str = "changelog";
/// delete.retention.ms of the tombstone test.
const RETENTION: Duration = Duration::from_secs(8);

/// What the broker acknowledged: offset -> (key, value; `None` a tombstone).
type Acked = Arc<Mutex<BTreeMap<i64, (String, Option<String>)>>>;

struct Recorder(Acked);

impl ClientContext for Recorder {}

impl ProducerContext for Recorder {
    type DeliveryOpaque = Box<(String, Option<String>)>;

    fn delivery(&self, result: &DeliveryResult<'_>, record: Self::DeliveryOpaque) {
        if let Ok(message) = result {
            self.0.lock().unwrap().insert(message.offset(), *record);
        }
    }
}

fn start(dir: &Path, port: u16, bytes_per_sec: u64) -> Agent {
    let config = format!(
        "agent:\n  http: 127.0.0.1:0\nbroker:\n  listen: 127.0.0.1:{port}\n  data_dir: ./broker\n  num_partitions: 1\n  \
         log_cleaner_backoff_ms: 100\n  log_cleaner_io_max_bytes_per_second: {bytes_per_sec}\n"
    );
    let mut agent = Agent::start(dir, &config);
    agent.wait_listening(&format!("127.0.0.1:{port}"), "the broker");
    agent
}

fn create_topic(bootstrap: &str, delete_retention_ms: u64) {
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_agent"))
        .args([
            "topics",
            "--bootstrap-server",
            bootstrap,
            "--create",
            "--topic",
            TOPIC,
        ])
        .args(["--partitions", "1"])
        .args(["--config", "cleanup.policy=compact"])
        .args(["--config", "segment.bytes=65536"])
        .args(["--config", "min.cleanable.dirty.ratio=0.01"])
        .arg("--config")
        .arg(format!("delete.retention.ms={delete_retention_ms}"))
        .status()
        .unwrap();
    assert!(status.success());
}

/// Produces `records` (key, value) with an idempotent producer, acks=all, and waits for
/// every acknowledgement.
fn produce(
    bootstrap: &str,
    acked: &Acked,
    records: impl IntoIterator<Item = (String, Option<String>)>,
) {
    let producer: BaseProducer<Recorder> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create_with_context(Recorder(Arc::clone(acked)))
        .unwrap();
    for (key, value) in records {
        let opaque = Box::new((key.clone(), value.clone()));
        let mut record = BaseRecord::with_opaque_to(TOPIC, opaque).key(key.as_str());
        if let Some(value) = value.as_deref() {
            record = record.payload(value);
        }
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, back)) => {
                    record = back;
                    producer.poll(Duration::from_millis(10));
                }
            }
        }
    }
    producer.flush(Duration::from_secs(60)).unwrap();
}

/// Every record of the partition from its start: (offset, key, value).
fn read_all(bootstrap: &str) -> Vec<(i64, String, Option<String>)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "unused")
        .set("enable.auto.commit", "false")
        .set("check.crcs", "true")
        .create()
        .unwrap();
    let (_, high) = consumer
        .fetch_watermarks(TOPIC, 0, Duration::from_secs(10))
        .unwrap();
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(TOPIC, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&assignment).unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut position = -1;
    while position + 1 < high {
        assert!(Instant::now() < deadline, "read up to {position} of {high}");
        let Some(message) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let message = message.unwrap();
        let text = |b: Option<&[u8]>| b.map(|b| String::from_utf8(b.to_vec()).unwrap());
        out.push((
            message.offset(),
            text(message.key()).unwrap(),
            text(message.payload()),
        ));
        position = message.offset();
    }
    out
}

/// The base offset of the partition's active segment (its newest `.log`).
fn active_base(dir: &Path) -> i64 {
    fs::read_dir(partition_dir(dir))
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_suffix(".log")?.parse().ok())
        .max()
        .unwrap()
}

fn partition_dir(dir: &Path) -> PathBuf {
    dir.join("broker").join(format!("{TOPIC}-0"))
}

/// Whether each key appears at most once below `active_base`.
fn compacted_below(read: &[(i64, String, Option<String>)], active_base: i64) -> bool {
    let mut seen = std::collections::BTreeSet::new();
    read.iter()
        .filter(|(o, ..)| *o < active_base)
        .all(|(_, key, _)| seen.insert(key))
}

/// What a consistent compacted log read back shows: every record is the one acknowledged at
/// its offset, each key's newest acknowledged record is there (a tombstone may be gone once
/// `tombstones_may_go`), and, given the active segment's base (all below it cleaned), below
/// it each key's newest record there, alone.
fn check(
    read: &[(i64, String, Option<String>)],
    acked: &BTreeMap<i64, (String, Option<String>)>,
    active_base: Option<i64>,
    tombstones_may_go: bool,
) {
    let mut previous = -1;
    for (offset, key, value) in read {
        assert!(
            *offset > previous,
            "offsets grow: {offset} after {previous}"
        );
        previous = *offset;
        let expected = acked
            .get(offset)
            .unwrap_or_else(|| panic!("offset {offset} was never acknowledged"));
        assert_eq!(
            (key, value),
            (&expected.0, &expected.1),
            "the record at {offset}"
        );
    }
    let mut newest: BTreeMap<&str, i64> = BTreeMap::new();
    for (offset, (key, _)) in acked {
        newest.insert(key, *offset);
    }
    for (key, offset) in &newest {
        let tombstone = acked[offset].1.is_none();
        let present = read.iter().any(|(o, ..)| o == offset);
        assert!(
            present || (tombstone && tombstones_may_go),
            "the newest record of {key} (offset {offset}) is there"
        );
    }
    if let Some(base) = active_base {
        let mut newest_below: BTreeMap<&str, (i64, bool)> = BTreeMap::new();
        for (offset, (key, value)) in acked.range(..base) {
            newest_below.insert(key, (*offset, value.is_none()));
        }
        let mut kept: BTreeMap<&str, i64> = BTreeMap::new();
        for (offset, key, _) in read.iter().filter(|(o, ..)| *o < base) {
            if let Some(before) = kept.insert(key, *offset) {
                panic!(
                    "{key} appears at {before} and {offset}, below the active segment at {base}"
                );
            }
        }
        for (key, (offset, tombstone)) in &newest_below {
            let found = kept.remove(key);
            let gone_tombstone = *tombstone && tombstones_may_go && found.is_none();
            assert!(
                found == Some(*offset) || gone_tombstone,
                "below {base}, {key} is its newest record there, {offset}: {found:?}"
            );
        }
        assert!(
            kept.is_empty(),
            "keys never acknowledged below {base}: {kept:?}"
        );
    }
}

fn updates(from: u64, to: u64, keys: u64) -> impl Iterator<Item = (String, Option<String>)> {
    (from..to).map(move |i| {
        (
            format!("k{}", i % keys),
            Some(format!("{i:08}-{}", "x".repeat(80))),
        )
    })
}

/// 20,000 updates of 50 keys compact to each key's last value at its offset; 5 tombstones stay
/// while delete.retention.ms has not passed, and go with a pass after it.
#[test]
fn a_compacted_topic_keeps_each_keys_last_value_and_tombstones_until_delete_retention_ms() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let bootstrap = format!("127.0.0.1:{port}");
    let broker = start(dir.path(), port, 0);
    create_topic(&bootstrap, RETENTION.as_millis() as u64);
    let acked: Acked = Arc::default();
    let doomed: Vec<(String, Option<String>)> = (0..5)
        .map(|i| (format!("t{i}"), Some("alive".into())))
        .collect();
    produce(&bootstrap, &acked, doomed);
    produce(&bootstrap, &acked, updates(0, 20_000, 50));
    let tombstones: Vec<(String, Option<String>)> =
        (0..5).map(|i| (format!("t{i}"), None)).collect();
    produce(&bootstrap, &acked, tombstones);
    // The tombstones must be in a finished segment to be cleaned: more updates roll it.
    produce(&bootstrap, &acked, updates(20_000, 22_000, 50));
    let tombstoned_at = Instant::now();
    let total = acked.lock().unwrap().len();
    assert_eq!(total, 22_010);

    let mut read = Vec::new();
    wait_until(Duration::from_secs(30), "the log to be compacted", || {
        read = read_all(&bootstrap);
        read.len() < total / 4 && compacted_below(&read, active_base(dir.path()))
    });
    let acked_now = acked.lock().unwrap().clone();
    check(&read, &acked_now, Some(active_base(dir.path())), false);
    assert!(
        tombstoned_at.elapsed() < RETENTION,
        "the check ran within delete.retention.ms"
    );
    assert!(
        !read
            .iter()
            .any(|(_, k, v)| k.starts_with('t') && v.is_some()),
        "the values the tombstones delete are gone"
    );
    // The metrics show the passes and what they removed.
    let address = http_address(&broker).unwrap();
    let (status, metrics) = http_get(&address, "/metrics");
    assert_eq!(status, 200);
    let value = |name: &str| -> f64 {
        let prefix = format!("{name}{{topic=\"{TOPIC}\",partition=\"0\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("{prefix} in {metrics}"))
            .parse()
            .unwrap()
    };
    assert!(value("kafka_log_cleaner_passes_total") >= 1.0);
    assert!(value("kafka_log_cleaner_records_removed_total") > 15_000.0);
    assert!(value("kafka_log_cleaner_checkpoint") > 15_000.0);
    let tombstones_read = read
        .iter()
        .filter(|(_, k, v)| k.starts_with('t') && v.is_none())
        .count();
    assert_eq!(
        tombstones_read, 5,
        "a consumer from the start sees the tombstones"
    );

    // Past delete.retention.ms, with new data for a pass: the tombstones go.
    std::thread::sleep(RETENTION.saturating_sub(tombstoned_at.elapsed()));
    wait_until(Duration::from_secs(30), "the tombstones to go", || {
        produce(&bootstrap, &acked, updates(22_000, 24_000, 50));
        read = read_all(&bootstrap);
        !read.iter().any(|(_, k, _)| k.starts_with('t'))
    });
    let acked_now = acked.lock().unwrap().clone();
    check(&read, &acked_now, None, true);
}

/// The broker is SIGKILLed at random moments of compaction passes (slowed to 2 MB/s so they
/// take seconds), while more updates come: every restart reads a consistent log, with every
/// acknowledged key's newest record at its offset.
#[test]
fn a_broker_killed_while_it_cleans_restarts_with_a_consistent_log() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let bootstrap = format!("127.0.0.1:{port}");
    let mut broker = start(dir.path(), port, 2_000_000);
    create_topic(&bootstrap, 86_400_000);
    let acked: Acked = Arc::default();
    produce(&bootstrap, &acked, updates(0, 40_000, 200));
    let mut random = Lcg(crash_seed());
    let cleaning = partition_dir(dir.path()).join("cleaning");
    let mut interrupted = 0;
    let mut next = 40_000;
    for round in 0..4 {
        wait_until(
            Duration::from_secs(60),
            "a compaction pass to start",
            || cleaning.exists(),
        );
        std::thread::sleep(Duration::from_millis(random.next_below(1500)));
        broker.signal(Signal::SIGKILL);
        broker.wait(Duration::from_secs(10));
        if cleaning.exists() {
            interrupted += 1;
        }
        fs::rename(
            dir.path().join("agent.log"),
            dir.path().join(format!("agent-{round}.log")),
        )
        .unwrap();
        broker = start(dir.path(), port, 2_000_000);
        let read = read_all(&bootstrap);
        let acked_now = acked.lock().unwrap().clone();
        check(&read, &acked_now, None, false);
        produce(&bootstrap, &acked, updates(next, next + 10_000, 200));
        next += 10_000;
    }
    assert!(
        interrupted >= 2,
        "{interrupted} of 4 kills landed during a pass"
    );
    let logs: String = (0..4)
        .map(|r| fs::read_to_string(dir.path().join(format!("agent-{r}.log"))).unwrap_or_default())
        .collect::<String>()
        + &broker.log();
    assert!(
        logs.contains("removing an unfinished cleaning pass")
            || logs.contains("finishing the swap"),
        "a restart met an interrupted pass"
    );
    // Compaction goes on after the kills.
    let mut read = Vec::new();
    wait_until(Duration::from_secs(60), "the log to be compacted", || {
        read = read_all(&bootstrap);
        compacted_below(&read, active_base(dir.path()))
    });
    let acked_now = acked.lock().unwrap().clone();
    check(&read, &acked_now, Some(active_base(dir.path())), false);
}
