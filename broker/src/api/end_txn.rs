//! EndTxn: commits or aborts the producer's transaction; answered once the markers are written
//! and the transaction's offsets applied (or, after a storage error, once the outcome is
//! durable).

use std::sync::Arc;

use kafka_protocol::messages::{ApiKey, EndTxnRequest, EndTxnResponse, RequestHeader};
use kafka_protocol::protocol::VersionRange;

use super::{Context, Handler};
use crate::security::{AclOperation, Resource};
use crate::txn;

pub(super) struct EndTxn;

/// PRODUCER_FENCED is known from v2 on (KIP-588).
const FENCED_FROM: i16 = 2;

impl Handler for EndTxn {
    const KEY: ApiKey = ApiKey::EndTxn;
    // v5 is transaction version 2 (KIP-890: an epoch bump per transaction), not served.
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 4 };
    const SHAPE: &'static super::shape::Shape = &super::shape::END_TXN;
    type Request = EndTxnRequest;
    type Response = EndTxnResponse;

    fn error_codes(response: &EndTxnResponse, count: &mut dyn FnMut(i16)) {
        count(response.error_code);
    }

    async fn handle(
        ctx: &Arc<Context>,
        header: &RequestHeader,
        request: EndTxnRequest,
    ) -> Option<EndTxnResponse> {
        let id = Resource::transactional_id(&request.transactional_id.0);
        if let Err(e) = ctx.check(AclOperation::Write, id) {
            return Some(EndTxnResponse::default().with_error_code(e.code()));
        }
        let result = ctx.txns.end(
            &ctx.topics,
            &request.transactional_id.0,
            request.producer_id.0,
            request.producer_epoch,
            request.committed,
            crate::log::now_ms(),
        );
        ctx.appended.notify_waiters();
        let error = result.err().map(|e| {
            tracing::debug!(transactional_id = %request.transactional_id.0,
                commit = request.committed, error = ?e, "EndTxn refused");
            txn::for_version(e, header.request_api_version, FENCED_FROM)
        });
        Some(EndTxnResponse::default().with_error_code(error.map_or(0, |e| e.code())))
    }
}
