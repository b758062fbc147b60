//! Real librdkafka clients (the `rdkafka` crate) against the real broker.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use rdkafka::producer::FutureRecord;

use crate::common::*;

/// Records per (codec, acks) case; `FERRY_BROKER_TEST_RECORDS` raises it (the full run
/// uses 1,000,000).
fn record_count() -> usize {
    std::env::var("FERRY_BROKER_TEST_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

/// A deterministic, compressible-but-not-trivial value for record `i`.
fn value(case: &str, i: usize) -> Vec<u8> {
    let mut v = format!("{case}:{i}:").into_bytes();
    let mut x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for _ in 0..(i % 97) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push(b'a' + (x % 16) as u8);
    }
    v
}

/// The compression codec (attributes bits 0-2) of every batch in a segment file.
fn stored_codecs(log: &[u8]) -> std::collections::BTreeSet<usize> {
    let mut codecs = std::collections::BTreeSet::new();
    let mut at = 0;
    while at + 61 <= log.len() {
        codecs.insert(usize::from(log[at + 22] & 7));
        at += 12 + i32::from_be_bytes(log[at + 8..at + 12].try_into().unwrap()) as usize;
    }
    assert_eq!(at, log.len(), "segment holds whole batches");
    codecs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_codec_round_trips_byte_for_byte_with_acks_1_and_all() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, bootstrap) = start(config(dir.path())).await;
    let count = record_count();
    for (codec_id, codec) in ["none", "gzip", "snappy", "lz4", "zstd"]
        .into_iter()
        .enumerate()
    {
        for acks in ["1", "all"] {
            let case = format!("{codec}-acks-{acks}");
            let topic = format!("roundtrip-{case}");
            create_topic(&bootstrap, &topic, 3, &[]).await;
            let producer = producer(
                &bootstrap,
                &[
                    ("compression.codec", codec),
                    ("acks", acks),
                    ("batch.size", "65536"),
                ],
            );
            let mut deliveries = Vec::with_capacity(count);
            for i in 0..count {
                let key = i.to_string();
                let payload = value(&case, i);
                let record = FutureRecord::to(&topic).key(&key).payload(&payload);
                let mut record = record;
                loop {
                    match producer.send_result(record) {
                        Ok(delivery) => {
                            deliveries.push(delivery);
                            break;
                        }
                        Err((_, returned)) => {
                            // Local queue full: let deliveries drain.
                            record = returned;
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                    }
                }
            }
            for delivery in deliveries {
                let result = delivery.await.expect("delivery reported");
                assert!(
                    result.is_ok(),
                    "{case}: delivery failed: {:?}",
                    result.err()
                );
            }
            let consumed = {
                let bootstrap = bootstrap.clone();
                let topic = topic.clone();
                tokio::task::spawn_blocking(move || {
                    consume(&bootstrap, &topic, 3, count, Duration::from_secs(60))
                })
                .await
                .unwrap()
            };
            assert_eq!(consumed.len(), count, "{case}: records consumed");
            let mut by_key = vec![None; count];
            for r in &consumed {
                let key: usize = std::str::from_utf8(r.key.as_deref().unwrap())
                    .unwrap()
                    .parse()
                    .unwrap();
                assert!(by_key[key].is_none(), "{case}: record {key} consumed twice");
                by_key[key] = Some(r.value.clone().unwrap());
            }
            for (i, got) in by_key.into_iter().enumerate() {
                assert_eq!(
                    got.as_deref(),
                    Some(value(&case, i).as_slice()),
                    "{case}: record {i}"
                );
            }
            let mut sorted = consumed;
            sorted.sort();
            assert_contiguous_offsets(&sorted);
            let partitions_used = sorted
                .iter()
                .map(|r| r.partition)
                .collect::<std::collections::BTreeSet<_>>();
            assert_eq!(
                partitions_used.len(),
                3,
                "{case}: keys spread over all partitions"
            );
            // The batches are stored as the producer compressed them (librdkafka sends a batch
            // uncompressed when compression would not make it smaller).
            let log = std::fs::read(
                dir.path()
                    .join(format!("{topic}-0/00000000000000000000.log")),
            )
            .unwrap();
            let codecs = stored_codecs(&log);
            assert!(
                codecs.contains(&codec_id),
                "{case}: stored batches use codecs {codecs:?}"
            );
            assert!(
                codecs.iter().all(|c| *c == codec_id || *c == 0),
                "{case}: {codecs:?}"
            );
        }
    }
    broker.shutdown().await;
}
