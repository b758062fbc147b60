//! ConsumerGroupHeartbeat (KIP-848): joins, keeps alive, reconciles and leaves a member of a
//! consumer-protocol group; the state machine is in [`crate::groups::consumer`].

use std::collections::BTreeSet;
use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::consumer_group_heartbeat_response::{Assignment, TopicPartitions};
use kafka_protocol::messages::{
    ApiKey, ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse, RequestHeader,
};
use kafka_protocol::protocol::VersionRange;

use super::{Context, Handler, text};
use crate::groups::consumer::Heartbeat;
use crate::security::{AclOperation, Resource};

pub(super) struct ConsumerGroupHeartbeat;

fn refused(e: ResponseError, message: &str) -> ConsumerGroupHeartbeatResponse {
    ConsumerGroupHeartbeatResponse::default()
        .with_error_code(e.code())
        .with_error_message(Some(text(message)))
}

impl Handler for ConsumerGroupHeartbeat {
    const KEY: ApiKey = ApiKey::ConsumerGroupHeartbeat;
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 1 };
    const SHAPE: &'static super::shape::Shape = &super::shape::CONSUMER_GROUP_HEARTBEAT;
    type Request = ConsumerGroupHeartbeatRequest;
    type Response = ConsumerGroupHeartbeatResponse;

    fn error_codes(response: &ConsumerGroupHeartbeatResponse, count: &mut dyn FnMut(i16)) {
        count(response.error_code);
    }

    async fn handle(
        ctx: &Arc<Context>,
        header: &RequestHeader,
        request: ConsumerGroupHeartbeatRequest,
    ) -> Option<ConsumerGroupHeartbeatResponse> {
        let group = request.group_id.0.to_string();
        if let Err(e) = ctx.check(AclOperation::Read, Resource::group(&group)) {
            return Some(refused(e, &super::denial_message(e)));
        }
        if let Some(regex) = request
            .subscribed_topic_regex
            .as_deref()
            .filter(|r| !r.is_empty())
        {
            return Some(refused(
                ResponseError::InvalidRegularExpression,
                &format!(
                    "SubscribedTopicRegex {regex:?}: this broker subscribes consumer groups by \
                     topic name only"
                ),
            ));
        }
        let subscribed: Option<Vec<String>> = request
            .subscribed_topic_names
            .as_ref()
            .map(|names| names.iter().map(|n| n.0.to_string()).collect());
        if let Some(names) = &subscribed
            && let Some(denied) = names
                .iter()
                .find(|n| !ctx.authorize(AclOperation::Describe, Resource::topic(n)))
        {
            let e = ResponseError::TopicAuthorizationFailed;
            return Some(refused(
                e,
                &format!("topic {denied}: {}", super::denial_message(e)),
            ));
        }
        let owned = request.topic_partitions.as_ref().map(|tps| {
            tps.iter()
                .flat_map(|t| t.partitions.iter().map(move |p| (t.topic_id, *p)))
                .collect::<BTreeSet<_>>()
        });
        let hb = Heartbeat {
            member_id: request.member_id.to_string(),
            member_epoch: request.member_epoch,
            instance_id: request.instance_id.as_deref().map(str::to_owned),
            rack_id: request.rack_id.as_deref().map(str::to_owned),
            rebalance_timeout_ms: request.rebalance_timeout_ms,
            subscribed,
            assignor: request
                .server_assignor
                .as_deref()
                .filter(|a| !a.is_empty())
                .map(str::to_owned),
            owned,
            client_id: header.client_id.as_deref().unwrap_or_default().to_owned(),
            client_host: super::client_host(),
        };
        let reply = ctx.groups.consumer_heartbeat(&ctx.topics, &group, hb);
        let mut response = ConsumerGroupHeartbeatResponse::default()
            .with_member_id(Some(text(&reply.member_id)))
            .with_member_epoch(reply.member_epoch)
            .with_heartbeat_interval_ms(ctx.groups.consumer_heartbeat_interval());
        if let Some((e, message)) = reply.error {
            response = response
                .with_error_code(e.code())
                .with_error_message(Some(text(&message)));
        }
        if let Some(assigned) = reply.assignment {
            let mut topics: Vec<TopicPartitions> = Vec::new();
            for (id, p) in assigned {
                match topics.last_mut() {
                    Some(t) if t.topic_id == id => t.partitions.push(p),
                    _ => topics.push(
                        TopicPartitions::default()
                            .with_topic_id(id)
                            .with_partitions(vec![p]),
                    ),
                }
            }
            response =
                response.with_assignment(Some(Assignment::default().with_topic_partitions(topics)));
        }
        Some(response)
    }
}
