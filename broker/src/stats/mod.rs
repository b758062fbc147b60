//! What the broker reports about itself, for the embedding process to serve: a snapshot as
//! data ([`BrokerStats`], serde-serializable) and the same numbers as Prometheus metrics
//! ([`BrokerObserver::collector`]), both read from the live state when asked.
//!
//! - **Where the numbers come from.** Offsets and sizes from each partition's log (its lock,
//!   held for a few loads); groups and transactions from their coordinators (their locks, as a
//!   DescribeGroups does); committed offsets from the catalog's in-memory copy (no SQLite
//!   query); traffic, requests and connections from [`counters`], relaxed atomics bumped on the
//!   request path once per batch, per fetched topic, per request or per connection.
//! - **Cost.** A snapshot walks every partition, group and open transaction once: cheap for
//!   the hundreds of partitions a single broker holds, and nothing is copied on the hot path.
//! - **Lifetime.** A [`BrokerObserver`] holds the broker's shared state, so it outlives the
//!   [`crate::BrokerHandle`] it came from: after a shutdown it reports the final numbers.

pub(crate) mod counters;
mod prometheus;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use bytes::Buf;
use kafka_protocol::messages::ConsumerProtocolAssignment;
use kafka_protocol::protocol::Decodable;
use serde::Serialize;

use crate::api::Context;
use crate::txn::TxnState;

pub(crate) use counters::{ListenerCounters, RequestCounters, TopicCounters};
pub use prometheus::BrokerCollector;

/// The counters the request path bumps, broker-wide.
#[derive(Debug)]
pub(crate) struct Counters {
    /// Per API served.
    pub(crate) requests: RequestCounters,
    /// Per listener, in configuration order.
    pub(crate) listeners: Vec<Arc<ListenerCounters>>,
}

impl Counters {
    /// Counters for every served API and for `listeners`.
    pub(crate) fn new(listeners: Vec<Arc<ListenerCounters>>) -> Self {
        Counters {
            requests: RequestCounters::new(crate::api::ROUTES.iter().map(|r| r.key)),
            listeners,
        }
    }
}

/// Everything the broker reports, at one moment.
#[derive(Debug, Clone, Serialize)]
pub struct BrokerStats {
    /// Every partition, by topic and index.
    pub partitions: Vec<PartitionStats>,
    /// Each topic's traffic since the broker started (or the topic was created), by name.
    pub topics: Vec<TopicStats>,
    /// Each API served, in the broker's route order.
    pub requests: Vec<ApiStats>,
    /// Each listener's connections, in configuration order.
    pub connections: Vec<ListenerStats>,
    /// Every consumer group the coordinator knows, by id.
    pub groups: Vec<GroupStats>,
    /// The open transactions (Ongoing, PrepareCommit, PrepareAbort), by transactional id.
    pub transactions: Vec<TransactionStats>,
    /// Bytes of requests read and not yet answered (bounded by `queued_max_request_bytes`).
    pub queued_request_bytes: u64,
    /// For each bound on what clients make the broker hold (`group_max_size`, `max_groups`,
    /// `max_transactional_ids`, `max_producer_ids_per_partition`, `max_pending_fetches`): how
    /// many times it was reached since start.
    pub limits_reached: Vec<LimitReached>,
}

/// How often one bound was reached.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LimitReached {
    /// The setting that bounds it.
    pub limit: String,
    /// Times it was reached since start.
    pub count: u64,
}

/// One partition's log.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PartitionStats {
    /// Topic name.
    pub topic: String,
    /// Partition index.
    pub partition: i32,
    /// First offset still stored (moves with retention).
    pub log_start_offset: i64,
    /// Offset the next record gets; on one broker also the log end offset.
    pub high_watermark: i64,
    /// Where read_committed consumers stop: the first offset of the oldest open transaction
    /// on the partition, or the high watermark.
    pub last_stable_offset: i64,
    /// Bytes of its segment files.
    pub size_bytes: u64,
    /// Number of segments, the active one included.
    pub segments: usize,
    /// Ranges of its segment files found damaged (by recovery, the scrubber or a read) and
    /// not yet removed: fetches of their offsets get CORRUPT_MESSAGE (see `agent log-repair`).
    pub damaged_ranges: usize,
    /// Bytes of those ranges.
    pub damaged_bytes: u64,
    /// Compaction passes swapped in since the broker started (topics whose `cleanup.policy`
    /// includes `compact`).
    pub cleaner_passes: u64,
    /// Records those passes removed (superseded, keyless, expired tombstones, aborted).
    pub cleaner_records_removed: u64,
    /// Where the last pass ended: the offsets from it on are not compacted yet (0 before one).
    pub cleaner_checkpoint: i64,
}

