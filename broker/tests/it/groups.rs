//! Consumer groups with real librdkafka consumers (the `rdkafka` crate) against the real
//! broker: partitions shared among members under each assignor, a killed member's partitions
//! taken over after its session timeout, every record processed once with synchronous
//! commits, committed offsets kept across a restart, and `auto.offset.reset` for new groups.
//!
//! A member is "killed" by running it in a child process (this test binary, re-executed to run
//! only [`group_member_child_process`]) and sending it SIGKILL: no LeaveGroup, no close, the
//! broker only notices that its heartbeats stop.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use tokio::net::TcpStream;

use crate::common::raw::call;
use crate::common::*;

const SESSION_TIMEOUT_MS: u64 = 6000;
const PARTITIONS: i32 = 6;
/// Records produced before and again after the kill.
const RECORDS_PER_PHASE: usize = 300;
const CHILD_ENV: &str = "FERRY_GROUP_MEMBER";

fn member_config(bootstrap: &str, group: &str, strategy: &str, reset: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .set("log_level", "3")
        .set("group.id", group)
        .set("partition.assignment.strategy", strategy)
        .set("session.timeout.ms", SESSION_TIMEOUT_MS.to_string())
        .set("heartbeat.interval.ms", "500")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("auto.offset.reset", reset);
    // librdkafka's own debug contexts (e.g. `cgrp,fetch,topic`), logged through the test's
    // subscriber with RUST_LOG=rdkafka=debug: how a failure of these tests is looked into.
    if let Ok(contexts) = std::env::var("FERRY_TEST_RDKAFKA_DEBUG") {
        config.set("debug", contexts).set("log_level", "7");
    }
    config
}

/// What a member tells the test.
#[derive(Debug)]
enum Event {
    Assigned(Vec<i32>),
    /// Processed and committed: partition, offset, key.
    Consumed(i32, i64, String),
}

/// A group member's loop: each record is processed by committing its offset synchronously
/// and only then reported; a failed commit (a rebalance is under way) rewinds to the record so
/// it is processed again, by this member or by the partition's next owner.
fn run_member(config: ClientConfig, topic: &str, stop: &AtomicBool, mut report: impl FnMut(Event)) {
    let consumer: BaseConsumer = config.create().unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let mut assigned: Vec<i32> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let polled = consumer.poll(Duration::from_millis(50));
        let mut now_assigned: Vec<i32> = consumer
            .assignment()
            .map(|tpl| tpl.elements().iter().map(|e| e.partition()).collect())
            .unwrap_or_default();
        now_assigned.sort_unstable();
        if now_assigned != assigned {
            assigned = now_assigned;
            report(Event::Assigned(assigned.clone()));
        }
        let Some(Ok(message)) = polled else { continue };
        let (partition, offset) = (message.partition(), message.offset());
        let key = String::from_utf8_lossy(message.key().unwrap_or_default()).into_owned();
        match consumer.commit_message(&message, CommitMode::Sync) {
            Ok(()) => report(Event::Consumed(partition, offset, key)),
            Err(_) => {
                drop(message);
                let _ = consumer.seek(
                    topic,
                    partition,
                    Offset::Offset(offset),
                    Duration::from_secs(1),
                );
            }
        }
    }
}

/// Run by the child process only: a member that reports on stdout until it is killed.
#[test]
#[ignore = "a group member run in a child process by the tests below"]
fn group_member_child_process() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let parts: Vec<&str> = spec.split('|').collect();
    let [bootstrap, topic, group, strategy] = parts[..] else {
        panic!("bad {CHILD_ENV}: {spec}");
    };
    // Its logs (librdkafka's among them) go to the stderr it shares with the parent: stdout
    // is the parent's, and held below.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
    // The parent holds our stdin: when it goes away, so do we.
    std::thread::spawn(|| {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        std::process::exit(0);
    });
    let stop = AtomicBool::new(false);
    let mut out = std::io::stdout().lock();
    let mut config = member_config(bootstrap, group, strategy, "earliest");
    config.set("client.id", "member-2");
    run_member(config, topic, &stop, |event| {
        let line = match event {
            Event::Assigned(p) => format!(
                "ASSIGNED {}",
                p.iter().map(i32::to_string).collect::<Vec<_>>().join(",")
            ),
            Event::Consumed(p, o, k) => format!("CONSUMED {p} {o} {k}"),
        };
        // When it happened, for the parent's timeline.
        writeln!(out, "{line} @{}", now_ms()).unwrap();
        out.flush().unwrap();
    });
}

