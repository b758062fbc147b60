//! One handler per Kafka API, routed by api key.
//!
//! [`ROUTES`] is the single list of what this broker serves: the connection dispatches through
//! it and ApiVersions answers from it, so the broker can never advertise an API or a version it
//! does not handle. Adding an API is a new module with a [`Handler`] impl,
//! its request's [`shape`], a sample in `samples.rs` and one line in [`ROUTES`].

mod add_offsets_to_txn;
mod add_partitions_to_txn;
mod alter_configs;
mod alter_user_scram_credentials;
mod api_versions;
mod consumer_group_describe;
mod consumer_group_heartbeat;
mod create_acls;
mod create_partitions;
mod create_topics;
mod delete_acls;
mod delete_groups;
mod delete_records;
mod delete_topics;
mod describe_acls;
mod describe_cluster;
mod describe_configs;
mod describe_groups;
mod describe_log_dirs;
mod describe_producers;
mod describe_transactions;
mod describe_user_scram_credentials;
mod end_txn;
mod fetch;
mod find_coordinator;
mod heartbeat;
mod incremental_alter_configs;
mod init_producer_id;
mod join_group;
mod leave_group;
mod list_groups;
mod list_offsets;
mod list_transactions;
mod metadata;
mod offset_commit;
mod offset_delete;
mod offset_fetch;
mod produce;
#[cfg(test)]
mod samples;
mod sasl_authenticate;
mod sasl_handshake;
mod shape;
mod sync_group;
mod txn_offset_commit;
mod write_txn_markers;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes, VersionRange};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::groups::{self, GroupCoordinator};
use crate::log::FileSlice;
use crate::security::credentials::Credentials;
use crate::security::{AclOperation, Authorizer, Resource, ResourceType};
use crate::stats::Counters;
use crate::topics::{Topic, TopicError, Topics};
use crate::txn::TxnCoordinator;

pub(crate) use api_versions::unsupported_version_response;
pub(crate) use sasl_authenticate::authenticate as sasl_authenticate;
pub(crate) use sasl_handshake::handshake as sasl_handshake;

/// The calling client's host as Kafka shows it (`/127.0.0.1`), when known.
pub(crate) fn client_host() -> String {
    crate::security::session().client_host.clone()
}

/// What every handler can reach: the topics, the groups, the transactions, the ACLs and
/// broker-wide facts.
pub(crate) struct Context {
    pub(crate) topics: Topics,
    pub(crate) groups: GroupCoordinator,
    pub(crate) txns: TxnCoordinator,
    pub(crate) acls: Authorizer,
    /// Woken after every append, for long-polling fetches.
    pub(crate) appended: Notify,
    /// Cancelled when the broker shuts down.
    pub(crate) shutdown: CancellationToken,
    /// The users SASL authenticates.
    pub(crate) credentials: Credentials,
    pub(crate) node_id: i32,
    /// The advertised host and port of the first listener, for requests served outside a
    /// connection.
    pub(crate) host: String,
    pub(crate) port: i32,
    pub(crate) cluster_id: String,
    /// The request and connection counters (see [`crate::stats`]).
    pub(crate) stats: Counters,
    /// Connection, memory and partition limits (see [`crate::limits`]).
    pub(crate) limits: Arc<crate::limits::Limits>,
    /// Byte-rate quotas by client id (see [`crate::quotas`]).
    pub(crate) quotas: crate::quotas::Quotas,
}

impl Context {
    /// Records `bytes` against the quota of the request's client id and returns its
    /// `throttle_time_ms` (0 within the quota, or without one).
    pub(crate) fn throttle(
        &self,
        header: &RequestHeader,
        direction: crate::quotas::Direction,
        bytes: u64,
    ) -> i32 {
        if !self.quotas.any() {
            return 0;
        }
        let client_id = header.client_id.as_deref().unwrap_or_default();
        crate::quotas::throttle_ms(self.quotas.record(client_id, direction, bytes))
    }

