//! `kafka`: Flume's KafkaSource. Consumes topics in a consumer group through librdkafka, from
//! the bundled broker or any Kafka cluster, a Flume event per record.
//!
//! Where the consumed offsets live (the rule of delivery in `DESIGN.md`): every batch's
//! checkpoint holds the next offset of every partition this source has read, and travels with
//! the events. With a durable channel it is committed in the same SQLite transaction as the
//! events, so a crash at any moment neither loses nor repeats a record; with a memory channel
//! it is saved once the sinks delivered the batch (at-least-once). When partitions are
//! assigned, the source seeks each to the larger of its own offset and the group's committed
//! one, so a partition handed over by another agent of the group starts where that agent
//! committed. The group's committed offsets follow the durable checkpoint (after every batch,
//! and synchronously for partitions being revoked), which keeps `agent groups` lag true and
//! makes hand-overs exact when the previous owner stopped cleanly.
//!
//! Transaction markers: the next offset of a partition is librdkafka's position (past the
//! control records after the last record read, as Kafka's consumer commits) when every record
//! before it is in the batch or an earlier one, so a fully read transactional topic has lag 0;
//! a marker read after the last batch moves the checkpoint in a batch without events.
//!
//! Rebalances: records of a batch still being gathered are dropped when their partition is
//! revoked (its new owner reads them), so a batch never carries records of a partition this
//! consumer no longer owns.
//!
//! Headers: the record's Kafka headers become Flume headers (values as UTF-8, lossy), then
//! `topic`, `partition`, `offset`, `timestamp` (ms) and, when the record has one, `key` are set.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ferry_core::{
    Checkpoint, CompactString, ComponentConfig, ConfigError, Event, Headers, Source, SourceContext,
    SourceError, ToCompactString, async_trait, format_compact,
};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, RebalanceProtocol, StreamConsumer,
};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use serde::Deserialize;

use crate::client::security::TokenContext;
use crate::client::{ClientError, Connection, Role, headers};

/// Options of the `kafka` source.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSourceConfig {
    // `bootstrap_servers` and the security options are read by [`Connection::from_config`],
    // the same for every Kafka component (see `crate::client::security`).
    /// Topics to consume. Flume: `kafka.topics`.
    #[serde(default)]
    pub topics: Vec<String>,
    /// A regular expression of the topics to consume, instead of `topics`. Flume:
    /// `kafka.topics.regex`.
    #[serde(default)]
    pub topics_regex: Option<String>,
    /// Consumer group. Default `flume`. Flume: `kafka.consumer.group.id`.
    #[serde(default = "default_group_id")]
    pub group_id: String,
    /// Most records per put. Default `1000`. Flume: `batchSize`.
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// Longest a batch is gathered before it is put. Default `1s`. Flume:
    /// `batchDurationMillis`.
    #[serde(
        default = "default_batch_duration",
        with = "ferry_core::config::duration"
    )]
    pub batch_duration: Duration,
    /// Where a partition without any stored offset starts: `earliest` or `latest`. Default
    /// `earliest`. Kafka: `auto.offset.reset`.
    #[serde(default = "default_reset")]
    pub auto_offset_reset: String,
    /// `read_committed` (default: records of aborted or open transactions are not read) or
    /// `read_uncommitted`. Kafka: `isolation.level`.
    #[serde(default = "default_isolation")]
    pub isolation_level: String,
    /// Any other consumer property, passed to librdkafka as written. Flume: `kafka.consumer.*`.
    #[serde(default)]
    pub consumer: BTreeMap<String, String>,
}

fn default_group_id() -> String {
    "flume".into()
}
fn default_batch_size() -> usize {
    1000
}
fn default_batch_duration() -> Duration {
    Duration::from_secs(1)
}
fn default_reset() -> String {
    "earliest".into()
}
fn default_isolation() -> String {
    "read_committed".into()
}

/// A topic partition.
type Tp = (String, i32);

/// The checkpoint: the next offset of every partition read, as JSON `[[topic, partition,
/// offset], ...]`.
fn encode_offsets(offsets: &BTreeMap<Tp, i64>) -> Checkpoint {
    let list: Vec<(&str, i32, i64)> = offsets
        .iter()
        .map(|((topic, partition), offset)| (topic.as_str(), *partition, *offset))
        .collect();
    Checkpoint::new(serde_json::to_vec(&list).unwrap_or_default())
}

fn decode_offsets(checkpoint: &Checkpoint) -> Result<BTreeMap<Tp, i64>, SourceError> {
    let list: Vec<(String, i32, i64)> =
        serde_json::from_slice(checkpoint.as_bytes()).map_err(|e| {
            SourceError::Other(format!(
                "checkpoint {:?} is not a kafka source checkpoint: {e}",
                String::from_utf8_lossy(checkpoint.as_bytes())
            ))
        })?;
    Ok(list.into_iter().map(|(t, p, o)| ((t, p), o)).collect())
}

/// The next offset of every partition a kafka source checkpoint holds, as `(topic,
/// partition, offset)` (for `agent state`); `None` if `bytes` is not such a checkpoint.
pub fn checkpoint_offsets(bytes: &[u8]) -> Option<Vec<(String, i32, i64)>> {
    let offsets = decode_offsets(&Checkpoint::new(bytes.to_vec())).ok()?;
    Some(offsets.into_iter().map(|((t, p), o)| (t, p, o)).collect())
}

