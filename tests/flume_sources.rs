//! Flume's interceptors and network sources on the real agent: every interceptor option in
//! one pipeline, syslog over TCP (both RFC formats, both framings) on one port and on two,
//! syslog and netcat over UDP, from real sockets into a `file_roll` sink; a batch whose events
//! are all filtered still moves the checkpoint; `position` headers stay the same when lines
//! are read again after a SIGKILL.

#![allow(clippy::unwrap_used)]

use crate::harness;

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::path::Path;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::harness::{Agent, free_port, read_dir_concat, wait_until};

/// One line of a `header_and_text` file: `{k=v, ...} body`.
#[derive(Debug)]
struct Line {
    headers: BTreeMap<String, String>,
    body: String,
}

/// Every event written so far into `dir` (`header_and_text`, one per line).
fn read_events(dir: &Path) -> Vec<Line> {
    let text = String::from_utf8_lossy(&read_dir_concat(dir)).into_owned();
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix('{')?;
            let (headers, body) = rest.split_once("} ")?;
            let headers = headers
                .split(", ")
                .filter(|h| !h.is_empty())
                .filter_map(|h| h.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            Some(Line {
                headers,
                body: body.to_owned(),
            })
        })
        .collect()
}

/// Waits until `dir` holds at least `n` events, and returns them.
fn wait_for_events(agent: &Agent, dir: &Path, n: usize) -> Vec<Line> {
    let mut found = Vec::new();
    wait_until(Duration::from_secs(60), &format!("{n} events"), || {
        found = read_events(dir);
        assert!(
            !agent.log().contains("panicked"),
            "the agent panicked:\n{}",
            agent.log()
        );
        found.len() >= n
    });
    found
}

/// Waits until the agent logged `needle` `times` times.
fn wait_for_log(agent: &Agent, needle: &str, times: usize) {
    wait_until(Duration::from_secs(60), needle, || {
        agent.log().matches(needle).count() >= times
    });
}

fn stop(mut agent: Agent) {
    agent.signal(Signal::SIGTERM);
    let status = agent.wait(Duration::from_secs(30));
    assert!(status.success(), "{status:?}\n{}", agent.log());
}

/// A UDP port on 127.0.0.1 that was free a moment ago.
fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

const SINK: &str = "sinks:
  out: { type: file_roll, channel: buffer, directory: ./out, serializer: header_and_text, roll_interval: 0s }
";