    /// A context over `config.data_dir` with no listener and no background task, for the
    /// unit tests and the fuzz targets; panics where the directory cannot be used.
    pub(crate) fn standalone(config: crate::config::BrokerConfig) -> Arc<Context> {
        let catalog = crate::catalog::Catalog::open(&config.data_dir).expect("the catalog");
        let limits = Arc::new(crate::limits::Limits::new(&config, None));
        let topics =
            Topics::open(config.clone(), catalog, true, Arc::clone(&limits)).expect("the topics");
        let groups = GroupCoordinator::load(&config, topics.catalog(), Arc::clone(&limits.reached))
            .expect("the groups");
        let txns = TxnCoordinator::load(&config, topics.catalog(), Arc::clone(&limits.reached))
            .expect("the transactions");
        txns.recover(&topics);
        let acls = Authorizer::load(&config, topics.catalog()).expect("the ACLs");
        let credentials = Credentials::new(&config.users, topics.catalog()).expect("the users");
        Arc::new(Context {
            topics,
            groups,
            txns,
            acls,
            appended: Notify::new(),
            shutdown: CancellationToken::new(),
            credentials,
            node_id: config.node_id,
            host: "127.0.0.1".into(),
            port: 9092,
            cluster_id: "test-cluster".into(),
            stats: Counters::new(Vec::new()),
            limits,
            quotas: crate::quotas::Quotas::of(&config),
        })
    }

    /// Whether the caller of the request being served may perform `operation` on `resource`
    /// (see [`crate::security::Authorizer`]); a denial is logged at debug, in the words of
    /// Kafka's authorizer log.
    pub(crate) fn authorize(&self, operation: AclOperation, resource: Resource<'_>) -> bool {
        let session = crate::security::session();
        let allowed = self.acls.authorize(&session, operation, resource);
        if !allowed {
            tracing::debug!(
                "Principal = {} is Denied Operation = {operation} from host = {} on resource = \
                 {resource}",
                session.principal,
                session.ip
            );
        }
        allowed
    }

    /// [`Context::authorize`], as the error Kafka answers a denial on this kind of resource
    /// with (TOPIC_AUTHORIZATION_FAILED, GROUP_..., TRANSACTIONAL_ID_..., CLUSTER_...).
    pub(crate) fn check(
        &self,
        operation: AclOperation,
        resource: Resource<'_>,
    ) -> Result<(), ResponseError> {
        if self.authorize(operation, resource) {
            return Ok(());
        }
        Err(match resource.resource_type {
            ResourceType::Topic => ResponseError::TopicAuthorizationFailed,
            ResourceType::Group => ResponseError::GroupAuthorizationFailed,
            ResourceType::TransactionalId => ResponseError::TransactionalIdAuthorizationFailed,
            ResourceType::Cluster => ResponseError::ClusterAuthorizationFailed,
        })
    }

