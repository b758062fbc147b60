//! The broker's limits, on the real `agent broker`: topics past the file descriptor budget
//! refused before anything is created, connection limits, the memory held by requests
//! bounded by `queued_max_request_bytes` however many huge frames clients leave half-sent,
//! the errors a full disk gets, and byte-rate quotas.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, CreateTopicsRequest, CreateTopicsResponse,
    GroupId, MetadataRequest, MetadataResponse, OffsetCommitRequest, OffsetCommitResponse,
    RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

use crate::harness::{Tmpfs, free_port, http_get, wait_listening, wait_until};

/// `agent broker` on a free port with `settings` (YAML lines), under `ulimit -n` when given.
pub(crate) struct Broker {
    child: Child,
    dir: PathBuf,
    pub(crate) address: SocketAddr,
    pub(crate) http: String,
}

impl Broker {
    pub(crate) fn start(dir: &Path, settings: &str, descriptor_limit: Option<u32>) -> Broker {
        Broker::start_on(dir, &dir.join("data"), settings, descriptor_limit)
    }

    /// Like `start`, with the broker's data directory at `data`.
    fn start_on(dir: &Path, data: &Path, settings: &str, descriptor_limit: Option<u32>) -> Broker {
        let port = free_port();
        let address: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let listen = format!("listen: {address}\n");
        Broker::start_listening(dir, data, &listen, address, settings, descriptor_limit)
    }

