//! Built-in sources and interceptors.
//!
//! | type      | module                 | Flume counterpart        |
//! |-----------|------------------------|--------------------------|
//! | `seq`     | [`seq`]                | `SequenceGeneratorSource`|
//! | `netcat`  | [`netcat`]             | `NetcatSource`           |
//! | `netcat_udp` | [`netcat_udp`]      | `NetcatUdpSource`        |
//! | `syslog_tcp` | [`syslog`]          | `SyslogTcpSource`        |
//! | `multiport_syslog_tcp` | [`syslog`] | `MultiportSyslogTCPSource` |
//! | `syslog_udp` | [`syslog`]          | `SyslogUDPSource`        |
//! | `exec`    | [`exec`]               | `ExecSource`             |
//! | `http`    | [`http`]               | `HTTPSource` + `JSONHandler` |
//! | `stdin`   | [`stdin`]              | (none)                   |
//! | `taildir` | [`taildir`]            | `TaildirSource`          |
//! | `spooldir`| [`spooldir`]           | `SpoolDirectorySource`   |
//!
//! Interceptors (`timestamp`, `host`, `static`, `regex_filter`, `regex_extractor`,
//! `remove_header`, `search_replace`, `uuid`, `position`) live in [`interceptors`].
//!
//! Every source follows the rule of the plugin API: nothing is acknowledged to a client (an
//! `OK` line, an HTTP 200) before [`SourceContext::send`](ferry_core::SourceContext::send)
//! returned `Ok`.

use ferry_core::Registry;

mod datagrams;
mod datetime;
pub mod exec;
#[cfg(unix)]
mod file_id;
pub mod http;
#[cfg(unix)]
pub mod inspect;
pub mod interceptors;
mod lines;
pub mod netcat;
pub mod netcat_udp;
pub mod seq;
#[cfg(unix)]
pub mod spooldir;
pub mod stdin;
pub mod syslog;
#[cfg(unix)]
pub mod taildir;

/// A listening source bound its address (again): whatever made its runs fail (the address in
/// use, say, while the runner retried) is over, so `/health` is not held at 503 until the
/// first event arrives.
pub(crate) fn listening(ctx: &ferry_core::SourceContext) {
    ctx.metrics().succeeded();
}

/// Registers every built-in source and interceptor under its type name.
pub fn register(registry: &mut Registry) {
    registry
        .register_source("seq", |cfg| Ok(Box::new(seq::SeqSource::build(cfg)?)))
        .register_source("netcat", |cfg| {
            Ok(Box::new(netcat::NetcatSource::build(cfg)?))
        })
        .register_source("netcat_udp", |cfg| {
            Ok(Box::new(netcat_udp::NetcatUdpSource::build(cfg)?))
        })
        .register_source("syslog_tcp", |cfg| {
            Ok(Box::new(syslog::SyslogTcpSource::build(cfg)?))
        })
        .register_source("multiport_syslog_tcp", |cfg| {
            Ok(Box::new(syslog::SyslogTcpSource::build_multiport(cfg)?))
        })
        .register_source("syslog_udp", |cfg| {
            Ok(Box::new(syslog::SyslogUdpSource::build(cfg)?))
        })
        .register_source("exec", |cfg| Ok(Box::new(exec::ExecSource::build(cfg)?)))
        .register_source("http", |cfg| Ok(Box::new(http::HttpSource::build(cfg)?)))
        .register_source("stdin", |cfg| Ok(Box::new(stdin::StdinSource::build(cfg)?)));
    #[cfg(unix)]
    registry
        .register_source("taildir", |cfg| {
            Ok(Box::new(taildir::TaildirSource::build(cfg)?))
        })
        .register_source("spooldir", |cfg| {
            Ok(Box::new(spooldir::SpooldirSource::build(cfg)?))
        });
    interceptors::register(registry);
}

/// The most events one put may carry into every channel of `ctx`: the smallest
/// `transaction_capacity` of its channels.
fn transaction_capacity(ctx: &ferry_core::SourceContext) -> usize {
    ctx.channels()
        .iter()
        .map(|c| c.transaction_capacity())
        .min()
        .unwrap_or(usize::MAX)
        .max(1)
}

/// Splits `items` into runs of at most `size`, in order, without copying the items.
fn chunks<T>(mut items: Vec<T>, size: usize) -> Vec<Vec<T>> {
    if items.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(items.len().div_ceil(size));
    while items.len() > size {
        let rest = items.split_off(size);
        out.push(std::mem::replace(&mut items, rest));
    }
    out.push(items);
    out
}

/// The default address of the listening sources: this machine only.
pub(crate) fn loopback() -> String {
    "127.0.0.1".into()
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
            registry.type_names(ComponentKind::Source),
            vec![
                "exec",
                "http",
                "multiport_syslog_tcp",
                "netcat",
                "netcat_udp",
                "seq",
                "spooldir",
                "stdin",
                "syslog_tcp",
                "syslog_udp",
                "taildir"
            ]
        );
        assert_eq!(
            registry.type_names(ComponentKind::Interceptor),
            vec![
                "host",
                "position",
                "regex_extractor",
                "regex_filter",
                "remove_header",
                "search_replace",
                "static",
                "timestamp",
                "uuid"
            ]
        );
    }

    #[test]
    fn chunks_keep_order() {
        let parts = chunks((0..7).collect(), 3);
        assert_eq!(parts, vec![vec![0, 1, 2], vec![3, 4, 5], vec![6]]);
        assert!(chunks(Vec::<u8>::new(), 3).is_empty());
    }
}
