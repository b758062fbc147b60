//! ListTransactions: the transactional ids this coordinator knows, filtered by state, producer
//! id and (v1) how long their transaction has been open (`kafka-transactions.sh list`, `find-hanging`).

use std::sync::Arc;

use kafka_protocol::messages::list_transactions_response::TransactionState;
use kafka_protocol::messages::{
    ApiKey, ListTransactionsRequest, ListTransactionsResponse, ProducerId, RequestHeader,
    TransactionalId,
};
use kafka_protocol::protocol::VersionRange;

use super::{Context, Handler, text};
use crate::security::{AclOperation, Resource};
use crate::txn::TxnState;

pub(super) struct ListTransactions;

impl Handler for ListTransactions {
    const KEY: ApiKey = ApiKey::ListTransactions;
    // v2 filters by a Java regular expression, not served.
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 1 };
    const SHAPE: &'static super::shape::Shape = &super::shape::LIST_TRANSACTIONS;
    type Request = ListTransactionsRequest;
    type Response = ListTransactionsResponse;

    async fn handle(
        ctx: &Arc<Context>,
        _header: &RequestHeader,
        request: ListTransactionsRequest,
    ) -> Option<ListTransactionsResponse> {
        let mut states = Vec::new();
        let mut unknown = Vec::new();
        for name in request.state_filters {
            match TxnState::from_name(&name) {
                Some(state) => states.push(state),
                None => unknown.push(name),
            }
        }
        // Only unknown states asked for: nothing matches.
        let listed = if states.is_empty() && !unknown.is_empty() {
            Vec::new()
        } else {
            let producer_ids: Vec<i64> = request.producer_id_filters.iter().map(|p| p.0).collect();
            ctx.txns.list(
                &states,
                &producer_ids,
                request.duration_filter,
                crate::log::now_ms(),
            )
        };
        let listed = listed
            .into_iter()
            .filter(|d| {
                ctx.authorize(
                    AclOperation::Describe,
                    Resource::transactional_id(&d.transactional_id),
                )
            })
            .map(|d| {
                TransactionState::default()
                    .with_transactional_id(TransactionalId(text(&d.transactional_id)))
                    .with_producer_id(ProducerId(d.producer_id))
                    .with_transaction_state(text(d.state.name()))
            })
            .collect();
        Some(
            ListTransactionsResponse::default()
                .with_unknown_state_filters(unknown)
                .with_transaction_states(listed),
        )
    }
}
