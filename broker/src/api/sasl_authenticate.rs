//! SaslAuthenticate: one message of the SASL exchange chosen by SaslHandshake.
//!
//! Served by the connection itself before authentication ([`authenticate`]); through the
//! routes (no SASL on the listener, or already authenticated) it answers ILLEGAL_SASL_STATE.
//! A failed exchange answers SASL_AUTHENTICATION_FAILED with Kafka's message, then the
//! connection is closed. Sessions do not expire (`session_lifetime_ms` 0): KIP-368
//! re-authentication is not asked for.

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::{
    ApiKey, RequestHeader, SaslAuthenticateRequest, SaslAuthenticateResponse,
};
use kafka_protocol::protocol::{StrBytes, VersionRange};

use super::{ApiError, Context, Frame, Handler, decode_request, response_frame};
use crate::security::Principal;
use crate::security::sasl::{Authenticator, Step, failure_message};

pub(super) struct SaslAuthenticate;

impl Handler for SaslAuthenticate {
    const KEY: ApiKey = ApiKey::SaslAuthenticate;
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 2 };
    const SHAPE: &'static super::shape::Shape = &super::shape::SASL_AUTHENTICATE;
    type Request = SaslAuthenticateRequest;
    type Response = SaslAuthenticateResponse;

    async fn handle(
        _: &Arc<Context>,
        _: &RequestHeader,
        _: SaslAuthenticateRequest,
    ) -> Option<SaslAuthenticateResponse> {
        Some(illegal_state())
    }
}

fn illegal_state() -> SaslAuthenticateResponse {
    SaslAuthenticateResponse::default()
        .with_error_code(ResponseError::IllegalSaslState.code())
        .with_error_message(Some(StrBytes::from_static_str(
            "SaslAuthenticate request received without a SaslHandshake before it, or after \
             authentication",
        )))
}

/// What the connection does after a SaslAuthenticate.
pub(crate) struct Authenticated {
    /// The response.
    pub(crate) frame: Frame,
    /// The principal, when the exchange succeeded with this message.
    pub(crate) principal: Option<Principal>,
    /// Close the connection after the response (the exchange failed).
    pub(crate) close: bool,
}

/// Serves a SaslAuthenticate on a connection that is authenticating.
pub(crate) fn authenticate(
    ctx: &Context,
    auth: &mut Authenticator,
    header: &RequestHeader,
    body: Bytes,
) -> Result<Authenticated, ApiError> {
    let request = decode_request::<SaslAuthenticate>(header, body)?;
    let (response, principal, close) =
        match auth.authenticate(&request.auth_bytes, &ctx.credentials) {
            Step::Continue(reply) => (
                SaslAuthenticateResponse::default().with_auth_bytes(Bytes::from(reply)),
                None,
                false,
            ),
            Step::Done { principal, reply } => (
                SaslAuthenticateResponse::default()
                    .with_auth_bytes(Bytes::from(reply))
                    .with_session_lifetime_ms(0),
                Some(principal),
                false,
            ),
            Step::Failed { mechanism, reason } => {
                tracing::info!(
                    client = %crate::security::session().client_host,
                    mechanism = mechanism.map_or("?", |m| m.name()),
                    %reason,
                    "SASL authentication failed"
                );
                let response = SaslAuthenticateResponse::default()
                    .with_error_code(ResponseError::SaslAuthenticationFailed.code())
                    .with_error_message(Some(StrBytes::from_string(failure_message(mechanism))));
                (response, None, true)
            }
            Step::IllegalState => (illegal_state(), None, true),
        };
    Ok(Authenticated {
        frame: response_frame::<SaslAuthenticate>(header, response)?,
        principal,
        close,
    })
}
