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
//! already waiting. Anything the broker cannot make sense of (a bad size, an unknown API or
//! version, a body that does not decode) closes this connection only, with a log line.
//!
//! What a request can make the broker hold, whatever the client sends:
//! - its announced size is checked against `socket.request.max.bytes` (before SASL
//!   authentication, against `sasl.server.max.receive.size`) and a larger one closes the
//!   connection before anything is allocated;
//! - its memory is taken as its bytes arrive, not from the size it announces: a request of up
//!   to [`SMALL_REQUEST`] bytes is read in one buffer of the connection's own (one request at
//!   a time per connection, so `max_connections` bounds them all); a larger one draws on the
//!   shared `queued.max.request.bytes` in growing steps, each taken once bytes are waiting to
//!   fill it. A client announcing 100 MiB and sending 4 bytes holds one step, and every small
//!   request (ApiVersions, metadata, heartbeats, commits, most fetches) is read without waiting
//!   on the large ones;
//! - it must arrive whole within `request_receive_timeout_ms` of its first byte, or the
//!   connection is closed and what it held is given back (a slow-loris client, a stalled
//!   upload, large requests that wait on each other for room in a full pool).
//!
//! A connection arrives on a [`Listener`]: plain TCP, or TLS (the handshake made in the
//! connection's task, with a timeout); on a SASL listener it must authenticate before
//! anything but ApiVersions, SaslHandshake and SaslAuthenticate is served.
//!
//! A Fetch response frame comes with the record batches still in the segment files (see
//! [`Frame`]). Over plain TCP on Linux a range is sent with `sendfile(2)`, from the page cache to the socket
//! without passing through the broker's memory; over TLS, elsewhere, or where the file system does not
//! support it, and for ranges too small to be worth the extra system calls, it is read and
//! written like any other bytes. The encoded bytes before a range are flushed first, so the
//! frame goes out in order. The ranges are read while the frame is being sent, after its size
//! went out: a disk error then can only close the connection (Kafka's `transferTo` is the
//! same), where a read before encoding could answer KAFKA_STORAGE_ERROR for the partition.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use kafka_protocol::messages::{ApiKey, RequestHeader};
use kafka_protocol::protocol::Decodable;
use tokio::io::{
    AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader,
    BufWriter,
};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio_rustls::TlsAcceptor;

use crate::api::{self, ApiError, Context, Frame};
use crate::config::SaslMechanism;
use crate::log::{FileSlice, StorageError};
use crate::security::sasl::Authenticator;
use crate::security::{SESSION, Session, tls};
use crate::stats::ListenerCounters;

/// Smallest request: api key, version, correlation id.
const MIN_REQUEST: usize = 8;
const BUFFER: usize = 64 * 1024;
/// Requests up to this size are read without drawing on `queued.max.request.bytes`.
pub(crate) const SMALL_REQUEST: usize = BUFFER;
/// The most a large request's memory grows by at a time; steps double from
/// [`SMALL_REQUEST`] up to it.
const GROWTH: usize = 1 << 20;
/// File ranges smaller than this are copied through the write buffer: below it, the extra
/// system calls of sending them separately cost more than the copy saves.
const SENDFILE_MIN: usize = 64 * 1024;

/// Per-connection limits from the broker config.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// socket.request.max.bytes
    pub(crate) max_request: usize,
    /// connections.max.idle.ms
    pub(crate) idle: Duration,
    /// request_receive_timeout_ms: from a request's first byte to its last.
    pub(crate) receive: Duration,
    /// sasl.server.max.receive.size: the largest request before SASL authentication.
    pub(crate) max_unauthenticated: usize,
    /// ssl_handshake_timeout_ms: from accept to the end of the TLS handshake.
    pub(crate) handshake: Duration,
    /// sasl_authentication_timeout_ms: from accept (after TLS) to SASL authentication.
    pub(crate) authentication: Duration,
}

/// A listener as its connections see it.
pub(crate) struct Listener {
    /// Its name, for logs.
    pub(crate) name: String,
    /// TLS on `ssl` and `sasl_ssl` listeners.
    pub(crate) tls: Option<TlsAcceptor>,
    /// The SASL mechanisms enabled; empty on a listener without SASL.
    pub(crate) mechanisms: Vec<SaslMechanism>,
    /// The host and port its clients are given in metadata.
    pub(crate) advertised: (String, i32),
    /// Its connections, counted where they are accepted and end.
    pub(crate) counters: Arc<ListenerCounters>,
}

