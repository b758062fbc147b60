//! The broker's bounds on what clients can make it hold: connections (in all and per address),
//! bytes of requests read but not yet answered, partitions, and the file descriptors all of
//! them need. Each refusal is counted and logged at most once a minute per cause, so a client
//! hammering a limit cannot fill the log.
//!
//! File descriptors: at start the soft `RLIMIT_NOFILE` is raised to the hard one (as most
//! servers do), and the limit found splits in two budgets. Connections get at most half of it
//! (the effective `max_connections`); partitions, whose segment files stay open, get what is
//! left after the connections' share and a reserve for the metadata database, the state files
//! and the listeners. A topic whose partitions would not fit is refused before anything is
//! created, naming the limit and what to raise, instead of failing half-way with EMFILE.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::BrokerConfig;

/// Descriptors kept for everything but connections and segment files: the metadata
/// database and its journal, listeners, producer snapshots being written, the runtime.
const RESERVED_DESCRIPTORS: u64 = 64;
/// Descriptors a segment holds open: its `.log`, `.index` and `.timeindex`.
pub(crate) const DESCRIPTORS_PER_SEGMENT: u64 = 3;
/// How often one kind of refusal or warning is logged at most.
const LOG_EVERY: Duration = Duration::from_secs(60);
/// Peers remembered for rate-limiting their warnings; past it the oldest are forgotten.
const PEERS_REMEMBERED: usize = 4096;

/// The process's file descriptor limit after raising the soft limit to the hard one; `None`
/// where it cannot be read (it is then not budgeted).
pub(crate) fn raise_descriptor_limit() -> Option<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    if soft < hard {
        match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => return Some(hard),
            Err(e) => {
                tracing::debug!(soft, hard, error = %e, "cannot raise the file descriptor limit")
            }
        }
    }
    Some(soft)
}

/// Descriptors this process has open now (Linux: the entries of `/proc/self/fd`).
pub(crate) fn open_descriptors() -> Option<u64> {
    std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|entries| entries.count() as u64)
}

/// Logs a message at most once per [`LOG_EVERY`] per key, with how many were held back.
#[derive(Debug)]
pub(crate) struct LogLimiter<K> {
    last: Mutex<HashMap<K, (Instant, u64)>>,
}

impl<K> Default for LogLimiter<K> {
    fn default() -> Self {
        LogLimiter {
            last: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: std::hash::Hash + Eq + Clone> LogLimiter<K> {
    /// `Some(suppressed since the last one)` when a line for `key` is due now.
    pub(crate) fn due(&self, key: &K) -> Option<u64> {
        let now = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.len() >= PEERS_REMEMBERED && !last.contains_key(key) {
            last.retain(|_, (at, _)| now.duration_since(*at) < LOG_EVERY);
            if last.len() >= PEERS_REMEMBERED {
                last.clear();
            }
        }
        match last.get_mut(key) {
            Some((at, suppressed)) if now.duration_since(*at) < LOG_EVERY => {
                *suppressed += 1;
                None
            }
            Some((at, suppressed)) => {
                let held_back = *suppressed;
                *at = now;
                *suppressed = 0;
                Some(held_back)
            }
            None => {
                last.insert(key.clone(), (now, 0));
                Some(0)
            }
        }
    }
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Refusal {
    /// `max_connections` (or the descriptor budget) reached.
    Total(u32),
    /// The address's `max_connections_per_ip` reached.
    PerIp(u32),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Total(max) => write!(f, "{max} connections are open, the most allowed"),
            Refusal::PerIp(max) => write!(
                f,
                "{max} connections are open from this address, the most allowed \
                 (max_connections_per_ip)"
            ),
        }
    }
}

/// What clients make the broker hold beyond connections and request bytes, each bounded by a
/// setting; a client past one gets a Kafka error (or, for producer states, the least recently
/// used idle one is forgotten), counted in `kafka_limit_reached_total` by setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Held {
    /// Members (and member ids handed out, not joined yet) of one group: `group_max_size`.
    GroupMembers,
    /// Groups, with members or offsets: `max_groups`.
    Groups,
    /// Transactional ids known to the coordinator: `max_transactional_ids`.
    TransactionalIds,
    /// Producer states a partition keeps for deduplication: `max_producer_ids_per_partition`.
    ProducerIds,
    /// Fetches waiting for data at once: `max_pending_fetches`.
    PendingFetches,
}

impl Held {
    pub(crate) const ALL: [Held; 5] = [
        Held::GroupMembers,
        Held::Groups,
        Held::TransactionalIds,
        Held::ProducerIds,
        Held::PendingFetches,
    ];

