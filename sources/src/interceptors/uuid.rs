//! `uuid`: Flume's `UUIDInterceptor` (from its morphline Solr sink). Sets a random version 4
//! UUID header on every event, e.g. `id: b5755073-77a9-43c1-8fad-b7a586fc1b97`.
//!
//! The id is random: an event read again after a restart (at-least-once delivery) gets a new
//! one, so it cannot tell a repeated event from a new one. For that, use `position`.

use ferry_core::{ComponentConfig, ConfigError, Event, Interceptor};
use serde::Deserialize;

/// Options of the `uuid` interceptor.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UuidConfig {
    /// The header to set. Default `id` (as Flume's). Flume: `headerName`.
    #[serde(default = "default_header_name")]
    pub header_name: String,
    /// Keep the header of events that already have one. Default `true` (as Flume's).
    /// Flume: `preserveExisting`.
    #[serde(default = "default_true")]
    pub preserve_existing: bool,
    /// Put before each UUID. Default empty. Flume: `prefix`.
    #[serde(default)]
    pub prefix: String,
}

fn default_header_name() -> String {
    "id".into()
}

fn default_true() -> bool {
    true
}

/// The UUID interceptor.
#[derive(Debug)]
pub struct UuidInterceptor {
    config: UuidConfig,
}

impl UuidInterceptor {
    /// Validates the options.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        let config: UuidConfig = cfg.parse()?;
        if config.header_name.is_empty() {
            return Err(cfg.error_at("header_name", "`header_name` must not be empty"));
        }
        Ok(Self { config })
    }
}

impl Interceptor for UuidInterceptor {
    fn intercept(&self, mut events: Vec<Event>) -> Vec<Event> {
        let UuidConfig {
            header_name,
            preserve_existing,
            prefix,
        } = &self.config;
        // One value per event, so one map per event: nothing to share.
        for event in &mut events {
            if *preserve_existing && event.headers.contains_key(header_name.as_str()) {
                continue;
            }
            let id = format!("{prefix}{}", ::uuid::Uuid::new_v4());
            event.headers.set(header_name.clone(), id);
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interceptors::config;

    #[test]
    fn every_event_gets_its_own_uuid_in_id() {
        let interceptor = UuidInterceptor::build(&config("uuid", "")).unwrap();
        let out = interceptor.intercept(vec![Event::from_body("a"), Event::from_body("b")]);
        let ids: Vec<&str> = out.iter().map(|e| e.headers["id"].as_str()).collect();
        assert_ne!(ids[0], ids[1]);
        for id in ids {
            let parsed = ::uuid::Uuid::parse_str(id).unwrap();
            assert_eq!(parsed.get_version_num(), 4);
        }
    }

    #[test]
    fn prefix_header_name_and_preserving() {
        let interceptor =
            UuidInterceptor::build(&config("uuid", "header_name: eid\nprefix: 'web-'")).unwrap();
        let mut tagged = Event::from_body("b");
        tagged.headers.insert("eid".into(), "given".into());
        let out = interceptor.intercept(vec![Event::from_body("a"), tagged]);
        assert!(out[0].headers["eid"].starts_with("web-"), "{:?}", out[0]);
        assert_eq!(out[0].headers["eid"].len(), 4 + 36);
        assert_eq!(out[1].headers["eid"], "given");
    }

    #[test]
    fn overwrites_when_not_preserving() {
        let interceptor =
            UuidInterceptor::build(&config("uuid", "preserve_existing: false")).unwrap();
        let mut tagged = Event::from_body("b");
        tagged.headers.insert("id".into(), "given".into());
        assert_ne!(
            interceptor.intercept(vec![tagged])[0].headers["id"],
            "given"
        );
    }

    #[test]
    fn an_empty_header_name_is_refused() {
        let error = UuidInterceptor::build(&config("uuid", "header_name: ''")).unwrap_err();
        assert!(error.message.contains("`header_name`"), "{error}");
    }
}
