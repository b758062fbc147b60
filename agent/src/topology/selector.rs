//! A source's `selector:`: Flume's channel selectors, `replicating` (the default) and
//! `multiplexing`, resolved against the channels the source lists.

use std::collections::{BTreeMap, HashMap};

use ferry_core::config::{ComponentKind, Location, unknown_name_message};
use ferry_core::selector::{ChannelSelector, Route};
use ferry_core::{ComponentConfig, ConfigError};
use marked_yaml::Node;
use marked_yaml::types::MarkedScalarNode;
use serde::Deserialize;

use super::{key_location, location};

/// Selector types, with Flume's class names as aliases.
const TYPES: [(&str, &str); 2] = [
    (
        "replicating",
        "org.apache.flume.channel.ReplicatingChannelSelector",
    ),
    (
        "multiplexing",
        "org.apache.flume.channel.MultiplexingChannelSelector",
    ),
];

// The structs below check the shape of a selector and name a misspelt option; the channel
// names are then read from the nodes themselves, with their positions.

/// One channel name or several (a list, or names separated by spaces as Flume writes them).
#[allow(dead_code)]
#[derive(Debug, Default, Deserialize)]
#[serde(untagged)]
enum Names {
    #[default]
    None,
    One(String),
    Many(Vec<String>),
}

/// `selector: { type: replicating, optional: [...] }`.
#[allow(dead_code)]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Replicating {
    /// Channels whose failure does not fail the put. Flume: `selector.optional`.
    #[serde(default)]
    optional: Names,
}

/// `selector: { type: multiplexing, header, mapping, default, optional }`.
#[allow(dead_code)]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Multiplexing {
    /// The header whose value picks the channels. Flume: `selector.header` (default
    /// `flume.selector.header`).
    #[serde(default = "default_header")]
    header: String,
    /// Channels by header value. Flume: `selector.mapping.<value>`.
    #[serde(default)]
    mapping: BTreeMap<String, Names>,
    /// Channels of events whose value has no mapping. Flume: `selector.default`.
    #[serde(default)]
    default: Names,
    /// Channels that also get events of a value, if they can. Flume:
    /// `selector.optional.<value>`.
    #[serde(default)]
    optional: BTreeMap<String, Names>,
}

fn default_header() -> String {
    "flume.selector.header".to_owned()
}

/// Parses `node` (a source's `selector:`) against the names of the source's `channels`, in
/// order. Every problem is reported.
pub(super) fn parse(
    source: &str,
    node: &Node,
    channels: &[String],
    data_dir: &std::path::Path,
) -> Result<ChannelSelector, Vec<ConfigError>> {
    let error = |location: Option<Location>, message: String| {
        ConfigError::new(location, message).in_component(ComponentKind::Source, source)
    };
    let Some(map) = node.as_mapping() else {
        return Err(vec![error(
            location(node),
            "`selector` must be a mapping like `{ type: multiplexing, header: ..., mapping: ... }`"
                .into(),
        )]);
    };
    let mut options = map.clone();
    let type_name = match options.remove("type") {
        None => "replicating".to_owned(),
        Some(Node::Scalar(s)) => s.as_str().to_owned(),
        Some(other) => {
            return Err(vec![error(
                location(&other),
                "`type` must be a name".into(),
            )]);
        }
    };
    let Some(canonical) = TYPES
        .iter()
        .find(|(name, class)| name.eq_ignore_ascii_case(&type_name) || *class == type_name)
        .map(|(name, _)| *name)
    else {
        let message = unknown_name_message("selector type", &type_name, TYPES.map(|t| t.0));
        let at = map
            .keys()
            .find(|k| k.as_str() == "type")
            .and_then(key_location);
        return Err(vec![error(at, message)]);
    };
    let cfg = ComponentConfig::from_node(
        ComponentKind::Source,
        source,
        canonical,
        Node::from(options.clone()),
        data_dir,
    );
    let parsed = if canonical == "replicating" {
        cfg.parse::<Replicating>().map(|_| None)
    } else {
        cfg.parse::<Multiplexing>().map(|m| Some(m.header))
    };
    let header = parsed.map_err(ConfigError::into_all)?;

    // The channel names, resolved with their positions.
    let mut errors = Vec::new();
    let mut resolve = |node: Option<&Node>| -> Vec<usize> {
        let mut out = Vec::new();
        for (name, at) in names(node) {
            match channels.iter().position(|c| *c == name) {
                Some(i) => {
                    if !out.contains(&i) {
                        out.push(i);
                    }
                }
                None => {
                    let message = format!(
                        "{}; a selector picks among the source's `channels`",
                        unknown_name_message("channel", &name, channels.iter().map(String::as_str))
                    );
                    errors.push(error(at, message));
                }
            }
        }
        out
    };
    let selector = match header {
        None => ChannelSelector::Replicating {
            optional: resolve(options.get_node("optional")),
        },
        Some(header) => {
            let default = Route {
                required: resolve(options.get_node("default")),
                optional: Vec::new(),
            };
            let mut mapping: HashMap<String, Route> = HashMap::new();
            if let Some(map) = options.get_mapping("mapping") {
                for (value, node) in map.iter() {
                    mapping
                        .entry(value.as_str().to_owned())
                        .or_default()
                        .required = resolve(Some(node));
                }
            }
            if let Some(map) = options.get_mapping("optional") {
                for (value, node) in map.iter() {
                    // A value with optional channels only still goes to the default ones, as
                    // in Flume.
                    let route = mapping
                        .entry(value.as_str().to_owned())
                        .or_insert_with(|| Route {
                            required: default.required.clone(),
                            optional: Vec::new(),
                        });
                    route.optional = resolve(Some(node));
                }
            }
            ChannelSelector::Multiplexing {
                header,
                mapping,
                default,
            }
        }
    };
    if errors.is_empty() {
        Ok(selector)
    } else {
        Err(errors)
    }
}

/// The channel names written at `node`, each with where it is written.
fn names(node: Option<&Node>) -> Vec<(String, Option<Location>)> {
    let split = |scalar: &MarkedScalarNode| -> Vec<(String, Option<Location>)> {
        scalar
            .as_str()
            .split_whitespace()
            .map(|name| (name.to_owned(), key_location(scalar)))
            .collect()
    };
    match node {
        Some(Node::Scalar(s)) => split(s),
        Some(Node::Sequence(seq)) => seq
            .iter()
            .filter_map(Node::as_scalar)
            .flat_map(split)
            .collect(),
        _ => Vec::new(),
    }
}
