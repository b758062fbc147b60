//! `agent delete-records` (kafka-delete-records.sh) against the bundled broker run by the agent:
//! Kafka's output, the log start offset seen by `agent get-offsets` and by librdkafka consumers,
//! the segments below it gone from the data directory, the start kept across a SIGKILL, -1
//! emptying the partition, errors per partition as Kafka's tool prints them, bad offset files
//! named with the field, and the Delete ACL the broker requires.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use nix::sys::signal::Signal;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Message, Offset, TopicPartitionList};

use crate::harness;

use crate::harness::{Agent, free_port, wait_until};

use crate::harness::agent_ok as ok;

fn agent(args: &[&str]) -> Output {
    harness::agent_output(args, None)
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// Runs `agent delete-records` on an offset file holding `json`.
fn delete_records(dir: &Path, bootstrap: &str, json: &str) -> Output {
    let file = dir.join("offsets.json");
    std::fs::write(&file, json).unwrap();
    agent(&[
        "delete-records",
        "--bootstrap-server",
        bootstrap,
        "--offset-json-file",
        file.to_str().unwrap(),
    ])
}

fn earliest(bootstrap: &str, topic: &str) -> String {
    ok(&[
        "get-offsets",
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--time",
        "earliest",
    ])
}

/// Produces `count` records `v0`, `v1`, ... to partition 0 of `topic`, one batch each.
fn produce(bootstrap: &str, topic: &str, count: usize) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "0")
        .create()
        .unwrap();
    for i in 0..count {
        let value = format!("v{i}");
        producer
            .send(BaseRecord::<(), _>::to(topic).partition(0).payload(&value))
            .unwrap();
        producer.flush(Duration::from_secs(10)).unwrap();
    }
}

/// A consumer of partition 0 of `topic` from `offset`, with `auto.offset.reset` `reset`.
fn consumer(bootstrap: &str, topic: &str, offset: Offset, reset: &str) -> BaseConsumer {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "delete-records-test")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", reset)
        .create()
        .unwrap();
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(topic, 0, offset).unwrap();
    consumer.assign(&list).unwrap();
    consumer
}

/// The offsets and values read from the beginning of partition 0, until `count` records.
fn read_from_beginning(bootstrap: &str, topic: &str, count: usize) -> Vec<(i64, String)> {
    let consumer = consumer(bootstrap, topic, Offset::Beginning, "earliest");
    let mut read = Vec::new();
    wait_until(Duration::from_secs(30), "the records", || {
        if let Some(message) = consumer.poll(Duration::from_millis(200)) {
            let message = message.unwrap();
            let value = String::from_utf8(message.payload().unwrap().to_vec()).unwrap();
            read.push((message.offset(), value));
        }
        read.len() >= count
    });
    read
}

/// The base offsets of the segments of `dir`, in order.
fn segment_bases(dir: &Path) -> Vec<i64> {
    let mut bases: Vec<i64> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".log")?.parse().ok()
        })
        .collect();
    bases.sort_unstable();
    bases
}

#[test]
fn delete_records_moves_the_log_start_deletes_whole_segments_and_survives_a_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let (mut broker, bootstrap) = harness::broker_agent(dir.path(), 1);
    let b = bootstrap.as_str();
    ok(&[
        "topics",
        "--bootstrap-server",
        b,
        "--create",
        "--topic",
        "trimmed",
        "--config",
        "segment.bytes=280",
    ]);
    produce(b, "trimmed", 10);
    let partition_dir = dir.path().join("broker/trimmed-0");
    let before = segment_bases(&partition_dir);
    assert!(before.len() >= 3, "segments {before:?}");
    assert_eq!(before[0], 0);

    let out = delete_records(
        dir.path(),
        b,
        r#"{"partitions":[{"topic":"trimmed","partition":0,"offset":6}],"version":1}"#,
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        stdout(&out),
        "Executing records delete operation\nRecords delete operation completed:\n\
         partition: trimmed-0\tlow_watermark: 6\n"
    );
    assert_eq!(earliest(b, "trimmed"), "trimmed:0:6\n");

    // The segments wholly below 6 are gone: the first one left holds 6, those after it too.
    let after = segment_bases(&partition_dir);
    assert!(after.len() < before.len(), "{before:?} then {after:?}");
    assert!(
        after[0] <= 6 && after.get(1).is_none_or(|next| *next > 6),
        "{after:?}"
    );
    for base in before.iter().filter(|b| !after.contains(b)) {
        let next = before.iter().find(|n| *n > base).unwrap();
        assert!(
            *next <= 6,
            "segment {base} held offsets from 6 on: {after:?}"
        );
    }

    // A consumer from the beginning starts at 6; a fetch at 2 is out of range.
    let read = read_from_beginning(b, "trimmed", 4);
    assert_eq!(
        read,
        (6..10).map(|i| (i, format!("v{i}"))).collect::<Vec<_>>()
    );
    // (librdkafka reports the OFFSET_OUT_OF_RANGE answer as AutoOffsetReset when the reset
    // policy is `error`; at 6 the same consumer reads.)
    let first_at = |offset| {
        let consumer = consumer(b, "trimmed", Offset::Offset(offset), "error");
        let mut got = None;
        wait_until(Duration::from_secs(30), "a record or an error", || {
            got = consumer
                .poll(Duration::from_millis(200))
                .map(|r| r.map(|m| m.offset()));
            got.is_some()
        });
        got.unwrap()
    };
    match first_at(2) {
        Err(KafkaError::MessageConsumption(RDKafkaErrorCode::AutoOffsetReset)) => {}
        other => panic!("a fetch at 2 got {other:?}"),
    }
    assert_eq!(first_at(6).unwrap(), 6);

    // After a SIGKILL the start is still 6.
    broker.signal(Signal::SIGKILL);
    broker.wait(Duration::from_secs(10));
    drop(broker);
    let (broker, bootstrap) = harness::broker_agent(dir.path(), 1);
    let b = bootstrap.as_str();
    assert_eq!(earliest(b, "trimmed"), "trimmed:0:6\n");
    assert_eq!(read_from_beginning(b, "trimmed", 4)[0], (6, "v6".into()));

    // Past the high watermark: Kafka's error, the start unchanged; unknown partitions each
    // get their error line.
    let out = delete_records(
        dir.path(),
        b,
        r#"{"partitions":[{"topic":"trimmed","partition":0,"offset":11},
            {"topic":"missing","partition":0,"offset":1}],"version":1}"#,
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        stdout(&out),
        "Executing records delete operation\nRecords delete operation completed:\n\
         partition: trimmed-0\terror: org.apache.kafka.common.errors.OffsetOutOfRangeException: \
         The requested offset is not within the range of offsets maintained by the server.\n\
         partition: missing-0\terror: org.apache.kafka.common.errors.\
         UnknownTopicOrPartitionException: This server does not host this topic-partition.\n"
    );
    assert_eq!(earliest(b, "trimmed"), "trimmed:0:6\n");

    // -1: the high watermark, the partition is empty, new records go on from 10.
    let out = delete_records(
        dir.path(),
        b,
        r#"{"partitions":[{"topic":"trimmed","partition":0,"offset":-1}],"version":1}"#,
    );
    assert!(
        stdout(&out).ends_with("partition: trimmed-0\tlow_watermark: 10\n"),
        "{out:?}"
    );
    assert_eq!(earliest(b, "trimmed"), "trimmed:0:10\n");
    assert_eq!(segment_bases(&partition_dir).len(), 1);
    produce(b, "trimmed", 1);
    assert_eq!(read_from_beginning(b, "trimmed", 1), [(10, "v0".into())]);
    drop(broker);
}

