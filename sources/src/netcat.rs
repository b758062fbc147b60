//! `netcat`: Flume's `NetcatSource`. Listens on TCP; every line (up to `\n`, which is removed;
//! a `\r` before it is kept, as in Flume) becomes one event. Each line is answered `OK\n` once
//! the channel accepted it, or `FAILED: <reason>\n` if the put failed.
//!
//! Throughput: the lines of one read from the socket (up to 64 KiB) are put in one batch (split
//! to the channels' `transaction_capacity`) and their `OK`s written back in one write, so the
//! per-line cost is small. Connections are served concurrently.
//!
//! A line longer than `max_line_length` (counting its `\n`) is answered, as Flume does, with
//! `FAILED: Event exceeds the maximum length (N chars, including newline)`, counted in
//! `EventReadFail`, and the connection is closed; the lines before it are delivered.
//! Unlike Flume, a last line without `\n` when the client closes its side is delivered too.

use std::net::SocketAddr;

use bytes::Bytes;
use ferry_core::{
    ComponentConfig, ConfigError, Counter, Event, Source, SourceContext, SourceError, async_trait,
};
use serde::Deserialize;
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use crate::lines::LineBuffer;

/// Options of the `netcat` source.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetcatConfig {
    /// Address to listen on: `0.0.0.0` for every interface. Default `127.0.0.1`, reachable
    /// from this machine only (Flume requires it). Flume: `bind`.
    #[serde(default = "crate::loopback")]
    pub bind: String,
    /// TCP port to listen on (`0` picks a free one, logged at start). Required. Flume: `port`.
    pub port: u16,
    /// Longest accepted line in bytes, counting its `\n`. Default `512`.
    /// Flume: `max-line-length`.
    #[serde(default = "default_max_line_length")]
    pub max_line_length: usize,
    /// Answer `OK` for every line accepted. Default `true`. Flume: `ack-every-event`.
    #[serde(default = "default_true")]
    pub ack_every_event: bool,
}

fn default_max_line_length() -> usize {
    512
}

fn default_true() -> bool {
    true
}

/// The netcat source.
#[derive(Debug)]
pub struct NetcatSource {
    config: NetcatConfig,
    /// Told the bound address once listening (tests bind port 0).
    on_listen: Option<oneshot::Sender<SocketAddr>>,
}

impl NetcatSource {
    /// Validates the options.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        let config: NetcatConfig = cfg.parse()?;
        if config.max_line_length < 2 {
            return Err(cfg.error_at(
                "max_line_length",
                "`max_line_length` must be at least 2 (one byte and the newline)",
            ));
        }
        Ok(Self {
            config,
            on_listen: None,
        })
    }
}

#[async_trait]
impl Source for NetcatSource {
    async fn run(self: Box<Self>, ctx: SourceContext) -> Result<(), SourceError> {
        let NetcatSource { config, on_listen } = *self;
        let address = format!("{}:{}", config.bind, config.port);
        let listener = TcpListener::bind(&address)
            .await
            .map_err(|e| SourceError::io(format!("binding {address}"), e))?;
        let local = listener
            .local_addr()
            .map_err(|e| SourceError::io(format!("binding {address}"), e))?;
        tracing::info!(source = ctx.name(), address = %local, "netcat source listening");
        crate::listening(&ctx);
        if let Some(tx) = on_listen {
            let _ = tx.send(local);
        }
        let counters = Counters {
            open: ctx.metrics().counter("OpenConnectionCount"),
            read_fail: ctx.metrics().counter("EventReadFail"),
        };
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                _ = ctx.shutdown().wait() => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let connection = Connection {
                            ctx: ctx.clone(),
                            config: config.clone(),
                            counters: counters.clone(),
                            peer,
                        };
                        connections.spawn(connection.serve(stream));
                    }
                    Err(error) => {
                        // Out of file descriptors and the like: wait, do not spin.
                        tracing::warn!(source = ctx.name(), %error, "accepting a connection");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                },
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
        // Stop accepting at once; connections finish the batch they are sending and close.
        drop(listener);
        while connections.join_next().await.is_some() {}
        Ok(())
    }
}

#[derive(Clone)]
struct Counters {
    open: Counter,
    read_fail: Counter,
}

struct Connection {
    ctx: SourceContext,
    config: NetcatConfig,
    counters: Counters,
    peer: SocketAddr,
}

impl Connection {
    async fn serve(self, stream: TcpStream) {
        self.counters.open.inc();
        tracing::debug!(source = self.ctx.name(), peer = %self.peer, "connection opened");
        if let Err(error) = self.read_lines(stream).await {
            tracing::debug!(source = self.ctx.name(), peer = %self.peer, %error, "connection broken");
        }
        self.counters.open.sub(1);
    }

