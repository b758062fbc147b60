//! The agent's state store: one SQLite database per data directory holding source
//! checkpoints, sink progress and the index of every durable (`file`) channel.
//!
//! Keeping all of it in one database is what makes the delivery rule cheap to follow: a put
//! into a file channel appends the events to the channel's segment files, and then commits the
//! channel's new end *and* the source's checkpoint in one SQLite transaction, so after a crash
//! either both are there or neither is (bytes past the committed end are cut). The event bytes
//! themselves never pass through SQLite; the file channel's module documents its segments.
//!
//! # Layout (`<data_dir>/state.db`, WAL mode)
//!
//! | table | key | columns | written by |
//! |---|---|---|---|
//! | `checkpoints` | `source` | `checkpoint` BLOB | put transactions, or acknowledgements |
//! | `sink_progress` | `sink` | `progress` BLOB | sinks with exactly-once delivery |
//! | `channels` | `id` | `name` UNIQUE, `next_seq` | the first put of each channel |
//! | `channel_log` | `id` | `end_segment`, `end_offset`, `taken_seq`, `stored` | put and take commits |
//! | `channel_segments` | `channel`, `base_seq` | | puts that start a segment; takes that empty one |
//! | `channel_taken` | `channel`, `first_seq` | `last_seq` | takes committed out of order |
//!
//! Sequence numbers are per channel, start at 1 and only grow: `next_seq` is stored, so they
//! are never reused even after the channel was emptied. Every event below `taken_seq` was taken
//! for good; `channel_taken` holds the ranges above it that were (another take below them is
//! still open). `end_segment`/`end_offset` is the committed end of the log: the base sequence
//! number of its last segment file and that file's committed length.
//!
//! Schema version 1 kept each event as a row of a table `channel_<id>` (`seq`, `headers` BLOB,
//! `body` BLOB); a file channel still holding such a table moves its rows into segments at start
//! ([`StateStore::legacy_events`], [`StateStore::finish_migration`]).
//!
//! `PRAGMA user_version` holds the schema version; [`StateStore::open`] migrates older files.
//! Every transaction is durable when it returns (`synchronous = FULL`), except commits made with
//! [`Durability::Normal`] and checkpoints saved through [`CheckpointStore::save`] (the
//! at-least-once paths), which survive a crash of the process but not of the machine, and
//! commits made with [`Durability::Deferred`] (a file channel's takes), which survive power loss
//! once the write-ahead log is next synced ([`StateStore::sync_deferred`]).
//!
//! All methods block on SQLite; call them from `spawn_blocking` in async code.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use rusqlite::{Connection, ErrorCode, OptionalExtension, params};

use crate::checkpoint::{Checkpoint, CheckpointStore, CheckpointStoreError};
use crate::event::{Event, Headers};

/// The newest schema version this build writes.
const SCHEMA_VERSION: i64 = 2;

pub mod inspect;

/// Errors of the state store.
#[derive(Clone, Debug, thiserror::Error)]
pub enum StateError {
    /// The filesystem holding the database is full; retrying later may succeed.
    #[error("{path}: disk full")]
    DiskFull {
        /// The database file.
        path: PathBuf,
    },
    /// Any other failure of the database.
    #[error("{path}: {message}")]
    Database {
        /// The database file.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// A stored event could not be decoded (the file was damaged or written by a newer build).
    #[error("{path}: channel `{channel}` event {seq} is damaged: {message}")]
    Corrupt {
        /// The database file.
        path: PathBuf,
        /// The channel.
        channel: String,
        /// The event's sequence number.
        seq: u64,
        /// What is wrong.
        message: String,
    },
}

impl StateError {
    /// Whether the error is a full disk (callers wait for space rather than fail).
    pub fn is_disk_full(&self) -> bool {
        matches!(self, StateError::DiskFull { .. })
    }
}

/// How durable a commit is when it returns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// Fsynced at every commit: survives power loss (SQLite `synchronous = FULL`). Default.
    #[default]
    Full,
    /// Survives a crash of the process, not of the machine (SQLite `synchronous = NORMAL`).
    Normal,
    /// As [`Self::Normal`] when it returns; survives power loss once the write-ahead log is
    /// next synced: by the next [`Self::Full`] commit, by a checkpoint of the log, or by
    /// [`StateStore::sync_deferred`]. For take commits, whose loss only gives events again:
    /// the file channel's takes are made durable before the sink's next flush, together with
    /// the puts' fsyncs in between. Not a configuration value.
    #[serde(skip)]
    Deferred,
}

impl Durability {
    /// The most durable of `self` and `other`.
    fn stronger(self, other: Self) -> Self {
        let rank = |d: Self| match d {
            Self::Normal => 0,
            Self::Deferred => 1,
            Self::Full => 2,
        };
        if rank(other) > rank(self) {
            other
        } else {
            self
        }
    }
}

/// Events read from a channel, each with its sequence number.
#[derive(Debug, Default)]
pub struct StoredEvents {
    /// Sequence numbers, increasing.
    pub sequences: Vec<u64>,
    /// The events, in the same order.
    pub events: Vec<Event>,
}

/// A shared handle to the state database of one data directory. Cheap to clone.
#[derive(Clone)]
pub struct StateStore(Arc<Inner>);

struct Inner {
    path: PathBuf,
    /// Writes: puts, deletes, checkpoints, progress; with the `synchronous` level it has now.
    writer: Mutex<Writer>,
    /// Channel name → table id.
    channels: Mutex<HashMap<String, i64>>,
    /// Held by one joint put at a time, from its first part to its commit (see [`JointPut`]).
    joint_turn: Arc<tokio::sync::Mutex<()>>,
    /// Whether a [`Durability::Deferred`] commit is not yet synced; changed under `writer`.
    deferred: AtomicBool,
}

impl std::fmt::Debug for StateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateStore")
            .field("path", &self.0.path)
            .finish()
    }
}

struct Writer {
    conn: Connection,
    durability: Durability,
}

impl Writer {
    /// Switches `PRAGMA synchronous` for the next transactions, if it differs.
    fn set_durability(&mut self, durability: Durability) -> rusqlite::Result<()> {
        let pragma = synchronous_pragma(durability);
        if synchronous_pragma(self.durability) != pragma {
            self.conn.execute_batch(pragma)?;
        }
        self.durability = durability;
        Ok(())
    }
}

