//! End to end: the real `agent` binary running the shipped pipelines and test pipelines,
//! driven by real TCP clients and a real HTTP server, stopped with real signals.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::harness::{Agent, free_port, http_server, pipeline, read_dir_concat, wait_until};

fn numbered_lines(range: std::ops::Range<usize>) -> Vec<u8> {
    let mut out = Vec::new();
    for i in range {
        writeln!(out, "line-{i}").unwrap();
    }
    out
}

#[test]
fn seq_to_logger_prints_every_event_and_exits() {
    let dir = tempfile::tempdir().unwrap();
    let config = pipeline("seq-to-logger.yaml", &[("./var/seq-to-logger", "./state")]);
    let mut agent = Agent::start(dir.path(), &config);
    let status = agent.wait(Duration::from_secs(60));
    let log = agent.log();
    assert!(status.success(), "{status:?}\n{log}");
    let printed = log.lines().filter(|l| l.contains("Event: {")).count();
    assert_eq!(printed, 1000, "{log}");
    assert!(
        log.contains("timestamp"),
        "interceptors add headers:\n{log}"
    );
}

/// Starts the shipped netcat-to-file pipeline on a free port, writing into `dir/out`.
fn start_netcat_to_file(dir: &std::path::Path) -> (Agent, u16) {
    let port = free_port();
    let config = pipeline(
        "netcat-to-file.yaml",
        &[
            ("port: 44444", &format!("port: {port}")),
            ("./var/netcat-to-file", "./state"),
            ("./var/netcat-out", "./out"),
        ],
    );
    let agent = Agent::start(dir, &config);
    wait_until(Duration::from_secs(30), "netcat source listening", || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    (agent, port)
}

#[test]
fn netcat_to_file_delivers_100k_lines_exactly_once_in_order() {
    const LINES: usize = 100_000;
    let dir = tempfile::tempdir().unwrap();
    let (mut agent, port) = start_netcat_to_file(dir.path());
    let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let payload = numbered_lines(0..LINES);
    let sender = std::thread::spawn(move || writer.write_all(&payload).unwrap());
    let mut acks = 0;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    while acks < LINES {
        line.clear();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "connection closed after {acks} acks"
        );
        assert_eq!(line, "OK\n");
        acks += 1;
    }
    sender.join().unwrap();
    drop(reader);
    agent.signal(Signal::SIGTERM);
    let status = agent.wait(Duration::from_secs(60));
    assert!(status.success(), "{status:?}\n{}", agent.log());
    let written = read_dir_concat(&dir.path().join("out"));
    assert!(
        written == numbered_lines(0..LINES),
        "output differs: {} bytes written, {} expected",
        written.len(),
        numbered_lines(0..LINES).len()
    );
}

#[test]
fn sigterm_mid_stream_keeps_every_acknowledged_line() {
    let dir = tempfile::tempdir().unwrap();
    let (mut agent, port) = start_netcat_to_file(dir.path());
    let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut writer = stream.try_clone().unwrap();
    // Far more than gets through before the signal; the writer stops when the agent closes.
    let sender = std::thread::spawn(move || {
        for chunk in 0..1000 {
            if writer
                .write_all(&numbered_lines(chunk * 1000..(chunk + 1) * 1000))
                .is_err()
            {
                break;
            }
        }
    });
    let mut reader = BufReader::new(stream);
    let mut acks = 0;
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) if line == "OK\n" => acks += 1,
            Ok(_) => panic!("unexpected reply {line:?}"),
        }
        if acks == 20_000 {
            agent.signal(Signal::SIGTERM);
        }
    }
    let _ = sender.join();
    let status = agent.wait(Duration::from_secs(60));
    assert!(status.success(), "{status:?}\n{}", agent.log());
    assert!(acks >= 20_000, "only {acks} acknowledged");
    let written = read_dir_concat(&dir.path().join("out"));
    let text = String::from_utf8(written).unwrap();
    let delivered: Vec<&str> = text.lines().collect();
    assert!(
        delivered.len() >= acks,
        "{acks} lines acknowledged but only {} delivered",
        delivered.len()
    );
    for (i, line) in delivered.iter().enumerate() {
        assert_eq!(
            *line,
            format!("line-{i}"),
            "line {i} out of order or duplicated"
        );
    }
}

