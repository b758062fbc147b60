//! The agent's state store: one SQLite database per data directory holding source
//! checkpoints, sink progress and the events of durable (`file`) channels.
//!
//! Keeping all of it in one database is what makes the delivery rule cheap to follow: a put
//! into a file channel writes the events *and* the source's checkpoint in one SQLite
//! transaction, so after a crash either both are there or neither is.
//!
//! # Layout (`<data_dir>/state.db`, WAL mode)
//!
//! | table | key | columns | written by |
//! |---|---|---|---|
//! | `checkpoints` | `source` | `checkpoint` BLOB | put transactions, or acknowledgements |
//! | `sink_progress` | `sink` | `progress` BLOB | sinks with exactly-once delivery |
//! | `channels` | `id` | `name` UNIQUE, `next_seq` | the first put of each channel |
//! | `channel_<id>` | `seq` (rowid) | `headers` BLOB, `body` BLOB | puts; take commits delete |
//!
//! Sequence numbers are per channel, start at 1 and only grow: `next_seq` is stored, so they
//! are never reused even after the channel was emptied. `headers` is encoded as a count and
//! length-prefixed keys and values (little-endian `u32`s).
//!
//! `PRAGMA user_version` holds the schema version; [`StateStore::open`] migrates older files.
//! Every transaction is durable when it returns (`synchronous = FULL`), except puts made with
//! [`Durability::Normal`], which survive a crash of the process but not of the machine.
//!
//! All methods block on SQLite; call them from `spawn_blocking` in async code.

use std::collections::HashMap;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use rusqlite::{Connection, ErrorCode, OptionalExtension, params};

use crate::checkpoint::{Checkpoint, CheckpointStore, CheckpointStoreError};
use crate::event::{Event, Headers};

/// The newest schema version this build writes.
const SCHEMA_VERSION: i64 = 1;

/// Errors of the state store.
#[derive(Debug, thiserror::Error)]
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
    /// Reads of channel events, so that takes do not wait behind a put's fsync.
    reader: Mutex<Connection>,
    /// Channel name → table id.
    channels: Mutex<HashMap<String, i64>>,
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
        if self.durability != durability {
            self.conn.execute_batch(synchronous_pragma(durability))?;
            self.durability = durability;
        }
        Ok(())
    }
}