fn synchronous_pragma(durability: Durability) -> &'static str {
    match durability {
        Durability::Full => "PRAGMA synchronous = FULL",
        Durability::Normal | Durability::Deferred => "PRAGMA synchronous = NORMAL",
    }
}

/// Open stores by database path, so that every component of an agent shares one.
fn open_stores() -> &'static Mutex<HashMap<PathBuf, Weak<Inner>>> {
    static STORES: OnceLock<Mutex<HashMap<PathBuf, Weak<Inner>>>> = OnceLock::new();
    STORES.get_or_init(Mutex::default)
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section is one SQLite call or map update: a panic inside cannot leave
    // half-changed state behind, so a poisoned lock is safe to reuse.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl StateStore {
    /// Opens (creating if needed) `<data_dir>/state.db`, or returns the handle already open
    /// in this process for the same directory. Checkpoint and progress writes are always
    /// durable; each put chooses its own [`Durability`].
    pub fn open(data_dir: &Path) -> Result<Self, StateError> {
        let database_error = |message: String| StateError::Database {
            path: data_dir.join("state.db"),
            message,
        };
        std::fs::create_dir_all(data_dir)
            .map_err(|e| database_error(format!("creating {}: {e}", data_dir.display())))?;
        let dir = data_dir
            .canonicalize()
            .map_err(|e| database_error(e.to_string()))?;
        let path = dir.join("state.db");
        let mut stores = lock(open_stores());
        if let Some(inner) = stores.get(&path).and_then(Weak::upgrade) {
            return Ok(Self(inner));
        }
        let writer = connect(&path)?;
        migrate(&writer, &path)?;
        let inner = Arc::new(Inner {
            path: path.clone(),
            writer: Mutex::new(Writer {
                conn: writer,
                durability: Durability::Full,
            }),
            channels: Mutex::default(),
            joint_turn: Arc::default(),
            deferred: AtomicBool::new(false),
        });
        stores.insert(path, Arc::downgrade(&inner));
        Ok(Self(inner))
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.0.path
    }

    fn error(&self, error: rusqlite::Error) -> StateError {
        sql_error(&self.0.path, error)
    }

    /// The table id of `channel`, creating the channel on first use.
    fn channel_id(&self, conn: &Connection, channel: &str) -> Result<i64, StateError> {
        if let Some(id) = lock(&self.0.channels).get(channel).copied() {
            return Ok(id);
        }
        let existing: Option<i64> = conn
            .query_row(
                "SELECT id FROM channels WHERE name = ?1",
                [channel],
                |row| row.get(0),
            )
            .optional()
            .map_err(|e| self.error(e))?;
        let id = match existing {
            Some(id) => id,
            None => {
                conn.execute(
                    "INSERT INTO channels (name, next_seq) VALUES (?1, 1)",
                    [channel],
                )
                .map_err(|e| self.error(e))?;
                conn.last_insert_rowid()
            }
        };
        lock(&self.0.channels).insert(channel.to_owned(), id);
        Ok(id)
    }

    /// Opens the index of `channel`'s segment log (creating the channel on first use): where
    /// its committed end is, what was taken, which segment files exist.
    pub fn channel_log(&self, channel: &str) -> Result<LogIndex, StateError> {
        let writer = lock(&self.0.writer);
        let conn = &writer.conn;
        let id = self.channel_id(conn, channel)?;
        let next_seq: i64 = conn
            .query_row("SELECT next_seq FROM channels WHERE id = ?1", [id], |row| {
                row.get(0)
            })
            .map_err(|e| self.error(e))?;
        let row: Option<(Option<i64>, i64, i64, i64)> = conn
            .query_row(
                "SELECT end_segment, end_offset, taken_seq, stored FROM channel_log WHERE id = ?1",
                [id],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
            )
            .optional()
            .map_err(|e| self.error(e))?;
        let (end, taken_seq, stored) = match row {
            Some((segment, offset, taken, stored)) => (
                segment.map(|s| (s as u64, offset as u64)),
                taken as u64,
                stored as u64,
            ),
            None => (None, next_seq as u64, 0),
        };
        let segments = conn
            .prepare_cached(
                "SELECT base_seq FROM channel_segments WHERE channel = ?1 ORDER BY base_seq",
            )
            .and_then(|mut select| {
                select
                    .query_map([id], |row| row.get::<_, i64>(0).map(|s| s as u64))?
                    .collect::<rusqlite::Result<Vec<u64>>>()
            })
            .map_err(|e| self.error(e))?;
        let taken = conn
            .prepare_cached(
                "SELECT first_seq, last_seq FROM channel_taken WHERE channel = ?1 ORDER BY first_seq",
            )
            .and_then(|mut select| {
                select
                    .query_map([id], |row| {
                        Ok((row.get::<_, i64>(0)? as u64, row.get::<_, i64>(1)? as u64))
                    })?
                    .collect::<rusqlite::Result<Vec<(u64, u64)>>>()
            })
            .map_err(|e| self.error(e))?;
        let legacy_rows: bool = conn
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)",
                [format!("channel_{id}")],
                |row| row.get(0),
            )
            .map_err(|e| self.error(e))?;
        Ok(LogIndex {
            id: id as u64,
            next_seq: next_seq as u64,
            taken_seq,
            stored,
            end,
            segments,
            taken,
            legacy_rows,
        })
    }

    /// Commits puts to `channel`'s segment log: its new end and next sequence number, the
    /// segments created on the way there, and, in the same transaction, the checkpoints of the
    /// sources whose batches the bytes up to that end hold.
    pub fn commit_put(&self, channel: &str, put: &PutCommit<'_>) -> Result<(), StateError> {
        self.commit_puts(&[(channel, put)], None)
    }

    /// Commits puts to several channels' segment logs, and `checkpoint` (a source's name and
    /// checkpoint) if given, in one transaction: after a crash either all of it is there or
    /// none. The transaction is as durable as the most durable of the puts.
    pub fn commit_puts(
        &self,
        puts: &[(&str, &PutCommit<'_>)],
        checkpoint: Option<(&str, &Checkpoint)>,
    ) -> Result<(), StateError> {
        self.commit_together(puts, &[], checkpoint)
    }

    /// Commits puts, takes and a checkpoint in one transaction (a joint put; see
    /// [`JointPart::commit_take`]). As durable as the most durable of them.
    fn commit_together(
        &self,
        puts: &[(&str, &PutCommit<'_>)],
        takes: &[(&str, &TakeCommit<'_>)],
        checkpoint: Option<(&str, &Checkpoint)>,
    ) -> Result<(), StateError> {
        let durability = puts
            .iter()
            .map(|(_, p)| p.durability)
            .chain(takes.iter().map(|(_, t)| t.durability))
            .reduce(Durability::stronger)
            .unwrap_or(Durability::Full);
        let mut writer = lock(&self.0.writer);
        writer
            .set_durability(durability)
            .map_err(|e| self.error(e))?;
        let mut ids = Vec::with_capacity(puts.len());
        for (channel, _) in puts {
            ids.push(self.channel_id(&writer.conn, channel)?);
        }
        let mut take_ids = Vec::with_capacity(takes.len());
        for (channel, _) in takes {
            take_ids.push(self.channel_id(&writer.conn, channel)?);
        }
        let tx = writer.conn.transaction().map_err(|e| self.error(e))?;
        for (id, (_, put)) in ids.into_iter().zip(puts) {
            record_put(&tx, id, put).map_err(|e| self.error(e))?;
        }
        for (id, (_, take)) in take_ids.into_iter().zip(takes) {
            record_take(&tx, id, take).map_err(|e| self.error(e))?;
        }
        if let Some((source, checkpoint)) = checkpoint {
            save_checkpoint(&tx, source, checkpoint).map_err(|e| self.error(e))?;
        }
        tx.commit().map_err(|e| self.error(e))?;
        self.committed(durability);
        Ok(())
    }

    /// Notes a commit made with `durability` (under the writer's lock): a full one synced the
    /// write-ahead log, and with it every deferred commit before it.
    fn committed(&self, durability: Durability) {
        match durability {
            Durability::Full => self.0.deferred.store(false, Ordering::Relaxed),
            Durability::Deferred => self.0.deferred.store(true, Ordering::Relaxed),
            Durability::Normal => {}
        }
    }

    /// Whether a [`Durability::Deferred`] commit is not yet synced.
    pub fn sync_owed(&self) -> bool {
        self.0.deferred.load(Ordering::Relaxed)
    }

    /// Makes the [`Durability::Deferred`] commits made so far survive power loss: syncs the
    /// write-ahead log unless a full commit or a checkpoint of the log already did. SQLite
    /// recovers the log's commits in order, so that every commit before a synced one is
    /// durable too.
    pub fn sync_deferred(&self) -> Result<(), StateError> {
        let _writer = lock(&self.0.writer);
        if !self.sync_owed() {
            return Ok(());
        }
        let mut wal = self.0.path.clone().into_os_string();
        wal.push("-wal");
        let wal = PathBuf::from(wal);
        let synced = std::fs::OpenOptions::new()
            .write(true)
            .open(&wal)
            .and_then(|file| file.sync_data());
        match synced {
            // No log: it was checkpointed into the database, which that synced.
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(StateError::Database {
                    path: wal,
                    message: format!("cannot sync: {e}"),
                });
            }
            _ => {}
        }
        self.0.deferred.store(false, Ordering::Relaxed);
        Ok(())
    }

    /// Starts a put of one batch into `parts` channels of this store, committed in one
    /// transaction with `checkpoint` of `source`. A part may instead be a take commit
    /// ([`JointPart::commit_take`]): events then leave one channel in the transaction that
    /// puts them into another (a sink's dead letters; `agent dead-letters replay`). Waits while another joint put of this store
    /// is under way: each part holds its channel's commits until the transaction, so two at
    /// once could each wait for a channel the other holds.
    pub async fn begin_joint_put(
        &self,
        parts: usize,
        source: &str,
        checkpoint: Option<Checkpoint>,
    ) -> Vec<JointPart> {
        let turn = Arc::clone(&self.0.joint_turn).lock_owned().await;
        let joint = Arc::new(Joint {
            store: self.clone(),
            parts,
            checkpoint: checkpoint.map(|c| (source.to_owned(), c)),
            state: Mutex::new(JointState::default()),
            done: std::sync::Condvar::new(),
            _turn: turn,
        });
        (0..parts)
            .map(|_| JointPart {
                joint: Some(Arc::clone(&joint)),
            })
            .collect()
    }

    /// Commits a take of `channel`: the events in `take.ranges` are gone for good.
    /// `taken_seq` is the new low-water mark (every event below it is taken); ranges taken
    /// above it are kept until the mark passes them. Segments wholly below the mark are
    /// dropped from the index in the same transaction (their files are deleted after).
    pub fn commit_take(&self, channel: &str, take: &TakeCommit<'_>) -> Result<(), StateError> {
        let mut writer = lock(&self.0.writer);
        writer
            .set_durability(take.durability)
            .map_err(|e| self.error(e))?;
        let id = self.channel_id(&writer.conn, channel)?;
        let tx = writer.conn.transaction().map_err(|e| self.error(e))?;
        record_take(&tx, id, take).map_err(|e| self.error(e))?;
        tx.commit().map_err(|e| self.error(e))?;
        self.committed(take.durability);
        Ok(())
    }

    /// Events of `channel` still in the table of the row format (schema version 1), from
    /// sequence number `from` on, at most `max`: what a migration to the segment log moves.
    pub fn legacy_events(
        &self,
        channel: &str,
        from: u64,
        max: usize,
    ) -> Result<StoredEvents, StateError> {
        let writer = lock(&self.0.writer);
        let id = self.channel_id(&writer.conn, channel)?;
        let mut select = writer
            .conn
            .prepare(&format!(
                "SELECT seq, headers, body FROM channel_{id} WHERE seq >= ?1 ORDER BY seq LIMIT ?2"
            ))
            .map_err(|e| self.error(e))?;
        let mut rows = select
            .query(params![from as i64, max as i64])
            .map_err(|e| self.error(e))?;
        let mut out = StoredEvents::default();
        while let Some(row) = rows.next().map_err(|e| self.error(e))? {
            let seq: i64 = row.get(0).map_err(|e| self.error(e))?;
            let headers: &[u8] = row
                .get_ref(1)
                .and_then(|v| v.as_blob().map_err(Into::into))
                .map_err(|e| self.error(e))?;
            let headers = decode_headers(headers).map_err(|message| StateError::Corrupt {
                path: self.0.path.clone(),
                channel: channel.to_owned(),
                seq: seq as u64,
                message,
            })?;
            let body: Vec<u8> = row.get(2).map_err(|e| self.error(e))?;
            out.sequences.push(seq as u64);
            out.events.push(Event::new(headers, body));
        }
        Ok(out)
    }

    /// Ends the migration of `channel` from the row format: in one transaction, the segment
    /// log written from its rows becomes the channel's ([`Self::commit_put`] with `put`, the
    /// sequence numbers missing between rows recorded as taken) and the row table is dropped.
    pub fn finish_migration(
        &self,
        channel: &str,
        put: &PutCommit<'_>,
        gaps: &[(u64, u64)],
    ) -> Result<(), StateError> {
        let mut writer = lock(&self.0.writer);
        writer
            .set_durability(Durability::Full)
            .map_err(|e| self.error(e))?;
        let id = self.channel_id(&writer.conn, channel)?;
        let tx = writer.conn.transaction().map_err(|e| self.error(e))?;
        let run = |sql: &str, values: &[&dyn rusqlite::ToSql]| {
            tx.execute(sql, values).map_err(|e| self.error(e))
        };
        run("DELETE FROM channel_log WHERE id = ?1", &[&id])?;
        run("DELETE FROM channel_segments WHERE channel = ?1", &[&id])?;
        run("DELETE FROM channel_taken WHERE channel = ?1", &[&id])?;
        let (segment, offset) = put.end;
        let end_segment = (!put.new_segments.is_empty()).then_some(segment as i64);
        run(
            "INSERT INTO channel_log (id, end_segment, end_offset, taken_seq, stored)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            &[
                &id,
                &end_segment,
                &(offset as i64),
                &(put.taken_seq as i64),
                &(put.added as i64),
            ],
        )?;
        for base in put.new_segments {
            run(
                "INSERT INTO channel_segments (channel, base_seq) VALUES (?1, ?2)",
                &[&id, &(*base as i64)],
            )?;
        }
        for (first, last) in gaps {
            run(
                "INSERT INTO channel_taken (channel, first_seq, last_seq) VALUES (?1, ?2, ?3)",
                &[&id, &(*first as i64), &(*last as i64)],
            )?;
        }
        run(
            "UPDATE channels SET next_seq = MAX(next_seq, ?1) WHERE id = ?2",
            &[&(put.next_seq as i64), &id],
        )?;
        run(&format!("DROP TABLE channel_{id}"), &[])?;
        tx.commit().map_err(|e| self.error(e))?;
        self.committed(Durability::Full);
        Ok(())
    }

    /// Free space of the filesystem holding the database. Pages freed by deleted events stay
    /// inside the database file; [`reclaim_space`](Self::reclaim_space) gives them back.
    pub fn available_bytes(&self) -> Result<u64, StateError> {
        let dir = self.0.path.parent().unwrap_or(Path::new("."));
        free_space(dir).map_err(|e| StateError::Database {
            path: self.0.path.clone(),
            message: format!("reading free space: {e}"),
        })
    }

    /// Returns the database's free pages to the filesystem and shrinks the write-ahead log,
    /// so that a nearly full disk has room again once sinks have taken events out.
    pub fn reclaim_space(&self) -> Result<(), StateError> {
        let writer = lock(&self.0.writer);
        let run = |sql: &str| -> rusqlite::Result<()> {
            // These pragmas work one step at a time (incremental_vacuum frees a page per
            // step): step them to the end.
            let mut statement = writer.conn.prepare(sql)?;
            let mut rows = statement.query([])?;
            while rows.next()?.is_some() {}
            Ok(())
        };
        run("PRAGMA incremental_vacuum")
            .and_then(|()| run("PRAGMA wal_checkpoint(TRUNCATE)"))
            .map_err(|e| self.error(e))
    }

    /// The progress record of sink `sink`, if it saved one.
    pub fn load_progress(&self, sink: &str) -> Result<Option<Vec<u8>>, StateError> {
        let writer = lock(&self.0.writer);
        writer
            .conn
            .query_row(
                "SELECT progress FROM sink_progress WHERE sink = ?1",
                [sink],
                |row| row.get(0),
            )
            .optional()
            .map_err(|e| self.error(e))
    }

    /// Replaces the progress record of sink `sink`.
    pub fn save_progress(&self, sink: &str, progress: &[u8]) -> Result<(), StateError> {
        let mut writer = lock(&self.0.writer);
        writer
            .set_durability(Durability::Full)
            .map_err(|e| self.error(e))?;
        writer
            .conn
            .prepare_cached(
                "INSERT INTO sink_progress (sink, progress) VALUES (?1, ?2)
             ON CONFLICT (sink) DO UPDATE SET progress = excluded.progress",
            )
            .and_then(|mut upsert| upsert.execute(params![sink, progress]))
            .map_err(|e| self.error(e))?;
        self.committed(Durability::Full);
        Ok(())
    }
}

/// The index of one channel's segment log, as committed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogIndex {
    /// The channel's id: its segment files live in `channels/<id>/` of the data directory.
    pub id: u64,
    /// Sequence number the next put gets.
    pub next_seq: u64,
    /// Every event below this sequence number is taken for good.
    pub taken_seq: u64,
    /// Events stored (put and not yet taken for good).
    pub stored: u64,
    /// The committed end: base sequence number of the last segment and its length in bytes.
    /// `None` when no segment exists.
    pub end: Option<(u64, u64)>,
    /// Base sequence numbers of the segment files, in order.
    pub segments: Vec<u64>,
    /// Ranges `(first, last)` taken for good above `taken_seq` (takes committed out of order).
    pub taken: Vec<(u64, u64)>,
    /// Whether the channel still has a table of the row format (schema version 1) to migrate.
    pub legacy_rows: bool,
}

/// What a group of puts to a segment log commits ([`StateStore::commit_put`]).
#[derive(Debug)]
pub struct PutCommit<'a> {
    /// Base sequence number of the segment holding the end, and the end's byte offset in it.
    pub end: (u64, u64),
    /// Sequence number the next put gets.
    pub next_seq: u64,
    /// The low-water mark, for the first commit of a channel.
    pub taken_seq: u64,
    /// Events added by these puts.
    pub added: u64,
    /// Segments created since the last commit.
    pub new_segments: &'a [u64],
    /// The checkpoints of the sources whose batches these puts hold.
    pub checkpoints: &'a [(&'a str, &'a Checkpoint)],
    /// How durable the commit is when it returns.
    pub durability: Durability,
}

/// One part of a joint put (see [`StateStore::begin_joint_put`]): the batch for one channel.
///
/// The channel writes and syncs its part, then hands what it would commit to
/// [`commit`](Self::commit), which waits for every other part and returns the outcome of
/// their one transaction (the last part to arrive runs it). A part dropped before it was
/// committed fails the whole put, so no channel waits for ever.
pub struct JointPart {
    joint: Option<Arc<Joint>>,
}

impl std::fmt::Debug for JointPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JointPart").finish_non_exhaustive()
    }
}

