//! Fetch: whole batches straight from the segment files, with long polling.
//!
//! A fetch waits until `min_bytes` are available or `max_wait_ms` passed, woken by every append.
//! Each partition returns whole batches from the one containing the fetch offset, up to
//! `partition_max_bytes` and the request's `max_bytes`, except that the first batch of the
//! response is always returned whole so a consumer makes progress past a large batch (KIP-74).
//! Fetch sessions (KIP-227) are not kept: session id 0 tells clients to send full requests.

use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::fetch_request::FetchTopic;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{ApiKey, FetchRequest, FetchResponse, RequestHeader, TopicName};
use kafka_protocol::protocol::{StrBytes, VersionRange};
use tokio::time::Instant;

use super::{Context, Handler};
use crate::log::Read;

pub(super) struct Fetch;

/// Versions from 13 on name topics by id.
const TOPIC_IDS_FROM: i16 = 13;

fn collect(
    ctx: &Context,
    version: i16,
    topics: &[FetchTopic],
    max_bytes: usize,
) -> (Vec<FetchableTopicResponse>, usize, bool) {
    let mut remaining = max_bytes;
    let mut total = 0usize;
    let mut any_error = false;
    let mut out = Vec::with_capacity(topics.len());
    for wanted in topics {
        let topic = if version >= TOPIC_IDS_FROM {
            ctx.topics.get_by_id(wanted.topic_id)
        } else {
            ctx.topics.get(&wanted.topic)
        };
        let missing_error = if version >= TOPIC_IDS_FROM {
            ResponseError::UnknownTopicId
        } else {
            ResponseError::UnknownTopicOrPartition
        };
        let partitions = wanted
            .partitions
            .iter()
            .map(|p| {
                let data = PartitionData::default().with_partition_index(p.partition);
                let Some(partition) = topic.as_ref().and_then(|t| t.partition(p.partition)) else {
                    any_error = true;
                    return data.with_error_code(missing_error.code()).with_high_watermark(-1);
                };
                // Only locate the bytes under the lock; read them after releasing it.
                let (start, end, read) = {
                    let log = partition.log();
                    let limit = usize::try_from(p.partition_max_bytes).unwrap_or(0).min(remaining);
                    // Only the response's first batch may exceed the limits (KIP-74).
                    let read = if limit == 0 && total > 0 {
                        Ok(Some(Read::Empty))
                    } else {
                        log.read(p.fetch_offset, limit, total == 0)
                    };
                    (log.log_start_offset(), log.log_end_offset(), read)
                };
                let data = data
                    .with_high_watermark(end)
                    .with_last_stable_offset(end)
                    .with_log_start_offset(start);
                match read.and_then(|r| r.map(|r| r.bytes()).transpose()) {
                    Ok(Some(records)) => {
                        total += records.len();
                        remaining = remaining.saturating_sub(records.len());
                        data.with_records(Some(records))
                    }
                    Ok(None) => {
                        any_error = true;
                        data.with_error_code(ResponseError::OffsetOutOfRange.code())
                    }
                    Err(e) => {
                        tracing::error!(topic = ?topic.as_ref().map(|t| &t.name), partition = p.partition, error = %e, "fetch read failed");
                        any_error = true;
                        data.with_error_code(ResponseError::KafkaStorageError.code())
                    }
                }
            })
            .collect();
        let name = topic.as_ref().map_or_else(
            || wanted.topic.clone(),
            |t| TopicName(StrBytes::from_string(t.name.clone())),
        );
        out.push(
            FetchableTopicResponse::default()
                .with_topic(name)
                .with_topic_id(wanted.topic_id)
                .with_partitions(partitions),
        );
    }
    (out, total, any_error)
}

impl Handler for Fetch {
    const KEY: ApiKey = ApiKey::Fetch;
    const VERSIONS: VersionRange = VersionRange { min: 4, max: 16 };
    const SHAPE: &'static super::shape::Shape = &super::shape::FETCH;
    type Request = FetchRequest;
    type Response = FetchResponse;

    async fn handle(
        ctx: &Arc<Context>,
        header: &RequestHeader,
        request: FetchRequest,
    ) -> Option<FetchResponse> {
        let version = header.request_api_version;
        let max_bytes = usize::try_from(request.max_bytes).unwrap_or(0);
        let min_bytes = usize::try_from(request.min_bytes).unwrap_or(0);
        let deadline =
            Instant::now() + Duration::from_millis(u64::try_from(request.max_wait_ms).unwrap_or(0));
        loop {
            // Register for the wake-up before looking, so an append in between is not missed.
            let appended = ctx.appended.notified();
            tokio::pin!(appended);
            appended.as_mut().enable();
            let (responses, total, any_error) = collect(ctx, version, &request.topics, max_bytes);
            if total >= min_bytes
                || any_error
                || Instant::now() >= deadline
                || ctx.shutdown.is_cancelled()
            {
                return Some(FetchResponse::default().with_responses(responses));
            }
            tokio::select! {
                _ = &mut appended => {}
                _ = tokio::time::sleep_until(deadline) => {}
                _ = ctx.shutdown.cancelled() => {}
            }
        }
    }
}
