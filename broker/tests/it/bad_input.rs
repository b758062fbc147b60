//! Hostile and odd input on the wire: the broker closes only the offending connection, answers
//! with the right Kafka errors, and keeps serving everyone else.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, StrBytes};
use rdkafka::producer::FutureRecord;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::raw::{self, call, frame};
use crate::common::*;

/// xorshift64*: deterministic, so a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Reads until the broker closes the connection (or a second passes); returns bytes read.
async fn drain(stream: &mut TcpStream) -> usize {
    let mut total = 0;
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(1), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return total,
            Ok(Ok(n)) => total += n,
        }
    }
}

fn metadata_v(version: i16) -> Vec<u8> {
    frame(
        ApiKey::Metadata,
        version,
        1,
        &MetadataRequest::default().with_topics(None),
    )
}

fn produce_request(topic: &str, records: bytes::Bytes, acks: i16) -> ProduceRequest {
    ProduceRequest::default()
        .with_acks(acks)
        .with_timeout_ms(5000)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_owned())))
                .with_partition_data(vec![
                    PartitionProduceData::default()
                        .with_index(0)
                        .with_records(Some(records)),
                ]),
        ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_and_truncated_frames_close_only_their_connection() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, bootstrap) = start(config(dir.path())).await;
    let addr = broker.local_addr();
    // A well-behaved connection opened before the storm must survive it.
    let mut bystander = TcpStream::connect(addr).await.unwrap();
    let served: Vec<i16> = {
        let versions: ApiVersionsResponse = call(
            &mut bystander,
            ApiKey::ApiVersions,
            3,
            &ApiVersionsRequest::default(),
        )
        .await;
        versions.api_keys.iter().map(|k| k.api_key).collect()
    };
    let valid = [
        metadata_v(1),
        metadata_v(9),
        metadata_v(12),
        frame(
            ApiKey::Produce,
            9,
            2,
            &produce_request("fuzz", raw::batch(3, 10, 1), 1),
        ),
        frame(
            ApiKey::Fetch,
            12,
            3,
            &FetchRequest::default().with_max_wait_ms(10),
        ),
        frame(
            ApiKey::JoinGroup,
            9,
            4,
            &JoinGroupRequest::default()
                .with_group_id(GroupId(StrBytes::from_static_str("fuzz")))
                .with_session_timeout_ms(6000)
                .with_rebalance_timeout_ms(1000)
                .with_protocol_type(StrBytes::from_static_str("consumer"))
                .with_protocols(vec![
                    join_group_request::JoinGroupRequestProtocol::default()
                        .with_name(StrBytes::from_static_str("range")),
                ]),
        ),
        frame(
            ApiKey::OffsetCommit,
            8,
            5,
            &OffsetCommitRequest::default()
                .with_group_id(GroupId(StrBytes::from_static_str("fuzz")))
                .with_generation_id_or_member_epoch(-1)
                .with_topics(vec![
                    offset_commit_request::OffsetCommitRequestTopic::default()
                        .with_name(TopicName(StrBytes::from_static_str("fuzz")))
                        .with_partitions(vec![Default::default()]),
                ]),
        ),
        frame(
            ApiKey::OffsetFetch,
            8,
            6,
            &OffsetFetchRequest::default().with_groups(vec![
                offset_fetch_request::OffsetFetchRequestGroup::default()
                    .with_group_id(GroupId(StrBytes::from_static_str("fuzz"))),
            ]),
        ),
    ];
    let mut rng = Rng(0x5EED_1234_ABCD_0001);
    for round in 0..400i32 {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let bytes = match round % 6 {
            // Pure noise.
            0 => {
                let n = 1 + rng.below(300) as usize;
                rng.bytes(n)
            }
            // A right-sized frame for a served API and a random version, random body.
            1 => {
                let body_len = rng.below(200) as usize;
                let mut f = ((body_len + 8) as u32).to_be_bytes().to_vec();
                f.extend_from_slice(&served[rng.below(served.len() as u64) as usize].to_be_bytes());
                f.extend_from_slice(&(rng.below(20) as i16).to_be_bytes());
                f.extend_from_slice(&round.to_be_bytes());
                f.extend(rng.bytes(body_len));
                f
            }
            // A valid request cut short, or with its body bytes flipped.
            2 | 3 => {
                let mut f = valid[rng.below(valid.len() as u64) as usize].clone();
                if round % 5 == 2 {
                    f.truncate(rng.below(f.len() as u64) as usize);
                } else {
                    for _ in 0..1 + rng.below(4) {
                        let at = 12 + rng.below((f.len() - 12) as u64) as usize;
                        f[at] = rng.next() as u8;
                    }
                }
                f
            }
            // A valid header, then an array claiming ~2^31 elements.
            4 => {
                let (key, version, prefix): (ApiKey, i16, &[u8]) = [
                    (ApiKey::Metadata, 1, &[][..]),
                    (ApiKey::Produce, 3, &[0xff, 0xff, 0, 1, 0, 0, 0, 1][..]),
                    (ApiKey::CreateTopics, 2, &[][..]),
                    (ApiKey::Fetch, 4, &[0; 17][..]),
                ][rng.below(4) as usize];
                let mut f = frame(key, version, round, &ApiVersionsRequest::default());
                f.truncate(4 + 8 + 2 + 8); // size, fixed header part, client id "raw-test"
                f.extend_from_slice(prefix);
                f.extend_from_slice(&[0x7f, 0xff, 0xff, 0xfe]);
                let tail = rng.below(64) as usize;
                f.extend(rng.bytes(tail));
                let size = (f.len() - 4) as u32;
                f[..4].copy_from_slice(&size.to_be_bytes());
                f
            }
            // Absurd sizes: huge, negative, too small.
            _ => [i32::MAX, -1, 3, 104_857_601][rng.below(4) as usize]
                .to_be_bytes()
                .to_vec(),
        };
        let _ = stream.write_all(&bytes).await;
        let _ = stream.shutdown().await;
        drain(&mut stream).await;
    }

    // The bystander connection still gets answers.
    let metadata: MetadataResponse = call(
        &mut bystander,
        ApiKey::Metadata,
        12,
        &MetadataRequest::default(),
    )
    .await;
    assert_eq!(metadata.brokers.len(), 1);

    // And a real client works end to end.
    create_topic(&bootstrap, "after-fuzz", 1, &[]).await;
    let producer = producer(&bootstrap, &[]);
    producer
        .send(
            FutureRecord::to("after-fuzz")
                .key("k")
                .payload("still alive"),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    let consumed = tokio::task::spawn_blocking(move || {
        consume(&bootstrap, "after-fuzz", 1, 1, Duration::from_secs(20))
    })
    .await
    .unwrap();
    assert_eq!(consumed[0].value.as_deref(), Some(&b"still alive"[..]));
    broker.shutdown().await;
}

