//! The agent's HTTP server on `agent.http`: metrics, health and the pipeline's state.
//!
//! | path | answers |
//! |---|---|
//! | `/metrics` | every counter as OpenMetrics text (`prometheus-client`): one family per Flume counter, labelled `name` and `type` |
//! | `/metrics.json` | Flume's JSON reporting layout: `{"CHANNEL.c1": {"ChannelSize": "0", ..., "Type": "CHANNEL"}, ...}`, every value a string |
//! | `/health` | 200 while no component has failed (or cannot reach its destination or input, or a sink's delivery has been in flight) for `agent.unhealthy_after` without a success; else 503 naming each, its last error and since when |
//! | `/api/pipeline` | the components with kind, type, name, counters, channel fill and last error (for a web console) |
//!
//! **Adding to it.** [`HttpServer::new`] starts from the pipeline's metrics; before
//! [`HttpServer::start`], [`HttpServer::registry_mut`] takes more Prometheus collectors (the
//! bundled broker's, say) into the same `/metrics`, and [`HttpServer::merge`] more routes (an
//! `/api/broker`), as an axum [`Router`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use ferry_core::{Channel, ComponentMetrics, Failure, MeteredChannel, Shutdown};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use serde_json::{Map, Value, json};
use tokio::task::JoinHandle;
use tracing::info;

use crate::topology::Topology;

/// Content type of the OpenMetrics text exposition.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// One component as the endpoints show it.
#[derive(Clone)]
struct Component {
    /// `source`, `channel` or `sink`.
    kind: &'static str,
    name: String,
    /// The plugin type: `taildir`, `file`, `kafka`, ...
    type_name: String,
    metrics: ComponentMetrics,
    /// For channels: to read the size before the counters.
    channel: Option<Arc<MeteredChannel>>,
    /// The channels a source puts to, or the one a sink takes from.
    channels: Vec<String>,
    /// For a sink of a sink group: the group.
    group: Option<String>,
}

impl Component {
    /// The counters, with the channel's gauges fresh.
    fn counters(&self) -> Vec<(&'static str, u64)> {
        if let Some(channel) = &self.channel {
            channel.refresh();
        }
        self.metrics.snapshot()
    }

    /// Flume's key for the component: `SOURCE.r1`.
    fn flume_key(&self) -> String {
        format!("{}.{}", self.kind.to_uppercase(), self.name)
    }

    /// What makes the component unhealthy once it has lasted `unhealthy_after`: its failure
    /// (a failed delivery, take or run, or what its client cannot reach) when that is old
    /// enough, else a delivery in flight for that long (a sink whose destination accepts the
    /// connection and never answers).
    fn trouble(&self, now: SystemTime, unhealthy_after: Duration) -> Option<Failure> {
        let old_enough = |failure: &Failure| {
            now.duration_since(failure.since).unwrap_or_default() >= unhealthy_after
        };
        if let Some(failure) = self.metrics.failure().filter(old_enough) {
            return Some(failure);
        }
        let (since, lasted) = self.metrics.delivery_in_flight()?;
        (lasted >= unhealthy_after).then(|| Failure {
            message: format!("delivery in flight for {} s", lasted.as_secs()),
            since,
        })
    }
}

