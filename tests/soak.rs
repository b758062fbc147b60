//! Load and soak of the bundled broker: many producer connections and consumers in several
//! groups for a bounded time against the real `agent` binary, then the books are checked:
//! every record a producer had acknowledged was consumed by every group exactly once, each
//! group's committed offsets reached the end of every partition, no client saw an error, and
//! the broker's resident memory stayed flat.
//!
//! CI runs a reduced size. The full size of the hardening issue (200 producer connections, 50
//! consumers in 5 groups, five minutes) is a documented command:
//!
//! ```sh
//! FERRY_SOAK_PRODUCERS=200 FERRY_SOAK_CONSUMERS=50 FERRY_SOAK_SECONDS=300 \
//!   cargo test --release -p ferry-agent --test e2e soak:: -- --nocapture
//! ```
//!
//! The figures printed (records, rate, RSS) are for the reader; only the books are checked.
//!
//! The hostile soak runs the same load while hostile and broken clients work on the broker from
//! other processes (`tests/hostile_clients.py`): requests mutated from real clients' ones,
//! connections sending a byte every second, connections announcing 100 MiB and sending 4
//! bytes, and a flood of connections with broken frames. On top of the books it checks that
//! every probe (an ApiVersions on a fresh connection, five a second from each hostile process)
//! is answered within two seconds. Its long run:
//!
//! ```sh
//! FERRY_SOAK_SECONDS=3600 cargo test --release -p ferry-agent --test e2e soak::hostile -- --nocapture
//! ```

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use crate::harness::{broker_agent_with, wait_until};

const GROUPS: usize = 5;
const PARTITIONS: u32 = 10;
const TOPIC: &str = "soak";

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// (partition, offset) of each record acknowledged, with its value.
type Books = Arc<Mutex<BTreeMap<(i32, i64), String>>>;

struct Acks {
    acked: Books,
    errors: Arc<AtomicU64>,
}

impl ClientContext for Acks {}

impl ProducerContext for Acks {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(m) => {
                let value = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
                self.acked
                    .lock()
                    .unwrap()
                    .insert((m.partition(), m.offset()), value);
            }
            Err((e, _)) => {
                eprintln!("delivery failed: {e}");
                self.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

fn client(bootstrap: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4");
    config
}

#[test]
fn producers_and_consumer_groups_under_load_keep_the_books_and_the_memory_flat() {
    soak(&[], false);
}

/// The same load while hostile clients work on the broker from four other processes; the
/// broker closes a request that has not arrived whole after 3 s, so the slow ones come and go.
#[test]
fn hostile_clients_leave_the_books_the_memory_and_the_liveness_of_the_broker_whole() {
    soak(&["request_receive_timeout_ms: 3000"], true);
}

/// The hostile processes, each for `seconds`: mode and its arguments.
fn hostile_loads(seconds: u64) -> Vec<Vec<String>> {
    let corpus = crate::harness::repo_root().join("fuzz/corpus/kafka_request");
    let seconds = seconds.to_string();
    let load = |args: &[&str]| -> Vec<String> {
        let mut all: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        all.extend(["--seconds".to_owned(), seconds.clone()]);
        all
    };
    vec![
        load(&[
            "frames",
            "--count",
            "8",
            "--corpus",
            corpus.to_str().unwrap(),
        ]),
        load(&["trickle", "--count", "200", "--every", "1", "--repeat"]),
        load(&["hogs", "--count", "64", "--repeat"]),
        load(&["flood", "--count", "4"]),
    ]
}

fn soak(broker_settings: &[&str], hostile: bool) {
    let producers = setting("FERRY_SOAK_PRODUCERS", 20);
    let consumers = setting("FERRY_SOAK_CONSUMERS", 10).max(GROUPS);
    let seconds = setting("FERRY_SOAK_SECONDS", 15) as u64;
    // Each producer sends at a steady pace, so the load lasts the whole run.
    let per_second = setting("FERRY_SOAK_RECORDS_PER_SECOND", 40);

    let dir = tempfile::tempdir().unwrap();
    let (broker, bootstrap) = broker_agent_with(dir.path(), PARTITIONS, broker_settings);
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));

    // The topic exists before anyone subscribes, so every group's first assignment can be
    // its last.
    let admin: AdminClient<DefaultClientContext> = client(&bootstrap).create().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let created = runtime
        .block_on(admin.create_topics(
            &[NewTopic::new(
                TOPIC,
                PARTITIONS as i32,
                TopicReplication::Fixed(1),
            )],
            &AdminOptions::new(),
        ))
        .unwrap();
    assert!(created.iter().all(|r| r.is_ok()), "{created:?}");

