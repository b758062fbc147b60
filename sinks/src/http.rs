//! `http`: Flume's `HttpSink`, batch-shaped. Each batch is one POST to `endpoint`: by default a
//! JSON array of `{"headers": {...}, "body": "..."}` (the format the `http` source and Flume's
//! `JSONHandler` read; bodies that are not UTF-8 are sent with U+FFFD replacements), or with
//! `format: lines` the bodies, each followed by `\n`.
//!
//! | response | result |
//! |----------|--------|
//! | 2xx | delivered |
//! | 5xx, 408, 429, 3xx (redirects are not followed), timeout, connection error | transient `Err`: the runner retries the batch after a backoff |
//! | any other 4xx | permanent `Err` ([`SinkError::permanent`]): the endpoint refuses the data itself; the runner splits the batch to find the events at fault and moves them to the sink's `dead_letter` channel (without one it keeps retrying) |
//!
//! Unlike Flume's `HttpSink` (one request per event), one request carries the whole batch.
//! The sink keeps no progress of its own, so it delivers at least once: a crash between the
//! endpoint's 2xx and the take commit sends that batch again. When the runner splits a refused
//! batch, each half the endpoint accepts is delivered at once, but the take commits only when
//! the whole batch is settled: a crash or a transient failure before then sends the accepted
//! halves again.

use std::borrow::Cow;
use std::error::Error as _;
use std::time::Duration;

use ferry_core::{
    ComponentConfig, ComponentMetrics, ConfigError, Event, Headers, Sink, SinkBatch, SinkContext,
    SinkError, async_trait,
};
use reqwest::header::CONTENT_TYPE;
use reqwest::{Client, Url};
use serde::{Deserialize, Serialize, Serializer};

/// Options of the `http` sink.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSinkConfig {
    /// URL to POST batches to, e.g. `http://127.0.0.1:8080/events`. Required.
    /// Flume: `endpoint`.
    pub endpoint: String,
    /// Longest wait for a whole request and its response. Default `5s`.
    /// Flume: `requestTimeout` (5000 ms).
    #[serde(default = "default_timeout", with = "ferry_core::config::duration")]
    pub request_timeout: Duration,
    /// Longest wait to connect. Default `5s`. Flume: `connectTimeout` (5000 ms).
    #[serde(default = "default_timeout", with = "ferry_core::config::duration")]
    pub connect_timeout: Duration,
    /// `Content-Type` of the requests. Default `application/json` for `format: json`,
    /// `text/plain` for `format: lines`. Flume: `contentTypeHeader` (default `text/plain`).
    #[serde(default)]
    pub content_type: Option<String>,
    /// Request body: `json` (an array of `{headers, body}`) or `lines`. Default `json`.
    /// (No Flume counterpart: Flume sends each body alone.)
    #[serde(default)]
    pub format: BodyFormat,
}

fn default_timeout() -> Duration {
    Duration::from_secs(5)
}

/// How a batch is written in the request body.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BodyFormat {
    /// A JSON array of `{"headers": {...}, "body": "..."}`.
    #[default]
    Json,
    /// The bodies, each followed by `\n`.
    Lines,
}

/// The HTTP sink.
#[derive(Debug)]
pub struct HttpSink {
    endpoint: Url,
    content_type: String,
    config: HttpSinkConfig,
    client: Option<Client>,
    /// The sink's metrics, from `start`: a connection error marks the endpoint unreachable.
    metrics: Option<ComponentMetrics>,
}

