//! `kafka`: Flume's KafkaSink. Writes each event as a Kafka record, through librdkafka, to the
//! bundled broker or any Kafka cluster. Flume headers travel as Kafka record headers; the
//! record key comes from the `key_header` header. Records with neither key nor partition go
//! one channel batch to one partition of `topic`, the next batch to the next (see `Spread`).
//!
//! The sink pipelines: [`Sink::send`] queues the records of a channel batch on the producer
//! and returns, so the runner takes the next batch while Kafka acknowledges the earlier ones;
//! [`Sink::flush`] waits until every record sent since the last flush is safe. The runner
//! flushes once `transaction_max_events` events or `transaction_max_bytes` bytes are in
//! flight, `transaction_max_delay` after the first send, or when the channel has nothing more
//! ready, and only then commits the takes.
//! A flush waits on one counter of the records sent since the last one, and a full producer
//! queue waits for room (see [`crate::client`]).
//!
//! `delivery: at_least_once` (the default): an idempotent producer; a flush succeeds when
//! every record sent since the last one was acknowledged (`acks`); if any fails, every batch
//! since the last flush is rolled back and sent again, so a failure, or a crash between the
//! acknowledgement and the take commits, repeats them.
//!
//! `delivery: exactly_once` (needs a durable channel): the batches sent between two flushes go
//! in one Kafka transaction, which also commits, with `send_offsets_to_transaction`, the
//! channel sequence numbers of all of them, those skipped included (as runs `first-last,...`
//! in the metadata of the offset of partition 0 of `progress_topic` for the consumer group
//! `transactional_id`). The records and the progress become visible together or not at all;
//! a failed send or flush aborts the transaction, and the runner sends its batches again.
//! Before its first batch, and after any failure, the sink initialises its transactional
//! producer (which fences an older instance and settles its open transaction) and reads that
//! progress back: the events of those batches were delivered by a transaction that committed
//! before their takes could, and are skipped when the channel gives them again, however the
//! channel groups them into batches this time. Only the last committed transaction's events
//! are skipped, never "everything below", so other sinks sharing the channel and rolled-back
//! takes are safe. Only standard Kafka APIs are used, so this works the same against any
//! Kafka cluster.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferry_core::{
    CompactString, ComponentConfig, ConfigError, Event, Headers, Pipelining, Sink, SinkBatch,
    SinkContext, SinkError, async_trait,
};
use rdkafka::ClientConfig;
use serde::Deserialize;

use crate::client::{
    ClientError, Connection, GroupConsumer, GroupOffset, Producer, Role, TransactionalProducer,
    call_blocking, create_topic, headers,
};

/// Options of the `kafka` sink.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSinkConfig {
    // `bootstrap_servers` and the security options are read by [`Connection::from_config`],
    // the same for every Kafka component (see `crate::client::security`).
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
    /// Most events sent before the sink waits for them to be safe: with `exactly_once`, the
    /// most in one Kafka transaction (which then holds several channel batches, 100 at most);
    /// with `at_least_once`, the most awaiting acknowledgement. Default `50000`.
    #[serde(default = "default_transaction_max_events")]
    pub transaction_max_events: usize,
    /// Most bytes of events (bodies and headers) sent before the sink waits for them to be
    /// safe, the memory bound of what is in flight when events are large. Default `16MiB`.
    #[serde(default = "default_transaction_max_bytes")]
    pub transaction_max_bytes: ferry_core::config::ByteSize,
    /// Longest time from the first batch sent until the sink waits for it to be safe and
    /// commits (the transaction, with `exactly_once`). Default `100ms`, Kafka Streams'
    /// `commit.interval.ms` under exactly-once.
    #[serde(
        default = "default_transaction_max_delay",
        with = "ferry_core::config::duration"
    )]
    pub transaction_max_delay: Duration,
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
fn default_transaction_max_events() -> usize {
    50_000
}
fn default_transaction_max_bytes() -> ferry_core::config::ByteSize {
    ferry_core::config::ByteSize(16 << 20)
}
fn default_transaction_max_delay() -> Duration {
    Duration::from_millis(100)
}

/// With `exactly_once`: what was sent since the last flush.
#[derive(Debug)]
struct Transaction {
    /// Every channel sequence number of the batches sent, skipped ones included.
    runs: Runs,
    records: usize,
    batches: usize,
    started: Instant,
}

