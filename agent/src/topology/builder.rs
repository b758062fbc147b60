//! Building a topology from a parsed file: each section in turn, every problem collected.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use ferry_core::config::{ComponentKind, Location, unknown_name_message};
use ferry_core::{
    Channel, ChannelSelector, ComponentConfig, ComponentMetrics, ConfigError, Interceptor,
    MeteredChannel, Registry, Source,
};
use marked_yaml::Node;
use marked_yaml::types::{MarkedMappingNode, MarkedScalarNode};

use super::*;

pub(super) struct Builder<'a> {
    pub(super) registry: &'a Registry,
    pub(super) errors: Vec<ConfigError>,
    pub(super) notes: Vec<(Option<Location>, String)>,
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

    pub(super) fn build(&mut self, root: &Node) -> Topology {
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
        let flume = crate::flume::components::our_type(kind, written);
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

mod sink_groups;
