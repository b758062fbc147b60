//! WriteTxnMarkers: writes COMMIT or ABORT markers for a producer on the partitions named.
//! Kafka's coordinators send it to partition leaders; here the coordinator writes its own
//! markers, and this request is what an operator's `kafka-transactions.sh abort` (and
//! `agent transactions abort`) sends to close a hanging transaction. It needs ClusterAction.

use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
};
use kafka_protocol::messages::{
    ApiKey, RequestHeader, WriteTxnMarkersRequest, WriteTxnMarkersResponse,
};
use kafka_protocol::protocol::VersionRange;

use super::{Context, Handler};
use crate::log::{AppendError, ProducerError};
use crate::security::{AclOperation, Resource};

pub(super) struct WriteTxnMarkers;

impl Handler for WriteTxnMarkers {
    const KEY: ApiKey = ApiKey::WriteTxnMarkers;
    const VERSIONS: VersionRange = VersionRange { min: 1, max: 1 };
    const SHAPE: &'static super::shape::Shape = &super::shape::WRITE_TXN_MARKERS;
    type Request = WriteTxnMarkersRequest;
    type Response = WriteTxnMarkersResponse;

    fn error_codes(response: &WriteTxnMarkersResponse, count: &mut dyn FnMut(i16)) {
        for marker in &response.markers {
            for topic in &marker.topics {
                for p in &topic.partitions {
                    count(p.error_code);
                }
            }
        }
    }

    async fn handle(
        ctx: &Arc<Context>,
        _header: &RequestHeader,
        request: WriteTxnMarkersRequest,
    ) -> Option<WriteTxnMarkersResponse> {
        let allowed = ctx.check(AclOperation::ClusterAction, Resource::cluster());
        let mut appended = false;
        let markers = request
            .markers
            .into_iter()
            .map(|marker| {
                let topics = marker
                    .topics
                    .into_iter()
                    .map(|asked| {
                        let topic = ctx.topics.get(&asked.name);
                        let partitions = asked
                            .partition_indexes
                            .iter()
                            .map(|&index| {
                                let written = allowed.and_then(|()| {
                                    let partition = topic
                                        .as_ref()
                                        .and_then(|t| t.partition(index))
                                        .ok_or(ResponseError::UnknownTopicOrPartition)?;
                                    let result = partition.log().append_marker(
                                        marker.producer_id.0,
                                        marker.producer_epoch,
                                        marker.transaction_result,
                                        marker.coordinator_epoch,
                                    );
                                    match result {
                                        Ok(offset) => {
                                            tracing::info!(topic = %asked.name.0, partition = index,
                                                producer_id = marker.producer_id.0,
                                                epoch = marker.producer_epoch,
                                                commit = marker.transaction_result, offset,
                                                "wrote a transaction marker on request");
                                            appended = true;
                                            Ok(())
                                        }
                                        Err(AppendError::Producer(
                                            ProducerError::InvalidProducerEpoch { .. },
                                        )) => Err(ResponseError::InvalidProducerEpoch),
                                        Err(AppendError::Producer(_)) => {
                                            Err(ResponseError::InvalidTxnState)
                                        }
                                        Err(AppendError::Storage(e)) => {
                                            tracing::error!(topic = %asked.name.0, partition = index,
                                                error = %e, "cannot write a transaction marker");
                                            Err(ResponseError::KafkaStorageError)
                                        }
                                    }
                                });
                                WritableTxnMarkerPartitionResult::default()
                                    .with_partition_index(index)
                                    .with_error_code(written.err().map_or(0, |e| e.code()))
                            })
                            .collect();
                        WritableTxnMarkerTopicResult::default()
                            .with_name(asked.name)
                            .with_partitions(partitions)
                    })
                    .collect();
                WritableTxnMarkerResult::default()
                    .with_producer_id(marker.producer_id)
                    .with_topics(topics)
            })
            .collect();
        if appended {
            ctx.appended.notify_waiters();
        }
        Some(WriteTxnMarkersResponse::default().with_markers(markers))
    }
}
