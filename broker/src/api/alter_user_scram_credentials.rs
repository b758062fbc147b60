//! AlterUserScramCredentials (KIP-554): adds, replaces and deletes users' SCRAM credentials,
//! as `kafka-configs.sh --alter --add-config 'SCRAM-SHA-256=[iterations=8192,password=...]'
//! --entity-type users --entity-name alice` and `agent users` send them. The client salts the
//! password itself: the request carries the salt, the iterations and the salted password, from
//! which the stored and server keys are derived here; no password reaches the broker.
//!
//! Each user gets one result: any invalid alteration of a user fails all of that user's
//! alterations; the valid users' alterations are stored in one transaction. Users of the
//! broker configuration cannot be altered (their credentials are made from the config file
//! at every start).

use std::collections::BTreeSet;
use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse, ApiKey, RequestHeader,
};
use kafka_protocol::protocol::{StrBytes, VersionRange};

use super::{Context, Handler, denial_message, text};
use crate::security::scram::{MAX_ITERATIONS, MIN_ITERATIONS, ScramCredential, ScramMechanism};
use crate::security::{AclOperation, Resource};

pub(super) struct AlterUserScramCredentials;

type Refusal = (ResponseError, String);

fn mechanism(t: i8) -> Result<ScramMechanism, Refusal> {
    ScramMechanism::from_kafka_type(t).ok_or_else(|| {
        (
            ResponseError::UnsupportedSaslMechanism,
            format!("Unknown SCRAM mechanism {t}: expected 1 (SCRAM-SHA-256) or 2 (SCRAM-SHA-512)"),
        )
    })
}

