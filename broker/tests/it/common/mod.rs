//! Helpers shared by the broker's integration tests: a real broker on 127.0.0.1:0 in a temp
//! dir, and real librdkafka clients pointed at it.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use ferry_broker::{Broker, BrokerConfig, BrokerHandle};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::FutureProducer;
use rdkafka::{Offset, TopicPartitionList};
use tracing_subscriber::fmt::TestWriter;

/// The one log subscriber of this test binary (a process has one; the first to install it
/// wins, so every test goes through here): what the brokers log at the level `RUST_LOG`
/// sets (errors when unset), shown with the test's output and kept, for the tests that
/// count what was reported ([`logged`]).
pub fn init_tracing() {
    logs();
}

fn logs() -> &'static Mutex<Vec<u8>> {
    static LOGS: OnceLock<Mutex<Vec<u8>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_ansi(false)
            .with_writer(|| Capture(TestWriter::new()))
            .try_init();
        Mutex::new(Vec::new())
    })
}

/// Everything logged so far by this test binary (see [`init_tracing`]).
pub fn logged() -> String {
    String::from_utf8_lossy(&logs().lock().unwrap()).into_owned()
}

/// Writes a log line to the test's output and keeps a copy.
struct Capture(TestWriter);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        logs().lock().unwrap().extend_from_slice(buf);
        self.0.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// Whether kcat is installed; when it is not, a test skips, unless `FERRY_REQUIRE_KCAT` is
/// set (where kcat is provisioned), which makes that a failure.
pub fn kcat_available() -> bool {
    let found = std::process::Command::new("kcat")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var("FERRY_REQUIRE_KCAT").is_err(),
            "kcat is required but not installed"
        );
        eprintln!("kcat not installed: skipping");
    }
    found
}

/// A broker config on a free loopback port, storing in `dir`.
pub fn config(dir: &Path) -> BrokerConfig {
    BrokerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.to_path_buf(),
        ..BrokerConfig::default()
    }
}

pub async fn start(config: BrokerConfig) -> (BrokerHandle, String) {
    init_tracing();
    let broker = Broker::start(config).await.expect("broker starts");
    let bootstrap = broker.local_addr().to_string();
    (broker, bootstrap)
}

fn client_config(bootstrap: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .set("log_level", "4");
    config
}

pub fn producer(bootstrap: &str, settings: &[(&str, &str)]) -> FutureProducer {
    let mut config = client_config(bootstrap);
    config
        .set("linger.ms", "5")
        .set("message.timeout.ms", "30000");
    for (k, v) in settings {
        config.set(*k, *v);
    }
    config.create().expect("producer")
}

pub fn admin(bootstrap: &str) -> AdminClient<DefaultClientContext> {
    client_config(bootstrap).create().expect("admin client")
}

pub async fn create_topic(bootstrap: &str, name: &str, partitions: i32, configs: &[(&str, &str)]) {
    let admin = admin(bootstrap);
    let mut topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    for (k, v) in configs {
        topic = topic.set(k, v);
    }
    let results = admin
        .create_topics(
            [&topic],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .expect("create_topics request");
    for result in results {
        result.expect("topic created");
    }
}

/// One consumed record.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Consumed {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
}

/// Reads `partitions` of `topic` from the beginning (no consumer group) until `expected`
/// records arrived or `timeout` passed.
pub fn consume(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    expected: usize,
    timeout: Duration,
) -> Vec<Consumed> {
    let consumer: BaseConsumer = client_config(bootstrap)
        .set("group.id", "ferry-broker-tests")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .create()
        .expect("consumer");
    let mut assignment = TopicPartitionList::new();
    for p in 0..partitions {
        assignment
            .add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&assignment).expect("assign");
    let deadline = Instant::now() + timeout;
    let mut out = Vec::with_capacity(expected);
    while out.len() < expected && Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => out.push(Consumed {
                partition: m.partition(),
                offset: m.offset(),
                key: m.key().map(<[u8]>::to_vec),
                value: m.payload().map(<[u8]>::to_vec),
            }),
            Some(Err(e)) => panic!("consume error: {e}"),
            None => {}
        }
    }
    out
}

