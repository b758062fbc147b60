//! `static`: Flume's `StaticInterceptor`. Sets one fixed header on every event.

use ferry_core::{ComponentConfig, ConfigError, Event, Interceptor};
use serde::Deserialize;

/// Options of the `static` interceptor.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticConfig {
    /// Header name. Default `key` (as Flume's). Flume: `key`.
    #[serde(default = "default_key")]
    pub key: String,
    /// Header value. Default `value` (as Flume's). Flume: `value`.
    #[serde(default = "default_value")]
    pub value: String,
    /// Keep the header of events that already have one. Default `true`.
    /// Flume: `preserveExisting`.
    #[serde(default = "default_true")]
    pub preserve_existing: bool,
}

fn default_key() -> String {
    "key".into()
}

fn default_value() -> String {
    "value".into()
}

fn default_true() -> bool {
    true
}

/// The static interceptor.
#[derive(Debug)]
pub struct StaticInterceptor {
    config: StaticConfig,
}

impl StaticInterceptor {
    /// Validates the options.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        Ok(Self {
            config: cfg.parse()?,
        })
    }
}

impl Interceptor for StaticInterceptor {
    fn intercept(&self, mut events: Vec<Event>) -> Vec<Event> {
        let StaticConfig {
            key,
            value,
            preserve_existing,
        } = &self.config;
        super::set_header(&mut events, key, value, *preserve_existing);
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interceptors::config;

    #[test]
    fn sets_the_header_and_preserves_existing_by_default() {
        let interceptor =
            StaticInterceptor::build(&config("static", "key: dc\nvalue: eu-1")).unwrap();
        let mut tagged = Event::from_body("b");
        tagged.headers.insert("dc".into(), "us-2".into());
        let out = interceptor.intercept(vec![Event::from_body("a"), tagged]);
        assert_eq!(out[0].headers["dc"], "eu-1");
        assert_eq!(out[1].headers["dc"], "us-2");
    }

    #[test]
    fn overwrites_when_not_preserving() {
        let interceptor = StaticInterceptor::build(&config(
            "static",
            "key: dc\nvalue: eu-1\npreserve_existing: false",
        ))
        .unwrap();
        let mut tagged = Event::from_body("b");
        tagged.headers.insert("dc".into(), "us-2".into());
        assert_eq!(interceptor.intercept(vec![tagged])[0].headers["dc"], "eu-1");
    }

    #[test]
    fn defaults_are_flumes() {
        let interceptor = StaticInterceptor::build(&config("static", "")).unwrap();
        assert_eq!(
            interceptor.intercept(vec![Event::default()])[0].headers["key"],
            "value"
        );
    }
}
