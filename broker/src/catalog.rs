//! Broker metadata in SQLite (`<data_dir>/metadata.sqlite`): the cluster id, topics with their
//! ids and partition counts, and topic config overrides. Later: committed group offsets,
//! producer ids and transaction state, as more tables here.

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
";

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
}
