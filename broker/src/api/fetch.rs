//! Fetch: whole batches straight from the segment files, with long polling.
//!
//! A fetch waits until `min_bytes` are available or `max_wait_ms` passed, woken by every append.
//! Each partition returns whole batches from the one containing the fetch offset, up to
//! `partition_max_bytes` and the request's `max_bytes`, except that the first batch of the
//! response is always returned whole so a consumer makes progress past a large batch (KIP-74).
//! Fetch sessions (KIP-227) are not kept: session id 0 tells clients to send full requests.
//! At isolation level READ_COMMITTED a partition is read up to its last stable offset, and the
//! transactions aborted in that range are listed so the consumer drops their records.
//! Offsets whose batches are damaged (see `log::scan`) get CORRUPT_MESSAGE, which clients pass
//! to the application; a read before them stops at them, one after them is served.
//!
//! The records are not copied into the response: each partition's `records` is encoded with a
//! placeholder, which [`FetchReply::into_frame`] then cuts out of the encoded frame, putting
//! the real length prefix in its place and the segment file range after it, for the connection
//! to send straight from the file (see `connection`). Nothing else in the frame depends on the
//! records' length but their own prefix and the frame size, which is corrected too: Kafka's
//! arrays count elements, not bytes, and `records` is not inside a tagged field.
//!
//! ```text
//! encoded:  | size | header | ... | len(P) | P | tags | ... | len(P) | P | tags | ... |
//! sent:     | size'| header | ... | len(R1)| <file range R1> | tags | ... | len(R2)| <R2> | ... |
//! ```
//!
//! The placeholder is 16 random bytes drawn once per process and never sent, so the metadata
//! around it (topic names and ids, partition numbers, offsets) cannot contain it by accident,
//! and a client cannot forge it. It is found in order, and its length prefix is checked.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::fetch_request::FetchTopic;
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, FetchableTopicResponse, PartitionData,
};
use kafka_protocol::messages::{
    ApiKey, FetchRequest, FetchResponse, ProducerId, RequestHeader, TopicName,
};
use kafka_protocol::protocol::{StrBytes, VersionRange};
use tokio::time::Instant;

use super::{ApiError, Context, Frame, Handler, IntoFrame, encode_error, encode_response};
use crate::limits::Held;
use crate::log::{FileSlice, Read, StorageError};
use crate::quotas::Direction;
use crate::security::{AclOperation, Resource};
use crate::stats::TopicCounters;

pub(super) struct Fetch;

/// Versions from 13 on name topics by id.
const TOPIC_IDS_FROM: i16 = 13;
/// Versions from 12 on are flexible: compact (varint) lengths.
const FLEXIBLE_FROM: i16 = 12;

/// Stands in for a partition's records in the encoded response (see the module docs).
static PLACEHOLDER: LazyLock<Bytes> =
    LazyLock::new(|| Bytes::copy_from_slice(uuid::Uuid::new_v4().as_bytes()));

/// A Fetch response whose records are still in the segment files.
pub(super) struct FetchReply {
    response: FetchResponse,
    /// The ranges of the partitions whose `records` hold the placeholder, in response order.
    records: Vec<FileSlice>,
}

