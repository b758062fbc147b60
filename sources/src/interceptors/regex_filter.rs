//! `regex_filter`: Flume's `RegexFilteringInterceptor`. Keeps (or, with `exclude_events`,
//! drops) the events whose body matches a regular expression. The source counts what it
//! drops in `EventFilteredCount`.

use ferry_core::{ComponentConfig, ConfigError, Event, Interceptor};
use regex::bytes::Regex;
use serde::Deserialize;

/// Options of the `regex_filter` interceptor.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegexFilterConfig {
    /// The expression searched for in each body. Default `.*` (as Flume's). Flume: `regex`.
    #[serde(default = "default_regex")]
    pub regex: String,
    /// Drop the matching events instead of keeping them. Default `false`.
    /// Flume: `excludeEvents`.
    #[serde(default)]
    pub exclude_events: bool,
}

fn default_regex() -> String {
    ".*".into()
}

/// The regex filtering interceptor.
#[derive(Debug)]
pub struct RegexFilterInterceptor {
    regex: Regex,
    exclude_events: bool,
}

impl RegexFilterInterceptor {
    /// Validates the options and compiles the expression.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        let config: RegexFilterConfig = cfg.parse()?;
        let regex = Regex::new(&config.regex)
            .map_err(|e| cfg.error_at("regex", format!("invalid regular expression: {e}")))?;
        Ok(Self {
            regex,
            exclude_events: config.exclude_events,
        })
    }
}

impl Interceptor for RegexFilterInterceptor {
    fn intercept(&self, mut events: Vec<Event>) -> Vec<Event> {
        events.retain(|event| self.regex.is_match(&event.body) != self.exclude_events);
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interceptors::config;

    fn bodies(events: &[Event]) -> Vec<&[u8]> {
        events.iter().map(|e| &e.body[..]).collect()
    }

    fn batch() -> Vec<Event> {
        ["GET /", "DEBUG x", "POST /a", "DEBUG y"]
            .into_iter()
            .map(Event::from_body)
            .collect()
    }

    #[test]
    fn keeps_only_matching_events() {
        let interceptor =
            RegexFilterInterceptor::build(&config("regex_filter", "regex: ^(GET|POST)")).unwrap();
        let out = interceptor.intercept(batch());
        assert_eq!(bodies(&out), [&b"GET /"[..], b"POST /a"]);
    }

    #[test]
    fn drops_matching_events_when_excluding() {
        let interceptor = RegexFilterInterceptor::build(&config(
            "regex_filter",
            "regex: ^DEBUG\nexclude_events: true",
        ))
        .unwrap();
        let out = interceptor.intercept(batch());
        assert_eq!(bodies(&out), [&b"GET /"[..], b"POST /a"]);
    }

    #[test]
    fn an_invalid_expression_is_a_configuration_error() {
        let error = RegexFilterInterceptor::build(&config("regex_filter", "regex: '('"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("invalid regular expression"), "{error}");
    }

    #[test]
    fn the_default_keeps_everything() {
        let interceptor = RegexFilterInterceptor::build(&config("regex_filter", "")).unwrap();
        assert_eq!(interceptor.intercept(batch()).len(), 4);
    }
}
