//! From the properties of one Flume agent to the YAML tree of the same pipeline.

use std::collections::{BTreeSet, HashMap};

use ferry_core::ComponentKind;
use ferry_core::config::{closest, unknown_name_message};
use ferry_kafka::client::Role;

use super::Problem;
use super::components::{self, Conv, Ours, Special, To};
use super::yaml::{Map, Node};

/// The sections of an agent, in the order they are written, with the kind of their entries.
const SECTIONS: [(&str, Option<ComponentKind>); 4] = [
    ("sources", Some(ComponentKind::Source)),
    ("channels", Some(ComponentKind::Channel)),
    ("sinks", Some(ComponentKind::Sink)),
    ("sinkgroups", None),
];

/// The YAML of the pipeline, and what the reader should know (properties without effect,
/// components not listed).
pub(crate) struct Converted {
    pub(crate) root: Map,
    pub(crate) notes: Vec<Problem>,
}

/// One property of the agent: the key without the agent's name, e.g. `sources.r1.type`.
#[derive(Clone, Debug)]
struct Prop {
    key: String,
    value: String,
    line: usize,
}

/// A property of one component, `key` relative to it (`type`, `kafka.topic`).
#[derive(Clone, Debug)]
struct Own<'a> {
    key: &'a str,
    value: &'a str,
    line: usize,
    /// The whole key as written, for messages.
    full: String,
}

pub(crate) fn convert(text: &str, agent: &str) -> Result<Converted, Vec<Problem>> {
    let properties = ferry_core::properties::parse(text)
        .map_err(|e| vec![Problem::new(Some(e.line), None, e.message)])?;
    let mut converter = Converter {
        agent,
        errors: Vec::new(),
        notes: Vec::new(),
    };
    let props = converter.agent_properties(properties);
    let root = if props.is_empty() {
        Map::default()
    } else {
        converter.agent(&props)
    };
    if converter.errors.is_empty() {
        Ok(Converted {
            root,
            notes: converter.notes,
        })
    } else {
        converter.errors.sort_by_key(|p| p.line);
        Err(converter.errors)
    }
}

struct Converter<'a> {
    agent: &'a str,
    errors: Vec<Problem>,
    notes: Vec<Problem>,
}

