//! Broker metadata in SQLite (`<data_dir>/metadata.sqlite`): the cluster id, topics with their
//! ids and partition counts, topic config overrides, consumer groups and their committed
//! offsets, producer ids and transaction state.
//!
//! | table | row | written |
//! |---|---|---|
//! | `groups` | group id, protocol type, generation, when it entered its state (ms) | at the end of every join phase |
//! | `group_offsets` | group, topic, partition, offset, leader epoch, metadata, commit time (ms) | by OffsetCommit, one transaction per request; by a committing transaction |
//! | `producer_ids` | the next producer id to hand out (one row) | by every InitProducerId that needs a new id, before answering |
//! | `transactions` | transactional id, producer id and epoch, the previous ones, timeout, state, start and last update time (ms) | at every state change of the transaction coordinator, before answering |
//! | `txn_partitions` | transactional id, topic, partition | with its transaction: the partitions of the open transaction |
//! | `txn_groups` | transactional id, group | with its transaction: the groups of AddOffsetsToTxn |
//! | `scram_credentials` | user, mechanism, salt, iterations, stored key, server key (never a password) | by AlterUserScramCredentials |
//! | `txn_pending_offsets` | transactional id, group, topic, partition, offset, leader epoch, metadata, commit time (ms) | by TxnOffsetCommit; moved into `group_offsets` (commit) or deleted (abort) in the transaction that records the outcome |
//! | `acls` | resource type, name and pattern type, principal, host, operation, permission type (Kafka's protocol codes) | by CreateAcls and DeleteAcls, one transaction per request; the config's `acls` at start |
//!
//! A committed or pending offset names an existing topic (a foreign key), so deleting a topic
//! deletes the offsets committed for it. Every committed offset is also kept in memory
//! ([`Catalog::committed_offsets`]), updated with each write that changes one, so the broker's
//! metrics read group lag without a query. Producer ids only grow: an id is never handed out twice,
//! across restarts included.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, params};
use uuid::Uuid;

use crate::security::scram::{ScramCredential, ScramMechanism};
use crate::security::{AclBinding, AclOperation, AclPermissionType, PatternType, ResourceType};

/// A metadata database failure.
#[derive(Debug, thiserror::Error)]
#[error("metadata database {path}: cannot {action}: {source}")]
pub struct CatalogError {
    path: PathBuf,
    action: &'static str,
    source: rusqlite::Error,
}

impl CatalogError {
    /// Whether the disk is the cause (full, failing, read-only, gone), rather than the data.
    pub(crate) fn is_storage(&self) -> bool {
        use rusqlite::ErrorCode::*;
        matches!(
            self.source.sqlite_error_code(),
            Some(
                DiskFull | SystemIoFailure | CannotOpen | ReadOnly | DatabaseCorrupt | NotADatabase
            )
        )
    }

