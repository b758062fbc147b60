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
