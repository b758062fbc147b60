//! DescribeAcls: the ACLs matching a filter (Kafka's `AclBindingFilter`: ANY or MATCH pattern
//! types, a null field matches all), grouped by resource pattern. Needs Describe on the
//! cluster.

use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
use kafka_protocol::messages::{ApiKey, DescribeAclsRequest, DescribeAclsResponse, RequestHeader};
use kafka_protocol::protocol::VersionRange;

use super::{Context, Handler, denial_message, text};
use crate::security::{AclBinding, AclOperation, Resource};

pub(super) struct DescribeAcls;

/// The [`AclBindingFilter`] of a DescribeAcls request or a DeleteAcls filter, which have the
/// same fields.
macro_rules! acl_filter {
    ($f:expr) => {
        crate::security::AclBindingFilter::from_codes(
            $f.resource_type_filter,
            $f.resource_name_filter.as_deref(),
            $f.pattern_type_filter,
            $f.principal_filter.as_deref(),
            $f.host_filter.as_deref(),
            $f.operation,
            $f.permission_type,
        )
    };
}
pub(super) use acl_filter;

/// The bindings grouped by resource pattern; `bindings` is sorted, so a pattern's bindings
/// are next to each other.
fn by_resource(bindings: Vec<AclBinding>) -> Vec<DescribeAclsResource> {
    let mut resources: Vec<DescribeAclsResource> = Vec::new();
    for b in bindings {
        let acl = AclDescription::default()
            .with_principal(text(&b.principal))
            .with_host(text(&b.host))
            .with_operation(b.operation.code())
            .with_permission_type(b.permission_type.code());
        match resources.last_mut() {
            Some(last)
                if last.resource_type == b.resource_type.code()
                    && *last.resource_name == *b.resource_name
                    && last.pattern_type == b.pattern_type.code() =>
            {
                last.acls.push(acl);
            }
            _ => resources.push(
                DescribeAclsResource::default()
                    .with_resource_type(b.resource_type.code())
                    .with_resource_name(text(&b.resource_name))
                    .with_pattern_type(b.pattern_type.code())
                    .with_acls(vec![acl]),
            ),
        }
    }
    resources
}

impl Handler for DescribeAcls {
    const KEY: ApiKey = ApiKey::DescribeAcls;
    const VERSIONS: VersionRange = VersionRange { min: 1, max: 3 };
    const SHAPE: &'static super::shape::Shape = &super::shape::DESCRIBE_ACLS;
    type Request = DescribeAclsRequest;
    type Response = DescribeAclsResponse;

    async fn handle(
        ctx: &Arc<Context>,
        _: &RequestHeader,
        request: DescribeAclsRequest,
    ) -> Option<DescribeAclsResponse> {
        let failed = |error: ResponseError, message: String| {
            DescribeAclsResponse::default()
                .with_error_code(error.code())
                .with_error_message(Some(text(&message)))
        };
        if let Err(e) = ctx.check(AclOperation::Describe, Resource::cluster()) {
            return Some(failed(e, denial_message(e)));
        }
        let filter = acl_filter!(request);
        Some(match filter {
            Ok(filter) => DescribeAclsResponse::default()
                .with_resources(by_resource(ctx.acls.describe(&filter))),
            Err(why) => failed(ResponseError::InvalidRequest, why),
        })
    }
}
