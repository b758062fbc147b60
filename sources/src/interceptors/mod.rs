//! Built-in interceptors: they add headers to every event of a batch, as Flume's do.
//!
//! | type        | Flume counterpart       | header                     |
//! |-------------|-------------------------|----------------------------|
//! | `timestamp` | `TimestampInterceptor`  | `timestamp`: epoch millis  |
//! | `host`      | `HostInterceptor`       | `host`: IP or host name    |
//! | `static`    | `StaticInterceptor`     | a fixed key and value      |

use std::sync::Arc;

use ferry_core::{Event, Registry};

pub mod host;
pub mod static_header;
pub mod timestamp;

pub use host::HostInterceptor;
pub use static_header::StaticInterceptor;
pub use timestamp::TimestampInterceptor;

/// Registers `timestamp`, `host` and `static`.
pub fn register(registry: &mut Registry) {
    registry
        .register_interceptor("timestamp", |cfg| {
            Ok(Arc::new(TimestampInterceptor::build(cfg)?))
        })
        .register_interceptor("host", |cfg| Ok(Arc::new(HostInterceptor::build(cfg)?)))
        .register_interceptor("static", |cfg| Ok(Arc::new(StaticInterceptor::build(cfg)?)));
}

/// Sets header `key` to `value` on every event; with `preserve_existing`, events that already
/// have the header keep theirs.
fn set_header(events: &mut [Event], key: &str, value: &str, preserve_existing: bool) {
    for event in events {
        if preserve_existing && event.headers.contains_key(key) {
            continue;
        }
        event.headers.insert(key.to_owned(), value.to_owned());
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
