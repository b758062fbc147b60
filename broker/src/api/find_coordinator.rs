//! FindCoordinator: this broker coordinates every consumer group and every transactional id;
//! other key types (KIP-932 share groups) get INVALID_REQUEST, as Kafka answers an unknown one.
//!
//! Besides being the first step of the group protocol, librdkafka only enables LZ4 compression
//! against brokers that advertise this API.

use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{
    ApiKey, BrokerId, FindCoordinatorRequest, FindCoordinatorResponse, RequestHeader,
};
use kafka_protocol::protocol::{StrBytes, VersionRange};

use super::{Context, Handler};
use crate::security::{AclOperation, Resource};

pub(super) struct FindCoordinator;

/// Versions from 4 on look up several keys at once.
const BATCHED_FROM: i16 = 4;
const GROUP: i8 = 0;
const TRANSACTION: i8 = 1;

fn coordinator(ctx: &Context, key: StrBytes, key_type: i8) -> Coordinator {
    let checked = match key_type {
        GROUP => ctx.check(AclOperation::Describe, Resource::group(&key)),
        TRANSACTION => ctx.check(AclOperation::Describe, Resource::transactional_id(&key)),
        _ => Err(ResponseError::InvalidRequest),
    };
    let found = Coordinator::default().with_key(key);
    match checked {
        Ok(()) => {
            let (host, port) = ctx.advertised();
            found
                .with_node_id(BrokerId(ctx.node_id))
                .with_host(host)
                .with_port(port)
        }
        Err(error) => found
            .with_node_id(BrokerId(-1))
            .with_port(-1)
            .with_error_code(error.code())
            .with_error_message(
                (error == ResponseError::InvalidRequest)
                    .then(|| StrBytes::from_static_str("unsupported coordinator key type")),
            ),
    }
}

impl Handler for FindCoordinator {
    const KEY: ApiKey = ApiKey::FindCoordinator;
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 4 };
    const SHAPE: &'static super::shape::Shape = &super::shape::FIND_COORDINATOR;
    type Request = FindCoordinatorRequest;
    type Response = FindCoordinatorResponse;

    fn error_codes(response: &FindCoordinatorResponse, count: &mut dyn FnMut(i16)) {
        count(response.error_code);
        for coordinator in &response.coordinators {
            count(coordinator.error_code);
        }
    }

    async fn handle(
        ctx: &Arc<Context>,
        header: &RequestHeader,
        request: FindCoordinatorRequest,
    ) -> Option<FindCoordinatorResponse> {
        if header.request_api_version >= BATCHED_FROM {
            let coordinators = request
                .coordinator_keys
                .into_iter()
                .map(|key| coordinator(ctx, key, request.key_type))
                .collect();
            return Some(FindCoordinatorResponse::default().with_coordinators(coordinators));
        }
        let found = coordinator(ctx, request.key, request.key_type);
        Some(
            FindCoordinatorResponse::default()
                .with_error_code(found.error_code)
                .with_error_message(found.error_message)
                .with_node_id(found.node_id)
                .with_host(found.host)
                .with_port(found.port),
        )
    }
}
