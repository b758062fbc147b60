//! The flags of the agent's Kafka-style tools, spelled and answered as Kafka's own tools
//! (`kafka-topics.sh`, `kafka-console-consumer.sh`, `kafka-dump-log.sh`) spell and answer them,
//! run as the real binary against the bundled broker.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;

#[path = "harness.rs"]
mod harness;

/// Runs the agent with `args` (and `stdin`), whatever its exit status.
fn run(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_agent"))
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(input) = stdin {
        child.stdin.take().unwrap().write_all(input).unwrap();
    }
    child.wait_with_output().unwrap()
}

/// Runs the agent and expects exit status 0; gives its standard output.
fn ok(args: &[&str]) -> String {
    let out = run(args, None);
    assert!(
        out.status.success(),
        "agent {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn topics(bootstrap: &str, args: &[&str]) -> Vec<String> {
    let mut all = vec![
        "topics".to_owned(),
        "--bootstrap-server".into(),
        bootstrap.into(),
    ];
    all.extend(args.iter().map(|a| (*a).to_owned()));
    all
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn topics_flags_answer_as_kafka_topics_does() {
    let dir = tempfile::tempdir().unwrap();
    let (mut broker, bootstrap) = harness::broker_agent(dir.path(), 1);
    let b = bootstrap.as_str();
    let t = |args: &[&str]| topics(b, args);
    ok(&strs(&t(&[
        "--create",
        "--topic",
        "alpha",
        "--partitions",
        "2",
        "--config",
        "retention.ms=60000",
    ])));
    ok(&strs(&t(&["--create", "--topic", "beta"])));
    ok(&strs(&t(&["--create", "--topic", "__meta"])));

    // A missing topic is reported as Kafka reports it, and not created by asking.
    let missing = run(&strs(&t(&["--describe", "--topic", "nosuch"])), None);
    assert_eq!(missing.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&missing.stdout),
        "Error while executing topic command : Topic 'nosuch' does not exist as expected\n"
    );
    assert_eq!(ok(&strs(&t(&["--list"]))), "__meta\nalpha\nbeta\n");
    for action in [
        &["--describe", "--topic", "nosuch", "--if-exists"][..],
        &["--delete", "--topic", "nosuch", "--if-exists"],
        &[
            "--alter",
            "--topic",
            "nosuch",
            "--partitions",
            "3",
            "--if-exists",
        ],
    ] {
        assert_eq!(ok(&strs(&t(action))), "", "{action:?}");
    }
    let delete = run(&strs(&t(&["--delete", "--topic", "nosuch"])), None);
    assert_eq!(delete.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&delete.stdout)
            .contains("Topic 'nosuch' does not exist as expected")
    );
    assert_eq!(ok(&strs(&t(&["--list"]))), "__meta\nalpha\nbeta\n");

    // --topic is a regular expression matching whole names.
    assert_eq!(ok(&strs(&t(&["--list", "--topic", "a.*"]))), "alpha\n");
    assert_eq!(ok(&strs(&t(&["--list", "--topic", "alp"]))), "");
    assert_eq!(
        ok(&strs(&t(&["--list", "--exclude-internal"]))),
        "alpha\nbeta\n"
    );
    assert_eq!(
        ok(&strs(&t(&[
            "--create",
            "--topic",
            "alpha",
            "--if-not-exists"
        ]))),
        ""
    );

    // Kafka 3.x's layout, with the topic id.
    let described = ok(&strs(&t(&["--describe", "--topic", "alpha"])));
    let lines: Vec<&str> = described.lines().collect();
    assert_eq!(lines.len(), 3, "{described}");
    let fields: Vec<&str> = lines[0].split('\t').collect();
    assert_eq!(fields.len(), 5, "{described}");
    assert_eq!(fields[0], "Topic: alpha");
    let id = fields[1].strip_prefix("TopicId: ").unwrap();
    assert_eq!(id.len(), 22, "a base64 UUID: {id}");
    assert!(
        id.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
        "{id}"
    );
    assert_eq!(fields[2], "PartitionCount: 2");
    assert_eq!(fields[3], "ReplicationFactor: 1");
    assert!(fields[4].starts_with("Configs: "), "{described}");
    assert!(fields[4].contains("retention.ms=60000"), "{described}");
    assert_eq!(
        lines[1],
        "\tTopic: alpha\tPartition: 0\tLeader: 0\tReplicas: 0\tIsr: 0"
    );
    // The id is the topic's own: the same on every describe, another for another topic.
    assert_eq!(
        ok(&strs(&t(&["--describe", "--topic", "alpha"]))),
        described
    );
    let beta = ok(&strs(&t(&["--describe", "--topic", "beta"])));
    assert!(beta.starts_with("Topic: beta\tTopicId: "), "{beta}");
    assert!(!beta.contains(id), "{beta}");

    // Only the topics with overrides, and only their topic line.
    let overrides = ok(&strs(&t(&["--describe", "--topics-with-overrides"])));
    assert_eq!(overrides, format!("{}\n", lines[0]));
    let all = ok(&strs(&t(&["--describe", "--exclude-internal"])));
    assert!(!all.contains("__meta"), "{all}");
    assert!(all.contains("Topic: beta\t"), "{all}");

    // --command-config is read (a bad one is refused, naming it) and used.
    let config = dir.path().join("client.properties");
    std::fs::write(&config, "client.id=flags-test\n").unwrap();
    let config = config.to_str().unwrap();
    assert_eq!(
        ok(&strs(&t(&[
            "--list",
            "--command-config",
            config,
            "--topic",
            "beta"
        ]))),
        "beta\n"
    );
    let bad = dir.path().join("bad.properties");
    std::fs::write(&bad, "no equals sign\n").unwrap();
    let refused = run(
        &strs(&t(&["--list", "--command-config", bad.to_str().unwrap()])),
        None,
    );
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&refused.stdout).contains("bad.properties"),
        "{refused:?}"
    );

    broker.signal(Signal::SIGTERM);
    assert!(
        broker.wait(Duration::from_secs(30)).success(),
        "{}",
        broker.log()
    );
}