/// Flume's `ChannelFillPercentage`: size over capacity, in percent; 0 for an unbounded channel.
fn fill_percentage(counters: &[(&'static str, u64)]) -> Option<f64> {
    let get = |key| counters.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
    let size = get("ChannelSize")?;
    let capacity = get("ChannelCapacity")?;
    Some(if capacity == 0 {
        0.0
    } else {
        size as f64 * 100.0 / capacity as f64
    })
}

/// The counters of every component of a pipeline, read by the endpoints. Cheap to clone.
#[derive(Clone)]
pub struct PipelineMetrics {
    /// Swapped whole when a reload changes the pipeline.
    components: Arc<std::sync::RwLock<Arc<Vec<Component>>>>,
    unhealthy_after: Duration,
}

impl PipelineMetrics {
    /// The metrics of every source, channel and sink of `topology` (sources and sinks share
    /// their counters with the specs that will run them).
    pub fn new(topology: &Topology) -> Self {
        // A spec holds its channels as the metered channels of the topology, shared.
        let channel_name = |channel: &Arc<dyn Channel>| {
            topology
                .channels
                .iter()
                .find(|(_, metered)| std::ptr::addr_eq(Arc::as_ptr(metered), Arc::as_ptr(channel)))
                .map(|(name, _)| name.clone())
        };
        let mut components = Vec::new();
        for spec in &topology.sources {
            components.push(Component {
                kind: "source",
                name: spec.name.clone(),
                type_name: spec.config.type_name().to_owned(),
                metrics: spec.metrics.clone(),
                channel: None,
                channels: spec.channels.iter().filter_map(channel_name).collect(),
                group: None,
            });
        }
        for (name, channel) in &topology.channels {
            components.push(Component {
                kind: "channel",
                name: name.clone(),
                type_name: topology
                    .channel_types
                    .get(name)
                    .cloned()
                    .unwrap_or_default(),
                metrics: channel.metrics().clone(),
                channel: Some(Arc::clone(channel)),
                channels: Vec::new(),
                group: None,
            });
        }
        let grouped = topology
            .sink_groups
            .iter()
            .flat_map(|g| g.members.iter().map(move |m| (m, Some(g.name.clone()))));
        for (spec, group) in topology.sinks.iter().map(|s| (s, None)).chain(grouped) {
            components.push(Component {
                kind: "sink",
                name: spec.name.clone(),
                type_name: spec.config.type_name().to_owned(),
                metrics: spec.metrics.clone(),
                channel: None,
                channels: channel_name(&spec.channel).into_iter().collect(),
                group,
            });
        }
        Self {
            components: Arc::new(std::sync::RwLock::new(Arc::new(components))),
            unhealthy_after: topology.agent.unhealthy_after,
        }
    }

    /// The components now.
    fn components(&self) -> Arc<Vec<Component>> {
        Arc::clone(&self.components.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Takes the components of `other` (a reloaded pipeline): every endpoint shows them from
    /// now on.
    pub fn replace(&self, other: &PipelineMetrics) {
        let components = other.components();
        *self.components.write().unwrap_or_else(|e| e.into_inner()) = components;
    }

    /// No components: the metrics of `agent broker`, which runs no pipeline.
    pub fn empty() -> Self {
        Self {
            components: Arc::new(std::sync::RwLock::new(Arc::new(Vec::new()))),
            unhealthy_after: Duration::from_secs(30),
        }
    }

    /// Flume's JSON reporting layout: one object per component, keyed `KIND.name`, each
    /// value a string, with `StartTime`, `StopTime` (epoch millis, 0 while running) and
    /// `Type`; sinks and sources also carry `LastError` (empty while not failing).
    pub fn flume_json(&self) -> Value {
        let mut all = Map::new();
        for component in self.components().iter() {
            let counters = component.counters();
            let mut entry = Map::new();
            for (key, value) in &counters {
                entry.insert((*key).to_owned(), Value::String(value.to_string()));
            }
            if let Some(fill) = fill_percentage(&counters) {
                entry.insert("ChannelFillPercentage".into(), json!(format!("{fill:?}")));
            }
            if component.kind != "channel" {
                let error = component.metrics.failure().map(|f| f.message);
                entry.insert("LastError".into(), json!(error.unwrap_or_default()));
            }
            let metrics = &component.metrics;
            entry.insert("StartTime".into(), json!(metrics.start_time().to_string()));
            entry.insert("StopTime".into(), json!(metrics.stop_time().to_string()));
            entry.insert("Type".into(), json!(component.kind.to_uppercase()));
            all.insert(component.flume_key(), Value::Object(entry));
        }
        Value::Object(all)
    }

    /// The components that have failed for longer than `agent.unhealthy_after` without a
    /// success since, with their failure.
    fn failing<'a>(&self, components: &'a [Component]) -> Vec<(&'a Component, Failure)> {
        let now = SystemTime::now();
        components
            .iter()
            .filter_map(|c| c.trouble(now, self.unhealthy_after).map(|f| (c, f)))
            .collect()
    }

    /// The `/health` answer: its status code and body.
    pub fn health(&self) -> (StatusCode, Value) {
        let all = self.components();
        let now = SystemTime::now();
        // A failing sink of a group whose other members deliver leaves the pipeline healthy
        // (that is what failover and load balancing are for): it is shown as degraded.
        let (degraded, failing): (Vec<_>, Vec<_>) =
            self.failing(&all).into_iter().partition(|(component, _)| {
                component.group.as_ref().is_some_and(|group| {
                    all.iter().any(|other| {
                        other.group.as_ref() == Some(group)
                            && other.name != component.name
                            && other.metrics.failure().is_none()
                            && other.trouble(now, self.unhealthy_after).is_none()
                    })
                })
            });
        let describe = |(component, failure): (&Component, Failure)| {
            json!({
                "component": component.flume_key(),
                "kind": component.kind,
                "name": component.name,
                "type": component.type_name,
                "error": failure.message,
                "since": humantime::format_rfc3339_millis(failure.since).to_string(),
                "failing_for_ms": now.duration_since(failure.since).unwrap_or_default().as_millis() as u64,
                "consecutive_failures": component.metrics.counter("ConsecutiveFailures").get(),
            })
        };
        let degraded: Vec<Value> = degraded.into_iter().map(describe).collect();
        if failing.is_empty() {
            let mut body = json!({"status": "ok", "components": all.len()});
            if !degraded.is_empty() {
                body["degraded"] = Value::Array(degraded);
            }
            return (StatusCode::OK, body);
        }
        let failing: Vec<Value> = failing.into_iter().map(describe).collect();
        (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "failing", "failing": failing, "degraded": degraded}),
        )
    }

    /// The `/api/pipeline` answer: every component with its counters.
    pub fn api(&self) -> Value {
        let components: Vec<Value> = self
            .components()
            .iter()
            .map(|component| {
                let counters = component.counters();
                let failure = component.metrics.failure();
                let mut value = json!({
                    "kind": component.kind,
                    "type": component.type_name,
                    "name": component.name,
                    "channels": component.channels,
                    "items": component.metrics.items().into_iter().map(|(k, found)| {
                        let values: Vec<Value> = found.values.iter()
                            .map(|(item, v)| json!({found.label: item, "value": v}))
                            .collect();
                        (k.to_owned(), json!(values))
                    }).collect::<Map<_, _>>(),
                    "latencies": component.metrics.latencies().into_iter().map(|(k, l)| {
                        (k.to_owned(), json!({
                            "count": l.count,
                            "sum_seconds": l.sum_seconds,
                            "buckets": ferry_core::metrics::LATENCY_BUCKETS.iter().zip(&l.buckets)
                                .map(|(le, n)| json!([le, n])).collect::<Vec<_>>(),
                        }))
                    }).collect::<Map<_, _>>(),
                    "counters": counters.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect::<Map<_, _>>(),
                    "start_time": component.metrics.start_time(),
                    "stop_time": component.metrics.stop_time(),
                    "last_error": failure.as_ref().map(|f| f.message.clone()),
                    "failing_since_ms": failure.as_ref().map(|f| {
                        f.since.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_millis() as u64
                    }),
                });
                if let Some(fill) = fill_percentage(&counters) {
                    value["fill_percentage"] = json!(fill);
                }
                value
            })
            .collect();
        json!({ "components": components })
    }
}

/// The Prometheus name of a Flume counter of a `kind` component, without the `_total` a
/// counter gets: `ferry_channel_event_put_success` for `EventPutSuccessCount`. Flume's name
/// in snake case without its `Count`; a channel's `Channel...` gauges lose the repeated word.
pub fn prometheus_name(kind: &str, flume: &str) -> String {
    let base = match (kind, flume) {
        ("channel", "ChannelSize") => "size".to_owned(),
        ("channel", "ChannelCapacity") => "capacity".to_owned(),
        ("channel", "ChannelFillPercentage") => "fill_percentage".to_owned(),
        (_, "OpenConnectionCount") => "open_connections".to_owned(),
        (_, "ChannelFullWaitMillis") => "channel_full_wait_milliseconds".to_owned(),
        ("channel", "OldestEventAgeMillis") => "oldest_event_age_milliseconds".to_owned(),
        (_, "FileBytesBehind") => "file_bytes_behind".to_owned(),
        _ => {
            let snake = snake_case(flume);
            snake
                .strip_suffix("_count")
                .map(str::to_owned)
                .unwrap_or(snake)
        }
    };
    format!("ferry_{kind}_{base}")
}

fn snake_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else if c.is_ascii_alphanumeric() {
            out.push(c);
        } else {
            out.push('_');
        }
    }
    out
}

