//! `kafka`: Flume's KafkaChannel. The events live in a Kafka topic, on the bundled broker or any
//! Kafka cluster, so a channel survives the agent and can be shared by agents.
//!
//! - **put**: one Kafka transaction (a transactional producer, `transactional.id`
//!   `<id_prefix>-<channel>`, by default `ferry-<host>-<channel>`) holds the batch's records
//!   and the source's checkpoint, which goes with `send_offsets_to_transaction` as the
//!   metadata of the committed offset of the consumer group `<id_prefix>-<source>` on
//!   partition 0 of the topic. Records and
//!   checkpoint become visible together or not at all: source → kafka channel is
//!   exactly-once. A checkpoint must fit Kafka's `offset.metadata.max.bytes` (4096 by
//!   default): larger ones are refused with an error (use a file channel).
//! - **take**: a consumer in `group_id` reads the topic at read_committed; the take's commit
//!   commits the offsets after its events to the group (the consumer's position, past the
//!   transaction markers read after them; an empty take commits a position moved by a marker
//!   alone), a rollback seeks back to its first event. Sequence numbers are the records' offsets when the topic has one partition (the
//!   default when the channel creates it), so exactly-once sinks work behind it; with more
//!   partitions takes carry none.
//! - **parse_as_flume_event** (default `true`): Flume headers travel as Kafka record headers;
//!   `false` writes bodies only and reads records of any producer as bodies.
//!
//! One take is open at a time: a further take waits for the previous one to end, so a sink
//! runner keeps at most one batch in flight here (`max_open_takes`). Puts go one transaction
//! at a time.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ferry_core::{
    Channel, ChannelError, Checkpoint, ComponentConfig, ConfigError, Event, PutBatch,
    TakeTransaction, async_trait,
};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde::Deserialize;
use tokio::sync::{Mutex, OwnedMutexGuard};

use crate::client::security::TokenContext;

use crate::client::{
    CALL_TIMEOUT, ClientError, Connection, GroupConsumer, GroupOffset, Role, TransactionalProducer,
    create_topic, headers,
};

/// Options of the `kafka` channel.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaChannelConfig {
    // `bootstrap_servers` and the security options are read by [`Connection::from_config`],
    // the same for every Kafka component (see `crate::client::security`).
    /// The topic holding the events. Default `flume-channel`. Flume: `kafka.topic`.
    #[serde(default = "default_topic")]
    pub topic: String,
    /// The consumer group of the takes. Default `flume`. Flume: `kafka.consumer.group.id`.
    #[serde(default = "default_group")]
    pub group_id: String,
    /// Flume headers as Kafka headers. Default `true`. Flume: `parseAsFlumeEvent`.
    #[serde(default = "default_true")]
    pub parse_as_flume_event: bool,
    /// How long a take waits for more records once it has one. Default `100ms`. Flume:
    /// `pollTimeout`.
    #[serde(default = "default_poll", with = "ferry_core::config::duration")]
    pub poll_timeout: Duration,
    /// Most events per put or take. Default `1000`.
    #[serde(default = "default_transaction_capacity")]
    pub transaction_capacity: usize,
    /// Partitions when the channel creates the topic. Default `1` (takes then carry sequence
    /// numbers, see the module docs).
    #[serde(default = "default_partitions")]
    pub partitions: i32,
    /// Names this agent's transactional producer (`<prefix>-<channel>`) and the groups holding
    /// its sources' checkpoints (`<prefix>-<source>`). Must differ between agents writing to
    /// the same cluster and stay the same across restarts. Default `ferry-<host name>`.
    #[serde(default)]
    pub id_prefix: Option<String>,
    /// Any other producer property, passed to librdkafka. Flume: `kafka.producer.*`.
    #[serde(default)]
    pub producer: BTreeMap<String, String>,
    /// Any other consumer property, passed to librdkafka. Flume: `kafka.consumer.*`.
    #[serde(default)]
    pub consumer: BTreeMap<String, String>,
}

