//! `agent producer-perf-test` and `agent consumer-perf-test`: Kafka's
//! `kafka-producer-perf-test.sh` and `kafka-consumer-perf-test.sh`, with their flags and their
//! output, on librdkafka.
//!
//! This file holds what both tools share: reading properties files and `key=value` flags,
//! librdkafka's statistics printed as Kafka's metrics (`--print-metrics`), Java's number
//! format and small helpers. The producer is in `producer.rs`, the consumer in `consumer.rs`.

use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use ferry_kafka::client::properties::ClientProperties;

use super::split_property;

mod consumer;
mod producer;

pub use consumer::{ConsumerPerfArgs, consume};
pub use producer::{ProducerPerfArgs, produce};

/// Properties Kafka's tools set themselves (Java classes): taken and left alone.
const JAVA_SERDES: [&str; 4] = [
    "key.serializer",
    "value.serializer",
    "key.deserializer",
    "value.deserializer",
];

/// Reads a properties file as the tools do, also taking `bootstrap.servers` from it (which
/// the cluster tools refuse); gives the properties and the servers.
fn read_properties(path: &Path) -> anyhow::Result<(ClientProperties, Option<String>)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{}: cannot read the file", path.display()))?;
    let parsed = ferry_core::properties::parse(&text)
        .map_err(|e| anyhow::anyhow!("{}:{}: {}", path.display(), e.line, e.message))?;
    let servers = parsed
        .iter()
        .rev()
        .find(|p| p.key == "bootstrap.servers")
        .map(|p| p.value.clone());
    let skipped: Vec<usize> = parsed
        .iter()
        .filter(|p| p.key == "bootstrap.servers" || JAVA_SERDES.contains(&p.key.as_str()))
        .map(|p| p.line)
        .collect();
    // Those lines are blanked, so that the others keep their numbers in the messages.
    let kept: Vec<&str> = text
        .lines()
        .enumerate()
        .map(|(i, line)| if skipped.contains(&(i + 1)) { "" } else { line })
        .collect();
    let properties = ClientProperties::parse(path, &kept.join("\n"))?;
    Ok((properties, servers))
}

/// The `key=value` flags as checked client properties (security settings such as
/// `sasl.jaas.config` translated as in a file), and `bootstrap.servers` if among them.
fn flag_properties(
    flag: &str,
    pairs: &[String],
) -> anyhow::Result<(ClientProperties, Option<String>)> {
    let mut servers = None;
    let mut lines = Vec::new();
    for pair in pairs {
        let (key, value) = split_property(pair).with_context(|| flag.to_owned())?;
        if key == "bootstrap.servers" {
            servers = Some(value.to_owned());
        } else if !JAVA_SERDES.contains(&key) {
            // As a properties line: backslashes stay themselves.
            lines.push(format!("{key}={}", value.replace('\\', "\\\\")));
        } else {
            lines.push(String::new());
        }
    }
    let properties = ClientProperties::parse(Path::new(flag), &lines.join("\n")).map_err(|e| {
        let item = e
            .line
            .and_then(|l| pairs.get(l - 1))
            .map(|pair| format!(" `{pair}`"))
            .unwrap_or_default();
        anyhow::anyhow!("{flag}{item}: {}", e.message)
    })?;
    Ok((properties, servers))
}

/// Statistics of librdkafka, kept for `--print-metrics`.
#[derive(Default)]
struct Metrics {
    /// The latest statistics (JSON) and when they came.
    latest: Mutex<Option<(Instant, Vec<u8>)>>,
}

impl Metrics {
    fn keep(&self, statistics: &[u8]) {
        let mut latest = self.latest.lock().unwrap_or_else(|e| e.into_inner());
        *latest = Some((Instant::now(), statistics.to_vec()));
    }

    /// Statistics that came after `after`, waiting for them up to `patience` while `poll`
    /// serves the client's events.
    fn after(&self, after: Instant, patience: Duration, mut poll: impl FnMut()) -> Option<Vec<u8>> {
        let deadline = Instant::now() + patience;
        loop {
            {
                let latest = self.latest.lock().unwrap_or_else(|e| e.into_inner());
                if let Some((at, json)) = latest.as_ref()
                    && *at >= after
                {
                    return Some(json.clone());
                }
            }
            if Instant::now() >= deadline {
                let latest = self.latest.lock().unwrap_or_else(|e| e.into_inner());
                return latest.as_ref().map(|(_, json)| json.clone());
            }
            poll();
        }
    }
}

/// The statistics interval asked of librdkafka for `--print-metrics`.
const STATISTICS_INTERVAL_MS: &str = "500";