fn collect(
    ctx: &Context,
    version: i16,
    read_committed: bool,
    topics: &[FetchTopic],
    max_bytes: usize,
    records: &mut Vec<FileSlice>,
    sent: &mut Vec<(Arc<TopicCounters>, u64, u64)>,
) -> (Vec<FetchableTopicResponse>, usize, bool) {
    let mut remaining = max_bytes;
    let mut total = 0usize;
    let mut any_error = false;
    records.clear();
    sent.clear();
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
        // Named topics are checked whether they exist or not, as Kafka does.
        let name = if version >= TOPIC_IDS_FROM {
            topic.as_ref().map(|t| t.name.as_str())
        } else {
            Some(wanted.topic.0.as_str())
        };
        let denied = name.is_some_and(|n| !ctx.authorize(AclOperation::Read, Resource::topic(n)));
        let (mut bytes_out, mut records_out) = (0u64, 0u64);
        let partitions = wanted
            .partitions
            .iter()
            .map(|p| {
                let data = PartitionData::default().with_partition_index(p.partition);
                let found = topic.as_ref().filter(|_| !denied);
                let Some(partition) = found.and_then(|t| t.partition(p.partition)) else {
                    any_error = true;
                    let error = if denied { ResponseError::TopicAuthorizationFailed } else { missing_error };
                    return data.with_error_code(error.code()).with_high_watermark(-1);
                };
                // Only locate the bytes under the lock; read them after releasing it.
                let (start, end, stable, read, aborted) = {
                    let mut log = partition.log();
                    let limit = usize::try_from(p.partition_max_bytes).unwrap_or(0).min(remaining);
                    let end = log.log_end_offset();
                    let stable = log.last_stable_offset();
                    let upper = if read_committed { stable } else { end };
                    // Only the response's first batch may exceed the limits (KIP-74).
                    let read = if limit == 0 && total > 0 {
                        Ok(Some(Read::Empty))
                    } else {
                        log.read_checked(p.fetch_offset, limit, total == 0, upper)
                    };
                    let aborted = read_committed.then(|| {
                        log.aborted_transactions(p.fetch_offset, upper)
                            .into_iter()
                            .map(|(producer_id, first_offset)| {
                                AbortedTransaction::default()
                                    .with_producer_id(ProducerId(producer_id))
                                    .with_first_offset(first_offset)
                            })
                            .collect::<Vec<_>>()
                    });
                    (log.log_start_offset(), end, stable, read, aborted)
                };
                let data = data
                    .with_high_watermark(end)
                    .with_last_stable_offset(stable)
                    .with_log_start_offset(start)
                    .with_aborted_transactions(aborted);
                match read {
                    Ok(Some(Read::Slice(slice))) if slice.len() > 0 => {
                        total += slice.len();
                        remaining = remaining.saturating_sub(slice.len());
                        bytes_out += slice.len() as u64;
                        records_out += slice.offsets();
                        records.push(slice);
                        data.with_records(Some(PLACEHOLDER.clone()))
                    }
                    Ok(Some(_)) => data.with_records(Some(Bytes::new())),
                    Ok(None) => {
                        any_error = true;
                        data.with_error_code(ResponseError::OffsetOutOfRange.code())
                    }
                    // Damage was reported once, when found: the consumer is told, not the log.
                    Err(e @ StorageError::Damaged { .. }) => {
                        tracing::debug!(topic = ?topic.as_ref().map(|t| &t.name), partition = p.partition, error = %e, "fetch of damaged offsets");
                        any_error = true;
                        data.with_error_code(ResponseError::CorruptMessage.code())
                    }
                    Err(e) => {
                        tracing::error!(topic = ?topic.as_ref().map(|t| &t.name), partition = p.partition, error = %e, "fetch read failed");
                        any_error = true;
                        data.with_error_code(ResponseError::KafkaStorageError.code())
                    }
                }
            })
            .collect();
        if let Some(topic) = topic.as_ref().filter(|_| bytes_out > 0) {
            sent.push((Arc::clone(&topic.counters), bytes_out, records_out));
        }
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
    type Response = FetchReply;

    fn error_codes(response: &FetchReply, count: &mut dyn FnMut(i16)) {
        count(response.response.error_code);
        for topic in &response.response.responses {
            for p in &topic.partitions {
                count(p.error_code);
            }
        }
    }

    async fn handle(
        ctx: &Arc<Context>,
        header: &RequestHeader,
        request: FetchRequest,
    ) -> Option<FetchReply> {
        let version = header.request_api_version;
        let read_committed = request.isolation_level == 1;
        let max_bytes = usize::try_from(request.max_bytes).unwrap_or(0);
        let min_bytes = usize::try_from(request.min_bytes).unwrap_or(0);
        let deadline =
            Instant::now() + Duration::from_millis(u64::try_from(request.max_wait_ms).unwrap_or(0));
        let mut records = Vec::new();
        let mut sent = Vec::new();
        // A fetch that may wait takes a place among those woken by appends; past
        // max_pending_fetches it waits out max_wait_ms unwoken.
        let place = (request.max_wait_ms > 0 && min_bytes > 0).then(|| ctx.limits.pending_fetch());
        let woken = !matches!(place, Some(None));
        let mut counted = false;
        loop {
            // Register for the wake-up before looking, so an append in between is not missed.
            let appended = ctx.appended.notified();
            tokio::pin!(appended);
            if woken {
                appended.as_mut().enable();
            }
            let (responses, total, any_error) = collect(
                ctx,
                version,
                read_committed,
                &request.topics,
                max_bytes,
                &mut records,
                &mut sent,
            );
            if total >= min_bytes
                || any_error
                || Instant::now() >= deadline
                || ctx.shutdown.is_cancelled()
            {
                // Counted when answered: a long poll looks again, and only its last look is sent.
                for (counters, bytes, offsets) in &sent {
                    counters.fetched(*bytes, *offsets);
                }
                let fetched: usize = records.iter().map(|slice| slice.len()).sum();
                let throttle = ctx.throttle(header, Direction::Fetch, fetched as u64);
                // Which client was answered what and when: how a consumer's view of a
                // partition is followed (RUST_LOG=ferry_broker::api::fetch=trace).
                tracing::trace!(
                    client = ?header.client_id,
                    asked = ?request
                        .topics
                        .iter()
                        .flat_map(|t| t.partitions.iter().map(move |p| (&t.topic.0, p.partition, p.fetch_offset)))
                        .collect::<Vec<_>>(),
                    bytes = fetched,
                    "fetch answered"
                );
                return Some(FetchReply {
                    response: FetchResponse::default()
                        .with_responses(responses)
                        .with_throttle_time_ms(throttle),
                    records,
                });
            }
            if woken {
                tokio::select! {
                    _ = &mut appended => {}
                    _ = tokio::time::sleep_until(deadline) => {}
                    _ = ctx.shutdown.cancelled() => {}
                }
                continue;
            }
            if !counted {
                counted = true;
                ctx.limits.reached.count(Held::PendingFetches, || {
                    format!(
                        "a fetch from {:?} waits its max_wait_ms ({} ms) without being woken by \
                         appends: max_pending_fetches fetches already wait",
                        header.client_id, request.max_wait_ms
                    )
                });
            }
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => {}
                _ = ctx.shutdown.cancelled() => {}
            }
        }
    }
}

