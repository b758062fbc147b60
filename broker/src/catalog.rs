//! Broker metadata in SQLite (`<data_dir>/metadata.sqlite`): the cluster id, topics with their
//! ids and partition counts, topic config overrides, consumer groups and their committed
//! offsets. Later: producer ids and transaction state, as more tables here.
//!
//! | table | row | written |
//! |---|---|---|
//! | `groups` | group id, protocol type, generation, when it entered its state (ms) | at the end of every join phase |
//! | `group_offsets` | group, topic, partition, offset, leader epoch, metadata, commit time (ms) | by OffsetCommit, one transaction per request |
//!
//! A committed offset names an existing topic (a foreign key), so deleting a topic deletes the
//! offsets committed for it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, params};
use uuid::Uuid;

/// A metadata database failure.
#[derive(Debug, thiserror::Error)]
#[error("metadata database {path}: cannot {action}: {source}")]
pub struct CatalogError {
    path: PathBuf,
    action: &'static str,
    source: rusqlite::Error,
}

/// A topic as stored.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TopicRecord {
    pub(crate) name: String,
    pub(crate) id: Uuid,
    pub(crate) partitions: i32,
    pub(crate) configs: BTreeMap<String, String>,
}

/// The metadata database.
pub(crate) struct Catalog {
    path: PathBuf,
    conn: Mutex<Connection>,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS cluster (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS topics (
    name TEXT PRIMARY KEY,
    topic_id BLOB NOT NULL,
    partitions INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS topic_configs (
    topic TEXT NOT NULL REFERENCES topics(name) ON DELETE CASCADE,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (topic, key)
);
CREATE TABLE IF NOT EXISTS groups (
    group_id TEXT PRIMARY KEY,
    protocol_type TEXT NOT NULL,
    generation INTEGER NOT NULL,
    state_timestamp INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS group_offsets (
    group_id TEXT NOT NULL,
    topic TEXT NOT NULL REFERENCES topics(name) ON DELETE CASCADE,
    partition INTEGER NOT NULL,
    committed_offset INTEGER NOT NULL,
    leader_epoch INTEGER NOT NULL,
    metadata TEXT,
    commit_timestamp INTEGER NOT NULL,
    PRIMARY KEY (group_id, topic, partition)
);
CREATE INDEX IF NOT EXISTS group_offsets_by_topic ON group_offsets (topic);
";

/// A group as stored: what survives a restart besides its offsets.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GroupRecord {
    pub(crate) group_id: String,
    pub(crate) protocol_type: String,
    pub(crate) generation: i32,
    /// Wall-clock ms when the group entered its current state.
    pub(crate) state_timestamp: i64,
}

/// One committed offset.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CommittedOffset {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) leader_epoch: i32,
    pub(crate) metadata: Option<String>,
    /// Wall-clock ms of the commit.
    pub(crate) commit_timestamp: i64,
}

impl Catalog {
    /// Opens or creates the database in `data_dir`.
    pub(crate) fn open(data_dir: &Path) -> Result<Catalog, CatalogError> {
        let path = data_dir.join("metadata.sqlite");
        let err = |action| {
            let path = path.clone();
            move |source| CatalogError {
                path,
                action,
                source,
            }
        };
        let conn = Connection::open(&path).map_err(err("open"))?;
        conn.execute_batch("PRAGMA journal_mode=WAL; PRAGMA foreign_keys=ON;")
            .map_err(err("configure"))?;
        conn.execute_batch(SCHEMA)
            .map_err(err("create the schema"))?;
        Ok(Catalog {
            path,
            conn: Mutex::new(conn),
        })
    }

    fn with<T>(
        &self,
        action: &'static str,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>,
    ) -> Result<T, CatalogError> {
        let mut conn = self
            .conn
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&mut conn).map_err(|source| CatalogError {
            path: self.path.clone(),
            action,
            source,
        })
    }

    /// The cluster id, made on first start.
    pub(crate) fn cluster_id(&self) -> Result<String, CatalogError> {
        self.with("read the cluster id", |conn| {
            let existing: Option<String> = conn
                .query_row(
                    "SELECT value FROM cluster WHERE key = 'cluster_id'",
                    [],
                    |r| r.get(0),
                )
                .optional()?;
            if let Some(id) = existing {
                return Ok(id);
            }
            // Kafka cluster ids are 22 characters of URL-safe base64 of a UUID.
            let id: String = Uuid::new_v4()
                .simple()
                .to_string()
                .chars()
                .take(22)
                .collect();
            conn.execute(
                "INSERT INTO cluster (key, value) VALUES ('cluster_id', ?1)",
                [&id],
            )?;
            Ok(id)
        })
    }

    /// All topics.
    pub(crate) fn topics(&self) -> Result<Vec<TopicRecord>, CatalogError> {
        self.with("read topics", |conn| {
            let mut topics = Vec::new();
            let mut stmt =
                conn.prepare("SELECT name, topic_id, partitions FROM topics ORDER BY name")?;
            let rows = stmt.query_map([], |r| {
                let id: Vec<u8> = r.get(1)?;
                Ok(TopicRecord {
                    name: r.get(0)?,
                    id: Uuid::from_slice(&id).unwrap_or_default(),
                    partitions: r.get(2)?,
                    configs: BTreeMap::new(),
                })
            })?;
            for row in rows {
                topics.push(row?);
            }
            let mut stmt = conn.prepare("SELECT key, value FROM topic_configs WHERE topic = ?1")?;
            for topic in &mut topics {
                let rows = stmt.query_map([&topic.name], |r| Ok((r.get(0)?, r.get(1)?)))?;
                for row in rows {
                    let (k, v) = row?;
                    topic.configs.insert(k, v);
                }
            }
            Ok(topics)
        })
    }

    /// Stores a new topic.
    pub(crate) fn create_topic(&self, topic: &TopicRecord) -> Result<(), CatalogError> {
        self.with("create a topic", |conn| {
            let tx = conn.transaction()?;
            tx.execute(
                "INSERT INTO topics (name, topic_id, partitions) VALUES (?1, ?2, ?3)",
                params![topic.name, topic.id.as_bytes().as_slice(), topic.partitions],
            )?;
            for (k, v) in &topic.configs {
                tx.execute(
                    "INSERT INTO topic_configs (topic, key, value) VALUES (?1, ?2, ?3)",
                    params![topic.name, k, v],
                )?;
            }
            tx.commit()
        })
    }

    /// Forgets a topic and its configs.
    pub(crate) fn delete_topic(&self, name: &str) -> Result<(), CatalogError> {
        self.with("delete a topic", |conn| {
            conn.execute("DELETE FROM topics WHERE name = ?1", [name])
                .map(|_| ())
        })
    }

    /// Records a topic's new partition count.
    pub(crate) fn set_partitions(&self, name: &str, partitions: i32) -> Result<(), CatalogError> {
        self.with("change a partition count", |conn| {
            conn.execute(
                "UPDATE topics SET partitions = ?2 WHERE name = ?1",
                params![name, partitions],
            )
            .map(|_| ())
        })
    }

    /// Replaces a topic's config overrides.
    pub(crate) fn set_configs(
        &self,
        name: &str,
        configs: &BTreeMap<String, String>,
    ) -> Result<(), CatalogError> {
        self.with("change topic configs", |conn| {
            let tx = conn.transaction()?;
            tx.execute("DELETE FROM topic_configs WHERE topic = ?1", [name])?;
            for (k, v) in configs {
                tx.execute(
                    "INSERT INTO topic_configs (topic, key, value) VALUES (?1, ?2, ?3)",
                    params![name, k, v],
                )?;
            }
            tx.commit()
        })
    }

    /// Every stored group, and every group that only has committed offsets (with an empty
    /// protocol type and generation 0, as a standalone consumer's group).
    pub(crate) fn groups(&self) -> Result<Vec<GroupRecord>, CatalogError> {
        self.with("read groups", |conn| {
            let mut stmt = conn.prepare(
                "SELECT group_id, protocol_type, generation, state_timestamp FROM groups
                 UNION ALL
                 SELECT group_id, '', 0, MAX(commit_timestamp) FROM group_offsets
                 WHERE group_id NOT IN (SELECT group_id FROM groups) GROUP BY group_id",
            )?;
            let rows = stmt.query_map([], |r| {
                Ok(GroupRecord {
                    group_id: r.get(0)?,
                    protocol_type: r.get(1)?,
                    generation: r.get(2)?,
                    state_timestamp: r.get(3)?,
                })
            })?;
            rows.collect()
        })
    }

    /// Records a group's generation (at the end of each join phase).
    pub(crate) fn save_group(&self, group: &GroupRecord) -> Result<(), CatalogError> {
        self.with("save a group", |conn| {
            conn.execute(
                "INSERT INTO groups (group_id, protocol_type, generation, state_timestamp)
                 VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (group_id) DO UPDATE SET protocol_type = ?2, generation = ?3,
                 state_timestamp = ?4",
                params![
                    group.group_id,
                    group.protocol_type,
                    group.generation,
                    group.state_timestamp
                ],
            )
            .map(|_| ())
        })
    }

    /// Forgets a group and its offsets.
    pub(crate) fn delete_group(&self, group_id: &str) -> Result<(), CatalogError> {
        self.with("delete a group", |conn| {
            let tx = conn.transaction()?;
            tx.execute("DELETE FROM group_offsets WHERE group_id = ?1", [group_id])?;
            tx.execute("DELETE FROM groups WHERE group_id = ?1", [group_id])?;
            tx.commit()
        })
    }

    /// Stores committed offsets of a group, all or none.
    pub(crate) fn commit_offsets(
        &self,
        group_id: &str,
        offsets: &[CommittedOffset],
    ) -> Result<(), CatalogError> {
        self.with("commit offsets", |conn| {
            let tx = conn.transaction()?;
            {
                let mut stmt = tx.prepare_cached(
                    "INSERT INTO group_offsets (group_id, topic, partition, committed_offset,
                     leader_epoch, metadata, commit_timestamp) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                     ON CONFLICT (group_id, topic, partition) DO UPDATE SET
                     committed_offset = ?4, leader_epoch = ?5, metadata = ?6, commit_timestamp = ?7",
                )?;
                for o in offsets {
                    stmt.execute(params![
                        group_id,
                        o.topic,
                        o.partition,
                        o.offset,
                        o.leader_epoch,
                        o.metadata,
                        o.commit_timestamp
                    ])?;
                }
            }
            tx.commit()
        })
    }

