//! `syslog_tcp` and `multiport_syslog_tcp`: one source type listening on one port or on
//! several, each connection cut into messages by [`Framer`] (see the module docs of
//! `syslog` for what is delivered when).

use std::net::SocketAddr;
use std::time::Duration;

use ferry_core::{
    ChannelError, ComponentConfig, ConfigError, Counter, Event, Source, SourceContext, SourceError,
    async_trait,
};
use serde::Deserialize;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use super::parser::{Frame, Framer, event_of};
use super::{KeepFields, client_headers};

/// Options of the `syslog_tcp` source.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyslogTcpConfig {
    /// Address to listen on: `0.0.0.0` for every interface. Default `127.0.0.1`, this machine
    /// only. Flume: `host`.
    #[serde(default = "crate::loopback")]
    pub host: String,
    /// TCP port to listen on (`0` picks a free one, logged at start). Required.
    /// Flume: `port`.
    pub port: u16,
    /// Longest message in bytes; a longer one is cut (`flume.syslog.status: Incomplete`) and
    /// its rest becomes the next event. Default `2500` (as Flume's), at least 10.
    /// Flume: `eventSize`.
    #[serde(default = "default_event_size")]
    pub event_size: usize,
    /// Header fields kept in the body: `none`, `all`, or some of `priority version timestamp
    /// hostname`. Default `none` (as Flume's). Flume: `keepFields`.
    #[serde(default = "super::default_keep_fields")]
    pub keep_fields: String,
    /// Header to put the client's IP address in. Default none. Flume: `clientIPHeader`.
    #[serde(default)]
    pub client_ip_header: Option<String>,
}

/// Options of the `multiport_syslog_tcp` source: those of `syslog_tcp` with `ports` for
/// `port`, and `port_header` and `batch_size`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MultiportSyslogTcpConfig {
    /// Address to listen on. Default `127.0.0.1`. Flume: `host`.
    #[serde(default = "crate::loopback")]
    pub host: String,
    /// TCP ports to listen on: a list, or Flume's space-separated string. Required.
    /// Flume: `ports`.
    pub ports: Ports,
    /// Longest message in bytes. Default `2500`. Flume: `eventSize`.
    #[serde(default = "default_event_size")]
    pub event_size: usize,
    /// Header fields kept in the body. Default `none`. Flume: `keepFields`.
    #[serde(default = "super::default_keep_fields")]
    pub keep_fields: String,
    /// Header to put the port the message came in on in. Default none. Flume: `portHeader`.
    #[serde(default)]
    pub port_header: Option<String>,
    /// Header to put the client's IP address in. Default none. Flume: `clientIPHeader`.
    #[serde(default)]
    pub client_ip_header: Option<String>,
    /// Most events per put. Default `100` (as Flume's). Flume: `batchSize`.
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
}

/// Ports as a YAML list (`[5140, 5141]`) or as Flume writes them (`"5140 5141"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ports(pub Vec<u16>);

impl<'de> Deserialize<'de> for Ports {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Ports;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of ports like `[5140, 5141]`, or `\"5140 5141\"`")
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Ports, E> {
                text.split_whitespace()
                    .map(|p| {
                        p.parse::<u16>()
                            .map_err(|_| E::custom(format!("`{p}` is not a port number")))
                    })
                    .collect::<Result<_, _>>()
                    .map(Ports)
            }

