//! What clients make the broker hold past connections and requests, each bounded by a setting
//! and counted in `kafka_limit_reached_total`: members of a group, groups, transactional ids,
//! producer states per partition, fetches waiting for data. Each test has real clients
//! (librdkafka, or raw requests where no client would go past the bound) go past a bound
//! while a well-behaved client keeps working.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{ApiKey, FetchRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use crate::limits::{Broker, api_versions, commit_offset, create_topic, frame_as};

fn producer(bootstrap: &str, extra: &[(&str, &str)]) -> BaseProducer {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "0")
        .set("enable.idempotence", "true");
    for (k, v) in extra {
        config.set(*k, *v);
    }
    config.create().unwrap()
}

fn consumer(bootstrap: &str, group: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
        .create()
        .unwrap()
}

fn send(producer: &BaseProducer, topic: &str, value: &str) {
    producer
        .send(BaseRecord::to(topic).key(value).payload(value))
        .map_err(|(e, _)| e)
        .unwrap();
}

/// Sends each of `values` to `topic` with `producer`, in order: the values sent.
fn send_each(
    producer: &BaseProducer,
    topic: &str,
    values: impl Iterator<Item = String>,
) -> BTreeSet<String> {
    values
        .inspect(|value| send(producer, topic, value))
        .collect()
}

/// Polls `consumers` until `want` distinct values came, for at most `timeout`; returns how
/// many times each value came.
fn consume(consumers: &[&BaseConsumer], want: usize, timeout: Duration) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    let deadline = Instant::now() + timeout;
    while seen.len() < want && Instant::now() < deadline {
        for consumer in consumers {
            if let Some(Ok(message)) = consumer.poll(Duration::from_millis(50)) {
                let value = String::from_utf8_lossy(message.payload().unwrap()).into_owned();
                *seen.entry(value).or_insert(0) += 1;
            }
        }
    }
    seen
}

fn assert_each_once(seen: &BTreeMap<String, usize>, expected: &BTreeSet<String>) {
    let got: BTreeSet<String> = seen.keys().cloned().collect();
    let missing: Vec<_> = expected.difference(&got).collect();
    assert!(missing.is_empty(), "missing: {missing:?}");
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "read more than once: {twice:?}");
}

/// A read_committed consumer of `topic` in group `reader` on `bootstrap` reads each of
/// `expected` exactly once within 60 s.
fn read_each_once(bootstrap: &str, topic: &str, expected: &BTreeSet<String>) {
    let reader = consumer(bootstrap, "reader");
    reader.subscribe(&[topic]).unwrap();
    let seen = consume(&[&reader], expected.len(), Duration::from_secs(60));
    assert_each_once(&seen, expected);
}

fn reached(broker: &Broker, limit: &str) -> f64 {
    broker.metric(&format!("kafka_limit_reached_total{{limit=\"{limit}\"}}"))
}

/// Four librdkafka consumers join a group that may have three members: one is refused with
/// GROUP_MAX_SIZE_REACHED and the three share every record. Standalone commits for new
/// groups past `max_groups` get POLICY_VIOLATION, and the group there keeps consuming.
#[test]
fn members_and_groups_past_their_bounds_are_refused_and_the_group_keeps_consuming() {
    const POLICY_VIOLATION: i16 = 44;
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(
        dir.path(),
        "group_max_size: 3\nmax_groups: 3\nnum_partitions: 6\n\
         group_initial_rebalance_delay_ms: 500\n",
        None,
    );
    let bootstrap = broker.address.to_string();
    let p = producer(&bootstrap, &[]);
    let expected = send_each(&p, "events", (0..120).map(|i| format!("first-{i}")));
    p.flush(Duration::from_secs(30)).unwrap();

    let members: Vec<BaseConsumer> = (0..4).map(|_| consumer(&bootstrap, "big")).collect();
    for m in &members {
        m.subscribe(&["events"]).unwrap();
    }
    let refs: Vec<&BaseConsumer> = members.iter().collect();
    let seen = consume(&refs, expected.len(), Duration::from_secs(60));
    assert_each_once(&seen, &expected);
    assert!(
        reached(&broker, "group_max_size") >= 1.0,
        "no member was refused"
    );
    let (status, body) = crate::harness::http_get(&broker.http, "/metrics");
    assert_eq!(status, 200);
    let in_group = body
        .lines()
        .find(|l| l.starts_with("kafka_group_members{group=\"big\""))
        .unwrap_or_else(|| panic!("no members of big in:\n{body}"));
    assert!(in_group.ends_with(" 3"), "{in_group}");

    // "big" is one group; two more fit, the next is refused.
    let mut stream = broker.connect();
    assert_eq!(commit_offset(&mut stream, "tool-1", "events", 0), 0);
    assert_eq!(commit_offset(&mut stream, "tool-2", "events", 0), 0);
    assert_eq!(
        commit_offset(&mut stream, "tool-3", "events", 0),
        POLICY_VIOLATION
    );
    assert!(reached(&broker, "max_groups") >= 1.0);
    assert!(broker.log().contains("max_groups"), "{}", broker.log());

    // The group at its bound keeps working: new records are read, once.
    let more = send_each(&p, "events", (0..60).map(|i| format!("second-{i}")));
    p.flush(Duration::from_secs(30)).unwrap();
    let seen = consume(&refs, more.len(), Duration::from_secs(60));
    assert_each_once(&seen, &more);
}

