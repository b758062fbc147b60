//! `regex_extractor`: Flume's `RegexExtractorInterceptor`. Searches each body for a regular
//! expression once; the text of its groups, in order, becomes headers named by the
//! `serializers` list (group 1 by the first serializer, and so on). Groups beyond the list
//! are ignored, a group that did not take part in the match sets nothing, and a body that does
//! not match is left as it is.
//!
//! Serializers, as Flume's:
//!
//! - `default` (Flume's `RegexExtractorInterceptorPassThroughSerializer`): the text as it is;
//! - `millis` (Flume's `RegexExtractorInterceptorMillisSerializer`): the text read as a date
//!   by a Joda-Time `pattern` (e.g. `yyyy-MM-dd HH:mm:ss`), written as epoch milliseconds.
//!   Supported letters: `y` (year; `yy` is 20yy), `M` (month; `MMM` and longer a name), `d`,
//!   `H`, `h` with `a` (AM/PM), `m`, `s`, `S` (fraction of a second), `Z` (offset such as
//!   `+0200`, `+02:00` or `Z`), `E` (a day name, skipped); text in `'quotes'` and other
//!   characters are literal. Without `Z`, the time is read as UTC (Joda uses the JVM's zone).
//!   Text that does not fit the pattern sets no header (Flume fails the batch).

use ferry_core::{ComponentConfig, ConfigError, Event, Interceptor};
use regex::bytes::Regex;
use serde::Deserialize;

use crate::datetime::{DateTime, month_of_name};

/// Options of the `regex_extractor` interceptor.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegexExtractorConfig {
    /// The expression searched for in each body. Required. Flume: `regex`.
    pub regex: String,
    /// One serializer per group of `regex`, in group order. Required. Flume: `serializers`
    /// (the list of names) with `serializers.<name>.*`.
    pub serializers: Vec<SerializerConfig>,
}

/// How one group becomes a header.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SerializerConfig {
    /// The header set from the group. Required. Flume: `serializers.<s>.name`.
    pub name: String,
    /// `default` (the text as it is) or `millis`. Default `default`.
    /// Flume: `serializers.<s>.type`.
    #[serde(default = "default_type", rename = "type")]
    pub kind: String,
    /// For `millis`: the Joda-Time pattern of the text. Flume: `serializers.<s>.pattern`.
    #[serde(default)]
    pub pattern: Option<String>,
}

fn default_type() -> String {
    "default".into()
}

#[derive(Debug)]
enum Serializer {
    PassThrough,
    Millis(DatePattern),
}

impl Serializer {
    fn serialize(&self, text: &str) -> Option<String> {
        match self {
            Serializer::PassThrough => Some(text.to_owned()),
            Serializer::Millis(pattern) => pattern.parse(text).map(|millis| millis.to_string()),
        }
    }
}

/// The regex extractor interceptor.
#[derive(Debug)]
pub struct RegexExtractorInterceptor {
    regex: Regex,
    serializers: Vec<(String, Serializer)>,
}

impl RegexExtractorInterceptor {
    /// Validates the options, compiles the expression and the date patterns.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        let config: RegexExtractorConfig = cfg.parse()?;
        let regex = Regex::new(&config.regex).map_err(|e| {
            cfg.error_at("regex", format!("`regex`: invalid regular expression: {e}"))
        })?;
        if config.serializers.is_empty() {
            return Err(cfg.error_at(
                "serializers",
                "`serializers` needs one entry per group, e.g. `[ { name: level } ]`",
            ));
        }
        let mut serializers = Vec::new();
        for (i, s) in config.serializers.into_iter().enumerate() {
            let at = |message: String| {
                cfg.error_at("serializers", format!("`serializers[{i}]`: {message}"))
            };
            if s.name.is_empty() {
                return Err(at("`name` must not be empty".into()));
            }
            let serializer = match (s.kind.as_str(), s.pattern) {
                ("default", None) => Serializer::PassThrough,
                ("default", Some(_)) => {
                    return Err(at(
                        "`pattern` is an option of the `millis` serializer".into()
                    ));
                }
                ("millis", Some(pattern)) => Serializer::Millis(
                    DatePattern::new(&pattern).map_err(|e| at(format!("`pattern`: {e}")))?,
                ),
                ("millis", None) => {
                    return Err(at(
                        "the `millis` serializer needs a `pattern`, e.g. `yyyy-MM-dd HH:mm`".into(),
                    ));
                }
                (other, _) => {
                    return Err(at(ferry_core::config::unknown_name_message(
                        "serializer type",
                        other,
                        ["default", "millis"],
                    )));
                }
            };
            serializers.push((s.name, serializer));
        }
        Ok(Self { regex, serializers })
    }
}

impl Interceptor for RegexExtractorInterceptor {
    fn intercept(&self, mut events: Vec<Event>) -> Vec<Event> {
        for event in &mut events {
            let Some(groups) = self.regex.captures(&event.body) else {
                continue;
            };
            for ((name, serializer), group) in self.serializers.iter().zip(groups.iter().skip(1)) {
                let Some(group) = group else { continue };
                let text = String::from_utf8_lossy(group.as_bytes());
                if let Some(value) = serializer.serialize(&text) {
                    event.headers.set(name.clone(), value);
                }
            }
        }
        events
    }
}

