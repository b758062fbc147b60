//! DeleteTopics: by name (v1-v5) or by name or id (v6).

use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::{
    ApiKey, DeleteTopicsRequest, DeleteTopicsResponse, RequestHeader, TopicName,
};
use kafka_protocol::protocol::{StrBytes, VersionRange};
use uuid::Uuid;

use super::{Context, Handler};
use crate::security::{AclOperation, Resource};

pub(super) struct DeleteTopics;

fn delete(ctx: &Context, name: Option<TopicName>, id: Uuid) -> DeletableTopicResult {
    let name = match name {
        Some(name) => Some(name.0.to_string()),
        None => ctx.topics.get_by_id(id).map(|t| t.name.clone()),
    };
    let Some(name) = name else {
        return DeletableTopicResult::default()
            .with_topic_id(id)
            .with_error_code(ResponseError::UnknownTopicId.code());
    };
    let result = DeletableTopicResult::default()
        .with_name(Some(TopicName(StrBytes::from_string(name.clone()))));
    if let Err(e) = ctx.check(AclOperation::Delete, Resource::topic(&name)) {
        return result.with_topic_id(id).with_error_code(e.code());
    }
    match ctx.topics.delete(&name) {
        Ok(topic) => result.with_topic_id(topic.id),
        Err(e) => result
            .with_topic_id(id)
            .with_error_code(e.response_error().code())
            .with_error_message(Some(StrBytes::from_string(e.to_string()))),
    }
}

impl Handler for DeleteTopics {
    const KEY: ApiKey = ApiKey::DeleteTopics;
    const VERSIONS: VersionRange = VersionRange { min: 1, max: 6 };
    const SHAPE: &'static super::shape::Shape = &super::shape::DELETE_TOPICS;
    type Request = DeleteTopicsRequest;
    type Response = DeleteTopicsResponse;

    fn error_codes(response: &DeleteTopicsResponse, count: &mut dyn FnMut(i16)) {
        for topic in &response.responses {
            count(topic.error_code);
        }
    }

    async fn handle(
        ctx: &Arc<Context>,
        _: &RequestHeader,
        request: DeleteTopicsRequest,
    ) -> Option<DeleteTopicsResponse> {
        let mut responses: Vec<_> = request
            .topic_names
            .into_iter()
            .map(|n| delete(ctx, Some(n), Uuid::nil()))
            .collect();
        responses.extend(
            request
                .topics
                .into_iter()
                .map(|t| delete(ctx, t.name, t.topic_id)),
        );
        Some(DeleteTopicsResponse::default().with_responses(responses))
    }
}