/// A connection's byte stream: plain TCP, or TLS over it.
pub(crate) trait Transport: AsyncRead + AsyncWrite + Unpin + Send {
    /// The socket, when the bytes written to the stream go to it as they are: then file
    /// ranges can be sent with `sendfile(2)`. Over TLS they must be encrypted, so copied.
    fn tcp(&self) -> Option<&TcpStream>;
}

impl Transport for TcpStream {
    fn tcp(&self) -> Option<&TcpStream> {
        Some(self)
    }
}

impl Transport for tokio_rustls::server::TlsStream<TcpStream> {
    fn tcp(&self) -> Option<&TcpStream> {
        None
    }
}

/// Why a connection was closed by the broker.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectionError {
    #[error("idle for {0:?}")]
    Idle(Duration),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("request of {size} bytes refused: socket.request.max.bytes is {max}")]
    TooLarge { size: i64, max: usize },
    #[error(
        "request of {size} bytes before SASL authentication refused: \
         sasl_server_max_receive_size is {max}"
    )]
    TooLargeUnauthenticated { size: i64, max: usize },
    #[error(
        "request not received whole within {0:?} of its first byte (request_receive_timeout_ms)"
    )]
    ReceiveTimeout(Duration),
    #[error("not authenticated within {0:?} (sasl_authentication_timeout_ms)")]
    AuthenticationTimeout(Duration),
    #[error("request of {0} bytes is too short to hold a header")]
    TooShort(i64),
    #[error("api key {0} is not served")]
    UnknownApi(i16),
    #[error("{api:?} version {version} is not served")]
    UnsupportedVersion { api: ApiKey, version: i16 },
    #[error(
        "SaslHandshake v0 (SASL tokens without Kafka framing) is not supported: the client must \
         send SaslHandshake v1, as librdkafka, kcat, confluent-kafka, kafka-python and the Java \
         client do"
    )]
    SaslHandshakeV0,
    #[error("{0:?} request before SASL authentication")]
    Unauthenticated(ApiKey),
    #[error("SASL authentication refused")]
    AuthenticationRefused,
    #[error("cannot decode the {api:?} request header: {reason}")]
    Header { api: ApiKey, reason: String },
    #[error(transparent)]
    Api(#[from] ApiError),
}

/// Serves one connection until the client closes it, it misbehaves, or the broker shuts down.
/// On a TLS listener the handshake is made here, in the connection's task, so a slow or
/// failing one holds up nobody else.
pub(crate) async fn serve(
    ctx: Arc<Context>,
    stream: TcpStream,
    peer: SocketAddr,
    listener: Arc<Listener>,
    limits: Limits,
) {
    let _ = stream.set_nodelay(true);
    let mut session = Session::anonymous(peer);
    session.advertised = Some(listener.advertised.clone());
    let Some(acceptor) = &listener.tls else {
        return serve_stream(ctx, stream, peer, session, &listener, limits).await;
    };
    let accepted = tokio::select! {
        accepted = tokio::time::timeout(limits.handshake, acceptor.accept(stream)) => accepted,
        _ = ctx.shutdown.cancelled() => return,
    };
    let stream = match accepted {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            tracing::info!(%peer, listener = %listener.name, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            listener
                .counters
                .handshake_timeouts
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            match ctx.limits.malformed.due(&peer.ip()) {
                Some(suppressed) => tracing::warn!(%peer, listener = %listener.name, suppressed,
                    timeout = ?limits.handshake, "TLS handshake not done in time \
                    (ssl_handshake_timeout_ms): closing connection"),
                None => {
                    tracing::debug!(%peer, listener = %listener.name, "TLS handshake timed out")
                }
            }
            return;
        }
    };
    // A certificate is only here once the verifier accepted it.
    if let Some(certificate) = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
    {
        match tls::principal_of(certificate) {
            Some(principal) => session.principal = principal,
            None => {
                tracing::info!(%peer, listener = %listener.name, "cannot read the subject of the client certificate");
                return;
            }
        }
    }
    tracing::debug!(%peer, listener = %listener.name, principal = %session.principal, "TLS connection");
    serve_stream(ctx, stream, peer, session, &listener, limits).await
}

