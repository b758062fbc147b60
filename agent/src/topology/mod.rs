//! Loading and validating a pipeline file: the YAML topology of sources, channels and sinks.
//!
//! Every problem in the file is collected and reported at once, each with its line and
//! column, the component it belongs to and, for a misspelt name, the closest valid one.
//! Building a topology constructs every component through its factory (which validates its
//! options) but starts nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ferry_broker::BrokerConfig;
use ferry_core::config::{ComponentKind, Location};
use ferry_core::registry::{SinkFactory, SourceFactory};
use ferry_core::{
    Channel, ChannelSelector, ComponentConfig, ComponentMetrics, ConfigError, Interceptor,
    MeteredChannel, Registry, Sink, Source,
};
use marked_yaml::types::{MarkedMappingNode, MarkedScalarNode};
use marked_yaml::{LoaderOptions, Node};
use serde::Deserialize;

use crate::sinkgroup::SinkProcessorConfig;

mod builder;
mod env;
mod selector;

use builder::Builder;
pub(crate) use env::substitute_env;

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
    /// is down or cannot be reached, a source that stopped with an error or cannot reach its
    /// input), or a sink whose delivery stays in flight this long, makes `/health` answer
    /// 503. Default `30s`.
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

#[cfg(test)]
mod tests;
