//! SyncGroup: the second half of a rebalance round; the leader brings the assignment and
//! every member gets its part.

use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::{ApiKey, RequestHeader, SyncGroupRequest, SyncGroupResponse};
use kafka_protocol::protocol::VersionRange;

use super::{Context, Handler, text};
use crate::groups::{SyncOutcome, SyncRequest};
use crate::security::{AclOperation, Resource};

pub(super) struct SyncGroup;

/// v5 names the protocol type and name in request and response.
const PROTOCOL_FROM: i16 = 5;

impl Handler for SyncGroup {
    const KEY: ApiKey = ApiKey::SyncGroup;
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 5 };
    const SHAPE: &'static super::shape::Shape = &super::shape::SYNC_GROUP;
    type Request = SyncGroupRequest;
    type Response = SyncGroupResponse;

    fn error_codes(response: &SyncGroupResponse, count: &mut dyn FnMut(i16)) {
        count(response.error_code);
    }

    async fn handle(
        ctx: &Arc<Context>,
        header: &RequestHeader,
        request: SyncGroupRequest,
    ) -> Option<SyncGroupResponse> {
        let assignments = request
            .assignments
            .into_iter()
            .map(|a| (a.member_id.to_string(), a.assignment))
            .collect();
        let request_view = SyncRequest {
            member_id: &request.member_id,
            instance_id: request.group_instance_id.as_deref(),
            generation: request.generation_id,
            protocol_type: request.protocol_type.as_deref(),
            protocol_name: request.protocol_name.as_deref(),
            assignments,
        };
        let outcome = match ctx.check(AclOperation::Read, Resource::group(&request.group_id.0)) {
            Err(e) => SyncOutcome::error(e),
            Ok(()) => {
                let reply = ctx.groups.sync(&request.group_id.0, request_view);
                ctx.answer(reply, || {
                    SyncOutcome::error(ResponseError::CoordinatorNotAvailable)
                })
                .await
            }
        };
        let mut response = SyncGroupResponse::default()
            .with_error_code(outcome.error.map_or(0, |e| e.code()))
            .with_assignment(outcome.assignment);
        if header.request_api_version >= PROTOCOL_FROM {
            response = response
                .with_protocol_type(outcome.protocol_type.as_deref().map(text))
                .with_protocol_name(outcome.protocol_name.as_deref().map(text));
        }
        Some(response)
    }
}
