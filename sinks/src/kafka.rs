//! `kafka`: Flume's KafkaSink. Writes each event as a Kafka record, through librdkafka, to the
//! bundled broker or any Kafka cluster. Flume headers travel as Kafka record headers; the
//! record key comes from the `key_header` header.
//!
//! `delivery: at_least_once` (the default): an idempotent producer; a batch is delivered when
//! every record of it was acknowledged (`acks`); if any fails, the batch is rolled back and
//! sent again, so a crash between the acknowledgement and the take commit repeats it.
//!
//! `delivery: exactly_once` (needs a durable channel): each batch is one Kafka transaction,
//! which also commits, with `send_offsets_to_transaction`, the channel sequence numbers of the
//! batch (as runs `first-last,...` in the metadata of the offset of partition 0 of
//! `progress_topic` for the consumer group `transactional_id`). The records and the progress
//! become visible together or not at all. Before its first batch, and after any failure, the
//! sink initialises its transactional producer (which fences an older instance and settles its
//! open transaction) and reads that progress back: the events of that batch were delivered by
//! a transaction that committed before the take could, and are skipped when the channel gives
//! them again. Only that batch is skipped, never "everything below", so other sinks sharing the
//! channel and rolled-back takes are safe. Only standard Kafka APIs are used, so this works the
//! same against any Kafka cluster.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ferry_core::{
    ComponentConfig, ConfigError, Event, Sink, SinkBatch, SinkContext, SinkError, async_trait,
};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde::Deserialize;

/// Options of the `kafka` sink.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSinkConfig {
    /// `host:port[,host:port]` of the cluster. Required. Flume: `kafka.bootstrap.servers`.
    pub bootstrap_servers: String,
    /// Topic to write to; `%{name}` is replaced by the event's header `name`. Default
    /// `default-flume-topic`. Flume: `kafka.topic`.
    #[serde(default = "default_topic")]
    pub topic: String,
    /// Header that names the topic of an event, when `allow_topic_override`. Default `topic`.
    /// Flume: `topicHeader`.
    #[serde(default = "default_topic_header")]
    pub topic_header: String,
    /// Let `topic_header` choose the topic. Default `true`. Flume: `allowTopicOverride`.
    #[serde(default = "default_true")]
    pub allow_topic_override: bool,
    /// Header whose value becomes the record key. Default `key` (Flume uses the header `key`).
    #[serde(default = "default_key_header")]
    pub key_header: String,
    /// Header holding the partition number of an event. Default none. Flume:
    /// `partitionIdHeader`.
    #[serde(default)]
    pub partition_id_header: Option<String>,
    /// Partition of every event without a partition header. Default: the producer's
    /// partitioner decides. Flume: `defaultPartitionId`.
    #[serde(default)]
    pub default_partition_id: Option<i32>,
    /// Acknowledgements to wait for: `0`, `1` or `all`. Default `all` (Kafka producers'
    /// default since 3.0; Flume's is `1`). Below `all` the producer is not idempotent.
    #[serde(default = "default_acks")]
    pub acks: String,
    /// `none`, `gzip`, `snappy`, `lz4` or `zstd`. Default `none`. Kafka: `compression.type`.
    #[serde(default = "default_compression")]
    pub compression: String,
    /// How long the producer waits to fill a request. Default `5ms`. Kafka: `linger.ms`.
    #[serde(default = "default_linger", with = "ferry_core::config::duration")]
    pub linger: Duration,
    /// Any other producer property, passed to librdkafka as written. Flume: `kafka.producer.*`.
    #[serde(default)]
    pub producer: BTreeMap<String, String>,
    /// `at_least_once` (default) or `exactly_once` (see the module docs).
    #[serde(default)]
    pub delivery: Delivery,
    /// With `exactly_once`: the producer's `transactional.id`, also the consumer group holding
    /// the progress. Must differ between agents: two agents sharing it fence each other and
    /// skip each other's events. Default `ferry-<host name>-<sink name>`.
    #[serde(default)]
    pub transactional_id: Option<String>,
    /// With `exactly_once`: the topic whose partition 0 the progress offsets name (created with
    /// one partition if missing). Default `ferry-sink-progress`.
    #[serde(default = "default_progress_topic")]
    pub progress_topic: String,
}