/// Milliseconds since the epoch: the one clock of the parent and the child.
fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis()
}

/// What the test knows of the three members.
#[derive(Default)]
struct Observed {
    assignments: [Vec<i32>; 3],
    /// (member, partition, offset, key)
    consumed: Vec<(usize, i32, i64, String)>,
    /// Every assignment, record processed (with its partition) and step of the test, with its
    /// time, to show when a check fails.
    timeline: Vec<(u128, Option<i32>, String)>,
}

impl Observed {
    fn apply(&mut self, member: usize, event: Event) {
        self.apply_at(member, event, now_ms());
    }

    fn apply_at(&mut self, member: usize, event: Event, at: u128) {
        let line = match &event {
            Event::Assigned(p) => (None, format!("member {member} assigned {p:?}")),
            Event::Consumed(p, o, k) => {
                (Some(*p), format!("member {member} processed {p}/{o} {k}"))
            }
        };
        self.timeline.push((at, line.0, line.1));
        match event {
            Event::Assigned(p) => self.assignments[member] = p,
            Event::Consumed(p, o, k) => self.consumed.push((member, p, o, k)),
        }
    }

    fn step(&mut self, what: &str) {
        self.timeline.push((now_ms(), None, what.to_owned()));
    }

    /// The timeline in time order, with the records processed from `partition` only.
    fn report(&self, partition: i32) -> String {
        let mut lines: Vec<_> = self
            .timeline
            .iter()
            .filter(|(_, p, _)| p.is_none_or(|p| p == partition))
            .collect();
        lines.sort_by_key(|(at, _, _)| *at);
        let out: Vec<String> = lines.iter().map(|(at, _, l)| format!("{at} {l}")).collect();
        out.join("\n")
    }

    /// Each of `members` owns at least one partition, and every partition has exactly one
    /// owner among them.
    fn partitions_split_among(&self, members: &[usize]) -> bool {
        let mut owned: Vec<i32> = members
            .iter()
            .flat_map(|m| self.assignments[*m].iter().copied())
            .collect();
        owned.sort_unstable();
        members.iter().all(|m| !self.assignments[*m].is_empty())
            && owned == (0..PARTITIONS).collect::<Vec<_>>()
    }
}

/// Commits `offset` for every partition of `topic` as a consumer outside the group
/// (generation -1), as before the group's first member joins.
fn commit_standalone(bootstrap: &str, group: &str, topic: &str, offset: i64) {
    let consumer: BaseConsumer = member_config(bootstrap, group, "range", "earliest")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(topic, p, Offset::Offset(offset))
            .unwrap();
    }
    consumer.commit(&tpl, CommitMode::Sync).unwrap();
}

