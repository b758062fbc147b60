//! InitProducerId: a producer id and epoch for an idempotent producer (a fresh id each time)
//! or a transactional one (its transactional id's, with the epoch bumped; see [`crate::txn`]).

use std::sync::Arc;

use kafka_protocol::messages::{
    ApiKey, InitProducerIdRequest, InitProducerIdResponse, ProducerId, RequestHeader,
};
use kafka_protocol::protocol::VersionRange;

use super::{Context, Handler};
use crate::security::{AclOperation, Resource};
use crate::txn::{self, NO_PRODUCER_EPOCH, NO_PRODUCER_ID};

pub(super) struct InitProducerId;

/// PRODUCER_FENCED is known from v4 on (KIP-588).
const FENCED_FROM: i16 = 4;
/// The current producer id and epoch are sent from v3 on (KIP-360).
const EXPECTED_FROM: i16 = 3;

impl Handler for InitProducerId {
    const KEY: ApiKey = ApiKey::InitProducerId;
    // v6 is KIP-939's (two-phase commit), not served.
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 5 };
    const SHAPE: &'static super::shape::Shape = &super::shape::INIT_PRODUCER_ID;
    type Request = InitProducerIdRequest;
    type Response = InitProducerIdResponse;

    fn error_codes(response: &InitProducerIdResponse, count: &mut dyn FnMut(i16)) {
        count(response.error_code);
    }

    async fn handle(
        ctx: &Arc<Context>,
        header: &RequestHeader,
        request: InitProducerIdRequest,
    ) -> Option<InitProducerIdResponse> {
        let version = header.request_api_version;
        let failed = |error| {
            InitProducerIdResponse::default()
                .with_error_code(txn::for_version(error, version, FENCED_FROM).code())
                .with_producer_id(ProducerId(NO_PRODUCER_ID))
                .with_producer_epoch(NO_PRODUCER_EPOCH)
        };
        let expected = match (request.producer_id.0, request.producer_epoch) {
            _ if version < EXPECTED_FROM => None,
            (NO_PRODUCER_ID, NO_PRODUCER_EPOCH) => None,
            (NO_PRODUCER_ID, _) | (_, NO_PRODUCER_EPOCH) => {
                return Some(failed(kafka_protocol::ResponseError::InvalidRequest));
            }
            (id, epoch) => Some((id, epoch)),
        };
        let transactional_id = request.transactional_id.as_ref().map(|t| t.0.as_str());
        let authorized = match transactional_id {
            Some(id) => ctx.check(AclOperation::Write, Resource::transactional_id(id)),
            None => ctx.check_idempotent_write(),
        };
        if let Err(e) = authorized {
            return Some(failed(e));
        }
        let result = ctx.txns.init_producer_id(
            &ctx.topics,
            transactional_id,
            request.transaction_timeout_ms,
            expected,
            crate::log::now_ms(),
        );
        // Fencing an open transaction writes markers.
        if transactional_id.is_some() {
            ctx.appended.notify_waiters();
        }
        Some(match result {
            Ok((id, epoch)) => InitProducerIdResponse::default()
                .with_producer_id(ProducerId(id))
                .with_producer_epoch(epoch),
            Err(error) => {
                tracing::debug!(transactional_id, error = ?error, "InitProducerId refused");
                failed(error)
            }
        })
    }
}
