//! The plugin API of the agent.
//!
//! Everything that moves data implements one of four traits:
//!
//! - [`Source`]: reads events and hands them, batch by batch, to [`SourceContext::send`];
//! - [`Channel`]: buffers events between sources and sinks, with put and take transactions;
//! - [`Sink`]: delivers batches taken from a channel;
//! - [`Interceptor`]: rewrites batches between a source and its channels.
//!
//! Components are created by factories registered by type name in a [`Registry`]; a factory
//! parses its options with [`ComponentConfig::parse`]. The agent's runtime wires them as the
//! YAML topology says, runs one task per source and per sink, and applies the delivery rule:
//! progress is committed in the same transaction as the data, in whatever store receives it
//! (see [`checkpoint`] and [`ack`]).
//!
//! A plugin crate registers its own types on the registry that already holds the built-ins
//! and runs the agent with it (the `ferry-agent` crate; `docs/plugins.md` has the whole guide,
//! `examples/custom-plugin/` a crate built and tested in CI):
//!
//! ```text
//! fn main() -> std::process::ExitCode {
//!     let mut registry = ferry_agent::builtin_registry();
//!     registry.register_source("ticker", |cfg| Ok(Box::new(Ticker::build(cfg)?)));
//!     ferry_agent::main_with(registry)
//! }
//! ```

pub mod ack;
pub mod channel;
pub mod checkpoint;
pub mod config;
pub mod event;
pub mod header_map;
pub mod interceptor;
pub mod metrics;
pub mod properties;
pub mod registry;
pub mod selector;
pub mod shutdown;
pub mod sink;
pub mod source;
pub mod state;
#[cfg(feature = "test-support")]
pub mod test_support;

pub use ack::{AckTracker, Acknowledgement};

/// Makes rustls' ring provider the process's default, once. Every HTTPS client of the agent
/// (reqwest, built without a provider of its own) needs it before it is built; calling it
/// again is harmless.
pub fn install_tls_provider() {
    // Fails only when a provider is installed already, which is what is wanted.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
pub use async_trait::async_trait;
pub use bytes::Bytes;
pub use channel::{Channel, ChannelError, MeteredChannel, PutBatch, TakeTransaction};
pub use checkpoint::{Checkpoint, CheckpointStore, CheckpointStoreError, MemoryCheckpointStore};
pub use config::{ComponentConfig, ComponentKind, ConfigError};
pub use event::{CompactString, Event, HeaderMap, Headers, ToCompactString, format_compact};
pub use interceptor::Interceptor;
pub use metrics::{ComponentMetrics, Counter, Failure, Items, Latency, LatencySnapshot};
pub use registry::Registry;
pub use selector::ChannelSelector;
pub use shutdown::Shutdown;
pub use sink::{Pipelining, Sink, SinkBatch, SinkContext, SinkError};
pub use source::{Source, SourceContext, SourceError, SourceOptions};

/// This machine's host name, or `localhost` if the system does not say (for the `host`
/// interceptor, and for names that must differ between agents running the same pipeline).
pub fn host_name() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .chain(std::env::var("HOSTNAME").ok())
        .map(|name| name.trim().to_owned())
        .find(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Runs `f`, a call that blocks (a synchronous client library waiting on the network), from
/// async code: on a multi-threaded runtime the worker hands its other tasks to another thread
/// first, so they (the bundled broker, say) keep running while `f` waits.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}