    /// The setting that bounds it.
    pub(crate) fn setting(self) -> &'static str {
        match self {
            Held::GroupMembers => "group_max_size",
            Held::Groups => "max_groups",
            Held::TransactionalIds => "max_transactional_ids",
            Held::ProducerIds => "max_producer_ids_per_partition",
            Held::PendingFetches => "max_pending_fetches",
        }
    }
}

/// How often each [`Held`] limit was reached, shared by the coordinators, the logs and
/// `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct Reached {
    counts: [AtomicU64; Held::ALL.len()],
    logged: LogLimiter<Held>,
}

impl Reached {
    /// Counts one time `held` was reached, and logs `what` (the client's request and what the
    /// broker did) at most once a minute per limit.
    pub(crate) fn count(&self, held: Held, what: impl FnOnce() -> String) {
        self.add(held, 1, what);
    }

    /// Like [`Self::count`], for `times` at once (producer states forgotten together).
    pub(crate) fn add(&self, held: Held, times: u64, what: impl FnOnce() -> String) {
        self.counts[held as usize].fetch_add(times, Ordering::Relaxed);
        if let Some(suppressed) = self.logged.due(&held) {
            tracing::warn!(limit = held.setting(), suppressed, "{}", what());
        }
    }

    /// How many times `held` was reached since start.
    pub(crate) fn get(&self, held: Held) -> u64 {
        self.counts[held as usize].load(Ordering::Relaxed)
    }
}

/// The broker's limits, shared by every listener.
#[derive(Debug)]
pub(crate) struct Limits {
    /// The effective connection limit.
    max_connections: u32,
    per_ip: Option<u32>,
    per_ip_overrides: HashMap<IpAddr, u32>,
    /// Open connections per address; the sum is the total.
    open: Mutex<(u32, HashMap<IpAddr, u32>)>,
    /// Bytes of requests read and not yet answered.
    request_bytes: Arc<Semaphore>,
    queued_max_request_bytes: u64,
    /// The descriptor limit, when known.
    descriptors: Option<u64>,
    max_broker_partitions: u32,
    max_partitions_per_topic: u32,
    /// Refusals and warnings already logged recently.
    pub(crate) refusals: LogLimiter<Refusal>,
    pub(crate) malformed: LogLimiter<IpAddr>,
    pub(crate) exhausted: LogLimiter<&'static str>,
    pub(crate) auto_create_failures: LogLimiter<std::mem::Discriminant<crate::topics::TopicError>>,
    /// What else clients hold: how often each bound was reached.
    pub(crate) reached: Arc<Reached>,
    /// Fetches waiting for data now, woken by appends.
    pending_fetches: AtomicU64,
    max_pending_fetches: u64,
}

/// A fetch's place among those woken by appends, given back when it is answered.
#[derive(Debug)]
pub(crate) struct PendingFetch<'a>(&'a AtomicU64);

impl Drop for PendingFetch<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A connection's place in the limits, given back when it is dropped.
#[derive(Debug)]
pub(crate) struct ConnectionSlot {
    limits: Arc<Limits>,
    ip: IpAddr,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut open = self.limits.open.lock().unwrap_or_else(|p| p.into_inner());
        open.0 = open.0.saturating_sub(1);
        if let Some(count) = open.1.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.1.remove(&self.ip);
            }
        }
    }
}