            fn visit_u64<E: serde::de::Error>(self, port: u64) -> Result<Ports, E> {
                u16::try_from(port)
                    .map(|p| Ports(vec![p]))
                    .map_err(|_| E::custom(format!("`{port}` is not a port number")))
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Ports, A::Error> {
                let mut ports = Vec::new();
                while let Some(port) = seq.next_element::<u16>()? {
                    ports.push(port);
                }
                Ok(Ports(ports))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

fn default_event_size() -> usize {
    2500
}

fn default_batch_size() -> usize {
    100
}

/// The smallest `event_size`, as Flume's.
const MIN_EVENT_SIZE: usize = 10;

/// What every connection needs to make its events.
#[derive(Debug, Clone)]
struct Settings {
    event_size: usize,
    keep: KeepFields,
    client_ip_header: Option<String>,
    port_header: Option<String>,
    batch_size: usize,
}

/// The syslog TCP source, on one port (`syslog_tcp`) or several (`multiport_syslog_tcp`).
#[derive(Debug)]
pub struct SyslogTcpSource {
    host: String,
    ports: Vec<u16>,
    settings: Settings,
    /// The batch size to validate against the channels, for `multiport_syslog_tcp`.
    max_batch: Option<usize>,
    /// Told the bound addresses once listening (tests bind port 0).
    on_listen: Option<oneshot::Sender<Vec<SocketAddr>>>,
}

fn check_event_size(cfg: &ComponentConfig, event_size: usize) -> Result<(), ConfigError> {
    if event_size < MIN_EVENT_SIZE {
        return Err(cfg.error_at(
            "event_size",
            format!("`event_size` must be at least {MIN_EVENT_SIZE} bytes"),
        ));
    }
    Ok(())
}

fn check_header(
    cfg: &ComponentConfig,
    key: &str,
    value: &Option<String>,
) -> Result<(), ConfigError> {
    if value.as_deref() == Some("") {
        return Err(cfg.error_at(key, format!("`{key}` must not be empty")));
    }
    Ok(())
}

impl SyslogTcpSource {
    /// Validates the options of `syslog_tcp`.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        let config: SyslogTcpConfig = cfg.parse()?;
        check_event_size(cfg, config.event_size)?;
        check_header(cfg, "client_ip_header", &config.client_ip_header)?;
        Ok(Self {
            host: config.host,
            ports: vec![config.port],
            settings: Settings {
                event_size: config.event_size,
                keep: super::keep_fields(cfg, &config.keep_fields)?,
                client_ip_header: config.client_ip_header,
                port_header: None,
                batch_size: usize::MAX,
            },
            max_batch: None,
            on_listen: None,
        })
    }

    /// Validates the options of `multiport_syslog_tcp`.
    pub fn build_multiport(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        let config: MultiportSyslogTcpConfig = cfg.parse()?;
        check_event_size(cfg, config.event_size)?;
        check_header(cfg, "client_ip_header", &config.client_ip_header)?;
        check_header(cfg, "port_header", &config.port_header)?;
        if config.batch_size == 0 {
            return Err(cfg.error_at("batch_size", "`batch_size` must be at least 1"));
        }
        let Ports(ports) = config.ports;
        if ports.is_empty() {
            return Err(cfg.error_at(
                "ports",
                "`ports` needs at least one port, e.g. `[5140, 5141]`",
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        if let Some(twice) = ports.iter().find(|p| **p != 0 && !seen.insert(**p)) {
            return Err(cfg.error_at("ports", format!("`ports`: port {twice} is listed twice")));
        }
        Ok(Self {
            host: config.host,
            ports,
            settings: Settings {
                event_size: config.event_size,
                keep: super::keep_fields(cfg, &config.keep_fields)?,
                client_ip_header: config.client_ip_header,
                port_header: config.port_header,
                batch_size: config.batch_size,
            },
            max_batch: Some(config.batch_size),
            on_listen: None,
        })
    }
}

#[async_trait]
impl Source for SyslogTcpSource {
    fn max_batch_size(&self) -> Option<usize> {
        self.max_batch
    }

    async fn run(self: Box<Self>, ctx: SourceContext) -> Result<(), SourceError> {
        let SyslogTcpSource {
            host,
            ports,
            settings,
            on_listen,
            ..
        } = *self;
        let mut listeners = Vec::new();
        for port in ports {
            let address = format!("{host}:{port}");
            let listener = TcpListener::bind(&address)
                .await
                .map_err(|e| SourceError::io(format!("binding {address}"), e))?;
            let local = listener
                .local_addr()
                .map_err(|e| SourceError::io(format!("binding {address}"), e))?;
            tracing::info!(source = ctx.name(), address = %local, "syslog source listening on TCP");
            listeners.push((listener, local));
        }
        crate::listening(&ctx);
        if let Some(tx) = on_listen {
            let _ = tx.send(listeners.iter().map(|(_, local)| *local).collect());
        }
        let counters = Counters {
            open: ctx.metrics().counter("OpenConnectionCount"),
            dropped: ctx.metrics().counter("EventDroppedCount"),
        };
        let mut accepting = JoinSet::new();
        for (listener, local) in listeners {
            let port = Port {
                ctx: ctx.clone(),
                settings: settings.clone(),
                counters: counters.clone(),
                local,
            };
            accepting.spawn(port.accept(listener));
        }
        while accepting.join_next().await.is_some() {}
        Ok(())
    }
}

#[derive(Clone)]
struct Counters {
    open: Counter,
    dropped: Counter,
}

/// One listening port and what its connections share.
#[derive(Clone)]
struct Port {
    ctx: SourceContext,
    settings: Settings,
    counters: Counters,
    local: SocketAddr,
}

impl Port {
    async fn accept(self, listener: TcpListener) {
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                _ = self.ctx.shutdown().wait() => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        connections.spawn(self.clone().serve(stream, peer));
                    }
                    Err(error) => {
                        // Out of file descriptors and the like: wait, do not spin.
                        tracing::warn!(source = self.ctx.name(), %error, "accepting a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
        drop(listener);
        while connections.join_next().await.is_some() {}
    }

    async fn serve(self, mut stream: TcpStream, peer: SocketAddr) {
        self.counters.open.inc();
        tracing::debug!(source = self.ctx.name(), %peer, "connection opened");
        let capacity = crate::transaction_capacity(&self.ctx).min(self.settings.batch_size);
        let mut framer = Framer::new(self.settings.event_size);
        loop {
            framer.buffer().reserve(64 * 1024);
            let read = tokio::select! {
                _ = self.ctx.shutdown().wait() => Ok(0),
                read = stream.read_buf(framer.buffer()) => read,
            };
            let at_end = match read {
                Ok(n) => n == 0,
                Err(error) => {
                    tracing::debug!(source = self.ctx.name(), %peer, %error, "connection broken");
                    true
                }
            };
            let mut events = Vec::new();
            while let Some(frame) = framer.next_frame() {
                events.push(self.event(frame, peer));
            }
            if at_end && let Some(frame) = framer.rest() {
                events.push(self.event(frame, peer));
            }
            // Everything read is put before the connection is read again: a full channel
            // holds the sender back.
            for chunk in crate::chunks(events, capacity) {
                self.deliver(chunk, peer).await;
            }
            if at_end {
                break;
            }
        }
        self.counters.open.sub(1);
    }

    fn event(&self, frame: Frame, peer: SocketAddr) -> Event {
        let mut event = event_of(&frame.message, frame.cut, self.settings.keep);
        client_headers(&mut event, self.settings.client_ip_header.as_deref(), peer);
        if let Some(key) = &self.settings.port_header {
            event
                .headers
                .set(key.clone(), self.local.port().to_string());
        }
        event
    }

    /// Puts a batch, retrying a failed put until it succeeds: the sender cannot be asked again.
    /// Only a batch that can never fit in the channel, or one still failing at shutdown, is
    /// dropped, and counted in `EventDroppedCount`.
    async fn deliver(&self, events: Vec<Event>, peer: SocketAddr) {
        let mut backoff = Duration::from_millis(100);
        loop {
            let error = match self.ctx.send(events.clone(), None).await {
                Ok(()) => return,
                Err(error) => error,
            };
            let n = events.len() as u64;
            if matches!(error, ChannelError::BatchTooLarge { .. })
                || self.ctx.shutdown().is_triggered()
            {
                tracing::error!(source = self.ctx.name(), %peer, %error, events = n, "syslog messages dropped");
                self.counters.dropped.add(n);
                return;
            }
            tracing::warn!(source = self.ctx.name(), %peer, %error, retry_in = ?backoff, "could not put syslog messages");
            tokio::select! {
                _ = self.ctx.shutdown().wait() => {}
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::io::AsyncWriteExt;

    use super::*;
    use ferry_core::test_support::{TestChannel, config, context};

    struct Running {
        addresses: Vec<SocketAddr>,
        shutdown: ferry_core::Shutdown,
        task: tokio::task::JoinHandle<Result<(), SourceError>>,
    }

    async fn start(channel: &Arc<TestChannel>, mut source: SyslogTcpSource) -> Running {
        let (tx, rx) = oneshot::channel();
        source.on_listen = Some(tx);
        let (ctx, shutdown) = context(channel);
        let task = tokio::spawn(Box::new(source).run(ctx));
        let addresses = rx.await.unwrap();
        Running {
            addresses,
            shutdown,
            task,
        }
    }

    async fn wait_for(channel: &TestChannel, n: usize) {
        tokio::time::timeout(Duration::from_secs(10), async {
            while channel.events().len() < n {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("events within 10 s");
    }

    #[tokio::test]
    async fn messages_in_both_framings_become_events() {
        let channel = TestChannel::new(100, 100);
        let source =
            SyslogTcpSource::build(&config("syslog_tcp", "port: 0\nclient_ip_header: client"))
                .unwrap();
        let running = start(&channel, source).await;
        let mut client = TcpStream::connect(running.addresses[0]).await.unwrap();
        let counted = "<165>1 2003-10-11T22:14:15.003Z host5424 app - - - counted";
        client
            .write_all(
                format!(
                    "<34>Oct 11 22:14:15 host3164 su: line\n{} {counted}",
                    counted.len()
                )
                .as_bytes(),
            )
            .await
            .unwrap();
        client.write_all(b"<13>last without newline").await.unwrap();
        client.shutdown().await.unwrap();
        wait_for(&channel, 3).await;
        let events = channel.events();
        assert_eq!(
            channel.bodies(),
            ["su: line", "app - - - counted", "<13>last without newline"]
        );
        assert_eq!(events[0].headers["host"], "host3164");
        assert_eq!(events[1].headers["host"], "host5424");
        assert_eq!(events[1].headers["timestamp"], "1065910455003");
        assert_eq!(events[0].headers["client"], "127.0.0.1");
        running.shutdown.trigger();
        running.task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn multiport_listens_on_every_port_and_names_it() {
        let channel = TestChannel::new(100, 100);
        let source = SyslogTcpSource::build_multiport(&config(
            "multiport_syslog_tcp",
            "ports: [0, 0]\nport_header: port\nbatch_size: 10",
        ))
        .unwrap();
        let running = start(&channel, source).await;
        assert_eq!(running.addresses.len(), 2);
        for (i, address) in running.addresses.iter().enumerate() {
            let mut client = TcpStream::connect(address).await.unwrap();
            client
                .write_all(format!("<13>Oct 11 22:14:15 h m{i}\n").as_bytes())
                .await
                .unwrap();
            wait_for(&channel, i + 1).await;
        }
        let events = channel.events();
        for (i, address) in running.addresses.iter().enumerate() {
            assert_eq!(&events[i].body[..], format!("m{i}").as_bytes());
            assert_eq!(events[i].headers["port"], address.port().to_string());
        }
        running.shutdown.trigger();
        running.task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_failed_put_is_retried_not_lost() {
        let channel = TestChannel::new(100, 100);
        let source = SyslogTcpSource::build(&config("syslog_tcp", "port: 0")).unwrap();
        let running = start(&channel, source).await;
        channel.fail_puts(true);
        let mut client = TcpStream::connect(running.addresses[0]).await.unwrap();
        client
            .write_all(b"<13>Oct 11 22:14:15 h kept\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(channel.events().is_empty());
        channel.fail_puts(false);
        wait_for(&channel, 1).await;
        assert_eq!(channel.bodies(), ["kept"]);
        running.shutdown.trigger();
        running.task.await.unwrap().unwrap();
    }

    #[test]
    fn options_are_checked_and_named() {
        let tcp = |yaml: &str| {
            SyslogTcpSource::build(&config("syslog_tcp", yaml))
                .unwrap_err()
                .to_string()
        };
        let multi = |yaml: &str| {
            SyslogTcpSource::build_multiport(&config("multiport_syslog_tcp", yaml))
                .unwrap_err()
                .to_string()
        };
        assert!(tcp("port: 1\nevent_size: 5").contains("`event_size`"));
        assert!(tcp("port: 1\nkeep_fields: hostnme").contains("`keep_fields`"));
        assert!(tcp("port: 1\nclient_ip_header: ''").contains("`client_ip_header`"));
        assert!(tcp("port: 1\nkeepFields: all").contains("did you mean `keep_fields`"));
        assert!(tcp("host: 0.0.0.0").contains("port"));
        assert!(multi("ports: []").contains("`ports`"));
        assert!(
            multi("ports: '5140 x'").contains("`x` is not a port"),
            "{}",
            multi("ports: '5140 x'")
        );
        assert!(multi("ports: [5140, 5140]").contains("listed twice"));
        assert!(multi("ports: [1]\nbatch_size: 0").contains("`batch_size`"));
        let flume = SyslogTcpSource::build_multiport(&config(
            "multiport_syslog_tcp",
            "ports: '5140 5141'\nkeep_fields: true",
        ))
        .unwrap();
        assert_eq!(flume.ports, [5140, 5141]);
        assert_eq!(flume.settings.keep, KeepFields::ALL);
        assert_eq!(flume.host, "127.0.0.1");
    }
}
