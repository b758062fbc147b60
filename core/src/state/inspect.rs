//! Reading a data directory's state database without changing anything (`agent state`).
//!
//! The database is opened read-only and never locked for writing, so a running agent is not
//! disturbed and a stopped one's files stay as they are, byte for byte:
//!
//! - With a `state.db-wal` and `state.db-shm` next to it (the agent runs, or stopped without
//!   closing the database), it is opened `mode=ro` with `readonly_shm=1`: the committed
//!   transactions in the WAL are read, and the shared-memory index is only read, never
//!   rebuilt or marked (a plain read-only connection would rewrite it after a crash).
//! - Without a WAL file (the agent closed the database), it is opened `immutable=1`: nothing
//!   else is opened or created (a read-only connection would create an empty WAL file).
//! - A WAL file without its `-shm` index cannot be read without creating one; the database
//!   file alone is read then, and [`StateSnapshot::notes`] says so.
//!
//! Everything is read in one read transaction, so the numbers are of one moment. (Should the
//! agent close the database between the look for its WAL file and the open, the open fails
//! and may leave an empty WAL file, which the next agent to open the database removes: read
//! again.)

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags, OptionalExtension};

use super::{LogIndex, SCHEMA_VERSION, StateError};

/// What a data directory's state database holds, read in one transaction.
#[derive(Clone, Debug, Default)]
pub struct StateSnapshot {
    /// The database file.
    pub path: PathBuf,
    /// `PRAGMA user_version`.
    pub schema_version: i64,
    /// What `PRAGMA integrity_check` found: empty when the database is sound.
    pub integrity_problems: Vec<String>,
    /// Remarks about how the database was read.
    pub notes: Vec<String>,
    /// Source checkpoints, by source name, as stored.
    pub checkpoints: Vec<(String, Vec<u8>)>,
    /// Sink progress records, by sink name, as stored.
    pub sink_progress: Vec<(String, Vec<u8>)>,
    /// File channels, by name.
    pub channels: Vec<(String, LogIndex)>,
}

/// Reads `<data_dir>/state.db` without writing, locking for writing or creating any file.
/// Errors name the directory or file: a missing directory or database, a file that is not a
/// database, a schema newer than this build knows.
pub fn read_state(data_dir: &Path) -> Result<StateSnapshot, StateError> {
    let path = data_dir.join("state.db");
    let error = |message: String| StateError::Database {
        path: path.clone(),
        message,
    };
    match std::fs::metadata(data_dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            return Err(StateError::Database {
                path: data_dir.to_owned(),
                message: "not a directory".into(),
            });
        }
        Err(e) => {
            return Err(StateError::Database {
                path: data_dir.to_owned(),
                message: format!("no data directory here: {e}"),
            });
        }
    }
    if !path.is_file() {
        return Err(error(
            "no state database (has an agent run with this data_dir?)".into(),
        ));
    }
    let mut notes = Vec::new();
    let wal = sibling(&path, "-wal").exists();
    let shm = sibling(&path, "-shm").exists();
    let parameters = match (wal, shm) {
        (true, true) => "mode=ro&readonly_shm=1",
        (true, false) => {
            notes.push(
                "state.db-wal has no state.db-shm beside it: only state.db was read, \
                 transactions still in the WAL are not shown"
                    .into(),
            );
            "immutable=1"
        }
        (false, _) => "immutable=1",
    };
    let uri = format!("file:{}?{parameters}", uri_path(&path)?);
    let conn = Connection::open_with_flags(
        &uri,
        OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| error(e.to_string()))?;
    conn.busy_timeout(std::time::Duration::from_secs(10))
        .map_err(|e| error(e.to_string()))?;
    let mut snapshot = read_retrying(&conn).map_err(|e| error(describe(&e)))?;
    if snapshot.schema_version > SCHEMA_VERSION {
        return Err(error(format!(
            "schema version {} is newer than this agent understands ({SCHEMA_VERSION}); use a newer agent",
            snapshot.schema_version
        )));
    }
    snapshot.path = path;
    snapshot.notes.splice(0..0, notes);
    Ok(snapshot)
}

