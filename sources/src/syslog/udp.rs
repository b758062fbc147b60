//! `syslog_udp`: one message per datagram (a line end at its end is removed). At most once:
//! see the module docs of `syslog`.

use std::net::SocketAddr;

use ferry_core::{ComponentConfig, ConfigError, Source, SourceContext, SourceError, async_trait};
use serde::Deserialize;
use tokio::sync::oneshot;

use super::parser::event_of;
use super::{KeepFields, client_headers};

/// Options of the `syslog_udp` source.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyslogUdpConfig {
    /// Address to listen on: `0.0.0.0` for every interface. Default `127.0.0.1`, this machine
    /// only. Flume: `host`.
    #[serde(default = "crate::loopback")]
    pub host: String,
    /// UDP port to listen on (`0` picks a free one, logged at start). Required.
    /// Flume: `port`.
    pub port: u16,
    /// Header fields kept in the body: `none`, `all`, or some of `priority version timestamp
    /// hostname`. Default `none` (as Flume's). Flume: `keepFields`.
    #[serde(default = "super::default_keep_fields")]
    pub keep_fields: String,
    /// Header to put the sender's IP address in. Default none. Flume: `clientIPHeader`.
    #[serde(default)]
    pub client_ip_header: Option<String>,
}

/// The syslog UDP source.
#[derive(Debug)]
pub struct SyslogUdpSource {
    address: String,
    keep: KeepFields,
    client_ip_header: Option<String>,
    /// Told the bound address once listening (tests bind port 0).
    on_listen: Option<oneshot::Sender<SocketAddr>>,
}

impl SyslogUdpSource {
    /// Validates the options.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        let config: SyslogUdpConfig = cfg.parse()?;
        if config.client_ip_header.as_deref() == Some("") {
            return Err(cfg.error_at("client_ip_header", "`client_ip_header` must not be empty"));
        }
        Ok(Self {
            address: format!("{}:{}", config.host, config.port),
            keep: super::keep_fields(cfg, &config.keep_fields)?,
            client_ip_header: config.client_ip_header,
            on_listen: None,
        })
    }
}

/// A datagram without the line end some senders put at its end.
pub(crate) fn without_line_end(datagram: &[u8]) -> &[u8] {
    let datagram = datagram.strip_suffix(b"\n").unwrap_or(datagram);
    datagram.strip_suffix(b"\r").unwrap_or(datagram)
}

#[async_trait]
impl Source for SyslogUdpSource {
    async fn run(self: Box<Self>, ctx: SourceContext) -> Result<(), SourceError> {
        let SyslogUdpSource {
            address,
            keep,
            client_ip_header,
            on_listen,
        } = *self;
        let socket = crate::datagrams::bind(&ctx, "syslog", &address, on_listen).await?;
        crate::datagrams::receive(&ctx, socket, |datagram, peer, events| {
            let mut event = event_of(without_line_end(datagram), false, keep);
            client_headers(&mut event, client_ip_header.as_deref(), peer);
            events.push(event);
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use ferry_core::test_support::{TestChannel, config, context};

    #[tokio::test]
    async fn each_datagram_is_a_message_and_a_full_channel_drops_and_counts() {
        let channel = TestChannel::new(2, 100);
        let mut source = SyslogUdpSource::build(&config(
            "syslog_udp",
            "port: 0\nclient_ip_header: ip\nkeep_fields: hostname",
        ))
        .unwrap();
        let (tx, rx) = oneshot::channel();
        source.on_listen = Some(tx);
        let (ctx, shutdown) = context(&channel);
        let task = tokio::spawn(Box::new(source).run(ctx.clone()));
        let address = rx.await.unwrap();
        let client = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let wait = |n: usize| {
            let channel = Arc::clone(&channel);
            async move {
                tokio::time::timeout(Duration::from_secs(10), async {
                    while channel.events().len() < n {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                })
                .await
                .expect("events within 10 s")
            }
        };
        client
            .send_to(
                b"<13>1 2003-10-11T22:14:15.003Z web-1 app - - - one\n",
                address,
            )
            .await
            .unwrap();
        wait(1).await;
        client
            .send_to(b"<14>Oct 11 22:14:15 web-2 two", address)
            .await
            .unwrap();
        wait(2).await;
        assert_eq!(channel.bodies(), ["web-1 app - - - one", "web-2 two"]);
        let events = channel.events();
        assert_eq!(events[0].headers["Severity"], "5");
        assert_eq!(events[1].headers["host"], "web-2");
        assert_eq!(events[1].headers["ip"], "127.0.0.1");
        // The channel holds 2: the third datagram is dropped and counted.
        client
            .send_to(b"<14>Oct 11 22:14:15 web-2 three", address)
            .await
            .unwrap();
        let dropped = ctx.metrics().counter("EventDroppedCount");
        tokio::time::timeout(Duration::from_secs(10), async {
            while dropped.get() < 1 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the drop is counted");
        assert_eq!(channel.events().len(), 2);
        shutdown.trigger();
        task.await.unwrap().unwrap();
    }
}
