//! `http`: Flume's `HTTPSource` with its default `JSONHandler`. A client POSTs (to any path) a
//! JSON array of events:
//!
//! ```json
//! [{"headers": {"host": "web-1"}, "body": "first line"}, {"body": "second line"}]
//! ```
//!
//! `headers` (string values) and `body` (a string, stored as its UTF-8 bytes) may be left out.
//! A request is one put, answered:
//!
//! | status | when |
//! |--------|------|
//! | 200 | every event was committed to every channel |
//! | 400 | the body is not such a JSON array (the message says why) |
//! | 405 | the method is not POST |
//! | 413 | more events than the channels' `transaction_capacity` (or their byte capacity), or a body over `max_body_size` |
//! | 503 | the channel is full: retry later (nothing was stored) |
//! | 500 | the channel failed to store the events |
//!
//! On shutdown the source stops accepting connections and answers the requests in flight.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{Method, StatusCode};
use bytes::Bytes;
use ferry_core::{
    ChannelError, ComponentConfig, ConfigError, Counter, Event, Headers, Source, SourceContext,
    SourceError, async_trait, config::ByteSize,
};
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// Options of the `http` source.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// Address to listen on: `0.0.0.0` for every interface. Default `127.0.0.1`, reachable
    /// from this machine only (Flume requires it). Flume: `bind`.
    #[serde(default = "crate::loopback")]
    pub bind: String,
    /// TCP port (`0` picks a free one, logged at start). Required. Flume: `port`.
    pub port: u16,
    /// Largest request body accepted; larger ones are answered 413. Default `16MiB`.
    /// (No Flume counterpart: Flume does not limit it.)
    #[serde(default = "default_max_body_size")]
    pub max_body_size: ByteSize,
}

fn default_max_body_size() -> ByteSize {
    ByteSize(16 * 1024 * 1024)
}

/// One element of the JSON array, as Flume's `JSONHandler` reads it.
#[derive(Deserialize)]
struct JsonEvent {
    #[serde(default)]
    headers: Option<Headers>,
    #[serde(default)]
    body: Option<String>,
}

/// The HTTP source.
#[derive(Debug)]
pub struct HttpSource {
    config: HttpConfig,
    /// Told the bound address once listening (tests bind port 0).
    on_listen: Option<oneshot::Sender<SocketAddr>>,
}

impl HttpSource {
    /// Validates the options.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        Ok(Self {
            config: cfg.parse()?,
            on_listen: None,
        })
    }
}

struct Shared {
    ctx: SourceContext,
    read_fail: Counter,
}

#[async_trait]
impl Source for HttpSource {
    async fn run(self: Box<Self>, ctx: SourceContext) -> Result<(), SourceError> {
        let HttpSource { config, on_listen } = *self;
        let address = format!("{}:{}", config.bind, config.port);
        let listener = TcpListener::bind(&address)
            .await
            .map_err(|e| SourceError::io(format!("binding {address}"), e))?;
        let local = listener
            .local_addr()
            .map_err(|e| SourceError::io(format!("binding {address}"), e))?;
        tracing::info!(source = ctx.name(), address = %local, "http source listening");
        crate::listening(&ctx);
        if let Some(tx) = on_listen {
            let _ = tx.send(local);
        }
        let limit = usize::try_from(config.max_body_size.bytes()).unwrap_or(usize::MAX);
        let shared = Arc::new(Shared {
            read_fail: ctx.metrics().counter("EventReadFail"),
            ctx: ctx.clone(),
        });
        let app = Router::new()
            .fallback(receive)
            .with_state(shared)
            .layer(DefaultBodyLimit::max(limit));
        let shutdown = ctx.shutdown().clone();
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.wait().await })
            .await
            .map_err(|e| SourceError::io(format!("serving HTTP on {local}"), e))
    }
}

