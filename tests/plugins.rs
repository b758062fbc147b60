//! Process plugins end to end, with the Python examples of `examples/process-plugins/` (standard
//! library only) and small inline programs: a sink that acknowledges gets every event once, a
//! batch it refuses comes again, killing it in the middle of a batch loses nothing, a malformed
//! line is reported with the plugin's name and the line while the agent keeps running, a source
//! resumes from its checkpoint after the agent is killed, and an interceptor rewrites batches.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::harness::{Agent, read_dir_concat, repo_root, wait_until};

fn example(name: &str) -> String {
    repo_root()
        .join("examples/process-plugins")
        .join(name)
        .display()
        .to_string()
}

/// Lines of `path`, counted.
fn counts(path: &Path) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for line in std::fs::read_to_string(path).unwrap_or_default().lines() {
        *counts.entry(line.to_owned()).or_default() += 1;
    }
    counts
}

/// seq (`total` events) → file channel → the example sink with `config`.
fn seq_to_sink(total: u64, batch: u64, config: &str) -> String {
    format!(
        "\
agent:
  data_dir: ./state
sources:
  numbers:
    type: seq
    channels: [durable]
    batch_size: {batch}
    total_events: {total}
channels:
  durable:
    type: file
sinks:
  out:
    type: process
    channel: durable
    batch_size: {batch}
    command: [python3, {sink}]
    config: {config}
",
        sink = example("sink.py")
    )
}

fn run_to_end(dir: &Path, config: &str) -> Agent {
    let mut agent = Agent::start(dir, config);
    let status = agent.wait(Duration::from_secs(120));
    assert!(status.success(), "{status:?}\n{}", agent.log());
    agent
}

#[test]
fn a_sink_that_acks_gets_every_event_once_and_a_refused_batch_again() {
    let dir = tempfile::tempdir().unwrap();
    let config = seq_to_sink(
        500,
        50,
        "{ path: ./out.txt, fail_every: 3, received: ./received.txt }",
    );
    let agent = run_to_end(dir.path(), &config);
    let out = counts(&dir.path().join("out.txt"));
    assert_eq!(out.len(), 500);
    assert!(out.values().all(|c| *c == 1), "some events written twice");
    assert!((0..500).all(|n| out.contains_key(&n.to_string())));
    // Every third batch received was refused and came again: its first event was received
    // twice, and more events were received than there are.
    let received = std::fs::read_to_string(dir.path().join("received.txt")).unwrap();
    let mut firsts: HashMap<&str, usize> = HashMap::new();
    let mut events_received = 0;
    for line in received.lines() {
        let mut fields = line.split(' ');
        let first = fields.nth(1).unwrap();
        *firsts.entry(first).or_default() += 1;
        events_received += fields.next().unwrap().parse::<usize>().unwrap();
    }
    let receipts = received.lines().count();
    assert!(firsts.values().any(|c| *c >= 2), "{received}");
    assert_eq!(receipts / 3, receipts - firsts.len(), "{received}");
    assert!(events_received > 500, "{received}");
    assert!(agent.log().contains("refused on purpose"));
}

#[test]
fn killing_the_sink_program_in_the_middle_of_a_batch_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = seq_to_sink(
        400,
        20,
        "{ path: ./out.txt, delay_ms: 100, pid_file: ./sink.pid }",
    );
    let mut agent = Agent::start(dir.path(), &config);
    let pid_file = dir.path().join("sink.pid");
    let mut kills = 0;
    let mut last_pid = String::new();
    while kills < 3 {
        wait_until(Duration::from_secs(60), "a new sink program", || {
            std::fs::read_to_string(&pid_file).is_ok_and(|p| !p.is_empty() && p != last_pid)
        });
        std::thread::sleep(Duration::from_millis(250));
        last_pid = std::fs::read_to_string(&pid_file).unwrap();
        kill(Pid::from_raw(last_pid.parse().unwrap()), Signal::SIGKILL).unwrap();
        kills += 1;
    }
    let status = agent.wait(Duration::from_secs(120));
    assert!(status.success(), "{status:?}\n{}", agent.log());
    let out = counts(&dir.path().join("out.txt"));
    let missing: Vec<u64> = (0..400)
        .filter(|n| !out.contains_key(&n.to_string()))
        .collect();
    assert!(missing.is_empty(), "lost {missing:?}");
    assert!(
        agent.log().contains("plugin `out` exited"),
        "{}",
        agent.log()
    );
}

