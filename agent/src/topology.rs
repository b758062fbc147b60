//! Loading and validating a pipeline file: the YAML topology of sources, channels and sinks.
//!
//! Every problem in the file is collected and reported at once, each with its line and
//! column, the component it belongs to and, for a misspelt name, the closest valid one.
//! Building a topology constructs every component through its factory (which validates its
//! options) but starts nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ferry_broker::BrokerConfig;
use ferry_core::config::{ComponentKind, Location, unknown_name_message};
use ferry_core::registry::{SinkFactory, SourceFactory};
use ferry_core::{
    Channel, ComponentConfig, ComponentMetrics, ConfigError, Interceptor, MeteredChannel, Registry,
    Sink, Source,
};
use marked_yaml::types::{MarkedMappingNode, MarkedScalarNode};
use marked_yaml::{LoaderOptions, Node};
use serde::Deserialize;

/// Keys allowed at the top of a pipeline file.
const SECTIONS: [&str; 5] = ["agent", "broker", "sources", "channels", "sinks"];

/// The `agent:` section.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSettings {
    /// Where the agent keeps its state (checkpoints, durable channels). Default `./var/agent`.
    #[serde(default = "default_data_dir")]
    pub data_dir: PathBuf,
    /// Address of the HTTP server for `/metrics`, `/metrics.json`, `/health` and
    /// `/api/pipeline`, e.g. `127.0.0.1:8048`. Default: no server. Flume:
    /// `flume.monitoring.port` (with `flume.monitoring.type=http`).
    #[serde(default)]
    pub http: Option<std::net::SocketAddr>,
    /// A source that waits this long on a full channel logs a warning, once per stall.
    /// Default `10s`.
    #[serde(
        default = "default_full_channel_warning",
        with = "ferry_core::config::duration"
    )]
    pub full_channel_warning: Duration,
    /// A component that keeps failing this long without a success (a sink whose destination
    /// is down, a source that stopped with an error) makes `/health` answer 503.
    /// Default `30s`.
    #[serde(
        default = "default_unhealthy_after",
        with = "ferry_core::config::duration"
    )]
    pub unhealthy_after: Duration,
}

impl Default for AgentSettings {
    fn default() -> Self {
        Self {
            data_dir: default_data_dir(),
            http: None,
            full_channel_warning: default_full_channel_warning(),
            unhealthy_after: default_unhealthy_after(),
        }
    }
}

fn default_full_channel_warning() -> Duration {
    Duration::from_secs(10)
}

fn default_unhealthy_after() -> Duration {
    Duration::from_secs(30)
}

fn default_data_dir() -> PathBuf {
    PathBuf::from("./var/agent")
}

/// A source ready to run, with what it is wired to.
pub struct SourceSpec {
    /// Name from the file.
    pub name: String,
    /// The built source.
    pub source: Box<dyn Source>,
    /// Its options, kept to rebuild the source after it fails.
    pub config: ComponentConfig,
    /// Its factory, kept for the same reason.
    pub factory: SourceFactory,
    /// The channels it puts into, in the order written.
    pub channels: Vec<Arc<dyn Channel>>,
    /// Its interceptors, in the order written.
    pub interceptors: Vec<Arc<dyn Interceptor>>,
    /// Its counters, kept across restarts of the source.
    pub metrics: ComponentMetrics,
}

/// A sink ready to run, with the channel it takes from.
pub struct SinkSpec {
    /// Name from the file.
    pub name: String,
    /// The built sink.
    pub sink: Box<dyn Sink>,
    /// Its options and factory, to rebuild it.
    pub config: ComponentConfig,
    /// Its factory.
    pub factory: SinkFactory,
    /// The channel it takes from.
    pub channel: Arc<dyn Channel>,
    /// Most events per take (`batch_size`, default 100 as Flume's sinks).
    pub batch_size: usize,
    /// Its counters.
    pub metrics: ComponentMetrics,
}