impl IntoFrame for FetchReply {
    fn into_frame(self, api: ApiKey, version: i16, correlation_id: i32) -> Result<Frame, ApiError> {
        let encoded = encode_response(api, version, correlation_id, &self.response)?;
        if self.records.is_empty() {
            return Ok(Frame::from(encoded));
        }
        let error = |reason: &str| encode_error(api, version)(reason);
        let placeholder: &[u8] = &PLACEHOLDER;
        let mut placeholder_prefix = Vec::with_capacity(5);
        put_length_prefix(&mut placeholder_prefix, placeholder.len(), version);
        let mut bytes = BytesMut::with_capacity(encoded.len() + 4 * self.records.len());
        let mut files = Vec::with_capacity(self.records.len());
        let mut cursor = 0;
        for slice in self.records {
            let at = encoded[cursor..]
                .windows(placeholder.len())
                .position(|w| w == placeholder)
                .map(|i| cursor + i)
                .ok_or_else(|| error("a records placeholder is missing"))?;
            let prefix_at = at
                .checked_sub(placeholder_prefix.len())
                .filter(|p| *p >= cursor && encoded[*p..at] == placeholder_prefix[..])
                .ok_or_else(|| error("a records placeholder has an unexpected length prefix"))?;
            bytes.put_slice(&encoded[cursor..prefix_at]);
            put_length_prefix(&mut bytes, slice.len(), version);
            files.push((bytes.len(), slice));
            cursor = at + placeholder.len();
        }
        bytes.put_slice(&encoded[cursor..]);
        let size = files.iter().map(|(_, slice)| slice.len()).sum::<usize>() + bytes.len() - 4;
        let size = i32::try_from(size).map_err(|_| error("response larger than 2 GiB"))?;
        bytes[..4].copy_from_slice(&size.to_be_bytes());
        Ok(Frame {
            bytes: bytes.freeze(),
            files,
        })
    }
}

