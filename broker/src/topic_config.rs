//! Topic-level configuration: Kafka's topic property names, their broker-wide defaults, and the
//! effective [`LogConfig`] a partition log runs with.

use std::collections::BTreeMap;

use kafka_protocol::records::Compression;

use crate::config::BrokerConfig;

/// Kafka's "no limit" for the flush settings.
const NEVER: i64 = i64::MAX;

/// The topic configs this broker knows: (topic property, broker property it defaults to).
pub(crate) const TOPIC_CONFIGS: &[(&str, &str)] = &[
    ("cleanup.policy", "log.cleanup.policy"),
    ("compression.type", "compression.type"),
    ("delete.retention.ms", "log.cleaner.delete.retention.ms"),
    ("flush.messages", "log.flush.interval.messages"),
    ("flush.ms", "log.flush.interval.ms"),
    ("index.interval.bytes", "log.index.interval.bytes"),
    ("max.compaction.lag.ms", "log.cleaner.max.compaction.lag.ms"),
    ("max.message.bytes", "message.max.bytes"),
    ("message.timestamp.type", "log.message.timestamp.type"),
    ("min.insync.replicas", "min.insync.replicas"),
    (
        "min.cleanable.dirty.ratio",
        "log.cleaner.min.cleanable.ratio",
    ),
    ("min.compaction.lag.ms", "log.cleaner.min.compaction.lag.ms"),
    ("retention.bytes", "log.retention.bytes"),
    ("retention.ms", "log.retention.ms"),
    ("segment.bytes", "log.segment.bytes"),
    ("segment.ms", "log.roll.ms"),
];

/// How an accepted topic config without an effect here is checked.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Inert {
    Bool,
    /// An integer (INT or LONG as Kafka types it) in `min..=max`.
    Int {
        min: i64,
        max: i64,
        long: bool,
    },
    /// A comma-separated list of replica assignments (`*` or `partition:broker,...`).
    Replicas,
    /// Any string (a deprecated version name).
    Text,
}

/// The topic configs Kafka 3.9 accepts that have no effect on this single-node broker:
/// (name, Kafka's default, how the value is checked). They are stored and described as given,
/// so tools that set them work; docs/configuration.md says why each has no effect.
pub(crate) const INERT_TOPIC_CONFIGS: &[(&str, &str, Inert)] = &[
    (
        "compression.gzip.level",
        "-1",
        Inert::Int {
            min: -1,
            max: 9,
            long: false,
        },
    ),
    (
        "compression.lz4.level",
        "9",
        Inert::Int {
            min: 1,
            max: 17,
            long: false,
        },
    ),
    (
        "compression.zstd.level",
        "3",
        Inert::Int {
            min: -131_072,
            max: 22,
            long: false,
        },
    ),
    (
        "file.delete.delay.ms",
        "60000",
        Inert::Int {
            min: 0,
            max: i64::MAX,
            long: true,
        },
    ),
    (
        "follower.replication.throttled.replicas",
        "",
        Inert::Replicas,
    ),
    ("leader.replication.throttled.replicas", "", Inert::Replicas),
    (
        "local.retention.bytes",
        "-2",
        Inert::Int {
            min: -2,
            max: i64::MAX,
            long: true,
        },
    ),
    (
        "local.retention.ms",
        "-2",
        Inert::Int {
            min: -2,
            max: i64::MAX,
            long: true,
        },
    ),
    ("message.downconversion.enable", "true", Inert::Bool),
    ("message.format.version", "3.0-IV1", Inert::Text),
    (
        "message.timestamp.after.max.ms",
        "9223372036854775807",
        Inert::Int {
            min: 0,
            max: i64::MAX,
            long: true,
        },
    ),
    (
        "message.timestamp.before.max.ms",
        "9223372036854775807",
        Inert::Int {
            min: 0,
            max: i64::MAX,
            long: true,
        },
    ),
    (
        "message.timestamp.difference.max.ms",
        "9223372036854775807",
        Inert::Int {
            min: 0,
            max: i64::MAX,
            long: true,
        },
    ),
    ("preallocate", "false", Inert::Bool),
    ("remote.log.copy.disable", "false", Inert::Bool),
    ("remote.log.delete.on.disable", "false", Inert::Bool),
    ("remote.storage.enable", "false", Inert::Bool),
    (
        "segment.index.bytes",
        "10485760",
        Inert::Int {
            min: 4,
            max: i32::MAX as i64,
            long: false,
        },
    ),
    (
        "segment.jitter.ms",
        "0",
        Inert::Int {
            min: 0,
            max: i64::MAX,
            long: true,
        },
    ),
    ("unclean.leader.election.enable", "false", Inert::Bool),
];

