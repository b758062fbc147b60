//! The bundled single-node broker that speaks the Kafka wire protocol, so that any Kafka client
//! can produce to and consume from it.
//!
//! - [`server`](Broker::start): listener, connections, background retention, shutdown.
//! - `connection`: framing and request order; `api`: one handler per Kafka API.
//! - `topics` and `catalog`: the topics, their configs in SQLite; `log`: the partition log on
//!   disk, laid out as Kafka lays it out; `scrub`: the background check of its CRCs.
//! - `groups`: the group coordinator (classic consumer groups) and committed offsets.
//! - `txn`: the transaction coordinator (producer ids, transactions, transactional offsets).
//! - `security`: who a request comes from (its principal and host): TLS, SASL, SCRAM users;
//!   and what its ACLs allow.
//! - [`stats`](BrokerObserver): what the broker reports about itself, as data and as
//!   Prometheus metrics.
//!
//! ```no_run
//! # async fn run() -> Result<(), ferry_broker::BrokerError> {
//! let config = ferry_broker::BrokerConfig { data_dir: "./var/broker".into(), ..Default::default() };
//! let broker = ferry_broker::Broker::start(config).await?;
//! println!("listening on {}", broker.local_addr());
//! broker.shutdown().await;
//! # Ok(()) }
//! ```

mod api;
mod catalog;
mod compaction;
mod config;
mod connection;
mod dump;
#[doc(hidden)]
pub mod fuzzing;
mod groups;
mod limits;
mod log;
mod quotas;
mod repair;
mod scrub;
mod security;
mod server;
mod stats;
mod topic_config;
mod topics;
mod txn;

pub use catalog::CatalogError;
pub use config::{
    BrokerConfig, ClientAuth, ListenerConfig, Password, SaslMechanism, SecurityProtocol, SslConfig,
    UserConfig,
};
pub use dump::{
    DumpError, DumpOptions, DumpReport, dump_segment_file, dump_segment_file_verified,
    dump_segment_file_with,
};
pub use log::StorageError;
pub use log::batch::BatchError;
pub use quotas::{ClientQuota, DEFAULT_CLIENT};
pub use repair::{DamagedRange, RepairError, find_damage, remove_damage};
pub use security::scram::{SaltError, SaltedPassword, ScramClient, salt_password};
pub use security::tls::TlsError;
pub use security::{
    AclBinding, AclOperation, AclPermissionType, CLUSTER_NAME, PatternType, ResourceType,
};
pub use server::{Broker, BrokerError, BrokerHandle, PartitionInfo, TopicInfo};
pub use stats::{
    ApiStats, BrokerCollector, BrokerObserver, BrokerStats, ErrorCount, GroupStats, LatencyBucket,
    LatencyHistogram, ListenerStats, MemberStats, PartitionLag, PartitionStats, TopicPartition,
    TopicStats, TransactionStats,
};