async fn produce_keys(producer: &FutureProducer, topic: &str, prefix: &str, count: usize) {
    for i in 0..count {
        let key = format!("{prefix}{i}");
        let partition = (i % PARTITIONS as usize) as i32;
        producer
            .send(
                FutureRecord::to(topic)
                    .key(&key)
                    .payload("v")
                    .partition(partition),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
    }
}

async fn three_members_share_the_partitions_and_take_over_a_killed_ones(strategy: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.group_initial_rebalance_delay_ms = 500;
    let (broker, bootstrap) = start(config).await;
    let topic = "shared";
    let group = format!("group-{strategy}");
    create_topic(&bootstrap, topic, PARTITIONS, &[]).await;
    let producer = producer(&bootstrap, &[]);
    // Every partition starts from a committed offset (0), so that no assignment goes through
    // `auto.offset.reset`: librdkafka (2.12.1) races there. A partition revoked while its
    // reset lookup (ListOffsets) is still waiting for its answer (behind a long-poll Fetch on the
    // same connection, as with Kafka) gets an outdated reply; librdkafka then retries the
    // lookup 500 ms later (`rd_kafka_toppar_offset_retry(.., "outdated offset response")`)
    // although the partition is no longer assigned, and fetches it from there. When the
    // partition is assigned back to that member, the first of those records is delivered once,
    // ahead of the committed offset it then resumes from: a record processed twice. The
    // broker's fetch trace shows it (a member fetching from offset 0 a partition another member
    // owns, from 500 ms after its revoke). Resets are tested on their own below, with one
    // member.
    commit_standalone(&bootstrap, &group, topic, 0);

    let observed = Arc::new(Mutex::new(Observed::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for member in 0..2 {
        let (observed, stop) = (Arc::clone(&observed), Arc::clone(&stop));
        let mut config = member_config(&bootstrap, &group, strategy, "earliest");
        config.set("client.id", format!("member-{member}"));
        threads.push(std::thread::spawn(move || {
            run_member(config, topic, &stop, |e| {
                observed.lock().unwrap().apply(member, e)
            })
        }));
    }
    // The third member joins a group already at work: in the cooperative protocol the others
    // first give up partitions, then rejoin at once, and a second round hands them over.
    wait_for(
        "two members to split the partitions",
        Duration::from_secs(30),
        || observed.lock().unwrap().partitions_split_among(&[0, 1]),
    )
    .await;
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "groups::group_member_child_process",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, format!("{bootstrap}|{topic}|{group}|{strategy}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let child_out = child.stdout.take().unwrap();
    let reader = {
        let observed = Arc::clone(&observed);
        std::thread::spawn(move || {
            for line in BufReader::new(child_out).lines() {
                let Ok(line) = line else { break };
                // libtest's "test ... " line has no newline before ours.
                let line = match line.find("ASSIGNED ").or_else(|| line.find("CONSUMED ")) {
                    Some(at) => &line[at..],
                    None => continue,
                };
                let Some((line, at)) = line.rsplit_once(" @") else {
                    continue;
                };
                let at = at.parse().unwrap_or_else(|_| now_ms());
                let event = if let Some(p) = line.strip_prefix("ASSIGNED ") {
                    Event::Assigned(p.split(',').filter_map(|x| x.parse().ok()).collect())
                } else if let Some(rest) = line.strip_prefix("CONSUMED ") {
                    let f: Vec<&str> = rest.splitn(3, ' ').collect();
                    Event::Consumed(f[0].parse().unwrap(), f[1].parse().unwrap(), f[2].into())
                } else {
                    continue;
                };
                observed.lock().unwrap().apply_at(2, event, at);
            }
        })
    };

    wait_for(
        "three members to split the partitions",
        Duration::from_secs(30),
        || observed.lock().unwrap().partitions_split_among(&[0, 1, 2]),
    )
    .await;
    observed.lock().unwrap().step("producing the first records");
    produce_keys(&producer, topic, "before-", RECORDS_PER_PHASE).await;
    wait_for(
        "the first records to be consumed",
        Duration::from_secs(30),
        || observed.lock().unwrap().consumed.len() >= RECORDS_PER_PHASE,
    )
    .await;
    {
        let o = observed.lock().unwrap();
        assert!(
            o.assignments.iter().all(|a| a.len() == 2),
            "{strategy}: {:?}",
            o.assignments
        );
    }

    // Kill the third member while it is idle: no LeaveGroup, its session must run out.
    observed.lock().unwrap().step("killing member 2");
    child.kill().unwrap();
    child.wait().unwrap();
    reader.join().unwrap();
    let killed_at = Instant::now();
    observed.lock().unwrap().assignments[2].clear();
    wait_for(
        "the survivors to take over the killed member's partitions",
        Duration::from_millis(SESSION_TIMEOUT_MS + 10_000),
        || observed.lock().unwrap().partitions_split_among(&[0, 1]),
    )
    .await;
    let took = killed_at.elapsed();
    assert!(
        took < Duration::from_millis(SESSION_TIMEOUT_MS + 4000),
        "{strategy}: takeover took {took:?}"
    );

    observed.lock().unwrap().step("producing the last records");
    produce_keys(&producer, topic, "after-", RECORDS_PER_PHASE).await;
    wait_for(
        "every record to be consumed",
        Duration::from_secs(30),
        || observed.lock().unwrap().consumed.len() >= 2 * RECORDS_PER_PHASE,
    )
    .await;
    // Anything processed twice would show up now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }

    {
        let o = observed.lock().unwrap();
        let mut keys = BTreeMap::new();
        for (member, partition, offset, key) in &o.consumed {
            if let Some(first) = keys.insert(key.clone(), (*member, *partition, *offset)) {
                panic!(
                    "{strategy}: {key} processed twice: {first:?} and {:?}\n{}",
                    (member, partition, offset),
                    o.report(*partition)
                );
            }
        }
        let expected: BTreeSet<String> = (0..RECORDS_PER_PHASE)
            .flat_map(|i| [format!("before-{i}"), format!("after-{i}")])
            .collect();
        assert_eq!(
            keys.keys().cloned().collect::<BTreeSet<_>>(),
            expected,
            "{strategy}"
        );
        assert!(
            o.consumed.iter().any(|c| c.0 == 2),
            "{strategy}: the killed member had consumed records"
        );
        assert!(
            o.consumed
                .iter()
                .filter(|c| c.3.starts_with("after-"))
                .all(|c| c.0 != 2),
            "{strategy}: nothing went to the dead member"
        );
    }

    // The group's committed offsets are the end of every partition.
    let checker: BaseConsumer = member_config(&bootstrap, &group, strategy, "earliest")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition(topic, p);
    }
    let committed = checker
        .committed_offsets(tpl, Duration::from_secs(10))
        .unwrap();
    let per_partition = (2 * RECORDS_PER_PHASE / PARTITIONS as usize) as i64;
    for e in committed.elements() {
        assert_eq!(
            e.offset(),
            Offset::Offset(per_partition),
            "{strategy}: partition {}",
            e.partition()
        );
    }
    drop(checker);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_members_share_partitions_and_take_over_a_killed_member() {
    three_members_share_the_partitions_and_take_over_a_killed_ones("range").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roundrobin_members_share_partitions_and_take_over_a_killed_member() {
    three_members_share_the_partitions_and_take_over_a_killed_ones("roundrobin").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cooperative_sticky_members_share_partitions_and_take_over_a_killed_member() {
    three_members_share_the_partitions_and_take_over_a_killed_ones("cooperative-sticky").await;
}

/// Consumes with a group until `count` records arrived (committing each synchronously) or 20
/// seconds passed; returns their keys.
fn consume_in_group(
    bootstrap: &str,
    group: &str,
    topic: &str,
    reset: &str,
    count: usize,
) -> Vec<String> {
    let consumer: BaseConsumer = member_config(bootstrap, group, "range", reset)
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut keys = Vec::new();
    while keys.len() < count && Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(50)) {
            keys.push(String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned());
            consumer.commit_message(&m, CommitMode::Sync).unwrap();
        }
    }
    keys
}

/// Subscribes a new group and waits until it owns every partition of `topic` and has had time
/// to settle its starting positions.
fn assigned_consumer(
    bootstrap: &str,
    group: &str,
    topic: &str,
    reset: &str,
    partitions: usize,
) -> (BaseConsumer, Vec<String>) {
    let consumer: BaseConsumer = member_config(bootstrap, group, "range", reset)
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let mut early = Vec::new();
    let mut poll = |consumer: &BaseConsumer| {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(50)) {
            early.push(String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned());
        }
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while consumer.assignment().map(|a| a.count()).unwrap_or(0) < partitions {
        assert!(Instant::now() < deadline, "{group}: no assignment");
        poll(&consumer);
    }
    // Let the offset reset (a ListOffsets per partition) complete; what arrives meanwhile is
    // kept.
    let settle = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < settle {
        poll(&consumer);
    }
    (consumer, early)
}

fn poll_keys((consumer, early): (BaseConsumer, Vec<String>), count: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut keys = early;
    while keys.len() < count && Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(50)) {
            keys.push(String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned());
        }
    }
    // Nothing more than expected arrives.
    let quiet = Instant::now() + Duration::from_millis(300);
    while Instant::now() < quiet {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(50)) {
            keys.push(String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned());
        }
    }
    keys.sort();
    keys
}

fn keys(prefix: &str, count: usize) -> Vec<String> {
    let mut k: Vec<String> = (0..count).map(|i| format!("{prefix}{i}")).collect();
    k.sort();
    k
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_offsets_survive_a_restart_and_new_groups_start_where_auto_offset_reset_says() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = config(dir.path());
    settings.group_initial_rebalance_delay_ms = 0;
    let (broker, bootstrap) = start(settings.clone()).await;
    let topic = "resume";
    create_topic(&bootstrap, topic, 2, &[]).await;
    {
        let producer = producer(&bootstrap, &[]);
        for i in 0..10 {
            let key = format!("old-{i}");
            producer
                .send(
                    FutureRecord::to(topic)
                        .key(&key)
                        .payload("v")
                        .partition(i % 2),
                    Duration::from_secs(10),
                )
                .await
                .unwrap();
        }
    }
    let b = bootstrap.clone();
    let first = tokio::task::spawn_blocking(move || {
        let keys = consume_in_group(&b, "resumer", topic, "earliest", 6);
        // Metadata travels with a commit.
        let consumer: BaseConsumer = member_config(&b, "tagger", "range", "earliest")
            .create()
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, 1, Offset::Offset(4))
            .unwrap();
        tpl.find_partition(topic, 1)
            .unwrap()
            .set_metadata("checkpoint-4");
        consumer.commit(&tpl, CommitMode::Sync).unwrap();
        keys
    })
    .await
    .unwrap();
    assert_eq!(first.len(), 6);
    broker.shutdown().await;

    let (broker, bootstrap) = start(settings).await;
    let b = bootstrap.clone();
    let (committed, tagged) = tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = member_config(&b, "resumer", "range", "earliest")
            .create()
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(topic, 0);
        tpl.add_partition(topic, 1);
        let committed = consumer
            .committed_offsets(tpl.clone(), Duration::from_secs(10))
            .unwrap();
        let tagger: BaseConsumer = member_config(&b, "tagger", "range", "earliest")
            .create()
            .unwrap();
        let tagged = tagger
            .committed_offsets(tpl, Duration::from_secs(10))
            .unwrap();
        let total: i64 = committed
            .elements()
            .iter()
            .map(|e| match e.offset() {
                Offset::Offset(o) => o,
                other => panic!("{other:?}"),
            })
            .sum();
        let p1 = tagged.find_partition(topic, 1).unwrap();
        (total, (p1.offset(), p1.metadata().to_owned()))
    })
    .await
    .unwrap();
    assert_eq!(
        committed, 6,
        "six records were committed before the restart"
    );
    assert_eq!(tagged, (Offset::Offset(4), "checkpoint-4".to_owned()));

    // The group resumes: only the four records it had not processed.
    let b = bootstrap.clone();
    let rest =
        tokio::task::spawn_blocking(move || consume_in_group(&b, "resumer", topic, "earliest", 4))
            .await
            .unwrap();
    let mut all: Vec<String> = first.into_iter().chain(rest).collect();
    all.sort();
    assert_eq!(
        all,
        keys("old-", 10),
        "resumed where the commits left off, nothing twice"
    );

    // New groups: `latest` sees only what is produced after it joined, `earliest` everything.
    let b = bootstrap.clone();
    let (latest, earliest) = tokio::task::spawn_blocking(move || {
        (
            assigned_consumer(&b, "newcomer-latest", topic, "latest", 2),
            assigned_consumer(&b, "newcomer-earliest", topic, "earliest", 2),
        )
    })
    .await
    .unwrap();
    let producer = producer(&bootstrap, &[]);
    for i in 0..3 {
        let key = format!("new-{i}");
        producer
            .send(
                FutureRecord::to(topic).key(&key).payload("v"),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
    }
    let (seen_latest, seen_earliest) =
        tokio::task::spawn_blocking(move || (poll_keys(latest, 3), poll_keys(earliest, 13)))
            .await
            .unwrap();
    assert_eq!(seen_latest, keys("new-", 3));
    let mut everything = keys("old-", 10);
    everything.extend(keys("new-", 3));
    everything.sort();
    assert_eq!(seen_earliest, everything);
    broker.shutdown().await;
}