/// What serving one request gave.
pub(crate) struct Served {
    response: Option<Frame>,
    /// How long to wait before reading the next request: the client is over its quota.
    muted: Duration,
    /// The connection authenticated with this request.
    principal: Option<crate::security::Principal>,
    /// Close the connection after the response.
    close: bool,
}

impl From<Option<Frame>> for Served {
    fn from(response: Option<Frame>) -> Self {
        Served {
            response,
            muted: Duration::ZERO,
            principal: None,
            close: false,
        }
    }
}

async fn serve_stream<S: Transport>(
    ctx: Arc<Context>,
    stream: S,
    peer: SocketAddr,
    session: Session,
    listener: &Listener,
    limits: Limits,
) {
    // Reads and writes alternate (one request at a time), so one buffered stream serves
    // both: the read buffer over the write buffer.
    let mut stream = BufReader::with_capacity(BUFFER, BufWriter::with_capacity(BUFFER, stream));
    let mut session = Arc::new(session);
    let mut auth =
        (!listener.mechanisms.is_empty()).then(|| Authenticator::new(listener.mechanisms.clone()));
    // On a SASL listener, the connection is closed unless it authenticates within the bound;
    // the sleep is polled only while it has not.
    let authentication = tokio::time::sleep(limits.authentication);
    tokio::pin!(authentication);
    let result: Result<(), ConnectionError> = async {
        loop {
            let unauthenticated = auth.as_ref().is_some_and(|a| !a.is_authenticated());
            // Between requests the connection may be idle up to connections.max.idle.ms; from
            // a request's first byte, it has request_receive_timeout_ms to send the rest.
            let started = tokio::select! {
                ready = tokio::time::timeout(limits.idle, stream.fill_buf()) => match ready {
                    Ok(ready) => !ready?.is_empty(),
                    Err(_) => return Err(ConnectionError::Idle(limits.idle)),
                },
                _ = &mut authentication, if unauthenticated => {
                    return Err(ConnectionError::AuthenticationTimeout(limits.authentication));
                }
                _ = ctx.shutdown.cancelled() => return Ok(()),
            };
            if !started {
                return Ok(());
            }
            let max = if unauthenticated {
                limits.max_request.min(limits.max_unauthenticated)
            } else {
                limits.max_request
            };
            let (frame, memory) = tokio::select! {
                frame = tokio::time::timeout(limits.receive, read_frame(&mut stream, max, &ctx.limits)) => match frame {
                    Ok(Ok(frame)) => frame,
                    Ok(Err(ConnectionError::TooLarge { size, max })) if unauthenticated => {
                        return Err(ConnectionError::TooLargeUnauthenticated { size, max });
                    }
                    Ok(Err(e)) => return Err(e),
                    Err(_) => return Err(ConnectionError::ReceiveTimeout(limits.receive)),
                },
                _ = &mut authentication, if unauthenticated => {
                    return Err(ConnectionError::AuthenticationTimeout(limits.authentication));
                }
                _ = ctx.shutdown.cancelled() => return Ok(()),
            };
            let served = SESSION.scope(Arc::clone(&session), handle(&ctx, frame, &mut auth));
            let served = served.await?;
            // The request's bytes are gone once it is answered.
            drop(memory);
            if let Some(principal) = served.principal {
                tracing::debug!(%peer, listener = %listener.name, %principal, "SASL authenticated");
                session = Arc::new(Session {
                    principal,
                    ..(*session).clone()
                });
            }
            if let Some(response) = served.response {
                write_frame(stream.get_mut(), &response).await?;
            }
            if served.close {
                return Err(ConnectionError::AuthenticationRefused);
            }
            if !whole_frame_buffered(stream.buffer()) || !served.muted.is_zero() {
                stream.get_mut().flush().await?;
            }
            if !served.muted.is_zero() {
                // Over its quota: the response (with throttle_time_ms) is out, the next
                // request waits (KIP-219), even from a client that ignores the hint.
                tokio::select! {
                    _ = tokio::time::sleep(served.muted) => {}
                    _ = ctx.shutdown.cancelled() => return Ok(()),
                }
            }
        }
    }
    .await;
    // Responses to the requests before a bad one (or before shutdown) still go out.
    let _ = stream.get_mut().flush().await;
    let counters = &listener.counters;
    let listener = &listener.name;
    match result {
        Ok(()) => tracing::debug!(%peer, %listener, "connection closed"),
        Err(ConnectionError::Io(e)) => {
            tracing::debug!(%peer, %listener, error = %e, "connection lost")
        }
        Err(e @ (ConnectionError::Idle(_) | ConnectionError::AuthenticationRefused)) => {
            tracing::debug!(%peer, %listener, error = %e, "closing connection")
        }
        Err(
            e @ (ConnectionError::ReceiveTimeout(_)
            | ConnectionError::AuthenticationTimeout(_)
            | ConnectionError::TooLargeUnauthenticated { .. }),
        ) => {
            let counter = match e {
                ConnectionError::ReceiveTimeout(_) => &counters.receive_timeouts,
                ConnectionError::AuthenticationTimeout(_) => &counters.authentication_timeouts,
                _ => &counters.unauthenticated_too_large,
            };
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            match ctx.limits.malformed.due(&peer.ip()) {
                Some(suppressed) => {
                    tracing::warn!(%peer, %listener, error = %e, suppressed, "closing connection")
                }
                None => tracing::debug!(%peer, %listener, error = %e, "closing connection"),
            }
        }
        Err(e @ (ConnectionError::Unauthenticated(_) | ConnectionError::SaslHandshakeV0)) => {
            tracing::info!(%peer, %listener, error = %e, "closing connection")
        }
        Err(e @ ConnectionError::Storage(_)) => {
            tracing::warn!(%peer, %listener, error = %e, "closing connection")
        }
        Err(e) => {
            // A client that cannot speak the protocol (or a fuzzer) can open connections as
            // fast as it likes: counted each time, named once a minute per address.
            counters
                .malformed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            match ctx.limits.malformed.due(&peer.ip()) {
                Some(suppressed) => tracing::warn!(%peer, %listener, error = %e, suppressed,
                    "closing connection after a request that made no sense"),
                None => tracing::debug!(%peer, %listener, error = %e, "closing connection"),
            }
        }
    }
}

