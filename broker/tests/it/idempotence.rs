//! Idempotent producers (librdkafka, `enable.idempotence=true`) against the real broker through
//! a proxy that loses Produce responses: the broker appends a batch, the client never hears of
//! it and sends the same batch again on a new connection. The broker must recognise the retry
//! by its producer id, epoch and sequence numbers and not append it twice.
//!
//! The proxy sits between every client connection and the broker: the broker advertises the
//! proxy's address in its metadata, so even the connections librdkafka opens after a bootstrap
//! go through it. It reads the request frames (4-byte size, then api key i16, api version i16,
//! correlation id i32), forwards each one, and for every [`DROP_EVERY`]th Produce request it
//! waits for the broker's response — so the batch is in the log — and then closes the client's
//! connection instead of forwarding it.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::FutureRecord;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

use crate::common::*;

/// Every this many Produce requests (counted over all connections), the response is lost.
const DROP_EVERY: usize = 3;
const PARTITIONS: i32 = 3;
const RECORDS: usize = 3000;
const PRODUCE_KEY: i16 = 0;

/// What the proxy did.
#[derive(Default)]
struct ProxyCounters {
    produce_requests: AtomicUsize,
    /// Produce responses the broker sent that the client never got.
    dropped_responses: AtomicUsize,
}

/// Listens on a free loopback port and relays each connection to `upstream`, which is set once
/// the broker is up (the broker must know the proxy's address before it starts).
async fn start_proxy(
    upstream: Arc<Mutex<Option<SocketAddr>>>,
    counters: Arc<ProxyCounters>,
) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Some(broker) = *upstream.lock().unwrap() else {
                continue;
            };
            let counters = Arc::clone(&counters);
            tokio::spawn(async move {
                let Ok(broker) = TcpStream::connect(broker).await else {
                    return;
                };
                let (client_read, client_write) = client.into_split();
                let (broker_read, broker_write) = broker.into_split();
                let doomed = Arc::new(Mutex::new(HashSet::new()));
                let requests = tokio::spawn(relay_requests(
                    client_read,
                    broker_write,
                    Arc::clone(&doomed),
                    Arc::clone(&counters),
                ));
                relay_responses(broker_read, client_write, &doomed, &counters).await;
                // Dropping both halves of both sockets closes the two connections.
                requests.abort();
            });
        }
    });
    address
}

/// Reads one frame (size prefix included) or None at the end of the stream.
async fn read_frame(from: &mut OwnedReadHalf) -> Option<Vec<u8>> {
    let mut size = [0u8; 4];
    from.read_exact(&mut size).await.ok()?;
    let mut frame = size.to_vec();
    frame.resize(4 + u32::from_be_bytes(size) as usize, 0);
    from.read_exact(&mut frame[4..]).await.ok()?;
    Some(frame)
}

/// Client → broker: forwards every request, marking every DROP_EVERY-th Produce as doomed.
async fn relay_requests(
    mut client: OwnedReadHalf,
    mut broker: OwnedWriteHalf,
    doomed: Arc<Mutex<HashSet<i32>>>,
    counters: Arc<ProxyCounters>,
) {
    while let Some(frame) = read_frame(&mut client).await {
        if frame.len() >= 12 {
            let api_key = i16::from_be_bytes([frame[4], frame[5]]);
            let correlation_id = i32::from_be_bytes([frame[8], frame[9], frame[10], frame[11]]);
            if api_key == PRODUCE_KEY {
                let n = counters.produce_requests.fetch_add(1, Ordering::SeqCst) + 1;
                if n.is_multiple_of(DROP_EVERY) {
                    doomed.lock().unwrap().insert(correlation_id);
                }
            }
        }
        if broker.write_all(&frame).await.is_err() {
            return;
        }
    }
}

/// Broker → client: forwards every response until a doomed one, then returns without it.
async fn relay_responses(
    mut broker: OwnedReadHalf,
    mut client: OwnedWriteHalf,
    doomed: &Mutex<HashSet<i32>>,
    counters: &ProxyCounters,
) {
    while let Some(frame) = read_frame(&mut broker).await {
        if frame.len() >= 8 {
            let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
            if doomed.lock().unwrap().remove(&correlation_id) {
                counters.dropped_responses.fetch_add(1, Ordering::SeqCst);
                return;
            }
        }
        if client.write_all(&frame).await.is_err() {
            return;
        }
    }
}

