//! Flume agent configuration files (`.properties`): run them as they are, or convert them to
//! the pipeline YAML.
//!
//! A Flume file holds any number of agents; `--name` picks one (`a1`), and only keys starting
//! with `a1.` are read:
//!
//! ```text
//! a1.sources = r1                     a1.sources.r1.type = TAILDIR
//! a1.channels = c1                    a1.sources.r1.channels = c1
//! a1.sinks = k1                       a1.sources.r1.interceptors = i1
//! a1.sinkgroups = g1                  a1.sources.r1.interceptors.i1.type = timestamp
//!                                     a1.sources.r1.selector.type = multiplexing
//!                                     a1.sinks.k1.channel = c1
//!                                     a1.sinkgroups.g1.processor.type = failover
//! ```
//!
//! The conversion ([`convert`]) builds the YAML of the same pipeline ([`yaml`]): each type
//! found by Flume's alias (any case) or class name, each property renamed to our option with
//! its value converted (Flume's milliseconds and seconds become durations), as the tables of
//! [`components`] say. That YAML is then validated by [`topology::parse`], the one validation
//! there is; the YAML line of every problem leads back to the Flume line it came from.
//!
//! Nothing is dropped silently. Flume skips components it cannot build and starts anyway; here:
//!
//! - a component type that cannot run here (`avro`, `hive`, an `hdfs` sink whose path is not
//!   in object storage, ...), a property that cannot be honoured, an unknown property
//!   (probably misspelt: Flume ignores those), a listed component without properties: errors,
//!   naming the file, the line and what to use instead;
//! - a property without effect here (`checkpointDir`, `keep-alive`, ...), a component defined
//!   but not listed in `a1.sources`/`a1.channels`/`a1.sinks` (Flume does not run it either), a
//!   key set twice: notes, printed as warnings and written as comments in the converted YAML.

use std::path::{Path, PathBuf};

use ferry_core::Registry;

use crate::topology::{self, Topology};

pub(crate) mod components;
mod convert;
mod yaml;

/// A problem or a note about a Flume file: its line, the key, what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The line in the Flume file, from 1, when one is to blame.
    pub line: Option<usize>,
    /// The key as written (`a1.sources.r1.type`), when one is to blame.
    pub key: Option<String>,
    /// What is wrong, and what to do.
    pub message: String,
}

impl Problem {
    pub(crate) fn new(line: Option<usize>, key: Option<String>, message: String) -> Self {
        Self { line, key, message }
    }

    /// `file:line: key: message`.
    pub fn display<'a>(&'a self, file: &'a Path) -> impl std::fmt::Display + 'a {
        struct Shown<'a>(&'a Problem, &'a Path);
        impl std::fmt::Display for Shown<'_> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                let Shown(problem, file) = self;
                write!(f, "{}", file.display())?;
                if let Some(line) = problem.line {
                    write!(f, ":{line}")?;
                }
                if let Some(key) = &problem.key {
                    write!(f, ": {key}")?;
                }
                write!(f, ": {}", problem.message)
            }
        }
        Shown(self, file)
    }
}

/// Every problem found in one Flume file.
#[derive(Debug)]
pub struct Problems {
    /// The file.
    pub file: PathBuf,
    /// The problems, in line order.
    pub problems: Vec<Problem>,
}

impl std::fmt::Display for Problems {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for problem in &self.problems {
            writeln!(f, "{}", problem.display(&self.file))?;
        }
        let n = self.problems.len();
        write!(
            f,
            "{n} problem{} in {}",
            if n == 1 { "" } else { "s" },
            self.file.display()
        )
    }
}

impl std::error::Error for Problems {}

/// A Flume agent converted to pipeline YAML.
#[derive(Debug)]
pub struct Conversion {
    /// The YAML, with a header comment naming the file and the agent.
    pub yaml: String,
    /// What the reader should know (also written as comments in the YAML).
    pub notes: Vec<Problem>,
    /// For every line of `yaml` (index 0 is line 1), the Flume line it came from.
    lines: Vec<Option<usize>>,
}

impl Conversion {
    /// The Flume line that YAML line `line` (from 1) came from.
    fn flume_line(&self, line: usize) -> Option<usize> {
        line.checked_sub(1)
            .and_then(|i| self.lines.get(i).copied().flatten())
    }
}

