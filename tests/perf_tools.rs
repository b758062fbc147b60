//! `agent producer-perf-test` and `agent consumer-perf-test`, run as the real binary against
//! the bundled broker, with the flags and the output of Kafka's perf-test tools.

#![allow(clippy::unwrap_used)]

use std::process::Output;
use std::time::{Duration, Instant};

use crate::harness;

use crate::harness::agent_ok as ok;

fn run(args: &[&str]) -> Output {
    harness::agent_output(args, None)
}

/// Runs the agent, expects it to fail, and gives its standard error.
fn fails(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        !out.status.success(),
        "agent {args:?} succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stderr).unwrap()
}

/// The bundled broker, run by the agent, without the 3 s wait of a new group's first
/// rebalance (so that short --timeout runs get records).
fn start_broker(dir: &std::path::Path) -> (harness::Agent, String) {
    let port = harness::free_port();
    let config = format!(
        "broker:\n  listen: 127.0.0.1:{port}\n  data_dir: ./broker\n  \
         group_initial_rebalance_delay_ms: 0\n"
    );
    let mut agent = harness::Agent::start(dir, &config);
    let bootstrap = format!("127.0.0.1:{port}");
    agent.wait_listening(&bootstrap, "the broker");
    (agent, bootstrap)
}

fn create_topic(bootstrap: &str, topic: &str, partitions: &str) {
    ok(&[
        "topics",
        "--bootstrap-server",
        bootstrap,
        "--create",
        "--topic",
        topic,
        "--partitions",
        partitions,
        "--replication-factor",
        "1",
    ]);
}

/// The producer's summary: `N records sent, X records/sec (Y MB/sec), Z ms avg latency, W ms
/// max latency, A ms 50th, B ms 95th, C ms 99th, D ms 99.9th.`, checked field by field; gives
/// N.
fn producer_summary(line: &str) -> u64 {
    let fields: Vec<&str> = line
        .strip_suffix('.')
        .unwrap_or_else(|| panic!("no final dot: {line}"))
        .split(", ")
        .collect();
    assert_eq!(fields.len(), 8, "{line}");
    let (count, rate) = fields[0]
        .split_once(" records sent")
        .unwrap_or_else(|| panic!("{line}"));
    assert!(rate.is_empty(), "{line}");
    let (per_sec, mb) = fields[1].split_once(" records/sec (").unwrap();
    // `%f`: six decimals.
    assert_eq!(per_sec.split_once('.').unwrap().1.len(), 6, "{line}");
    per_sec.parse::<f64>().unwrap();
    let mb = mb.strip_suffix(" MB/sec)").unwrap();
    assert_eq!(mb.split_once('.').unwrap().1.len(), 2, "{line}");
    for (field, suffix) in fields[2..4]
        .iter()
        .zip([" ms avg latency", " ms max latency"])
    {
        let value = field
            .strip_suffix(suffix)
            .unwrap_or_else(|| panic!("{line}"));
        assert_eq!(value.split_once('.').unwrap().1.len(), 2, "{line}");
        value.parse::<f64>().unwrap();
    }
    for (field, suffix) in
        fields[4..]
            .iter()
            .zip([" ms 50th", " ms 95th", " ms 99th", " ms 99.9th"])
    {
        field
            .strip_suffix(suffix)
            .unwrap_or_else(|| panic!("{line}"))
            .parse::<u64>()
            .unwrap();
    }
    count.parse().unwrap()
}

const HEADER: &str = "start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, \
                      nMsg.sec, rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec";

/// The consumer's summary line, checked: gives the MB (as printed) and the record count.
fn consumer_summary(line: &str) -> (String, u64) {
    let fields: Vec<&str> = line.split(", ").collect();
    assert_eq!(fields.len(), 10, "{line}");
    for time in &fields[..2] {
        // yyyy-MM-dd HH:mm:ss:SSS
        assert_eq!(time.len(), 23, "{line}");
        assert_eq!(&time[4..5], "-", "{line}");
        assert_eq!(&time[19..20], ":", "{line}");
    }
    for i in [2, 3, 5] {
        assert_eq!(fields[i].split_once('.').unwrap().1.len(), 4, "{line}");
    }
    fields[6].parse::<i64>().unwrap();
    fields[7].parse::<i64>().unwrap();
    (fields[2].to_owned(), fields[4].parse().unwrap())
}

fn end_offsets_sum(bootstrap: &str, topic: &str) -> u64 {
    ok(&[
        "get-offsets",
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
    ])
    .lines()
    .map(|l| l.rsplit(':').next().unwrap().parse::<u64>().unwrap())
    .sum()
}