#[test]
fn every_interceptor_option_shapes_the_events() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("logs")).unwrap();
    fs::write(
        dir.path().join("logs/app.log"),
        "INFO [2003-10-11 22:14:15] login user=a password=hunter2 card 1234-5678\n\
         DEBUG [2003-10-11 22:14:16] noise\n\
         WARN [2003-10-11 22:14:17] slow password=x\n",
    )
    .unwrap();
    let config = format!(
        "sources:
  app:
    type: taildir
    channels: [buffer]
    filegroups: {{ app: ./logs/*.log }}
    file_header: true
    interceptors:
      - {{ type: static, key: drop_me, value: '1' }}
      - {{ type: static, key: x-trace, value: t }}
      - {{ type: static, key: also, value: a }}
      - {{ type: remove_header, with_name: drop_me, from_list: 'file ; also', list_separator: '\\s*;\\s*', matching: 'x-.*' }}
      - {{ type: uuid, header_name: eid, prefix: 'web-', preserve_existing: true }}
      - {{ type: search_replace, search_pattern: 'password=\\S+', replace_string: 'password=***', charset: UTF-8 }}
      - {{ type: search_replace, search_pattern: '(\\d{{4}})-(\\d{{4}})', replace_string: '$2-$1' }}
      - {{ type: regex_filter, regex: '^DEBUG', exclude_events: true }}
      - type: regex_extractor
        regex: '^(\\w+) \\[([^\\]]+)\\]'
        serializers:
          - {{ name: level }}
          - {{ name: ts, type: millis, pattern: 'yyyy-MM-dd HH:mm:ss' }}
      - {{ type: position, header_name: pos }}
channels:
  buffer: {{ type: memory }}
{SINK}"
    );
    let agent = Agent::start(dir.path(), &config);
    let out = dir.path().join("out");
    let events = wait_for_events(&agent, &out, 2);
    stop(agent);
    let events_after = read_events(&out);
    assert_eq!(
        events_after.len(),
        2,
        "the DEBUG line is filtered: {events_after:?}"
    );
    assert_eq!(
        events[0].body,
        "INFO [2003-10-11 22:14:15] login user=a password=*** card 5678-1234"
    );
    assert_eq!(
        events[1].body,
        "WARN [2003-10-11 22:14:17] slow password=***"
    );
    for (event, (level, ts)) in events
        .iter()
        .zip([("INFO", "1065910455000"), ("WARN", "1065910457000")])
    {
        let names: Vec<&str> = event.headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["eid", "level", "pos", "ts"], "{event:?}");
        assert_eq!(event.headers["level"], level);
        assert_eq!(event.headers["ts"], ts);
        let eid = &event.headers["eid"];
        assert!(eid.starts_with("web-") && eid.len() == 4 + 36, "{eid}");
    }
    assert_ne!(events[0].headers["eid"], events[1].headers["eid"]);
    // Taildir positions: inode, CRC of the file's head, offset of the line.
    let offsets: Vec<&str> = events
        .iter()
        .map(|e| e.headers["pos"].rsplit('-').next().unwrap())
        .collect();
    let second_line = "INFO [2003-10-11 22:14:15] login user=a password=hunter2 card 1234-5678\n\
                       DEBUG [2003-10-11 22:14:16] noise\n"
        .len();
    assert_eq!(offsets, ["0".to_string(), second_line.to_string()]);
}

#[test]
fn position_on_a_source_without_positions_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "sources:
  net:
    type: netcat
    port: {}
    channels: [buffer]
    interceptors: [ {{ type: position }} ]
channels:
  buffer: {{ type: memory }}
{SINK}",
        free_port()
    );
    fs::write(dir.path().join("pipeline.yaml"), config).unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_agent"))
        .arg("validate")
        .arg(dir.path().join("pipeline.yaml"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stderr).into_owned()
        + &String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(
        text.contains("a `netcat` source cannot tell where an event was read"),
        "{text}"
    );
}

/// A counter of source `app` from the agent's `/metrics.json`.
fn source_counter(agent: &Agent, name: &str) -> u64 {
    counter(agent, "SOURCE.app", name)
}

/// A counter of `component` (`SOURCE.app`, `SINK.out`, ...) from the agent's `/metrics.json`.
fn counter(agent: &Agent, component: &str, name: &str) -> u64 {
    let Some(address) = harness::http_address(agent) else {
        return 0;
    };
    let (_, reply) = harness::http_get(&address, "/metrics.json");
    let key = format!("\"{name}\":\"");
    reply
        .split(&format!("\"{component}\""))
        .nth(1)
        .and_then(|source| source.split(&key).nth(1))
        .and_then(|rest| rest.split('"').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0)
}

/// Taildir through `channel` with a filter that drops every line: once every batch was
/// filtered (and so put empty, with its checkpoint), a SIGKILL and a restart without the
/// filter must not read the lines again.
fn filtered_lines_are_not_read_again(channel: &str) {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("logs")).unwrap();
    let old: String = (0..500).map(|i| format!("old {i}\n")).collect();
    fs::write(dir.path().join("logs/app.log"), &old).unwrap();
    let config = |interceptors: &str| {
        format!(
            "agent:
  http: 127.0.0.1:0
sources:
  app:
    type: taildir
    channels: [buffer]
    filegroups: {{ app: ./logs/*.log }}
    batch_size: 50
    interceptors: [ {interceptors} ]
channels:
  buffer: {channel}
{SINK}"
        )
    };
    let mut agent = Agent::start(
        dir.path(),
        &config("{ type: regex_filter, regex: '^old', exclude_events: true }"),
    );
    wait_until(
        Duration::from_secs(60),
        "500 events filtered in 10 batches",
        || {
            source_counter(&agent, "EventFilteredCount") == 500
                && source_counter(&agent, "AppendBatchAcceptedCount") >= 10
        },
    );
    agent.signal(Signal::SIGKILL);
    agent.wait(Duration::from_secs(10));

    let agent = Agent::start(dir.path(), &config(""));
    let mut app = fs::OpenOptions::new()
        .append(true)
        .open(dir.path().join("logs/app.log"))
        .unwrap();
    app.write_all(b"new\n").unwrap();
    let out = dir.path().join("out");
    wait_until(Duration::from_secs(60), "the new line delivered", || {
        read_events(&out).iter().any(|e| e.body == "new")
    });
    stop(agent);
    let bodies: Vec<String> = read_events(&out).into_iter().map(|e| e.body).collect();
    assert_eq!(bodies, ["new"], "nothing filtered is read again");
}

#[test]
fn filtered_batches_move_the_checkpoint_through_a_file_channel() {
    filtered_lines_are_not_read_again("{ type: file }");
}

#[test]
fn filtered_batches_move_the_checkpoint_through_a_memory_channel() {
    filtered_lines_are_not_read_again("{ type: memory }");
}

#[test]
fn taildir_positions_are_the_same_when_lines_are_read_again_after_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("logs")).unwrap();
    // Long enough that lines within the file's first KiB and past it both occur.
    let lines: String = (0..3000).map(|i| format!("line {i:05}\n")).collect();
    fs::write(dir.path().join("logs/app.log"), &lines).unwrap();
    // Two memory channels: `kept` is delivered to `out_kept`, `held` to `held_out`. While
    // `held_out` is not a directory, its sink cannot start, so no event is ever acknowledged
    // in both channels: no checkpoint is saved, and the next run reads every line again.
    let config = "agent:
  http: 127.0.0.1:0
sources:
  app:
    type: taildir
    channels: [kept, held]
    filegroups: { app: ./logs/*.log }
    interceptors: [ { type: position } ]
channels:
  kept: { type: memory, capacity: 10000 }
  held: { type: memory, capacity: 10000 }
sinks:
  kept_out: { type: file_roll, channel: kept, directory: ./out_kept, serializer: header_and_text, roll_interval: 0s }
  held_out: { type: file_roll, channel: held, directory: ./out_held, serializer: header_and_text, roll_interval: 0s }
";
    fs::write(dir.path().join("out_held"), "not a directory").unwrap();
    let mut first = Agent::start(dir.path(), config);
    let first_events = wait_for_events(&first, &dir.path().join("out_kept"), 3000);
    wait_for_log(&first, "sink cannot start", 1);
    // The lines are in the file before file_roll records them (its flush writes, syncs, then
    // records the files' lengths); a kill between the two would let the next start cut them
    // off. Killed once every take of `kept` committed, after the record, the file keeps all.
    wait_until(Duration::from_secs(60), "3000 events drained", || {
        counter(&first, "SINK.kept_out", "EventDrainSuccessCount") == 3000
    });
    first.signal(Signal::SIGKILL);
    first.wait(Duration::from_secs(10));

    fs::remove_file(dir.path().join("out_held")).unwrap();
    let second = Agent::start(dir.path(), config);
    let second_events = wait_for_events(&second, &dir.path().join("out_held"), 3000);
    wait_for_events(&second, &dir.path().join("out_kept"), 6000);
    stop(second);

    let ids = |events: &[Line]| -> BTreeMap<String, String> {
        events
            .iter()
            .map(|e| (e.body.clone(), e.headers["position"].clone()))
            .collect()
    };
    let (first_ids, second_ids) = (ids(&first_events), ids(&second_events));
    assert_eq!(first_ids.len(), 3000);
    assert_eq!(
        first_ids, second_ids,
        "every line read again has the id it had"
    );
    let mut distinct: Vec<&String> = first_ids.values().collect();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 3000, "one id per line");
    // The kept channel got everything again: the same ids, twice each.
    let again = read_events(&dir.path().join("out_kept"));
    assert_eq!(again.len(), 6000);
    assert_eq!(ids(&again), first_ids);
}

/// Starts an agent running `source` (YAML of one source named `net`) into `./out`.
fn network_agent(dir: &Path, source: &str) -> Agent {
    let config = format!(
        "sources:
  net:
{source}
    channels: [buffer]
channels:
  buffer: {{ type: memory }}
{SINK}"
    );
    let agent = Agent::start(dir, &config);
    wait_for_log(&agent, "listening", 1);
    agent
}

fn connect(port: u16) -> TcpStream {
    let mut last = None;
    for _ in 0..100 {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(stream) => return stream,
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("cannot connect to port {port}: {last:?}");
}

#[test]
fn syslog_tcp_reads_both_formats_in_both_framings() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let agent = network_agent(
        dir.path(),
        &format!(
            "    type: syslog_tcp\n    port: {port}\n    client_ip_header: client\n    event_size: 200"
        ),
    );
    let mut stream = connect(port);
    let rfc5424 = "<165>1 2003-10-11T22:14:15.003Z mymachine.example.com evntslog - ID47 - An application event";
    let counted_3164 = "<34>Oct 11 22:14:15 mymachine su: counted";
    let mut sent = String::new();
    sent.push_str("<34>Oct 11 22:14:15 mymachine su: 'su root' failed\n");
    sent.push_str(&format!("{} {rfc5424}", rfc5424.len()));
    sent.push_str(&format!("{} {counted_3164}", counted_3164.len()));
    sent.push_str("<13>1 2003-08-24T05:14:15.000003-07:00 192.0.2.1 myproc 8710 - - line\r\n");
    sent.push_str("not syslog at all\n");
    sent.push_str(&format!("<13>{}\n", "x".repeat(250)));
    stream.write_all(sent.as_bytes()).unwrap();
    drop(stream);
    let out = dir.path().join("out");
    let events = wait_for_events(&agent, &out, 7);
    stop(agent);
    let bodies: Vec<&str> = events.iter().map(|e| e.body.as_str()).collect();
    let long_rest = "x".repeat(250 - (200 - 4));
    let long_head = format!("<13>{}", "x".repeat(196));
    assert_eq!(
        bodies,
        [
            "su: 'su root' failed",
            "evntslog - ID47 - An application event",
            "su: counted",
            "myproc 8710 - - line",
            "not syslog at all",
            long_head.as_str(),
            long_rest.as_str(),
        ]
    );
    let h = |i: usize, key: &str| events[i].headers.get(key).map(String::as_str);
    assert_eq!(h(0, "Facility"), Some("4"));
    assert_eq!(h(0, "Severity"), Some("2"));
    assert_eq!(h(0, "host"), Some("mymachine"));
    assert_eq!(h(0, "client"), Some("127.0.0.1"));
    assert!(h(0, "timestamp").is_some());
    assert_eq!(h(1, "Facility"), Some("20"));
    assert_eq!(h(1, "Severity"), Some("5"));
    assert_eq!(h(1, "timestamp"), Some("1065910455003"));
    assert_eq!(h(1, "host"), Some("mymachine.example.com"));
    assert_eq!(h(1, "version"), Some("1"));
    assert_eq!(h(3, "timestamp"), Some("1061727255000"));
    assert_eq!(h(4, "flume.syslog.status"), Some("Invalid"));
    assert_eq!(h(5, "flume.syslog.status"), Some("Incomplete"));
    assert_eq!(h(6, "flume.syslog.status"), Some("Invalid"));
    assert_eq!(h(1, "flume.syslog.status"), None);
}

#[test]
fn multiport_syslog_tcp_listens_on_two_ports() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (free_port(), free_port());
    let agent = network_agent(
        dir.path(),
        &format!(
            "    type: multiport_syslog_tcp\n    ports: '{a} {b}'\n    port_header: port\n    keep_fields: all"
        ),
    );
    wait_for_log(&agent, "listening", 2);
    for (port, text) in [(a, "first"), (b, "second")] {
        let mut stream = connect(port);
        writeln!(stream, "<13>Oct 11 22:14:15 web {text}").unwrap();
    }
    let out = dir.path().join("out");
    let events = wait_for_events(&agent, &out, 2);
    stop(agent);
    let mut seen: Vec<(String, String)> = events
        .iter()
        .map(|e| (e.headers["port"].clone(), e.body.clone()))
        .collect();
    seen.sort();
    let mut expected = vec![
        (a.to_string(), "<13>Oct 11 22:14:15 web first".to_string()),
        (b.to_string(), "<13>Oct 11 22:14:15 web second".to_string()),
    ];
    expected.sort();
    assert_eq!(seen, expected);
    assert!(events.iter().all(|e| e.headers["host"] == "web"));
}

#[test]
fn syslog_udp_and_netcat_udp_turn_datagrams_into_events() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_udp_port();
    let agent = network_agent(
        dir.path(),
        &format!("    type: syslog_udp\n    port: {port}\n    keep_fields: 'priority hostname'"),
    );
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    let out = dir.path().join("out");
    // A datagram may be lost even on loopback: send again until it is there.
    wait_until(Duration::from_secs(60), "the datagram delivered", || {
        client
            .send_to(
                b"<165>1 2003-10-11T22:14:15.003Z web-1 app - - - over udp\n",
                ("127.0.0.1", port),
            )
            .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        !read_events(&out).is_empty()
    });
    stop(agent);
    let events = read_events(&out);
    assert_eq!(events[0].body, "<165>web-1 app - - - over udp");
    assert_eq!(events[0].headers["host"], "web-1");
    assert_eq!(events[0].headers["timestamp"], "1065910455003");

    let dir = tempfile::tempdir().unwrap();
    let port = free_udp_port();
    let agent = network_agent(
        dir.path(),
        &format!("    type: netcat_udp\n    port: {port}\n    remote_address_header: from"),
    );
    let out = dir.path().join("out");
    wait_until(Duration::from_secs(60), "the datagram delivered", || {
        client
            .send_to(b"hello\nworld\n", ("127.0.0.1", port))
            .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        read_events(&out).len() >= 2
    });
    stop(agent);
    let events = read_events(&out);
    assert_eq!(events[0].body, "hello");
    assert_eq!(events[1].body, "world");
    assert_eq!(
        events[0].headers["from"],
        client.local_addr().unwrap().to_string()
    );
}

#[test]
fn a_syslog_tcp_sender_is_held_back_by_a_full_channel_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = format!(
        "sources:
  net:
    type: syslog_tcp
    port: {port}
    channels: [buffer]
channels:
  buffer: {{ type: memory, capacity: 100, transaction_capacity: 100 }}
sinks:
  out: {{ type: file_roll, channel: buffer, directory: ./out, roll_interval: 0s }}
"
    );
    let agent = Agent::start(dir.path(), &config);
    wait_for_log(&agent, "listening", 1);
    let mut stream = connect(port);
    let total = 20_000;
    let mut sent = String::new();
    for i in 0..total {
        sent.push_str(&format!("<13>Oct 11 22:14:15 web message {i:05}\n"));
    }
    stream.write_all(sent.as_bytes()).unwrap();
    stream.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "syslog answers nothing");
    let out = dir.path().join("out");
    wait_until(Duration::from_secs(60), "every message", || {
        read_dir_concat(&out)
            .iter()
            .filter(|b| **b == b'\n')
            .count()
            >= total
    });
    stop(agent);
    let expected: String = (0..total).map(|i| format!("message {i:05}\n")).collect();
    assert_eq!(String::from_utf8(read_dir_concat(&out)).unwrap(), expected);
}
