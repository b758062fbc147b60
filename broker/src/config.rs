//! Broker settings. Each field maps to the Apache Kafka broker property named in its doc, with
//! Kafka's default; `log_*` settings are the broker-wide defaults that topic configs override.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use serde::{Deserialize, Deserializer};

use crate::security::AclBinding;

/// Settings of the bundled broker, as written in the agent's `broker:` YAML section.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BrokerConfig {
    /// Address of the one plaintext listener, when `listeners` is not given (shorthand for
    /// Kafka `listeners=PLAINTEXT://...`). Default `127.0.0.1:9092`; port 0 picks a free port,
    /// see [`crate::BrokerHandle::local_addr`].
    pub listen: SocketAddr,
    /// `host:port` given to clients in metadata for the `listen` listener (Kafka
    /// `advertised.listeners`). Default: the bound listen address.
    pub advertised_listener: Option<String>,
    /// Address of the HTTP server of `agent broker` (`/metrics`, `/health`, `/api/broker`),
    /// e.g. `127.0.0.1:8048`; off unless set. The broker itself serves no HTTP: the agent
    /// binary does, and in a pipeline file `agent.http` serves the bundled broker's metrics.
    pub http: Option<SocketAddr>,
    /// The listeners, each with its own address and security protocol (Kafka `listeners`,
    /// `listener.security.protocol.map`, `advertised.listeners`). Default: none, and the one
    /// plaintext listener of `listen`; the two cannot be given together.
    pub listeners: Vec<ListenerConfig>,
    /// Users that SASL listeners accept, each turned into salted SCRAM credentials (SHA-256
    /// and SHA-512, 4096 iterations) at start; the plain text is not kept. Write the password
    /// as `${ENV_VAR}`. Users added with AlterUserScramCredentials (`agent users`) are stored
    /// in the metadata database besides these. Default: none.
    pub users: Vec<UserConfig>,
    /// Directory holding the partition logs and the metadata database (Kafka `log.dirs`).
    /// Default `./var/broker`.
    pub data_dir: PathBuf,
    /// Id of this broker in metadata responses (Kafka `node.id`). Default 0.
    pub node_id: i32,
    /// Partitions of an auto-created topic (Kafka `num.partitions`). Default 1.
    pub num_partitions: i32,
    /// Create a topic on first Metadata/Produce request naming it (Kafka
    /// `auto.create.topics.enable`). Default true.
    pub auto_create_topics_enable: bool,
    /// Size at which a new segment is rolled (Kafka `log.segment.bytes`, topic `segment.bytes`).
    /// Default 1 GiB.
    pub log_segment_bytes: u64,
    /// Age at which a new segment is rolled (Kafka `log.roll.ms`, topic `segment.ms`). Default 7
    /// days.
    pub log_roll_ms: i64,
    /// Segments whose newest record is older than this are deleted (Kafka `log.retention.ms`,
    /// topic `retention.ms`); -1 keeps them forever. Default 7 days.
    pub log_retention_ms: i64,
    /// Oldest segments are deleted while a partition is larger than this (Kafka
    /// `log.retention.bytes`, topic `retention.bytes`); -1 means no limit. Default -1.
    pub log_retention_bytes: i64,
    /// How often retention is enforced (Kafka `log.retention.check.interval.ms`). Default 5
    /// minutes.
    pub log_retention_check_interval_ms: u64,
    /// Bytes of log between two entries of the sparse offset and time indexes (Kafka
    /// `log.index.interval.bytes`, topic `index.interval.bytes`). Default 4096.
    pub log_index_interval_bytes: u32,
    /// Pause between two scrubs of the finished segments, which check every batch's CRC to
    /// find damage on disk (no Kafka property: Kafka checks CRCs only when recovering). The
    /// first scrub starts with the broker; 0 turns scrubbing off. Default 86400000 (1 day).
    pub log_scrub_interval_ms: u64,
    /// A segment's files (`.log`, `.index`, `.timeindex`) not read or written for this long
    /// are closed, and opened again when next needed, so idle partitions hold no file
    /// descriptors. No Kafka property (Kafka keeps every segment open). Default 300000 (5
    /// minutes).
    pub log_files_idle_close_ms: u64,
    /// Most bytes a scrub reads per second, so that it does not compete with clients for the
    /// disk (no Kafka property). Default 10485760 (10 MiB).
    pub log_scrub_bytes_per_sec: u64,
    /// Run the log cleaner, which compacts the topics whose `cleanup.policy` includes
    /// `compact` (Kafka `log.cleaner.enable`). Default true.
    pub log_cleaner_enable: bool,
    /// Pause between two rounds of the cleaner over the compacted partitions (Kafka
    /// `log.cleaner.backoff.ms`). Default 15000.
    pub log_cleaner_backoff_ms: u64,
    /// Most memory a compaction pass gives to the keys it collects (Kafka
    /// `log.cleaner.dedupe.buffer.size`); a pass with more keys cleans part of the log and
    /// leaves the rest to the next. Default 134217728 (128 MiB).
    pub log_cleaner_dedupe_buffer_size: u64,
    /// Most bytes the cleaner reads per second (Kafka `log.cleaner.io.max.bytes.per.second`);
    /// 0 means no limit. Default 0.
    pub log_cleaner_io_max_bytes_per_second: u64,
    /// Largest record batch accepted (Kafka `message.max.bytes`, topic `max.message.bytes`);
    /// larger batches get MESSAGE_TOO_LARGE. Default 1048588.
    pub message_max_bytes: i32,
    /// Largest request accepted; a larger frame closes the connection before it is read (Kafka
    /// `socket.request.max.bytes`). Default 104857600 (100 MiB).
    pub socket_request_max_bytes: i32,
    /// Close a connection that sent no request for this long (Kafka `connections.max.idle.ms`).
    /// Default 10 minutes.
    pub connections_max_idle_ms: u64,
    /// Close a connection whose request did not arrive whole within this long of its first
    /// byte, giving back the memory it held (a client sending a byte every few seconds, or
    /// stalling half-way through a large request). A per-request deadline: Kafka has none
    /// (its `connections.max.idle.ms` counts from the last byte). Raise it for very large
    /// requests over slow links. Default 30000.
    pub request_receive_timeout_ms: u64,
    /// Largest request read before a connection on a SASL listener has authenticated (Kafka
    /// `sasl.server.max.receive.size`); a larger one closes the connection before anything is
    /// read. Default 524288 (512 KiB).
    pub sasl_server_max_receive_size: i32,
    /// Close a connection on a TLS listener whose handshake is not done within this long of
    /// its accept (a client that connects and sends nothing, or a partial ClientHello).
    /// Handshakes are made in the connections' own tasks, so a slow one holds up nobody else;
    /// this bounds how long each holds its connection slot. Default 10000.
    pub ssl_handshake_timeout_ms: u64,
    /// Close a connection on a SASL listener that has not authenticated within this long of
    /// its accept (after the TLS handshake): a client that starts a SASL exchange and stops,
    /// or never starts one. Kafka has no such bound (only `connections.max.idle.ms`, 10
    /// minutes). Default 10000.
    pub sasl_authentication_timeout_ms: u64,
    /// Connections open at once across every listener (Kafka `max.connections`); past it a new
    /// connection is closed at once, counted and logged (once a minute), so the client fails
    /// fast and retries instead of waiting in the accept queue. The broker also keeps enough
    /// file descriptors free for its partitions: with a low `ulimit -n` the effective limit is
    /// lower, and the start-up log says which it is. Default 10000.
    pub max_connections: u32,
    /// Fetches that wait for data (their `min_bytes` not there yet) and are woken by every
    /// append, at once; a fetch past it still waits its `max_wait_ms` but looks only then,
    /// so a consumer over it sees new records up to `fetch.wait.max.ms` later (librdkafka:
    /// 500 ms) and appends do not wake an unbounded number of waiters. No Kafka property
    /// (Kafka's fetch purgatory is unbounded). Default 1000.
    pub max_pending_fetches: u32,
    /// Connections open at once from one IP address (Kafka `max.connections.per.ip`). Default:
    /// no limit beyond `max_connections`.
    pub max_connections_per_ip: Option<u32>,
    /// Per-address exceptions to `max_connections_per_ip`, e.g. `{"10.0.0.5": 2000}` (Kafka
    /// `max.connections.per.ip.overrides`, a map here rather than `host:count,...`). Default
    /// none.
    pub max_connections_per_ip_overrides: BTreeMap<IpAddr, u32>,
    /// Bytes of requests read but not yet answered, across every connection (Kafka
    /// `queued.max.request.bytes`); a connection whose next request does not fit waits, unread,
    /// until others are answered, so the broker's memory stays bounded whatever the clients
    /// send. At least `socket_request_max_bytes`. Default 536870912 (512 MiB).
    pub queued_max_request_bytes: u64,
    /// Partitions this broker hosts at most, across every topic (Kafka's
    /// `max.broker.partitions` of KIP-578); CreateTopics, CreatePartitions and auto-creation
    /// past it are refused before anything is created. Each partition holds open file
    /// descriptors, so with a low `ulimit -n` the effective cap is lower, and the refusal says
    /// so. Default 10000.
    pub max_broker_partitions: u32,
    /// Partitions one topic may have at most. Default 10000.
    pub max_partitions_per_topic: u32,
    /// Byte-rate quotas by client id: `{producer_byte_rate, consumer_byte_rate}` for each,
    /// `<default>` for every client id without its own (Kafka's client-id quotas, set with
    /// `kafka-configs --entity-type clients`). A client over its quota gets `throttle_time_ms`
    /// and its connection waits that long. Default none.
    pub client_quotas: BTreeMap<String, crate::quotas::ClientQuota>,
    /// Samples a quota's rate is measured over (Kafka `quota.window.num`). Default 11.
    pub quota_window_num: u32,
    /// Length of one sample, in seconds (Kafka `quota.window.size.seconds`). Default 1.
    pub quota_window_size_seconds: u32,
    /// Fsync a partition after this many records (Kafka `log.flush.interval.messages`, topic
    /// `flush.messages`). Default: never; the page cache and the OS decide.
    pub log_flush_interval_messages: Option<i64>,
    /// Fsync a partition when its last fsync is older than this (Kafka `log.flush.interval.ms`,
    /// topic `flush.ms`). Default: never.
    pub log_flush_interval_ms: Option<i64>,
    /// A partition forgets an idempotent producer (its last sequence numbers, for
    /// deduplicating retries) once it wrote nothing this long and has no open transaction
    /// (Kafka `producer.id.expiration.ms`). Default 86400000 (1 day).
    pub producer_id_expiration_ms: i64,
    /// Producer states a partition keeps (for idempotence: each producer id's epoch and last
    /// batches); past it the least recently written ones without an open transaction are
    /// forgotten, as idle ones are after `producer_id_expiration_ms`. Bounds what clients that
    /// make a new idempotent producer for every few records hold. No Kafka property (Kafka
    /// 3.8 throttles new producer ids per user instead, KIP-936). Default 10000.
    pub max_producer_ids_per_partition: u32,
    /// Committed offsets of a group are deleted once the group has been empty this long; for a
    /// group that never had members (offsets committed by a standalone consumer or a tool), once
    /// each offset is this old (Kafka `offsets.retention.minutes`). Default 10080 (7 days).
    pub offsets_retention_minutes: u64,
    /// How often expired offsets and empty groups are removed (Kafka
    /// `offsets.retention.check.interval.ms`). Default 10 minutes.
    pub offsets_retention_check_interval_ms: u64,
    /// Largest metadata string accepted with a committed offset (Kafka
    /// `offset.metadata.max.bytes`). Default 4096.
    pub offset_metadata_max_bytes: usize,
    /// Smallest session timeout a group member may ask for (Kafka
    /// `group.min.session.timeout.ms`). Default 6000.
    pub group_min_session_timeout_ms: i32,
    /// Largest session timeout a group member may ask for (Kafka
    /// `group.max.session.timeout.ms`). Default 1800000 (30 minutes).
    pub group_max_session_timeout_ms: i32,
    /// Members a group may have, member ids handed out and not joined yet included (Kafka
    /// `group.max.size`, and `group.consumer.max.size` for the consumer protocol); a member
    /// joining past it gets GROUP_MAX_SIZE_REACHED. Default 1000 (Kafka: no limit).
    pub group_max_size: u32,
    /// Groups the coordinator keeps, with members or only committed offsets; a request that
    /// would make a new one past it gets POLICY_VIOLATION. No Kafka property. Default 100000.
    pub max_groups: u32,
    /// How long the first rebalance of an empty group waits for more members to join, so they
    /// all get partitions in one round (Kafka `group.initial.rebalance.delay.ms`). Default 3000.
    pub group_initial_rebalance_delay_ms: u64,
    /// Session timeout of the members of consumer-protocol groups (KIP-848; Kafka
    /// `group.consumer.session.timeout.ms`). Default 45000.
    pub group_consumer_session_timeout_ms: i32,
    /// Heartbeat interval the coordinator gives the members of consumer-protocol groups (Kafka
    /// `group.consumer.heartbeat.interval.ms`). Default 5000.
    pub group_consumer_heartbeat_interval_ms: i32,
    /// Largest `transaction.timeout.ms` a transactional producer may ask for; InitProducerId
    /// with a larger one gets INVALID_TRANSACTION_TIMEOUT (Kafka `transaction.max.timeout.ms`).
    /// Default 900000 (15 minutes).
    pub transaction_max_timeout_ms: i32,
    /// How often open transactions past their timeout are aborted, fencing their producers, and
    /// idle transactional ids past `transactional_id_expiration_ms` removed (Kafka
    /// `transaction.abort.timed.out.transaction.cleanup.interval.ms`). Default 10000.
    pub transaction_abort_timed_out_transaction_cleanup_interval_ms: u64,
    /// A transactional id without any transaction for this long is forgotten (Kafka
    /// `transactional.id.expiration.ms`). Default 604800000 (7 days).
    pub transactional_id_expiration_ms: i64,
    /// Transactional ids the coordinator keeps (each with its state, and at most one open
    /// transaction); InitProducerId for a new one past it gets POLICY_VIOLATION. Idle ones
    /// go after `transactional_id_expiration_ms`. No Kafka property. Default 100000.
    pub max_transactional_ids: u32,
    /// Whether a request on a resource that no ACL names at all is allowed (Kafka
    /// `allow.everyone.if.no.acl.found`). Default true, unlike Kafka's false: with no ACLs
    /// configured everything stays allowed; set false to allow only what an ACL allows.
    pub allow_everyone_if_no_acl_found: bool,
    /// Principals allowed everything, whatever the ACLs say (Kafka `super.users`, a list here
    /// rather than `;`-separated), e.g. `[User:admin]`. Default none.
    pub super_users: Vec<String>,
    /// ACLs added at every start when missing, as `agent acls --add` adds them; they are
    /// stored with the others, so removing one from this list does not remove it from the
    /// broker (`agent acls --remove` does). No Kafka property: a convenience for pipeline
    /// files. Default none.
    pub acls: Vec<AclBinding>,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 9092)),
            advertised_listener: None,
            http: None,
            listeners: Vec::new(),
            users: Vec::new(),
            data_dir: PathBuf::from("./var/broker"),
            node_id: 0,
            num_partitions: 1,
            auto_create_topics_enable: true,
            log_segment_bytes: 1 << 30,
            log_roll_ms: 7 * 24 * 3600 * 1000,
            log_retention_ms: 7 * 24 * 3600 * 1000,
            log_retention_bytes: -1,
            log_retention_check_interval_ms: 300_000,
            log_index_interval_bytes: 4096,
            log_scrub_interval_ms: 86_400_000,
            log_files_idle_close_ms: 300_000,
            log_scrub_bytes_per_sec: 10 << 20,
            log_cleaner_enable: true,
            log_cleaner_backoff_ms: 15_000,
            log_cleaner_dedupe_buffer_size: 128 << 20,
            log_cleaner_io_max_bytes_per_second: 0,
            message_max_bytes: 1_048_588,
            socket_request_max_bytes: 104_857_600,
            connections_max_idle_ms: 600_000,
            request_receive_timeout_ms: 30_000,
            sasl_server_max_receive_size: 524_288,
            ssl_handshake_timeout_ms: 10_000,
            sasl_authentication_timeout_ms: 10_000,
            max_connections: 10_000,
            max_pending_fetches: 1000,
            max_connections_per_ip: None,
            max_connections_per_ip_overrides: BTreeMap::new(),
            queued_max_request_bytes: 512 << 20,
            max_broker_partitions: 10_000,
            max_partitions_per_topic: 10_000,
            client_quotas: BTreeMap::new(),
            quota_window_num: 11,
            quota_window_size_seconds: 1,
            log_flush_interval_messages: None,
            log_flush_interval_ms: None,
            producer_id_expiration_ms: 86_400_000,
            max_producer_ids_per_partition: 10_000,
            offsets_retention_minutes: 10_080,
            offsets_retention_check_interval_ms: 600_000,
            offset_metadata_max_bytes: 4096,
            group_min_session_timeout_ms: 6000,
            group_max_session_timeout_ms: 1_800_000,
            group_max_size: 1000,
            max_groups: 100_000,
            group_initial_rebalance_delay_ms: 3000,
            group_consumer_session_timeout_ms: 45_000,
            group_consumer_heartbeat_interval_ms: 5000,
            transaction_max_timeout_ms: 900_000,
            transaction_abort_timed_out_transaction_cleanup_interval_ms: 10_000,
            transactional_id_expiration_ms: 7 * 24 * 3600 * 1000,
            max_transactional_ids: 100_000,
            allow_everyone_if_no_acl_found: true,
            super_users: Vec::new(),
            acls: Vec::new(),
        }
    }
}