/// What a Flume counter means, for the `# HELP` line.
fn help(flume: &str) -> &'static str {
    match flume {
        "EventReceivedCount" => {
            "Events the source received, before interceptors (Flume EventReceivedCount)"
        }
        "EventAcceptedCount" => {
            "Events the source put into all its channels (Flume EventAcceptedCount)"
        }
        "AppendBatchReceivedCount" => {
            "Batches the source received (Flume AppendBatchReceivedCount)"
        }
        "AppendBatchAcceptedCount" => {
            "Batches the source put into all its channels (Flume AppendBatchAcceptedCount)"
        }
        "EventFilteredCount" => "Events dropped by the source's interceptors",
        "EventUnroutedCount" => "Events no route of the source's multiplexing selector took",
        "OptionalChannelWriteFail" => {
            "Batches an optional channel of the source's selector did not take"
        }
        "ChannelWriteFail" => "Batches a channel refused (Flume ChannelWriteFail)",
        "EventReadFail" => "Inputs the source could not read as events (Flume EventReadFail)",
        "EventDroppedCount" => {
            "Events a source dropped: UDP datagrams while a channel was full, batches that never fit"
        }
        "OpenConnectionCount" => "Connections open to the source (Flume OpenConnectionCount)",
        "ChannelFullWaitMillis" => "Milliseconds the source waited on full channels",
        "ChannelSize" => "Events in the channel (Flume ChannelSize)",
        "EventAcceptedBytes" => "Bytes of event bodies the source put into its channels",
        "EventDrainSuccessBytes" => "Bytes of event bodies the sink delivered",
        "FileBytesBehind" => "Bytes of a tailed file not yet committed to the channel",
        "OldestEventAgeMillis" => {
            "Milliseconds since the oldest event in the channel was put (0 when empty)"
        }
        "ObjectWrittenCount" => "Objects (or files) the sink finished and uploaded",
        "ObjectWrittenBytes" => "Bytes of the objects the sink uploaded",
        "PartsInFlight" => "Multipart upload parts being sent",
        "ObjectsWaitingCount" => "Finished objects waiting in the staging directory for upload",
        "ObjectsWaitingBytes" => "Bytes of the finished objects waiting for upload",
        "UploadLatency" => "Seconds an object's upload took, from its first request to the last",
        "PutLatency" => "Seconds a put took, per batch committed into the channel",
        "TakeToCommitLatency" => {
            "Seconds from a take to its commit, per batch (a sink's delivery and commit)"
        }
        "DeliveryLatency" => {
            "Seconds from a flush's first send to the sink's answer that all of it is delivered"
        }
        "ChannelCapacity" => {
            "Most events the channel holds, 0 if unbounded (Flume ChannelCapacity)"
        }
        "ChannelFillPercentage" => {
            "Channel size over capacity, in percent (Flume ChannelFillPercentage)"
        }
        "EventPutAttemptCount" => "Events offered to the channel (Flume EventPutAttemptCount)",
        "EventPutSuccessCount" => "Events committed into the channel (Flume EventPutSuccessCount)",
        "EventTakeAttemptCount" => {
            "Attempts to take an event from the channel (Flume EventTakeAttemptCount)"
        }
        "EventTakeSuccessCount" => {
            "Events taken from the channel and committed (Flume EventTakeSuccessCount)"
        }
        "RollbackCount" => "Put and take transactions rolled back (Flume RollbackCount)",
        "BatchCompleteCount" => "Batches of batch_size events (Flume BatchCompleteCount)",
        "BatchEmptyCount" => "Takes that found no event (Flume BatchEmptyCount)",
        "BatchUnderflowCount" => {
            "Batches of fewer than batch_size events (Flume BatchUnderflowCount)"
        }
        "ConnectionCreatedCount" => "Connections the sink opened (Flume ConnectionCreatedCount)",
        "ConnectionClosedCount" => "Connections the sink closed (Flume ConnectionClosedCount)",
        "ConnectionFailedCount" => {
            "Connections the sink failed to open (Flume ConnectionFailedCount)"
        }
        "EventDrainAttemptCount" => {
            "Events the sink tried to deliver (Flume EventDrainAttemptCount)"
        }
        "EventDrainSuccessCount" => "Events the sink delivered (Flume EventDrainSuccessCount)",
        "EventWriteFail" => "Events of failed deliveries, retried (Flume EventWriteFail)",
        "EventDeadLetteredCount" => {
            "Events the destination refused for good, moved to the sink's dead_letter channel"
        }
        "ChannelReadFail" => "Takes from the channel that failed (Flume ChannelReadFail)",
        "ConsecutiveFailures" => "Failures since the component's last success",
        _ => "A component's own counter",
    }
}

