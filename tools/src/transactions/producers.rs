//! `describe-producers`, `find-hanging` and `abort` of `agent transactions`: the producer state
//! of partitions (DescribeProducers to each partition's leader) and the transaction markers an
//! operator writes to close a hanging transaction (WriteTxnMarkers), as `kafka-transactions.sh`.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, bail};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::describe_producers_response::ProducerState;
use kafka_protocol::messages::{
    DescribeProducersRequest, MetadataRequest, ProducerId, TopicName, WriteTxnMarkersRequest,
    describe_producers_request, metadata_request, write_txn_markers_request,
};
use kafka_protocol::protocol::StrBytes;

use super::super::wire::{Connection, Security};
use super::error_text;

pub(super) const DESCRIBE_PRODUCERS_HEADER: [&str; 6] = [
    "ProducerId",
    "ProducerEpoch",
    "LatestCoordinatorEpoch",
    "LastSequence",
    "LastTimestamp",
    "CurrentTransactionStartOffset",
];

pub(super) const HANGING_HEADER: [&str; 8] = [
    "Topic",
    "Partition",
    "ProducerId",
    "ProducerEpoch",
    "CoordinatorEpoch",
    "StartOffset",
    "LastTimestamp",
    "Duration(min)",
];

/// The row of one producer, as `describe-producers` prints it.
pub(super) fn describe_row(p: &ProducerState) -> [String; 6] {
    [
        p.producer_id.0.to_string(),
        p.producer_epoch.to_string(),
        p.coordinator_epoch.to_string(),
        p.last_sequence.to_string(),
        p.last_timestamp.to_string(),
        if p.current_txn_start_offset >= 0 {
            p.current_txn_start_offset.to_string()
        } else {
            "None".to_owned()
        },
    ]
}

/// A transaction open on a partition.
pub(super) struct Open {
    topic: String,
    partition: i32,
    producer: ProducerState,
}

/// The row of a hanging transaction, as `find-hanging` prints it.
pub(super) fn hanging_row(h: &Open, now_ms: i64) -> [String; 8] {
    [
        h.topic.clone(),
        h.partition.to_string(),
        h.producer.producer_id.0.to_string(),
        h.producer.producer_epoch.to_string(),
        h.producer.coordinator_epoch.to_string(),
        h.producer.current_txn_start_offset.to_string(),
        h.producer.last_timestamp.to_string(),
        ((now_ms - h.producer.last_timestamp).max(0) / 60_000).to_string(),
    ]
}

/// The producer and epochs of the transaction an abort closes.
pub(super) struct AbortSpec {
    pub(super) producer_id: i64,
    pub(super) producer_epoch: i16,
    pub(super) coordinator_epoch: i32,
}

/// The cluster, as far as these commands need it: its brokers and each partition's leader.
pub(super) struct Cluster {
    first: Connection,
    bootstrap: String,
    security: Security,
    /// Broker id → address.
    brokers: BTreeMap<i32, String>,
}

impl Cluster {
    pub(super) async fn connect(bootstrap: &str, security: &Security) -> anyhow::Result<Cluster> {
        let first = Connection::bootstrap(bootstrap, security).await?;
        Ok(Cluster {
            first,
            bootstrap: bootstrap.to_owned(),
            security: security.clone(),
            brokers: BTreeMap::new(),
        })
    }

    /// Leaders of the partitions of `topics` (every topic when `None`), as (topic, partition,
    /// leader id, replica ids); the topics' existence is checked, none is created.
    async fn partitions(
        &mut self,
        topics: Option<&[String]>,
    ) -> anyhow::Result<Vec<(String, i32, i32, Vec<i32>)>> {
        let version = self.first.version::<MetadataRequest>()?;
        let request = MetadataRequest::default()
            .with_topics(topics.map(|names| {
                names
                    .iter()
                    .map(|n| {
                        metadata_request::MetadataRequestTopic::default()
                            .with_name(Some(TopicName(StrBytes::from_string(n.clone()))))
                    })
                    .collect()
            }))
            .with_allow_auto_topic_creation(false);
        let metadata = self.first.call(version, &request).await?;
        for broker in &metadata.brokers {
            self.brokers
                .insert(broker.node_id.0, format!("{}:{}", broker.host, broker.port));
        }
        let mut out = Vec::new();
        for topic in metadata.topics {
            let name = topic.name.map(|n| n.0.to_string()).unwrap_or_default();
            if let Some(e) = ResponseError::try_from_code(topic.error_code) {
                bail!("topic `{name}`: {}", error_text(e, None));
            }
            for p in topic.partitions {
                let replicas = p.replica_nodes.iter().map(|r| r.0).collect();
                out.push((name.clone(), p.partition_index, p.leader_id.0, replicas));
            }
        }
        Ok(out)
    }

