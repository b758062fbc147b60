//! End to end: poison events. An `http` sink whose endpoint refuses one event of a batch for
//! good (400) delivers the others and moves that one to its `dead_letter` file channel, once,
//! across SIGKILLs; a transient 503 is retried, not dead-lettered; without `dead_letter` the
//! batch is retried and the log says why; `agent dead-letters` lists the dead letters and
//! replays them; a bad `dead_letter` is refused by `agent validate`.

#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::harness::{Agent, Lcg, Received, crash_seed, http_server_reading, wait_until};

/// The event the test endpoints refuse: the seq source's event 42.
const MARKED: &str = r#""body":"42""#;

/// seq (100 events, one batch) → file channel `buffer` → http sink `remote` (one batch of
/// 100), with `dead_letter: dlq` when `dead_letter`.
fn pipeline(http_port: u16, dead_letter: bool) -> String {
    let (option, channel) = if dead_letter {
        ("    dead_letter: dlq\n", "  dlq:\n    type: file\n")
    } else {
        ("", "")
    };
    format!(
        "\
agent:
  data_dir: ./state
sources:
  numbers:
    type: seq
    channels: [buffer]
    batch_size: 100
    total_events: 100
channels:
  buffer:
    type: file
{channel}sinks:
  remote:
    type: http
    channel: buffer
    batch_size: 100
    endpoint: http://127.0.0.1:{http_port}/
{option}"
    )
}