struct Joint {
    store: StateStore,
    parts: usize,
    checkpoint: Option<(String, Checkpoint)>,
    state: Mutex<JointState>,
    done: std::sync::Condvar,
    /// The store's turn for joint puts, held until the last part is done.
    _turn: tokio::sync::OwnedMutexGuard<()>,
}

#[derive(Default)]
struct JointState {
    /// What each part that arrived commits: a channel's puts, by channel.
    deposits: Vec<(String, OwnedPutCommit)>,
    /// The take commits of parts that remove events from a channel, by channel.
    takes: Vec<(String, OwnedTakeCommit)>,
    /// Parts that gave up.
    abandoned: Option<StateError>,
    /// The outcome, once known.
    outcome: Option<Result<(), StateError>>,
}

/// A [`TakeCommit`] that owns its parts, to travel between the parts' threads.
struct OwnedTakeCommit {
    ranges: Vec<(u64, u64)>,
    removed: u64,
    taken_seq: u64,
    dropped_segments: Vec<u64>,
    log_emptied: bool,
    durability: Durability,
}

/// A [`PutCommit`] that owns its parts, to travel between the parts' threads.
struct OwnedPutCommit {
    end: (u64, u64),
    next_seq: u64,
    taken_seq: u64,
    added: u64,
    new_segments: Vec<u64>,
    checkpoints: Vec<(String, Checkpoint)>,
    durability: Durability,
}