fn default_topic() -> String {
    "flume-channel".into()
}
fn default_group() -> String {
    "flume".into()
}
fn default_true() -> bool {
    true
}
fn default_poll() -> Duration {
    Duration::from_millis(100)
}
fn default_transaction_capacity() -> usize {
    1000
}
fn default_partitions() -> i32 {
    1
}

/// Longest checkpoint stored, encoded, as committed offset metadata.
const MAX_CHECKPOINT: usize = 4000;

/// The Kafka channel.
pub struct KafkaChannel {
    name: String,
    config: KafkaChannelConfig,
    connection: Connection,
    /// `connection`, its clients reporting to the channel's metrics once
    /// [`Channel::report_to`] was called (before `start`).
    watched: std::sync::OnceLock<Connection>,
    producer_config: ClientConfig,
    consumer_config: ClientConfig,
    /// The transactional producer, one transaction at a time; `None` until initialised, and
    /// again after a failed put.
    producer: Mutex<Option<TransactionalProducer>>,
    /// The consumer, held by the open take.
    consumer: Arc<Mutex<Option<StreamConsumer<TokenContext>>>>,
    /// The offsets the takes committed last, per partition.
    committed: Arc<std::sync::Mutex<BTreeMap<i32, i64>>>,
    /// Prefix of the groups holding sources' checkpoints.
    checkpoint_prefix: String,
    /// A consumer of each source's checkpoint group, for its group metadata.
    checkpoint_groups: std::sync::Mutex<BTreeMap<String, Arc<GroupConsumer>>>,
    /// Whether the topic has one partition (seen at start): takes then carry sequences.
    one_partition: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for KafkaChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaChannel")
            .field("name", &self.name)
            .finish()
    }
}