async fn receive(
    State(shared): State<Arc<Shared>>,
    method: Method,
    body: Bytes,
) -> (StatusCode, String) {
    if method != Method::POST {
        return (
            StatusCode::METHOD_NOT_ALLOWED,
            "POST a JSON array of {\"headers\": {...}, \"body\": \"...\"}\n".into(),
        );
    }
    let parsed: Vec<JsonEvent> = match serde_json::from_slice(&body) {
        Ok(parsed) => parsed,
        Err(error) => {
            shared.read_fail.inc();
            return (
                StatusCode::BAD_REQUEST,
                format!(
                    "malformed request: {error}; expected a JSON array of {{\"headers\": {{...}}, \"body\": \"...\"}}\n"
                ),
            );
        }
    };
    let ctx = &shared.ctx;
    let capacity = crate::transaction_capacity(ctx);
    if parsed.len() > capacity {
        return (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "{} events in one request exceed the channel's transaction capacity of {capacity}; send smaller batches\n",
                parsed.len()
            ),
        );
    }
    if parsed.is_empty() {
        return (StatusCode::OK, String::new());
    }
    let events: Vec<Event> = parsed
        .into_iter()
        .map(|e| Event::new(e.headers.unwrap_or_default(), e.body.unwrap_or_default()))
        .collect();
    match ctx.try_send(events, None).await {
        Ok(()) => (StatusCode::OK, String::new()),
        Err(error) => {
            let status = match error {
                ChannelError::Full { .. } => StatusCode::SERVICE_UNAVAILABLE,
                ChannelError::BatchTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
                ChannelError::Storage { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            };
            tracing::debug!(source = ctx.name(), %error, %status, "request refused");
            (status, format!("{error}\n"))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use ferry_core::test_support::{TestChannel, config, context};

    struct Running {
        url: String,
        shutdown: ferry_core::Shutdown,
        task: tokio::task::JoinHandle<Result<(), SourceError>>,
    }

    async fn start(channel: &Arc<TestChannel>, extra: &str) -> Running {
        let yaml = format!("bind: 127.0.0.1\nport: 0\n{extra}");
        let mut source = HttpSource::build(&config("http", &yaml)).unwrap();
        let (tx, rx) = oneshot::channel();
        source.on_listen = Some(tx);
        let (ctx, shutdown) = context(channel);
        let task = tokio::spawn(Box::new(source).run(ctx));
        let address = rx.await.unwrap();
        Running {
            url: format!("http://{address}/"),
            shutdown,
            task,
        }
    }

    async fn post(url: &str, body: &str) -> (u16, String) {
        ferry_core::install_tls_provider();
        let response = reqwest::Client::new()
            .post(url)
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.text().await.unwrap())
    }

    #[tokio::test]
    async fn answers_200_once_the_events_are_stored() {
        let channel = TestChannel::new(10, 10);
        let running = start(&channel, "").await;
        assert_eq!(post(&running.url, "[]").await, (200, String::new()));
        let body = r#"[{"headers":{"a":"1"},"body":"first"},{"body":"second"},{}]"#;
        assert_eq!(post(&running.url, body).await, (200, String::new()));
        let events = channel.events();
        assert_eq!(events.len(), 3);
        assert_eq!(events[0].headers.value("a"), Some("1"));
        assert_eq!(&events[0].body[..], b"first");
        assert_eq!(&events[1].body[..], b"second");
        assert!(events[2].body.is_empty() && events[2].headers.is_empty());
        running.shutdown.trigger();
        running.task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn answers_503_when_the_channel_is_full() {
        let channel = TestChannel::new(2, 10);
        let running = start(&channel, "").await;
        assert_eq!(
            post(&running.url, r#"[{"body":"a"},{"body":"b"}]"#).await.0,
            200
        );
        let (status, message) = post(&running.url, r#"[{"body":"c"}]"#).await;
        assert_eq!(status, 503, "{message}");
        assert!(message.contains("full"), "{message}");
        channel.drain();
        assert_eq!(post(&running.url, r#"[{"body":"c"}]"#).await.0, 200);
        assert_eq!(channel.bodies(), ["c"]);
        running.shutdown.trigger();
        running.task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn answers_400_with_a_reason_for_malformed_json() {
        let channel = TestChannel::new(10, 10);
        let running = start(&channel, "").await;
        for bad in [r#"[{"body":"a"}"#, r#"{"body":"a"}"#, r#"[{"body":1}]"#] {
            let (status, message) = post(&running.url, bad).await;
            assert_eq!(status, 400, "{bad}: {message}");
            assert!(message.contains("malformed request"), "{message}");
        }
        assert!(channel.events().is_empty());
        running.shutdown.trigger();
        running.task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn answers_413_above_the_transaction_capacity_or_body_limit() {
        let channel = TestChannel::new(10, 2);
        let running = start(&channel, "max_body_size: 1KiB").await;
        let (status, message) = post(&running.url, r#"[{},{},{}]"#).await;
        assert_eq!(status, 413);
        assert!(message.contains("transaction capacity of 2"), "{message}");
        let big = format!(r#"[{{"body":"{}"}}]"#, "x".repeat(2000));
        assert_eq!(post(&running.url, &big).await.0, 413);
        assert!(channel.events().is_empty());
        running.shutdown.trigger();
        running.task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn answers_500_when_the_channel_fails_and_405_for_get() {
        let channel = TestChannel::new(10, 10);
        let running = start(&channel, "").await;
        channel.fail_puts(true);
        let (status, message) = post(&running.url, r#"[{"body":"a"}]"#).await;
        assert_eq!(status, 500);
        assert!(message.contains("disk on fire"), "{message}");
        ferry_core::install_tls_provider();
        let get = reqwest::get(&running.url).await.unwrap();
        assert_eq!(get.status().as_u16(), 405);
        running.shutdown.trigger();
        running.task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn stops_listening_on_shutdown() {
        let channel = TestChannel::new(10, 10);
        let running = start(&channel, "").await;
        running.shutdown.trigger();
        tokio::time::timeout(Duration::from_secs(5), running.task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        ferry_core::install_tls_provider();
        assert!(reqwest::get(&running.url).await.is_err());
    }
}