fn group(s: &str) -> GroupId {
    GroupId(StrBytes::from_string(s.to_owned()))
}

fn s(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_owned())
}

fn commit_request(
    group_id: &str,
    generation: i32,
    member: &str,
    topic: &str,
    offset: i64,
) -> OffsetCommitRequest {
    OffsetCommitRequest::default()
        .with_group_id(group(group_id))
        .with_generation_id_or_member_epoch(generation)
        .with_member_id(s(member))
        .with_topics(vec![
            offset_commit_request::OffsetCommitRequestTopic::default()
                .with_name(TopicName(s(topic)))
                .with_partitions(vec![
                    offset_commit_request::OffsetCommitRequestPartition::default()
                        .with_committed_offset(offset)
                        .with_committed_metadata(Some(s("meta"))),
                ]),
        ])
}

async fn fetch_offset(stream: &mut TcpStream, group_id: &str, topic: &str) -> i64 {
    let fetched: OffsetFetchResponse = call(
        stream,
        ApiKey::OffsetFetch,
        8,
        &OffsetFetchRequest::default().with_groups(vec![
            offset_fetch_request::OffsetFetchRequestGroup::default()
                .with_group_id(group(group_id))
                .with_topics(Some(vec![
                    offset_fetch_request::OffsetFetchRequestTopics::default()
                        .with_name(TopicName(s(topic)))
                        .with_partition_indexes(vec![0]),
                ])),
        ]),
    )
    .await;
    fetched.groups[0].topics[0].partitions[0].committed_offset
}

