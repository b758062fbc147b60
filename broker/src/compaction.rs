//! The log cleaner's schedule: every `log_cleaner_backoff_ms` (after the previous round ended)
//! each partition of a compacted topic whose pass is due is cleaned (see `log::cleaner`), one
//! at a time, its reads kept to `log_cleaner_io_max_bytes_per_second`. A partition is held
//! only to plan a pass and to swap the cleaned segments in; producers and consumers go on
//! while its segments are read and rewritten. Shutdown stops a pass, which the next start
//! removes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::api::Context;
use crate::log::cleaner::{self, CleanError, Limits};
use crate::scrub::Throttle;
use crate::topics::Topics;

/// The cleaner's settings, from the broker's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    pub(crate) backoff: Duration,
    pub(crate) bytes_per_sec: u64,
    pub(crate) limits: Limits,
}

/// Cleans until shutdown.
pub(crate) async fn run(ctx: Arc<Context>, settings: Settings) {
    loop {
        let job = Arc::clone(&ctx);
        // File reads and writes: blocking work, off the async threads.
        let _ = tokio::task::spawn_blocking(move || {
            clean_all(&job.topics, &job.shutdown, settings);
        })
        .await;
        tokio::select! {
            _ = tokio::time::sleep(settings.backoff) => {}
            _ = ctx.shutdown.cancelled() => return,
        }
    }
}

/// One round: a pass over each partition whose pass is due.
fn clean_all(topics: &Topics, stop: &CancellationToken, settings: Settings) {
    let mut throttle = Throttle::new(settings.bytes_per_sec, stop);
    for topic in topics.all() {
        for partition in &topic.partitions {
            if stop.is_cancelled() {
                return;
            }
            let plan = partition.log().cleaning_plan(crate::log::now_ms());
            let plan = match plan {
                Ok(Some(plan)) => plan,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(topic = %topic.name, partition = partition.index, error = %e, "cannot plan a compaction pass");
                    continue;
                }
            };
            let started = Instant::now();
            match cleaner::clean(&plan, settings.limits, &mut |bytes| throttle.pass(bytes)) {
                Ok(Some(cleaned)) => match partition.log().install_cleaned(&cleaned) {
                    Ok(true) => tracing::info!(
                        topic = %topic.name,
                        partition = partition.index,
                        bytes_before = cleaned.bytes_before,
                        bytes_after = cleaned.bytes_after,
                        records_removed = cleaned.records_removed,
                        elapsed = ?started.elapsed(),
                        "compacted the log"
                    ),
                    Ok(false) => {}
                    Err(e) => tracing::error!(
                        topic = %topic.name, partition = partition.index, error = %e,
                        "cannot swap the cleaned segments in; the next start finishes the swap"
                    ),
                },
                Ok(None) => return,
                Err(CleanError::Damaged { path, position, .. }) => {
                    // Recorded and reported by the partition; cleaning stops before it.
                    partition.log().damage_met(&path, position);
                }
                Err(CleanError::Storage(e)) => {
                    tracing::warn!(topic = %topic.name, partition = partition.index, error = %e, "a compaction pass failed");
                }
            }
        }
    }
}