    async fn read_lines(&self, mut stream: TcpStream) -> std::io::Result<()> {
        let (mut reader, writer) = stream.split();
        let mut writer = BufWriter::new(writer);
        let max = self.config.max_line_length;
        let capacity = crate::transaction_capacity(&self.ctx);
        let mut lines = LineBuffer::new(false);
        loop {
            let read = tokio::select! {
                _ = self.ctx.shutdown().wait() => break,
                read = lines.fill(&mut reader) => read?,
            };
            let at_eof = read == 0;
            let mut bodies = Vec::new();
            let mut too_long = false;
            while let Some(len) = lines.next_line_len() {
                if len + 1 > max {
                    too_long = true;
                    break;
                }
                bodies.extend(lines.next_line());
            }
            if !too_long && lines.partial_len() >= max {
                too_long = true;
            }
            if at_eof && !too_long {
                bodies.extend(lines.take_rest());
            }
            for chunk in crate::chunks(bodies, capacity) {
                self.deliver(chunk, &mut writer).await?;
            }
            if too_long {
                self.counters.read_fail.inc();
                tracing::warn!(
                    source = self.ctx.name(), peer = %self.peer, max,
                    "client sent a line exceeding the maximum length; closing the connection"
                );
                let message = format!(
                    "FAILED: Event exceeds the maximum length ({max} chars, including newline)\n"
                );
                writer.write_all(message.as_bytes()).await?;
                writer.flush().await?;
                break;
            }
            writer.flush().await?;
            if at_eof {
                break;
            }
        }
        writer.shutdown().await
    }