/// The delivery guarantee of the kafka sink.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// Idempotent producer; a crash may repeat a batch.
    #[default]
    AtLeastOnce,
    /// Transactional producer with progress in the same transaction.
    ExactlyOnce,
}

fn default_progress_topic() -> String {
    "ferry-sink-progress".into()
}

fn default_topic() -> String {
    "default-flume-topic".into()
}
fn default_topic_header() -> String {
    "topic".into()
}
fn default_key_header() -> String {
    "key".into()
}
fn default_true() -> bool {
    true
}
fn default_acks() -> String {
    "all".into()
}
fn default_compression() -> String {
    "none".into()
}
fn default_linger() -> Duration {
    Duration::from_millis(5)
}

/// The Kafka sink.
pub struct KafkaSink {
    config: KafkaSinkConfig,
    client: ClientConfig,
    producer: Option<FutureProducer>,
    /// With `exactly_once`: the transactional id (also the progress group) once started.
    transactional_id: Option<String>,
    /// With `exactly_once`: the channel sequence numbers of the last batch delivered, as runs
    /// (first, last), read back from the progress group; `None` until the producer is ready.
    delivered: Option<Runs>,
    /// With `exactly_once`: a consumer of the progress group, for its group metadata.
    progress: Option<Arc<BaseConsumer>>,
}

impl std::fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink")
            .field("config", &self.config)
            .finish()
    }
}

impl KafkaSink {
    /// Validates the options; the producer is created at `start`.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        let config: KafkaSinkConfig = cfg.parse()?;
        if config.bootstrap_servers.trim().is_empty() {
            return Err(cfg.error_at("bootstrap_servers", "`bootstrap_servers` is empty"));
        }
        if config.topic.is_empty() {
            return Err(cfg.error_at("topic", "`topic` is empty"));
        }
        cfg.check_one_of("acks", &config.acks, &["0", "1", "all", "-1"])?;
        cfg.check_one_of(
            "compression",
            &config.compression,
            &["none", "gzip", "snappy", "lz4", "zstd"],
        )?;
        let mut client = ClientConfig::new();
        client
            .set("bootstrap.servers", &config.bootstrap_servers)
            .set("acks", &config.acks)
            .set("compression.type", &config.compression)
            .set("linger.ms", config.linger.as_millis().to_string())
            // Retries inside the producer never duplicate or reorder records.
            .set("enable.idempotence", "true");
        if config.delivery == Delivery::ExactlyOnce {
            if config.acks != "all" && config.acks != "-1" {
                return Err(cfg.error_at(
                    "acks",
                    "`delivery: exactly_once` needs `acks: all` (transactions require it)",
                ));
            }
            client.set("acks", "all");
            if config.progress_topic.is_empty() {
                return Err(cfg.error_at("progress_topic", "`progress_topic` is empty"));
            }
        } else if config.acks != "all" && config.acks != "-1" {
            // An idempotent producer needs acks=all; with fewer acks the user chose speed.
            client.set("enable.idempotence", "false");
        }
        for (key, value) in &config.producer {
            client.set(key, value);
        }
        Ok(Self {
            config,
            client,
            producer: None,
            transactional_id: None,
            delivered: None,
            progress: None,
        })
    }

    /// The topic of `event`: the override header, or the template with headers filled in.
    fn topic_of(&self, event: &Event) -> String {
        if self.config.allow_topic_override
            && let Some(topic) = event.headers.get(&self.config.topic_header)
        {
            return topic.clone();
        }
        fill_template(&self.config.topic, event)
    }

    /// The partition the header names; a value that is not a partition number is logged and
    /// ignored (failing the batch would retry it forever).
    fn partition_of(&self, event: &Event) -> Result<Option<i32>, SinkError> {
        let Some(header) = &self.config.partition_id_header else {
            return Ok(self.config.default_partition_id);
        };
        match event.headers.get(header).map(|v| (v, v.parse::<i32>())) {
            Some((_, Ok(partition))) if partition >= 0 => Ok(Some(partition)),
            Some((value, _)) => {
                tracing::warn!(header = %header, value = %value, "not a partition number; the default partitioning applies");
                Ok(self.config.default_partition_id)
            }
            None => Ok(self.config.default_partition_id),
        }
    }
}