    /// `agent broker` with `listen` (a `listen:` or `listeners:` block, YAML), `address`
    /// being the plaintext listener's.
    fn start_listening(
        dir: &Path,
        data: &Path,
        listen: &str,
        address: SocketAddr,
        settings: &str,
        descriptor_limit: Option<u32>,
    ) -> Broker {
        let http = format!("127.0.0.1:{}", free_port());
        let config = dir.join("broker.yaml");
        std::fs::write(
            &config,
            format!(
                "{listen}data_dir: {}\nhttp: {http}\n{settings}",
                data.display()
            ),
        )
        .unwrap();
        let agent = env!("CARGO_BIN_EXE_agent");
        let mut command = match descriptor_limit {
            // Soft and hard: the broker cannot raise it.
            Some(limit) => {
                let mut c = Command::new("bash");
                c.arg("-c")
                    .arg(format!(
                        "ulimit -n {limit} && exec \"$0\" broker --config \"$1\""
                    ))
                    .arg(agent)
                    .arg(&config);
                c
            }
            None => {
                let mut c = Command::new(agent);
                c.args(["broker", "--config"]).arg(&config);
                c
            }
        };
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("broker.log")).unwrap())
            .spawn()
            .unwrap();
        let mut broker = Broker {
            child,
            dir: dir.to_owned(),
            address,
            http,
        };
        let log = dir.join("broker.log");
        wait_listening(&mut broker.child, &broker.http, "the broker", || {
            std::fs::read_to_string(&log).unwrap_or_default()
        });
        broker
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("broker.log")).unwrap_or_default()
    }

    pub(crate) fn connect(&self) -> TcpStream {
        let stream = TcpStream::connect(self.address).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream
    }

    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }

    /// The value of a metric line starting with `prefix` on `/metrics`.
    pub(crate) fn metric(&self, prefix: &str) -> f64 {
        let (status, body) = http_get(&self.http, "/metrics");
        assert_eq!(status, 200);
        body.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no metric {prefix} in:\n{body}"))
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn frame_as<R: Encodable>(
    client_id: &str,
    key: ApiKey,
    version: i16,
    request: &R,
) -> Vec<u8> {
    let header = RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(7)
        .with_client_id(Some(StrBytes::from_string(client_id.to_owned())));
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

/// Sends a request and decodes its response; `None` when the broker closed the connection.
pub(crate) fn call<Req: Encodable, Resp: Decodable>(
    stream: &mut TcpStream,
    key: ApiKey,
    version: i16,
    request: &Req,
) -> Option<Resp> {
    call_as("limits-test", stream, key, version, request)
}

fn call_as<Req: Encodable, Resp: Decodable>(
    client_id: &str,
    stream: &mut TcpStream,
    key: ApiKey,
    version: i16,
    request: &Req,
) -> Option<Resp> {
    stream
        .write_all(&frame_as(client_id, key, version, request))
        .ok()?;
    let mut size = [0u8; 4];
    stream.read_exact(&mut size).ok()?;
    let mut buf = vec![0u8; u32::from_be_bytes(size) as usize];
    stream.read_exact(&mut buf).ok()?;
    let mut buf = Bytes::from(buf);
    let header = ResponseHeader::decode(&mut buf, key.response_header_version(version)).unwrap();
    assert_eq!(header.correlation_id, 7);
    let response = Resp::decode(&mut buf, version).unwrap();
    assert!(!buf.has_remaining());
    Some(response)
}

pub(crate) fn api_versions(stream: &mut TcpStream) -> Option<ApiVersionsResponse> {
    call(
        stream,
        ApiKey::ApiVersions,
        0,
        &ApiVersionsRequest::default(),
    )
}

fn partition_dirs(data: &Path) -> Vec<String> {
    let mut dirs: Vec<String> = std::fs::read_dir(data)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    dirs.sort();
    dirs
}

/// Under `ulimit -n 1024`, 400 topics named in Metadata used to leave orphan partition
/// directories behind and then fail produce with KAFKA_STORAGE_ERROR, logging nothing; a
/// CreateTopics of 100,000 partitions created hundreds of directories before refusing.
#[test]
fn topics_past_the_descriptor_budget_are_refused_before_anything_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path(), "", Some(1024));
    let mut stream = broker.connect();
    let mut created = Vec::new();
    let mut refused = Vec::new();
    for i in 0..400 {
        let name = format!("auto-{i:03}");
        let request = MetadataRequest::default()
            .with_topics(Some(vec![
                MetadataRequestTopic::default()
                    .with_name(Some(TopicName(StrBytes::from_string(name.clone())))),
            ]))
            .with_allow_auto_topic_creation(true);
        let response: MetadataResponse =
            call(&mut stream, ApiKey::Metadata, 9, &request).expect("a Metadata response");
        let code = response.topics[0].error_code;
        match code {
            0 => created.push(name),
            // POLICY_VIOLATION: a limit of the broker's.
            44 => refused.push(name),
            other => panic!("topic {name}: error code {other}\n{}", broker.log()),
        }
    }
    assert!(
        created.len() >= 50,
        "only {} topics fit 1024 descriptors:\n{}",
        created.len(),
        broker.log()
    );
    assert!(
        !refused.is_empty(),
        "nothing was refused under 1024 descriptors"
    );

    // Nothing orphaned: one directory per partition of a topic that exists.
    let expected: Vec<String> = created.iter().map(|t| format!("{t}-0")).collect();
    assert_eq!(partition_dirs(&broker.dir.join("data")), expected);

    // Said once, with what to do, not once per refused topic.
    let log = broker.log();
    assert_eq!(
        log.matches("not enough file descriptors").count(),
        1,
        "the cause is logged once:\n{log}"
    );
    assert!(log.contains("ulimit -n"), "{log}");

    // A topic past the per-topic cap is refused before any directory exists.
    let request = CreateTopicsRequest::default()
        .with_topics(vec![
            CreatableTopic::default()
                .with_name(TopicName(StrBytes::from_static_str("huge")))
                .with_num_partitions(100_000)
                .with_replication_factor(1),
        ])
        .with_timeout_ms(5000);
    let response: CreateTopicsResponse =
        call(&mut stream, ApiKey::CreateTopics, 5, &request).expect("a CreateTopics response");
    let topic = &response.topics[0];
    assert_eq!(topic.error_code, 44);
    let message = topic
        .error_message
        .as_deref()
        .unwrap_or_default()
        .to_owned();
    assert!(
        message.contains("max_partitions_per_topic"),
        "the refusal names its bound: {message}"
    );
    assert!(!broker.dir.join("data/huge-0").exists());

    // The broker still serves: new connections and the topics it has.
    let mut fresh = broker.connect();
    assert!(api_versions(&mut fresh).is_some());
    let request = MetadataRequest::default()
        .with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(
            TopicName(StrBytes::from_string(created[0].clone())),
        ))]))
        .with_allow_auto_topic_creation(false);
    let response: MetadataResponse = call(&mut fresh, ApiKey::Metadata, 9, &request).unwrap();
    assert_eq!(response.topics[0].error_code, 0);
}

