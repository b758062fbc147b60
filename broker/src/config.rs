//! Broker settings. Each field maps to the Apache Kafka broker property named in its doc, with
//! Kafka's default; `log_*` settings are the broker-wide defaults that topic configs override.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use crate::security::AclBinding;

/// Settings of the bundled broker, as written in the agent's `broker:` YAML section.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BrokerConfig {
    /// Address to listen on (Kafka `listeners`). Default `127.0.0.1:9092`; port 0 picks a free
    /// port, see [`crate::BrokerHandle::local_addr`].
    pub listen: SocketAddr,
    /// `host:port` given to clients in metadata (Kafka `advertised.listeners`). Default: the
    /// bound listen address.
    pub advertised_listener: Option<String>,
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
    /// Largest record batch accepted (Kafka `message.max.bytes`, topic `max.message.bytes`);
    /// larger batches get MESSAGE_TOO_LARGE. Default 1048588.
    pub message_max_bytes: i32,
    /// Largest request accepted; a larger frame closes the connection before it is read (Kafka
    /// `socket.request.max.bytes`). Default 104857600 (100 MiB).
    pub socket_request_max_bytes: i32,
    /// Close a connection that sent no request for this long (Kafka `connections.max.idle.ms`).
    /// Default 10 minutes.
    pub connections_max_idle_ms: u64,
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
    /// How long the first rebalance of an empty group waits for more members to join, so they
    /// all get partitions in one round (Kafka `group.initial.rebalance.delay.ms`). Default 3000.
    pub group_initial_rebalance_delay_ms: u64,
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
            message_max_bytes: 1_048_588,
            socket_request_max_bytes: 104_857_600,
            connections_max_idle_ms: 600_000,
            log_flush_interval_messages: None,
            log_flush_interval_ms: None,
            producer_id_expiration_ms: 86_400_000,
            offsets_retention_minutes: 10_080,
            offsets_retention_check_interval_ms: 600_000,
            offset_metadata_max_bytes: 4096,
            group_min_session_timeout_ms: 6000,
            group_max_session_timeout_ms: 1_800_000,
            group_initial_rebalance_delay_ms: 3000,
            transaction_max_timeout_ms: 900_000,
            transaction_abort_timed_out_transaction_cleanup_interval_ms: 10_000,
            transactional_id_expiration_ms: 7 * 24 * 3600 * 1000,
            allow_everyone_if_no_acl_found: true,
            super_users: Vec::new(),
            acls: Vec::new(),
        }
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
}
