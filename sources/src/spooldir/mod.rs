//! `spooldir`: Flume's `SpoolDirectorySource`. Reads the files dropped into a directory, one
//! at a time and one event per line, and renames each (or deletes it) once all its events
//! were sent.
//!
//! # Contract, as in Flume
//!
//! A file must be complete when it appears in the directory (write it elsewhere and move it
//! in) and must not change afterwards; a name must not be used twice. Hidden files (starting
//! with `.`) and files ending in `file_suffix` are never read.
//!
//! # Positions and delivery
//!
//! Each batch goes with a checkpoint naming the file being read (device, inode, fingerprint
//! of its first bytes) and the byte just after its last line in the batch (format in
//! `spooldir/checkpoint.rs`). A restarted source continues that file from there, so a partly
//! read file is neither read again (with a durable channel) nor skipped. A file is renamed (or
//! deleted) only after the put of its last batch returned `Ok`.
//!
//! Through a channel that is not durable (memory), a checkpoint is saved only once the sinks
//! delivered everything before it, while files are completed as soon as their events are in
//! the channel. So each checkpoint also carries a completion mark: the change time of the
//! newest completed file when it was sent. A restarted source first finishes the file of the
//! checkpoint (under its completed name if need be), then reads again, oldest first, every
//! completed file changed after the mark (at-least-once: their events may have been lost with
//! the channel). Through durable channels this never happens (exactly-once).
//!
//! # Errors are per file
//!
//! A file that changed while it was read, or whose name was already completed (`name` and
//! `name.COMPLETED` both exist), is reported (an `ERROR` log naming the file) and left where
//! it is; the source goes on with the other files. The report is remembered in the checkpoint,
//! so the file is not read again until it is removed or replaced by another file. The events
//! already sent from a file that changed stay sent.

mod checkpoint;
mod config;
pub(crate) mod inspect;
mod reader;
#[cfg(test)]
mod tests;

use bytes::Bytes;
use ferry_core::{
    ComponentConfig, ConfigError, Event, Headers, Source, SourceContext, SourceError, async_trait,
};
use regex::Regex;

pub use config::{ConsumeOrder, DeletePolicy, SpooldirConfig};

use self::checkpoint::{Failed, SpoolState};
use self::reader::{Next, Selection, SpoolFile};

/// The spooling directory source.
#[derive(Debug)]
pub struct SpooldirSource {
    config: SpooldirConfig,
    selection: Selection,
}