/// What the rebalance callback and the batch loop share.
#[derive(Default)]
struct Shared {
    /// Next offsets whose records every channel holds (what the checkpoints say).
    sent: BTreeMap<Tp, i64>,
    /// Partitions owned now, each with the number of the assignment that gave it (see
    /// [`RebalanceContext::assignments`]).
    assigned: HashMap<Tp, u64>,
    /// Partitions this consumer was ever revoked from: until a record of the current
    /// assignment is read, librdkafka's position of such a partition might still be that of
    /// the assignment before, past records dropped from a batch.
    revoked: std::collections::HashSet<Tp>,
    /// Where each owned partition's current assignment started, when this source set it.
    /// librdkafka (2.12.1) can hand over a record fetched while the partition was not assigned
    /// (an `auto.offset.reset` lookup retried after a revoke fetches it anyway): one below the
    /// start is not this assignment's, and is dropped.
    starts: HashMap<Tp, i64>,
}

struct RebalanceContext {
    token: TokenContext,
    source: String,
    ctx: SourceContext,
    shared: Arc<Mutex<Shared>>,
    /// Assignments and revocations so far, counted under `shared`'s lock: the batch loop reads
    /// it after every record without locking, and looks at `shared` again only when it moved.
    assignments: Arc<AtomicU64>,
}

impl RebalanceContext {
    fn shared(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where each newly assigned partition starts: the larger of this source's offset and the
    /// group's committed one; neither known leaves it to `auto.offset.reset`.
    fn seek_targets(&self, consumer: &BaseConsumer<Self>, tpl: &mut TopicPartitionList) {
        // Runs inside `recv` on an async worker: let its other tasks move (the bundled broker
        // may be one of them).
        let committed = match ferry_core::blocking(|| {
            consumer.committed_offsets(tpl.clone(), Duration::from_secs(10))
        }) {
            Ok(committed) => committed,
            Err(e) => {
                tracing::warn!(source = %self.source, error = %e, "cannot read the group's committed offsets; starting from this source's own");
                TopicPartitionList::new()
            }
        };
        let shared = self.shared();
        let wanted: Vec<(String, i32)> = tpl
            .elements()
            .iter()
            .map(|e| (e.topic().to_owned(), e.partition()))
            .collect();
        for (topic, partition) in wanted {
            let group = committed
                .find_partition(&topic, partition)
                .and_then(|e| e.offset().to_raw())
                .filter(|o| *o >= 0);
            let own = shared.sent.get(&(topic.clone(), partition)).copied();
            if let Some(start) = own.max(group) {
                if let Err(e) = tpl.set_partition_offset(&topic, partition, Offset::Offset(start)) {
                    tracing::warn!(source = %self.source, topic, partition, error = %e, "cannot set a start offset");
                }
                tracing::info!(source = %self.source, topic, partition, offset = start, own, group, "partition assigned");
            } else {
                tracing::info!(source = %self.source, topic, partition, "partition assigned; no offset stored, auto_offset_reset applies");
            }
        }
    }

    /// Commits the durable offsets of `partitions` (all owned ones when `None`).
    fn commit_durable(
        &self,
        consumer: &BaseConsumer<Self>,
        partitions: Option<&TopicPartitionList>,
        mode: CommitMode,
    ) {
        commit_durable(
            &self.source,
            &self.ctx,
            consumer,
            partitions,
            &self.shared,
            mode,
        );
    }
}

fn commit_durable<C: ConsumerContext>(
    source: &str,
    ctx: &SourceContext,
    consumer: &impl Consumer<C>,
    partitions: Option<&TopicPartitionList>,
    shared: &Mutex<Shared>,
    mode: CommitMode,
) {
    let Some(Ok(durable)) = ctx.durable_checkpoint().as_ref().map(decode_offsets) else {
        return;
    };
    let mut tpl = TopicPartitionList::new();
    {
        let shared = shared.lock().unwrap_or_else(|e| e.into_inner());
        for ((topic, partition), offset) in &durable {
            let wanted = match partitions {
                Some(list) => list.find_partition(topic, *partition).is_some(),
                None => shared.assigned.contains_key(&(topic.clone(), *partition)),
            };
            if wanted {
                let _ = tpl.add_partition_offset(topic, *partition, Offset::Offset(*offset));
            }
        }
    }
    if tpl.count() == 0 {
        return;
    }
    if let Err(e) = ferry_core::blocking(|| consumer.commit(&tpl, mode)) {
        tracing::warn!(source, error = %e, "cannot commit offsets to the group (informational: the source's own offsets decide)");
    }
}

impl ClientContext for RebalanceContext {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn generate_oauth_token(
        &self,
        _config: Option<&str>,
    ) -> Result<rdkafka::client::OAuthToken, Box<dyn std::error::Error>> {
        self.token.oauth_token()
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        self.token.client_error(error, reason);
    }