/// `agent dead-letters ARGS --config pipeline.yaml` in `dir`: exit code, stdout, stderr.
fn dead_letters(dir: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_agent"))
        .arg("dead-letters")
        .args(args)
        .args(["--config", "pipeline.yaml"])
        .current_dir(dir)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The lines `agent dead-letters list` prints for `channel`.
fn listed(dir: &std::path::Path, channel: &str) -> Vec<String> {
    let (code, out, err) = dead_letters(dir, &["list", "--channel", channel]);
    assert_eq!(code, 0, "{err}");
    out.lines().map(str::to_owned).collect()
}

/// How often each of the events 0..100 was accepted.
fn accepted(received: &Received) -> Vec<usize> {
    let mut counts = vec![0; 100];
    for body in received.bodies.lock().unwrap().iter() {
        counts[body.parse::<usize>().unwrap()] += 1;
    }
    counts
}

fn run_to_end(dir: &std::path::Path, config: &str) -> Agent {
    let mut agent = Agent::start(dir, config);
    let status = agent.wait(Duration::from_secs(60));
    assert!(status.success(), "{status:?}\n{}", agent.log());
    agent
}

#[test]
fn a_refused_event_is_dead_lettered_once_and_the_others_delivered_across_sigkills() {
    // Slow enough that the kills land while the batch is being split.
    let (port, received) = http_server_reading(
        |_, body| if body.contains(MARKED) { 400 } else { 200 },
        Duration::from_millis(25),
    );
    let dir = tempfile::tempdir().unwrap();
    let config = pipeline(port, true);
    let seed = crash_seed();
    let mut rng = Lcg(seed);
    for _ in 0..6 {
        let mut agent = Agent::start(dir.path(), &config);
        wait_until(Duration::from_secs(60), "the agent to start", || {
            agent.log().contains("pipeline started")
        });
        std::thread::sleep(Duration::from_millis(rng.next_below(600)));
        agent.signal(Signal::SIGKILL);
        agent.wait(Duration::from_secs(30));
    }
    run_to_end(dir.path(), &config);

    // The http sink delivers at least once: a kill after the endpoint accepted a half but
    // before the take committed sends that half again on the next run.
    let counts = accepted(&received);
    for (i, n) in counts.iter().enumerate() {
        if i == 42 {
            assert_eq!(*n, 0, "CRASH_SEED={seed}: the refused event was accepted");
        } else {
            assert!(*n >= 1, "CRASH_SEED={seed}: event {i} was never delivered");
        }
    }
    let repeated: usize = counts.iter().map(|n| n.saturating_sub(1)).sum();
    println!("{repeated} events delivered again after the kills (at-least-once)");
    // The dead letter, though, is there exactly once: it moved in the take's transaction.
    let letters = listed(dir.path(), "dlq");
    assert_eq!(letters.len(), 1, "CRASH_SEED={seed}: {letters:?}");
    let letter = &letters[0];
    assert!(letter.contains(r#"body="42""#), "{letter}");
    assert!(letter.contains("sink=remote channel=buffer"), "{letter}");
    assert!(letter.contains("400"), "{letter}");
    assert!(
        listed(dir.path(), "buffer").is_empty(),
        "the sink's channel is drained"
    );
}

#[test]
fn a_transient_503_is_retried_and_delivered_not_dead_lettered() {
    let (port, received) =
        http_server_reading(|n, _| if n < 3 { 503 } else { 200 }, Duration::ZERO);
    let dir = tempfile::tempdir().unwrap();
    let agent = run_to_end(dir.path(), &pipeline(port, true));
    assert_eq!(received.refused.load(Ordering::SeqCst), 3);
    assert_eq!(accepted(&received), vec![1; 100], "each event once");
    assert!(listed(dir.path(), "dlq").is_empty());
    assert!(!agent.log().contains("for good"), "{}", agent.log());
}

#[test]
fn without_dead_letter_a_refused_batch_is_retried_kept_and_the_log_says_it_is_permanent() {
    let (port, received) = http_server_reading(
        |_, body| if body.contains(MARKED) { 400 } else { 200 },
        Duration::ZERO,
    );
    let dir = tempfile::tempdir().unwrap();
    let mut agent = Agent::start(dir.path(), &pipeline(port, false));
    wait_until(Duration::from_secs(30), "three refusals", || {
        received.refused.load(Ordering::SeqCst) >= 3
    });
    let log = agent.log();
    assert!(log.contains("permanent failure"), "{log}");
    assert!(log.contains("set `dead_letter` on this sink"), "{log}");
    // The throttle: one line for the refusals so far, not one per retry.
    assert_eq!(log.matches("permanent failure").count(), 1, "{log}");
    assert!(received.bodies.lock().unwrap().is_empty());
    // The tool refuses to touch the data directory of a running agent.
    let (code, _, err) = dead_letters(dir.path(), &["list", "--channel", "buffer"]);
    assert_ne!(code, 0);
    assert!(err.contains("is in use by the agent with pid"), "{err}");
    agent.signal(Signal::SIGKILL);
    agent.wait(Duration::from_secs(30));
    // Nothing was dropped: all 100 events wait in the channel.
    assert_eq!(listed(dir.path(), "buffer").len(), 100);
}

#[test]
fn dead_letters_are_listed_and_a_replay_delivers_them_once_the_endpoint_accepts() {
    let accept_all = Arc::new(AtomicBool::new(false));
    let (port, received) = {
        let accept_all = Arc::clone(&accept_all);
        http_server_reading(
            move |_, body| {
                if body.contains(MARKED) && !accept_all.load(Ordering::SeqCst) {
                    400
                } else {
                    200
                }
            },
            Duration::ZERO,
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let config = pipeline(port, true);
    let agent = run_to_end(dir.path(), &config);
    assert!(
        agent
            .log()
            .contains("moved them to the dead-letter channel"),
        "{}",
        agent.log()
    );
    let mut counts = accepted(&received);
    assert_eq!(counts[42], 0);
    counts[42] = 1;
    assert_eq!(counts, vec![1; 100]);

    let letters = listed(dir.path(), "dlq");
    assert_eq!(letters.len(), 1, "{letters:?}");
    let seq = letters[0].split(' ').next().unwrap().to_owned();
    assert!(letters[0].contains("time=20"), "{}", letters[0]);

    // A channel the file does not have is named, with those it has.
    let (code, _, err) = dead_letters(
        dir.path(),
        &[
            "replay",
            "--channel",
            "dlq",
            "--from",
            &seq,
            "--into",
            "nope",
        ],
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("has no channel `nope` (channels: buffer, dlq)"),
        "{err}"
    );

    accept_all.store(true, Ordering::SeqCst);
    let (code, _, err) = dead_letters(
        dir.path(),
        &[
            "replay",
            "--channel",
            "dlq",
            "--from",
            &seq,
            "--to",
            &seq,
            "--into",
            "buffer",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("replayed 1 events"), "{err}");
    assert!(listed(dir.path(), "dlq").is_empty());
    let back = listed(dir.path(), "buffer");
    assert_eq!(back.len(), 1);
    assert!(
        back[0].contains("sink=- channel=-"),
        "headers dropped: {}",
        back[0]
    );

    run_to_end(dir.path(), &config);
    assert_eq!(
        accepted(&received),
        vec![1; 100],
        "42 delivered once, after the replay"
    );
    assert!(listed(dir.path(), "buffer").is_empty());
}

#[test]
fn a_dead_letter_that_is_unknown_or_the_sinks_own_channel_is_refused_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let validate = |config: String| {
        let file = dir.path().join("pipeline.yaml");
        std::fs::write(&file, config).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_agent"))
            .arg("validate")
            .arg(&file)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let good = pipeline(1, true);
    assert_eq!(validate(good.clone()).0, Some(0));

    // A memory dead-letter channel is allowed, with a warning about what a crash loses.
    let (code, err) = validate(good.replace("  dlq:\n    type: file", "  dlq:\n    type: memory"));
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("warning: "), "{err}");
    assert!(
        err.contains("dead_letter `dlq` is a memory channel"),
        "{err}"
    );

    let (code, err) = validate(good.replace("dead_letter: dlq", "dead_letter: dlqq"));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("pipeline.yaml:20"), "{err}");
    assert!(err.contains("unknown channel `dlqq`"), "{err}");
    assert!(err.contains("`dlq`"), "the closest name: {err}");

    let (code, err) = validate(good.replace("dead_letter: dlq", "dead_letter: buffer"));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("pipeline.yaml:20"), "{err}");
    assert!(
        err.contains("cannot be `buffer`, the channel this sink takes from"),
        "{err}"
    );
}