/// A validated pipeline file, every component built.
pub struct Topology {
    /// The `agent:` section.
    pub agent: AgentSettings,
    /// The `broker:` section: start the bundled broker in this process.
    pub broker: Option<BrokerConfig>,
    /// Channels by name, each counted by the [`MeteredChannel`] around it.
    pub channels: BTreeMap<String, Arc<MeteredChannel>>,
    /// The type of each channel (`memory`, `file`, ...), by name.
    pub channel_types: BTreeMap<String, String>,
    /// Sources, in file order.
    pub sources: Vec<SourceSpec>,
    /// Sinks, in file order.
    pub sinks: Vec<SinkSpec>,
}

/// Every problem found in one file.
#[derive(Debug)]
pub struct Problems {
    /// The file.
    pub file: PathBuf,
    /// The problems, in file order.
    pub errors: Vec<ConfigError>,
}

impl std::fmt::Display for Problems {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for error in &self.errors {
            write!(f, "{}", self.file.display())?;
            if let Some(location) = error.location {
                write!(f, ":{location}")?;
            }
            write!(f, ": ")?;
            if let Some(component) = &error.component {
                write!(f, "{component}: ")?;
            }
            writeln!(f, "{}", error.message)?;
        }
        let n = self.errors.len();
        write!(
            f,
            "{n} problem{} in {}",
            if n == 1 { "" } else { "s" },
            self.file.display()
        )
    }
}

impl std::error::Error for Problems {}

/// Reads and validates `path`.
pub fn load(path: &Path, registry: &Registry) -> Result<Topology, Problems> {
    let problems = |errors| Problems {
        file: path.to_owned(),
        errors,
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| problems(vec![ConfigError::new(None, format!("cannot read: {e}"))]))?;
    parse(&text, registry).map_err(problems)
}

/// Validates the text of a pipeline file.
pub fn parse(text: &str, registry: &Registry) -> Result<Topology, Vec<ConfigError>> {
    let root = marked_yaml::parse_yaml_with_options(
        0,
        text,
        LoaderOptions::default().error_on_duplicate_keys(true),
    )
    .map_err(|e| vec![load_error(&e)])?;
    let mut builder = Builder {
        registry,
        errors: Vec::new(),
    };
    let root = substitute_env(&root, &mut builder.errors);
    let topology = builder.build(&root);
    let mut errors = builder.errors;
    if errors.is_empty() {
        Ok(topology)
    } else {
        errors.sort_by_key(|e| e.location);
        Err(errors)
    }
}

/// Replaces `${NAME}` in every value (not in keys) by the environment variable `NAME`; `$${`
/// writes a literal `${`. This is how secrets (`sasl_password: ${KAFKA_PASSWORD}`) stay out of
/// pipeline files. An unset variable is an error at the value; no message shows a value.
pub(crate) fn substitute_env(node: &Node, errors: &mut Vec<ConfigError>) -> Node {
    substitute_env_with(node, &|name| std::env::var(name).ok(), errors)
}

fn substitute_env_with(
    node: &Node,
    lookup: &dyn Fn(&str) -> Option<String>,
    errors: &mut Vec<ConfigError>,
) -> Node {
    match node {
        Node::Scalar(scalar) if scalar.as_str().contains('$') => {
            match expand_env(scalar.as_str(), lookup) {
                Ok(text) => {
                    let mut expanded = MarkedScalarNode::new(*scalar.span(), text);
                    // A quoted value stays a string; a plain one may still be a number.
                    expanded.set_coerce(scalar.may_coerce());
                    Node::from(expanded)
                }
                Err(message) => {
                    errors.push(ConfigError::new(key_location(scalar), message));
                    node.clone()
                }
            }
        }
        Node::Scalar(_) => node.clone(),
        Node::Sequence(sequence) => {
            let items = sequence
                .iter()
                .map(|item| substitute_env_with(item, lookup, errors))
                .collect();
            Node::from(marked_yaml::types::MarkedSequenceNode::new(
                *sequence.span(),
                items,
            ))
        }
        Node::Mapping(mapping) => {
            let mut out = MarkedMappingNode::new_empty(*mapping.span());
            for (key, value) in mapping.iter() {
                out.insert(key.clone(), substitute_env_with(value, lookup, errors));
            }
            Node::from(out)
        }
    }
}