impl KafkaChannel {
    /// Validates the options; connections are made at `start`.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        let (connection, own) = Connection::from_config(cfg, Role::Channel)?;
        let config: KafkaChannelConfig = own.parse()?;
        Connection::check_passthrough(cfg, "producer", &config.producer)?;
        Connection::check_passthrough(cfg, "consumer", &config.consumer)?;
        if config.topic.is_empty() {
            return Err(cfg.error_at("topic", "`topic` is empty"));
        }
        if config.transaction_capacity == 0 {
            return Err(cfg.error_at(
                "transaction_capacity",
                "`transaction_capacity` must be at least 1",
            ));
        }
        if config.partitions < 1 {
            return Err(cfg.error_at("partitions", "`partitions` must be at least 1"));
        }
        let prefix = config
            .id_prefix
            .clone()
            .unwrap_or_else(|| format!("ferry-{}", ferry_core::host_name()));
        if prefix.is_empty() {
            return Err(cfg.error_at("id_prefix", "`id_prefix` is empty"));
        }
        let one_partition = config.partitions == 1;
        let mut producer_config = connection.client_config();
        producer_config
            .set("transactional.id", format!("{prefix}-{}", cfg.name()))
            .set("linger.ms", "5");
        for (key, value) in &config.producer {
            producer_config.set(key, value);
        }
        let mut consumer_config = connection.consumer_config(&config.group_id);
        for (key, value) in &config.consumer {
            consumer_config.set(key, value);
        }
        // The channel's /health follows its clients (see `Channel::report_to`).
        Connection::watch_settings(&mut producer_config);
        Connection::watch_settings(&mut consumer_config);
        Ok(Self {
            name: cfg.name().to_owned(),
            config,
            connection,
            watched: std::sync::OnceLock::new(),
            producer_config,
            consumer_config,
            producer: Mutex::new(None),
            consumer: Arc::new(Mutex::new(None)),
            committed: Arc::default(),
            checkpoint_prefix: format!("{prefix}-"),
            checkpoint_groups: std::sync::Mutex::new(BTreeMap::new()),
            one_partition: std::sync::atomic::AtomicBool::new(one_partition),
        })
    }

    fn error(&self, what: &str, e: impl std::fmt::Display) -> ChannelError {
        ChannelError::Storage {
            channel: self.name.clone(),
            message: format!("{what}: {e}"),
        }
    }

    /// The connection the clients are made with: reporting to the channel's metrics once told.
    fn connection(&self) -> &Connection {
        self.watched.get().unwrap_or(&self.connection)
    }

    /// The cluster answered a put or a take: whatever the clients reported unreachable is
    /// reached (one atomic swap).
    fn reached(&self) {
        if let Some(metrics) = self.connection().watcher() {
            metrics.reachable();
        }
    }

    /// A consumer of a source's checkpoint group (never subscribed).
    fn checkpoint_consumer(&self, source: &str) -> Result<GroupConsumer, ChannelError> {
        GroupConsumer::new(
            self.connection(),
            &format!("{}{source}", self.checkpoint_prefix),
        )
        .map_err(|e| e.in_channel(&self.name))
    }

    /// A consumer of the channel's topic in `group_id`, starting at the committed offsets.
    fn new_consumer(&self) -> Result<StreamConsumer<TokenContext>, ChannelError> {
        let consumer: StreamConsumer<TokenContext> = self
            .consumer_config
            .create_with_context(self.connection().context())
            .map_err(|e| self.error("creating the consumer", e))?;
        consumer
            .subscribe(&[&self.config.topic])
            .map_err(|e| self.error("subscribing to the channel's topic", e))?;
        Ok(consumer)
    }

    /// The (cached) consumer of `source`'s checkpoint group.
    fn checkpoint_group(&self, source: &str) -> Result<Arc<GroupConsumer>, ChannelError> {
        let mut groups = self
            .checkpoint_groups
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(group) = groups.get(source) {
            return Ok(Arc::clone(group));
        }
        let group = Arc::new(self.checkpoint_consumer(source)?);
        groups.insert(source.to_owned(), Arc::clone(&group));
        Ok(group)
    }

    /// The transactional producer, initialised on first use (fencing an older instance of this
    /// channel and settling its open transaction).
    async fn ready_producer<'a>(
        &self,
        slot: &'a mut Option<TransactionalProducer>,
    ) -> Result<&'a mut TransactionalProducer, ChannelError> {
        if slot.is_none() {
            let producer = TransactionalProducer::init(
                &self.producer_config,
                self.connection().context(),
                &self.config.topic,
            )
            .await
            .map_err(|e| e.in_channel(&self.name))?;
            *slot = Some(producer);
        }
        slot.as_mut()
            .ok_or_else(|| self.error("the transactional producer", "not initialised"))
    }

    async fn put_once(&self, batch: &PutBatch) -> Result<(), ChannelError> {
        let checkpoint = match &batch.checkpoint {
            Some(checkpoint) => {
                let encoded = encode_checkpoint(checkpoint);
                if encoded.len() > MAX_CHECKPOINT {
                    return Err(self.error(
                        &format!("source `{}`", batch.source),
                        format!(
                            "its checkpoint is {} bytes encoded; a kafka channel stores at most \
                             {MAX_CHECKPOINT} (Kafka's offset metadata limit): use a file channel",
                            encoded.len()
                        ),
                    ));
                }
                Some(encoded)
            }
            None => None,
        };
        let mut slot = self.producer.lock().await;
        let producer = self.ready_producer(&mut slot).await?;
        let result = self.transaction(producer, batch, checkpoint).await;
        if result.is_ok() {
            self.reached();
        } else if let Some(producer) = slot.take() {
            // A new producer settles whatever state the transaction is in.
            producer.abort().await;
        }
        result
    }

    async fn transaction(
        &self,
        producer: &mut TransactionalProducer,
        batch: &PutBatch,
        checkpoint: Option<String>,
    ) -> Result<(), ChannelError> {
        let in_channel = |e: ClientError| e.in_channel(&self.name);
        producer.begin().map_err(in_channel)?;
        for event in &batch.events {
            let mut record = producer
                .producer()
                .record(&self.config.topic)
                .payload(&event.body[..]);
            if self.config.parse_as_flume_event && !event.headers.is_empty() {
                record = record.headers(headers::record_headers(event));
            }
            producer.producer().send(record).await.map_err(in_channel)?;
        }
        let offset = match checkpoint {
            Some(metadata) => Some(GroupOffset {
                group: self.checkpoint_group(&batch.source)?,
                topic: self.config.topic.clone(),
                offset: 0,
                metadata,
            }),
            None => None,
        };
        producer.commit(offset).await.map_err(in_channel)
    }
}