/// One listener: where it binds and how its clients authenticate.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    /// The listener name of Kafka's `listeners` (`SASL_SSL://...`). Default: the security
    /// protocol's name in upper case; two listeners of one protocol need names.
    #[serde(default)]
    pub name: Option<String>,
    /// `ip:port` to bind; port 0 picks a free port.
    pub address: SocketAddr,
    /// `plaintext`, `ssl`, `sasl_plaintext` or `sasl_ssl` (Kafka's upper-case names too; Kafka
    /// `listener.security.protocol.map`). Default `plaintext`.
    #[serde(default)]
    pub security_protocol: SecurityProtocol,
    /// `host:port` that Metadata, FindCoordinator and DescribeCluster give clients of this
    /// listener (Kafka `advertised.listeners`). Default: the bound address.
    #[serde(default)]
    pub advertised: Option<String>,
    /// Certificate, key and client authentication: required on `ssl` and `sasl_ssl`.
    #[serde(default)]
    pub ssl: Option<SslConfig>,
    /// SASL mechanisms enabled on a `sasl_*` listener (Kafka
    /// `sasl.enabled.mechanisms`). Default `[PLAIN, SCRAM-SHA-256, SCRAM-SHA-512]`.
    #[serde(default)]
    pub sasl_mechanisms: Option<Vec<SaslMechanism>>,
}