#[test]
fn records_written_by_producer_perf_test_are_read_back_by_consumer_perf_test() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, bootstrap) = start_broker(dir.path());
    let b = bootstrap.as_str();
    create_topic(b, "perf", "2");
    let out = ok(&[
        "producer-perf-test",
        "--topic",
        "perf",
        "--num-records",
        "20000",
        "--record-size",
        "100",
        "--throughput",
        "-1",
        "--producer-props",
        &format!("bootstrap.servers={b}"),
        "acks=all",
        "linger.ms=5",
    ]);
    let last = out.lines().last().unwrap();
    assert_eq!(producer_summary(last), 20_000, "{out}");
    assert_eq!(end_offsets_sum(b, "perf"), 20_000);

    let out = ok(&[
        "consumer-perf-test",
        "--bootstrap-server",
        b,
        "--topic",
        "perf",
        "--messages",
        "20000",
        "--timeout",
        "10000",
    ]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_eq!(lines[0], HEADER);
    // 20,000 × 100 B = 1.9073 MiB.
    assert_eq!(
        consumer_summary(lines[1]),
        ("1.9073".into(), 20_000),
        "{out}"
    );

    // More asked than there is: the warning after --timeout, then what was read.
    let started = Instant::now();
    let out = ok(&[
        "consumer-perf-test",
        "--broker-list",
        b,
        "--topic",
        "perf",
        "--messages",
        "25000",
        "--timeout",
        "1500",
        "--group",
        "perf-short",
        "--hide-header",
    ]);
    assert!(started.elapsed() >= Duration::from_millis(1500));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_eq!(
        lines[0],
        "WARNING: Exiting before consuming the expected number of messages: timeout (1500 ms) \
         exceeded. You can use the --timeout option to increase the timeout."
    );
    assert_eq!(consumer_summary(lines[1]).1, 20_000, "{out}");

    // The group committed its offsets: from the end, nothing is left to read.
    let out = ok(&[
        "consumer-perf-test",
        "--bootstrap-server",
        b,
        "--topic",
        "perf",
        "--messages",
        "1",
        "--timeout",
        "1000",
        "--group",
        "perf-short",
        "--show-detailed-stats",
    ]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        HEADER.replace("start.time, end.time", "time, threadId"),
        "{out}"
    );
    assert!(lines[1].starts_with("WARNING: Exiting before"), "{out}");
    assert_eq!(lines.len(), 2, "{out}");
}

#[test]
fn a_throttled_run_keeps_to_the_rate_and_prints_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, bootstrap) = start_broker(dir.path());
    let b = bootstrap.as_str();
    create_topic(b, "slow", "1");
    // The servers from --producer.config, as Kafka's tool takes them.
    let config = dir.path().join("producer.properties");
    std::fs::write(
        &config,
        format!("# perf\nbootstrap.servers={b}\nacks=all\nkey.serializer=org.apache.kafka.common.serialization.ByteArraySerializer\n"),
    )
    .unwrap();
    let started = Instant::now();
    let out = ok(&[
        "producer-perf-test",
        "--producer.config",
        config.to_str().unwrap(),
        "--topic",
        "slow",
        "--num-records",
        "4000",
        "--record-size",
        "50",
        "--throughput",
        "2000",
        "--print-metrics",
    ]);
    // 4,000 records at 2,000 a second: about 2 s (a lower bound only: the throttle works).
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "{:?}: {out}",
        started.elapsed()
    );
    let summary = out
        .lines()
        .find(|l| l.contains(" ms 99.9th."))
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(producer_summary(summary), 4000);
    assert!(out.contains("Metric Name"), "{out}");
    let txmsgs = out
        .lines()
        .find(|l| l.starts_with("rdkafka:txmsgs:{"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(txmsgs.ends_with(": 4000.000"), "{txmsgs}");
    assert_eq!(end_offsets_sum(b, "slow"), 4000);

    // --payload-monotonic: the payloads are the record numbers.
    create_topic(b, "numbers", "1");
    let out = ok(&[
        "producer-perf-test",
        "--bootstrap-server",
        b,
        "--topic",
        "numbers",
        "--num-records",
        "12",
        "--payload-monotonic",
        "--throughput",
        "-1",
    ]);
    assert_eq!(producer_summary(out.lines().last().unwrap()), 12, "{out}");
    let out = ok(&[
        "consumer-perf-test",
        "--bootstrap-server",
        b,
        "--topic",
        "numbers",
        "--messages",
        "12",
        "--hide-header",
    ]);
    // "0" to "9" and "10", "11": 14 bytes.
    assert_eq!(
        consumer_summary(out.lines().next().unwrap()),
        (format!("{:.4}", 14.0 / 1_048_576.0), 12),
        "{out}"
    );
}

#[test]
fn a_transactional_run_leaves_committed_records() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, bootstrap) = start_broker(dir.path());
    let b = bootstrap.as_str();
    create_topic(b, "txn", "1");
    let payloads = dir.path().join("payloads.txt");
    std::fs::write(&payloads, "alpha|beta|gamma").unwrap();
    let out = ok(&[
        "producer-perf-test",
        "--bootstrap-server",
        b,
        "--topic",
        "txn",
        "--num-records",
        "3000",
        "--payload-file",
        payloads.to_str().unwrap(),
        "--payload-delimiter",
        "|",
        "--throughput",
        "6000",
        "--transactional-id",
        "perf-txn",
        "--transaction-duration-ms",
        "100",
    ]);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("Reading payloads from: "), "{out}");
    assert!(lines[0].ends_with("payloads.txt"), "{out}");
    assert_eq!(lines[1], "Number of messages read: 3", "{out}");
    assert_eq!(producer_summary(lines.last().unwrap()), 3000, "{out}");
    // Several transactions, each ending in a marker: more offsets than records.
    let end = end_offsets_sum(b, "txn");
    assert!(end > 3001, "end offset {end}");

    let config = dir.path().join("consumer.properties");
    std::fs::write(&config, "isolation.level=read_committed\n").unwrap();
    let out = ok(&[
        "consumer-perf-test",
        "--bootstrap-server",
        b,
        "--topic",
        "txn",
        "--messages",
        "3000",
        "--timeout",
        "10000",
        "--consumer.config",
        config.to_str().unwrap(),
        "--date-format",
        "yyyy-MM-dd HH:mm:ss:SSS",
    ]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_eq!(consumer_summary(lines[1]).1, 3000, "{out}");
}