impl SpooldirSource {
    /// Validates the options.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        let config: SpooldirConfig = cfg.parse()?;
        let regex = |key: &str, pattern: &str| {
            Regex::new(pattern).map_err(|e| {
                cfg.error_at(
                    key,
                    format!("`{key}`: invalid regular expression `{pattern}`: {e}"),
                )
            })
        };
        let include = regex("include_pattern", &config.include_pattern)?;
        let ignore = regex("ignore_pattern", &config.ignore_pattern)?;
        if config.file_suffix.is_empty() {
            return Err(cfg.error_at("file_suffix", "`file_suffix` must not be empty"));
        }
        if config.max_line_length.bytes() == 0 {
            return Err(cfg.error_at("max_line_length", "`max_line_length` must be at least 1"));
        }
        if config.batch_size == 0 {
            return Err(cfg.error_at("batch_size", "`batch_size` must be at least 1"));
        }
        if config.poll_delay.is_zero() {
            return Err(cfg.error_at("poll_delay", "`poll_delay` must be more than 0"));
        }
        let selection = Selection {
            dir: config.spool_dir.clone(),
            suffix: config.file_suffix.clone(),
            include,
            ignore,
            order: config.consume_order,
        };
        Ok(Self { config, selection })
    }

    /// The headers of every event of `file`.
    fn headers(&self, file: &SpoolFile) -> Headers {
        let mut headers = Headers::new();
        if self.config.file_header {
            let path = std::path::absolute(&file.name).unwrap_or_else(|_| file.name.clone());
            headers.set(
                self.config.file_header_key.clone(),
                path.to_string_lossy().into_owned(),
            );
        }
        if self.config.basename_header {
            let name = file.name.file_name().unwrap_or_default();
            headers.set(
                self.config.basename_header_key.clone(),
                name.to_string_lossy().into_owned(),
            );
        }
        headers
    }

    /// Sends every line of `file` from where it is positioned, then completes it. Returns
    /// early (the checkpoint keeps the position) on shutdown.
    async fn consume(
        &self,
        ctx: &SourceContext,
        state: &mut SpoolState,
        file: SpoolFile,
    ) -> Result<(), SourceError> {
        let capacity = self.config.batch_size.min(crate::transaction_capacity(ctx));
        let max_length = usize::try_from(self.config.max_line_length.bytes()).unwrap_or(usize::MAX);
        let headers = self.headers(&file);
        let mut file = Some(file);
        let (file, changed) = loop {
            if ctx.shutdown().is_triggered() {
                return Ok(());
            }
            let Some(mut reading) = file.take() else {
                return Ok(());
            };
            let (returned, lines) = blocking(move || {
                let lines = reading.next_lines(capacity, max_length)?;
                let changed = if reading.at_end {
                    reading.changed()?
                } else {
                    None
                };
                Ok((reading, (lines, changed)))
            })
            .await
            .map_err(|e| SourceError::io("reading a spooled file", e))?;
            let (lines, changed) = lines;
            state.current = Some(returned.position());
            if let Some(reason) = &changed {
                report(ctx, &returned.name, reason);
                state.failed.push(Failed {
                    path: returned.name.clone(),
                    key: returned.key,
                });
                // Not resumed after a restart either.
                state.current = None;
            }
            if !lines.is_empty() || changed.is_some() {
                // A spooled file never changes: its inode and fingerprint name it for good.
                let position = ctx.position_header().map(|key| {
                    let id = format!("{}-{:08x}", returned.key.inode, returned.fingerprint.crc);
                    (key, id)
                });
                let events = to_events(lines, &headers, position);
                ctx.send(events, Some(state.encode())).await?;
            }
            if returned.at_end {
                break (returned, changed);
            }
            file = Some(returned);
        };
        if changed.is_some() {
            return Ok(());
        }
        let policy = self.config.delete_policy;
        let suffix = self.config.file_suffix.clone();
        let name = file.name.clone();
        let key = file.key;
        let completed = blocking(move || {
            if !file.already_completed {
                file.complete(policy, &suffix)?;
            }
            let time = file.completion_time(&suffix);
            Ok((file, time))
        })
        .await;
        match completed {
            Ok((file, time)) => {
                if let (Some(mark), Some(time)) = (&mut state.mark, time) {
                    mark.advance(key, time);
                }
                if !file.already_completed {
                    tracing::info!(source = ctx.name(), file = %name.display(), "spooled file completed");
                }
            }
            Err(error) => {
                report(ctx, &name, &format!("it could not be completed: {error}"));
                state.failed.push(Failed { path: name, key });
                state.current = None;
                ctx.send(Vec::new(), Some(state.encode())).await?;
            }
        }
        Ok(())
    }
}

/// Logs that `file` is left in the directory and why.
fn report(ctx: &SourceContext, file: &std::path::Path, reason: &str) {
    tracing::error!(
        source = ctx.name(),
        file = %file.display(),
        "spooled file {} is left in place and skipped: {reason}",
        file.display()
    );
}

/// The events of `lines`, with `position` (header key and file id) if asked for:
/// `inode-fingerprint-offset`.
fn to_events(
    lines: Vec<(u64, Bytes)>,
    headers: &Headers,
    position: Option<(&str, String)>,
) -> Vec<Event> {
    lines
        .into_iter()
        .map(|(offset, line)| {
            let mut event = Event::new(headers.clone(), line);
            if let Some((key, file)) = &position {
                event
                    .headers
                    .set((*key).to_owned(), format!("{file}-{offset}"));
            }
            event
        })
        .collect()
}

/// Runs blocking file work off the async threads.
async fn blocking<T: Send + 'static, R: Send + 'static>(
    work: impl FnOnce() -> std::io::Result<(T, R)> + Send + 'static,
) -> std::io::Result<(T, R)> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(std::io::Error::other)?
}

#[async_trait]
impl Source for SpooldirSource {
    fn max_batch_size(&self) -> Option<usize> {
        Some(self.config.batch_size)
    }

