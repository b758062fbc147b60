//! Receiving datagrams, for the UDP sources (`syslog_udp`, `netcat_udp`).
//!
//! UDP is at-most-once: nothing acknowledges a datagram, so one the network or the kernel
//! drops is gone unseen. The source does its part visibly: the datagrams waiting in the
//! socket are read in one batch (up to the channels' `transaction_capacity`) and put without
//! waiting for room; while a channel is full, or when a put fails, the batch is dropped and
//! its events counted in `EventDroppedCount`, with one warning per stall. (Waiting instead
//! would let the socket's buffer overflow, and the kernel would drop datagrams uncounted.)

use std::net::SocketAddr;

use ferry_core::{Event, SourceContext, SourceError};
use tokio::net::UdpSocket;
use tokio::sync::oneshot;

/// The largest datagram: a UDP payload cannot be longer.
const MAX_DATAGRAM: usize = 65_536;

/// Binds `address` for source `kind` and tells `on_listen` the address bound.
pub(crate) async fn bind(
    ctx: &SourceContext,
    kind: &str,
    address: &str,
    on_listen: Option<oneshot::Sender<SocketAddr>>,
) -> Result<UdpSocket, SourceError> {
    let socket = UdpSocket::bind(address)
        .await
        .map_err(|e| SourceError::io(format!("binding {address}"), e))?;
    let local = socket
        .local_addr()
        .map_err(|e| SourceError::io(format!("binding {address}"), e))?;
    tracing::info!(source = ctx.name(), address = %local, "{kind} source listening on UDP");
    crate::listening(ctx);
    if let Some(tx) = on_listen {
        let _ = tx.send(local);
    }
    Ok(socket)
}

/// Receives until shutdown; `to_events` turns each datagram (and its sender) into events.
pub(crate) async fn receive(
    ctx: &SourceContext,
    socket: UdpSocket,
    mut to_events: impl FnMut(&[u8], SocketAddr, &mut Vec<Event>) + Send,
) -> Result<(), SourceError> {
    let dropped = ctx.metrics().counter("EventDroppedCount");
    let capacity = crate::transaction_capacity(ctx);
    let mut buffer = vec![0u8; MAX_DATAGRAM];
    let mut stalled = false;
    loop {
        let (len, peer) = tokio::select! {
            _ = ctx.shutdown().wait() => return Ok(()),
            received = socket.recv_from(&mut buffer) => match received {
                Ok(received) => received,
                Err(error) => {
                    // An ICMP error for an earlier send and the like: not fatal for a listener.
                    tracing::debug!(source = ctx.name(), %error, "receiving a datagram");
                    continue;
                }
            },
        };
        let mut events = Vec::new();
        to_events(&buffer[..len], peer, &mut events);
        // What else is waiting, without waiting for more.
        while events.len() < capacity {
            match socket.try_recv_from(&mut buffer) {
                Ok((len, peer)) => to_events(&buffer[..len], peer, &mut events),
                Err(_) => break,
            }
        }
        for batch in crate::chunks(events, capacity) {
            let n = batch.len() as u64;
            match ctx.try_send(batch, None).await {
                Ok(()) => {
                    if stalled {
                        tracing::info!(
                            source = ctx.name(),
                            "the channel has room again: datagrams are delivered"
                        );
                    }
                    stalled = false;
                }
                Err(error) => {
                    dropped.add(n);
                    if !stalled {
                        tracing::warn!(source = ctx.name(), %error, "datagrams dropped (counted in EventDroppedCount) until the channel takes them again");
                    }
                    stalled = true;
                }
            }
        }
    }
}