    /// A connection to broker `id`.
    async fn broker(&self, id: i32) -> anyhow::Result<Connection> {
        let address = self
            .brokers
            .get(&id)
            .with_context(|| format!("broker {id} is not in the cluster's metadata"))?;
        self.first.open_another(address).await
    }

    /// DescribeProducers for `partitions` of one broker.
    async fn producers_on(
        &self,
        broker: i32,
        partitions: &[(String, i32)],
    ) -> anyhow::Result<Vec<(String, i32, anyhow::Result<Vec<ProducerState>>)>> {
        let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
        for (topic, p) in partitions {
            by_topic.entry(topic).or_default().push(*p);
        }
        let request = DescribeProducersRequest::default().with_topics(
            by_topic
                .into_iter()
                .map(|(topic, indexes)| {
                    describe_producers_request::TopicRequest::default()
                        .with_name(TopicName(StrBytes::from_string(topic.to_owned())))
                        .with_partition_indexes(indexes)
                })
                .collect(),
        );
        let mut connection = self.broker(broker).await?;
        let version = connection.version::<DescribeProducersRequest>()?;
        let response = connection.call(version, &request).await?;
        let mut out = Vec::new();
        for topic in response.topics {
            for p in topic.partitions {
                let result = match ResponseError::try_from_code(p.error_code) {
                    None => Ok(p.active_producers),
                    Some(e) => Err(anyhow::anyhow!(
                        "{}",
                        error_text(e, p.error_message.as_deref())
                    )),
                };
                out.push((topic.name.0.to_string(), p.partition_index, result));
            }
        }
        Ok(out)
    }

    /// The producers of one partition, from `broker_id` or else its leader.
    pub(super) async fn describe_producers(
        &mut self,
        topic: &str,
        partition: i32,
        broker_id: Option<i32>,
    ) -> anyhow::Result<Vec<ProducerState>> {
        let failed = |on: &str| {
            format!("Failed to describe producers for partition {topic}-{partition} on {on}")
        };
        let partitions = self
            .partitions(Some(&[topic.to_owned()]))
            .await
            .with_context(|| failed("leader"))?;
        let leader = partitions
            .iter()
            .find(|(_, p, ..)| *p == partition)
            .map(|(_, _, leader, _)| *leader)
            .with_context(|| format!("{}: no such partition", failed("leader")))?;
        let (broker, on) = match broker_id {
            Some(id) => (id, format!("broker {id}")),
            None => (leader, "leader".to_owned()),
        };
        let answers = self
            .producers_on(broker, &[(topic.to_owned(), partition)])
            .await
            .with_context(|| failed(&on))?;
        let (_, _, result) = answers
            .into_iter()
            .find(|(t, p, _)| t == topic && *p == partition)
            .with_context(|| format!("{}: no answer for it", failed(&on)))?;
        result.with_context(|| failed(&on))
    }

