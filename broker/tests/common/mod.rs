//! Helpers shared by the broker's integration tests: a real broker on 127.0.0.1:0 in a temp
//! dir, and real librdkafka clients pointed at it.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use ferry_broker::{Broker, BrokerConfig, BrokerHandle};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::FutureProducer;
use rdkafka::{Offset, TopicPartitionList};

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
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