impl Limits {
    /// The limits of `config`, with the descriptor limit found at start (`None`: unknown).
    pub(crate) fn new(config: &BrokerConfig, descriptors: Option<u64>) -> Limits {
        let mut max_connections = config.max_connections;
        if let Some(limit) = descriptors {
            let share = u32::try_from(limit / 2).unwrap_or(u32::MAX);
            if share < max_connections {
                tracing::info!(
                    descriptor_limit = limit,
                    max_connections = share,
                    configured = config.max_connections,
                    "the file descriptor limit (ulimit -n) allows fewer connections than \
                     max_connections: raise the limit for more"
                );
                max_connections = share.max(1);
            }
        }
        let permits = usize::try_from(config.queued_max_request_bytes)
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS);
        Limits {
            max_connections,
            per_ip: config.max_connections_per_ip,
            per_ip_overrides: config
                .max_connections_per_ip_overrides
                .iter()
                .map(|(ip, max)| (*ip, *max))
                .collect(),
            open: Mutex::new((0, HashMap::new())),
            request_bytes: Arc::new(Semaphore::new(permits)),
            queued_max_request_bytes: config.queued_max_request_bytes,
            descriptors,
            max_broker_partitions: config.max_broker_partitions,
            max_partitions_per_topic: config.max_partitions_per_topic,
            refusals: LogLimiter::default(),
            malformed: LogLimiter::default(),
            exhausted: LogLimiter::default(),
            auto_create_failures: LogLimiter::default(),
            reached: Arc::default(),
            pending_fetches: AtomicU64::new(0),
            max_pending_fetches: u64::from(config.max_pending_fetches),
        }
    }

    /// A slot for a new connection from `ip`, or why there is none.
    pub(crate) fn connect(self: &Arc<Self>, ip: IpAddr) -> Result<ConnectionSlot, Refusal> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.0 >= self.max_connections {
            return Err(Refusal::Total(self.max_connections));
        }
        let per_ip = self.per_ip_overrides.get(&ip).copied().or(self.per_ip);
        let from_ip = open.1.get(&ip).copied().unwrap_or(0);
        if let Some(max) = per_ip
            && from_ip >= max
        {
            return Err(Refusal::PerIp(max));
        }
        open.0 += 1;
        *open.1.entry(ip).or_insert(0) += 1;
        Ok(ConnectionSlot {
            limits: Arc::clone(self),
            ip,
        })
    }

    /// A place for a fetch that waits for data among those woken by every append, or `None`
    /// when `max_pending_fetches` wait already: that one waits out its `max_wait_ms` and looks
    /// once, at no cost to appends.
    pub(crate) fn pending_fetch(&self) -> Option<PendingFetch<'_>> {
        self.pending_fetches
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max_pending_fetches).then_some(n + 1)
            })
            .ok()
            .map(|_| PendingFetch(&self.pending_fetches))
    }

    /// Connections open now.
    pub(crate) fn open_connections(&self) -> u32 {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).0
    }

    /// Waits until `bytes` more request bytes may be held (the request's size was checked
    /// against `socket.request.max.bytes`, which is at most `queued.max.request.bytes`).
    pub(crate) async fn request_memory(&self, bytes: usize) -> OwnedSemaphorePermit {
        let bytes = u32::try_from(bytes).unwrap_or(u32::MAX);
        Arc::clone(&self.request_bytes)
            .acquire_many_owned(bytes)
            .await
            .expect("the request memory semaphore is never closed")
    }

    /// Request bytes held now.
    pub(crate) fn queued_request_bytes(&self) -> u64 {
        let available = self.request_bytes.available_permits() as u64;
        self.queued_max_request_bytes.saturating_sub(available)
    }

    /// Checks that `adding` more partitions fit, `hosted` being those hosted now and
    /// `largest_topic` the new size of the topic that grows; the error says which bound and
    /// what to change.
    pub(crate) fn check_partitions(
        &self,
        hosted: u64,
        adding: u64,
        topic_total: u64,
    ) -> Result<(), String> {
        if topic_total > u64::from(self.max_partitions_per_topic) {
            return Err(format!(
                "{topic_total} partitions in one topic is above max_partitions_per_topic ({})",
                self.max_partitions_per_topic
            ));
        }
        if hosted + adding > u64::from(self.max_broker_partitions) {
            return Err(format!(
                "the broker hosts {hosted} partitions; {adding} more is above \
                 max_broker_partitions ({})",
                self.max_broker_partitions
            ));
        }
        let (Some(limit), Some(open)) = (self.descriptors, open_descriptors()) else {
            return Ok(());
        };
        // Connections may take their whole share whatever they hold now.
        let connections = u64::from(self.open_connections());
        let others = open.saturating_sub(connections);
        let budget = limit
            .saturating_sub(u64::from(self.max_connections))
            .saturating_sub(RESERVED_DESCRIPTORS);
        let needed = others + adding * DESCRIPTORS_PER_SEGMENT;
        if needed > budget {
            return Err(format!(
                "not enough file descriptors: {adding} more partitions need {} and the broker \
                 has {} of its {budget} for partitions in use (the limit is {limit}, half of it \
                 kept for connections): raise `ulimit -n` (LimitNOFILE= under systemd) or \
                 lower max_connections",
                adding * DESCRIPTORS_PER_SEGMENT,
                others
            ));
        }
        Ok(())
    }
}
