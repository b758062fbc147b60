//! DescribeGroups: state, protocol and members (with their assignments) of each group asked.

use std::sync::Arc;

use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::{
    ApiKey, DescribeGroupsRequest, DescribeGroupsResponse, RequestHeader,
};
use kafka_protocol::protocol::VersionRange;

use super::{Context, Handler, text};
use crate::groups::GroupState;
use crate::security::{AclOperation, Resource};

pub(super) struct DescribeGroups;

/// Kafka's "operations not asked for" value of authorized_operations.
const OPERATIONS_OMITTED: i32 = i32::MIN;

impl Handler for DescribeGroups {
    const KEY: ApiKey = ApiKey::DescribeGroups;
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 5 };
    const SHAPE: &'static super::shape::Shape = &super::shape::DESCRIBE_GROUPS;
    type Request = DescribeGroupsRequest;
    type Response = DescribeGroupsResponse;

    async fn handle(
        ctx: &Arc<Context>,
        header: &RequestHeader,
        request: DescribeGroupsRequest,
    ) -> Option<DescribeGroupsResponse> {
        let version = header.request_api_version;
        let groups = request
            .groups
            .into_iter()
            .map(|id| {
                let mut described = DescribedGroup::default().with_group_id(id.clone());
                if version >= 3 {
                    described = described.with_authorized_operations(OPERATIONS_OMITTED);
                }
                if let Err(e) = ctx.check(AclOperation::Describe, Resource::group(&id.0)) {
                    return described.with_error_code(e.code());
                }
                // An unknown group is described as Dead without an error, as Kafka does.
                let Some(group) = ctx.groups.describe(&id.0) else {
                    return described.with_group_state(text(GroupState::Dead.name()));
                };
                let members = group
                    .members
                    .into_iter()
                    .map(|m| {
                        let mut member = DescribedGroupMember::default()
                            .with_member_id(text(&m.member_id))
                            .with_client_id(text(&m.client_id))
                            .with_client_host(text(&m.client_host))
                            .with_member_metadata(m.metadata)
                            .with_member_assignment(m.assignment);
                        if version >= 4 {
                            member =
                                member.with_group_instance_id(m.instance_id.as_deref().map(text));
                        }
                        member
                    })
                    .collect();
                described
                    .with_group_state(text(group.state.name()))
                    .with_protocol_type(text(&group.protocol_type))
                    .with_protocol_data(text(&group.protocol))
                    .with_members(members)
            })
            .collect();
        Some(DescribeGroupsResponse::default().with_groups(groups))
    }
}
