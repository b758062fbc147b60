//! Metadata: the broker, the cluster and the requested topics (auto-creating them when allowed).

use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{
    ApiKey, BrokerId, MetadataRequest, MetadataResponse, RequestHeader, TopicName,
};
use kafka_protocol::protocol::{StrBytes, VersionRange};

use super::{Context, Handler};
use crate::topics::{Topic, TopicError};

pub(super) struct Metadata;

/// The metadata entry of an existing topic.
pub(super) fn describe_topic(ctx: &Context, topic: &Topic) -> MetadataResponseTopic {
    let node = BrokerId(ctx.node_id);
    let partitions = topic
        .partitions
        .iter()
        .map(|p| {
            MetadataResponsePartition::default()
                .with_partition_index(p.index)
                .with_leader_id(node)
                .with_leader_epoch(0)
                .with_replica_nodes(vec![node])
                .with_isr_nodes(vec![node])
        })
        .collect();
    MetadataResponseTopic::default()
        .with_name(Some(TopicName(StrBytes::from_string(topic.name.clone()))))
        .with_topic_id(topic.id)
        .with_partitions(partitions)
}

fn failed_topic(name: Option<TopicName>, error: ResponseError) -> MetadataResponseTopic {
    MetadataResponseTopic::default()
        .with_name(name)
        .with_error_code(error.code())
}

impl Handler for Metadata {
    const KEY: ApiKey = ApiKey::Metadata;
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 12 };
    const SHAPE: &'static super::shape::Shape = &super::shape::METADATA;
    type Request = MetadataRequest;
    type Response = MetadataResponse;

    async fn handle(
        ctx: &Arc<Context>,
        header: &RequestHeader,
        request: MetadataRequest,
    ) -> Option<MetadataResponse> {
        // Before v4 there is no flag and Kafka auto-creates.
        let allow_create = request.allow_auto_topic_creation || header.request_api_version < 4;
        let topics = match request.topics {
            // v0 uses an empty list for "all topics"; later versions use null.
            None => ctx.topics.all().iter().map(|t| describe_topic(ctx, t)).collect(),
            Some(list) if list.is_empty() && header.request_api_version == 0 => {
                ctx.topics.all().iter().map(|t| describe_topic(ctx, t)).collect()
            }
            Some(list) => list
                .into_iter()
                .map(|wanted| match &wanted.name {
                    Some(name) => match ctx.topics.get_or_create(name, allow_create) {
                        Ok(topic) => describe_topic(ctx, &topic),
                        Err(e) => {
                            if !matches!(e, TopicError::Unknown(_)) {
                                tracing::debug!(topic = %name.0, error = %e, "metadata for topic failed");
                            }
                            failed_topic(wanted.name.clone(), e.response_error())
                        }
                    },
                    None => match ctx.topics.get_by_id(wanted.topic_id) {
                        Some(topic) => describe_topic(ctx, &topic),
                        None => failed_topic(None, ResponseError::UnknownTopicId).with_topic_id(wanted.topic_id),
                    },
                })
                .collect(),
        };
        let (host, port) = ctx.advertised();
        let broker = MetadataResponseBroker::default()
            .with_node_id(BrokerId(ctx.node_id))
            .with_host(host)
            .with_port(port);
        Some(
            MetadataResponse::default()
                .with_brokers(vec![broker])
                .with_cluster_id(Some(ctx.cluster_id()))
                .with_controller_id(BrokerId(ctx.node_id))
                .with_topics(topics),
        )
    }
}