    // Consumers: `consumers` members spread over GROUPS groups, each polling and committing.
    let consumed: Vec<Books> = (0..GROUPS).map(|_| Books::default()).collect();
    let duplicates = Arc::new(AtomicU64::new(0));
    // Each member's partitions now, to wait for every group's assignment to settle.
    let assigned: Vec<Arc<AtomicU64>> = (0..consumers).map(|_| Arc::default()).collect();
    let mut consumer_threads = Vec::new();
    for member in 0..consumers {
        let group = member % GROUPS;
        let books = Arc::clone(&consumed[group]);
        let (stop, errors, duplicates, assigned) = (
            Arc::clone(&stop),
            Arc::clone(&errors),
            Arc::clone(&duplicates),
            Arc::clone(&assigned[member]),
        );
        let bootstrap = bootstrap.clone();
        consumer_threads.push(std::thread::spawn(move || {
            let consumer: BaseConsumer = client(&bootstrap)
                .set("group.id", format!("soak-{group}"))
                .set("client.id", format!("soak-consumer-{member}"))
                .set("enable.auto.commit", "false")
                .set("auto.offset.reset", "earliest")
                .set("session.timeout.ms", "30000")
                .create()
                .unwrap();
            consumer.subscribe(&[TOPIC]).unwrap();
            let mut last_commit = Instant::now();
            loop {
                match consumer.poll(Duration::from_millis(100)) {
                    Some(Ok(m)) => {
                        let value =
                            String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
                        if books
                            .lock()
                            .unwrap()
                            .insert((m.partition(), m.offset()), value)
                            .is_some()
                        {
                            duplicates.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Some(Err(KafkaError::PartitionEOF(_))) => {}
                    Some(Err(e)) => {
                        eprintln!("consumer {member}: {e}");
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                    None => {}
                }
                if let Ok(assignment) = consumer.assignment() {
                    assigned.store(assignment.count() as u64, Ordering::Relaxed);
                }
                if last_commit.elapsed() > Duration::from_millis(200) {
                    // Nothing consumed since the last commit gives NoOffset: not an error.
                    let _ = consumer.commit_consumer_state(CommitMode::Async);
                    last_commit = Instant::now();
                }
                if stop.load(Ordering::Relaxed) {
                    let _ = consumer.commit_consumer_state(CommitMode::Sync);
                    return;
                }
            }
        }));
    }
    // Every group's partitions all assigned, and still so three seconds later: the groups
    // are stable before the load starts, so no rebalance hands a record over twice.
    let settled = || {
        (0..GROUPS).all(|group| {
            let owned: u64 = (group..consumers)
                .step_by(GROUPS)
                .map(|member| assigned[member].load(Ordering::Relaxed))
                .sum();
            owned == u64::from(PARTITIONS)
        })
    };
    let mut stable_since = None;
    wait_until(Duration::from_secs(120), "every group to settle", || {
        match (settled(), stable_since) {
            (false, _) => stable_since = None,
            (true, None) => stable_since = Some(Instant::now()),
            (true, Some(since)) => return since.elapsed() > Duration::from_secs(3),
        }
        false
    });

    // Producers: each its own client (its own connections), sending at a steady pace.
    let acked = Books::default();
    let sending = Arc::new(AtomicBool::new(true));
    let mut producer_threads = Vec::new();
    for producer in 0..producers {
        let acks = Acks {
            acked: Arc::clone(&acked),
            errors: Arc::clone(&errors),
        };
        let bootstrap = bootstrap.clone();
        let sending = Arc::clone(&sending);
        producer_threads.push(std::thread::spawn(move || {
            let client: ThreadedProducer<Acks> = client(&bootstrap)
                .set("client.id", format!("soak-producer-{producer}"))
                .set("acks", "all")
                .set("enable.idempotence", "true")
                .set("linger.ms", "5")
                .create_with_context(acks)
                .unwrap();
            let pause = Duration::from_secs(1) / per_second.max(1) as u32;
            let mut seq = 0u64;
            while sending.load(Ordering::Relaxed) {
                let value = format!("p{producer}-{seq}");
                let key = format!("k{}", seq % 97);
                // A full queue is retried after a pause: only the broker's answers count.
                if client
                    .send(BaseRecord::to(TOPIC).key(&key).payload(&value))
                    .is_ok()
                {
                    seq += 1;
                }
                std::thread::sleep(pause);
            }
            client.flush(Duration::from_secs(60)).unwrap();
        }));
    }

    // The hostile processes, started with the load.
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let script = crate::harness::repo_root().join("tests/hostile_clients.py");
    let hostiles: Vec<std::process::Child> = match hostile {
        false => Vec::new(),
        true => hostile_loads(seconds)
            .into_iter()
            .map(|args| {
                std::process::Command::new(&python)
                    .arg(&script)
                    .arg(&bootstrap)
                    .args(args)
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect(),
    };

    // The run, sampling the broker's memory.
    let started = Instant::now();
    let mut rss = Vec::new();
    while started.elapsed() < Duration::from_secs(seconds) {
        std::thread::sleep(Duration::from_millis(500));
        rss.push(broker.rss_kib());
    }
    sending.store(false, Ordering::Relaxed);
    for thread in producer_threads {
        thread.join().unwrap();
    }
    let produced = acked.lock().unwrap().len();
    let elapsed = started.elapsed();
    for child in hostiles {
        let output = child.wait_with_output().unwrap();
        let report = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "hostile_clients.py: {report}");
        let report: serde_json::Value = serde_json::from_str(report.trim()).unwrap();
        println!("soak: hostile load {report}");
        let probe = &report["probe"];
        assert!(probe["answered"].as_u64().unwrap() >= seconds, "{report}");
        assert_eq!(probe["failed"], 0, "a probe was not answered: {report}");
        assert!(
            probe["slowest"].as_f64().unwrap() < 2.0,
            "a probe took over 2 s: {report}"
        );
    }

    // Every group catches up with everything acknowledged.
    let total = produced;
    wait_until(
        Duration::from_secs(120),
        "every group to consume everything",
        || {
            consumed
                .iter()
                .all(|books| books.lock().unwrap().len() >= total)
        },
    );
    stop.store(true, Ordering::Relaxed);
    for thread in consumer_threads {
        thread.join().unwrap();
    }

    let half = rss.len() / 2;
    let first = rss[..half].iter().copied().max().unwrap_or(0);
    let second = rss[half..].iter().copied().max().unwrap_or(0);
    println!(
        "soak: {producers} producers, {consumers} consumers in {GROUPS} groups, {produced} records \
         acknowledged in {elapsed:?} ({:.0}/s); broker RSS max {} MiB in the first half, {} MiB \
         in the second",
        produced as f64 / elapsed.as_secs_f64(),
        first / 1024,
        second / 1024
    );

    assert_eq!(errors.load(Ordering::Relaxed), 0, "no client saw an error");
    assert_eq!(
        duplicates.load(Ordering::Relaxed),
        0,
        "no record twice in a group"
    );
    assert!(produced > 0);
    let acked = acked.lock().unwrap();
    for (group, books) in consumed.iter().enumerate() {
        let books = books.lock().unwrap();
        for (at, value) in acked.iter() {
            assert_eq!(
                books.get(at),
                Some(value),
                "group soak-{group}: acknowledged record {at:?} consumed as itself"
            );
        }
        assert_eq!(books.len(), total, "group soak-{group}: nothing extra");
    }

    // Each group committed the end of every partition.
    let ends: BTreeMap<i32, i64> = (0..PARTITIONS as i32)
        .map(|p| {
            let end = acked
                .keys()
                .filter(|(partition, _)| *partition == p)
                .map(|(_, offset)| offset + 1)
                .max()
                .unwrap_or(0);
            (p, end)
        })
        .collect();
    for group in 0..GROUPS {
        let consumer: BaseConsumer = client(&bootstrap)
            .set("group.id", format!("soak-{group}"))
            .create()
            .unwrap();
        let mut wanted = TopicPartitionList::new();
        for p in 0..PARTITIONS as i32 {
            wanted.add_partition(TOPIC, p);
        }
        let committed = consumer
            .committed_offsets(wanted, Duration::from_secs(10))
            .unwrap();
        let committed: BTreeSet<(i32, i64)> = committed
            .elements()
            .iter()
            .map(|e| {
                let offset = match e.offset() {
                    Offset::Offset(o) => o,
                    _ => 0,
                };
                (e.partition(), offset)
            })
            .collect();
        let expected: BTreeSet<(i32, i64)> = ends.iter().map(|(p, o)| (*p, *o)).collect();
        assert_eq!(committed, expected, "group soak-{group}: committed offsets");
    }

    // Flat: the second half of the run holds no more than the first, give or take.
    assert!(
        second <= first + first / 4 + 32 * 1024,
        "broker RSS grew from {} MiB to {} MiB over the run",
        first / 1024,
        second / 1024
    );
    drop(broker);
}
