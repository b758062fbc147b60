//! DescribeConfigs: topic configs (overrides and defaults) and the broker's static settings.

use std::collections::BTreeMap;
use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::{
    ApiKey, DescribeConfigsRequest, DescribeConfigsResponse, RequestHeader,
};
use kafka_protocol::protocol::{StrBytes, VersionRange};

use super::{Context, Handler};
use crate::config::BrokerConfig;
use crate::security::{AclOperation, Resource};
use crate::topic_config::{INERT_TOPIC_CONFIGS, Inert, LogConfig, TOPIC_CONFIGS};

pub(super) struct DescribeConfigs;

/// Kafka's resource types.
pub(super) const TOPIC: i8 = 2;
pub(super) const BROKER: i8 = 4;

/// The check of a config resource: `operation` (DescribeConfigs, AlterConfigs) on the topic,
/// or on the cluster for a broker.
pub(super) fn check_config_resource(
    ctx: &Context,
    operation: AclOperation,
    resource_type: i8,
    name: &str,
) -> Result<(), ResponseError> {
    match resource_type {
        TOPIC => ctx.check(operation, Resource::topic(name)),
        BROKER => ctx.check(operation, Resource::cluster()),
        _ => Ok(()),
    }
}

/// Kafka's config sources.
const TOPIC_CONFIG: i8 = 1;
const STATIC_BROKER_CONFIG: i8 = 4;
const DEFAULT_CONFIG: i8 = 5;

/// Kafka's config types.
const BOOLEAN: i8 = 1;
const STRING: i8 = 2;
const INT: i8 = 3;
const LONG: i8 = 5;
const DOUBLE: i8 = 6;
pub(super) const LIST: i8 = 7;

/// One config value as described to clients.
pub(super) struct ConfigEntry {
    pub(super) name: &'static str,
    pub(super) value: String,
    pub(super) source: i8,
    pub(super) config_type: i8,
    pub(super) read_only: bool,
}

pub(super) fn topic_config_type(name: &str) -> i8 {
    if let Some((.., kind)) = INERT_TOPIC_CONFIGS.iter().find(|(n, ..)| *n == name) {
        return match kind {
            Inert::Bool => BOOLEAN,
            Inert::Int { long: false, .. } => INT,
            Inert::Int { long: true, .. } => LONG,
            Inert::Replicas => LIST,
            Inert::Text => STRING,
        };
    }
    match name {
        "cleanup.policy" => LIST,
        "compression.type" | "message.timestamp.type" => STRING,
        "min.cleanable.dirty.ratio" => DOUBLE,
        "index.interval.bytes" | "max.message.bytes" | "min.insync.replicas" | "segment.bytes" => {
            INT
        }
        _ => LONG,
    }
}

/// Every topic config with its effective value given these overrides.
pub(super) fn topic_entries(
    ctx: &Context,
    overrides: &BTreeMap<String, String>,
) -> Vec<ConfigEntry> {
    let broker = ctx.topics.broker_config();
    let effective = LogConfig::resolve(broker, overrides)
        .or_else(|_| LogConfig::resolve(broker, &BTreeMap::new()));
    let Ok(effective) = effective else {
        return Vec::new();
    };
    // Kafka's own defaults, to tell a default apart from a broker setting.
    let kafka_defaults = LogConfig::resolve(&BrokerConfig::default(), &BTreeMap::new()).ok();
    let mut names: Vec<&'static str> = TOPIC_CONFIGS
        .iter()
        .map(|(name, _)| *name)
        .chain(INERT_TOPIC_CONFIGS.iter().map(|(name, ..)| *name))
        .collect();
    names.sort_unstable();
    names
        .into_iter()
        .filter_map(|name| {
            let value = effective.value_of(name)?;
            let source = if overrides.contains_key(name) {
                TOPIC_CONFIG
            } else if kafka_defaults
                .as_ref()
                .and_then(|d| d.value_of(name))
                .as_ref()
                == Some(&value)
            {
                DEFAULT_CONFIG
            } else {
                STATIC_BROKER_CONFIG
            };
            Some(ConfigEntry {
                name,
                value,
                source,
                config_type: topic_config_type(name),
                read_only: false,
            })
        })
        .collect()
}

