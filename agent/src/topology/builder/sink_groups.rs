//! The `sinkgroups:` section: each group's members and its processor (`default`,
//! `failover`, `load_balance`) with their options.

use std::collections::BTreeMap;
use std::time::Duration;

use ferry_core::config::{ComponentKind, Location, closest, unknown_name_message};
use ferry_core::{ComponentConfig, ConfigError};
use marked_yaml::Node;
use marked_yaml::types::{MarkedMappingNode, MarkedScalarNode};
use serde::Deserialize;

use super::*;
use crate::sinkgroup::{DEFAULT_MAX_PENALTY, PROCESSOR_TYPES, Selector, SinkProcessorConfig};

impl Builder<'_> {
    /// Builds every sink group of `sinkgroups:`, moving its members out of `topology.sinks`.
    /// A group's sinks must be declared, take from one channel and be in no other group.
    pub(super) fn build_sink_groups(&mut self, root: &MarkedMappingNode, topology: &mut Topology) {
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

    pub(super) fn group_error(
        &mut self,
        group: &str,
        location: Option<Location>,
        message: impl Into<String>,
    ) {
        self.errors.push(ConfigError {
            component: Some(format!("sink group `{group}`")),
            ..ConfigError::new(location, message)
        });
    }

    /// The names of a group's `sinks`, with where each is written; each must be a declared
    /// sink, listed once, in no other group.
    pub(super) fn group_members(
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
    pub(super) fn sink_processor(
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
    pub(super) fn priorities(
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
