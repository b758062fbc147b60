//! End to end: the agent's HTTP server on `agent.http`, scraped while a real pipeline runs.
//! `/metrics` is read by the Prometheus project's own Python parser, `/metrics.json` checked
//! against Flume's JSON reporting layout, and `/health` watched while a sink's destination
//! goes down and comes back.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::harness;

use crate::harness::{Agent, http_get as get, http_server, python, wait_until};

fn json(address: &str, path: &str) -> (u16, serde_json::Value) {
    let (status, body) = get(address, path);
    (status, serde_json::from_str(&body).unwrap())
}

/// The address the agent logged for its HTTP server.
fn http_address(agent: &Agent) -> String {
    let mut address = None;
    wait_until(Duration::from_secs(30), "the HTTP server to listen", || {
        address = agent
            .log()
            .lines()
            .find(|l| l.contains("HTTP server listening"))
            .and_then(|l| l.split("address=").nth(1))
            .map(|a| a.split_whitespace().next().unwrap().to_owned());
        address.is_some()
    });
    address.unwrap()
}

/// Samples of `/metrics` as the Prometheus Python client's OpenMetrics parser reads them:
/// sample name → component name → value. `None` without Python.
fn scrape(address: &str) -> Option<BTreeMap<String, BTreeMap<String, f64>>> {
    let python = python()?;
    let (status, text) = get(address, "/metrics");
    assert_eq!(status, 200);
    let script = r#"
import json, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
out = {}
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        out.setdefault(s.name, {})[s.labels["name"]] = s.value
        assert s.labels["type"], s
print(json.dumps(out))
"#;
    let mut child = Command::new(python)
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the Prometheus parser refused /metrics: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(serde_json::from_slice(&out.stdout).unwrap())
}

fn value(samples: &BTreeMap<String, BTreeMap<String, f64>>, sample: &str, name: &str) -> f64 {
    samples
        .get(sample)
        .and_then(|by_name| by_name.get(name))
        .copied()
        .unwrap_or_else(|| panic!("no sample {sample}{{name=\"{name}\"}} in {samples:?}"))
}

/// Every key Flume's JSON reporting shows for each kind of component.
const FLUME_KEYS: [(&str, &[&str]); 3] = [
    (
        "SOURCE",
        &[
            "EventReceivedCount",
            "EventAcceptedCount",
            "AppendBatchReceivedCount",
            "AppendBatchAcceptedCount",
            "ChannelWriteFail",
            "EventReadFail",
            "StartTime",
            "StopTime",
            "Type",
        ],
    ),
    (
        "CHANNEL",
        &[
            "ChannelSize",
            "ChannelCapacity",
            "ChannelFillPercentage",
            "EventPutAttemptCount",
            "EventPutSuccessCount",
            "EventTakeAttemptCount",
            "EventTakeSuccessCount",
            "RollbackCount",
            "StartTime",
            "StopTime",
            "Type",
        ],
    ),
    (
        "SINK",
        &[
            "BatchCompleteCount",
            "BatchEmptyCount",
            "BatchUnderflowCount",
            "ConnectionCreatedCount",
            "ConnectionClosedCount",
            "ConnectionFailedCount",
            "EventDrainAttemptCount",
            "EventDrainSuccessCount",
            "EventWriteFail",
            "ChannelReadFail",
            "StartTime",
            "StopTime",
            "Type",
        ],
    ),
];