#[tokio::test]
async fn a_request_over_socket_request_max_bytes_is_refused_before_its_body_arrives() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.socket_request_max_bytes = 1000;
    let (broker, _) = start(config).await;
    let mut stream = TcpStream::connect(broker.local_addr()).await.unwrap();
    stream.write_all(&1001u32.to_be_bytes()).await.unwrap();
    // No body sent: the broker must close on the size alone.
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
        .await
        .expect("closed promptly");
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "connection closed, got {read:?}"
    );
    broker.shutdown().await;
}

#[tokio::test]
async fn api_versions_in_an_unknown_version_answers_unsupported_version_with_a_v0_body() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, _) = start(config(dir.path())).await;
    let mut stream = TcpStream::connect(broker.local_addr()).await.unwrap();
    // Version 99, flexible header as a future client would send.
    let mut f = frame(ApiKey::ApiVersions, 3, 42, &ApiVersionsRequest::default());
    f[6..8].copy_from_slice(&99i16.to_be_bytes());
    stream.write_all(&f).await.unwrap();
    let (correlation_id, mut body) = raw::read_response(&mut stream, ApiKey::ApiVersions, 0)
        .await
        .unwrap();
    assert_eq!(correlation_id, 42);
    let response = ApiVersionsResponse::decode(&mut body, 0).unwrap();
    assert_eq!(
        response.error_code,
        ResponseError::UnsupportedVersion.code()
    );
    let apis = response
        .api_keys
        .iter()
        .find(|k| k.api_key == ApiKey::ApiVersions as i16)
        .unwrap();
    assert_eq!((apis.min_version, apis.max_version), (0, 3));
    // The connection stays usable: the client retries with a version we have.
    let ok: ApiVersionsResponse = call(
        &mut stream,
        ApiKey::ApiVersions,
        3,
        &ApiVersionsRequest::default(),
    )
    .await;
    assert_eq!(ok.error_code, 0);
    // An API the broker does not serve is not advertised (ElectLeaders: one broker, no
    // leader to elect).
    assert!(
        ok.api_keys
            .iter()
            .all(|k| k.api_key != ApiKey::ElectLeaders as i16)
    );
    broker.shutdown().await;
}

