//! DescribeCluster: this single broker, which is also the controller.

use std::sync::Arc;

use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::{
    ApiKey, BrokerId, DescribeClusterRequest, DescribeClusterResponse, RequestHeader,
};
use kafka_protocol::protocol::VersionRange;

use super::{Context, Handler};
use crate::security::{AclOperation, Resource};

pub(super) struct DescribeCluster;

impl Handler for DescribeCluster {
    const KEY: ApiKey = ApiKey::DescribeCluster;
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 1 };
    const SHAPE: &'static super::shape::Shape = &super::shape::DESCRIBE_CLUSTER;
    type Request = DescribeClusterRequest;
    type Response = DescribeClusterResponse;

    async fn handle(
        ctx: &Arc<Context>,
        _: &RequestHeader,
        _: DescribeClusterRequest,
    ) -> Option<DescribeClusterResponse> {
        if let Err(e) = ctx.check(AclOperation::Describe, Resource::cluster()) {
            return Some(DescribeClusterResponse::default().with_error_code(e.code()));
        }
        let (host, port) = ctx.advertised();
        let broker = DescribeClusterBroker::default()
            .with_broker_id(BrokerId(ctx.node_id))
            .with_host(host)
            .with_port(port);
        Some(
            DescribeClusterResponse::default()
                .with_cluster_id(ctx.cluster_id())
                .with_controller_id(BrokerId(ctx.node_id))
                .with_brokers(vec![broker]),
        )
    }
}
