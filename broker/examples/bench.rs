//! Produce and consume throughput with librdkafka against the broker, both in this process:
//!
//! ```text
//! cargo run --release -p ferry-broker --example bench -- [RECORDS] [RECORD_BYTES] [--acks 1|all]
//! ```
//!
//! Defaults: 1,000,000 records of 100 bytes, one partition, acks=1, no compression. Then, for
//! the broker's side of a consume alone, whole 10 MB Fetch responses read off a plain socket
//! without looking at the records (librdkafka's per-message work dominates the consume).
//! Prints one line per phase, then all of them as one JSON line for scripts (`scripts/bench`).

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};

use ferry_broker::{Broker, BrokerConfig};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{ApiKey, FetchRequest, RequestHeader, TopicName};
use kafka_protocol::protocol::{Encodable, StrBytes};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

type BenchError = Box<dyn std::error::Error + Send + Sync>;

/// The consumer gives up when no record came for this long.
const STALL: Duration = Duration::from_secs(60);

#[tokio::main]
async fn main() -> Result<(), BenchError> {
    if std::env::var("BENCH_DEBUG").is_ok() {
        tracing_subscriber::fmt().with_env_filter("debug").init();
    }
    let Options {
        records,
        size,
        acks,
    } = parse_args(std::env::args().skip(1))?;
    let dir = tempfile::tempdir()?;
    let config = BrokerConfig {
        listen: "127.0.0.1:0".parse()?,
        data_dir: dir.path().to_path_buf(),
        ..Default::default()
    };
    let broker = Broker::start(config).await?;
    let bootstrap = broker.local_addr().to_string();

    let report = tokio::task::spawn_blocking(move || -> Result<String, BenchError> {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("acks", &acks)
            .set("linger.ms", "5")
            .set("batch.size", "1000000")
            .set("queue.buffering.max.messages", "1000000")
            .create()?;
        let payload = vec![b'x'; size];
        let started = Instant::now();
        for _ in 0..records {
            loop {
                match producer.send(BaseRecord::<(), _>::to("bench").payload(&payload)) {
                    Ok(()) => break,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                        producer.poll(Duration::from_millis(1));
                    }
                    Err((e, _)) => return Err(e.into()),
                }
            }
        }
        producer.flush(Duration::from_secs(120))?;
        let produce = started.elapsed();

        let consumer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("group.id", "bench")
            .set("enable.auto.commit", "false")
            .set("fetch.max.bytes", "52428800")
            .set("max.partition.fetch.bytes", "10485760")
            // librdkafka pauses fetching for fetch.queue.backoff.ms (1 s) whenever more than
            // queued.min.messages wait in its queue; the defaults cap a fast consumer.
            .set("queued.min.messages", "2000000")
            .set("fetch.queue.backoff.ms", "5")
            .set_log_level(rdkafka::config::RDKafkaLogLevel::Info)
            .clone();
        let consumer: BaseConsumer = match std::env::var("BENCH_DEBUG") {
            Ok(debug) => consumer.clone().set("debug", debug).create()?,
            Err(_) => consumer.create()?,
        };
        let mut assignment = TopicPartitionList::new();
        assignment.add_partition_offset("bench", 0, Offset::Beginning)?;
        consumer.assign(&assignment)?;
        let started = Instant::now();
        let mut seen = 0;
        let mut last_seen = Instant::now();
        while seen < records {
            if let Some(message) = consumer.poll(Duration::from_secs(5)) {
                let message = message?;
                seen += usize::from(message.payload().map_or(0, <[u8]>::len) == size);
                last_seen = Instant::now();
            } else if last_seen.elapsed() > STALL {
                return Err(format!(
                    "consume: {seen} of {records} records, then none for {STALL:?}"
                )
                .into());
            }
        }
        let consume = started.elapsed();
        drop((consumer, producer));

        let fetches = 300;
        let mut stream = std::net::TcpStream::connect(&bootstrap)?;
        let mut response = Vec::new();
        let started = Instant::now();
        let cpu_before = (cpu_seconds("self"), cpu_seconds("thread-self"));
        let mut fetched = 0usize;
        for correlation_id in 0..fetches {
            stream.write_all(&fetch_request(correlation_id)?)?;
            let mut size = [0u8; 4];
            stream.read_exact(&mut size)?;
            response.resize(i32::from_be_bytes(size) as usize, 0);
            stream.read_exact(&mut response)?;
            fetched += 4 + response.len();
        }
        let raw_fetch = started.elapsed();
        // The broker's CPU: the process's but this (reading) thread's.
        let broker_cpu_ms_per_gb =
            match (cpu_before, cpu_seconds("self"), cpu_seconds("thread-self")) {
                ((Some(process0), Some(thread0)), Some(process1), Some(thread1)) => Some(
                    ((process1 - process0) - (thread1 - thread0)) * 1e3 / (fetched as f64 / 1e9),
                ),
                _ => None,
            };
        let broker_cpu = broker_cpu_ms_per_gb
            .map(|ms| format!("; broker CPU {ms:.0} ms per GB"))
            .unwrap_or_default();
        let mb = (records * size) as f64 / 1e6;
        let line = |what: &str, took: Duration| {
            format!(
                "{what}: {records} records of {size} bytes in {:.2}s = {:.0} records/s, {:.1} MB/s",
                took.as_secs_f64(),
                records as f64 / took.as_secs_f64(),
                mb / took.as_secs_f64()
            )
        };
        let fetch = format!(
            "fetch (raw socket, no record parsing): {fetches} responses, {:.0} MB in {:.2}s = \
             {:.0} MB/s{broker_cpu}",
            fetched as f64 / 1e6,
            raw_fetch.as_secs_f64(),
            fetched as f64 / 1e6 / raw_fetch.as_secs_f64()
        );
        let rate = |took: Duration| {
            format!(
                "{{\"seconds\":{:.6},\"records_per_s\":{:.1},\"mb_per_s\":{:.3}}}",
                took.as_secs_f64(),
                records as f64 / took.as_secs_f64(),
                mb / took.as_secs_f64()
            )
        };
        let json = format!(
            "{{\"bench\":\"broker\",\"records\":{records},\"size\":{size},\"acks\":\"{acks}\",\
             \"produce\":{},\"consume\":{},\"raw_fetch\":{{\"bytes\":{fetched},\"seconds\":{:.6},\
             \"mb_per_s\":{:.3},\"broker_cpu_ms_per_gb\":{}}}}}",
            rate(produce),
            rate(consume),
            raw_fetch.as_secs_f64(),
            fetched as f64 / 1e6 / raw_fetch.as_secs_f64(),
            broker_cpu_ms_per_gb.map_or("null".into(), |ms| format!("{ms:.1}")),
        );
        Ok(format!(
            "{}\n{}\n{fetch}\n{json}",
            line(&format!("produce (acks={acks})"), produce),
            line("consume", consume)
        ))
    })
    .await??;
    println!("{report}");
    broker.shutdown().await;
    Ok(())
}