#[test]
fn bad_flags_are_refused_with_what_is_wrong() {
    let base = [
        "producer-perf-test",
        "--bootstrap-server",
        "127.0.0.1:1",
        "--num-records",
        "10",
        "--throughput",
        "-1",
    ];
    let with = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        fails(&args)
    };
    let err = with(&["--topic", "t", "--record-size", "0"]);
    assert!(
        err.contains("--record-size 0: must be at least 1 byte"),
        "{err}"
    );
    let err = with(&["--record-size", "10"]);
    assert!(err.contains("--topic"), "{err}");
    let err = with(&["--topic", "t"]);
    assert!(err.contains("--record-size"), "{err}");
    let err = with(&["--topic", "t", "--payload-file", "/nonexistent/payloads"]);
    assert!(err.contains("/nonexistent/payloads: cannot read"), "{err}");
    let err = fails(&[
        "producer-perf-test",
        "--topic",
        "t",
        "--num-records",
        "10",
        "--record-size",
        "10",
        "--throughput",
        "0",
    ]);
    assert!(err.contains("--throughput 0"), "{err}");
    let err = fails(&[
        "producer-perf-test",
        "--topic",
        "t",
        "--num-records",
        "10",
        "--record-size",
        "10",
        "--throughput",
        "-1",
    ]);
    assert!(err.contains("no servers to connect to"), "{err}");
    let err = with(&[
        "--topic",
        "t",
        "--record-size",
        "10",
        "--producer-props",
        "buffer.memory",
    ]);
    assert!(
        err.contains("expected key=value, got `buffer.memory`"),
        "{err}"
    );
    // Nothing listens on port 1: every record fails, the summary says 0 and the exit is 1.
    let out = run(&[
        "producer-perf-test",
        "--bootstrap-server",
        "127.0.0.1:1",
        "--topic",
        "t",
        "--num-records",
        "5",
        "--record-size",
        "10",
        "--throughput",
        "-1",
        "--producer-props",
        "message.timeout.ms=500",
    ]);
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("0 records sent, "), "{stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("5 of 5 records were not delivered to t; first error: ")
            && stderr.contains("timed out"),
        "{stderr}"
    );
    let err = fails(&[
        "consumer-perf-test",
        "--bootstrap-server",
        "127.0.0.1:1",
        "--topic",
        "t",
        "--messages",
        "10",
        "--date-format",
        "yyyy-qq",
    ]);
    assert!(err.contains("unknown pattern letter `q`"), "{err}");
    let err = fails(&[
        "consumer-perf-test",
        "--bootstrap-server",
        "127.0.0.1:1",
        "--messages",
        "10",
    ]);
    assert!(err.contains("--topic"), "{err}");
}
