//! Starting and stopping the broker: the listeners, the connection tasks, retention, the
//! group and transaction timeouts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api::Context;
use crate::catalog::{Catalog, CatalogError};
use crate::config::{BrokerConfig, ClientAuth, ListenerConfig};
use crate::connection::{self, Listener};
use crate::groups::GroupCoordinator;
use crate::limits::{self, Limits};
use crate::security::Authorizer;
use crate::security::credentials::Credentials;
use crate::security::tls::{self, TlsError};
use crate::stats::{BrokerCollector, BrokerObserver, BrokerStats, Counters, ListenerCounters};
use crate::topics::{TopicError, Topics};
use crate::txn::TxnCoordinator;

/// Written after every log was fsynced at shutdown (Kafka's name); its absence at start means
/// a crash, so finished segments are checked rather than trusted.
pub(crate) const CLEAN_SHUTDOWN_MARKER: &str = ".kafka_cleanshutdown";

/// Why the broker could not start.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The data directory cannot be created.
    #[error("cannot create the broker data directory {path}: {source}")]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The metadata database cannot be opened.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// A topic's logs or configs cannot be loaded.
    #[error("cannot load topics: {0}")]
    Topics(String),
    /// A listener's address cannot be bound.
    #[error("listener {listener}: cannot listen on {addr}: {source}")]
    Bind {
        /// The listener's name.
        listener: String,
        /// The configured address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// A setting is out of range.
    #[error("invalid broker setting: {0}")]
    Config(String),
    /// A listener's certificate, key or CA cannot be used.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// No randomness for the salts of the configured users.
    #[error("cannot salt the configured users' passwords: {0}")]
    Random(getrandom::Error),
}

impl From<TopicError> for BrokerError {
    fn from(e: TopicError) -> Self {
        BrokerError::Topics(e.to_string())
    }
}

/// What is loaded from the data directory before serving.
type Loaded = (
    Topics,
    GroupCoordinator,
    TxnCoordinator,
    Authorizer,
    Credentials,
    String,
);

/// The bundled broker.
#[derive(Debug)]
pub struct Broker;

/// A topic as [`BrokerHandle::topics`] reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct TopicInfo {
    /// Topic name.
    pub name: String,
    /// Its partitions, by index.
    pub partitions: Vec<PartitionInfo>,
}

/// One partition's state.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionInfo {
    /// Partition index.
    pub partition: i32,
    /// First offset still stored (moves with retention).
    pub log_start_offset: i64,
    /// Offset the next record will get (the high watermark).
    pub log_end_offset: i64,
    /// Bytes on disk in its segments.
    pub size_bytes: u64,
    /// Number of segments, the active one included.
    pub segments: usize,
}

/// A running broker; dropping it stops the broker without waiting, [`BrokerHandle::shutdown`]
/// stops it gracefully.
pub struct BrokerHandle {
    /// Each listener's name and bound address, in configuration order.
    listeners: Vec<(String, SocketAddr)>,
    ctx: Arc<Context>,
    tracker: TaskTracker,
}

impl std::fmt::Debug for BrokerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerHandle")
            .field("listeners", &self.listeners)
            .finish()
    }
}