    /// Transactions open on partitions longer than `max_ms` whose transactional id the
    /// coordinators do not know, or whose coordinator does not count the partition in it.
    pub(super) async fn find_hanging(
        &mut self,
        broker_id: Option<i32>,
        topic: Option<&str>,
        partition: Option<i32>,
        max_ms: i64,
        now_ms: i64,
    ) -> anyhow::Result<Vec<Open>> {
        let topics = topic.map(|t| vec![t.to_owned()]);
        let partitions = self.partitions(topics.as_deref()).await?;
        // Each partition is asked of its leader, or of `broker_id` where it holds a replica.
        let mut by_broker: BTreeMap<i32, Vec<(String, i32)>> = BTreeMap::new();
        for (t, p, leader, replicas) in partitions {
            if partition.is_some_and(|want| want != p) {
                continue;
            }
            let ask = match broker_id {
                Some(id) if replicas.contains(&id) || leader == id => id,
                Some(_) => continue,
                None => leader,
            };
            by_broker.entry(ask).or_default().push((t, p));
        }
        let mut candidates = Vec::new();
        for (broker, partitions) in by_broker {
            for (topic, partition, result) in self.producers_on(broker, &partitions).await? {
                let producers = result.with_context(|| {
                    format!("failed to describe producers of {topic}-{partition}")
                })?;
                for producer in producers {
                    if producer.current_txn_start_offset >= 0
                        && now_ms - producer.last_timestamp > max_ms
                    {
                        candidates.push(Open {
                            topic: topic.clone(),
                            partition,
                            producer,
                        });
                    }
                }
            }
        }
        if candidates.is_empty() {
            return Ok(candidates);
        }
        // The coordinators' transactions of those producers.
        let ids: BTreeSet<i64> = candidates
            .iter()
            .map(|c| c.producer.producer_id.0)
            .collect();
        let listed = super::list(&self.bootstrap, &self.security).await?;
        let mut transactional_ids: BTreeMap<i64, String> = BTreeMap::new();
        for [id, _, producer_id, _] in listed {
            if let Ok(pid) = producer_id.parse::<i64>()
                && ids.contains(&pid)
            {
                transactional_ids.insert(pid, id);
            }
        }
        let mut hanging = Vec::new();
        for open in candidates {
            let Some(id) = transactional_ids.get(&open.producer.producer_id.0) else {
                hanging.push(open);
                continue;
            };
            match super::describe_state(&self.bootstrap, &self.security, id).await {
                Ok((_, state)) => {
                    let counted = state.topics.iter().any(|t| {
                        t.topic.0.as_str() == open.topic && t.partitions.contains(&open.partition)
                    });
                    if !counted {
                        hanging.push(open);
                    }
                }
                Err(_) => hanging.push(open),
            }
        }
        Ok(hanging)
    }

    /// The producer whose open transaction on the partition starts at `start_offset`.
    pub(super) async fn abort_spec(
        &mut self,
        topic: &str,
        partition: i32,
        start_offset: i64,
    ) -> anyhow::Result<AbortSpec> {
        let producers = self
            .describe_producers(topic, partition, None)
            .await
            .with_context(|| {
                format!("Failed to validate producer state for partition {topic}-{partition}")
            })?;
        let producer = producers
            .iter()
            .find(|p| p.current_txn_start_offset == start_offset)
            .with_context(|| {
                format!(
                    "Could not find any open transactions starting at offset {start_offset} on \
                     partition {topic}-{partition}"
                )
            })?;
        Ok(AbortSpec {
            producer_id: producer.producer_id.0,
            producer_epoch: i16::try_from(producer.producer_epoch)
                .context("the producer's epoch is out of range")?,
            coordinator_epoch: producer.coordinator_epoch.max(0),
        })
    }

    /// Writes an ABORT marker for the spec's producer on the partition, at its leader.
    pub(super) async fn abort(
        &mut self,
        topic: &str,
        partition: i32,
        spec: &AbortSpec,
    ) -> anyhow::Result<()> {
        let what = || {
            format!(
                "Failed to abort transaction of producer {} (epoch {}) on {topic}-{partition}",
                spec.producer_id, spec.producer_epoch
            )
        };
        let partitions = self
            .partitions(Some(&[topic.to_owned()]))
            .await
            .with_context(what)?;
        let leader = partitions
            .iter()
            .find(|(_, p, ..)| *p == partition)
            .map(|(_, _, leader, _)| *leader)
            .with_context(|| format!("{}: no such partition", what()))?;
        let mut connection = self.broker(leader).await.with_context(what)?;
        let version = connection
            .version::<WriteTxnMarkersRequest>()
            .with_context(what)?;
        let request = WriteTxnMarkersRequest::default().with_markers(vec![
            write_txn_markers_request::WritableTxnMarker::default()
                .with_producer_id(ProducerId(spec.producer_id))
                .with_producer_epoch(spec.producer_epoch)
                .with_transaction_result(false)
                .with_coordinator_epoch(spec.coordinator_epoch)
                .with_topics(vec![
                    write_txn_markers_request::WritableTxnMarkerTopic::default()
                        .with_name(TopicName(StrBytes::from_string(topic.to_owned())))
                        .with_partition_indexes(vec![partition]),
                ]),
        ]);
        let response = connection
            .call(version, &request)
            .await
            .with_context(what)?;
        for marker in response.markers {
            for t in marker.topics {
                for p in t.partitions {
                    if let Some(e) = ResponseError::try_from_code(p.error_code) {
                        bail!("{}: {}", what(), error_text(e, None));
                    }
                }
            }
        }
        Ok(())
    }
}
