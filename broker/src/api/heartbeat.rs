//! Heartbeat: keeps a member's session alive and tells it when a rebalance is due
//! (REBALANCE_IN_PROGRESS).

use std::sync::Arc;

use kafka_protocol::messages::{ApiKey, HeartbeatRequest, HeartbeatResponse, RequestHeader};
use kafka_protocol::protocol::VersionRange;

use super::{Context, Handler};
use crate::security::{AclOperation, Resource};

pub(super) struct Heartbeat;

impl Handler for Heartbeat {
    const KEY: ApiKey = ApiKey::Heartbeat;
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 4 };
    const SHAPE: &'static super::shape::Shape = &super::shape::HEARTBEAT;
    type Request = HeartbeatRequest;
    type Response = HeartbeatResponse;

    fn error_codes(response: &HeartbeatResponse, count: &mut dyn FnMut(i16)) {
        count(response.error_code);
    }

    async fn handle(
        ctx: &Arc<Context>,
        _: &RequestHeader,
        request: HeartbeatRequest,
    ) -> Option<HeartbeatResponse> {
        let group = &request.group_id.0;
        let error = ctx
            .check(AclOperation::Read, Resource::group(group))
            .err()
            .or_else(|| {
                ctx.groups.heartbeat(
                    group,
                    &request.member_id,
                    request.group_instance_id.as_deref(),
                    request.generation_id,
                )
            });
        Some(HeartbeatResponse::default().with_error_code(error.map_or(0, |e| e.code())))
    }
}
