//! Live reload end to end: the real agent, its pipeline file edited while events flow
//! through a file channel.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::harness::{Agent, read_dir_concat, wait_until};
use nix::sys::signal::Signal;

const TOTAL: u64 = 200_000;

/// seq → file channel → file_roll sinks; `sinks` is the `sinks:` section.
fn pipeline(sinks: &str) -> String {
    format!(
        "\
agent:
  data_dir: ./state
sources:
  numbers:
    type: seq
    channels: [buffer]
    batch_size: 20
    total_events: {TOTAL}
channels:
  buffer: {{ type: file, capacity: 5000, transaction_capacity: 1000 }}
sinks:
{sinks}"
    )
}

/// Every number delivered, across the sinks' directories, and how many lines in all.
fn delivered(dir: &std::path::Path) -> (BTreeSet<u64>, usize) {
    let mut seen = BTreeSet::new();
    let mut lines = 0;
    for out in ["out-a", "out-b"] {
        let text = String::from_utf8(read_dir_concat(&dir.join(out))).unwrap();
        for line in text.lines() {
            lines += 1;
            seen.insert(line.parse::<u64>().unwrap());
        }
    }
    (seen, lines)
}

fn count(log: &str, needle: &str) -> usize {
    log.matches(needle).count()
}

#[test]
fn edits_apply_while_events_flow_and_every_event_arrives_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipeline.yaml");
    let sink_a = "  a: { type: file_roll, channel: buffer, directory: ./out-a, batch_size: 50 }\n";
    let sink_b = |batch: u32| {
        format!(
            "  b: {{ type: file_roll, channel: buffer, directory: ./out-b, batch_size: {batch} }}\n"
        )
    };
    // The agent runs `dir/pipeline.yaml` and watches it.
    let mut agent = Agent::start(dir.path(), &pipeline(sink_a));
    wait_until(Duration::from_secs(60), "the agent to start", || {
        agent.log().contains("pipeline started")
    });
    let edit = |text: String, what: &str, expect: &str, n: usize| {
        std::fs::write(&file, text).unwrap();
        let started = Instant::now();
        wait_until(Duration::from_secs(30), what, || {
            count(&agent.log(), expect) >= n
        });
        eprintln!("{what}: applied in {:?}", started.elapsed());
    };
    // 1. A second sink on the channel.
    edit(
        pipeline(&format!("{sink_a}{}", sink_b(30))),
        "adding sink b",
        "pipeline reloaded",
        1,
    );
    let after_add = delivered(dir.path()).1;
    // 2. One of its options changes: it stops after what it has in flight and starts again.
    edit(
        pipeline(&format!("{sink_a}{}", sink_b(70))),
        "changing sink b",
        "pipeline reloaded",
        2,
    );
    // 3. A mistake: refused, the running pipeline goes on as it is.
    edit(
        pipeline(&format!(
            "{sink_a}  c: {{ type: file_roll, channel: buffer, directory: ./out-c, batch_sise: 5 }}\n"
        )),
        "refusing the broken version",
        "is not applied",
        1,
    );
    // 4. The mistake fixed (sink c becomes b again, with another batch size).
    edit(
        pipeline(&format!("{sink_a}{}", sink_b(40))),
        "fixing it",
        "pipeline reloaded",
        3,
    );
    wait_until(Duration::from_secs(240), "every event delivered", || {
        delivered(dir.path()).1 >= TOTAL as usize
    });
    agent.signal(Signal::SIGTERM);
    assert!(agent.wait(Duration::from_secs(60)).success());
    let log = agent.log();
    for line in log
        .lines()
        .filter(|l| l.contains("reload") || l.contains("applied") || l.contains("started"))
    {
        eprintln!("{line}");
    }
    let (seen, lines) = delivered(dir.path());
    assert_eq!(lines, TOTAL as usize, "an event was delivered twice");
    assert_eq!(
        seen,
        (0..TOTAL).collect::<BTreeSet<_>>(),
        "an event is missing"
    );
    assert!(
        after_add < TOTAL as usize,
        "the events had all flowed before the first edit; make the run longer"
    );
    assert!(
        !read_dir_concat(&dir.path().join("out-b")).is_empty(),
        "sink b never delivered"
    );
    assert!(
        !dir.path().join("out-c").exists(),
        "the broken version ran:\n{log}"
    );
    assert!(log.contains("batch_sise"), "the problem is logged:\n{log}");
    assert_eq!(
        count(&log, "source started source=numbers"),
        1,
        "the unchanged source was restarted:\n{log}"
    );
    assert_eq!(
        count(&log, "sink started sink=a"),
        1,
        "sink a was restarted:\n{log}"
    );
    assert_eq!(count(&log, "sink started sink=b"), 3, "{log}");
}