/// A checkpoint as offset metadata: `u:` and the text when it is UTF-8, else `x:` and hex.
fn encode_checkpoint(checkpoint: &Checkpoint) -> String {
    match std::str::from_utf8(checkpoint.as_bytes()) {
        Ok(text) => format!("u:{text}"),
        Err(_) => {
            let mut out = String::from("x:");
            for b in checkpoint.as_bytes() {
                out.push_str(&format!("{b:02x}"));
            }
            out
        }
    }
}

fn decode_checkpoint(metadata: &str) -> Option<Checkpoint> {
    if let Some(text) = metadata.strip_prefix("u:") {
        return Some(Checkpoint::new(text.as_bytes().to_vec()));
    }
    let hex = metadata.strip_prefix("x:")?;
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    bytes.map(Checkpoint::new)
}

#[async_trait]
impl Channel for KafkaChannel {
    fn name(&self) -> &str {
        &self.name
    }

    async fn start(&self) -> Result<(), ChannelError> {
        match create_topic(
            self.connection(),
            &self.config.topic,
            self.config.partitions,
        )
        .await
        {
            Ok(()) => {}
            Err(e @ ClientError::Refused { .. }) => return Err(e.in_channel(&self.name)),
            // The cluster may be down now; puts and takes retry later.
            Err(e) => {
                tracing::warn!(channel = %self.name, error = %e, "cannot check the channel's topic")
            }
        }
        let consumer = self.new_consumer()?;
        // Takes carry sequence numbers only from a one-partition topic, whatever `partitions`
        // says (the topic may have existed before).
        let topic = self.config.topic.clone();
        match ferry_core::blocking(|| consumer.fetch_metadata(Some(&topic), CALL_TIMEOUT)) {
            Ok(metadata) => {
                let n = metadata
                    .topics()
                    .first()
                    .map_or(0, |t| t.partitions().len());
                self.one_partition
                    .store(n == 1, std::sync::atomic::Ordering::Relaxed);
                if n > 1 {
                    tracing::warn!(channel = %self.name, topic = %topic, partitions = n, "the channel's topic has several partitions: takes carry no sequence numbers, so exactly-once sinks cannot run behind it");
                }
            }
            Err(e) => {
                tracing::warn!(channel = %self.name, error = %e, "cannot read the topic's partitions")
            }
        }
        *self.consumer.lock().await = Some(consumer);
        // Initialising the producer now fences an instance killed mid-put and aborts its
        // transaction, whose staged checkpoint would otherwise keep the sources' checkpoint
        // reads waiting (UNSTABLE_OFFSET_COMMIT) until the transaction timed out.
        let mut slot = self.producer.lock().await;
        if let Err(e) = self.ready_producer(&mut slot).await {
            tracing::warn!(channel = %self.name, error = %e, "cannot initialise the transactional producer yet; puts will retry");
        }
        Ok(())
    }

    async fn put(&self, batch: PutBatch) -> Result<(), ChannelError> {
        self.try_put(batch).await
    }

    async fn try_put(&self, batch: PutBatch) -> Result<(), ChannelError> {
        if batch.events.len() > self.config.transaction_capacity {
            return Err(ChannelError::BatchTooLarge {
                channel: self.name.clone(),
                events: batch.events.len(),
                bytes: batch.events.iter().map(|e| e.body.len()).sum(),
                limit: format!("transaction_capacity {}", self.config.transaction_capacity),
            });
        }
        self.put_once(&batch).await
    }