    fn stats_raw(&self, statistics: &[u8]) {
        self.token.client_statistics(statistics);
    }
}

impl ConsumerContext for RebalanceContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let cooperative = matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        let result = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                self.seek_targets(consumer, tpl);
                let result = if cooperative {
                    consumer.incremental_assign(tpl)
                } else {
                    consumer.assign(tpl)
                };
                let mut shared = self.shared();
                if !cooperative {
                    shared.assigned.clear();
                    shared.starts.clear();
                }
                let number = self.assignments.fetch_add(1, Ordering::AcqRel) + 1;
                for e in tpl.elements() {
                    let tp = (e.topic().to_owned(), e.partition());
                    match e.offset() {
                        Offset::Offset(start) => shared.starts.insert(tp.clone(), start),
                        _ => shared.starts.remove(&tp),
                    };
                    shared.assigned.insert(tp, number);
                }
                result
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                // The next owner starts where this one's durable offsets end.
                self.commit_durable(consumer, Some(tpl), CommitMode::Sync);
                {
                    let mut shared = self.shared();
                    for e in tpl.elements() {
                        let tp = (e.topic().to_owned(), e.partition());
                        shared.assigned.remove(&tp);
                        shared.starts.remove(&tp);
                        shared.revoked.insert(tp);
                    }
                    // The batch being gathered drops the revoked partitions' records (checked
                    // after every `recv`).
                    self.assignments.fetch_add(1, Ordering::AcqRel);
                }
                tracing::info!(source = %self.source, partitions = tpl.count(), "partitions revoked");
                if cooperative {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                }
            }
            other => {
                tracing::error!(source = %self.source, error = ?other, "rebalance failed");
                let mut shared = self.shared();
                shared.starts.clear();
                let owned: Vec<Tp> = shared.assigned.drain().map(|(tp, _)| tp).collect();
                shared.revoked.extend(owned);
                // Nothing is owned any more: the batch being gathered drops its records.
                self.assignments.fetch_add(1, Ordering::AcqRel);
                drop(shared);
                consumer.unassign()
            }
        };
        if let Err(e) = result {
            tracing::error!(source = %self.source, error = %e, "cannot apply a rebalance");
        }
    }
}

/// librdkafka's position of each owned partition whose records before it were all read by
/// this source under its current assignment (`read`: the assignment of the last record read
/// per partition) or, for a partition never revoked, by this consumer since it started: the
/// offset after the last record read and after the control records (transaction markers)
/// that follow it. Other partitions are left out.
fn positions<C: ConsumerContext>(
    consumer: &impl Consumer<C>,
    shared: &Mutex<Shared>,
    read: &HashMap<Tp, u64>,
) -> Vec<(Tp, i64)> {
    let Ok(list) = consumer.position() else {
        return Vec::new();
    };
    let shared = shared.lock().unwrap_or_else(|e| e.into_inner());
    list.elements()
        .iter()
        .filter_map(|e| {
            let Offset::Offset(position) = e.offset() else {
                return None;
            };
            let tp = (e.topic().to_owned(), e.partition());
            let assignment = shared.assigned.get(&tp)?;
            let trusted = read.get(&tp) == Some(assignment) || !shared.revoked.contains(&tp);
            (trusted && position >= 0).then_some((tp, position))
        })
        .collect()
}

/// The Kafka source.
pub struct KafkaSource {
    config: KafkaSourceConfig,
    connection: Connection,
    client: ClientConfig,
}

impl std::fmt::Debug for KafkaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSource")
            .field("config", &self.config)
            .finish()
    }
}

impl KafkaSource {
    /// Validates the options; the consumer is created when the source runs.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        let (connection, own) = Connection::from_config(cfg, Role::Source)?;
        let config: KafkaSourceConfig = own.parse()?;
        Connection::check_passthrough(cfg, "consumer", &config.consumer)?;
        match (&config.topics_regex, config.topics.is_empty()) {
            (None, true) => {
                return Err(ConfigError::new(
                    cfg.location(),
                    "set `topics` (a list) or `topics_regex`",
                ));
            }
            (Some(_), false) => {
                return Err(
                    cfg.error_at("topics_regex", "set `topics` or `topics_regex`, not both")
                );
            }
            (Some(regex), true) => {
                if let Err(e) = regex::Regex::new(regex) {
                    return Err(
                        cfg.error_at("topics_regex", format!("not a regular expression: {e}"))
                    );
                }
            }
            (None, false) => {}
        }
        if config.group_id.is_empty() {
            return Err(cfg.error_at("group_id", "`group_id` is empty"));
        }
        if config.batch_size == 0 {
            return Err(cfg.error_at("batch_size", "`batch_size` must be at least 1"));
        }
        cfg.check_one_of(
            "auto_offset_reset",
            &config.auto_offset_reset,
            &["earliest", "latest"],
        )?;
        cfg.check_one_of(
            "isolation_level",
            &config.isolation_level,
            &["read_committed", "read_uncommitted"],
        )?;
        let mut client = connection.consumer_config(&config.group_id);
        client
            .set("auto.offset.reset", &config.auto_offset_reset)
            .set("isolation.level", &config.isolation_level);
        for (key, value) in &config.consumer {
            client.set(key, value);
        }
        Ok(Self {
            config,
            connection,
            client,
        })
    }
}

/// The batch being gathered: its events, and per event the partition it was read from under
/// which assignment. Records arrive in runs of one partition, so the partition of a record is
/// found without allocating or hashing (the last one's, or a short scan).
#[derive(Default)]
struct Gathering {
    parts: Vec<Part>,
    /// Index in `parts` of the last record's partition.
    last: usize,
    events: Vec<Event>,
    /// `parts[owners[i]]` is where `events[i]` was read.
    owners: Vec<usize>,
}

