//! Per-component counters, named as Flume names them (`EventReceivedCount`, ...).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

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

/// The counters of one component, created on first use.
#[derive(Clone, Debug)]
pub struct ComponentMetrics {
    kind: &'static str,
    name: String,
    counters: Arc<Mutex<BTreeMap<&'static str, Counter>>>,
}

impl ComponentMetrics {
    /// Counters for component `name` of `kind` (`source`, `channel`, `sink`).
    pub fn new(kind: &'static str, name: impl Into<String>) -> Self {
        Self {
            kind,
            name: name.into(),
            counters: Arc::default(),
        }
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
}