fn whole_frame_buffered(buffer: &[u8]) -> bool {
    buffer.len() >= 4 && {
        let size = i32::from_be_bytes([buffer[0], buffer[1], buffer[2], buffer[3]]);
        size >= 0 && buffer.len() - 4 >= size as usize
    }
}

/// Reads one frame whose first bytes are waiting, with the share of
/// `queued.max.request.bytes` it took (none for a small one); the memory is taken as the bytes
/// arrive (see the module's documentation). The caller bounds how long it may take.
async fn read_frame<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    max_request: usize,
    limits: &crate::limits::Limits,
) -> Result<(BytesMut, Option<OwnedSemaphorePermit>), ConnectionError> {
    let mut size = [0u8; 4];
    reader.read_exact(&mut size).await?;
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
    let size = size as usize;
    let mut memory: Option<OwnedSemaphorePermit> = None;
    let mut frame = BytesMut::new();
    // Room taken for the frame so far (and, past SMALL_REQUEST, from the shared pool).
    let mut room = 0;
    while frame.len() < size {
        if room == frame.len() {
            // Only once bytes are waiting to fill it is more room taken.
            if reader.fill_buf().await?.is_empty() {
                return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
            }
            let step = if size <= SMALL_REQUEST {
                size
            } else {
                let step = (size - room).min(room.max(SMALL_REQUEST)).min(GROWTH);
                let permit = limits.request_memory(step).await;
                match memory.as_mut() {
                    Some(memory) => memory.merge(permit),
                    None => memory = Some(permit),
                }
                step
            };
            frame.reserve(step);
            room += step;
        }
        let wanted = (room - frame.len()) as u64;
        if reader.take(wanted).read_buf(&mut frame).await? == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
        }
    }
    Ok((frame, memory))
}