/// Replaces `%{name}` by the event's header `name` (empty when absent).
fn fill_template(template: &str, event: &Event) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find("%{") {
        out.push_str(&rest[..start]);
        match rest[start + 2..].find('}') {
            Some(end) => {
                let name = &rest[start + 2..start + 2 + end];
                out.push_str(event.headers.get(name).map_or("", String::as_str));
                rest = &rest[start + 3 + end..];
            }
            None => {
                out.push_str(&rest[start..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

fn kafka_error(context: &str, error: KafkaError) -> SinkError {
    SinkError::Delivery(format!("{context}: {error}"))
}

/// How long a transactional call waits before failing the batch (it is retried).
const TXN_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs a blocking librdkafka call off the async threads.
async fn blocking<T: Send + 'static>(
    context: &str,
    f: impl FnOnce() -> Result<T, KafkaError> + Send + 'static,
) -> Result<T, SinkError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| SinkError::Delivery(format!("{context}: {e}")))?
        .map_err(|e| kafka_error(context, e))
}

impl KafkaSink {
    /// With `exactly_once`: a transactional producer, initialised (fencing an older instance
    /// and settling its open transaction), and the progress read back from the group.
    async fn ready_exactly_once(&mut self) -> Result<(FutureProducer, Runs), SinkError> {
        if let (Some(producer), Some(delivered)) = (&self.producer, &self.delivered) {
            return Ok((producer.clone(), delivered.clone()));
        }
        let id = self.transactional_id.clone().unwrap_or_default();
        let topic = self.config.progress_topic.clone();
        let bootstrap = self.config.bootstrap_servers.clone();
        ensure_topic(&bootstrap, &topic).await?;
        let mut client = self.client.clone();
        client.set("transactional.id", &id);
        let producer: FutureProducer = client
            .create()
            .map_err(|e| kafka_error("creating the transactional producer", e))?;
        let p = producer.clone();
        blocking("initialising the transactional producer", move || {
            p.init_transactions(TXN_TIMEOUT)
        })
        .await?;
        let delivered = read_progress(&bootstrap, &id, &topic).await?;
        let progress = progress_consumer(&bootstrap, &id)
            .map_err(|e| kafka_error("creating the progress group's consumer", e))?;
        self.progress = Some(Arc::new(progress));
        tracing::info!(transactional_id = %id, last_delivered = %encode_runs(&delivered), "kafka sink ready for exactly-once delivery");
        self.producer = Some(producer.clone());
        self.delivered = Some(delivered.clone());
        Ok((producer, delivered))
    }

    /// Queues every record of `events` on `producer`; returns their delivery futures.
    async fn send_all(
        &self,
        producer: &FutureProducer,
        events: impl Iterator<Item = &Event>,
    ) -> Result<Vec<DeliveryFuture>, SinkError> {
        let mut pending: Vec<DeliveryFuture> = Vec::new();
        for event in events {
            let topic = self.topic_of(event);
            let partition = self.partition_of(event)?;
            let mut headers = OwnedHeaders::new_with_capacity(event.headers.len());
            for (key, value) in &event.headers {
                headers = headers.insert(Header {
                    key,
                    value: Some(value.as_bytes()),
                });
            }
            let mut record = FutureRecord::<[u8], [u8]>::to(&topic)
                .payload(&event.body[..])
                .headers(headers);
            if let Some(key) = event.headers.get(&self.config.key_header) {
                record = record.key(key.as_bytes());
            }
            if let Some(partition) = partition {
                record = record.partition(partition);
            }
            loop {
                match producer.send_result(record) {
                    Ok(delivery) => {
                        pending.push(delivery);
                        break;
                    }
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        // The local queue is full: wait for the oldest record of this batch.
                        record = back;
                        if let Some(oldest) = pending.first_mut() {
                            wait_for(oldest).await?;
                            pending.remove(0);
                        } else {
                            producer.poll(Duration::from_millis(10));
                        }
                    }
                    Err((error, _)) => {
                        return Err(kafka_error(&format!("sending to {topic}"), error));
                    }
                }
            }
        }
        Ok(pending)
    }

    /// One transaction: the fresh events and the progress after them.
    async fn deliver_exactly_once(&mut self, batch: SinkBatch<'_>) -> Result<(), SinkError> {
        let Some(sequences) = batch.sequences else {
            return Err(SinkError::Delivery(
                "`delivery: exactly_once` needs a channel that numbers its events: a file \
                 channel, or a kafka channel on a one-partition topic"
                    .into(),
            ));
        };
        let (producer, delivered) = self.ready_exactly_once().await?;
        // Only the events of the last batch a transaction committed are skipped: the one whose
        // take may not have committed. (Not "everything below": another sink on the same
        // channel may hand back lower sequence numbers, and a channel may number anew.)
        let fresh: Vec<&Event> = batch
            .events
            .iter()
            .zip(sequences)
            .filter(|(_, seq)| !in_runs(&delivered, **seq))
            .map(|(e, _)| e)
            .collect();
        if fresh.is_empty() {
            return Ok(());
        }
        let runs = runs_of(sequences);
        let result = self.transaction(&producer, fresh, &runs).await;
        match result {
            Ok(()) => {
                self.delivered = Some(runs);
                Ok(())
            }
            Err(error) => {
                // Whatever state the transaction is in, a new producer settles it (init
                // aborts an open one, completes a committing one) and the progress read then
                // tells what is delivered.
                let p = producer.clone();
                let _ = blocking("aborting the transaction", move || {
                    p.abort_transaction(TXN_TIMEOUT)
                })
                .await;
                self.producer = None;
                self.delivered = None;
                Err(error)
            }
        }
    }

    async fn transaction(
        &self,
        producer: &FutureProducer,
        events: Vec<&Event>,
        runs: &Runs,
    ) -> Result<(), SinkError> {
        let started = std::time::Instant::now();
        producer
            .begin_transaction()
            .map_err(|e| kafka_error("beginning a transaction", e))?;
        let mut pending = self.send_all(producer, events.into_iter()).await?;
        // Waiting for every record here, rather than leaving it to the commit, keeps the
        // commit's own flush from polling in 100 ms steps (rust-rdkafka's flush loop).
        for delivery in &mut pending {
            wait_for(delivery).await?;
        }
        let sent = started.elapsed();
        let topic = self.config.progress_topic.clone();
        let group = self
            .progress
            .clone()
            .ok_or_else(|| SinkError::Delivery("the progress group is not ready".into()))?;
        let p = producer.clone();
        let next = runs.last().map_or(0, |(_, last)| last + 1);
        let metadata = encode_runs(runs);
        blocking("committing the transaction", move || {
            let group_metadata = group.group_metadata().ok_or_else(|| {
                KafkaError::ClientCreation("no group metadata for the progress group".into())
            })?;
            let mut offsets = TopicPartitionList::new();
            let mut entry = offsets.add_partition(&topic, 0);
            entry.set_offset(Offset::Offset(next as i64))?;
            entry.set_metadata(metadata);
            p.send_offsets_to_transaction(&offsets, &group_metadata, TXN_TIMEOUT)?;
            p.commit_transaction(TXN_TIMEOUT)
        })
        .await?;
        let committed = started.elapsed();
        tracing::debug!(records = pending.len(), ?sent, ?committed, total = ?started.elapsed(), "transaction committed");
        Ok(())
    }
}

/// A consumer of the progress group, never subscribed: for its group metadata and committed
/// offsets.
fn progress_consumer(bootstrap: &str, group: &str) -> Result<BaseConsumer, KafkaError> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
}

