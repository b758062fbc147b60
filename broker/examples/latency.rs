//! Produce → consume latency through the broker at a fixed rate, with librdkafka:
//!
//! ```text
//! cargo run --release -p ferry-broker --example latency -- \
//!     [--bootstrap HOST:PORT] [--rate 10000] [--seconds 10] [--size 100]
//! ```
//!
//! A producer paced at `--rate` records/s stamps each record with the time it was due to be
//! sent; a consumer in the same process (so on the same clock) reads the topic and takes the
//! difference. Counting from the due time rather than the actual send means a producer that
//! falls behind shows up as latency instead of hiding it. The first second is a warm-up and is
//! not counted. Without `--bootstrap` a broker is started in this process, in a temp dir.
//!
//! Producer: `acks=all`, `linger.ms=0`, one partition of a new topic. Consumer: assigned to it
//! from the beginning (no group), librdkafka's defaults otherwise (`fetch.wait.max.ms=500`,
//! `fetch.min.bytes=1`: the broker answers a waiting fetch as soon as a record arrives).
//! Prints the percentiles in one line, then as a JSON line for scripts (`scripts/bench`).

use std::time::{Duration, Instant};

use ferry_broker::{Broker, BrokerConfig};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

type BenchError = Box<dyn std::error::Error + Send + Sync>;

/// Records sent during this first stretch are not counted.
const WARMUP: Duration = Duration::from_secs(1);
/// How long after the last send the consumer may still wait for the rest.
const DRAIN: Duration = Duration::from_secs(30);
/// A record's payload starts with its due time (ns since the start) and its index.
const STAMP_BYTES: usize = 16;

/// What the command line asks for.
struct Options {
    bootstrap: Option<String>,
    rate: u64,
    seconds: u64,
    size: usize,
}

#[tokio::main]
async fn main() -> Result<(), BenchError> {
    let options = parse_args(std::env::args().skip(1))?;
    let dir = tempfile::tempdir()?;
    let (broker, bootstrap) = match options.bootstrap.clone() {
        Some(bootstrap) => (None, bootstrap),
        None => {
            let broker = Broker::start(BrokerConfig {
                listen: "127.0.0.1:0".parse()?,
                data_dir: dir.path().to_path_buf(),
                ..Default::default()
            })
            .await?;
            let bootstrap = broker.local_addr().to_string();
            (Some(broker), bootstrap)
        }
    };
    // A topic of its own, so earlier runs against the same broker are not read back.
    let topic = format!("latency-{}-{}", std::process::id(), unix_millis());
    create_topic(&bootstrap, &topic).await?;
    let report =
        tokio::task::spawn_blocking(move || measure(&bootstrap, &topic, &options)).await??;
    println!("{report}");
    if let Some(broker) = broker {
        broker.shutdown().await;
    }
    Ok(())
}

async fn create_topic(bootstrap: &str, topic: &str) -> Result<(), BenchError> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let new = NewTopic::new(topic, 1, TopicReplication::Fixed(1));
    for result in admin.create_topics([&new], &options).await? {
        result.map_err(|(topic, code)| format!("creating topic {topic}: {code}"))?;
    }
    Ok(())
}

fn measure(bootstrap: &str, topic: &str, options: &Options) -> Result<String, BenchError> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("linger.ms", "0")
        .create()?;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "latency")
        .set("enable.auto.commit", "false")
        .create()?;
    let mut assignment = TopicPartitionList::new();
    assignment.add_partition_offset(topic, 0, Offset::Beginning)?;
    consumer.assign(&assignment)?;

    let interval = Duration::from_nanos(1_000_000_000 / options.rate);
    let warmup = WARMUP.as_nanos() as u64 / interval.as_nanos() as u64;
    let total = warmup + options.rate * options.seconds;
    let origin = Instant::now();
    let (sent, latencies) = std::thread::scope(|scope| {
        let sender =
            scope.spawn(|| send_paced(&producer, topic, options.size, interval, total, origin));
        let latencies = receive(&consumer, total, warmup, origin, options.seconds);
        (sender.join(), latencies)
    });
    let send_seconds = sent.map_err(|_| "the producer thread panicked")??;
    let mut latencies = latencies?;
    latencies.sort_unstable();
    let ms = |p: f64| {
        let rank = ((p * latencies.len() as f64).ceil() as usize).clamp(1, latencies.len());
        latencies[rank - 1] as f64 / 1e6
    };
    let (p50, p99, p999) = (ms(0.50), ms(0.99), ms(0.999));
    let max = latencies.last().map_or(0.0, |ns| *ns as f64 / 1e6);
    let achieved = total as f64 / send_seconds;
    Ok(format!(
        "latency at {} records/s ({achieved:.0} achieved) of {} bytes, {} records after a {}s \
         warm-up: p50 {p50:.3} ms, p99 {p99:.3} ms, p99.9 {p999:.3} ms, max {max:.3} ms \
         (librdkafka producer acks=all linger.ms=0, consumer defaults)\n\
         {{\"bench\":\"latency\",\"client\":\"librdkafka\",\"producer\":\"acks=all linger.ms=0\",\
         \"rate\":{},\"achieved_rate\":{achieved:.1},\"size\":{},\"records\":{},\"p50_ms\":{p50:.4},\
         \"p99_ms\":{p99:.4},\"p999_ms\":{p999:.4},\"max_ms\":{max:.4}}}",
        options.rate,
        options.size,
        latencies.len(),
        WARMUP.as_secs(),
        options.rate,
        options.size,
        latencies.len(),
    ))
}