    /// The checks of the topics of a request that acts on partitions of several of them:
    /// `whole` (the check of its group or transactional id) refuses every topic when it
    /// failed; otherwise each topic the caller may not `operation` is refused with
    /// TOPIC_AUTHORIZATION_FAILED.
    pub(crate) fn check_topics<'a>(
        &self,
        whole: Result<(), ResponseError>,
        operation: AclOperation,
        topics: impl IntoIterator<Item = &'a str>,
    ) -> TopicChecks {
        TopicChecks(
            topics
                .into_iter()
                .map(|name| {
                    whole
                        .and_then(|()| self.check(operation, Resource::topic(name)))
                        .err()
                })
                .collect(),
        )
    }

    /// The check of an idempotent producer (InitProducerId without a transactional id):
    /// IdempotentWrite on the cluster, or Write on any topic (KIP-679), else
    /// CLUSTER_AUTHORIZATION_FAILED.
    pub(crate) fn check_idempotent_write(&self) -> Result<(), ResponseError> {
        let session = crate::security::session();
        let cluster = Resource::cluster();
        if self
            .acls
            .authorize(&session, AclOperation::IdempotentWrite, cluster)
            || self
                .acls
                .authorize_any(&session, AclOperation::Write, ResourceType::Topic)
        {
            return Ok(());
        }
        tracing::debug!(
            "Principal = {} is Denied Operation = {} from host = {} on resource = {cluster} \
             (nor has Write on any topic)",
            session.principal,
            AclOperation::IdempotentWrite,
            session.ip
        );
        Err(ResponseError::ClusterAuthorizationFailed)
    }

    /// Whether the caller may create topic `name`: Create on the cluster or on the topic.
    pub(crate) fn may_create_topic(&self, name: &str) -> bool {
        let session = crate::security::session();
        self.acls
            .authorize(&session, AclOperation::Create, Resource::cluster())
            || self.authorize(AclOperation::Create, Resource::topic(name))
    }

    /// The topic `name`. A missing one asked to be auto-created (`create`) is, when
    /// auto-creation is on and the caller may create it; when it may not, the answer is
    /// TOPIC_AUTHORIZATION_FAILED, as Kafka answers Metadata.
    pub(crate) fn topic_or_create(
        &self,
        name: &str,
        create: bool,
    ) -> Result<Arc<Topic>, ResponseError> {
        if let Some(topic) = self.topics.get(name) {
            return Ok(topic);
        }
        let create = create && self.topics.broker_config().auto_create_topics_enable;
        if create && !self.may_create_topic(name) {
            return Err(ResponseError::TopicAuthorizationFailed);
        }
        self.topics.get_or_create(name, create).map_err(|e| {
            if !matches!(e, TopicError::Unknown(_)) {
                // Named once a minute per cause, not per request: clients ask again and again.
                let cause = std::mem::discriminant(&e);
                match self.limits.auto_create_failures.due(&cause) {
                    Some(suppressed) => {
                        tracing::warn!(topic = name, error = %e, suppressed, "topic auto-creation failed")
                    }
                    None => tracing::debug!(topic = name, error = %e, "topic auto-creation failed"),
                }
            }
            e.response_error()
        })
    }

    /// The cluster id as a protocol string.
    pub(crate) fn cluster_id(&self) -> StrBytes {
        StrBytes::from_string(self.cluster_id.clone())
    }

    /// The host and port this broker is reached at by the caller: those advertised by the
    /// listener the request arrived on (so a TLS client is never sent to a plaintext port).
    pub(crate) fn advertised(&self) -> (StrBytes, i32) {
        match &crate::security::session().advertised {
            Some((host, port)) => (StrBytes::from_string(host.clone()), *port),
            None => (StrBytes::from_string(self.host.clone()), self.port),
        }
    }

    /// Waits for a group's answer that is not ready yet (the end of a join phase, the
    /// leader's assignment); `lost` stands in when the broker shuts down meanwhile or the
    /// member was dropped without an answer.
    pub(crate) async fn answer<T>(&self, reply: groups::Reply<T>, lost: impl FnOnce() -> T) -> T {
        match reply {
            groups::Reply::Now(answer) => answer,
            groups::Reply::Later(rx) => tokio::select! {
                answer = rx => answer.unwrap_or_else(|_| lost()),
                _ = self.shutdown.cancelled() => lost(),
            },
        }
    }
}

/// Each topic's refusal, if any, in request order (see [`Context::check_topics`]).
pub(crate) struct TopicChecks(Vec<Option<ResponseError>>);

impl TopicChecks {
    /// The error topic `i` gets, if refused.
    pub(crate) fn refusal(&self, i: usize) -> Option<ResponseError> {
        self.0.get(i).copied().flatten()
    }

    /// Whether topic `i` may be acted on.
    pub(crate) fn allowed(&self, i: usize) -> bool {
        self.refusal(i).is_none()
    }

    /// The answer of every partition in request order, given each topic's partition count
    /// and `answers`, one per partition of the allowed topics, in order.
    pub(crate) fn merge(
        &self,
        partition_counts: impl IntoIterator<Item = usize>,
        answers: impl IntoIterator<Item = Option<ResponseError>>,
    ) -> Vec<Option<ResponseError>> {
        let mut answers = answers.into_iter();
        let mut merged = Vec::new();
        for (i, count) in partition_counts.into_iter().enumerate() {
            let refusal = self.refusal(i);
            merged.extend((0..count).map(|_| refusal.or_else(|| answers.next().flatten())));
        }
        merged
    }
}

/// The message Kafka sends with an authorization error (its exceptions' default messages).
pub(crate) fn denial_message(error: ResponseError) -> String {
    match error {
        ResponseError::TopicAuthorizationFailed => "Topic authorization failed.",
        ResponseError::GroupAuthorizationFailed => "Group authorization failed.",
        ResponseError::TransactionalIdAuthorizationFailed => {
            "Transactional Id authorization failed."
        }
        ResponseError::ClusterAuthorizationFailed => "Cluster authorization failed.",
        _ => return error.to_string(),
    }
    .to_owned()
}

/// A protocol string.
pub(crate) fn text(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_owned())
}

/// Failure to serve one request; the connection is closed after it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ApiError {
    #[error("cannot decode {api:?} v{version} request: {reason}")]
    Decode {
        api: ApiKey,
        version: i16,
        reason: String,
    },
    #[error("cannot encode {api:?} v{version} response: {reason}")]
    Encode {
        api: ApiKey,
        version: i16,
        reason: String,
    },
}