/// Past `max_connections` and `max_connections_per_ip` a connection is closed at once and
/// counted, an address with an override gets its own bound, and a freed slot is reused.
#[test]
fn connections_past_the_limits_are_closed_at_once_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(
        dir.path(),
        "max_connections: 6\nmax_connections_per_ip: 2\nmax_connections_per_ip_overrides:\n  127.0.0.2: 3\n",
        None,
    );
    let from = |source: &str| {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let stream = runtime
            .block_on(socket.connect(broker.address))
            .unwrap()
            .into_std()
            .unwrap();
        stream.set_nonblocking(false).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream
    };
    let served = |stream: &mut TcpStream| api_versions(stream).is_some();

    let mut first: Vec<TcpStream> = (0..2).map(|_| from("127.0.0.1")).collect();
    for stream in &mut first {
        assert!(served(stream), "{}", broker.log());
    }
    let mut third = from("127.0.0.1");
    assert!(
        !served(&mut third),
        "a third connection from 127.0.0.1 is closed"
    );

    // 127.0.0.2 has an override of 3.
    let mut other: Vec<TcpStream> = (0..3).map(|_| from("127.0.0.2")).collect();
    for stream in &mut other {
        assert!(served(stream));
    }
    assert!(!served(&mut from("127.0.0.2")));

    // Five open; the sixth (from a third address) fits, a seventh does not.
    let mut sixth = from("127.0.0.3");
    assert!(served(&mut sixth));
    assert!(!served(&mut from("127.0.0.4")), "max_connections is 6");

    // A freed slot is taken again.
    let closed = first.pop().unwrap();
    closed.shutdown(Shutdown::Both).unwrap();
    drop(closed);
    wait_until(Duration::from_secs(10), "the slot to be freed", || {
        served(&mut from("127.0.0.1"))
    });

    let refused = broker.metric("kafka_connections_refused_total{");
    assert!(refused >= 3.0, "refusals counted: {refused}");
    let log = broker.log();
    assert!(log.contains("connection refused"), "{log}");
    assert!(log.contains("max_connections_per_ip"), "{log}");
}

/// Eight clients each announce a 96 MiB request and send all of it but the last byte: with
/// no bound the broker held every byte (RSS from 94 to 957 MiB). With
/// `queued_max_request_bytes` of 128 MiB it holds at most that (the requests take it as their
/// bytes arrive, and wait unread once it is taken), small requests of other clients are still
/// read and answered at once, and `request_receive_timeout_ms` after their first byte the
/// stalled requests are dropped and their memory given back.
#[test]
fn memory_held_by_half_sent_requests_is_bounded_by_queued_max_request_bytes() {
    const FRAME: usize = 96 << 20;
    const POOL: usize = 128 << 20;
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(
        dir.path(),
        &format!("queued_max_request_bytes: {POOL}\nrequest_receive_timeout_ms: 6000\n"),
        None,
    );
    let base = broker.rss_kib();
    let mut writers = Vec::new();
    for _ in 0..8 {
        let stream = broker.connect();
        writers.push(std::thread::spawn(move || {
            let mut stream = stream;
            let _ = stream.write_all(&(FRAME as u32).to_be_bytes());
            // An ApiVersions header, then filler: never finished.
            let mut header = vec![0u8, 18, 0, 0, 0, 0, 0, 7];
            header.resize(1 << 20, b'x');
            let mut sent = 0;
            while sent + header.len() < FRAME {
                if stream.write_all(&header).is_err() {
                    return;
                }
                sent += header.len();
            }
            let rest = vec![b'x'; FRAME - sent - 1];
            let _ = stream.write_all(&rest);
            // Then nothing until the broker gives up on the request.
            let mut buf = [0u8; 1];
            let _ = stream.read(&mut buf);
        }));
    }
    // The pool fills up to its last step (steps are at most 1 MiB).
    wait_until(Duration::from_secs(60), "the pool to fill", || {
        broker.metric("kafka_queued_request_bytes ") >= (POOL - (8 << 20)) as f64
    });
    let held = broker.metric("kafka_queued_request_bytes ");
    let rss = broker.rss_kib();
    assert!(
        held <= POOL as f64,
        "request bytes held: {held}, above queued_max_request_bytes"
    );
    // The pool and buffers: far below the 8 × 96 MiB the clients announced.
    let grown_mib = rss.saturating_sub(base) / 1024;
    assert!(
        grown_mib < 128 + 48,
        "RSS grew by {grown_mib} MiB with queued_max_request_bytes of 128 MiB"
    );
    // A small request of another client does not wait on the full pool.
    let mut fresh = broker.connect();
    let asked = std::time::Instant::now();
    assert!(api_versions(&mut fresh).is_some());
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "ApiVersions took {:?} while the pool was full",
        asked.elapsed()
    );
    // The stalled requests are dropped after the receive timeout: their memory comes back.
    for writer in writers {
        writer.join().unwrap();
    }
    wait_until(
        Duration::from_secs(10),
        "the memory to be given back",
        || broker.metric("kafka_queued_request_bytes ") == 0.0,
    );
    assert!(broker.metric("kafka_connections_receive_timeouts_total{") >= 8.0);
    assert!(api_versions(&mut broker.connect()).is_some());
}

