//! The agent's Kafka components with other Kafka clients: records the `kafka` sink writes
//! (exactly-once, headers included) are read by kcat and by Python confluent-kafka; records
//! those clients produce are consumed by the `kafka` source, headers included.
//!
//! kcat is skipped when absent unless `FERRY_REQUIRE_KCAT=1`; Python runs with `$PYTHON`
//! (the test virtualenv `scripts/test` makes) and is skipped when it is unset unless
//! `FERRY_REQUIRE_KCAT=1` (set by `scripts/test`, where both are provisioned).

#![allow(clippy::unwrap_used)]

use crate::harness;

use std::process::Command;
use std::time::Duration;

use crate::harness::{Agent, kcat_available, python, read_dir_concat, wait_until};

/// An agent running only the bundled broker; returns it and its address.
fn broker(dir: &std::path::Path) -> (Agent, String) {
    harness::broker_agent(dir, 2)
}

#[test]
fn sink_records_read_by_kcat_and_python_with_headers() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, bootstrap) = broker(&dir.path().join("b"));
    let agent_dir = dir.path().join("a");
    std::fs::create_dir_all(&agent_dir).unwrap();
    let config = format!(
        "\
agent:
  data_dir: ./state
sources:
  numbers:
    type: seq
    channels: [durable]
    batch_size: 50
    total_events: 500
    interceptors:
      - {{ type: static, key: app, value: web }}
channels:
  durable:
    type: file
    transaction_capacity: 100
sinks:
  to_kafka:
    type: kafka
    channel: durable
    batch_size: 100
    bootstrap_servers: {bootstrap}
    topic: interop
    delivery: exactly_once
"
    );
    let mut agent = Agent::start(&agent_dir, &config);
    let status = agent.wait(Duration::from_secs(120));
    assert!(status.success(), "{status:?}\n{}", agent.log());

    if kcat_available() {
        let out = Command::new("kcat")
            .args(["-b", &bootstrap, "-C", "-t", "interop", "-e", "-q"])
            .args(["-X", "isolation.level=read_committed", "-f", "%h|%s\n"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        let mut bodies: Vec<u64> = text
            .lines()
            .map(|l| {
                let (headers, body) = l.split_once('|').unwrap();
                assert!(
                    headers.contains("app=web"),
                    "kcat shows headers {headers:?}"
                );
                body.parse().unwrap()
            })
            .collect();
        bodies.sort_unstable();
        assert_eq!(bodies, (0..500).collect::<Vec<u64>>());
    }
    if let Some(python) = python() {
        let script = r#"
import sys
from confluent_kafka import Consumer
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": "py", "auto.offset.reset": "earliest",
              "isolation.level": "read_committed", "enable.partition.eof": True})
c.subscribe(["interop"])
eof, seen = set(), []
while len(eof) < 2:
    m = c.poll(10)
    if m is None:
        break
    if m.error():
        eof.add(m.partition())
        continue
    assert dict(m.headers() or [])["app"] == b"web", m.headers()
    seen.append(int(m.value()))
c.close()
assert sorted(seen) == list(range(500)), (len(seen), sorted(seen)[:5])
print("ok", len(seen))
"#;
        let out = Command::new(python)
            .args(["-c", script, &bootstrap])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn source_consumes_records_of_kcat_and_python_with_headers() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, bootstrap) = broker(&dir.path().join("b"));
    let mut expected = Vec::new();
    if kcat_available() {
        let lines: String = (0..100).map(|i| format!("kcat-{i}\n")).collect();
        let mut child = Command::new("kcat")
            .args(["-b", &bootstrap, "-P", "-t", "incoming", "-H", "via=kcat"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), lines.as_bytes()).unwrap();
        assert!(child.wait().unwrap().success());
        expected.extend((0..100).map(|i| (format!("kcat-{i}"), "kcat")));
    }
    if let Some(python) = python() {
        let script = r#"
import sys
from confluent_kafka import Producer
p = Producer({"bootstrap.servers": sys.argv[1]})
for i in range(100):
    p.produce("incoming", value=f"python-{i}".encode(), key=f"k{i}".encode(), headers=[("via", b"python")])
assert p.flush(30) == 0
"#;
        let out = Command::new(python)
            .args(["-c", script, &bootstrap])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        expected.extend((0..100).map(|i| (format!("python-{i}"), "python")));
    }
    if expected.is_empty() {
        return;
    }
    let agent_dir = dir.path().join("a");
    std::fs::create_dir_all(&agent_dir).unwrap();
    let config = format!(
        "\
agent:
  data_dir: ./state
sources:
  from_kafka:
    type: kafka
    channels: [durable]
    bootstrap_servers: {bootstrap}
    topics: [incoming]
    batch_duration: 100ms
channels:
  durable:
    type: file
sinks:
  files:
    type: file_roll
    channel: durable
    directory: ./out
    serializer: header_and_text
    roll_interval: 1s
"
    );
    let mut agent = Agent::start(&agent_dir, &config);
    let out = agent_dir.join("out");
    wait_until(Duration::from_secs(60), "the records in the output", || {
        String::from_utf8_lossy(&read_dir_concat(&out))
            .lines()
            .count()
            >= expected.len()
    });
    agent.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(agent.wait(Duration::from_secs(30)).success());
    let text = String::from_utf8(read_dir_concat(&out)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), expected.len(), "{text}");
    for (body, via) in &expected {
        let line = lines
            .iter()
            .find(|l| l.ends_with(&format!(" {body}")))
            .unwrap_or_else(|| panic!("{body} is missing:\n{text}"));
        assert!(line.contains(&format!("via={via}")), "{line}");
        assert!(
            line.contains("topic=incoming") && line.contains("offset="),
            "{line}"
        );
        if *via == "python" {
            let n = &body["python-".len()..];
            assert!(line.contains(&format!("key=k{n}")), "{line}");
        }
    }
}
