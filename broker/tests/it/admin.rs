//! Topic administration, offsets lookups and long polling with librdkafka.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::{Duration, Instant};

use rdkafka::admin::{AdminOptions, NewPartitions, ResourceSpecifier};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::FutureRecord;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::common::*;

fn options() -> AdminOptions {
    AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_are_created_described_grown_and_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, bootstrap) = start(config(dir.path())).await;
    let admin = admin(&bootstrap);
    create_topic(&bootstrap, "admin-t", 2, &[("retention.ms", "3600000")]).await;

    // Creating it again fails with TopicAlreadyExists.
    let again = admin
        .create_topics(
            [&rdkafka::admin::NewTopic::new(
                "admin-t",
                1,
                rdkafka::admin::TopicReplication::Fixed(1),
            )],
            &options(),
        )
        .await
        .unwrap();
    assert!(matches!(
        again[0],
        Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists))
    ));

    let configs = admin
        .describe_configs([&ResourceSpecifier::Topic("admin-t")], &options())
        .await
        .unwrap();
    let resource = configs.into_iter().next().unwrap().unwrap();
    let retention = resource.get("retention.ms").unwrap();
    assert_eq!(retention.value.as_deref(), Some("3600000"));
    assert!(matches!(
        retention.source,
        rdkafka::admin::ConfigSource::DynamicTopic
    ));
    assert_eq!(
        resource.get("segment.bytes").unwrap().value.as_deref(),
        Some("1073741824")
    );
    assert!(matches!(
        resource.get("segment.bytes").unwrap().source,
        rdkafka::admin::ConfigSource::Default
    ));

    let grown = admin
        .create_partitions([&NewPartitions::new("admin-t", 5)], &options())
        .await
        .unwrap();
    assert!(grown[0].is_ok(), "{grown:?}");
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    let metadata = consumer
        .fetch_metadata(Some("admin-t"), Duration::from_secs(10))
        .unwrap();
    assert_eq!(metadata.topics()[0].partitions().len(), 5);
    assert!(dir.path().join("admin-t-4").is_dir());

    let shrink = admin
        .create_partitions([&NewPartitions::new("admin-t", 3)], &options())
        .await
        .unwrap();
    assert!(shrink[0].is_err(), "the partition count cannot shrink");

    let deleted = admin
        .delete_topics(&["admin-t", "never-existed"], &options())
        .await
        .unwrap();
    assert!(deleted[0].is_ok());
    assert!(matches!(
        deleted[1],
        Err((_, rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition))
    ));
    assert!(
        !dir.path().join("admin-t-0").exists(),
        "partition directories removed"
    );
    let metadata = consumer
        .fetch_metadata(None, Duration::from_secs(10))
        .unwrap();
    assert!(metadata.topics().iter().all(|t| t.name() != "admin-t"));
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_are_found_by_earliest_latest_and_timestamp() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, bootstrap) = start(config(dir.path())).await;
    create_topic(&bootstrap, "times", 1, &[("index.interval.bytes", "100")]).await;
    let producer = producer(&bootstrap, &[("linger.ms", "0")]);
    // Record i stamped 1_000_000 + 10 * i, one batch each.
    for i in 0..200i64 {
        producer
            .send(
                FutureRecord::to("times")
                    .partition(0)
                    .key("k")
                    .payload("v")
                    .timestamp(1_000_000 + 10 * i),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
    }
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    assert_eq!(
        consumer
            .fetch_watermarks("times", 0, Duration::from_secs(10))
            .unwrap(),
        (0, 200)
    );
    for (ts, expected) in [
        (1_000_000, 0),
        (1_000_005, 1),
        (1_000_500, 50),
        (1_001_990, 199),
    ] {
        let mut query = TopicPartitionList::new();
        query
            .add_partition_offset("times", 0, Offset::Offset(ts))
            .unwrap();
        let found = consumer
            .offsets_for_times(query, Duration::from_secs(10))
            .unwrap();
        assert_eq!(
            found.elements()[0].offset(),
            Offset::Offset(expected),
            "timestamp {ts}"
        );
    }
    let mut query = TopicPartitionList::new();
    query
        .add_partition_offset("times", 0, Offset::Offset(9_000_000))
        .unwrap();
    let found = consumer
        .offsets_for_times(query, Duration::from_secs(10))
        .unwrap();
    assert_eq!(
        found.elements()[0].offset(),
        Offset::End,
        "no record that late"
    );
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_fetch_returns_as_soon_as_a_record_arrives() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, bootstrap) = start(config(dir.path())).await;
    create_topic(&bootstrap, "poll", 1, &[]).await;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "poll-test")
        .set("fetch.wait.max.ms", "5000")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset("poll", 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&assignment).unwrap();
    // Let the consumer park a long-polling fetch on the empty partition.
    assert!(consumer.poll(Duration::from_millis(300)).is_none());
    let sent = Instant::now();
    producer(&bootstrap, &[("linger.ms", "0")])
        .send(
            FutureRecord::to("poll").key("k").payload("wake up"),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    let message = tokio::task::spawn_blocking(move || {
        let m = consumer.poll(Duration::from_secs(10)).unwrap().unwrap();
        m.payload().map(<[u8]>::to_vec)
    })
    .await
    .unwrap();
    assert_eq!(message.as_deref(), Some(&b"wake up"[..]));
    assert!(
        sent.elapsed() < Duration::from_secs(3),
        "delivered by the waiting fetch, not after max wait: {:?}",
        sent.elapsed()
    );
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn altering_retention_applies_to_a_live_topic_and_the_handle_reports_offsets() {
    use kafka_protocol::messages::incremental_alter_configs_request::{
        AlterConfigsResource, AlterableConfig,
    };
    use kafka_protocol::messages::{
        ApiKey, IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
    };
    use kafka_protocol::protocol::StrBytes;

    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.log_retention_check_interval_ms = 50;
    let (broker, bootstrap) = start(config).await;
    create_topic(&bootstrap, "live", 1, &[("segment.bytes", "4096")]).await;
    let producer = producer(&bootstrap, &[("batch.size", "1000"), ("linger.ms", "1")]);
    let payload = vec![b'p'; 200];
    for _ in 0..200 {
        producer
            .send(
                FutureRecord::to("live").key("k").payload(&payload),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
    }
    let before = broker.topics();
    assert_eq!(before.len(), 1);
    let partition = &before[0].partitions[0];
    assert_eq!(
        (partition.log_start_offset, partition.log_end_offset),
        (0, 200)
    );
    assert!(partition.segments > 3, "{partition:?}");

    // retention.bytes=5000 set on the running topic.
    let mut stream = tokio::net::TcpStream::connect(broker.local_addr())
        .await
        .unwrap();
    let request = IncrementalAlterConfigsRequest::default().with_resources(vec![
        AlterConfigsResource::default()
            .with_resource_type(2)
            .with_resource_name(StrBytes::from_static_str("live"))
            .with_configs(vec![
                AlterableConfig::default()
                    .with_name(StrBytes::from_static_str("retention.bytes"))
                    .with_config_operation(0)
                    .with_value(Some(StrBytes::from_static_str("5000"))),
            ]),
    ]);
    let response: IncrementalAlterConfigsResponse =
        common::raw::call(&mut stream, ApiKey::IncrementalAlterConfigs, 1, &request).await;
    assert_eq!(response.responses[0].error_code, 0);

    wait_for("retention.bytes to apply", Duration::from_secs(10), || {
        let p = &broker.topics()[0].partitions[0];
        p.log_start_offset > 0 && p.size_bytes <= 5000 + 4096
    })
    .await;
    let after = &broker.topics()[0].partitions[0];
    assert_eq!(after.log_end_offset, 200);

    // The override survives a restart (it lives in the catalog).
    broker.shutdown().await;
    let (broker, bootstrap) = start(common::config(dir.path())).await;
    let admin = admin(&bootstrap);
    let configs = admin
        .describe_configs([&ResourceSpecifier::Topic("live")], &options())
        .await
        .unwrap();
    let resource = configs.into_iter().next().unwrap().unwrap();
    assert_eq!(
        resource.get("retention.bytes").unwrap().value.as_deref(),
        Some("5000")
    );
    broker.shutdown().await;
}