/// Prints librdkafka's statistics as Kafka's tools print their metrics: a `Metric Name` /
/// `Value` table, one `group:name:{tags}` line per number (`rdkafka` for the client,
/// `rdkafka-broker`, `rdkafka-topic` and `rdkafka-partition` for the parts).
fn print_metrics(out: &mut impl Write, statistics: Option<Vec<u8>>) -> anyhow::Result<()> {
    let Some(json) = statistics else {
        bail!("--print-metrics: librdkafka gave no statistics");
    };
    let value: serde_json::Value =
        serde_json::from_slice(&json).context("--print-metrics: librdkafka's statistics")?;
    let mut rows: Vec<(String, String)> = Vec::new();
    let client_tag = format!(
        "client-id={}",
        value
            .get("client_id")
            .and_then(|v| v.as_str())
            .unwrap_or("")
    );
    if let Some(top) = value.as_object() {
        for (key, v) in top {
            match key.as_str() {
                "brokers" => each_part(v, |name, part| {
                    flatten(
                        part,
                        "rdkafka-broker",
                        "",
                        &format!("broker={name}"),
                        &mut rows,
                    );
                }),
                "topics" => each_part(v, |topic, part| {
                    if let Some(fields) = part.as_object() {
                        for (k, f) in fields {
                            if k == "partitions" {
                                each_part(f, |p, partition| {
                                    flatten(
                                        partition,
                                        "rdkafka-partition",
                                        "",
                                        &format!("topic={topic}, partition={p}"),
                                        &mut rows,
                                    );
                                });
                            } else {
                                flatten(
                                    f,
                                    "rdkafka-topic",
                                    k,
                                    &format!("topic={topic}"),
                                    &mut rows,
                                );
                            }
                        }
                    }
                }),
                _ => flatten(v, "rdkafka", key, &client_tag, &mut rows),
            }
        }
    }
    rows.sort();
    let width = rows.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    writeln!(out)?;
    writeln!(out, "{:<width$}   Value", "Metric Name")?;
    for (name, value) in rows {
        writeln!(out, "{name:<width$} : {value}")?;
    }
    Ok(())
}

/// Calls `f` with each entry of a JSON object.
fn each_part(value: &serde_json::Value, mut f: impl FnMut(&str, &serde_json::Value)) {
    if let Some(parts) = value.as_object() {
        for (name, part) in parts {
            f(name, part);
        }
    }
}

/// The numbers of `value` as rows `group:path:{tags}`; nested objects join their keys with `.`.
fn flatten(
    value: &serde_json::Value,
    group: &str,
    path: &str,
    tags: &str,
    rows: &mut Vec<(String, String)>,
) {
    match value {
        serde_json::Value::Number(n) => {
            if let Some(x) = n.as_f64() {
                rows.push((format!("{group}:{path}:{{{tags}}}"), format!("{x:.3}")));
            }
        }
        serde_json::Value::Object(fields) => {
            for (k, v) in fields {
                let path = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                flatten(v, group, &path, tags, rows);
            }
        }
        _ => {}
    }
}

/// `x` as Java's `%.Nf` prints it (`Infinity`, `NaN` for what a division by zero gives).
fn java_fixed(x: f64, decimals: usize) -> String {
    if x.is_nan() {
        "NaN".into()
    } else if x.is_infinite() {
        if x > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else {
        format!("{x:.decimals$}")
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A small, fast pseudo-random generator (xorshift64*), seeded from the clock: payload
/// letters and the pick among the file's payloads need no better.
struct Random(u64);

impl Random {
    fn seeded() -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Random((nanos ^ u64::from(std::process::id()) << 32) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn statistics_print_as_a_metrics_table() {
        let json = br#"{"client_id":"c1","txmsgs":20,"name":"x",
            "brokers":{"b:1/1":{"rtt":{"avg":120}}},
            "topics":{"t":{"batchsize":{"avg":5},"partitions":{"0":{"txmsgs":20}}}}}"#;
        let mut out = Vec::new();
        print_metrics(&mut out, Some(json.to_vec())).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("Metric Name"), "{text}");
        assert!(text.contains("rdkafka:txmsgs:{client-id=c1} "), "{text}");
        assert!(
            text.contains("rdkafka-broker:rtt.avg:{broker=b:1/1}"),
            "{text}"
        );
        assert!(
            text.contains("rdkafka-topic:batchsize.avg:{topic=t}"),
            "{text}"
        );
        assert!(
            text.contains("rdkafka-partition:txmsgs:{topic=t, partition=0} : 20.000"),
            "{text}"
        );
        assert!(print_metrics(&mut Vec::new(), None).is_err());
    }
}