impl JointPart {
    /// The store the put commits in.
    pub fn store(&self) -> Option<&StateStore> {
        self.joint.as_ref().map(|j| &j.store)
    }

    /// Commits `channel`'s part once every part arrived, in one transaction with the others.
    /// Blocks (call it from `spawn_blocking`). Every part gets the same outcome.
    pub fn commit(self, channel: &str, put: &PutCommit<'_>) -> Result<(), StateError> {
        let owned = OwnedPutCommit {
            end: put.end,
            next_seq: put.next_seq,
            taken_seq: put.taken_seq,
            added: put.added,
            new_segments: put.new_segments.to_vec(),
            checkpoints: put
                .checkpoints
                .iter()
                .map(|(s, c)| ((*s).to_owned(), (*c).clone()))
                .collect(),
            durability: put.durability,
        };
        self.deposit(|state| state.deposits.push((channel.to_owned(), owned)))
    }

    /// Commits a take of `channel` as this part, in one transaction with the other parts'
    /// puts: the events leave `channel` exactly when the others arrive in theirs (a sink's
    /// refused events moving to its dead-letter channel, a replay moving them back). Blocks
    /// like [`Self::commit`].
    pub fn commit_take(self, channel: &str, take: &TakeCommit<'_>) -> Result<(), StateError> {
        let owned = OwnedTakeCommit {
            ranges: take.ranges.to_vec(),
            removed: take.removed,
            taken_seq: take.taken_seq,
            dropped_segments: take.dropped_segments.to_vec(),
            log_emptied: take.log_emptied,
            durability: take.durability,
        };
        self.deposit(|state| state.takes.push((channel.to_owned(), owned)))
    }

