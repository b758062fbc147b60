//! The pipeline YAML a Flume file converts to, built as a small tree whose every node knows the
//! Flume line it came from, and written as block YAML with, for every line written, that
//! Flume line: so that a problem `topology::parse` finds at a YAML line is reported at the
//! Flume file's line.

/// A YAML value and the line of the Flume file it came from.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Node {
    pub(crate) value: Value,
    pub(crate) line: Option<usize>,
}

/// A YAML value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Value {
    /// A scalar written by the converter (a number, a boolean, a duration, a size): written
    /// plain.
    Plain(String),
    /// A string from the Flume file: written plain when YAML reads it back unchanged, quoted
    /// otherwise.
    Text(String),
    Seq(Vec<Node>),
    Map(Map),
}

/// A mapping, in insertion order, with comments between its entries.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Map {
    pub(crate) entries: Vec<Entry>,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Entry {
    Pair(String, Node),
    Comment(String),
}

impl Node {
    pub(crate) fn plain(text: impl Into<String>, line: Option<usize>) -> Self {
        Self {
            value: Value::Plain(text.into()),
            line,
        }
    }

    pub(crate) fn text(text: impl Into<String>, line: Option<usize>) -> Self {
        Self {
            value: Value::Text(text.into()),
            line,
        }
    }

    pub(crate) fn seq(items: Vec<Node>, line: Option<usize>) -> Self {
        Self {
            value: Value::Seq(items),
            line,
        }
    }

    pub(crate) fn map(map: Map, line: Option<usize>) -> Self {
        Self {
            value: Value::Map(map),
            line,
        }
    }
}

impl Map {
    /// Sets `key` (replacing an earlier value, keeping its place).
    pub(crate) fn insert(&mut self, key: impl Into<String>, node: Node) {
        let key = key.into();
        for entry in &mut self.entries {
            if let Entry::Pair(k, v) = entry
                && *k == key
            {
                *v = node;
                return;
            }
        }
        self.entries.push(Entry::Pair(key, node));
    }

    pub(crate) fn comment(&mut self, text: impl Into<String>) {
        self.entries.push(Entry::Comment(text.into()));
    }

    pub(crate) fn get_mut(&mut self, key: &str) -> Option<&mut Node> {
        self.entries.iter_mut().find_map(|entry| match entry {
            Entry::Pair(k, v) if k == key => Some(v),
            _ => None,
        })
    }