    async fn take(
        &self,
        max: usize,
        wait: Duration,
    ) -> Result<Box<dyn TakeTransaction>, ChannelError> {
        let mut guard = Arc::clone(&self.consumer).lock_owned().await;
        if guard.is_none() {
            // Never started, or dropped after a failed rollback.
            *guard = Some(self.new_consumer()?);
        }
        let Some(consumer) = guard.as_ref() else {
            return Err(self.error("take", "no consumer"));
        };
        let mut events = Vec::new();
        let mut offsets: Vec<(i32, i64)> = Vec::new();
        // One timer per take, looked at only when no record is ready.
        let deadline = tokio::time::sleep(wait);
        tokio::pin!(deadline);
        while events.len() < max.min(self.config.transaction_capacity) {
            let message = tokio::select! {
                biased;
                m = consumer.recv() => m,
                _ = &mut deadline => break,
            };
            let message = match message {
                Ok(message) => message,
                // A broker's connection failing is reported to /health by the clients (see
                // `Channel::report_to`) and retried by the consumer itself: not a failed take.
                // The consumer queues one per reconnection attempt while the cluster is down;
                // failing a take for each would cost the sink a backoff apiece once it is back.
                Err(KafkaError::MessageConsumption(
                    RDKafkaErrorCode::BrokerTransportFailure | RDKafkaErrorCode::AllBrokersDown,
                )) => continue,
                // What was read is returned as the take (the consumer's position is past it);
                // the error comes back with the next take if it lasts.
                Err(e) if !events.is_empty() => {
                    tracing::warn!(channel = %self.name, error = %e, "kafka consumer error; the take ends here");
                    break;
                }
                Err(e) => {
                    drop(guard);
                    return Err(self.error("reading the channel's topic", e));
                }
            };
            events.push(headers::event_of(
                &message,
                self.config.parse_as_flume_event,
            ));
            offsets.push((message.partition(), message.offset()));
            if events.len() == 1 {
                deadline
                    .as_mut()
                    .reset(tokio::time::Instant::now() + self.config.poll_timeout);
            }
        }
        // Every record read is in this take or a committed one (a rolled back take seeks back,
        // which resets the position): the position, past the transaction markers after the
        // last record, is what the take's commit may commit, as Kafka's consumer does.
        let positions = positions(consumer, &self.config.topic);
        if events.is_empty() {
            // A marker read after the last take moved the position alone.
            self.commit_positions(consumer, &positions);
        }
        if !events.is_empty() {
            self.reached();
        }
        let one_partition = self
            .one_partition
            .load(std::sync::atomic::Ordering::Relaxed);
        let sequences = (one_partition && offsets.iter().all(|(p, _)| *p == 0))
            .then(|| offsets.iter().map(|(_, o)| *o as u64).collect());
        // An empty take holds nothing: the consumer is free for the next one at once.
        let guard = (!events.is_empty()).then_some(guard);
        Ok(Box::new(KafkaTake {
            channel: self.name.clone(),
            topic: self.config.topic.clone(),
            events,
            offsets,
            positions,
            committed: Arc::clone(&self.committed),
            sequences,
            guard,
        }))
    }

    fn transaction_capacity(&self) -> usize {
        self.config.transaction_capacity
    }

    /// The consumer belongs to the open take until it commits or rolls back.
    fn max_open_takes(&self) -> Option<usize> {
        Some(1)
    }

    fn is_durable(&self) -> bool {
        true
    }

    /// Not known without asking the cluster: the events stay in Kafka across restarts, so the
    /// agent need not wait for this channel to drain.
    fn len(&self) -> usize {
        0
    }

    fn capacity(&self) -> usize {
        usize::MAX
    }

    fn keeps_checkpoints(&self) -> bool {
        true
    }

    /// From now on the channel's clients (made at `start` and after) report librdkafka's
    /// all-brokers-down, resolve and authentication errors to `metrics`, as the kafka sink's
    /// do: the channel's `/health` fails within seconds of a dead cluster, and is healthy again
    /// when a client's statistics show a broker up or a put or take gets through.
    fn report_to(&self, metrics: &ferry_core::ComponentMetrics) {
        let _ = self.watched.set(self.connection.reporting_to(metrics));
    }

    fn load_checkpoint(&self, source: &str) -> Result<Option<Checkpoint>, ChannelError> {
        // A network round trip: let the async runtime move its other tasks elsewhere.
        ferry_core::blocking(|| self.read_checkpoint(source))
    }
}