/// Channel sequence numbers as runs of consecutive numbers: (first, last), in order.
type Runs = Vec<(u64, u64)>;

fn runs_of(sequences: &[u64]) -> Runs {
    let mut runs: Runs = Vec::new();
    for &seq in sequences {
        match runs.last_mut() {
            Some((_, last)) if seq == *last + 1 => *last = seq,
            _ => runs.push((seq, seq)),
        }
    }
    runs
}

fn in_runs(runs: &Runs, seq: u64) -> bool {
    runs.iter()
        .any(|(first, last)| (*first..=*last).contains(&seq))
}

/// `12-40,55-60`: the committed offset's metadata.
fn encode_runs(runs: &Runs) -> String {
    let parts: Vec<String> = runs.iter().map(|(a, b)| format!("{a}-{b}")).collect();
    parts.join(",")
}

fn decode_runs(text: &str) -> Option<Runs> {
    if text.is_empty() {
        return Some(Vec::new());
    }
    text.split(',')
        .map(|run| {
            let (a, b) = run.split_once('-')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        })
        .collect()
}

/// The channel sequence numbers of the last batch delivered: the metadata of the progress
/// group's committed offset on partition 0 of the progress topic (none at first).
async fn read_progress(bootstrap: &str, group: &str, topic: &str) -> Result<Runs, SinkError> {
    let (bootstrap, group, topic) = (bootstrap.to_owned(), group.to_owned(), topic.to_owned());
    let metadata = blocking("reading the sink's progress", move || {
        let consumer = progress_consumer(&bootstrap, &group)?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&topic, 0);
        let committed = consumer.committed_offsets(tpl, TXN_TIMEOUT)?;
        Ok(committed
            .find_partition(&topic, 0)
            .map(|e| e.metadata().to_owned())
            .unwrap_or_default())
    })
    .await?;
    decode_runs(&metadata).ok_or_else(|| {
        SinkError::Delivery(format!(
            "the progress recorded for this sink ({metadata:?}) is not one it wrote"
        ))
    })
}

