//! Per-component counters, named as Flume names them (`EventReceivedCount`, ...), and the
//! state a health check reads: when the component started and stopped, and whether it keeps
//! failing.
//!
//! Counting is a relaxed atomic add; the runtime counts once per batch, not per event. The map
//! of counters is locked only to look a counter up (once, when a component starts) and to read
//! them all (a scrape).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A counter or gauge shared between a component and the metrics endpoint.
#[derive(Clone, Debug, Default)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    /// Adds one.
    pub fn inc(&self) {
        self.add(1);
    }
    /// Sets the value (for gauges such as `ChannelSize`).
    pub fn set(&self, n: u64) {
        self.0.store(n, Ordering::Relaxed);
    }
    /// Subtracts `n` (for gauges such as `OpenConnectionCount`).
    pub fn sub(&self, n: u64) {
        self.0.fetch_sub(n, Ordering::Relaxed);
    }
    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Counters whose value goes down as well as up: exposed as gauges, not counters.
pub const GAUGES: [&str; 9] = [
    "ChannelSize",
    "OldestEventAgeMillis",
    "ChannelCapacity",
    "ChannelFillPercentage",
    "OpenConnectionCount",
    "ConsecutiveFailures",
    "PartsInFlight",
    "ObjectsWaitingCount",
    "ObjectsWaitingBytes",
];

/// Why a component is failing: its last error, and since when it has failed without a
/// success in between.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The last error, as logged.
    pub message: String,
    /// The first failure since the last success.
    pub since: SystemTime,
}

impl Failure {
    /// Makes `message` the failure in `slot`, keeping the time of the one already there.
    fn record(slot: &Mutex<Option<Failure>>, message: impl std::fmt::Display) {
        let mut failure = slot.lock().unwrap_or_else(|e| e.into_inner());
        let since = failure
            .as_ref()
            .map_or_else(SystemTime::now, |failure| failure.since);
        *failure = Some(Failure {
            message: message.to_string(),
            since,
        });
    }
}

#[derive(Debug, Default)]
struct Status {
    /// Milliseconds since the epoch; 0 until started.
    start_time: AtomicU64,
    /// Milliseconds since the epoch; 0 while running.
    stop_time: AtomicU64,
    /// Whether `failure` holds something: checked before locking it on every success.
    failing: AtomicBool,
    failure: Mutex<Option<Failure>>,
    /// Whether `unreachable` holds something.
    cut_off: AtomicBool,
    /// What the component's client reported it cannot reach, and since when: known before
    /// any delivery fails (a dead broker is seen when its connection drops, a record times
    /// out only minutes later).
    unreachable: Mutex<Option<Failure>>,
    /// When the sink's delivery now in flight began, as nanoseconds after [`clock_base`]
    /// plus one; 0 while none is.
    delivering: AtomicU64,
}

/// An instant and the wall-clock time it was, read once per process: a delivery's start is
/// kept as a monotonic offset from it (the runner reads the monotonic clock anyway) and shown
/// as a wall-clock time.
fn clock_base() -> &'static (Instant, SystemTime) {
    static BASE: OnceLock<(Instant, SystemTime)> = OnceLock::new();
    BASE.get_or_init(|| (Instant::now(), SystemTime::now()))
}

/// Upper bounds of the latency buckets, in seconds: Prometheus' default buckets with a finer
/// low end, where a memory channel's puts fall.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A latency histogram shared between a component and the metrics endpoint: one relaxed
/// atomic add per bucket hit and one for the sum, per observation (a batch, not an event).
#[derive(Clone, Debug, Default)]
pub struct Latency(Arc<LatencyCounts>);

#[derive(Debug, Default)]
struct LatencyCounts {
    /// Observations per bucket of [`LATENCY_BUCKETS`], the last one above them all.
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
}

/// What a [`Latency`] holds at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct LatencySnapshot {
    /// Observations per bucket of [`LATENCY_BUCKETS`] (not cumulative), then above them all.
    pub buckets: Vec<u64>,
    /// Observations in all.
    pub count: u64,
    /// Their sum, in seconds.
    pub sum_seconds: f64,
}

