//! Helpers for tests against the bundled broker (feature `test-support`, for this workspace's
//! tests): a broker on port 0, and readers of what a transactional writer committed.

use std::path::Path;
use std::time::Duration;

use ferry_broker::{Broker, BrokerConfig, BrokerHandle};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, Timestamp, TopicPartitionList};

use crate::client::{Connection, GroupConsumer};

/// A bundled broker on 127.0.0.1 port 0 keeping its data in `dir`, whose new topics get
/// `partitions` partitions and whose groups rebalance at once; and its address.
pub async fn start_broker(dir: &Path, partitions: i32) -> (BrokerHandle, String) {
    let broker = Broker::start(BrokerConfig {
        listen: ([127, 0, 0, 1], 0).into(),
        data_dir: dir.to_path_buf(),
        num_partitions: partitions,
        group_initial_rebalance_delay_ms: 0,
        ..BrokerConfig::default()
    })
    .await
    .expect("the bundled broker starts in a temporary directory");
    let bootstrap = broker.local_addr().to_string();
    (broker, bootstrap)
}

/// Bodies a read_committed consumer finds in partition 0 of `topic`, from its beginning, once
/// nothing more arrives for 2 s.
pub fn committed_bodies(bootstrap: &str, topic: &str) -> Vec<String> {
    committed_records(bootstrap, topic)
        .into_iter()
        .map(|(body, _)| body)
        .collect()
}

/// The bodies and timestamps of [`committed_bodies`]' records.
pub fn committed_records(bootstrap: &str, topic: &str) -> Vec<(String, Timestamp)> {
    read_committed(bootstrap, topic, |m| {
        let body = String::from_utf8_lossy(m.payload().unwrap_or_default()).into();
        (body, m.timestamp())
    })
}

/// The keys and bodies of [`committed_bodies`]' records.
pub fn committed_keys(bootstrap: &str, topic: &str) -> Vec<(Option<String>, String)> {
    read_committed(bootstrap, topic, |m| {
        let key = m.key().map(|k| String::from_utf8_lossy(k).into_owned());
        (
            key,
            String::from_utf8_lossy(m.payload().unwrap_or_default()).into(),
        )
    })
}

/// The bodies a read_committed consumer finds in each of the first `partitions` partitions of
/// `topic`, from their beginning, once nothing more arrives for 2 s.
pub fn committed_bodies_by_partition(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
) -> Vec<Vec<String>> {
    (0..partitions)
        .map(|partition| {
            read_committed_in(bootstrap, topic, partition, |m| {
                String::from_utf8_lossy(m.payload().unwrap_or_default()).into()
            })
        })
        .collect()
}

/// What `read` makes of each record a read_committed consumer finds in partition 0 of
/// `topic`, from its beginning, once nothing more arrives for 2 s.
fn read_committed<T>(
    bootstrap: &str,
    topic: &str,
    read: impl Fn(&rdkafka::message::BorrowedMessage<'_>) -> T,
) -> Vec<T> {
    read_committed_in(bootstrap, topic, 0, read)
}

/// [`read_committed`] in `partition`.
fn read_committed_in<T>(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    read: impl Fn(&rdkafka::message::BorrowedMessage<'_>) -> T,
) -> Vec<T> {
    let consumer: BaseConsumer = Connection::plaintext(bootstrap)
        .consumer_config("reader")
        .create()
        .expect("a consumer of the test's broker");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Beginning)
        .expect("offset Beginning is valid");
    consumer.assign(&tpl).expect("assigning a partition");
    let mut records = Vec::new();
    let mut quiet = 0;
    while quiet < 10 {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                quiet = 0;
                records.push(read(&m));
            }
            _ => quiet += 1,
        }
    }
    records
}

/// The metadata of `group`'s committed offset of partition 0 of `topic` (empty when none): an
/// exactly-once sink's progress, a kafka channel's checkpoint of a source.
pub fn committed_metadata(bootstrap: &str, group: &str, topic: &str) -> String {
    GroupConsumer::new(&Connection::plaintext(bootstrap), group)
        .and_then(|consumer| consumer.committed_metadata(topic, 0))
        .expect("the group's committed offsets")
}
