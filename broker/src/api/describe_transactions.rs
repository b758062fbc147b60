//! DescribeTransactions: the coordinator's state of transactional ids (`kafka-transactions.sh
//! describe`).

use std::collections::BTreeMap;
use std::sync::Arc;

use kafka_protocol::messages::describe_transactions_response::{TopicData, TransactionState};
use kafka_protocol::messages::{
    ApiKey, DescribeTransactionsRequest, DescribeTransactionsResponse, ProducerId, RequestHeader,
    TopicName,
};
use kafka_protocol::protocol::VersionRange;

use super::{Context, Handler, text};
use crate::security::{AclOperation, Resource};

pub(super) struct DescribeTransactions;

impl Handler for DescribeTransactions {
    const KEY: ApiKey = ApiKey::DescribeTransactions;
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 0 };
    const SHAPE: &'static super::shape::Shape = &super::shape::DESCRIBE_TRANSACTIONS;
    type Request = DescribeTransactionsRequest;
    type Response = DescribeTransactionsResponse;

    async fn handle(
        ctx: &Arc<Context>,
        _header: &RequestHeader,
        request: DescribeTransactionsRequest,
    ) -> Option<DescribeTransactionsResponse> {
        let states = request
            .transactional_ids
            .into_iter()
            .map(|id| {
                let answer = TransactionState::default().with_transactional_id(id.clone());
                if let Err(e) = ctx.check(AclOperation::Describe, Resource::transactional_id(&id.0))
                {
                    return answer.with_error_code(e.code());
                }
                match ctx.txns.describe(&id.0) {
                    Ok(d) => {
                        let mut topics: BTreeMap<String, Vec<i32>> = BTreeMap::new();
                        for (topic, partition) in d.partitions {
                            topics.entry(topic).or_default().push(partition);
                        }
                        answer
                            .with_transaction_state(text(d.state.name()))
                            .with_transaction_timeout_ms(d.timeout_ms)
                            .with_transaction_start_time_ms(d.start_ms)
                            .with_producer_id(ProducerId(d.producer_id))
                            .with_producer_epoch(d.producer_epoch)
                            .with_topics(
                                topics
                                    .into_iter()
                                    .map(|(topic, partitions)| {
                                        TopicData::default()
                                            .with_topic(TopicName(text(&topic)))
                                            .with_partitions(partitions)
                                    })
                                    .collect(),
                            )
                    }
                    Err(e) => answer.with_error_code(e.code()),
                }
            })
            .collect();
        Some(DescribeTransactionsResponse::default().with_transaction_states(states))
    }
}