#[test]
fn no_watch_leaves_a_running_agent_alone() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipeline.yaml");
    let sinks = "  a: { type: null, channel: buffer }\n";
    let mut agent = Agent::start_args(dir.path(), &pipeline(sinks), &["--no-watch"]);
    wait_until(Duration::from_secs(60), "the agent to start", || {
        agent.log().contains("pipeline started")
    });
    std::fs::write(
        &file,
        pipeline("  a: { type: null, channel: buffer, batch_size: 7 }\n"),
    )
    .unwrap();
    agent.signal(Signal::SIGHUP);
    std::thread::sleep(Duration::from_secs(2));
    let log = agent.log();
    assert!(!log.contains("pipeline reloaded"), "{log}");
    agent.signal(Signal::SIGTERM);
    agent.wait(Duration::from_secs(30));
}

#[test]
fn a_changed_file_channel_is_rebuilt_with_its_events_and_nothing_is_lost_or_repeated() {
    let dir = tempfile::tempdir().unwrap();
    let sinks = "  a: { type: file_roll, channel: buffer, directory: ./out-a, batch_size: 50 }\n";
    let mut agent = Agent::start(dir.path(), &pipeline(sinks));
    wait_until(Duration::from_secs(60), "some events delivered", || {
        delivered(dir.path()).1 > 1000
    });
    // A bigger channel: the source and the sink stop, the channel is rebuilt over the same
    // segments, and both start again on it.
    let bigger = pipeline(sinks).replace("capacity: 5000,", "capacity: 8000,");
    std::fs::write(dir.path().join("pipeline.yaml"), bigger).unwrap();
    wait_until(Duration::from_secs(30), "the reload", || {
        agent.log().contains("pipeline reloaded")
    });
    let at_reload = delivered(dir.path()).1;
    wait_until(Duration::from_secs(240), "every event delivered", || {
        delivered(dir.path()).1 >= TOTAL as usize
    });
    agent.signal(Signal::SIGTERM);
    assert!(agent.wait(Duration::from_secs(60)).success());
    let log = agent.log();
    let (seen, lines) = delivered(dir.path());
    assert!(
        at_reload < TOTAL as usize,
        "everything had flowed before the edit"
    );
    assert_eq!(lines, TOTAL as usize, "an event was delivered twice");
    assert_eq!(
        seen,
        (0..TOTAL).collect::<BTreeSet<_>>(),
        "an event is missing"
    );
    let reload = log
        .lines()
        .find(|l| l.contains("pipeline reloaded"))
        .unwrap();
    assert!(
        reload.contains("channel buffer")
            && reload.contains("source numbers")
            && reload.contains("sink a"),
        "{reload}"
    );
    assert_eq!(count(&log, "source started source=numbers"), 2, "{log}");
}

#[test]
fn removing_every_source_leaves_the_agent_running_until_it_is_told_to_stop() {
    let dir = tempfile::tempdir().unwrap();
    let sinks = "  a: { type: null, channel: buffer }\n";
    let endless = pipeline(sinks).replace(&format!("    total_events: {TOTAL}\n"), "");
    let mut agent = Agent::start(dir.path(), &endless);
    wait_until(Duration::from_secs(60), "the agent to start", || {
        agent.log().contains("pipeline started")
    });
    let sourceless = endless.replace(
        "sources:\n  numbers:\n    type: seq\n    channels: [buffer]\n    batch_size: 20\n",
        "",
    );
    assert!(!sourceless.contains("numbers"), "{sourceless}");
    std::fs::write(dir.path().join("pipeline.yaml"), sourceless).unwrap();
    wait_until(Duration::from_secs(30), "the reload", || {
        agent.log().contains("pipeline reloaded")
    });
    std::thread::sleep(Duration::from_secs(1));
    let log = agent.log();
    assert!(log.contains("removed=[\"source numbers\"]"), "{log}");
    assert!(
        !log.contains("pipeline stopped"),
        "the agent stopped:\n{log}"
    );
    agent.signal(Signal::SIGTERM);
    assert!(agent.wait(Duration::from_secs(30)).success());
}