fn seq_to_http(total: Option<usize>, http_port: u16, capacity: usize) -> String {
    let total = total
        .map(|t| format!("    total_events: {t}\n"))
        .unwrap_or_default();
    format!(
        "\
agent:
  data_dir: ./state
sources:
  numbers:
    type: seq
    channels: [buffer]
    batch_size: 100
{total}channels:
  buffer:
    type: memory
    capacity: {capacity}
    transaction_capacity: 100
sinks:
  remote:
    type: http
    channel: buffer
    batch_size: 100
    endpoint: http://127.0.0.1:{http_port}/events
"
    )
}

fn assert_contiguous_from_zero(bodies: &[String]) {
    for (i, body) in bodies.iter().enumerate() {
        assert_eq!(
            body,
            &i.to_string(),
            "event {i} lost, duplicated or reordered"
        );
    }
}

#[test]
fn slow_sink_applies_backpressure_with_bounded_memory_and_no_loss() {
    let (port, received) = http_server(|_| 200, Duration::from_millis(20));
    let dir = tempfile::tempdir().unwrap();
    let mut agent = Agent::start(dir.path(), &seq_to_http(None, port, 1000));
    wait_until(Duration::from_secs(30), "first deliveries", || {
        received.requests.load(Ordering::SeqCst) >= 5
    });
    let mut peak = 0;
    for _ in 0..40 {
        peak = peak.max(agent.rss_kib());
        std::thread::sleep(Duration::from_millis(50));
    }
    let delivered_before_stop = received.bodies.lock().unwrap().len();
    agent.signal(Signal::SIGTERM);
    let status = agent.wait(Duration::from_secs(60));
    assert!(status.success(), "{status:?}\n{}", agent.log());
    let bodies = received.bodies.lock().unwrap();
    // An unbounded source against a 20 ms sink: without backpressure the agent would hold
    // millions of events. With it, at most the channel's capacity plus one batch is pending.
    assert!(
        bodies.len() <= delivered_before_stop + 1000 + 2 * 100,
        "{} delivered, {delivered_before_stop} before the stop: the source did not wait",
        bodies.len()
    );
    assert!(peak < 150 * 1024, "resident memory peaked at {peak} KiB");
    assert_contiguous_from_zero(&bodies);
}

#[test]
fn failing_sink_rolls_back_and_retries_without_loss_or_reordering() {
    // Every other request fails with a 500.
    let (port, received) = http_server(|n| if n % 2 == 1 { 500 } else { 200 }, Duration::ZERO);
    let dir = tempfile::tempdir().unwrap();
    let mut agent = Agent::start(dir.path(), &seq_to_http(Some(5000), port, 1000));
    let status = agent.wait(Duration::from_secs(120));
    assert!(status.success(), "{status:?}\n{}", agent.log());
    let bodies = received.bodies.lock().unwrap();
    assert_eq!(bodies.len(), 5000);
    assert_contiguous_from_zero(&bodies);
    assert!(
        received.refused.load(Ordering::SeqCst) >= 49,
        "the sink did fail"
    );
}

#[test]
fn replicating_fan_out_delivers_every_event_to_every_channel() {
    let dir = tempfile::tempdir().unwrap();
    let config = "\
agent:
  data_dir: ./state
sources:
  numbers:
    type: seq
    channels: [to_a, to_b]
    batch_size: 100
    total_events: 20000
channels:
  to_a: { type: memory, capacity: 1000, transaction_capacity: 100 }
  to_b: { type: memory, capacity: 300, transaction_capacity: 100 }
sinks:
  a: { type: file_roll, channel: to_a, directory: ./out_a, roll_size: 16KiB }
  b: { type: file_roll, channel: to_b, directory: ./out_b, sync: false }
";
    let mut agent = Agent::start(dir.path(), config);
    let status = agent.wait(Duration::from_secs(60));
    assert!(status.success(), "{status:?}\n{}", agent.log());
    let expected: String = (0..20000).map(|i| format!("{i}\n")).collect();
    for out in ["out_a", "out_b"] {
        let written = read_dir_concat(&dir.path().join(out));
        assert!(
            written == expected.as_bytes(),
            "{out}: {} bytes, {} expected",
            written.len(),
            expected.len()
        );
    }
}

