//! OffsetCommit: a member's (or a standalone consumer's) committed offsets, stored in the
//! catalog before the answer.

use std::sync::Arc;

use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::{ApiKey, OffsetCommitRequest, OffsetCommitResponse, RequestHeader};
use kafka_protocol::protocol::VersionRange;

use super::{Context, Handler};
use crate::groups::{Committer, OffsetToCommit};
use crate::security::{AclOperation, Resource};

pub(super) struct OffsetCommit;

/// Leader epochs are sent from v6 on.
const LEADER_EPOCH_FROM: i16 = 6;

impl Handler for OffsetCommit {
    const KEY: ApiKey = ApiKey::OffsetCommit;
    // v9: the generation is a member epoch in consumer-protocol groups (KIP-848).
    const VERSIONS: VersionRange = VersionRange { min: 2, max: 9 };
    const SHAPE: &'static super::shape::Shape = &super::shape::OFFSET_COMMIT;
    type Request = OffsetCommitRequest;
    type Response = OffsetCommitResponse;

    fn error_codes(response: &OffsetCommitResponse, count: &mut dyn FnMut(i16)) {
        for topic in &response.topics {
            for p in &topic.partitions {
                count(p.error_code);
            }
        }
    }

    async fn handle(
        ctx: &Arc<Context>,
        header: &RequestHeader,
        request: OffsetCommitRequest,
    ) -> Option<OffsetCommitResponse> {
        let with_epoch = header.request_api_version >= LEADER_EPOCH_FROM;
        let group = ctx.check(AclOperation::Read, Resource::group(&request.group_id.0));
        let checks = ctx.check_topics(
            group,
            AclOperation::Read,
            request.topics.iter().map(|t| t.name.0.as_str()),
        );
        let offsets: Vec<_> = request
            .topics
            .iter()
            .enumerate()
            .filter(|(i, _)| checks.allowed(*i))
            .flat_map(|(_, t)| {
                t.partitions.iter().map(|p| OffsetToCommit {
                    topic: t.name.0.to_string(),
                    partition: p.partition_index,
                    offset: p.committed_offset,
                    leader_epoch: if with_epoch {
                        p.committed_leader_epoch
                    } else {
                        -1
                    },
                    metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
                })
            })
            .collect();
        let committer = Committer {
            member_id: &request.member_id,
            instance_id: request.group_instance_id.as_deref(),
            generation: request.generation_id_or_member_epoch,
        };
        // Nothing allowed: the group is not touched.
        let answers = if offsets.is_empty() {
            Vec::new()
        } else {
            ctx.groups
                .commit(&ctx.topics, &request.group_id.0, committer, offsets)
        };
        let counts = request.topics.iter().map(|t| t.partitions.len());
        let mut errors = checks.merge(counts, answers).into_iter();
        let topics = request
            .topics
            .into_iter()
            .map(|t| {
                let partitions = t
                    .partitions
                    .iter()
                    .map(|p| {
                        let error = errors.next().flatten();
                        OffsetCommitResponsePartition::default()
                            .with_partition_index(p.partition_index)
                            .with_error_code(error.map_or(0, |e| e.code()))
                    })
                    .collect();
                OffsetCommitResponseTopic::default()
                    .with_name(t.name)
                    .with_partitions(partitions)
            })
            .collect();
        Some(OffsetCommitResponse::default().with_topics(topics))
    }
}