/// Creates `topic` with one partition unless it exists.
async fn ensure_topic(bootstrap: &str, topic: &str) -> Result<(), SinkError> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .map_err(|e| kafka_error("creating an admin client", e))?;
    let new = NewTopic::new(topic, 1, TopicReplication::Fixed(-1));
    let results = admin
        .create_topics(
            [&new],
            &AdminOptions::new().request_timeout(Some(TXN_TIMEOUT)),
        )
        .await
        .map_err(|e| kafka_error(&format!("creating the progress topic {topic}"), e))?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => {
                return Err(SinkError::Delivery(format!(
                    "creating the progress topic {topic}: {code}"
                )));
            }
        }
    }
    Ok(())
}

#[async_trait]
impl Sink for KafkaSink {
    fn needs_sequence_numbers(&self) -> bool {
        self.config.delivery == Delivery::ExactlyOnce
    }

    async fn start(&mut self, ctx: &SinkContext) -> Result<(), SinkError> {
        if self.config.delivery == Delivery::ExactlyOnce {
            // The producer is made before the first batch, so an unreachable cluster is
            // retried like any failed delivery.
            self.transactional_id = Some(
                self.config
                    .transactional_id
                    .clone()
                    .unwrap_or_else(|| format!("ferry-{}-{}", ferry_core::host_name(), ctx.name)),
            );
            return Ok(());
        }
        let producer: FutureProducer = self
            .client
            .create()
            .map_err(|e| kafka_error("creating the Kafka producer", e))?;
        self.producer = Some(producer);
        Ok(())
    }