/// The consumer's position in each partition of `topic` that has one: after the last record
/// read and after the control records (transaction markers) that follow it.
fn positions(consumer: &StreamConsumer<TokenContext>, topic: &str) -> BTreeMap<i32, i64> {
    let Ok(list) = consumer.position() else {
        return BTreeMap::new();
    };
    list.elements()
        .iter()
        .filter(|e| e.topic() == topic)
        .filter_map(|e| match e.offset() {
            Offset::Offset(n) if n >= 0 => Some((e.partition(), n)),
            _ => None,
        })
        .collect()
}

impl KafkaChannel {
    /// Commits the positions that moved past what the takes committed (transaction markers
    /// read after the last take); a failure is retried by the next empty take.
    fn commit_positions(
        &self,
        consumer: &StreamConsumer<TokenContext>,
        positions: &BTreeMap<i32, i64>,
    ) {
        let moved: Vec<(i32, i64)> = {
            let committed = self.committed.lock().unwrap_or_else(|e| e.into_inner());
            positions
                .iter()
                .filter(|(p, o)| committed.get(p).is_none_or(|c| c < o))
                .map(|(p, o)| (*p, *o))
                .collect()
        };
        if moved.is_empty() {
            return;
        }
        let mut tpl = TopicPartitionList::new();
        for (partition, offset) in &moved {
            if let Err(e) =
                tpl.add_partition_offset(&self.config.topic, *partition, Offset::Offset(*offset))
            {
                tracing::warn!(channel = %self.name, error = %e, "cannot commit the consumer's position");
                return;
            }
        }
        match ferry_core::blocking(|| consumer.commit(&tpl, CommitMode::Sync)) {
            Ok(()) => self
                .committed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(moved),
            Err(e) => {
                tracing::debug!(channel = %self.name, error = %e, "cannot commit the consumer's position past transaction markers yet")
            }
        }
    }

    fn read_checkpoint(&self, source: &str) -> Result<Option<Checkpoint>, ChannelError> {
        // The cached consumer of the group: destroying one made for this call took librdkafka
        // 100 ms.
        let metadata = self
            .checkpoint_group(source)?
            .committed_metadata(&self.config.topic, 0)
            .map_err(|e| self.error(&format!("reading the checkpoint of `{source}`"), e))?;
        if metadata.is_empty() {
            return Ok(None);
        }
        decode_checkpoint(&metadata).map(Some).ok_or_else(|| {
            self.error(
                &format!("the checkpoint of `{source}`"),
                "it is not one this channel wrote",
            )
        })
    }
}

/// An open take: the consumer stays locked until it commits or rolls back.
struct KafkaTake {
    channel: String,
    topic: String,
    events: Vec<Event>,
    /// (partition, offset) per event.
    offsets: Vec<(i32, i64)>,
    /// The consumer's position per partition when the take ended.
    positions: BTreeMap<i32, i64>,
    /// The channel's record of the offsets committed last.
    committed: Arc<std::sync::Mutex<BTreeMap<i32, i64>>>,
    sequences: Option<Vec<u64>>,
    guard: Option<OwnedMutexGuard<Option<StreamConsumer<TokenContext>>>>,
}

impl KafkaTake {
    fn error(&self, what: &str, e: impl std::fmt::Display) -> ChannelError {
        ChannelError::Storage {
            channel: self.channel.clone(),
            message: format!("{what}: {e}"),
        }
    }

    /// Per partition, the first and the last offset taken.
    fn ranges(&self) -> BTreeMap<i32, (i64, i64)> {
        let mut ranges: BTreeMap<i32, (i64, i64)> = BTreeMap::new();
        for (partition, offset) in &self.offsets {
            let range = ranges.entry(*partition).or_insert((*offset, *offset));
            range.0 = range.0.min(*offset);
            range.1 = range.1.max(*offset);
        }
        ranges
    }
}

#[async_trait]
impl TakeTransaction for KafkaTake {
    fn events(&self) -> &[Event] {
        &self.events
    }

    fn sequences(&self) -> Option<&[u64]> {
        self.sequences.as_deref()
    }