/// `path` with `suffix` appended to its file name (`state.db` → `state.db-wal`).
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// `path` as the path of an SQLite `file:` URI: absolute, with `%`, `?` and `#` escaped.
fn uri_path(path: &Path) -> Result<String, StateError> {
    let absolute = std::path::absolute(path).map_err(|e| StateError::Database {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    let Some(text) = absolute.to_str() else {
        return Err(StateError::Database {
            path: path.to_owned(),
            message: "the path is not UTF-8".into(),
        });
    };
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '%' => out.push_str("%25"),
            '?' => out.push_str("%3F"),
            '#' => out.push_str("%23"),
            c => out.push(c),
        }
    }
    Ok(out)
}

/// SQLite's message, with a hint where the usual one is terse.
fn describe(error: &rusqlite::Error) -> String {
    match error.sqlite_error_code() {
        Some(rusqlite::ErrorCode::NotADatabase) => "not an SQLite state database".into(),
        Some(rusqlite::ErrorCode::DatabaseCorrupt) => format!("damaged: {error}"),
        _ => error.to_string(),
    }
}

/// Reads again while a running agent's writes keep the WAL from being read consistently (a
/// reader that may not write the shared-memory index retries where others would wait).
fn read_retrying(conn: &Connection) -> rusqlite::Result<StateSnapshot> {
    let mut attempt = 0;
    loop {
        match read_in_transaction(conn) {
            Err(e) if attempt < 10 && is_transient(&e) => {
                attempt += 1;
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            read => return read,
        }
    }
}

fn is_transient(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(
            rusqlite::ErrorCode::DatabaseBusy
                | rusqlite::ErrorCode::DatabaseLocked
                | rusqlite::ErrorCode::FileLockingProtocolFailed
        )
    )
}

fn read_in_transaction(conn: &Connection) -> rusqlite::Result<StateSnapshot> {
    // A deferred transaction reads one snapshot of the database and writes nothing.
    conn.execute_batch("BEGIN")?;
    let snapshot = read_tables(conn);
    let _ = conn.execute_batch("COMMIT");
    snapshot
}

fn read_tables(conn: &Connection) -> rusqlite::Result<StateSnapshot> {
    let schema_version: i64 = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    let mut snapshot = StateSnapshot {
        schema_version,
        ..StateSnapshot::default()
    };
    // Damage found while reading or checking is a finding, not a failure to read: the rows
    // first (SQLite may refuse more reads after the check met damage), then the check.
    if let Err(e) = read_rows(conn, &mut snapshot) {
        snapshot
            .integrity_problems
            .push(format!("reading the tables: {}", describe(&e)));
    }
    match integrity_problems(conn) {
        Ok(problems) => snapshot.integrity_problems.extend(problems),
        Err(e) => snapshot.integrity_problems.push(describe(&e)),
    }
    Ok(snapshot)
}

/// The rows of every table into `snapshot`.
fn read_rows(conn: &Connection, snapshot: &mut StateSnapshot) -> rusqlite::Result<()> {
    let schema_version = snapshot.schema_version;
    if !(1..=SCHEMA_VERSION).contains(&schema_version) {
        if schema_version < 1 {
            snapshot
                .notes
                .push("the database has no tables yet (schema version 0)".into());
        }
        return Ok(());
    }
    snapshot.checkpoints = pairs(
        conn,
        "SELECT source, checkpoint FROM checkpoints ORDER BY source",
    )?;
    snapshot.sink_progress = pairs(
        conn,
        "SELECT sink, progress FROM sink_progress ORDER BY sink",
    )?;
    let channels: Vec<(i64, String, i64)> = conn
        .prepare("SELECT id, name, next_seq FROM channels ORDER BY name")?
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (id, name, next_seq) in channels {
        let index = channel_index(conn, schema_version, id, next_seq)?;
        if index.legacy_rows {
            snapshot.notes.push(format!(
                "channel `{name}` still holds events in the row format of schema version 1 \
                 (table channel_{id}); the agent moves them to segments at its next start"
            ));
        }
        snapshot.channels.push((name, index));
    }
    Ok(())
}