#[test]
fn metrics_count_every_event_and_health_follows_a_sink_destination() {
    // The destination refuses everything until `up` is set.
    let up = Arc::new(AtomicBool::new(false));
    let (port, received) = {
        let up = Arc::clone(&up);
        http_server(
            move |_| if up.load(Ordering::SeqCst) { 200 } else { 503 },
            Duration::ZERO,
        )
    };
    let dir = tempfile::tempdir().unwrap();
    // 1000 numbers; the filter drops those ending in 7 (100 of them).
    let config = format!(
        r#"
agent:
  data_dir: ./state
  http: 127.0.0.1:0
  unhealthy_after: 1s
sources:
  numbers:
    type: seq
    channels: [buffer]
    batch_size: 50
    total_events: 1000
    interceptors:
      - {{ type: regex_filter, regex: "7$", exclude_events: true }}
channels:
  buffer:
    type: memory
    capacity: 2000
    transaction_capacity: 100
sinks:
  out:
    type: http
    channel: buffer
    batch_size: 100
    endpoint: http://127.0.0.1:{port}/events
"#
    );
    let mut agent = Agent::start(dir.path(), &config);
    let address = http_address(&agent);

    // The destination is down: once the sink has failed for a second, /health names it.
    wait_until(Duration::from_secs(20), "/health to answer 503", || {
        get(&address, "/health").0 == 503
    });
    let (_, health) = json(&address, "/health");
    let failing = health["failing"].as_array().unwrap();
    assert_eq!(failing.len(), 1, "{health}");
    assert_eq!(failing[0]["component"], "SINK.out", "{health}");
    assert!(
        failing[0]["error"].as_str().unwrap().contains("503"),
        "{health}"
    );
    assert!(failing[0]["consecutive_failures"].as_u64().unwrap() >= 1);

    // During the run: the events wait in the channel, the sink's failures are counted.
    if let Some(samples) = scrape(&address) {
        assert_eq!(value(&samples, "ferry_channel_size", "buffer"), 900.0);
        let oldest = value(
            &samples,
            "ferry_channel_oldest_event_age_milliseconds",
            "buffer",
        );
        assert!(oldest > 0.0, "the events wait while the sink is down");
        assert_eq!(value(&samples, "ferry_channel_capacity", "buffer"), 2000.0);
        assert_eq!(
            value(&samples, "ferry_channel_fill_percentage", "buffer"),
            45.0
        );
        assert!(value(&samples, "ferry_sink_event_write_fail_total", "out") >= 100.0);
        assert!(value(&samples, "ferry_sink_consecutive_failures", "out") >= 1.0);
        assert_eq!(
            value(&samples, "ferry_sink_event_drain_success_total", "out"),
            0.0
        );
    }
    let (_, flume) = json(&address, "/metrics.json");
    assert!(
        flume["SINK.out"]["LastError"]
            .as_str()
            .unwrap()
            .contains("503"),
        "{flume}"
    );

    // The destination comes back: everything is delivered and /health is 200 again.
    up.store(true, Ordering::SeqCst);
    wait_until(Duration::from_secs(20), "every event delivered", || {
        received.bodies.lock().unwrap().len() == 900
    });
    wait_until(Duration::from_secs(10), "/health to answer 200", || {
        get(&address, "/health").0 == 200
    });

    // After the run: every counter agrees with what was sent and delivered.
    if let Some(samples) = scrape(&address) {
        let source = |s: &str| value(&samples, &format!("ferry_source_{s}_total"), "numbers");
        let channel = |s: &str| value(&samples, &format!("ferry_channel_{s}_total"), "buffer");
        let sink = |s: &str| value(&samples, &format!("ferry_sink_{s}_total"), "out");
        assert_eq!(source("event_received"), 1000.0);
        assert_eq!(source("event_filtered"), 100.0);
        assert_eq!(source("event_accepted"), 900.0);
        assert_eq!(source("append_batch_received"), 20.0);
        assert_eq!(source("append_batch_accepted"), 20.0);
        assert_eq!(source("channel_write_fail"), 0.0);
        assert_eq!(channel("event_put_attempt"), 900.0);
        assert_eq!(channel("event_put_success"), 900.0);
        assert_eq!(channel("event_take_success"), 900.0);
        assert!(channel("rollback") >= 1.0, "failed deliveries roll back");
        assert_eq!(sink("event_drain_success"), 900.0);
        assert_eq!(
            sink("event_drain_attempt"),
            900.0 + sink("event_write_fail"),
            "every failed event was attempted again"
        );
        assert!(source("event_accepted_bytes") > 0.0);
        assert_eq!(
            sink("event_drain_success_bytes"),
            source("event_accepted_bytes"),
            "bytes in = bytes out"
        );
        assert_eq!(sink("batch_complete"), 9.0);
        assert_eq!(sink("connection_created"), 1.0);
        // The latency histograms: one observation per batch put, per take committed, per
        // delivered flush.
        let count = |sample: &str, name: &str| value(&samples, sample, name);
        assert_eq!(
            count("ferry_channel_put_latency_seconds_count", "buffer"),
            source("append_batch_accepted")
        );
        assert_eq!(
            count(
                "ferry_channel_take_to_commit_latency_seconds_count",
                "buffer"
            ),
            sink("batch_complete") + sink("batch_underflow")
        );
        assert!(count("ferry_sink_delivery_latency_seconds_count", "out") >= 1.0);
        assert!(count("ferry_channel_take_to_commit_latency_seconds_sum", "buffer") > 0.0);
        assert_eq!(value(&samples, "ferry_channel_size", "buffer"), 0.0);
        assert_eq!(
            value(
                &samples,
                "ferry_channel_oldest_event_age_milliseconds",
                "buffer"
            ),
            0.0
        );
        assert_eq!(
            value(&samples, "ferry_sink_consecutive_failures", "out"),
            0.0
        );
    }

    // /metrics.json: Flume's layout, every value a string.
    let (status, flume) = json(&address, "/metrics.json");
    assert_eq!(status, 200);
    let flume = flume.as_object().unwrap();
    assert_eq!(
        flume.keys().collect::<Vec<_>>(),
        ["CHANNEL.buffer", "SINK.out", "SOURCE.numbers"]
    );
    for (key, component) in flume {
        let component = component.as_object().unwrap();
        let kind = key.split('.').next().unwrap();
        let expected = FLUME_KEYS.iter().find(|(k, _)| *k == kind).unwrap().1;
        for name in expected {
            assert!(
                component.contains_key(*name),
                "{key} lacks {name}: {component:?}"
            );
        }
        for (name, value) in component {
            assert!(value.is_string(), "{key}.{name} is not a string: {value}");
        }
        assert_eq!(component["Type"], kind);
        let start: u64 = component["StartTime"].as_str().unwrap().parse().unwrap();
        assert!(start > 1_600_000_000_000, "{key}: StartTime {start}");
    }
    assert_eq!(flume["CHANNEL.buffer"]["EventPutSuccessCount"], "900");
    assert_eq!(flume["CHANNEL.buffer"]["ChannelFillPercentage"], "0.0");
    assert_eq!(flume["SOURCE.numbers"]["EventAcceptedCount"], "900");
    // The seq source has finished, so the pipeline drained and stopped (the server stays up
    // until the agent is told to stop).
    for key in ["SOURCE.numbers", "CHANNEL.buffer", "SINK.out"] {
        assert_ne!(flume[key]["StopTime"], "0", "{key}");
    }
    assert_eq!(flume["SINK.out"]["ConnectionClosedCount"], "1");
    assert_eq!(flume["SINK.out"]["EventDrainSuccessCount"], "900");
    assert_eq!(flume["SINK.out"]["LastError"], "");

    // /api/pipeline: the components for a console.
    let (status, api) = json(&address, "/api/pipeline");
    assert_eq!(status, 200);
    let components = api["components"].as_array().unwrap();
    let sink = components.iter().find(|c| c["name"] == "out").unwrap();
    assert_eq!(
        (&sink["kind"], &sink["type"]),
        (&"sink".into(), &"http".into())
    );
    assert_eq!(sink["counters"]["EventDrainSuccessCount"], 900);
    let channel = components.iter().find(|c| c["kind"] == "channel").unwrap();
    assert_eq!(channel["type"], "memory");
    assert_eq!(channel["fill_percentage"], 0.0);

    // One line per component start and stop; the server stops with the agent.
    agent.signal(Signal::SIGTERM);
    let status = agent.wait(Duration::from_secs(30));
    let log = agent.log();
    assert!(status.success(), "{status:?}\n{log}");
    for line in [
        "source started",
        "source stopped",
        "channel started",
        "channel stopped",
        "sink started",
        "sink stopped",
        "HTTP server stopped",
    ] {
        assert!(log.contains(line), "no `{line}` in:\n{log}");
    }
    assert!(!log.contains('\u{1b}'), "no colours when not on a terminal");
}