impl Handler for AlterUserScramCredentials {
    const KEY: ApiKey = ApiKey::AlterUserScramCredentials;
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 0 };
    const SHAPE: &'static super::shape::Shape = &super::shape::ALTER_USER_SCRAM_CREDENTIALS;
    type Request = AlterUserScramCredentialsRequest;
    type Response = AlterUserScramCredentialsResponse;

    async fn handle(
        ctx: &Arc<Context>,
        _: &RequestHeader,
        request: AlterUserScramCredentialsRequest,
    ) -> Option<AlterUserScramCredentialsResponse> {
        // Kafka: Alter on the cluster, else every user named is refused.
        if let Err(error) = ctx.check(AclOperation::Alter, Resource::cluster()) {
            let mut named = BTreeSet::new();
            let users = request.deletions.iter().map(|d| &d.name);
            let results = users
                .chain(request.upsertions.iter().map(|u| &u.name))
                .filter(|user| named.insert(user.as_str()))
                .map(|user| {
                    AlterUserScramCredentialsResult::default()
                        .with_user(user.clone())
                        .with_error_code(error.code())
                        .with_error_message(Some(StrBytes::from_string(denial_message(error))))
                })
                .collect();
            return Some(AlterUserScramCredentialsResponse::default().with_results(results));
        }
        let stored = match ctx.credentials.catalog().scram_users() {
            Ok(users) => users,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read SCRAM credentials");
                Default::default()
            }
        };
        // Users in the order of the request, each with its first refusal, if any.
        let mut users: Vec<(String, Option<Refusal>)> = Vec::new();
        let mut refuse = |user: &str, refusal: Option<Refusal>| match users
            .iter_mut()
            .find(|(u, _)| u == user)
        {
            Some((_, first)) => {
                if first.is_none() {
                    *first = refusal;
                }
            }
            None => users.push((user.to_owned(), refusal)),
        };
        let mut altered: BTreeSet<(String, ScramMechanism)> = BTreeSet::new();
        let mut deletions = Vec::new();
        let mut upsertions = Vec::new();
        let mut check_common = |user: &str, t: i8| -> Result<ScramMechanism, Refusal> {
            if user.is_empty() {
                return Err((
                    ResponseError::UnacceptableCredential,
                    "Username must not be empty".into(),
                ));
            }
            if ctx.credentials.is_configured(user) {
                return Err((
                    ResponseError::InvalidRequest,
                    format!("User {user} is defined in the broker configuration; change it there"),
                ));
            }
            let m = mechanism(t)?;
            if !altered.insert((user.to_owned(), m)) {
                return Err((
                    ResponseError::DuplicateResource,
                    format!(
                        "A user credential cannot be altered twice in the same request: {user} {}",
                        m.name()
                    ),
                ));
            }
            Ok(m)
        };
        for deletion in &request.deletions {
            let user = deletion.name.as_str();
            let checked = check_common(user, deletion.mechanism).and_then(|m| {
                let exists = stored
                    .get(user)
                    .is_some_and(|c| c.iter().any(|(sm, _)| *sm == m));
                if exists {
                    Ok(m)
                } else {
                    Err((
                        ResponseError::ResourceNotFound,
                        format!(
                            "Attempt to delete a user credential that does not exist: {user} {}",
                            m.name()
                        ),
                    ))
                }
            });
            match checked {
                Ok(m) => {
                    deletions.push((user.to_owned(), m));
                    refuse(user, None);
                }
                Err(refusal) => refuse(user, Some(refusal)),
            }
        }
        for upsertion in &request.upsertions {
            let user = upsertion.name.as_str();
            let checked = check_common(user, upsertion.mechanism).and_then(|m| {
                let unacceptable =
                    |message: String| Err((ResponseError::UnacceptableCredential, message));
                if upsertion.iterations < MIN_ITERATIONS {
                    return unacceptable(format!(
                        "Too few iterations: {} is below the minimum {MIN_ITERATIONS} for {}",
                        upsertion.iterations,
                        m.name()
                    ));
                }
                if upsertion.iterations > MAX_ITERATIONS {
                    return unacceptable(format!(
                        "Too many iterations: {} is above the maximum {MAX_ITERATIONS} for {}",
                        upsertion.iterations,
                        m.name()
                    ));
                }
                if upsertion.salt.is_empty() {
                    return unacceptable("Salt must not be empty".into());
                }
                let expected = match m {
                    ScramMechanism::Sha256 => 32,
                    ScramMechanism::Sha512 => 64,
                };
                if upsertion.salted_password.len() != expected {
                    return unacceptable(format!(
                        "Salted password of {} bytes: {} needs {expected}",
                        upsertion.salted_password.len(),
                        m.name()
                    ));
                }
                Ok(ScramCredential::from_salted_password(
                    m,
                    upsertion.salt.to_vec(),
                    upsertion.iterations,
                    &upsertion.salted_password,
                ))
            });
            match checked {
                Ok(credential) => {
                    upsertions.push((user.to_owned(), credential));
                    refuse(user, None);
                }
                Err(refusal) => refuse(user, Some(refusal)),
            }
        }
        // A user with any refusal has none of its alterations applied.
        let refused: BTreeSet<String> = users
            .iter()
            .filter(|(_, r)| r.is_some())
            .map(|(u, _)| u.clone())
            .collect();
        deletions.retain(|(u, _)| !refused.contains(u));
        upsertions.retain(|(u, _)| !refused.contains(u));
        let stored = ctx
            .credentials
            .catalog()
            .alter_scram_credentials(&deletions, &upsertions);
        if let Err(e) = &stored {
            tracing::warn!(error = %e, "cannot store SCRAM credentials");
        }
        let results = users
            .into_iter()
            .map(|(user, refusal)| {
                let refusal = refusal.or_else(|| {
                    stored
                        .as_ref()
                        .err()
                        .map(|e| (ResponseError::UnknownServerError, e.to_string()))
                });
                let result = AlterUserScramCredentialsResult::default().with_user(text(&user));
                match refusal {
                    None => result,
                    Some((error, message)) => result
                        .with_error_code(error.code())
                        .with_error_message(Some(StrBytes::from_string(message))),
                }
            })
            .collect();
        Some(AlterUserScramCredentialsResponse::default().with_results(results))
    }
}
