//! Built-in sinks.
//!
//! | type        | module          | Flume counterpart  |
//! |-------------|-----------------|--------------------|
//! | `logger`    | [`logger`]      | `LoggerSink`       |
//! | `null`      | [`null`]        | `NullSink`         |
//! | `file_roll` | [`file_roll`]   | `RollingFileSink`  |
//! | `http`      | [`http`]        | `HttpSink`         |
//! | `s3`        | [`s3`]          | `HDFSEventSink` (`s3a://`) |
//!
//! A sink's `deliver` returns `Ok` only once the batch is safe at the destination; on `Err`
//! the runner rolls the take back and delivers the same batch again after a backoff. A sink
//! that pipelines (the kafka sink, in `ferry-kafka`) has `send` start a batch and `flush` make every batch since the
//! last flush safe; the runner commits their takes only after the flush, and rolls all of
//! them back when a send or the flush fails.

use ferry_core::Registry;

pub mod file_roll;
pub mod http;
pub mod logger;
pub mod null;
pub mod roll;
pub mod s3;

/// Registers every built-in sink under its type name.
pub fn register(registry: &mut Registry) {
    registry
        .register_sink("logger", |cfg| {
            Ok(Box::new(logger::LoggerSink::build(cfg)?))
        })
        .register_sink("null", |cfg| Ok(Box::new(null::NullSink::build(cfg)?)))
        .register_sink("file_roll", |cfg| {
            Ok(Box::new(file_roll::FileRollSink::build(cfg)?))
        })
        .register_sink("http", |cfg| Ok(Box::new(http::HttpSink::build(cfg)?)))
        .register_sink("s3", |cfg| Ok(Box::new(s3::S3Sink::build(cfg)?)));
}

/// Appends headers the way Java prints a map, as Flume's output does: `{a=1, b=2}`.
fn push_java_map(out: &mut Vec<u8>, headers: &ferry_core::Headers) {
    out.push(b'{');
    for (i, (key, value)) in headers.iter().enumerate() {
        if i > 0 {
            out.extend_from_slice(b", ");
        }
        out.extend_from_slice(key.as_bytes());
        out.push(b'=');
        out.extend_from_slice(value.as_bytes());
    }
    out.push(b'}');
}

/// Parses a YAML snippet as the options of a sink.
#[cfg(test)]
fn config(type_name: &str, yaml: &str) -> ferry_core::ComponentConfig {
    ferry_core::ComponentConfig::from_yaml(ferry_core::ComponentKind::Sink, "test", type_name, yaml)
        .unwrap()
}

/// A sink context for tests.
#[cfg(test)]
fn context() -> ferry_core::SinkContext {
    ferry_core::SinkContext {
        name: "test".into(),
        metrics: ferry_core::ComponentMetrics::new("sink", "test"),
        state: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_core::config::ComponentKind;

    #[test]
    fn registers_every_type_name() {
        let mut registry = Registry::new();
        register(&mut registry);
        assert_eq!(
            registry.type_names(ComponentKind::Sink),
            vec!["file_roll", "http", "logger", "null", "s3"]
        );
    }
}
