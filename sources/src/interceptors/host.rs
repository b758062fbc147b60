//! `host`: Flume's `HostInterceptor`. Sets a header to this machine's IP address or host name.
//!
//! The value is looked up once, at the first batch: the host name from the system; the address
//! by resolving that name (a non-loopback IPv4 address is preferred, then any non-loopback
//! one). Where the name resolves only to loopback (common in containers, where Flume would say
//! `127.0.0.1`), the address of the interface that routes to the outside is used, found by
//! connecting a UDP socket (which sends nothing); `127.0.0.1` is the last resort.

use std::net::{IpAddr, ToSocketAddrs, UdpSocket};
use std::sync::OnceLock;

use ferry_core::{ComponentConfig, ConfigError, Event, Interceptor};
use serde::Deserialize;

/// Options of the `host` interceptor.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    /// Header to set. Default `host`. Flume: `hostHeader`.
    #[serde(default = "default_host_header")]
    pub host_header: String,
    /// Use the IP address (`true`) or the host name (`false`). Default `true`. Flume: `useIP`.
    #[serde(default = "default_true")]
    pub use_ip: bool,
    /// Keep the header of events that already have one. Default `false`.
    /// Flume: `preserveExisting`.
    #[serde(default)]
    pub preserve_existing: bool,
}

fn default_host_header() -> String {
    "host".into()
}

fn default_true() -> bool {
    true
}

/// The host interceptor.
#[derive(Debug)]
pub struct HostInterceptor {
    header: String,
    use_ip: bool,
    preserve_existing: bool,
    /// Looked up at the first batch, so that building (as `agent validate` does) touches
    /// nothing.
    value: OnceLock<String>,
}

impl HostInterceptor {
    /// Validates the options and looks up the host.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        let config: HostConfig = cfg.parse()?;
        Ok(Self {
            header: config.host_header,
            use_ip: config.use_ip,
            preserve_existing: config.preserve_existing,
            value: OnceLock::new(),
        })
    }

    fn value(&self) -> &str {
        self.value.get_or_init(|| {
            let name = ferry_core::host_name();
            if self.use_ip {
                address_of(&name).to_string()
            } else {
                name
            }
        })
    }
}

impl Interceptor for HostInterceptor {
    fn intercept(&self, mut events: Vec<Event>) -> Vec<Event> {
        super::set_header(
            &mut events,
            &self.header,
            self.value(),
            self.preserve_existing,
        );
        events
    }
}

/// The address `name` resolves to, preferring a non-loopback IPv4 address; else the address
/// of the outgoing interface; else `127.0.0.1`.
fn address_of(name: &str) -> IpAddr {
    let addresses: Vec<IpAddr> = (name, 0)
        .to_socket_addrs()
        .map(|found| found.map(|a| a.ip()).collect())
        .unwrap_or_default();
    addresses
        .iter()
        .find(|ip| ip.is_ipv4() && !ip.is_loopback())
        .or_else(|| addresses.iter().find(|ip| !ip.is_loopback()))
        .copied()
        .or_else(outgoing_address)
        .unwrap_or(IpAddr::from([127, 0, 0, 1]))
}

/// The local address the system would send from to the outside world. Connecting a UDP
/// socket only picks a route; no packet is sent.
fn outgoing_address() -> Option<IpAddr> {
    let socket = UdpSocket::bind(("0.0.0.0", 0)).ok()?;
    socket.connect(("192.0.2.1", 9)).ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_unspecified() && !ip.is_loopback()).then_some(ip)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interceptors::config;

    #[test]
    fn sets_an_ip_address_by_default() {
        let interceptor = HostInterceptor::build(&config("host", "")).unwrap();
        let out = interceptor.intercept(vec![Event::from_body("a")]);
        let value = &out[0].headers["host"];
        assert!(value.parse::<IpAddr>().is_ok(), "{value}");
        let outgoing = outgoing_address();
        if outgoing.is_some() {
            let ip: IpAddr = value.parse().unwrap();
            assert!(!ip.is_loopback(), "a routable address is preferred to {ip}");
        }
    }

    #[test]
    fn sets_the_host_name_under_the_chosen_header() {
        let interceptor =
            HostInterceptor::build(&config("host", "use_ip: false\nhost_header: origin")).unwrap();
        let out = interceptor.intercept(vec![Event::from_body("a")]);
        assert_eq!(out[0].headers["origin"], ferry_core::host_name());
        assert!(!ferry_core::host_name().is_empty());
    }

    #[test]
    fn preserves_existing_only_when_asked() {
        let mut tagged = Event::from_body("a");
        tagged.headers.insert("host".into(), "elsewhere".into());
        let keep = HostInterceptor::build(&config("host", "preserve_existing: true")).unwrap();
        assert_eq!(
            keep.intercept(vec![tagged.clone()])[0].headers["host"],
            "elsewhere"
        );
        let replace = HostInterceptor::build(&config("host", "")).unwrap();
        assert_ne!(
            replace.intercept(vec![tagged])[0].headers["host"],
            "elsewhere"
        );
    }
}
