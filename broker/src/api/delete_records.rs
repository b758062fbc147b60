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
