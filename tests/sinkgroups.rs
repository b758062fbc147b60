//! End to end: sink groups (`sinkgroups:`) on the real binary, with `http` sinks posting to
//! local servers the tests control. Failover while the primary's destination answers 503 and
//! then recovers, through a file channel; load balancing across several sinks; and the
//! configuration errors `agent validate` reports for a bad group.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::harness;

use crate::harness::{Agent, Received, free_port, http_server, wait_until};

/// The bodies `received` accepted so far.
fn bodies(received: &Received) -> Vec<String> {
    received.bodies.lock().unwrap().clone()
}

/// A netcat client of the agent: sends lines and waits for each `OK`.
struct Lines {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Lines {
    fn connect(port: u16) -> Lines {
        wait_until(
            Duration::from_secs(30),
            "the netcat source to listen",
            || TcpStream::connect(("127.0.0.1", port)).is_ok(),
        );
        let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        Lines {
            writer: stream.try_clone().unwrap(),
            reader: BufReader::new(stream),
        }
    }

    /// Sends `e<i>` for every `i` of `range`; returns once the agent acknowledged them all.
    fn send(&mut self, range: std::ops::Range<usize>) {
        let mut payload = String::new();
        for i in range.clone() {
            payload.push_str(&format!("e{i}\n"));
        }
        self.writer.write_all(payload.as_bytes()).unwrap();
        let mut line = String::new();
        for _ in range {
            line.clear();
            self.reader.read_line(&mut line).unwrap();
            assert_eq!(line, "OK\n");
        }
    }
}

fn stop(mut agent: Agent) {
    agent.signal(Signal::SIGTERM);
    let status = agent.wait(Duration::from_secs(60));
    assert!(status.success(), "agent failed: {}", agent.log());
}

#[test]
fn failover_moves_to_the_standby_while_the_primary_fails_and_back_once_it_recovers() {
    // The primary's destination refuses everything until `up` is set.
    let up = Arc::new(AtomicBool::new(false));
    let (primary_port, primary) = {
        let up = Arc::clone(&up);
        http_server(
            move |_| if up.load(Ordering::SeqCst) { 200 } else { 503 },
            Duration::ZERO,
        )
    };
    let (standby_port, standby) = http_server(|_| 200, Duration::ZERO);
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        r#"
agent:
  data_dir: ./state
  http: 127.0.0.1:0
  unhealthy_after: 1s
sources:
  lines:
    type: netcat
    port: {port}
    channels: [durable]
channels:
  durable:
    type: file
    capacity: 100000
    transaction_capacity: 1000
sinks:
  primary:
    type: http
    channel: durable
    batch_size: 50
    endpoint: http://127.0.0.1:{primary_port}/
  standby:
    type: http
    channel: durable
    batch_size: 50
    endpoint: http://127.0.0.1:{standby_port}/
sinkgroups:
  g1:
    sinks: [standby, primary]
    processor:
      type: failover
      priority: {{ primary: 10, standby: 5 }}
      max_penalty: 2s
"#
    );
    let agent = Agent::start(dir.path(), &config);
    let mut lines = Lines::connect(port);

    // The primary is down: the standby takes every batch after the primary refused one.
    lines.send(0..300);
    wait_until(
        Duration::from_secs(30),
        "the standby to get 300 events",
        || standby.bodies.lock().unwrap().len() == 300,
    );
    assert!(
        primary.refused.load(Ordering::SeqCst) > 0,
        "the primary was tried"
    );
    assert!(bodies(&primary).is_empty());

    // Still down a few seconds later: tried again after its penalty, refused again, and the
    // standby still delivers.
    let refused = primary.refused.load(Ordering::SeqCst);
    let mut next = 300;
    wait_until(Duration::from_secs(30), "the primary to be retried", || {
        lines.send(next..next + 10);
        next += 10;
        std::thread::sleep(Duration::from_millis(100));
        primary.refused.load(Ordering::SeqCst) > refused
    });
    assert!(bodies(&primary).is_empty());
    // The group delivers through the standby: the agent is healthy, the primary degraded.
    let address = harness::http_address(&agent).expect("the HTTP server's address");
    let (status, health) = harness::http_get(&address, "/health");
    assert_eq!(status, 200, "{health}");
    assert!(
        health.contains("\"degraded\"") && health.contains("SINK.primary"),
        "{health}"
    );

    // The primary recovers: once its penalty is over it takes over again.
    up.store(true, Ordering::SeqCst);
    wait_until(
        Duration::from_secs(30),
        "the primary to deliver again",
        || {
            lines.send(next..next + 10);
            next += 10;
            std::thread::sleep(Duration::from_millis(100));
            !bodies(&primary).is_empty()
        },
    );
    let standby_before = bodies(&standby).len();
    let recovered = next;
    lines.send(recovered..recovered + 300);
    let total = recovered + 300;
    wait_until(Duration::from_secs(30), "every event to arrive", || {
        bodies(&primary).len() + bodies(&standby).len() >= total
    });
    assert_eq!(
        bodies(&standby).len(),
        standby_before,
        "the standby got nothing once the primary was back"
    );
    let primary_bodies = bodies(&primary);
    for i in recovered..total {
        assert!(
            primary_bodies.contains(&format!("e{i}")),
            "e{i} went to the primary"
        );
    }
    stop(agent);

    // Every event exactly once across the two destinations.
    let mut all = bodies(&primary);
    all.extend(bodies(&standby));
    assert_eq!(all.len(), total, "no event delivered twice");
    let distinct: BTreeSet<String> = all.into_iter().collect();
    let expected: BTreeSet<String> = (0..total).map(|i| format!("e{i}")).collect();
    assert_eq!(distinct, expected, "no event lost");
}