    /// Leaves this part's commit with the others and waits for the outcome.
    fn deposit(mut self, leave: impl FnOnce(&mut JointState)) -> Result<(), StateError> {
        let Some(joint) = self.joint.take() else {
            return Err(joint_error(None, "the part was already used"));
        };
        let mut state = lock(&joint.state);
        leave(&mut state);
        joint.settle(&mut state);
        loop {
            if let Some(outcome) = &state.outcome {
                return outcome.clone();
            }
            state = joint.done.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Gives up this part, failing the whole put with `error`.
    pub fn abandon(mut self, error: StateError) {
        if let Some(joint) = self.joint.take() {
            joint.abandon(error);
        }
    }
}

impl Drop for JointPart {
    fn drop(&mut self) {
        if let Some(joint) = self.joint.take() {
            let path = joint.store.path().to_owned();
            joint.abandon(joint_error(
                Some(path),
                "a channel of the fan-out put gave up before committing",
            ));
        }
    }
}

impl Joint {
    fn abandon(&self, error: StateError) {
        let mut state = lock(&self.state);
        if state.abandoned.is_none() {
            state.abandoned = Some(error);
        }
        self.settle(&mut state);
    }

    /// Once every part arrived or gave up: runs the transaction (or fails it) and wakes
    /// every part.
    fn settle(&self, state: &mut JointState) {
        let arrived = state.deposits.len() + state.takes.len();
        if state.outcome.is_some() {
            return;
        }
        let outcome = if let Some(error) = &state.abandoned {
            // A part gave up: nothing is committed, however many others still come.
            Err(error.clone())
        } else if arrived < self.parts {
            return;
        } else {
            let checkpoints: Vec<Vec<(&str, &Checkpoint)>> = state
                .deposits
                .iter()
                .map(|(_, d)| d.checkpoints.iter().map(|(s, c)| (s.as_str(), c)).collect())
                .collect();
            let commits: Vec<PutCommit<'_>> = state
                .deposits
                .iter()
                .zip(&checkpoints)
                .map(|((_, d), checkpoints)| PutCommit {
                    end: d.end,
                    next_seq: d.next_seq,
                    taken_seq: d.taken_seq,
                    added: d.added,
                    new_segments: &d.new_segments,
                    checkpoints,
                    durability: d.durability,
                })
                .collect();
            let puts: Vec<(&str, &PutCommit<'_>)> = state
                .deposits
                .iter()
                .zip(&commits)
                .map(|((name, _), commit)| (name.as_str(), commit))
                .collect();
            let takes: Vec<(&str, TakeCommit<'_>)> = state
                .takes
                .iter()
                .map(|(name, t)| {
                    let take = TakeCommit {
                        ranges: &t.ranges,
                        removed: t.removed,
                        taken_seq: t.taken_seq,
                        dropped_segments: &t.dropped_segments,
                        log_emptied: t.log_emptied,
                        durability: t.durability,
                    };
                    (name.as_str(), take)
                })
                .collect();
            let takes: Vec<(&str, &TakeCommit<'_>)> =
                takes.iter().map(|(name, take)| (*name, take)).collect();
            let checkpoint = self.checkpoint.as_ref().map(|(s, c)| (s.as_str(), c));
            self.store.commit_together(&puts, &takes, checkpoint)
        };
        state.outcome = Some(outcome);
        self.done.notify_all();
    }
}

fn joint_error(path: Option<PathBuf>, message: &str) -> StateError {
    StateError::Database {
        path: path.unwrap_or_default(),
        message: message.to_owned(),
    }
}

/// What a take commit of a segment log records ([`StateStore::commit_take`]).
#[derive(Debug)]
pub struct TakeCommit<'a> {
    /// The sequence numbers taken, as runs `(first, last)`.
    pub ranges: &'a [(u64, u64)],
    /// Events in that range.
    pub removed: u64,
    /// The new low-water mark.
    pub taken_seq: u64,
    /// Segments now wholly taken, to drop from the index.
    pub dropped_segments: &'a [u64],
    /// Whether the last segment was dropped too (the log holds no segment any more).
    pub log_emptied: bool,
    /// How durable the commit is when it returns.
    pub durability: Durability,
}

impl CheckpointStore for StateStore {
    fn load(&self, source: &str) -> Result<Option<Checkpoint>, CheckpointStoreError> {
        let writer = lock(&self.0.writer);
        writer
            .conn
            .query_row(
                "SELECT checkpoint FROM checkpoints WHERE source = ?1",
                [source],
                |row| row.get::<_, Vec<u8>>(0),
            )
            .optional()
            .map(|c| c.map(Checkpoint::new))
            .map_err(|e| CheckpointStoreError(self.error(e).to_string()))
    }

    /// Saves without waiting for an fsync ([`Durability::Normal`]): checkpoints saved here
    /// are those of at-least-once paths (a memory channel's acknowledgements, the copy of a
    /// checkpoint a kafka channel keeps), where the saved position only ever lags what was
    /// delivered. A power loss may lose the newest save, which repeats events on restart but
    /// never loses one; a crash of the agent loses nothing. Checkpoints committed with a file
    /// channel's put are as durable as the put.
    fn save(&self, source: &str, checkpoint: &Checkpoint) -> Result<(), CheckpointStoreError> {
        let mut writer = lock(&self.0.writer);
        writer
            .set_durability(Durability::Normal)
            .and_then(|()| save_checkpoint(&writer.conn, source, checkpoint))
            .map_err(|e| CheckpointStoreError(self.error(e).to_string()))
    }
}

/// Bytes available to this process on the filesystem holding `path`.
pub fn free_space(path: &Path) -> std::io::Result<u64> {
    let stats = nix::sys::statvfs::statvfs(path).map_err(std::io::Error::from)?;
    #[allow(clippy::unnecessary_cast)] // the field types differ between platforms
    Ok((stats.blocks_available() as u64).saturating_mul(stats.fragment_size() as u64))
}

/// Records one channel's take commit in `tx`.
fn record_take(tx: &Connection, id: i64, take: &TakeCommit<'_>) -> rusqlite::Result<()> {
    let run = |sql: &str, values: &[&dyn rusqlite::ToSql]| {
        tx.prepare_cached(sql)
            .and_then(|mut statement| statement.execute(values))
    };
    run(
        "UPDATE channel_log SET taken_seq = ?2, stored = stored - ?3 WHERE id = ?1",
        &[&id, &(take.taken_seq as i64), &(take.removed as i64)],
    )?;
    for (first, last) in take.ranges {
        if *last >= take.taken_seq {
            run(
                "INSERT OR REPLACE INTO channel_taken (channel, first_seq, last_seq) VALUES (?1, ?2, ?3)",
                &[&id, &(*first as i64), &(*last as i64)],
            )?;
        }
    }
    run(
        "DELETE FROM channel_taken WHERE channel = ?1 AND last_seq < ?2",
        &[&id, &(take.taken_seq as i64)],
    )?;
    for base in take.dropped_segments {
        run(
            "DELETE FROM channel_segments WHERE channel = ?1 AND base_seq = ?2",
            &[&id, &(*base as i64)],
        )?;
    }
    if take.log_emptied {
        run(
            "UPDATE channel_log SET end_segment = NULL, end_offset = 0 WHERE id = ?1",
            &[&id],
        )?;
    }
    Ok(())
}

/// Records one channel's puts in `tx`.
fn record_put(tx: &Connection, id: i64, put: &PutCommit<'_>) -> rusqlite::Result<()> {
    let (segment, offset) = put.end;
    tx.prepare_cached(
        "INSERT INTO channel_log (id, end_segment, end_offset, taken_seq, stored)
         VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (id) DO UPDATE SET end_segment = excluded.end_segment,
             end_offset = excluded.end_offset, stored = stored + ?5",
    )?
    .execute(params![
        id,
        segment as i64,
        offset as i64,
        put.taken_seq as i64,
        put.added as i64
    ])?;
    for base in put.new_segments {
        tx.prepare_cached(
            "INSERT OR IGNORE INTO channel_segments (channel, base_seq) VALUES (?1, ?2)",
        )?
        .execute(params![id, *base as i64])?;
    }
    tx.prepare_cached("UPDATE channels SET next_seq = ?1 WHERE id = ?2")?
        .execute(params![put.next_seq as i64, id])?;
    for (source, checkpoint) in put.checkpoints {
        save_checkpoint(tx, source, checkpoint)?;
    }
    Ok(())
}

fn save_checkpoint(
    conn: &Connection,
    source: &str,
    checkpoint: &Checkpoint,
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO checkpoints (source, checkpoint) VALUES (?1, ?2)
         ON CONFLICT (source) DO UPDATE SET checkpoint = excluded.checkpoint",
    )?
    .execute(params![source, checkpoint.as_bytes()])?;
    Ok(())
}

fn sql_error(path: &Path, error: rusqlite::Error) -> StateError {
    match error.sqlite_error_code() {
        Some(ErrorCode::DiskFull) => StateError::DiskFull {
            path: path.to_owned(),
        },
        _ => StateError::Database {
            path: path.to_owned(),
            message: error.to_string(),
        },
    }
}

fn connect(path: &Path) -> Result<Connection, StateError> {
    let conn = Connection::open(path).map_err(|e| sql_error(path, e))?;
    // Before anything else: on a new database this makes free pages returnable to the
    // filesystem (`reclaim_space`); once tables exist it can no longer change.
    conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL;")
        .map_err(|e| sql_error(path, e))?;
    conn.execute_batch(
        "PRAGMA journal_mode = WAL;
         PRAGMA synchronous = FULL;
         PRAGMA busy_timeout = 60000;
         PRAGMA wal_autocheckpoint = 1000;
         PRAGMA journal_size_limit = 16777216;",
    )
    .map_err(|e| sql_error(path, e))?;
    Ok(conn)
}

/// Brings the schema to [`SCHEMA_VERSION`], one step at a time.
fn migrate(conn: &Connection, path: &Path) -> Result<(), StateError> {
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(|e| sql_error(path, e))?;
    if version > SCHEMA_VERSION {
        return Err(StateError::Database {
            path: path.to_owned(),
            message: format!(
                "schema version {version} is newer than this agent understands ({SCHEMA_VERSION}); use a newer agent"
            ),
        });
    }
    if version < 1 {
        conn.execute_batch(
            "BEGIN;
             CREATE TABLE checkpoints (source TEXT PRIMARY KEY, checkpoint BLOB NOT NULL);
             CREATE TABLE sink_progress (sink TEXT PRIMARY KEY, progress BLOB NOT NULL);
             CREATE TABLE channels (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE,
                                    next_seq INTEGER NOT NULL);
             PRAGMA user_version = 1;
             COMMIT;",
        )
        .map_err(|e| sql_error(path, e))?;
    }
    if version < 2 {
        // The segment log of file channels. Row tables of version 1 (`channel_<id>`) stay
        // until each channel migrates its events at start (`finish_migration`).
        conn.execute_batch(
            "BEGIN;
             CREATE TABLE channel_log (id INTEGER PRIMARY KEY, end_segment INTEGER,
                                       end_offset INTEGER NOT NULL, taken_seq INTEGER NOT NULL,
                                       stored INTEGER NOT NULL);
             CREATE TABLE channel_segments (channel INTEGER NOT NULL, base_seq INTEGER NOT NULL,
                                            PRIMARY KEY (channel, base_seq));
             CREATE TABLE channel_taken (channel INTEGER NOT NULL, first_seq INTEGER NOT NULL,
                                         last_seq INTEGER NOT NULL,
                                         PRIMARY KEY (channel, first_seq));
             PRAGMA user_version = 2;
             COMMIT;",
        )
        .map_err(|e| sql_error(path, e))?;
    }
    Ok(())
}

#[cfg(test)]
fn encode_headers(headers: &Headers, out: &mut Vec<u8>) {
    if headers.is_empty() {
        return;
    }
    out.extend_from_slice(&(headers.len() as u32).to_le_bytes());
    for (k, v) in headers {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(k.as_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
        out.extend_from_slice(v.as_bytes());
    }
}

fn decode_headers(mut bytes: &[u8]) -> Result<Headers, String> {
    let mut headers = Headers::new();
    if bytes.is_empty() {
        return Ok(headers);
    }
    fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
        if bytes.len() < n {
            return Err("headers truncated".into());
        }
        let (head, tail) = bytes.split_at(n);
        *bytes = tail;
        Ok(head)
    }
    fn take_u32(bytes: &mut &[u8]) -> Result<usize, String> {
        let raw = take(bytes, 4)?;
        Ok(u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]) as usize)
    }
    fn take_str(bytes: &mut &[u8]) -> Result<crate::CompactString, String> {
        let n = take_u32(bytes)?;
        crate::CompactString::from_utf8(take(bytes, n)?).map_err(|_| "header is not UTF-8".into())
    }
    let count = take_u32(&mut bytes)?;
    for _ in 0..count {
        let k = take_str(&mut bytes)?;
        let v = take_str(&mut bytes)?;
        headers.insert(k, v);
    }
    if !bytes.is_empty() {
        return Err("trailing bytes after headers".into());
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(i: u32) -> Event {
        let mut e = Event::from_body(format!("event {i}"));
        e.headers.set("n", i.to_string());
        e
    }

    fn put<'a>(
        end: (u64, u64),
        next_seq: u64,
        added: u64,
        new_segments: &'a [u64],
        checkpoints: &'a [(&'a str, &'a Checkpoint)],
    ) -> PutCommit<'a> {
        PutCommit {
            end,
            next_seq,
            taken_seq: 1,
            added,
            new_segments,
            checkpoints,
            durability: Durability::Full,
        }
    }