    /// The Kafka error a request failing on this answers: KAFKA_STORAGE_ERROR when the disk
    /// is the cause, UNKNOWN_SERVER_ERROR otherwise.
    pub(crate) fn response_error(&self) -> kafka_protocol::ResponseError {
        if self.is_storage() {
            kafka_protocol::ResponseError::KafkaStorageError
        } else {
            kafka_protocol::ResponseError::UnknownServerError
        }
    }
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
    /// The committed offsets of `group_offsets`: group → (topic, partition) → offset.
    committed: Mutex<GroupOffsets>,
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
CREATE TABLE IF NOT EXISTS producer_ids (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 0),
    next_id INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS transactions (
    transactional_id TEXT PRIMARY KEY,
    producer_id INTEGER NOT NULL,
    last_producer_id INTEGER NOT NULL,
    producer_epoch INTEGER NOT NULL,
    last_producer_epoch INTEGER NOT NULL,
    timeout_ms INTEGER NOT NULL,
    state TEXT NOT NULL,
    start_ms INTEGER NOT NULL,
    last_update_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS txn_partitions (
    transactional_id TEXT NOT NULL REFERENCES transactions(transactional_id) ON DELETE CASCADE,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    PRIMARY KEY (transactional_id, topic, partition)
);
CREATE TABLE IF NOT EXISTS txn_groups (
    transactional_id TEXT NOT NULL REFERENCES transactions(transactional_id) ON DELETE CASCADE,
    group_id TEXT NOT NULL,
    PRIMARY KEY (transactional_id, group_id)
);
CREATE TABLE IF NOT EXISTS txn_pending_offsets (
    transactional_id TEXT NOT NULL REFERENCES transactions(transactional_id) ON DELETE CASCADE,
    group_id TEXT NOT NULL,
    topic TEXT NOT NULL REFERENCES topics(name) ON DELETE CASCADE,
    partition INTEGER NOT NULL,
    committed_offset INTEGER NOT NULL,
    leader_epoch INTEGER NOT NULL,
    metadata TEXT,
    commit_timestamp INTEGER NOT NULL,
    PRIMARY KEY (transactional_id, group_id, topic, partition)
);
CREATE INDEX IF NOT EXISTS txn_pending_offsets_by_group ON txn_pending_offsets (group_id);
CREATE TABLE IF NOT EXISTS acls (
    resource_type INTEGER NOT NULL,
    resource_name TEXT NOT NULL,
    pattern_type INTEGER NOT NULL,
    principal TEXT NOT NULL,
    host TEXT NOT NULL,
    operation INTEGER NOT NULL,
    permission_type INTEGER NOT NULL,
    PRIMARY KEY (resource_type, resource_name, pattern_type, principal, host, operation,
                 permission_type)
);
";

/// Committed offsets in memory: group → (topic, partition) → offset.
pub(crate) type GroupOffsets = HashMap<String, BTreeMap<(String, i32), i64>>;

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

/// A transactional id's coordinator state as stored.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TransactionRecord {
    pub(crate) transactional_id: String,
    pub(crate) producer_id: i64,
    pub(crate) last_producer_id: i64,
    pub(crate) producer_epoch: i16,
    pub(crate) last_producer_epoch: i16,
    pub(crate) timeout_ms: i32,
    /// Kafka's name of the state (`Ongoing`, `PrepareCommit`, ...).
    pub(crate) state: String,
    /// Wall-clock ms when the open transaction started; -1 when none is open.
    pub(crate) start_ms: i64,
    /// Wall-clock ms of the last state change.
    pub(crate) last_update_ms: i64,
    pub(crate) partitions: BTreeSet<(String, i32)>,
    pub(crate) groups: BTreeSet<String>,
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
        // WAL with synchronous=NORMAL: a commit survives a crash of the process, and is on
        // disk by the next checkpoint, as the partitions' logs (which are not fsynced per
        // append either). With FULL every offset commit fsynced on the thread serving the
        // request, and on a busy disk the whole broker waited on it.
        conn.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;",
        )
        .map_err(err("configure"))?;
        conn.execute_batch(SCHEMA)
            .map_err(err("create the schema"))?;
        conn.execute_batch(SCRAM_SCHEMA)
            .map_err(err("create the schema"))?;
        let committed = load_committed(&conn).map_err(err("read committed offsets"))?;
        Ok(Catalog {
            path,
            conn: Mutex::new(conn),
            committed: Mutex::new(committed),
        })
    }

    /// Every group's committed offsets, by topic and partition, from memory: no query.
    pub(crate) fn committed_offsets(&self) -> GroupOffsets {
        self.committed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Applies `change` to the in-memory committed offsets, after the write that made it
    /// durable.
    fn mirror(&self, change: impl FnOnce(&mut GroupOffsets)) {
        change(
            &mut self
                .committed
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
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

    /// Forgets a topic and its configs (and, by the foreign keys, its committed offsets).
    pub(crate) fn delete_topic(&self, name: &str) -> Result<(), CatalogError> {
        self.with("delete a topic", |conn| {
            conn.execute("DELETE FROM topics WHERE name = ?1", [name])
                .map(|_| ())
        })?;
        self.mirror(|committed| {
            for offsets in committed.values_mut() {
                offsets.retain(|(topic, _), _| topic != name);
            }
            committed.retain(|_, offsets| !offsets.is_empty());
        });
        Ok(())
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
        })?;
        self.mirror(|committed| {
            committed.remove(group_id);
        });
        Ok(())
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
        })?;
        self.mirror(|committed| {
            let group = committed.entry(group_id.to_owned()).or_default();
            for o in offsets {
                group.insert((o.topic.clone(), o.partition), o.offset);
            }
        });
        Ok(())
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
        })?;
        self.mirror(|committed| {
            if let Some(group) = committed.get_mut(group_id) {
                for (topic, partition) in partitions {
                    group.remove(&(topic.clone(), *partition));
                }
            }
        });
        Ok(())
    }

    /// Deletes a group's offsets committed before `cutoff_ms`; returns how many went.
    pub(crate) fn delete_offsets_before(
        &self,
        group_id: &str,
        cutoff_ms: i64,
    ) -> Result<usize, CatalogError> {
        let (deleted, left) = self.with("expire committed offsets", |conn| {
            let deleted = conn.execute(
                "DELETE FROM group_offsets WHERE group_id = ?1 AND commit_timestamp < ?2",
                params![group_id, cutoff_ms],
            )?;
            Ok((deleted, group_committed(conn, group_id)?))
        })?;
        self.mirror(|committed| {
            committed.insert(group_id.to_owned(), left);
        });
        Ok(deleted)
    }

    /// Hands out a producer id never handed out before (the counter is durable).
    pub(crate) fn next_producer_id(&self) -> Result<i64, CatalogError> {
        self.with("allocate a producer id", |conn| {
            let tx = conn.transaction()?;
            let id: i64 = tx
                .query_row(
                    "SELECT next_id FROM producer_ids WHERE singleton = 0",
                    [],
                    |r| r.get(0),
                )
                .optional()?
                .unwrap_or(0);
            tx.execute(
                "INSERT INTO producer_ids (singleton, next_id) VALUES (0, ?1)
                 ON CONFLICT (singleton) DO UPDATE SET next_id = ?1",
                [id + 1],
            )?;
            tx.commit()?;
            Ok(id)
        })
    }

    /// Every stored transactional id with its partitions and groups.
    pub(crate) fn transactions(&self) -> Result<Vec<TransactionRecord>, CatalogError> {
        self.with("read transactions", |conn| {
            let mut stmt = conn.prepare(
                "SELECT transactional_id, producer_id, last_producer_id, producer_epoch,
                 last_producer_epoch, timeout_ms, state, start_ms, last_update_ms
                 FROM transactions ORDER BY transactional_id",
            )?;
            let rows = stmt.query_map([], |r| {
                Ok(TransactionRecord {
                    transactional_id: r.get(0)?,
                    producer_id: r.get(1)?,
                    last_producer_id: r.get(2)?,
                    producer_epoch: r.get(3)?,
                    last_producer_epoch: r.get(4)?,
                    timeout_ms: r.get(5)?,
                    state: r.get(6)?,
                    start_ms: r.get(7)?,
                    last_update_ms: r.get(8)?,
                    partitions: BTreeSet::new(),
                    groups: BTreeSet::new(),
                })
            })?;
            let mut all = rows.collect::<rusqlite::Result<Vec<_>>>()?;
            let mut partitions = conn.prepare(
                "SELECT topic, partition FROM txn_partitions WHERE transactional_id = ?1",
            )?;
            let mut groups =
                conn.prepare("SELECT group_id FROM txn_groups WHERE transactional_id = ?1")?;
            for txn in &mut all {
                let rows = partitions
                    .query_map([&txn.transactional_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
                txn.partitions = rows.collect::<rusqlite::Result<_>>()?;
                let rows = groups.query_map([&txn.transactional_id], |r| r.get(0))?;
                txn.groups = rows.collect::<rusqlite::Result<_>>()?;
            }
            Ok(all)
        })
    }

    /// Records a transactional id's state, partitions and groups, all or none.
    pub(crate) fn save_transaction(&self, txn: &TransactionRecord) -> Result<(), CatalogError> {
        self.with("save a transaction", |conn| {
            let tx = conn.transaction()?;
            save_transaction(&tx, txn)?;
            tx.commit()
        })
    }

    /// Records a transaction's outcome and, in the same SQLite transaction, makes its pending
    /// offsets committed offsets (`commit`) or drops them.
    pub(crate) fn complete_transaction(
        &self,
        txn: &TransactionRecord,
        commit: bool,
    ) -> Result<usize, CatalogError> {
        let mut applied = Vec::new();
        let moved = self.with("complete a transaction", |conn| {
            let tx = conn.transaction()?;
            if commit {
                let mut stmt = tx.prepare_cached(
                    "SELECT group_id, topic, partition, committed_offset FROM txn_pending_offsets
                     WHERE transactional_id = ?1",
                )?;
                let rows = stmt.query_map([&txn.transactional_id], |r| {
                    Ok((r.get::<_, String>(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                })?;
                applied = rows.collect::<rusqlite::Result<Vec<(String, String, i32, i64)>>>()?;
            }
            let moved = if commit {
                tx.execute(
                    "INSERT INTO group_offsets (group_id, topic, partition, committed_offset,
                     leader_epoch, metadata, commit_timestamp)
                     SELECT group_id, topic, partition, committed_offset, leader_epoch, metadata,
                     commit_timestamp FROM txn_pending_offsets WHERE transactional_id = ?1
                     ON CONFLICT (group_id, topic, partition) DO UPDATE SET
                     committed_offset = excluded.committed_offset,
                     leader_epoch = excluded.leader_epoch, metadata = excluded.metadata,
                     commit_timestamp = excluded.commit_timestamp",
                    [&txn.transactional_id],
                )?
            } else {
                0
            };
            tx.execute(
                "DELETE FROM txn_pending_offsets WHERE transactional_id = ?1",
                [&txn.transactional_id],
            )?;
            save_transaction(&tx, txn)?;
            tx.commit()?;
            Ok(moved)
        })?;
        self.mirror(|committed| {
            for (group, topic, partition, offset) in applied {
                committed
                    .entry(group)
                    .or_default()
                    .insert((topic, partition), offset);
            }
        });
        Ok(moved)
    }

    /// Forgets a transactional id, its partitions, groups and pending offsets.
    pub(crate) fn delete_transaction(&self, transactional_id: &str) -> Result<(), CatalogError> {
        self.with("delete a transaction", |conn| {
            conn.execute(
                "DELETE FROM transactions WHERE transactional_id = ?1",
                [transactional_id],
            )
            .map(|_| ())
        })
    }

    /// Stages offsets of an open transaction for a group; they replace earlier ones of the
    /// same transaction and partition.
    pub(crate) fn stage_txn_offsets(
        &self,
        transactional_id: &str,
        group_id: &str,
        offsets: &[CommittedOffset],
    ) -> Result<(), CatalogError> {
        self.with("stage transactional offsets", |conn| {
            let tx = conn.transaction()?;
            {
                let mut stmt = tx.prepare_cached(
                    "INSERT INTO txn_pending_offsets (transactional_id, group_id, topic,
                     partition, committed_offset, leader_epoch, metadata, commit_timestamp)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                     ON CONFLICT (transactional_id, group_id, topic, partition) DO UPDATE SET
                     committed_offset = ?5, leader_epoch = ?6, metadata = ?7,
                     commit_timestamp = ?8",
                )?;
                for o in offsets {
                    stmt.execute(params![
                        transactional_id,
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

    /// The partitions of a group with offsets staged by an open transaction.
    pub(crate) fn pending_txn_offsets(
        &self,
        group_id: &str,
    ) -> Result<BTreeSet<(String, i32)>, CatalogError> {
        self.with("read pending transactional offsets", |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT DISTINCT topic, partition FROM txn_pending_offsets WHERE group_id = ?1",
            )?;
            let rows = stmt.query_map([group_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
            rows.collect()
        })
    }
}

impl Catalog {
    /// Every stored ACL (rows with codes this version does not know are skipped).
    pub(crate) fn acls(&self) -> Result<Vec<AclBinding>, CatalogError> {
        self.with("read ACLs", |conn| {
            let mut stmt = conn.prepare(
                "SELECT resource_type, resource_name, pattern_type, principal, host, operation,
                 permission_type FROM acls",
            )?;
            let rows = stmt.query_map([], |r| {
                Ok((|| {
                    Some(AclBinding {
                        resource_type: ResourceType::from_code(r.get(0).ok()?)?,
                        resource_name: r.get(1).ok()?,
                        pattern_type: PatternType::from_code(r.get(2).ok()?)?,
                        principal: r.get(3).ok()?,
                        host: r.get(4).ok()?,
                        operation: AclOperation::from_code(r.get(5).ok()?)?,
                        permission_type: AclPermissionType::from_code(r.get(6).ok()?)?,
                    })
                })())
            })?;
            rows.filter_map(Result::transpose).collect()
        })
    }

    /// Stores ACLs, all or none; one already stored is kept once.
    pub(crate) fn add_acls(&self, acls: &[AclBinding]) -> Result<(), CatalogError> {
        self.change_acls(
            "store ACLs",
            "INSERT OR IGNORE INTO acls (resource_type, resource_name,
             pattern_type, principal, host, operation, permission_type)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            acls,
        )
    }

    /// Deletes ACLs, all or none.
    pub(crate) fn delete_acls(&self, acls: &[AclBinding]) -> Result<(), CatalogError> {
        self.change_acls(
            "delete ACLs",
            "DELETE FROM acls WHERE resource_type = ?1 AND
             resource_name = ?2 AND pattern_type = ?3 AND principal = ?4 AND host = ?5 AND
             operation = ?6 AND permission_type = ?7",
            acls,
        )
    }

    /// Runs `sql` for each ACL (its fields as ?1 to ?7) in one transaction.
    fn change_acls(
        &self,
        action: &'static str,
        sql: &str,
        acls: &[AclBinding],
    ) -> Result<(), CatalogError> {
        self.with(action, |conn| {
            let tx = conn.transaction()?;
            {
                let mut stmt = tx.prepare_cached(sql)?;
                for a in acls {
                    stmt.execute(params![
                        a.resource_type.code(),
                        a.resource_name,
                        a.pattern_type.code(),
                        a.principal,
                        a.host,
                        a.operation.code(),
                        a.permission_type.code()
                    ])?;
                }
            }
            tx.commit()
        })
    }
}

fn save_transaction(
    tx: &rusqlite::Transaction<'_>,
    txn: &TransactionRecord,
) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT INTO transactions (transactional_id, producer_id, last_producer_id, producer_epoch,
         last_producer_epoch, timeout_ms, state, start_ms, last_update_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
         ON CONFLICT (transactional_id) DO UPDATE SET producer_id = ?2, last_producer_id = ?3,
         producer_epoch = ?4, last_producer_epoch = ?5, timeout_ms = ?6, state = ?7,
         start_ms = ?8, last_update_ms = ?9",
        params![
            txn.transactional_id,
            txn.producer_id,
            txn.last_producer_id,
            txn.producer_epoch,
            txn.last_producer_epoch,
            txn.timeout_ms,
            txn.state,
            txn.start_ms,
            txn.last_update_ms
        ],
    )?;
    tx.execute(
        "DELETE FROM txn_partitions WHERE transactional_id = ?1",
        [&txn.transactional_id],
    )?;
    tx.execute(
        "DELETE FROM txn_groups WHERE transactional_id = ?1",
        [&txn.transactional_id],
    )?;
    let mut partitions = tx.prepare_cached(
        "INSERT INTO txn_partitions (transactional_id, topic, partition) VALUES (?1, ?2, ?3)",
    )?;
    for (topic, partition) in &txn.partitions {
        partitions.execute(params![txn.transactional_id, topic, partition])?;
    }
    let mut groups =
        tx.prepare_cached("INSERT INTO txn_groups (transactional_id, group_id) VALUES (?1, ?2)")?;
    for group in &txn.groups {
        groups.execute(params![txn.transactional_id, group])?;
    }
    Ok(())
}

/// Salted SCRAM credentials (KIP-554): what SCRAM and PLAIN authenticate against.
const SCRAM_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS scram_credentials (
    user TEXT NOT NULL,
    mechanism TEXT NOT NULL,
    salt BLOB NOT NULL,
    iterations INTEGER NOT NULL,
    stored_key BLOB NOT NULL,
    server_key BLOB NOT NULL,
    PRIMARY KEY (user, mechanism)
);
";

impl Catalog {
    /// The stored SCRAM credential of `user` for `mechanism`.
    pub(crate) fn scram_credential(
        &self,
        user: &str,
        mechanism: ScramMechanism,
    ) -> Result<Option<ScramCredential>, CatalogError> {
        self.with("read a SCRAM credential", |conn| {
            conn.query_row(
                "SELECT salt, iterations, stored_key, server_key FROM scram_credentials
                 WHERE user = ?1 AND mechanism = ?2",
                params![user, mechanism.name()],
                |r| {
                    Ok(ScramCredential {
                        mechanism,
                        salt: r.get(0)?,
                        iterations: r.get(1)?,
                        stored_key: r.get(2)?,
                        server_key: r.get(3)?,
                    })
                },
            )
            .optional()
        })
    }

    /// Every stored user with the mechanisms and iterations of its credentials, by user.
    pub(crate) fn scram_users(
        &self,
    ) -> Result<BTreeMap<String, Vec<(ScramMechanism, i32)>>, CatalogError> {
        self.with("read SCRAM credentials", |conn| {
            let mut statement = conn.prepare(
                "SELECT user, mechanism, iterations FROM scram_credentials ORDER BY user, mechanism",
            )?;
            let rows = statement.query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i32>(2)?,
                ))
            })?;
            let mut users: BTreeMap<String, Vec<(ScramMechanism, i32)>> = BTreeMap::new();
            for row in rows {
                let (user, mechanism, iterations) = row?;
                if let Some(mechanism) = ScramMechanism::from_name(&mechanism) {
                    users.entry(user).or_default().push((mechanism, iterations));
                }
            }
            Ok(users)
        })
    }

    /// Applies one AlterUserScramCredentials request: `deletions` then `upsertions`, in one
    /// transaction.
    pub(crate) fn alter_scram_credentials(
        &self,
        deletions: &[(String, ScramMechanism)],
        upsertions: &[(String, ScramCredential)],
    ) -> Result<(), CatalogError> {
        self.with("store SCRAM credentials", |conn| {
            let tx = conn.transaction()?;
            for (user, mechanism) in deletions {
                tx.execute(
                    "DELETE FROM scram_credentials WHERE user = ?1 AND mechanism = ?2",
                    params![user, mechanism.name()],
                )?;
            }
            for (user, c) in upsertions {
                tx.execute(
                    "INSERT INTO scram_credentials
                     (user, mechanism, salt, iterations, stored_key, server_key)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                     ON CONFLICT (user, mechanism) DO UPDATE SET salt = ?3, iterations = ?4,
                     stored_key = ?5, server_key = ?6",
                    params![
                        user,
                        c.mechanism.name(),
                        c.salt,
                        c.iterations,
                        c.stored_key,
                        c.server_key
                    ],
                )?;
            }
            tx.commit()
        })
    }
}

/// Every committed offset, by group, topic and partition.
fn load_committed(conn: &Connection) -> rusqlite::Result<GroupOffsets> {
    let mut stmt =
        conn.prepare("SELECT group_id, topic, partition, committed_offset FROM group_offsets")?;
    let rows = stmt.query_map([], |r| {
        Ok((r.get::<_, String>(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
    })?;
    let mut committed: GroupOffsets = HashMap::new();
    for row in rows {
        let (group, topic, partition, offset) = row?;
        committed
            .entry(group)
            .or_default()
            .insert((topic, partition), offset);
    }
    Ok(committed)
}

/// One group's committed offsets, by topic and partition.
fn group_committed(
    conn: &Connection,
    group_id: &str,
) -> rusqlite::Result<BTreeMap<(String, i32), i64>> {
    let mut stmt = conn.prepare_cached(
        "SELECT topic, partition, committed_offset FROM group_offsets WHERE group_id = ?1",
    )?;
    let rows = stmt.query_map([group_id], |r| Ok(((r.get(0)?, r.get(1)?), r.get(2)?)))?;
    rows.collect()
}