impl ListenerConfig {
    /// A plaintext listener on `address`.
    pub fn plaintext(address: SocketAddr) -> ListenerConfig {
        ListenerConfig {
            name: None,
            address,
            security_protocol: SecurityProtocol::Plaintext,
            advertised: None,
            ssl: None,
            sasl_mechanisms: None,
        }
    }

    /// The listener's name: given, or that of its protocol.
    pub fn name(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| self.security_protocol.kafka_name().to_owned())
    }

    /// The SASL mechanisms enabled on it (none on a listener without SASL).
    pub fn mechanisms(&self) -> Vec<SaslMechanism> {
        if !self.security_protocol.sasl() {
            return Vec::new();
        }
        self.sasl_mechanisms.clone().unwrap_or_else(|| {
            vec![
                SaslMechanism::Plain,
                SaslMechanism::ScramSha256,
                SaslMechanism::ScramSha512,
            ]
        })
    }
}

/// How a listener's clients connect (Kafka's `SecurityProtocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SecurityProtocol {
    /// Plain TCP, no authentication: every client is `User:ANONYMOUS`.
    #[default]
    Plaintext,
    /// TLS; a client certificate, when asked for and given, names the principal.
    Ssl,
    /// SASL authentication over plain TCP.
    SaslPlaintext,
    /// SASL authentication over TLS.
    SaslSsl,
}