/// One topic's traffic, counted per batch (Kafka's `BytesInPerSec`, `BytesOutPerSec`,
/// `MessagesInPerSec` as running totals).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TopicStats {
    /// Topic name.
    pub topic: String,
    /// Bytes of record batches appended by Produce (retried duplicates included).
    pub bytes_in: u64,
    /// Bytes of record batches sent by Fetch (the file ranges, sent with `sendfile` or not).
    pub bytes_out: u64,
    /// Records appended by Produce, from the batches' record counts.
    pub records_in: u64,
    /// Offsets spanned by the batches sent by Fetch: records, transaction markers included.
    /// A batch sent to two consumers counts twice, as its bytes do.
    pub records_out: u64,
}

/// The requests of one API.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ApiStats {
    /// Kafka's name of the API (`Produce`, `Fetch`, `Metadata`, ...).
    pub api: String,
    /// Requests served, the ones that failed to decode included.
    pub requests: u64,
    /// Error codes in the responses, by code: each partition, topic or group answered with
    /// an error counts once, as in Kafka's `ErrorsPerSec`; a request that did not decode
    /// counts as INVALID_REQUEST.
    pub errors: Vec<ErrorCount>,
    /// How long requests took from decoding to the response being ready (a long-polling
    /// Fetch's wait included; the time to send it not).
    pub latency: LatencyHistogram,
}

/// How often one error code was answered.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorCount {
    /// The Kafka error code.
    pub code: i16,
    /// Kafka's name of it (`UNKNOWN_TOPIC_OR_PARTITION`); `UNKNOWN` for a code out of range.
    pub error: String,
    /// Times answered.
    pub count: u64,
}

/// A latency histogram with fixed buckets.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LatencyHistogram {
    /// Each bucket's upper bound in milliseconds and the requests in it (not cumulative);
    /// the last bucket has no bound (`null`: +Inf).
    pub buckets: Vec<LatencyBucket>,
    /// Requests counted.
    pub count: u64,
    /// Total time of those requests, in milliseconds.
    pub sum_ms: f64,
}

/// One latency bucket.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LatencyBucket {
    /// Upper bound in milliseconds, inclusive; `None` for the last (+Inf).
    pub le_ms: Option<f64>,
    /// Requests that took longer than the previous bound and at most this one.
    pub count: u64,
}

/// One listener's connections.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ListenerStats {
    /// The listener's name (`PLAINTEXT`, `SASL_SSL`, or its configured name).
    pub listener: String,
    /// The bound address.
    pub address: SocketAddr,
    /// Connections open now (accepted minus closed).
    pub open: u64,
    /// Connections accepted since start.
    pub accepted: u64,
    /// Connections closed since start, by either side.
    pub closed: u64,
    /// Connections refused since start: a connection limit was reached, or the broker was out
    /// of file descriptors.
    pub refused: u64,
    /// Connections closed since start because a request could not be made sense of (a bad
    /// size, an unknown API or version, a body that does not decode).
    pub malformed: u64,
    /// Connections closed since start because a request did not arrive whole within
    /// `request_receive_timeout_ms` of its first byte.
    pub receive_timeouts: u64,
    /// Connections closed since start because a request before SASL authentication was
    /// larger than `sasl_server_max_receive_size`.
    pub unauthenticated_too_large: u64,
    /// Connections closed since start because their TLS handshake was not done within
    /// `ssl_handshake_timeout_ms`.
    pub handshake_timeouts: u64,
    /// Connections closed since start because they had not authenticated within
    /// `sasl_authentication_timeout_ms`.
    pub authentication_timeouts: u64,
}