impl Broker {
    /// Recovers the logs in `config.data_dir`, binds every listener (`config.listeners`, or the
    /// one of `config.listen`) and serves clients on the current tokio runtime until the handle
    /// is shut down.
    pub async fn start(config: BrokerConfig) -> Result<BrokerHandle, BrokerError> {
        if config.num_partitions < 1 {
            return Err(BrokerError::Config(format!(
                "num_partitions is {}, must be at least 1",
                config.num_partitions
            )));
        }
        if config.log_segment_bytes < 128 || config.log_segment_bytes > i32::MAX as u64 {
            return Err(BrokerError::Config(format!(
                "log_segment_bytes is {}, must be between 128 and 2147483647",
                config.log_segment_bytes
            )));
        }
        if config.socket_request_max_bytes < 1 || config.message_max_bytes < 1 {
            return Err(BrokerError::Config(
                "socket_request_max_bytes and message_max_bytes must be positive".into(),
            ));
        }
        if config.queued_max_request_bytes < config.socket_request_max_bytes as u64 {
            return Err(BrokerError::Config(format!(
                "queued_max_request_bytes ({}) is below socket_request_max_bytes ({}): a request \
                 of the largest size allowed could never be read",
                config.queued_max_request_bytes, config.socket_request_max_bytes
            )));
        }
        if config.max_connections < 1 || config.max_connections_per_ip == Some(0) {
            return Err(BrokerError::Config(
                "max_connections and max_connections_per_ip must be at least 1".into(),
            ));
        }
        if config.quota_window_num < 2 || config.quota_window_size_seconds < 1 {
            return Err(BrokerError::Config(format!(
                "quota_window_num ({}) must be at least 2 and quota_window_size_seconds ({}) at \
                 least 1",
                config.quota_window_num, config.quota_window_size_seconds
            )));
        }
        if config.max_broker_partitions < 1 || config.max_partitions_per_topic < 1 {
            return Err(BrokerError::Config(
                "max_broker_partitions and max_partitions_per_topic must be at least 1".into(),
            ));
        }
        if config.group_min_session_timeout_ms > config.group_max_session_timeout_ms {
            return Err(BrokerError::Config(format!(
                "group_min_session_timeout_ms ({}) is above group_max_session_timeout_ms ({})",
                config.group_min_session_timeout_ms, config.group_max_session_timeout_ms
            )));
        }
        if config.transaction_max_timeout_ms < 1 || config.transactional_id_expiration_ms < 1 {
            return Err(BrokerError::Config(format!(
                "transaction_max_timeout_ms ({}) and transactional_id_expiration_ms ({}) must be \
                 positive",
                config.transaction_max_timeout_ms, config.transactional_id_expiration_ms
            )));
        }
        if let Some(error) = crate::security::config_error(&config) {
            return Err(BrokerError::Config(error));
        }
        std::fs::create_dir_all(&config.data_dir).map_err(|source| BrokerError::DataDir {
            path: config.data_dir.clone(),
            source,
        })?;
        let listener_configs = listener_configs(&config)?;
        let limits = Arc::new(Limits::new(&config, limits::raise_descriptor_limit()));
        // TLS files are read before anything is bound, so a bad one stops nothing half-started.
        let mut bound = Vec::new();
        for listener in &listener_configs {
            let name = listener.name();
            let tls = match (&listener.ssl, listener.security_protocol.tls()) {
                (Some(ssl), true) => Some(tls::acceptor(&name, ssl)?),
                _ => None,
            };
            let bind_error = |source| BrokerError::Bind {
                listener: name.clone(),
                addr: listener.address,
                source,
            };
            let socket = TcpListener::bind(listener.address)
                .await
                .map_err(bind_error)?;
            let local_addr = socket.local_addr().map_err(bind_error)?;
            warn_if_open(listener, &name, local_addr);
            let advertised = advertised(listener.advertised.as_deref(), local_addr);
            let settings = Listener {
                counters: Arc::new(ListenerCounters::new(name.clone())),
                name,
                tls,
                mechanisms: listener.mechanisms(),
                advertised,
            };
            bound.push((socket, local_addr, settings));
        }
        // Recovery reads the active segments: blocking work, off the async threads.
        let loaded = {
            let config = config.clone();
            let limits = Arc::clone(&limits);
            tokio::task::spawn_blocking(move || -> Result<Loaded, BrokerError> {
                let catalog = Catalog::open(&config.data_dir)?;
                let cluster_id = catalog.cluster_id()?;
                // The marker is removed while running, so a crash leaves none behind.
                let marker = config.data_dir.join(CLEAN_SHUTDOWN_MARKER);
                let clean_shutdown = marker.exists();
                if clean_shutdown {
                    std::fs::remove_file(&marker).map_err(|source| BrokerError::DataDir {
                        path: marker.clone(),
                        source,
                    })?;
                } else if !catalog.topics()?.is_empty() {
                    tracing::info!("no clean shutdown marker: checking every segment");
                }
                let reached = Arc::clone(&limits.reached);
                let topics = Topics::open(config.clone(), catalog, clean_shutdown, limits)?;
                let groups =
                    GroupCoordinator::load(&config, topics.catalog(), Arc::clone(&reached))?;
                // Transactions decided before a stop get their markers (again) before
                // any client is served.
                let txns = TxnCoordinator::load(&config, topics.catalog(), reached)?;
                txns.recover(&topics);
                let acls = Authorizer::load(&config, topics.catalog())?;
                // Salting the configured passwords is deliberately slow work too.
                let credentials = Credentials::new(&config.users, topics.catalog())
                    .map_err(BrokerError::Random)?;
                Ok((topics, groups, txns, acls, credentials, cluster_id))
            })
            .await
            .map_err(|e| BrokerError::Topics(e.to_string()))??
        };
        let (topics, groups, txns, acls, credentials, cluster_id) = loaded;
        let (host, port) = bound
            .first()
            .map(|(_, _, listener)| listener.advertised.clone())
            .unwrap_or_default();
        let listener_counters = bound
            .iter()
            .map(|(_, _, settings)| Arc::clone(&settings.counters))
            .collect();
        let ctx = Arc::new(Context {
            limits,
            quotas: crate::quotas::Quotas::of(&config),
            stats: Counters::new(listener_counters),
            topics,
            groups,
            txns,
            acls,
            appended: Notify::new(),
            shutdown: CancellationToken::new(),
            credentials,
            node_id: config.node_id,
            host,
            port,
            cluster_id,
        });
        let tracker = TaskTracker::new();
        let limits = connection::Limits {
            max_request: config.socket_request_max_bytes as usize,
            idle: Duration::from_millis(config.connections_max_idle_ms.max(1)),
            receive: Duration::from_millis(config.request_receive_timeout_ms.max(1)),
            max_unauthenticated: usize::try_from(config.sasl_server_max_receive_size.max(1))
                .unwrap_or(usize::MAX),
            handshake: Duration::from_millis(config.ssl_handshake_timeout_ms.max(1)),
            authentication: Duration::from_millis(config.sasl_authentication_timeout_ms.max(1)),
        };
        let mut listeners = Vec::new();
        for (socket, local_addr, settings) in bound {
            tracing::info!(
                listener = %settings.name,
                %local_addr,
                advertised = %format!("{}:{}", settings.advertised.0, settings.advertised.1),
                "listening"
            );
            listeners.push((settings.name.clone(), local_addr));
            tracker.spawn(accept(
                Arc::clone(&ctx),
                socket,
                Arc::new(settings),
                tracker.clone(),
                limits,
            ));
        }
        tracker.spawn(maintenance(
            Arc::clone(&ctx),
            Duration::from_millis(config.log_retention_check_interval_ms.max(1)),
            Duration::from_millis(config.offsets_retention_check_interval_ms.max(1)),
            Duration::from_millis((config.log_files_idle_close_ms / 2).clamp(100, 30_000)),
        ));
        tracker.spawn(crate::scrub::run(
            Arc::clone(&ctx),
            Duration::from_millis(config.log_scrub_interval_ms),
            config.log_scrub_bytes_per_sec,
        ));
        if config.log_cleaner_enable {
            tracker.spawn(crate::compaction::run(
                Arc::clone(&ctx),
                crate::compaction::Settings {
                    backoff: Duration::from_millis(config.log_cleaner_backoff_ms.max(1)),
                    bytes_per_sec: config.log_cleaner_io_max_bytes_per_second,
                    limits: crate::log::cleaner::Limits {
                        dedupe_buffer_bytes: usize::try_from(config.log_cleaner_dedupe_buffer_size)
                            .unwrap_or(usize::MAX),
                    },
                },
            ));
        }
        tracker.spawn(group_timeouts(Arc::clone(&ctx)));
        tracker.spawn(transaction_timeouts(
            Arc::clone(&ctx),
            Duration::from_millis(
                config
                    .transaction_abort_timed_out_transaction_cleanup_interval_ms
                    .max(1),
            ),
        ));
        tracing::info!(data_dir = %config.data_dir.display(), "broker started");
        Ok(BrokerHandle {
            listeners,
            ctx,
            tracker,
        })
    }
}