#[tokio::test]
async fn corrupt_and_oversized_batches_get_kafka_errors_and_acks_0_gets_no_response() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.message_max_bytes = 2000;
    let (broker, _) = start(config).await;
    let mut stream = TcpStream::connect(broker.local_addr()).await.unwrap();
    let error_of = |r: &ProduceResponse| r.responses[0].partition_responses[0].error_code;

    let good: ProduceResponse = call(
        &mut stream,
        ApiKey::Produce,
        9,
        &produce_request("checks", raw::batch(5, 10, 1), -1),
    )
    .await;
    assert_eq!(error_of(&good), 0);
    assert_eq!(good.responses[0].partition_responses[0].base_offset, 0);

    let mut corrupt = raw::batch(5, 10, 1).to_vec();
    let last = corrupt.len() - 1;
    corrupt[last] ^= 1;
    let r: ProduceResponse = call(
        &mut stream,
        ApiKey::Produce,
        9,
        &produce_request("checks", corrupt.into(), 1),
    )
    .await;
    assert_eq!(error_of(&r), ResponseError::CorruptMessage.code());

    let r: ProduceResponse = call(
        &mut stream,
        ApiKey::Produce,
        9,
        &produce_request("checks", raw::batch(1, 3000, 1), 1),
    )
    .await;
    assert_eq!(error_of(&r), ResponseError::MessageTooLarge.code());

    // A batch whose offset span does not match its record count (CRC recomputed, so only the
    // span is wrong) would make offsets jump.
    let mut inflated = raw::batch(1, 10, 1).to_vec();
    inflated[23..27].copy_from_slice(&1000i32.to_be_bytes());
    let crc = crc32c::crc32c(&inflated[21..]);
    inflated[17..21].copy_from_slice(&crc.to_be_bytes());
    let r: ProduceResponse = call(
        &mut stream,
        ApiKey::Produce,
        9,
        &produce_request("checks", inflated.into(), 1),
    )
    .await;
    assert_eq!(error_of(&r), ResponseError::CorruptMessage.code());

    // acks=0: nothing comes back, so the next response on the wire is the Metadata one.
    stream
        .write_all(&frame(
            ApiKey::Produce,
            9,
            100,
            &produce_request("checks", raw::batch(2, 10, 1), 0),
        ))
        .await
        .unwrap();
    stream
        .write_all(&frame(
            ApiKey::Metadata,
            12,
            101,
            &MetadataRequest::default().with_topics(None),
        ))
        .await
        .unwrap();
    let (correlation_id, _) = raw::read_response(&mut stream, ApiKey::Metadata, 12)
        .await
        .unwrap();
    assert_eq!(correlation_id, 101);

    let offsets: ListOffsetsResponse = call(
        &mut stream,
        ApiKey::ListOffsets,
        6,
        &ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_topics(vec![
                list_offsets_request::ListOffsetsTopic::default()
                    .with_name(TopicName(StrBytes::from_static_str("checks")))
                    .with_partitions(vec![
                        list_offsets_request::ListOffsetsPartition::default().with_timestamp(-1),
                    ]),
            ]),
    )
    .await;
    assert_eq!(
        offsets.topics[0].partitions[0].offset, 7,
        "5 + 2 records stored, the bad ones not"
    );
    broker.shutdown().await;
}

#[tokio::test]
async fn a_request_trickling_in_byte_by_byte_is_served_and_idle_connections_are_closed() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.connections_max_idle_ms = 300;
    let (broker, _) = start(config).await;
    let mut stream = TcpStream::connect(broker.local_addr()).await.unwrap();
    let request = metadata_v(12);
    for byte in &request {
        stream.write_all(std::slice::from_ref(byte)).await.unwrap();
        stream.flush().await.unwrap();
    }
    let (correlation_id, mut body) = raw::read_response(&mut stream, ApiKey::Metadata, 12)
        .await
        .unwrap();
    assert_eq!(correlation_id, 1);
    let metadata = MetadataResponse::decode(&mut body, 12).unwrap();
    assert_eq!(metadata.brokers.len(), 1);
    // Then silence: the broker hangs up after connections.max.idle.ms.
    let mut buf = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
        .await
        .expect("closed within 5 s");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    broker.shutdown().await;
}

#[tokio::test]
async fn responses_before_a_bad_request_are_delivered_before_the_close() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, _) = start(config(dir.path())).await;
    let mut stream = TcpStream::connect(broker.local_addr()).await.unwrap();
    let mut pipelined = metadata_v(12);
    pipelined.extend_from_slice(&[0, 0, 0, 8, 0x7f, 0x7f, 0, 0, 0, 0, 0, 9]); // unknown api key
    stream.write_all(&pipelined).await.unwrap();
    let (correlation_id, _) = raw::read_response(&mut stream, ApiKey::Metadata, 12)
        .await
        .expect("metadata answered");
    assert_eq!(correlation_id, 1);
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert!(rest.is_empty(), "nothing answers the unknown api key");
    broker.shutdown().await;
}
