//! `taildir`: Flume's `TaildirSource`. Tails every file matched by the globs of its file
//! groups, one event per line (or per joined multi-line message), and resumes after a restart
//! exactly where the delivered events end.
//!
//! # Positions and delivery
//!
//! Each batch is sent with a checkpoint holding the position of every known file (format in
//! `taildir/checkpoint.rs`): the byte just after the last line in an event of this batch or an
//! earlier one. Lines held back (a partial last line, an event still being joined) are
//! not covered, so a restart reads them again instead of losing them. With a durable channel
//! the checkpoint is committed with the events; with a memory channel once they are delivered.
//! On start, every file found with a saved position resumes from it.
//!
//! # Telling files apart
//!
//! A file is its device and inode plus a fingerprint of its first bytes (see
//! `file_id.rs`): a saved position is used only for the same inode with the same first
//! bytes, so a new file that reuses a deleted file's inode is read from its start.
//!
//! - **Rename rotation** (`app.log` → `app.log.1`, new `app.log`): the renamed file is the same
//!   inode, so it is read to its end through the handle already open (or found again in its
//!   directory), then released once it stayed idle for `idle_timeout`; the new `app.log` is a
//!   new file, read from its start.
//! - **copytruncate**: a file shorter than what was read, or whose first bytes changed, is read
//!   again from its start. (Do not let the globs match the copy: it is a new file.)
//! - **Deleted** files are read to their end through the open handle and released.
//!
//! # Finding data promptly
//!
//! Filesystem notifications (`notify`: inotify on Linux) on the directories of the globs wake
//! the source when a file is created, renamed or written; the globs are also expanded and
//! every file checked each `poll_interval`, so nothing depends on notifications arriving.
//! Reading is in 64 KiB reads, split into lines without copying, on a blocking thread.

mod checkpoint;
mod config;
mod files;
pub(crate) mod inspect;
mod reader;
#[cfg(test)]
mod tests;

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use ferry_core::{
    ComponentConfig, ConfigError, Headers, Source, SourceContext, SourceError, async_trait,
};
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::Notify;

pub use config::{MultilineConfig, TaildirConfig};

use self::config::Multiline;
use self::files::{Group, TailedFiles};
use self::reader::EventOptions;

/// The taildir source.
#[derive(Debug)]
pub struct TaildirSource {
    config: TaildirConfig,
    groups: Vec<Group>,
    group_headers: Vec<Headers>,
    multiline: Option<Multiline>,
}

impl TaildirSource {
    /// Validates the options.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        let config: TaildirConfig = cfg.parse()?;
        if config.filegroups.is_empty() {
            return Err(cfg.error_at(
                "filegroups",
                "`filegroups` needs at least one group, e.g. `{ app: /var/log/app/*.log }`",
            ));
        }
        let mut groups = Vec::new();
        let mut group_headers = Vec::new();
        for (name, pattern) in &config.filegroups {
            if let Err(error) = glob::Pattern::new(pattern) {
                return Err(cfg.error_at(
                    "filegroups",
                    format!("`filegroups.{name}`: invalid glob `{pattern}`: {error}"),
                ));
            }
            groups.push(Group {
                name: name.clone(),
                pattern: pattern.clone(),
            });
            group_headers.push(
                config
                    .headers
                    .get(name)
                    .cloned()
                    .map(Headers::from)
                    .unwrap_or_default(),
            );
        }
        if let Some(name) = config
            .headers
            .keys()
            .find(|name| !config.filegroups.contains_key(*name))
        {
            return Err(cfg.error_at(
                "headers",
                ferry_core::config::unknown_name_message(
                    "file group",
                    name,
                    config.filegroups.keys().map(String::as_str),
                ),
            ));
        }
        if config.batch_size == 0 {
            return Err(cfg.error_at("batch_size", "`batch_size` must be at least 1"));
        }
        if config.max_line_length.bytes() == 0 {
            return Err(cfg.error_at("max_line_length", "`max_line_length` must be at least 1"));
        }
        if config.poll_interval.is_zero() {
            return Err(cfg.error_at("poll_interval", "`poll_interval` must be more than 0"));
        }
        let multiline = config
            .multiline
            .as_ref()
            .map(|m| Multiline::build(cfg, m))
            .transpose()?;
        Ok(Self {
            config,
            groups,
            group_headers,
            multiline,
        })
    }

    /// The positions to start from: the checkpoint, or on first start the Flume position
    /// file.
    fn resume_positions(
        &self,
        ctx: &SourceContext,
    ) -> Result<(Vec<checkpoint::Position>, Vec<checkpoint::FlumePosition>), SourceError> {
        if let Some(saved) = ctx.checkpoint() {
            return Ok((checkpoint::decode(saved)?, Vec::new()));
        }
        match &self.config.flume_position_file {
            // Flume writes the file once it has run: without one there is nothing to import.
            Some(path) if !path.exists() => {
                tracing::info!(
                    source = ctx.name(),
                    path = %path.display(),
                    "first start: no Flume position file to import"
                );
                Ok((Vec::new(), Vec::new()))
            }
            Some(path) => {
                let flume = checkpoint::read_flume_positions(path)?;
                tracing::info!(
                    source = ctx.name(),
                    path = %path.display(),
                    files = flume.len(),
                    "first start: importing the Flume position file"
                );
                Ok((Vec::new(), flume))
            }
            None => Ok((Vec::new(), Vec::new())),
        }
    }
}

/// Wakes the source from filesystem notifications.
#[derive(Default)]
struct Wakeup {
    notify: Notify,
    /// A file may have appeared, been renamed or been deleted: expand the globs again.
    rescan: AtomicBool,
}