/// The Kafka sink.
pub struct KafkaSink {
    config: KafkaSinkConfig,
    connection: Connection,
    client: ClientConfig,
    /// Whether `topic` holds `%{header}` references (else no event needs its own topic name).
    topic_is_template: bool,
    /// With `at_least_once`: the producer.
    producer: Option<Producer>,
    /// With `exactly_once`: the transactional producer, once initialised; `None` again after
    /// a failure.
    session: Option<TransactionalProducer>,
    /// With `exactly_once`: the transactional id (also the progress group) once started.
    transactional_id: Option<String>,
    /// With `exactly_once`: the channel sequence numbers the last committed transaction
    /// delivered, as runs, read back from the progress group; `None` until the producer is
    /// ready.
    delivered: Option<Runs>,
    /// With `exactly_once`: a consumer of the progress group, for its group metadata.
    progress: Option<Arc<GroupConsumer>>,
    /// With `exactly_once`: the transaction filled since the last flush.
    open: Option<Transaction>,
    /// The partition of each batch's records that have neither key nor partition; `None` when
    /// librdkafka's partitioner decides (a topic template, or a `partitioner` property).
    spread: Option<Mutex<Spread>>,
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
        let (connection, own) = Connection::from_config(cfg, Role::Sink)?;
        // Every problem of the options at once: those of reading them, then the checks of the
        // rest.
        let (config, mut problems) = own.parse_all::<KafkaSinkConfig>();
        let Some(config) = config else {
            ConfigError::all(problems)?;
            return Err(cfg.error_at("type", "the options could not be read"));
        };
        problems.extend(Connection::check_passthrough(cfg, "producer", &config.producer).err());
        if config.topic.is_empty() {
            problems.push(cfg.error_at("topic", "`topic` is empty"));
        }
        if config.transaction_max_events == 0 {
            problems.push(cfg.error_at(
                "transaction_max_events",
                "`transaction_max_events` must be at least 1",
            ));
        }
        if config.transaction_max_bytes.bytes() == 0 {
            problems.push(cfg.error_at(
                "transaction_max_bytes",
                "`transaction_max_bytes` must be at least 1 byte",
            ));
        }
        problems.extend(
            cfg.check_one_of("acks", &config.acks, &["0", "1", "all", "-1"])
                .err(),
        );
        problems.extend(
            cfg.check_one_of(
                "compression",
                &config.compression,
                &["none", "gzip", "snappy", "lz4", "zstd"],
            )
            .err(),
        );
        let all_acks = config.acks == "all" || config.acks == "-1";
        if config.delivery == Delivery::ExactlyOnce {
            if matches!(config.acks.as_str(), "0" | "1") {
                problems.push(cfg.error_at(
                    "acks",
                    "`delivery: exactly_once` needs `acks: all` (transactions require it)",
                ));
            }
            if config.progress_topic.is_empty() {
                problems.push(cfg.error_at("progress_topic", "`progress_topic` is empty"));
            }
        }
        ConfigError::all(problems)?;
        let mut client = connection.client_config();
        client
            .set("acks", &config.acks)
            .set("compression.type", &config.compression)
            .set("linger.ms", config.linger.as_millis().to_string())
            // Retries inside the producer never duplicate or reorder records.
            .set("enable.idempotence", "true");
        if config.delivery == Delivery::ExactlyOnce {
            client.set("acks", "all");
        } else if !all_acks {
            // An idempotent producer needs acks=all; with fewer acks the user chose speed.
            client.set("enable.idempotence", "false");
        }
        for (key, value) in &config.producer {
            client.set(key, value);
        }
        let topic_is_template = config.topic.contains("%{");
        let spread = (!topic_is_template && !config.producer.contains_key("partitioner"))
            .then(|| Mutex::new(Spread::default()));
        Ok(Self {
            topic_is_template,
            spread,
            config,
            connection,
            client,
            producer: None,
            session: None,
            transactional_id: None,
            delivered: None,
            progress: None,
            open: None,
        })
    }

    /// The topic of `event`: the override header, or the template with headers filled in.
    /// Only a template makes a new string.
    fn topic_of<'a>(&'a self, event: &'a Event) -> Cow<'a, str> {
        if self.config.allow_topic_override
            && let Some(topic) = event.headers.get(self.config.topic_header.as_str())
        {
            return Cow::Borrowed(topic);
        }
        if self.topic_is_template {
            Cow::Owned(fill_template(&self.config.topic, event))
        } else {
            Cow::Borrowed(&self.config.topic)
        }
    }

    /// The partition the header names; a value that is not a partition number is logged and
    /// ignored (failing the batch would retry it forever).
    fn partition_of(&self, event: &Event) -> Option<i32> {
        let Some(header) = &self.config.partition_id_header else {
            return self.config.default_partition_id;
        };
        match event
            .headers
            .get(header.as_str())
            .map(|v| (v, v.parse::<i32>()))
        {
            Some((_, Ok(partition))) if partition >= 0 => Some(partition),
            Some((value, _)) => {
                tracing::warn!(header = %header, value = %value, "not a partition number; the default partitioning applies");
                self.config.default_partition_id
            }
            None => self.config.default_partition_id,
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
                out.push_str(event.headers.value(name).unwrap_or(""));
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

/// The partitions of the sink's topic, each channel batch's records without key or partition
/// going to the next one in turn: what librdkafka's sticky partitioner does per `linger`, done
/// once per batch rather than with a partition lookup and a clock read per record.
#[derive(Debug)]
struct Spread {
    /// The topic's partitions when last asked; `None` while unknown (librdkafka's partitioner
    /// decides).
    partitions: Option<i32>,
    /// The next batch's partition (modulo `partitions`).
    next: u32,
    /// When the cluster was last asked; `None` until it is, and again after a failure.
    asked: Option<Instant>,
}

impl Default for Spread {
    fn default() -> Self {
        // Agents starting together begin on different partitions.
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.subsec_nanos());
        Self {
            partitions: None,
            next: seed ^ std::process::id(),
            asked: None,
        }
    }
}

/// How often the sink asks how many partitions its topic has, so that partitions added while
/// it runs get records (librdkafka refreshes its own metadata every 5 minutes).
const SPREAD_REFRESH: Duration = Duration::from_secs(60);

/// Where the events of one header map go.
struct Route<'a> {
    headers: &'a Headers,
    topic: Cow<'a, str>,
    key: Option<&'a CompactString>,
    partition: Option<i32>,
}

