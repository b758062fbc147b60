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
use ferry_core::config::{ComponentKind, Location, closest, unknown_name_message};
use ferry_core::registry::{SinkFactory, SourceFactory};
use ferry_core::{
    Channel, ChannelSelector, ComponentConfig, ComponentMetrics, ConfigError, Interceptor,
    MeteredChannel, Registry, Sink, Source,
};
use marked_yaml::types::{MarkedMappingNode, MarkedScalarNode};
use marked_yaml::{LoaderOptions, Node};
use serde::Deserialize;

use crate::sinkgroup::{DEFAULT_MAX_PENALTY, PROCESSOR_TYPES, Selector, SinkProcessorConfig};

mod selector;

/// Keys allowed at the top of a pipeline file.
const SECTIONS: [&str; 6] = [
    "agent",
    "broker",
    "sources",
    "channels",
    "sinks",
    "sinkgroups",
];

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
    /// The longest the first SIGTERM waits for the sinks to drain the channels. Then the sinks
    /// finish what they have in flight and stop: durable channels keep the rest for the next
    /// start, and events left in memory channels are reported (the agent then exits non-zero).
    /// Default `30s`.
    #[serde(
        default = "default_drain_timeout",
        with = "ferry_core::config::duration"
    )]
    pub drain_timeout: Duration,
}

impl Default for AgentSettings {
    fn default() -> Self {
        Self {
            data_dir: default_data_dir(),
            http: None,
            full_channel_warning: default_full_channel_warning(),
            unhealthy_after: default_unhealthy_after(),
            drain_timeout: default_drain_timeout(),
        }
    }
}

fn default_full_channel_warning() -> Duration {
    Duration::from_secs(10)
}

fn default_unhealthy_after() -> Duration {
    Duration::from_secs(30)
}

fn default_drain_timeout() -> Duration {
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
    /// Which of its channels get which events.
    pub selector: ChannelSelector,
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
    /// Where events the destination refuses for good go (`dead_letter`); `None`: they are
    /// retried.
    pub dead_letter: Option<Arc<dyn Channel>>,
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
    /// Sinks outside any group, in file order.
    pub sinks: Vec<SinkSpec>,
    /// Sink groups, by name; their members are not in `sinks`.
    pub sink_groups: Vec<SinkGroupSpec>,
    /// Remarks that are not problems, with their lines: a type written in Flume's spelling
    /// (`TAILDIR`, `syslogtcp`) is taken, with the canonical name suggested.
    pub notes: Vec<String>,
    /// What each entry says, as written (variables substituted) but without positions, by
    /// `section.name` (`sources.app`), and `agent` and `broker`: two files say the same of a
    /// component when these are equal. A reload compares them.
    pub fingerprints: BTreeMap<String, String>,
}

impl Topology {
    /// Every sink, those outside groups first, then each group's members.
    pub fn all_sinks(&self) -> impl Iterator<Item = &SinkSpec> {
        self.sinks
            .iter()
            .chain(self.sink_groups.iter().flat_map(|g| g.members.iter()))
    }
}

/// Sinks on one channel driven by one runner that hands each batch to one of them
/// (`sinkgroups:`, Flume's sink processors; see [`crate::sinkgroup`]).
pub struct SinkGroupSpec {
    /// Name from the file.
    pub name: String,
    /// The members, in the order of the group's `sinks`, all taking from one channel.
    pub members: Vec<SinkSpec>,
    /// How a member is chosen for each batch.
    pub processor: SinkProcessorConfig,
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
        notes: Vec::new(),
    };
    let root = substitute_env(&root, &mut builder.errors);
    let mut topology = builder.build(&root);
    builder.notes.sort();
    topology.notes = builder.notes.into_iter().map(|(_, note)| note).collect();
    topology.fingerprints = fingerprints(&root);
    let mut errors = builder.errors;
    if errors.is_empty() {
        Ok(topology)
    } else {
        errors.sort_by_key(|e| e.location);
        Err(errors)
    }
}

/// The fingerprint of every entry of `root` (see [`Topology::fingerprints`]).
fn fingerprints(root: &Node) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Some(root) = root.as_mapping() else {
        return out;
    };
    for (section, node) in root.iter() {
        match node.as_mapping() {
            Some(entries) if section.as_str() != "agent" && section.as_str() != "broker" => {
                for (name, entry) in entries.iter() {
                    out.insert(
                        format!("{}.{}", section.as_str(), name.as_str()),
                        canonical(entry),
                    );
                }
            }
            _ => {
                out.insert(section.as_str().to_owned(), canonical(node));
            }
        }
    }
    out
}

