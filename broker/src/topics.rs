//! The topics this broker hosts: their partitions' logs, kept in step with the catalog.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use kafka_protocol::ResponseError;
use uuid::Uuid;

use crate::catalog::{Catalog, CatalogError, TopicRecord};
use crate::config::BrokerConfig;
use crate::limits::Limits;
use crate::log::{PartitionLog, StorageError};
use crate::stats::TopicCounters;
use crate::topic_config::{LogConfig, TopicConfigError};

/// Why a topic operation failed; each maps to a Kafka error code.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TopicError {
    #[error("topic `{0}` already exists")]
    AlreadyExists(String),
    #[error("topic `{0}` does not exist")]
    Unknown(String),
    #[error("topic name `{0}` is not valid: {1}")]
    InvalidName(String, &'static str),
    #[error("topic `{0}`: {1}")]
    InvalidPartitions(String, String),
    #[error("replication factor {0} is not possible on a single broker")]
    InvalidReplicationFactor(i16),
    #[error(transparent)]
    InvalidConfig(#[from] TopicConfigError),
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// A limit of the broker's (partitions, file descriptors) would be passed.
    #[error("topic `{0}`: {1}")]
    Limit(String, String),
}

impl TopicError {
    /// The Kafka error this becomes on the wire.
    pub(crate) fn response_error(&self) -> ResponseError {
        match self {
            TopicError::AlreadyExists(_) => ResponseError::TopicAlreadyExists,
            TopicError::Unknown(_) => ResponseError::UnknownTopicOrPartition,
            TopicError::InvalidName(..) => ResponseError::InvalidTopicException,
            TopicError::InvalidPartitions(..) => ResponseError::InvalidPartitions,
            TopicError::InvalidReplicationFactor(_) => ResponseError::InvalidReplicationFactor,
            TopicError::InvalidConfig(_) => ResponseError::InvalidConfig,
            TopicError::Storage(_) => ResponseError::KafkaStorageError,
            TopicError::Catalog(e) => e.response_error(),
            TopicError::Limit(..) => ResponseError::PolicyViolation,
        }
    }
}

/// One partition: its log behind a lock held only for an append or a read.
pub(crate) struct Partition {
    pub(crate) index: i32,
    log: Mutex<PartitionLog>,
}

impl Partition {
    /// Exclusive access to the log.
    pub(crate) fn log(&self) -> MutexGuard<'_, PartitionLog> {
        // A panic while holding the lock cannot leave the log half-updated in memory in a way
        // that matters more than refusing service, so poisoning is ignored.
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A topic and its partitions.
pub(crate) struct Topic {
    pub(crate) name: String,
    pub(crate) id: Uuid,
    pub(crate) partitions: Vec<Arc<Partition>>,
    pub(crate) configs: BTreeMap<String, String>,
    /// Its traffic; the same counters across partition additions and config changes.
    pub(crate) counters: Arc<TopicCounters>,
}

impl Topic {
    /// The partition with this index.
    pub(crate) fn partition(&self, index: i32) -> Option<&Arc<Partition>> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.partitions.get(i))
    }
}

/// Topics by name and by id (Fetch v13+ and Produce v13+ name topics by id).
#[derive(Default)]
struct Registry {
    by_name: HashMap<String, Arc<Topic>>,
    by_id: HashMap<Uuid, String>,
}

impl Registry {
    fn get(&self, name: &str) -> Option<&Arc<Topic>> {
        self.by_name.get(name)
    }

    fn by_id(&self, id: Uuid) -> Option<Arc<Topic>> {
        self.by_id
            .get(&id)
            .and_then(|name| self.by_name.get(name))
            .cloned()
    }