#[test]
fn a_malformed_line_is_reported_and_its_batch_not_committed() {
    let dir = tempfile::tempdir().unwrap();
    // Answers its very first batch with garbage (a marker file remembers it did), then
    // behaves like the example sink.
    let program = dir.path().join("flaky.py");
    std::fs::write(
        &program,
        format!(
            r#"
import json, os, sys
sys.argv = ["sink.py"]
marker = "garbled"
real_stdout = sys.stdout
if not os.path.exists(marker):
    hello = sys.stdin.readline()
    print(json.dumps({{"type": "hello", "protocol": 1}}), flush=True)
    sys.stdin.readline()
    open(marker, "w").close()
    print("this is not json", flush=True)
    sys.stdin.readline()
    sys.exit(0)
exec(open({sink:?}).read())
"#,
            sink = example("sink.py")
        ),
    )
    .unwrap();
    let config = seq_to_sink(100, 10, "{ path: ./out.txt }").replace(
        &format!("command: [python3, {}]", example("sink.py")),
        &format!("command: [python3, {}]", program.display()),
    );
    let agent = run_to_end(dir.path(), &config);
    let log = agent.log();
    assert!(log.contains("plugin `out` sent a malformed line"), "{log}");
    assert!(log.contains("this is not json"), "{log}");
    let out = counts(&dir.path().join("out.txt"));
    assert_eq!(out.len(), 100);
    assert!(out.values().all(|c| *c == 1));
}

#[test]
fn a_process_source_resumes_from_its_checkpoint_after_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "\
agent:
  data_dir: ./state
sources:
  numbers:
    type: process
    command: [python3, {source}]
    config: {{ count: 3000, batch_size: 10, prefix: n }}
    batch_size: 10
    channels: [durable]
channels:
  durable:
    type: file
sinks:
  files:
    type: file_roll
    channel: durable
    batch_size: 10
    directory: ./out
    roll_interval: 1s
",
        source = example("source.py")
    );
    let mut agent = Agent::start(dir.path(), &config);
    let out: PathBuf = dir.path().join("out");
    wait_until(Duration::from_secs(60), "some output", || {
        String::from_utf8_lossy(&read_dir_concat(&out))
            .lines()
            .count()
            > 200
    });
    agent.signal(Signal::SIGKILL);
    agent.wait(Duration::from_secs(30));
    let agent = run_to_end(dir.path(), &config);
    let text = String::from_utf8(read_dir_concat(&out)).unwrap();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for line in text.lines() {
        *seen.entry(line).or_default() += 1;
    }
    assert_eq!(seen.len(), 3000, "{}", agent.log());
    assert!(seen.values().all(|c| *c == 1), "lines written twice");
}

#[test]
fn a_process_interceptor_rewrites_and_drops_events() {
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("upper.py");
    std::fs::write(
        &program,
        r#"
import json, sys
hello = json.loads(sys.stdin.readline())
assert hello["role"] == "interceptor"
print(json.dumps({"type": "hello", "protocol": 1}), flush=True)
for line in sys.stdin:
    m = json.loads(line)
    if m["type"] != "batch":
        break
    kept = [dict(e, body=e["body"].upper()) for e in m["events"] if not e["body"].endswith("7")]
    print(json.dumps({"type": "batch", "id": m["id"], "events": kept}), flush=True)
"#,
    )
    .unwrap();
    let config = format!(
        "\
sources:
  numbers:
    type: seq
    channels: [mem]
    batch_size: 10
    total_events: 100
    interceptors:
      - {{ type: process, command: [python3, {program}] }}
channels:
  mem:
    type: memory
sinks:
  files:
    type: file_roll
    channel: mem
    directory: ./out
",
        program = program.display()
    );
    run_to_end(dir.path(), &config);
    let text = String::from_utf8(read_dir_concat(&dir.path().join("out"))).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 90);
    assert!(!lines.iter().any(|l| l.ends_with('7')));
}

/// A small Python program written to `dir/name`.
fn program(dir: &Path, name: &str, code: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, code).unwrap();
    path.display().to_string()
}

#[test]
fn a_sink_program_that_stops_reading_times_out_and_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    // The first instance answers the hello, then never reads again: the agent's write of a
    // 200 KB batch fills the pipe. Later instances behave like the example sink.
    let flaky = program(
        dir.path(),
        "stuck.py",
        &format!(
            r#"
import json, os, sys, time
sys.argv = ["sink.py"]
if not os.path.exists("stuck-once"):
    open("stuck-once", "w").close()
    sys.stdin.readline()
    print(json.dumps({{"type": "hello", "protocol": 1}}), flush=True)
    time.sleep(3600)
exec(open({sink:?}).read())
"#,
            sink = example("sink.py")
        ),
    );
    let config = format!(
        "\
agent:
  data_dir: ./state
sources:
  big:
    type: exec
    command: python3 -c \"print('x' * 200000)\"
    channels: [durable]
channels:
  durable:
    type: file
sinks:
  out:
    type: process
    channel: durable
    command: [python3, {flaky}]
    config: {{ path: ./out.txt }}
    timeout: 1s
"
    );
    let mut agent = Agent::start(dir.path(), &config);
    wait_until(Duration::from_secs(60), "the line in the output", || {
        std::fs::read_to_string(dir.path().join("out.txt")).is_ok_and(|t| t.len() > 200_000)
    });
    assert!(
        agent.log().contains("did not answer within 1s"),
        "{}",
        agent.log()
    );
    agent.signal(Signal::SIGTERM);
    assert!(agent.wait(Duration::from_secs(30)).success());
}