#[test]
fn json_logs_are_one_object_per_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = "agent:\n  data_dir: ./state\nsources:\n  numbers:\n    type: seq\n    channels: [buffer]\n    total_events: 10\nchannels:\n  buffer:\n    type: memory\nsinks:\n  out:\n    type: null\n    channel: buffer\n";
    std::fs::write(dir.path().join("pipeline.yaml"), config).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_agent"))
        .args(["--log-format", "json", "run", "pipeline.yaml"])
        .current_dir(dir.path())
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let log = String::from_utf8(out.stderr).unwrap();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l["fields"]["message"] == "sink stopped" && l["fields"]["sink"] == "out"),
        "{log}"
    );
}

/// The bundled broker's state at `/api/broker` and in `/metrics` of the agent that runs it:
/// 1,000 events from `seq` into a 3-partition topic, a group that consumed 10 of them, its lag
/// the 990 left; and `agent broker` with its own `http` serving the same.
#[test]
fn the_bundled_brokers_partitions_groups_and_lag_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let port = harness::free_port();
    let config = format!(
        "\
agent:
  data_dir: ./data
  http: 127.0.0.1:0
broker:
  listen: 127.0.0.1:{port}
  data_dir: ./broker
  num_partitions: 3
sources:
  numbers:
    type: seq
    channels: [buffer]
    batch_size: 100
    total_events: 1000
channels:
  buffer:
    type: memory
    capacity: 1000
    transaction_capacity: 100
sinks:
  to_kafka:
    type: kafka
    channel: buffer
    bootstrap_servers: 127.0.0.1:{port}
    topic: numbers
"
    );
    let agent = Agent::start(dir.path(), &config);
    let address = http_address(&agent);
    let high_watermarks = |stats: &serde_json::Value| -> i64 {
        stats["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["topic"] == "numbers")
            .map(|p| p["high_watermark"].as_i64().unwrap())
            .sum()
    };
    wait_until(
        Duration::from_secs(60),
        "1,000 records in the topic",
        || high_watermarks(&json(&address, "/api/broker").1) == 1000,
    );
    consume_as_readers(port, "numbers", 10);
    let lag = |stats: &serde_json::Value| -> Option<i64> {
        let group = stats["groups"]
            .as_array()?
            .iter()
            .find(|g| g["group"] == "readers")?;
        Some(
            group["offsets"]
                .as_array()?
                .iter()
                .map(|o| o["lag"].as_i64().unwrap_or(0))
                .sum(),
        )
    };
    // Partitions without a committed offset have no lag: the 990 are counted once all three
    // have one, which the consumer's ten records need not give; what is committed is exact.
    let (_, stats) = json(&address, "/api/broker");
    let group = stats["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["group"] == "readers")
        .unwrap_or_else(|| panic!("no group `readers` in {stats}"));
    let committed: i64 = group["offsets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["committed_offset"].as_i64().unwrap())
        .sum();
    assert_eq!(committed, 10, "{group}");
    let partitions_with_offsets = group["offsets"].as_array().unwrap().len();
    if partitions_with_offsets == 3 {
        assert_eq!(lag(&stats), Some(990), "{group}");
    }
    let (status, text) = get(&address, "/metrics");
    assert_eq!(status, 200);
    for family in [
        "kafka_high_watermark{",
        "kafka_group_lag{",
        "kafka_requests_total{",
        "ferry_sink_event_drain_success_total{",
    ] {
        assert!(text.contains(family), "no {family} in /metrics:\n{text}");
    }
    drop(agent);

    // `agent broker` alone, on the same data: its own `http` option.
    let broker_dir = dir.path().join("alone");
    std::fs::create_dir_all(&broker_dir).unwrap();
    let file = broker_dir.join("broker.yaml");
    std::fs::write(
        &file,
        format!(
            "listen: 127.0.0.1:{}\ndata_dir: {}\nhttp: 127.0.0.1:0\n",
            harness::free_port(),
            dir.path().join("broker").display()
        ),
    )
    .unwrap();
    let log = broker_dir.join("agent.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_agent"))
        .args(["broker", "--config"])
        .arg(&file)
        .env("NO_COLOR", "1")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut alone = None;
    wait_until(
        Duration::from_secs(30),
        "agent broker's HTTP server",
        || {
            alone = std::fs::read_to_string(&log)
                .unwrap_or_default()
                .lines()
                .find(|l| l.contains("HTTP server listening"))
                .and_then(|l| l.split("address=").nth(1))
                .map(|a| a.split_whitespace().next().unwrap().to_owned());
            alone.is_some()
        },
    );
    let alone = alone.unwrap();
    let (status, stats) = json(&alone, "/api/broker");
    assert_eq!(status, 200);
    assert_eq!(high_watermarks(&stats), 1000, "{stats}");
    assert_eq!(get(&alone, "/health").0, 200);
    assert!(get(&alone, "/metrics").1.contains("kafka_log_size_bytes{"));
    let _ = child.kill();
    let _ = child.wait();
}

/// `agent top` under tmux: it draws the pipeline of a running agent with a non-zero rate, and
/// `q` ends it.
#[test]
fn agent_top_shows_the_pipeline_and_its_rates_and_quits_on_q() {
    let found = Command::new("tmux").arg("-V").output().is_ok();
    assert!(
        found || !harness::clients_required(),
        "tmux is required but not installed"
    );
    if !found {
        eprintln!("tmux not installed: skipping");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = "\
agent:
  data_dir: ./data
  http: 127.0.0.1:0
sources:
  counter:
    type: seq
    channels: [buffer]
    batch_size: 100
channels:
  buffer:
    type: memory
    capacity: 10000
    transaction_capacity: 100
sinks:
  nowhere:
    type: null
    channel: buffer
";
    let agent = Agent::start(dir.path(), config);
    let address = http_address(&agent);
    let session = format!("ferry-top-{}", std::process::id());
    let tmux = |args: &[&str]| {
        Command::new("tmux")
            .args(args)
            .env_remove("TMUX")
            .output()
            .unwrap()
    };
    let started = tmux(&[
        "new-session",
        "-d",
        "-s",
        &session,
        "-x",
        "160",
        "-y",
        "40",
        &format!(
            "{} top --address {address} --interval 300ms",
            env!("CARGO_BIN_EXE_agent")
        ),
    ]);
    assert!(started.status.success(), "{started:?}");
    let screen = || {
        String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", &session]).stdout).into_owned()
    };
    let rate_of = |screen: &str, name: &str| -> Option<f64> {
        let line = screen
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(name))?;
        line.split_whitespace().nth(3)?.parse().ok()
    };
    wait_until(Duration::from_secs(30), "agent top to show a rate", || {
        let screen = screen();
        rate_of(&screen, "counter").is_some_and(|r| r > 0.0)
            && rate_of(&screen, "nowhere").is_some_and(|r| r > 0.0)
    });
    let shown = screen();
    assert!(shown.contains("agent top"), "{shown}");
    assert!(shown.contains("buffer"), "{shown}");
    assert!(tmux(&["send-keys", "-t", &session, "q"]).status.success());
    wait_until(Duration::from_secs(10), "agent top to quit on q", || {
        !tmux(&["has-session", "-t", &session]).status.success()
    });
    drop(agent);
}

/// `agent console-consumer` in group `readers`: reads `count` records of `topic` from the
/// beginning and commits them.
fn consume_as_readers(port: u16, topic: &str, count: usize) {
    let consumed = Command::new(env!("CARGO_BIN_EXE_agent"))
        .args(["console-consumer", "--bootstrap-server"])
        .arg(format!("127.0.0.1:{port}"))
        .args(["--topic", topic, "--group", "readers", "--from-beginning"])
        .args(["--max-messages", &count.to_string()])
        .output()
        .unwrap();
    assert!(consumed.status.success(), "{consumed:?}");
}

/// The number at the start of `text` (up to the next tag), written with `,` separators.
fn number(text: &str, page: &str) -> u64 {
    let shown = text.split('<').next().unwrap_or_default();
    shown
        .replace(',', "")
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("`{shown}` is not a number in the page:\n{page}"))
}

