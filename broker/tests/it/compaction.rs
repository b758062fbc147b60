//! Compacted topics: `cleanup.policy=compact` is accepted, a record without a key is refused
//! with INVALID_RECORD, and a compacted topic's segments are not deleted by retention.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::FutureRecord;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_topic_refuses_keyless_records_and_keeps_keyed_ones() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, bootstrap) = start(config(dir.path())).await;
    create_topic(
        &bootstrap,
        "compacted",
        1,
        &[
            ("cleanup.policy", "compact"),
            ("delete.retention.ms", "1000"),
        ],
    )
    .await;
    let producer = producer(&bootstrap, &[("retries", "0")]);
    let keyed = producer
        .send(
            FutureRecord::to("compacted").key("k").payload("v1"),
            Duration::from_secs(10),
        )
        .await;
    assert!(keyed.is_ok(), "a keyed record is appended: {keyed:?}");
    let keyless = producer
        .send(
            FutureRecord::<(), _>::to("compacted").payload("no key"),
            Duration::from_secs(10),
        )
        .await;
    match keyless {
        Err((KafkaError::MessageProduction(RDKafkaErrorCode::InvalidRecord), _)) => {}
        other => panic!("a keyless record must be refused with INVALID_RECORD: {other:?}"),
    }
    // A topic with the default policy still takes keyless records.
    create_topic(&bootstrap, "plain", 1, &[]).await;
    let plain = producer
        .send(
            FutureRecord::<(), _>::to("plain").payload("no key"),
            Duration::from_secs(10),
        )
        .await;
    assert!(plain.is_ok(), "{plain:?}");
}
