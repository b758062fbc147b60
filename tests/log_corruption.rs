//! Damage in the bundled broker's log on disk, through the real `agent` binary: found after a
//! SIGKILL (recovery) or a clean stop (the scrubber), reported once, read around by a
//! librdkafka consumer that is told CORRUPT_MESSAGE at the damage, shown by
//! `dump-log-segments --verify`, listed by `agent log-repair` and removed by its `--execute`.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::harness::{Agent, free_port, http_get, wait_until};

const RECORDS: usize = 400;

use crate::harness::agent_output as agent;

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A broker-only agent in `dir` (data in `dir/broker`), its metrics on `agent.http`.
struct Broker {
    agent: Agent,
    bootstrap: String,
    http: String,
}

fn start(dir: &Path, scrub: bool) -> Broker {
    let port = free_port();
    let http = free_port();
    let scrub_ms = if scrub { 100 } else { 0 };
    let config = format!(
        "agent:\n  http: 127.0.0.1:{http}\nbroker:\n  listen: 127.0.0.1:{port}\n  data_dir: ./broker\n  \
         log_scrub_interval_ms: {scrub_ms}\n  log_scrub_bytes_per_sec: 104857600\n"
    );
    let mut agent = Agent::start(dir, &config);
    let bootstrap = format!("127.0.0.1:{port}");
    agent.wait_listening(&bootstrap, "the broker");
    let http = format!("127.0.0.1:{http}");
    wait_until(Duration::from_secs(30), "the HTTP server", || {
        std::net::TcpStream::connect(&http).is_ok()
    });
    Broker {
        agent,
        bootstrap,
        http,
    }
}