/// A partition of the batch being gathered, under one assignment.
struct Part {
    tp: Tp,
    assignment: u64,
    /// Where this assignment started, when this source set it (see [`Shared::starts`]).
    start: Option<i64>,
    /// The offset after the last record gathered; 0 before the first.
    next: i64,
    /// False once a rebalance took the partition (or this assignment of it) away: its records
    /// are out of the batch and later records of the partition start a new `Part`.
    owned: bool,
}

impl Gathering {
    fn len(&self) -> usize {
        self.events.len()
    }

    /// The owned part of `topic`/`partition`, if the batch has one.
    fn find(&mut self, topic: &str, partition: i32) -> Option<usize> {
        let is = |p: &Part| p.owned && p.tp.1 == partition && p.tp.0 == topic;
        if self.parts.get(self.last).is_some_and(is) {
            return Some(self.last);
        }
        let index = self.parts.iter().position(is)?;
        self.last = index;
        Some(index)
    }

    fn add_part(&mut self, tp: Tp, assignment: u64, start: Option<i64>) -> usize {
        self.parts.push(Part {
            tp,
            assignment,
            start,
            next: 0,
            owned: true,
        });
        self.last = self.parts.len() - 1;
        self.last
    }

    fn push(&mut self, part: usize, offset: i64, event: Event) {
        let next = &mut self.parts[part].next;
        *next = (*next).max(offset + 1);
        self.events.push(event);
        self.owners.push(part);
    }

    /// After a rebalance: drops the records of partitions `state` no longer assigns under the
    /// same assignment; returns how many.
    fn keep_owned(&mut self, state: &Shared) -> usize {
        for part in &mut self.parts {
            part.owned = part.owned && state.assigned.get(&part.tp) == Some(&part.assignment);
        }
        let before = self.events.len();
        if self.parts.iter().all(|p| p.owned) {
            return 0;
        }
        let mut owners = self.owners.iter();
        self.events
            .retain(|_| owners.next().is_some_and(|&i| self.parts[i].owned));
        self.owners.retain(|&i| self.parts[i].owned);
        before - self.events.len()
    }

    /// The gathered events, and each owned partition that has some with the offset after them;
    /// leaves the gathering empty.
    fn take(&mut self) -> (Vec<Event>, Vec<(Tp, i64)>) {
        let nexts = self
            .parts
            .drain(..)
            .filter(|p| p.owned && p.next > 0)
            .map(|p| (p.tp, p.next))
            .collect();
        self.owners.clear();
        self.last = 0;
        (std::mem::take(&mut self.events), nexts)
    }
}

/// The record's event: its Kafka headers, then where it was read; with `position`, that header
/// holds `topic-partition-offset`.
///
/// The names are static and the values (a topic name, numbers) short enough to be stored inline,
/// so a record's headers cost the map and no allocation per header.
fn event_of(message: &impl Message, position: Option<&str>) -> Event {
    let mut map = headers::header_map(message, 6);
    // In the order of their names: each goes at the end of the record's own headers (`file`,
    // `host`, ... sort before them), without a search.
    if let Some(key) = message.key() {
        map.insert(
            CompactString::const_new("key"),
            CompactString::from_utf8_lossy(key),
        );
    }
    map.insert(
        CompactString::const_new("offset"),
        message.offset().to_compact_string(),
    );
    map.insert(
        CompactString::const_new("partition"),
        message.partition().to_compact_string(),
    );
    if let Some(ts) = message.timestamp().to_millis() {
        map.insert(
            CompactString::const_new("timestamp"),
            ts.to_compact_string(),
        );
    }
    map.insert(
        CompactString::const_new("topic"),
        CompactString::from(message.topic()),
    );
    if let Some(header) = position {
        let id = format_compact!(
            "{}-{}-{}",
            message.topic(),
            message.partition(),
            message.offset()
        );
        map.insert(header.into(), id);
    }
    Event::new(Headers::from(map), headers::body_of(message))
}

#[async_trait]
impl Source for KafkaSource {
    fn max_batch_size(&self) -> Option<usize> {
        Some(self.config.batch_size)
    }

    /// Positions are `topic-partition-offset` of the record.
    fn sets_positions(&self) -> bool {
        true
    }