    /// Positions are `inode-fingerprint-offset` of the line.
    fn sets_positions(&self) -> bool {
        true
    }

    async fn run(self: Box<Self>, ctx: SourceContext) -> Result<(), SourceError> {
        let mut state = ctx
            .checkpoint()
            .map(SpoolState::decode)
            .transpose()?
            .unwrap_or_default();
        // Through a channel that is not durable, checkpoints are saved once the sinks delivered,
        // so files completed after the saved one may hold undelivered events: read them again.
        let volatile = ctx.channels().iter().any(|c| !c.is_durable());
        if volatile && self.config.delete_policy == DeletePolicy::Immediate {
            tracing::warn!(
                source = ctx.name(),
                "with `delete_policy: immediate` and a channel that is not durable, files are deleted before their events are delivered: events in the channel when the agent dies are lost"
            );
        }
        let again = match (&state.mark, volatile) {
            (Some(mark), true) => {
                let (selection, mark) = (self.selection.clone(), mark.clone());
                let current = state.current.as_ref().map(|c| c.key);
                blocking(move || Ok((selection.completed_since(&mark, current)?, ())))
                    .await
                    .map_err(|e| SourceError::io("listing completed spooled files", e))?
                    .0
            }
            _ => Vec::new(),
        };
        if state.mark.is_none() {
            let selection = self.selection.clone();
            let (mark, ()) = blocking(move || Ok((selection.start_mark()?, ())))
                .await
                .map_err(|e| {
                    SourceError::io(
                        format!(
                            "reading the spool directory {}",
                            self.config.spool_dir.display()
                        ),
                        e,
                    )
                })?;
            state.mark = Some(mark);
            // Saved at once (nothing is in flight): a restart knows which completions are new.
            ctx.send(Vec::new(), Some(state.encode())).await?;
            // The change-time clock is coarse: a completion from now on is after the mark.
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        if let Some(current) = state.current.clone() {
            let selection = self.selection.clone();
            let resumed = blocking(move || Ok((selection.resume(&current), ())))
                .await
                .map_err(|e| SourceError::io("resuming a spooled file", e))?
                .0;
            match resumed {
                Some(file) => {
                    tracing::info!(source = ctx.name(), file = %file.name.display(), offset = file.offset, "resuming a partly read spooled file");
                    self.consume(&ctx, &mut state, file).await?;
                }
                None => state.current = None,
            }
        }
        for completed in again {
            if ctx.shutdown().is_triggered() {
                return Ok(());
            }
            let selection = self.selection.clone();
            let path = completed.clone();
            match blocking(move || Ok((selection.reopen_completed(&path)?, ()))).await {
                Ok((file, ())) => {
                    tracing::info!(source = ctx.name(), file = %completed.display(), "sending again the events of a file completed after the last delivered checkpoint");
                    self.consume(&ctx, &mut state, file).await?;
                }
                Err(error) => {
                    tracing::warn!(source = ctx.name(), file = %completed.display(), %error, "cannot read a completed file again")
                }
            }
        }
        while !ctx.shutdown().is_triggered() {
            let selection = self.selection.clone();
            let mut failed = std::mem::take(&mut state.failed);
            let (next, failed) = blocking(move || {
                let next = selection.next(&mut failed);
                Ok((next, failed))
            })
            .await
            .map_err(|e| SourceError::io("listing the spool directory", e))?;
            state.failed = failed;
            let next = next.map_err(|e| {
                SourceError::io(
                    format!(
                        "listing the spool directory {}",
                        self.config.spool_dir.display()
                    ),
                    e,
                )
            })?;
            match next {
                Some(Next::Read(file)) => self.consume(&ctx, &mut state, file).await?,
                Some(Next::Reject(failed, reason)) => {
                    report(&ctx, &failed.path, &reason);
                    state.failed.push(failed);
                    ctx.send(Vec::new(), Some(state.encode())).await?;
                }
                None => {
                    tokio::select! {
                        _ = ctx.shutdown().wait() => break,
                        _ = tokio::time::sleep(self.config.poll_delay) => {}
                    }
                }
            }
        }
        Ok(())
    }
}
