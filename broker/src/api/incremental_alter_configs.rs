//! IncrementalAlterConfigs: set or delete topic config overrides. Broker settings are static.

use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::incremental_alter_configs_request::AlterConfigsResource;
use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::{
    ApiKey, IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse, RequestHeader,
};
use kafka_protocol::protocol::{StrBytes, VersionRange};

use super::describe_configs::{TOPIC, check_config_resource};
use super::{Context, Handler, denial_message};
use crate::security::AclOperation;

pub(super) struct IncrementalAlterConfigs;

const SET: i8 = 0;
const DELETE: i8 = 1;

fn alter(
    ctx: &Context,
    resource: &AlterConfigsResource,
    validate_only: bool,
) -> Result<(), (ResponseError, String)> {
    let (kind, name) = (resource.resource_type, &resource.resource_name);
    check_config_resource(ctx, AclOperation::AlterConfigs, kind, name)
        .map_err(|e| (e, denial_message(e)))?;
    if resource.resource_type != TOPIC {
        return Err((
            ResponseError::InvalidRequest,
            "only topic configs can be altered; broker settings are static".into(),
        ));
    }
    let topic = ctx.topics.get(&resource.resource_name).ok_or_else(|| {
        (
            ResponseError::UnknownTopicOrPartition,
            format!("topic `{}` does not exist", resource.resource_name),
        )
    })?;
    let mut configs = topic.configs.clone();
    for change in &resource.configs {
        match (change.config_operation, &change.value) {
            (SET, Some(value)) => {
                configs.insert(change.name.to_string(), value.to_string());
            }
            (DELETE, _) => {
                configs.remove(change.name.as_str());
            }
            (op, _) => {
                return Err((
                    ResponseError::InvalidRequest,
                    format!("operation {op} on `{}` is not supported", change.name),
                ));
            }
        }
    }
    ctx.topics
        .set_configs(&topic.name, configs, validate_only)
        .map_err(|e| (e.response_error(), e.to_string()))
}

impl Handler for IncrementalAlterConfigs {
    const KEY: ApiKey = ApiKey::IncrementalAlterConfigs;
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 1 };
    const SHAPE: &'static super::shape::Shape = &super::shape::INCREMENTAL_ALTER_CONFIGS;
    type Request = IncrementalAlterConfigsRequest;
    type Response = IncrementalAlterConfigsResponse;

    async fn handle(
        ctx: &Arc<Context>,
        _: &RequestHeader,
        request: IncrementalAlterConfigsRequest,
    ) -> Option<IncrementalAlterConfigsResponse> {
        let responses = request
            .resources
            .iter()
            .map(|resource| {
                let response = AlterConfigsResourceResponse::default()
                    .with_resource_type(resource.resource_type)
                    .with_resource_name(resource.resource_name.clone());
                match alter(ctx, resource, request.validate_only) {
                    Ok(()) => response,
                    Err((error, message)) => response
                        .with_error_code(error.code())
                        .with_error_message(Some(StrBytes::from_string(message))),
                }
            })
            .collect();
        Some(IncrementalAlterConfigsResponse::default().with_responses(responses))
    }
}