/// The group APIs spoken directly: KIP-394's MEMBER_ID_REQUIRED, describe/list while a member
/// is in, delete refused for a non-empty group and done once it left, offsets deleted with
/// their topic and expired with their empty group.
#[tokio::test]
async fn group_apis_on_the_wire_follow_kafka() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = config(dir.path());
    settings.group_initial_rebalance_delay_ms = 0;
    let (broker, bootstrap) = start(settings).await;
    create_topic(&bootstrap, "wire", 1, &[]).await;
    create_topic(&bootstrap, "doomed", 1, &[]).await;
    let mut stream = TcpStream::connect(broker.local_addr()).await.unwrap();

    let join = JoinGroupRequest::default()
        .with_group_id(group("g"))
        .with_session_timeout_ms(10_000)
        .with_rebalance_timeout_ms(10_000)
        .with_protocol_type(s("consumer"))
        .with_protocols(vec![
            join_group_request::JoinGroupRequestProtocol::default()
                .with_name(s("range"))
                .with_metadata(Bytes::from_static(&[
                    0, 0, 0, 0, 0, 1, 0, 4, b'w', b'i', b'r', b'e',
                ])),
        ]);
    let first: JoinGroupResponse = call(&mut stream, ApiKey::JoinGroup, 9, &join).await;
    assert_eq!(first.error_code, ResponseError::MemberIdRequired.code());
    let member = first.member_id.clone();
    assert!(member.starts_with("raw-test-"), "{member}");
    let joined: JoinGroupResponse = call(
        &mut stream,
        ApiKey::JoinGroup,
        9,
        &join.clone().with_member_id(member.clone()),
    )
    .await;
    assert_eq!(joined.error_code, 0);
    assert_eq!(joined.generation_id, 1);
    assert_eq!(joined.leader, member);
    assert_eq!(joined.protocol_name.as_deref(), Some("range"));
    assert_eq!(joined.members.len(), 1);
    let synced: SyncGroupResponse = call(
        &mut stream,
        ApiKey::SyncGroup,
        5,
        &SyncGroupRequest::default()
            .with_group_id(group("g"))
            .with_generation_id(1)
            .with_member_id(member.clone())
            .with_protocol_type(Some(s("consumer")))
            .with_protocol_name(Some(s("range")))
            .with_assignments(vec![
                sync_group_request::SyncGroupRequestAssignment::default()
                    .with_member_id(member.clone())
                    .with_assignment(Bytes::from_static(b"mine")),
            ]),
    )
    .await;
    assert_eq!(
        (synced.error_code, &synced.assignment[..]),
        (0, &b"mine"[..])
    );

    let described: DescribeGroupsResponse = call(
        &mut stream,
        ApiKey::DescribeGroups,
        5,
        &DescribeGroupsRequest::default().with_groups(vec![group("g"), group("nobody")]),
    )
    .await;
    let g = &described.groups[0];
    assert_eq!(
        (g.group_state.as_str(), g.protocol_data.as_str()),
        ("Stable", "range")
    );
    assert_eq!(g.members[0].client_host.as_str(), "/127.0.0.1");
    assert_eq!(&g.members[0].member_assignment[..], b"mine");
    assert_eq!(described.groups[1].group_state.as_str(), "Dead");

    let wrong_generation: HeartbeatResponse = call(
        &mut stream,
        ApiKey::Heartbeat,
        4,
        &HeartbeatRequest::default()
            .with_group_id(group("g"))
            .with_generation_id(7)
            .with_member_id(member.clone()),
    )
    .await;
    assert_eq!(
        wrong_generation.error_code,
        ResponseError::IllegalGeneration.code()
    );

    let committed: OffsetCommitResponse = call(
        &mut stream,
        ApiKey::OffsetCommit,
        8,
        &commit_request("g", 1, &member, "wire", 3),
    )
    .await;
    assert_eq!(committed.topics[0].partitions[0].error_code, 0);
    let stale: OffsetCommitResponse = call(
        &mut stream,
        ApiKey::OffsetCommit,
        8,
        &commit_request("g", 0, &member, "wire", 9),
    )
    .await;
    assert_eq!(
        stale.topics[0].partitions[0].error_code,
        ResponseError::IllegalGeneration.code()
    );
    assert_eq!(fetch_offset(&mut stream, "g", "wire").await, 3);

    let listed: ListGroupsResponse = call(
        &mut stream,
        ApiKey::ListGroups,
        4,
        &ListGroupsRequest::default(),
    )
    .await;
    assert_eq!(listed.groups.len(), 1);
    assert_eq!(listed.groups[0].group_state.as_str(), "Stable");

    let refused: DeleteGroupsResponse = call(
        &mut stream,
        ApiKey::DeleteGroups,
        2,
        &DeleteGroupsRequest::default().with_groups_names(vec![group("g")]),
    )
    .await;
    assert_eq!(
        refused.results[0].error_code,
        ResponseError::NonEmptyGroup.code()
    );
    let subscribed: OffsetDeleteResponse = call(
        &mut stream,
        ApiKey::OffsetDelete,
        0,
        &OffsetDeleteRequest::default()
            .with_group_id(group("g"))
            .with_topics(vec![
                offset_delete_request::OffsetDeleteRequestTopic::default()
                    .with_name(TopicName(s("wire")))
                    .with_partitions(vec![Default::default()]),
            ]),
    )
    .await;
    assert_eq!(
        subscribed.topics[0].partitions[0].error_code,
        ResponseError::GroupSubscribedToTopic.code()
    );

    let left: LeaveGroupResponse = call(
        &mut stream,
        ApiKey::LeaveGroup,
        5,
        &LeaveGroupRequest::default()
            .with_group_id(group("g"))
            .with_members(vec![
                leave_group_request::MemberIdentity::default().with_member_id(member.clone()),
                leave_group_request::MemberIdentity::default().with_member_id(s("stranger")),
            ]),
    )
    .await;
    assert_eq!(left.members[0].error_code, 0);
    assert_eq!(
        left.members[1].error_code,
        ResponseError::UnknownMemberId.code()
    );
    let deleted: DeleteGroupsResponse = call(
        &mut stream,
        ApiKey::DeleteGroups,
        2,
        &DeleteGroupsRequest::default().with_groups_names(vec![group("g"), group("g")]),
    )
    .await;
    assert_eq!(deleted.results[0].error_code, 0);
    assert_eq!(
        deleted.results[1].error_code,
        ResponseError::GroupIdNotFound.code()
    );
    assert_eq!(fetch_offset(&mut stream, "g", "wire").await, -1);

    // A standalone commit (generation -1), then its topic is deleted: the offset goes with it.
    let standalone: OffsetCommitResponse = call(
        &mut stream,
        ApiKey::OffsetCommit,
        2,
        &commit_request("solo", -1, "", "doomed", 5),
    )
    .await;
    assert_eq!(standalone.topics[0].partitions[0].error_code, 0);
    assert_eq!(fetch_offset(&mut stream, "solo", "doomed").await, 5);
    let _: DeleteTopicsResponse = call(
        &mut stream,
        ApiKey::DeleteTopics,
        4,
        &DeleteTopicsRequest::default()
            .with_topic_names(vec![TopicName(s("doomed"))])
            .with_timeout_ms(5000),
    )
    .await;
    assert_eq!(fetch_offset(&mut stream, "solo", "doomed").await, -1);
    let unknown: OffsetCommitResponse = call(
        &mut stream,
        ApiKey::OffsetCommit,
        8,
        &commit_request("solo", -1, "", "doomed", 5),
    )
    .await;
    assert_eq!(
        unknown.topics[0].partitions[0].error_code,
        ResponseError::UnknownTopicOrPartition.code()
    );
    broker.shutdown().await;
}