/// Starts the agent with `args`, reads one line of its output, closes the pipe and gives its
/// exit status and standard error.
fn read_one_line_then_close(args: &[&str]) -> (std::process::ExitStatus, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_agent"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    {
        let mut reader = BufReader::new(child.stdout.take().unwrap());
        reader.read_line(&mut first).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status,
        first,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_closed_pipe_ends_a_tool_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let (mut broker, bootstrap) = harness::broker_agent(dir.path(), 1);
    let b = bootstrap.as_str();
    let input: String = (0..20_000)
        .map(|i| format!("record number {i}\n"))
        .collect();
    let produced = run(
        &[
            "console-producer",
            "--bootstrap-server",
            b,
            "--topic",
            "piped",
        ],
        Some(input.as_bytes()),
    );
    assert!(produced.status.success(), "{produced:?}");

    let (status, first, stderr) = read_one_line_then_close(&[
        "console-consumer",
        "--bootstrap-server",
        b,
        "--topic",
        "piped",
        "--from-beginning",
        "--timeout-ms",
        "10000",
    ]);
    assert_eq!(first, "record number 0\n");
    assert!(status.success(), "{status:?} {stderr}");
    assert!(!stderr.to_lowercase().contains("broken pipe"), "{stderr}");
    assert!(!stderr.contains("error"), "{stderr}");

    let (status, first, stderr) =
        read_one_line_then_close(&["topics", "--bootstrap-server", b, "--describe"]);
    assert!(first.starts_with("Topic: piped\t"), "{first}");
    assert!(status.success(), "{status:?} {stderr}");

    broker.signal(Signal::SIGTERM);
    assert!(
        broker.wait(Duration::from_secs(30)).success(),
        "{}",
        broker.log()
    );
    let segment = dir.path().join("broker/piped-0/00000000000000000000.log");
    let (status, first, stderr) = read_one_line_then_close(&[
        "dump-log-segments",
        "--files",
        segment.to_str().unwrap(),
        "--print-data-log",
    ]);
    assert_eq!(first, format!("Dumping {}\n", segment.display()));
    assert!(status.success(), "{status:?} {stderr}");
    assert!(!stderr.to_lowercase().contains("broken pipe"), "{stderr}");
    assert_eq!(stderr, "");
}