/// A broker behind a response-losing proxy; returns the broker, the proxy's address and its
/// counters.
async fn broker_behind_proxy(
    dir: &std::path::Path,
) -> (ferry_broker::BrokerHandle, String, Arc<ProxyCounters>) {
    let upstream = Arc::new(Mutex::new(None));
    let counters = Arc::new(ProxyCounters::default());
    let proxy = start_proxy(Arc::clone(&upstream), Arc::clone(&counters)).await;
    let mut config = config(dir);
    config.advertised_listener = Some(proxy.to_string());
    let (broker, direct) = start(config).await;
    *upstream.lock().unwrap() = Some(direct.parse().unwrap());
    (broker, proxy.to_string(), counters)
}

/// Produces RECORDS records, record `i` to partition `i % PARTITIONS` with value `i`, waiting
/// for every delivery report; panics on a failed delivery.
async fn produce_all(bootstrap: &str, topic: &str, settings: &[(&str, &str)]) {
    let mut all = vec![
        ("acks", "all"),
        ("batch.num.messages", "50"),
        ("retry.backoff.ms", "10"),
        ("reconnect.backoff.ms", "10"),
        ("reconnect.backoff.max.ms", "100"),
    ];
    all.extend_from_slice(settings);
    let producer = producer(bootstrap, &all);
    let values: Vec<String> = (0..RECORDS).map(|i| i.to_string()).collect();
    let deliveries: Vec<_> = values
        .iter()
        .enumerate()
        .map(|(i, value)| {
            let record = FutureRecord::<(), str>::to(topic)
                .payload(value)
                .partition((i % PARTITIONS as usize) as i32);
            match producer.send_result(record) {
                Ok(delivery) => delivery,
                Err((e, _)) => panic!("record {i} was not queued: {e}"),
            }
        })
        .collect();
    for (i, delivery) in deliveries.into_iter().enumerate() {
        if let Err((e, _)) = delivery.await.expect("delivery report") {
            panic!("record {i} was not delivered: {e}");
        }
    }
}

/// Sum of the high watermarks of the topic's partitions: how many records the log holds.
fn log_end_total(bootstrap: &str, topic: &str) -> i64 {
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
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_producer_retries_lost_responses_without_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, bootstrap, counters) = broker_behind_proxy(dir.path()).await;
    let topic = "idempotent";
    create_topic(&bootstrap, topic, PARTITIONS, &[]).await;

    produce_all(
        &bootstrap,
        topic,
        &[
            ("enable.idempotence", "true"),
            ("max.in.flight.requests.per.connection", "5"),
        ],
    )
    .await;
    let dropped = counters.dropped_responses.load(Ordering::SeqCst);
    assert!(dropped > 0, "the proxy lost no Produce response");
    println!(
        "{dropped} of {} Produce responses lost",
        counters.produce_requests.load(Ordering::SeqCst)
    );

    assert_eq!(
        log_end_total(&bootstrap, topic),
        RECORDS as i64,
        "the log holds duplicates ({dropped} responses were lost)"
    );
    let records = consume(
        &bootstrap,
        topic,
        PARTITIONS,
        RECORDS,
        Duration::from_secs(30),
    );
    assert_eq!(records.len(), RECORDS);
    assert_contiguous_offsets(&records);
    // Every record once, each partition in the order it was produced.
    let mut per_partition: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
    for r in &records {
        let value: usize = String::from_utf8(r.value.clone().unwrap())
            .unwrap()
            .parse()
            .unwrap();
        per_partition.entry(r.partition).or_default().push(value);
    }
    for p in 0..PARTITIONS {
        let expected: Vec<usize> = (0..RECORDS)
            .filter(|i| i % PARTITIONS as usize == p as usize)
            .collect();
        assert_eq!(per_partition.get(&p), Some(&expected), "partition {p}");
    }
}

/// The proxy's lost responses really make a producer send batches again: without idempotence
/// they are appended twice. (Without this, the test above could pass with a proxy that loses
/// nothing that matters.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_producer_duplicates_behind_the_same_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, bootstrap, counters) = broker_behind_proxy(dir.path()).await;
    let topic = "plain";
    create_topic(&bootstrap, topic, PARTITIONS, &[]).await;

    produce_all(
        &bootstrap,
        topic,
        &[
            ("enable.idempotence", "false"),
            ("max.in.flight.requests.per.connection", "5"),
        ],
    )
    .await;
    let dropped = counters.dropped_responses.load(Ordering::SeqCst);
    assert!(dropped > 0, "the proxy lost no Produce response");
    let total = log_end_total(&bootstrap, topic);
    println!("{dropped} Produce responses lost, {total} records in the log");
    assert!(
        total > RECORDS as i64,
        "{dropped} responses were lost but the log holds {total} records, no duplicate"
    );
}