/// The listeners to bind: `listeners`, or the plaintext one of `listen` and
/// `advertised_listener`; each checked for what it needs.
fn listener_configs(config: &BrokerConfig) -> Result<Vec<ListenerConfig>, BrokerError> {
    if config.listeners.is_empty() {
        let mut listener = ListenerConfig::plaintext(config.listen);
        listener.advertised = config.advertised_listener.clone();
        return Ok(vec![listener]);
    }
    if config.listen != BrokerConfig::default().listen || config.advertised_listener.is_some() {
        return Err(BrokerError::Config(
            "`listen`/`advertised_listener` and `listeners` cannot be given together: put the \
             `listen` address in `listeners` as a plaintext listener"
                .into(),
        ));
    }
    let mut names = std::collections::BTreeSet::new();
    for listener in &config.listeners {
        let name = listener.name();
        let problem = |what: &str| BrokerError::Config(format!("listener {name}: {what}"));
        if !names.insert(name.clone()) {
            return Err(problem(
                "two listeners have this name: give each a distinct `name`",
            ));
        }
        let protocol = listener.security_protocol;
        match (&listener.ssl, protocol.tls()) {
            (None, true) => {
                return Err(problem(&format!(
                    "security_protocol {} needs `ssl` with a certificate and key",
                    protocol.kafka_name()
                )));
            }
            (Some(_), false) => {
                return Err(problem(&format!(
                    "`ssl` is set but security_protocol {} is not TLS (use ssl or sasl_ssl)",
                    protocol.kafka_name()
                )));
            }
            _ => {}
        }
        if let Some(mechanisms) = &listener.sasl_mechanisms {
            if !protocol.sasl() {
                return Err(problem(&format!(
                    "`sasl_mechanisms` is set but security_protocol {} has no SASL",
                    protocol.kafka_name()
                )));
            }
            if mechanisms.is_empty() {
                return Err(problem("`sasl_mechanisms` is empty"));
            }
        }
        if let Some(advertised) = &listener.advertised
            && parse_host_port(advertised).is_none()
        {
            return Err(problem(&format!(
                "advertised `{advertised}` is not host:port"
            )));
        }
    }
    Ok(config.listeners.clone())
}