impl SecurityProtocol {
    const ALL: [SecurityProtocol; 4] = [
        SecurityProtocol::Plaintext,
        SecurityProtocol::Ssl,
        SecurityProtocol::SaslPlaintext,
        SecurityProtocol::SaslSsl,
    ];

    /// Kafka's name: `PLAINTEXT`, `SSL`, `SASL_PLAINTEXT`, `SASL_SSL`.
    pub fn kafka_name(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::Ssl => "SSL",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::SaslSsl => "SASL_SSL",
        }
    }

    /// Whether connections are TLS.
    pub fn tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    /// Whether clients authenticate with SASL.
    pub fn sasl(self) -> bool {
        matches!(
            self,
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
        )
    }
}

impl<'de> Deserialize<'de> for SecurityProtocol {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        SecurityProtocol::ALL
            .into_iter()
            .find(|p| p.kafka_name().eq_ignore_ascii_case(&text))
            .ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "unknown security_protocol `{text}`, expected one of plaintext, ssl, \
                     sasl_plaintext, sasl_ssl"
                ))
            })
    }
}

/// TLS settings of a listener.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SslConfig {
    /// PEM file with the server certificate, then its intermediates (Kafka
    /// `ssl.keystore.location`, as PEM).
    pub certificate: PathBuf,
    /// PEM file with the private key of the certificate: PKCS#8, RSA or EC (Kafka
    /// `ssl.key.password`/keystore, as PEM).
    pub key: PathBuf,
    /// Whether clients must present a certificate signed by `ca` (Kafka `ssl.client.auth`):
    /// `none`, `requested` or `required`. Default `none`.
    #[serde(default)]
    pub client_auth: ClientAuth,
    /// PEM bundle of the CAs that sign client certificates (Kafka `ssl.truststore.location`);
    /// required unless `client_auth` is `none`.
    #[serde(default)]
    pub ca: Option<PathBuf>,
}

