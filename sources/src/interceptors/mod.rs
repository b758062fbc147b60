//! Built-in interceptors: they add headers to every event of a batch, or filter events, as
//! Flume's do.
//!
//! | type           | Flume counterpart            | effect                            |
//! |----------------|------------------------------|-----------------------------------|
//! | `timestamp`    | `TimestampInterceptor`       | `timestamp` header: epoch millis  |
//! | `host`         | `HostInterceptor`            | `host` header: IP or host name    |
//! | `static`       | `StaticInterceptor`          | a fixed header key and value      |
//! | `regex_filter` | `RegexFilteringInterceptor`  | keeps or drops events by body     |
//! | `remove_header`| `RemoveHeaderInterceptor`    | removes headers by name or regex  |
//! | `uuid`         | `UUIDInterceptor`            | a random UUID header              |
//! | `search_replace`| `SearchAndReplaceInterceptor`| rewrites bodies by regex         |
//! | `regex_extractor`| `RegexExtractorInterceptor`| headers from regex groups of the body |
//! | `position`     | (none)                       | a stable id of where the event was read |

use std::sync::Arc;

use ferry_core::{Event, Headers, Registry};

pub mod host;
pub mod position;
pub mod regex_extractor;
pub mod regex_filter;
pub mod remove_header;
pub mod search_replace;
pub mod static_header;
pub mod timestamp;
pub mod uuid;

pub use host::HostInterceptor;
pub use position::PositionInterceptor;
pub use regex_extractor::RegexExtractorInterceptor;
pub use regex_filter::RegexFilterInterceptor;
pub use remove_header::RemoveHeaderInterceptor;
pub use search_replace::SearchReplaceInterceptor;
pub use static_header::StaticInterceptor;
pub use timestamp::TimestampInterceptor;
pub use uuid::UuidInterceptor;

/// Registers every built-in interceptor under its type name.
pub fn register(registry: &mut Registry) {
    registry
        .register_interceptor("timestamp", |cfg| {
            Ok(Arc::new(TimestampInterceptor::build(cfg)?))
        })
        .register_interceptor("host", |cfg| Ok(Arc::new(HostInterceptor::build(cfg)?)))
        .register_interceptor("static", |cfg| Ok(Arc::new(StaticInterceptor::build(cfg)?)))
        .register_interceptor("regex_filter", |cfg| {
            Ok(Arc::new(RegexFilterInterceptor::build(cfg)?))
        })
        .register_interceptor("remove_header", |cfg| {
            Ok(Arc::new(RemoveHeaderInterceptor::build(cfg)?))
        })
        .register_interceptor("uuid", |cfg| Ok(Arc::new(UuidInterceptor::build(cfg)?)))
        .register_interceptor("search_replace", |cfg| {
            Ok(Arc::new(SearchReplaceInterceptor::build(cfg)?))
        })
        .register_interceptor("regex_extractor", |cfg| {
            Ok(Arc::new(RegexExtractorInterceptor::build(cfg)?))
        })
        .register_interceptor("position", |cfg| {
            Ok(Arc::new(PositionInterceptor::build(cfg)?))
        });
}

/// Sets header `key` to `value` on every event; with `preserve_existing`, events that already
/// have the header keep theirs.
fn set_header(events: &mut [Event], key: &str, value: &str, preserve_existing: bool) {
    edit_headers(
        events,
        |headers| !(preserve_existing && headers.contains_key(key)),
        |headers| {
            headers.set(key.to_owned(), value.to_owned());
        },
    );
}

/// Applies `edit` to the headers of every event for which `applies` says so.
///
/// Events that share their headers (all the lines of one tailed file do) get one new map
/// between them: one copy per run of such events, not one per event. An event `applies`
/// refuses is not copied at all.
fn edit_headers(
    events: &mut [Event],
    applies: impl Fn(&Headers) -> bool,
    mut edit: impl FnMut(&mut Headers),
) {
    let mut last: Option<(Headers, Headers)> = None;
    for event in events {
        if let Some((before, after)) = &last
            && event.headers.shares_with(before)
        {
            event.headers = after.clone();
            continue;
        }
        let before = event.headers.is_shared().then(|| event.headers.clone());
        if applies(&event.headers) {
            edit(&mut event.headers);
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
            assert_eq!(event.headers.value("host"), Some("web-1"));
            assert_eq!(event.headers.value("file"), Some("/var/log/a.log"));
        }
        assert_eq!(
            events[3].headers.value("host"),
            Some("kept"),
            "preserve_existing keeps an existing header"
        );
    }
}