    /// A group's committed offsets, sorted by topic and partition.
    pub(crate) fn offsets(&self, group_id: &str) -> Result<Vec<CommittedOffset>, CatalogError> {
        self.with("read committed offsets", |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT topic, partition, committed_offset, leader_epoch, metadata, commit_timestamp
                 FROM group_offsets WHERE group_id = ?1 ORDER BY topic, partition",
            )?;
            let rows = stmt.query_map([group_id], |r| {
                Ok(CommittedOffset {
                    topic: r.get(0)?,
                    partition: r.get(1)?,
                    offset: r.get(2)?,
                    leader_epoch: r.get(3)?,
                    metadata: r.get(4)?,
                    commit_timestamp: r.get(5)?,
                })
            })?;
            rows.collect()
        })
    }

    /// Deletes some committed offsets of a group.
    pub(crate) fn delete_offsets(
        &self,
        group_id: &str,
        partitions: &[(String, i32)],
    ) -> Result<(), CatalogError> {
        self.with("delete committed offsets", |conn| {
            let tx = conn.transaction()?;
            {
                let mut stmt = tx.prepare_cached(
                    "DELETE FROM group_offsets WHERE group_id = ?1 AND topic = ?2 AND partition = ?3",
                )?;
                for (topic, partition) in partitions {
                    stmt.execute(params![group_id, topic, partition])?;
                }
            }
            tx.commit()
        })
    }

    /// Deletes a group's offsets committed before `cutoff_ms`; returns how many went.
    pub(crate) fn delete_offsets_before(
        &self,
        group_id: &str,
        cutoff_ms: i64,
    ) -> Result<usize, CatalogError> {
        self.with("expire committed offsets", |conn| {
            conn.execute(
                "DELETE FROM group_offsets WHERE group_id = ?1 AND commit_timestamp < ?2",
                params![group_id, cutoff_ms],
            )
        })
    }
}