impl Inert {
    /// Why `value` is refused, if it is.
    fn check(self, name: &str, value: &str) -> Result<(), &'static str> {
        let value = value.trim();
        match self {
            Inert::Bool if value.eq_ignore_ascii_case("true") => {
                if name == "remote.storage.enable" {
                    return Err("tiered storage is not available on this broker");
                }
                Ok(())
            }
            Inert::Bool if value.eq_ignore_ascii_case("false") => Ok(()),
            Inert::Bool => Err("not `true` or `false`"),
            Inert::Int { min, max, .. } => match value.parse::<i64>() {
                Err(_) => Err("not an integer"),
                Ok(n) if n < min => Err("below the minimum"),
                Ok(n) if n > max => Err("above the maximum"),
                Ok(_) => Ok(()),
            },
            Inert::Replicas => {
                let assignment = |item: &str| {
                    let mut parts = item.trim().split(':');
                    let number =
                        |p: Option<&str>| p.is_some_and(|p| p.trim().parse::<u32>().is_ok());
                    number(parts.next()) && number(parts.next()) && parts.next().is_none()
                };
                if value.is_empty() || value == "*" || value.split(',').all(assignment) {
                    Ok(())
                } else {
                    Err("not `*` or a list of `partition:broker` pairs")
                }
            }
            Inert::Text => Ok(()),
        }
    }
}

/// A topic's `compression.type`: Kafka's names, `producer` keeping what the producer sent.
fn compression_of(value: &str) -> Option<Option<Compression>> {
    Some(match value.trim() {
        "producer" => None,
        // Kafka's name for it is `uncompressed`; `none` is what producers call it.
        "uncompressed" | "none" => Some(Compression::None),
        "gzip" => Some(Compression::Gzip),
        "snappy" => Some(Compression::Snappy),
        "lz4" => Some(Compression::Lz4),
        "zstd" => Some(Compression::Zstd),
        _ => return None,
    })
}

fn compression_name(compression: Option<Compression>) -> &'static str {
    match compression {
        None => "producer",
        Some(Compression::None) => "uncompressed",
        Some(Compression::Gzip) => "gzip",
        Some(Compression::Snappy) => "snappy",
        Some(Compression::Lz4) => "lz4",
        Some(Compression::Zstd) => "zstd",
    }
}

/// Effective settings of one partition log.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LogConfig {
    pub(crate) segment_bytes: u64,
    pub(crate) segment_ms: i64,
    pub(crate) retention_ms: i64,
    pub(crate) retention_bytes: i64,
    pub(crate) index_interval_bytes: u32,
    pub(crate) max_message_bytes: i32,
    pub(crate) flush_messages: i64,
    pub(crate) flush_ms: i64,
    /// Broker-wide: `producer.id.expiration.ms`.
    pub(crate) producer_id_expiration_ms: i64,
    /// Broker-wide: `max_producer_ids_per_partition`.
    pub(crate) max_producer_ids: usize,
    /// `compression.type`: the codec batches are stored with, re-encoded on produce when the
    /// producer's differs; `None` (`producer`) keeps the producer's.
    pub(crate) compression: Option<Compression>,
    /// `message.timestamp.type` is `LogAppendTime`: the broker stamps each batch on append.
    pub(crate) log_append_time: bool,
    /// `min.insync.replicas`: above 1 (the one replica here), acks=all produce is refused
    /// with NOT_ENOUGH_REPLICAS, as Kafka does when too few replicas are in sync.
    pub(crate) min_insync_replicas: i64,
    /// The values of [`INERT_TOPIC_CONFIGS`] set on the topic.
    pub(crate) inert: BTreeMap<&'static str, String>,
    /// `cleanup.policy`: `delete`, `compact` or both.
    pub(crate) cleanup_policy: CleanupPolicy,
    /// `delete.retention.ms`: how long tombstones stay after their segment was cleaned.
    pub(crate) delete_retention_ms: i64,
    /// `min.cleanable.dirty.ratio`.
    pub(crate) min_cleanable_dirty_ratio: f64,
    /// `min.compaction.lag.ms`.
    pub(crate) min_compaction_lag_ms: i64,
    /// `max.compaction.lag.ms`.
    pub(crate) max_compaction_lag_ms: i64,
}

/// Kafka's `cleanup.policy`: a list of `delete` and `compact`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CleanupPolicy {
    pub(crate) delete: bool,
    pub(crate) compact: bool,
}