/// `text` with `${NAME}` replaced by `lookup(NAME)` and `$${` by `${`.
fn expand_env(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(literal) = after.strip_prefix("${") {
            out.push_str("${");
            rest = literal;
        } else if let Some(reference) = after.strip_prefix('{') {
            let Some(end) = reference.find('}') else {
                return Err("`${` without its closing `}` (write `$${` for a literal `${`)".into());
            };
            let name = &reference[..end];
            let valid =
                !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(format!(
                    "`${{{name}}}` is not an environment variable reference (letters, digits, `_`)"
                ));
            }
            let value =
                lookup(name).ok_or_else(|| format!("environment variable `{name}` is not set"))?;
            out.push_str(&value);
            rest = &reference[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn load_error(error: &marked_yaml::LoadError) -> ConfigError {
    use marked_yaml::LoadError::*;
    let marker = match error {
        TopLevelMustBeMapping(m)
        | TopLevelMustBeSequence(m)
        | UnexpectedAnchor(m)
        | MappingKeyMustBeScalar(m)
        | UnexpectedTag(m)
        | ScanError(m, _) => Some(*m),
        _ => None,
    };
    let location = marker.map(|m| Location {
        line: m.line(),
        column: m.column(),
    });
    // The loader's message repeats the position; keep only what follows it.
    let message = error.to_string();
    let message = match (marker, message.split_once(": ")) {
        (Some(_), Some((_, rest))) => rest.to_owned(),
        _ => message,
    };
    ConfigError::new(location, format!("invalid YAML: {message}"))
}

fn location(node: &Node) -> Option<Location> {
    node.span().start().map(|m| Location {
        line: m.line(),
        column: m.column(),
    })
}

fn key_location(key: &MarkedScalarNode) -> Option<Location> {
    key.span().start().map(|m| Location {
        line: m.line(),
        column: m.column(),
    })
}

struct Builder<'a> {
    registry: &'a Registry,
    errors: Vec<ConfigError>,
}

/// What is common to every component entry after the runtime's keys are taken out.
struct Entry<'n> {
    name: &'n str,
    key: &'n MarkedScalarNode,
    type_name: String,
    type_location: Option<Location>,
    options: MarkedMappingNode,
}

