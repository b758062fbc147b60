//! DeleteRecords (v0-v2): moves a partition's log start offset forward, as
//! `kafka-delete-records.sh` and the admin clients' `deleteRecords` ask. Needs Delete on the
//! topic. An offset of -1 means the high watermark; one past it (or another negative one)
//! answers OFFSET_OUT_OF_RANGE; a topic whose `cleanup.policy` is `compact` alone answers
//! POLICY_VIOLATION, as Kafka's does. Each partition answers its new low watermark (the log
//! start offset; -1 with an error). See [`crate::log::PartitionLog::delete_records_before`].

use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::{
    ApiKey, DeleteRecordsRequest, DeleteRecordsResponse, RequestHeader,
};
use kafka_protocol::protocol::VersionRange;

use super::{Context, Handler};
use crate::security::{AclOperation, Resource};
use crate::topics::Partition;

pub(super) struct DeleteRecords;

/// The offset standing for the high watermark.
const HIGH_WATERMARK: i64 = -1;

/// Moves the start of `partition` to `offset`: its new low watermark, or the error.
fn delete_before(
    partition: &Partition,
    name: &str,
    index: i32,
    offset: i64,
) -> Result<i64, ResponseError> {
    let mut log = partition.log();
    let policy = log.config().cleanup_policy;
    if policy.compact && !policy.delete {
        return Err(ResponseError::PolicyViolation);
    }
    let high_watermark = log.log_end_offset();
    let offset = if offset == HIGH_WATERMARK {
        high_watermark
    } else {
        offset
    };
    if !(0..=high_watermark).contains(&offset) {
        return Err(ResponseError::OffsetOutOfRange);
    }
    log.delete_records_before(offset).map_err(|e| {
        tracing::error!(topic = name, partition = index, offset, error = %e, "cannot move the log start offset");
        ResponseError::KafkaStorageError
    })
}

impl Handler for DeleteRecords {
    const KEY: ApiKey = ApiKey::DeleteRecords;
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 2 };
    const SHAPE: &'static super::shape::Shape = &super::shape::DELETE_RECORDS;
    type Request = DeleteRecordsRequest;
    type Response = DeleteRecordsResponse;

    fn error_codes(response: &DeleteRecordsResponse, count: &mut dyn FnMut(i16)) {
        for topic in &response.topics {
            for p in &topic.partitions {
                count(p.error_code);
            }
        }
    }

    async fn handle(
        ctx: &Arc<Context>,
        _: &RequestHeader,
        request: DeleteRecordsRequest,
    ) -> Option<DeleteRecordsResponse> {
        let topics = request
            .topics
            .into_iter()
            .map(|wanted| {
                let name = wanted.name.0.as_str();
                let topic = ctx
                    .check(AclOperation::Delete, Resource::topic(name))
                    .map(|()| ctx.topics.get(name));
                let partitions = wanted
                    .partitions
                    .iter()
                    .map(|p| {
                        let result = DeleteRecordsPartitionResult::default()
                            .with_partition_index(p.partition_index);
                        let moved = match &topic {
                            Err(denied) => Err(*denied),
                            Ok(topic) => {
                                match topic.as_ref().and_then(|t| t.partition(p.partition_index)) {
                                    None => Err(ResponseError::UnknownTopicOrPartition),
                                    Some(partition) => {
                                        delete_before(partition, name, p.partition_index, p.offset)
                                    }
                                }
                            }
                        };
                        match moved {
                            Ok(low_watermark) => result.with_low_watermark(low_watermark),
                            Err(e) => result.with_low_watermark(-1).with_error_code(e.code()),
                        }
                    })
                    .collect();
                DeleteRecordsTopicResult::default()
                    .with_name(wanted.name)
                    .with_partitions(partitions)
            })
            .collect();
        Some(DeleteRecordsResponse::default().with_topics(topics))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;

    use kafka_protocol::messages::TopicName;
    use kafka_protocol::messages::delete_records_request::{
        DeleteRecordsPartition, DeleteRecordsTopic,
    };
    use kafka_protocol::protocol::StrBytes;

    use super::*;
    use crate::log::batch;

    fn request(topic: &str, offsets: &[(i32, i64)]) -> DeleteRecordsRequest {
        DeleteRecordsRequest::default().with_topics(vec![
            DeleteRecordsTopic::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_owned())))
                .with_partitions(
                    offsets
                        .iter()
                        .map(|&(p, o)| {
                            DeleteRecordsPartition::default()
                                .with_partition_index(p)
                                .with_offset(o)
                        })
                        .collect(),
                ),
        ])
    }

    /// Each partition's (error code, low watermark).
    async fn delete(ctx: &Arc<Context>, topic: &str, offsets: &[(i32, i64)]) -> Vec<(i16, i64)> {
        let response =
            DeleteRecords::handle(ctx, &RequestHeader::default(), request(topic, offsets))
                .await
                .unwrap();
        response.topics[0]
            .partitions
            .iter()
            .map(|p| (p.error_code, p.low_watermark))
            .collect()
    }

    fn fill(ctx: &Context, topic: &str, count: i32) {
        let topic = ctx.topics.get(topic).unwrap();
        let mut log = topic.partition(0).unwrap().log();
        let mut bytes = batch::tests::make_batch(0, count, 1000);
        let mut headers = batch::validate_all(&bytes).unwrap();
        log.append(&mut bytes, &mut headers).unwrap();
    }

    #[tokio::test]
    async fn offsets_are_checked_against_the_high_watermark_and_unknown_partitions_named() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = super::super::tests::context(dir.path());
        ctx.topics
            .create("t", 2, 1, BTreeMap::new(), false)
            .unwrap();
        fill(&ctx, "t", 10);
        let oor = ResponseError::OffsetOutOfRange.code();
        let unknown = ResponseError::UnknownTopicOrPartition.code();
        assert_eq!(
            delete(&ctx, "t", &[(0, 11), (0, -2), (2, 1), (-1, 1)]).await,
            [(oor, -1), (oor, -1), (unknown, -1), (unknown, -1)]
        );
        assert_eq!(delete(&ctx, "t", &[(0, 4), (1, 0)]).await, [(0, 4), (0, 0)]);
        // Lower than the start: no change, the start answered.
        assert_eq!(delete(&ctx, "t", &[(0, 2)]).await, [(0, 4)]);
        assert_eq!(delete(&ctx, "t", &[(0, -1)]).await, [(0, 10)]);
        assert_eq!(delete(&ctx, "nope", &[(0, 1)]).await, [(unknown, -1)]);
        let log_start = ctx
            .topics
            .get("t")
            .unwrap()
            .partition(0)
            .unwrap()
            .log()
            .log_start_offset();
        assert_eq!(log_start, 10);
    }

    #[tokio::test]
    async fn a_compacted_topic_refuses_and_compact_delete_accepts() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = super::super::tests::context(dir.path());
        for (name, policy) in [("c", "compact"), ("cd", "compact,delete")] {
            let configs = BTreeMap::from([("cleanup.policy".to_owned(), policy.to_owned())]);
            ctx.topics.create(name, 1, 1, configs, false).unwrap();
        }
        assert_eq!(
            delete(&ctx, "c", &[(0, 0)]).await,
            [(ResponseError::PolicyViolation.code(), -1)]
        );
        assert_eq!(delete(&ctx, "cd", &[(0, 0)]).await, [(0, 0)]);
    }
}
