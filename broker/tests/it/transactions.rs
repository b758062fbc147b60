//! Transactions with real librdkafka transactional producers and consumers (the `rdkafka`
//! crate) against the real broker, as Kafka behaves: committed transactions are visible to
//! `read_committed` consumers and aborted ones are not, `read_uncommitted` consumers see every
//! data record and never a marker, a second producer with the same `transactional.id` fences
//! the first, an abandoned transaction is aborted after its timeout so `read_committed`
//! consumers move past it, and offsets sent to a transaction count only once it commits.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use ferry_broker::BrokerConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

use crate::common::*;

const PARTITIONS: i32 = 3;
const TXN_TIMEOUT: Duration = Duration::from_secs(20);
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// A transactional producer, initialised (InitProducerId done).
fn transactional_producer(bootstrap: &str, id: &str, settings: &[(&str, &str)]) -> FutureProducer {
    let mut all = vec![("transactional.id", id)];
    all.extend_from_slice(settings);
    let producer = producer(bootstrap, &all);
    producer.init_transactions(TXN_TIMEOUT).unwrap();
    producer
}

/// Queues `values`, value `i` to partition `i % PARTITIONS` (within the open transaction).
fn send_all(producer: &FutureProducer, topic: &str, values: &[String]) {
    for (i, value) in values.iter().enumerate() {
        let record = FutureRecord::<(), str>::to(topic)
            .payload(value)
            .partition((i % PARTITIONS as usize) as i32);
        if let Err((e, _)) = producer.send_result(record) {
            panic!("queueing {value}: {e}");
        }
    }
}

/// The values of transaction `t`: `t{t}-{i}`.
fn transaction_values(t: usize, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("t{t}-{i}")).collect()
}

/// A broker config whose coordinator looks for timed-out transactions every `interval_ms`.
fn config_with_txn_cleanup(dir: &Path, interval_ms: u64) -> BrokerConfig {
    BrokerConfig {
        transaction_abort_timed_out_transaction_cleanup_interval_ms: interval_ms,
        ..config(dir)
    }
}