/// The handler of one Kafka API.
pub(crate) trait Handler {
    /// The API served.
    const KEY: ApiKey;
    /// The versions served (a sub-range of what the codec knows).
    const VERSIONS: VersionRange;
    /// The request's wire shape, checked before decoding (see [`shape`]).
    const SHAPE: &'static shape::Shape;
    type Request: Decodable + Send;
    type Response: IntoFrame + Send;
    /// Serves a request; `None` sends no response (Produce with acks=0).
    fn handle(
        ctx: &Arc<Context>,
        header: &RequestHeader,
        request: Self::Request,
    ) -> impl Future<Output = Option<Self::Response>> + Send;
    /// Calls `count` with each error code of a response, as Kafka's `errorCounts` lists them
    /// for its `ErrorsPerSec` metric (a top-level code, then one per partition, topic or
    /// group); NONE may be passed and is not counted. By default nothing is counted.
    fn error_codes(_response: &Self::Response, _count: &mut dyn FnMut(i16)) {}
}

/// An encoded response frame. The records of a Fetch response are not in `bytes`: they are
/// sent straight from the segment files, each range at its place in the frame.
pub(crate) struct Frame {
    /// Size, header and body, except the file ranges; the size counts them.
    pub(crate) bytes: Bytes,
    /// Each file range with the position in `bytes` it goes before, in order.
    pub(crate) files: Vec<(usize, FileSlice)>,
}

impl From<Bytes> for Frame {
    fn from(bytes: Bytes) -> Self {
        Frame {
            bytes,
            files: Vec::new(),
        }
    }
}

/// A handler's response, made into a frame.
pub(crate) trait IntoFrame {
    /// The whole response frame: size, header (in the version the API mandates), body.
    fn into_frame(self, api: ApiKey, version: i16, correlation_id: i32) -> Result<Frame, ApiError>;
}

impl<R: Encodable> IntoFrame for R {
    fn into_frame(self, api: ApiKey, version: i16, correlation_id: i32) -> Result<Frame, ApiError> {
        encode_response(api, version, correlation_id, &self).map(Frame::from)
    }
}

type Reply<'a> = Pin<Box<dyn Future<Output = Result<Option<Frame>, ApiError>> + Send + 'a>>;

/// A routing table entry.
pub(crate) struct Route {
    pub(crate) key: ApiKey,
    pub(crate) versions: VersionRange,
    pub(crate) shape: &'static shape::Shape,
    call: for<'a> fn(&'a Arc<Context>, RequestHeader, Bytes) -> Reply<'a>,
}

impl Route {
    /// Checks `body` against the request's shape, decodes it, runs the handler and returns the
    /// encoded response frame, if any.
    pub(crate) fn call<'a>(
        &self,
        ctx: &'a Arc<Context>,
        header: RequestHeader,
        body: Bytes,
    ) -> Reply<'a> {
        if let Err(e) = self.shape.check(&body, header.request_api_version) {
            count_undecodable(ctx, self.key, Instant::now());
            let error = ApiError::Decode {
                api: self.key,
                version: header.request_api_version,
                reason: e.to_string(),
            };
            return Box::pin(std::future::ready(Err(error)));
        }
        (self.call)(ctx, header, body)
    }
}

const fn route<H: Handler + 'static>() -> Route {
    Route {
        key: H::KEY,
        versions: H::VERSIONS,
        shape: H::SHAPE,
        call: serve::<H>,
    }
}