pub(crate) fn create_topic(stream: &mut TcpStream, name: &str) -> (i16, String) {
    let request = CreateTopicsRequest::default()
        .with_topics(vec![
            CreatableTopic::default()
                .with_name(TopicName(StrBytes::from_string(name.to_owned())))
                .with_num_partitions(1)
                .with_replication_factor(1),
        ])
        .with_timeout_ms(5000);
    let response: CreateTopicsResponse =
        call(stream, ApiKey::CreateTopics, 5, &request).expect("a CreateTopics response");
    let topic = &response.topics[0];
    (
        topic.error_code,
        topic
            .error_message
            .as_deref()
            .unwrap_or_default()
            .to_owned(),
    )
}

/// A standalone OffsetCommit (generation -1) of `offset` for partition 0 of `topic` by
/// `group`: the partition's error code.
pub(crate) fn commit_offset(stream: &mut TcpStream, group: &str, topic: &str, offset: i64) -> i16 {
    let request = OffsetCommitRequest::default()
        .with_group_id(GroupId(StrBytes::from_string(group.to_owned())))
        .with_generation_id_or_member_epoch(-1)
        .with_topics(vec![
            OffsetCommitRequestTopic::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_owned())))
                .with_partitions(vec![
                    OffsetCommitRequestPartition::default()
                        .with_partition_index(0)
                        .with_committed_offset(offset),
                ]),
        ]);
    let response: OffsetCommitResponse =
        call(stream, ApiKey::OffsetCommit, 2, &request).expect("an OffsetCommit response");
    response.topics[0].partitions[0].error_code
}

/// A full disk used to answer CreateTopics and OffsetCommit with UNKNOWN_SERVER_ERROR; the
/// disk is the cause, so the answer is KAFKA_STORAGE_ERROR, nothing is left behind, and
/// both work again once there is room. A new, empty data directory is not "recovered".
#[test]
fn a_full_disk_answers_storage_errors_and_leaves_nothing_behind() {
    const KAFKA_STORAGE_ERROR: i16 = 56;
    let disk = Tmpfs::mount(16);
    let dir = tempfile::tempdir().unwrap();
    let data = disk.path.join("broker");
    let broker = Broker::start_on(dir.path(), &data, "", None);
    assert!(
        !broker.log().contains("clean shutdown marker"),
        "a fresh directory has nothing to recover:\n{}",
        broker.log()
    );
    let mut stream = broker.connect();
    assert_eq!(create_topic(&mut stream, "before").0, 0);
    assert_eq!(commit_offset(&mut stream, "standalone", "before", 0), 0);

    // Someone else's file takes every byte left.
    let filler = disk.path.join("filler");
    {
        let mut file = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; 1 << 16];
        while file.write_all(&chunk).is_ok() {}
        while file.write_all(&chunk[..512]).is_ok() {}
        while file.write_all(&chunk[..1]).is_ok() {}
    }
    let (code, message) = create_topic(&mut stream, "during");
    assert_eq!(code, KAFKA_STORAGE_ERROR, "{message}\n{}", broker.log());
    assert!(
        !data.join("during-0").exists(),
        "nothing left of the refused topic"
    );
    assert_eq!(
        commit_offset(&mut stream, "standalone", "before", 1),
        KAFKA_STORAGE_ERROR,
        "{}",
        broker.log()
    );

    std::fs::remove_file(&filler).unwrap();
    assert_eq!(create_topic(&mut stream, "during").0, 0);
    assert_eq!(commit_offset(&mut stream, "standalone", "before", 1), 0);
}