    async fn commit(mut self: Box<Self>) -> Result<(), ChannelError> {
        let Some(guard) = self.guard.take() else {
            return Ok(());
        };
        let Some(consumer) = guard.as_ref() else {
            return Ok(());
        };
        let mut tpl = TopicPartitionList::new();
        let mut next = Vec::new();
        for (partition, (_, last)) in self.ranges() {
            // Past the markers after the take's last record, when the consumer read them.
            let offset = self
                .positions
                .get(&partition)
                .map_or(last + 1, |p| (*p).max(last + 1));
            tpl.add_partition_offset(&self.topic, partition, Offset::Offset(offset))
                .map_err(|e| self.error("committing a take", e))?;
            next.push((partition, offset));
        }
        // Blocking calls: the bundled broker may run on the same async runtime.
        ferry_core::blocking(|| consumer.commit(&tpl, CommitMode::Sync))
            .map_err(|e| self.error("committing a take", e))?;
        self.committed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(next);
        Ok(())
    }

    async fn rollback(mut self: Box<Self>) -> Result<(), ChannelError> {
        let Some(mut guard) = self.guard.take() else {
            return Ok(());
        };
        let Some(consumer) = guard.as_ref() else {
            return Ok(());
        };
        for (partition, (first, _)) in self.ranges() {
            let sought = ferry_core::blocking(|| {
                consumer.seek(
                    &self.topic,
                    partition,
                    Offset::Offset(first),
                    Duration::from_secs(10),
                )
            });
            if let Err(e) = sought {
                // Its position is past events that were not delivered: a new consumer starts
                // again from the group's committed offsets.
                *guard = None;
                return Err(self.error("rolling a take back (the consumer is recreated)", e));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(yaml: &str) -> ComponentConfig {
        ComponentConfig::from_yaml(ferry_core::ComponentKind::Channel, "kc", "kafka", yaml).unwrap()
    }

    fn batch(from: usize, to: usize, checkpoint: &str) -> PutBatch {
        PutBatch {
            source: "src".into(),
            events: (from..to)
                .map(|i| {
                    let mut e = Event::from_body(format!("e{i}"));
                    e.headers.set("n", i.to_string());
                    e
                })
                .collect(),
            checkpoint: Some(Checkpoint::new(checkpoint.as_bytes().to_vec())),
            ack: None,
            joint: None,
        }
    }

    async fn take_bodies(channel: &KafkaChannel, max: usize) -> Box<dyn TakeTransaction> {
        let mut waited = 0;
        loop {
            let take = channel.take(max, Duration::from_secs(2)).await.unwrap();
            if take.events().len() == max || waited > 10 {
                return take;
            }
            take.rollback().await.unwrap();
            waited += 1;
        }
    }

    fn bodies(take: &dyn TakeTransaction) -> Vec<String> {
        take.events()
            .iter()
            .map(|e| String::from_utf8_lossy(&e.body).into_owned())
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn puts_carry_the_checkpoint_and_takes_commit_or_roll_back_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let (broker, bootstrap) = crate::test_support::start_broker(dir.path(), 1).await;
        let yaml = format!("bootstrap_servers: {bootstrap}\ntopic: ch");
        let channel = KafkaChannel::build(&config(&yaml)).unwrap();
        channel.start().await.unwrap();
        assert_eq!(channel.load_checkpoint("src").unwrap(), None);
        channel.put(batch(0, 10, "pos=10")).await.unwrap();
        channel.put(batch(10, 20, "pos=20")).await.unwrap();
        assert_eq!(
            channel.load_checkpoint("src").unwrap(),
            Some(Checkpoint::new(b"pos=20".to_vec()))
        );
        let binary = PutBatch {
            checkpoint: Some(Checkpoint::new(vec![0xff, 0, 7])),
            ..batch(20, 25, "")
        };
        channel.put(binary).await.unwrap();
        assert_eq!(
            channel.load_checkpoint("src").unwrap(),
            Some(Checkpoint::new(vec![0xff, 0, 7]))
        );
        let huge = batch(0, 1, &"x".repeat(5000));
        let err = channel.put(huge).await.unwrap_err();
        assert!(err.to_string().contains("use a file channel"), "{err}");

        let take = take_bodies(&channel, 15).await;
        assert_eq!(
            bodies(&*take),
            (0..15).map(|i| format!("e{i}")).collect::<Vec<_>>()
        );
        assert_eq!(take.events()[3].headers["n"], "3");
        let seqs = take.sequences().unwrap().to_vec();
        assert_eq!(seqs.len(), 15);
        assert!(seqs.windows(2).all(|w| w[0] < w[1]));
        take.rollback().await.unwrap();
        let take = take_bodies(&channel, 15).await;
        assert_eq!(take.sequences().unwrap(), &seqs[..]);
        take.commit().await.unwrap();
        drop(channel);

        // Another instance (a restart) goes on after the committed take.
        let channel = KafkaChannel::build(&config(&yaml)).unwrap();
        channel.start().await.unwrap();
        let take = take_bodies(&channel, 10).await;
        assert_eq!(
            bodies(&*take),
            (15..25).map(|i| format!("e{i}")).collect::<Vec<_>>()
        );
        take.commit().await.unwrap();
        broker.shutdown().await;
    }

    /// Per partition of `topic`: (the group `flume`'s committed offset, the end offset).
    fn lag(bootstrap: &str, topic: &str, partitions: i32) -> Vec<(i64, i64)> {
        let consumer: rdkafka::consumer::BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", "flume")
            .create()
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition(topic, p);
        }
        let committed = consumer
            .committed_offsets(tpl, Duration::from_secs(10))
            .unwrap();
        (0..partitions)
            .map(|p| {
                let group = committed
                    .find_partition(topic, p)
                    .and_then(|e| e.offset().to_raw())
                    .unwrap_or(-1);
                let (_, end) = consumer
                    .fetch_watermarks(topic, p, Duration::from_secs(10))
                    .unwrap();
                (group, end)
            })
            .collect()
    }

    /// Every put is a transaction, ended by a marker that takes an offset: the takes' commits
    /// step over the markers (the last one read by an empty take), so the lag ends at 0.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn takes_commit_past_transaction_markers_so_the_lag_ends_at_zero() {
        let dir = tempfile::tempdir().unwrap();
        let (broker, bootstrap) = crate::test_support::start_broker(dir.path(), 2).await;
        let yaml = format!("bootstrap_servers: {bootstrap}\ntopic: ch2\npartitions: 2");
        let channel = KafkaChannel::build(&config(&yaml)).unwrap();
        channel.start().await.unwrap();
        for t in 0..3 {
            channel
                .put(batch(t * 10, t * 10 + 10, &format!("pos={t}")))
                .await
                .unwrap();
        }
        let take = take_bodies(&channel, 30).await;
        let mut got = bodies(&*take);
        got.sort();
        let mut expected: Vec<String> = (0..30).map(|i| format!("e{i}")).collect();
        expected.sort();
        assert_eq!(got, expected);
        take.commit().await.unwrap();
        let mut last = Vec::new();
        for _ in 0..50 {
            // An empty take reads what follows the last record: the last marker.
            let take = channel.take(10, Duration::from_millis(200)).await.unwrap();
            assert!(take.events().is_empty());
            take.commit().await.unwrap();
            let b = bootstrap.clone();
            last = tokio::task::spawn_blocking(move || lag(&b, "ch2", 2))
                .await
                .unwrap();
            if last.iter().all(|(group, end)| *end == 0 || group == end) {
                break;
            }
        }
        assert!(last.iter().any(|(_, end)| *end > 0), "{last:?}");
        assert!(
            last.iter().all(|(group, end)| *end == 0 || group == end),
            "{last:?}"
        );
        // A restart finds nothing left.
        drop(channel);
        let channel = KafkaChannel::build(&config(&yaml)).unwrap();
        channel.start().await.unwrap();
        let take = channel.take(10, Duration::from_secs(2)).await.unwrap();
        assert!(take.events().is_empty());
        broker.shutdown().await;
    }
}
