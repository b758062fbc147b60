//! OffsetDelete: removes committed offsets of partitions a group no longer subscribes to.

use std::sync::Arc;

use kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use kafka_protocol::messages::{ApiKey, OffsetDeleteRequest, OffsetDeleteResponse, RequestHeader};
use kafka_protocol::protocol::VersionRange;

use super::{Context, Handler};
use crate::security::{AclOperation, Resource};

pub(super) struct OffsetDelete;

impl Handler for OffsetDelete {
    const KEY: ApiKey = ApiKey::OffsetDelete;
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 0 };
    const SHAPE: &'static super::shape::Shape = &super::shape::OFFSET_DELETE;
    type Request = OffsetDeleteRequest;
    type Response = OffsetDeleteResponse;

    async fn handle(
        ctx: &Arc<Context>,
        _: &RequestHeader,
        request: OffsetDeleteRequest,
    ) -> Option<OffsetDeleteResponse> {
        if let Err(e) = ctx.check(AclOperation::Delete, Resource::group(&request.group_id.0)) {
            return Some(OffsetDeleteResponse::default().with_error_code(e.code()));
        }
        let checks = ctx.check_topics(
            Ok(()),
            AclOperation::Read,
            request.topics.iter().map(|t| t.name.0.as_str()),
        );
        let partitions: Vec<(String, i32)> = request
            .topics
            .iter()
            .enumerate()
            .filter(|(i, _)| checks.allowed(*i))
            .flat_map(|(_, t)| {
                t.partitions
                    .iter()
                    .map(|p| (t.name.0.to_string(), p.partition_index))
            })
            .collect();
        let errors = match ctx.groups.delete_offsets(&request.group_id.0, &partitions) {
            Ok(errors) => errors,
            Err(e) => return Some(OffsetDeleteResponse::default().with_error_code(e.code())),
        };
        let counts = request.topics.iter().map(|t| t.partitions.len());
        let mut errors = checks.merge(counts, errors).into_iter();
        let topics = request
            .topics
            .into_iter()
            .map(|t| {
                let partitions = t
                    .partitions
                    .iter()
                    .map(|p| {
                        OffsetDeleteResponsePartition::default()
                            .with_partition_index(p.partition_index)
                            .with_error_code(errors.next().flatten().map_or(0, |e| e.code()))
                    })
                    .collect();
                OffsetDeleteResponseTopic::default()
                    .with_name(t.name)
                    .with_partitions(partitions)
            })
            .collect();
        Some(OffsetDeleteResponse::default().with_topics(topics))
    }
}