/// What the command line asks for.
struct Options {
    records: usize,
    size: usize,
    /// The producer's `acks`: `0`, `1` or `all`.
    acks: String,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Options, BenchError> {
    let mut positional = Vec::new();
    let mut acks = "1".to_string();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--acks" => {
                acks = args.next().ok_or("--acks needs a value")?;
                if !["0", "1", "all", "-1"].contains(&acks.as_str()) {
                    return Err(format!("--acks {acks}: expected 0, 1 or all").into());
                }
            }
            flag if flag.starts_with("--") => return Err(format!("unknown option {flag}").into()),
            _ => positional.push(arg.parse::<usize>()?),
        }
    }
    match positional[..] {
        [] => Ok(Options {
            records: 1_000_000,
            size: 100,
            acks,
        }),
        [records] => Ok(Options {
            records,
            size: 100,
            acks,
        }),
        [records, size] => Ok(Options {
            records,
            size,
            acks,
        }),
        _ => Err("expected at most RECORDS and RECORD_BYTES".into()),
    }
}

/// A Fetch v4 frame for 10 MB of partition 0 of `bench` from its first offset.
fn fetch_request(correlation_id: i32) -> Result<BytesMut, BenchError> {
    let version = 4;
    let header = RequestHeader::default()
        .with_request_api_key(ApiKey::Fetch as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_static_str("bench")));
    let request = FetchRequest::default()
        .with_max_bytes(64 << 20)
        .with_topics(vec![
            FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_static_str("bench")))
                .with_partitions(vec![
                    FetchPartition::default()
                        .with_partition(0)
                        .with_fetch_offset(0)
                        .with_partition_max_bytes(10 << 20),
                ]),
        ]);
    let mut buf = BytesMut::new();
    buf.put_i32(0);
    header.encode(&mut buf, ApiKey::Fetch.request_header_version(version))?;
    request.encode(&mut buf, version)?;
    let size = (buf.len() - 4) as i32;
    buf[..4].copy_from_slice(&size.to_be_bytes());
    Ok(buf)
}

/// User and system CPU seconds of `/proc/<which>` ("self", "thread-self"), where Linux has it.
/// (/proc counts in USER_HZ, 100 on every Linux architecture tokio runs on.)
fn cpu_seconds(which: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{which}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}