/// Exposes every component's counters on each scrape, one family per Flume counter.
#[derive(Clone)]
struct PipelineCollector(PipelineMetrics);

impl std::fmt::Debug for PipelineCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipelineCollector").finish_non_exhaustive()
    }
}

/// The samples of one family: (component name, type, value).
type Samples<'a> = Vec<(&'a str, &'a str, f64)>;

impl Collector for PipelineCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        // Grouped by family first: a family's samples must follow its descriptor.
        let mut families: BTreeMap<(&'static str, &'static str), Samples<'_>> = BTreeMap::new();
        let components = self.0.components();
        for component in components.iter() {
            let counters = component.counters();
            let fill = fill_percentage(&counters);
            let samples = counters
                .into_iter()
                .map(|(key, value)| (key, value as f64))
                .chain(fill.map(|fill| ("ChannelFillPercentage", fill)));
            for (key, value) in samples {
                families.entry((component.kind, key)).or_default().push((
                    &component.name,
                    &component.type_name,
                    value,
                ));
            }
        }
        // Per-item gauges, e.g. ferry_source_file_bytes_behind{file=...}.
        let mut items: BTreeMap<(&'static str, &'static str), Vec<_>> = BTreeMap::new();
        let components = self.0.components();
        for component in components.iter() {
            for (metric, found) in component.metrics.items() {
                items.entry((component.kind, metric)).or_default().push((
                    &component.name,
                    &component.type_name,
                    found,
                ));
            }
        }
        for ((kind, metric), samples) in items {
            let name = prometheus_name(kind, metric);
            let mut family = encoder.encode_descriptor(
                &name,
                help(metric),
                None,
                ConstGauge::new(0.0).metric_type(),
            )?;
            for (component, type_name, found) in samples {
                for (item, value) in &found.values {
                    let labels = [
                        ("name", component.as_str()),
                        ("type", type_name.as_str()),
                        (found.label, item.as_str()),
                    ];
                    ConstGauge::new(*value as f64).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        // Latency histograms: `ferry_<kind>_<name>_seconds`, e.g. ferry_channel_put_latency_seconds.
        let mut latencies: BTreeMap<(&'static str, &'static str), Vec<_>> = BTreeMap::new();
        let components = self.0.components();
        for component in components.iter() {
            for (metric, snapshot) in component.metrics.latencies() {
                latencies
                    .entry((component.kind, metric))
                    .or_default()
                    .push((&component.name, &component.type_name, snapshot));
            }
        }
        for ((kind, metric), samples) in latencies {
            let name = format!(
                "{}_seconds",
                prometheus_name(kind, metric).trim_end_matches("_total")
            );
            let mut family = encoder.encode_descriptor(
                &name,
                help(metric),
                None,
                prometheus_client::metrics::MetricType::Histogram,
            )?;
            for (component, type_name, snapshot) in samples {
                let labels = [("name", component), ("type", type_name)];
                let buckets: Vec<(f64, u64)> = ferry_core::metrics::LATENCY_BUCKETS
                    .iter()
                    .copied()
                    .chain([f64::INFINITY])
                    .zip(snapshot.buckets.iter().copied())
                    .collect();
                family
                    .encode_family(&labels)?
                    .encode_histogram::<NoLabelSet>(
                        snapshot.sum_seconds,
                        snapshot.count,
                        &buckets,
                        None,
                    )?;
            }
        }
        for ((kind, flume), samples) in families {
            let name = prometheus_name(kind, flume);
            let gauge = ferry_core::metrics::GAUGES.contains(&flume);
            let metric_type = if gauge {
                ConstGauge::new(0.0).metric_type()
            } else {
                ConstCounter::new(0u64).metric_type()
            };
            let mut family = encoder.encode_descriptor(&name, help(flume), None, metric_type)?;
            for (component, type_name, value) in samples {
                let labels = [("name", component), ("type", type_name)];
                let sample = family.encode_family(&labels)?;
                if gauge {
                    ConstGauge::new(value).encode(sample)?;
                } else {
                    ConstCounter::new(value as u64).encode(sample)?;
                }
            }
        }
        Ok(())
    }
}

/// The HTTP server, before it starts: the pipeline's endpoints plus whatever the caller
/// adds.
///
/// ```no_run
/// # async fn demo(metrics: ferry_agent::http::PipelineMetrics, stop: ferry_core::Shutdown) -> anyhow::Result<()> {
/// use axum::routing::get;
/// let mut server = ferry_agent::http::HttpServer::new(metrics);
/// // server.registry_mut().register_collector(Box::new(broker_collector));
/// server.merge(axum::Router::new().route("/api/broker", get(|| async { "{}" })));
/// let running = server.start("127.0.0.1:8048".parse()?, stop).await?;
/// running.stopped().await;
/// # Ok(()) }
/// ```
pub struct HttpServer {
    pipeline: PipelineMetrics,
    registry: Registry,
    routes: Router,
    /// The bundled broker, whose damaged logs `/health` lists.
    broker: Option<ferry_broker::BrokerObserver>,
}

/// The bundled broker's partitions with damaged log ranges, for `/health`: listed without
/// failing it, since a restart does not mend them (`agent log-repair` does).
fn damaged_logs(broker: &ferry_broker::BrokerObserver) -> Option<Value> {
    let damaged: Vec<Value> = broker
        .stats()
        .partitions
        .iter()
        .filter(|p| p.damaged_ranges > 0)
        .map(|p| {
            json!({
                "topic": p.topic,
                "partition": p.partition,
                "damaged_ranges": p.damaged_ranges,
                "damaged_bytes": p.damaged_bytes,
            })
        })
        .collect();
    (!damaged.is_empty()).then_some(Value::Array(damaged))
}

impl HttpServer {
    /// A server for `pipeline`'s endpoints; its registry holds the pipeline's counters.
    pub fn new(pipeline: PipelineMetrics) -> Self {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(PipelineCollector(pipeline.clone())));
        Self {
            pipeline,
            registry,
            routes: Router::new(),
            broker: None,
        }
    }

    /// The registry `/metrics` encodes: register more metrics or collectors here.
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// Adds routes (they must not repeat the server's own paths).
    pub fn merge(&mut self, routes: Router) -> &mut Self {
        self.routes = std::mem::take(&mut self.routes).merge(routes);
        self
    }

    /// Adds the bundled broker's metrics to `/metrics` and its state (partitions, traffic,
    /// requests, connections, groups with their lag, open transactions) at `/api/broker`.
    pub fn with_broker(&mut self, broker: ferry_broker::BrokerObserver) -> &mut Self {
        broker.register_metrics(&mut self.registry);
        self.broker = Some(broker.clone());
        self.merge(Router::new().route(
            "/api/broker",
            get(move || {
                let stats = broker.stats();
                async move { axum::Json(stats) }
            }),
        ))
    }

    fn router(self) -> Router {
        let registry = Arc::new(self.registry);
        let pipeline = self.pipeline;
        let json = pipeline.clone();
        let health = pipeline.clone();
        let broker = self.broker;
        let api = pipeline;
        Router::new()
            .route("/", get(console))
            .route("/metrics", get(move || metrics_text(Arc::clone(&registry))))
            .route(
                "/metrics.json",
                get(move || async move { axum::Json(json.flume_json()) }),
            )
            .route(
                "/health",
                get(move || async move {
                    let (status, mut body) = health.health();
                    if let Some(damaged) = broker.as_ref().and_then(damaged_logs) {
                        body["damaged_logs"] = damaged;
                    }
                    (status, axum::Json(body))
                }),
            )
            .route(
                "/api/pipeline",
                get(move || async move { axum::Json(api.api()) }),
            )
            .merge(self.routes)
    }

    /// Binds `address` and serves until `stop` fires; logs the address it bound (a port 0
    /// becomes a real one).
    pub async fn start(self, address: SocketAddr, stop: Shutdown) -> anyhow::Result<RunningServer> {
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .with_context(|| format!("binding the HTTP server to {address} (agent.http)"))?;
        let bound = listener.local_addr()?;
        info!(address = %bound, "HTTP server listening");
        let router = self.router();
        let task = tokio::spawn(async move {
            let served = axum::serve(listener, router)
                .with_graceful_shutdown(async move { stop.wait().await })
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "the HTTP server failed");
            }
            info!("HTTP server stopped");
        });
        Ok(RunningServer {
            address: bound,
            task,
        })
    }
}

