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
use crate::security::{AclOperation, Resource};
use crate::topics::Topic;

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

    fn error_codes(response: &MetadataResponse, count: &mut dyn FnMut(i16)) {
        for topic in &response.topics {
            count(topic.error_code);
            for p in &topic.partitions {
                count(p.error_code);
            }
        }
    }

    async fn handle(
        ctx: &Arc<Context>,
        header: &RequestHeader,
        request: MetadataRequest,
    ) -> Option<MetadataResponse> {
        // Before v4 there is no flag and Kafka auto-creates.
        let allow_create = request.allow_auto_topic_creation || header.request_api_version < 4;
        let described = |topic: Arc<Topic>| {
            if ctx.authorize(AclOperation::Describe, Resource::topic(&topic.name)) {
                describe_topic(ctx, &topic)
            } else {
                failed_topic(None, ResponseError::TopicAuthorizationFailed).with_topic_id(topic.id)
            }
        };
        let topics = match request.topics {
            // v0 uses an empty list for "all topics"; later versions use null. Topics the
            // caller may not describe are left out.
            Some(list) if !(list.is_empty() && header.request_api_version == 0) => list
                .into_iter()
                .map(|wanted| match &wanted.name {
                    Some(name) => ctx
                        .check(AclOperation::Describe, Resource::topic(name))
                        .and_then(|()| ctx.topic_or_create(name, allow_create))
                        .map_or_else(
                            |e| failed_topic(wanted.name.clone(), e),
                            |topic| describe_topic(ctx, &topic),
                        ),
                    None => match ctx.topics.get_by_id(wanted.topic_id) {
                        Some(topic) => described(topic),
                        None => failed_topic(None, ResponseError::UnknownTopicId)
                            .with_topic_id(wanted.topic_id),
                    },
                })
                .collect(),
            _ => ctx
                .topics
                .all()
                .iter()
                .filter(|t| ctx.authorize(AclOperation::Describe, Resource::topic(&t.name)))
                .map(|t| describe_topic(ctx, t))
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
