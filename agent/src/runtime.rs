//! Running a topology: one task per source and per sink runner, and an orderly shutdown.
//!
//! Shutdown drains: when the stop signal fires (or every source has ended on its own), the
//! sources stop first, so nothing new enters the channels; then each sink runner keeps taking
//! until its channel is empty, and stops. Every event a source acknowledged to its client is
//! therefore delivered before the process exits.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ferry_broker::Broker;
use ferry_core::state::StateStore;
use ferry_core::{
    CheckpointStore, ComponentMetrics, Counter, Shutdown, SinkBatch, SinkContext, SourceContext,
};
use tokio::task::JoinSet;
use tracing::{error, info, warn};

use crate::topology::{SinkSpec, SourceSpec, Topology};

/// How long a sink runner waits for events before calling the sink's `idle`.
const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// First wait after a failure; doubled on each further failure.
const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// Longest wait between retries (Flume's sink runner backs off up to 5 s).
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// While the agent stops, how long a sink may keep failing before it gives up on a durable
/// channel (whose events wait for the next run).
const DRAIN_GRACE: Duration = Duration::from_secs(10);

/// Runs `topology` until `stop` fires (or every source ends, when there is no broker), then
/// drains and returns.
pub async fn run(topology: Topology, stop: Shutdown) -> anyhow::Result<()> {
    // The broker comes first, so that Kafka components find it, and goes last.
    let broker = match topology.broker.clone() {
        Some(config) => {
            let broker = Broker::start(config)
                .await
                .context("starting the bundled broker")?;
            info!(listen = %broker.local_addr(), "bundled broker started");
            Some(broker)
        }
        None => None,
    };
    let result = run_pipeline(topology, stop.clone()).await;
    if let Some(broker) = broker {
        if result.is_ok() {
            // With a broker the agent serves until it is told to stop, even when every
            // source has ended.
            stop.wait().await;
        }
        broker.shutdown().await;
        info!("bundled broker stopped");
    }
    result
}

/// Runs the sources, channels and sinks until `stop` fires or every source ends.
async fn run_pipeline(topology: Topology, stop: Shutdown) -> anyhow::Result<()> {
    let data_dir = topology.agent.data_dir.clone();
    let state = tokio::task::spawn_blocking(move || StateStore::open(&data_dir))
        .await?
        .context("opening the agent's state store")?;
    for channel in topology.channels.values() {
        channel
            .start()
            .await
            .with_context(|| format!("starting channel `{}`", channel.name()))?;
    }
    let store: Arc<dyn CheckpointStore> = Arc::new(state.clone());
    let source_stop = stop.child();
    let drain = Shutdown::new();

    let has_sources = !topology.sources.is_empty();
    let mut sources = JoinSet::new();
    for spec in topology.sources {
        sources.spawn(run_source(spec, source_stop.clone(), Arc::clone(&store)));
    }
    let mut sinks = JoinSet::new();
    for spec in topology.sinks {
        sinks.spawn(run_sink(spec, drain.clone(), state.clone()));
    }
    info!(
        sources = sources.len(),
        sinks = sinks.len(),
        channels = topology.channels.len(),
        "pipeline started"
    );

    if has_sources {
        while let Some(result) = sources.join_next().await {
            if let Err(e) = result {
                error!(error = %e, "a source task panicked");
            }
        }
    } else {
        stop.wait().await;
    }
    info!("sources stopped; draining channels");
    drain.trigger();
    while let Some(result) = sinks.join_next().await {
        if let Err(e) = result {
            error!(error = %e, "a sink task panicked");
        }
    }
    info!("pipeline stopped");
    Ok(())
}

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

async fn run_source(spec: SourceSpec, stop: Shutdown, store: Arc<dyn CheckpointStore>) {
    let SourceSpec {
        name,
        mut source,
        config,
        factory,
        channels,
        interceptors,
    } = spec;
    let mut backoff = MIN_BACKOFF;
    loop {
        let ctx = match SourceContext::new(
            name.clone(),
            channels.clone(),
            interceptors.clone(),
            stop.clone(),
            Arc::clone(&store),
        ) {
            Ok(ctx) => ctx,
            Err(e) => {
                error!(source = %name, error = %e, "cannot load the checkpoint; retrying after backoff");
                if backoff_or_stop(&mut backoff, &stop).await {
                    return;
                }
                continue;
            }
        };
        let started = tokio::time::Instant::now();
        match source.run(ctx).await {
            Ok(()) => {
                info!(source = %name, "source finished");
                return;
            }
            Err(e) => {
                error!(source = %name, error = %e, "source failed; restarting after backoff");
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
                return;
            }
        };
    }
}

