//! Component configuration: typed parsing with positions, human durations and sizes.
//!
//! Every component parses its own part of the YAML into a struct with
//! `#[serde(deny_unknown_fields)]` through [`ComponentConfig::parse`]; a mistake is reported
//! as a [`ConfigError`] carrying the line and column, and for a misspelt option the closest
//! valid name.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use marked_yaml::Node;
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer};

/// The kind of a component, as named in the configuration file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ComponentKind {
    /// An entry under `sources:`.
    Source,
    /// An entry under `channels:`.
    Channel,
    /// An entry under `sinks:`.
    Sink,
    /// An entry of a source's `interceptors:` list.
    Interceptor,
}

impl fmt::Display for ComponentKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ComponentKind::Source => "source",
            ComponentKind::Channel => "channel",
            ComponentKind::Sink => "sink",
            ComponentKind::Interceptor => "interceptor",
        })
    }
}

/// A line and column in the configuration file, both starting at 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Location {
    /// Line, from 1.
    pub line: usize,
    /// Column, from 1.
    pub column: usize,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// A configuration problem: where, in which component, what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ConfigError {
    /// Where in the file, when known.
    pub location: Option<Location>,
    /// The component, e.g. `sink \`out\``, when the problem is inside one.
    pub component: Option<String>,
    /// What is wrong, including the closest valid name where one applies.
    pub message: String,
    /// Further problems found in the same check (a component with several bad options
    /// reports them all at once); see [`ConfigError::into_all`].
    pub also: Vec<ConfigError>,
}

impl ConfigError {
    /// A problem at `location`.
    pub fn new(location: Option<Location>, message: impl Into<String>) -> Self {
        Self {
            location,
            component: None,
            message: message.into(),
            also: Vec::new(),
        }
    }

    /// The same problems (this one and those found with it), attributed to `component`,
    /// e.g. ``section `agent` ``.
    pub fn labelled(mut self, component: &str) -> Self {
        self.component = Some(component.to_owned());
        self.also = self
            .also
            .into_iter()
            .map(|e| e.labelled(component))
            .collect();
        self
    }

    /// This problem and every one found with it, in the order found.
    pub fn into_all(mut self) -> Vec<ConfigError> {
        let also = std::mem::take(&mut self.also);
        std::iter::once(self)
            .chain(also.into_iter().flat_map(ConfigError::into_all))
            .collect()
    }

    /// `Ok` without problems, else the first with the others in [`also`](Self::also).
    pub fn all(errors: Vec<ConfigError>) -> Result<(), ConfigError> {
        let mut errors = errors.into_iter();
        match errors.next() {
            None => Ok(()),
            Some(mut first) => {
                first.also.extend(errors);
                Err(first)
            }
        }
    }

    /// The same problem, attributed to a component.
    pub fn in_component(mut self, kind: ComponentKind, name: &str) -> Self {
        self.component = Some(format!("{kind} `{name}`"));
        self
    }
}

/// The part of the configuration that belongs to one component, ready to be parsed into its
/// typed config struct. Keys handled by the runtime are already removed: `type` everywhere,
/// `channels` and `interceptors` of sources, `channel` and `batch_size` of sinks (a source's
/// `batch_size` is its own option and stays). Its `Debug` shows the option names, not their
/// values (which may be secrets).
#[derive(Clone)]
pub struct ComponentConfig {
    kind: ComponentKind,
    name: String,
    type_name: String,
    node: Node,
    data_dir: PathBuf,
    /// Option names parsed elsewhere (see [`ComponentConfig::split_off`]), offered too when
    /// an option is misspelt.
    elsewhere: &'static [&'static str],
}