/// Reads `partitions` of `topic` from the beginning until every partition reported its end
/// (for `read_committed`, the last stable offset), with `isolation.level` set to `isolation`;
/// panics after `timeout`. Call it once the records of interest are written.
pub fn read_to_end(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    isolation: &str,
    timeout: Duration,
) -> Vec<Consumed> {
    let consumer: BaseConsumer = client_config(bootstrap)
        .set("group.id", "ferry-broker-tests")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", isolation)
        .create()
        .expect("consumer");
    let mut assignment = TopicPartitionList::new();
    for p in 0..partitions {
        assignment
            .add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&assignment).expect("assign");
    let deadline = Instant::now() + timeout;
    let mut at_end = std::collections::HashSet::new();
    let mut out = Vec::new();
    while at_end.len() < partitions as usize {
        assert!(
            Instant::now() < deadline,
            "{isolation} read of {topic}: partitions {at_end:?} of {partitions} reached their end \
             within {timeout:?} ({} records)",
            out.len()
        );
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                at_end.remove(&m.partition());
                out.push(Consumed {
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m.key().map(<[u8]>::to_vec),
                    value: m.payload().map(<[u8]>::to_vec),
                });
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => panic!("consume error: {e}"),
            None => {}
        }
    }
    out
}

/// The values of `records` as strings, sorted.
pub fn sorted_values(records: &[Consumed]) -> Vec<String> {
    let mut values: Vec<String> = records
        .iter()
        .map(|r| String::from_utf8(r.value.clone().unwrap_or_default()).unwrap())
        .collect();
    values.sort();
    values
}

/// Checks that each partition's offsets run 0, 1, 2, ... with no gap or repeat.
pub fn assert_contiguous_offsets(records: &[Consumed]) {
    let mut next: HashMap<i32, i64> = HashMap::new();
    for r in records {
        let expected = next.entry(r.partition).or_insert(0);
        assert_eq!(r.offset, *expected, "partition {} offsets", r.partition);
        *expected += 1;
    }
}

/// Waits for a condition, checking every 20 ms, failing after `timeout`.
pub async fn wait_for(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A raw protocol connection for tests that need to send exact bytes.
pub mod raw {
    use bytes::{Buf, BufMut, Bytes, BytesMut};
    use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// A request frame (size prefix included).
    pub fn frame<R: Encodable>(
        key: ApiKey,
        version: i16,
        correlation_id: i32,
        request: &R,
    ) -> Vec<u8> {
        let header = RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(StrBytes::from_static_str("raw-test")));
        let mut body = BytesMut::new();
        header
            .encode(&mut body, key.request_header_version(version))
            .unwrap();
        request.encode(&mut body, version).unwrap();
        let mut out = Vec::with_capacity(body.len() + 4);
        out.put_u32(body.len() as u32);
        out.extend_from_slice(&body);
        out
    }

    /// Reads one response frame; returns (correlation id, body) or None at end of stream.
    pub async fn read_response(
        stream: &mut TcpStream,
        key: ApiKey,
        version: i16,
    ) -> Option<(i32, Bytes)> {
        let mut size = [0u8; 4];
        stream.read_exact(&mut size).await.ok()?;
        let mut buf = vec![0u8; u32::from_be_bytes(size) as usize];
        stream.read_exact(&mut buf).await.ok()?;
        let mut buf = Bytes::from(buf);
        let header =
            ResponseHeader::decode(&mut buf, key.response_header_version(version)).unwrap();
        Some((header.correlation_id, buf))
    }

    /// Sends a request and decodes its response.
    pub async fn call<Req: Encodable, Resp: Decodable>(
        stream: &mut TcpStream,
        key: ApiKey,
        version: i16,
        request: &Req,
    ) -> Resp {
        stream
            .write_all(&frame(key, version, 7, request))
            .await
            .unwrap();
        let (correlation_id, mut body) = read_response(stream, key, version)
            .await
            .expect("a response");
        assert_eq!(correlation_id, 7);
        let response = Resp::decode(&mut body, version).unwrap();
        assert!(!body.has_remaining(), "response fully decoded");
        response
    }

    /// A record batch v2 of `count` records with the given timestamp.
    pub fn batch(count: usize, value_len: usize, timestamp: i64) -> Bytes {
        let records: Vec<Record> = (0..count)
            .map(|i| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 0,
                producer_id: -1,
                producer_epoch: -1,
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                sequence: -1,
                timestamp,
                key: Some(Bytes::from(format!("k{i}"))),
                value: Some(Bytes::from(vec![b'v'; value_len])),
                headers: Default::default(),
            })
            .collect();
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            &records,
            &RecordEncodeOptions {
                version: 2,
                compression: Compression::None,
            },
        )
        .unwrap();
        buf.freeze()
    }
}