impl Builder<'_> {
    fn error(&mut self, location: Option<Location>, message: impl Into<String>) {
        self.errors.push(ConfigError::new(location, message));
    }

    fn component_error(
        &mut self,
        kind: ComponentKind,
        name: &str,
        location: Option<Location>,
        message: impl Into<String>,
    ) {
        self.errors
            .push(ConfigError::new(location, message).in_component(kind, name));
    }

    fn build(&mut self, root: &Node) -> Topology {
        let mut topology = Topology {
            agent: AgentSettings::default(),
            broker: None,
            channels: BTreeMap::new(),
            channel_types: BTreeMap::new(),
            sources: Vec::new(),
            sinks: Vec::new(),
        };
        let Some(root) = root.as_mapping() else {
            self.error(
                location(root),
                "a pipeline file must be a mapping with `sources`, `channels` and `sinks`",
            );
            return topology;
        };
        for key in root.keys() {
            if !SECTIONS.contains(&key.as_str()) {
                let message = unknown_name_message("section", key.as_str(), SECTIONS);
                self.error(key_location(key), message);
            }
        }
        if let Some(agent) = root.get_node("agent") {
            match parse_section::<AgentSettings>(agent, "agent") {
                Ok(settings) => topology.agent = settings,
                Err(error) => self.errors.push(error),
            }
        }
        if let Some(broker) = root.get_node("broker") {
            match parse_broker_section(broker) {
                Ok(settings) => topology.broker = Some(settings),
                Err(error) => self.errors.push(error),
            }
        }
        let data_dir = topology.agent.data_dir.clone();

        // Channels first: sources and sinks refer to them.
        let mut channel_keys: BTreeMap<String, Option<Location>> = BTreeMap::new();
        for entry in self.entries(root, "channels", ComponentKind::Channel) {
            channel_keys.insert(entry.name.to_owned(), key_location(entry.key));
            let Some(()) = self.factory_check(ComponentKind::Channel, &entry) else {
                continue;
            };
            let Some(factory) = self.registry.channel(&entry.type_name).cloned() else {
                continue;
            };
            let cfg = component_config(ComponentKind::Channel, &entry, &data_dir);
            match factory(&cfg) {
                Ok(channel) => {
                    let channel = Arc::new(MeteredChannel::new(channel));
                    topology.channels.insert(entry.name.to_owned(), channel);
                    topology
                        .channel_types
                        .insert(entry.name.to_owned(), cfg.type_name().to_owned());
                }
                Err(e) => self.errors.push(e),
            }
        }
        let channel_names: Vec<String> = channel_keys.keys().cloned().collect();
        let mut read: BTreeSet<String> = BTreeSet::new();

        for entry in self.entries(root, "sources", ComponentKind::Source) {
            let name = entry.name.to_owned();
            let source_node = root
                .get_mapping("sources")
                .and_then(|m| m.get_mapping(&name));
            let channels_node = source_node.and_then(|m| m.get_node("channels"));
            let channels = match channels_node {
                None => {
                    self.component_error(
                        ComponentKind::Source,
                        &name,
                        key_location(entry.key),
                        "missing `channels`: list the channels this source puts into",
                    );
                    Vec::new()
                }
                Some(node) => self.channel_refs(
                    ComponentKind::Source,
                    &name,
                    node,
                    &channel_names,
                    &topology.channels,
                ),
            };
            let interceptors = source_node
                .and_then(|m| m.get_node("interceptors"))
                .map(|node| self.interceptors(&name, node, &data_dir))
                .unwrap_or_default();
            let Some(()) = self.factory_check(ComponentKind::Source, &entry) else {
                continue;
            };
            let Some(factory) = self.registry.source(&entry.type_name).cloned() else {
                continue;
            };
            let cfg = component_config(ComponentKind::Source, &entry, &data_dir);
            let source = match factory(&cfg) {
                Ok(source) => source,
                Err(e) => {
                    self.errors.push(e);
                    continue;
                }
            };
            self.check_positions(&entry, source.as_ref(), &interceptors);
            if let Some(max) = source.max_batch_size() {
                for channel in &channels {
                    if max > channel.transaction_capacity() {
                        let location = cfg.location_of_key("batch_size");
                        self.component_error(
                            ComponentKind::Source,
                            &name,
                            location,
                            format!(
                                "batch size {max} is above the transaction_capacity {} of channel `{}`",
                                channel.transaction_capacity(),
                                channel.name()
                            ),
                        );
                    }
                }
            }
            topology.sources.push(SourceSpec {
                metrics: ComponentMetrics::new("source", name.clone()),
                name,
                source,
                config: cfg,
                factory,
                channels,
                interceptors,
            });
        }

        for entry in self.entries(root, "sinks", ComponentKind::Sink) {
            let name = entry.name.to_owned();
            let sink_node = root.get_mapping("sinks").and_then(|m| m.get_mapping(&name));
            let channel = match sink_node.and_then(|m| m.get_node("channel")) {
                None => {
                    self.component_error(
                        ComponentKind::Sink,
                        &name,
                        key_location(entry.key),
                        "missing `channel`: name the channel this sink takes from",
                    );
                    None
                }
                Some(node) => {
                    let mut found = self.channel_refs(
                        ComponentKind::Sink,
                        &name,
                        node,
                        &channel_names,
                        &topology.channels,
                    );
                    if let Some(scalar) = node.as_scalar() {
                        read.insert(scalar.as_str().to_owned());
                    }
                    if found.len() > 1 {
                        self.component_error(
                            ComponentKind::Sink,
                            &name,
                            location(node),
                            "a sink takes from exactly one `channel`",
                        );
                    }
                    found.pop()
                }
            };
            let batch_node = sink_node.and_then(|m| m.get_node("batch_size"));
            let batch_size =
                match batch_node.map(|n| n.as_scalar().map(|s| s.as_str().parse::<usize>())) {
                    None => 100,
                    Some(Some(Ok(n))) if n > 0 => n,
                    Some(_) => {
                        self.component_error(
                            ComponentKind::Sink,
                            &name,
                            batch_node.and_then(location),
                            "`batch_size` must be a whole number of at least 1",
                        );
                        100
                    }
                };
            if let Some(channel) = &channel
                && batch_size > channel.transaction_capacity()
            {
                self.component_error(
                    ComponentKind::Sink,
                    &name,
                    sink_node
                        .and_then(|m| m.keys().find(|k| k.as_str() == "batch_size"))
                        .and_then(key_location),
                    format!(
                        "batch_size {batch_size} is above the transaction_capacity {} of channel `{}`",
                        channel.transaction_capacity(),
                        channel.name()
                    ),
                );
            }
            let Some(()) = self.factory_check(ComponentKind::Sink, &entry) else {
                continue;
            };
            let Some(factory) = self.registry.sink(&entry.type_name).cloned() else {
                continue;
            };
            let cfg = component_config(ComponentKind::Sink, &entry, &data_dir);
            let sink = match factory(&cfg) {
                Ok(sink) => sink,
                Err(e) => {
                    self.errors.push(e);
                    continue;
                }
            };
            if let Some(channel) = &channel
                && sink.needs_sequence_numbers()
                && !channel.is_durable()
            {
                self.component_error(
                    ComponentKind::Sink,
                    &name,
                    sink_node
                        .and_then(|m| m.keys().find(|k| k.as_str() == "delivery"))
                        .and_then(key_location),
                    format!(
                        "this delivery needs a channel that numbers its events (a file channel, or a kafka channel on a one-partition topic); channel `{}` does not",
                        channel.name()
                    ),
                );
            }
            if let Some(channel) = channel {
                topology.sinks.push(SinkSpec {
                    metrics: ComponentMetrics::new("sink", name.clone()),
                    name,
                    sink,
                    config: cfg,
                    factory,
                    channel,
                    batch_size,
                });
            }
        }

        for (name, location) in &channel_keys {
            if !read.contains(name) {
                self.component_error(
                    ComponentKind::Channel,
                    name,
                    *location,
                    "no sink takes from this channel, so its events would pile up; bind a sink to it with `channel:`",
                );
            }
        }
        if root.get_node("sources").is_none()
            && root.get_node("sinks").is_none()
            && root.get_node("broker").is_none()
        {
            self.error(
                location(&Node::from(root.clone())),
                "nothing to run: the file has no `sources`, `sinks` or `broker`",
            );
        }
        topology
    }

    /// The entries of section `section`, with `type` taken out and checked to be present.
    fn entries<'n>(
        &mut self,
        root: &'n MarkedMappingNode,
        section: &str,
        kind: ComponentKind,
    ) -> Vec<Entry<'n>> {
        let Some(node) = root.get_node(section) else {
            return Vec::new();
        };
        let Some(map) = node.as_mapping() else {
            self.error(
                location(node),
                format!("`{section}` must be a mapping of {kind} names to their options"),
            );
            return Vec::new();
        };
        let mut out = Vec::new();
        for (key, value) in map.iter() {
            let name = key.as_str();
            let Some(options) = value.as_mapping() else {
                self.component_error(
                    kind,
                    name,
                    location(value),
                    "must be a mapping of options with at least `type`",
                );
                continue;
            };
            let mut options = options.clone();
            let (type_name, type_location) = match options.remove("type") {
                Some(Node::Scalar(s)) => (s.as_str().to_owned(), key_location(&s)),
                Some(other) => {
                    self.component_error(kind, name, location(&other), "`type` must be a name");
                    continue;
                }
                None => {
                    self.component_error(kind, name, key_location(key), "missing `type`");
                    continue;
                }
            };
            for runtime_key in runtime_keys(kind) {
                options.remove(*runtime_key);
            }
            out.push(Entry {
                name,
                key,
                type_name,
                type_location,
                options,
            });
        }
        out
    }

    /// Checks that the entry's type is registered, reporting the closest name otherwise.
    fn factory_check(&mut self, kind: ComponentKind, entry: &Entry<'_>) -> Option<()> {
        let names = self.registry.type_names(kind);
        if names.contains(&entry.type_name.as_str()) {
            return Some(());
        }
        let message = unknown_name_message(&format!("{kind} type"), &entry.type_name, names);
        self.component_error(kind, entry.name, entry.type_location, message);
        None
    }

    /// Resolves a list (or single name) of channel references.
    fn channel_refs(
        &mut self,
        kind: ComponentKind,
        name: &str,
        node: &Node,
        known: &[String],
        built: &BTreeMap<String, Arc<MeteredChannel>>,
    ) -> Vec<Arc<dyn Channel>> {
        let refs: Vec<&MarkedScalarNode> = match node {
            Node::Scalar(s) => vec![s],
            Node::Sequence(seq) => {
                let mut refs = Vec::new();
                for item in seq.iter() {
                    match item.as_scalar() {
                        Some(s) => refs.push(s),
                        None => self.component_error(
                            kind,
                            name,
                            location(item),
                            "channel names must be plain names",
                        ),
                    }
                }
                refs
            }
            Node::Mapping(_) => {
                self.component_error(
                    kind,
                    name,
                    location(node),
                    "expected a channel name or a list of channel names",
                );
                Vec::new()
            }
        };
        if refs.is_empty() && matches!(node, Node::Sequence(_)) {
            self.component_error(kind, name, location(node), "`channels` is empty");
        }
        let mut out = Vec::new();
        for r in refs {
            let channel = r.as_str();
            if let Some(c) = built.get(channel) {
                out.push(Arc::clone(c) as Arc<dyn Channel>);
            } else if !known.iter().any(|k| k == channel) {
                let message =
                    unknown_name_message("channel", channel, known.iter().map(String::as_str));
                self.component_error(kind, name, key_location(r), message);
            }
        }
        out
    }

    fn interceptors(
        &mut self,
        source: &str,
        node: &Node,
        data_dir: &Path,
    ) -> Vec<Arc<dyn Interceptor>> {
        let Some(seq) = node.as_sequence() else {
            self.component_error(
                ComponentKind::Source,
                source,
                location(node),
                "`interceptors` must be a list like `[ { type: timestamp } ]`",
            );
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, item) in seq.iter().enumerate() {
            let label = format!("{source}[{i}]");
            let Some(map) = item.as_mapping() else {
                self.component_error(
                    ComponentKind::Interceptor,
                    &label,
                    location(item),
                    "an interceptor is a mapping with `type`",
                );
                continue;
            };
            let mut options = map.clone();
            let type_name = match options.remove("type") {
                Some(Node::Scalar(s)) => s.as_str().to_owned(),
                _ => {
                    self.component_error(
                        ComponentKind::Interceptor,
                        &label,
                        location(item),
                        "missing `type`",
                    );
                    continue;
                }
            };
            let Some(factory) = self.registry.interceptor(&type_name).cloned() else {
                let names = self.registry.type_names(ComponentKind::Interceptor);
                let message = unknown_name_message("interceptor type", &type_name, names);
                self.component_error(ComponentKind::Interceptor, &label, location(item), message);
                continue;
            };
            let cfg = ComponentConfig::from_node(
                ComponentKind::Interceptor,
                label,
                type_name,
                Node::from(options),
                data_dir,
            );
            match factory(&cfg) {
                Ok(interceptor) => out.push(interceptor),
                Err(e) => self.errors.push(e),
            }
        }
        out
    }

    /// A `position` interceptor needs a source that writes positions.
    fn check_positions(
        &mut self,
        entry: &Entry<'_>,
        source: &dyn Source,
        interceptors: &[Arc<dyn Interceptor>],
    ) {
        if interceptors.iter().any(|i| i.position_header().is_some()) && !source.sets_positions() {
            let message = format!(
                "interceptor `position`: a `{}` source cannot tell where an event was read; \
                 positions come from `taildir`, `spooldir`, `seq` and `kafka` sources",
                entry.type_name
            );
            self.component_error(
                ComponentKind::Source,
                entry.name,
                entry.type_location,
                message,
            );
        }
    }
}

