//! The broker's own report ([`ferry_broker::BrokerObserver`]): after batches of known size are
//! produced to a 3-partition topic, a group consumes and commits part of them, a transaction is
//! left open and a request fails, `stats()` and the Prometheus text say so, number for number.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use ferry_broker::{BrokerStats, PartitionStats};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ApiKey, ProduceRequest, ProduceResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use tokio::net::TcpStream;

use crate::common::*;

const TOPIC: &str = "metered";
const PARTITIONS: i32 = 3;
const RECORDS_PER_PARTITION: usize = 10;
const VALUE_LEN: usize = 100;
const GROUP: &str = "metered-readers";
/// What the group commits per partition; the lag is what is left of the 10.
const COMMITTED: [i64; 3] = [4, 2, 7];

fn produce(partitions: &[(i32, bytes::Bytes)]) -> ProduceRequest {
    ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_static_str(TOPIC)))
                .with_partition_data(
                    partitions
                        .iter()
                        .map(|(index, batch)| {
                            PartitionProduceData::default()
                                .with_index(*index)
                                .with_records(Some(batch.clone()))
                        })
                        .collect(),
                ),
        ])
}

/// Subscribes to the topic in the group, reads every record (so each batch was fetched), then
/// commits [`COMMITTED`]; returns the consumer, still a member.
fn consume_and_commit(bootstrap: &str) -> BaseConsumer {
    let consumer: BaseConsumer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .set("group.id", GROUP)
        .set("client.id", "metered-client")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    consumer.subscribe(&[TOPIC]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut read = 0;
    while read < PARTITIONS as usize * RECORDS_PER_PARTITION {
        assert!(Instant::now() < deadline, "read {read} records in 20 s");
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(_)) => read += 1,
            Some(Err(e)) => panic!("consume error: {e}"),
            None => {}
        }
    }
    let mut offsets = TopicPartitionList::new();
    for (p, offset) in COMMITTED.iter().enumerate() {
        offsets
            .add_partition_offset(TOPIC, p as i32, Offset::Offset(*offset))
            .unwrap();
    }
    consumer.commit(&offsets, CommitMode::Sync).unwrap();
    consumer
}

fn partition<'a>(stats: &'a BrokerStats, topic: &str, index: i32) -> &'a PartitionStats {
    stats
        .partitions
        .iter()
        .find(|p| p.topic == topic && p.partition == index)
        .unwrap_or_else(|| panic!("{topic}-{index} in {:?}", stats.partitions))
}

fn requests(stats: &BrokerStats, api: &str) -> u64 {
    stats
        .requests
        .iter()
        .find(|a| a.api == api)
        .unwrap_or_else(|| panic!("{api} in the request stats"))
        .requests
}