/// Joins `group_id` as its only member (JoinGroup v3, no MEMBER_ID_REQUIRED) and syncs;
/// returns the member id of generation 1.
async fn join_alone(stream: &mut TcpStream, group_id: &str) -> StrBytes {
    let joined: JoinGroupResponse = call(
        stream,
        ApiKey::JoinGroup,
        3,
        &JoinGroupRequest::default()
            .with_group_id(group(group_id))
            .with_session_timeout_ms(10_000)
            .with_rebalance_timeout_ms(10_000)
            .with_protocol_type(s("consumer"))
            .with_protocols(vec![
                join_group_request::JoinGroupRequestProtocol::default().with_name(s("range")),
            ]),
    )
    .await;
    assert_eq!((joined.error_code, joined.generation_id), (0, 1));
    let synced: SyncGroupResponse = call(
        stream,
        ApiKey::SyncGroup,
        2,
        &SyncGroupRequest::default()
            .with_group_id(group(group_id))
            .with_generation_id(1)
            .with_member_id(joined.member_id.clone()),
    )
    .await;
    assert_eq!(synced.error_code, 0);
    joined.member_id
}

#[tokio::test]
async fn offsets_of_an_empty_group_expire_after_offsets_retention_minutes() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = config(dir.path());
    settings.offsets_retention_minutes = 0;
    settings.offsets_retention_check_interval_ms = 100;
    settings.group_initial_rebalance_delay_ms = 0;
    let (broker, bootstrap) = start(settings).await;
    create_topic(&bootstrap, "brief", 1, &[]).await;
    let mut stream = TcpStream::connect(broker.local_addr()).await.unwrap();
    let committed: OffsetCommitResponse = call(
        &mut stream,
        ApiKey::OffsetCommit,
        8,
        &commit_request("fleeting", -1, "", "brief", 2),
    )
    .await;
    assert_eq!(committed.topics[0].partitions[0].error_code, 0);

    // A group with a member keeps its offsets however old they are.
    let member = join_alone(&mut stream, "held").await;
    let committed: OffsetCommitResponse = call(
        &mut stream,
        ApiKey::OffsetCommit,
        8,
        &commit_request("held", 1, &member, "brief", 7),
    )
    .await;
    assert_eq!(committed.topics[0].partitions[0].error_code, 0);

    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(fetch_offset(&mut stream, "fleeting", "brief").await, -1);
    assert_eq!(fetch_offset(&mut stream, "held", "brief").await, 7);

    // Once its last member left, the retention counts from then.
    let left: LeaveGroupResponse = call(
        &mut stream,
        ApiKey::LeaveGroup,
        1,
        &LeaveGroupRequest::default()
            .with_group_id(group("held"))
            .with_member_id(member),
    )
    .await;
    assert_eq!(left.error_code, 0);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(fetch_offset(&mut stream, "held", "brief").await, -1);
    let listed: ListGroupsResponse = call(
        &mut stream,
        ApiKey::ListGroups,
        3,
        &ListGroupsRequest::default(),
    )
    .await;
    assert!(
        listed.groups.is_empty(),
        "the empty groups went with their offsets"
    );
    broker.shutdown().await;
}