/// Warns of a listener that lets anyone who reaches it in without credentials.
fn warn_if_open(listener: &ListenerConfig, name: &str, local_addr: SocketAddr) {
    let client_certificates = listener
        .ssl
        .as_ref()
        .is_some_and(|ssl| ssl.client_auth == ClientAuth::Required);
    if !local_addr.ip().is_loopback() && !listener.security_protocol.sasl() && !client_certificates
    {
        tracing::warn!(
            listener = %name,
            %local_addr,
            "listener is reachable beyond this machine without authentication: anyone who can \
             reach it can read and write every topic (use sasl_ssl, or ssl with client_auth \
             required)"
        );
    }
}

fn parse_host_port(text: &str) -> Option<(String, i32)> {
    let (host, port) = text.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    (!host.is_empty()).then(|| (host.to_owned(), i32::from(port)))
}

/// The host and port given to a listener's clients: `advertised`, or the bound address.
fn advertised(advertised: Option<&str>, local_addr: SocketAddr) -> (String, i32) {
    advertised
        .and_then(parse_host_port)
        .unwrap_or_else(|| (local_addr.ip().to_string(), i32::from(local_addr.port())))
}

async fn accept(
    ctx: Arc<Context>,
    socket: TcpListener,
    listener: Arc<Listener>,
    tracker: TaskTracker,
    limits: connection::Limits,
) {
    loop {
        let accepted = tokio::select! {
            accepted = socket.accept() => accepted,
            _ = ctx.shutdown.cancelled() => return,
        };
        match accepted {
            Ok((stream, peer)) => {
                let slot = match ctx.limits.connect(peer.ip()) {
                    Ok(slot) => slot,
                    Err(refusal) => {
                        // Closed at once: the client sees the connection fail and retries
                        // with its backoff, rather than waiting in the accept queue.
                        listener.counters.refused.fetch_add(1, Relaxed);
                        if let Some(suppressed) = ctx.limits.refusals.due(&refusal) {
                            tracing::warn!(%peer, listener = %listener.name, suppressed, "connection refused: {refusal}");
                        }
                        drop(stream);
                        continue;
                    }
                };
                tracing::debug!(%peer, listener = %listener.name, "connection accepted");
                let counters = Arc::clone(&listener.counters);
                counters.accepted.fetch_add(1, Relaxed);
                let serve = connection::serve(
                    Arc::clone(&ctx),
                    stream,
                    peer,
                    Arc::clone(&listener),
                    limits,
                );
                tracker.spawn(async move {
                    serve.await;
                    drop(slot);
                    counters.closed.fetch_add(1, Relaxed);
                });
            }
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning, and
                // say what to do once a minute rather than every time.
                listener.counters.refused.fetch_add(1, Relaxed);
                let exhausted = matches!(e.raw_os_error(), Some(code) if code == nix::libc::EMFILE || code == nix::libc::ENFILE);
                let key = if exhausted { "descriptors" } else { "accept" };
                if let Some(suppressed) = ctx.limits.exhausted.due(&key) {
                    if exhausted {
                        tracing::error!(listener = %listener.name, error = %e, suppressed,
                            open_connections = ctx.limits.open_connections(),
                            "cannot accept connections: out of file descriptors; raise `ulimit -n` \
                             (LimitNOFILE= under systemd), lower max_connections, or host fewer \
                             partitions");
                    } else {
                        tracing::warn!(listener = %listener.name, error = %e, suppressed, "accept failed");
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Background maintenance: the files of idle segments closed (checked every half of
/// `log_files_idle_close_ms`, between 100 ms and 30 s), log retention every
/// `log.retention.check.interval.ms`, the
/// time-based flush policy (`flush.ms`) checked every second (Kafka's
/// `log.flush.scheduler.interval.ms`), committed offset expiry every
/// `offsets.retention.check.interval.ms`. Blocking file work runs off the async threads.
async fn maintenance(
    ctx: Arc<Context>,
    retention_every: Duration,
    offsets_every: Duration,
    idle_files_every: Duration,
) {
    let mut retention = tokio::time::interval(retention_every);
    let mut idle_files = tokio::time::interval(idle_files_every);
    idle_files.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    retention.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut flush = tokio::time::interval(Duration::from_secs(1));
    flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut offsets = tokio::time::interval(offsets_every);
    offsets.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let job: fn(&Context) = tokio::select! {
            _ = retention.tick() => |ctx| ctx.topics.enforce_retention(),
            _ = flush.tick() => |ctx| ctx.topics.flush_due(),
            _ = offsets.tick() => |ctx| ctx.groups.expire_offsets(),
            _ = idle_files.tick() => |ctx| ctx.topics.close_idle_files(),
            _ = ctx.shutdown.cancelled() => return,
        };
        let ctx = Arc::clone(&ctx);
        let _ = tokio::task::spawn_blocking(move || job(&ctx)).await;
    }
}

/// How often group timeouts (sessions, join phases) are checked: their resolution.
const GROUP_TICK: Duration = Duration::from_millis(100);

/// Drives the group coordinator's timeouts.
async fn group_timeouts(ctx: Arc<Context>) {
    let mut tick = tokio::time::interval(GROUP_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => ctx.groups.tick(),
            _ = ctx.shutdown.cancelled() => return,
        }
    }
}

/// Drives the transaction coordinator's timeouts every
/// `transaction.abort.timed.out.transaction.cleanup.interval.ms` (see [`TxnCoordinator::tick`]).
async fn transaction_timeouts(ctx: Arc<Context>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = ctx.shutdown.cancelled() => return,
        }
        let job = Arc::clone(&ctx);
        // Markers and SQLite writes: blocking work, off the async threads.
        let _ = tokio::task::spawn_blocking(move || {
            job.txns.tick(&job.topics, crate::log::now_ms());
        })
        .await;
        ctx.appended.notify_waiters();
    }
}

impl BrokerHandle {
    /// The address of the first listener (with the real port when configured with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.listeners[0].1
    }

    /// Every listener's name and bound address, in configuration order.
    pub fn listener_addrs(&self) -> &[(String, SocketAddr)] {
        &self.listeners
    }

    /// The bound address of the listener named `name` (`SASL_SSL`, or its configured name).
    pub fn local_addr_of(&self, name: &str) -> Option<SocketAddr> {
        self.listeners
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, addr)| *addr)
    }

    /// Every topic with its partitions' offsets and sizes, sorted by name (for dashboards and
    /// metrics in the embedding process, without a Kafka client).
    pub fn topics(&self) -> Vec<TopicInfo> {
        self.ctx
            .topics
            .all()
            .iter()
            .map(|topic| TopicInfo {
                name: topic.name.clone(),
                partitions: topic
                    .partitions
                    .iter()
                    .map(|p| {
                        let log = p.log();
                        PartitionInfo {
                            partition: p.index,
                            log_start_offset: log.log_start_offset(),
                            log_end_offset: log.log_end_offset(),
                            size_bytes: log.size_bytes(),
                            segments: log.segment_count(),
                        }
                    })
                    .collect(),
            })
            .collect()
    }

    /// A view of this broker's state for metrics and dashboards, that lives on independently
    /// of the handle (see [`BrokerObserver`]).
    pub fn observer(&self) -> BrokerObserver {
        BrokerObserver::new(Arc::clone(&self.ctx), &self.listeners)
    }

    /// Everything the broker reports, now: [`BrokerObserver::stats`].
    pub fn stats(&self) -> BrokerStats {
        self.observer().stats()
    }

    /// A Prometheus collector of the broker's metrics: [`BrokerObserver::collector`].
    pub fn collector(&self) -> BrokerCollector {
        self.observer().collector()
    }

    /// Registers the broker's metrics in `registry`: [`BrokerObserver::register_metrics`].
    pub fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        self.observer().register_metrics(registry);
    }

    /// Stops accepting, lets every connection finish its current request, fsyncs all logs.
    pub async fn shutdown(self) {
        self.ctx.shutdown.cancel();
        self.tracker.close();
        self.tracker.wait().await;
        let ctx = Arc::clone(&self.ctx);
        let marked = tokio::task::spawn_blocking(move || {
            if !ctx.topics.flush_all() {
                return false;
            }
            let marker = ctx
                .topics
                .broker_config()
                .data_dir
                .join(CLEAN_SHUTDOWN_MARKER);
            std::fs::File::create(&marker)
                .and_then(|f| f.sync_all())
                .is_ok()
        })
        .await;
        if !matches!(marked, Ok(true)) {
            tracing::warn!("shutdown not recorded as clean: the next start checks every segment");
        }
        tracing::info!("broker stopped");
    }
}

impl Drop for BrokerHandle {
    fn drop(&mut self) {
        self.ctx.shutdown.cancel();
    }
}
