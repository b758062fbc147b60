//! Syslog sources, as Flume's: `syslog_tcp` (`SyslogTcpSource`), `multiport_syslog_tcp`
//! (`MultiportSyslogTCPSource`) and `syslog_udp` (`SyslogUDPSource`). Messages in RFC 3164 or
//! RFC 5424 become events with Flume's headers (`Facility`, `Severity`, `timestamp`, `host`,
//! ...; see `parser.rs`).
//!
//! # Delivery
//!
//! Syslog has no acknowledgements, so these sources answer nothing. Over **TCP** nothing read
//! is lost: the messages of one read are put (waiting while a channel is full) before the
//! connection is read again, so a full channel holds back the sender through TCP's flow
//! control; a put that fails is retried until it succeeds or the agent stops; at the end of a
//! connection (or shutdown) a last message without its line end is delivered too.
//!
//! Over **UDP** delivery is at most once: a datagram the network or the kernel drops is
//! gone, and the sender never knows. While a channel is full the source does not wait (the
//! kernel would drop the datagrams that arrive meanwhile, uncounted): it drops the batch of
//! datagrams it holds and counts their events in `EventDroppedCount`, with a warning once
//! per stall. A failed put drops and counts them the same way.

mod parser;
mod tcp;
mod udp;

pub use tcp::{MultiportSyslogTcpConfig, Ports, SyslogTcpConfig, SyslogTcpSource};
pub use udp::{SyslogUdpConfig, SyslogUdpSource};

pub(crate) use parser::KeepFields;

/// Reads option `keep_fields` (Flume's `keepFields`).
fn keep_fields(
    cfg: &ferry_core::ComponentConfig,
    text: &str,
) -> Result<KeepFields, ferry_core::ConfigError> {
    KeepFields::parse(text).map_err(|e| cfg.error_at("keep_fields", format!("`keep_fields`: {e}")))
}

fn default_keep_fields() -> String {
    "none".into()
}

/// Sets the client's address header, if configured.
fn client_headers(
    event: &mut ferry_core::Event,
    ip_header: Option<&str>,
    peer: std::net::SocketAddr,
) {
    if let Some(key) = ip_header {
        event.headers.set(key.to_owned(), peer.ip().to_string());
    }
}