/// Every API this broker serves.
pub(crate) const ROUTES: &[Route] = &[
    route::<produce::Produce>(),
    route::<fetch::Fetch>(),
    route::<list_offsets::ListOffsets>(),
    route::<find_coordinator::FindCoordinator>(),
    route::<metadata::Metadata>(),
    route::<api_versions::ApiVersions>(),
    route::<create_topics::CreateTopics>(),
    route::<delete_topics::DeleteTopics>(),
    route::<delete_records::DeleteRecords>(),
    route::<describe_configs::DescribeConfigs>(),
    route::<create_partitions::CreatePartitions>(),
    route::<alter_configs::AlterConfigs>(),
    route::<incremental_alter_configs::IncrementalAlterConfigs>(),
    route::<describe_cluster::DescribeCluster>(),
    route::<offset_commit::OffsetCommit>(),
    route::<offset_fetch::OffsetFetch>(),
    route::<join_group::JoinGroup>(),
    route::<heartbeat::Heartbeat>(),
    route::<leave_group::LeaveGroup>(),
    route::<sync_group::SyncGroup>(),
    route::<describe_groups::DescribeGroups>(),
    route::<list_groups::ListGroups>(),
    route::<consumer_group_heartbeat::ConsumerGroupHeartbeat>(),
    route::<consumer_group_describe::ConsumerGroupDescribe>(),
    route::<delete_groups::DeleteGroups>(),
    route::<offset_delete::OffsetDelete>(),
    route::<init_producer_id::InitProducerId>(),
    route::<add_partitions_to_txn::AddPartitionsToTxn>(),
    route::<add_offsets_to_txn::AddOffsetsToTxn>(),
    route::<end_txn::EndTxn>(),
    route::<txn_offset_commit::TxnOffsetCommit>(),
    route::<describe_transactions::DescribeTransactions>(),
    route::<list_transactions::ListTransactions>(),
    route::<describe_producers::DescribeProducers>(),
    route::<describe_log_dirs::DescribeLogDirs>(),
    route::<write_txn_markers::WriteTxnMarkers>(),
    route::<create_acls::CreateAcls>(),
    route::<describe_acls::DescribeAcls>(),
    route::<delete_acls::DeleteAcls>(),
    route::<sasl_handshake::SaslHandshake>(),
    route::<sasl_authenticate::SaslAuthenticate>(),
    route::<describe_user_scram_credentials::DescribeUserScramCredentials>(),
    route::<alter_user_scram_credentials::AlterUserScramCredentials>(),
];

/// The route for an api key, if served.
pub(crate) fn route_for(key: i16) -> Option<&'static Route> {
    ROUTES.iter().find(|r| r.key as i16 == key)
}

fn serve<'a, H: Handler + 'static>(
    ctx: &'a Arc<Context>,
    header: RequestHeader,
    body: Bytes,
) -> Reply<'a> {
    Box::pin(async move {
        let started = Instant::now();
        let request = decode_request::<H>(&header, body).inspect_err(|_| {
            count_undecodable(ctx, H::KEY, started);
        })?;
        let response = H::handle(ctx, &header, request).await;
        if let Some(counters) = ctx.stats.requests.api(H::KEY) {
            if let Some(response) = &response {
                H::error_codes(response, &mut |code| counters.error(code));
            }
            counters.served(started.elapsed());
        }
        let Some(response) = response else {
            return Ok(None);
        };
        response_frame::<H>(&header, response).map(Some)
    })
}

/// Counts a request that did not decode (the connection is closed after it) as one that got
/// INVALID_REQUEST.
fn count_undecodable(ctx: &Context, key: ApiKey, started: Instant) {
    if let Some(counters) = ctx.stats.requests.api(key) {
        counters.error(ResponseError::InvalidRequest.code());
        counters.served(started.elapsed());
    }
}

/// Checks a request body against `H`'s shape and decodes it.
fn decode_request<H: Handler>(
    header: &RequestHeader,
    mut body: Bytes,
) -> Result<H::Request, ApiError> {
    let version = header.request_api_version;
    let error = |reason: String| ApiError::Decode {
        api: H::KEY,
        version,
        reason,
    };
    H::SHAPE
        .check(&body, version)
        .map_err(|e| error(e.to_string()))?;
    H::Request::decode(&mut body, version).map_err(|e| error(e.to_string()))
}

/// The response frame of `H` to the request of `header`.
fn response_frame<H: Handler>(
    header: &RequestHeader,
    response: H::Response,
) -> Result<Frame, ApiError> {
    response.into_frame(H::KEY, header.request_api_version, header.correlation_id)
}

/// A whole response frame: size, header (in the version the API mandates), body.
pub(crate) fn encode_response<R: Encodable>(
    api: ApiKey,
    version: i16,
    correlation_id: i32,
    response: &R,
) -> Result<Bytes, ApiError> {
    let header_version = api.response_header_version(version);
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    let size = header
        .compute_size(header_version)
        .map_err(encode_error(api, version))?
        + response
            .compute_size(version)
            .map_err(encode_error(api, version))?;
    let mut buf = BytesMut::with_capacity(4 + size);
    buf.put_u32(size as u32);
    header
        .encode(&mut buf, header_version)
        .map_err(encode_error(api, version))?;
    response
        .encode(&mut buf, version)
        .map_err(encode_error(api, version))?;
    Ok(buf.freeze())
}

