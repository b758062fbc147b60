//! CreateTopics: new topics with a partition count and config overrides.

use std::collections::BTreeMap;
use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult,
};
use kafka_protocol::messages::{ApiKey, CreateTopicsRequest, CreateTopicsResponse, RequestHeader};
use kafka_protocol::protocol::{StrBytes, VersionRange};

use super::describe_configs::topic_entries;
use super::{Context, Handler, denial_message};

pub(super) struct CreateTopics;

fn create(ctx: &Context, wanted: &CreatableTopic, validate_only: bool) -> CreatableTopicResult {
    let result = CreatableTopicResult::default().with_name(wanted.name.clone());
    let fail = |error: ResponseError, message: String| {
        result
            .clone()
            .with_error_code(error.code())
            .with_error_message(Some(StrBytes::from_string(message)))
    };
    if !ctx.may_create_topic(&wanted.name) {
        let error = ResponseError::TopicAuthorizationFailed;
        return fail(error, denial_message(error));
    }
    let mut partitions = wanted.num_partitions;
    let mut replication = wanted.replication_factor;
    if !wanted.assignments.is_empty() {
        // Manual assignment: every replica list must be exactly this broker.
        if wanted
            .assignments
            .iter()
            .any(|a| a.broker_ids.len() != 1 || a.broker_ids[0].0 != ctx.node_id)
        {
            return fail(
                ResponseError::InvalidReplicaAssignment,
                format!("only broker {} exists", ctx.node_id),
            );
        }
        partitions = wanted.assignments.len() as i32;
        replication = 1;
    }
    let configs: BTreeMap<String, String> = wanted
        .configs
        .iter()
        .filter_map(|c| {
            c.value
                .as_ref()
                .map(|v| (c.name.to_string(), v.to_string()))
        })
        .collect();
    match ctx.topics.create(
        &wanted.name,
        partitions,
        replication,
        configs,
        validate_only,
    ) {
        Ok(topic) => {
            let count = if partitions == -1 {
                ctx.topics.broker_config().num_partitions
            } else {
                partitions
            };
            let configs = topic_entries(ctx, &topic.configs)
                .into_iter()
                .map(|e| {
                    CreatableTopicConfigs::default()
                        .with_name(StrBytes::from_static_str(e.name))
                        .with_value(Some(StrBytes::from_string(e.value)))
                        .with_config_source(e.source)
                })
                .collect();
            result
                .with_topic_id(topic.id)
                .with_num_partitions(count)
                .with_replication_factor(1)
                .with_configs(Some(configs))
        }
        Err(e) => fail(e.response_error(), e.to_string()),
    }
}

impl Handler for CreateTopics {
    const KEY: ApiKey = ApiKey::CreateTopics;
    const VERSIONS: VersionRange = VersionRange { min: 2, max: 7 };
    const SHAPE: &'static super::shape::Shape = &super::shape::CREATE_TOPICS;
    type Request = CreateTopicsRequest;
    type Response = CreateTopicsResponse;

    fn error_codes(response: &CreateTopicsResponse, count: &mut dyn FnMut(i16)) {
        for topic in &response.topics {
            count(topic.error_code);
        }
    }

    async fn handle(
        ctx: &Arc<Context>,
        _: &RequestHeader,
        request: CreateTopicsRequest,
    ) -> Option<CreateTopicsResponse> {
        let topics = request
            .topics
            .iter()
            .map(|t| create(ctx, t, request.validate_only))
            .collect();
        Some(CreateTopicsResponse::default().with_topics(topics))
    }
}
