//! `remove_header`: Flume's `RemoveHeaderInterceptor`. Removes headers from every event: one
//! named header, a list of names, and every header whose whole name matches a regular
//! expression; any of the three, or several together.

use ferry_core::{ComponentConfig, ConfigError, Event, Headers, Interceptor};
use regex::Regex;
use serde::Deserialize;

/// Options of the `remove_header` interceptor. With none of `with_name`, `from_list` and
/// `matching` set, nothing is removed (as in Flume).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoveHeaderConfig {
    /// Name of a header to remove. Default none. Flume: `withName`.
    #[serde(default)]
    pub with_name: Option<String>,
    /// Names of headers to remove, separated by `list_separator`, e.g. `host, file`.
    /// Default none. Flume: `fromList`.
    #[serde(default)]
    pub from_list: Option<String>,
    /// Regular expression separating the names of `from_list`. Default `\s*,\s*` (as Flume's).
    /// Flume: `fromListSeparator`.
    #[serde(default = "default_separator")]
    pub list_separator: String,
    /// Headers whose whole name matches this regular expression are removed. Default none.
    /// Flume: `matching`.
    #[serde(default)]
    pub matching: Option<String>,
}

fn default_separator() -> String {
    r"\s*,\s*".into()
}

/// The remove-header interceptor.
#[derive(Debug)]
pub struct RemoveHeaderInterceptor {
    /// `with_name` and the names of `from_list`.
    names: Vec<String>,
    matching: Option<Regex>,
}

impl RemoveHeaderInterceptor {
    /// Validates the options and compiles the expressions.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        let config: RemoveHeaderConfig = cfg.parse()?;
        let compile = |key: &str, pattern: &str| {
            Regex::new(pattern)
                .map_err(|e| cfg.error_at(key, format!("`{key}`: invalid regular expression: {e}")))
        };
        let separator = compile("list_separator", &config.list_separator)?;
        let mut names: Vec<String> = config.with_name.into_iter().collect();
        if let Some(list) = &config.from_list {
            names.extend(
                separator
                    .split(list.trim())
                    .filter(|name| !name.is_empty())
                    .map(str::to_owned),
            );
        }
        // As Java's `Matcher.matches`: the expression must match the whole name.
        let matching = config
            .matching
            .map(|pattern| compile("matching", &format!("^(?:{pattern})$")))
            .transpose()?;
        Ok(Self { names, matching })
    }

    fn removes(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
            || self.matching.as_ref().is_some_and(|m| m.is_match(name))
    }
}

impl Interceptor for RemoveHeaderInterceptor {
    fn intercept(&self, mut events: Vec<Event>) -> Vec<Event> {
        if self.names.is_empty() && self.matching.is_none() {
            return events;
        }
        super::edit_headers(
            &mut events,
            |headers: &Headers| headers.keys().any(|k| self.removes(k)),
            |headers| headers.retain(|k, _| !self.removes(k)),
        );
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interceptors::config;

    fn event(headers: &[(&str, &str)]) -> Event {
        Event::new(
            headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            "body",
        )
    }

    fn names(event: &Event) -> Vec<&str> {
        event.headers.keys().map(|k| k.as_str()).collect()
    }

    fn build(yaml: &str) -> RemoveHeaderInterceptor {
        RemoveHeaderInterceptor::build(&config("remove_header", yaml)).unwrap()
    }

    #[test]
    fn removes_by_name_list_and_whole_name_match() {
        let interceptor = build("with_name: host\nfrom_list: 'file ,  offset'\nmatching: 'x-.*'\n");
        let out = interceptor.intercept(vec![event(&[
            ("host", "h"),
            ("file", "f"),
            ("offset", "1"),
            ("x-trace", "t"),
            ("keep-x-", "k"),
            ("topic", "t"),
        ])]);
        assert_eq!(names(&out[0]), ["keep-x-", "topic"]);
    }

    #[test]
    fn a_custom_separator_splits_the_list() {
        let interceptor = build("from_list: 'a|b'\nlist_separator: '\\|'");
        let out = interceptor.intercept(vec![event(&[("a", "1"), ("b", "2"), ("c", "3")])]);
        assert_eq!(names(&out[0]), ["c"]);
    }

    #[test]
    fn events_without_such_headers_are_not_copied() {
        let interceptor = build("with_name: host");
        let shared = event(&[("file", "f")]).headers;
        let events = vec![
            Event::new(shared.clone(), "1"),
            Event::new(shared.clone(), "2"),
        ];
        let out = interceptor.intercept(events);
        assert!(out[0].headers.shares_with(&shared));
        assert!(out[1].headers.shares_with(&shared));
    }

    #[test]
    fn events_sharing_headers_share_the_result() {
        let interceptor = build("with_name: host");
        let shared = event(&[("file", "f"), ("host", "h")]).headers;
        let out = interceptor.intercept(vec![
            Event::new(shared.clone(), "1"),
            Event::new(shared.clone(), "2"),
        ]);
        assert_eq!(names(&out[0]), ["file"]);
        assert!(out[0].headers.shares_with(&out[1].headers));
        assert_eq!(shared.len(), 2, "the source's map is not changed");
    }

    #[test]
    fn without_options_nothing_is_removed() {
        let out = build("").intercept(vec![event(&[("host", "h")])]);
        assert_eq!(names(&out[0]), ["host"]);
    }

    #[test]
    fn invalid_expressions_name_their_option() {
        for (yaml, key) in [
            ("matching: '('", "matching"),
            ("list_separator: '['", "list_separator"),
        ] {
            let error = RemoveHeaderInterceptor::build(&config("remove_header", yaml)).unwrap_err();
            assert!(
                error
                    .message
                    .contains(&format!("`{key}`: invalid regular expression")),
                "{error}"
            );
            assert_eq!(error.location.map(|l| l.line), Some(1), "{key}: {error:?}");
        }
        let error =
            RemoveHeaderInterceptor::build(&config("remove_header", "with_nam: x")).unwrap_err();
        assert!(
            error.message.contains("did you mean `with_name`"),
            "{error}"
        );
    }
}