impl Latency {
    /// Counts one observation of `elapsed`.
    pub fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let bucket = LATENCY_BUCKETS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.0.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.0.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The counts now.
    pub fn snapshot(&self) -> LatencySnapshot {
        let buckets: Vec<u64> = self
            .0
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        LatencySnapshot {
            count: buckets.iter().sum(),
            buckets,
            sum_seconds: self.0.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

/// The counters of one component, created on first use, and its status.
///
/// ```
/// use ferry_core::ComponentMetrics;
/// let metrics = ComponentMetrics::new("sink", "k1");
/// let drained = metrics.counter("EventDrainSuccessCount");
/// drained.add(100);
/// metrics.failed("connection refused");
/// assert_eq!(metrics.counter("ConsecutiveFailures").get(), 1);
/// metrics.succeeded();
/// assert!(metrics.failure().is_none());
/// assert_eq!(metrics.snapshot(), [("ConsecutiveFailures", 0), ("EventDrainSuccessCount", 100)]);
/// ```
#[derive(Clone, Debug)]
pub struct ComponentMetrics {
    kind: &'static str,
    name: String,
    counters: Arc<Mutex<BTreeMap<&'static str, Counter>>>,
    latencies: Arc<Mutex<BTreeMap<&'static str, Latency>>>,
    items: Arc<Mutex<BTreeMap<&'static str, Items>>>,
    status: Arc<Status>,
}

/// A gauge per item of a component (per tailed file, say): the label that names the items,
/// and each item's value.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Items {
    /// The label naming an item, e.g. `file`.
    pub label: &'static str,
    /// Each item and its value.
    pub values: Vec<(String, u64)>,
}

impl ComponentMetrics {
    /// Counters for component `name` of `kind` (`source`, `channel`, `sink`).
    pub fn new(kind: &'static str, name: impl Into<String>) -> Self {
        Self {
            kind,
            name: name.into(),
            counters: Arc::default(),
            latencies: Arc::default(),
            items: Arc::default(),
            status: Arc::default(),
        }
    }
    /// The latency histogram called `metric`, e.g. `PutLatency`. Look it up once and keep it.
    pub fn latency(&self, metric: &'static str) -> Latency {
        let mut map = self.latencies.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(metric).or_default().clone()
    }
    /// Replaces the per-item gauge `metric` (e.g. `FileBytesBehind`, items labelled `file`).
    /// Set it when the items are looked at anyway (a directory scan), not per event.
    pub fn set_items(&self, metric: &'static str, label: &'static str, values: Vec<(String, u64)>) {
        let mut map = self.items.lock().unwrap_or_else(|e| e.into_inner());
        map.insert(metric, Items { label, values });
    }
    /// Every per-item gauge, by name.
    pub fn items(&self) -> Vec<(&'static str, Items)> {
        let map = self.items.lock().unwrap_or_else(|e| e.into_inner());
        map.iter().map(|(k, v)| (*k, v.clone())).collect()
    }
    /// Every latency histogram and its counts, by name.
    pub fn latencies(&self) -> Vec<(&'static str, LatencySnapshot)> {
        let map = self.latencies.lock().unwrap_or_else(|e| e.into_inner());
        map.iter().map(|(k, v)| (*k, v.snapshot())).collect()
    }
    /// The counter called `metric`, e.g. `EventAcceptedCount`. Look it up once and keep it.
    pub fn counter(&self, metric: &'static str) -> Counter {
        let mut map = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(metric).or_default().clone()
    }
    /// Component kind.
    pub fn kind(&self) -> &'static str {
        self.kind
    }
    /// Component name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// All counters and their values, by name.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let map = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        map.iter().map(|(k, v)| (*k, v.get())).collect()
    }
    /// Records that the component started (now) and is running.
    pub fn started(&self) {
        self.status
            .start_time
            .store(epoch_millis(), Ordering::Relaxed);
        self.status.stop_time.store(0, Ordering::Relaxed);
    }
    /// Records that the component stopped (now).
    pub fn stopped(&self) {
        self.status
            .stop_time
            .store(epoch_millis(), Ordering::Relaxed);
    }
    /// When the component started, in milliseconds since the epoch (Flume's `StartTime`);
    /// 0 if it never did.
    pub fn start_time(&self) -> u64 {
        self.status.start_time.load(Ordering::Relaxed)
    }
    /// When the component stopped, in milliseconds since the epoch (Flume's `StopTime`); 0
    /// while it runs.
    pub fn stop_time(&self) -> u64 {
        self.status.stop_time.load(Ordering::Relaxed)
    }
    /// Records a failure: `ConsecutiveFailures` goes up by one and `message` becomes the last
    /// error.
    pub fn failed(&self, message: impl std::fmt::Display) {
        self.counter("ConsecutiveFailures").inc();
        Failure::record(&self.status.failure, message);
        self.status.failing.store(true, Ordering::Relaxed);
    }
    /// Records a success: the failures in a row are over, and whatever the component
    /// delivered to is reachable. Cheap when there were none.
    pub fn succeeded(&self) {
        if self.status.failing.swap(false, Ordering::Relaxed) {
            self.counter("ConsecutiveFailures").set(0);
            *self
                .status
                .failure
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = None;
        }
        self.reachable();
    }
    /// Records that the component cannot reach its destination or input (`message` says
    /// which and why), as its client reports it, before any delivery fails; the first
    /// report's time is kept until [`reachable`](Self::reachable) or a success.
    pub fn unreachable(&self, message: impl std::fmt::Display) {
        Failure::record(&self.status.unreachable, message);
        self.status.cut_off.store(true, Ordering::Relaxed);
    }
    /// Whether the component's client reported that it cannot reach its destination or input,
    /// and did not reach it since.
    pub fn is_unreachable(&self) -> bool {
        self.status.cut_off.load(Ordering::Relaxed)
    }
    /// Records that the component's client reaches its destination or input again.
    pub fn reachable(&self) {
        if self.status.cut_off.swap(false, Ordering::Relaxed) {
            *self
                .status
                .unreachable
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = None;
        }
    }
    /// Records that a sink's delivery (a batch handed to it, or the first of several) began
    /// at `at`, until [`delivery_ended`](Self::delivery_ended): `/health` fails a sink whose
    /// delivery stays in flight too long. One atomic store, no clock read of its own.
    pub fn delivery_started(&self, at: Instant) {
        let (base, _) = clock_base();
        let nanos = at.saturating_duration_since(*base).as_nanos();
        let stored = u64::try_from(nanos).unwrap_or(u64::MAX - 1) + 1;
        self.status.delivering.store(stored, Ordering::Relaxed);
    }
    /// Records that the delivery in flight ended, delivered or failed.
    pub fn delivery_ended(&self) {
        self.status.delivering.store(0, Ordering::Relaxed);
    }
    /// When the sink's delivery now in flight began (wall clock), and how long ago; `None`
    /// while none is.
    pub fn delivery_in_flight(&self) -> Option<(SystemTime, Duration)> {
        let stored = self.status.delivering.load(Ordering::Relaxed);
        let (base, wall) = clock_base();
        let offset = Duration::from_nanos(stored.checked_sub(1)?);
        let began = *base + offset;
        Some((
            *wall + offset,
            Instant::now().saturating_duration_since(began),
        ))
    }
    /// The failure the component has not recovered from, if any: a failed delivery or take,
    /// else what its client cannot reach.
    pub fn failure(&self) -> Option<Failure> {
        if self.status.failing.load(Ordering::Relaxed)
            && let Some(failure) = self
                .status
                .failure
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
        {
            return Some(failure);
        }
        if !self.status.cut_off.load(Ordering::Relaxed) {
            return None;
        }
        self.status
            .unreachable
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

fn epoch_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_keeps_its_first_time_until_a_success() {
        let metrics = ComponentMetrics::new("sink", "k1");
        assert!(metrics.failure().is_none());
        metrics.failed("refused");
        let first = metrics.failure().unwrap();
        metrics.failed("timed out");
        let second = metrics.failure().unwrap();
        assert_eq!(second.message, "timed out");
        assert_eq!(second.since, first.since);
        assert_eq!(metrics.counter("ConsecutiveFailures").get(), 2);
        metrics.succeeded();
        assert!(metrics.failure().is_none());
        assert_eq!(metrics.counter("ConsecutiveFailures").get(), 0);
    }

    #[test]
    fn what_a_client_cannot_reach_is_a_failure_until_reached_or_delivered_to() {
        let metrics = ComponentMetrics::new("sink", "k1");
        metrics.unreachable("cannot reach 127.0.0.1:9092");
        let first = metrics.failure().unwrap();
        assert_eq!(first.message, "cannot reach 127.0.0.1:9092");
        metrics.unreachable("still cannot reach 127.0.0.1:9092");
        assert_eq!(metrics.failure().unwrap().since, first.since);
        // A delivery failure is named first; the reachability stays.
        metrics.failed("record timed out");
        assert_eq!(metrics.failure().unwrap().message, "record timed out");
        metrics.reachable();
        assert_eq!(metrics.failure().unwrap().message, "record timed out");
        metrics.unreachable("cannot reach 127.0.0.1:9092");
        metrics.succeeded();
        assert!(metrics.failure().is_none());
        metrics.unreachable("cannot reach 127.0.0.1:9092");
        metrics.reachable();
        assert!(metrics.failure().is_none());
        // Unreachable alone does not count as a failed attempt.
        assert_eq!(metrics.counter("ConsecutiveFailures").get(), 0);
    }

    #[test]
    fn a_delivery_is_in_flight_from_its_start_until_it_ends() {
        let metrics = ComponentMetrics::new("sink", "k1");
        assert!(metrics.delivery_in_flight().is_none());
        let before = SystemTime::now();
        let at = Instant::now();
        metrics.delivery_started(at);
        std::thread::sleep(Duration::from_millis(20));
        let (since, elapsed) = metrics.delivery_in_flight().unwrap();
        assert!(elapsed >= Duration::from_millis(20), "{elapsed:?}");
        let off = since
            .duration_since(before)
            .unwrap_or_else(|e| e.duration());
        assert!(off < Duration::from_secs(1), "{since:?} vs {before:?}");
        // A clone shares the state, as the runner's and /health's do.
        metrics.clone().delivery_ended();
        assert!(metrics.delivery_in_flight().is_none());
        // Not a failure by itself: /health judges its age.
        assert!(metrics.failure().is_none());
    }

    #[test]
    fn start_and_stop_times_are_flumes() {
        let metrics = ComponentMetrics::new("source", "r1");
        assert_eq!((metrics.start_time(), metrics.stop_time()), (0, 0));
        metrics.started();
        assert!(metrics.start_time() > 1_600_000_000_000);
        assert_eq!(metrics.stop_time(), 0);
        metrics.stopped();
        assert!(metrics.stop_time() >= metrics.start_time());
    }
}