struct SinkCounters {
    batches_complete: Counter,
    batches_underflow: Counter,
    batches_empty: Counter,
    drain_attempts: Counter,
    drain_successes: Counter,
    failures: Counter,
}

impl SinkCounters {
    fn new(metrics: &ComponentMetrics) -> Self {
        Self {
            batches_complete: metrics.counter("BatchCompleteCount"),
            batches_underflow: metrics.counter("BatchUnderflowCount"),
            batches_empty: metrics.counter("BatchEmptyCount"),
            drain_attempts: metrics.counter("EventDrainAttemptCount"),
            drain_successes: metrics.counter("EventDrainSuccessCount"),
            failures: metrics.counter("EventWriteFailCount"),
        }
    }
}

async fn run_sink(spec: SinkSpec, drain: Shutdown, state: StateStore) {
    let SinkSpec {
        name,
        mut sink,
        channel,
        batch_size,
        ..
    } = spec;
    let ctx = SinkContext {
        name: name.clone(),
        metrics: ComponentMetrics::new("sink", name.clone()),
        state: Some(state),
    };
    let counters = SinkCounters::new(&ctx.metrics);
    let mut backoff = MIN_BACKOFF;
    while let Err(e) = sink.start(&ctx).await {
        if drain.is_triggered() {
            // Nothing was taken: what the channel holds stays there (in a durable channel,
            // for the next run).
            error!(sink = %name, error = %e, "sink cannot start; giving up, the agent is stopping");
            return;
        }
        error!(sink = %name, error = %e, "sink cannot start; retrying");
        if backoff_or_stop(&mut backoff, &drain).await {
            continue;
        }
    }
    backoff = MIN_BACKOFF;
    let mut failing_since: Option<tokio::time::Instant> = None;
    loop {
        if drain.is_triggered() && channel.is_empty() {
            break;
        }
        let take = tokio::select! {
            take = channel.take(batch_size, POLL_INTERVAL) => take,
            // Taking is cancel-safe: nothing leaves the channel until `take` returns.
            _ = drain.wait(), if !drain.is_triggered() => continue,
        };
        let take = match take {
            Ok(take) => take,
            Err(e) => {
                error!(sink = %name, error = %e, "cannot take from channel");
                back_off(&mut backoff).await;
                continue;
            }
        };
        let n = take.events().len();
        if n == 0 {
            counters.batches_empty.inc();
            drop(take);
            if let Err(e) = sink.idle().await {
                warn!(sink = %name, error = %e, "sink idle work failed");
            }
            continue;
        }
        counters.drain_attempts.add(n as u64);
        let delivered = sink
            .deliver(SinkBatch {
                events: take.events(),
                sequences: take.sequences(),
            })
            .await;
        match delivered {
            Ok(()) => {
                if let Err(e) = take.commit().await {
                    // The events were delivered but stay in the channel: they will be
                    // delivered again (at-least-once), never lost.
                    error!(sink = %name, error = %e, "cannot commit take");
                    continue;
                }
                counters.drain_successes.add(n as u64);
                failing_since = None;
                if n == batch_size {
                    counters.batches_complete.inc();
                } else {
                    counters.batches_underflow.inc();
                }
                backoff = MIN_BACKOFF;
            }
            Err(e) => {
                counters.failures.add(n as u64);
                error!(sink = %name, error = %e, events = n, "delivery failed; rolling back and retrying");
                if let Err(e) = take.rollback().await {
                    error!(sink = %name, error = %e, "cannot roll back take");
                }
                if drain.is_triggered() && channel.is_durable() {
                    let failing = *failing_since.get_or_insert_with(tokio::time::Instant::now);
                    if failing.elapsed() >= DRAIN_GRACE {
                        // The events are safe in the channel for the next run; waiting on a
                        // dead destination would keep the agent from stopping.
                        warn!(sink = %name, "the sink keeps failing while the agent stops; its durable channel keeps the rest for the next run");
                        break;
                    }
                }
                back_off(&mut backoff).await;
            }
        }
    }
    if let Err(e) = sink.stop().await {
        error!(sink = %name, error = %e, "sink did not stop cleanly");
    }
    info!(sink = %name, "sink stopped");
}