/// Every line of `PRAGMA integrity_check` other than `ok`.
fn integrity_problems(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    let lines: Vec<String> = conn
        .prepare("PRAGMA integrity_check")?
        .query_map([], |row| row.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(lines.into_iter().filter(|line| line != "ok").collect())
}

fn pairs(conn: &Connection, sql: &str) -> rusqlite::Result<Vec<(String, Vec<u8>)>> {
    conn.prepare(sql)?
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect()
}

fn channel_index(
    conn: &Connection,
    schema_version: i64,
    id: i64,
    next_seq: i64,
) -> rusqlite::Result<LogIndex> {
    let legacy_rows: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)",
        [format!("channel_{id}")],
        |row| row.get(0),
    )?;
    let mut index = LogIndex {
        id: id as u64,
        next_seq: next_seq as u64,
        taken_seq: next_seq as u64,
        legacy_rows,
        ..LogIndex::default()
    };
    if legacy_rows {
        // The table name is made of the integer id, not of any text from the file.
        let rows: i64 =
            conn.query_row(&format!("SELECT COUNT(*) FROM channel_{id}"), [], |row| {
                row.get(0)
            })?;
        index.stored = rows as u64;
    }
    if schema_version < 2 {
        return Ok(index);
    }
    let row: Option<(Option<i64>, i64, i64, i64)> = conn
        .query_row(
            "SELECT end_segment, end_offset, taken_seq, stored FROM channel_log WHERE id = ?1",
            [id],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
        )
        .optional()?;
    if let Some((segment, offset, taken, stored)) = row {
        index.end = segment.map(|s| (s as u64, offset as u64));
        index.taken_seq = taken as u64;
        index.stored += stored as u64;
    }
    index.segments = conn
        .prepare("SELECT base_seq FROM channel_segments WHERE channel = ?1 ORDER BY base_seq")?
        .query_map([id], |row| row.get::<_, i64>(0).map(|s| s as u64))?
        .collect::<rusqlite::Result<_>>()?;
    index.taken = conn
        .prepare(
            "SELECT first_seq, last_seq FROM channel_taken WHERE channel = ?1 ORDER BY first_seq",
        )?
        .query_map([id], |row| {
            Ok((row.get::<_, i64>(0)? as u64, row.get::<_, i64>(1)? as u64))
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::StateStore;

    /// Every file of `dir` with its bytes and modification time.
    fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>, std::time::SystemTime)> {
        let mut out: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let path = e.unwrap().path();
                let meta = std::fs::metadata(&path).unwrap();
                (
                    path.clone(),
                    std::fs::read(&path).unwrap(),
                    meta.modified().unwrap(),
                )
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn reads_progress_of_an_open_store_and_changes_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path()).unwrap();
        store.save_progress("out", b"seq=41").unwrap();
        // In one process the shared-memory index is shared with the store's connection (the
        // end-to-end tests check it across processes): compare the other files.
        let without_shm = |files: Vec<(PathBuf, Vec<u8>, std::time::SystemTime)>| {
            files
                .into_iter()
                .filter(|(p, _, _)| !p.to_string_lossy().ends_with("-shm"))
                .collect::<Vec<_>>()
        };
        let before = without_shm(files(dir.path()));
        let snapshot = read_state(dir.path()).unwrap();
        assert_eq!(
            snapshot.sink_progress,
            vec![("out".into(), b"seq=41".to_vec())]
        );
        assert!(snapshot.integrity_problems.is_empty());
        assert_eq!(snapshot.schema_version, SCHEMA_VERSION);
        assert_eq!(without_shm(files(dir.path())), before);
        drop(store);
        let closed = files(dir.path());
        let snapshot = read_state(dir.path()).unwrap();
        assert_eq!(snapshot.sink_progress.len(), 1);
        assert_eq!(files(dir.path()), closed);
    }

    #[test]
    fn missing_directories_databases_and_other_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let err = read_state(&dir.path().join("nope"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("nope") && err.contains("no data directory"),
            "{err}"
        );
        let err = read_state(dir.path()).unwrap_err().to_string();
        assert!(err.contains("state.db: no state database"), "{err}");
        std::fs::write(dir.path().join("state.db"), vec![b'x'; 4096]).unwrap();
        let err = read_state(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("state.db: not an SQLite state database"),
            "{err}"
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        drop(StateStore::open(dir.path()).unwrap());
        Connection::open(dir.path().join("state.db"))
            .unwrap()
            .execute_batch("PRAGMA user_version = 99")
            .unwrap();
        let err = read_state(dir.path()).unwrap_err().to_string();
        assert!(err.contains("schema version 99 is newer"), "{err}");
    }
}