/// A Joda-Time date pattern, for parsing.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DatePattern(Vec<Token>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Literal(String),
    /// A pattern letter and how many times it is written.
    Field(char, usize),
}

impl Token {
    fn is_numeric(&self) -> bool {
        match self {
            Token::Field('M', n) => *n < 3,
            Token::Field(c, _) => matches!(c, 'y' | 'd' | 'H' | 'h' | 'm' | 's' | 'S'),
            Token::Literal(_) => false,
        }
    }
}

impl DatePattern {
    fn new(pattern: &str) -> Result<Self, String> {
        let mut tokens = Vec::new();
        let mut chars = pattern.chars().peekable();
        while let Some(c) = chars.next() {
            if c == '\'' {
                let mut text = String::new();
                loop {
                    match chars.next() {
                        Some('\'') if chars.peek() == Some(&'\'') => {
                            chars.next();
                            text.push('\'');
                        }
                        Some('\'') => break,
                        Some(c) => text.push(c),
                        None => return Err(format!("unclosed quote in `{pattern}`")),
                    }
                }
                // `''` alone is a quote.
                tokens.push(Token::Literal(if text.is_empty() {
                    "'".into()
                } else {
                    text
                }));
            } else if c.is_ascii_alphabetic() {
                if !"yMdHhmsSZEa".contains(c) {
                    return Err(format!(
                        "pattern letter `{c}` is not supported (supported: y M d H h a m s S Z E)"
                    ));
                }
                let mut n = 1;
                while chars.peek() == Some(&c) {
                    chars.next();
                    n += 1;
                }
                tokens.push(Token::Field(c, n));
            } else {
                tokens.push(Token::Literal(c.to_string()));
            }
        }
        if tokens.is_empty() {
            return Err("the pattern is empty".into());
        }
        Ok(Self(tokens))
    }

    /// Reads `text`, all of it, as epoch milliseconds.
    fn parse(&self, text: &str) -> Option<i64> {
        let mut at = DateTime::default();
        let mut pm: Option<bool> = None;
        let mut hour12: Option<u32> = None;
        let mut rest = text;
        for (i, token) in self.0.iter().enumerate() {
            let next_numeric = self.0.get(i + 1).is_some_and(Token::is_numeric);
            match token {
                Token::Literal(literal) => rest = rest.strip_prefix(literal.as_str())?,
                Token::Field(letter, n) if token.is_numeric() => {
                    let widest = match letter {
                        'y' if *n == 2 => 2,
                        'y' => 9,
                        'S' => 9,
                        _ => 2,
                    };
                    // Next to another number, a field takes exactly as many digits as written.
                    let max = if next_numeric { *n } else { widest.max(*n) };
                    let len = rest
                        .bytes()
                        .take(max)
                        .take_while(u8::is_ascii_digit)
                        .count();
                    if len == 0 || (next_numeric && len < *n) {
                        return None;
                    }
                    let (digits, tail) = rest.split_at(len);
                    rest = tail;
                    let value: u64 = digits.parse().ok()?;
                    let small = u32::try_from(value).ok();
                    match letter {
                        'y' if *n == 2 => at.year = 2000 + value as i64,
                        'y' => at.year = i64::try_from(value).ok()?,
                        'M' => at.month = small?,
                        'd' => at.day = small?,
                        'H' => at.hour = small?,
                        'h' => hour12 = Some(small?),
                        'm' => at.minute = small?,
                        's' => at.second = small?,
                        // A fraction: `5` is 500 ms, `123456` is 123 ms.
                        _ => {
                            let scaled = format!("{digits:0<3}");
                            at.millis = scaled[..3].parse().ok()?;
                        }
                    }
                }
                Token::Field('M', _) | Token::Field('E', _) | Token::Field('a', _) => {
                    let len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
                    let (word, tail) = rest.split_at(len);
                    rest = tail;
                    match token {
                        Token::Field('M', _) => at.month = month_of_name(word)?,
                        Token::Field('a', _) => match word.to_ascii_uppercase().as_str() {
                            "AM" => pm = Some(false),
                            "PM" => pm = Some(true),
                            _ => return None,
                        },
                        _ if len >= 3 => {}
                        _ => return None,
                    }
                }
                Token::Field(_, _) => {
                    // `Z`: an offset.
                    let (offset, tail) = parse_offset(rest)?;
                    at.offset_seconds = offset;
                    rest = tail;
                }
            }
        }
        if !rest.is_empty() {
            return None;
        }
        if let Some(h) = hour12 {
            if !(1..=12).contains(&h) {
                return None;
            }
            at.hour = (h % 12) + if pm == Some(true) { 12 } else { 0 };
        }
        at.epoch_millis()
    }
}