/// Most channel batches in flight (in one transaction, with `exactly_once`). Each batch adds
/// at least one run `first-last` to the transaction's progress record; when sinks sharing a
/// channel interleave their takes, every batch adds one, and the record must fit Kafka's
/// `offset.metadata.max.bytes` (4096 by default): 100 runs of 12-digit numbers do.
const MAX_BATCHES_IN_FLIGHT: usize = 100;

impl KafkaSink {
    /// Queues a record for each of `events` on `producer`.
    async fn queue<'a>(
        &'a self,
        producer: &Producer,
        events: impl Iterator<Item = &'a Event> + Send,
    ) -> Result<(), ClientError> {
        // The records' CreateTime: one clock read per batch rather than librdkafka's per record.
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_millis() as i64);
        let spread = self.batch_partition(producer).await;
        // An event's topic, key and partition come from its headers alone: the events sharing
        // one header map (a tailed file's lines, a decoded channel batch) look them up once.
        let mut routed: Option<Route<'a>> = None;
        for event in events {
            let route = match &routed {
                Some(route) if route.headers.shares_with(&event.headers) => route,
                _ => {
                    let topic = self.topic_of(event);
                    let key = event.headers.get(self.config.key_header.as_str());
                    // A record with a key goes where librdkafka hashes it.
                    let spread = spread.filter(|_| key.is_none() && topic == self.config.topic);
                    &*routed.insert(Route {
                        headers: &event.headers,
                        partition: self.partition_of(event).or(spread),
                        topic,
                        key,
                    })
                }
            };
            let mut record = producer
                .record(&route.topic)
                .payload(&event.body[..])
                .timestamp(now);
            if !event.headers.is_empty() {
                record = record.headers(headers::record_headers(event));
            }
            if let Some(key) = route.key {
                record = record.key(key.as_bytes());
            }
            if let Some(partition) = route.partition {
                record = record.partition(partition);
            }
            producer.send(record).await?;
        }
        Ok(())
    }

    /// The partition of this batch's records that have neither key nor partition, when the
    /// sink spreads them itself (see [`Spread`]); asks the cluster first when it never has, or
    /// not for [`SPREAD_REFRESH`].
    async fn batch_partition(&self, producer: &Producer) -> Option<i32> {
        let spread = self.spread.as_ref()?;
        let lock = || spread.lock().unwrap_or_else(|e| e.into_inner());
        let stale = lock()
            .asked
            .is_none_or(|asked| asked.elapsed() >= SPREAD_REFRESH);
        if stale {
            let partitions = producer.partition_count(&self.config.topic).await;
            let mut spread = lock();
            spread.partitions = partitions;
            spread.asked = Some(Instant::now());
        }
        let mut spread = lock();
        let partitions = spread.partitions?;
        let partition = spread.next % partitions.unsigned_abs();
        spread.next = partition.wrapping_add(1);
        i32::try_from(partition).ok()
    }

    /// With `at_least_once`: queues the batch's records.
    async fn send_at_least_once(&mut self, batch: SinkBatch<'_>) -> Result<(), SinkError> {
        if self.producer.is_none() {
            // Replacing a fatally failed producer failed: try again.
            self.producer = Some(Producer::new(&self.client, self.connection.context())?);
        }
        let Some(producer) = &self.producer else {
            return Ok(());
        };
        Ok(self.queue(producer, batch.events.iter()).await?)
    }

    /// With `at_least_once`: waits until every record sent since the last flush is
    /// acknowledged.
    async fn acknowledged(&mut self) -> Result<(), SinkError> {
        match &mut self.producer {
            Some(producer) => Ok(producer.acknowledged().await?),
            None => Ok(()),
        }
    }

    /// With `exactly_once`: makes the transactional producer ready (initialising it fences an
    /// older instance and settles its open transaction) and reads the progress back from the
    /// group.
    async fn ready_exactly_once(&mut self) -> Result<(), SinkError> {
        if self.session.is_some() && self.delivered.is_some() {
            return Ok(());
        }
        let id = self.transactional_id.clone().unwrap_or_default();
        let topic = self.config.progress_topic.clone();
        let started = std::time::Instant::now();
        create_topic(&self.connection, &topic, 1).await?;
        let created = started.elapsed();
        let mut client = self.client.clone();
        client.set("transactional.id", &id);
        let session =
            TransactionalProducer::init(&client, self.connection.context(), &topic).await?;
        let initialised = started.elapsed();
        // One consumer of the progress group reads the progress and then lends the group's
        // metadata to the transactions (destroying a consumer takes librdkafka 100 ms).
        let progress = Arc::new(GroupConsumer::new(&self.connection, &id)?);
        let delivered = read_progress(&progress, &topic).await?;
        tracing::debug!(progress_topic = ?created, transactions = ?initialised, progress_read = ?started.elapsed(), "exactly-once start-up took");
        if let Some(old) = self.progress.replace(progress) {
            tokio::task::spawn_blocking(move || drop(old));
        }
        tracing::info!(transactional_id = %id, last_delivered = %encode_runs(&delivered), "kafka sink ready for exactly-once delivery");
        self.session = Some(session);
        self.delivered = Some(delivered);
        Ok(())
    }

    /// With `exactly_once`: adds the batch to the open transaction (beginning one if needed)
    /// and queues its events that the last committed transaction did not deliver.
    async fn send_exactly_once(&mut self, batch: SinkBatch<'_>) -> Result<(), SinkError> {
        let Some(sequences) = batch.sequences else {
            return Err(SinkError::Delivery(
                "`delivery: exactly_once` needs a channel that numbers its events: a file \
                 channel, or a kafka channel on a one-partition topic"
                    .into(),
            ));
        };
        self.ready_exactly_once().await?;
        let delivered = self.delivered.as_ref();
        // Only the events of the last committed transaction are skipped: those whose takes
        // may not have committed. (Not "everything below": another sink on the same channel
        // may hand back lower sequence numbers, and a channel may number anew.)
        let is_fresh = |seq: &u64| !delivered.is_some_and(|runs| in_runs(runs, *seq));
        let fresh = sequences.iter().filter(|seq| is_fresh(seq)).count();
        let open = self.open.get_or_insert_with(|| Transaction {
            runs: Runs::new(),
            records: 0,
            batches: 0,
            started: Instant::now(),
        });
        // Skipped events count too: their takes commit after this transaction, so a crash
        // before then must find them in its progress.
        extend_runs(&mut open.runs, sequences);
        open.batches += 1;
        if fresh == 0 {
            return Ok(());
        }
        open.records += fresh;
        let Some(session) = &mut self.session else {
            return Err(SinkError::Delivery(
                "the transactional producer is not ready".into(),
            ));
        };
        // Not begun while every event sent was already delivered by the last committed one.
        session.begin()?;
        let Some(session) = &self.session else {
            return Ok(());
        };
        let events = batch
            .events
            .iter()
            .zip(sequences)
            .filter(|(_, seq)| is_fresh(seq))
            .map(|(event, _)| event);
        Ok(self.queue(session.producer(), events).await?)
    }

    /// With `exactly_once`: waits for every record of the open transaction, then commits it
    /// with the progress of all its batches.
    async fn commit_transaction(&mut self) -> Result<(), SinkError> {
        let Some(open) = &self.open else {
            return Ok(());
        };
        let (Some(session), Some(group)) = (&mut self.session, &self.progress) else {
            return Err(SinkError::Delivery(
                "the transactional producer is not ready".into(),
            ));
        };
        if !session.is_open() {
            // Every event was delivered by the last committed transaction, whose progress
            // already names them.
            self.open = None;
            return Ok(());
        }
        let next = open.runs.iter().map(|(_, last)| last + 1).max();
        let progress = GroupOffset {
            group: Arc::clone(group),
            topic: self.config.progress_topic.clone(),
            offset: next.unwrap_or(0) as i64,
            metadata: encode_runs(&open.runs),
        };
        session.commit(Some(progress)).await?;
        if let Some(open) = self.open.take() {
            tracing::debug!(records = open.records, batches = open.batches, total = ?open.started.elapsed(), "transaction committed");
            self.delivered = Some(open.runs);
        }
        Ok(())
    }

    /// After a failed send or flush: drops what was sent since the last flush. With
    /// `exactly_once` the transaction is aborted and the producer made anew before the next
    /// batch (initialising it settles whatever state the transaction is in, and the progress
    /// read then tells what is delivered); with `at_least_once` a producer that failed fatally
    /// is replaced.
    async fn discard(&mut self) {
        self.open = None;
        if let Some(spread) = &self.spread {
            // Ask again before the next batch: the topic may have changed (recreated with
            // fewer partitions, say).
            spread.lock().unwrap_or_else(|e| e.into_inner()).asked = None;
        }
        if let Some(session) = self.session.take() {
            session.abort().await;
            self.delivered = None;
        }
        let Some(producer) = &mut self.producer else {
            return;
        };
        producer.forget_sent();
        if let Some((code, reason)) = producer.fatal_error() {
            // A fatal producer error never clears: start over with a new producer.
            tracing::error!(error = %code, %reason, "the Kafka producer failed fatally; making a new one");
            self.producer = Producer::new(&self.client, self.connection.context()).ok();
        }
    }
}