pub(crate) fn encode_error<E: std::fmt::Display>(
    api: ApiKey,
    version: i16,
) -> impl Fn(E) -> ApiError {
    move |e| ApiError::Encode {
        api,
        version,
        reason: e.to_string(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::BrokerConfig;
    use std::collections::BTreeMap;

    pub(crate) fn context(dir: &std::path::Path) -> Arc<Context> {
        let config = BrokerConfig {
            data_dir: dir.to_path_buf(),
            ..Default::default()
        };
        Context::standalone(config)
    }

    /// Every API but the ones a client needs before it can authenticate decides who may do
    /// what it asks: a new handler that forgot its check fails here.
    #[tokio::test]
    async fn every_api_that_acts_on_something_authorizes_its_caller() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path());
        ctx.topics
            .create("x", 1, 1, BTreeMap::new(), false)
            .unwrap();
        // ListTransactions filters what it lists, and the broker has no transaction to list.
        let exempt = [
            ApiKey::ApiVersions,
            ApiKey::SaslHandshake,
            ApiKey::SaslAuthenticate,
            ApiKey::ListTransactions,
        ];
        let mut unchecked = Vec::new();
        for route in ROUTES.iter().filter(|r| !exempt.contains(&r.key)) {
            let before = crate::security::acl::tests::AUTHORIZED.with(std::cell::Cell::get);
            for version in route.versions.min..=route.versions.max {
                let header = RequestHeader::default()
                    .with_request_api_key(route.key as i16)
                    .with_request_api_version(version)
                    .with_correlation_id(5);
                let body = Bytes::from(samples::sample(route.key, version));
                route.call(&ctx, header, body).await.unwrap();
            }
            if crate::security::acl::tests::AUTHORIZED.with(std::cell::Cell::get) == before {
                unchecked.push(route.key);
            }
        }
        assert!(
            unchecked.is_empty(),
            "served without an authorization check: {unchecked:?}"
        );
    }

    /// Writes a request frame (header and sample body, without the size prefix) of every
    /// served version of every API into the directory `FERRY_FUZZ_SEEDS` names, as seeds for
    /// the kafka_request fuzz target, so that every handler is fuzzed from its first run:
    /// `FERRY_FUZZ_SEEDS=$PWD/fuzz/corpus/kafka_request cargo test -p ferry-broker --lib
    /// write_fuzz_seeds -- --ignored`. Without the variable it checks that every frame is one.
    #[test]
    #[ignore = "writes the fuzz seeds when asked to"]
    fn write_fuzz_seeds() {
        use kafka_protocol::protocol::{Encodable, StrBytes};
        let out = std::env::var_os("FERRY_FUZZ_SEEDS").map(std::path::PathBuf::from);
        for route in ROUTES {
            for version in route.versions.min..=route.versions.max {
                let header = RequestHeader::default()
                    .with_request_api_key(route.key as i16)
                    .with_request_api_version(version)
                    .with_correlation_id(7)
                    .with_client_id(Some(StrBytes::from_static_str("seed")));
                let mut frame = bytes::BytesMut::new();
                header
                    .encode(&mut frame, route.key.request_header_version(version))
                    .unwrap();
                frame.extend_from_slice(&samples::sample(route.key, version));
                assert!(frame.len() >= 8);
                if let Some(dir) = &out {
                    let name = format!("seed-{:?}-v{version}", route.key);
                    std::fs::write(dir.join(name), &frame).unwrap();
                }
            }
        }
    }

    /// Every advertised version of every API decodes a request and encodes its response: a
    /// field set that a version lacks would fail here instead of closing a client's connection.
    #[tokio::test]
    async fn every_served_version_answers_with_an_encodable_response() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path());
        for route in ROUTES {
            for version in route.versions.min..=route.versions.max {
                if ctx.topics.get("x").is_none() {
                    ctx.topics
                        .create("x", 1, 1, BTreeMap::new(), false)
                        .unwrap();
                }
                let header = RequestHeader::default()
                    .with_request_api_key(route.key as i16)
                    .with_request_api_version(version)
                    .with_correlation_id(5);
                let body = Bytes::from(samples::sample(route.key, version));
                let reply = route.call(&ctx, header, body).await;
                let frame = reply.unwrap_or_else(|e| panic!("{:?} v{version}: {e}", route.key));
                if route.key != ApiKey::Produce {
                    let frame =
                        frame.unwrap_or_else(|| panic!("{:?} v{version}: no response", route.key));
                    assert_eq!(
                        &frame.bytes[4..8],
                        &5i32.to_be_bytes(),
                        "{:?} v{version}",
                        route.key
                    );
                }
            }
        }
    }
}
