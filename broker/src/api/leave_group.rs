//! LeaveGroup: one member (v0-v2) or several, possibly by static instance id (v3+).

use std::sync::Arc;

use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::{ApiKey, LeaveGroupRequest, LeaveGroupResponse, RequestHeader};
use kafka_protocol::protocol::VersionRange;

use super::{Context, Handler};
use crate::security::{AclOperation, Resource};

pub(super) struct LeaveGroup;

/// From v3 on members leave in batches.
const BATCH_FROM: i16 = 3;

impl Handler for LeaveGroup {
    const KEY: ApiKey = ApiKey::LeaveGroup;
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 5 };
    const SHAPE: &'static super::shape::Shape = &super::shape::LEAVE_GROUP;
    type Request = LeaveGroupRequest;
    type Response = LeaveGroupResponse;

    fn error_codes(response: &LeaveGroupResponse, count: &mut dyn FnMut(i16)) {
        count(response.error_code);
        for member in &response.members {
            count(member.error_code);
        }
    }

    async fn handle(
        ctx: &Arc<Context>,
        header: &RequestHeader,
        request: LeaveGroupRequest,
    ) -> Option<LeaveGroupResponse> {
        if let Err(e) = ctx.check(AclOperation::Read, Resource::group(&request.group_id.0)) {
            return Some(LeaveGroupResponse::default().with_error_code(e.code()));
        }
        if header.request_api_version < BATCH_FROM {
            let leaving = [(request.member_id.to_string(), None)];
            let error = ctx
                .groups
                .leave(&request.group_id.0, &leaving)
                .into_iter()
                .next()
                .flatten();
            return Some(
                LeaveGroupResponse::default().with_error_code(error.map_or(0, |e| e.code())),
            );
        }
        let leaving: Vec<_> = request
            .members
            .iter()
            .map(|m| {
                (
                    m.member_id.to_string(),
                    m.group_instance_id.as_ref().map(|i| i.to_string()),
                )
            })
            .collect();
        let errors = ctx.groups.leave(&request.group_id.0, &leaving);
        let members = request
            .members
            .into_iter()
            .zip(errors)
            .map(|(m, error)| {
                MemberResponse::default()
                    .with_member_id(m.member_id)
                    .with_group_instance_id(m.group_instance_id)
                    .with_error_code(error.map_or(0, |e| e.code()))
            })
            .collect();
        Some(LeaveGroupResponse::default().with_members(members))
    }
}