/// With room for two transactional ids, a third producer's InitProducerId is refused with
/// POLICY_VIOLATION, while the two go on committing transactions read once by a
/// read_committed consumer.
#[test]
fn transactional_ids_past_the_bound_are_refused_and_the_others_commit() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path(), "max_transactional_ids: 2\n", None);
    let bootstrap = broker.address.to_string();
    let transactional = |id: &str| {
        producer(
            &bootstrap,
            &[
                ("transactional.id", id),
                ("transaction.timeout.ms", "10000"),
            ],
        )
    };
    let first = transactional("txn-1");
    let second = transactional("txn-2");
    first.init_transactions(Duration::from_secs(30)).unwrap();
    second.init_transactions(Duration::from_secs(30)).unwrap();
    let third = transactional("txn-3");
    // librdkafka retries the refusal until its timeout, then reports it.
    let refused = third.init_transactions(Duration::from_secs(3)).unwrap_err();
    assert!(
        refused.to_string().to_lowercase().contains("policy"),
        "{refused}"
    );
    assert!(reached(&broker, "max_transactional_ids") >= 1.0);

    let mut expected = BTreeSet::new();
    for round in 0..3 {
        for (name, p) in [("txn-1", &first), ("txn-2", &second)] {
            p.begin_transaction().unwrap();
            let values = (0..10).map(|i| format!("{name}-{round}-{i}"));
            expected.extend(send_each(p, "committed", values));
            p.commit_transaction(Duration::from_secs(30)).unwrap();
        }
    }
    read_each_once(&bootstrap, "committed", &expected);
}

/// Sixty idempotent producers that each write one record and go, with room for twenty
/// producer states per partition: the least recently written are forgotten (counted), a
/// steady idempotent producer writing all along is never refused, and every record is read
/// once.
#[test]
fn producer_states_past_the_bound_are_forgotten_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(
        dir.path(),
        "max_producer_ids_per_partition: 20\nnum_partitions: 1\n",
        None,
    );
    let bootstrap = broker.address.to_string();
    let steady = producer(&bootstrap, &[]);
    // Created together, so that their connections and producer ids are got in parallel.
    let many: Vec<BaseProducer> = (0..60).map(|_| producer(&bootstrap, &[])).collect();
    let mut expected = BTreeSet::new();
    for (i, once) in many.iter().enumerate() {
        let value = format!("once-{i}");
        send(once, "producers", &value);
        once.flush(Duration::from_secs(30)).unwrap();
        expected.insert(value);
        let value = format!("steady-{i}");
        send(&steady, "producers", &value);
        steady.flush(Duration::from_secs(30)).unwrap();
        expected.insert(value);
    }
    let forgotten = reached(&broker, "max_producer_ids_per_partition");
    // 61 producers on one partition that keeps 20: at least 41 forgotten.
    assert!(forgotten >= 41.0, "forgotten: {forgotten}");
    read_each_once(&bootstrap, "producers", &expected);
}

/// A hundred connections each leave a fetch waiting 30 s for a megabyte that never comes;
/// twenty of them are woken by appends, the others wait unwoken (counted). A librdkafka
/// consumer reads every record a producer writes meanwhile, and ApiVersions is answered.
#[test]
fn fetches_past_max_pending_fetches_wait_unwoken_and_consumers_get_everything() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path(), "max_pending_fetches: 20\n", None);
    let bootstrap = broker.address.to_string();
    let mut stream = broker.connect();
    assert_eq!(create_topic(&mut stream, "quiet").0, 0);
    let fetch = FetchRequest::default()
        .with_max_wait_ms(30_000)
        .with_min_bytes(1 << 20)
        .with_max_bytes(1 << 20)
        .with_topics(vec![
            FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_static_str("quiet")))
                .with_partitions(vec![
                    FetchPartition::default()
                        .with_partition(0)
                        .with_fetch_offset(0)
                        .with_partition_max_bytes(1 << 20),
                ]),
        ]);
    let frame = frame_as("long-poll", ApiKey::Fetch, 4, &fetch);
    let waiting: Vec<TcpStream> = (0..100)
        .map(|_| {
            let mut s = broker.connect();
            s.write_all(&frame).unwrap();
            s
        })
        .collect();
    crate::harness::wait_until(
        Duration::from_secs(10),
        "fetches past the bound to be counted",
        || reached(&broker, "max_pending_fetches") >= 80.0,
    );

    let p = producer(&bootstrap, &[]);
    let reader = consumer(&bootstrap, "reader");
    reader.subscribe(&["busy"]).unwrap();
    let expected = send_each(&p, "busy", (0..100).map(|i| format!("busy-{i}")));
    p.flush(Duration::from_secs(30)).unwrap();
    let seen = consume(&[&reader], expected.len(), Duration::from_secs(60));
    assert_each_once(&seen, &expected);
    let started = Instant::now();
    assert!(api_versions(&mut broker.connect()).is_some());
    assert!(started.elapsed() < Duration::from_secs(1));
    drop(waiting);
}