    /// The mapping under `key`, made (at `line`) if missing.
    pub(crate) fn map_mut(&mut self, key: &str, line: Option<usize>) -> &mut Map {
        if !matches!(
            self.get_mut(key),
            Some(Node {
                value: Value::Map(_),
                ..
            })
        ) {
            self.insert(key, Node::map(Map::default(), line));
        }
        match self.get_mut(key) {
            Some(Node {
                value: Value::Map(map),
                ..
            }) => map,
            _ => unreachable!("inserted just above"),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Block YAML, and for each line written (index 0 is line 1) the Flume line it came from.
pub(crate) struct Written {
    pub(crate) text: String,
    pub(crate) lines: Vec<Option<usize>>,
}

impl Written {
    fn line(&mut self, text: &str, from: Option<usize>) {
        self.text.push_str(text);
        self.text.push('\n');
        self.lines.push(from);
    }
}

/// Writes `header` (each line a comment) and then `map`.
pub(crate) fn write(header: &[String], map: &Map) -> Written {
    let mut out = Written {
        text: String::new(),
        lines: Vec::new(),
    };
    for line in header {
        out.line(format!("# {line}").trim_end(), None);
    }
    write_map(&mut out, map, 0);
    out
}

fn write_map(out: &mut Written, map: &Map, indent: usize) {
    let pad = " ".repeat(indent);
    for entry in &map.entries {
        match entry {
            Entry::Comment(text) => {
                for line in text.lines() {
                    out.line(&format!("{pad}# {line}"), None);
                }
            }
            Entry::Pair(key, node) => {
                let key = scalar(key);
                match &node.value {
                    Value::Map(inner) if !inner.is_empty() => {
                        out.line(&format!("{pad}{key}:"), node.line);
                        write_map(out, inner, indent + 2);
                    }
                    Value::Seq(items) if !items.is_empty() && !all_scalars(items) => {
                        out.line(&format!("{pad}{key}:"), node.line);
                        write_seq(out, items, indent + 2);
                    }
                    _ => out.line(&format!("{pad}{key}: {}", inline(node, false)), node.line),
                }
            }
        }
    }
}

fn write_seq(out: &mut Written, items: &[Node], indent: usize) {
    let pad = " ".repeat(indent);
    for item in items {
        match &item.value {
            Value::Map(map) if !map.is_empty() => {
                // `- key: value` then the other keys under it.
                let mut first = Written {
                    text: String::new(),
                    lines: Vec::new(),
                };
                write_map(&mut first, map, indent + 2);
                for (i, (line, from)) in first.text.lines().zip(&first.lines).enumerate() {
                    let line = if i == 0 {
                        format!("{pad}- {}", &line[indent + 2..])
                    } else {
                        line.to_owned()
                    };
                    out.line(&line, from.or(item.line));
                }
            }
            _ => out.line(&format!("{pad}- {}", inline(item, false)), item.line),
        }
    }
}

fn all_scalars(items: &[Node]) -> bool {
    items
        .iter()
        .all(|i| matches!(i.value, Value::Plain(_) | Value::Text(_)))
}

/// A node on one line: a scalar, `[a, b]` or `{}` (`flow`: inside another `[...]`/`{...}`).
fn inline(node: &Node, flow: bool) -> String {
    match &node.value {
        Value::Plain(text) => text.clone(),
        Value::Text(text) => scalar_in(text, flow),
        Value::Seq(items) => {
            let items: Vec<String> = items.iter().map(|i| inline(i, true)).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Map(map) => {
            let pairs: Vec<String> = map
                .entries
                .iter()
                .filter_map(|e| match e {
                    Entry::Pair(k, v) => {
                        Some(format!("{}: {}", scalar_in(k, true), inline(v, true)))
                    }
                    Entry::Comment(_) => None,
                })
                .collect();
            format!("{{{}}}", pairs.join(", "))
        }
    }
}

/// `text` as a YAML scalar that reads back as the same string: plain when it is made of
/// characters that mean nothing to YAML there, double-quoted otherwise. A plain scalar may
/// still be read as a number or a boolean where an option wants one (a `${PORT}` too, once
/// substituted), a quoted one never is.
pub(crate) fn scalar(text: &str) -> String {
    scalar_in(text, false)
}

/// `scalar` inside `[...]` or `{...}`, where `[]{},` end a plain scalar.
fn scalar_in(text: &str, flow: bool) -> String {
    let inner = |c: char| {
        c.is_ascii_alphanumeric() || "._/-+=@%:$*?!&".contains(c) || (!flow && "{}[],".contains(c))
    };
    let plain = text
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric() || "./_$".contains(c))
        && text.chars().all(inner)
        && !text.ends_with(':')
        && !["~", "null", "Null", "NULL"].contains(&text);
    if plain {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_read_back_unchanged() {
        for text in [
            "plain",
            "127.0.0.1:9092",
            "/var/log/*.log",
            "a b",
            "",
            "key: value",
            "# not a comment",
            "${KAFKA_PASSWORD}",
            "${A}:${B}",
            "a,b",
            "x{y}",
            "- dash",
            "quote \" and \\ backslash",
            "line\nbreak\ttab",
            "^\\d{4}-\\d{2}$",
            "null",
            "true",
            "[x]",
            "{y}",
            "*alias",
            "&anchor",
            "!tag",
            "%x",
            "@x",
            "`x",
            "x:",
            "x #y",
            "/var/log/*.log",
            "a?b!c&d",
            "é",
        ] {
            let yaml = format!("k: {}\nl: [{}, x]\n", scalar(text), scalar_in(text, true));
            let node = marked_yaml::parse_yaml(0, &yaml).unwrap_or_else(|e| panic!("{yaml}: {e}"));
            let root = node.as_mapping().unwrap();
            assert_eq!(root.get_scalar("k").unwrap().as_str(), text, "{yaml}");
            let item = root.get_sequence("l").unwrap().get_scalar(0).unwrap();
            assert_eq!(item.as_str(), text, "{yaml}");
        }
    }

    #[test]
    fn every_written_line_knows_its_flume_line() {
        let mut interceptor = Map::default();
        interceptor.insert("type", Node::text("static", Some(7)));
        interceptor.insert("key", Node::text("env", Some(8)));
        let mut source = Map::default();
        source.insert("type", Node::text("netcat", Some(3)));
        source.insert(
            "channels",
            Node::seq(vec![Node::text("c1", Some(4))], Some(4)),
        );
        source.comment("a note");
        source.insert(
            "interceptors",
            Node::seq(vec![Node::map(interceptor, Some(6))], Some(5)),
        );
        let mut sources = Map::default();
        sources.insert("r1", Node::map(source, Some(3)));
        let mut root = Map::default();
        root.insert("sources", Node::map(sources, Some(1)));
        let written = write(&["converted".into()], &root);
        assert_eq!(
            written.text,
            "# converted\n\
             sources:\n\
             \x20 r1:\n\
             \x20   type: netcat\n\
             \x20   channels: [c1]\n\
             \x20   # a note\n\
             \x20   interceptors:\n\
             \x20     - type: static\n\
             \x20       key: env\n"
        );
        assert_eq!(
            written.lines,
            [
                None,
                Some(1),
                Some(3),
                Some(3),
                Some(4),
                None,
                Some(5),
                Some(7),
                Some(8)
            ]
        );
        marked_yaml::parse_yaml(0, &written.text).unwrap();
    }
}
