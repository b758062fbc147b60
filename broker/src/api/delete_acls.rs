//! DeleteAcls: deletes the ACLs each filter matches (Kafka's `AclBindingFilter`, as in
//! DescribeAcls) and answers them per filter; a binding matched by several filters is
//! answered with the first. Needs Alter on the cluster.

use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::delete_acls_response::{
    DeleteAclsFilterResult, DeleteAclsMatchingAcl,
};
use kafka_protocol::messages::{ApiKey, DeleteAclsRequest, DeleteAclsResponse, RequestHeader};
use kafka_protocol::protocol::VersionRange;

use super::describe_acls::acl_filter;
use super::{Context, Handler, denial_message, text};
use crate::security::{AclBinding, AclBindingFilter, AclOperation, Resource};

pub(super) struct DeleteAcls;

fn matching(b: AclBinding) -> DeleteAclsMatchingAcl {
    DeleteAclsMatchingAcl::default()
        .with_resource_type(b.resource_type.code())
        .with_resource_name(text(&b.resource_name))
        .with_pattern_type(b.pattern_type.code())
        .with_principal(text(&b.principal))
        .with_host(text(&b.host))
        .with_operation(b.operation.code())
        .with_permission_type(b.permission_type.code())
}

fn failed(error: ResponseError, message: &str) -> DeleteAclsFilterResult {
    DeleteAclsFilterResult::default()
        .with_error_code(error.code())
        .with_error_message(Some(text(message)))
}

impl Handler for DeleteAcls {
    const KEY: ApiKey = ApiKey::DeleteAcls;
    const VERSIONS: VersionRange = VersionRange { min: 1, max: 3 };
    const SHAPE: &'static super::shape::Shape = &super::shape::DELETE_ACLS;
    type Request = DeleteAclsRequest;
    type Response = DeleteAclsResponse;

    async fn handle(
        ctx: &Arc<Context>,
        _: &RequestHeader,
        request: DeleteAclsRequest,
    ) -> Option<DeleteAclsResponse> {
        if let Err(e) = ctx.check(AclOperation::Alter, Resource::cluster()) {
            let results = request
                .filters
                .iter()
                .map(|_| failed(e, &denial_message(e)))
                .collect();
            return Some(DeleteAclsResponse::default().with_filter_results(results));
        }
        let filters: Vec<Result<AclBindingFilter, String>> =
            request.filters.iter().map(|f| acl_filter!(f)).collect();
        let valid: Vec<AclBindingFilter> = filters.iter().filter_map(|f| f.clone().ok()).collect();
        let deleted = ctx.acls.delete(&valid);
        let mut deleted = match deleted {
            Ok(deleted) => deleted.into_iter().map(Ok).collect::<Vec<_>>().into_iter(),
            Err(e) => {
                tracing::error!(error = %e, "cannot delete ACLs");
                vec![Err(e.to_string()); valid.len()].into_iter()
            }
        };
        let results = filters
            .into_iter()
            .map(|f| match f.map(|_| deleted.next()) {
                Err(why) => failed(ResponseError::InvalidRequest, &why),
                Ok(Some(Ok(bindings))) => DeleteAclsFilterResult::default()
                    .with_matching_acls(bindings.into_iter().map(matching).collect()),
                Ok(Some(Err(why))) => failed(ResponseError::UnknownServerError, &why),
                Ok(None) => failed(ResponseError::UnknownServerError, "no result"),
            })
            .collect();
        Some(DeleteAclsResponse::default().with_filter_results(results))
    }
}
