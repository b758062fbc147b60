//! The run and reload loop of one agent: its data directory is locked, the bundled broker
//! and the HTTP server start, then the [`Pipeline`] runs (applying reloads) until the stop
//! signal; then the pipeline drains, and the HTTP server and the broker stop, in that order.

use anyhow::Context;
use ferry_broker::Broker;
use ferry_core::Shutdown;
use tracing::info;

use crate::http::{HttpServer, PipelineMetrics};
use crate::lock::DataDirLock;
use crate::pipeline::{Pipeline, Reloads};
use crate::topology::Topology;

/// Runs `topology` until `stop` fires (or every source ends, when there is no broker), then
/// drains and returns.
pub async fn run(topology: Topology, stop: Shutdown) -> anyhow::Result<()> {
    run_reloading(topology, stop, None).await
}

/// Like [`run`], applying the reloads `reloads` asks for while it runs (see
/// [`crate::pipeline`]).
pub async fn run_reloading(
    topology: Topology,
    stop: Shutdown,
    reloads: Option<Reloads>,
) -> anyhow::Result<()> {
    // Before anything starts: a second agent on this data_dir is refused here.
    let _lock = DataDirLock::acquire(&topology.agent.data_dir)?;
    // The broker comes first, so that Kafka components find it, and goes last.
    let broker = match topology.broker.clone() {
        Some(config) => {
            let broker = Broker::start(config)
                .await
                .context("starting the bundled broker")?;
            info!(listeners = %listeners(&broker), "bundled broker started");
            Some(broker)
        }
        None => None,
    };
    // The HTTP server comes next and also goes after the pipeline, so that the drain can be
    // watched.
    let http_stop = Shutdown::new();
    let metrics = PipelineMetrics::new(&topology);
    let http = match topology.agent.http {
        Some(address) => {
            let mut server = HttpServer::new(metrics.clone());
            if let Some(broker) = &broker {
                server.with_broker(broker.observer());
            }
            Some(server.start(address, http_stop.clone()).await?)
        }
        None => None,
    };
    let serves_until_stopped = broker.is_some() || http.is_some();
    let result = match Pipeline::start(topology, stop.clone(), Some(metrics)).await {
        Ok(pipeline) => pipeline.run(reloads).await,
        Err(e) => Err(e),
    };
    if serves_until_stopped && result.is_ok() {
        // With a broker or an HTTP server the agent serves until it is told to stop, even
        // when every source has ended.
        stop.wait().await;
    }
    if let Some(http) = http {
        http_stop.trigger();
        http.stopped().await;
    }
    if let Some(broker) = broker {
        broker.shutdown().await;
        info!("bundled broker stopped");
    }
    result
}

/// Every listener of `broker` as `NAME=address`, comma-separated, for the log line that says
/// it started (tests find the ports of listeners on port 0 there).
pub fn listeners(broker: &ferry_broker::BrokerHandle) -> String {
    broker
        .listener_addrs()
        .iter()
        .map(|(name, addr)| format!("{name}={addr}"))
        .collect::<Vec<_>>()
        .join(",")
}
