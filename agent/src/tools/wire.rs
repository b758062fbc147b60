//! The Kafka protocol spoken by the tools themselves, for the admin calls librdkafka has no
//! function for (transactions, ACLs, SCRAM users): one request at a time on one connection,
//! each at the highest version both sides speak (learnt with ApiVersions when the connection
//! opens); an API the broker does not advertise is an error naming the broker.

use std::collections::HashMap;

use anyhow::{Context, bail};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, RequestHeader, ResponseHeader,
};
use kafka_protocol::protocol::{Decodable, Encodable, Message, Request, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::REQUEST_TIMEOUT;

/// One connection to one broker, with the versions it serves.
pub(super) struct Connection {
    pub(super) address: String,
    stream: TcpStream,
    /// Api key → (min, max) version the broker serves.
    versions: HashMap<i16, (i16, i16)>,
    correlation_id: i32,
}

impl Connection {
    /// A connection to the first of the comma-separated `bootstrap` servers that answers.
    pub(super) async fn bootstrap(bootstrap: &str) -> anyhow::Result<Connection> {
        let mut failures = Vec::new();
        for address in bootstrap
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
        {
            match Connection::open(address).await {
                Ok(connection) => return Ok(connection),
                Err(e) => failures.push(format!("{e:#}")),
            }
        }
        if failures.is_empty() {
            bail!("--bootstrap-server names no server");
        }
        bail!("{}", failures.join("; "))
    }

    /// Connects to `address` and asks which versions it serves.
    pub(super) async fn open(address: &str) -> anyhow::Result<Connection> {
        let stream = tokio::time::timeout(REQUEST_TIMEOUT, TcpStream::connect(address))
            .await
            .map_err(|_| anyhow::anyhow!("connecting to broker {address} timed out"))?
            .with_context(|| format!("cannot connect to broker {address}"))?;
        let mut connection = Connection {
            address: address.to_owned(),
            stream,
            versions: HashMap::new(),
            correlation_id: 0,
        };
        // Version 0: every broker serves it, and its response header is version 0 always.
        let response: ApiVersionsResponse =
            connection.call(0, &ApiVersionsRequest::default()).await?;
        if let Some(e) = ResponseError::try_from_code(response.error_code) {
            bail!("broker {address} refused ApiVersions: {e}");
        }
        connection.versions = response
            .api_keys
            .iter()
            .map(|k| (k.api_key, (k.min_version, k.max_version)))
            .collect();
        Ok(connection)
    }

    /// The highest version of `R` that the broker and this tool both speak.
    pub(super) fn version<R: Request>(&self) -> anyhow::Result<i16> {
        let name = api_name(R::KEY);
        let Some(&(min, max)) = self.versions.get(&R::KEY) else {
            bail!("broker {} does not support {name}", self.address);
        };
        let ours = <R as Message>::VERSIONS;
        let version = max.min(ours.max);
        if version < min.max(ours.min) {
            bail!(
                "broker {} serves {name} versions {min} to {max}; this tool speaks {} to {}",
                self.address,
                ours.min,
                ours.max
            );
        }
        Ok(version)
    }

    /// Sends `request` at `version` and reads its response.
    pub(super) async fn call<R: Request>(
        &mut self,
        version: i16,
        request: &R,
    ) -> anyhow::Result<R::Response> {
        let name = api_name(R::KEY);
        let address = self.address.clone();
        let exchange = async {
            self.correlation_id += 1;
            let header = RequestHeader::default()
                .with_request_api_key(R::KEY)
                .with_request_api_version(version)
                .with_correlation_id(self.correlation_id)
                .with_client_id(Some(StrBytes::from_static_str("agent-tools")));
            let mut body = BytesMut::new();
            header.encode(&mut body, R::header_version(version))?;
            request.encode(&mut body, version)?;
            let mut frame = BytesMut::with_capacity(body.len() + 4);
            frame.put_u32(body.len() as u32);
            frame.extend_from_slice(&body);
            self.stream.write_all(&frame).await?;
            let mut size = [0u8; 4];
            self.stream.read_exact(&mut size).await?;
            let mut buf = vec![0u8; u32::from_be_bytes(size) as usize];
            self.stream.read_exact(&mut buf).await?;
            let mut buf = Bytes::from(buf);
            let header = ResponseHeader::decode(
                &mut buf,
                <R::Response as kafka_protocol::protocol::HeaderVersion>::header_version(version),
            )?;
            if header.correlation_id != self.correlation_id {
                bail!(
                    "the response has correlation id {}, not {}",
                    header.correlation_id,
                    self.correlation_id
                );
            }
            let response = R::Response::decode(&mut buf, version)?;
            if buf.has_remaining() {
                bail!("{} bytes left after the response", buf.remaining());
            }
            Ok(response)
        };
        match tokio::time::timeout(REQUEST_TIMEOUT, exchange).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(e)) => Err(e.context(format!("{name} v{version} to broker {address} failed"))),
            Err(_) => {
                bail!("{name} v{version} to broker {address}: no answer within {REQUEST_TIMEOUT:?}")
            }
        }
    }
}

pub(super) fn api_name(key: i16) -> String {
    ApiKey::try_from(key).map_or_else(|_| format!("API {key}"), |k| format!("{k:?}"))
}