impl HttpSink {
    /// Validates the options.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        let config: HttpSinkConfig = cfg.parse()?;
        let endpoint = Url::parse(&config.endpoint).map_err(|e| {
            cfg.error_at(
                "endpoint",
                format!("invalid URL `{}`: {e}", config.endpoint),
            )
        })?;
        if endpoint.scheme() != "http" {
            return Err(cfg.error_at(
                "endpoint",
                format!(
                    "unsupported scheme `{}` in `{}`: only `http` is supported",
                    endpoint.scheme(),
                    config.endpoint
                ),
            ));
        }
        let content_type = config.content_type.clone().unwrap_or_else(|| {
            match config.format {
                BodyFormat::Json => "application/json",
                BodyFormat::Lines => "text/plain",
            }
            .into()
        });
        Ok(Self {
            endpoint,
            content_type,
            config,
            client: None,
            metrics: None,
        })
    }

    fn client(&mut self) -> Result<Client, SinkError> {
        if let Some(client) = &self.client {
            return Ok(client.clone());
        }
        ferry_core::install_tls_provider();
        let client = Client::builder()
            .timeout(self.config.request_timeout)
            .connect_timeout(self.config.connect_timeout)
            // A redirected POST may be replayed as a GET without the body, whose 200 would
            // count a batch that never arrived as delivered: treat 3xx as a failure instead.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| SinkError::Delivery(format!("building the HTTP client: {e}")))?;
        self.client = Some(client.clone());
        Ok(client)
    }

    fn body(&self, events: &[Event]) -> Result<Vec<u8>, SinkError> {
        match self.config.format {
            BodyFormat::Json => serde_json::to_vec(&JsonBatch(events))
                .map_err(|e| SinkError::Delivery(format!("encoding the batch as JSON: {e}"))),
            BodyFormat::Lines => {
                let size = events.iter().map(|e| e.body.len() + 1).sum();
                let mut out = Vec::with_capacity(size);
                for event in events {
                    out.extend_from_slice(&event.body);
                    out.push(b'\n');
                }
                Ok(out)
            }
        }
    }
}

/// A batch serialized as a JSON array without building an intermediate vector.
struct JsonBatch<'a>(&'a [Event]);

#[derive(Serialize)]
struct JsonEvent<'a> {
    headers: &'a Headers,
    body: Cow<'a, str>,
}

impl Serialize for JsonBatch<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|event| JsonEvent {
            headers: &event.headers,
            body: String::from_utf8_lossy(&event.body),
        }))
    }
}