/// A consumer group.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupStats {
    /// Group id.
    pub group: String,
    /// Kafka's name of its state: `Empty`, `PreparingRebalance`, `CompletingRebalance`,
    /// `Stable`, `Dead`.
    pub state: String,
    /// The protocol type (`consumer`; empty for a group that only holds offsets committed by
    /// a standalone consumer or tool).
    pub protocol_type: String,
    /// The assignor chosen (`range`, `cooperative-sticky`, ...); empty when not stable.
    pub protocol: String,
    /// Its members, by member id.
    pub members: Vec<MemberStats>,
    /// Its committed offsets and the lag behind each, by topic and partition.
    pub offsets: Vec<PartitionLag>,
}

/// A member of a group.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemberStats {
    /// Member id.
    pub member_id: String,
    /// The client's `client.id`.
    pub client_id: String,
    /// The client's host as Kafka shows it (`/127.0.0.1`).
    pub client_host: String,
    /// The partitions assigned to it (for protocol type `consumer`; empty otherwise).
    pub assignment: Vec<TopicPartition>,
}

/// A topic partition.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct TopicPartition {
    /// Topic name.
    pub topic: String,
    /// Partition index.
    pub partition: i32,
}

/// A group's progress on one partition, as `kafka-consumer-groups.sh --describe` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PartitionLag {
    /// Topic name.
    pub topic: String,
    /// Partition index.
    pub partition: i32,
    /// The committed offset: the next record the group will read.
    pub committed_offset: i64,
    /// The partition's high watermark (the tool's LOG-END-OFFSET, which it reads at
    /// read_uncommitted whatever the consumers' isolation level).
    pub high_watermark: i64,
    /// `high_watermark - committed_offset`, never below 0 (the tool's LAG).
    pub lag: i64,
}

/// An open transaction.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TransactionStats {
    /// The producer's `transactional.id`.
    pub transactional_id: String,
    /// Its producer id.
    pub producer_id: i64,
    /// Its producer epoch.
    pub producer_epoch: i16,
    /// Kafka's name of the state: `Ongoing`, `PrepareCommit`, `PrepareAbort`.
    pub state: String,
    /// The partitions written in it, by topic and partition.
    pub partitions: Vec<TopicPartition>,
    /// When it started, in ms since the Unix epoch.
    pub start_ms: i64,
    /// How long it has been open, in ms.
    pub duration_ms: i64,
    /// Its `transaction.timeout.ms`: it is aborted when open longer.
    pub timeout_ms: i32,
}

/// A view of a running broker's state, to report it: cheap to clone, shareable between
/// threads, usable while the [`crate::BrokerHandle`] lives elsewhere (and after it shut down).
#[derive(Clone)]
pub struct BrokerObserver {
    ctx: Arc<Context>,
    /// Each listener's name and bound address, in configuration order.
    listeners: Arc<[(String, SocketAddr)]>,
}

impl std::fmt::Debug for BrokerObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerObserver")
            .field("listeners", &self.listeners)
            .finish()
    }
}

impl BrokerObserver {
    pub(crate) fn new(ctx: Arc<Context>, listeners: &[(String, SocketAddr)]) -> Self {
        BrokerObserver {
            ctx,
            listeners: listeners.into(),
        }
    }

    /// Everything the broker reports, now. Takes each partition's, the group coordinator's
    /// and the transaction coordinator's lock briefly; never touches the disk.
    pub fn stats(&self) -> BrokerStats {
        let partitions = self.partitions();
        let high_watermarks: BTreeMap<(&str, i32), i64> = partitions
            .iter()
            .map(|p| ((p.topic.as_str(), p.partition), p.high_watermark))
            .collect();
        let groups = self.groups(&high_watermarks);
        BrokerStats {
            topics: self.topics(),
            requests: self.requests(),
            connections: self.connections(),
            groups,
            transactions: self.transactions(),
            partitions,
            queued_request_bytes: self.ctx.limits.queued_request_bytes(),
            limits_reached: crate::limits::Held::ALL
                .iter()
                .map(|held| LimitReached {
                    limit: held.setting().to_owned(),
                    count: self.ctx.limits.reached.get(*held),
                })
                .collect(),
        }
    }

    /// A Prometheus collector of the same numbers, read at every scrape (see
    /// [`BrokerCollector`] for the metric names).
    pub fn collector(&self) -> BrokerCollector {
        BrokerCollector::new(self.clone())
    }

