//! `timestamp`: Flume's `TimestampInterceptor`. Sets a header to the time the batch passed the
//! interceptor, in milliseconds since the Unix epoch (one clock reading per batch).

use std::time::{SystemTime, UNIX_EPOCH};

use ferry_core::{ComponentConfig, ConfigError, Event, Interceptor};
use serde::Deserialize;

/// Options of the `timestamp` interceptor.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimestampConfig {
    /// Header to set. Default `timestamp`. Flume: `headerName`.
    #[serde(default = "default_header_name")]
    pub header_name: String,
    /// Keep the header of events that already have one. Default `false`.
    /// Flume: `preserveExisting`.
    #[serde(default)]
    pub preserve_existing: bool,
}

fn default_header_name() -> String {
    "timestamp".into()
}

/// The timestamp interceptor.
#[derive(Debug)]
pub struct TimestampInterceptor {
    config: TimestampConfig,
}

impl TimestampInterceptor {
    /// Validates the options.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        Ok(Self {
            config: cfg.parse()?,
        })
    }
}

impl Interceptor for TimestampInterceptor {
    fn intercept(&self, mut events: Vec<Event>) -> Vec<Event> {
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
        super::set_header(
            &mut events,
            &self.config.header_name,
            &millis.to_string(),
            self.config.preserve_existing,
        );
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interceptors::config;

    fn millis_now() -> u128 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis()
    }

    #[test]
    fn stamps_every_event_with_epoch_millis() {
        let interceptor = TimestampInterceptor::build(&config("timestamp", "")).unwrap();
        let before = millis_now();
        let events = interceptor.intercept(vec![Event::from_body("a"), Event::from_body("b")]);
        let after = millis_now();
        for event in &events {
            let stamp: u128 = event.headers["timestamp"].parse().unwrap();
            assert!(before <= stamp && stamp <= after, "{stamp}");
        }
    }

    #[test]
    fn replaces_existing_unless_preserving() {
        let mut old = Event::from_body("x");
        old.headers.insert("ts".into(), "1".into());
        let replace = TimestampInterceptor::build(&config("timestamp", "header_name: ts")).unwrap();
        assert_ne!(replace.intercept(vec![old.clone()])[0].headers["ts"], "1");
        let keep = TimestampInterceptor::build(&config(
            "timestamp",
            "header_name: ts\npreserve_existing: true",
        ))
        .unwrap();
        assert_eq!(keep.intercept(vec![old])[0].headers["ts"], "1");
    }
}