/// Runs `events` numbers from a seq source through a load-balancing group over `servers`
/// (their ports); returns once the agent drained and stopped.
fn load_balance(selector: &str, backoff: bool, ports: &[u16], events: usize) {
    let dir = tempfile::tempdir().unwrap();
    let mut sinks = String::new();
    let mut names = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        sinks.push_str(&format!(
            "  k{i}:\n    type: http\n    channel: buffer\n    batch_size: 10\n    endpoint: http://127.0.0.1:{port}/\n"
        ));
        names.push(format!("k{i}"));
    }
    let config = format!(
        r#"
sources:
  numbers:
    type: seq
    channels: [buffer]
    batch_size: 10
    total_events: {events}
channels:
  buffer:
    type: memory
    capacity: 100000
    transaction_capacity: 100
sinks:
{sinks}sinkgroups:
  spread:
    sinks: [{}]
    processor:
      type: load_balance
      selector: {selector}
      backoff: {backoff}
      max_timeout: 10s
"#,
        names.join(", ")
    );
    let mut agent = Agent::start(dir.path(), &config);
    // Without a broker or HTTP server the agent drains and exits once the source ends.
    let status = agent.wait(Duration::from_secs(120));
    assert!(status.success(), "agent failed: {}", agent.log());
}

/// Asserts that `servers` together received `0..events` exactly once.
fn exactly_once(servers: &[&Received], events: usize) {
    let all: Vec<String> = servers.iter().flat_map(|s| bodies(s)).collect();
    assert_eq!(all.len(), events, "no event delivered twice");
    let distinct: BTreeSet<String> = all.into_iter().collect();
    let expected: BTreeSet<String> = (0..events).map(|i| i.to_string()).collect();
    assert_eq!(distinct, expected, "no event lost");
}

#[test]
fn round_robin_hands_the_batches_to_each_sink_in_turn() {
    let servers: Vec<(u16, Arc<Received>)> = (0..3)
        .map(|_| http_server(|_| 200, Duration::ZERO))
        .collect();
    let ports: Vec<u16> = servers.iter().map(|(port, _)| *port).collect();
    load_balance("round_robin", false, &ports, 3000);
    let received: Vec<&Received> = servers.iter().map(|(_, r)| r.as_ref()).collect();
    exactly_once(&received, 3000);
    let requests: Vec<usize> = received
        .iter()
        .map(|r| r.requests.load(Ordering::SeqCst))
        .collect();
    let (min, max) = (
        *requests.iter().min().unwrap(),
        *requests.iter().max().unwrap(),
    );
    assert!(min > 0 && max - min <= 1, "batches in turn: {requests:?}");
}

#[test]
fn random_selection_spreads_the_batches_and_backoff_leaves_a_failing_sink_out() {
    let servers: Vec<(u16, Arc<Received>)> = (0..2)
        .map(|_| http_server(|_| 200, Duration::ZERO))
        .collect();
    let (down_port, down) = http_server(|_| 503, Duration::ZERO);
    let mut ports: Vec<u16> = servers.iter().map(|(port, _)| *port).collect();
    ports.push(down_port);
    load_balance("random", true, &ports, 3000);
    let received: Vec<&Received> = servers.iter().map(|(_, r)| r.as_ref()).collect();
    exactly_once(&received, 3000);
    for (i, server) in received.iter().enumerate() {
        assert!(
            server.requests.load(Ordering::SeqCst) > 20,
            "sink k{i} got a share of the batches"
        );
    }
    assert!(bodies(&down).is_empty());
    // Backing off, the failing sink was tried a few times, not for every batch.
    let tried = down.requests.load(Ordering::SeqCst);
    assert!(
        (1..50).contains(&tried),
        "the failing sink was tried {tried} times"
    );
}

#[test]
fn validate_reports_bad_sink_groups_with_their_lines() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("groups.yaml");
    std::fs::write(
        &path,
        "\
sources:
  numbers: { type: seq, channels: [a, b] }
channels:
  a: { type: memory }
  b: { type: memory }
sinks:
  primary: { type: logger, channel: a }
  standby: { type: logger, channel: a }
  left: { type: logger, channel: a }
  right: { type: logger, channel: b }
  one: { type: logger, channel: a }
  two: { type: logger, channel: a }
sinkgroups:
  g1:
    sinks: [primary, standbye]
    processor: { type: failover }
  g2:
    sinks: [primary, standby]
    processor: { type: failover, priority: { primary: 1, standbye: 2 } }
  g3:
    sinks: [left, right]
    processor: { type: load_balance }
  g4:
    sinks: [one, two]
    processor: { type: failovr }
",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_agent"))
        .arg("validate")
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    for expected in [
        ":15:22: sink group `g1`: unknown sink `standbye`, did you mean `standby`?",
        ":18:13: sink group `g2`: sink `primary` is already in sink group `g1` (line 15); a sink can be in one group only",
        ":19:58: sink group `g2`: `priority` names `standbye`, which is not a sink of this group; did you mean `standby`?",
        ":21:5: sink group `g3`: the sinks of a group must take from one channel, but `left` from `a`, `right` from `b`",
        ":25:24: sink group `g4`: unknown sink processor type `failovr`, did you mean `failover`?",
    ] {
        assert!(
            stderr.contains(expected),
            "missing `{expected}` in:\n{stderr}"
        );
    }
}