/// A static member (`group.instance.id`) that restarts within its session timeout takes its
/// old place: same partitions, and the other member sees no rebalance at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_member_restarting_keeps_its_partitions_without_a_rebalance() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = config(dir.path());
    settings.group_initial_rebalance_delay_ms = 500;
    let (broker, bootstrap) = start(settings).await;
    let topic = "static";
    create_topic(&bootstrap, topic, PARTITIONS, &[]).await;
    let observed = Arc::new(Mutex::new(Observed::default()));
    let assignments_of_b = Arc::new(Mutex::new(Vec::new()));
    let spawn = |member: usize, instance: &str, stop: Arc<AtomicBool>| {
        let mut config = member_config(&bootstrap, "statics", "range", "earliest");
        config.set("group.instance.id", instance);
        let observed = Arc::clone(&observed);
        let assignments_of_b = Arc::clone(&assignments_of_b);
        std::thread::spawn(move || {
            run_member(config, topic, &stop, |e| {
                if let (1, Event::Assigned(p)) = (member, &e) {
                    assignments_of_b.lock().unwrap().push(p.clone());
                }
                observed.lock().unwrap().apply(member, e)
            })
        })
    };
    let stop_a = Arc::new(AtomicBool::new(false));
    let stop_b = Arc::new(AtomicBool::new(false));
    let a = spawn(0, "instance-a", Arc::clone(&stop_a));
    let b = spawn(1, "instance-b", Arc::clone(&stop_b));
    wait_for(
        "two static members to split the partitions",
        Duration::from_secs(20),
        || observed.lock().unwrap().partitions_split_among(&[0, 1]),
    )
    .await;
    let before = observed.lock().unwrap().assignments.clone();
    let b_rounds = assignments_of_b.lock().unwrap().len();

    // `a` stops (a static member sends no LeaveGroup) and comes back under the same instance id.
    stop_a.store(true, Ordering::Relaxed);
    a.join().unwrap();
    observed.lock().unwrap().assignments[0].clear();
    let stop_a = Arc::new(AtomicBool::new(false));
    let a = spawn(0, "instance-a", Arc::clone(&stop_a));
    wait_for(
        "the restarted member to get its partitions back",
        Duration::from_secs(20),
        || observed.lock().unwrap().assignments[0] == before[0],
    )
    .await;
    // Longer than a heartbeat interval: a rebalance would have reached `b` by now.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(observed.lock().unwrap().assignments, before);
    assert_eq!(
        assignments_of_b.lock().unwrap().len(),
        b_rounds,
        "the other member was not rebalanced"
    );
    stop_a.store(true, Ordering::Relaxed);
    stop_b.store(true, Ordering::Relaxed);
    a.join().unwrap();
    b.join().unwrap();
    broker.shutdown().await;
}