/// A Produce v9 request of one batch of `count` records of `len` bytes to partition 0.
fn produce_request(topic: &str, count: usize, len: usize) -> ProduceRequest {
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
            timestamp: 1_700_000_000_000,
            key: None,
            value: Some(Bytes::from(vec![b'v'; len])),
            headers: Default::default(),
        })
        .collect();
    let mut batch = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut batch,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .unwrap();
    ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_owned())))
                .with_partition_data(vec![
                    PartitionProduceData::default()
                        .with_index(0)
                        .with_records(Some(batch.freeze())),
                ]),
        ])
}

/// A client over its `producer_byte_rate` gets `throttle_time_ms` as Kafka computes it, and
/// its connection reads nothing more for that long; another client id is not held back.
#[test]
fn a_client_over_its_produce_quota_is_throttled_and_others_are_not() {
    let dir = tempfile::tempdir().unwrap();
    // 100 KiB/s, measured over two one-second samples.
    let broker = Broker::start(
        dir.path(),
        "client_quotas:\n  limited:\n    producer_byte_rate: 102400\nquota_window_num: 2\n",
        None,
    );
    let request = produce_request("quota", 200, 1024);
    let mut free = broker.connect();
    let response: ProduceResponse =
        call_as("free", &mut free, ApiKey::Produce, 9, &request).unwrap();
    assert_eq!(response.responses[0].partition_responses[0].error_code, 0);
    assert_eq!(response.throttle_time_ms, 0);

    // About 200 KiB in the first second: twice the quota, so about a second of throttle.
    let mut limited = broker.connect();
    let response: ProduceResponse =
        call_as("limited", &mut limited, ApiKey::Produce, 9, &request).unwrap();
    assert_eq!(response.responses[0].partition_responses[0].error_code, 0);
    let throttle = response.throttle_time_ms;
    assert!(
        (500..=2000).contains(&throttle),
        "throttle_time_ms {throttle} for twice the quota over one second"
    );
    // The connection waits out the throttle before reading the next request.
    let asked = std::time::Instant::now();
    let _: ApiVersionsResponse = call_as(
        "limited",
        &mut limited,
        ApiKey::ApiVersions,
        0,
        &ApiVersionsRequest::default(),
    )
    .unwrap();
    let waited = asked.elapsed();
    assert!(
        waited >= Duration::from_millis(throttle as u64 * 8 / 10),
        "answered after {waited:?}, throttled for {throttle} ms"
    );
    // The other client id is still served at once, with no throttle.
    let response: ProduceResponse =
        call_as("free", &mut free, ApiKey::Produce, 9, &request).unwrap();
    assert_eq!(response.throttle_time_ms, 0);
}

fn open_descriptors(broker: &Broker) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", broker.child.id()))
        .unwrap()
        .count()
}

