//! CreatePartitions: grow a topic's partition count.

use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::{
    ApiKey, CreatePartitionsRequest, CreatePartitionsResponse, RequestHeader,
};
use kafka_protocol::protocol::{StrBytes, VersionRange};

use super::{Context, Handler, denial_message};
use crate::security::{AclOperation, Resource};

pub(super) struct CreatePartitions;

impl Handler for CreatePartitions {
    const KEY: ApiKey = ApiKey::CreatePartitions;
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 3 };
    const SHAPE: &'static super::shape::Shape = &super::shape::CREATE_PARTITIONS;
    type Request = CreatePartitionsRequest;
    type Response = CreatePartitionsResponse;

    async fn handle(
        ctx: &Arc<Context>,
        _: &RequestHeader,
        request: CreatePartitionsRequest,
    ) -> Option<CreatePartitionsResponse> {
        let results = request
            .topics
            .iter()
            .map(|t| {
                let result = CreatePartitionsTopicResult::default().with_name(t.name.clone());
                let bad_assignment = t.assignments.as_ref().is_some_and(|a| {
                    a.iter()
                        .any(|p| p.broker_ids.len() != 1 || p.broker_ids[0].0 != ctx.node_id)
                });
                let outcome =
                    if let Err(e) = ctx.check(AclOperation::Alter, Resource::topic(&t.name)) {
                        Err((e, denial_message(e)))
                    } else if bad_assignment {
                        Err((
                            ResponseError::InvalidReplicaAssignment,
                            format!("only broker {} exists", ctx.node_id),
                        ))
                    } else {
                        ctx.topics
                            .add_partitions(&t.name, t.count, request.validate_only)
                            .map_err(|e| (e.response_error(), e.to_string()))
                    };
                match outcome {
                    Ok(()) => result,
                    Err((error, message)) => result
                        .with_error_code(error.code())
                        .with_error_message(Some(StrBytes::from_string(message))),
                }
            })
            .collect();
        Some(CreatePartitionsResponse::default().with_results(results))
    }
}