    async fn deliver(&mut self, batch: SinkBatch<'_>) -> Result<(), SinkError> {
        if self.config.delivery == Delivery::ExactlyOnce {
            return self.deliver_exactly_once(batch).await;
        }
        let Some(producer) = self.producer.clone() else {
            return Err(SinkError::Delivery("kafka sink used before start".into()));
        };
        let result = async {
            let mut pending = self.send_all(&producer, batch.events.iter()).await?;
            for delivery in &mut pending {
                wait_for(delivery).await?;
            }
            Ok(())
        }
        .await;
        if result.is_err()
            && let Some((code, reason)) = producer.client().fatal_error()
        {
            // A fatal producer error never clears: start over with a new producer.
            tracing::error!(error = %code, %reason, "the Kafka producer failed fatally; making a new one");
            self.producer = Some(
                self.client
                    .create()
                    .map_err(|e| kafka_error("creating the Kafka producer", e))?,
            );
        }
        result
    }

    async fn stop(&mut self) -> Result<(), SinkError> {
        if let Some(producer) = self.producer.take() {
            tokio::task::spawn_blocking(move || producer.flush(Duration::from_secs(30)))
                .await
                .map_err(|e| SinkError::Delivery(format!("flushing the producer: {e}")))?
                .map_err(|e| kafka_error("flushing the producer", e))?;
        }
        Ok(())
    }
}