    /// Registers [`BrokerObserver::collector`] in `registry`.
    pub fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register_collector(Box::new(self.collector()));
    }

    fn sorted_topics(&self) -> Vec<Arc<crate::topics::Topic>> {
        let mut topics = self.ctx.topics.all();
        topics.sort_by(|a, b| a.name.cmp(&b.name));
        topics
    }

    fn partitions(&self) -> Vec<PartitionStats> {
        let mut out = Vec::new();
        for topic in self.sorted_topics() {
            for p in &topic.partitions {
                let log = p.log();
                let (damaged_ranges, damaged_bytes) = log.damage_summary();
                out.push(PartitionStats {
                    topic: topic.name.clone(),
                    partition: p.index,
                    log_start_offset: log.log_start_offset(),
                    high_watermark: log.log_end_offset(),
                    last_stable_offset: log.last_stable_offset(),
                    size_bytes: log.size_bytes(),
                    segments: log.segment_count(),
                    damaged_ranges,
                    damaged_bytes,
                    cleaner_passes: log.cleaner_stats().passes,
                    cleaner_records_removed: log.cleaner_stats().records_removed,
                    cleaner_checkpoint: log.cleaner_stats().checkpoint,
                });
            }
        }
        out
    }

    fn topics(&self) -> Vec<TopicStats> {
        self.sorted_topics()
            .iter()
            .map(|t| TopicStats {
                topic: t.name.clone(),
                bytes_in: t.counters.bytes_in.load(Relaxed),
                bytes_out: t.counters.bytes_out.load(Relaxed),
                records_in: t.counters.records_in.load(Relaxed),
                records_out: t.counters.records_out.load(Relaxed),
            })
            .collect()
    }

    fn requests(&self) -> Vec<ApiStats> {
        self.ctx
            .stats
            .requests
            .all()
            .iter()
            .map(|api| {
                let (buckets, sum_micros) = api.latency();
                let count = buckets.iter().sum();
                ApiStats {
                    api: format!("{:?}", api.key),
                    requests: api.requests.load(Relaxed),
                    errors: api
                        .errors()
                        .into_iter()
                        .map(|(code, count)| ErrorCount {
                            code,
                            error: counters::error_name(code),
                            count,
                        })
                        .collect(),
                    latency: LatencyHistogram {
                        buckets: buckets
                            .iter()
                            .enumerate()
                            .map(|(i, count)| LatencyBucket {
                                le_ms: counters::LATENCY_BUCKETS_MS.get(i).copied(),
                                count: *count,
                            })
                            .collect(),
                        count,
                        sum_ms: sum_micros as f64 / 1000.0,
                    },
                }
            })
            .collect()
    }

    fn connections(&self) -> Vec<ListenerStats> {
        self.ctx
            .stats
            .listeners
            .iter()
            .map(|l| {
                // Closed is read first: it never passes accepted then.
                let closed = l.closed.load(Relaxed);
                let accepted = l.accepted.load(Relaxed);
                let address = self
                    .listeners
                    .iter()
                    .find(|(name, _)| *name == l.name)
                    .map(|(_, addr)| *addr)
                    .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
                ListenerStats {
                    listener: l.name.clone(),
                    address,
                    open: accepted.saturating_sub(closed),
                    accepted,
                    closed,
                    refused: l.refused.load(Relaxed),
                    malformed: l.malformed.load(Relaxed),
                    receive_timeouts: l.receive_timeouts.load(Relaxed),
                    unauthenticated_too_large: l.unauthenticated_too_large.load(Relaxed),
                    handshake_timeouts: l.handshake_timeouts.load(Relaxed),
                    authentication_timeouts: l.authentication_timeouts.load(Relaxed),
                }
            })
            .collect()
    }

    fn groups(&self, high_watermarks: &BTreeMap<(&str, i32), i64>) -> Vec<GroupStats> {
        let mut committed = self.ctx.topics.catalog().committed_offsets();
        let mut lag_of = |group: &str| -> Vec<PartitionLag> {
            committed
                .remove(group)
                .unwrap_or_default()
                .into_iter()
                .map(|((topic, partition), committed_offset)| {
                    let high_watermark = high_watermarks
                        .get(&(topic.as_str(), partition))
                        .copied()
                        .unwrap_or(committed_offset);
                    PartitionLag {
                        lag: (high_watermark - committed_offset).max(0),
                        topic,
                        partition,
                        committed_offset,
                        high_watermark,
                    }
                })
                .collect()
        };
        let mut out: Vec<GroupStats> = self
            .ctx
            .groups
            .list()
            .into_iter()
            .map(|(group, protocol_type, state)| {
                let description = self.ctx.groups.describe(&group);
                let consumer = protocol_type == "consumer";
                let mut members: Vec<MemberStats> = description
                    .as_ref()
                    .map(|d| d.members.as_slice())
                    .unwrap_or_default()
                    .iter()
                    .map(|m| MemberStats {
                        member_id: m.member_id.clone(),
                        client_id: m.client_id.clone(),
                        client_host: m.client_host.clone(),
                        assignment: if consumer {
                            assigned_partitions(&m.assignment)
                        } else {
                            Vec::new()
                        },
                    })
                    .collect();
                members.sort_by(|a, b| a.member_id.cmp(&b.member_id));
                let offsets = lag_of(&group);
                GroupStats {
                    group,
                    state: state.name().to_owned(),
                    protocol_type,
                    protocol: description.map(|d| d.protocol).unwrap_or_default(),
                    members,
                    offsets,
                }
            })
            .collect();
        // Consumer-protocol (KIP-848) groups: their members own partitions by topic id.
        let names: std::collections::HashMap<uuid::Uuid, String> = self
            .ctx
            .topics
            .all()
            .iter()
            .map(|t| (t.id, t.name.clone()))
            .collect();
        for (group, state) in self.ctx.groups.list_consumer() {
            let described = self.ctx.groups.with_consumer_group(&group, |g| {
                let members: Vec<MemberStats> = g
                    .members
                    .values()
                    .map(|m| MemberStats {
                        member_id: m.id.clone(),
                        client_id: m.client_id.clone(),
                        client_host: m.client_host.clone(),
                        assignment: m
                            .assigned
                            .iter()
                            .filter_map(|(id, partition)| {
                                Some(TopicPartition {
                                    topic: names.get(id)?.clone(),
                                    partition: *partition,
                                })
                            })
                            .collect(),
                    })
                    .collect();
                (members, g.assignor().to_owned())
            });
            let (members, assignor) = described.unwrap_or_default();
            let offsets = lag_of(&group);
            out.push(GroupStats {
                group,
                state: state.to_owned(),
                protocol_type: "consumer".to_owned(),
                protocol: assignor,
                members,
                offsets,
            });
        }
        out.sort_by(|a, b| a.group.cmp(&b.group));
        out
    }

    fn transactions(&self) -> Vec<TransactionStats> {
        let now = crate::log::now_ms();
        let open = [
            TxnState::Ongoing,
            TxnState::PrepareCommit,
            TxnState::PrepareAbort,
        ];
        self.ctx
            .txns
            .list(&open, &[], -1, now)
            .into_iter()
            .map(|t| TransactionStats {
                state: t.state.name().to_owned(),
                partitions: t
                    .partitions
                    .into_iter()
                    .map(|(topic, partition)| TopicPartition { topic, partition })
                    .collect(),
                duration_ms: if t.start_ms < 0 {
                    0
                } else {
                    now.saturating_sub(t.start_ms).max(0)
                },
                transactional_id: t.transactional_id,
                producer_id: t.producer_id,
                producer_epoch: t.producer_epoch,
                start_ms: t.start_ms,
                timeout_ms: t.timeout_ms,
            })
            .collect()
    }
}

/// The partitions of a ConsumerProtocolAssignment (a version, then the assignment in that
/// version); none when it does not decode.
fn assigned_partitions(assignment: &[u8]) -> Vec<TopicPartition> {
    let mut buf = bytes::Bytes::copy_from_slice(assignment);
    if buf.remaining() < 2 {
        return Vec::new();
    }
    // Newer versions only add fields at the end: read them as the newest known.
    let version = buf.get_i16().clamp(0, 3);
    let Ok(decoded) = ConsumerProtocolAssignment::decode(&mut buf, version) else {
        return Vec::new();
    };
    let mut partitions: Vec<TopicPartition> = decoded
        .assigned_partitions
        .iter()
        .flat_map(|tp| {
            tp.partitions.iter().map(|p| TopicPartition {
                topic: tp.topic.0.to_string(),
                partition: *p,
            })
        })
        .collect();
    partitions.sort();
    partitions
}
