//! The component registry: type names (`taildir`, `memory`, `file_roll`, ...) to factories.
//!
//! A factory turns a [`ComponentConfig`] into a ready-to-run component. It validates and
//! constructs; it must not start background work, bind sockets or open files, because
//! `agent validate` calls every factory without running anything.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::channel::Channel;
use crate::config::{ComponentConfig, ComponentKind, ConfigError};
use crate::interceptor::Interceptor;
use crate::sink::Sink;
use crate::source::Source;

/// Builds a source from its configuration.
pub type SourceFactory =
    Arc<dyn Fn(&ComponentConfig) -> Result<Box<dyn Source>, ConfigError> + Send + Sync>;
/// Builds a channel from its configuration.
pub type ChannelFactory =
    Arc<dyn Fn(&ComponentConfig) -> Result<Arc<dyn Channel>, ConfigError> + Send + Sync>;
/// Builds a sink from its configuration.
pub type SinkFactory =
    Arc<dyn Fn(&ComponentConfig) -> Result<Box<dyn Sink>, ConfigError> + Send + Sync>;
/// Builds an interceptor from its configuration.
pub type InterceptorFactory =
    Arc<dyn Fn(&ComponentConfig) -> Result<Arc<dyn Interceptor>, ConfigError> + Send + Sync>;

/// Type names to factories, for every kind of component.
///
/// ```
/// use ferry_core::{async_trait, Registry, Sink, SinkBatch, SinkError};
/// struct Discard;
/// #[async_trait]
/// impl Sink for Discard {
///     async fn deliver(&mut self, _batch: SinkBatch<'_>) -> Result<(), SinkError> { Ok(()) }
/// }
/// let mut registry = Registry::new();
/// registry.register_sink("discard", |_cfg| Ok(Box::new(Discard)));
/// assert!(registry.sink("discard").is_some());
/// assert_eq!(registry.type_names(ferry_core::config::ComponentKind::Sink), vec!["discard"]);
/// ```
#[derive(Clone, Default)]
pub struct Registry {
    sources: BTreeMap<String, SourceFactory>,
    channels: BTreeMap<String, ChannelFactory>,
    sinks: BTreeMap<String, SinkFactory>,
    interceptors: BTreeMap<String, InterceptorFactory>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("sources", &self.sources.keys().collect::<Vec<_>>())
            .field("channels", &self.channels.keys().collect::<Vec<_>>())
            .field("sinks", &self.sinks.keys().collect::<Vec<_>>())
            .field(
                "interceptors",
                &self.interceptors.keys().collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers (or replaces) source type `name`.
    pub fn register_source(
        &mut self,
        name: &str,
        factory: impl Fn(&ComponentConfig) -> Result<Box<dyn Source>, ConfigError>
        + Send
        + Sync
        + 'static,
    ) -> &mut Self {
        self.sources.insert(name.to_owned(), Arc::new(factory));
        self
    }

    /// Registers (or replaces) channel type `name`.
    pub fn register_channel(
        &mut self,
        name: &str,
        factory: impl Fn(&ComponentConfig) -> Result<Arc<dyn Channel>, ConfigError>
        + Send
        + Sync
        + 'static,
    ) -> &mut Self {
        self.channels.insert(name.to_owned(), Arc::new(factory));
        self
    }

    /// Registers (or replaces) sink type `name`.
    pub fn register_sink(
        &mut self,
        name: &str,
        factory: impl Fn(&ComponentConfig) -> Result<Box<dyn Sink>, ConfigError> + Send + Sync + 'static,
    ) -> &mut Self {
        self.sinks.insert(name.to_owned(), Arc::new(factory));
        self
    }

    /// Registers (or replaces) interceptor type `name`.
    pub fn register_interceptor(
        &mut self,
        name: &str,
        factory: impl Fn(&ComponentConfig) -> Result<Arc<dyn Interceptor>, ConfigError>
        + Send
        + Sync
        + 'static,
    ) -> &mut Self {
        self.interceptors.insert(name.to_owned(), Arc::new(factory));
        self
    }

    /// The factory of source type `name`.
    pub fn source(&self, name: &str) -> Option<&SourceFactory> {
        self.sources.get(name)
    }

    /// The factory of channel type `name`.
    pub fn channel(&self, name: &str) -> Option<&ChannelFactory> {
        self.channels.get(name)
    }

    /// The factory of sink type `name`.
    pub fn sink(&self, name: &str) -> Option<&SinkFactory> {
        self.sinks.get(name)
    }

    /// The factory of interceptor type `name`.
    pub fn interceptor(&self, name: &str) -> Option<&InterceptorFactory> {
        self.interceptors.get(name)
    }

    /// Registered type names of one kind, sorted.
    pub fn type_names(&self, kind: ComponentKind) -> Vec<&str> {
        match kind {
            ComponentKind::Source => self.sources.keys().map(String::as_str).collect(),
            ComponentKind::Channel => self.channels.keys().map(String::as_str).collect(),
            ComponentKind::Sink => self.sinks.keys().map(String::as_str).collect(),
            ComponentKind::Interceptor => self.interceptors.keys().map(String::as_str).collect(),
        }
    }
}