/// Converts agent `agent` of the Flume file `file` (its `text`) to pipeline YAML. Errors name
/// the Flume file's lines.
pub fn convert(file: &Path, text: &str, agent: &str) -> Result<Conversion, Problems> {
    let converted = convert::convert(text, agent).map_err(|problems| Problems {
        file: file.to_owned(),
        problems,
    })?;
    let header = [
        format!(
            "Converted from the Flume file {} (agent `{agent}`) by `agent convert`.",
            file.display()
        ),
        "Each option comes from the Flume property of the same line or the one named in a comment;"
            .into(),
        "see docs/flume-migration.md.".into(),
    ];
    let written = yaml::write(&header, &converted.root);
    Ok(Conversion {
        yaml: written.text,
        notes: converted.notes,
        lines: written.lines,
    })
}

/// Converts and validates agent `agent` of the Flume file at `path`: the topology ready to
/// run, and the notes to show. Every problem names a line of the Flume file where one is to
/// blame.
pub fn load(
    path: &Path,
    agent: &str,
    registry: &Registry,
) -> Result<(Topology, Vec<Problem>), Problems> {
    let text = read(path)?;
    let conversion = convert(path, &text, agent)?;
    match topology::parse(&conversion.yaml, registry) {
        Ok(topology) => Ok((topology, conversion.notes)),
        Err(errors) => {
            let problems = errors
                .into_iter()
                .map(|error| {
                    let yaml_line = error.location.map(|l| l.line);
                    let line = yaml_line.and_then(|l| conversion.flume_line(l));
                    let mut message = match &error.component {
                        Some(component) => format!("{component}: {}", error.message),
                        None => error.message.clone(),
                    };
                    if let (None, Some(yaml_line)) = (line, yaml_line) {
                        message.push_str(&format!(
                            " (line {yaml_line} of the YAML `agent convert` prints)"
                        ));
                    }
                    Problem::new(line, None, message)
                })
                .collect();
            Err(Problems {
                file: path.to_owned(),
                problems,
            })
        }
    }
}

/// The environment variables that `${NAME}` references in `text` name and that are not set
/// (`$${` is a literal `${`).
pub fn unset_variables(text: &str) -> Vec<String> {
    let mut unset = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("${") {
        let escaped = at > 0 && rest[..at].ends_with('$');
        rest = &rest[at + 2..];
        let Some(end) = rest.find('}') else { break };
        let name = &rest[..end];
        if !escaped && std::env::var_os(name).is_none() && !unset.iter().any(|n| n == name) {
            unset.push(name.to_owned());
        }
    }
    unset
}

/// The text of the Flume file at `path`.
pub fn read(path: &Path) -> Result<String, Problems> {
    std::fs::read_to_string(path).map_err(|e| Problems {
        file: path.to_owned(),
        problems: vec![Problem::new(None, None, format!("cannot read: {e}"))],
    })
}

/// Whether the file at `path` is a Flume file rather than pipeline YAML: its extension is
/// `.properties` or `.conf`, or it is not a YAML mapping and a line of it sets
/// `<agent>.sources`, `<agent>.channels`, `<agent>.sinks` or `<agent>.sinkgroups`.
pub fn is_flume_file(path: &Path, text: &str) -> bool {
    let by_extension = path
        .extension()
        .is_some_and(|e| e == "properties" || e == "conf");
    let yaml_mapping = marked_yaml::parse_yaml(0, text).is_ok_and(|n| n.as_mapping().is_some());
    by_extension
        || (!yaml_mapping
            && ferry_core::properties::parse(text).is_ok_and(|properties| {
                properties.iter().any(|p| {
                    p.key.split_once('.').is_some_and(|(agent, section)| {
                        !agent.is_empty()
                            && ["sources", "channels", "sinks", "sinkgroups"].contains(&section)
                    })
                })
            }))
}

/// The agent to take: `name` when given, else the only agent of the file.
pub fn agent_name(path: &Path, text: &str, name: Option<&str>) -> Result<String, Problems> {
    if let Some(name) = name {
        return Ok(name.to_owned());
    }
    let mut agents: Vec<String> = ferry_core::properties::parse(text)
        .map(|properties| {
            properties
                .iter()
                .filter_map(|p| p.key.split_once('.').map(|(a, _)| a.to_owned()))
                .collect()
        })
        .unwrap_or_default();
    agents.sort();
    agents.dedup();
    match agents.as_slice() {
        [only] => Ok(only.clone()),
        _ => Err(Problems {
            file: path.to_owned(),
            problems: vec![Problem::new(
                None,
                None,
                format!(
                    "a Flume file needs `--name` to pick its agent; the agents in this file: {}",
                    if agents.is_empty() {
                        "none".to_owned()
                    } else {
                        agents.join(", ")
                    }
                ),
            )],
        }),
    }
}

#[cfg(test)]
mod tests;
