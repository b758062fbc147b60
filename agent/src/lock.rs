//! One agent per data directory: an exclusive lock on `<data_dir>/agent.lock`, held while the
//! agent runs. Two agents on one directory would share its state database and channel files
//! and undo each other's work; the second is refused, naming the directory and the first
//! one's process id.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

/// The lock of a data directory; released when dropped (or when the process ends, however
/// it ends: the kernel releases a `flock` with the last descriptor).
pub(crate) struct DataDirLock {
    _lock: Flock<File>,
}

impl DataDirLock {
    /// Takes the lock of `data_dir` (creating the directory), or fails naming the process that
    /// holds it.
    pub(crate) fn acquire(data_dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(data_dir)
            .with_context(|| format!("creating the data directory {}", data_dir.display()))?;
        let path = data_dir.join("agent.lock");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => lock,
            Err((mut file, Errno::EWOULDBLOCK)) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                let holder = if holder.is_empty() {
                    "another process".to_owned()
                } else {
                    format!("the agent with pid {holder}")
                };
                anyhow::bail!(
                    "the data directory {} is in use by {holder} (it holds {}); run each agent with its own `agent.data_dir`",
                    absolute(data_dir).display(),
                    path.display()
                );
            }
            Err((_, errno)) => {
                return Err(std::io::Error::from(errno))
                    .with_context(|| format!("locking {}", path.display()));
            }
        };
        // Who holds it, for the message a second agent prints.
        let written = lock
            .set_len(0)
            .and_then(|()| lock.rewind())
            .and_then(|()| writeln!(lock, "{}", std::process::id()))
            .and_then(|()| lock.flush());
        written.with_context(|| format!("writing {}", path.display()))?;
        Ok(Self { _lock: lock })
    }
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_of_one_directory_is_refused_naming_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let first = DataDirLock::acquire(dir.path()).unwrap();
        // A second open file description conflicts as a second process would.
        let error = DataDirLock::acquire(dir.path()).err().unwrap().to_string();
        assert!(
            error.contains(&format!("pid {}", std::process::id())) && error.contains("in use"),
            "{error}"
        );
        drop(first);
        DataDirLock::acquire(dir.path()).unwrap();
    }
}