/// Serves one request frame; returns the response frame unless the API sends none. Before
/// SASL authentication (`auth` not yet authenticated) only ApiVersions, SaslHandshake and
/// SaslAuthenticate are served, the last two by the connection's authenticator; anything else
/// closes the connection, as Kafka does.
pub(crate) async fn handle(
    ctx: &Arc<Context>,
    frame: BytesMut,
    auth: &mut Option<Authenticator>,
) -> Result<Served, ConnectionError> {
    let api_key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
    let Some(route) = api::route_for(api_key) else {
        return Err(ConnectionError::UnknownApi(api_key));
    };
    if version < route.versions.min || version > route.versions.max {
        if route.key == ApiKey::ApiVersions {
            // The client sent its newest version; tell it which ones we have.
            return Ok(Some(api::unsupported_version_response(correlation_id)?.into()).into());
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
    if let Some(auth) = auth.as_mut().filter(|a| !a.is_authenticated()) {
        match route.key {
            ApiKey::ApiVersions => {}
            ApiKey::SaslHandshake if version == 0 => return Err(ConnectionError::SaslHandshakeV0),
            ApiKey::SaslHandshake => {
                let (frame, close) = api::sasl_handshake(auth, &header, buf)?;
                return Ok(Served {
                    response: Some(frame),
                    muted: Duration::ZERO,
                    principal: None,
                    close,
                });
            }
            ApiKey::SaslAuthenticate => {
                let done = api::sasl_authenticate(ctx, auth, &header, buf)?;
                return Ok(Served {
                    response: Some(done.frame),
                    muted: Duration::ZERO,
                    principal: done.principal,
                    close: done.close,
                });
            }
            other => return Err(ConnectionError::Unauthenticated(other)),
        }
    }
    let client_id = header.client_id.clone();
    let mut served: Served = route.call(ctx, header, buf).await?.into();
    if ctx.quotas.any() {
        served.muted = ctx
            .quotas
            .muted_for(client_id.as_deref().unwrap_or_default());
    }
    Ok(served)
}

/// Writes a response frame, its file ranges at their places. Once part of a frame is out, an
/// error leaves the client with a frame it cannot finish, so the connection is closed.
async fn write_frame<S: Transport>(
    writer: &mut BufWriter<S>,
    frame: &Frame,
) -> Result<(), ConnectionError> {
    let mut written = 0;
    for (at, slice) in &frame.files {
        writer.write_all(&frame.bytes[written..*at]).await?;
        written = *at;
        if slice.len() < SENDFILE_MIN || writer.get_ref().tcp().is_none() {
            copy_through_buffer(writer, slice, 0).await?;
        } else {
            writer.flush().await?;
            send_file(writer, slice).await?;
        }
    }
    writer.write_all(&frame.bytes[written..]).await?;
    Ok(())
}

/// Reads `slice` from `skip` bytes into it on, and writes it through the buffer.
async fn copy_through_buffer<S: Transport>(
    writer: &mut BufWriter<S>,
    slice: &FileSlice,
    skip: usize,
) -> Result<(), ConnectionError> {
    let mut chunk = vec![0u8; (slice.len() - skip).min(BUFFER)];
    let mut done = skip;
    while done < slice.len() {
        let n = chunk.len().min(slice.len() - done);
        slice.read_at(done, &mut chunk[..n])?;
        writer.write_all(&chunk[..n]).await?;
        done += n;
    }
    Ok(())
}

/// Sends `slice` from its file to the socket with `sendfile(2)`, the write buffer being empty.
///
/// The socket is non-blocking (tokio's), so `sendfile` sends what fits in the socket buffer
/// and fails with `EAGAIN` when none does: that is waited out with `writable()`, and
/// `try_io` clears the readiness so the wait is real. The kernel advances `offset` by what
/// it sent. A file system that cannot `sendfile` makes it fail with `EINVAL` or `ENOSYS`
/// before anything is sent; the rest is then copied. As the reads it replaces did, it runs on
/// the async thread: a range no longer in the page cache holds that thread while it is read
/// from disk.
#[cfg(target_os = "linux")]
async fn send_file<S: Transport>(
    writer: &mut BufWriter<S>,
    slice: &FileSlice,
) -> Result<(), ConnectionError> {
    use nix::errno::Errno;
    use tokio::io::Interest;

    let (file, start) = slice.file_range();
    let start = i64::try_from(start).map_err(std::io::Error::other)?;
    let end = start + slice.len() as i64;
    let mut offset = start;
    while offset < end {
        let Some(stream) = writer.get_ref().tcp() else {
            return copy_through_buffer(writer, slice, (offset - start) as usize).await;
        };
        stream.writable().await?;
        let count = (end - offset) as usize;
        let sent = stream.try_io(Interest::WRITABLE, || {
            nix::sys::sendfile::sendfile64(stream, file, Some(&mut offset), count)
                .map_err(std::io::Error::from)
        });
        match sent {
            Ok(0) => {
                // The range was whole batches when the fetch located it and segments only
                // grow while the broker runs: a shorter file is not ours to explain away.
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "segment file ended inside a fetched range",
                )
                .into());
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.raw_os_error().map(Errno::from_raw),
                    Some(Errno::EINVAL | Errno::ENOSYS)
                ) =>
            {
                return copy_through_buffer(writer, slice, (offset - start) as usize).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Without `sendfile`, the range is copied.
#[cfg(not(target_os = "linux"))]
async fn send_file<S: Transport>(
    writer: &mut BufWriter<S>,
    slice: &FileSlice,
) -> Result<(), ConnectionError> {
    copy_through_buffer(writer, slice, 0).await
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use bytes::Bytes;
    use tokio::net::TcpListener;

    use super::*;
    use crate::config::BrokerConfig;
    use crate::log::{PartitionLog, Read, batch, now_ms};
    use crate::topic_config::LogConfig;

    fn append(log: &mut PartitionLog, batches: usize) {
        let mut bytes: Vec<u8> = (0..batches)
            .flat_map(|_| batch::tests::make_batch(0, 60, 1000))
            .collect();
        let mut headers = batch::validate_all(&bytes).unwrap();
        log.append(&mut bytes, &mut headers).unwrap();
    }

    fn slice(log: &PartitionLog, offset: i64, max_bytes: usize) -> FileSlice {
        match log.read(offset, max_bytes, true, i64::MAX).unwrap() {
            Some(Read::Slice(slice)) => slice,
            _ => panic!("nothing at offset {offset}"),
        }
    }

    /// A range larger than the socket buffers goes out through `sendfile` (waiting while the
    /// peer does not read), a small one through the buffer, each at its place in the frame,
    /// and both are sent whole although retention deleted their segment after the fetch
    /// located them.
    #[tokio::test]
    async fn frame_with_file_ranges_goes_out_whole_after_its_segment_is_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let broker = BrokerConfig {
            log_segment_bytes: 1 << 20,
            ..Default::default()
        };
        let config = LogConfig::resolve(&broker, &BTreeMap::new()).unwrap();
        let mut log = PartitionLog::open(dir.path(), "t-0".into(), config, true).unwrap();
        // One append goes to one segment whatever its size: ~8 MB, then a second segment.
        append(&mut log, 15_000);
        append(&mut log, 1);
        assert_eq!(log.segment_count(), 2);
        let big = slice(&log, 0, 64 << 20);
        let small = slice(&log, 120, 10_000);
        assert!(big.len() > 8_000_000 && small.len() < SENDFILE_MIN);
        let expected_big = big.read().unwrap();
        let expected_small = small.read().unwrap();
        // The batches from 1970 are past retention.ms.
        assert_eq!(log.enforce_retention(now_ms()).unwrap(), 1);
        assert!(!dir.path().join("00000000000000000000.log").exists());

        let frame = Frame {
            bytes: Bytes::from_static(b"head-mid-tail"),
            files: vec![(5, small), (9, big)],
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        let mut writer = BufWriter::with_capacity(BUFFER, client);
        let send = async move {
            write_frame(&mut writer, &frame).await.unwrap();
            writer.shutdown().await.unwrap();
        };
        let receive = async move {
            // Let the socket buffers fill up first.
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            let mut received = Vec::new();
            server.read_to_end(&mut received).await.unwrap();
            received
        };
        let ((), received) = tokio::join!(send, receive);

        let mut expected = b"head-".to_vec();
        expected.extend_from_slice(&expected_small);
        expected.extend_from_slice(b"mid-");
        expected.extend_from_slice(&expected_big);
        expected.extend_from_slice(b"tail");
        assert_eq!(received.len(), expected.len());
        assert!(received == expected);
    }
}
