//! One client connection: size-prefixed frames in, responses out in request order.
//!
//! ```text
//! request:  | size i32 | api_key i16 | api_version i16 | correlation_id i32 | client_id | [tags] | body |
//! response: | size i32 | correlation_id i32 | [tags] | body |
//! ```
//!
//! Requests on one connection are served one at a time, which keeps responses in request
//! order as the protocol requires; clients pipeline many requests per connection, so reading
//! and writing are buffered and a response is flushed only when no further whole request is
//! already waiting. The size is checked against `socket.request.max.bytes` before anything is
//! allocated. Anything the broker cannot make sense of (a bad size, an unknown API or version,
//! a body that does not decode) closes this connection only, with a log line.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader};
use kafka_protocol::protocol::Decodable;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;

use crate::api::{self, ApiError, Context};

/// Smallest request: api key, version, correlation id.
const MIN_REQUEST: usize = 8;
const BUFFER: usize = 64 * 1024;
/// How much more room a frame being read gets at a time.
const GROWTH: usize = 1 << 20;

/// Per-connection limits from the broker config.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// socket.request.max.bytes
    pub(crate) max_request: usize,
    /// connections.max.idle.ms
    pub(crate) idle: std::time::Duration,
}

/// Why a connection was closed by the broker.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectionError {
    #[error("idle for {0:?}")]
    Idle(std::time::Duration),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("request of {size} bytes refused: socket.request.max.bytes is {max}")]
    TooLarge { size: i64, max: usize },
    #[error("request of {0} bytes is too short to hold a header")]
    TooShort(i64),
    #[error("api key {0} is not served")]
    UnknownApi(i16),
    #[error("{api:?} version {version} is not served")]
    UnsupportedVersion { api: ApiKey, version: i16 },
    #[error("cannot decode the {api:?} request header: {reason}")]
    Header { api: ApiKey, reason: String },
    #[error(transparent)]
    Api(#[from] ApiError),
}

/// Serves one connection until the client closes it, it misbehaves, or the broker shuts down.
pub(crate) async fn serve(ctx: Arc<Context>, stream: TcpStream, peer: SocketAddr, limits: Limits) {
    let _ = stream.set_nodelay(true);
    let (read, write) = stream.into_split();
    let mut reader = BufReader::with_capacity(BUFFER, read);
    let mut writer = BufWriter::with_capacity(BUFFER, write);
    let host = format!("/{}", peer.ip());
    let result: Result<(), ConnectionError> = api::CLIENT_HOST.scope(host, async {
        loop {
            let frame = tokio::select! {
                frame = tokio::time::timeout(limits.idle, read_frame(&mut reader, limits.max_request)) => match frame {
                    Ok(frame) => frame?,
                    Err(_) => return Err(ConnectionError::Idle(limits.idle)),
                },
                _ = ctx.shutdown.cancelled() => return Ok(()),
            };
            let Some(frame) = frame else { return Ok(()) };
            if let Some(response) = handle(&ctx, frame).await? {
                writer.write_all(&response).await?;
            }
            if !whole_frame_buffered(reader.buffer()) {
                writer.flush().await?;
            }
        }
    })
    .await;
    // Responses to the requests before a bad one (or before shutdown) still go out.
    let _ = writer.flush().await;
    match result {
        Ok(()) => tracing::debug!(%peer, "connection closed"),
        Err(ConnectionError::Io(e)) => tracing::debug!(%peer, error = %e, "connection lost"),
        Err(e @ ConnectionError::Idle(_)) => {
            tracing::debug!(%peer, error = %e, "closing idle connection")
        }
        Err(e) => tracing::warn!(%peer, error = %e, "closing connection"),
    }
}

fn whole_frame_buffered(buffer: &[u8]) -> bool {
    buffer.len() >= 4 && {
        let size = i32::from_be_bytes([buffer[0], buffer[1], buffer[2], buffer[3]]);
        size >= 0 && buffer.len() - 4 >= size as usize
    }
}

/// Reads one frame; `None` at a clean end of stream.
async fn read_frame<R: AsyncReadExt + Unpin>(
    reader: &mut R,
    max_request: usize,
) -> Result<Option<BytesMut>, ConnectionError> {
    let mut size = [0u8; 4];
    match reader.read_exact(&mut size).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let size = i64::from(i32::from_be_bytes(size));
    if size > max_request as i64 || size < 0 {
        return Err(ConnectionError::TooLarge {
            size,
            max: max_request,
        });
    }
    if (size as usize) < MIN_REQUEST {
        return Err(ConnectionError::TooShort(size));
    }
    // Memory grows with the bytes that actually arrive, not with the size a client announces:
    // a client announcing 100 MiB and sending nothing costs one small buffer.
    let size = size as usize;
    let mut frame = BytesMut::with_capacity(size.min(GROWTH));
    while frame.len() < size {
        frame.reserve((size - frame.len()).min(GROWTH));
        let wanted = (size - frame.len()) as u64;
        if reader.take(wanted).read_buf(&mut frame).await? == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
        }
    }
    Ok(Some(frame))
}

/// Serves one request frame; returns the response frame unless the API sends none.
async fn handle(ctx: &Arc<Context>, frame: BytesMut) -> Result<Option<Bytes>, ConnectionError> {
    let api_key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
    let Some(route) = api::route_for(api_key) else {
        return Err(ConnectionError::UnknownApi(api_key));
    };
    if version < route.versions.min || version > route.versions.max {
        if route.key == ApiKey::ApiVersions {
            // The client sent its newest version; tell it which ones we have.
            return Ok(Some(api::unsupported_version_response(correlation_id)?));
        }
        return Err(ConnectionError::UnsupportedVersion {
            api: route.key,
            version,
        });
    }
    let mut buf = frame.freeze();
    let header_version = route.key.request_header_version(version);
    let header =
        RequestHeader::decode(&mut buf, header_version).map_err(|e| ConnectionError::Header {
            api: route.key,
            reason: e.to_string(),
        })?;
    Ok(route.call(ctx, header, buf).await?)
}
