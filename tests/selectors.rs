//! Channel selectors end to end: the real agent, multiplexing by a header into two file
//! channels while it is killed with SIGKILL, and replicating with an optional channel that
//! cannot keep up.

#![allow(clippy::unwrap_used)]

use std::fmt::Write as _;
use std::time::Duration;

use crate::harness::{Agent, Lcg, crash_seed, free_port, read_dir_concat, wait_until};
use nix::sys::signal::Signal;

/// Writes `lines` lines `<prefix>-<n>` to `path`.
fn write_lines(path: &std::path::Path, prefix: &str, lines: usize) {
    let mut text = String::with_capacity(lines * 12);
    for n in 0..lines {
        writeln!(text, "{prefix}-{n}").unwrap();
    }
    std::fs::write(path, text).unwrap();
}

fn lines_of(dir: &std::path::Path) -> Vec<String> {
    String::from_utf8(read_dir_concat(dir))
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn multiplexing_into_two_file_channels_is_exactly_once_across_sigkills() {
    const LINES: usize = 150_000;
    let seed = crash_seed();
    let mut rng = Lcg(seed);
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    std::fs::create_dir(&input).unwrap();
    write_lines(&input.join("a.log"), "a", LINES);
    write_lines(&input.join("b.log"), "b", LINES);
    // Events of group `a` carry `kind: a` and go to channel `first`, those of `b` to
    // `second`; the checkpoint rides with `second`, so every batch of `a` is a joint put of
    // its events in `first` and the checkpoint in `second`.
    let config = "\
agent:
  data_dir: ./state
sources:
  logs:
    type: taildir
    channels: [first, second]
    filegroups: { a: ./in/a.log, b: ./in/b.log }
    headers: { a: { kind: a }, b: { kind: b } }
    batch_size: 500
    selector:
      type: multiplexing
      header: kind
      mapping: { a: first, b: second }
channels:
  first: { type: file, transaction_capacity: 1000 }
  second: { type: file, transaction_capacity: 1000 }
sinks:
  out_a: { type: file_roll, channel: first, directory: ./out-a, batch_size: 700 }
  out_b: { type: file_roll, channel: second, directory: ./out-b, batch_size: 300 }
";
    let mut killed = 0;
    for _ in 0..8 {
        let mut agent = Agent::start(dir.path(), config);
        wait_until(Duration::from_secs(60), "the agent to start", || {
            agent.log().contains("pipeline started")
        });
        std::thread::sleep(Duration::from_millis(100 + rng.next_below(500)));
        agent.signal(Signal::SIGKILL);
        agent.wait(Duration::from_secs(30));
        killed += 1;
        let done = (
            lines_of(&dir.path().join("out-a")).len(),
            lines_of(&dir.path().join("out-b")).len(),
        );
        eprintln!("after kill {killed}: {done:?} of {LINES} lines each");
        assert!(
            killed > 1 || done.0 < LINES || done.1 < LINES,
            "the first run finished before the kill; make the run longer"
        );
        if lines_of(&dir.path().join("out-a")).len() == LINES
            && lines_of(&dir.path().join("out-b")).len() == LINES
        {
            break;
        }
    }
    let mut agent = Agent::start(dir.path(), config);
    wait_until(Duration::from_secs(240), "every line in its output", || {
        lines_of(&dir.path().join("out-a")).len() >= LINES
            && lines_of(&dir.path().join("out-b")).len() >= LINES
    });
    agent.signal(Signal::SIGTERM);
    assert!(
        agent.wait(Duration::from_secs(60)).success(),
        "{}",
        agent.log()
    );
    for (out, prefix) in [("out-a", "a"), ("out-b", "b")] {
        let lines = lines_of(&dir.path().join(out));
        for (n, line) in lines.iter().enumerate() {
            assert_eq!(
                *line,
                format!("{prefix}-{n}"),
                "CRASH_SEED={seed}, {killed} kills: {out} went wrong at line {n} (a duplicate, a gap or the wrong channel)"
            );
        }
        assert_eq!(lines.len(), LINES, "CRASH_SEED={seed}: {out}");
    }
}

#[test]
fn an_optional_channel_that_is_full_does_not_stop_the_required_one() {
    let dir = tempfile::tempdir().unwrap();
    let dead = free_port();
    // `spare` holds 10 events and its sink cannot deliver (nothing listens on its port), so
    // it is full after the first batch; the required channel still gets every event.
    let config = format!(
        "\
agent:
  data_dir: ./state
sources:
  numbers:
    type: seq
    channels: [main, spare]
    batch_size: 10
    total_events: 5000
    selector: {{ type: replicating, optional: [spare] }}
channels:
  main: {{ type: memory, capacity: 1000 }}
  spare: {{ type: memory, capacity: 10, transaction_capacity: 10 }}
sinks:
  out: {{ type: file_roll, channel: main, directory: ./out }}
  nowhere:
    type: http
    channel: spare
    batch_size: 10
    endpoint: http://127.0.0.1:{dead}/
"
    );
    let mut agent = Agent::start(dir.path(), &config);
    wait_until(Duration::from_secs(60), "5000 events in ./out", || {
        lines_of(&dir.path().join("out")).len() >= 5000
    });
    // `spare` never drains: the first signal waits for it, the second ends the agent.
    agent.signal(Signal::SIGTERM);
    std::thread::sleep(Duration::from_secs(1));
    agent.signal(Signal::SIGTERM);
    agent.wait(Duration::from_secs(30));
    let lines = lines_of(&dir.path().join("out"));
    let expected: Vec<String> = (0..5000).map(|n| n.to_string()).collect();
    assert_eq!(lines, expected);
}

#[test]
fn selectors_with_unknown_channels_or_types_are_refused_with_their_lines() {
    let dir = tempfile::tempdir().unwrap();
    let config = "\
sources:
  numbers:
    type: seq
    channels: [a, b]
    selector:
      type: multiplexin
channels:
  a: { type: memory }
  b: { type: memory }
sinks:
  x: { type: null, channel: a }
  y: { type: null, channel: b }
";
    let file = dir.path().join("p.yaml");
    std::fs::write(&file, config).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agent"))
        .arg("validate")
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(":6:7: source `numbers`: unknown selector type `multiplexin`")
            && stderr.contains("multiplexing"),
        "{stderr}"
    );

    let validate = |text: &str| {
        std::fs::write(&file, text).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_agent"))
            .arg("validate")
            .arg(&file)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let unknown_channels = config.replace(
        "      type: multiplexin\n",
        "      type: multiplexing\n      header: kind\n      mapping: { x: [a, c] }\n      default: d\n",
    );
    let stderr = validate(&unknown_channels);
    assert!(
        stderr.contains(":8:25: source `numbers`: unknown channel `c`")
            && stderr.contains(":9:16: source `numbers`: unknown channel `d`")
            && stderr.contains("2 problems"),
        "{stderr}"
    );
    let misspelt = config.replace(
        "      type: multiplexin\n",
        "      type: multiplexing\n      optinal: {}\n",
    );
    let stderr = validate(&misspelt);
    assert!(
        stderr.contains("optinal") && stderr.contains("`optional`"),
        "{stderr}"
    );
}