/// Kafka's `ssl.client.auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    /// No client certificate is asked for.
    #[default]
    None,
    /// A certificate is asked for; a client without one connects as `User:ANONYMOUS`.
    Requested,
    /// A client without a valid certificate is refused.
    Required,
}

/// A SASL mechanism.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SaslMechanism {
    /// RFC 4616: the password in the clear (use over TLS only), checked against the user's
    /// SCRAM credentials.
    Plain,
    /// RFC 7677 SCRAM with SHA-256.
    ScramSha256,
    /// SCRAM with SHA-512.
    ScramSha512,
}

impl SaslMechanism {
    /// Every mechanism served.
    pub const ALL: [SaslMechanism; 3] = [
        SaslMechanism::Plain,
        SaslMechanism::ScramSha256,
        SaslMechanism::ScramSha512,
    ];

    /// The IANA name, as clients send it: `PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`.
    pub fn name(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }

    /// The mechanism of an IANA name (case-insensitive).
    pub fn from_name(name: &str) -> Option<SaslMechanism> {
        SaslMechanism::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(name))
    }
}

impl fmt::Display for SaslMechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl<'de> Deserialize<'de> for SaslMechanism {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        SaslMechanism::from_name(&text).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "unknown SASL mechanism `{text}`, expected PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"
            ))
        })
    }
}

