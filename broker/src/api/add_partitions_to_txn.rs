//! AddPartitionsToTxn: the partitions a transactional producer is about to write to join its
//! transaction (starting one if none is open). Only the client versions (v0-3) are served; v4+
//! is Kafka's broker-to-broker verification batch.

use std::collections::BTreeSet;
use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, ApiKey, RequestHeader,
};
use kafka_protocol::protocol::VersionRange;

use super::{Context, Handler};
use crate::security::{AclOperation, Resource};
use crate::txn::{self, Addition};

pub(super) struct AddPartitionsToTxn;

/// PRODUCER_FENCED is known from v2 on (KIP-588).
const FENCED_FROM: i16 = 2;

impl Handler for AddPartitionsToTxn {
    const KEY: ApiKey = ApiKey::AddPartitionsToTxn;
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 3 };
    const SHAPE: &'static super::shape::Shape = &super::shape::ADD_PARTITIONS_TO_TXN;
    type Request = AddPartitionsToTxnRequest;
    type Response = AddPartitionsToTxnResponse;

    fn error_codes(response: &AddPartitionsToTxnResponse, count: &mut dyn FnMut(i16)) {
        count(response.error_code);
        for txn in &response.results_by_transaction {
            for topic in &txn.topic_results {
                for p in &topic.results_by_partition {
                    count(p.partition_error_code);
                }
            }
        }
    }

    async fn handle(
        ctx: &Arc<Context>,
        header: &RequestHeader,
        request: AddPartitionsToTxnRequest,
    ) -> Option<AddPartitionsToTxnResponse> {
        let version = header.request_api_version;
        let topics = request.v3_and_below_topics;
        // Write on the transactional id, then on each topic.
        let id = Resource::transactional_id(&request.v3_and_below_transactional_id.0);
        let checks = ctx.check_topics(
            ctx.check(AclOperation::Write, id),
            AclOperation::Write,
            topics.iter().map(|t| t.name.0.as_str()),
        );
        let problem = |i: usize, topic: &str, partition: i32| {
            let exists = ctx
                .topics
                .get(topic)
                .is_some_and(|t| t.partition(partition).is_some());
            checks
                .refusal(i)
                .or((!exists).then_some(ResponseError::UnknownTopicOrPartition))
        };
        let all_fine = topics.iter().enumerate().all(|(i, t)| {
            t.partitions
                .iter()
                .all(|p| problem(i, &t.name.0, *p).is_none())
        });
        // As Kafka: with any partition refused or unknown, none is added; the others are not
        // attempted.
        let error_of = |i: usize, topic: &str, partition: i32, outcome: Option<ResponseError>| {
            if all_fine {
                outcome
            } else {
                problem(i, topic, partition).or(Some(ResponseError::OperationNotAttempted))
            }
        };
        let outcome = if all_fine {
            let partitions: BTreeSet<(String, i32)> = topics
                .iter()
                .flat_map(|t| t.partitions.iter().map(|p| (t.name.0.to_string(), *p)))
                .collect();
            ctx.txns
                .add(
                    &ctx.topics,
                    &request.v3_and_below_transactional_id.0,
                    request.v3_and_below_producer_id.0,
                    request.v3_and_below_producer_epoch,
                    Addition::Partitions(&partitions),
                    crate::log::now_ms(),
                )
                .err()
                .map(|e| txn::for_version(e, version, FENCED_FROM))
        } else {
            None
        };
        if let Some(error) = outcome {
            tracing::debug!(transactional_id = %request.v3_and_below_transactional_id.0,
                error = ?error, "AddPartitionsToTxn refused");
        }
        let results = topics
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                let partitions = t
                    .partitions
                    .iter()
                    .map(|p| {
                        let error = error_of(i, &t.name.0, *p, outcome);
                        AddPartitionsToTxnPartitionResult::default()
                            .with_partition_index(*p)
                            .with_partition_error_code(error.map_or(0, |e| e.code()))
                    })
                    .collect();
                AddPartitionsToTxnTopicResult::default()
                    .with_name(t.name)
                    .with_results_by_partition(partitions)
            })
            .collect();
        Some(AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(results))
    }
}
