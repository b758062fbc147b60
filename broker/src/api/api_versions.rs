//! ApiVersions: what this broker serves, read off the routing table.

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, ApiVersionsResponse, RequestHeader};
use kafka_protocol::protocol::VersionRange;

use super::{ApiError, Context, Handler, ROUTES, encode_response};

pub(super) struct ApiVersions;

fn advertised() -> Vec<ApiVersion> {
    ROUTES
        .iter()
        .map(|r| {
            ApiVersion::default()
                .with_api_key(r.key as i16)
                .with_min_version(r.versions.min)
                .with_max_version(r.versions.max)
        })
        .collect()
}

impl Handler for ApiVersions {
    const KEY: ApiKey = ApiKey::ApiVersions;
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 3 };
    const SHAPE: &'static super::shape::Shape = &super::shape::API_VERSIONS;
    type Request = ApiVersionsRequest;
    type Response = ApiVersionsResponse;

    async fn handle(
        _: &Arc<Context>,
        _: &RequestHeader,
        _: ApiVersionsRequest,
    ) -> Option<ApiVersionsResponse> {
        Some(ApiVersionsResponse::default().with_api_keys(advertised()))
    }
}

/// The answer to an ApiVersions request in a version this broker does not know: error 35 in a
/// v0 body (always readable) listing what is supported, so the client retries with one of those.
pub(crate) fn unsupported_version_response(correlation_id: i32) -> Result<Bytes, ApiError> {
    let response = ApiVersionsResponse::default()
        .with_error_code(ResponseError::UnsupportedVersion.code())
        .with_api_keys(advertised());
    encode_response(ApiKey::ApiVersions, 0, correlation_id, &response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertises_exactly_the_routed_apis_within_codec_limits() {
        let advertised = advertised();
        assert_eq!(advertised.len(), ROUTES.len());
        for route in ROUTES {
            let codec = route.key.valid_versions();
            assert!(
                route.versions.min >= codec.min && route.versions.max <= codec.max,
                "{:?}",
                route.key
            );
        }
        for kip848 in [
            ApiKey::ConsumerGroupHeartbeat,
            ApiKey::ConsumerGroupDescribe,
        ] {
            assert!(advertised.iter().any(|a| a.api_key == kip848 as i16));
        }
    }
}
