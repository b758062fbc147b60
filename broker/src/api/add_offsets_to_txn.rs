//! AddOffsetsToTxn: a group's offsets will be committed in the producer's transaction
//! (consume-transform-produce; TxnOffsetCommit follows).

use std::sync::Arc;

use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, ApiKey, RequestHeader,
};
use kafka_protocol::protocol::VersionRange;

use super::{Context, Handler};
use crate::security::{AclOperation, Resource};
use crate::txn::{self, Addition};

pub(super) struct AddOffsetsToTxn;

/// PRODUCER_FENCED is known from v2 on (KIP-588).
const FENCED_FROM: i16 = 2;

impl Handler for AddOffsetsToTxn {
    const KEY: ApiKey = ApiKey::AddOffsetsToTxn;
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 4 };
    const SHAPE: &'static super::shape::Shape = &super::shape::ADD_OFFSETS_TO_TXN;
    type Request = AddOffsetsToTxnRequest;
    type Response = AddOffsetsToTxnResponse;

    fn error_codes(response: &AddOffsetsToTxnResponse, count: &mut dyn FnMut(i16)) {
        count(response.error_code);
    }

    async fn handle(
        ctx: &Arc<Context>,
        header: &RequestHeader,
        request: AddOffsetsToTxnRequest,
    ) -> Option<AddOffsetsToTxnResponse> {
        let authorized = ctx
            .check(
                AclOperation::Write,
                Resource::transactional_id(&request.transactional_id.0),
            )
            .and_then(|()| ctx.check(AclOperation::Read, Resource::group(&request.group_id.0)));
        if let Err(e) = authorized {
            return Some(AddOffsetsToTxnResponse::default().with_error_code(e.code()));
        }
        let result = ctx.txns.add(
            &ctx.topics,
            &request.transactional_id.0,
            request.producer_id.0,
            request.producer_epoch,
            Addition::Group(&request.group_id.0),
            crate::log::now_ms(),
        );
        let error = result.err().map(|e| {
            tracing::debug!(transactional_id = %request.transactional_id.0,
                group = %request.group_id.0, error = ?e, "AddOffsetsToTxn refused");
            txn::for_version(e, header.request_api_version, FENCED_FROM)
        });
        Some(AddOffsetsToTxnResponse::default().with_error_code(error.map_or(0, |e| e.code())))
    }
}