impl fmt::Debug for ComponentConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ComponentConfig")
            .field("kind", &self.kind)
            .field("name", &self.name)
            .field("type_name", &self.type_name)
            .field("options", &self.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl ComponentConfig {
    /// Used by the agent's configuration loader (and tests) to hand a component its options.
    pub fn from_node(
        kind: ComponentKind,
        name: impl Into<String>,
        type_name: impl Into<String>,
        node: Node,
        data_dir: impl Into<PathBuf>,
    ) -> Self {
        Self {
            kind,
            name: name.into(),
            type_name: type_name.into(),
            node,
            data_dir: data_dir.into(),
            elsewhere: &[],
        }
    }

    /// Parses a YAML snippet as a component's options (for tests and examples).
    ///
    /// ```
    /// use ferry_core::config::{ComponentConfig, ComponentKind};
    /// #[derive(Debug, serde::Deserialize)]
    /// #[serde(deny_unknown_fields)]
    /// struct Options { port: u16 }
    /// let cfg = ComponentConfig::from_yaml(ComponentKind::Source, "in", "netcat", "port: 80").unwrap();
    /// assert_eq!(cfg.parse::<Options>().unwrap().port, 80);
    /// let bad = ComponentConfig::from_yaml(ComponentKind::Source, "in", "netcat", "prot: 80").unwrap();
    /// let err = bad.parse::<Options>().unwrap_err();
    /// assert!(err.message.contains("did you mean `port`"), "{}", err.message);
    /// assert_eq!(err.location.unwrap().line, 1);
    /// ```
    pub fn from_yaml(
        kind: ComponentKind,
        name: &str,
        type_name: &str,
        yaml: &str,
    ) -> Result<Self, ConfigError> {
        let node = if yaml.trim().is_empty() {
            Node::from(marked_yaml::types::MarkedMappingNode::new_empty(
                marked_yaml::Span::new_blank(),
            ))
        } else {
            marked_yaml::parse_yaml(0, yaml).map_err(|e| ConfigError::new(None, e.to_string()))?
        };
        Ok(Self::from_node(kind, name, type_name, node, "."))
    }

    /// Component kind.
    pub fn kind(&self) -> ComponentKind {
        self.kind
    }

    /// Component name (the key under `sources:`, `channels:` or `sinks:`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The `type` the component was configured with.
    pub fn type_name(&self) -> &str {
        &self.type_name
    }

    /// The agent's `data_dir`, where durable components keep their state.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Where the component's options start in the file.
    pub fn location(&self) -> Option<Location> {
        location_of(&self.node)
    }

    /// Where option `key` is written, or the component's location if it is absent.
    pub fn location_of_key(&self, key: &str) -> Option<Location> {
        self.node
            .as_mapping()
            .and_then(|m| m.keys().find(|k| k.as_str() == key))
            .and_then(|k| k.span().start().map(marker_location))
            .or_else(|| self.location())
    }

    /// A problem with option `key` of this component, located at that option.
    pub fn error_at(&self, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::new(self.location_of_key(key), message).in_component(self.kind, &self.name)
    }

    /// Checks that option `key` has one of the `allowed` values; the error names the closest.
    pub fn check_one_of(
        &self,
        key: &str,
        value: &str,
        allowed: &[&str],
    ) -> Result<(), ConfigError> {
        if allowed.contains(&value) {
            return Ok(());
        }
        Err(self.error_at(
            key,
            unknown_name_message(key, value, allowed.iter().copied()),
        ))
    }

    /// The option names as written, in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.node
            .as_mapping()
            .into_iter()
            .flat_map(|m| m.keys().map(|k| k.as_str()))
    }

    /// Splits the options in two, for a component whose options are partly shared with others
    /// and parsed into a struct of their own: the options named in `names`, or that `alias`
    /// maps to one of `names` (then under that name, at the alias's position), and the rest.
    /// A misspelt option of the rest is matched against `names` too. Two keys naming the same
    /// option are an error.
    ///
    /// ```
    /// use ferry_core::config::{ComponentConfig, ComponentKind};
    /// let cfg = ComponentConfig::from_yaml(ComponentKind::Sink, "out", "x",
    ///     "topic: t\nkafka.servers: h:1").unwrap();
    /// let alias = |key: &str| (key == "kafka.servers").then_some("servers");
    /// let (shared, own) = cfg.split_off(&["servers"], alias).unwrap();
    /// assert_eq!(shared.keys().collect::<Vec<_>>(), ["servers"]);
    /// assert_eq!(shared.location_of_key("servers").unwrap().line, 2);
    /// assert_eq!(own.keys().collect::<Vec<_>>(), ["topic"]);
    /// ```
    pub fn split_off(
        &self,
        names: &'static [&'static str],
        alias: impl Fn(&str) -> Option<&'static str>,
    ) -> Result<(ComponentConfig, ComponentConfig), ConfigError> {
        let span = *self.node.span();
        let mut taken = marked_yaml::types::MarkedMappingNode::new_empty(span);
        let mut rest = marked_yaml::types::MarkedMappingNode::new_empty(span);
        let mut first_key: std::collections::HashMap<&str, String> = Default::default();
        if let Some(mapping) = self.node.as_mapping() {
            for (key, value) in mapping.iter() {
                let written = key.as_str();
                let name = names
                    .iter()
                    .copied()
                    .find(|n| *n == written)
                    .or_else(|| alias(written));
                match name {
                    Some(name) => {
                        if let Some(first) = first_key.insert(name, written.to_owned()) {
                            return Err(self.error_at(
                                written,
                                format!("`{first}` and `{written}` both set `{name}`: set it once"),
                            ));
                        }
                        let renamed = marked_yaml::types::MarkedScalarNode::new(*key.span(), name);
                        taken.insert(renamed, value.clone());
                    }
                    None => {
                        rest.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        let part = |node: marked_yaml::types::MarkedMappingNode, elsewhere| ComponentConfig {
            node: Node::from(node),
            elsewhere,
            ..self.clone()
        };
        Ok((part(taken, &[]), part(rest, names)))
    }

    /// Parses the options into the component's config struct. Every bad option is reported,
    /// not only the first (see [`parse_all`](Self::parse_all)).
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, ConfigError> {
        match self.parse_all::<T>() {
            (Some(parsed), problems) if problems.is_empty() => Ok(parsed),
            (_, problems) => Err(ConfigError::all(problems)
                .err()
                .unwrap_or_else(|| self.error_at("type", "the options could not be read"))),
        }
    }

    /// Parses the options, reporting every bad one: after a problem with an option, the
    /// options are parsed again without it, to find the next. Returns the config parsed
    /// without the bad options (they take their defaults) when that parses, so that a
    /// component can check the rest too, and the problems.
    pub fn parse_all<T: DeserializeOwned>(&self) -> (Option<T>, Vec<ConfigError>) {
        let mut node = self.node.clone();
        let mut errors: Vec<ConfigError> = Vec::new();
        let mut removed: Vec<String> = Vec::new();
        let mut misspelt: Vec<String> = Vec::new();
        loop {
            let error = match marked_yaml::from_node::<T>(&node) {
                Ok(parsed) => return (Some(parsed), errors),
                Err(error) => error,
            };
            let key = offending_key(&error);
            let described = self.describe(&error);
            // "missing field `x`" after `x` was taken out for being wrong, or after a
            // misspelling of `x`, says nothing new.
            let about_removed = described.message.contains("missing field")
                && removed
                    .iter()
                    .chain(&misspelt)
                    .any(|k| described.message.contains(&format!("`{k}`")));
            if let marked_yaml::Error::UnknownFieldError(field, expected, _) = &*error
                && let Some(meant) = closest(field, expected.iter().copied())
            {
                misspelt.push(meant.to_owned());
            }
            if !about_removed {
                errors.push(described);
            }
            let Some(key) = key.filter(|k| !removed.contains(k)) else {
                return (None, errors);
            };
            let Some(mut map) = node.as_mapping().cloned() else {
                return (None, errors);
            };
            if map.remove(key.as_str()).is_none() || errors.len() >= 32 {
                return (None, errors);
            }
            node = Node::from(map);
            removed.push(key);
        }
    }

    /// One parse error, with its position and the closest name where it is a misspelling.
    fn describe(&self, error: &marked_yaml::FromNodeError) -> ConfigError {
        let location = error
            .start_mark()
            .map(|m| marker_location(&m))
            .or_else(|| self.location());
        let message = match &**error {
            marked_yaml::Error::UnknownFieldError(field, expected, _) => unknown_name_message(
                "option",
                field,
                expected
                    .iter()
                    .copied()
                    .chain(self.elsewhere.iter().copied()),
            ),
            other => match error.path() {
                Some(path) if !path.is_empty() && path != "." => {
                    format!("option `{path}`: {other}")
                }
                _ => other.to_string(),
            },
        };
        ConfigError::new(location, message).in_component(self.kind, &self.name)
    }
}

/// The top-level option a parse error is about, when it names one.
fn offending_key(error: &marked_yaml::FromNodeError) -> Option<String> {
    if let marked_yaml::Error::UnknownFieldError(field, _, _) = &**error {
        return Some(field.clone());
    }
    let path = error.path()?;
    let first = path
        .trim_start_matches('.')
        .split(['.', '['])
        .next()
        .unwrap_or_default();
    (!first.is_empty()).then(|| first.to_owned())
}

fn location_of(node: &Node) -> Option<Location> {
    node.span().start().map(marker_location)
}

fn marker_location(marker: &marked_yaml::Marker) -> Location {
    Location {
        line: marker.line(),
        column: marker.column(),
    }
}

/// The candidate closest to `name`, if one is close enough to be a likely typo.
///
/// ```
/// assert_eq!(ferry_core::config::closest("tailder", ["taildir", "seq"]), Some("taildir"));
/// assert_eq!(ferry_core::config::closest("zzz", ["taildir", "seq"]), None);
/// ```
pub fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(name, c), c))
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

/// "unknown source type `tailder`, did you mean `taildir`?" or, with nothing close, the list
/// of valid names.
pub fn unknown_name_message<'a>(
    what: &str,
    name: &str,
    valid: impl IntoIterator<Item = &'a str> + Clone,
) -> String {
    match closest(name, valid.clone()) {
        Some(best) => format!("unknown {what} `{name}`, did you mean `{best}`?"),
        None => {
            let list: Vec<String> = valid.into_iter().map(|v| format!("`{v}`")).collect();
            if list.is_empty() {
                format!("unknown {what} `{name}`")
            } else {
                format!(
                    "unknown {what} `{name}`, expected one of {}",
                    list.join(", ")
                )
            }
        }
    }
}