/// `node` as text without positions: equal for equal YAML wherever it is written.
fn canonical(node: &Node) -> String {
    match node {
        Node::Scalar(s) => format!("{:?}", s.as_str()),
        Node::Sequence(seq) => {
            let items: Vec<String> = seq.iter().map(canonical).collect();
            format!("[{}]", items.join(","))
        }
        Node::Mapping(map) => {
            let items: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{:?}:{}", k.as_str(), canonical(v)))
                .collect();
            format!("{{{}}}", items.join(","))
        }
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
            let reference_text = &reference[..end];
            // `${NAME:-default}`: the default when NAME is unset or empty, as in the shell.
            let (name, default) = match reference_text.split_once(":-") {
                Some((name, default)) => (name, Some(default)),
                None => (reference_text, None),
            };
            let valid =
                !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(format!(
                    "`${{{reference_text}}}` is not an environment variable reference (letters, digits, `_`, then optionally `:-default`)"
                ));
            }
            let value = match (lookup(name).filter(|v| !v.is_empty()), default) {
                (Some(value), _) => value,
                (None, Some(default)) => default.to_owned(),
                (None, None) => {
                    return Err(format!(
                        "environment variable `{name}` is not set (write `${{{name}:-default}}` for a default)"
                    ));
                }
            };
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
    notes: Vec<(Option<Location>, String)>,
}

/// Most events a sink takes at once when the file does not say (Flume's sinks' default).
const DEFAULT_SINK_BATCH_SIZE: usize = 100;

/// Channel names declared in the file, with where; built or not.
type Declared = BTreeMap<String, Option<Location>>;

/// What is common to every component entry after the runtime's keys are taken out.
struct Entry<'n> {
    kind: ComponentKind,
    name: &'n str,
    key: &'n MarkedScalarNode,
    /// The whole entry as written, runtime keys included.
    node: &'n MarkedMappingNode,
    type_name: String,
    type_location: Option<Location>,
    /// The component's own options: the entry without `type` and the runtime's keys.
    options: MarkedMappingNode,
}

