//! `search_replace`: Flume's `SearchAndReplaceInterceptor`. Replaces every match of a regular
//! expression in each body, e.g. to mask card numbers or drop a prefix.
//!
//! The replacement may name groups of the expression: `$1`, `${name}` (as Java's
//! `replaceAll`); a literal `$` is written `$$` (Java writes `\$`). Bodies that are not valid
//! UTF-8 are searched as bytes: what does not match is kept as it is.

use std::borrow::Cow;

use bytes::Bytes;
use ferry_core::{ComponentConfig, ConfigError, Event, Interceptor};
use regex::bytes::Regex;
use serde::Deserialize;

/// Options of the `search_replace` interceptor.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchReplaceConfig {
    /// The expression to search for. Required. Flume: `searchPattern`.
    pub search_pattern: String,
    /// What each match is replaced with. Default empty (matches are removed).
    /// Flume: `replaceString`.
    #[serde(default)]
    pub replace_string: String,
    /// The charset of the bodies. Only `UTF-8` (the default, as Flume's) is supported.
    /// Flume: `charset`.
    #[serde(default = "default_charset")]
    pub charset: String,
}

fn default_charset() -> String {
    "UTF-8".into()
}

/// The search-and-replace interceptor.
#[derive(Debug)]
pub struct SearchReplaceInterceptor {
    search: Regex,
    replace: Vec<u8>,
}

impl SearchReplaceInterceptor {
    /// Validates the options and compiles the expression.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        let config: SearchReplaceConfig = cfg.parse()?;
        if config.search_pattern.is_empty() {
            return Err(cfg.error_at("search_pattern", "`search_pattern` must not be empty"));
        }
        let search = Regex::new(&config.search_pattern).map_err(|e| {
            cfg.error_at(
                "search_pattern",
                format!("`search_pattern`: invalid regular expression: {e}"),
            )
        })?;
        if !matches!(
            config.charset.to_ascii_uppercase().as_str(),
            "UTF-8" | "UTF8"
        ) {
            return Err(cfg.error_at(
                "charset",
                format!(
                    "`charset`: `{}` is not supported; bodies are searched as `UTF-8`",
                    config.charset
                ),
            ));
        }
        Ok(Self {
            search,
            replace: config.replace_string.into_bytes(),
        })
    }
}

impl Interceptor for SearchReplaceInterceptor {
    fn intercept(&self, mut events: Vec<Event>) -> Vec<Event> {
        for event in &mut events {
            // A body without a match is not copied.
            if let Cow::Owned(body) = self.search.replace_all(&event.body, &self.replace[..]) {
                event.body = Bytes::from(body);
            }
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interceptors::config;

    fn build(yaml: &str) -> Result<SearchReplaceInterceptor, ConfigError> {
        SearchReplaceInterceptor::build(&config("search_replace", yaml))
    }

    fn body(interceptor: &SearchReplaceInterceptor, body: &'static [u8]) -> Bytes {
        interceptor
            .intercept(vec![Event::from_body(body)])
            .remove(0)
            .body
    }

    #[test]
    fn replaces_every_match_with_group_references() {
        let interceptor = build(
            "search_pattern: '(\\d{4})-\\d{4}-\\d{4}-(\\d{4})'\nreplace_string: '$1-xxxx-xxxx-$2'",
        )
        .unwrap();
        assert_eq!(
            body(
                &interceptor,
                b"card 1234-5678-9012-3456 and 1111-2222-3333-4444"
            ),
            &b"card 1234-xxxx-xxxx-3456 and 1111-xxxx-xxxx-4444"[..]
        );
    }

    #[test]
    fn the_default_replacement_removes_matches() {
        let interceptor = build("search_pattern: '^DEBUG '").unwrap();
        assert_eq!(body(&interceptor, b"DEBUG x"), &b"x"[..]);
        assert_eq!(body(&interceptor, b"INFO DEBUG x"), &b"INFO DEBUG x"[..]);
    }

    #[test]
    fn bodies_that_are_not_utf8_keep_their_other_bytes() {
        let interceptor = build("search_pattern: secret\nreplace_string: '***'").unwrap();
        assert_eq!(
            body(&interceptor, b"\xff\xfe secret \xc3"),
            &b"\xff\xfe *** \xc3"[..]
        );
    }

    #[test]
    fn options_are_checked() {
        let missing = build("replace_string: x").unwrap_err();
        assert!(missing.message.contains("search_pattern"), "{missing}");
        let invalid = build("search_pattern: '('").unwrap_err();
        assert!(
            invalid.message.contains("`search_pattern`: invalid"),
            "{invalid}"
        );
        let charset = build("search_pattern: a\ncharset: UTF-16").unwrap_err();
        assert!(charset.message.contains("`charset`"), "{charset}");
        assert_eq!(charset.location.map(|l| l.line), Some(2));
        assert!(build("search_pattern: a\ncharset: utf-8").is_ok());
    }
}
