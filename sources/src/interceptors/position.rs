//! `position` (ours; Flume has none): a header holding a stable id of where each event was
//! read, so that a destination fed at-least-once can drop the events it already has. Flume's
//! `uuid` cannot: an event read again after a restart gets a new random id, while its
//! position is the same.
//!
//! The source writes the header as it reads (this interceptor only asks for it, so it is
//! there for every interceptor of the list, wherever `position` stands), in a form of its own:
//!
//! | source     | position                                   | example                 |
//! |------------|--------------------------------------------|-------------------------|
//! | `taildir`  | `inode-headcrc-offset` of the line          | `1835093-5c1d2f0a-4096` |
//! | `spooldir` | `inode-fingerprint-offset` of the line      | `1835101-0f3e4b2c-120`  |
//! | `seq`      | the sequence number                        | `42`                    |
//! | `kafka`    | `topic-partition-offset` of the record     | `logs-3-1207`           |
//!
//! (`headcrc`, `fingerprint`: CRC-32C of the first bytes of the file, up to 1 KiB, in hex; for
//! `taildir` only the bytes up to the end of the event, which cannot change once it is read.)
//! Other sources cannot tell where an event came from in a way that survives a restart: a
//! `position` interceptor on them is a configuration error.
//!
//! An id costs one header map per event (events of a file otherwise share one).

use ferry_core::{ComponentConfig, ConfigError, Event, Interceptor};
use serde::Deserialize;

/// Options of the `position` interceptor.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PositionConfig {
    /// The header holding the position. Default `position`.
    #[serde(default = "default_header_name")]
    pub header_name: String,
}

fn default_header_name() -> String {
    "position".into()
}

/// The position interceptor.
#[derive(Debug)]
pub struct PositionInterceptor {
    header_name: String,
}

impl PositionInterceptor {
    /// Validates the options.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        let config: PositionConfig = cfg.parse()?;
        if config.header_name.is_empty() {
            return Err(cfg.error_at("header_name", "`header_name` must not be empty"));
        }
        Ok(Self {
            header_name: config.header_name,
        })
    }
}

impl Interceptor for PositionInterceptor {
    fn intercept(&self, events: Vec<Event>) -> Vec<Event> {
        events
    }

    fn position_header(&self) -> Option<&str> {
        Some(&self.header_name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interceptors::config;

    #[test]
    fn asks_the_source_for_the_header_and_changes_nothing() {
        let interceptor = PositionInterceptor::build(&config("position", "")).unwrap();
        assert_eq!(interceptor.position_header(), Some("position"));
        let named =
            PositionInterceptor::build(&config("position", "header_name: eventid")).unwrap();
        assert_eq!(named.position_header(), Some("eventid"));
        let out = named.intercept(vec![Event::from_body("a")]);
        assert!(out[0].headers.is_empty());
        let error = PositionInterceptor::build(&config("position", "header_name: ''")).unwrap_err();
        assert!(error.message.contains("`header_name`"), "{error}");
    }
}