impl Broker {
    fn damaged_ranges(&self, topic: &str) -> Option<String> {
        let (_, metrics) = http_get(&self.http, "/metrics");
        metrics
            .lines()
            .find(|l| {
                l.starts_with("kafka_log_damaged_ranges{")
                    && l.contains(&format!("topic=\"{topic}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_owned)
    }

    fn damage_reports(&self) -> usize {
        self.agent
            .log()
            .lines()
            .filter(|l| l.contains("damaged record batches"))
            .count()
    }

    fn stop(mut self) {
        self.agent.signal(Signal::SIGTERM);
        assert!(self.agent.wait(Duration::from_secs(30)).success());
    }
}

/// Creates `topic` with segments of `segment_bytes` and writes `RECORDS` records keyed by their
/// offset in small batches.
fn fill(bootstrap: &str, topic: &str, segment_bytes: u32) {
    let segment_bytes = format!("segment.bytes={segment_bytes}");
    ok(
        agent(
            &[
                "topics",
                "--bootstrap-server",
                bootstrap,
                "--create",
                "--topic",
                topic,
                "--partitions",
                "1",
                "--config",
                &segment_bytes,
            ],
            None,
        ),
        "topics --create",
    );
    let input: String = (0..RECORDS)
        .map(|i| format!("{i}\tvalue-{i:05}-{}\n", "x".repeat(40)))
        .collect();
    ok(
        agent(
            &[
                "console-producer",
                "--bootstrap-server",
                bootstrap,
                "--topic",
                topic,
                "--property",
                "parse.key=true",
                "--producer-property",
                "batch.size=800",
                "--producer-property",
                "linger.ms=5",
            ],
            Some(input.as_bytes()),
        ),
        "console-producer",
    );
}

/// (position, base offset, last offset, size) of each batch of a segment file.
fn batches(path: &Path) -> Vec<(usize, i64, i64, usize)> {
    let bytes = std::fs::read(path).unwrap();
    let mut out = Vec::new();
    let mut at = 0;
    while at + 61 <= bytes.len() {
        let base = i64::from_be_bytes(bytes[at..at + 8].try_into().unwrap());
        let size = 12 + i32::from_be_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        let delta = i32::from_be_bytes(bytes[at + 23..at + 27].try_into().unwrap());
        out.push((at, base, base + i64::from(delta), size));
        at += size;
    }
    out
}

fn first_segment(dir: &Path, topic: &str) -> PathBuf {
    dir.join("broker")
        .join(format!("{topic}-0"))
        .join(format!("{:020}.log", 0))
}

/// The keys `console-consumer` prints reading partition 0 from `offset`: (keys, success,
/// standard error).
fn consume(bootstrap: &str, topic: &str, offset: i64, max: usize) -> (Vec<i64>, bool, String) {
    let offset = offset.to_string();
    let max = max.to_string();
    let out = agent(
        &[
            "console-consumer",
            "--bootstrap-server",
            bootstrap,
            "--topic",
            topic,
            "--partition",
            "0",
            "--offset",
            &offset,
            "--max-messages",
            &max,
            "--timeout-ms",
            "10000",
            "--property",
            "print.key=true",
            "--consumer-property",
            "check.crcs=true",
        ],
        None,
    );
    let keys = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.split('\t').next().unwrap().parse().unwrap())
        .collect();
    (
        keys,
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// What must hold once batch `lost` of the first segment is damaged and the broker runs on the
/// data: the damage reported once and in the metrics, everything around it readable, the
/// damaged offsets answered CORRUPT_MESSAGE; then `dump-log-segments --verify`, `log-repair`
/// (dry run, then `--execute`) and a full read with offsets kept.
/// `lost` is the damaged batch: its position, size, first and last offset.
fn check_damage_then_repair(
    dir: &Path,
    broker: Broker,
    topic: &str,
    lost: (usize, usize, i64, i64),
) {
    let (position, size, first_lost, last_lost) = lost;
    wait_until(Duration::from_secs(20), "the damage metric", || {
        broker.damaged_ranges(topic).as_deref() == Some("1")
    });
    let (status, health) = http_get(&broker.http, "/health");
    assert_eq!(status, 200);
    for field in [
        "\"damaged_logs\":[".to_owned(),
        format!("\"topic\":\"{topic}\""),
        "\"damaged_ranges\":1".to_owned(),
        format!("\"damaged_bytes\":{size}"),
    ] {
        assert!(health.contains(&field), "{field} in {health}");
    }
    let (keys, success, stderr) = consume(&broker.bootstrap, topic, 0, RECORDS);
    assert!(!success, "the consumer is told of the damage");
    assert!(stderr.contains("Invalid message"), "{stderr}");
    assert_eq!(keys, (0..first_lost).collect::<Vec<_>>());
    let rest = RECORDS - last_lost as usize - 1;
    let (keys, success, stderr) = consume(&broker.bootstrap, topic, last_lost + 1, rest);
    assert!(success, "{stderr}");
    assert_eq!(keys, (last_lost + 1..RECORDS as i64).collect::<Vec<_>>());
    // Fetched again and again (librdkafka retries every fetch backoff): reported once.
    let (keys, success, _) = consume(&broker.bootstrap, topic, first_lost, 1);
    assert!(keys.is_empty() && !success);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(broker.damage_reports(), 1, "{}", broker.agent.log());
    let report = broker
        .agent
        .log()
        .lines()
        .find(|l| l.contains("damaged record batches"))
        .unwrap()
        .to_owned();
    for field in [
        format!("topic={topic}"),
        "partition=0".to_owned(),
        format!("position={position}"),
        format!("first_offset={first_lost}"),
        format!("last_offset={last_lost}"),
        "00000000000000000000.log".to_owned(),
    ] {
        assert!(report.contains(&field), "{field} in {report}");
    }
    // Not while the broker runs.
    let data_dir = dir.join("broker");
    let data_arg = data_dir.to_str().unwrap();
    let refused = agent(&["log-repair", "--data-dir", data_arg, "--execute"], None);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("no clean-shutdown marker"), "{stderr}");
    broker.stop();

    let segment = first_segment(dir, topic);
    let segment_arg = segment.to_str().unwrap();
    let verify = agent(
        &["dump-log-segments", "--files", segment_arg, "--verify"],
        None,
    );
    assert!(!verify.status.success());
    let dump = String::from_utf8(verify.stdout).unwrap();
    assert!(
        dump.contains(&format!(
            "Damaged bytes at position {position} to {} ",
            position + size
        )),
        "{dump}"
    );
    assert!(
        dump.contains(&format!("baseOffset: {} ", last_lost + 1)),
        "the batches after the damage are dumped: {dump}"
    );

    let before = std::fs::read(&segment).unwrap();
    let dry = ok(
        agent(&["log-repair", "--data-dir", data_arg], None),
        "log-repair",
    );
    assert!(
        dry.contains(&format!("offsets {first_lost} to {last_lost}): "))
            && dry.contains(segment_arg),
        "{dry}"
    );
    assert!(dry.contains("nothing changed"), "{dry}");
    assert_eq!(
        std::fs::read(&segment).unwrap(),
        before,
        "a dry run changes nothing"
    );
    let done = ok(
        agent(&["log-repair", "--data-dir", data_arg, "--execute"], None),
        "log-repair --execute",
    );
    assert!(done.contains("removed 1 damaged range(s)"), "{done}");
    let again = ok(
        agent(&["log-repair", "--data-dir", data_arg], None),
        "log-repair",
    );
    assert!(again.contains("no damaged ranges"), "{again}");
    let dump = ok(
        agent(&["dump-log-segments", "--files", segment_arg], None),
        "dump-log-segments",
    );
    assert!(
        dump.contains(&format!("baseOffset: {} ", last_lost + 1)),
        "offsets kept: {dump}"
    );

    let broker = start(dir, false);
    let kept = RECORDS - (last_lost - first_lost + 1) as usize;
    let (keys, success, stderr) = consume(&broker.bootstrap, topic, 0, kept);
    assert!(success, "{stderr}");
    let expected: Vec<i64> = (0..RECORDS as i64)
        .filter(|o| !(first_lost..=last_lost).contains(o))
        .collect();
    assert_eq!(keys, expected);
    assert_eq!(broker.damaged_ranges(topic).as_deref(), Some("0"));
    let (_, health) = http_get(&broker.http, "/health");
    assert!(!health.contains("damaged_logs"), "{health}");
    broker.stop();
}

#[test]
fn flipped_bytes_in_a_closed_segment_after_a_sigkill_are_found_read_around_and_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path(), false);
    fill(&broker.bootstrap, "killed", 4096);
    let mut agent = broker.agent;
    agent.signal(Signal::SIGKILL);
    agent.wait(Duration::from_secs(10));
    let segment = first_segment(dir.path(), "killed");
    let batches = batches(&segment);
    assert!(batches.len() >= 4, "{batches:?}");
    let (at, first, last, size) = batches[2];
    let mut data = std::fs::read(&segment).unwrap();
    data[at + size - 5] ^= 0x01;
    std::fs::write(&segment, data).unwrap();
    // Recovery finds it if the segment is past the recovery point (not yet fsynced when the
    // broker was killed), else the scrubber does.
    let broker = start(dir.path(), true);
    check_damage_then_repair(dir.path(), broker, "killed", (at, size, first, last));
}

#[test]
fn after_a_sigkill_recovery_checks_every_crc_and_cuts_only_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path(), false);
    // One segment: the active one, which recovery always checks.
    fill(&broker.bootstrap, "torn", 1 << 30);
    let mut agent = broker.agent;
    agent.signal(Signal::SIGKILL);
    agent.wait(Duration::from_secs(10));
    let segment = first_segment(dir.path(), "torn");
    let batches = batches(&segment);
    assert!(batches.len() >= 4, "{batches:?}");
    let (at, first, last, size) = batches[2];
    let mut data = std::fs::read(&segment).unwrap();
    let intact = data.len();
    data[at + size - 5] ^= 0x01;
    // Half a batch the kill interrupted.
    let torn = data[..40].to_vec();
    data.extend_from_slice(&torn);
    std::fs::write(&segment, data).unwrap();
    // No scrubber: recovery finds the damage, keeps the batches after it, cuts the tail.
    let broker = start(dir.path(), false);
    assert_eq!(std::fs::metadata(&segment).unwrap().len(), intact as u64);
    check_damage_then_repair(dir.path(), broker, "torn", (at, size, first, last));
}