/// A server that runs until its stop signal.
pub struct RunningServer {
    address: SocketAddr,
    task: JoinHandle<()>,
}

impl RunningServer {
    /// The address it listens on.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Waits until it has stopped (after its stop signal, once open requests are answered).
    pub async fn stopped(self) {
        if let Err(e) = self.task.await {
            tracing::error!(error = %e, "the HTTP server task panicked");
        }
    }
}

async fn metrics_text(registry: Arc<Registry>) -> Response {
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, &registry) {
        Ok(()) => ([(header::CONTENT_TYPE, OPENMETRICS)], text).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// The web console: one page, its script and style inside it (nothing fetched from
/// elsewhere), drawing `/api/pipeline`, `/api/broker` and `/health` every two seconds.
async fn console() -> axum::response::Html<&'static str> {
    axum::response::Html(include_str!("console.html"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pipeline of `components` (sinks named as given, in `group` when set) for `/health`.
    fn pipeline(components: &[(&str, Option<&str>)], unhealthy_after: Duration) -> PipelineMetrics {
        let components = components
            .iter()
            .map(|(name, group)| Component {
                kind: "sink",
                name: (*name).to_owned(),
                type_name: "http".into(),
                metrics: ComponentMetrics::new("sink", *name),
                channel: None,
                channels: Vec::new(),
                group: group.map(str::to_owned),
            })
            .collect();
        PipelineMetrics {
            components: Arc::new(std::sync::RwLock::new(Arc::new(components))),
            unhealthy_after,
        }
    }

    #[test]
    fn a_delivery_in_flight_too_long_fails_health_until_it_ends() {
        let health = pipeline(&[("out", None)], Duration::from_millis(200));
        let metrics = health.components()[0].metrics.clone();
        metrics.delivery_started(std::time::Instant::now());
        assert_eq!(health.health().0, StatusCode::OK, "not yet too long");
        std::thread::sleep(Duration::from_millis(250));
        let (status, body) = health.health();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        let failing = &body["failing"][0];
        assert_eq!(failing["component"], "SINK.out", "{body}");
        assert_eq!(failing["error"], "delivery in flight for 0 s", "{body}");
        assert!(failing["failing_for_ms"].as_u64().unwrap() >= 250, "{body}");
        assert!(failing["since"].as_str().unwrap().ends_with('Z'), "{body}");
        metrics.delivery_ended();
        assert_eq!(health.health().0, StatusCode::OK);
    }

    #[test]
    fn what_a_component_cannot_reach_fails_health_after_unhealthy_after_with_since_when() {
        let health = pipeline(&[("out", None)], Duration::from_millis(100));
        let metrics = health.components()[0].metrics.clone();
        metrics.unreachable("cannot reach http://127.0.0.1:9/: connection refused");
        assert_eq!(health.health().0, StatusCode::OK, "not yet for long");
        std::thread::sleep(Duration::from_millis(150));
        let (status, body) = health.health();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert_eq!(
            body["failing"][0]["error"],
            "cannot reach http://127.0.0.1:9/: connection refused"
        );
        metrics.reachable();
        assert_eq!(health.health().0, StatusCode::OK);
    }

    #[test]
    fn a_group_member_stuck_in_flight_leaves_the_other_degraded_not_healthy() {
        let health = pipeline(
            &[("primary", Some("g")), ("standby", Some("g"))],
            Duration::from_millis(50),
        );
        let all = health.components();
        all[0].metrics.failed("POST http://primary/: 503");
        std::thread::sleep(Duration::from_millis(80));
        let (status, body) = health.health();
        assert_eq!(status, StatusCode::OK, "the standby delivers: {body}");
        assert_eq!(body["degraded"][0]["name"], "primary", "{body}");
        all[1].metrics.delivery_started(std::time::Instant::now());
        std::thread::sleep(Duration::from_millis(80));
        let (status, body) = health.health();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert_eq!(body["failing"].as_array().unwrap().len(), 2, "{body}");
    }

    #[test]
    fn prometheus_names_follow_flumes() {
        let cases = [
            (
                "channel",
                "EventPutSuccessCount",
                "ferry_channel_event_put_success",
            ),
            ("channel", "ChannelSize", "ferry_channel_size"),
            (
                "channel",
                "ChannelFillPercentage",
                "ferry_channel_fill_percentage",
            ),
            ("channel", "RollbackCount", "ferry_channel_rollback"),
            (
                "source",
                "EventAcceptedCount",
                "ferry_source_event_accepted",
            ),
            (
                "source",
                "ChannelWriteFail",
                "ferry_source_channel_write_fail",
            ),
            (
                "source",
                "OpenConnectionCount",
                "ferry_source_open_connections",
            ),
            (
                "source",
                "ChannelFullWaitMillis",
                "ferry_source_channel_full_wait_milliseconds",
            ),
            (
                "sink",
                "EventDrainSuccessCount",
                "ferry_sink_event_drain_success",
            ),
            (
                "sink",
                "ConsecutiveFailures",
                "ferry_sink_consecutive_failures",
            ),
            ("source", "TickBatches", "ferry_source_tick_batches"),
        ];
        for (kind, flume, expected) in cases {
            assert_eq!(prometheus_name(kind, flume), expected, "{flume}");
        }
    }

    #[test]
    fn fill_percentage_is_size_over_capacity() {
        let counters = [("ChannelCapacity", 200), ("ChannelSize", 50)];
        assert_eq!(fill_percentage(&counters), Some(25.0));
        assert_eq!(
            fill_percentage(&[("ChannelCapacity", 0), ("ChannelSize", 5)]),
            Some(0.0)
        );
        assert_eq!(fill_percentage(&[("EventDrainSuccessCount", 5)]), None);
    }
}