impl Entry<'_> {
    /// Where key `key` of the entry is written.
    fn location_of_key(&self, key: &str) -> Option<Location> {
        self.node
            .keys()
            .find(|k| k.as_str() == key)
            .and_then(key_location)
    }
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
            sink_groups: Vec::new(),
            notes: Vec::new(),
            fingerprints: BTreeMap::new(),
        };
        let Some(root) = root.as_mapping() else {
            self.error(
                location(root),
                "a pipeline file must be a mapping with `sources`, `channels` and `sinks`",
            );
            return topology;
        };
        self.check_sections(root);
        self.settings(root, &mut topology);
        let data_dir = topology.agent.data_dir.clone();
        // Channels first: sources and sinks refer to them.
        let declared = self.build_channels(root, &data_dir, &mut topology);
        self.build_sources(root, &data_dir, &declared, &mut topology);
        let read = self.build_sinks(root, &data_dir, &declared, &mut topology);
        self.build_sink_groups(root, &mut topology);
        self.check_every_channel_is_read(&declared, &read);
        self.check_something_runs(root);
        topology
    }

    /// Refuses keys at the top that are not sections.
    fn check_sections(&mut self, root: &MarkedMappingNode) {
        for key in root.keys() {
            if !SECTIONS.contains(&key.as_str()) {
                let message = unknown_name_message("section", key.as_str(), SECTIONS);
                self.error(key_location(key), message);
            }
        }
    }

    /// The `agent:` and `broker:` sections.
    fn settings(&mut self, root: &MarkedMappingNode, topology: &mut Topology) {
        if let Some(agent) = root.get_node("agent") {
            match parse_section::<AgentSettings>(agent, "agent") {
                Ok(settings) => topology.agent = settings,
                Err(error) => self.errors.extend(error.into_all()),
            }
        }
        if let Some(broker) = root.get_node("broker") {
            match parse_broker_section(broker) {
                Ok(settings) => topology.broker = Some(settings),
                Err(error) => self.errors.extend(error.into_all()),
            }
        }
    }

    /// Builds every channel; returns the names declared (built or not, so that a channel
    /// with a bad option is not also reported as unknown where it is used) with their
    /// locations.
    fn build_channels(
        &mut self,
        root: &MarkedMappingNode,
        data_dir: &Path,
        topology: &mut Topology,
    ) -> Declared {
        let mut declared = Declared::new();
        for entry in self.entries(root, "channels", ComponentKind::Channel) {
            declared.insert(entry.name.to_owned(), key_location(entry.key));
            let Some(factory) = self.factory(&entry, |r, t| r.channel(t).cloned()) else {
                continue;
            };
            let cfg = component_config(ComponentKind::Channel, &entry, data_dir);
            match factory(&cfg) {
                Ok(channel) => {
                    let channel = Arc::new(MeteredChannel::new(channel));
                    topology.channels.insert(entry.name.to_owned(), channel);
                    topology
                        .channel_types
                        .insert(entry.name.to_owned(), cfg.type_name().to_owned());
                }
                Err(e) => self.errors.extend(e.into_all()),
            }
        }
        declared
    }

    /// Builds every source with its channels and interceptors.
    fn build_sources(
        &mut self,
        root: &MarkedMappingNode,
        data_dir: &Path,
        declared: &Declared,
        topology: &mut Topology,
    ) {
        for entry in self.entries(root, "sources", ComponentKind::Source) {
            let name = entry.name.to_owned();
            let channels = match entry.node.get_node("channels") {
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
                    declared,
                    &topology.channels,
                ),
            };
            let interceptors = entry
                .node
                .get_node("interceptors")
                .map(|node| self.interceptors(&name, node, data_dir))
                .unwrap_or_default();
            let selector = match entry.node.get_node("selector") {
                None => ChannelSelector::default(),
                Some(node) => {
                    let names = channel_names(entry.node.get_node("channels"));
                    selector::parse(&name, node, &names, data_dir).unwrap_or_else(|errors| {
                        self.errors.extend(errors);
                        ChannelSelector::default()
                    })
                }
            };
            let Some(factory) = self.factory(&entry, |r, t| r.source(t).cloned()) else {
                continue;
            };
            let cfg = component_config(ComponentKind::Source, &entry, data_dir);
            let source = match factory(&cfg) {
                Ok(source) => source,
                Err(e) => {
                    self.errors.extend(e.into_all());
                    continue;
                }
            };
            self.check_positions(&entry, source.as_ref(), &interceptors);
            if let Some(max) = source.max_batch_size() {
                for channel in &channels {
                    self.check_fits(
                        ComponentKind::Source,
                        &name,
                        max,
                        channel.as_ref(),
                        cfg.location_of_key("batch_size"),
                    );
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
                selector,
            });
        }
    }

    /// Builds every sink with the channel it takes from; returns the names of the channels
    /// some sink takes from.
    fn build_sinks(
        &mut self,
        root: &MarkedMappingNode,
        data_dir: &Path,
        declared: &Declared,
        topology: &mut Topology,
    ) -> BTreeSet<String> {
        let mut read = BTreeSet::new();
        for entry in self.entries(root, "sinks", ComponentKind::Sink) {
            let name = entry.name.to_owned();
            let channel = match entry.node.get_node("channel") {
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
                    if let Some(scalar) = node.as_scalar() {
                        read.insert(scalar.as_str().to_owned());
                    }
                    self.sink_channel(&name, node, declared, &topology.channels)
                }
            };
            let dead_letter =
                self.sink_dead_letter(&entry, channel.as_deref(), declared, &topology.channels);
            if let Some(node) = entry.node.get_node("dead_letter")
                && let Some(scalar) = node.as_scalar()
            {
                // Read by `agent dead-letters` (or a sink of its own), not left to pile up.
                read.insert(scalar.as_str().to_owned());
            }
            let batch_size = self.sink_batch_size(&entry);
            if let Some(channel) = &channel {
                let location = entry.location_of_key("batch_size");
                self.check_fits(
                    ComponentKind::Sink,
                    &name,
                    batch_size,
                    channel.as_ref(),
                    location,
                );
            }
            if let Some(dead_letter) = &dead_letter {
                // A batch's refused events go to the dead-letter channel in one put.
                let location = entry.location_of_key("dead_letter");
                if !dead_letter.is_durable() {
                    let at = location.map(|l| format!("{l}: ")).unwrap_or_default();
                    self.notes.push((
                        location,
                        format!(
                            "{at}sink `{name}`: dead_letter `{}` is a memory channel, so refused events moved there are lost if the agent crashes or stops with them; a `file` channel keeps them",
                            dead_letter.name()
                        ),
                    ));
                }
                self.check_fits(
                    ComponentKind::Sink,
                    &name,
                    batch_size,
                    dead_letter.as_ref(),
                    location,
                );
            }
            let Some(factory) = self.factory(&entry, |r, t| r.sink(t).cloned()) else {
                continue;
            };
            let cfg = component_config(ComponentKind::Sink, &entry, data_dir);
            let sink = match factory(&cfg) {
                Ok(sink) => sink,
                Err(e) => {
                    self.errors.extend(e.into_all());
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
                    entry.location_of_key("delivery"),
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
                    dead_letter,
                });
            }
        }
        read
    }

    /// Builds every sink group of `sinkgroups:`, moving its members out of `topology.sinks`.
    /// A group's sinks must be declared, take from one channel and be in no other group.
    fn build_sink_groups(&mut self, root: &MarkedMappingNode, topology: &mut Topology) {
        let Some(node) = root.get_node("sinkgroups") else {
            return;
        };
        let Some(groups) = node.as_mapping() else {
            self.error(
                location(node),
                "`sinkgroups` must be a mapping of group names to `sinks` and `processor`",
            );
            return;
        };
        let declared: Vec<String> = root
            .get_mapping("sinks")
            .map(|sinks| sinks.keys().map(|k| k.as_str().to_owned()).collect())
            .unwrap_or_default();
        // Each sink already in a group, with the group and where it was listed.
        let mut grouped: BTreeMap<String, (String, Option<Location>)> = BTreeMap::new();
        for (key, value) in groups.iter() {
            let group = key.as_str();
            let errors_before = self.errors.len();
            let Some(entry) = value.as_mapping() else {
                self.group_error(
                    group,
                    location(value),
                    "a sink group is a mapping with `sinks` and `processor`",
                );
                continue;
            };
            for option in entry.keys() {
                if !["sinks", "processor"].contains(&option.as_str()) {
                    let message =
                        unknown_name_message("option", option.as_str(), ["sinks", "processor"]);
                    self.group_error(group, key_location(option), message);
                }
            }
            let members = self.group_members(group, key, entry, &declared, &mut grouped);
            let names: Vec<&str> = members.iter().map(|(name, _)| name.as_str()).collect();
            let processor = self.sink_processor(group, entry, &names);
            if self.errors.len() > errors_before {
                continue;
            }
            // Members that failed to build were reported with the sink.
            let mut specs = Vec::new();
            for (name, _) in &members {
                if let Some(at) = topology.sinks.iter().position(|s| &s.name == name) {
                    specs.push(topology.sinks.remove(at));
                }
            }
            if specs.len() < members.len() {
                continue;
            }
            if !self.check_one_channel(group, entry, &specs) {
                continue;
            }
            topology.sink_groups.push(SinkGroupSpec {
                name: group.to_owned(),
                members: specs,
                processor,
            });
        }
    }

    fn group_error(&mut self, group: &str, location: Option<Location>, message: impl Into<String>) {
        self.errors.push(ConfigError {
            component: Some(format!("sink group `{group}`")),
            ..ConfigError::new(location, message)
        });
    }

    /// The names of a group's `sinks`, with where each is written; each must be a declared
    /// sink, listed once, in no other group.
    fn group_members(
        &mut self,
        group: &str,
        key: &MarkedScalarNode,
        entry: &MarkedMappingNode,
        declared: &[String],
        grouped: &mut BTreeMap<String, (String, Option<Location>)>,
    ) -> Vec<(String, Option<Location>)> {
        let mut names: Vec<(String, Option<Location>)> = Vec::new();
        match entry.get_node("sinks") {
            None => {
                self.group_error(
                    group,
                    key_location(key),
                    "missing `sinks`: list the sinks of this group",
                );
            }
            // Flume writes `sinks = k1 k2`.
            Some(Node::Scalar(s)) => {
                for name in s.as_str().split_whitespace() {
                    names.push((name.to_owned(), key_location(s)));
                }
            }
            Some(Node::Sequence(seq)) => {
                for item in seq.iter() {
                    match item.as_scalar() {
                        Some(s) => names.push((s.as_str().to_owned(), key_location(s))),
                        None => self.group_error(
                            group,
                            location(item),
                            "sink names must be plain names",
                        ),
                    }
                }
            }
            Some(other @ Node::Mapping(_)) => {
                self.group_error(
                    group,
                    location(other),
                    "`sinks` must be a list of sink names, like `[k1, k2]`",
                );
            }
        }
        if names.is_empty() && entry.get_node("sinks").is_some() {
            self.group_error(group, key_location(key), "`sinks` is empty");
        }
        // Every name listed comes back once, problems or not (a group with a problem is not
        // built), so that the processor's checks do not report the same name again.
        let mut out: Vec<(String, Option<Location>)> = Vec::new();
        for (name, at) in names {
            if out.iter().any(|(n, _)| n == &name) {
                self.group_error(group, at, format!("sink `{name}` is listed twice"));
                continue;
            }
            if !declared.contains(&name) {
                let message =
                    unknown_name_message("sink", &name, declared.iter().map(String::as_str));
                self.group_error(group, at, message);
            } else if let Some((other, other_at)) = grouped.get(&name) {
                let line = other_at
                    .map(|l| format!(" (line {})", l.line))
                    .unwrap_or_default();
                self.group_error(
                    group,
                    at,
                    format!(
                        "sink `{name}` is already in sink group `{other}`{line}; a sink can be in one group only"
                    ),
                );
            } else {
                grouped.insert(name.clone(), (group.to_owned(), at));
            }
            out.push((name, at));
        }
        out
    }

    /// A group's `processor`, checked against its `members`.
    fn sink_processor(
        &mut self,
        group: &str,
        entry: &MarkedMappingNode,
        members: &[&str],
    ) -> SinkProcessorConfig {
        let sinks_at = entry
            .keys()
            .find(|k| k.as_str() == "sinks")
            .and_then(key_location);
        let mut options = match entry.get_node("processor") {
            None => MarkedMappingNode::new_empty(*entry.span()),
            Some(Node::Mapping(map)) => map.clone(),
            Some(other) => {
                self.group_error(
                    group,
                    location(other),
                    "`processor` must be a mapping with `type`, like `{ type: failover }`",
                );
                return SinkProcessorConfig::Default;
            }
        };
        let type_name = match options.remove("type") {
            None => "default".to_owned(),
            Some(Node::Scalar(s)) if PROCESSOR_TYPES.contains(&s.as_str()) => s.as_str().to_owned(),
            Some(other) => {
                let written = other.as_scalar().map(|s| s.as_str()).unwrap_or_default();
                let message = unknown_name_message("sink processor type", written, PROCESSOR_TYPES);
                self.group_error(group, location(&other), message);
                return SinkProcessorConfig::Default;
            }
        };
        let cfg = ComponentConfig::from_node(
            ComponentKind::Sink,
            group,
            type_name.clone(),
            Node::from(options.clone()),
            ".",
        );
        let parsed = match type_name.as_str() {
            "failover" => cfg.parse::<FailoverOptions>().map(|o| {
                let priorities = self.priorities(group, &options, &o.priority, members);
                SinkProcessorConfig::Failover {
                    priorities,
                    max_penalty: o.max_penalty,
                }
            }),
            "load_balance" => cfg.parse::<LoadBalanceOptions>().map(|o| {
                if members.len() < 2 {
                    self.group_error(
                        group,
                        sinks_at,
                        "a load_balance group needs at least two sinks",
                    );
                }
                SinkProcessorConfig::LoadBalance {
                    selector: o.selector,
                    backoff: o.backoff,
                    max_timeout: o.max_timeout,
                }
            }),
            _ => cfg.parse::<DefaultOptions>().map(|_| {
                if members.len() > 1 {
                    self.group_error(
                        group,
                        sinks_at,
                        "the default processor drives one sink; use `type: failover` or `type: load_balance` for several",
                    );
                }
                SinkProcessorConfig::Default
            }),
        };
        parsed.unwrap_or_else(|error| {
            self.errors
                .extend(error.labelled(&format!("sink group `{group}`")).into_all());
            SinkProcessorConfig::Default
        })
    }

    /// One priority per member, in the order of `members`: the one written, else -1, -2, ...
    /// in that order (as Flume numbers sinks without one). Names must be members and
    /// priorities distinct.
    fn priorities(
        &mut self,
        group: &str,
        processor: &MarkedMappingNode,
        written: &BTreeMap<String, i64>,
        members: &[&str],
    ) -> Vec<i64> {
        let keys: Vec<&MarkedScalarNode> = processor
            .get_mapping("priority")
            .map(|m| m.keys().collect())
            .unwrap_or_default();
        let at = |name: &str| {
            keys.iter()
                .find(|k| k.as_str() == name)
                .and_then(|k| key_location(k))
        };
        for name in written.keys() {
            if !members.contains(&name.as_str()) {
                let hint = match closest(name, members.iter().copied()) {
                    Some(best) => format!("did you mean `{best}`?"),
                    None => format!("its sinks are `{}`", members.join("`, `")),
                };
                self.group_error(
                    group,
                    at(name),
                    format!("`priority` names `{name}`, which is not a sink of this group; {hint}"),
                );
            }
        }
        let mut next = 0;
        let mut priorities = Vec::new();
        for member in members {
            let priority = written.get(*member).copied().unwrap_or_else(|| {
                next -= 1;
                next
            });
            if let Some(j) = priorities.iter().position(|&p| p == priority) {
                self.group_error(
                    group,
                    at(member),
                    format!(
                        "sinks `{}` and `{member}` have the same priority {priority}; priorities must differ",
                        members[j]
                    ),
                );
            }
            priorities.push(priority);
        }
        priorities
    }

    /// Refuses a group whose members take from different channels.
    fn check_one_channel(
        &mut self,
        group: &str,
        entry: &MarkedMappingNode,
        members: &[SinkSpec],
    ) -> bool {
        let first = &members[0].channel;
        if members.iter().all(|m| Arc::ptr_eq(&m.channel, first)) {
            return true;
        }
        let takes: Vec<String> = members
            .iter()
            .map(|m| format!("`{}` from `{}`", m.name, m.channel.name()))
            .collect();
        let at = entry
            .keys()
            .find(|k| k.as_str() == "sinks")
            .and_then(key_location);
        self.group_error(
            group,
            at,
            format!(
                "the sinks of a group must take from one channel, but {}",
                takes.join(", ")
            ),
        );
        false
    }

    /// The one channel a sink takes from.
    fn sink_channel(
        &mut self,
        name: &str,
        node: &Node,
        declared: &Declared,
        built: &BTreeMap<String, Arc<MeteredChannel>>,
    ) -> Option<Arc<dyn Channel>> {
        let mut found = self.channel_refs(ComponentKind::Sink, name, node, declared, built);
        if found.len() > 1 {
            self.component_error(
                ComponentKind::Sink,
                name,
                location(node),
                "a sink takes from exactly one `channel`",
            );
        }
        found.pop()
    }

    /// A sink's `dead_letter`: a channel of the pipeline other than the one it takes from.
    fn sink_dead_letter(
        &mut self,
        entry: &Entry<'_>,
        channel: Option<&dyn Channel>,
        declared: &Declared,
        built: &BTreeMap<String, Arc<MeteredChannel>>,
    ) -> Option<Arc<dyn Channel>> {
        let node = entry.node.get_node("dead_letter")?;
        let Some(scalar) = node.as_scalar() else {
            self.component_error(
                ComponentKind::Sink,
                entry.name,
                location(node),
                "`dead_letter` names one channel",
            );
            return None;
        };
        if channel.is_some_and(|c| c.name() == scalar.as_str()) {
            self.component_error(
                ComponentKind::Sink,
                entry.name,
                key_location(scalar),
                format!(
                    "`dead_letter` cannot be `{}`, the channel this sink takes from: refused events would come straight back; name another channel",
                    scalar.as_str()
                ),
            );
            return None;
        }
        self.channel_refs(ComponentKind::Sink, entry.name, node, declared, built)
            .pop()
    }

    /// A sink's `batch_size`: most events per take.
    fn sink_batch_size(&mut self, entry: &Entry<'_>) -> usize {
        let Some(node) = entry.node.get_node("batch_size") else {
            return DEFAULT_SINK_BATCH_SIZE;
        };
        match node.as_scalar().map(|s| s.as_str().parse::<usize>()) {
            Some(Ok(n)) if n > 0 => n,
            _ => {
                self.component_error(
                    ComponentKind::Sink,
                    entry.name,
                    location(node),
                    "`batch_size` must be a whole number of at least 1",
                );
                DEFAULT_SINK_BATCH_SIZE
            }
        }
    }

    /// Refuses a batch of `batch_size` events that could never fit in one transaction of
    /// `channel`.
    fn check_fits(
        &mut self,
        kind: ComponentKind,
        name: &str,
        batch_size: usize,
        channel: &dyn Channel,
        location: Option<Location>,
    ) {
        if batch_size > channel.transaction_capacity() {
            self.component_error(
                kind,
                name,
                location,
                format!(
                    "batch_size {batch_size} is above the transaction_capacity {} of channel `{}`",
                    channel.transaction_capacity(),
                    channel.name()
                ),
            );
        }
    }

    /// A channel no sink takes from would fill up and stop its sources.
    fn check_every_channel_is_read(&mut self, declared: &Declared, read: &BTreeSet<String>) {
        for (name, location) in declared {
            if !read.contains(name) {
                self.component_error(
                    ComponentKind::Channel,
                    name,
                    *location,
                    "no sink takes from this channel, so its events would pile up; bind a sink to it with `channel:`",
                );
            }
        }
    }

    fn check_something_runs(&mut self, root: &MarkedMappingNode) {
        if root.get_node("sources").is_none()
            && root.get_node("sinks").is_none()
            && root.get_node("broker").is_none()
        {
            self.error(
                location(&Node::from(root.clone())),
                "nothing to run: the file has no `sources`, `sinks` or `broker`",
            );
        }
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
            let Some(options_node) = value.as_mapping() else {
                self.component_error(
                    kind,
                    name,
                    location(value),
                    "must be a mapping of options with at least `type`",
                );
                continue;
            };
            let mut options = options_node.clone();
            let (type_name, type_location) = match options.remove("type") {
                Some(Node::Scalar(s)) => (
                    self.canonical_type(kind, s.as_str(), key_location(&s)),
                    key_location(&s),
                ),
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
                kind,
                name,
                key,
                node: options_node,
                type_name,
                type_location,
                options,
            });
        }
        out
    }

    /// The registered type name `written` stands for: itself, the one it matches ignoring
    /// case, `_` and `-` (Flume's `TAILDIR`, `FILE_ROLL`, `syslogtcp`), or the one Flume's
    /// class name stands for (`org.apache.flume.sink.kafka.KafkaSink`), noted with the
    /// canonical spelling. An unknown name is returned as written, for the factory lookup to
    /// report.
    fn canonical_type(
        &mut self,
        kind: ComponentKind,
        written: &str,
        location: Option<Location>,
    ) -> String {
        let names = self.registry.type_names(kind);
        if names.contains(&written) {
            return written.to_owned();
        }
        let fold = |name: &str| {
            name.chars()
                .filter(|c| !matches!(c, '_' | '-'))
                .map(|c| c.to_ascii_lowercase())
                .collect::<String>()
        };
        let folded = fold(written);
        let flume = crate::flume::our_type(kind, written);
        match names
            .iter()
            .find(|name| fold(name) == folded || Some(**name) == flume)
        {
            Some(name) => {
                let at = location.map(|l| format!("{l}: ")).unwrap_or_default();
                self.notes.push((
                    location,
                    format!("{at}{kind} type `{written}` is taken as `{name}`; write `{name}`"),
                ));
                (*name).to_owned()
            }
            None => written.to_owned(),
        }
    }

    /// The factory of the entry's type, reporting the closest name when none is registered.
    fn factory<F>(
        &mut self,
        entry: &Entry<'_>,
        lookup: impl Fn(&Registry, &str) -> Option<F>,
    ) -> Option<F> {
        let found = lookup(self.registry, &entry.type_name);
        if found.is_none() {
            let names = self.registry.type_names(entry.kind);
            let message =
                unknown_name_message(&format!("{} type", entry.kind), &entry.type_name, names);
            self.component_error(entry.kind, entry.name, entry.type_location, message);
        }
        found
    }

    /// Resolves a list (or single name) of channel references.
    fn channel_refs(
        &mut self,
        kind: ComponentKind,
        name: &str,
        node: &Node,
        known: &Declared,
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
        let mut seen = BTreeSet::new();
        for r in refs {
            let channel = r.as_str();
            if !seen.insert(channel) {
                self.component_error(
                    kind,
                    name,
                    key_location(r),
                    format!("channel `{channel}` is listed twice"),
                );
                continue;
            }
            if let Some(c) = built.get(channel) {
                out.push(Arc::clone(c) as Arc<dyn Channel>);
            } else if !known.contains_key(channel) {
                let message =
                    unknown_name_message("channel", channel, known.keys().map(String::as_str));
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
                Some(Node::Scalar(s)) => {
                    self.canonical_type(ComponentKind::Interceptor, s.as_str(), key_location(&s))
                }
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
                Err(e) => self.errors.extend(e.into_all()),
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
        .map_err(|error| error.labelled(&format!("section `{section}`")))
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

/// The channel names of a source's `channels`, in order.
fn channel_names(node: Option<&Node>) -> Vec<String> {
    match node {
        Some(Node::Scalar(s)) => vec![s.as_str().to_owned()],
        Some(Node::Sequence(seq)) => seq
            .iter()
            .filter_map(Node::as_scalar)
            .map(|s| s.as_str().to_owned())
            .collect(),
        _ => Vec::new(),
    }
}

/// Options of a `failover` processor.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FailoverOptions {
    /// Priority of each sink; higher goes first. Flume: `processor.priority.<sink>`.
    #[serde(default)]
    priority: BTreeMap<String, i64>,
    /// Longest time a failed sink is left out. Default `30s`. Flume: `processor.maxpenalty`.
    #[serde(default = "default_max_penalty", with = "ferry_core::config::duration")]
    max_penalty: Duration,
}

/// Options of a `load_balance` processor.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LoadBalanceOptions {
    /// `round_robin` or `random`. Default `round_robin`. Flume: `processor.selector`.
    #[serde(default = "default_selector", deserialize_with = "selector")]
    selector: Selector,
    /// Leave a failed sink out for a while. Default `false`. Flume: `processor.backoff`.
    #[serde(default)]
    backoff: bool,
    /// Longest time a failed sink is left out. Default `30s`. Flume:
    /// `processor.selector.maxTimeOut`.
    #[serde(default = "default_max_penalty", with = "ferry_core::config::duration")]
    max_timeout: Duration,
}

/// A `default` processor has no options.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DefaultOptions {}

fn default_max_penalty() -> Duration {
    DEFAULT_MAX_PENALTY
}

fn default_selector() -> Selector {
    Selector::RoundRobin
}

fn selector<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Selector, D::Error> {
    let name = String::deserialize(d)?;
    match name.as_str() {
        "round_robin" => Ok(Selector::RoundRobin),
        "random" => Ok(Selector::Random),
        other => Err(serde::de::Error::custom(unknown_name_message(
            "selector",
            other,
            ["round_robin", "random"],
        ))),
    }
}

/// Keys of a component entry that the runtime handles, not the component.
fn runtime_keys(kind: ComponentKind) -> &'static [&'static str] {
    match kind {
        ComponentKind::Source => &["channels", "interceptors", "selector"],
        ComponentKind::Sink => &["channel", "batch_size", "dead_letter"],
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
        // Defaults, as the shell's `${NAME:-default}`: taken when unset or empty.
        assert_eq!(
            expand_env(
                "${PASSWORD:-x} ${PORT:-9092} ${EMPTY:-} ${HOST:-a:b}",
                &lookup
            )
            .unwrap(),
            "hunter2 9092  a:b"
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

    #[test]
    fn a_channel_listed_twice_by_a_source_is_refused() {
        let got = problems(
            "sources:\n  gen: { type: generator, channels: [c, c] }\nchannels:\n  c: { type: memory }\nsinks:\n  out: { type: discard, channel: c }\n",
        );
        assert_eq!(got, ["2:41: source `gen`: channel `c` is listed twice"]);
    }

    #[test]
    fn flume_spellings_of_type_names_are_taken_and_the_canonical_one_is_suggested() {
        let yaml = "\
sources:
  gen: { type: GENERATOR, channels: [c] }
channels:
  c: { type: Memory }
sinks:
  out: { type: DIS-CARD, channel: c }
";
        let topology = parse(yaml, &registry()).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(topology.channel_types["c"], "memory");
        assert_eq!(
            topology.notes,
            [
                "2:16: source type `GENERATOR` is taken as `generator`; write `generator`",
                "4:14: channel type `Memory` is taken as `memory`; write `memory`",
                "6:16: sink type `DIS-CARD` is taken as `discard`; write `discard`",
            ]
        );
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
        assert!(got[0].starts_with("2:42: source `gen`: batch_size 500 is above the transaction_capacity 100 of channel `c`"), "{got:#?}");
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

    const GROUP_BASE: &str = "\
sources:
  gen: { type: generator, channels: [c] }
channels:
  c: { type: memory }
sinks:
  k1: { type: discard, channel: c }
  k2: { type: discard, channel: c }
  k3: { type: discard, channel: c }
";

    #[test]
    fn a_sink_group_takes_its_members_out_of_the_sinks() {
        let yaml = format!(
            "{GROUP_BASE}sinkgroups:\n  g1:\n    sinks: k1 k2\n    processor:\n      type: failover\n      priority: {{ k2: 7 }}\n      max_penalty: 5s\n"
        );
        let topology = parse(&yaml, &registry()).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(topology.sinks.len(), 1);
        assert_eq!(topology.sinks[0].name, "k3");
        let group = &topology.sink_groups[0];
        let members: Vec<&str> = group.members.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(members, ["k1", "k2"]);
        assert_eq!(
            group.processor,
            SinkProcessorConfig::Failover {
                priorities: vec![-1, 7],
                max_penalty: Duration::from_secs(5),
            }
        );
        assert_eq!(topology.all_sinks().count(), 3);
    }

    #[test]
    fn bad_processors_are_refused_with_their_lines() {
        let yaml = format!(
            "{GROUP_BASE}sinkgroups:
  one:
    sinks: [k1, k2]
  lonely:
    sinks: [k3]
    processor: {{ type: load_balance }}
"
        );
        let got = problems(&yaml);
        assert_eq!(
            got,
            [
                "11:5: sink group `one`: the default processor drives one sink; use `type: failover` or `type: load_balance` for several",
                "13:5: sink group `lonely`: a load_balance group needs at least two sinks",
            ],
            "{got:#?}"
        );
        let yaml = format!(
            "{GROUP_BASE}sinkgroups:
  g:
    sinks: [k1, k2]
    processor: {{ type: load_balance, selector: round_robn }}
"
        );
        assert_eq!(
            problems(&yaml),
            [
                "12:48: sink group `g`: option `selector`: unknown selector `round_robn`, did you mean `round_robin`?"
            ]
        );
        let yaml = format!(
            "{GROUP_BASE}sinkgroups:
  g:
    sinks: [k1, k2, k1]
    processor: {{ type: failover, priority: {{ k1: 3, k2: 3 }} }}
"
        );
        let got = problems(&yaml);
        assert_eq!(got.len(), 2, "{got:#?}");
        assert!(got[0].contains("sink `k1` is listed twice"), "{got:#?}");
        assert!(
            got[1].contains("sinks `k1` and `k2` have the same priority 3"),
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
