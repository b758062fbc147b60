//! Crash safety end to end: the real agent, killed with SIGKILL at random moments and
//! restarted, must deliver every event exactly once through a durable channel.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::sys::signal::Signal;

#[path = "harness.rs"]
mod harness;

use harness::{Agent, read_dir_concat, wait_until};

/// A small deterministic generator for kill delays (the seed is printed to replay a run).
struct Lcg(u64);

impl Lcg {
    fn next_below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

#[test]
fn seq_through_file_channel_to_file_roll_is_exactly_once_across_sigkills() {
    const TOTAL: usize = 1_000_000;
    let seed = std::env::var("CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    println!("CRASH_SEED={seed}");
    let mut rng = Lcg(seed);
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "\
agent:
  data_dir: ./state
sources:
  numbers:
    type: seq
    channels: [durable]
    batch_size: 500
    total_events: {TOTAL}
channels:
  durable:
    type: file
    capacity: 20000
    transaction_capacity: 1000
sinks:
  files:
    type: file_roll
    channel: durable
    batch_size: 700
    directory: ./out
    roll_size: 256KiB
"
    );
    let out = dir.path().join("out");
    let written = || read_dir_concat(&out).len();
    for round in 0..10 {
        let mut agent = Agent::start(dir.path(), &config);
        // Let it make some progress (or finish starting), then kill it mid-flight.
        let before = written();
        wait_until(
            Duration::from_secs(60),
            "the agent to start writing",
            || written() > before || agent.log().contains("pipeline started"),
        );
        std::thread::sleep(Duration::from_millis(50 + rng.next_below(400)));
        agent.signal(Signal::SIGKILL);
        let status = agent.wait(Duration::from_secs(30));
        assert!(
            !status.success(),
            "round {round}: the agent finished before the kill"
        );
    }
    // The last run goes to completion: the source ends, the channel drains, the agent exits.
    let mut agent = Agent::start(dir.path(), &config);
    let status = agent.wait(Duration::from_secs(300));
    assert!(status.success(), "{status:?}\n{}", agent.log());
    let text = String::from_utf8(read_dir_concat(&out)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    for (expected, line) in lines.iter().enumerate() {
        assert_eq!(
            *line,
            expected.to_string(),
            "CRASH_SEED={seed}: at event {expected} the output went wrong (duplicate, gap or reorder)"
        );
    }
    assert_eq!(lines.len(), TOTAL, "CRASH_SEED={seed}");
}