async fn wait_for(delivery: &mut DeliveryFuture) -> Result<(), SinkError> {
    match delivery.await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err((error, _))) => Err(kafka_error("record not acknowledged", error)),
        Err(_) => Err(SinkError::Delivery("the producer was closed".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(headers: &[(&str, &str)]) -> Event {
        let mut e = Event::from_body("x");
        for (k, v) in headers {
            e.headers.insert((*k).into(), (*v).into());
        }
        e
    }

    #[test]
    fn topic_templates_take_header_values() {
        let e = event(&[("app", "web"), ("env", "prod")]);
        assert_eq!(fill_template("logs-%{app}-%{env}", &e), "logs-web-prod");
        assert_eq!(fill_template("logs-%{missing}", &e), "logs-");
        assert_eq!(fill_template("plain", &e), "plain");
        assert_eq!(fill_template("broken-%{app", &e), "broken-%{app");
    }

    #[test]
    fn topic_header_overrides_unless_disabled() {
        let sink = KafkaSink::build(&crate::config(
            "kafka",
            "bootstrap_servers: 127.0.0.1:9092\ntopic: base",
        ))
        .unwrap();
        assert_eq!(sink.topic_of(&event(&[("topic", "other")])), "other");
        let sink = KafkaSink::build(&crate::config(
            "kafka",
            "bootstrap_servers: 127.0.0.1:9092\ntopic: base\nallow_topic_override: false",
        ))
        .unwrap();
        assert_eq!(sink.topic_of(&event(&[("topic", "other")])), "base");
    }

    /// Bodies a read_committed consumer finds in `topic`, once their number stops changing.
    fn committed_bodies(bootstrap: &str, topic: &str) -> Vec<String> {
        use rdkafka::consumer::BaseConsumer;
        use rdkafka::message::Message;
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", "reader")
            .set("isolation.level", "read_committed")
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, 0, Offset::Beginning)
            .unwrap();
        consumer.assign(&tpl).unwrap();
        let mut bodies = Vec::new();
        let mut quiet = 0;
        while quiet < 10 {
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(m)) => {
                    quiet = 0;
                    bodies.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into());
                }
                _ => quiet += 1,
            }
        }
        bodies
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn exactly_once_skips_what_a_committed_transaction_delivered_and_fences_a_zombie() {
        let dir = tempfile::tempdir().unwrap();
        let broker = ferry_broker::Broker::start(ferry_broker::BrokerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: dir.path().to_path_buf(),
            ..Default::default()
        })
        .await
        .unwrap();
        let bootstrap = broker.local_addr().to_string();
        let yaml = format!(
            "bootstrap_servers: {bootstrap}\ntopic: out\ndelivery: exactly_once\ntransactional_id: t1"
        );
        let events: Vec<Event> = (0..150)
            .map(|i| Event::from_body(format!("e{i}")))
            .collect();
        let seqs: Vec<u64> = (1000..1150).collect();
        let batch = |from: usize, to: usize| SinkBatch {
            events: &events[from..to],
            sequences: Some(&seqs[from..to]),
        };

        let mut sink = KafkaSink::build(&crate::config("kafka", &yaml)).unwrap();
        sink.start(&crate::context()).await.unwrap();
        sink.deliver(batch(0, 100)).await.unwrap();
        // Without sequence numbers (a memory channel) exactly-once is refused.
        let err = sink
            .deliver(SinkBatch {
                events: &events[..1],
                sequences: None,
            })
            .await
            .unwrap_err();
        assert!(err.to_string().contains("numbers its events"), "{err}");
        drop(sink);

        // A zombie instance with the same transactional id left a transaction open.
        let zombie: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("transactional.id", "t1")
            .create()
            .unwrap();
        zombie.init_transactions(Duration::from_secs(10)).unwrap();
        zombie.begin_transaction().unwrap();
        zombie
            .send(
                FutureRecord::<(), _>::to("out").payload("zombie"),
                Duration::from_secs(10),
            )
            .await
            .unwrap();

        // The take of batch 0..100 was not committed (a crash): it comes again, with more.
        let mut sink = KafkaSink::build(&crate::config("kafka", &yaml)).unwrap();
        sink.start(&crate::context()).await.unwrap();
        sink.deliver(batch(0, 120)).await.unwrap();
        sink.deliver(batch(120, 150)).await.unwrap();
        assert!(zombie.commit_transaction(Duration::from_secs(10)).is_err());
        // Lower sequence numbers than the last batch's (another sink on the channel rolled
        // them back) are delivered: only the last batch itself is ever skipped.
        let late: Vec<Event> = (150..160)
            .map(|i| Event::from_body(format!("e{i}")))
            .collect();
        let late_seqs: Vec<u64> = (500..510).collect();
        sink.deliver(SinkBatch {
            events: &late,
            sequences: Some(&late_seqs),
        })
        .await
        .unwrap();

        let bodies = committed_bodies(&bootstrap, "out");
        let expected: Vec<String> = (0..160).map(|i| format!("e{i}")).collect();
        assert_eq!(bodies, expected);
        broker.shutdown().await;
    }

    #[test]
    fn progress_runs_round_trip() {
        let runs = runs_of(&[5, 6, 7, 10, 11, 40]);
        assert_eq!(runs, vec![(5, 7), (10, 11), (40, 40)]);
        assert_eq!(decode_runs(&encode_runs(&runs)), Some(runs.clone()));
        assert!(in_runs(&runs, 6) && in_runs(&runs, 40) && !in_runs(&runs, 8));
        assert_eq!(decode_runs(""), Some(vec![]));
        assert_eq!(decode_runs("x"), None);
        assert_eq!(decode_runs("1-"), None);
    }

    #[test]
    fn bad_options_name_the_closest_value() {
        let err = KafkaSink::build(&crate::config("kafka", "bootstrap_servers: h:1\nacks: al"))
            .unwrap_err();
        assert!(err.message.contains("did you mean `all`"), "{err:?}");
        assert_eq!(err.location.map(|l| l.line), Some(2));
    }
}