fn broker_entries(ctx: &Context) -> Vec<ConfigEntry> {
    let c = ctx.topics.broker_config();
    let optional = |v: Option<i64>| v.unwrap_or(i64::MAX).to_string();
    let entry = |name, value: String, config_type| ConfigEntry {
        name,
        value,
        source: STATIC_BROKER_CONFIG,
        config_type,
        read_only: true,
    };
    vec![
        entry(
            "auto.create.topics.enable",
            c.auto_create_topics_enable.to_string(),
            BOOLEAN,
        ),
        entry(
            "connections.max.idle.ms",
            c.connections_max_idle_ms.to_string(),
            LONG,
        ),
        entry(
            "log.flush.interval.messages",
            optional(c.log_flush_interval_messages),
            LONG,
        ),
        entry(
            "log.flush.interval.ms",
            optional(c.log_flush_interval_ms),
            LONG,
        ),
        entry(
            "log.index.interval.bytes",
            c.log_index_interval_bytes.to_string(),
            INT,
        ),
        entry(
            "log.retention.bytes",
            c.log_retention_bytes.to_string(),
            LONG,
        ),
        entry(
            "log.retention.check.interval.ms",
            c.log_retention_check_interval_ms.to_string(),
            LONG,
        ),
        entry("log.retention.ms", c.log_retention_ms.to_string(), LONG),
        entry("log.roll.ms", c.log_roll_ms.to_string(), LONG),
        entry("log.segment.bytes", c.log_segment_bytes.to_string(), INT),
        entry("max.connections", c.max_connections.to_string(), INT),
        entry(
            "max.connections.per.ip",
            c.max_connections_per_ip
                .unwrap_or(i32::MAX as u32)
                .to_string(),
            INT,
        ),
        entry("message.max.bytes", c.message_max_bytes.to_string(), INT),
        entry("node.id", c.node_id.to_string(), INT),
        entry("num.partitions", c.num_partitions.to_string(), INT),
        entry(
            "queued.max.request.bytes",
            c.queued_max_request_bytes.to_string(),
            LONG,
        ),
        entry(
            "sasl.server.max.receive.size",
            c.sasl_server_max_receive_size.to_string(),
            INT,
        ),
        entry(
            "socket.request.max.bytes",
            c.socket_request_max_bytes.to_string(),
            INT,
        ),
    ]
}

impl Handler for DescribeConfigs {
    const KEY: ApiKey = ApiKey::DescribeConfigs;
    const VERSIONS: VersionRange = VersionRange { min: 1, max: 4 };
    const SHAPE: &'static super::shape::Shape = &super::shape::DESCRIBE_CONFIGS;
    type Request = DescribeConfigsRequest;
    type Response = DescribeConfigsResponse;

    async fn handle(
        ctx: &Arc<Context>,
        _: &RequestHeader,
        request: DescribeConfigsRequest,
    ) -> Option<DescribeConfigsResponse> {
        let results = request
            .resources
            .into_iter()
            .map(|resource| {
                let result = DescribeConfigsResult::default()
                    .with_resource_type(resource.resource_type)
                    .with_resource_name(resource.resource_name.clone());
                let checked = check_config_resource(
                    ctx,
                    AclOperation::DescribeConfigs,
                    resource.resource_type,
                    &resource.resource_name,
                );
                if let Err(e) = checked {
                    return result.with_error_code(e.code());
                }
                let entries = match resource.resource_type {
                    TOPIC => match ctx.topics.get(&resource.resource_name) {
                        Some(topic) => topic_entries(ctx, &topic.configs),
                        None => {
                            return result
                                .with_error_code(ResponseError::UnknownTopicOrPartition.code());
                        }
                    },
                    BROKER
                        if resource.resource_name.is_empty()
                            || *resource.resource_name == *ctx.node_id.to_string() =>
                    {
                        broker_entries(ctx)
                    }
                    _ => {
                        return result
                            .with_error_code(ResponseError::InvalidRequest.code())
                            .with_error_message(Some(StrBytes::from_static_str(
                                "unknown resource",
                            )));
                    }
                };
                let configs = entries
                    .into_iter()
                    .filter(|e| {
                        resource.configuration_keys.as_ref().is_none_or(|keys| {
                            keys.is_empty() || keys.iter().any(|k| **k == *e.name)
                        })
                    })
                    .map(|e| {
                        // The value's source first, as Kafka lists synonyms: a topic
                        // override is its own synonym.
                        let synonyms = if request.include_synonyms && e.source == TOPIC_CONFIG {
                            vec![
                                DescribeConfigsSynonym::default()
                                    .with_name(StrBytes::from_static_str(e.name))
                                    .with_value(Some(StrBytes::from_string(e.value.clone())))
                                    .with_source(TOPIC_CONFIG),
                            ]
                        } else {
                            Vec::new()
                        };
                        DescribeConfigsResourceResult::default()
                            .with_name(StrBytes::from_static_str(e.name))
                            .with_synonyms(synonyms)
                            .with_value(Some(StrBytes::from_string(e.value)))
                            .with_read_only(e.read_only)
                            .with_config_source(e.source)
                            .with_config_type(e.config_type)
                    })
                    .collect();
                result.with_configs(configs)
            })
            .collect();
        Some(DescribeConfigsResponse::default().with_results(results))
    }
}
