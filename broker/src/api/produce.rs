//! Produce: validate each batch's framing and CRC, check an idempotent producer's sequence and
//! epoch against the partition's producer state, assign offsets in place, append. A retried
//! batch already in the log is acknowledged with its original offset (see `log::producers`).

use std::sync::Arc;

use bytes::BytesMut;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{ApiKey, ProduceRequest, ProduceResponse, RequestHeader};
use kafka_protocol::protocol::VersionRange;

use super::{Context, Handler};
use crate::log::{AppendError, ProducerError, batch};
use crate::quotas::Direction;
use crate::security::{AclOperation, Resource};
use crate::topics::Topic;

pub(super) struct Produce;

fn append(
    topic: &Topic,
    index: i32,
    records: Option<&[u8]>,
    acks: i16,
    reached: &crate::limits::Reached,
) -> PartitionProduceResponse {
    let response = PartitionProduceResponse::default()
        .with_index(index)
        .with_log_append_time_ms(-1);
    let fail = |error: ResponseError| {
        response
            .clone()
            .with_error_code(error.code())
            .with_base_offset(-1)
    };
    let Some(partition) = topic.partition(index) else {
        return fail(ResponseError::UnknownTopicOrPartition);
    };
    let records = records.unwrap_or_default();
    let mut headers = match batch::validate_all(records) {
        // A producer's batch holds records 0..count: its offset span must match its count,
        // or a client could make offsets jump.
        Ok(headers)
            if !headers.is_empty()
                && headers.iter().all(|(_, h)| {
                    h.record_count >= 1
                        && i64::from(h.last_offset_delta) + 1 == i64::from(h.record_count)
                        // Uncompressed, the count must fit the bytes (compressed, it cannot be
                        // known without decompressing, which the broker never does).
                        && (h.attributes & 7 != 0 || batch::plausible_record_count(h))
                }) =>
        {
            headers
        }
        Ok(_) => return fail(ResponseError::CorruptMessage),
        Err(e) => {
            tracing::debug!(topic = %topic.name, partition = index, error = %e, "refused a corrupt batch");
            return fail(ResponseError::CorruptMessage);
        }
    };
    let (codec, log_append_time, min_insync, compacted, max_bytes) = {
        let log = partition.log();
        let config = log.config();
        let min_insync = config.min_insync_replicas;
        (
            config.compression,
            config.log_append_time,
            min_insync,
            log.compacted(),
            log.max_message_bytes(),
        )
    };
    // One replica is all there is: acks=all asks for more in sync than that, Kafka refuses.
    if acks == -1 && min_insync > 1 {
        let message = format!(
            "the in-sync replicas of {}-{index} (1) are fewer than min.insync.replicas ({min_insync})",
            topic.name
        );
        return fail(ResponseError::NotEnoughReplicas).with_error_message(Some(message.into()));
    }
    // The only copy on the produce path: the request buffer is shared, the log needs the
    // offsets written into the batch headers. A topic's codec or LogAppendTime rewrites the
    // batches first.
    let append_time = log_append_time.then(crate::log::now_ms);
    let mut bytes = if codec.is_some() || append_time.is_some() {
        match rewrite(records, &headers, codec, append_time) {
            Ok(Some((rewritten, new_headers))) => {
                headers = new_headers;
                BytesMut::from(&rewritten[..])
            }
            Ok(None) => BytesMut::from(records),
            Err(why) => {
                tracing::debug!(topic = %topic.name, partition = index, why, "refused a batch it cannot re-encode");
                let message = format!(
                    "a batch for {}-{index} cannot be re-encoded: {why}",
                    topic.name
                );
                return fail(ResponseError::CorruptMessage)
                    .with_error_message(Some(message.into()));
            }
        }
    } else {
        BytesMut::from(records)
    };
    let max = usize::try_from(max_bytes).unwrap_or(0);
    if headers.iter().any(|(_, h)| h.size > max) {
        return fail(ResponseError::MessageTooLarge);
    }
    // As Kafka's: a compacted topic keeps the last record of each key, so a record without
    // one is refused, every such record named by its index in the request's records. Checked
    // before the partition is held (the records are decompressed to find their keys).
    if compacted {
        let mut errors = Vec::new();
        let mut position = 0i32;
        for (at, header) in &headers {
            // The batches as they are appended (re-encoded for the topic's codec, maybe).
            let records = bytes
                .get(*at..at.saturating_add(header.size))
                .map(batch::BatchRecords::read);
            let Some(Ok(records)) = records else {
                return fail(ResponseError::CorruptMessage);
            };
            for record in &records.records {
                if record.key.is_none() {
                    errors.push(
                        BatchIndexAndErrorMessage::default()
                            .with_batch_index(position)
                            .with_batch_index_error_message(Some(
                                "Compacted topic cannot accept message without key.".into(),
                            )),
                    );
                }
                position = position.saturating_add(1);
            }
        }
        if !errors.is_empty() {
            let message = format!(
                "Compacted topic cannot accept message without key in topic partition {}-{index}.",
                topic.name
            );
            return fail(ResponseError::InvalidRecord)
                .with_record_errors(errors)
                .with_error_message(Some(message.into()));
        }
    }
    let mut log = partition.log();
    let appended = log.append(&mut bytes, &mut headers);
    let forgotten = log.take_forgotten_producers();
    if forgotten > 0 {
        reached.add(crate::limits::Held::ProducerIds, forgotten, || {
            format!(
                "partition {}-{index} forgot the state of its {forgotten} least recently written \
                 producers: it held more than max_producer_ids_per_partition",
                topic.name
            )
        });
    }
    match appended {
        Ok(base_offset) => {
            let records = headers.iter().map(|(_, h)| h.record_count.max(0) as u64);
            topic.counters.produced(bytes.len() as u64, records.sum());
            response
                .with_base_offset(base_offset)
                .with_log_start_offset(log.log_start_offset())
                .with_log_append_time_ms(append_time.unwrap_or(-1))
        }
        Err(AppendError::Storage(e)) => {
            tracing::error!(topic = %topic.name, partition = index, error = %e, "append failed");
            fail(ResponseError::KafkaStorageError)
        }
        Err(AppendError::Producer(e)) => {
            tracing::debug!(topic = %topic.name, partition = index, error = %e, "refused a producer's batch");
            let error = match e {
                ProducerError::InvalidProducerEpoch { .. } => ResponseError::InvalidProducerEpoch,
                ProducerError::OutOfOrderSequence { .. } => ResponseError::OutOfOrderSequenceNumber,
                ProducerError::InvalidTxnState { .. } => ResponseError::InvalidTxnState,
                ProducerError::SeveralBatches(_) | ProducerError::ControlBatch => {
                    ResponseError::InvalidRecord
                }
            };
            fail(error).with_error_message(Some(e.to_string().into()))
        }
    }
}

