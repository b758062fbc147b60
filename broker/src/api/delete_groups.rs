//! DeleteGroups: removes empty groups and their committed offsets.

use std::sync::Arc;

use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::{ApiKey, DeleteGroupsRequest, DeleteGroupsResponse, RequestHeader};
use kafka_protocol::protocol::VersionRange;

use super::{Context, Handler};
use crate::security::{AclOperation, Resource};

pub(super) struct DeleteGroups;

impl Handler for DeleteGroups {
    const KEY: ApiKey = ApiKey::DeleteGroups;
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 2 };
    const SHAPE: &'static super::shape::Shape = &super::shape::DELETE_GROUPS;
    type Request = DeleteGroupsRequest;
    type Response = DeleteGroupsResponse;

    async fn handle(
        ctx: &Arc<Context>,
        _: &RequestHeader,
        request: DeleteGroupsRequest,
    ) -> Option<DeleteGroupsResponse> {
        let results = request
            .groups_names
            .into_iter()
            .map(|id| {
                let error = ctx
                    .check(AclOperation::Delete, Resource::group(&id.0))
                    .err()
                    .or_else(|| ctx.groups.delete_group(&id.0));
                DeletableGroupResult::default()
                    .with_group_id(id)
                    .with_error_code(error.map_or(0, |e| e.code()))
            })
            .collect();
        Some(DeleteGroupsResponse::default().with_results(results))
    }
}