    #[test]
    fn a_put_commits_the_log_end_with_the_checkpoint_and_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = StateStore::open(dir.path()).unwrap();
            let fresh = store.channel_log("c").unwrap();
            assert_eq!((fresh.next_seq, fresh.taken_seq, fresh.end), (1, 1, None));
            let cp = Checkpoint::new(b"pos=3".to_vec());
            store
                .commit_put("c", &put((1, 300), 4, 3, &[1], &[("src", &cp)]))
                .unwrap();
            store
                .commit_put("c", &put((4, 100), 5, 1, &[4], &[]))
                .unwrap();
        }
        let store = StateStore::open(dir.path()).unwrap();
        assert_eq!(
            store.load("src").unwrap(),
            Some(Checkpoint::new(b"pos=3".to_vec()))
        );
        let index = store.channel_log("c").unwrap();
        assert_eq!(index.next_seq, 5);
        assert_eq!(index.stored, 4);
        assert_eq!(index.end, Some((4, 100)));
        assert_eq!(index.segments, [1, 4]);
        assert!(!index.legacy_rows);
    }

    #[test]
    fn a_deferred_take_commit_is_owed_a_sync_until_a_full_commit_or_a_sync() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = StateStore::open(dir.path()).unwrap();
            store
                .commit_put("c", &put((1, 900), 31, 30, &[1], &[]))
                .unwrap();
            assert!(!store.sync_owed());
            let take = |first: u64, durability| {
                let last = first + 9;
                store
                    .commit_take(
                        "c",
                        &TakeCommit {
                            ranges: &[(first, last)],
                            removed: 10,
                            taken_seq: last + 1,
                            dropped_segments: &[],
                            log_emptied: false,
                            durability,
                        },
                    )
                    .unwrap();
            };
            take(1, Durability::Deferred);
            assert!(store.sync_owed());
            // A checkpoint saved without an fsync does not sync the log.
            store
                .save("src", &Checkpoint::new(b"pos=1".to_vec()))
                .unwrap();
            assert!(store.sync_owed());
            store.sync_deferred().unwrap();
            assert!(!store.sync_owed());
            // A full commit syncs the log, and the deferred commits before it with it.
            take(11, Durability::Deferred);
            assert!(store.sync_owed());
            store
                .commit_put("c", &put((1, 930), 32, 1, &[], &[]))
                .unwrap();
            assert!(!store.sync_owed());
            take(21, Durability::Deferred);
            store.sync_deferred().unwrap();
            assert!(!store.sync_owed());
        }
        let index = StateStore::open(dir.path())
            .unwrap()
            .channel_log("c")
            .unwrap();
        assert_eq!((index.taken_seq, index.stored), (31, 1));
    }

    #[test]
    fn takes_committed_out_of_order_keep_their_ranges_until_the_mark_passes() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path()).unwrap();
        store
            .commit_put("c", &put((1, 900), 31, 30, &[1, 11, 21], &[]))
            .unwrap();
        let take = |ranges: &[(u64, u64)], removed, taken_seq, dropped: &[u64]| {
            store
                .commit_take(
                    "c",
                    &TakeCommit {
                        ranges,
                        removed,
                        taken_seq,
                        dropped_segments: dropped,
                        log_emptied: false,
                        durability: Durability::Full,
                    },
                )
                .unwrap();
            store.channel_log("c").unwrap()
        };
        let index = take(&[(11, 20)], 10, 1, &[]);
        assert_eq!((index.taken_seq, index.stored), (1, 20));
        assert_eq!(index.taken, [(11, 20)]);
        let index = take(&[(1, 10)], 10, 21, &[1, 11]);
        assert_eq!((index.taken_seq, index.stored), (21, 10));
        assert!(index.taken.is_empty());
        assert_eq!(index.segments, [21]);
    }

    #[test]
    fn sequence_numbers_are_never_reused() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = StateStore::open(dir.path()).unwrap();
            store
                .commit_put("c", &put((1, 10), 3, 2, &[1], &[]))
                .unwrap();
            store
                .commit_take(
                    "c",
                    &TakeCommit {
                        ranges: &[(1, 2)],
                        removed: 2,
                        taken_seq: 3,
                        dropped_segments: &[1],
                        log_emptied: true,
                        durability: Durability::Full,
                    },
                )
                .unwrap();
        }
        let store = StateStore::open(dir.path()).unwrap();
        let index = store.channel_log("c").unwrap();
        assert_eq!((index.next_seq, index.taken_seq, index.stored), (3, 3, 0));
        assert_eq!(index.end, None);
        assert!(index.segments.is_empty());
    }

    #[test]
    fn rows_of_the_version_1_format_are_read_back_and_dropped_by_the_migration() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(
                "CREATE TABLE checkpoints (source TEXT PRIMARY KEY, checkpoint BLOB NOT NULL);
                 CREATE TABLE sink_progress (sink TEXT PRIMARY KEY, progress BLOB NOT NULL);
                 CREATE TABLE channels (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE,
                                        next_seq INTEGER NOT NULL);
                 CREATE TABLE channel_1 (seq INTEGER PRIMARY KEY, headers BLOB NOT NULL,
                                         body BLOB NOT NULL);
                 INSERT INTO channels VALUES (1, 'c', 9);
                 PRAGMA user_version = 1;",
            )
            .unwrap();
            for seq in [3u32, 4, 7] {
                let mut headers = Vec::new();
                encode_headers(&event(seq).headers, &mut headers);
                conn.execute(
                    "INSERT INTO channel_1 VALUES (?1, ?2, ?3)",
                    params![seq, headers, event(seq).body.to_vec()],
                )
                .unwrap();
            }
        }
        let store = StateStore::open(dir.path()).unwrap();
        let index = store.channel_log("c").unwrap();
        assert!(index.legacy_rows);
        assert_eq!(index.next_seq, 9);
        let rows = store.legacy_events("c", 4, 10).unwrap();
        assert_eq!(rows.sequences, [4, 7]);
        assert_eq!(rows.events, [event(4), event(7)]);
        store
            .finish_migration(
                "c",
                &PutCommit {
                    end: (3, 500),
                    next_seq: 9,
                    taken_seq: 3,
                    added: 3,
                    new_segments: &[3],
                    checkpoints: &[],
                    durability: Durability::Full,
                },
                &[(5, 6), (8, 8)],
            )
            .unwrap();
        let index = store.channel_log("c").unwrap();
        assert!(!index.legacy_rows);
        assert_eq!(
            (index.taken_seq, index.stored, index.end),
            (3, 3, Some((3, 500)))
        );
        assert_eq!(index.taken, [(5, 6), (8, 8)]);
    }

    #[test]
    fn sink_progress_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path()).unwrap();
        assert_eq!(store.load_progress("s").unwrap(), None);
        store.save_progress("s", b"42").unwrap();
        store.save_progress("s", b"43").unwrap();
        assert_eq!(store.load_progress("s").unwrap(), Some(b"43".to_vec()));
    }

    #[test]
    fn damaged_headers_are_reported_not_panicked() {
        assert!(decode_headers(&[5, 0, 0, 0, 1]).is_err());
        assert!(decode_headers(&[1, 0, 0, 0, 1, 0, 0, 0, b'k', 9, 0, 0, 0]).is_err());
        let mut buf = Vec::new();
        let h = event(7).headers;
        encode_headers(&h, &mut buf);
        assert_eq!(decode_headers(&buf).unwrap(), h);
    }

    #[test]
    fn newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        Connection::open(&path)
            .unwrap()
            .execute_batch("PRAGMA user_version = 99")
            .unwrap();
        let err = StateStore::open(dir.path()).unwrap_err();
        assert!(err.to_string().contains("newer"), "{err}");
    }
}