#[test]
fn a_hung_interceptor_is_timed_out_and_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let hung = program(
        dir.path(),
        "tagger.py",
        r#"
import json, os, sys, time
first = not os.path.exists("hung-once")
open("hung-once", "w").close()
sys.stdin.readline()
print(json.dumps({"type": "hello", "protocol": 1}), flush=True)
if first:
    time.sleep(3600)
for line in sys.stdin:
    m = json.loads(line)
    events = [dict(e, headers=dict(e.get("headers", {}), tagged="yes")) for e in m["events"]]
    print(json.dumps({"type": "batch", "id": m["id"], "events": events}), flush=True)
"#,
    );
    let config = format!(
        "\
sources:
  numbers:
    type: seq
    channels: [mem]
    batch_size: 10
    total_events: 100000
    interceptors:
      - {{ type: process, command: [python3, {hung}], timeout: 1s }}
channels:
  mem:
    type: memory
sinks:
  files:
    type: file_roll
    channel: mem
    directory: ./out
    serializer: header_and_text
"
    );
    let agent = run_to_end(dir.path(), &config);
    let text = String::from_utf8(read_dir_concat(&dir.path().join("out"))).unwrap();
    // Enough events that they still flow once the backoff after the hang has passed.
    assert_eq!(text.lines().count(), 100_000);
    assert!(
        text.lines().any(|l| l.contains("tagged=yes")),
        "never restarted"
    );
    assert!(
        agent.log().contains("no answer within 1s"),
        "{}",
        agent.log()
    );
}

#[test]
fn a_sink_that_cannot_start_does_not_keep_a_durable_agent_from_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let config = "\
agent:
  data_dir: ./state
sources:
  numbers:
    type: seq
    channels: [durable]
    total_events: 10
channels:
  durable:
    type: file
sinks:
  out:
    type: process
    channel: durable
    command: [/nonexistent/plugin]
";
    let mut agent = Agent::start(dir.path(), config);
    let status = agent.wait(Duration::from_secs(60));
    assert!(status.success(), "{status:?}\n{}", agent.log());
    let log = agent.log();
    assert!(
        log.contains("cannot start [\"/nonexistent/plugin\"]"),
        "{log}"
    );
    assert!(log.contains("keeps the rest for the next run"), "{log}");
}

#[test]
fn a_source_program_that_exits_without_reading_acks_has_every_batch_committed_once() {
    let dir = tempfile::tempdir().unwrap();
    let eager = program(
        dir.path(),
        "eager.py",
        r#"
import json, sys
sys.stdin.readline()
print(json.dumps({"type": "hello", "protocol": 1}))
for b in range(200):
    events = [{"body": f"{b}-{i}"} for i in range(5)]
    print(json.dumps({"type": "batch", "id": b + 1, "events": events}))
sys.stdout.flush()
"#,
    );
    let config = format!(
        "\
agent:
  data_dir: ./state
sources:
  eager:
    type: process
    command: [python3, {eager}]
    batch_size: 5
    channels: [durable]
channels:
  durable:
    type: file
sinks:
  files:
    type: file_roll
    channel: durable
    directory: ./out
"
    );
    let agent = run_to_end(dir.path(), &config);
    let text = String::from_utf8(read_dir_concat(&dir.path().join("out"))).unwrap();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for line in text.lines() {
        *seen.entry(line).or_default() += 1;
    }
    assert_eq!(seen.len(), 1000, "{}", agent.log());
    assert!(seen.values().all(|c| *c == 1));
}

#[test]
fn with_a_memory_channel_a_source_program_hears_when_its_checkpoint_is_durable() {
    let dir = tempfile::tempdir().unwrap();
    let waiting = program(
        dir.path(),
        "waiting.py",
        r#"
import json, sys
sys.stdin.readline()
print(json.dumps({"type": "hello", "protocol": 1}), flush=True)
for b in range(3):
    print(json.dumps({"type": "batch", "id": b + 1, "events": [{"body": str(b)}], "checkpoint": str(b + 1)}), flush=True)
for line in sys.stdin:
    m = json.loads(line)
    if m["type"] == "durable" and m["checkpoint"] == "3":
        open("durable-3", "w").close()
        break
"#,
    );
    let config = format!(
        "\
sources:
  waiting:
    type: process
    command: [python3, {waiting}]
    channels: [mem]
channels:
  mem:
    type: memory
sinks:
  files:
    type: file_roll
    channel: mem
    directory: ./out
"
    );
    run_to_end(dir.path(), &config);
    assert!(dir.path().join("durable-3").exists());
}
