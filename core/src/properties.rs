//! Java `.properties` syntax (`java.util.Properties.load`), read with the line of every key:
//! the format of Kafka's client properties files and of Flume's agent configuration files.
//!
//! - One `key=value`, `key: value` or `key value` a line; blanks around the `=` or `:` belong
//!   to neither side, and keys and values are trimmed.
//! - Lines whose first non-blank character is `#` or `!` are comments; blank lines are
//!   skipped.
//! - A line ending in an odd number of `\` continues on the next, whose leading blanks are
//!   dropped.
//! - `\t`, `\n`, `\r`, `\f`, `\uXXXX` and `\` before any other character (`\=`, `\:`, `\ `,
//!   `\\`) are escapes, in keys and values.
//!
//! A key may repeat; as with Java, the caller decides (the last one counts there).
//!
//! ```
//! let properties = ferry_core::properties::parse("# comment\na.b = 1\nc: two \\\n  words\n").unwrap();
//! assert_eq!(properties[0].key, "a.b");
//! assert_eq!(properties[1].value, "two words");
//! assert_eq!(properties[1].line, 3);
//! ```

/// One `key=value` and the line it starts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Property {
    /// The key, unescaped.
    pub key: String,
    /// The value, unescaped (continuation lines joined).
    pub value: String,
    /// The line the key is on, from 1.
    pub line: usize,
}

/// A line that is not valid `.properties` syntax.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct SyntaxError {
    /// The line, from 1.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// The properties of `text`, in file order.
pub fn parse(text: &str) -> Result<Vec<Property>, SyntaxError> {
    let mut properties = Vec::new();
    let mut natural = text.lines().enumerate().map(|(i, l)| (i + 1, l));
    while let Some((line, first)) = natural.next() {
        let first = first.trim_start();
        if first.is_empty() || first.starts_with('#') || first.starts_with('!') {
            continue;
        }
        // Join continuation lines: an odd number of trailing backslashes.
        let mut logical = String::new();
        let mut part = first;
        loop {
            let trailing = part.len() - part.trim_end_matches('\\').len();
            if trailing % 2 == 1 {
                logical.push_str(&part[..part.len() - 1]);
                match natural.next() {
                    Some((_, next)) => part = next.trim_start(),
                    None => break,
                }
            } else {
                logical.push_str(part);
                break;
            }
        }
        let error = |message| SyntaxError { line, message };
        let (key, value) = split_key_value(&logical);
        let key = unescape(key).map_err(error)?;
        let value = unescape(value).map_err(error)?;
        let (key, value) = (key.trim().to_owned(), value.trim().to_owned());
        if key.is_empty() {
            return Err(error("a value without a key".into()));
        }
        properties.push(Property { key, value, line });
    }
    Ok(properties)
}

/// Splits a logical line at the first unescaped `=`, `:` or blank (blanks around one `=` or
/// `:` belong to neither side).
fn split_key_value(line: &str) -> (&str, &str) {
    let bytes = line.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'=' | b':' | b' ' | b'\t' | b'\x0c' => break,
            _ => i += 1,
        }
    }
    let i = i.min(line.len());
    let key = &line[..i];
    let mut rest = line[i..].trim_start_matches([' ', '\t', '\x0c']);
    if let Some(after) = rest.strip_prefix(['=', ':']) {
        rest = after.trim_start_matches([' ', '\t', '\x0c']);
    }
    (key, rest)
}

fn unescape(text: &str) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('f') => out.push('\x0c'),
            Some('u') => {
                let hex: String = chars.by_ref().take(4).collect();
                let code = u32::from_str_radix(&hex, 16)
                    .ok()
                    .filter(|_| hex.len() == 4)
                    .and_then(char::from_u32)
                    .ok_or_else(|| format!("`\\u{hex}` is not a \\uXXXX escape"))?;
                out.push(code);
            }
            Some(other) => out.push(other),
            None => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(text: &str) -> Vec<(String, String, usize)> {
        parse(text)
            .unwrap()
            .into_iter()
            .map(|p| (p.key, p.value, p.line))
            .collect()
    }

    fn owned(rows: &[(&str, &str, usize)]) -> Vec<(String, String, usize)> {
        rows.iter()
            .map(|(k, v, l)| (k.to_string(), v.to_string(), *l))
            .collect()
    }

    #[test]
    fn reads_java_properties_syntax_with_the_line_of_each_key() {
        let text = "# a comment\n\
                    ! another\n\
                    \n\
                    security.protocol=SASL_SSL\n\
                    sasl.mechanism : PLAIN  \n\
                    \tclient.id   ferry-tools\n\
                    message.max.bytes = 10\\\n\
                    \x20\x20\x20\x2000\n\
                    key\\=with\\:marks=v\\u00e9\\t!\n\
                    empty=\n\
                    a1.sources = r1 r2\n";
        assert_eq!(
            rows(text),
            owned(&[
                ("security.protocol", "SASL_SSL", 4),
                ("sasl.mechanism", "PLAIN", 5),
                ("client.id", "ferry-tools", 6),
                ("message.max.bytes", "1000", 7),
                ("key=with:marks", "vé\t!", 9),
                ("empty", "", 10),
                ("a1.sources", "r1 r2", 11),
            ])
        );
        // Two backslashes end a line with a backslash; they do not continue it.
        assert_eq!(
            rows("a=x\\\\\nb=y"),
            owned(&[("a", "x\\", 1), ("b", "y", 2)])
        );
        // A regex keeps its escapes doubled, as Java reads them.
        assert_eq!(rows("r = ^\\\\d+$"), owned(&[("r", "^\\d+$", 1)]));
        assert_eq!(parse("a=\\u12").unwrap_err().line, 1);
        assert_eq!(parse("x=1\n=value").unwrap_err().line, 2);
    }
}