#[test]
fn a_second_agent_on_the_same_data_dir_is_refused_with_the_path_and_the_first_ones_pid() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let config = format!(
        "agent:\n  data_dir: {}\nsources:\n  numbers: {{ type: seq, channels: [c] }}\nchannels:\n  c: {{ type: file }}\nsinks:\n  out: {{ type: null, channel: c }}\n",
        state.display()
    );
    let (first_dir, second_dir) = (dir.path().join("first"), dir.path().join("second"));
    std::fs::create_dir_all(&first_dir).unwrap();
    std::fs::create_dir_all(&second_dir).unwrap();
    let mut first = Agent::start(&first_dir, &config);
    wait_until(Duration::from_secs(60), "the first agent to start", || {
        first.log().contains("pipeline started")
    });
    let mut second = Agent::start(&second_dir, &config);
    let status = second.wait(Duration::from_secs(30));
    let log = second.log();
    assert!(!status.success(), "{log}");
    assert!(
        log.contains(&format!("pid {}", first.pid())) && log.contains(&state.display().to_string()),
        "{log}"
    );
    assert!(!log.contains("pipeline started"), "{log}");
    first.signal(Signal::SIGTERM);
    assert!(first.wait(Duration::from_secs(30)).success());
    // Once the first is gone, the directory is free again.
    let mut third = Agent::start(&second_dir, &config);
    wait_until(Duration::from_secs(60), "the next agent to start", || {
        third.log().contains("pipeline started")
    });
    third.signal(Signal::SIGTERM);
    assert!(third.wait(Duration::from_secs(30)).success());
}

/// seq → `channel` → an http sink whose destination is down, stopping within `drain_timeout`.
fn undeliverable(channel: &str) -> String {
    let dead = free_port();
    format!(
        "agent:\n  data_dir: ./state\n  drain_timeout: 2s\nsources:\n  numbers: {{ type: seq, channels: [buffer], batch_size: 10, total_events: 100 }}\nchannels:\n  buffer: {{ type: {channel} }}\nsinks:\n  out: {{ type: http, channel: buffer, endpoint: 'http://127.0.0.1:{dead}/' }}\n"
    )
}

#[test]
fn events_left_in_a_memory_channel_at_exit_are_reported_with_a_failing_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    // The source ends after 100 events; the sink can deliver none of them.
    let mut agent = Agent::start(dir.path(), &undeliverable("memory"));
    let status = agent.wait(Duration::from_secs(60));
    let log = agent.log();
    assert!(!status.success(), "{log}");
    assert!(log.contains("did not drain in time"), "{log}");
    assert!(
        log.contains("stopped with events undelivered in memory channels: 100 in channel `buffer`"),
        "{log}"
    );
}

#[test]
fn a_dead_destination_does_not_hold_the_first_sigterm_and_a_file_channel_keeps_its_events() {
    let dir = tempfile::tempdir().unwrap();
    let mut agent = Agent::start(dir.path(), &undeliverable("file"));
    wait_until(Duration::from_secs(60), "the sink to fail", || {
        agent.log().contains("out") && agent.log().contains("pipeline started")
    });
    std::thread::sleep(Duration::from_millis(500));
    agent.signal(Signal::SIGTERM);
    let status = agent.wait(Duration::from_secs(30));
    let log = agent.log();
    assert!(status.success(), "{log}");
    assert!(
        log.contains("channel stopped channel=buffer events=100"),
        "{log}"
    );
}

/// A sink that cannot even start used to make the agent log "giving up" and exit 0 with the
/// events of its memory channel gone; the exit now fails and names them.
#[test]
fn a_sink_that_cannot_start_does_not_end_the_agent_with_exit_0_and_events_inside() {
    let dir = tempfile::tempdir().unwrap();
    // The sink's directory is a file: it cannot start.
    std::fs::write(dir.path().join("out"), "not a directory").unwrap();
    let config = "agent:\n  data_dir: ./state\n  drain_timeout: 2s\nsources:\n  numbers: { type: seq, channels: [buffer], batch_size: 10, total_events: 50 }\nchannels:\n  buffer: { type: memory }\nsinks:\n  files: { type: file_roll, channel: buffer, directory: ./out }\n";
    let mut agent = Agent::start(dir.path(), config);
    let status = agent.wait(Duration::from_secs(60));
    let log = agent.log();
    assert!(log.contains("sink cannot start"), "{log}");
    assert!(!status.success(), "{log}");
    assert!(
        log.contains("stopped with events undelivered in memory channels: 50 in channel `buffer`"),
        "{log}"
    );
}
