//! Kafka-style command-line tools (`topics`, `groups`, `console-producer`, `console-consumer`,
//! `transactions`), built on librdkafka so that they work against any Kafka cluster, not only
//! the bundled broker (`transactions` speaks the protocol itself: librdkafka has no admin call
//! for it; `users` neither, for SCRAM users). Flags follow Kafka's own tools (`kafka-topics.sh`, `kafka-console-producer.sh`,
//! ...).

use std::time::Duration;

use anyhow::{Context, bail};
use rdkafka::config::ClientConfig;

pub mod console;
pub mod groups;
pub mod topics;
pub mod transactions;
pub mod users;
mod wire;

/// How long a tool waits for the cluster to answer one request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A librdkafka configuration for `bootstrap` with `k=v` overrides.
fn client_config(bootstrap: &str, overrides: &[String]) -> anyhow::Result<ClientConfig> {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap);
    for pair in overrides {
        let (key, value) = split_property(pair)?;
        config.set(key, value);
    }
    Ok(config)
}

/// Splits `key=value`.
fn split_property(pair: &str) -> anyhow::Result<(&str, &str)> {
    match pair.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k, v)),
        _ => bail!("expected key=value, got `{pair}`"),
    }
}

/// A runtime for the asynchronous admin calls.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")
}