/// Parses a human duration such as `500ms`, `5s`, `1m 30s`, `2h`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|e| {
        format!("invalid duration `{text}` ({e}); write a number with a unit, e.g. `30s`, `500ms`")
    })
}

/// Parses a human size such as `16KiB`, `1 MB`, `512` (bytes).
pub fn parse_size(text: &str) -> Result<u64, String> {
    bytesize::ByteSize::from_str(text.trim())
        .map(|b| b.as_u64())
        .map_err(|e| format!("invalid size `{text}` ({e}); write e.g. `16KiB`, `1MiB`, `512`"))
}

/// Serde helpers for [`Duration`] fields written as human strings: use
/// `#[serde(with = "ferry_core::config::duration")]`.
pub mod duration {
    use super::*;

    /// Deserializes `5s`, `100ms`, ...
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        parse_duration(&text).map_err(D::Error::custom)
    }

    /// For `Option<Duration>` fields: `#[serde(default, with = "ferry_core::config::duration::option")]`.
    pub mod option {
        use super::*;

        /// Deserializes an optional human duration.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
            let text = Option::<String>::deserialize(d)?;
            text.map(|t| parse_duration(&t).map_err(D::Error::custom))
                .transpose()
        }
    }
}

/// A size in bytes, written as `16KiB`, `1 MB` or a plain number.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// The size in bytes.
    pub fn bytes(self) -> u64 {
        self.0
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        parse_size(&text).map(ByteSize).map_err(D::Error::custom)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", bytesize::ByteSize(self.0).display().iec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Sample {
        #[serde(with = "duration")]
        every: Duration,
        size: ByteSize,
        #[serde(default)]
        count: u32,
    }

    fn cfg(yaml: &str) -> ComponentConfig {
        ComponentConfig::from_yaml(ComponentKind::Sink, "out", "x", yaml).unwrap()
    }

    #[test]
    fn parses_human_durations_and_sizes() {
        let s: Sample = cfg("every: 1m 30s\nsize: 16KiB\ncount: 3").parse().unwrap();
        assert_eq!(s.every, Duration::from_secs(90));
        assert_eq!(s.size, ByteSize(16 * 1024));
        assert_eq!(s.count, 3);
    }

    #[test]
    fn bad_duration_names_the_line() {
        let err = cfg("size: 1\nevery: soon").parse::<Sample>().unwrap_err();
        assert_eq!(err.location.map(|l| l.line), Some(2), "{err:?}");
        assert!(err.message.contains("invalid duration `soon`"), "{err:?}");
        assert_eq!(err.component.as_deref(), Some("sink `out`"));
    }

    #[test]
    fn bad_number_names_the_option() {
        let err = cfg("size: 1\nevery: 1s\ncount: many")
            .parse::<Sample>()
            .unwrap_err();
        assert_eq!(err.location.map(|l| l.line), Some(3), "{err:?}");
    }

    #[test]
    fn debug_output_names_options_but_never_shows_values() {
        let shown = format!("{:?}", cfg("password: hunter2\nsize: 1"));
        assert!(
            shown.contains("password") && shown.contains("size"),
            "{shown}"
        );
        assert!(!shown.contains("hunter2"), "{shown}");
    }

    #[test]
    fn misspelt_option_suggests_the_closest() {
        let err = cfg("size: 1\nevery: 1s\ncuont: 1")
            .parse::<Sample>()
            .unwrap_err();
        assert_eq!(err.message, "unknown option `cuont`, did you mean `count`?");
        assert_eq!(err.location.map(|l| l.line), Some(3));
    }
}
