//! ListOffsets: earliest (-2), latest (-1), or the first offset at or after a timestamp. At
//! isolation level READ_COMMITTED (v2+) latest is the last stable offset, and a timestamp
//! lookup does not find records past it.

use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{ApiKey, ListOffsetsRequest, ListOffsetsResponse, RequestHeader};
use kafka_protocol::protocol::VersionRange;

use super::{Context, Handler};
use crate::security::{AclOperation, Resource};

pub(super) struct ListOffsets;

const LATEST: i64 = -1;
const EARLIEST: i64 = -2;
/// v7 (KIP-734): the record with the largest timestamp, and that timestamp.
const MAX_TIMESTAMP: i64 = -3;

impl Handler for ListOffsets {
    const KEY: ApiKey = ApiKey::ListOffsets;
    // v8 adds -4 (the local log start of tiered storage), which has no meaning here.
    const VERSIONS: VersionRange = VersionRange { min: 1, max: 7 };
    const SHAPE: &'static super::shape::Shape = &super::shape::LIST_OFFSETS;
    type Request = ListOffsetsRequest;
    type Response = ListOffsetsResponse;

    fn error_codes(response: &ListOffsetsResponse, count: &mut dyn FnMut(i16)) {
        for topic in &response.topics {
            for p in &topic.partitions {
                count(p.error_code);
            }
        }
    }

    async fn handle(
        ctx: &Arc<Context>,
        header: &RequestHeader,
        request: ListOffsetsRequest,
    ) -> Option<ListOffsetsResponse> {
        // The leader epoch field exists from v4 on; earlier versions must leave it unset.
        let leader_epoch = if header.request_api_version >= 4 {
            0
        } else {
            -1
        };
        let read_committed = request.isolation_level == 1;
        let topics = request
            .topics
            .into_iter()
            .map(|wanted| {
                let topic = ctx
                    .check(AclOperation::Describe, Resource::topic(&wanted.name))
                    .map(|()| ctx.topics.get(&wanted.name));
                let partitions = wanted
                    .partitions
                    .iter()
                    .map(|p| {
                        let response = ListOffsetsPartitionResponse::default()
                            .with_partition_index(p.partition_index)
                            .with_timestamp(-1)
                            .with_offset(-1);
                        let partition = match &topic {
                            Ok(topic) => {
                                topic.as_ref().and_then(|t| t.partition(p.partition_index))
                            }
                            Err(denied) => return response.with_error_code(denied.code()),
                        };
                        let Some(partition) = partition else {
                            return response
                                .with_error_code(ResponseError::UnknownTopicOrPartition.code());
                        };
                        let log = partition.log();
                        let upper = if read_committed {
                            log.last_stable_offset()
                        } else {
                            log.log_end_offset()
                        };
                        match p.timestamp {
                            LATEST => response.with_offset(upper),
                            EARLIEST => response.with_offset(log.log_start_offset()),
                            MAX_TIMESTAMP if header.request_api_version >= 7 => {
                                match log.max_timestamp() {
                                    Some(max) => lookup(
                                        &log,
                                        max,
                                        upper,
                                        response,
                                        &wanted.name.0,
                                        p.partition_index,
                                    ),
                                    None => response,
                                }
                            }
                            ts if ts < 0 => {
                                response.with_error_code(ResponseError::InvalidRequest.code())
                            }
                            ts => {
                                lookup(&log, ts, upper, response, &wanted.name.0, p.partition_index)
                            }
                        }
                        .with_leader_epoch(leader_epoch)
                    })
                    .collect();
                ListOffsetsTopicResponse::default()
                    .with_name(wanted.name)
                    .with_partitions(partitions)
            })
            .collect();
        Some(ListOffsetsResponse::default().with_topics(topics))
    }
}

/// The first record at or after timestamp `ts` below `upper`, into `response`.
fn lookup(
    log: &crate::log::PartitionLog,
    ts: i64,
    upper: i64,
    response: ListOffsetsPartitionResponse,
    topic: &str,
    partition: i32,
) -> ListOffsetsPartitionResponse {
    match log.offset_for_timestamp(ts) {
        Ok(Some(found)) if found.offset < upper => response
            .with_timestamp(found.timestamp)
            .with_offset(found.offset),
        Ok(_) => response,
        Err(e) => {
            tracing::error!(topic, partition, error = %e, "timestamp lookup failed");
            response.with_error_code(ResponseError::KafkaStorageError.code())
        }
    }
}