fn high_watermarks(bootstrap: &str, topic: &str) -> Vec<i64> {
    let consumer: BaseConsumer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .create()
        .unwrap();
    (0..PARTITIONS)
        .map(|p| {
            consumer
                .fetch_watermarks(topic, p, Duration::from_secs(10))
                .unwrap()
                .1
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn read_committed_sees_only_committed_transactions_and_read_uncommitted_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, bootstrap) = start(config(dir.path())).await;
    let topic = "orders";
    create_topic(&bootstrap, topic, PARTITIONS, &[]).await;
    let producer = transactional_producer(&bootstrap, "orders-writer", &[]);

    const TRANSACTIONS: usize = 9;
    const PER_TRANSACTION: usize = 30;
    let mut committed = Vec::new();
    let mut everything = Vec::new();
    for t in 0..TRANSACTIONS {
        producer.begin_transaction().unwrap();
        let values = transaction_values(t, PER_TRANSACTION);
        send_all(&producer, topic, &values);
        // Every third transaction is aborted, once its records are in the log.
        if t % 3 == 1 {
            producer.flush(TXN_TIMEOUT).unwrap();
            producer.abort_transaction(TXN_TIMEOUT).unwrap();
        } else {
            producer.commit_transaction(TXN_TIMEOUT).unwrap();
            committed.extend(values.iter().cloned());
        }
        everything.extend(values);
    }
    committed.sort();
    everything.sort();

    // Each transaction wrote a tenth of its records and one marker to each partition.
    let per_partition =
        (TRANSACTIONS * PER_TRANSACTION / PARTITIONS as usize + TRANSACTIONS) as i64;
    assert_eq!(
        high_watermarks(&bootstrap, topic),
        vec![per_partition; PARTITIONS as usize]
    );

    let read = read_to_end(
        &bootstrap,
        topic,
        PARTITIONS,
        "read_committed",
        READ_TIMEOUT,
    );
    assert_eq!(sorted_values(&read), committed, "read_committed");
    let read = read_to_end(
        &bootstrap,
        topic,
        PARTITIONS,
        "read_uncommitted",
        READ_TIMEOUT,
    );
    assert_eq!(
        sorted_values(&read),
        everything,
        "read_uncommitted: data, no marker"
    );
    // Per partition the records keep the order they were sent in.
    let mut order: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    for r in &read {
        order.entry(r.partition).or_default().push(r.offset);
    }
    for offsets in order.values() {
        assert!(offsets.windows(2).all(|w| w[0] < w[1]), "{offsets:?}");
    }
}

fn is_fenced(error: &KafkaError) -> bool {
    match error {
        KafkaError::Transaction(e) => {
            e.is_fatal()
                && matches!(
                    e.code(),
                    RDKafkaErrorCode::Fenced
                        | RDKafkaErrorCode::ProducerFenced
                        | RDKafkaErrorCode::InvalidProducerEpoch
                )
        }
        _ => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_producer_with_the_same_transactional_id_fences_the_old_one() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, bootstrap) = start(config(dir.path())).await;
    let topic = "fenced";
    create_topic(&bootstrap, topic, PARTITIONS, &[]).await;

    let old = transactional_producer(&bootstrap, "fence-me", &[]);
    old.begin_transaction().unwrap();
    send_all(&old, topic, &transaction_values(0, 6));
    old.commit_transaction(TXN_TIMEOUT).unwrap();

    let new = transactional_producer(&bootstrap, "fence-me", &[]);

    // The old producer's next transaction fails with a fatal "fenced" error.
    let fenced = old.begin_transaction().and_then(|()| {
        send_all(&old, topic, &transaction_values(1, 6));
        old.commit_transaction(TXN_TIMEOUT)
    });
    match fenced {
        Err(e) => assert!(is_fenced(&e), "expected a fatal fenced error, got {e:?}"),
        Ok(()) => panic!("the fenced producer committed a transaction"),
    }

    new.begin_transaction().unwrap();
    send_all(&new, topic, &transaction_values(2, 6));
    new.commit_transaction(TXN_TIMEOUT).unwrap();

    let mut expected = transaction_values(0, 6);
    expected.extend(transaction_values(2, 6));
    expected.sort();
    let read = read_to_end(
        &bootstrap,
        topic,
        PARTITIONS,
        "read_committed",
        READ_TIMEOUT,
    );
    assert_eq!(sorted_values(&read), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_abandoned_transaction_is_aborted_after_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, bootstrap) = start(config_with_txn_cleanup(dir.path(), 100)).await;
    let topic = "abandoned";
    create_topic(&bootstrap, topic, PARTITIONS, &[]).await;

    // Opens a transaction, writes to every partition and goes quiet.
    let stale = transactional_producer(
        &bootstrap,
        "goes-quiet",
        &[
            ("transaction.timeout.ms", "1000"),
            ("message.timeout.ms", "1000"),
        ],
    );
    stale.begin_transaction().unwrap();
    send_all(&stale, topic, &transaction_values(0, 6));
    stale.flush(TXN_TIMEOUT).unwrap();

    // A transaction committed after it: read_committed consumers reach it only once the
    // abandoned one, which starts before it in every partition, is ended by the coordinator.
    let later = transactional_producer(&bootstrap, "keeps-going", &[]);
    later.begin_transaction().unwrap();
    send_all(&later, topic, &transaction_values(1, 6));
    later.commit_transaction(TXN_TIMEOUT).unwrap();

    let read = read_until(&bootstrap, topic, 6, READ_TIMEOUT);
    assert_eq!(
        sorted_values(&read),
        transaction_values(1, 6),
        "only the committed transaction"
    );

    // The coordinator bumped the epoch when it aborted: the quiet producer cannot commit.
    assert!(
        stale.commit_transaction(TXN_TIMEOUT).is_err(),
        "a transaction aborted by its timeout was committed"
    );
    let read = read_to_end(
        &bootstrap,
        topic,
        PARTITIONS,
        "read_committed",
        READ_TIMEOUT,
    );
    assert_eq!(sorted_values(&read), transaction_values(1, 6));
}

/// Reads `read_committed` until `count` records arrived, panicking after `timeout`.
fn read_until(bootstrap: &str, topic: &str, count: usize, timeout: Duration) -> Vec<Consumed> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let read = read_to_end(bootstrap, topic, PARTITIONS, "read_committed", timeout);
        if read.len() >= count {
            return read;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "read_committed saw {} of {count} records within {timeout:?}",
            read.len()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn offsets_sent_to_a_transaction_are_committed_only_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, bootstrap) = start(config(dir.path())).await;
    create_topic(&bootstrap, "input", 1, &[]).await;
    create_topic(&bootstrap, "output", PARTITIONS, &[]).await;
    let group = "transformers";
    let consumer: BaseConsumer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("broker.address.family", "v4")
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let committed = || {
        let mut partitions = TopicPartitionList::new();
        partitions.add_partition("input", 0);
        let offsets = consumer
            .committed_offsets(partitions, Duration::from_secs(10))
            .unwrap();
        offsets.find_partition("input", 0).unwrap().offset()
    };
    let offsets = |n: i64| {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset("input", 0, Offset::Offset(n))
            .unwrap();
        tpl
    };
    let producer = transactional_producer(&bootstrap, "transformer", &[]);
    let metadata = consumer.group_metadata().unwrap();

    producer.begin_transaction().unwrap();
    send_all(&producer, "output", &transaction_values(0, 3));
    producer
        .send_offsets_to_transaction(&offsets(5), &metadata, TXN_TIMEOUT)
        .unwrap();
    producer.abort_transaction(TXN_TIMEOUT).unwrap();
    assert_eq!(
        committed(),
        Offset::Invalid,
        "offsets of an aborted transaction"
    );

    producer.begin_transaction().unwrap();
    send_all(&producer, "output", &transaction_values(1, 3));
    producer
        .send_offsets_to_transaction(&offsets(7), &metadata, TXN_TIMEOUT)
        .unwrap();
    producer.commit_transaction(TXN_TIMEOUT).unwrap();
    assert_eq!(
        committed(),
        Offset::Offset(7),
        "offsets of a committed transaction"
    );
}