fn synchronous_pragma(durability: Durability) -> &'static str {
    match durability {
        Durability::Full => "PRAGMA synchronous = FULL",
        Durability::Normal => "PRAGMA synchronous = NORMAL",
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
        let reader = connect(&path)?;
        let inner = Arc::new(Inner {
            path: path.clone(),
            writer: Mutex::new(Writer {
                conn: writer,
                durability: Durability::Full,
            }),
            reader: Mutex::new(reader),
            channels: Mutex::default(),
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

    /// The table id of `channel` if this handle has seen it already (no database access).
    fn known_channel_id(&self, channel: &str) -> Option<i64> {
        lock(&self.0.channels).get(channel).copied()
    }

    /// The table id of `channel`, creating the channel on first use.
    fn channel_id(&self, conn: &Connection, channel: &str) -> Result<i64, StateError> {
        if let Some(id) = self.known_channel_id(channel) {
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
        conn.execute_batch(&format!(
            "CREATE TABLE IF NOT EXISTS channel_{id} (
                 seq INTEGER PRIMARY KEY, headers BLOB NOT NULL, body BLOB NOT NULL)"
        ))
        .map_err(|e| self.error(e))?;
        lock(&self.0.channels).insert(channel.to_owned(), id);
        Ok(id)
    }

    /// Opens `channel` (creating it) and returns the sequence numbers of its first stored event
    /// and the next one to be assigned, and how many events it holds.
    pub fn channel_state(&self, channel: &str) -> Result<ChannelState, StateError> {
        let writer = lock(&self.0.writer);
        let conn = &writer.conn;
        let id = self.channel_id(conn, channel)?;
        let next_seq: i64 = conn
            .query_row("SELECT next_seq FROM channels WHERE id = ?1", [id], |row| {
                row.get(0)
            })
            .map_err(|e| self.error(e))?;
        let (first, len): (Option<i64>, i64) = conn
            .query_row(
                &format!("SELECT MIN(seq), COUNT(*) FROM channel_{id}"),
                [],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .map_err(|e| self.error(e))?;
        Ok(ChannelState {
            first_seq: first.unwrap_or(next_seq) as u64,
            next_seq: next_seq as u64,
            len: len as u64,
        })
    }

    /// Appends `events` to `channel` and, in the same transaction, saves `checkpoint` for its
    /// source. Returns the sequence number of the first event.
    pub fn append(
        &self,
        channel: &str,
        events: &[Event],
        checkpoint: Option<(&str, &Checkpoint)>,
        durability: Durability,
    ) -> Result<u64, StateError> {
        let mut writer = lock(&self.0.writer);
        writer
            .set_durability(durability)
            .map_err(|e| self.error(e))?;
        let id = self.channel_id(&writer.conn, channel)?;
        let tx = writer.conn.transaction().map_err(|e| self.error(e))?;
        let first: i64 = tx
            .query_row("SELECT next_seq FROM channels WHERE id = ?1", [id], |row| {
                row.get(0)
            })
            .map_err(|e| self.error(e))?;
        {
            let mut insert = tx
                .prepare_cached(&format!(
                    "INSERT INTO channel_{id} (seq, headers, body) VALUES (?1, ?2, ?3)"
                ))
                .map_err(|e| self.error(e))?;
            let mut headers = Vec::new();
            for (i, event) in events.iter().enumerate() {
                headers.clear();
                encode_headers(&event.headers, &mut headers);
                insert
                    .execute(params![first + i as i64, &headers, &event.body[..]])
                    .map_err(|e| self.error(e))?;
            }
        }
        tx.execute(
            "UPDATE channels SET next_seq = ?1 WHERE id = ?2",
            params![first + events.len() as i64, id],
        )
        .map_err(|e| self.error(e))?;
        if let Some((source, checkpoint)) = checkpoint {
            save_checkpoint(&tx, source, checkpoint).map_err(|e| self.error(e))?;
        }
        tx.commit().map_err(|e| self.error(e))?;
        Ok(first as u64)
    }

    /// Reads up to `max` events of `channel` with sequence numbers from `from` on.
    pub fn read(&self, channel: &str, from: u64, max: usize) -> Result<StoredEvents, StateError> {
        // Only a channel never seen needs the writer (to create its table); otherwise a read
        // must not wait behind a put's fsync.
        let id = match self.known_channel_id(channel) {
            Some(id) => id,
            None => {
                let writer = lock(&self.0.writer);
                self.channel_id(&writer.conn, channel)?
            }
        };
        let conn = lock(&self.0.reader);
        let mut select = conn
            .prepare_cached(&format!(
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

    /// Deletes the events of `channel` in `seqs` (a committed take).
    pub fn remove(&self, channel: &str, seqs: RangeInclusive<u64>) -> Result<(), StateError> {
        let writer = lock(&self.0.writer);
        let id = self.channel_id(&writer.conn, channel)?;
        writer
            .conn
            .prepare_cached(&format!(
                "DELETE FROM channel_{id} WHERE seq BETWEEN ?1 AND ?2"
            ))
            .and_then(|mut delete| {
                delete.execute(params![*seqs.start() as i64, *seqs.end() as i64])
            })
            .map_err(|e| self.error(e))?;
        Ok(())
    }

    /// Free space of the filesystem holding the database. Pages freed by deleted events stay
    /// inside the database file; [`reclaim_space`](Self::reclaim_space) gives them back.
    pub fn available_bytes(&self) -> Result<u64, StateError> {
        let dir = self.0.path.parent().unwrap_or(Path::new("."));
        let stats = nix::sys::statvfs::statvfs(dir).map_err(|e| StateError::Database {
            path: self.0.path.clone(),
            message: format!("reading free space: {e}"),
        })?;
        Ok((stats.blocks_available() as u64).saturating_mul(stats.fragment_size() as u64))
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
        Ok(())
    }
}

/// Where a durable channel stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelState {
    /// Sequence number of the oldest stored event (equal to `next_seq` when empty).
    pub first_seq: u64,
    /// Sequence number the next put gets.
    pub next_seq: u64,
    /// Events stored.
    pub len: u64,
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

    fn save(&self, source: &str, checkpoint: &Checkpoint) -> Result<(), CheckpointStoreError> {
        let mut writer = lock(&self.0.writer);
        writer
            .set_durability(Durability::Full)
            .and_then(|()| save_checkpoint(&writer.conn, source, checkpoint))
            .map_err(|e| CheckpointStoreError(self.error(e).to_string()))
    }
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
    Ok(())
}

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
    fn take_str(bytes: &mut &[u8]) -> Result<String, String> {
        let n = take_u32(bytes)?;
        String::from_utf8(take(bytes, n)?.to_vec()).map_err(|_| "header is not UTF-8".into())
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
        e.headers.insert("n".into(), i.to_string());
        e
    }

    #[test]
    fn events_and_checkpoint_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = StateStore::open(dir.path()).unwrap();
            let cp = Checkpoint::new(b"pos=3".to_vec());
            let batch: Vec<Event> = (0..3).map(event).collect();
            assert_eq!(
                store
                    .append("c", &batch, Some(("src", &cp)), Durability::Full)
                    .unwrap(),
                1
            );
            assert_eq!(
                store
                    .append("c", &[event(3)], None, Durability::Normal)
                    .unwrap(),
                4
            );
        }
        let store = StateStore::open(dir.path()).unwrap();
        assert_eq!(
            store.load("src").unwrap(),
            Some(Checkpoint::new(b"pos=3".to_vec()))
        );
        let read = store.read("c", 1, 10).unwrap();
        assert_eq!(read.sequences, [1, 2, 3, 4]);
        assert_eq!(read.events[2], event(2));
        assert_eq!(
            store.channel_state("c").unwrap(),
            ChannelState {
                first_seq: 1,
                next_seq: 5,
                len: 4
            }
        );
    }

    #[test]
    fn sequence_numbers_are_never_reused() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path()).unwrap();
        store
            .append("c", &[event(0), event(1)], None, Durability::Full)
            .unwrap();
        store.remove("c", 1..=2).unwrap();
        drop(store);
        let store = StateStore::open(dir.path()).unwrap();
        let state = store.channel_state("c").unwrap();
        assert_eq!((state.first_seq, state.next_seq, state.len), (3, 3, 0));
        assert_eq!(
            store
                .append("c", &[event(2)], None, Durability::Full)
                .unwrap(),
            3
        );
    }

    #[test]
    fn channels_are_independent_and_the_store_is_shared() {
        let dir = tempfile::tempdir().unwrap();
        let a = StateStore::open(dir.path()).unwrap();
        let b = StateStore::open(dir.path()).unwrap();
        assert!(Arc::ptr_eq(&a.0, &b.0));
        a.append("one", &[event(1)], None, Durability::Full)
            .unwrap();
        b.append("two", &[event(2), event(3)], None, Durability::Normal)
            .unwrap();
        assert_eq!(a.read("one", 0, 10).unwrap().events, [event(1)]);
        assert_eq!(a.read("two", 0, 10).unwrap().sequences, [1, 2]);
    }

    #[test]
    fn space_of_removed_events_goes_back_to_the_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path()).unwrap();
        let big: Vec<Event> = (0..2000)
            .map(|_| Event::from_body(vec![7u8; 1000]))
            .collect();
        store.append("c", &big, None, Durability::Normal).unwrap();
        store.reclaim_space().unwrap();
        let file = dir.path().join("state.db");
        let full = std::fs::metadata(&file).unwrap().len();
        assert!(full > 2_000_000, "{full}");
        store.remove("c", 1..=2000).unwrap();
        store.reclaim_space().unwrap();
        let after = std::fs::metadata(&file).unwrap().len();
        assert!(after < full / 10, "{after} bytes left of {full}");
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