/// Parses a top-level section (`agent:`, `broker:`) with the positions and suggestions
/// component options get.
pub fn parse_section<T: serde::de::DeserializeOwned>(
    node: &Node,
    section: &str,
) -> Result<T, ConfigError> {
    let node = match node {
        // An empty section (`broker:` alone) means all defaults.
        Node::Scalar(s) if s.as_str().is_empty() => {
            Node::from(MarkedMappingNode::new_empty(*node.span()))
        }
        other => other.clone(),
    };
    ComponentConfig::from_node(ComponentKind::Source, section, section, node, ".")
        .parse::<T>()
        .map_err(|error| ConfigError {
            component: Some(format!("section `{section}`")),
            ..error
        })
}

/// Parses the broker's settings (a pipeline's `broker:` section, or an `agent broker
/// --config` file), refusing the one-listener shorthand (`listen`, `advertised_listener`)
/// next to `listeners`.
pub fn parse_broker_section(node: &Node) -> Result<BrokerConfig, ConfigError> {
    if let Some(mapping) = node.as_mapping()
        && mapping.get_node("listeners").is_some()
    {
        for shorthand in ["listen", "advertised_listener"] {
            if let Some(key) = mapping.keys().find(|k| k.as_str() == shorthand) {
                return Err(ConfigError {
                    component: Some("section `broker`".into()),
                    ..ConfigError::new(
                        key_location(key),
                        format!(
                            "`{shorthand}` and `listeners` cannot be given together: put the \
                             address in `listeners` as a plaintext listener"
                        ),
                    )
                });
            }
        }
    }
    parse_section::<BrokerConfig>(node, "broker")
}