/// The directory to watch for a glob, and whether below it too: the part of the path before
/// the first component with a wildcard.
fn watch_root(pattern: &str) -> (PathBuf, RecursiveMode) {
    let components: Vec<Component<'_>> = Path::new(pattern).components().collect();
    let mut root = PathBuf::new();
    for (i, component) in components.iter().enumerate() {
        let last = i + 1 == components.len();
        let text = component.as_os_str().to_string_lossy();
        if text.contains(['*', '?', '[']) {
            let mode = if last {
                RecursiveMode::NonRecursive
            } else {
                RecursiveMode::Recursive
            };
            return (dir_or_dot(root), mode);
        }
        if last {
            break;
        }
        root.push(component);
    }
    (dir_or_dot(root), RecursiveMode::NonRecursive)
}

fn dir_or_dot(dir: PathBuf) -> PathBuf {
    if dir.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        dir
    }
}

/// The filesystem watcher and the directories it could not watch yet (they may appear later).
struct Watch {
    watcher: Option<notify::RecommendedWatcher>,
    pending: Vec<(PathBuf, RecursiveMode)>,
}

impl Watch {
    fn new(source: &str, groups: &[Group], wakeup: &Arc<Wakeup>) -> Self {
        let wake = Arc::clone(wakeup);
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            let rescan = match event {
                Ok(event) => match event.kind {
                    EventKind::Access(_) => return,
                    EventKind::Modify(notify::event::ModifyKind::Data(_)) => false,
                    _ => true,
                },
                Err(_) => true,
            };
            if rescan {
                wake.rescan.store(true, Ordering::Release);
            }
            wake.notify.notify_one();
        });
        let watcher = match watcher {
            Ok(watcher) => Some(watcher),
            Err(error) => {
                tracing::warn!(source, %error, "no filesystem notifications; polling only");
                None
            }
        };
        let mut pending: Vec<(PathBuf, RecursiveMode)> =
            groups.iter().map(|g| watch_root(&g.pattern)).collect();
        pending.sort_by(|a, b| a.0.cmp(&b.0));
        pending.dedup_by(|a, b| a.0 == b.0);
        Self { watcher, pending }
    }

    /// Watches the directories not watched yet (they may not have existed before).
    fn retry(&mut self) {
        let Some(watcher) = &mut self.watcher else {
            return;
        };
        self.pending
            .retain(|(dir, mode)| watcher.watch(dir, *mode).is_err());
    }
}

#[async_trait]
impl Source for TaildirSource {
    fn max_batch_size(&self) -> Option<usize> {
        Some(self.config.batch_size)
    }

    /// Positions are `inode-headcrc-offset` (see `TailedFile::position`).
    fn sets_positions(&self) -> bool {
        true
    }

    async fn run(self: Box<Self>, ctx: SourceContext) -> Result<(), SourceError> {
        let (restored, flume) = self.resume_positions(&ctx)?;
        let capacity = self
            .config
            .batch_size
            .min(crate::transaction_capacity(&ctx));
        let poll_interval = self.config.poll_interval;
        let wakeup = Arc::new(Wakeup::default());
        let mut watch = Watch::new(ctx.name(), &self.groups, &wakeup);
        let options = EventOptions {
            file_header_key: self
                .config
                .file_header
                .then(|| self.config.file_header_key.clone()),
            byte_offset_header: self.config.byte_offset_header,
            position_header: ctx.position_header().map(str::to_owned),
            multiline: self.multiline.clone(),
            partial_line_flush: self.config.partial_line_flush,
            max_line_length: usize::try_from(self.config.max_line_length.bytes())
                .unwrap_or(usize::MAX),
        };
        let mut files = Some(TailedFiles::new(
            ctx.name().to_owned(),
            self.groups.clone(),
            self.group_headers.clone(),
            options,
            self.config.idle_timeout,
            self.config.skip_to_end,
            restored,
            flume,
        ));
        let mut next_scan = Instant::now();
        while !ctx.shutdown().is_triggered() {
            let now = Instant::now();
            let notified = wakeup.rescan.swap(false, Ordering::AcqRel);
            let rescan = notified || now >= next_scan;
            if rescan {
                // Watch first, then scan: a file created in between is seen by the scan.
                watch.retry();
                next_scan = now + poll_interval;
            }
            let Some(mut taken) = files.take() else {
                break;
            };
            let (returned, round, positions, deadline, behind) =
                tokio::task::spawn_blocking(move || {
                    let now = Instant::now();
                    let behind = rescan.then(|| {
                        taken.scan(now);
                        taken.bytes_behind()
                    });
                    let round = taken.read(capacity, now);
                    let positions = (!round.events.is_empty())
                        .then(|| checkpoint::encode(taken.positions().iter()));
                    let deadline = taken.next_deadline();
                    (taken, round, positions, deadline, behind)
                })
                .await
                .map_err(|e| SourceError::Other(format!("taildir reader failed: {e}")))?;
            files = Some(returned);
            if let Some(behind) = behind {
                ctx.metrics().set_items("FileBytesBehind", "file", behind);
            }
            if !round.events.is_empty() {
                ctx.send(round.events, positions).await?;
            }
            if round.more {
                tokio::task::yield_now().await;
                continue;
            }
            let wake_at = deadline.map_or(next_scan, |d| d.min(next_scan));
            tokio::select! {
                _ = ctx.shutdown().wait() => break,
                _ = wakeup.notify.notified() => {}
                _ = tokio::time::sleep_until(wake_at.into()) => {}
            }
        }
        Ok(())
    }
}
