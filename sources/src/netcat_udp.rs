//! `netcat_udp`: Flume's `NetcatUdpSource`. Listens on UDP; every line of a datagram (up to
//! `\n`, which is removed) becomes one event, and a last line without `\n` too (Flume keeps
//! only the first line of a datagram). Nothing is answered.
//!
//! At most once, as UDP is: a datagram lost on the way is gone, and while a channel is full
//! the datagrams read are dropped and counted in `EventDroppedCount` (see `datagrams.rs`).

use std::net::SocketAddr;

use bytes::Bytes;
use ferry_core::{
    ComponentConfig, ConfigError, Event, Source, SourceContext, SourceError, async_trait,
};
use serde::Deserialize;
use tokio::sync::oneshot;

/// Options of the `netcat_udp` source.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetcatUdpConfig {
    /// Address to listen on: `0.0.0.0` for every interface. Default `127.0.0.1`, this machine
    /// only. Flume: `bind`.
    #[serde(default = "crate::loopback")]
    pub bind: String,
    /// UDP port to listen on (`0` picks a free one, logged at start). Required.
    /// Flume: `port`.
    pub port: u16,
    /// Header to put the sender's address (`ip:port`) in. Default none.
    /// Flume: `remoteAddressHeader`.
    #[serde(default)]
    pub remote_address_header: Option<String>,
}

/// The netcat UDP source.
#[derive(Debug)]
pub struct NetcatUdpSource {
    config: NetcatUdpConfig,
    /// Told the bound address once listening (tests bind port 0).
    on_listen: Option<oneshot::Sender<SocketAddr>>,
}

impl NetcatUdpSource {
    /// Validates the options.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        let config: NetcatUdpConfig = cfg.parse()?;
        if config.remote_address_header.as_deref() == Some("") {
            return Err(cfg.error_at(
                "remote_address_header",
                "`remote_address_header` must not be empty",
            ));
        }
        Ok(Self {
            config,
            on_listen: None,
        })
    }
}

/// The lines of a datagram: split at `\n`, a last line without one included.
fn lines(datagram: &[u8]) -> impl Iterator<Item = &[u8]> {
    let datagram = datagram.strip_suffix(b"\n").unwrap_or(datagram);
    datagram.split(|b| *b == b'\n')
}

#[async_trait]
impl Source for NetcatUdpSource {
    async fn run(self: Box<Self>, ctx: SourceContext) -> Result<(), SourceError> {
        let NetcatUdpSource { config, on_listen } = *self;
        let address = format!("{}:{}", config.bind, config.port);
        let socket = crate::datagrams::bind(&ctx, "netcat", &address, on_listen).await?;
        let header = config.remote_address_header;
        crate::datagrams::receive(&ctx, socket, |datagram, peer, events| {
            let mut headers = ferry_core::Headers::new();
            if let Some(key) = &header {
                headers.set(key.clone(), peer.to_string());
            }
            // The lines of one datagram share their headers.
            events.extend(
                lines(datagram)
                    .map(|line| Event::new(headers.clone(), Bytes::copy_from_slice(line))),
            );
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use ferry_core::test_support::{TestChannel, config, context};

    #[test]
    fn datagrams_split_into_lines() {
        let split = |d: &'static [u8]| lines(d).collect::<Vec<_>>();
        assert_eq!(split(b"one\n"), [&b"one"[..]]);
        assert_eq!(split(b"a\nb"), [&b"a"[..], b"b"]);
        assert_eq!(split(b"a\r\n\nb\n"), [&b"a\r"[..], b"", b"b"]);
    }

    #[tokio::test]
    async fn every_line_of_a_datagram_is_an_event_with_the_sender() {
        let channel = TestChannel::new(100, 100);
        let mut source = NetcatUdpSource::build(&config(
            "netcat_udp",
            "port: 0\nremote_address_header: from",
        ))
        .unwrap();
        let (tx, rx) = oneshot::channel();
        source.on_listen = Some(tx);
        let (ctx, shutdown) = context(&channel);
        let task = tokio::spawn(Box::new(source).run(ctx));
        let address = rx.await.unwrap();
        let client = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        client.send_to(b"hello\nworld\n", address).await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), async {
            while channel.events().len() < 2 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap();
        assert_eq!(channel.bodies(), ["hello", "world"]);
        let from = client.local_addr().unwrap().to_string();
        assert!(channel.events().iter().all(|e| e.headers["from"] == from));
        shutdown.trigger();
        task.await.unwrap().unwrap();
    }

    #[test]
    fn options_are_checked() {
        let error =
            NetcatUdpSource::build(&config("netcat_udp", "port: 1\nremote_address_header: ''"))
                .unwrap_err();
        assert!(error.message.contains("`remote_address_header`"), "{error}");
        let error = NetcatUdpSource::build(&config("netcat_udp", "bind: 0.0.0.0")).unwrap_err();
        assert!(error.message.contains("port"), "{error}");
    }
}