/// Channel sequence numbers as runs of consecutive numbers: (first, last), in order.
type Runs = Vec<(u64, u64)>;

/// Adds `sequences` to `runs`, joining a run that continues the last one.
fn extend_runs(runs: &mut Runs, sequences: &[u64]) {
    for &seq in sequences {
        match runs.last_mut() {
            Some((_, last)) if seq == *last + 1 => *last = seq,
            _ => runs.push((seq, seq)),
        }
    }
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

/// The channel sequence numbers the last committed transaction delivered: the metadata of the
/// progress group's committed offset on partition 0 of the progress topic (none at first).
async fn read_progress(consumer: &Arc<GroupConsumer>, topic: &str) -> Result<Runs, SinkError> {
    let consumer = Arc::clone(consumer);
    let topic = topic.to_owned();
    let metadata = call_blocking("reading the sink's progress", move || {
        Ok(consumer.committed_metadata(&topic, 0))
    })
    .await??;
    decode_runs(&metadata).ok_or_else(|| {
        SinkError::Delivery(format!(
            "the progress recorded for this sink ({metadata:?}) is not one it wrote"
        ))
    })
}

#[async_trait]
impl Sink for KafkaSink {
    fn needs_sequence_numbers(&self) -> bool {
        self.config.delivery == Delivery::ExactlyOnce
    }

    async fn start(&mut self, ctx: &SinkContext) -> Result<(), SinkError> {
        self.connection.report_to(&ctx.metrics, &mut self.client);
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
        let producer = Producer::new(&self.client, self.connection.context())?;
        if !self.topic_is_template {
            producer.connect(&self.config.topic).await;
        }
        self.producer = Some(producer);
        Ok(())
    }

    async fn deliver(&mut self, batch: SinkBatch<'_>) -> Result<(), SinkError> {
        self.send(batch).await?;
        self.flush().await
    }

    async fn send(&mut self, batch: SinkBatch<'_>) -> Result<(), SinkError> {
        let sent = match self.config.delivery {
            Delivery::ExactlyOnce => self.send_exactly_once(batch).await,
            Delivery::AtLeastOnce => self.send_at_least_once(batch).await,
        };
        if sent.is_err() {
            self.discard().await;
        }
        sent
    }

    async fn flush(&mut self) -> Result<(), SinkError> {
        let flushed = match self.config.delivery {
            Delivery::ExactlyOnce => self.commit_transaction().await,
            Delivery::AtLeastOnce => self.acknowledged().await,
        };
        if flushed.is_err() {
            self.discard().await;
        }
        flushed
    }

    fn pipelining(&self) -> Pipelining {
        Pipelining {
            max_batches: MAX_BATCHES_IN_FLIGHT,
            max_events: self.config.transaction_max_events,
            max_bytes: usize::try_from(self.config.transaction_max_bytes.bytes())
                .unwrap_or(usize::MAX),
            max_delay: self.config.transaction_max_delay,
        }
    }

    async fn stop(&mut self) -> Result<(), SinkError> {
        let session = self.session.take();
        let producer = self.producer.take();
        match (&session, &producer) {
            (Some(session), _) => session.producer().flush().await?,
            (None, Some(producer)) => producer.flush().await?,
            (None, None) => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Connection;
    use crate::test_support::{
        committed_bodies, committed_bodies_by_partition, committed_keys, committed_records,
    };
    use rdkafka::Timestamp;
    use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};

    fn config(yaml: &str) -> ComponentConfig {
        ComponentConfig::from_yaml(ferry_core::ComponentKind::Sink, "test", "kafka", yaml).unwrap()
    }

    fn context() -> SinkContext {
        SinkContext {
            name: "test".into(),
            metrics: ferry_core::ComponentMetrics::new("sink", "test"),
            state: None,
        }
    }

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
        let sink =
            KafkaSink::build(&config("bootstrap_servers: 127.0.0.1:9092\ntopic: base")).unwrap();
        assert_eq!(sink.topic_of(&event(&[("topic", "other")])), "other");
        // Neither the header nor a plain topic makes a string per event; a template does.
        assert!(matches!(
            sink.topic_of(&event(&[("topic", "other")])),
            Cow::Borrowed(_)
        ));
        assert!(matches!(sink.topic_of(&event(&[])), Cow::Borrowed("base")));
        let sink = KafkaSink::build(&config(
            "bootstrap_servers: 127.0.0.1:9092\ntopic: logs-%{app}",
        ))
        .unwrap();
        let web = event(&[("app", "web")]);
        let topic = sink.topic_of(&web);
        assert!(
            matches!(&topic, Cow::Owned(t) if t == "logs-web"),
            "{topic}"
        );
        let sink = KafkaSink::build(&config(
            "bootstrap_servers: 127.0.0.1:9092\ntopic: base\nallow_topic_override: false",
        ))
        .unwrap();
        assert_eq!(sink.topic_of(&event(&[("topic", "other")])), "base");
    }

    async fn start_broker(dir: &std::path::Path) -> ferry_broker::BrokerHandle {
        crate::test_support::start_broker(dir, 1).await.0
    }

    async fn started(yaml: &str) -> KafkaSink {
        let mut sink = KafkaSink::build(&config(yaml)).unwrap();
        sink.start(&context()).await.unwrap();
        sink
    }

    fn numbered(from: usize, to: usize) -> Vec<Event> {
        (from..to)
            .map(|i| Event::from_body(format!("e{i}")))
            .collect()
    }

    fn names(from: usize, to: usize) -> Vec<String> {
        (from..to).map(|i| format!("e{i}")).collect()
    }

    /// Events sharing a header map are routed once for all of them; each event still goes
    /// where its own headers say, whatever the order of shared and unshared maps.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn events_sharing_headers_go_where_their_headers_say() {
        let dir = tempfile::tempdir().unwrap();
        let broker = start_broker(dir.path()).await;
        let bootstrap = broker.local_addr().to_string();
        let mut sink = started(&format!("bootstrap_servers: {bootstrap}\ntopic: base")).await;
        let shared_a = event(&[("topic", "a"), ("key", "k1")]).headers;
        let with = |headers: &Headers, body: &str| Event::new(headers.clone(), body.to_owned());
        let b = event(&[("topic", "b")]);
        // A copy of b's map changed after the clone: a map of its own.
        let mut b_keyed = with(&b.headers, "e5");
        b_keyed.headers.set("key", "k2");
        let events = vec![
            with(&shared_a, "e0"),
            with(&shared_a, "e1"),
            with(&b.headers, "e2"),
            with(&shared_a, "e3"),
            Event::from_body("e4"),
            b_keyed,
            with(&b.headers, "e6"),
        ];
        sink.send(SinkBatch {
            events: &events,
            sequences: None,
        })
        .await
        .unwrap();
        sink.flush().await.unwrap();
        let keyed = |pairs: &[(Option<&str>, &str)]| -> Vec<(Option<String>, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.map(str::to_owned), (*v).to_owned()))
                .collect()
        };
        let k1 = Some("k1");
        assert_eq!(
            committed_keys(&bootstrap, "a"),
            keyed(&[(k1, "e0"), (k1, "e1"), (k1, "e3")])
        );
        assert_eq!(
            committed_keys(&bootstrap, "b"),
            keyed(&[(None, "e2"), (Some("k2"), "e5"), (None, "e6")])
        );
        assert_eq!(committed_keys(&bootstrap, "base"), keyed(&[(None, "e4")]));
        broker.shutdown().await;
    }

    /// Each batch's records without key or partition go to one partition, the next batch's to
    /// the next one; keyed records and named partitions go where they did before.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_batch_goes_to_the_next_partition() {
        let dir = tempfile::tempdir().unwrap();
        let (broker, bootstrap) = crate::test_support::start_broker(dir.path(), 3).await;
        let mut sink = started(&format!(
            "bootstrap_servers: {bootstrap}\ntopic: spread\ndelivery: exactly_once\n\
             transactional_id: spread"
        ))
        .await;
        let events = numbered(0, 60);
        let seqs: Vec<u64> = (0..60).collect();
        for from in (0..60).step_by(10) {
            sink.send(SinkBatch {
                events: &events[from..from + 10],
                sequences: Some(&seqs[from..from + 10]),
            })
            .await
            .unwrap();
        }
        // Keyed records, and records naming their partition, in one more batch.
        let mut pinned = vec![
            event(&[("key", "k")]),
            event(&[("key", "k")]),
            event(&[("partition", "1")]),
        ];
        for (i, e) in pinned.iter_mut().enumerate() {
            e.body = format!("pinned{i}").into();
        }
        sink.config.partition_id_header = Some("partition".into());
        sink.send(SinkBatch {
            events: &pinned,
            sequences: Some(&[60, 61, 62]),
        })
        .await
        .unwrap();
        sink.flush().await.unwrap();

        let found = committed_bodies_by_partition(&bootstrap, "spread", 3);
        let partition_of = |body: &str| {
            found
                .iter()
                .position(|bodies| bodies.iter().any(|b| b == body))
                .unwrap_or_else(|| panic!("{body} is in no partition: {found:?}"))
        };
        let batches: Vec<usize> = (0..60)
            .step_by(10)
            .map(|from| {
                let partition = partition_of(&format!("e{from}"));
                for i in from..from + 10 {
                    assert_eq!(partition_of(&format!("e{i}")), partition, "{found:?}");
                }
                partition
            })
            .collect();
        for pair in batches.windows(2) {
            assert_eq!(pair[1], (pair[0] + 1) % 3, "batches went to {batches:?}");
        }
        assert_eq!(partition_of("pinned0"), partition_of("pinned1"));
        assert_eq!(partition_of("pinned2"), 1);
        assert_eq!(found.iter().map(Vec::len).sum::<usize>(), 63, "{found:?}");
        broker.shutdown().await;
    }

    /// A `partitioner` property leaves every record to librdkafka's partitioner, as does a
    /// topic template (the sink only spreads records over its one configured topic).
    #[test]
    fn a_partitioner_property_or_a_topic_template_leaves_partitions_to_librdkafka() {
        let build = |yaml: &str| KafkaSink::build(&config(yaml)).unwrap();
        assert!(
            build("bootstrap_servers: 127.0.0.1:9092\ntopic: t")
                .spread
                .is_some()
        );
        assert!(
            build("bootstrap_servers: 127.0.0.1:9092\ntopic: t\nproducer: {partitioner: murmur2_random}")
                .spread
                .is_none()
        );
        assert!(
            build("bootstrap_servers: 127.0.0.1:9092\ntopic: t-%{app}")
                .spread
                .is_none()
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn exactly_once_skips_what_a_committed_transaction_delivered_and_fences_a_zombie() {
        let dir = tempfile::tempdir().unwrap();
        let broker = start_broker(dir.path()).await;
        let bootstrap = broker.local_addr().to_string();
        let yaml = format!(
            "bootstrap_servers: {bootstrap}\ntopic: out\ndelivery: exactly_once\ntransactional_id: t1"
        );
        let connection = Connection::plaintext(&bootstrap);
        let group = Arc::new(GroupConsumer::new(&connection, "t1").unwrap());
        let progress = || read_progress(&group, "ferry-sink-progress");
        let events = numbered(0, 400);
        let seqs: Vec<u64> = (1000..1400).collect();
        let batch = |from: usize, to: usize| SinkBatch {
            events: &events[from..to],
            sequences: Some(&seqs[from..to]),
        };

        // Three channel batches in one transaction: its progress names all of them.
        let mut sink = started(&yaml).await;
        sink.send(batch(0, 100)).await.unwrap();
        sink.send(batch(100, 200)).await.unwrap();
        sink.send(batch(200, 300)).await.unwrap();
        sink.flush().await.unwrap();
        assert_eq!(progress().await.unwrap(), vec![(1000, 1299)]);
        // A failed send aborts the batches sent since the flush: without sequence numbers (a
        // memory channel) exactly-once is refused.
        sink.send(batch(300, 320)).await.unwrap();
        let err = sink
            .send(SinkBatch {
                events: &events[..1],
                sequences: None,
            })
            .await
            .unwrap_err();
        assert!(err.to_string().contains("numbers its events"), "{err}");
        assert_eq!(progress().await.unwrap(), vec![(1000, 1299)]);
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

        // The takes of 0..300 were not committed (a crash after the transaction committed):
        // the channel gives them again, grouped otherwise, with more after them. The whole
        // transaction is skipped; what follows is delivered once.
        let mut sink = started(&yaml).await;
        sink.send(batch(0, 150)).await.unwrap();
        sink.send(batch(150, 350)).await.unwrap();
        sink.flush().await.unwrap();
        assert_eq!(progress().await.unwrap(), vec![(1000, 1349)]);
        sink.deliver(batch(350, 400)).await.unwrap();
        assert!(zombie.commit_transaction(Duration::from_secs(10)).is_err());
        // Lower sequence numbers than the last transaction's (another sink on the channel
        // rolled them back) are delivered: only the last transaction itself is ever skipped.
        let late = numbered(400, 410);
        let late_seqs: Vec<u64> = (500..510).collect();
        let late_batch = SinkBatch {
            events: &late,
            sequences: Some(&late_seqs),
        };
        sink.deliver(late_batch).await.unwrap();
        drop(sink);

        // Again a crash before the takes committed: a flush of only skipped events commits no
        // transaction and leaves the progress as it was.
        let mut sink = started(&yaml).await;
        sink.send(late_batch).await.unwrap();
        sink.flush().await.unwrap();
        assert_eq!(progress().await.unwrap(), vec![(500, 509)]);

        assert_eq!(committed_bodies(&bootstrap, "out"), names(0, 410));
        broker.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn at_least_once_keeps_batches_in_flight_and_waits_for_room_in_a_full_queue() {
        let dir = tempfile::tempdir().unwrap();
        let broker = start_broker(dir.path()).await;
        let bootstrap = broker.local_addr().to_string();
        // The producer's queue holds 10 records: sending 300 must wait for room, often.
        let mut sink = started(&format!(
            "bootstrap_servers: {bootstrap}\ntopic: out\nproducer:\n  queue.buffering.max.messages: '10'"
        ))
        .await;
        let events = numbered(0, 300);
        let epoch_ms = || {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_millis() as i64
        };
        let before = epoch_ms();
        for chunk in events.chunks(100) {
            sink.send(SinkBatch {
                events: chunk,
                sequences: None,
            })
            .await
            .unwrap();
        }
        sink.flush().await.unwrap();
        let after = epoch_ms();
        assert_eq!(sink.producer.as_ref().map(Producer::outstanding), Some(0));
        let records = committed_records(&bootstrap, "out");
        let bodies: Vec<String> = records.iter().map(|(body, _)| body.clone()).collect();
        assert_eq!(bodies, names(0, 300));
        // Each record carries its CreateTime, read once per batch while the batch was queued.
        for (body, timestamp) in &records {
            let Timestamp::CreateTime(ms) = *timestamp else {
                panic!("{body}: {timestamp:?}, not a CreateTime");
            };
            assert!(
                (before..=after).contains(&ms),
                "{body}: {ms} not in {before}..={after}"
            );
        }
        broker.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_record_too_large_is_a_permanent_failure_and_a_lost_cluster_a_transient_one() {
        let dir = tempfile::tempdir().unwrap();
        let broker = start_broker(dir.path()).await;
        let bootstrap = broker.local_addr().to_string();
        let mut sink = started(&format!(
            "bootstrap_servers: {bootstrap}\ntopic: out\nproducer:\n  message.max.bytes: '1000'"
        ))
        .await;
        let mut events = numbered(0, 3);
        events.insert(1, Event::from_body("x".repeat(5000)));
        let err = sink
            .deliver(SinkBatch {
                events: &events,
                sequences: None,
            })
            .await
            .unwrap_err();
        assert!(err.is_permanent(), "{err}");
        // Without the large record the rest goes through.
        events.remove(1);
        sink.deliver(SinkBatch {
            events: &events,
            sequences: None,
        })
        .await
        .unwrap();
        // `e0`, queued before the large record was refused, may be there twice: at least once.
        let bodies = committed_bodies(&bootstrap, "out");
        for name in names(0, 3) {
            assert!(bodies.contains(&name), "{name} missing from {bodies:?}");
        }
        assert!(
            bodies.iter().all(|b| b.len() < 100),
            "the large record got through"
        );
        broker.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn at_least_once_flush_fails_when_a_record_is_not_acknowledged() {
        // Nothing listens there (a socket bound and not listening holds the port for the
        // test): records time out after 300 ms.
        let dead = tokio::net::TcpSocket::new_v4().unwrap();
        dead.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = dead.local_addr().unwrap().port();
        let mut sink = started(&format!(
            "bootstrap_servers: 127.0.0.1:{port}\ntopic: out\nproducer:\n  message.timeout.ms: '300'"
        ))
        .await;
        let events = numbered(0, 10);
        sink.send(SinkBatch {
            events: &events,
            sequences: None,
        })
        .await
        .unwrap();
        let err = sink.flush().await.unwrap_err();
        assert!(err.to_string().contains("not acknowledged"), "{err}");
        assert!(!err.is_permanent(), "{err}");
    }

    #[test]
    fn progress_runs_round_trip() {
        let mut runs = Runs::new();
        extend_runs(&mut runs, &[5, 6, 7, 10]);
        extend_runs(&mut runs, &[11, 40]);
        assert_eq!(runs, vec![(5, 7), (10, 11), (40, 40)]);
        assert_eq!(decode_runs(&encode_runs(&runs)), Some(runs.clone()));
        assert!(in_runs(&runs, 6) && in_runs(&runs, 40) && !in_runs(&runs, 8));
        assert_eq!(decode_runs(""), Some(vec![]));
        assert_eq!(decode_runs("x"), None);
        assert_eq!(decode_runs("1-"), None);
    }

    #[test]
    fn every_bad_option_is_reported_at_once() {
        let err = KafkaSink::build(&config(
            "bootstrap_servers: h:1\ncompression: zip\nacks: al\ntopic: ''\nlinger: soon",
        ))
        .unwrap_err();
        let messages: Vec<String> = err.into_all().into_iter().map(|e| e.message).collect();
        assert_eq!(messages.len(), 4, "{messages:#?}");
        assert!(messages[0].contains("linger"), "{messages:#?}");
        assert!(
            messages
                .iter()
                .any(|m| m.contains("`compression`") || m.contains("zip"))
        );
        assert!(messages.iter().any(|m| m.contains("`al`")), "{messages:#?}");
        assert!(messages.iter().any(|m| m.contains("`topic` is empty")));
    }

    #[test]
    fn a_transaction_must_be_allowed_an_event_and_a_byte() {
        let err = KafkaSink::build(&config(
            "bootstrap_servers: h:1\ntopic: t\ntransaction_max_events: 0\ntransaction_max_bytes: 0",
        ))
        .unwrap_err();
        let problems: Vec<_> = err
            .into_all()
            .into_iter()
            .map(|e| (e.message, e.location.map(|l| l.line)))
            .collect();
        assert_eq!(
            problems,
            [
                (
                    "`transaction_max_events` must be at least 1".to_owned(),
                    Some(3)
                ),
                (
                    "`transaction_max_bytes` must be at least 1 byte".to_owned(),
                    Some(4)
                ),
            ]
        );
        let sink = KafkaSink::build(&config(
            "bootstrap_servers: h:1\ntopic: t\ntransaction_max_events: 1\ntransaction_max_bytes: 1 KiB",
        ))
        .unwrap();
        let bounds = sink.pipelining();
        assert_eq!((bounds.max_events, bounds.max_bytes), (1, 1024));
    }

    #[test]
    fn bad_options_name_the_closest_value() {
        let err = KafkaSink::build(&config("bootstrap_servers: h:1\nacks: al")).unwrap_err();
        assert!(err.message.contains("did you mean `all`"), "{err:?}");
        assert_eq!(err.location.map(|l| l.line), Some(2));
    }
}