/// Writes the length prefix of non-null `records` of `len` bytes: INT32 before the flexible
/// versions, the length plus one as an unsigned varint from them on. (A length past
/// `i32::MAX` makes a frame that is refused whole, so its prefix does not matter.)
fn put_length_prefix(buf: &mut impl BufMut, len: usize, version: i16) {
    if version < FLEXIBLE_FROM {
        buf.put_i32(len as i32);
        return;
    }
    let mut value = len as u64 + 1;
    while value >= 0x80 {
        buf.put_u8(value as u8 | 0x80);
        value >>= 7;
    }
    buf.put_u8(value as u8);
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use kafka_protocol::messages::fetch_request::FetchPartition;
    use kafka_protocol::messages::{ResponseHeader, TopicName};
    use kafka_protocol::protocol::Decodable;

    use super::*;
    use crate::log::batch;

    fn append(ctx: &Context, partition: i32, batches: usize) {
        let topic = ctx.topics.get("x").unwrap();
        let mut bytes: Vec<u8> = (0..batches)
            .flat_map(|_| batch::tests::make_batch(0, 3, 1000))
            .collect();
        let mut headers = batch::validate_all(&bytes).unwrap();
        let mut log = topic.partition(partition).unwrap().log();
        log.append(&mut bytes, &mut headers).unwrap();
    }

    fn wanted(partition: i32, fetch_offset: i64, max_bytes: i32) -> FetchPartition {
        FetchPartition::default()
            .with_partition(partition)
            .with_fetch_offset(fetch_offset)
            .with_partition_max_bytes(max_bytes)
    }

    /// The frame as the connection sends it: the file ranges read into their places.
    fn wire_bytes(frame: &Frame) -> Vec<u8> {
        let mut out = Vec::new();
        let mut written = 0;
        for (at, slice) in &frame.files {
            out.extend_from_slice(&frame.bytes[written..*at]);
            out.extend_from_slice(&slice.read().unwrap());
            written = *at;
        }
        out.extend_from_slice(&frame.bytes[written..]);
        out
    }

    /// The records sent from the files get exactly the length prefixes and frame size a
    /// response encoded with the records in it would have, in every version: the frame decodes
    /// to the same response.
    #[tokio::test]
    async fn responses_with_records_from_files_decode_in_every_version() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = super::super::tests::context(dir.path());
        ctx.topics
            .create("x", 3, 1, BTreeMap::new(), false)
            .unwrap();
        let batch_size = batch::tests::make_batch(0, 3, 1000).len();
        // Large enough for multi-byte varint length prefixes.
        append(&ctx, 0, 400);
        append(&ctx, 2, 5);
        let id = ctx.topics.get("x").unwrap().id;
        for version in Fetch::VERSIONS.min..=Fetch::VERSIONS.max {
            let topics = vec![
                FetchTopic::default()
                    .with_topic(TopicName(StrBytes::from_static_str("x")))
                    .with_topic_id(id)
                    .with_partitions(vec![
                        wanted(0, 4, 1 << 20),
                        // Empty: nothing stored.
                        wanted(1, 0, 1 << 20),
                        // Two and a half batches' worth: two whole batches.
                        wanted(2, 3, (batch_size * 5 / 2) as i32),
                        wanted(7, 0, 1 << 20),
                    ]),
                FetchTopic::default()
                    .with_topic(TopicName(StrBytes::from_static_str("nope")))
                    .with_topic_id(uuid::Uuid::new_v4())
                    .with_partitions(vec![wanted(0, 0, 1 << 20)]),
            ];
            let request = FetchRequest::default()
                .with_max_bytes(1 << 24)
                .with_topics(topics);
            let header = RequestHeader::default()
                .with_request_api_key(ApiKey::Fetch as i16)
                .with_request_api_version(version);
            let reply = Fetch::handle(&ctx, &header, request).await.unwrap();
            assert_eq!(reply.records.len(), 2, "v{version}");
            let frame = reply.into_frame(ApiKey::Fetch, version, 9).unwrap();
            assert_eq!(frame.files.len(), 2);
            let wire = wire_bytes(&frame);
            assert_eq!(
                i32::from_be_bytes(wire[..4].try_into().unwrap()) as usize,
                wire.len() - 4,
                "v{version}"
            );
            let mut buf = Bytes::from(wire).split_off(4);
            let header_version = ApiKey::Fetch.response_header_version(version);
            let header = ResponseHeader::decode(&mut buf, header_version).unwrap();
            assert_eq!(header.correlation_id, 9);
            let response = FetchResponse::decode(&mut buf, version).unwrap();
            assert!(buf.is_empty(), "v{version}: {} bytes left over", buf.len());

            let partitions = &response.responses[0].partitions;
            let records = |i: usize| partitions[i].records.clone().unwrap();
            let topic = ctx.topics.get("x").unwrap();
            let log = topic.partitions[0].log();
            let expected = log
                .read(4, 1 << 20, true, i64::MAX)
                .unwrap()
                .unwrap()
                .bytes()
                .unwrap();
            drop(log);
            assert_eq!(records(0), expected, "v{version}");
            assert_eq!(records(0).len(), 399 * batch_size);
            assert_eq!(batch::validate(&records(0)).unwrap().base_offset, 3);
            assert_eq!(records(1).len(), 0);
            let two = records(2);
            let headers = batch::validate_all(&two).unwrap();
            assert_eq!(headers.len(), 2, "v{version}");
            assert_eq!(headers[0].1.base_offset, 3);
            assert_eq!(partitions[2].high_watermark, 15);
            let missing = if version >= TOPIC_IDS_FROM {
                ResponseError::UnknownTopicId
            } else {
                ResponseError::UnknownTopicOrPartition
            };
            assert_eq!(partitions[3].error_code, missing.code());
            assert_ne!(response.responses[1].partitions[0].error_code, 0);
        }
    }
}