impl CleanupPolicy {
    pub(crate) const DELETE: CleanupPolicy = CleanupPolicy {
        delete: true,
        compact: false,
    };

    /// Parses Kafka's comma-separated list (`delete`, `compact`, `compact,delete`).
    pub(crate) fn parse(value: &str) -> Option<CleanupPolicy> {
        let mut policy = CleanupPolicy {
            delete: false,
            compact: false,
        };
        for item in value.split(',') {
            match item.trim() {
                "delete" => policy.delete = true,
                "compact" => policy.compact = true,
                _ => return None,
            }
        }
        (policy.delete || policy.compact).then_some(policy)
    }
}

impl std::fmt::Display for CleanupPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match (self.compact, self.delete) {
            (true, true) => "compact,delete",
            (true, false) => "compact",
            _ => "delete",
        })
    }
}

/// Kafka's defaults for the compaction settings.
const DELETE_RETENTION_MS: i64 = 86_400_000;
const MIN_CLEANABLE_DIRTY_RATIO: f64 = 0.5;

/// A topic config value that cannot be accepted.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TopicConfigError {
    #[error("unknown topic config `{0}`")]
    Unknown(String),
    #[error("topic config `{name}`: `{value}` is not valid: {reason}")]
    Invalid {
        name: String,
        value: String,
        reason: &'static str,
    },
}

impl LogConfig {
    /// Broker defaults, with `overrides` (topic property -> value) applied on top.
    pub(crate) fn resolve(
        broker: &BrokerConfig,
        overrides: &BTreeMap<String, String>,
    ) -> Result<LogConfig, TopicConfigError> {
        let mut config = LogConfig {
            segment_bytes: broker.log_segment_bytes,
            segment_ms: broker.log_roll_ms,
            retention_ms: broker.log_retention_ms,
            retention_bytes: broker.log_retention_bytes,
            index_interval_bytes: broker.log_index_interval_bytes,
            max_message_bytes: broker.message_max_bytes,
            flush_messages: broker.log_flush_interval_messages.unwrap_or(NEVER),
            flush_ms: broker.log_flush_interval_ms.unwrap_or(NEVER),
            producer_id_expiration_ms: broker.producer_id_expiration_ms,
            max_producer_ids: usize::try_from(broker.max_producer_ids_per_partition.max(1))
                .unwrap_or(usize::MAX),
            compression: None,
            log_append_time: false,
            min_insync_replicas: 1,
            inert: BTreeMap::new(),
            cleanup_policy: CleanupPolicy::DELETE,
            delete_retention_ms: DELETE_RETENTION_MS,
            min_cleanable_dirty_ratio: MIN_CLEANABLE_DIRTY_RATIO,
            min_compaction_lag_ms: 0,
            max_compaction_lag_ms: NEVER,
        };
        for (name, value) in overrides {
            config.apply(name, value)?;
        }
        Ok(config)
    }

    fn apply(&mut self, name: &str, value: &str) -> Result<(), TopicConfigError> {
        let invalid = |reason| TopicConfigError::Invalid {
            name: name.to_owned(),
            value: value.to_owned(),
            reason,
        };
        let int = |min: i64| -> Result<i64, TopicConfigError> {
            let n: i64 = value
                .trim()
                .parse()
                .map_err(|_| invalid("not an integer"))?;
            if n < min {
                return Err(invalid("below the minimum"));
            }
            Ok(n)
        };
        match name {
            "compression.type" => {
                self.compression = compression_of(value).ok_or_else(|| {
                    invalid("not one of uncompressed, zstd, lz4, snappy, gzip, producer")
                })?
            }
            "message.timestamp.type" => {
                self.log_append_time = match value.trim() {
                    "CreateTime" => false,
                    "LogAppendTime" => true,
                    _ => return Err(invalid("not `CreateTime` or `LogAppendTime`")),
                }
            }
            "min.insync.replicas" => {
                self.min_insync_replicas = int(1)?;
                if self.min_insync_replicas > i64::from(i32::MAX) {
                    return Err(invalid("above 2147483647"));
                }
            }
            "cleanup.policy" => {
                self.cleanup_policy = CleanupPolicy::parse(value)
                    .ok_or_else(|| invalid("expected `delete`, `compact` or `compact,delete`"))?
            }
            "delete.retention.ms" => self.delete_retention_ms = int(0)?,
            "min.cleanable.dirty.ratio" => {
                let ratio: f64 = value.trim().parse().map_err(|_| invalid("not a number"))?;
                if !(0.0..=1.0).contains(&ratio) {
                    return Err(invalid("not between 0 and 1"));
                }
                self.min_cleanable_dirty_ratio = ratio
            }
            "min.compaction.lag.ms" => self.min_compaction_lag_ms = int(0)?,
            "max.compaction.lag.ms" => self.max_compaction_lag_ms = int(1)?,
            "flush.messages" => self.flush_messages = int(1)?,
            "flush.ms" => self.flush_ms = int(0)?,
            "index.interval.bytes" => {
                self.index_interval_bytes =
                    u32::try_from(int(0)?).map_err(|_| invalid("too large"))?
            }
            "max.message.bytes" => {
                self.max_message_bytes = i32::try_from(int(0)?).map_err(|_| invalid("too large"))?
            }
            "retention.bytes" => self.retention_bytes = int(-1)?,
            "retention.ms" => self.retention_ms = int(-1)?,
            "segment.bytes" => {
                // Positions in the offset index are u32; Kafka caps segment.bytes at i32::MAX too.
                let n = int(128)?;
                if n > i64::from(i32::MAX) {
                    return Err(invalid("above 2147483647"));
                }
                self.segment_bytes = n.unsigned_abs()
            }
            "segment.ms" => self.segment_ms = int(1)?,
            _ => {
                let Some((name, _, kind)) = INERT_TOPIC_CONFIGS.iter().find(|(n, ..)| *n == name)
                else {
                    return Err(TopicConfigError::Unknown(name.to_owned()));
                };
                kind.check(name, value).map_err(invalid)?;
                self.inert.insert(name, value.trim().to_owned());
            }
        }
        Ok(())
    }