    fn contains_key(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    fn values(&self) -> impl Iterator<Item = &Arc<Topic>> {
        self.by_name.values()
    }

    fn insert(&mut self, name: String, topic: Arc<Topic>) {
        self.by_id.insert(topic.id, name.clone());
        self.by_name.insert(name, topic);
    }

    fn remove(&mut self, name: &str) -> Option<Arc<Topic>> {
        let topic = self.by_name.remove(name)?;
        self.by_id.remove(&topic.id);
        Some(topic)
    }
}

/// All topics, by name.
pub(crate) struct Topics {
    broker: BrokerConfig,
    catalog: Arc<Catalog>,
    topics: RwLock<Registry>,
    limits: Arc<Limits>,
}

/// Kafka's rule for topic names.
pub(crate) fn validate_name(name: &str) -> Result<(), TopicError> {
    let invalid = |why| Err(TopicError::InvalidName(name.to_owned(), why));
    if name.is_empty() {
        return invalid("empty");
    }
    if name == "." || name == ".." {
        return invalid("`.` and `..` are reserved");
    }
    if name.len() > 249 {
        return invalid("longer than 249 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        return invalid("only ASCII letters, digits, `.`, `_` and `-` are allowed");
    }
    Ok(())
}

impl Topics {
    /// Opens every topic in the catalog, recovering their logs (see [`PartitionLog::open`]).
    pub(crate) fn open(
        broker: BrokerConfig,
        catalog: Catalog,
        clean_shutdown: bool,
        limits: Arc<Limits>,
    ) -> Result<Topics, TopicError> {
        let mut topics = Registry::default();
        for record in catalog.topics()? {
            let config = LogConfig::resolve(&broker, &record.configs)?;
            let mut partitions = Vec::new();
            for index in 0..record.partitions {
                partitions.push(open_partition(
                    &broker,
                    &record.name,
                    index,
                    config.clone(),
                    clean_shutdown,
                )?);
            }
            let topic = Topic {
                name: record.name.clone(),
                id: record.id,
                partitions,
                configs: record.configs,
                counters: Arc::default(),
            };
            topics.insert(record.name, Arc::new(topic));
        }
        Ok(Topics {
            broker,
            catalog: Arc::new(catalog),
            topics: RwLock::new(topics),
            limits,
        })
    }

    /// Checks that `adding` partitions more fit the broker's limits, the topic growing to
    /// `topic_total`; `registry` is the locked registry, so that two creations cannot both
    /// pass the check with room for one.
    fn check_room(
        &self,
        registry: &Registry,
        name: &str,
        adding: i32,
        topic_total: i32,
    ) -> Result<(), TopicError> {
        let hosted: usize = registry.values().map(|t| t.partitions.len()).sum();
        self.limits
            .check_partitions(hosted as u64, adding as u64, topic_total as u64)
            .map_err(|why| TopicError::Limit(name.to_owned(), why))
    }

    /// Opens partitions `range` of a new or growing topic; when one fails, the directories of
    /// those already made are removed again, so a refusal leaves nothing behind.
    fn open_new_partitions(
        &self,
        name: &str,
        range: std::ops::Range<i32>,
        config: &LogConfig,
    ) -> Result<Vec<Arc<Partition>>, TopicError> {
        let mut opened = Vec::new();
        for index in range.clone() {
            let result = remove_stale_dir(&self.broker, name, index)
                .and_then(|()| open_partition(&self.broker, name, index, config.clone(), true));
            match result {
                Ok(partition) => opened.push(partition),
                Err(e) => {
                    drop(opened);
                    self.remove_partition_dirs(name, range.start..index + 1);
                    return Err(e);
                }
            }
        }
        Ok(opened)
    }

    /// Removes what partitions `range` of `name` left on disk, after a failed creation.
    fn remove_partition_dirs(&self, name: &str, range: std::ops::Range<i32>) {
        for index in range {
            let dir = partition_dir(&self.broker, name, index);
            if let Err(e) = std::fs::remove_dir_all(&dir)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::error!(dir = %dir.display(), error = %e, "cannot remove the directory of a partition whose creation failed");
            }
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, Registry> {
        self.topics.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Registry> {
        self.topics.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The broker settings topics default to.
    pub(crate) fn broker_config(&self) -> &BrokerConfig {
        &self.broker
    }

    /// The metadata database, shared with the group coordinator.
    pub(crate) fn catalog(&self) -> Arc<Catalog> {
        Arc::clone(&self.catalog)
    }

    /// The topic named `name`.
    pub(crate) fn get(&self, name: &str) -> Option<Arc<Topic>> {
        self.read().get(name).cloned()
    }

    /// The topic with this id.
    pub(crate) fn get_by_id(&self, id: Uuid) -> Option<Arc<Topic>> {
        self.read().by_id(id)
    }

    /// All topics, sorted by name.
    pub(crate) fn all(&self) -> Vec<Arc<Topic>> {
        let mut all: Vec<_> = self.read().values().cloned().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// The topic, created with `num.partitions` first when auto-creation is on and `allow`ed.
    pub(crate) fn get_or_create(&self, name: &str, allow: bool) -> Result<Arc<Topic>, TopicError> {
        if let Some(topic) = self.get(name) {
            return Ok(topic);
        }
        if !(allow && self.broker.auto_create_topics_enable) {
            return Err(TopicError::Unknown(name.to_owned()));
        }
        match self.create(name, self.broker.num_partitions, -1, BTreeMap::new(), false) {
            Ok(topic) => {
                tracing::info!(
                    topic = name,
                    partitions = topic.partitions.len(),
                    "auto-created topic"
                );
                Ok(topic)
            }
            // Another connection created it meanwhile.
            Err(TopicError::AlreadyExists(_)) => self
                .get(name)
                .ok_or_else(|| TopicError::Unknown(name.to_owned())),
            Err(e) => Err(e),
        }
    }

    /// Creates a topic (or only checks that it could be, with `validate_only`).
    pub(crate) fn create(
        &self,
        name: &str,
        partitions: i32,
        replication_factor: i16,
        configs: BTreeMap<String, String>,
        validate_only: bool,
    ) -> Result<Arc<Topic>, TopicError> {
        validate_name(name)?;
        let partitions = if partitions == -1 {
            self.broker.num_partitions
        } else {
            partitions
        };
        if partitions < 1 {
            return Err(TopicError::InvalidPartitions(
                name.to_owned(),
                format!("{partitions} partitions requested, at least 1 is needed"),
            ));
        }
        if replication_factor != -1 && replication_factor != 1 {
            return Err(TopicError::InvalidReplicationFactor(replication_factor));
        }
        let config = LogConfig::resolve(&self.broker, &configs)?;
        let mut topics = self.write();
        if topics.contains_key(name) {
            return Err(TopicError::AlreadyExists(name.to_owned()));
        }
        self.check_room(&topics, name, partitions, partitions)?;
        let record = TopicRecord {
            name: name.to_owned(),
            id: Uuid::new_v4(),
            partitions,
            configs,
        };
        let mut parts = Vec::new();
        if !validate_only {
            parts = self.open_new_partitions(name, 0..partitions, &config)?;
            if let Err(e) = self.catalog.create_topic(&record) {
                drop(parts);
                self.remove_partition_dirs(name, 0..partitions);
                return Err(e.into());
            }
        }
        let topic = Arc::new(Topic {
            name: record.name,
            id: record.id,
            partitions: parts,
            configs: record.configs,
            counters: Arc::default(),
        });
        if !validate_only {
            topics.insert(name.to_owned(), Arc::clone(&topic));
        }
        Ok(topic)
    }

    /// Deletes a topic and its logs.
    pub(crate) fn delete(&self, name: &str) -> Result<Arc<Topic>, TopicError> {
        let topic = self
            .write()
            .remove(name)
            .ok_or_else(|| TopicError::Unknown(name.to_owned()))?;
        self.catalog.delete_topic(name)?;
        for partition in &topic.partitions {
            let dir = partition_dir(&self.broker, name, partition.index);
            // Readers holding the partition keep their open files; the names go now.
            if let Err(source) = std::fs::remove_dir_all(&dir)
                && source.kind() != std::io::ErrorKind::NotFound
            {
                return Err(StorageError::Io {
                    path: dir,
                    action: "delete",
                    source,
                }
                .into());
            }
        }
        tracing::info!(topic = name, "deleted topic");
        Ok(topic)
    }

    /// Grows a topic to `count` partitions.
    pub(crate) fn add_partitions(
        &self,
        name: &str,
        count: i32,
        validate_only: bool,
    ) -> Result<(), TopicError> {
        let mut topics = self.write();
        let topic = topics
            .get(name)
            .cloned()
            .ok_or_else(|| TopicError::Unknown(name.to_owned()))?;
        let current = topic.partitions.len() as i32;
        if count <= current {
            return Err(TopicError::InvalidPartitions(
                name.to_owned(),
                format!("topic has {current} partitions; the count can only grow"),
            ));
        }
        self.check_room(&topics, name, count - current, count)?;
        if validate_only {
            return Ok(());
        }
        let config = LogConfig::resolve(&self.broker, &topic.configs)?;
        let mut partitions = topic.partitions.clone();
        partitions.extend(self.open_new_partitions(name, current..count, &config)?);
        if let Err(e) = self.catalog.set_partitions(name, count) {
            drop(partitions);
            self.remove_partition_dirs(name, current..count);
            return Err(e.into());
        }
        let grown = Topic {
            name: topic.name.clone(),
            id: topic.id,
            partitions,
            configs: topic.configs.clone(),
            counters: Arc::clone(&topic.counters),
        };
        topics.insert(name.to_owned(), Arc::new(grown));
        Ok(())
    }

    /// Replaces a topic's config overrides, applying them to its partitions at once.
    pub(crate) fn set_configs(
        &self,
        name: &str,
        configs: BTreeMap<String, String>,
        validate_only: bool,
    ) -> Result<(), TopicError> {
        let config = LogConfig::resolve(&self.broker, &configs)?;
        let mut topics = self.write();
        let topic = topics
            .get(name)
            .cloned()
            .ok_or_else(|| TopicError::Unknown(name.to_owned()))?;
        if validate_only {
            return Ok(());
        }
        self.catalog.set_configs(name, &configs)?;
        for partition in &topic.partitions {
            partition.log().set_config(config.clone());
        }
        let changed = Topic {
            name: topic.name.clone(),
            id: topic.id,
            partitions: topic.partitions.clone(),
            configs,
            counters: Arc::clone(&topic.counters),
        };
        topics.insert(name.to_owned(), Arc::new(changed));
        Ok(())
    }

    /// Applies retention to every partition.
    pub(crate) fn enforce_retention(&self) {
        let now = crate::log::now_ms();
        for topic in self.all() {
            for partition in &topic.partitions {
                if let Err(e) = partition.log().enforce_retention(now) {
                    tracing::error!(topic = %topic.name, partition = partition.index, error = %e, "retention failed");
                }
            }
        }
    }

    /// Fsyncs the partitions whose `flush.ms` has passed with records waiting, and the
    /// segments that rolled since the last look (moving the recovery point).
    /// Closes the segment files nobody read or wrote for `log_files_idle_close_ms`.
    pub(crate) fn close_idle_files(&self) {
        let idle = std::time::Duration::from_millis(self.broker.log_files_idle_close_ms);
        let mut closed = 0;
        for topic in self.all() {
            for partition in &topic.partitions {
                closed += partition.log().close_idle_files(idle);
            }
        }
        if closed > 0 {
            tracing::debug!(segments = closed, "closed the files of idle segments");
        }
    }

    pub(crate) fn flush_due(&self) {
        for topic in self.all() {
            for partition in &topic.partitions {
                if let Err(e) = partition.log().flush_if_due() {
                    tracing::error!(topic = %topic.name, partition = partition.index, error = %e, "flush failed");
                }
                if let Err(e) = crate::log::sync_finished_segments(|| partition.log()) {
                    tracing::error!(topic = %topic.name, partition = partition.index, error = %e, "fsync of finished segments failed");
                }
            }
        }
    }

    /// Fsyncs every partition and snapshots its producer state (on shutdown, so the next start
    /// replays nothing); false when any failed.
    pub(crate) fn flush_all(&self) -> bool {
        let mut all_flushed = true;
        for topic in self.all() {
            for partition in &topic.partitions {
                let mut log = partition.log();
                if let Err(e) = log.flush().and_then(|()| log.write_snapshot()) {
                    tracing::error!(topic = %topic.name, partition = partition.index, error = %e, "flush failed");
                    all_flushed = false;
                }
            }
        }
        all_flushed
    }
}

/// A directory left by a topic of the same name whose deletion was interrupted must not
/// lend its records to the new topic.
fn remove_stale_dir(broker: &BrokerConfig, topic: &str, index: i32) -> Result<(), TopicError> {
    let dir = partition_dir(broker, topic, index);
    if dir.exists() {
        tracing::warn!(dir = %dir.display(), "removing a partition directory left by a deleted topic");
        std::fs::remove_dir_all(&dir).map_err(|source| StorageError::Io {
            path: dir,
            action: "delete",
            source,
        })?;
    }
    Ok(())
}

fn partition_dir(broker: &BrokerConfig, topic: &str, index: i32) -> PathBuf {
    broker.data_dir.join(format!("{topic}-{index}"))
}

fn open_partition(
    broker: &BrokerConfig,
    topic: &str,
    index: i32,
    config: LogConfig,
    clean_shutdown: bool,
) -> Result<Arc<Partition>, TopicError> {
    let dir = partition_dir(broker, topic, index);
    let log = PartitionLog::open(&dir, format!("{topic}-{index}"), config, clean_shutdown)?;
    Ok(Arc::new(Partition {
        index,
        log: Mutex::new(log),
    }))
}
