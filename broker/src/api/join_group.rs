//! JoinGroup: the first half of a rebalance round (see `groups`).

use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::{ApiKey, JoinGroupRequest, JoinGroupResponse, RequestHeader};
use kafka_protocol::protocol::{StrBytes, VersionRange};

use super::{Context, Handler, client_host, text};
use crate::groups::{JoinOutcome, JoinRequest, Protocol};
use crate::security::{AclOperation, Resource};

pub(super) struct JoinGroup;

/// From v4 on a member without an id is sent one first (KIP-394).
const MEMBER_ID_REQUIRED_FROM: i16 = 4;
/// From v9 on a static leader may be told to keep the assignment (KIP-814).
const SKIP_ASSIGNMENT_FROM: i16 = 9;

fn response(outcome: JoinOutcome, version: i16) -> JoinGroupResponse {
    let members = outcome
        .members
        .into_iter()
        .map(|m| {
            JoinGroupResponseMember::default()
                .with_member_id(text(&m.member_id))
                .with_group_instance_id(if version >= 5 {
                    m.instance_id.as_deref().map(text)
                } else {
                    None
                })
                .with_metadata(m.metadata)
        })
        .collect();
    // Before v7 the protocol name is not nullable.
    let protocol_name = match outcome.protocol_name {
        Some(name) => Some(text(&name)),
        None if version < 7 => Some(StrBytes::default()),
        None => None,
    };
    JoinGroupResponse::default()
        .with_error_code(outcome.error.map_or(0, |e| e.code()))
        .with_generation_id(outcome.generation)
        .with_protocol_type(outcome.protocol_type.as_deref().map(text))
        .with_protocol_name(protocol_name)
        .with_leader(text(&outcome.leader))
        .with_skip_assignment(outcome.skip_assignment && version >= SKIP_ASSIGNMENT_FROM)
        .with_member_id(text(&outcome.member_id))
        .with_members(members)
}

impl Handler for JoinGroup {
    const KEY: ApiKey = ApiKey::JoinGroup;
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 9 };
    const SHAPE: &'static super::shape::Shape = &super::shape::JOIN_GROUP;
    type Request = JoinGroupRequest;
    type Response = JoinGroupResponse;

    fn error_codes(response: &JoinGroupResponse, count: &mut dyn FnMut(i16)) {
        count(response.error_code);
    }

    async fn handle(
        ctx: &Arc<Context>,
        header: &RequestHeader,
        request: JoinGroupRequest,
    ) -> Option<JoinGroupResponse> {
        let version = header.request_api_version;
        let millis = |ms: i32| Duration::from_millis(u64::try_from(ms).unwrap_or(0));
        let member_id = request.member_id.to_string();
        // v0 has no rebalance timeout: the session timeout served as both.
        let rebalance_timeout = if version >= 1 {
            request.rebalance_timeout_ms
        } else {
            request.session_timeout_ms
        };
        let join = JoinRequest {
            member_id: member_id.clone(),
            instance_id: request.group_instance_id.map(|i| i.to_string()),
            client_id: header
                .client_id
                .as_ref()
                .map(|c| c.to_string())
                .unwrap_or_default(),
            client_host: client_host(),
            session_timeout: millis(request.session_timeout_ms),
            rebalance_timeout: millis(rebalance_timeout),
            protocol_type: request.protocol_type.to_string(),
            protocols: request
                .protocols
                .into_iter()
                .map(|p| Protocol {
                    name: p.name.to_string(),
                    metadata: p.metadata,
                })
                .collect(),
            require_known_member_id: version >= MEMBER_ID_REQUIRED_FROM,
            supports_skip_assignment: version >= SKIP_ASSIGNMENT_FROM,
        };
        if let Err(e) = ctx.check(AclOperation::Read, Resource::group(&request.group_id.0)) {
            return Some(response(JoinOutcome::error(e, &member_id), version));
        }
        let reply = ctx.groups.join(&request.group_id.0, join);
        let outcome = ctx
            .answer(reply, || {
                JoinOutcome::error(ResponseError::CoordinatorNotAvailable, &member_id)
            })
            .await;
        Some(response(outcome, version))
    }
}