/// The batches of `records` rewritten for the topic's codec and timestamp type, with their
/// headers; `None` when none changes.
#[allow(clippy::type_complexity)]
fn rewrite(
    records: &[u8],
    headers: &[(usize, batch::BatchHeader)],
    codec: Option<kafka_protocol::records::Compression>,
    append_time: Option<i64>,
) -> Result<Option<(Vec<u8>, Vec<(usize, batch::BatchHeader)>)>, &'static str> {
    let mut out = Vec::with_capacity(records.len());
    let mut changed = false;
    for (start, header) in headers {
        let bytes = &records[*start..*start + header.size];
        match batch::rewrite(bytes, codec, append_time)? {
            Some(rewritten) => {
                out.extend_from_slice(&rewritten);
                changed = true;
            }
            None => out.extend_from_slice(bytes),
        }
    }
    if !changed {
        return Ok(None);
    }
    let headers = batch::validate_all(&out).map_err(|_| "the re-encoded batch is not valid")?;
    Ok(Some((out, headers)))
}

impl Handler for Produce {
    const KEY: ApiKey = ApiKey::Produce;
    const VERSIONS: VersionRange = VersionRange { min: 3, max: 11 };
    const SHAPE: &'static super::shape::Shape = &super::shape::PRODUCE;
    type Request = ProduceRequest;
    type Response = ProduceResponse;

    fn error_codes(response: &ProduceResponse, count: &mut dyn FnMut(i16)) {
        for topic in &response.responses {
            for p in &topic.partition_responses {
                count(p.error_code);
            }
        }
    }

    async fn handle(
        ctx: &Arc<Context>,
        header: &RequestHeader,
        request: ProduceRequest,
    ) -> Option<ProduceResponse> {
        // acks other than 0, 1 and -1 (all) fail every partition.
        let acks_error =
            (!matches!(request.acks, -1..=1)).then_some(ResponseError::InvalidRequiredAcks);
        // Transactional records need Write on the transactional id, or every partition fails.
        let request_error = acks_error.or_else(|| {
            let id = request.transactional_id.as_ref()?;
            ctx.check(AclOperation::Write, Resource::transactional_id(&id.0))
                .err()
        });
        let mut responses = Vec::with_capacity(request.topic_data.len());
        let mut appended = false;
        let produced: usize = request
            .topic_data
            .iter()
            .flat_map(|t| &t.partition_data)
            .filter_map(|p| p.records.as_ref().map(|r| r.len()))
            .sum();
        for topic_data in request.topic_data {
            let topic = match request_error {
                Some(error) => Err(error),
                None => ctx
                    .check(AclOperation::Write, Resource::topic(&topic_data.name))
                    .and_then(|()| ctx.topic_or_create(&topic_data.name, true)),
            };
            let partitions = topic_data
                .partition_data
                .iter()
                .map(|p| match &topic {
                    Ok(topic) => {
                        let r = append(
                            topic,
                            p.index,
                            p.records.as_deref(),
                            request.acks,
                            &ctx.limits.reached,
                        );
                        appended |= r.error_code == 0;
                        r
                    }
                    Err(error) => PartitionProduceResponse::default()
                        .with_index(p.index)
                        .with_error_code(error.code())
                        .with_base_offset(-1),
                })
                .collect();
            responses.push(
                TopicProduceResponse::default()
                    .with_name(topic_data.name)
                    .with_partition_responses(partitions),
            );
        }
        if appended {
            ctx.appended.notify_waiters();
        }
        // Produced bytes count against the quota whether they were appended or not, as Kafka's.
        let throttle = ctx.throttle(header, Direction::Produce, produced as u64);
        // With acks=0 the client expects no response at all.
        (request.acks != 0).then(|| {
            ProduceResponse::default()
                .with_responses(responses)
                .with_throttle_time_ms(throttle)
        })
    }
}