#[test]
fn a_bad_offset_file_is_refused_naming_the_file_and_the_field() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens there: the file is refused before any connection.
    let nowhere = format!("127.0.0.1:{}", free_port());
    for (json, names) in [
        ("{\"partitions\": [", "the input string is not a valid JSON"),
        (r#"{"version":1}"#, "missing partitions field"),
        (
            r#"{"partitions":[{"topic":"t","partition":0,"offset":1},{"topic":"t","partition":"x","offset":1}]}"#,
            "partitions[1].partition: expected a partition number, got \"x\"",
        ),
        (
            r#"{"partitions":[{"topic":"t","partition":0}]}"#,
            "partitions[0].offset: missing",
        ),
        (
            r#"{"partitions":[{"topic":"t","partition":0,"offset":1}],"version":3}"#,
            "version: not supported version field value 3",
        ),
    ] {
        let out = delete_records(dir.path(), &nowhere, json);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{json}");
        let file = dir.path().join("offsets.json");
        assert!(
            stderr.contains(&format!("{}: {names}", file.display())),
            "{json}: {stderr}"
        );
        assert!(stdout(&out).is_empty(), "{json}");
    }
}

/// With authorization on, DeleteRecords needs Delete on the topic: refused with Kafka's
/// TopicAuthorizationException line, then allowed once an ACL grants it.
#[test]
fn delete_records_needs_delete_on_the_topic() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = format!(
        "\
broker:
  listen: 127.0.0.1:{port}
  data_dir: ./broker
  allow_everyone_if_no_acl_found: false
  acls:
    - {{ resource_type: cluster, resource_name: kafka-cluster, principal: 'User:ANONYMOUS', operation: alter }}
    - {{ resource_type: topic, resource_name: guarded, principal: 'User:ANONYMOUS', operation: create }}
    - {{ resource_type: topic, resource_name: guarded, principal: 'User:ANONYMOUS', operation: write }}
    - {{ resource_type: topic, resource_name: guarded, principal: 'User:ANONYMOUS', operation: describe }}
"
    );
    let mut broker = Agent::start(dir.path(), &config);
    let bootstrap = format!("127.0.0.1:{port}");
    broker.wait_listening(&bootstrap, "the broker");
    let b = bootstrap.as_str();
    ok(&[
        "topics",
        "--bootstrap-server",
        b,
        "--create",
        "--topic",
        "guarded",
    ]);
    produce(b, "guarded", 5);
    let json = r#"{"partitions":[{"topic":"guarded","partition":0,"offset":3}],"version":1}"#;
    let out = delete_records(dir.path(), b, json);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout(&out).ends_with(
            "partition: guarded-0\terror: org.apache.kafka.common.errors.\
             TopicAuthorizationException: Topic authorization failed.\n"
        ),
        "{out:?}"
    );
    assert_eq!(
        segment_bases(&dir.path().join("broker/guarded-0")),
        [0],
        "nothing deleted"
    );
    ok(&[
        "acls",
        "--bootstrap-server",
        b,
        "--add",
        "--allow-principal",
        "User:ANONYMOUS",
        "--operation",
        "Delete",
        "--topic",
        "guarded",
    ]);
    let out = delete_records(dir.path(), b, json);
    assert!(
        stdout(&out).ends_with("partition: guarded-0\tlow_watermark: 3\n"),
        "{out:?}"
    );
}