/// Sends `total` records, record `i` due at `origin + i * interval`; returns the seconds taken.
fn send_paced(
    producer: &BaseProducer,
    topic: &str,
    size: usize,
    interval: Duration,
    total: u64,
    origin: Instant,
) -> Result<f64, BenchError> {
    let mut payload = vec![b'x'; size];
    for i in 0..total {
        let due = interval * u32::try_from(i)?;
        if let Some(wait) = due.checked_sub(origin.elapsed()) {
            std::thread::sleep(wait);
        }
        payload[..8].copy_from_slice(&(due.as_nanos() as u64).to_le_bytes());
        payload[8..STAMP_BYTES].copy_from_slice(&i.to_le_bytes());
        loop {
            match producer.send(BaseRecord::<(), _>::to(topic).payload(&payload)) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    producer.poll(Duration::from_millis(1));
                }
                Err((e, _)) => return Err(e.into()),
            }
        }
        producer.poll(Duration::ZERO);
    }
    let seconds = origin.elapsed().as_secs_f64();
    producer.flush(DRAIN)?;
    Ok(seconds)
}

/// Reads until all `total` records came; returns the latencies (ns) of those after `warmup`.
fn receive(
    consumer: &BaseConsumer,
    total: u64,
    warmup: u64,
    origin: Instant,
    seconds: u64,
) -> Result<Vec<u64>, BenchError> {
    let deadline = origin + WARMUP + Duration::from_secs(seconds) + DRAIN;
    let mut latencies = Vec::with_capacity(usize::try_from(total - warmup)?);
    let mut received = 0;
    while received < total {
        if Instant::now() > deadline {
            return Err(format!("the consumer read {received} of {total} records in time").into());
        }
        let Some(message) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let now = origin.elapsed().as_nanos() as u64;
        let payload = message?.payload().map(<[u8]>::to_vec).unwrap_or_default();
        let (Some(due), Some(index)) = (
            payload.get(..8).and_then(|b| b.try_into().ok()),
            payload.get(8..STAMP_BYTES).and_then(|b| b.try_into().ok()),
        ) else {
            return Err("a record without a stamp".into());
        };
        received += 1;
        if u64::from_le_bytes(index) >= warmup {
            latencies.push(now.saturating_sub(u64::from_le_bytes(due)));
        }
    }
    Ok(latencies)
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Options, BenchError> {
    let mut options = Options {
        bootstrap: None,
        rate: 10_000,
        seconds: 10,
        size: 100,
    };
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || -> Result<u64, BenchError> {
            let n: u64 = value.parse().map_err(|e| format!("{flag} {value}: {e}"))?;
            if n == 0 {
                return Err(format!("{flag} must be above 0").into());
            }
            Ok(n)
        };
        match flag.as_str() {
            "--bootstrap" => options.bootstrap = Some(value.clone()),
            "--rate" => options.rate = number()?.min(1_000_000_000),
            "--seconds" => options.seconds = number()?,
            "--size" => options.size = usize::try_from(number()?)?,
            _ => return Err(format!("unknown option {flag}").into()),
        }
    }
    if options.size < STAMP_BYTES {
        return Err(format!("--size must be at least {STAMP_BYTES} bytes (the stamp)").into());
    }
    Ok(options)
}

fn unix_millis() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}
