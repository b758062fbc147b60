//! Built-in interceptors: they add headers to every event of a batch, or filter events, as
//! Flume's do.
//!
//! | type           | Flume counterpart            | effect                            |
//! |----------------|------------------------------|-----------------------------------|
//! | `timestamp`    | `TimestampInterceptor`       | `timestamp` header: epoch millis  |
//! | `host`         | `HostInterceptor`            | `host` header: IP or host name    |
//! | `static`       | `StaticInterceptor`          | a fixed header key and value      |
//! | `regex_filter` | `RegexFilteringInterceptor`  | keeps or drops events by body     |

use std::sync::Arc;

use ferry_core::{Event, Headers, Registry};

pub mod host;
pub mod regex_filter;
pub mod static_header;
pub mod timestamp;

pub use host::HostInterceptor;
pub use regex_filter::RegexFilterInterceptor;
pub use static_header::StaticInterceptor;
pub use timestamp::TimestampInterceptor;

/// Registers `timestamp`, `host`, `static` and `regex_filter`.
pub fn register(registry: &mut Registry) {
    registry
        .register_interceptor("timestamp", |cfg| {
            Ok(Arc::new(TimestampInterceptor::build(cfg)?))
        })
        .register_interceptor("host", |cfg| Ok(Arc::new(HostInterceptor::build(cfg)?)))
        .register_interceptor("static", |cfg| Ok(Arc::new(StaticInterceptor::build(cfg)?)))
        .register_interceptor("regex_filter", |cfg| {
            Ok(Arc::new(RegexFilterInterceptor::build(cfg)?))
        });
}

/// Sets header `key` to `value` on every event; with `preserve_existing`, events that already
/// have the header keep theirs.
///
/// Events that share their headers (all the lines of one tailed file do) get one new map
/// between them: one copy per run of such events, not one per event.
fn set_header(events: &mut [Event], key: &str, value: &str, preserve_existing: bool) {
    let mut last: Option<(Headers, Headers)> = None;
    for event in events {
        if let Some((before, after)) = &last
            && event.headers.shares_with(before)
        {
            event.headers = after.clone();
            continue;
        }
        let before = event.headers.is_shared().then(|| event.headers.clone());
        if !(preserve_existing && event.headers.contains_key(key)) {
            event.headers.insert(key.to_owned(), value.to_owned());
        }
        last = before.map(|before| (before, event.headers.clone()));
    }
}

#[cfg(test)]
fn config(type_name: &str, yaml: &str) -> ferry_core::ComponentConfig {
    ferry_core::ComponentConfig::from_yaml(
        ferry_core::ComponentKind::Interceptor,
        "test",
        type_name,
        yaml,
    )
    .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_sharing_headers_share_the_new_ones() {
        let mut file = Headers::new();
        file.insert("file".into(), "/var/log/a.log".into());
        let mut own = Headers::new();
        own.insert("host".into(), "kept".into());
        let mut events: Vec<Event> = (0..3)
            .map(|i| Event::new(file.clone(), format!("{i}")))
            .chain([Event::new(own, "own")])
            .collect();
        set_header(&mut events, "host", "web-1", true);
        assert!(events[0].headers.shares_with(&events[1].headers));
        assert!(events[1].headers.shares_with(&events[2].headers));
        assert!(
            !events[0].headers.shares_with(&file),
            "the source's map is not changed"
        );
        assert_eq!(file.get("host"), None);
        for event in &events[..3] {
            assert_eq!(event.headers.get("host").map(String::as_str), Some("web-1"));
            assert_eq!(
                event.headers.get("file").map(String::as_str),
                Some("/var/log/a.log")
            );
        }
        assert_eq!(
            events[3].headers.get("host").map(String::as_str),
            Some("kept"),
            "preserve_existing keeps an existing header"
        );
    }
}