/// Keys of a component entry that the runtime handles, not the component.
fn runtime_keys(kind: ComponentKind) -> &'static [&'static str] {
    match kind {
        ComponentKind::Source => &["channels", "interceptors"],
        ComponentKind::Sink => &["channel", "batch_size"],
        ComponentKind::Channel | ComponentKind::Interceptor => &[],
    }
}

fn component_config(kind: ComponentKind, entry: &Entry<'_>, data_dir: &Path) -> ComponentConfig {
    ComponentConfig::from_node(
        kind,
        entry.name,
        entry.type_name.clone(),
        Node::from(entry.options.clone()),
        data_dir,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_core::{SinkBatch, SinkError, SourceContext, SourceError, async_trait};

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct GenOptions {
        #[serde(default = "one")]
        batch_size: usize,
    }

    fn one() -> usize {
        1
    }

    struct Gen(usize);

    #[async_trait]
    impl Source for Gen {
        fn max_batch_size(&self) -> Option<usize> {
            Some(self.0)
        }
        async fn run(self: Box<Self>, _ctx: SourceContext) -> Result<(), SourceError> {
            Ok(())
        }
    }

    struct Discard;

    #[async_trait]
    impl Sink for Discard {
        async fn deliver(&mut self, _batch: SinkBatch<'_>) -> Result<(), SinkError> {
            Ok(())
        }
    }

    fn registry() -> Registry {
        let mut registry = Registry::new();
        ferry_channels::register(&mut registry);
        registry.register_source("generator", |cfg| {
            let o: GenOptions = cfg.parse()?;
            Ok(Box::new(Gen(o.batch_size)))
        });
        registry.register_sink("discard", |cfg| {
            cfg.parse::<BTreeMap<String, String>>()?;
            Ok(Box::new(Discard))
        });
        registry
    }

    #[test]
    fn environment_variables_fill_values_and_an_unset_one_is_an_error_at_its_line() {
        let lookup = |name: &str| (name == "PASSWORD").then(|| "hunter2".to_owned());
        assert_eq!(
            expand_env("a ${PASSWORD} b $${PASSWORD} $5", &lookup).unwrap(),
            "a hunter2 b ${PASSWORD} $5"
        );
        assert!(
            expand_env("${MISSING}", &lookup)
                .unwrap_err()
                .contains("`MISSING` is not set")
        );
        assert!(
            expand_env("${PASS", &lookup)
                .unwrap_err()
                .contains("closing")
        );
        assert!(
            expand_env("${A-B}", &lookup)
                .unwrap_err()
                .contains("not an environment")
        );

        let root = marked_yaml::parse_yaml(
            0,
            "sinks:\n  out:\n    sasl_password: ${PASSWORD}\n    list: [x, '${MISSING}']\n",
        )
        .unwrap();
        let mut errors = Vec::new();
        let node = substitute_env_with(&root, &lookup, &mut errors);
        let out = node.as_mapping().unwrap().get_mapping("sinks").unwrap();
        let out = out.get_mapping("out").unwrap();
        assert_eq!(out.get_scalar("sasl_password").unwrap().as_str(), "hunter2");
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].location.map(|l| l.line), Some(4));
        assert!(!format!("{errors:?}").contains("hunter2"));
    }

    fn problems(yaml: &str) -> Vec<String> {
        match parse(yaml, &registry()) {
            Ok(_) => Vec::new(),
            Err(errors) => errors
                .iter()
                .map(|e| {
                    format!(
                        "{}: {}{}",
                        e.location.map(|l| l.to_string()).unwrap_or_default(),
                        e.component
                            .as_ref()
                            .map(|c| format!("{c}: "))
                            .unwrap_or_default(),
                        e.message
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn a_valid_pipeline_builds() {
        let yaml = "\
sources:
  gen: { type: generator, channels: [a, b], batch_size: 5 }
channels:
  a: { type: memory }
  b: { type: memory, capacity: 10, transaction_capacity: 10 }
sinks:
  out_a: { type: discard, channel: a }
  out_b: { type: discard, channel: b, batch_size: 10 }
";
        let topology = parse(yaml, &registry()).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(topology.sources[0].channels.len(), 2);
        assert_eq!(topology.sinks[1].batch_size, 10);
    }

    #[test]
    fn reports_every_problem_with_its_line() {
        let yaml = "\
sources:
  gen:
    type: generater
    channels: [buffer]
  other:
    type: generator
    channels: [bufer]
    batch_size: 500
channels:
  buffer:
    type: memory
  lonely:
    type: memory
sinks:
  out:
    type: discard
    channel: missing
";
        let got = problems(yaml);
        assert_eq!(
            got,
            [
                "3:11: source `gen`: unknown source type `generater`, did you mean `generator`?",
                "7:16: source `other`: unknown channel `bufer`, did you mean `buffer`?",
                "10:3: channel `buffer`: no sink takes from this channel, so its events would pile up; bind a sink to it with `channel:`",
                "12:3: channel `lonely`: no sink takes from this channel, so its events would pile up; bind a sink to it with `channel:`",
                "17:14: sink `out`: unknown channel `missing`, expected one of `buffer`, `lonely`",
            ],
            "{got:#?}"
        );
    }

    #[test]
    fn batch_sizes_above_transaction_capacity_are_refused() {
        let yaml = "\
sources:
  gen: { type: generator, channels: [c], batch_size: 500 }
channels:
  c: { type: memory, capacity: 1000, transaction_capacity: 100 }
sinks:
  out:
    type: discard
    channel: c
    batch_size: 101
";
        let got = problems(yaml);
        assert_eq!(got.len(), 2, "{got:#?}");
        assert!(got[0].starts_with("2:42: source `gen`: batch size 500 is above the transaction_capacity 100 of channel `c`"), "{got:#?}");
        assert!(
            got[1].starts_with("9:5: sink `out`: batch_size 101"),
            "{got:#?}"
        );
    }

    #[test]
    fn unknown_options_and_sections_suggest_names() {
        let yaml = "\
agent:
  data_dri: /tmp
source:
  x: 1
sources:
  gen: { type: generator, channels: [c], bacth_size: 5 }
channels:
  c: { type: memory, capactiy: 10 }
sinks:
  out: { type: discard, channel: c }
";
        let got = problems(yaml);
        assert_eq!(got.len(), 4, "{got:#?}");
        assert!(
            got[0].contains("section `agent`: unknown option `data_dri`, did you mean `data_dir`?"),
            "{got:#?}"
        );
        assert!(
            got[1].starts_with("3:1: unknown section `source`, did you mean `sources`?"),
            "{got:#?}"
        );
        assert!(
            got[2].contains("unknown option `bacth_size`, did you mean `batch_size`?"),
            "{got:#?}"
        );
        assert!(
            got[3].contains("channel `c`: unknown option `capactiy`, did you mean `capacity`?"),
            "{got:#?}"
        );
    }

    #[test]
    fn broken_yaml_is_located() {
        let got = problems("sources:\n  a: [unclosed\n");
        assert_eq!(got.len(), 1);
        assert!(got[0].contains("invalid YAML"), "{got:?}");
        assert!(!got[0].starts_with(':'), "has a location: {got:?}");
    }

    #[test]
    fn duplicate_keys_are_refused() {
        let got = problems("sources: {}\nsinks: {}\nsinks: {}\n");
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(got[0].contains("Duplicate key"), "{got:?}");
    }
}