/// Segment files nobody uses are closed, so idle partitions hold no descriptors: under
/// `ulimit -n 1024` the broker hosts 400 partitions (1200 files) in rounds, and a partition
/// whose files were closed takes appends again at the right offsets.
#[test]
fn idle_partitions_hold_no_descriptors_so_more_fit_than_the_limit_keeps_open() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path(), "log_files_idle_close_ms: 300\n", Some(1024));
    let mut stream = broker.connect();
    let idle = open_descriptors(&broker);
    for round in 0..8 {
        let request = CreateTopicsRequest::default()
            .with_topics(vec![
                CreatableTopic::default()
                    .with_name(TopicName(StrBytes::from_string(format!("round-{round}"))))
                    .with_num_partitions(50)
                    .with_replication_factor(1),
            ])
            .with_timeout_ms(5000);
        let response: CreateTopicsResponse =
            call(&mut stream, ApiKey::CreateTopics, 5, &request).unwrap();
        let topic = &response.topics[0];
        assert_eq!(
            topic.error_code,
            0,
            "round {round}: {:?}\n{}",
            topic.error_message,
            broker.log()
        );
        wait_until(
            Duration::from_secs(20),
            "idle segment files to close",
            || open_descriptors(&broker) < idle + 20,
        );
    }
    // A partition whose files were closed appends after what it holds, twice over.
    let request = produce_request("round-3", 200, 16);
    for expected in [0, 200] {
        let response: ProduceResponse = call(&mut stream, ApiKey::Produce, 9, &request).unwrap();
        let partition = &response.responses[0].partition_responses[0];
        assert_eq!(partition.error_code, 0, "{}", broker.log());
        assert_eq!(partition.base_offset, expected);
        wait_until(Duration::from_secs(20), "its files to close again", || {
            open_descriptors(&broker) < idle + 20
        });
    }
}