    async fn run(self: Box<Self>, ctx: SourceContext) -> Result<(), SourceError> {
        let name = ctx.name().to_owned();
        let shared = Arc::new(Mutex::new(Shared::default()));
        let assignments = Arc::new(AtomicU64::new(0));
        // Not `checkpoint()`: after a restart of this source in the same process, the durable
        // checkpoint is newer than the one loaded at start.
        if let Some(checkpoint) = ctx.durable_checkpoint() {
            let offsets = decode_offsets(&checkpoint)?;
            tracing::info!(source = %name, partitions = offsets.len(), "kafka source resumes from its checkpoint");
            shared.lock().unwrap_or_else(|e| e.into_inner()).sent = offsets;
        }
        // What the consumer cannot reach fails the source's /health within seconds.
        let mut connection = self.connection.clone();
        let mut client = self.client.clone();
        connection.report_to(ctx.metrics(), &mut client);
        let context = RebalanceContext {
            token: connection.context(),
            source: name.clone(),
            ctx: ctx.clone(),
            shared: Arc::clone(&shared),
            assignments: Arc::clone(&assignments),
        };
        let consumer: StreamConsumer<RebalanceContext> = client
            .create_with_context(context)
            .map_err(|e| ClientError::kafka("creating the Kafka consumer", e))?;
        let subscription: Vec<String> = match &self.config.topics_regex {
            // librdkafka reads a name starting with `^` as a regular expression.
            Some(regex) if regex.starts_with('^') => vec![regex.clone()],
            Some(regex) => vec![format!("^{regex}")],
            None => self.config.topics.clone(),
        };
        let topics: Vec<&str> = subscription.iter().map(String::as_str).collect();
        consumer
            .subscribe(&topics)
            .map_err(|e| ClientError::kafka(format!("subscribing to {topics:?}"), e))?;
        tracing::info!(source = %name, topics = ?topics, group = %self.config.group_id, "kafka source subscribed");

        let shutdown = ctx.shutdown().clone();
        let mut batch = Gathering::default();
        let mut assignments_seen = 0u64;
        // Per partition, the assignment under which a record was last read.
        let mut read: HashMap<Tp, u64> = HashMap::new();
        while !shutdown.is_triggered() {
            // One timer and one shutdown waiter per batch, looked at only when no record is
            // ready (a record already fetched is taken without touching either).
            let deadline = tokio::time::sleep(self.config.batch_duration);
            tokio::pin!(deadline);
            let stopping = shutdown.wait();
            tokio::pin!(stopping);
            while batch.len() < self.config.batch_size {
                let received = tokio::select! {
                    biased;
                    received = consumer.recv() => received,
                    _ = &mut deadline => break,
                    _ = &mut stopping => break,
                };
                // A rebalance runs inside `recv`: drop what was gathered from partitions this
                // consumer no longer owns, or owns again since a newer assignment.
                let assignments = assignments.load(Ordering::Acquire);
                if assignments != assignments_seen {
                    assignments_seen = assignments;
                    let dropped =
                        batch.keep_owned(&shared.lock().unwrap_or_else(|e| e.into_inner()));
                    if dropped > 0 {
                        tracing::info!(source = %name, dropped, "dropped records of revoked partitions from the batch being gathered");
                    }
                }
                let message = match received {
                    Ok(message) => message,
                    Err(KafkaError::PartitionEOF(_)) => continue,
                    Err(e) => {
                        tracing::warn!(source = %name, error = %e, "kafka consumer error");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let part = match batch.find(message.topic(), message.partition()) {
                    Some(part) => part,
                    None => {
                        let tp = (message.topic().to_owned(), message.partition());
                        let state = shared.lock().unwrap_or_else(|e| e.into_inner());
                        let Some(&assignment) = state.assigned.get(&tp) else {
                            continue;
                        };
                        let start = state.starts.get(&tp).copied();
                        drop(state);
                        read.insert(tp.clone(), assignment);
                        batch.add_part(tp, assignment, start)
                    }
                };
                let offset = message.offset();
                if let Some(start) = batch.parts[part].start.filter(|s| offset < *s) {
                    let tp = &batch.parts[part].tp;
                    tracing::warn!(source = %name, topic = %tp.0, partition = tp.1, offset, start, "dropped a record from before this assignment's start");
                    continue;
                }
                batch.push(part, offset, event_of(&message, ctx.position_header()));
            }
            // Where librdkafka's position stands: past the last record read and past the
            // control records (transaction markers) after it, as Kafka's consumer commits.
            let positions = positions(&consumer, &shared, &read);
            let mut offsets = shared
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .sent
                .clone();
            let before = offsets.clone();
            let (events, nexts) = batch.take();
            for (tp, next) in nexts {
                let at = offsets.entry(tp).or_insert(0);
                *at = (*at).max(next);
            }
            // Every record of these partitions before their position is in this batch or an
            // earlier one (the batch holds every record read since), so the checkpoint may
            // step over the markers.
            for (tp, position) in positions {
                let next = offsets.entry(tp).or_insert(0);
                *next = (*next).max(position);
            }
            if events.is_empty() && offsets == before {
                continue;
            }
            // Without records (a marker read after the last batch), the batch carries only
            // the checkpoint.
            ctx.send(events, Some(encode_offsets(&offsets))).await?;
            shared.lock().unwrap_or_else(|e| e.into_inner()).sent = offsets;
            commit_durable(&name, &ctx, &consumer, None, &shared, CommitMode::Async);
        }
        commit_durable(&name, &ctx, &consumer, None, &shared, CommitMode::Sync);
        // Dropping the consumer leaves the group, so its partitions move on at once.
        let closing = tokio::task::spawn_blocking(move || drop(consumer));
        let _ = closing.await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ferry_core::test_support::{TestChannel, config, context_with};
    use ferry_core::{CheckpointStore, MemoryCheckpointStore};
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};

    use super::*;

    async fn produce(bootstrap: &str, topic: &str, from: usize, to: usize) {
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("linger.ms", "5")
            .create()
            .unwrap();
        let sends: Vec<_> = (from..to)
            .map(|i| {
                let body = format!("record-{i}");
                let key = format!("k{i}");
                let headers = OwnedHeaders::new().insert(Header {
                    key: "app",
                    value: Some("web"),
                });
                producer
                    .send_result(
                        FutureRecord::to(topic)
                            .payload(&body)
                            .key(&key)
                            .headers(headers),
                    )
                    .unwrap()
            })
            .collect();
        for send in sends {
            send.await.unwrap().unwrap();
        }
    }

    /// Runs a kafka source into `channel` with `store` until `n` events arrived, then stops it.
    async fn consume(
        bootstrap: &str,
        channel: &Arc<TestChannel>,
        store: Arc<MemoryCheckpointStore>,
        n: usize,
    ) {
        consume_with(bootstrap, channel, store, n, "topics: [logs]").await;
    }

    async fn consume_with(
        bootstrap: &str,
        channel: &Arc<TestChannel>,
        store: Arc<MemoryCheckpointStore>,
        n: usize,
        topics: &str,
    ) {
        let (ctx, shutdown) = context_with(channel, "kafka-in", store);
        let source = KafkaSource::build(&config(
            "kafka",
            &format!(
                "bootstrap_servers: {bootstrap}\n{topics}\ngroup_id: g\nbatch_size: 50\nbatch_duration: 100ms"
            ),
        ))
        .unwrap();
        let task = tokio::spawn(Box::new(source).run(ctx));
        tokio::time::timeout(Duration::from_secs(60), channel.wait_for(n))
            .await
            .unwrap_or_else(|_| panic!("{} of {n} events arrived", channel.events().len()));
        shutdown.trigger();
        task.await.unwrap().unwrap();
    }

    /// A consumer of the sources' group `g`, never subscribed.
    fn group_g(bootstrap: &str) -> BaseConsumer {
        ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", "g")
            .create()
            .unwrap()
    }

    fn group_offsets(bootstrap: &str) -> BTreeMap<i32, i64> {
        let consumer = group_g(bootstrap);
        let mut tpl = TopicPartitionList::new();
        for p in 0..3 {
            tpl.add_partition("logs", p);
        }
        let committed = consumer
            .committed_offsets(tpl, Duration::from_secs(10))
            .unwrap();
        committed
            .elements()
            .iter()
            .map(|e| (e.partition(), e.offset().to_raw().unwrap_or(-1)))
            .collect()
    }

    fn reset_group(bootstrap: &str) {
        let consumer = group_g(bootstrap);
        let mut tpl = TopicPartitionList::new();
        for p in 0..3 {
            tpl.add_partition_offset("logs", p, Offset::Offset(0))
                .unwrap();
        }
        consumer.commit(&tpl, CommitMode::Sync).unwrap();
    }

    /// A broker in `dir` whose topics get 3 partitions and whose groups rebalance at once.
    async fn start_broker(dir: &std::path::Path) -> (ferry_broker::BrokerHandle, String) {
        crate::test_support::start_broker(dir, 3).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn records_arrive_once_with_headers_and_the_checkpoint_decides_where_to_resume() {
        let dir = tempfile::tempdir().unwrap();
        let (broker, bootstrap) = start_broker(dir.path()).await;
        produce(&bootstrap, "logs", 0, 300).await;

        let channel = TestChannel::new(100_000, 1000);
        let store = Arc::new(MemoryCheckpointStore::default());
        consume(&bootstrap, &channel, store.clone(), 300).await;
        let events = channel.drain();
        let mut bodies: Vec<String> = events
            .iter()
            .map(|e| String::from_utf8_lossy(&e.body).into_owned())
            .collect();
        bodies.sort();
        bodies.dedup();
        assert_eq!(bodies.len(), 300);
        let e = &events[0];
        let i: usize = String::from_utf8_lossy(&e.body)["record-".len()..]
            .parse()
            .unwrap();
        assert_eq!(e.headers["key"], format!("k{i}"));
        assert_eq!(e.headers["app"], "web");
        assert_eq!(e.headers["topic"], "logs");
        assert!(e.headers["partition"].parse::<i32>().unwrap() < 3);
        assert!(e.headers.contains_key("offset") && e.headers.contains_key("timestamp"));
        let checkpoint = channel.checkpoint().unwrap();
        let offsets = decode_offsets(&checkpoint).unwrap();
        assert_eq!(offsets.values().sum::<i64>(), 300);
        // The group's offsets followed the durable checkpoint.
        let committed = group_offsets(&bootstrap);
        assert_eq!(committed.values().sum::<i64>(), 300, "{committed:?}");

        // The group's offsets are moved back; the source's own offsets win: nothing repeats.
        reset_group(&bootstrap);
        store.save("kafka-in", &checkpoint).unwrap();
        produce(&bootstrap, "logs", 300, 400).await;
        consume(&bootstrap, &channel, store.clone(), 100).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut second: Vec<String> = channel
            .drain()
            .iter()
            .map(|e| String::from_utf8_lossy(&e.body).into_owned())
            .collect();
        second.sort();
        let expected: Vec<String> = {
            let mut v: Vec<String> = (300..400).map(|i| format!("record-{i}")).collect();
            v.sort();
            v
        };
        assert_eq!(second, expected);

        // A source without a checkpoint (another agent taking over) starts at the group's
        // committed offsets.
        produce(&bootstrap, "logs", 400, 450).await;
        let fresh = TestChannel::new(100_000, 1000);
        consume(
            &bootstrap,
            &fresh,
            Arc::new(MemoryCheckpointStore::default()),
            50,
        )
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(fresh.events().len(), 50);
        broker.shutdown().await;
    }

    /// Through a memory channel whose events are never delivered, nothing is durable: the
    /// group's offsets must not move (a restart reads everything again). A regex subscribes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_a_memory_channel_group_offsets_wait_for_delivery() {
        let dir = tempfile::tempdir().unwrap();
        let (broker, bootstrap) = start_broker(dir.path()).await;
        produce(&bootstrap, "logs", 0, 90).await;
        let channel = TestChannel::volatile(100_000, 1000);
        let store = Arc::new(MemoryCheckpointStore::default());
        consume_with(
            &bootstrap,
            &channel,
            store.clone(),
            90,
            "topics_regex: 'lo.s'",
        )
        .await;
        assert_eq!(channel.events().len(), 90);
        assert_eq!(store.load("kafka-in").unwrap(), None);
        let committed = group_offsets(&bootstrap);
        assert!(committed.values().all(|o| *o < 0), "{committed:?}");
        broker.shutdown().await;
    }

    /// A transactional producer of topic `txn` (2 partitions), records alternating between
    /// them.
    fn transactional_producer(bootstrap: &str) -> rdkafka::producer::BaseProducer {
        use rdkafka::producer::Producer;
        let producer: rdkafka::producer::BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("transactional.id", "txn-writer")
            .create()
            .unwrap();
        producer.init_transactions(Duration::from_secs(30)).unwrap();
        producer
    }

    /// Writes records `from..to` in one transaction, committed when `commit`.
    fn write_transaction(
        producer: &rdkafka::producer::BaseProducer,
        from: usize,
        to: usize,
        commit: bool,
    ) {
        use rdkafka::producer::{BaseRecord, Producer};
        producer.begin_transaction().unwrap();
        for i in from..to {
            let body = format!("record-{i}");
            producer
                .send(
                    BaseRecord::<(), _>::to("txn")
                        .payload(&body)
                        .partition((i % 2) as i32),
                )
                .unwrap();
        }
        producer.flush(Duration::from_secs(30)).unwrap();
        if commit {
            producer
                .commit_transaction(Duration::from_secs(30))
                .unwrap();
        }
    }

    /// Per partition of `txn`: (the group `g`'s committed offset, the end offset).
    fn txn_lag(bootstrap: &str) -> Vec<(i64, i64)> {
        let consumer = group_g(bootstrap);
        let mut tpl = TopicPartitionList::new();
        for p in 0..2 {
            tpl.add_partition("txn", p);
        }
        let committed = consumer
            .committed_offsets(tpl, Duration::from_secs(10))
            .unwrap();
        (0..2)
            .map(|p| {
                let group = committed
                    .find_partition("txn", p)
                    .and_then(|e| e.offset().to_raw())
                    .unwrap_or(-1);
                let (_, end) = consumer
                    .fetch_watermarks("txn", p, Duration::from_secs(10))
                    .unwrap();
                (group, end)
            })
            .collect()
    }

    /// Waits (at most 20 s) until the group's committed offsets of `txn` are its end offsets.
    async fn wait_for_lag_zero(bootstrap: &str) -> Vec<(i64, i64)> {
        let mut lag = Vec::new();
        for _ in 0..100 {
            let b = bootstrap.to_owned();
            lag = tokio::task::spawn_blocking(move || txn_lag(&b))
                .await
                .unwrap();
            if lag.iter().all(|(group, end)| group == end) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        lag
    }

    /// On a transactional topic every transaction ends with a marker taking an offset: the
    /// checkpoint and the group's offsets step over it as Kafka's consumer does (lag 0), both
    /// when the marker comes with the records and when it comes after they were put.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn transaction_markers_are_stepped_over_so_the_lag_ends_at_zero() {
        let dir = tempfile::tempdir().unwrap();
        let (broker, bootstrap) = crate::test_support::start_broker(dir.path(), 2).await;
        let b = bootstrap.clone();
        let producer = tokio::task::spawn_blocking(move || {
            let producer = transactional_producer(&b);
            for t in 0..3 {
                write_transaction(&producer, t * 10, t * 10 + 10, true);
            }
            producer
        })
        .await
        .unwrap();

        let channel = TestChannel::new(100_000, 1000);
        let store = Arc::new(MemoryCheckpointStore::default());
        let run = |isolation: &str| {
            let (ctx, shutdown) = context_with(&channel, "kafka-in", store.clone());
            let source = KafkaSource::build(&config(
                "kafka",
                &format!(
                    "bootstrap_servers: {bootstrap}\ntopics: [txn]\ngroup_id: g\nbatch_size: 50\nbatch_duration: 100ms\nisolation_level: {isolation}"
                ),
            ))
            .unwrap();
            (tokio::spawn(Box::new(source).run(ctx)), shutdown)
        };

        // The markers come with the records (read_committed sees a transaction once ended).
        let (task, shutdown) = run("read_committed");
        channel.wait_for(30).await;
        let lag = wait_for_lag_zero(&bootstrap).await;
        // 15 records and 3 markers per partition.
        assert_eq!(lag, vec![(18, 18), (18, 18)]);
        let offsets = decode_offsets(&channel.checkpoint().unwrap()).unwrap();
        assert_eq!(offsets.values().copied().collect::<Vec<_>>(), vec![18, 18]);
        shutdown.trigger();
        task.await.unwrap().unwrap();
        let mut bodies = channel.bodies();
        bodies.sort();
        let mut expected: Vec<String> = (0..30).map(|i| format!("record-{i}")).collect();
        expected.sort();
        assert_eq!(bodies, expected);

        // read_uncommitted sees the records before their transaction ends: they are put, then
        // the marker alone moves the checkpoint. A restart resumes after it, repeating nothing.
        let (task, shutdown) = run("read_uncommitted");
        let producer = tokio::task::spawn_blocking(move || {
            write_transaction(&producer, 30, 34, false);
            producer
        })
        .await
        .unwrap();
        channel.wait_for(34).await;
        let offsets = decode_offsets(&channel.checkpoint().unwrap()).unwrap();
        assert_eq!(offsets.values().copied().collect::<Vec<_>>(), vec![20, 20]);
        tokio::task::spawn_blocking(move || {
            use rdkafka::producer::Producer;
            producer
                .commit_transaction(Duration::from_secs(30))
                .unwrap();
        })
        .await
        .unwrap();
        let lag = wait_for_lag_zero(&bootstrap).await;
        assert_eq!(lag, vec![(21, 21), (21, 21)]);
        let offsets = decode_offsets(&channel.checkpoint().unwrap()).unwrap();
        assert_eq!(offsets.values().copied().collect::<Vec<_>>(), vec![21, 21]);
        shutdown.trigger();
        task.await.unwrap().unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(channel.events().len(), 34);
        broker.shutdown().await;
    }

    #[test]
    fn a_rebalance_drops_the_gathered_records_of_partitions_no_longer_owned_under_their_assignment()
    {
        let tp = |p: i32| ("t".to_owned(), p);
        let mut batch = Gathering::default();
        let a = batch.add_part(tp(0), 1, None);
        batch.push(a, 10, Event::from_body("a10"));
        let b = batch.add_part(tp(1), 1, Some(5));
        batch.push(b, 5, Event::from_body("b5"));
        assert_eq!(batch.find("t", 0), Some(a));
        batch.push(a, 11, Event::from_body("a11"));
        batch.push(b, 6, Event::from_body("b6"));
        assert_eq!(batch.find("t", 2), None);
        assert_eq!(batch.find("u", 1), None);

        // Partition 0 stays under assignment 1; partition 1 was revoked and assigned again.
        let mut state = Shared::default();
        state.assigned.insert(tp(0), 1);
        state.assigned.insert(tp(1), 2);
        assert_eq!(batch.keep_owned(&state), 2);
        assert_eq!(
            batch.find("t", 1),
            None,
            "a new assignment starts a new part"
        );
        let c = batch.add_part(tp(1), 2, None);
        batch.push(c, 7, Event::from_body("b7"));
        assert_eq!(batch.keep_owned(&state), 0);

        let (events, nexts) = batch.take();
        let bodies: Vec<&[u8]> = events.iter().map(|e| &e.body[..]).collect();
        assert_eq!(bodies, [&b"a10"[..], b"a11", b"b7"]);
        assert_eq!(nexts, [(tp(0), 12), (tp(1), 8)]);
        assert_eq!(batch.len(), 0);
        assert_eq!(batch.find("t", 0), None);
    }

    #[test]
    fn a_failed_rebalance_gives_up_every_partition_and_the_records_gathered_from_them() {
        let source = KafkaSource::build(&config(
            "kafka",
            "bootstrap_servers: 127.0.0.1:1\ntopics: [t]\ngroup_id: g",
        ))
        .unwrap();
        let channel = TestChannel::new(10, 10);
        let (ctx, _shutdown) = context_with(
            &channel,
            "kafka-in",
            Arc::new(MemoryCheckpointStore::default()),
        );
        let shared = Arc::new(Mutex::new(Shared::default()));
        let assignments = Arc::new(AtomicU64::new(1));
        let tp = |p: i32| ("t".to_owned(), p);
        {
            let mut state = shared.lock().unwrap();
            state.assigned.insert(tp(0), 1);
            state.assigned.insert(tp(1), 1);
            state.starts.insert(tp(0), 10);
        }
        let context = RebalanceContext {
            token: source.connection.context(),
            source: "kafka-in".into(),
            ctx,
            shared: Arc::clone(&shared),
            assignments: Arc::clone(&assignments),
        };
        let consumer: BaseConsumer<RebalanceContext> =
            source.client.create_with_context(context).unwrap();
        let mut batch = Gathering::default();
        let part = batch.add_part(tp(0), 1, None);
        batch.push(part, 10, Event::from_body("a10"));

        let mut tpl = TopicPartitionList::new();
        tpl.add_partition("t", 0);
        consumer
            .context()
            .rebalance(&consumer, RDKafkaRespErr::RD_KAFKA_RESP_ERR__FAIL, &mut tpl);

        assert_eq!(
            assignments.load(Ordering::Acquire),
            2,
            "an assignment change"
        );
        let state = shared.lock().unwrap();
        assert!(state.assigned.is_empty() && state.starts.is_empty());
        assert_eq!(state.revoked, [tp(0), tp(1)].into_iter().collect());
        assert_eq!(
            batch.keep_owned(&state),
            1,
            "the gathered record is dropped"
        );
        assert_eq!(batch.len(), 0);
    }

    #[test]
    fn bad_options_are_reported_with_their_key() {
        let err = KafkaSource::build(&config("kafka", "bootstrap_servers: h:1")).unwrap_err();
        assert!(err.message.contains("topics"), "{err:?}");
        let err = KafkaSource::build(&config(
            "kafka",
            "bootstrap_servers: h:1\ntopics: [a]\nauto_offset_reset: earlist",
        ))
        .unwrap_err();
        assert!(err.message.contains("did you mean `earliest`"), "{err:?}");
        let err = KafkaSource::build(&config(
            "kafka",
            "bootstrap_servers: h:1\ntopics_regex: '('",
        ))
        .unwrap_err();
        assert_eq!(err.location.map(|l| l.line), Some(2));
    }
}