/// The web console in headless Chromium (Debian's `chromium`): a running agent with the bundled
/// broker, a topic of 3 partitions fed by a tailed file, and a consumer group that read only
/// some of it. The page, after its script ran, shows the topic, its partitions with their
/// offsets, the group with its lag, and the pipeline with non-zero rates; a screenshot goes to
/// `target/console.png`.
#[test]
fn the_web_console_shows_topics_partitions_groups_and_pipeline_rates_in_chromium() {
    if harness::chromium().is_none() {
        eprintln!("chromium not installed: skipping");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = harness::free_port();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let config = format!(
        "\
agent:
  data_dir: ./data
  http: 127.0.0.1:0
broker:
  listen: 127.0.0.1:{port}
  data_dir: ./broker
  num_partitions: 3
sources:
  app_logs:
    type: taildir
    channels: [buffer]
    filegroups:
      app: ./logs/*.log
channels:
  buffer:
    type: memory
    capacity: 10000
    transaction_capacity: 1000
sinks:
  to_kafka:
    type: kafka
    channel: buffer
    bootstrap_servers: 127.0.0.1:{port}
    topic: console-logs
"
    );
    let agent = Agent::start(dir.path(), &config);
    let address = http_address(&agent);
    // Lines keep coming while the page is open, so that its rates are not zero.
    let writing = Arc::new(AtomicBool::new(true));
    let writer = {
        let (writing, file) = (Arc::clone(&writing), dir.path().join("logs/app.log"));
        std::thread::spawn(move || {
            let mut n = 0;
            while writing.load(Ordering::SeqCst) {
                let mut out = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&file)
                    .unwrap();
                for _ in 0..50 {
                    writeln!(out, "line {n}").unwrap();
                    n += 1;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    wait_until(Duration::from_secs(60), "records in the topic", || {
        let (_, stats) = json(&address, "/api/broker");
        stats["partitions"]
            .as_array()
            .is_some_and(|p| p.iter().filter(|p| p["topic"] == "console-logs").count() == 3)
    });
    consume_as_readers(port, "console-logs", 20);

    let screenshot = harness::repo_root().join("target/console.png");
    let Some(dom) = harness::browse_console(&address, &screenshot, 6) else {
        return;
    };
    writing.store(false, Ordering::SeqCst);
    writer.join().unwrap();

    // What the script put in the page.
    assert!(
        dom.contains(r#"class="topic" data-topic="console-logs""#),
        "{dom}"
    );
    let partitions = dom
        .matches(r#"class="partition" data-topic="console-logs""#)
        .count();
    assert_eq!(partitions, 3, "{dom}");
    let high_watermarks: Vec<u64> = dom
        .split(r#"class="num high-watermark">"#)
        .skip(1)
        // The page's own script holds the same markup as a template.
        .filter(|rest| !rest.starts_with("${"))
        .map(|rest| number(rest, &dom))
        .collect();
    assert!(
        high_watermarks.iter().sum::<u64>() > 20,
        "{high_watermarks:?}"
    );
    let group = dom
        .split(r#"class="group" data-group="readers""#)
        .nth(1)
        .unwrap_or_else(|| panic!("no group in {dom}"));
    let lag: u64 = group
        .split(r#"class="num lag">"#)
        .nth(1)
        .map(|rest| number(rest, &dom))
        .unwrap();
    assert!(lag > 0, "{group}");
    for name in ["app_logs", "buffer", "to_kafka"] {
        let component = dom
            .split(&format!(r#"data-name="{name}""#))
            .nth(1)
            .unwrap_or_else(|| panic!("no {name} in {dom}"));
        let rate: u64 = component
            .split(r#"class="events-per-s">"#)
            .nth(1)
            .map(|rest| number(rest, &dom))
            .unwrap();
        assert!(rate > 0, "{name} shows no rate: {component}");
    }
    // The tailed file, with how far behind the source is, on the source and in /metrics.
    let source = dom.split(r#"data-name="app_logs""#).nth(1).unwrap();
    let source = source.split("</div>\n  </div>").next().unwrap_or(source);
    assert!(
        source.contains("app.log") && source.contains("B behind"),
        "{source}"
    );
    let (_, metrics) = get(&address, "/metrics");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("ferry_source_file_bytes_behind{") && l.contains("app.log")),
        "{metrics}"
    );
    assert!(
        std::fs::metadata(&screenshot).is_ok_and(|m| m.len() > 10_000),
        "no screenshot at {}",
        screenshot.display()
    );
    drop(agent);
}

/// `agent broker` alone in `dir`, on `port` (the same across restarts).
fn broker_on(dir: &Path, port: u16) -> Agent {
    std::fs::create_dir_all(dir).unwrap();
    let config = format!("broker:\n  listen: 127.0.0.1:{port}\n  data_dir: ./broker\n");
    let mut broker = Agent::start(dir, &config);
    broker.wait_listening(&format!("127.0.0.1:{port}"), "the broker");
    broker
}

/// The `agent` section of the `/health` tests' pipelines: a state directory, the HTTP server on
/// a free port, and a component unhealthy once it has failed for 3 s.
const HEALTH_AGENT: &str = "
agent:
  data_dir: ./state
  http: 127.0.0.1:0
  unhealthy_after: 3s
";

/// How many events the sink `out` of the agent at `address` delivered, from `/metrics.json`.
fn drained(address: &str) -> u64 {
    let (_, flume) = json(address, "/metrics.json");
    flume["SINK.out"]["EventDrainSuccessCount"]
        .as_str()
        .map_or(0, |n| n.parse::<u64>().unwrap())
}

/// Waits for `/health` at `address` to answer `status`, and asserts it did within `limit` of
/// `since`, when `what` happened (`limit_named`: the limit as the failure says it); prints how
/// long it took.
fn health_answers_within(
    address: &str,
    status: u16,
    since: Instant,
    what: &str,
    limit: Duration,
    limit_named: &str,
) {
    wait_until(
        Duration::from_secs(20),
        &format!("/health to answer {status}"),
        || get(address, "/health").0 == status,
    );
    let took = since.elapsed();
    println!("/health: {status} {took:?} after {what}");
    assert!(
        took <= limit,
        "/health answered {status} {took:?} after {what}, more than {limit_named}"
    );
}

/// `/health` at `address` answers 503 within `unhealthy_after` (3 s) + 5 s of `since`, when
/// `what` happened.
fn health_fails_within_8_s(address: &str, since: Instant, what: &str) {
    let limit = Duration::from_secs(3 + 5);
    health_answers_within(address, 503, since, what, limit, "unhealthy_after + 5 s");
}

/// `/health` at `address` answers 200 within 10 s of `since`, when `what` happened.
fn health_recovers_within_10_s(address: &str, since: Instant, what: &str) {
    let limit = Duration::from_secs(10);
    health_answers_within(address, 200, since, what, limit, "10 s");
}

/// `agent broker` in `broker/` of a temporary directory, on a free port (the same across
/// restarts), for the pipeline in `pipeline/` beside it.
struct BesideABroker {
    broker: Agent,
    port: u16,
    /// The broker's address.
    bootstrap: String,
    dir: tempfile::TempDir,
}

impl BesideABroker {
    fn start() -> BesideABroker {
        let dir = tempfile::tempdir().unwrap();
        let port = harness::free_port();
        BesideABroker {
            broker: broker_on(&dir.path().join("broker"), port),
            port,
            bootstrap: format!("127.0.0.1:{port}"),
            dir,
        }
    }

    /// An agent in `pipeline/` on [`HEALTH_AGENT`] and `components` (its sources, channels and
    /// sinks): the agent and its HTTP server's address.
    fn pipeline(&self, components: &str) -> (Agent, String) {
        let pipeline = self.dir.path().join("pipeline");
        std::fs::create_dir_all(&pipeline).unwrap();
        let agent = Agent::start(&pipeline, &format!("{HEALTH_AGENT}{components}"));
        let address = http_address(&agent);
        (agent, address)
    }

    /// Like [`Self::pipeline`], with a netcat source on a free port ([`netcat_source`]) before
    /// `rest` (its channels and sinks): once the source listens, the agent, its HTTP server's
    /// address and the source's port.
    fn netcat_pipeline(&self, rest: &str) -> (Agent, String, u16) {
        let lines_port = harness::free_port();
        let (mut agent, address) = self.pipeline(&format!("{}{rest}", netcat_source(lines_port)));
        agent.wait_listening(&format!("127.0.0.1:{lines_port}"), "the netcat source");
        (agent, address, lines_port)
    }

    /// SIGKILLs the broker under the agent at `address`, then runs `meanwhile`: `/health`
    /// answers 503 within `unhealthy_after` + 5 s of the kill, naming `component` (its Flume
    /// key) with the broker's address in its error. Then starts the broker again: `/health`
    /// answers 200 within 10 s of it listening. Returns the 503 answer.
    fn kill_and_restart(
        &mut self,
        address: &str,
        component: &str,
        meanwhile: impl FnOnce(),
    ) -> serde_json::Value {
        self.broker.signal(Signal::SIGKILL);
        self.broker.wait(Duration::from_secs(10));
        let killed = Instant::now();
        meanwhile();
        health_fails_within_8_s(address, killed, "the broker died");
        let (_, health) = json(address, "/health");
        let failing = failing_component(&health, component);
        assert!(
            failing["error"].as_str().unwrap().contains(&self.bootstrap),
            "the broker is not named: {health}"
        );

        self.broker = broker_on(&self.dir.path().join("broker"), self.port);
        let back = Instant::now();
        health_recovers_within_10_s(address, back, "the broker came back");
        health
    }
}

/// A kafka sink whose broker is SIGKILLed while events wait: librdkafka reports every broker
/// down at once, so `/health` fails within `unhealthy_after` and a few seconds, naming the
/// sink and the broker (before, it answered 200 until a record timed out, five minutes
/// later); with the broker back, `/health` is 200 within 10 s and every line is delivered.
#[test]
fn health_fails_within_seconds_of_a_dead_kafka_and_recovers_when_it_is_back() {
    let mut kafka = BesideABroker::start();
    let rest = format!(
        r#"channels:
  buffer:
    type: memory
    capacity: 10000
sinks:
  out:
    type: kafka
    channel: buffer
    bootstrap_servers: {}
    topic: health
"#,
        kafka.bootstrap
    );
    let (agent, address, lines_port) = kafka.netcat_pipeline(&rest);
    send_lines(lines_port, 0, 100);
    wait_until(Duration::from_secs(30), "the first lines delivered", || {
        scrape(&address)
            .is_some_and(|s| value(&s, "ferry_sink_event_drain_success_total", "out") >= 100.0)
    });
    assert_eq!(get(&address, "/health").0, 200);

    let health = kafka.kill_and_restart(&address, "SINK.out", || {
        send_lines(lines_port, 100, 200);
    });
    let failing = health["failing"].as_array().unwrap();
    assert_eq!(failing.len(), 1, "{health}");
    assert_eq!(failing[0]["component"], "SINK.out", "{health}");

    let consumed = harness::agent_ok(&[
        "console-consumer",
        "--bootstrap-server",
        &kafka.bootstrap,
        "--topic",
        "health",
        "--from-beginning",
        "--max-messages",
        "200",
        "--timeout-ms",
        "30000",
    ]);
    let mut lines: Vec<&str> = consumed.lines().collect();
    lines.sort_unstable();
    lines.dedup();
    assert_eq!(lines.len(), 200, "every line once at least: {consumed}");
    drop(agent);
    drop(kafka);
}

/// Sends lines `line-{from}` to `line-{to - 1}` to a netcat source on `port` and reads each
/// `OK`: a line is the source's once acknowledged.
fn send_lines(port: u16, from: usize, to: usize) {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    for i in from..to {
        writeln!(stream, "line-{i}").unwrap();
    }
    let mut acks = std::io::BufReader::new(stream);
    for _ in from..to {
        let mut ok = String::new();
        std::io::BufRead::read_line(&mut acks, &mut ok).unwrap();
        assert_eq!(ok, "OK\n");
    }
}

/// An HTTP endpoint on `listener` for the http sink's JSON batches: it holds each request
/// unanswered while `answer` is unset, then answers 200 and keeps the batch's bodies.
fn endpoint_on(
    listener: std::net::TcpListener,
    answer: Arc<AtomicBool>,
) -> Arc<Mutex<Vec<String>>> {
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&bodies);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let (bodies, answer) = (Arc::clone(&kept), Arc::clone(&answer));
            std::thread::spawn(move || {
                let mut writer = stream.try_clone().unwrap();
                let mut reader = std::io::BufReader::new(stream);
                loop {
                    let mut length = 0;
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if std::io::BufRead::read_line(&mut reader, &mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        if line == "\r\n" {
                            break;
                        }
                        if let Some((name, value)) = line.split_once(':')
                            && name.eq_ignore_ascii_case("content-length")
                        {
                            length = value.trim().parse().unwrap();
                        }
                    }
                    let mut body = vec![0; length];
                    std::io::Read::read_exact(&mut reader, &mut body).unwrap();
                    while !answer.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    let events: Vec<serde_json::Value> = serde_json::from_slice(&body).unwrap();
                    bodies.lock().unwrap().extend(
                        events
                            .iter()
                            .map(|e| e["body"].as_str().unwrap().to_owned()),
                    );
                    if writer
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    bodies
}

/// Whether `bodies` holds `line-0` .. `line-{n - 1}`, each at least once.
fn every_line(bodies: &Mutex<Vec<String>>, n: usize) -> bool {
    let bodies = bodies.lock().unwrap();
    let seen: std::collections::BTreeSet<&str> = bodies.iter().map(String::as_str).collect();
    (0..n).all(|i| seen.contains(format!("line-{i}").as_str()))
}

/// The one failing component of a 503 `/health`, by its Flume key; panics unless the answer
/// names it.
fn failing_component(health: &serde_json::Value, key: &str) -> serde_json::Value {
    health["failing"]
        .as_array()
        .unwrap_or_else(|| panic!("not failing: {health}"))
        .iter()
        .find(|f| f["component"] == key)
        .unwrap_or_else(|| panic!("{key} is not named: {health}"))
        .clone()
}

/// The `sources` section of a netcat source `lines` on `port` into the channel `buffer`.
fn netcat_source(port: u16) -> String {
    format!(
        r#"sources:
  lines:
    type: netcat
    channels: [buffer]
    bind: 127.0.0.1
    port: {port}
"#
    )
}

/// A netcat source on `lines_port` into a memory channel and an http sink to `endpoint`,
/// `extra` lines added to the sink.
fn netcat_to_http(lines_port: u16, endpoint: &str, extra: &str) -> String {
    format!(
        r#"{HEALTH_AGENT}{}channels:
  buffer:
    type: memory
    capacity: 10000
sinks:
  out:
    type: http
    channel: buffer
    batch_size: 50
    endpoint: {endpoint}
{extra}"#,
        netcat_source(lines_port)
    )
}

/// An agent in `dir` on [`netcat_to_http`]: once its netcat source listens, the agent and its
/// HTTP server's address.
fn start_netcat_to_http(
    dir: &Path,
    lines_port: u16,
    endpoint: &str,
    extra: &str,
) -> (Agent, String) {
    let mut agent = Agent::start(dir, &netcat_to_http(lines_port, endpoint, extra));
    let address = http_address(&agent);
    agent.wait_listening(&format!("127.0.0.1:{lines_port}"), "the netcat source");
    (agent, address)
}

/// Sends `line-0` .. `line-{n - 1}` to the netcat source on `lines_port`: `/health` at
/// `address` answers 503 within `unhealthy_after` + 5 s of the sending (`what`, to say so),
/// naming the sink `out`. The 503 answer and the sink's entry in it.
fn sink_fails_on_lines(
    address: &str,
    lines_port: u16,
    n: usize,
    what: &str,
) -> (serde_json::Value, serde_json::Value) {
    let sent = Instant::now();
    send_lines(lines_port, 0, n);
    health_fails_within_8_s(address, sent, what);
    let (_, health) = json(address, "/health");
    let sink = failing_component(&health, "SINK.out");
    (health, sink)
}

/// Once the endpoint is back (`what`, to say how): `/health` at `address` answers 200 within
/// 10 s, and `bodies` gets every one of the `n` lines.
fn recovers_and_delivers(address: &str, what: &str, bodies: &Mutex<Vec<String>>, n: usize) {
    let back = Instant::now();
    health_recovers_within_10_s(address, back, what);
    wait_until(Duration::from_secs(30), "every line delivered", || {
        every_line(bodies, n)
    });
}

/// An http sink whose endpoint refuses connections (nothing listens on its port): `/health`
/// answers 503 within `unhealthy_after` and a few seconds, naming the sink, the URL and since
/// when; once a server listens there, 200 within 10 s and every line is delivered.
#[test]
fn health_names_an_http_sink_whose_endpoint_refuses_connections_until_one_listens() {
    let dir = tempfile::tempdir().unwrap();
    let lines_port = harness::free_port();
    let endpoint_port = harness::free_port();
    let url = format!("http://127.0.0.1:{endpoint_port}/events");
    let (agent, address) = start_netcat_to_http(dir.path(), lines_port, &url, "");
    assert_eq!(get(&address, "/health").0, 200);
    let (health, sink) =
        sink_fails_on_lines(&address, lines_port, 200, "the first refused delivery");
    let error = sink["error"].as_str().unwrap();
    assert!(error.contains(&url), "the URL is not named: {health}");
    assert!(
        error.to_lowercase().contains("refused"),
        "not a refusal: {health}"
    );
    assert!(sink["since"].as_str().is_some(), "{health}");
    assert!(sink["failing_for_ms"].as_u64().unwrap() >= 3000, "{health}");

    let listener = std::net::TcpListener::bind(("127.0.0.1", endpoint_port)).unwrap();
    let bodies = endpoint_on(listener, Arc::new(AtomicBool::new(true)));
    recovers_and_delivers(&address, "the endpoint listened", &bodies, 200);
    drop(agent);
}

/// An http sink whose endpoint accepts the request and never answers (a request timeout
/// longer than the test): the delivery stays in flight, so `/health` answers 503 after
/// `unhealthy_after` naming the sink and how long; when the endpoint answers, 200 again and
/// every line delivered.
#[test]
fn health_fails_a_sink_whose_delivery_stays_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let lines_port = harness::free_port();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/events", listener.local_addr().unwrap());
    let answer = Arc::new(AtomicBool::new(false));
    let bodies = endpoint_on(listener, Arc::clone(&answer));
    let (agent, address) =
        start_netcat_to_http(dir.path(), lines_port, &url, "    request_timeout: 120s\n");
    let (health, sink) = sink_fails_on_lines(&address, lines_port, 100, "the lines were sent");
    let error = sink["error"].as_str().unwrap();
    assert!(
        error.starts_with("delivery in flight for ") && error.ends_with(" s"),
        "{health}"
    );
    assert!(sink["failing_for_ms"].as_u64().unwrap() >= 3000, "{health}");

    answer.store(true, Ordering::SeqCst);
    recovers_and_delivers(&address, "the endpoint answered", &bodies, 100);
    drop(agent);
}

/// A netcat source whose port is taken: its runs fail to bind and are retried, so `/health`
/// answers 503 naming the source, the address and the error; once the port is free the source
/// binds and `/health` is 200 without waiting for an event.
#[test]
fn health_names_a_source_that_cannot_bind_its_port_until_it_can() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let config = format!(
        r#"
agent:
  data_dir: ./state
  http: 127.0.0.1:0
  unhealthy_after: 2s
{}channels:
  buffer:
    type: memory
sinks:
  out:
    type: "null"
    channel: buffer
"#,
        netcat_source(port)
    );
    let agent = Agent::start(dir.path(), &config);
    let address = http_address(&agent);
    wait_until(Duration::from_secs(20), "/health to answer 503", || {
        get(&address, "/health").0 == 503
    });
    let (_, health) = json(&address, "/health");
    let source = failing_component(&health, "SOURCE.lines");
    let error = source["error"].as_str().unwrap();
    assert!(
        error.starts_with(&format!("binding 127.0.0.1:{port}: ")),
        "the address is not named: {health}"
    );
    assert!(error.to_lowercase().contains("in use"), "{health}");

    drop(taken);
    wait_until(Duration::from_secs(15), "/health to answer 200", || {
        get(&address, "/health").0 == 200
    });
    send_lines(port, 0, 10);
    drop(agent);
}

/// A kafka source whose broker is SIGKILLed: its consumer reports every broker down, so
/// `/health` answers 503 naming the source and the broker; with the broker back, 200 within
/// 10 s, and records produced then are consumed.
#[test]
fn health_fails_a_kafka_source_whose_broker_is_dead_and_recovers_when_it_is_back() {
    let mut kafka = BesideABroker::start();
    let bootstrap = kafka.bootstrap.clone();
    let produce = |from: usize, to: usize| {
        let lines: String = (from..to).map(|i| format!("record-{i}\n")).collect();
        let out = harness::agent_output(
            &[
                "console-producer",
                "--bootstrap-server",
                &bootstrap,
                "--topic",
                "incoming",
            ],
            Some(lines.as_bytes()),
        );
        assert!(out.status.success(), "{out:?}");
    };
    produce(0, 50);
    let (agent, address) = kafka.pipeline(&format!(
        r#"sources:
  in:
    type: kafka
    channels: [buffer]
    bootstrap_servers: {bootstrap}
    topics: [incoming]
    batch_size: 100
    batch_duration: 100ms
channels:
  buffer:
    type: memory
sinks:
  out:
    type: "null"
    channel: buffer
"#
    ));
    wait_until(
        Duration::from_secs(60),
        "the first records consumed",
        || drained(&address) >= 50,
    );
    assert_eq!(get(&address, "/health").0, 200);

    kafka.kill_and_restart(&address, "SOURCE.in", || {});
    produce(50, 100);
    wait_until(
        Duration::from_secs(60),
        "the later records consumed",
        || drained(&address) >= 100,
    );
    drop(agent);
    drop(kafka);
}

/// A kafka channel whose broker is SIGKILLed: its clients report every broker down to the
/// channel's metrics (past the metrics wrapper), so `/health` answers 503 naming the channel
/// and the broker; with the broker back, 200 within 10 s and lines flow through it again.
#[test]
fn health_fails_a_kafka_channel_whose_broker_is_dead_and_recovers_when_it_is_back() {
    let mut kafka = BesideABroker::start();
    let rest = format!(
        r#"channels:
  buffer:
    type: kafka
    bootstrap_servers: {}
    topic: channel-health
sinks:
  out:
    type: "null"
    channel: buffer
"#,
        kafka.bootstrap
    );
    let (agent, address, lines_port) = kafka.netcat_pipeline(&rest);
    send_lines(lines_port, 0, 50);
    wait_until(Duration::from_secs(60), "the first lines through", || {
        drained(&address) >= 50
    });
    assert_eq!(get(&address, "/health").0, 200);

    kafka.kill_and_restart(&address, "CHANNEL.buffer", || {});
    send_lines(lines_port, 50, 100);
    wait_until(Duration::from_secs(60), "the later lines through", || {
        drained(&address) >= 100
    });
    drop(agent);
    drop(kafka);
}
