//! CreateAcls: new ACL bindings, stored before the answer. Needs Alter on the cluster; a
//! binding Kafka would refuse (an unknown or ANY code, a cluster named other than
//! `kafka-cluster`, an operation the resource type does not have) gets INVALID_REQUEST, the
//! others are created.

use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::{ApiKey, CreateAclsRequest, CreateAclsResponse, RequestHeader};
use kafka_protocol::protocol::VersionRange;

use super::{Context, Handler, denial_message, text};
use crate::security::{
    AclBinding, AclOperation, AclPermissionType, PatternType, Resource, ResourceType,
};

pub(super) struct CreateAcls;

/// The binding a creation asks for, or why it cannot be one.
fn binding(creation: &AclCreation) -> Result<AclBinding, String> {
    let code = |what: &str, code: i8| format!("{what} code {code} is not valid in an ACL");
    let binding = AclBinding {
        resource_type: ResourceType::from_code(creation.resource_type)
            .ok_or_else(|| code("resource type", creation.resource_type))?,
        resource_name: creation.resource_name.to_string(),
        pattern_type: PatternType::from_code(creation.resource_pattern_type)
            .ok_or_else(|| code("pattern type", creation.resource_pattern_type))?,
        principal: creation.principal.to_string(),
        host: creation.host.to_string(),
        operation: AclOperation::from_code(creation.operation)
            .ok_or_else(|| code("operation", creation.operation))?,
        permission_type: AclPermissionType::from_code(creation.permission_type)
            .ok_or_else(|| code("permission type", creation.permission_type))?,
    };
    match binding.invalid() {
        Some(why) => Err(why),
        None => Ok(binding),
    }
}

fn result(error: Option<(ResponseError, String)>) -> AclCreationResult {
    match error {
        None => AclCreationResult::default(),
        Some((error, message)) => AclCreationResult::default()
            .with_error_code(error.code())
            .with_error_message(Some(text(&message))),
    }
}

impl Handler for CreateAcls {
    const KEY: ApiKey = ApiKey::CreateAcls;
    const VERSIONS: VersionRange = VersionRange { min: 1, max: 3 };
    const SHAPE: &'static super::shape::Shape = &super::shape::CREATE_ACLS;
    type Request = CreateAclsRequest;
    type Response = CreateAclsResponse;

    async fn handle(
        ctx: &Arc<Context>,
        _: &RequestHeader,
        request: CreateAclsRequest,
    ) -> Option<CreateAclsResponse> {
        let checked: Vec<Result<AclBinding, (ResponseError, String)>> =
            match ctx.check(AclOperation::Alter, Resource::cluster()) {
                Err(e) => vec![Err((e, denial_message(e))); request.creations.len()],
                Ok(()) => request
                    .creations
                    .iter()
                    .map(|c| binding(c).map_err(|why| (ResponseError::InvalidRequest, why)))
                    .collect(),
            };
        let valid: Vec<AclBinding> = checked.iter().filter_map(|c| c.clone().ok()).collect();
        let stored = if valid.is_empty() {
            Ok(())
        } else {
            ctx.acls.create(&valid)
        };
        if let Err(e) = &stored {
            tracing::error!(error = %e, "cannot store ACLs");
        }
        let results = checked
            .into_iter()
            .map(|c| match (c, &stored) {
                (Err(refused), _) => result(Some(refused)),
                (Ok(_), Ok(())) => result(None),
                (Ok(_), Err(e)) => result(Some((ResponseError::UnknownServerError, e.to_string()))),
            })
            .collect();
        Some(CreateAclsResponse::default().with_results(results))
    }
}
