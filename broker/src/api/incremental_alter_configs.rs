//! IncrementalAlterConfigs: set or delete topic config overrides. Broker settings are static.

use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::incremental_alter_configs_request::AlterConfigsResource;
use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::{
    ApiKey, IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse, RequestHeader,
};
use kafka_protocol::protocol::{StrBytes, VersionRange};

use super::describe_configs::{LIST, TOPIC, check_config_resource, topic_config_type};
use super::{Context, Handler, denial_message};
use crate::security::AclOperation;
use crate::topic_config::LogConfig;

pub(super) struct IncrementalAlterConfigs;

const SET: i8 = 0;
const DELETE: i8 = 1;
const APPEND: i8 = 2;
const SUBTRACT: i8 = 3;

/// A list config's items, as Kafka splits them.
fn items(value: &str) -> Vec<&str> {
    value
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .collect()
}

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
            (op @ (APPEND | SUBTRACT), Some(value)) => {
                let name = change.name.as_str();
                if topic_config_type(name) != LIST {
                    return Err((
                        ResponseError::InvalidConfig,
                        format!(
                            "topic config `{name}`: {} applies only to list configs",
                            if op == APPEND { "APPEND" } else { "SUBTRACT" }
                        ),
                    ));
                }
                // From the current value: the override, else the topic's effective value.
                let current = match configs.get(name) {
                    Some(current) => current.clone(),
                    None => LogConfig::resolve(ctx.topics.broker_config(), &topic.configs)
                        .ok()
                        .and_then(|effective| effective.value_of(name))
                        .unwrap_or_default(),
                };
                let mut list: Vec<&str> = items(&current);
                for item in items(value) {
                    if op == APPEND && !list.contains(&item) {
                        list.push(item);
                    } else if op == SUBTRACT {
                        list.retain(|have| *have != item);
                    }
                }
                let joined = list.join(",");
                configs.insert(name.to_owned(), joined);
            }
            (op, value) => {
                return Err((
                    ResponseError::InvalidRequest,
                    match value {
                        None => format!("operation {op} on `{}` needs a value", change.name),
                        Some(_) => format!("operation {op} on `{}` is not known", change.name),
                    },
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