impl Converter<'_> {
    fn error(&mut self, line: Option<usize>, key: Option<&str>, message: impl Into<String>) {
        self.errors
            .push(Problem::new(line, key.map(str::to_owned), message.into()));
    }

    fn note(&mut self, line: Option<usize>, key: Option<&str>, message: impl Into<String>) {
        self.notes
            .push(Problem::new(line, key.map(str::to_owned), message.into()));
    }

    fn full(&self, key: &str) -> String {
        format!("{}.{key}", self.agent)
    }

    /// The properties of this agent, each key once (the last value counts, as in Flume).
    fn agent_properties(&mut self, properties: Vec<ferry_core::properties::Property>) -> Vec<Prop> {
        let prefix = format!("{}.", self.agent);
        let mut agents = BTreeSet::new();
        let mut out: Vec<Prop> = Vec::new();
        let mut at: HashMap<String, usize> = HashMap::new();
        for p in properties {
            let Some(key) = p.key.strip_prefix(&prefix) else {
                agents.insert(p.key.split('.').next().unwrap_or_default().to_owned());
                continue;
            };
            let prop = Prop {
                key: key.to_owned(),
                value: p.value,
                line: p.line,
            };
            match at.get(key) {
                Some(&i) => {
                    let first = out[i].line;
                    self.note(
                        Some(prop.line),
                        Some(&p.key),
                        format!(
                            "set again (first at line {first}); the last value counts, as in Flume"
                        ),
                    );
                    out[i] = prop;
                }
                None => {
                    at.insert(key.to_owned(), out.len());
                    out.push(prop);
                }
            }
        }
        if out.is_empty() {
            let message = if agents.is_empty() {
                format!("no properties of agent `{}`: the file is empty", self.agent)
            } else {
                unknown_name_message("agent", self.agent, agents.iter().map(String::as_str))
                    + " (the agent is the first part of every key, `--name` picks it)"
            };
            self.error(None, None, message);
        }
        out
    }

    fn agent(&mut self, props: &[Prop]) -> Map {
        // Lists (`a1.sources = r1 r2`) and the properties of each component, in file order.
        let mut lists: HashMap<&str, &Prop> = HashMap::new();
        let mut components: Vec<((&str, &str), Vec<Own<'_>>)> = Vec::new();
        let mut refused_filters = false;
        for prop in props {
            let (section, rest) = prop.key.split_once('.').unwrap_or((&prop.key, ""));
            let full = self.full(&prop.key);
            if section == "configfilters" {
                if !refused_filters {
                    self.error(
                        Some(prop.line),
                        Some(&full),
                        "config filters are not built in: write `${NAME}` in a value to read the environment variable NAME",
                    );
                    refused_filters = true;
                }
                continue;
            }
            let Some(section) = SECTIONS.iter().map(|(s, _)| *s).find(|s| *s == section) else {
                let message = unknown_name_message(
                    &format!("part `{}.{section}`", self.agent),
                    section,
                    SECTIONS.iter().map(|(s, _)| *s),
                );
                self.error(Some(prop.line), Some(&full), message);
                continue;
            };
            if rest.is_empty() {
                lists.insert(section, prop);
                continue;
            }
            let Some((name, key)) = rest.split_once('.').filter(|(_, k)| !k.is_empty()) else {
                self.error(
                    Some(prop.line),
                    Some(&full),
                    format!("expected `{}.{section}.{rest}.<property>`", self.agent),
                );
                continue;
            };
            let own = Own {
                key,
                value: &prop.value,
                line: prop.line,
                full,
            };
            match components.iter_mut().find(|(id, _)| *id == (section, name)) {
                Some((_, owns)) => owns.push(own),
                None => components.push(((section, name), vec![own])),
            }
        }

        let mut root = Map::default();
        for (section, kind) in SECTIONS {
            let listed: Vec<&str> = lists
                .get(section)
                .map(|p| p.value.split_whitespace().collect())
                .unwrap_or_default();
            let list_line = lists.get(section).map(|p| p.line);
            for ((s, name), owns) in &components {
                if *s == section && !listed.contains(name) {
                    self.note(
                        Some(owns[0].line),
                        Some(&owns[0].full),
                        format!(
                            "`{name}` is not listed in `{}.{section}`, so it does not run (Flume skips it too)",
                            self.agent
                        ),
                    );
                }
            }
            let mut out = Map::default();
            let mut seen = BTreeSet::new();
            for name in listed {
                if !seen.insert(name) {
                    self.error(
                        list_line,
                        Some(&self.full(section)),
                        format!("`{name}` is listed twice"),
                    );
                    continue;
                }
                let Some((_, owns)) = components.iter().find(|(id, _)| *id == (section, name))
                else {
                    self.error(
                        list_line,
                        Some(&self.full(section)),
                        format!(
                            "`{name}` is listed but has no properties (Flume would drop it and start anyway): give `{}.{section}.{name}.type`, or take it out of the list",
                            self.agent
                        ),
                    );
                    continue;
                };
                let node = match kind {
                    Some(kind) => self.component(kind, name, owns),
                    None => self.sink_group(name, owns),
                };
                if let Some(node) = node {
                    out.insert(name, node);
                }
            }
            if !out.is_empty() {
                root.insert(section, Node::map(out, list_line));
            }
        }
        if !lists.contains_key("sources") && !lists.contains_key("sinks") {
            self.error(
                None,
                None,
                format!(
                    "agent `{}` has no sources and no sinks: list them in `{0}.sources` and `{0}.sinks`",
                    self.agent
                ),
            );
        }
        root
    }

    /// A source, channel, sink or interceptor: its type and its options.
    fn component(&mut self, kind: ComponentKind, name: &str, owns: &[Own<'_>]) -> Option<Node> {
        let Some(type_prop) = owns.iter().find(|o| o.key == "type") else {
            self.error(
                Some(owns[0].line),
                Some(&owns[0].full),
                format!("{kind} `{name}` has no `type` (Flume would drop it and start anyway)"),
            );
            return None;
        };
        let line = Some(type_prop.line);
        let component = match components::find(kind, type_prop.value) {
            Ok(component) => component,
            Err(message) => {
                self.error(line, Some(&type_prop.full), message);
                return None;
            }
        };
        let mut runs_as = &component.ours;
        let (ours, properties, implied, note) = loop {
            match runs_as {
                Ours::Refused(instead) => {
                    self.error(
                        line,
                        Some(&type_prop.full),
                        format!(
                            "Flume's {kind} `{}` cannot run here: {instead}",
                            type_prop.value
                        ),
                    );
                    return None;
                }
                Ours::InObjectStorage {
                    key,
                    then,
                    otherwise,
                } => {
                    // Decided first: the other properties of a component that cannot run
                    // say nothing more.
                    match owns.iter().find(|o| o.key == *key) {
                        Some(own) if object_storage_url(own.value).is_some() => runs_as = then,
                        Some(own) if own.value.starts_with("${") => {
                            self.error(
                                Some(own.line),
                                Some(&own.full),
                                "the scheme and the bucket are written out, not taken from a variable (`s3a://my-bucket/${DIR}/...`): they choose what the sink becomes",
                            );
                            return None;
                        }
                        Some(own) => {
                            self.error(Some(own.line), Some(&own.full), *otherwise);
                            return None;
                        }
                        None => {
                            self.error(
                                line,
                                Some(&type_prop.full),
                                format!("`{key}` is missing (Flume requires it too): {otherwise}"),
                            );
                            return None;
                        }
                    }
                }
                Ours::Type {
                    name,
                    properties,
                    implied,
                    note,
                } => break (*name, *properties, *implied, *note),
            }
        };
        let mut map = Map::default();
        map.insert("type", Node::text(ours, line));
        let mut specials: Vec<(Special, &Own<'_>)> = Vec::new();
        let mut selector = Vec::new();
        let mut interceptors = Vec::new();
        for own in owns {
            match (kind, own.key) {
                (_, "type") => {}
                (ComponentKind::Source, "channels") => {
                    map.insert("channels", words(own.value, own.line));
                }
                (ComponentKind::Source, key) if key.starts_with("selector.") => {
                    selector.push(own);
                }
                (ComponentKind::Source, key)
                    if key == "interceptors" || key.starts_with("interceptors.") =>
                {
                    interceptors.push(own);
                }
                (ComponentKind::Sink, "channel") => {
                    map.insert("channel", Node::text(own.value, Some(own.line)));
                }
                (_, key) => match components::property(properties, key) {
                    None => {
                        let known = properties
                            .iter()
                            .map(|p| p.flume)
                            .filter(|p| !p.ends_with('*'));
                        let hint = closest(key, known)
                            .map(|c| format!(", did you mean `{c}`?"))
                            .unwrap_or_default();
                        self.error(
                            Some(own.line),
                            Some(&own.full),
                            format!(
                                "`{key}` is not a property of Flume's {kind} `{}` that we know{hint}",
                                component.flume_name()
                            ),
                        );
                    }
                    Some(property) => match &property.to {
                        To::Option(option, conv) => {
                            if let Some(node) = self.value(own, *conv) {
                                map.insert(*option, node);
                            }
                        }
                        To::Ignored(why) => self.no_effect(own, why, &mut map),
                        To::Refused(why) => {
                            self.error(Some(own.line), Some(&own.full), *why);
                        }
                        To::Only(value, why) => {
                            if !own.value.eq_ignore_ascii_case(value) {
                                self.error(
                                    Some(own.line),
                                    Some(&own.full),
                                    format!("only `{value}` is supported: {why}"),
                                );
                            }
                        }
                        To::Special(special) => specials.push((*special, own)),
                    },
                },
            }
        }
        self.specials(&specials, type_prop, &mut map);
        if !selector.is_empty()
            && let Some(node) = self.selector(&selector)
        {
            map.insert("selector", node);
        }
        if !interceptors.is_empty() {
            let list = self.interceptors(name, &interceptors);
            if !list.is_empty() {
                map.insert("interceptors", Node::seq(list, Some(interceptors[0].line)));
            }
        }
        for (option, value, why) in implied {
            if map.get_mut(option).is_none() {
                map.comment(format!("as in Flume: {why}"));
                map.insert(*option, Node::plain(*value, line));
            }
        }
        if let Some(note) = note {
            map.comment(format!("note: {note}"));
            self.note(line, Some(&type_prop.full), note);
        }
        Some(Node::map(map, line))
    }

    /// A property without effect here: a comment in the YAML and a note, saying why.
    fn no_effect(&mut self, own: &Own<'_>, why: &str, map: &mut Map) {
        map.comment(format!(
            "Flume `{} = {}` (line {}): no effect here: {why}",
            own.key, own.value, own.line
        ));
        self.note(
            Some(own.line),
            Some(&own.full),
            format!("no effect here: {why}"),
        );
    }

    /// A Flume value as the node of an option.
    fn value(&mut self, own: &Own<'_>, conv: Conv) -> Option<Node> {
        let line = Some(own.line);
        let value = own.value;
        let number = |unit: &str| {
            value
                .parse::<u64>()
                .map(|n| Node::plain(format!("{n}{unit}"), line))
        };
        let result = match conv {
            Conv::Text => Ok(Node::text(value, line)),
            Conv::Bool => match value.to_ascii_lowercase().as_str() {
                "true" | "false" => Ok(Node::plain(value.to_ascii_lowercase(), line)),
                _ => Err(format!(
                    "`{value}` is not `true` or `false` (Flume reads anything but `true` as false)"
                )),
            },
            Conv::Millis => number("ms").map_err(|_| duration_message(value, "milliseconds")),
            Conv::Seconds => number("s").map_err(|_| duration_message(value, "seconds")),
            Conv::Words => Ok(words(value, own.line)),
            Conv::Commas => Ok(Node::seq(
                value
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(|s| Node::text(s, line))
                    .collect(),
                line,
            )),
            Conv::Lower => Ok(Node::text(value.to_ascii_lowercase(), line)),
            Conv::Values(values) => values
                .iter()
                .find(|(flume, _)| flume.eq_ignore_ascii_case(value))
                .map(|(_, ours)| Node::plain(*ours, line))
                .ok_or_else(|| {
                    let names: Vec<String> = values.iter().map(|(f, _)| format!("`{f}`")).collect();
                    format!(
                        "`{value}` is not supported: one of {} (any case)",
                        names.join(", ")
                    )
                }),
            Conv::Extension if value.is_empty() => Ok(Node::text("", line)),
            Conv::Extension => Ok(Node::text(format!(".{value}"), line)),
            Conv::Prefix => Ok(Node::text(format!("{value}."), line)),
        };
        match result {
            Ok(node) => Some(node),
            Err(message) => {
                self.error(line, Some(&own.full), message);
                None
            }
        }
    }

    /// The properties of a component that its type's code reads (`type_prop` is its `type`).
    fn specials(&mut self, specials: &[(Special, &Own<'_>)], type_prop: &Own<'_>, map: &mut Map) {
        let mut kafka = Vec::new();
        let mut taildir = Vec::new();
        let mut serializers = Vec::new();
        let mut hdfs = Vec::new();
        for (special, own) in specials {
            match special {
                Special::Kafka(role) => kafka.push((*role, *own)),
                Special::Taildir => taildir.push(*own),
                Special::Serializers => serializers.push(*own),
                Special::Hdfs => hdfs.push(*own),
                Special::DataDirs => {
                    let dirs: Vec<&str> = own
                        .value
                        .split(',')
                        .map(str::trim)
                        .filter(|d| !d.is_empty())
                        .collect();
                    if let Some(first) = dirs.first() {
                        map.insert("data_dir", Node::text(*first, Some(own.line)));
                    }
                    if dirs.len() > 1 {
                        let message = format!(
                            "only the first directory, `{}`, is used: the channel writes one directory (Flume spreads its log files over all)",
                            dirs[0]
                        );
                        map.comment(format!("Flume `dataDirs` (line {}): {message}", own.line));
                        self.note(Some(own.line), Some(&own.full), message);
                    }
                }
            }
        }
        for (role, own) in kafka {
            self.kafka(role, own, map);
        }
        if !taildir.is_empty() {
            self.taildir(&taildir, map);
        }
        if !serializers.is_empty() {
            self.serializers(&serializers, map);
        }
        // Never empty for the `hdfs` sink: it runs only with its `hdfs.path`.
        if !hdfs.is_empty() {
            self.hdfs(&hdfs, type_prop, map);
        }
    }

    /// A `kafka.*` property of a Kafka component: a connection option (our Kafka client
    /// module knows Flume's names), one of the component's own, or a client property passed
    /// through in `producer:` / `consumer:`.
    fn kafka(&mut self, role: Role, own: &Own<'_>, map: &mut Map) {
        let line = Some(own.line);
        if let Some(option) = role.option_of_flume_key(own.key) {
            map.insert(option, Node::text(own.value, line));
            return;
        }
        let producer = own
            .key
            .strip_prefix("kafka.producer.")
            .filter(|_| role != Role::Source);
        let consumer = own
            .key
            .strip_prefix("kafka.consumer.")
            .filter(|_| role != Role::Sink);
        const BYTES: &str = "record keys and values are bytes; no serializer to choose";
        match (role, producer, consumer) {
            (_, Some("key.serializer" | "value.serializer"), _)
            | (_, _, Some("key.deserializer" | "value.deserializer")) => {
                self.no_effect(own, BYTES, map);
            }
            (Role::Sink, Some("acks"), _) => map.insert("acks", Node::text(own.value, line)),
            (Role::Sink, Some("linger.ms"), _) => {
                if let Some(node) = self.value(own, Conv::Millis) {
                    map.insert("linger", node);
                }
            }
            (Role::Sink, Some("compression.type"), _) => {
                map.insert(
                    "compression",
                    Node::text(own.value.to_ascii_lowercase(), line),
                );
            }
            (Role::Channel, Some("acks"), _) => {
                if !matches!(own.value, "all" | "-1") {
                    self.error(
                        line,
                        Some(&own.full),
                        "the channel writes in Kafka transactions, which need acks=all (Flume's default for the channel)",
                    );
                }
            }
            (Role::Source, _, Some("auto.offset.reset")) => {
                map.insert(
                    "auto_offset_reset",
                    Node::text(own.value.to_ascii_lowercase(), line),
                );
            }
            (Role::Source, _, Some("isolation.level")) => {
                map.insert("isolation_level", Node::text(own.value, line));
            }
            (_, _, Some("enable.auto.commit")) => self.no_effect(
                own,
                "offsets are committed by the agent once the events are safe",
                map,
            ),
            (_, Some(property), _) if !property.is_empty() => {
                map.map_mut("producer", line)
                    .insert(property, Node::text(own.value, line));
            }
            (_, _, Some(property)) if !property.is_empty() => {
                map.map_mut("consumer", line)
                    .insert(property, Node::text(own.value, line));
            }
            _ => {
                let prefixes = match role {
                    Role::Source => "`kafka.consumer.*`",
                    Role::Sink => "`kafka.producer.*`",
                    Role::Channel => "`kafka.producer.*`, `kafka.consumer.*`",
                };
                self.error(
                    line,
                    Some(&own.full),
                    format!(
                        "`{}` is not a Kafka property of this component: Kafka client properties go under {prefixes}",
                        own.key
                    ),
                );
            }
        }
    }

    /// Taildir's `filegroups = g1 g2`, `filegroups.g1 = /dir/regex` and
    /// `headers.g1.key = value`.
    fn taildir(&mut self, owns: &[&Own<'_>], map: &mut Map) {
        let list = owns.iter().find(|o| o.key == "filegroups");
        let Some(list) = list else {
            let first = owns[0];
            self.error(
                Some(first.line),
                Some(&first.full),
                "`filegroups` (the list of file group names) is missing",
            );
            return;
        };
        let groups: Vec<&str> = list.value.split_whitespace().collect();
        let mut filegroups = Map::default();
        for group in &groups {
            let key = format!("filegroups.{group}");
            let Some(path) = owns.iter().find(|o| o.key == key) else {
                self.error(
                    Some(list.line),
                    Some(&list.full),
                    format!("file group `{group}` has no `{key}`"),
                );
                continue;
            };
            match glob_of_flume_path(path.value) {
                Ok((glob, exact)) => {
                    if !exact {
                        let message = format!(
                            "the file name regex is written as the glob `{glob}`, which matches at least the same files; check it does not match more"
                        );
                        filegroups
                            .comment(format!("Flume `{key}` (line {}): {message}", path.line));
                        self.note(Some(path.line), Some(&path.full), message);
                    }
                    filegroups.insert(*group, Node::text(glob, Some(path.line)));
                }
                Err(message) => self.error(Some(path.line), Some(&path.full), message),
            }
        }
        let mut headers = Map::default();
        for own in owns {
            if let Some(rest) = own.key.strip_prefix("filegroups.")
                && !groups.contains(&rest)
            {
                self.note(
                    Some(own.line),
                    Some(&own.full),
                    format!("file group `{rest}` is not listed in `filegroups`, so it is not read (Flume skips it too)"),
                );
            }
            if let Some(rest) = own.key.strip_prefix("headers.") {
                match rest.split_once('.') {
                    Some((group, header)) if groups.contains(&group) && !header.is_empty() => {
                        headers
                            .map_mut(group, Some(own.line))
                            .insert(header, Node::text(own.value, Some(own.line)));
                    }
                    _ => self.error(
                        Some(own.line),
                        Some(&own.full),
                        "expected `headers.<file group>.<header> = value` for a listed file group",
                    ),
                }
            }
        }
        map.insert("filegroups", Node::map(filegroups, Some(list.line)));
        if !headers.is_empty() {
            map.insert("headers", Node::map(headers, None));
        }
    }

    /// The regex extractor's `serializers = s1 s2` and `serializers.s1.{name,type,pattern}`.
    fn serializers(&mut self, owns: &[&Own<'_>], map: &mut Map) {
        const MILLIS: &str =
            "org.apache.flume.interceptor.RegexExtractorInterceptorMillisSerializer";
        const PASS: &str =
            "org.apache.flume.interceptor.RegexExtractorInterceptorPassThroughSerializer";
        let Some(list) = owns.iter().find(|o| o.key == "serializers") else {
            self.error(
                Some(owns[0].line),
                Some(&owns[0].full),
                "`serializers` (the list of serializer names, one per group of the regex) is missing",
            );
            return;
        };
        let mut items = Vec::new();
        for name in list.value.split_whitespace() {
            let prefix = format!("serializers.{name}.");
            let mut item = Map::default();
            for own in owns.iter().filter(|o| o.key.starts_with(&prefix)) {
                let line = Some(own.line);
                match &own.key[prefix.len()..] {
                    "name" => item.insert("name", Node::text(own.value, line)),
                    "type" if own.value == MILLIS => {
                        item.insert("type", Node::plain("millis", line))
                    }
                    "type" if own.value == PASS => {}
                    "type" => self.error(
                        line,
                        Some(&own.full),
                        format!("only the serializers {MILLIS} and {PASS} are built in"),
                    ),
                    "pattern" => item.insert("pattern", Node::text(own.value, line)),
                    other => self.error(
                        line,
                        Some(&own.full),
                        format!(
                            "`{other}` is not a serializer property: `name`, `type`, `pattern`"
                        ),
                    ),
                }
            }
            if item.get_mut("name").is_none() {
                self.error(
                    Some(list.line),
                    Some(&list.full),
                    format!("serializer `{name}` has no `serializers.{name}.name`"),
                );
            }
            items.push(Node::map(item, Some(list.line)));
        }
        for own in owns {
            let listed = own.key == "serializers"
                || list
                    .value
                    .split_whitespace()
                    .any(|n| own.key.starts_with(&format!("serializers.{n}.")));
            if !listed {
                self.error(
                    Some(own.line),
                    Some(&own.full),
                    "not a serializer listed in `serializers`",
                );
            }
        }
        map.insert("serializers", Node::seq(items, Some(list.line)));
    }

    /// The `hdfs` sink's properties read together (see [`Special::Hdfs`]), and Flume's roll
    /// defaults where the file sets none.
    fn hdfs(&mut self, owns: &[&Own<'_>], type_prop: &Own<'_>, map: &mut Map) {
        let get = |key: &str| owns.iter().find(|o| o.key == key).copied();
        if let Some(path) = get("hdfs.path") {
            self.hdfs_path(path, map);
        }
        self.hdfs_file_type(get("hdfs.fileType"), get("hdfs.codeC"), type_prop, map);
        self.hdfs_round(
            get("hdfs.round"),
            get("hdfs.roundValue"),
            get("hdfs.roundUnit"),
            map,
        );
        self.hdfs_roll_defaults(type_prop, map);
    }

    /// `hdfs.path = s3a://bucket/path` as `bucket` and `path`, the path's escapes as they are.
    fn hdfs_path(&mut self, own: &Own<'_>, map: &mut Map) {
        // Anything else was refused before the properties were read.
        let Some((bucket, path)) = object_storage_url(own.value) else {
            return;
        };
        let line = Some(own.line);
        let problem = if bucket.is_empty() {
            Some("no bucket: write `s3a://<bucket>/<path>`")
        } else if bucket.contains('@') {
            Some(
                "credentials in the URL are not read (they would be written into the converted YAML): the s3 sink takes them from the environment, the profile file or the instance's role",
            )
        } else if bucket.contains('%') {
            Some(
                "the bucket cannot come from an escape (a sink writes one bucket): put the escapes in the path after it",
            )
        } else {
            None
        };
        if let Some(problem) = problem {
            self.error(line, Some(&own.full), problem);
            return;
        }
        map.insert("bucket", Node::text(bucket, line));
        // Flume puts a `/` between the path and the file name, as the s3 sink does.
        let path = path.trim_matches('/');
        if !path.is_empty() {
            map.insert("path", Node::text(path, line));
        }
    }

    /// `hdfs.fileType` with `hdfs.codeC` as `format` and `compression`. `type_prop`, the
    /// sink's `type`, is blamed when `hdfs.fileType` is left at Flume's default, SequenceFile.
    fn hdfs_file_type(
        &mut self,
        file_type: Option<&Own<'_>>,
        codec: Option<&Own<'_>>,
        type_prop: &Own<'_>,
        map: &mut Map,
    ) {
        const WRITE: &str = "write `hdfs.fileType = DataStream` (the bodies as text), or `CompressedStream` with `hdfs.codeC = gzip` or `zstd`";
        let Some(file_type) = file_type else {
            self.error(
                Some(type_prop.line),
                Some(&type_prop.full),
                format!(
                    "`hdfs.fileType` is not set and Flume's default is SequenceFile, which is not written here (Hadoop SequenceFiles): {WRITE}"
                ),
            );
            return;
        };
        let line = Some(file_type.line);
        let value = file_type.value;
        let compressed = if value.eq_ignore_ascii_case("DataStream") {
            false
        } else if value.eq_ignore_ascii_case("CompressedStream") {
            true
        } else if value.eq_ignore_ascii_case("SequenceFile") {
            self.error(
                line,
                Some(&file_type.full),
                format!("Hadoop SequenceFiles are not written here: {WRITE}"),
            );
            return;
        } else {
            self.error(
                line,
                Some(&file_type.full),
                format!("`{value}` is not one of Flume's file types: {WRITE}"),
            );
            return;
        };
        let compression = match (compressed, codec) {
            (false, None) => None,
            (false, Some(codec)) => {
                self.error(
                    Some(codec.line),
                    Some(&codec.full),
                    "Flume refuses a codec with `hdfs.fileType = DataStream` too: write `hdfs.fileType = CompressedStream` to compress",
                );
                return;
            }
            (true, None) => {
                self.error(
                    line,
                    Some(&file_type.full),
                    "`CompressedStream` needs `hdfs.codeC` (`gzip` or `zstd`), as in Flume",
                );
                return;
            }
            (true, Some(codec)) => match compression_of_codec(codec.value) {
                Some(found) => Some((found, codec.line)),
                None => {
                    self.error(
                        Some(codec.line),
                        Some(&codec.full),
                        format!(
                            "the codec `{}` is not supported: `gzip` or `zstd` (Hadoop's GzipCodec and ZStandardCodec); bzip2, lzo, lzop, snappy, lz4 and deflate are not written",
                            codec.value
                        ),
                    );
                    return;
                }
            },
        };
        if map.get_mut("format").is_none() {
            map.insert("format", Node::plain("text", line));
        }
        if let Some(((compression, extension), codec_line)) = compression {
            map.insert("compression", Node::plain(compression, Some(codec_line)));
            if map.get_mut("file_suffix").is_none() {
                map.comment(
                    "as in Flume: without hdfs.fileSuffix, the names end with the codec's extension",
                );
                map.insert("file_suffix", Node::text(extension, Some(codec_line)));
            }
        }
    }

    /// `hdfs.round`, `hdfs.roundValue` (default 1) and `hdfs.roundUnit` (default `second`)
    /// as `round` (`10m`).
    fn hdfs_round(
        &mut self,
        round: Option<&Own<'_>>,
        value: Option<&Own<'_>>,
        unit: Option<&Own<'_>>,
        map: &mut Map,
    ) {
        let Some(round) = round.filter(|own| {
            self.value(own, Conv::Bool).is_some() && own.value.eq_ignore_ascii_case("true")
        }) else {
            for own in [value, unit].into_iter().flatten() {
                self.no_effect(
                    own,
                    "`hdfs.round` is not `true` (Flume ignores it too)",
                    map,
                );
            }
            return;
        };
        let unit_name = unit.map_or("second", |own| own.value);
        let (suffix, most) = match unit_name.to_ascii_lowercase().as_str() {
            "second" => ("s", 60),
            "minute" => ("m", 60),
            "hour" => ("h", 24),
            _ => {
                if let Some(unit) = unit {
                    self.error(
                        Some(unit.line),
                        Some(&unit.full),
                        format!(
                            "`{unit_name}` is not `second`, `minute` or `hour` (Flume would turn rounding off with a warning)"
                        ),
                    );
                }
                return;
            }
        };
        let n = match value {
            None => 1,
            Some(own) => match own.value.parse::<u32>() {
                Ok(n) if (1..=most).contains(&n) => n,
                _ => {
                    self.error(
                        Some(own.line),
                        Some(&own.full),
                        format!(
                            "`{}` is not a whole number from 1 to {most} (Flume refuses it too)",
                            own.value
                        ),
                    );
                    return;
                }
            },
        };
        map.insert(
            "round",
            Node::plain(format!("{n}{suffix}"), Some(round.line)),
        );
    }

    /// Flume's roll defaults for the roll settings the file leaves out, with a note: they
    /// make small objects.
    fn hdfs_roll_defaults(&mut self, type_prop: &Own<'_>, map: &mut Map) {
        let missing: Vec<&components::RollDefault> = components::HDFS_ROLL_DEFAULTS
            .iter()
            .filter(|d| map.get_mut(d.option).is_none())
            .collect();
        if missing.is_empty() {
            return;
        }
        let list = |value: fn(&components::RollDefault) -> &'static str| {
            missing
                .iter()
                .map(|d| format!("`{} = {}`", d.flume, value(d)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let message = format!(
            "Flume's defaults are kept where the file does not set them, {}: they make small objects, slow and costly to store and to read; set larger ones, e.g. {}",
            list(|d| d.flume_value),
            list(|d| d.larger)
        );
        let line = Some(type_prop.line);
        map.comment(message.clone());
        for default in &missing {
            map.insert(default.option, Node::plain(default.ours, line));
        }
        self.note(line, Some(&type_prop.full), message);
    }

    /// `selector.*` of a source.
    fn selector(&mut self, owns: &[&Own<'_>]) -> Option<Node> {
        const REPLICATING: [&str; 2] = [
            "replicating",
            "org.apache.flume.channel.ReplicatingChannelSelector",
        ];
        const MULTIPLEXING: [&str; 2] = [
            "multiplexing",
            "org.apache.flume.channel.MultiplexingChannelSelector",
        ];
        let type_prop = owns.iter().find(|o| o.key == "selector.type");
        let kind = type_prop.map_or("replicating", |o| o.value);
        let line = type_prop.map(|o| o.line).or(Some(owns[0].line));
        let is = |names: [&str; 2]| names[0].eq_ignore_ascii_case(kind) || names[1] == kind;
        let mut map = Map::default();
        if is(REPLICATING) {
            map.insert("type", Node::plain("replicating", line));
            for own in owns {
                match own.key {
                    "selector.type" => {}
                    "selector.optional" => map.insert("optional", words(own.value, own.line)),
                    key => self.error(
                        Some(own.line),
                        Some(&own.full),
                        format!("`{key}` is not a property of the replicating selector: `selector.optional`"),
                    ),
                }
            }
            // Replicating to every channel, none optional, is what a source does without one.
            map.get_mut("optional")?;
        } else if is(MULTIPLEXING) {
            map.insert("type", Node::plain("multiplexing", line));
            // Flume's default header name.
            map.insert("header", Node::text("flume.selector.header", line));
            let mut mapping = Map::default();
            let mut optional = Map::default();
            for own in owns {
                let (key, value, line) = (own.key, own.value, own.line);
                let mapped = key.strip_prefix("selector.mapping.");
                let optional_for = key.strip_prefix("selector.optional.");
                if let Some(v) = mapped {
                    mapping.insert(v, words(value, line));
                } else if let Some(v) = optional_for {
                    optional.insert(v, words(value, line));
                } else if key == "selector.header" {
                    map.insert("header", Node::text(value, Some(line)));
                } else if key == "selector.default" {
                    map.insert("default", words(value, line));
                } else if key != "selector.type" {
                    self.error(
                        Some(line),
                        Some(&own.full),
                        format!("`{key}` is not a property of the multiplexing selector: `selector.header`, `selector.mapping.<value>`, `selector.default`, `selector.optional.<value>`"),
                    );
                }
            }
            if !mapping.is_empty() {
                map.insert("mapping", Node::map(mapping, None));
            }
            if !optional.is_empty() {
                map.insert("optional", Node::map(optional, None));
            }
        } else if kind.eq_ignore_ascii_case("load_balancing")
            || kind == "org.apache.flume.channel.LoadBalancingChannelSelector"
        {
            self.error(
                line,
                type_prop.map(|o| o.full.as_str()),
                "the load-balancing channel selector is not built in: put every event in one channel and balance its sinks with a sink group (`processor.type = load_balance`)",
            );
            return None;
        } else {
            self.error(
                line,
                type_prop.map(|o| o.full.as_str()),
                format!("selector type `{kind}` is not built in: `replicating` or `multiplexing`"),
            );
            return None;
        }
        Some(Node::map(map, line))
    }

    /// `interceptors = i1 i2` and `interceptors.i1.*` of source `source`.
    fn interceptors(&mut self, source: &str, owns: &[&Own<'_>]) -> Vec<Node> {
        let list = owns.iter().find(|o| o.key == "interceptors");
        let names: Vec<&str> = list
            .map(|o| o.value.split_whitespace().collect())
            .unwrap_or_default();
        let mut out = Vec::new();
        for name in &names {
            let prefix = format!("interceptors.{name}.");
            let props: Vec<Own<'_>> = owns
                .iter()
                .filter_map(|o| {
                    o.key.strip_prefix(&prefix).map(|key| Own {
                        key,
                        value: o.value,
                        line: o.line,
                        full: o.full.clone(),
                    })
                })
                .collect();
            if props.is_empty() {
                if let Some(list) = list {
                    self.error(
                        Some(list.line),
                        Some(&list.full),
                        format!("interceptor `{name}` has no `{prefix}type`"),
                    );
                }
                continue;
            }
            if let Some(node) = self.component(
                ComponentKind::Interceptor,
                &format!("{source}.{name}"),
                &props,
            ) {
                out.push(node);
            }
        }
        for own in owns {
            if own.key == "interceptors" {
                continue;
            }
            let listed = names
                .iter()
                .any(|n| own.key.starts_with(&format!("interceptors.{n}.")));
            if !listed {
                self.note(
                    Some(own.line),
                    Some(&own.full),
                    "this interceptor is not listed in `interceptors`, so it does not run (Flume skips it too)",
                );
            }
        }
        out
    }

    /// A sink group: `sinks = k1 k2` and `processor.*`.
    fn sink_group(&mut self, name: &str, owns: &[Own<'_>]) -> Option<Node> {
        let type_prop = owns.iter().find(|o| o.key == "processor.type");
        let kind = type_prop.map_or("default", |o| o.value);
        let line = type_prop.map(|o| o.line).or(Some(owns[0].line));
        let kind = if kind.eq_ignore_ascii_case("failover")
            || kind == "org.apache.flume.sink.FailoverSinkProcessor"
        {
            "failover"
        } else if kind.eq_ignore_ascii_case("load_balance")
            || kind == "org.apache.flume.sink.LoadBalancingSinkProcessor"
        {
            "load_balance"
        } else if kind.eq_ignore_ascii_case("default")
            || kind == "org.apache.flume.sink.DefaultSinkProcessor"
        {
            "default"
        } else {
            self.error(
                line,
                type_prop.map(|o| o.full.as_str()),
                format!("sink processor `{kind}` is not built in: `failover` or `load_balance`"),
            );
            return None;
        };
        let mut map = Map::default();
        let mut processor = Map::default();
        processor.insert("type", Node::plain(kind, line));
        let mut priority = Map::default();
        for own in owns {
            let l = Some(own.line);
            match (kind, own.key) {
                (_, "processor.type") => {}
                (_, "sinks") => map.insert("sinks", words(own.value, own.line)),
                ("failover", key) if key.starts_with("processor.priority.") => {
                    priority.insert(
                        &key["processor.priority.".len()..],
                        Node::text(own.value, l),
                    );
                }
                ("failover", "processor.maxpenalty") => {
                    if let Some(node) = self.value(own, Conv::Millis) {
                        processor.insert("max_penalty", node);
                    }
                }
                ("load_balance", "processor.backoff") => {
                    if let Some(node) = self.value(own, Conv::Bool) {
                        processor.insert("backoff", node);
                    }
                }
                ("load_balance", "processor.selector") => {
                    let value = own.value.to_ascii_lowercase();
                    if value == "round_robin" || value == "random" {
                        processor.insert("selector", Node::plain(value, l));
                    } else {
                        self.error(
                            l,
                            Some(&own.full),
                            format!(
                                "sink selector `{}` is not built in: `round_robin` or `random`",
                                own.value
                            ),
                        );
                    }
                }
                ("load_balance", "processor.selector.maxTimeOut") => {
                    if let Some(node) = self.value(own, Conv::Millis) {
                        processor.insert("max_timeout", node);
                    }
                }
                (_, key) => self.error(
                    l,
                    Some(&own.full),
                    format!("`{key}` is not a property of the {kind} sink processor"),
                ),
            }
        }
        if kind == "default" {
            // Flume's default processor runs one sink as if it had no group.
            self.note(
                line,
                type_prop.map(|o| o.full.as_str()).or(Some(&owns[0].full)),
                format!("sink group `{name}` has the default processor: its sink runs as a sink of its own"),
            );
            return None;
        }
        if !priority.is_empty() {
            processor.insert("priority", Node::map(priority, None));
        }
        if map.get_mut("sinks").is_none() {
            self.error(
                Some(owns[0].line),
                Some(&owns[0].full),
                format!("sink group `{name}` has no `sinks`"),
            );
        }
        map.insert("processor", Node::map(processor, line));
        Some(Node::map(map, Some(owns[0].line)))
    }
}

fn words(value: &str, line: usize) -> Node {
    Node::seq(
        value
            .split_whitespace()
            .map(|w| Node::text(w, Some(line)))
            .collect(),
        Some(line),
    )
}

fn duration_message(value: &str, unit: &str) -> String {
    if value.contains("${") {
        format!(
            "`{value}`: a variable cannot be converted to a duration here; write the number of {unit}"
        )
    } else {
        format!("`{value}` is not a whole number of {unit}")
    }
}

/// The bucket and the rest of an object-storage URL (Hadoop's schemes for S3: `s3a://`,
/// `s3n://`, `s3://`), or `None` for any other URL or path.
fn object_storage_url(url: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    ["s3a", "s3n", "s3"]
        .iter()
        .any(|s| s.eq_ignore_ascii_case(scheme))
        .then(|| rest.split_once('/').unwrap_or((rest, "")))
}

/// Our `compression` and Hadoop's file extension for the codec `hdfs.codeC` names. Flume
/// takes a codec class's name, its simple name, or that without `Codec`, in any case
/// (`org.apache.hadoop.io.compress.GzipCodec`, `GzipCodec`, `gzip`).
fn compression_of_codec(name: &str) -> Option<(&'static str, &'static str)> {
    let simple = name.rsplit('.').next().unwrap_or(name).to_ascii_lowercase();
    match simple.strip_suffix("codec").unwrap_or(&simple) {
        "gzip" | "gz" => Some(("gzip", ".gz")),
        "zstandard" | "zstd" => Some(("zstd", ".zst")),
        _ => None,
    }
}

/// A glob for Flume's taildir path (a directory, then a regular expression matched against
/// the whole file name) and whether it matches exactly the same names.
fn glob_of_flume_path(path: &str) -> Result<(String, bool), String> {
    let (dir, name) = match path.rfind('/') {
        Some(at) => (&path[..=at], &path[at + 1..]),
        None => ("", path),
    };
    let refuse = |what: &str| {
        Err(format!(
            "the file name regex `{name}` has {what}, which a glob cannot say: convert the file, then write the glob in `filegroups` (`*`, `?`, `[a-z]`)"
        ))
    };
    let mut glob = String::from(dir);
    let mut exact = true;
    let chars: Vec<char> = name.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        match c {
            '^' if i == 0 => {}
            '$' if i + 1 == chars.len() => {}
            '.' => match next {
                Some('*') => {
                    glob.push('*');
                    i += 1;
                }
                Some('+') => {
                    glob.push_str("?*");
                    i += 1;
                }
                _ => glob.push('?'),
            },
            '\\' => match next {
                Some(n) if "*?[]".contains(n) => return refuse("an escaped `*`, `?`, `[` or `]`"),
                Some(n) if n.is_ascii_alphanumeric() => {
                    return refuse(&format!("the class `\\{n}`"));
                }
                Some(n) => {
                    glob.push(n);
                    i += 1;
                }
                None => return refuse("a trailing `\\`"),
            },
            '[' => {
                let Some(end) = chars[i..].iter().position(|&c| c == ']') else {
                    return refuse("an unclosed `[`");
                };
                let class: String = chars[i + 1..i + end].iter().collect();
                if class.contains('\\') || class.contains('[') {
                    return refuse("an escape in a character class");
                }
                glob.push('[');
                match class.strip_prefix('^') {
                    Some(negated) => {
                        glob.push('!');
                        glob.push_str(negated);
                    }
                    None => glob.push_str(&class),
                }
                glob.push(']');
                i += end;
                match chars.get(i + 1) {
                    Some('+') => {
                        glob.push('*');
                        exact = false;
                        i += 1;
                    }
                    Some('*') => {
                        // Zero or more of the class: `*` matches those and more.
                        glob.pop();
                        while glob.pop() != Some('[') {}
                        glob.push('*');
                        exact = false;
                        i += 1;
                    }
                    _ => {}
                }
            }
            '(' | ')' | '|' | '{' | '}' | '+' | '*' | '?' => {
                return refuse(&format!("`{c}`"));
            }
            c => glob.push(c),
        }
        i += 1;
    }
    Ok((glob, exact))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taildir_file_name_regexes_become_globs() {
        for (path, glob, exact) in [
            ("/var/log/app/example.log", "/var/log/app/example?log", true),
            (
                "/var/log/app/example\\.log",
                "/var/log/app/example.log",
                true,
            ),
            ("/var/log/test2/.*log.*", "/var/log/test2/*log*", true),
            ("./logs/^app-.+\\.log$", "./logs/app-?*.log", true),
            ("/l/app\\.log\\.[0-9]+", "/l/app.log.[0-9]*", false),
            ("/l/[^.]*\\.log", "/l/*.log", false),
            ("/l/app[12]\\.log", "/l/app[12].log", true),
        ] {
            assert_eq!(
                glob_of_flume_path(path),
                Ok((glob.to_owned(), exact)),
                "{path}"
            );
        }
        for path in ["/l/(a|b)\\.log", "/l/\\d+\\.log", "/l/a{2}", "/l/x?"] {
            let err = glob_of_flume_path(path).unwrap_err();
            assert!(err.contains("a glob cannot say"), "{path}: {err}");
        }
    }
}