#[test]
fn flipped_bytes_after_a_clean_stop_are_found_by_the_scrubber_read_around_and_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path(), false);
    fill(&broker.bootstrap, "stopped", 4096);
    broker.stop();
    let segment = first_segment(dir.path(), "stopped");
    let batches = batches(&segment);
    assert!(batches.len() >= 4, "{batches:?}");
    let (at, first, last, size) = batches[1];
    let mut data = std::fs::read(&segment).unwrap();
    data[at + size - 5] ^= 0x80;
    std::fs::write(&segment, data).unwrap();
    let broker = start(dir.path(), true);
    check_damage_then_repair(dir.path(), broker, "stopped", (at, size, first, last));
}

#[test]
fn a_damaged_batch_length_after_a_clean_stop_is_reported_once_and_read_around() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path(), false);
    fill(&broker.bootstrap, "length", 4096);
    broker.stop();
    let segment = first_segment(dir.path(), "length");
    let batches = batches(&segment);
    let (at, first, last, size) = batches[2];
    let mut data = std::fs::read(&segment).unwrap();
    data[at + 8..at + 12].copy_from_slice(&0x7fff_ff00i32.to_be_bytes());
    std::fs::write(&segment, data).unwrap();
    // No scrubber: a fetch meets it. Nothing is reported before a consumer gets there.
    let broker = start(dir.path(), false);
    assert_eq!(broker.damaged_ranges("length").as_deref(), Some("0"));
    let (keys, success, _) = consume(&broker.bootstrap, "length", 0, RECORDS);
    assert!(!success);
    assert_eq!(keys, (0..first).collect::<Vec<_>>());
    check_damage_then_repair(dir.path(), broker, "length", (at, size, first, last));
}
