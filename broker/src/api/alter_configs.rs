//! AlterConfigs: replace a topic's config overrides with the given set (the older,
//! non-incremental API, which librdkafka's and kafka-python's `alter_configs` use). Broker
//! settings are static.

use std::collections::BTreeMap;
use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::alter_configs_request::AlterConfigsResource;
use kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::{AlterConfigsRequest, AlterConfigsResponse, ApiKey, RequestHeader};
use kafka_protocol::protocol::{StrBytes, VersionRange};

use super::describe_configs::{TOPIC, check_config_resource};
use super::{Context, Handler, denial_message};
use crate::security::AclOperation;

pub(super) struct AlterConfigs;

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
    // Unlike IncrementalAlterConfigs, the request is the complete new set of overrides.
    let configs: BTreeMap<String, String> = resource
        .configs
        .iter()
        .filter_map(|c| Some((c.name.to_string(), c.value.as_ref()?.to_string())))
        .collect();
    ctx.topics
        .set_configs(&topic.name, configs, validate_only)
        .map_err(|e| (e.response_error(), e.to_string()))
}

impl Handler for AlterConfigs {
    const KEY: ApiKey = ApiKey::AlterConfigs;
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 2 };
    const SHAPE: &'static super::shape::Shape = &super::shape::ALTER_CONFIGS;
    type Request = AlterConfigsRequest;
    type Response = AlterConfigsResponse;

    async fn handle(
        ctx: &Arc<Context>,
        _: &RequestHeader,
        request: AlterConfigsRequest,
    ) -> Option<AlterConfigsResponse> {
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
        Some(AlterConfigsResponse::default().with_responses(responses))
    }
}
