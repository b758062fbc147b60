//! SaslHandshake: the client names the SASL mechanism it will authenticate with.
//!
//! Authentication belongs to the connection, which serves this API itself on a `sasl_*`
//! listener before authentication ([`handshake`]). Reached through the routes (a listener
//! without SASL, or a connection already authenticated), it answers ILLEGAL_SASL_STATE, as
//! Kafka does. Version 0 is advertised but refused by closing the connection with a log line:
//! after a v0 handshake the tokens would follow without Kafka framing, which no current client
//! sends (librdkafka, kcat, confluent-kafka, kafka-python and the Java client use v1), but
//! librdkafka only takes a broker for a SASL one when ApiVersions lists v0.

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::{
    ApiKey, RequestHeader, SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::{StrBytes, VersionRange};

use super::{ApiError, Context, Frame, Handler, decode_request, response_frame};
use crate::security::sasl::{Authenticator, HandshakeRefusal};

pub(super) struct SaslHandshake;

impl Handler for SaslHandshake {
    const KEY: ApiKey = ApiKey::SaslHandshake;
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 1 };
    const SHAPE: &'static super::shape::Shape = &super::shape::SASL_HANDSHAKE;
    type Request = SaslHandshakeRequest;
    type Response = SaslHandshakeResponse;

    async fn handle(
        _: &Arc<Context>,
        _: &RequestHeader,
        _: SaslHandshakeRequest,
    ) -> Option<SaslHandshakeResponse> {
        Some(
            SaslHandshakeResponse::default()
                .with_error_code(ResponseError::IllegalSaslState.code()),
        )
    }
}

/// Serves a SaslHandshake on a connection that is authenticating; `true` with the frame
/// when the connection is to be closed after it (an unsupported mechanism, a second
/// handshake).
pub(crate) fn handshake(
    auth: &mut Authenticator,
    header: &RequestHeader,
    body: Bytes,
) -> Result<(Frame, bool), ApiError> {
    let request = decode_request::<SaslHandshake>(header, body)?;
    let mechanisms: Vec<StrBytes> = auth.enabled().map(StrBytes::from_static_str).collect();
    let (error, close) = match auth.handshake(&request.mechanism) {
        Ok(()) => (None, false),
        Err(HandshakeRefusal::Unsupported) => {
            tracing::info!(
                mechanism = %request.mechanism,
                enabled = %auth.enabled().collect::<Vec<_>>().join(", "),
                "SASL mechanism not enabled on this listener"
            );
            (Some(ResponseError::UnsupportedSaslMechanism), true)
        }
        Err(HandshakeRefusal::IllegalState) => (Some(ResponseError::IllegalSaslState), true),
    };
    let response = SaslHandshakeResponse::default()
        .with_error_code(error.map_or(0, |e| e.code()))
        .with_mechanisms(mechanisms);
    Ok((response_frame::<SaslHandshake>(header, response)?, close))
}