/// Runs `tests/hostile_clients.py ADDRESS MODE ARGS` (a second process, Python's standard
/// library only) to its end and returns its report; `during` runs while it does.
fn hostile_clients(
    address: &str,
    mode: &str,
    args: &[&str],
    during: impl FnOnce(),
) -> serde_json::Value {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/hostile_clients.py");
    let child = Command::new(python)
        .arg(script)
        .arg(address)
        .arg(mode)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    during();
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "hostile_clients.py {mode} failed: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// Checks the well-behaved client's view of a hostile run: every ApiVersions on a fresh
/// connection answered, none slower than `slowest` seconds.
fn assert_probes_served(report: &serde_json::Value, slowest: f64) {
    let probe = &report["probe"];
    let answered = probe["answered"].as_u64().unwrap();
    assert!(answered >= 10, "too few probes answered: {report}");
    assert_eq!(probe["failed"], 0, "probes failed: {report}");
    let took = probe["slowest"].as_f64().unwrap();
    assert!(took < slowest, "the slowest probe took {took} s: {report}");
}

/// How long after its first byte the broker closed each hostile connection, in seconds;
/// fails if one stayed open to the end of the run.
fn closed_after(report: &serde_json::Value, count: usize) -> Vec<f64> {
    let closed = report["closed_after"].as_array().unwrap();
    assert_eq!(closed.len(), count, "{report}");
    closed
        .iter()
        .map(|c| {
            c.as_f64()
                .unwrap_or_else(|| panic!("a hostile connection stayed open: {report}"))
        })
        .collect()
}

/// `agent broker` in `dir` with a plaintext listener on a free port (its `address`), then the
/// listeners `more` (items of its `listeners:` list), the user `alice` (password
/// `alice-secret`) and `settings`.
fn broker_listening(dir: &Path, more: &str, settings: &str) -> Broker {
    let address: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let listen = format!(
        "listeners:\n  - {{ address: {address} }}\n{more}\
         users:\n  - {{ name: alice, password: alice-secret }}\n"
    );
    Broker::start_listening(dir, &dir.join("data"), &listen, address, settings, None)
}

/// A `listeners:` item on a free port of `security_protocol` with the server certificate of
/// `certs`: its address and the item.
fn tls_listener(
    security_protocol: &str,
    certs: &crate::security::Certificates,
) -> (String, String) {
    let address = format!("127.0.0.1:{}", free_port());
    let item = format!(
        "  - address: {address}\n    security_protocol: {security_protocol}\n    \
         ssl: {{ certificate: {}, key: {} }}\n",
        certs.server_cert.display(),
        certs.server_key.display()
    );
    (address, item)
}

/// A producer of `alice` over SASL/PLAIN to `bootstrap`, sending each record at once.
fn alice_producer<T: rdkafka::config::FromClientConfig>(bootstrap: &str) -> T {
    rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("security.protocol", "SASL_PLAINTEXT")
        .set("sasl.mechanisms", "PLAIN")
        .set("sasl.username", "alice")
        .set("sasl.password", "alice-secret")
        .set("linger.ms", "0")
        .create()
        .unwrap()
}

/// Kafka's own bound is the pool: six connections announcing ~100 MiB each and sending 4
/// bytes of it used to reserve 600 MiB of `queued_max_request_bytes` (512 MiB) between them,
/// and no other request was read while they stayed open. Memory is now taken as bytes arrive:
/// 64 of them hold 64 KiB each, every ApiVersions on a fresh connection is answered within a
/// second, and each is closed `request_receive_timeout_ms` after its first byte. On a SASL_SSL
/// listener the same announcements are refused at once, before authentication.
#[test]
fn announced_huge_requests_hold_nothing_and_stop_nobody() {
    let dir = tempfile::tempdir().unwrap();
    let certs = crate::security::certificates(dir.path());
    let (sasl_ssl, listener) = tls_listener("SASL_SSL", &certs);
    let broker = broker_listening(dir.path(), &listener, "request_receive_timeout_ms: 4000\n");
    let address = broker.address;
    let mut rss_mib = 0;
    let report = hostile_clients(
        &address.to_string(),
        "hogs",
        &["--count", "64", "--seconds", "9"],
        || {
            std::thread::sleep(Duration::from_secs(3));
            rss_mib = broker.rss_kib() / 1024;
        },
    );
    assert_probes_served(&report, 1.0);
    assert!(rss_mib < 200, "RSS {rss_mib} MiB with 64 hogs");
    for after in closed_after(&report, 64) {
        assert!(
            (3.5..6.0).contains(&after),
            "a hog was closed {after} s after its first byte, not after 4 s: {report}"
        );
    }
    assert!(broker.metric("kafka_connections_receive_timeouts_total{") >= 64.0);
    assert_eq!(broker.metric("kafka_queued_request_bytes "), 0.0);

    let ca = certs.ca.display().to_string();
    let report = hostile_clients(
        &sasl_ssl,
        "hogs",
        &["--count", "64", "--seconds", "4", "--tls-ca", &ca],
        || {},
    );
    assert_probes_served(&report, 1.0);
    for after in closed_after(&report, 64) {
        assert!(
            after < 1.0,
            "a hog before authentication was held {after} s: {report}"
        );
    }
    let refused =
        broker.metric("kafka_connections_unauthenticated_too_large_total{listener=\"SASL_SSL\"");
    assert!(refused >= 64.0, "refusals counted: {refused}");
}

/// A thousand connections each send one byte of an ApiVersions request every two seconds:
/// every other client is served within a second meanwhile, and each of them is closed
/// `request_receive_timeout_ms` after its first byte, with memory flat.
#[test]
fn a_thousand_trickling_connections_stop_nobody_and_are_closed_in_time() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path(), "request_receive_timeout_ms: 4000\n", None);
    let address = broker.address.to_string();
    let mut rss_mib = 0;
    let report = hostile_clients(
        &address,
        "trickle",
        &["--count", "1000", "--every", "2", "--seconds", "10"],
        || {
            std::thread::sleep(Duration::from_secs(3));
            rss_mib = broker.rss_kib() / 1024;
        },
    );
    assert_probes_served(&report, 1.0);
    assert!(
        rss_mib < 200,
        "RSS {rss_mib} MiB with 1000 trickling connections"
    );
    for after in closed_after(&report, 1000) {
        assert!(
            (3.5..7.0).contains(&after),
            "a trickling connection was closed {after} s after its first byte, not after 4 s"
        );
    }
    assert!(broker.metric("kafka_connections_receive_timeouts_total{") >= 1000.0);
}