/// A user of the SASL listeners, defined in the configuration.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    /// The user name; the principal is `User:<name>`.
    pub name: String,
    /// The password, normally `${ENV_VAR}`.
    pub password: Password,
}

/// A secret read from the configuration, as written there (the agent has replaced `${NAME}` by
/// the environment variable `NAME` before: `agent run`, `agent broker --config` and `agent
/// validate` all do). Its `Debug` never shows it, so a printed config does not either.
#[derive(Clone, PartialEq)]
pub struct Password(String);

impl Password {
    /// A password given in code (tests, embedding programs).
    pub fn new(text: impl Into<String>) -> Password {
        Password(text.into())
    }

    /// The secret itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Password(<redacted>)")
    }
}

impl<'de> Deserialize<'de> for Password {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Password)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_kafka_named_settings_with_defaults_and_refuses_unknown_ones() {
        let config: BrokerConfig = serde_json::from_str(
            r#"{"listen": "127.0.0.1:0", "data_dir": "/tmp/b", "num_partitions": 3, "log_retention_ms": -1}"#,
        )
        .unwrap();
        assert_eq!(config.num_partitions, 3);
        assert_eq!(config.log_retention_ms, -1);
        assert_eq!(config.message_max_bytes, 1_048_588);
        assert_eq!(config.log_segment_bytes, 1 << 30);
        assert!(config.auto_create_topics_enable);
        assert_eq!(config.offsets_retention_minutes, 10_080);
        assert_eq!(config.group_initial_rebalance_delay_ms, 3000);
        assert_eq!(config.transaction_max_timeout_ms, 900_000);
        assert_eq!(
            config.transaction_abort_timed_out_transaction_cleanup_interval_ms,
            10_000
        );
        assert_eq!(config.transactional_id_expiration_ms, 604_800_000);
        let unknown = serde_json::from_str::<BrokerConfig>(r#"{"num.partitions": 3}"#);
        assert!(unknown.is_err());
    }

