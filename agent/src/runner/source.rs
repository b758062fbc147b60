//! The source runner: runs a source with its context (channels, interceptors, selector,
//! checkpoints), restarting it with backoff after a failure, until it ends or the agent stops.

use std::sync::Arc;
use std::time::Duration;

use ferry_core::{CheckpointStore, Shutdown, SourceContext, SourceOptions};
use tokio::time::Instant;
use tracing::{error, info};

use super::{MAX_BACKOFF, MIN_BACKOFF, backoff_or_stop};
use crate::topology::SourceSpec;

pub(crate) async fn run_source(
    spec: SourceSpec,
    stop: Shutdown,
    store: Arc<dyn CheckpointStore>,
    full_channel_warning: Duration,
) {
    let metrics = spec.metrics.clone();
    let type_name = spec.config.type_name().to_owned();
    metrics.started();
    info!(source = %spec.name, r#type = %type_name, "source started");
    run_source_until_done(spec, stop, store, full_channel_warning).await;
    metrics.stopped();
    info!(source = %metrics.name(), r#type = %type_name, "source stopped");
}

/// Runs a source, restarting it after a failure, until it finishes or the agent stops.
async fn run_source_until_done(
    spec: SourceSpec,
    stop: Shutdown,
    store: Arc<dyn CheckpointStore>,
    full_channel_warning: Duration,
) {
    let SourceSpec {
        name,
        mut source,
        config,
        factory,
        channels,
        interceptors,
        selector,
        metrics,
    } = spec;
    let options = SourceOptions {
        metrics: metrics.clone(),
        full_channel_warning,
        selector,
    };
    let mut backoff = MIN_BACKOFF;
    loop {
        let ctx = match SourceContext::with_options(
            name.clone(),
            channels.clone(),
            interceptors.clone(),
            stop.clone(),
            Arc::clone(&store),
            options.clone(),
        ) {
            Ok(ctx) => ctx,
            Err(e) => {
                error!(source = %name, error = %e, "cannot load the checkpoint; retrying after backoff");
                metrics.failed(format!("cannot load the checkpoint: {e}"));
                if backoff_or_stop(&mut backoff, &stop).await {
                    return;
                }
                continue;
            }
        };
        let started = Instant::now();
        match source.run(ctx).await {
            Ok(()) => {
                info!(source = %name, "source finished");
                return;
            }
            Err(e) => {
                error!(source = %name, error = %e, "source failed; restarting after backoff");
                metrics.failed(&e);
            }
        }
        // A source that ran a good while before failing starts over with a short backoff.
        if started.elapsed() > MAX_BACKOFF * 12 {
            backoff = MIN_BACKOFF;
        }
        if backoff_or_stop(&mut backoff, &stop).await {
            return;
        }
        source = match factory(&config) {
            Ok(source) => source,
            Err(e) => {
                error!(source = %name, error = %e, "cannot rebuild source");
                metrics.failed(format!("cannot rebuild the source: {e}"));
                return;
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use ferry_channels::{MemoryChannel, MemoryChannelConfig};
    use ferry_core::{Channel, Event, MemoryCheckpointStore, MeteredChannel};

    use super::*;

    /// A source on a full channel waits; the wait is counted on the source, and the puts and
    /// takes on the channel, by the counted channel every pipeline's channels are wrapped in.
    #[tokio::test(start_paused = true)]
    async fn a_source_counts_its_wait_on_a_full_channel_and_the_channel_its_puts_and_takes() {
        let metered = Arc::new(MeteredChannel::new(Arc::new(MemoryChannel::new(
            "mem",
            &MemoryChannelConfig {
                capacity: 2,
                transaction_capacity: 2,
                byte_capacity: None,
            },
        ))));
        let options = SourceOptions {
            full_channel_warning: Duration::from_secs(10),
            ..SourceOptions::new("src")
        };
        let source = options.metrics.clone();
        let ctx = SourceContext::with_options(
            "src",
            vec![Arc::clone(&metered) as Arc<dyn Channel>],
            Vec::new(),
            Shutdown::new(),
            Arc::new(MemoryCheckpointStore::default()),
            options,
        )
        .unwrap();
        let events = |n: u32| (0..n).map(|i| Event::from_body(i.to_string())).collect();
        ctx.send(events(2), None).await.unwrap();
        let waiting = tokio::spawn({
            let ctx = ctx.clone();
            async move { ctx.send(events(1), None).await }
        });
        tokio::time::sleep(Duration::from_secs(12)).await;
        assert!(!waiting.is_finished(), "the channel is full");
        let take = metered.take(2, Duration::ZERO).await.unwrap();
        take.commit().await.unwrap();
        waiting.await.unwrap().unwrap();
        let waited = source.counter("ChannelFullWaitMillis").get();
        assert!((12_000..13_000).contains(&waited), "{waited}");
        assert_eq!(source.counter("EventAcceptedCount").get(), 3);
        let counters = metered.metrics();
        metered.refresh();
        assert_eq!(counters.counter("EventPutAttemptCount").get(), 3);
        assert_eq!(counters.counter("EventPutSuccessCount").get(), 3);
        assert_eq!(counters.counter("EventTakeAttemptCount").get(), 2);
        assert_eq!(counters.counter("EventTakeSuccessCount").get(), 2);
        assert_eq!(counters.counter("ChannelSize").get(), 1);
        assert_eq!(counters.counter("ChannelCapacity").get(), 2);
    }
}
