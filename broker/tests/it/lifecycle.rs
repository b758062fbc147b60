//! Starting and stopping the broker.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use ferry_broker::{Broker, BrokerError};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{ApiKey, FetchRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::raw::frame;
use crate::common::*;

#[tokio::test]
async fn shutdown_ends_a_long_polling_fetch_and_closes_connections_promptly() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, bootstrap) = start(config(dir.path())).await;
    create_topic(&bootstrap, "idle", 1, &[]).await;
    let mut stream = TcpStream::connect(broker.local_addr()).await.unwrap();
    let fetch = FetchRequest::default()
        .with_max_wait_ms(60_000)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_topics(vec![
            FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_static_str("idle")))
                .with_partitions(vec![
                    FetchPartition::default().with_partition_max_bytes(1 << 20),
                ]),
        ]);
    stream
        .write_all(&frame(ApiKey::Fetch, 12, 1, &fetch))
        .await
        .unwrap();
    // Nothing outside the broker shows that the fetch is parked, so give it time to arrive
    // (it then waits a minute, far longer than this test).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    broker.shutdown().await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "shutdown took {:?}",
        started.elapsed()
    );
    // The parked fetch was answered (empty), then the connection closed.
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest))
        .await
        .unwrap();
    assert!(read.is_ok());
    assert!(
        rest.len() > 8,
        "the pending fetch got its response before the close"
    );
    assert_eq!(&rest[4..8], &1i32.to_be_bytes());
}

#[tokio::test]
async fn starting_on_a_taken_port_reports_the_address() {
    let dir = tempfile::tempdir().unwrap();
    let (first, _) = start(config(dir.path())).await;
    let other = tempfile::tempdir().unwrap();
    let mut second = config(other.path());
    second.listen = first.local_addr();
    match Broker::start(second).await {
        Err(BrokerError::Bind { addr, .. }) => assert_eq!(addr, first.local_addr()),
        other => panic!("expected a bind error, got {other:?}"),
    }
    first.shutdown().await;
}