    /// Puts one batch and writes the answer for each of its lines (into the buffer).
    async fn deliver<W: tokio::io::AsyncWrite + Unpin>(
        &self,
        bodies: Vec<Bytes>,
        writer: &mut BufWriter<W>,
    ) -> std::io::Result<()> {
        let n = bodies.len();
        let events = bodies.into_iter().map(Event::from_body).collect();
        match self.ctx.send(events, None).await {
            Ok(()) => {
                if self.config.ack_every_event {
                    for _ in 0..n {
                        writer.write_all(b"OK\n").await?;
                    }
                }
            }
            Err(error) => {
                tracing::warn!(source = self.ctx.name(), peer = %self.peer, %error, "could not put lines");
                let answer = format!("FAILED: {error}\n");
                for _ in 0..n {
                    writer.write_all(answer.as_bytes()).await?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::io::{AsyncBufReadExt, AsyncReadExt};

    use super::*;
    use ferry_core::test_support::{TestChannel, config, context};

    struct Running {
        address: SocketAddr,
        shutdown: ferry_core::Shutdown,
        task: tokio::task::JoinHandle<Result<(), SourceError>>,
    }

    async fn start(channel: &Arc<TestChannel>, extra: &str) -> Running {
        let yaml = format!("bind: 127.0.0.1\nport: 0\n{extra}");
        let mut source = NetcatSource::build(&config("netcat", &yaml)).unwrap();
        let (tx, rx) = oneshot::channel();
        source.on_listen = Some(tx);
        let (ctx, shutdown) = context(channel);
        let task = tokio::spawn(Box::new(source).run(ctx));
        let address = rx.await.unwrap();
        Running {
            address,
            shutdown,
            task,
        }
    }

    async fn read_n_lines(stream: &mut TcpStream, n: usize) -> Vec<String> {
        let mut reader = tokio::io::BufReader::new(stream);
        let mut out = Vec::new();
        for _ in 0..n {
            let mut line = String::new();
            reader.read_line(&mut line).await.unwrap();
            out.push(line);
        }
        out
    }

    #[tokio::test]
    async fn answers_ok_per_line_and_keeps_order() {
        let channel = TestChannel::new(100, 100);
        let running = start(&channel, "").await;
        let mut client = TcpStream::connect(running.address).await.unwrap();
        client.write_all(b"one\ntwo\r\nthree\n").await.unwrap();
        assert_eq!(read_n_lines(&mut client, 3).await, ["OK\n", "OK\n", "OK\n"]);
        assert_eq!(channel.bodies(), ["one", "two\r", "three"]);
        running.shutdown.trigger();
        running.task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn hundred_thousand_lines_arrive_in_order_in_batches() {
        let channel = TestChannel::new(200_000, 1000);
        let running = start(&channel, "").await;
        let client = TcpStream::connect(running.address).await.unwrap();
        let (mut rd, mut wr) = client.into_split();
        let total = 100_000;
        let writer = tokio::spawn(async move {
            let mut data = Vec::new();
            for i in 0..total {
                data.extend_from_slice(format!("line {i}\n").as_bytes());
            }
            wr.write_all(&data).await.unwrap();
            wr.shutdown().await.unwrap();
        });
        let mut answers = Vec::new();
        tokio::time::timeout(Duration::from_secs(60), rd.read_to_end(&mut answers))
            .await
            .expect("all answers within a minute")
            .unwrap();
        writer.await.unwrap();
        assert_eq!(answers.len(), total * 3);
        assert!(answers.chunks(3).all(|a| a == b"OK\n"));
        let bodies = channel.bodies();
        assert_eq!(bodies.len(), total);
        assert!(
            bodies
                .iter()
                .enumerate()
                .all(|(i, b)| *b == format!("line {i}"))
        );
        assert!(
            channel.batches() < total / 10,
            "lines are batched: {} puts",
            channel.batches()
        );
        running.shutdown.trigger();
        running.task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn answers_failed_when_the_put_fails() {
        let channel = TestChannel::new(100, 100);
        let running = start(&channel, "").await;
        channel.fail_puts(true);
        let mut client = TcpStream::connect(running.address).await.unwrap();
        client.write_all(b"a\n").await.unwrap();
        let answer = read_n_lines(&mut client, 1).await;
        assert_eq!(answer, ["FAILED: channel `test`: disk on fire\n"]);
        channel.fail_puts(false);
        client.write_all(b"b\n").await.unwrap();
        assert_eq!(read_n_lines(&mut client, 1).await, ["OK\n"]);
        assert_eq!(channel.bodies(), ["b"]);
        running.shutdown.trigger();
        running.task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn too_long_line_fails_and_closes_as_flume_does() {
        let channel = TestChannel::new(100, 100);
        let running = start(&channel, "max_line_length: 8").await;
        let mut client = TcpStream::connect(running.address).await.unwrap();
        client
            .write_all(b"1234567\n12345678\nnext\n")
            .await
            .unwrap();
        let mut answers = String::new();
        client.read_to_string(&mut answers).await.unwrap();
        assert_eq!(
            answers,
            "OK\nFAILED: Event exceeds the maximum length (8 chars, including newline)\n"
        );
        assert_eq!(channel.bodies(), ["1234567"]);
        running.shutdown.trigger();
        running.task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn serves_several_connections_at_once() {
        let channel = TestChannel::new(100, 100);
        let running = start(&channel, "").await;
        let mut first = TcpStream::connect(running.address).await.unwrap();
        let mut second = TcpStream::connect(running.address).await.unwrap();
        first.write_all(b"a1\n").await.unwrap();
        assert_eq!(read_n_lines(&mut first, 1).await, ["OK\n"]);
        second.write_all(b"b1\n").await.unwrap();
        assert_eq!(read_n_lines(&mut second, 1).await, ["OK\n"]);
        first.write_all(b"a2\n").await.unwrap();
        assert_eq!(read_n_lines(&mut first, 1).await, ["OK\n"]);
        assert_eq!(channel.bodies(), ["a1", "b1", "a2"]);
        running.shutdown.trigger();
        running.task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn without_acks_lines_are_delivered_silently() {
        let channel = TestChannel::new(100, 100);
        let running = start(&channel, "ack_every_event: false").await;
        let mut client = TcpStream::connect(running.address).await.unwrap();
        client
            .write_all(b"x\ny\nlast-without-newline")
            .await
            .unwrap();
        client.shutdown().await.unwrap();
        let mut answers = Vec::new();
        client.read_to_end(&mut answers).await.unwrap();
        assert!(answers.is_empty());
        assert_eq!(channel.bodies(), ["x", "y", "last-without-newline"]);
        running.shutdown.trigger();
        running.task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn stops_accepting_on_shutdown() {
        let channel = TestChannel::new(100, 100);
        let running = start(&channel, "").await;
        let mut open = TcpStream::connect(running.address).await.unwrap();
        open.write_all(b"before\n").await.unwrap();
        assert_eq!(read_n_lines(&mut open, 1).await, ["OK\n"]);
        running.shutdown.trigger();
        running.task.await.unwrap().unwrap();
        assert!(TcpStream::connect(running.address).await.is_err());
        let mut rest = Vec::new();
        assert_eq!(
            open.read_to_end(&mut rest).await.unwrap(),
            0,
            "closed cleanly"
        );
    }

    #[tokio::test]
    async fn binding_a_used_port_names_the_address() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let yaml = format!("bind: 127.0.0.1\nport: {port}");
        let source = NetcatSource::build(&config("netcat", &yaml)).unwrap();
        let channel = TestChannel::new(1, 1);
        let (ctx, _) = context(&channel);
        let err = Box::new(source).run(ctx).await.unwrap_err();
        assert!(
            err.to_string()
                .starts_with(&format!("binding 127.0.0.1:{port}: ")),
            "{err}"
        );
    }
}