/// The value of the sample `line_start` (name and labels) in Prometheus text.
fn sample(text: &str, line_start: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(line_start)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no sample `{line_start}` in:\n{text}"))
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_and_prometheus_text_report_offsets_traffic_lag_transactions_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, bootstrap) = start(config(dir.path())).await;
    let observer = broker.observer();
    create_topic(&bootstrap, TOPIC, PARTITIONS, &[]).await;
    create_topic(&bootstrap, "metered-txn", 1, &[]).await;

    // One batch of 10 records of 100-byte values per partition, and a Produce to a partition
    // that does not exist.
    let batch = raw::batch(RECORDS_PER_PARTITION, VALUE_LEN, 1_700_000_000_000);
    let mut stream = TcpStream::connect(broker.local_addr()).await.unwrap();
    let batches: Vec<_> = (0..PARTITIONS).map(|p| (p, batch.clone())).collect();
    let response: ProduceResponse =
        raw::call(&mut stream, ApiKey::Produce, 9, &produce(&batches)).await;
    let codes: Vec<i16> = response.responses[0]
        .partition_responses
        .iter()
        .map(|p| p.error_code)
        .collect();
    assert_eq!(codes, [0, 0, 0]);
    let response: ProduceResponse = raw::call(
        &mut stream,
        ApiKey::Produce,
        9,
        &produce(&[(7, batch.clone())]),
    )
    .await;
    assert_eq!(response.responses[0].partition_responses[0].error_code, 3);

    let consumer = tokio::task::spawn_blocking({
        let bootstrap = bootstrap.clone();
        move || consume_and_commit(&bootstrap)
    })
    .await
    .unwrap();

    // A transaction with one record, left open.
    let txn_producer = producer(&bootstrap, &[("transactional.id", "metered-txn-id")]);
    let txn_producer = tokio::task::spawn_blocking(move || {
        txn_producer
            .init_transactions(Duration::from_secs(10))
            .unwrap();
        txn_producer.begin_transaction().unwrap();
        txn_producer
            .send_result(FutureRecord::<(), str>::to("metered-txn").payload("pending"))
            .map_err(|(e, _)| e)
            .unwrap();
        txn_producer.flush(Duration::from_secs(10)).unwrap();
        txn_producer
    })
    .await
    .unwrap();

    let stats = observer.stats();

    // Offsets and sizes: each partition holds the one batch.
    for p in 0..PARTITIONS {
        let stats = partition(&stats, TOPIC, p);
        assert_eq!(
            (
                stats.log_start_offset,
                stats.high_watermark,
                stats.last_stable_offset
            ),
            (
                0,
                RECORDS_PER_PARTITION as i64,
                RECORDS_PER_PARTITION as i64
            ),
            "{stats:?}"
        );
        assert_eq!(stats.size_bytes, batch.len() as u64);
        assert_eq!(stats.segments, 1);
    }
    // The open transaction holds the last stable offset of its partition back.
    let txn_partition = partition(&stats, "metered-txn", 0);
    assert_eq!(
        (
            txn_partition.high_watermark,
            txn_partition.last_stable_offset
        ),
        (1, 0)
    );

    // Traffic: bytes and records in exactly; out at least everything, once each batch.
    let traffic = stats.topics.iter().find(|t| t.topic == TOPIC).unwrap();
    let total = PARTITIONS as u64 * batch.len() as u64;
    assert_eq!(traffic.bytes_in, total);
    assert_eq!(traffic.records_in, 30);
    assert!(traffic.bytes_out >= total, "{traffic:?}");
    assert_eq!(traffic.bytes_out % batch.len() as u64, 0, "whole batches");
    assert_eq!(
        traffic.records_out,
        traffic.bytes_out / batch.len() as u64 * RECORDS_PER_PARTITION as u64
    );

    // The group: one member with the three partitions, the lag is what was left.
    let group = stats.groups.iter().find(|g| g.group == GROUP).unwrap();
    assert_eq!(
        (group.state.as_str(), group.protocol_type.as_str()),
        ("Stable", "consumer")
    );
    assert_eq!(group.members.len(), 1, "{group:?}");
    assert_eq!(group.members[0].client_id, "metered-client");
    let assigned: Vec<(String, i32)> = group.members[0]
        .assignment
        .iter()
        .map(|tp| (tp.topic.clone(), tp.partition))
        .collect();
    assert_eq!(
        assigned,
        (0..PARTITIONS)
            .map(|p| (TOPIC.to_owned(), p))
            .collect::<Vec<_>>()
    );
    let lag: Vec<(i32, i64, i64)> = group
        .offsets
        .iter()
        .map(|o| (o.partition, o.committed_offset, o.lag))
        .collect();
    assert_eq!(lag, [(0, 4, 6), (1, 2, 8), (2, 7, 3)]);

    // The open transaction.
    assert_eq!(stats.transactions.len(), 1, "{:?}", stats.transactions);
    let txn = &stats.transactions[0];
    assert_eq!(txn.transactional_id, "metered-txn-id");
    assert_eq!(txn.state, "Ongoing");
    assert!(txn.producer_id >= 0);
    assert_eq!(txn.partitions.len(), 1);
    assert_eq!(txn.partitions[0].topic, "metered-txn");
    assert!(txn.start_ms > 0 && txn.duration_ms >= 0, "{txn:?}");

    // Requests, and the failed Produce's error.
    for api in ["Produce", "Fetch", "Metadata", "OffsetCommit", "JoinGroup"] {
        assert!(requests(&stats, api) > 0, "{api}");
    }
    let produce = stats.requests.iter().find(|a| a.api == "Produce").unwrap();
    let unknown = produce
        .errors
        .iter()
        .find(|e| e.error == "UNKNOWN_TOPIC_OR_PARTITION")
        .unwrap_or_else(|| panic!("{:?}", produce.errors));
    assert_eq!((unknown.code, unknown.count), (3, 1));
    assert_eq!(
        produce.latency.count, produce.requests,
        "every request timed"
    );
    let listener = &stats.connections[0];
    assert_eq!(listener.address, broker.local_addr());
    assert!(
        listener.open >= 3 && listener.accepted >= listener.open,
        "{listener:?}"
    );

    // The same numbers in the Prometheus text.
    let mut registry = prometheus_client::registry::Registry::default();
    observer.register_metrics(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let p1 = format!("{{topic=\"{TOPIC}\",partition=\"1\"}}");
    assert_eq!(sample(&text, &format!("kafka_high_watermark{p1}")), 10.0);
    assert_eq!(sample(&text, &format!("kafka_log_start_offset{p1}")), 0.0);
    assert_eq!(
        sample(&text, &format!("kafka_last_stable_offset{p1}")),
        10.0
    );
    assert_eq!(
        sample(&text, &format!("kafka_log_size_bytes{p1}")),
        batch.len() as f64
    );
    assert_eq!(sample(&text, &format!("kafka_log_segments{p1}")), 1.0);
    assert_eq!(
        sample(
            &text,
            "kafka_last_stable_offset{topic=\"metered-txn\",partition=\"0\"}"
        ),
        0.0
    );
    let t = format!("{{topic=\"{TOPIC}\"}}");
    assert_eq!(
        sample(&text, &format!("kafka_topic_bytes_in_total{t}")),
        total as f64
    );
    assert_eq!(
        sample(&text, &format!("kafka_topic_records_in_total{t}")),
        30.0
    );
    assert!(sample(&text, &format!("kafka_topic_bytes_out_total{t}")) >= total as f64);
    assert!(sample(&text, &format!("kafka_topic_records_out_total{t}")) >= 30.0);
    assert!(sample(&text, "kafka_requests_total{api=\"Fetch\"}") > 0.0);
    assert_eq!(
        sample(
            &text,
            "kafka_request_errors_total{api=\"Produce\",error=\"UNKNOWN_TOPIC_OR_PARTITION\"}"
        ),
        1.0
    );
    assert!(
        sample(
            &text,
            "kafka_request_duration_seconds_count{api=\"Metadata\"}"
        ) > 0.0
    );
    assert!(
        sample(
            &text,
            "kafka_request_duration_seconds_bucket{le=\"+Inf\",api=\"Metadata\"}"
        ) > 0.0
    );
    assert!(sample(&text, "kafka_connections{listener=\"PLAINTEXT\"}") >= 3.0);
    assert_eq!(
        sample(
            &text,
            &format!("kafka_group_members{{group=\"{GROUP}\",state=\"Stable\"}}")
        ),
        1.0
    );
    for (p, (committed, lag)) in [(4, 6), (2, 8), (7, 3)].into_iter().enumerate() {
        let labels = format!("{{group=\"{GROUP}\",topic=\"{TOPIC}\",partition=\"{p}\"}}");
        assert_eq!(
            sample(&text, &format!("kafka_group_lag{labels}")),
            f64::from(lag)
        );
        assert_eq!(
            sample(&text, &format!("kafka_group_committed_offset{labels}")),
            f64::from(committed)
        );
    }
    assert_eq!(sample(&text, "kafka_open_transactions"), 1.0);
    assert!(text.contains("# TYPE kafka_request_duration_seconds histogram"));

    drop(consumer);
    drop(txn_producer);
    broker.shutdown().await;
    // The observer outlives the handle and still reports.
    assert_eq!(partition(&observer.stats(), TOPIC, 0).high_watermark, 10);
}
