//! DescribeProducers: the idempotent and transactional producers each partition knows, with
//! their epoch, last sequence and open transaction (`kafka-transactions.sh describe-producers`,
//! and `find-hanging` to spot a transaction open too long).

use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::describe_producers_response::{
    PartitionResponse, ProducerState, TopicResponse,
};
use kafka_protocol::messages::{
    ApiKey, DescribeProducersRequest, DescribeProducersResponse, ProducerId, RequestHeader,
};
use kafka_protocol::protocol::VersionRange;

use super::{Context, Handler, text};
use crate::security::{AclOperation, Resource};

pub(super) struct DescribeProducers;

impl Handler for DescribeProducers {
    const KEY: ApiKey = ApiKey::DescribeProducers;
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 0 };
    const SHAPE: &'static super::shape::Shape = &super::shape::DESCRIBE_PRODUCERS;
    type Request = DescribeProducersRequest;
    type Response = DescribeProducersResponse;

    fn error_codes(response: &DescribeProducersResponse, count: &mut dyn FnMut(i16)) {
        for topic in &response.topics {
            for p in &topic.partitions {
                count(p.error_code);
            }
        }
    }

    async fn handle(
        ctx: &Arc<Context>,
        _header: &RequestHeader,
        request: DescribeProducersRequest,
    ) -> Option<DescribeProducersResponse> {
        let topics = request
            .topics
            .into_iter()
            .map(|asked| {
                // Kafka asks Read on the topic; a topic the client may not see is unknown.
                let topic = ctx
                    .check(AclOperation::Read, Resource::topic(&asked.name))
                    .and_then(|()| {
                        ctx.topics
                            .get(&asked.name)
                            .ok_or(ResponseError::UnknownTopicOrPartition)
                    });
                let partitions = asked
                    .partition_indexes
                    .iter()
                    .map(|&index| {
                        let answer = PartitionResponse::default().with_partition_index(index);
                        let partition = match &topic {
                            Ok(topic) => topic
                                .partition(index)
                                .ok_or(ResponseError::UnknownTopicOrPartition),
                            Err(e) => Err(*e),
                        };
                        match partition {
                            Err(e) => {
                                answer
                                    .with_error_code(e.code())
                                    .with_error_message(Some(text(&format!(
                                        "{}-{index}: {e}",
                                        asked.name.0
                                    ))))
                            }
                            Ok(partition) => answer.with_active_producers(
                                partition
                                    .log()
                                    .active_producers()
                                    .into_iter()
                                    .map(|p| {
                                        ProducerState::default()
                                            .with_producer_id(ProducerId(p.producer_id))
                                            .with_producer_epoch(i32::from(p.epoch))
                                            .with_last_sequence(p.last_sequence)
                                            .with_last_timestamp(p.last_timestamp)
                                            .with_coordinator_epoch(p.coordinator_epoch)
                                            .with_current_txn_start_offset(p.txn_start_offset)
                                    })
                                    .collect(),
                            ),
                        }
                    })
                    .collect();
                TopicResponse::default()
                    .with_name(asked.name)
                    .with_partitions(partitions)
            })
            .collect();
        Some(DescribeProducersResponse::default().with_topics(topics))
    }
}
