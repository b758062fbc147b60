//! TxnOffsetCommit: a group's offsets committed in the producer's transaction. They are staged
//! durably and become the group's committed offsets only when the transaction commits.

use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::{
    ApiKey, RequestHeader, TxnOffsetCommitRequest, TxnOffsetCommitResponse,
};
use kafka_protocol::protocol::VersionRange;

use super::{Context, Handler};
use crate::groups::{Committer, OffsetToCommit};
use crate::security::{AclOperation, Resource};
use crate::txn;

pub(super) struct TxnOffsetCommit;

/// Leader epochs are sent from v2 on.
const LEADER_EPOCH_FROM: i16 = 2;

impl TxnOffsetCommit {
    /// The answers for every partition: `whole` for all of them, else one each.
    fn answer(
        request: TxnOffsetCommitRequest,
        whole: Option<ResponseError>,
        each: Vec<Option<ResponseError>>,
    ) -> TxnOffsetCommitResponse {
        let mut each = each.into_iter();
        let topics = request
            .topics
            .into_iter()
            .map(|t| {
                let partitions = t
                    .partitions
                    .iter()
                    .map(|p| {
                        let error = whole.or_else(|| each.next().flatten());
                        TxnOffsetCommitResponsePartition::default()
                            .with_partition_index(p.partition_index)
                            .with_error_code(error.map_or(0, |e| e.code()))
                    })
                    .collect();
                TxnOffsetCommitResponseTopic::default()
                    .with_name(t.name)
                    .with_partitions(partitions)
            })
            .collect();
        TxnOffsetCommitResponse::default().with_topics(topics)
    }
}

impl Handler for TxnOffsetCommit {
    const KEY: ApiKey = ApiKey::TxnOffsetCommit;
    // v5 is transaction version 2 (KIP-890: no AddOffsetsToTxn), not served.
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 4 };
    const SHAPE: &'static super::shape::Shape = &super::shape::TXN_OFFSET_COMMIT;
    type Request = TxnOffsetCommitRequest;
    type Response = TxnOffsetCommitResponse;

    fn error_codes(response: &TxnOffsetCommitResponse, count: &mut dyn FnMut(i16)) {
        for topic in &response.topics {
            for p in &topic.partitions {
                count(p.error_code);
            }
        }
    }

    async fn handle(
        ctx: &Arc<Context>,
        header: &RequestHeader,
        request: TxnOffsetCommitRequest,
    ) -> Option<TxnOffsetCommitResponse> {
        let transactional_id = request.transactional_id.0.to_string();
        let group = request.group_id.0.to_string();
        let (producer_id, epoch) = (request.producer_id.0, request.producer_epoch);
        // A stale epoch is INVALID_PRODUCER_EPOCH in every version, as a partition reports it.
        let refused = |e: ResponseError| {
            tracing::debug!(transactional_id, group, error = ?e, "TxnOffsetCommit refused");
            txn::for_version(e, 0, i16::MAX)
        };
        // Write on the transactional id and Read on the group, as Kafka checks them first.
        let authorized = ctx
            .check(
                AclOperation::Write,
                Resource::transactional_id(&transactional_id),
            )
            .and_then(|()| ctx.check(AclOperation::Read, Resource::group(&group)));
        if let Err(e) = authorized {
            return Some(Self::answer(request, Some(e), Vec::new()));
        }
        let checks = ctx.check_topics(
            Ok(()),
            AclOperation::Read,
            request.topics.iter().map(|t| t.name.0.as_str()),
        );
        // The producer first: a fenced producer is told so before anything about the group.
        if let Err(e) = ctx
            .txns
            .stage_offsets(&transactional_id, producer_id, epoch, &group, &[])
        {
            return Some(Self::answer(request, Some(refused(e)), Vec::new()));
        }
        let with_epoch = header.request_api_version >= LEADER_EPOCH_FROM;
        let offsets = request
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
        // Before v3 there is no member id and the generation defaults to -1: no check.
        let committer = Committer {
            member_id: &request.member_id,
            instance_id: request.group_instance_id.as_deref(),
            generation: request.generation_id,
        };
        let checked = ctx
            .groups
            .check_txn_commit(&ctx.topics, &group, committer, offsets);
        let (answers, rows) = match checked {
            Ok(checked) => checked,
            Err(e) => return Some(Self::answer(request, Some(refused(e)), Vec::new())),
        };
        if let Err(e) = ctx
            .txns
            .stage_offsets(&transactional_id, producer_id, epoch, &group, &rows)
        {
            return Some(Self::answer(request, Some(refused(e)), Vec::new()));
        }
        let counts = request.topics.iter().map(|t| t.partitions.len());
        let answers = checks.merge(counts, answers);
        Some(Self::answer(request, None, answers))
    }
}