/// Before a connection on a SASL listener has authenticated, only requests up to
/// `sasl_server_max_receive_size` are read: 200 connections announcing 1 MiB are closed at
/// once; once authenticated, a client sends requests of up to `socket_request_max_bytes`.
#[test]
fn requests_over_the_sasl_receive_size_are_refused_before_authentication() {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let address: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let listen = format!(
        "listeners:\n  - {{ address: {address}, security_protocol: SASL_PLAINTEXT, \
         sasl_mechanisms: [PLAIN] }}\nusers:\n  - {{ name: alice, password: alice-secret }}\n"
    );
    let broker = Broker::start_listening(
        dir.path(),
        &dir.path().join("data"),
        &listen,
        address,
        "",
        None,
    );
    let report = hostile_clients(
        &address.to_string(),
        "oversized",
        &["--count", "200", "--announce", "1048576", "--seconds", "4"],
        || {},
    );
    assert_probes_served(&report, 1.0);
    for after in closed_after(&report, 200) {
        assert!(
            after < 1.0,
            "a 1 MiB request before authentication was held {after} s"
        );
    }
    let refused = broker.metric("kafka_connections_unauthenticated_too_large_total{");
    assert!(refused >= 200.0, "refusals counted: {refused}");
    assert!(broker.log().contains("sasl_server_max_receive_size"));

    // Authenticated, a produce request of ~900 KB (above 512 KiB) is read and acknowledged.
    let producer: BaseProducer = alice_producer(&address.to_string());
    let value = vec![b'v'; 900_000];
    producer
        .send(BaseRecord::<(), _>::to("large").payload(&value))
        .map_err(|(e, _)| e)
        .unwrap();
    producer.flush(Duration::from_secs(30)).unwrap();
    let stats = http_get(&broker.http, "/metrics").1;
    assert!(
        stats
            .lines()
            .any(|l| l.starts_with("kafka_topic_records_in_total{topic=\"large\"} 1")),
        "the large record was not appended:\n{stats}"
    );
}

/// Handshakes that never finish hold a connection slot for a bounded time only: 200
/// connections that open TCP to a TLS listener and send half a record header are closed
/// `ssl_handshake_timeout_ms` after their accept, and 200 that start a SASL exchange and stop
/// are closed `sasl_authentication_timeout_ms` after theirs; meanwhile a TLS client is
/// answered within a second and a SASL producer delivers.
#[test]
fn stalled_handshakes_and_sasl_exchanges_are_closed_in_time_and_stop_nobody() {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let dir = tempfile::tempdir().unwrap();
    let certs = crate::security::certificates(dir.path());
    let (ssl, tls) = tls_listener("SSL", &certs);
    let sasl = format!("127.0.0.1:{}", free_port());
    let listeners = format!(
        "{tls}  - {{ address: {sasl}, security_protocol: SASL_PLAINTEXT, sasl_mechanisms: [PLAIN] }}\n"
    );
    let broker = broker_listening(
        dir.path(),
        &listeners,
        "ssl_handshake_timeout_ms: 2000\nsasl_authentication_timeout_ms: 2000\n",
    );
    let ca = certs.ca.display().to_string();
    let report = hostile_clients(
        &ssl,
        "tls-stall",
        &["--count", "200", "--seconds", "5", "--tls-ca", &ca],
        || {},
    );
    assert_probes_served(&report, 1.0);
    for after in closed_after(&report, 200) {
        assert!(
            (1.5..4.0).contains(&after),
            "a stalled TLS handshake was closed {after} s after connecting, not after 2 s"
        );
    }
    let timeouts = broker.metric("kafka_connections_handshake_timeouts_total{listener=\"SSL\"");
    assert!(timeouts >= 200.0, "handshake timeouts counted: {timeouts}");

    let producer: FutureProducer = alice_producer(&sasl);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut delivered = 0;
    let report = hostile_clients(
        &sasl,
        "sasl-stall",
        &["--count", "200", "--seconds", "5"],
        || {
            // The well-behaved SASL client authenticates and produces while they stall.
            for i in 0..20 {
                let value = format!("record {i}");
                let sent = runtime.block_on(producer.send(
                    FutureRecord::<(), _>::to("behaved").payload(&value),
                    Duration::from_secs(10),
                ));
                assert!(sent.is_ok(), "record {i}: {sent:?}");
                delivered += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
        },
    );
    assert_eq!(delivered, 20);
    assert_probes_served(&report, 1.0);
    for after in closed_after(&report, 200) {
        assert!(
            (1.5..4.0).contains(&after),
            "a stalled SASL exchange was closed {after} s after connecting, not after 2 s"
        );
    }
    let timeouts = broker
        .metric("kafka_connections_authentication_timeouts_total{listener=\"SASL_PLAINTEXT\"");
    assert!(
        timeouts >= 200.0,
        "authentication timeouts counted: {timeouts}"
    );
}
