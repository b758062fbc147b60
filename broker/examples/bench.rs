//! Produce and consume throughput with librdkafka against the broker, both in this process:
//!
//! ```text
//! cargo run --release -p ferry-broker --example bench -- [RECORDS] [RECORD_BYTES]
//! ```
//!
//! Defaults: 1,000,000 records of 100 bytes, one partition, acks=1, no compression.

use std::time::{Duration, Instant};

use ferry_broker::{Broker, BrokerConfig};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var("BENCH_DEBUG").is_ok() {
        tracing_subscriber::fmt().with_env_filter("debug").init();
    }
    let mut args = std::env::args().skip(1);
    let records: usize = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(1_000_000);
    let size: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(100);
    let dir = tempfile::tempdir()?;
    let config = BrokerConfig {
        listen: "127.0.0.1:0".parse()?,
        data_dir: dir.path().to_path_buf(),
        ..Default::default()
    };
    let broker = Broker::start(config).await?;
    let bootstrap = broker.local_addr().to_string();

    let report = tokio::task::spawn_blocking(move || -> Result<String, KafkaError> {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("acks", "1")
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
                    Err((e, _)) => return Err(e),
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
        while seen < records {
            if let Some(message) = consumer.poll(Duration::from_secs(5)) {
                let message = message?;
                seen += usize::from(message.payload().map_or(0, <[u8]>::len) == size);
            }
        }
        let consume = started.elapsed();
        let mb = (records * size) as f64 / 1e6;
        let line = |what: &str, took: Duration| {
            format!(
                "{what}: {records} records of {size} bytes in {:.2}s = {:.0} records/s, {:.1} MB/s",
                took.as_secs_f64(),
                records as f64 / took.as_secs_f64(),
                mb / took.as_secs_f64()
            )
        };
        Ok(format!(
            "{}\n{}",
            line("produce (acks=1)", produce),
            line("consume", consume)
        ))
    })
    .await??;
    println!("{report}");
    broker.shutdown().await;
    Ok(())
}
