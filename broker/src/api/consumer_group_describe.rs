//! ConsumerGroupDescribe (KIP-848): a consumer-protocol group's epochs, assignor and members
//! with their current and target assignments.

use std::collections::BTreeSet;
use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::consumer_group_describe_response::{
    Assignment, DescribedGroup, Member, TopicPartitions,
};
use kafka_protocol::messages::{
    ApiKey, ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse, GroupId, RequestHeader,
    TopicName,
};
use kafka_protocol::protocol::VersionRange;

use super::{Context, Handler, text};
use crate::groups::consumer::Tp;
use crate::security::{AclOperation, Resource};

pub(super) struct ConsumerGroupDescribe;

fn assignment(ctx: &Context, tps: &BTreeSet<Tp>) -> Assignment {
    let mut topics: Vec<TopicPartitions> = Vec::new();
    for (id, p) in tps {
        match topics.last_mut() {
            Some(t) if t.topic_id == *id => t.partitions.push(*p),
            _ => {
                let name = ctx.topics.get_by_id(*id).map(|t| t.name.clone());
                topics.push(
                    TopicPartitions::default()
                        .with_topic_id(*id)
                        .with_topic_name(TopicName(text(&name.unwrap_or_default())))
                        .with_partitions(vec![*p]),
                );
            }
        }
    }
    Assignment::default().with_topic_partitions(topics)
}

impl Handler for ConsumerGroupDescribe {
    const KEY: ApiKey = ApiKey::ConsumerGroupDescribe;
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 1 };
    const SHAPE: &'static super::shape::Shape = &super::shape::CONSUMER_GROUP_DESCRIBE;
    type Request = ConsumerGroupDescribeRequest;
    type Response = ConsumerGroupDescribeResponse;

    fn error_codes(response: &ConsumerGroupDescribeResponse, count: &mut dyn FnMut(i16)) {
        for g in &response.groups {
            count(g.error_code);
        }
    }

    async fn handle(
        ctx: &Arc<Context>,
        _: &RequestHeader,
        request: ConsumerGroupDescribeRequest,
    ) -> Option<ConsumerGroupDescribeResponse> {
        let groups = request
            .group_ids
            .iter()
            .map(|id| {
                let out = DescribedGroup::default().with_group_id(GroupId(text(&id.0)));
                if let Err(e) = ctx.check(AclOperation::Describe, Resource::group(&id.0)) {
                    return out
                        .with_error_code(e.code())
                        .with_error_message(Some(text(&super::denial_message(e))));
                }
                let described = ctx.groups.with_consumer_group(&id.0, |g| {
                    let members = g
                        .members
                        .values()
                        .map(|m| {
                            let target = g.target.get(&m.id).cloned().unwrap_or_default();
                            Member::default()
                                .with_member_id(text(&m.id))
                                .with_instance_id(m.instance_id.as_deref().map(text))
                                .with_rack_id(m.rack_id.as_deref().map(text))
                                .with_member_epoch(m.epoch)
                                .with_client_id(text(&m.client_id))
                                .with_client_host(text(&m.client_host))
                                .with_subscribed_topic_names(
                                    m.subscribed.iter().map(|t| TopicName(text(t))).collect(),
                                )
                                .with_assignment(assignment(ctx, &m.assigned))
                                .with_target_assignment(assignment(ctx, &target))
                        })
                        .collect();
                    out.clone()
                        .with_group_state(text(g.state_name()))
                        .with_group_epoch(g.epoch)
                        .with_assignment_epoch(g.target_epoch)
                        .with_assignor_name(text(g.assignor()))
                        .with_members(members)
                });
                described.unwrap_or_else(|| {
                    let e = ResponseError::GroupIdNotFound;
                    out.with_error_code(e.code())
                        .with_error_message(Some(text(&format!(
                            "group {} is not a consumer-protocol group",
                            id.0.as_str()
                        ))))
                })
            })
            .collect();
        Some(ConsumerGroupDescribeResponse::default().with_groups(groups))
    }
}