    #[test]
    fn reads_acls_with_kafka_defaults_for_omitted_fields() {
        use crate::security::{AclOperation, AclPermissionType, PatternType, ResourceType};
        let config: BrokerConfig = serde_json::from_str(
            r#"{"allow_everyone_if_no_acl_found": false, "super_users": ["User:admin"],
                "acls": [{"resource_type": "topic", "resource_name": "logs-",
                          "pattern_type": "prefixed", "principal": "User:alice",
                          "operation": "write"},
                         {"resource_type": "transactional_id", "resource_name": "*",
                          "principal": "User:*", "host": "10.0.0.1",
                          "operation": "describe", "permission_type": "deny"}]}"#,
        )
        .unwrap();
        assert!(!config.allow_everyone_if_no_acl_found);
        assert_eq!(config.super_users, ["User:admin"]);
        let first = &config.acls[0];
        assert_eq!(first.resource_type, ResourceType::Topic);
        assert_eq!(first.pattern_type, PatternType::Prefixed);
        assert_eq!(first.host, "*");
        assert_eq!(first.operation, AclOperation::Write);
        assert_eq!(first.permission_type, AclPermissionType::Allow);
        let second = &config.acls[1];
        assert_eq!(second.pattern_type, PatternType::Literal);
        assert_eq!(second.permission_type, AclPermissionType::Deny);
        assert!(BrokerConfig::default().allow_everyone_if_no_acl_found);
    }

    #[test]
    fn reads_listeners_with_kafka_protocol_names_and_defaults() {
        let config: BrokerConfig = serde_json::from_str(
            r#"{"listeners": [
                {"address": "127.0.0.1:0"},
                {"name": "EXTERNAL", "address": "0.0.0.0:9094", "security_protocol": "SASL_SSL",
                 "advertised": "broker.example:9094",
                 "ssl": {"certificate": "c.pem", "key": "k.pem", "client_auth": "required", "ca": "ca.pem"}},
                {"address": "127.0.0.1:0", "security_protocol": "sasl_plaintext", "sasl_mechanisms": ["SCRAM-SHA-512"]}
            ]}"#,
        )
        .unwrap();
        let [plain, external, sasl] = &config.listeners[..] else {
            panic!("three listeners")
        };
        assert_eq!(plain.name(), "PLAINTEXT");
        assert!(plain.mechanisms().is_empty());
        assert_eq!(external.name(), "EXTERNAL");
        assert_eq!(external.security_protocol, SecurityProtocol::SaslSsl);
        assert_eq!(external.mechanisms(), SaslMechanism::ALL.to_vec());
        let ssl = external.ssl.as_ref().unwrap();
        assert_eq!(ssl.client_auth, ClientAuth::Required);
        assert_eq!(sasl.name(), "SASL_PLAINTEXT");
        assert_eq!(sasl.mechanisms(), vec![SaslMechanism::ScramSha512]);
        let bad = serde_json::from_str::<BrokerConfig>(
            r#"{"listeners": [{"address": "127.0.0.1:0", "security_protocol": "tls"}]}"#,
        );
        assert!(bad.unwrap_err().to_string().contains("sasl_plaintext"));
    }

    #[test]
    fn user_passwords_never_print() {
        let config: BrokerConfig =
            serde_json::from_str(r#"{"users": [{"name": "bob", "password": "literal-secret"}]}"#)
                .unwrap();
        assert_eq!(config.users[0].password.expose(), "literal-secret");
        assert!(!format!("{config:?}").contains("literal-secret"));
    }
}