/// The error and its causes, e.g. `error sending request: connection refused`.
fn describe(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// At most the first 512 bytes of a response body, for error messages.
async fn snippet(response: reqwest::Response) -> String {
    let mut response = response;
    match response.chunk().await {
        Ok(Some(chunk)) => {
            let text = String::from_utf8_lossy(&chunk[..chunk.len().min(512)]);
            text.trim().to_owned()
        }
        _ => String::new(),
    }
}

#[async_trait]
impl Sink for HttpSink {
    async fn start(&mut self, ctx: &SinkContext) -> Result<(), SinkError> {
        self.metrics = Some(ctx.metrics.clone());
        self.client().map(drop)
    }

    async fn deliver(&mut self, batch: SinkBatch<'_>) -> Result<(), SinkError> {
        if batch.events.is_empty() {
            return Ok(());
        }
        let client = self.client()?;
        let body = self.body(batch.events)?;
        let endpoint = &self.endpoint;
        let response = client
            .post(endpoint.clone())
            .header(CONTENT_TYPE, &self.content_type)
            .body(body)
            .send()
            .await
            .map_err(|e| {
                let error = describe(&e);
                if e.is_connect()
                    && let Some(metrics) = &self.metrics
                {
                    // Known before any retry: `/health` names the endpoint from this first
                    // refusal on; the next delivered batch clears it.
                    metrics.unreachable(format!("cannot reach {endpoint}: {error}"));
                }
                SinkError::Delivery(format!("POST {endpoint}: {error}"))
            })?;
        let status = response.status();
        if status.is_success() {
            // Read the (usually empty) answer so the connection can be reused.
            let _ = response.bytes().await;
            return Ok(());
        }
        let answer = snippet(response).await;
        let reason = format!(
            "POST {endpoint}: {status}{}{answer}",
            if answer.is_empty() { "" } else { ": " }
        );
        if refuses_for_good(status) {
            Err(SinkError::permanent(reason))
        } else {
            Err(SinkError::Delivery(reason))
        }
    }
}

/// Whether an answer refuses the request itself, so that sending it again cannot succeed:
/// every 4xx except 408 Request Timeout and 429 Too Many Requests.
fn refuses_for_good(status: reqwest::StatusCode) -> bool {
    status.is_client_error()
        && status != reqwest::StatusCode::REQUEST_TIMEOUT
        && status != reqwest::StatusCode::TOO_MANY_REQUESTS
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU16, Ordering};
    use std::sync::{Arc, Mutex};

    use axum::Router;
    use axum::extract::State;
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::post;

    use super::*;

    #[derive(Default)]
    struct Endpoint {
        status: AtomicU16,
        delay_ms: AtomicU16,
        requests: Mutex<Vec<(String, Vec<u8>)>>,
    }

    async fn record(
        State(endpoint): State<Arc<Endpoint>>,
        headers: HeaderMap,
        body: axum::body::Bytes,
    ) -> (StatusCode, &'static str) {
        let delay = endpoint.delay_ms.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(delay.into())).await;
        let content_type = headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        endpoint
            .requests
            .lock()
            .unwrap()
            .push((content_type, body.to_vec()));
        let status = StatusCode::from_u16(endpoint.status.load(Ordering::SeqCst)).unwrap();
        (status, "endpoint says no")
    }

    async fn serve(status: u16) -> (String, Arc<Endpoint>) {
        let endpoint = Arc::new(Endpoint::default());
        endpoint.status.store(status, Ordering::SeqCst);
        let app = Router::new()
            .route("/events", post(record))
            .route(
                "/moved",
                post(|| async { (StatusCode::FOUND, [("location", "/elsewhere")], "") }),
            )
            .route(
                "/elsewhere",
                axum::routing::any(|| async { StatusCode::OK }),
            )
            .with_state(endpoint.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (format!("http://{address}/events"), endpoint)
    }

    async fn sink(url: &str, extra: &str) -> HttpSink {
        let yaml = format!("endpoint: {url}\n{extra}");
        let mut sink = HttpSink::build(&crate::config("http", &yaml)).unwrap();
        sink.start(&crate::context()).await.unwrap();
        sink
    }

    fn events() -> Vec<Event> {
        let mut first = Event::from_body("first");
        first.headers.insert("host".into(), "web-1".into());
        vec![first, Event::from_body("second")]
    }

    async fn deliver(sink: &mut HttpSink) -> Result<(), SinkError> {
        let events = events();
        sink.deliver(SinkBatch {
            events: &events,
            sequences: None,
        })
        .await
    }

    #[tokio::test]
    async fn posts_the_batch_as_a_json_array() {
        let (url, endpoint) = serve(200).await;
        let mut sink = sink(&url, "").await;
        deliver(&mut sink).await.unwrap();
        let requests = endpoint.requests.lock().unwrap();
        assert_eq!(requests.len(), 1, "one request per batch");
        assert_eq!(requests[0].0, "application/json");
        let body: serde_json::Value = serde_json::from_slice(&requests[0].1).unwrap();
        assert_eq!(
            body,
            serde_json::json!([
                {"headers": {"host": "web-1"}, "body": "first"},
                {"headers": {}, "body": "second"}
            ])
        );
    }

    #[tokio::test]
    async fn posts_lines_when_asked() {
        let (url, endpoint) = serve(204).await;
        let mut sink = sink(&url, "format: lines\ncontent_type: text/x-log").await;
        deliver(&mut sink).await.unwrap();
        let requests = endpoint.requests.lock().unwrap();
        assert_eq!(
            requests[0],
            ("text/x-log".to_owned(), b"first\nsecond\n".to_vec())
        );
    }

    #[tokio::test]
    async fn server_error_is_an_error_to_retry() {
        let (url, endpoint) = serve(503).await;
        let mut sink = sink(&url, "").await;
        let err = deliver(&mut sink).await.unwrap_err();
        assert!(err.to_string().contains("503"), "{err}");
        assert!(!err.is_permanent(), "{err}");
        endpoint.status.store(200, Ordering::SeqCst);
        deliver(&mut sink).await.unwrap();
    }

    #[tokio::test]
    async fn client_error_is_a_permanent_error_with_the_answer() {
        let (url, _) = serve(400).await;
        let mut sink = sink(&url, "").await;
        let err = deliver(&mut sink).await.unwrap_err();
        assert!(err.is_permanent(), "{err}");
        let err = err.to_string();
        assert!(err.contains("400 Bad Request: endpoint says no"), "{err}");
    }

    #[tokio::test]
    async fn request_timeout_and_too_many_requests_are_transient() {
        let (url, endpoint) = serve(408).await;
        let mut sink = sink(&url, "").await;
        assert!(!deliver(&mut sink).await.unwrap_err().is_permanent());
        endpoint.status.store(429, Ordering::SeqCst);
        assert!(!deliver(&mut sink).await.unwrap_err().is_permanent());
        endpoint.status.store(413, Ordering::SeqCst);
        assert!(deliver(&mut sink).await.unwrap_err().is_permanent());
    }

    #[tokio::test]
    async fn redirect_is_an_error_not_a_delivery() {
        let (url, _) = serve(200).await;
        let moved = url.replace("/events", "/moved");
        let mut sink = sink(&moved, "").await;
        let err = deliver(&mut sink).await.unwrap_err().to_string();
        assert!(err.contains("302"), "{err}");
    }

    #[tokio::test]
    async fn connection_refused_is_an_error() {
        // Bound and not listening: connections are refused, and no other socket can take
        // the port while the test runs (a released port could be).
        let dead = tokio::net::TcpSocket::new_v4().unwrap();
        dead.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let address = dead.local_addr().unwrap();
        let url = format!("http://{address}/events");
        let mut sink = sink(&url, "").await;
        let err = deliver(&mut sink).await.unwrap_err();
        assert!(!err.is_permanent(), "{err}");
        let err = err.to_string();
        assert!(err.starts_with(&format!("POST {url}: ")), "{err}");
        // Unreachable at once, naming the endpoint, and since the first refusal.
        let metrics = sink.metrics.clone().unwrap();
        assert!(metrics.is_unreachable());
        let first = metrics.failure().unwrap();
        assert!(
            first.message.starts_with(&format!("cannot reach {url}: ")),
            "{first:?}"
        );
        deliver(&mut sink).await.unwrap_err();
        assert_eq!(metrics.failure().unwrap().since, first.since);
    }

    #[tokio::test]
    async fn an_answer_of_any_status_is_no_connection_error() {
        let (url, _) = serve(503).await;
        let mut sink = sink(&url, "").await;
        deliver(&mut sink).await.unwrap_err();
        assert!(!sink.metrics.as_ref().unwrap().is_unreachable());
    }

    #[tokio::test]
    async fn slow_endpoint_times_out() {
        let (url, endpoint) = serve(200).await;
        endpoint.delay_ms.store(2000, Ordering::SeqCst);
        let mut sink = sink(&url, "request_timeout: 100ms").await;
        assert!(deliver(&mut sink).await.is_err());
    }

    #[test]
    fn rejects_bad_endpoints() {
        let build = |yaml: &str| HttpSink::build(&crate::config("http", yaml));
        let err = build("endpoint: not a url").unwrap_err();
        assert!(err.message.contains("invalid URL"), "{}", err.message);
        let err = build("endpoint: https://example.com/").unwrap_err();
        assert!(err.message.contains("only `http`"), "{}", err.message);
        assert!(build("endpoint: http://127.0.0.1:1/\nformat: xml").is_err());
    }
}