/// `Z`, `+hh`, `+hhmm` or `+hh:mm` (or `-`) at the start of `text`: seconds east of UTC and
/// what follows.
pub(crate) fn parse_offset(text: &str) -> Option<(i64, &str)> {
    if let Some(rest) = text.strip_prefix('Z') {
        return Some((0, rest));
    }
    let sign = match text.as_bytes().first()? {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let digits = |s: &str| -> Option<i64> {
        (s.len() == 2 && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    let body = &text[1..];
    let hours = digits(body.get(..2)?)?;
    let after = &body[2..];
    let (minutes, rest) = if let Some(m) = after.strip_prefix(':') {
        (digits(m.get(..2)?)?, &m[2..])
    } else if let Some(m) = after.get(..2).and_then(digits) {
        (m, &after[2..])
    } else {
        (0, after)
    };
    if hours > 23 || minutes > 59 {
        return None;
    }
    Some((sign * (hours * 3600 + minutes * 60), rest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interceptors::config;

    fn build(yaml: &str) -> Result<RegexExtractorInterceptor, ConfigError> {
        RegexExtractorInterceptor::build(&config("regex_extractor", yaml))
    }

    fn millis(pattern: &str, text: &str) -> Option<i64> {
        DatePattern::new(pattern).unwrap().parse(text)
    }

    #[test]
    fn groups_become_headers_in_order() {
        let interceptor = build(
            "regex: '^(\\w+) (\\d+) (\\w+)'\nserializers: [ { name: level }, { name: code } ]",
        )
        .unwrap();
        let out = interceptor.intercept(vec![
            Event::from_body("WARN 503 upstream down"),
            Event::from_body("no match here"),
        ]);
        assert_eq!(out[0].headers["level"], "WARN");
        assert_eq!(out[0].headers["code"], "503");
        assert_eq!(out[0].headers.len(), 2, "the third group has no serializer");
        assert!(out[1].headers.is_empty());
        assert_eq!(&out[0].body[..], b"WARN 503 upstream down");
    }

    #[test]
    fn the_millis_serializer_reads_dates_by_pattern() {
        let interceptor = build(
            "regex: '^\\[([^\\]]+)\\] (?:(x)|y)'\n\
             serializers:\n  - { name: timestamp, type: millis, pattern: 'yyyy-MM-dd HH:mm:ss.SSS' }\n  - { name: x }",
        )
        .unwrap();
        let out = interceptor.intercept(vec![
            Event::from_body("[2003-10-11 22:14:15.003] y"),
            Event::from_body("[not a date] y"),
        ]);
        assert_eq!(out[0].headers["timestamp"], "1065910455003");
        assert!(
            !out[0].headers.contains_key("x"),
            "a group that did not match sets nothing"
        );
        assert!(
            out[1].headers.is_empty(),
            "text that is not a date sets nothing"
        );
    }

    #[test]
    fn date_patterns() {
        assert_eq!(
            millis("yyyy-MM-dd HH:mm", "2003-10-11 22:14"),
            Some(1_065_910_440_000)
        );
        assert_eq!(
            millis("yyyyMMddHHmmss", "20031011221415"),
            Some(1_065_910_455_000)
        );
        assert_eq!(
            millis("dd/MMM/yyyy:HH:mm:ss Z", "11/Oct/2003:22:14:15 +0200"),
            Some(1_065_903_255_000)
        );
        assert_eq!(
            millis("yyyy-MM-dd'T'HH:mm:ssZ", "2003-10-11T22:14:15-07:00"),
            Some(1_065_935_655_000)
        );
        assert_eq!(
            millis("EEE, d MMM yy h:mm a", "Sat, 11 Oct 03 10:14 PM"),
            Some(1_065_910_440_000)
        );
        assert_eq!(millis("yyyy-MM-dd", "2003-10-11 trailing"), None);
        assert_eq!(millis("yyyy-MM-dd", "2003-13-11"), None);
        assert_eq!(millis("yyyy-MM-dd", ""), None);
        assert_eq!(millis("HH:mm:ss.S", "00:00:01.5"), Some(1500));
    }

    #[test]
    fn options_are_checked_and_named() {
        let cases = [
            (
                "regex: '('\nserializers: [ { name: a } ]",
                "`regex`: invalid",
            ),
            ("regex: a\nserializers: []", "`serializers` needs"),
            (
                "regex: a\nserializers: [ { name: a, type: milis, pattern: x } ]",
                "did you mean `millis`",
            ),
            (
                "regex: a\nserializers: [ { name: a, type: millis } ]",
                "needs a `pattern`",
            ),
            (
                "regex: a\nserializers: [ { name: a, type: millis, pattern: 'yyyy-Q' } ]",
                "`pattern`: pattern letter `Q`",
            ),
            (
                "regex: a\nserializers: [ { name: a, type: millis, pattern: \"'x\" } ]",
                "unclosed quote",
            ),
            (
                "regex: a\nserializers: [ { name: a, pattern: yyyy } ]",
                "option of the `millis`",
            ),
            (
                "regex: a\nserializers: [ { nme: a } ]",
                "did you mean `name`",
            ),
            ("serializers: [ { name: a } ]", "regex"),
        ];
        for (yaml, expected) in cases {
            let error = build(yaml).unwrap_err();
            assert!(error.message.contains(expected), "{yaml}: {error}");
        }
    }
}