    /// The value of a topic property as Kafka would show it.
    pub(crate) fn value_of(&self, name: &str) -> Option<String> {
        Some(match name {
            "compression.type" => compression_name(self.compression).to_owned(),
            "message.timestamp.type" => if self.log_append_time {
                "LogAppendTime"
            } else {
                "CreateTime"
            }
            .to_owned(),
            "min.insync.replicas" => self.min_insync_replicas.to_string(),
            "cleanup.policy" => self.cleanup_policy.to_string(),
            "delete.retention.ms" => self.delete_retention_ms.to_string(),
            "min.cleanable.dirty.ratio" => self.min_cleanable_dirty_ratio.to_string(),
            "min.compaction.lag.ms" => self.min_compaction_lag_ms.to_string(),
            "max.compaction.lag.ms" => self.max_compaction_lag_ms.to_string(),
            "flush.messages" => self.flush_messages.to_string(),
            "flush.ms" => self.flush_ms.to_string(),
            "index.interval.bytes" => self.index_interval_bytes.to_string(),
            "max.message.bytes" => self.max_message_bytes.to_string(),
            "retention.bytes" => self.retention_bytes.to_string(),
            "retention.ms" => self.retention_ms.to_string(),
            "segment.bytes" => self.segment_bytes.to_string(),
            "segment.ms" => self.segment_ms.to_string(),
            _ => {
                let (name, default, _) = INERT_TOPIC_CONFIGS.iter().find(|(n, ..)| *n == name)?;
                self.inert
                    .get(name)
                    .cloned()
                    .unwrap_or_else(|| (*default).to_owned())
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_replace_broker_defaults_and_bad_values_are_refused() {
        let broker = BrokerConfig::default();
        let mut overrides = BTreeMap::new();
        overrides.insert("retention.ms".to_owned(), "1000".to_owned());
        let config = LogConfig::resolve(&broker, &overrides).unwrap();
        assert_eq!(config.retention_ms, 1000);
        assert_eq!(config.segment_bytes, 1 << 30);
        overrides.insert("segment.bytes".to_owned(), "lots".to_owned());
        assert!(LogConfig::resolve(&broker, &overrides).is_err());
        overrides.remove("segment.bytes");
        overrides.insert("cleanup.policy".to_owned(), "compact,delete".to_owned());
        let config = LogConfig::resolve(&broker, &overrides).unwrap();
        assert!(config.cleanup_policy.compact && config.cleanup_policy.delete);
        assert_eq!(config.value_of("cleanup.policy").unwrap(), "compact,delete");
        overrides.insert("cleanup.policy".to_owned(), "shred".to_owned());
        assert!(LogConfig::resolve(&broker, &overrides).is_err());
        overrides.insert("cleanup.policy".to_owned(), "compact".to_owned());
        overrides.insert("min.cleanable.dirty.ratio".to_owned(), "1.5".to_owned());
        assert!(LogConfig::resolve(&broker, &overrides).is_err());
    }
}
