//! DescribeUserScramCredentials (KIP-554): the users with SCRAM credentials and, for each,
//! the mechanisms and iteration counts (never salts or keys), as `kafka-configs.sh --describe
//! --entity-type users` and `agent users --list` show them.

use std::collections::BTreeSet;
use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use kafka_protocol::messages::{
    ApiKey, DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse,
    RequestHeader,
};
use kafka_protocol::protocol::{StrBytes, VersionRange};

use super::{Context, Handler, denial_message, text};
use crate::security::scram::ScramMechanism;
use crate::security::{AclOperation, Resource};

pub(super) struct DescribeUserScramCredentials;

fn described(
    user: &str,
    credentials: &[(ScramMechanism, i32)],
) -> DescribeUserScramCredentialsResult {
    DescribeUserScramCredentialsResult::default()
        .with_user(text(user))
        .with_credential_infos(
            credentials
                .iter()
                .map(|(m, iterations)| {
                    CredentialInfo::default()
                        .with_mechanism(m.kafka_type())
                        .with_iterations(*iterations)
                })
                .collect(),
        )
}

fn failed(user: &str, error: ResponseError, message: String) -> DescribeUserScramCredentialsResult {
    DescribeUserScramCredentialsResult::default()
        .with_user(text(user))
        .with_error_code(error.code())
        .with_error_message(Some(StrBytes::from_string(message)))
}

impl Handler for DescribeUserScramCredentials {
    const KEY: ApiKey = ApiKey::DescribeUserScramCredentials;
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 0 };
    const SHAPE: &'static super::shape::Shape = &super::shape::DESCRIBE_USER_SCRAM_CREDENTIALS;
    type Request = DescribeUserScramCredentialsRequest;
    type Response = DescribeUserScramCredentialsResponse;

    async fn handle(
        ctx: &Arc<Context>,
        _: &RequestHeader,
        request: DescribeUserScramCredentialsRequest,
    ) -> Option<DescribeUserScramCredentialsResponse> {
        // Kafka: Describe on the cluster.
        if let Err(error) = ctx.check(AclOperation::Describe, Resource::cluster()) {
            return Some(
                DescribeUserScramCredentialsResponse::default()
                    .with_error_code(error.code())
                    .with_error_message(Some(StrBytes::from_string(denial_message(error)))),
            );
        }
        let users = match ctx.credentials.users() {
            Ok(users) => users,
            Err(e) => {
                tracing::warn!(error = %e, "cannot describe SCRAM credentials");
                return Some(
                    DescribeUserScramCredentialsResponse::default()
                        .with_error_code(ResponseError::UnknownServerError.code())
                        .with_error_message(Some(StrBytes::from_string(e.to_string()))),
                );
            }
        };
        let results = match request.users {
            // Null or empty: every user.
            None => users.iter().map(|(u, c)| described(u, c)).collect(),
            Some(list) if list.is_empty() => users.iter().map(|(u, c)| described(u, c)).collect(),
            Some(list) => {
                let mut seen = BTreeSet::new();
                let duplicated: BTreeSet<&str> = list
                    .iter()
                    .filter(|u| !seen.insert(u.name.as_str()))
                    .map(|u| u.name.as_str())
                    .collect();
                let mut answered = BTreeSet::new();
                list.iter()
                    .filter(|u| answered.insert(u.name.as_str()))
                    .map(|u| {
                        let name = u.name.as_str();
                        if duplicated.contains(name) {
                            failed(
                                name,
                                ResponseError::DuplicateResource,
                                format!("Cannot describe SCRAM credentials for the same user twice in a single request: {name}"),
                            )
                        } else {
                            match users.get(name) {
                                Some(c) => described(name, c),
                                None => failed(
                                    name,
                                    ResponseError::ResourceNotFound,
                                    format!("Attempt to describe a user credential that does not exist: {name}"),
                                ),
                            }
                        }
                    })
                    .collect()
            }
        };
        Some(DescribeUserScramCredentialsResponse::default().with_results(results))
    }
}
