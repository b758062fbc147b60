//! What drives the units of a running pipeline: the source runner ([`source`]) and the sink
//! runner ([`sink`]), one task each.
//!
//! A sink runner takes a batch, sends it to the sink, and keeps its take open while it takes
//! and sends the next ones, up to the sink's [`Pipelining`] bounds (a sink that only delivers
//! has one batch in flight: today's take, deliver, commit). It flushes the sink when a bound
//! is reached or the channel has nothing more ready (an empty or short take; it never waits
//! for events while batches are in flight), then commits the takes oldest first. A failed send
//! or flush rolls every open take back, newest first, so the events return to the channel in
//! their order, and the runner backs off (100 ms doubling to 5 s) before taking them again.
//!
//! A sink group (`sinkgroups:`, see [`crate::sinkgroup`]) is driven by one runner the same
//! way, a sink alone being a group of one: for each round of takes the group's processor names
//! the sinks to try, in order; the batches go to the first, and when it fails they go on to the
//! next at once, their takes still open. Only when every sink named failed are the takes rolled
//! back. Each sink keeps its own counters, start and stop.
//!
//! Shutdown drains: when the stop signal fires (or every source has ended on its own), the
//! sources stop first, so nothing new enters the channels; then each sink runner keeps taking
//! until its channel is empty, and stops. Every event a source acknowledged to its client is
//! therefore delivered before the process exits.

use std::time::Duration;

use ferry_core::Shutdown;

mod sink;
mod source;

pub(crate) use sink::{run_sink, run_sink_group};
pub(crate) use source::run_source;

/// First wait after a failure; doubled on each further failure.
const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// Longest wait between retries (Flume's sink runner backs off up to 5 s).
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Sleeps for `backoff`, then doubles it up to [`MAX_BACKOFF`].
async fn back_off(backoff: &mut Duration) {
    let wait = *backoff;
    *backoff = (*backoff * 2).min(MAX_BACKOFF);
    tokio::time::sleep(wait).await;
}

/// Like [`back_off`], unless `stop` fires first; returns whether it fired.
async fn backoff_or_stop(backoff: &mut Duration, stop: &Shutdown) -> bool {
    tokio::select! {
        _ = back_off(backoff) => stop.is_triggered(),
        _ = stop.wait() => true,
    }
}
