//! The scrubber: a background check of every finished segment's batch CRCs, to find damage
//! on disk before a consumer does.
//!
//! A scrub walks every partition's finished segments (the active one is checked on open and
//! written to), reading each file without holding the partition, with CRC checks (see
//! `log::scan`), at most `log_scrub_bytes_per_sec`. Damage it finds is recorded in the
//! partition, which reports it once and from then on answers CORRUPT_MESSAGE for those
//! offsets while serving the intact batches around them. The first scrub starts with the
//! broker; the next `log_scrub_interval_ms` after one ends. Shutdown stops a scrub within
//! [`MAX_PAUSE`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::api::Context;
use crate::log::scan::{Found, Walk};
use crate::topics::Topics;

/// The longest a scrub sleeps at once to keep to its rate, so it notices a shutdown.
const MAX_PAUSE: Duration = Duration::from_millis(100);

/// Scrubs every `interval` (after the previous scrub ended) at `bytes_per_sec` (0: no limit)
/// until shutdown; does nothing when `interval` is zero.
pub(crate) async fn run(ctx: Arc<Context>, interval: Duration, bytes_per_sec: u64) {
    if interval.is_zero() {
        return;
    }
    loop {
        let job = Arc::clone(&ctx);
        // File reads and pauses: blocking work, off the async threads.
        let _ = tokio::task::spawn_blocking(move || {
            scrub(&job.topics, &job.shutdown, bytes_per_sec);
        })
        .await;
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = ctx.shutdown.cancelled() => return,
        }
    }
}

/// Keeps a background reader to a rate: [`Throttle::pass`] sleeps as long as the bytes read
/// so far are ahead of `bytes_per_sec` (0: no limit), in pauses of at most [`MAX_PAUSE`] so
/// that a shutdown is noticed.
pub(crate) struct Throttle<'a> {
    started: Instant,
    read: u64,
    bytes_per_sec: u64,
    stop: &'a CancellationToken,
}

impl<'a> Throttle<'a> {
    pub(crate) fn new(bytes_per_sec: u64, stop: &'a CancellationToken) -> Throttle<'a> {
        Throttle {
            started: Instant::now(),
            read: 0,
            bytes_per_sec,
            stop,
        }
    }

    /// Counts `bytes` read, waits if they are ahead of the rate; false once shutting down.
    pub(crate) fn pass(&mut self, bytes: u64) -> bool {
        self.read += bytes;
        if self.bytes_per_sec > 0 {
            loop {
                let due = Duration::from_secs_f64(self.read as f64 / self.bytes_per_sec as f64);
                let Some(ahead) = due.checked_sub(self.started.elapsed()) else {
                    break;
                };
                if self.stop.is_cancelled() {
                    break;
                }
                std::thread::sleep(ahead.min(MAX_PAUSE));
            }
        }
        !self.stop.is_cancelled()
    }

    /// Bytes read so far.
    pub(crate) fn bytes(&self) -> u64 {
        self.read
    }
}

/// One scrub of every finished segment of every partition.
fn scrub(topics: &Topics, stop: &CancellationToken, bytes_per_sec: u64) {
    let started = Instant::now();
    let mut throttle = Throttle::new(bytes_per_sec, stop);
    let mut keep_going = |bytes: u64| throttle.pass(bytes);
    for topic in topics.all() {
        for partition in &topic.partitions {
            let targets = partition.log().scrub_targets();
            for target in targets {
                let walk = Walk {
                    file: &target.file,
                    path: &target.path,
                    len: target.len,
                    base_offset: target.base_offset,
                    bound: Some(target.next_offset),
                    verify: true,
                };
                let mut damaged = Vec::new();
                let walked = walk.run(
                    0,
                    target.base_offset,
                    |found| {
                        if let Found::Damage(damage) = found {
                            damaged.push(damage);
                        }
                    },
                    &mut keep_going,
                );
                if let Err(e) = walked {
                    tracing::warn!(topic = %topic.name, partition = partition.index, error = %e, "scrub cannot read a segment");
                }
                if !damaged.is_empty() {
                    partition.log().add_damage(target.base_offset, damaged);
                }
                if stop.is_cancelled() {
                    return;
                }
            }
        }
    }
    tracing::debug!(bytes = throttle.bytes(), elapsed = ?started.elapsed(), "scrubbed the finished segments");
}
