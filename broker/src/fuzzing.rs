//! Entry points for the fuzz targets in `fuzz/` and the tests that replay their corpus and
//! regressions; not an API.
//!
//! [`Harness`] serves request frames as a connection does (the same decoding, dispatch and
//! authorization) on a broker context over a scratch directory, without listeners or
//! background tasks. A request that waits (a long-polling Fetch, a JoinGroup waiting for its
//! group) is dropped after a short bound, as a client going away would leave it.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;

use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ApiKey, ProduceRequest, RequestHeader, TopicName};
use kafka_protocol::protocol::{Encodable, StrBytes};

use crate::api::Context;
use crate::config::BrokerConfig;
use crate::security::{SESSION, Session};

/// Longest a request may take.
const REQUEST_BOUND: Duration = Duration::from_millis(50);

/// A broker context serving request frames.
pub struct Harness {
    runtime: tokio::runtime::Runtime,
    ctx: Arc<Context>,
}

impl Harness {
    /// A broker over `dir` (created if missing), with small limits so that no input can make
    /// it create thousands of partitions.
    pub fn new(dir: &Path) -> Harness {
        std::fs::create_dir_all(dir).expect("the scratch directory");
        let config = BrokerConfig {
            data_dir: dir.to_path_buf(),
            max_broker_partitions: 64,
            max_partitions_per_topic: 8,
            log_segment_bytes: 64 * 1024,
            group_initial_rebalance_delay_ms: 0,
            ..Default::default()
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let ctx = runtime.block_on(async { Context::standalone(config) });
        Harness { runtime, ctx }
    }

    /// Serves one request frame (without its size prefix), as a connection would; the
    /// response, or the error that would close the connection, is dropped.
    pub fn request(&self, frame: &[u8]) {
        let Ok(size) = i32::try_from(frame.len()) else {
            return;
        };
        // As `read_frame` checks, before anything is decoded.
        if frame.len() < 8 || size > BrokerConfig::default().socket_request_max_bytes {
            return;
        }
        let session = Arc::new(Session::anonymous(std::net::SocketAddr::from((
            [127, 0, 0, 1],
            50000,
        ))));
        let ctx = Arc::clone(&self.ctx);
        let frame = BytesMut::from(frame);
        self.runtime.block_on(async move {
            let mut auth = None;
            let served = SESSION.scope(session, crate::connection::handle(&ctx, frame, &mut auth));
            let _ = tokio::time::timeout(REQUEST_BOUND, served).await;
        });
    }

    /// Produces `records` (any bytes; the CRC of every whole batch in them is made right
    /// first, so the input reaches what lies behind the check) to partition 0 of `topic`,
    /// with acks=1, through [`Harness::request`].
    pub fn produce(&self, topic: &str, records: &[u8]) {
        let mut records = records.to_vec();
        fix_crcs(&mut records);
        let request = ProduceRequest::default()
            .with_acks(1)
            .with_timeout_ms(1000)
            .with_topic_data(vec![
                TopicProduceData::default()
                    .with_name(TopicName(StrBytes::from_string(topic.to_owned())))
                    .with_partition_data(vec![
                        PartitionProduceData::default()
                            .with_index(0)
                            .with_records(Some(records.into())),
                    ]),
            ]);
        let version = 9;
        let header = RequestHeader::default()
            .with_request_api_key(ApiKey::Produce as i16)
            .with_request_api_version(version)
            .with_correlation_id(1)
            .with_client_id(Some(StrBytes::from_static_str("fuzz")));
        let mut frame = BytesMut::new();
        let encoded = header
            .encode(&mut frame, ApiKey::Produce.request_header_version(version))
            .and_then(|()| request.encode(&mut frame, version));
        if encoded.is_ok() {
            self.request(&frame);
        }
    }
}

/// Writes the right CRC-32C into every batch of `records` whose length field says it is
/// whole.
pub fn fix_crcs(records: &mut [u8]) {
    let mut at = 0usize;
    while records.len() - at >= crate::log::batch::HEADER_LEN {
        let length = i32::from_be_bytes([
            records[at + 8],
            records[at + 9],
            records[at + 10],
            records[at + 11],
        ]);
        let Ok(length) = usize::try_from(length) else {
            return;
        };
        let end = at + 12 + length;
        if length < crate::log::batch::HEADER_LEN - 12 || end > records.len() {
            return;
        }
        let crc = crc32c::crc32c(&records[at + 21..end]);
        records[at + 17..at + 21].copy_from_slice(&crc.to_be_bytes());
        at = end;
    }
}

/// Writes `bytes` as a segment file in `dir` and dumps it as `agent dump-log-segments
/// --print-data-log` would (the tool reads whatever files it is pointed at).
pub fn dump_segment(dir: &Path, bytes: &[u8]) {
    let mut bytes = bytes.to_vec();
    fix_crcs(&mut bytes);
    let path = dir.join(format!("{:020}.log", 0));
    if std::fs::write(&path, &bytes).is_ok() {
        let mut out = Vec::new();
        let _ = crate::dump::dump_segment_file(&path, true, &mut out);
    }
}
