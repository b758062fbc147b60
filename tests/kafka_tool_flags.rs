//! The flags of the agent's Kafka-style tools, spelled and answered as Kafka's own tools
//! (`kafka-topics.sh`, `kafka-console-consumer.sh`, `kafka-dump-log.sh`) spell and answer them,
//! run as the real binary against the bundled broker.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::harness;

// `run`: the agent with `args` (and `stdin`), whatever its exit status; `ok`: exit status 0
// expected, its standard output.
use crate::harness::{agent_ok as ok, agent_output as run};

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

/// `agent TOOL --bootstrap-server BOOTSTRAP ARGS...` (with `stdin`), whatever its exit status.
fn on_server(tool: &str, bootstrap: &str, args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut all = vec![tool, "--bootstrap-server", bootstrap];
    all.extend_from_slice(args);
    run(&all, stdin)
}

/// `agent console-producer` of `input` to `topic` on `bootstrap`, `extra` flags added; asserts
/// it succeeded.
fn produce(bootstrap: &str, topic: &str, extra: &[&str], input: &[u8]) {
    let args = [&["--topic", topic][..], extra].concat();
    let produced = on_server("console-producer", bootstrap, &args, Some(input));
    assert!(produced.status.success(), "{produced:?}");
}

/// `agent broker` in `dir` ([`harness::broker_agent`], one partition a topic) with `topic`
/// created: the broker and its address.
fn broker_with_topic(dir: &std::path::Path, topic: &str) -> (harness::Agent, String) {
    let (broker, bootstrap) = harness::broker_agent(dir, 1);
    ok(&strs(&topics(&bootstrap, &["--create", "--topic", topic])));
    (broker, bootstrap)
}

/// SIGTERMs the broker agent and asserts it exits 0 within 30 s (its log if not).
fn stop_cleanly(broker: &mut harness::Agent) {
    broker.signal(Signal::SIGTERM);
    assert!(
        broker.wait(Duration::from_secs(30)).success(),
        "{}",
        broker.log()
    );
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

    stop_cleanly(&mut broker);
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
    produce(b, "piped", &[], input.as_bytes());

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

    stop_cleanly(&mut broker);
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

    // --deep-iteration is implied by --print-data-log, as in Kafka: taken with it, refused
    // alone, naming --print-data-log; --offsets-decoder is refused (no offsets topic).
    let plain = ok(&[
        "dump-log-segments",
        "--files",
        segment.to_str().unwrap(),
        "--print-data-log",
    ]);
    let deep = ok(&[
        "dump-log-segments",
        "--files",
        segment.to_str().unwrap(),
        "--print-data-log",
        "--deep-iteration",
    ]);
    assert_eq!(deep, plain);
    for (flag, names) in [
        ("--deep-iteration", "--print-data-log"),
        ("--offsets-decoder", "agent groups --describe"),
    ] {
        let refused = run(
            &[
                "dump-log-segments",
                "--files",
                segment.to_str().unwrap(),
                flag,
            ],
            None,
        );
        assert_eq!(refused.status.code(), Some(1), "{refused:?}");
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(stderr.contains(flag) && stderr.contains(names), "{stderr}");
        assert!(refused.stdout.is_empty(), "{refused:?}");
    }
    assert!(
        deep.contains("| offset: 0 "),
        "{}",
        &deep[..deep.len().min(2000)]
    );
}

/// `agent broker ARGS...` in `dir`, its log in `dir/broker.log`, stopped with SIGTERM (and
/// waited for) when dropped.
struct Broker(std::process::Child, std::path::PathBuf);

impl Broker {
    fn start(dir: &std::path::Path, args: &[&str]) -> Broker {
        let log = dir.join("broker.log");
        let child = Command::new(env!("CARGO_BIN_EXE_agent"))
            .arg("broker")
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Broker(child, log)
    }

    fn wait_listening(&mut self, address: &str) {
        let log = &self.1;
        harness::wait_listening(&mut self.0, address, "the broker", || {
            std::fs::read_to_string(log).unwrap_or_default()
        });
    }

    fn stop(&mut self) -> std::process::ExitStatus {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            Signal::SIGTERM,
        )
        .unwrap();
        self.0.wait().unwrap()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn broker_takes_listen_and_data_dir_flags_and_either_kind_of_file() {
    let dir = tempfile::tempdir().unwrap();
    let settings = dir.path().join("settings.yaml");
    // The file's listener and directory are overridden by the flags.
    std::fs::write(
        &settings,
        "listen: 127.0.0.1:1\ndata_dir: ./from-file\nnum_partitions: 3\n",
    )
    .unwrap();
    assert_eq!(
        ok(&["validate", settings.to_str().unwrap()]),
        format!("{}: ok (broker settings)\n", settings.display())
    );
    let bad = dir.path().join("bad-settings.yaml");
    std::fs::write(&bad, "listen: 127.0.0.1:1\nnum_partitons: 3\n").unwrap();
    let refused = run(&["validate", bad.to_str().unwrap()], None);
    assert_eq!(refused.status.code(), Some(2));
    let shown = String::from_utf8_lossy(&refused.stderr);
    assert!(shown.contains("num_partitons"), "{shown}");

    let port = harness::free_port();
    let address = format!("127.0.0.1:{port}");
    let data = dir.path().join("from-flag");
    let mut broker = Broker::start(
        dir.path(),
        &[
            "--config",
            settings.to_str().unwrap(),
            "--listen",
            &address,
            "--data-dir",
            data.to_str().unwrap(),
        ],
    );
    broker.wait_listening(&address);
    ok(&strs(&topics(
        &address,
        &["--create", "--topic", "flagged"],
    )));
    let described = ok(&strs(&topics(
        &address,
        &["--describe", "--topic", "flagged"],
    )));
    // Without --partitions: the broker's num_partitions, from the settings file, as Kafka.
    assert!(described.contains("\tPartitionCount: 3\t"), "{described}");
    assert!(broker.stop().success());
    assert!(data.join("flagged-0").is_dir());
    assert!(!dir.path().join("from-file").exists());

    // A pipeline file: its `broker:` section (num_partitions 3 applies to auto-created topics).
    let port = harness::free_port();
    let address = format!("127.0.0.1:{port}");
    let pipeline = dir.path().join("pipeline.yaml");
    std::fs::write(
        &pipeline,
        format!("broker:\n  listen: {address}\n  data_dir: ./piped\n  num_partitions: 3\n"),
    )
    .unwrap();
    let mut broker = Broker::start(dir.path(), &["--config", pipeline.to_str().unwrap()]);
    broker.wait_listening(&address);
    produce(&address, "auto", &[], b"one\n");
    let described = ok(&strs(&topics(&address, &["--describe", "--topic", "auto"])));
    assert!(described.contains("\tPartitionCount: 3\t"), "{described}");
    assert!(broker.stop().success());
    assert!(dir.path().join("piped/auto-0").is_dir());

    // The shipped pipeline file is taken too.
    let shipped = harness::repo_root().join("pipelines/chain/broker.yaml");
    assert!(
        ok(&["validate", shipped.to_str().unwrap()]).ends_with(": ok\n"),
        "a pipeline file stays a pipeline file"
    );
}

#[test]
fn console_consumer_prints_as_kafkas_default_message_formatter() {
    let dir = tempfile::tempdir().unwrap();
    let (mut broker, bootstrap) = harness::broker_agent(dir.path(), 1);
    let b = bootstrap.as_str();
    produce(
        b,
        "formatted",
        &[
            "--property",
            "parse.key=true",
            "--property",
            "key.separator=:",
        ],
        b"k0:v0\nk1:v1\n",
    );
    let consume = |extra: &[&str]| {
        let mut args = vec![
            "console-consumer",
            "--bootstrap-server",
            b,
            "--topic",
            "formatted",
            "--from-beginning",
            "--max-messages",
            "2",
            "--timeout-ms",
            "20000",
        ];
        args.extend_from_slice(extra);
        run(&args, None)
    };
    let out = consume(&[
        "--formatter",
        "kafka.tools.DefaultMessageFormatter",
        "--isolation-level",
        "read_uncommitted",
        "--property",
        "print.timestamp=true",
        "--property",
        "print.partition=true",
        "--property",
        "print.offset=true",
        "--property",
        "print.headers=true",
        "--property",
        "print.key=true",
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    for (i, line) in lines.iter().enumerate() {
        let fields: Vec<&str> = line.split('\t').collect();
        assert_eq!(fields.len(), 6, "{line}");
        let time = fields[0].strip_prefix("CreateTime:").unwrap();
        assert!(time.parse::<i64>().unwrap() > 1_600_000_000_000, "{line}");
        assert_eq!(
            &fields[1..],
            &[
                "Partition:0",
                &format!("Offset:{i}"),
                "NO_HEADERS",
                &format!("k{i}"),
                &format!("v{i}")
            ]
        );
    }
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "Processed a total of 2 messages\n"
    );
    // key.separator applies between every field.
    let out = consume(&[
        "--property",
        "print.offset=true",
        "--property",
        "print.key=true",
        "--property",
        "key.separator= | ",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "Offset:0 | k0 | v0\nOffset:1 | k1 | v1\n"
    );
    // A group member idle past the auto-commit interval (5 s) has nothing left to commit at
    // the end: it still ends with exit 0, and a second run has nothing new to read.
    let group = |timeout: &str| {
        run(
            &[
                "console-consumer",
                "--bootstrap-server",
                b,
                "--topic",
                "formatted",
                "--group",
                "readers",
                "--from-beginning",
                "--timeout-ms",
                timeout,
            ],
            None,
        )
    };
    let first = group("6500");
    assert!(first.status.success(), "{first:?}");
    assert_eq!(String::from_utf8_lossy(&first.stdout), "v0\nv1\n");
    assert_eq!(
        String::from_utf8_lossy(&first.stderr),
        "Processed a total of 2 messages\n"
    );
    let second = group("10000");
    assert!(second.status.success(), "{second:?}");
    assert_eq!(String::from_utf8_lossy(&second.stdout), "");
    let refused = consume(&["--formatter", "kafka.tools.LoggingMessageFormatter"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("DefaultMessageFormatter"),
        "{refused:?}"
    );
    stop_cleanly(&mut broker);
}

#[test]
fn console_producer_takes_kafkas_flags_and_keeps_the_lines_before_a_bad_one() {
    let dir = tempfile::tempdir().unwrap();
    let (mut broker, bootstrap) = harness::broker_agent(dir.path(), 1);
    let b = bootstrap.as_str();
    // The consumer waits for a topic that does not exist yet.
    let waiting = Command::new(env!("CARGO_BIN_EXE_agent"))
        .args([
            "console-consumer",
            "--bootstrap-server",
            b,
            "--topic",
            "later",
            "--from-beginning",
            "--max-messages",
            "2",
            "--timeout-ms",
            "30000",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let producer = |extra: &[&str], input: &[u8]| {
        let mut args = vec!["console-producer", "--broker-list", b, "--topic", "later"];
        args.extend_from_slice(extra);
        run(&args, Some(input))
    };
    let bad = producer(
        &[
            "--request-required-acks",
            "all",
            "--sync",
            "--property",
            "parse.key=true",
            "--property",
            "key.separator=:",
        ],
        b"k1:one\nk2:two\nno separator here\nk4:four\n",
    );
    assert_eq!(bad.status.code(), Some(1), "{bad:?}");
    assert!(
        String::from_utf8_lossy(&bad.stderr)
            .contains("No key separator found on line number 3: 'no separator here'"),
        "{bad:?}"
    );
    let out = waiting.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "one\ntwo\n");

    // ignore.error: the line without separator is a value without key.
    let ignored = producer(
        &[
            "--property",
            "parse.key=true",
            "--property",
            "key.separator=:",
            "--property",
            "ignore.error=true",
        ],
        b"plain line\nk6:six\n",
    );
    assert!(ignored.status.success(), "{ignored:?}");
    let out = ok(&[
        "console-consumer",
        "--bootstrap-server",
        b,
        "--topic",
        "later",
        "--from-beginning",
        "--max-messages",
        "4",
        "--timeout-ms",
        "20000",
        "--property",
        "print.key=true",
    ]);
    assert_eq!(out, "k1\tone\nk2\ttwo\nnull\tplain line\nk6\tsix\n");

    // parse.headers, with Kafka's defaults: `h1:v1,h2:v2<TAB>key<TAB>value`.
    produce(
        b,
        "headed",
        &[
            "--property",
            "parse.headers=true",
            "--property",
            "parse.key=true",
        ],
        b"h1:v1,h2:v2\tk\tvalue\n",
    );
    let out = ok(&[
        "console-consumer",
        "--bootstrap-server",
        b,
        "--topic",
        "headed",
        "--from-beginning",
        "--max-messages",
        "1",
        "--timeout-ms",
        "20000",
        "--property",
        "print.headers=true",
        "--property",
        "print.key=true",
    ]);
    assert_eq!(out, "h1:v1,h2:v2\tk\tvalue\n");

    // --include: every topic whose whole name matches, without --group too.
    let out = ok(&[
        "console-consumer",
        "--bootstrap-server",
        b,
        "--include",
        "late.|head.*",
        "--from-beginning",
        "--max-messages",
        "5",
        "--timeout-ms",
        "20000",
    ]);
    let mut values: Vec<&str> = out.lines().collect();
    values.sort_unstable();
    assert_eq!(
        values,
        ["one", "plain line", "six", "two", "value"],
        "{out}"
    );
    stop_cleanly(&mut broker);
}

#[test]
fn console_consumer_stops_on_sigterm_committing_and_counting() {
    let dir = tempfile::tempdir().unwrap();
    let (mut broker, bootstrap) = harness::broker_agent(dir.path(), 1);
    let b = bootstrap.as_str();
    produce(b, "signalled", &[], b"a\nb\nc\n");
    let consumer_args = [
        "console-consumer",
        "--bootstrap-server",
        b,
        "--topic",
        "signalled",
        "--group",
        "stoppers",
        "--from-beginning",
    ];
    let mut child = Command::new(env!("CARGO_BIN_EXE_agent"))
        .args(consumer_args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut lines = String::new();
    for _ in 0..3 {
        reader.read_line(&mut lines).unwrap();
    }
    assert_eq!(lines, "a\nb\nc\n");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        Signal::SIGTERM,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "Processed a total of 3 messages\n"
    );
    // The offsets were committed: the group has nothing new to read.
    let mut again = consumer_args.to_vec();
    again.extend(["--timeout-ms", "10000"]);
    assert_eq!(ok(&again), "");

    // --reset-offsets --dry-run prints the plan and commits nothing; without --dry-run or
    // --execute it warns, as Kafka does.
    let reset = |extra: &[&str]| {
        let mut args = vec![
            "groups",
            "--bootstrap-server",
            b,
            "--reset-offsets",
            "--group",
            "stoppers",
            "--topic",
            "signalled",
            "--to-earliest",
        ];
        args.extend_from_slice(extra);
        run(&args, None)
    };
    let dry = reset(&["--dry-run"]);
    assert!(dry.status.success(), "{dry:?}");
    let plan = String::from_utf8_lossy(&dry.stdout);
    assert!(plan.trim_start().starts_with("GROUP"), "{plan}");
    assert!(plan.contains("signalled"), "{plan}");
    assert_eq!(String::from_utf8_lossy(&dry.stderr), "");
    assert_eq!(ok(&again), "", "a dry run commits nothing");
    let implicit = reset(&[]);
    assert!(implicit.status.success(), "{implicit:?}");
    assert!(
        String::from_utf8_lossy(&implicit.stderr)
            .starts_with("WARN: No action will be performed as the --execute option is missing."),
        "{implicit:?}"
    );
    assert!(!reset(&["--dry-run", "--execute"]).status.success());

    // --shift-by moves the committed offset (3) back by 2, on the partitions of `topic:0`.
    let shift = |spec: &str| {
        run(
            &[
                "groups",
                "--bootstrap-server",
                b,
                "--reset-offsets",
                "--group",
                "stoppers",
                "--topic",
                spec,
                "--shift-by",
                "-2",
                "--execute",
            ],
            None,
        )
    };
    assert!(!shift("signalled:5").status.success());
    let shifted = shift("signalled:0");
    assert!(shifted.status.success(), "{shifted:?}");
    let table = String::from_utf8_lossy(&shifted.stdout);
    let row: Vec<&str> = table.lines().last().unwrap().split_whitespace().collect();
    assert_eq!(row, ["stoppers", "signalled", "0", "1"], "{table}");
    assert_eq!(ok(&again), "b\nc\n");
    let all = ok(&[
        "groups",
        "--bootstrap-server",
        b,
        "--describe",
        "--all-groups",
    ]);
    assert!(all.contains("stoppers"), "{all}");
    stop_cleanly(&mut broker);
}

/// `agent console-consumer --group GROUP` on `topic` as a child (`extra` flags too), its
/// output in `dir/NAME.out`.
fn group_consumer(
    dir: &std::path::Path,
    name: &str,
    bootstrap: &str,
    topic: &str,
    group: &str,
    extra: &[&str],
) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_agent"))
        .args([
            "console-consumer",
            "--bootstrap-server",
            bootstrap,
            "--topic",
            topic,
            "--group",
            group,
            "--from-beginning",
        ])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join(format!("{name}.out"))).unwrap())
        .stderr(std::fs::File::create(dir.join(format!("{name}.err"))).unwrap())
        .spawn()
        .unwrap()
}

fn sigterm(child: &mut std::process::Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        Signal::SIGTERM,
    )
    .unwrap();
    assert!(child.wait().unwrap().success());
}

/// The data rows of a groups table (after its blank line and header), split on whitespace.
fn table_rows(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .skip_while(|l| !l.starts_with("GROUP"))
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}

#[test]
fn groups_describe_members_and_state_of_classic_and_consumer_protocol_groups() {
    let dir = tempfile::tempdir().unwrap();
    let (mut broker, bootstrap) = harness::broker_agent(dir.path(), 2);
    let b = bootstrap.as_str();
    let port = b.rsplit_once(':').unwrap().1;
    // Five records in each partition.
    let producer: rdkafka::producer::BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", b)
        .create()
        .unwrap();
    for i in 0..10 {
        let value = format!("r{i}");
        producer
            .send(
                rdkafka::producer::BaseRecord::<(), str>::to("shared")
                    .partition(i % 2)
                    .payload(&value),
            )
            .unwrap();
    }
    rdkafka::producer::Producer::flush(&producer, Duration::from_secs(10)).unwrap();
    let mut classic = group_consumer(dir.path(), "classic", b, "shared", "classic", &[]);
    let mut modern = group_consumer(
        dir.path(),
        "modern",
        b,
        "shared",
        "modern",
        &["--consumer-property", "group.protocol=consumer"],
    );
    let groups = |args: &[&str]| {
        let mut all = vec!["groups", "--bootstrap-server", b];
        all.extend_from_slice(args);
        run(&all, None)
    };
    let out = |o: &Output| String::from_utf8_lossy(&o.stdout).into_owned();
    // Each group has its one member owning both partitions, in both protocols.
    for group in ["classic", "modern"] {
        harness::wait_until(
            Duration::from_secs(30),
            "the member to own both partitions",
            || {
                let o = groups(&["--describe", "--members", "--group", group]);
                table_rows(&out(&o))
                    .first()
                    .is_some_and(|r| r.get(4).is_some_and(|n| n == "2"))
            },
        );
        let members = groups(&["--describe", "--members", "--group", group]);
        assert!(members.status.success(), "{members:?}");
        let text = out(&members);
        let header = text.lines().nth(1).unwrap();
        // Kafka's widths: at least 15 per column, a space after each, #PARTITIONS padded too.
        assert!(header.starts_with("GROUP           CONSUMER-ID "), "{text}");
        assert!(
            header.ends_with(" CLIENT-ID       #PARTITIONS     "),
            "{text:?}"
        );
        let row = &table_rows(&text)[0];
        assert_eq!(row[0], group, "{text}");
        assert!(row[2].starts_with("/127.0.0.1"), "{text}");
        assert_eq!(row[4], "2", "{text}");
        let verbose = out(&groups(&[
            "--describe",
            "--members",
            "--verbose",
            "--group",
            group,
        ]));
        let header: Vec<&str> = verbose.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(
            header,
            [
                "GROUP",
                "CONSUMER-ID",
                "HOST",
                "CLIENT-ID",
                "#PARTITIONS",
                "CURRENT-EPOCH",
                "CURRENT-ASSIGNMENT",
                "TARGET-EPOCH",
                "TARGET-ASSIGNMENT"
            ],
            "{verbose}"
        );
        let row = &table_rows(&verbose)[0];
        assert_eq!(row[6], "shared:0,1", "{verbose}");
        let state = groups(&["--describe", "--state", "--group", group]);
        assert!(state.status.success(), "{state:?}");
        let text = out(&state);
        let header: Vec<&str> = text.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(
            header,
            [
                "GROUP",
                "COORDINATOR",
                "(ID)",
                "ASSIGNMENT-STRATEGY",
                "STATE",
                "#MEMBERS"
            ],
            "{text}"
        );
        let row = text.lines().nth(2).unwrap();
        assert!(
            row.contains(&format!(" 127.0.0.1:{port}  (")),
            "the coordinator as host:port  (id): {text}"
        );
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells[0], group);
        assert_eq!(&cells[cells.len() - 2..], ["Stable", "1"], "{text}");
        assert_ne!(cells[3], "-", "an assignment strategy: {text}");
        // Kafka refuses to reset the offsets of a group with active members, saying why.
        let refused = groups(&[
            "--reset-offsets",
            "--group",
            group,
            "--topic",
            "shared",
            "--to-earliest",
            "--execute",
        ]);
        assert!(refused.status.success(), "{refused:?}");
        assert_eq!(
            out(&refused),
            format!(
                "\nError: Assignments can only be reset if the group '{group}' is inactive, \
                 but the current state is Stable.\n"
            )
        );
    }
    // The classic group's strategy is the protocol librdkafka chose (range, its default).
    let state = out(&groups(&["--describe", "--state", "--group", "classic"]));
    assert!(state.lines().nth(2).unwrap().contains(" range "), "{state}");
    // --all-groups --state: one table per group.
    let all = out(&groups(&["--describe", "--state", "--all-groups"]));
    assert_eq!(all.matches("COORDINATOR (ID)").count(), 2, "{all}");
    // --list --state: Kafka's GROUP STATE table, filtered by the states given (any case).
    let listed = out(&groups(&["--list", "--state"]));
    assert_eq!(
        listed,
        "GROUP           STATE\nclassic         Stable\nmodern          Stable\n"
    );
    assert_eq!(out(&groups(&["--list", "--state", "stable,EMPTY"])), listed);
    assert_eq!(
        out(&groups(&["--list", "--state", "Empty"])),
        "GROUP           STATE\n"
    );
    let refused = groups(&["--list", "--state", "Busy"]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr)
            .contains("Invalid state list 'Busy'. Valid states are: Unknown, PreparingRebalance"),
        "{refused:?}"
    );
    let refused = groups(&["--describe", "--state", "Stable", "--group", "classic"]);
    assert!(!refused.status.success(), "{refused:?}");

    harness::wait_until(
        Duration::from_secs(30),
        "both groups to print every record",
        || {
            ["classic", "modern"].iter().all(|n| {
                std::fs::read_to_string(dir.path().join(format!("{n}.out")))
                    .is_ok_and(|t| t.lines().count() == 10)
            })
        },
    );
    sigterm(&mut classic);
    sigterm(&mut modern);
    for group in ["classic", "modern"] {
        harness::wait_until(Duration::from_secs(30), "the group to be empty", || {
            let o = groups(&["--describe", "--state", "--group", group]);
            out(&o).contains(" Empty ")
        });
        let state = groups(&["--describe", "--state", "--group", group]);
        assert_eq!(
            String::from_utf8_lossy(&state.stderr),
            format!("\nConsumer group '{group}' has no active members.\n")
        );
        let cells: Vec<String> = table_rows(&out(&state))[0].clone();
        assert_eq!(cells.last().unwrap(), "0");
        // No members: only the header, as Kafka.
        let members = groups(&["--describe", "--members", "--group", group]);
        assert!(table_rows(&out(&members)).is_empty(), "{members:?}");
        assert!(out(&members).contains("#PARTITIONS"), "{members:?}");
    }
    let missing = out(&groups(&["--describe", "--state", "--group", "nobody"]));
    assert_eq!(
        missing,
        "\nError: Consumer group 'nobody' does not exist.\n"
    );

    // Empty now: --all-groups --all-topics --to-current plans both groups' offsets (10 in all).
    let plan = groups(&[
        "--reset-offsets",
        "--all-groups",
        "--all-topics",
        "--to-current",
        "--dry-run",
    ]);
    assert!(plan.status.success(), "{plan:?}");
    let mut rows = table_rows(&out(&plan));
    rows.sort();
    let offsets: u64 = rows.iter().map(|r| r[3].parse::<u64>().unwrap()).sum();
    assert_eq!(rows.len(), 4, "{rows:?}");
    assert_eq!(offsets, 20, "both groups read all 10 records: {rows:?}");
    assert_eq!(rows[0][..3], ["classic", "shared", "0"]);
    assert_eq!(rows[3][..3], ["modern", "shared", "1"]);
    let earliest = groups(&[
        "--reset-offsets",
        "--all-groups",
        "--all-topics",
        "--to-earliest",
        "--execute",
    ]);
    assert!(earliest.status.success(), "{earliest:?}");
    assert!(
        table_rows(&out(&earliest)).iter().all(|r| r[3] == "0"),
        "{earliest:?}"
    );
    let offsets = out(&groups(&["--describe", "--group", "modern"]));
    // --offsets is the default, in Kafka's widths.
    assert_eq!(
        out(&groups(&["--describe", "--offsets", "--group", "modern"])),
        offsets
    );
    assert_eq!(
        offsets.lines().nth(1).unwrap(),
        "GROUP           TOPIC           PARTITION  CURRENT-OFFSET  LOG-END-OFFSET  LAG             \
         CONSUMER-ID     HOST            CLIENT-ID"
    );
    assert!(
        table_rows(&offsets).iter().all(|r| r[3] == "0"),
        "{offsets}"
    );
    // --reset-offsets needs a scope.
    let unscoped = groups(&["--reset-offsets", "--group", "classic", "--to-earliest"]);
    assert!(!unscoped.status.success());
    assert!(
        String::from_utf8_lossy(&unscoped.stderr).contains("--all-topics, --topic"),
        "{unscoped:?}"
    );

    // --delete takes whole groups: with --topic it would delete more than asked; refused.
    let refused = groups(&["--delete", "--group", "classic", "--topic", "shared"]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("topic-specific offset deletion"),
        "{refused:?}"
    );
    assert!(out(&groups(&["--list"])).contains("classic"));

    let deleted = groups(&["--delete", "--all-groups"]);
    assert!(deleted.status.success(), "{deleted:?}");
    assert_eq!(
        out(&deleted),
        "Deletion of requested consumer groups ('classic', 'modern') was successful.\n"
    );
    assert_eq!(out(&groups(&["--list"])), "");
    stop_cleanly(&mut broker);
}

#[test]
fn groups_reset_offsets_by_time_and_a_transactional_partition_has_no_lag() {
    use rdkafka::ClientConfig;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

    let dir = tempfile::tempdir().unwrap();
    let (mut broker, bootstrap) = harness::broker_agent(dir.path(), 1);
    let b = bootstrap.as_str();
    // Records 0..5 stamped 2001-09-09T01:46:40Z, 5..10 stamped 2023-11-14T22:13:20Z.
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", b)
        .create()
        .unwrap();
    for i in 0..10i64 {
        let stamp = if i < 5 {
            1_000_000_000_000
        } else {
            1_700_000_000_000
        };
        let value = format!("v{i}");
        producer
            .send(
                BaseRecord::<(), str>::to("stamped")
                    .payload(&value)
                    .timestamp(stamp),
            )
            .unwrap();
        producer.flush(Duration::from_secs(10)).unwrap();
    }
    let read = ok(&[
        "console-consumer",
        "--bootstrap-server",
        b,
        "--topic",
        "stamped",
        "--group",
        "timed",
        "--from-beginning",
        "--max-messages",
        "10",
    ]);
    assert_eq!(read.lines().count(), 10);
    let reset = |target: &[&str]| {
        let mut args = vec![
            "groups",
            "--bootstrap-server",
            b,
            "--reset-offsets",
            "--group",
            "timed",
            "--topic",
            "stamped",
        ];
        args.extend_from_slice(target);
        args.push("--dry-run");
        let o = run(&args, None);
        assert!(o.status.success(), "{target:?}: {o:?}");
        let rows = table_rows(&String::from_utf8_lossy(&o.stdout));
        rows[0][3].clone()
    };
    assert_eq!(reset(&["--to-datetime", "2010-01-01T00:00:00.000"]), "5");
    assert_eq!(
        reset(&["--to-datetime", "2023-11-15T00:13:20.000+02:00"]),
        "5"
    );
    // After every record's time: the log end, as Kafka.
    assert_eq!(reset(&["--to-datetime", "2023-11-14T22:13:20.001Z"]), "10");
    assert_eq!(
        reset(&["--to-datetime", "1999-12-31T23:59:59.999-05:00"]),
        "0"
    );
    assert_eq!(reset(&["--by-duration", "P36500D"]), "0");
    assert_eq!(reset(&["--by-duration", "PT1S"]), "10");
    assert_eq!(reset(&["--to-current"]), "10");
    for bad in [["--to-datetime", "2010-01-01"], ["--by-duration", "1h"]] {
        let mut args = vec![
            "groups",
            "--bootstrap-server",
            b,
            "--reset-offsets",
            "--group",
            "timed",
            "--topic",
            "stamped",
        ];
        args.extend_from_slice(&bad);
        let o = run(&args, None);
        assert!(!o.status.success(), "{o:?}");
        assert!(String::from_utf8_lossy(&o.stderr).contains(bad[1]), "{o:?}");
    }
    let moved = ok(&[
        "groups",
        "--bootstrap-server",
        b,
        "--reset-offsets",
        "--group",
        "timed",
        "--all-topics",
        "--to-datetime",
        "2010-01-01T00:00:00.000",
        "--execute",
    ]);
    assert_eq!(table_rows(&moved), [["timed", "stamped", "0", "5"]]);
    let again = ok(&[
        "console-consumer",
        "--bootstrap-server",
        b,
        "--topic",
        "stamped",
        "--group",
        "timed",
        "--timeout-ms",
        "5000",
    ]);
    assert_eq!(again, "v5\nv6\nv7\nv8\nv9\n");

    // A committed transaction: 3 records and its marker (offsets 0..4). Read to the end,
    // the group commits the position after the marker, as Kafka's consumer: lag 0.
    let txn: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", b)
        .set("transactional.id", "lagless")
        .create()
        .unwrap();
    txn.init_transactions(Duration::from_secs(10)).unwrap();
    txn.begin_transaction().unwrap();
    for i in 0..3 {
        let value = format!("t{i}");
        txn.send(BaseRecord::<(), str>::to("txn").payload(&value))
            .unwrap();
    }
    txn.commit_transaction(Duration::from_secs(10)).unwrap();
    let read = ok(&[
        "console-consumer",
        "--bootstrap-server",
        b,
        "--topic",
        "txn",
        "--group",
        "txg",
        "--from-beginning",
        "--timeout-ms",
        "5000",
    ]);
    assert_eq!(read, "t0\nt1\nt2\n");
    let described = ok(&[
        "groups",
        "--bootstrap-server",
        b,
        "--describe",
        "--group",
        "txg",
    ]);
    assert_eq!(
        table_rows(&described)[0][..6],
        ["txg", "txn", "0", "4", "4", "0"],
        "{described}"
    );
    stop_cleanly(&mut broker);
}

#[test]
fn dump_log_segments_takes_max_bytes_and_verifies_indexes_only() {
    use rdkafka::ClientConfig;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

    let dir = tempfile::tempdir().unwrap();
    let (mut broker, bootstrap) = harness::broker_agent(dir.path(), 1);
    // One batch per record, ~300 bytes each: an index entry every 4096 bytes (the default
    // index.interval.bytes), so the segment has a dozen.
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    let value = "x".repeat(200);
    for _ in 0..200 {
        producer
            .send(BaseRecord::<(), str>::to("indexed").payload(&value))
            .unwrap();
        producer.flush(Duration::from_secs(10)).unwrap();
    }
    stop_cleanly(&mut broker);
    let segment = dir.path().join("broker/indexed-0/00000000000000000000");
    let file = |ext: &str| segment.with_extension(ext).to_str().unwrap().to_owned();
    let (log, index, time) = (file("log"), file("index"), file("timeindex"));
    let dumped = |args: &[&str]| {
        let mut all = vec!["dump-log-segments"];
        all.extend_from_slice(args);
        run(&all, None)
    };
    let text = |o: &Output| String::from_utf8_lossy(&o.stdout).into_owned();
    let err = |o: &Output| String::from_utf8_lossy(&o.stderr).into_owned();

    // The indexes agree with the log: --verify-index-only prints only the file names.
    let entries = ok(&["dump-log-segments", "--files", &index]);
    let entry_lines: Vec<&str> = entries.lines().skip(1).collect();
    assert!(entry_lines.len() >= 5, "{entries}");
    let verified = dumped(&["--files", &format!("{index},{time}"), "--verify-index-only"]);
    assert!(verified.status.success(), "{verified:?}");
    assert_eq!(
        text(&verified),
        format!("Dumping {index}\nDumping {time}\n")
    );
    assert_eq!(err(&verified), "");

    // An entry pointing at the wrong batch, and a wrong timestamp: Kafka's messages, on
    // standard error after the dumps, and exit status 1.
    let mut bytes = std::fs::read(&index).unwrap();
    let second: i64 = entry_lines[1]
        .strip_prefix("offset: ")
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    bytes[12..16].copy_from_slice(&0u32.to_be_bytes());
    std::fs::write(&index, &bytes).unwrap();
    let mut times = std::fs::read(&time).unwrap();
    let stamp = i64::from_be_bytes(times[0..8].try_into().unwrap());
    let first_offset = u32::from_be_bytes(times[8..12].try_into().unwrap());
    times[0..8].copy_from_slice(&(stamp - 1).to_be_bytes());
    std::fs::write(&time, &times).unwrap();
    let absolute = |p: &str| std::path::absolute(p).unwrap().display().to_string();
    let found = dumped(&["--files", &format!("{index},{time}"), "--verify-index-only"]);
    assert!(!found.status.success(), "{found:?}");
    assert_eq!(text(&found), format!("Dumping {index}\nDumping {time}\n"));
    let expected = format!(
        "Mismatches in :{}\n  Index offset: {second}, log offset: 0\n\
         Found timestamp mismatch in :{}\n  Index timestamp: {}, log timestamp: {stamp}\n",
        absolute(&index),
        absolute(&time),
        stamp - 1
    );
    assert!(err(&found).starts_with(&expected), "{}", err(&found));
    assert!(first_offset > 0);
    // Without --verify-index-only the entries are printed and the mismatches reported too.
    let plain = dumped(&["--files", &index]);
    assert!(plain.status.success(), "{plain:?}");
    assert_eq!(text(&plain).lines().count(), entry_lines.len() + 1);
    assert!(err(&plain).starts_with("Mismatches in :"), "{plain:?}");

    // --max-bytes: only the whole batches within the first N bytes, no trailing-bytes note.
    let full = ok(&["dump-log-segments", "--files", &log]);
    let first_size: usize = full
        .lines()
        .nth(2)
        .unwrap()
        .split(" size: ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let batches = |o: &str| o.lines().filter(|l| l.starts_with("baseOffset:")).count();
    assert_eq!(batches(&full), 200);
    for (limit, expected) in [
        (first_size - 1, 0),
        (first_size, 1),
        (first_size + 5, 1),
        (3 * first_size, 3),
    ] {
        let limit = limit.to_string();
        let cut = ok(&["dump-log-segments", "--files", &log, "--max-bytes", &limit]);
        assert_eq!(batches(&cut), expected, "{cut}");
        assert!(!cut.contains("invalid bytes"), "{cut}");
        let verified = ok(&[
            "dump-log-segments",
            "--files",
            &log,
            "--max-bytes",
            &limit,
            "--verify",
        ]);
        assert_eq!(batches(&verified), expected, "{verified}");
        assert!(verified.contains(": 0 damaged range(s)"), "{verified}");
    }
    assert!(
        !dumped(&["--files", &log, "--max-bytes", "0"])
            .status
            .success()
    );
    assert!(
        !dumped(&["--files", &log, "--max-bytes", "x"])
            .status
            .success()
    );
}

/// `agent console-consumer ARGS` against `bootstrap` reading `topic`.
fn console_consumer(bootstrap: &str, topic: &str, extra: &[&str]) -> Output {
    let args = [&["--topic", topic][..], extra].concat();
    on_server("console-consumer", bootstrap, &args, None)
}

/// Asserts that `out` is a refusal (exit 1) whose standard error contains `message`.
fn assert_refused(out: &Output, message: &str) {
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(message),
        "expected `{message}`: {out:?}"
    );
}

#[test]
fn console_consumer_takes_the_group_offset_and_reset_as_kafkas_does() {
    use rdkafka::ClientConfig;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

    let dir = tempfile::tempdir().unwrap();
    let (mut broker, bootstrap) = harness::broker_agent(dir.path(), 1);
    let b = bootstrap.as_str();
    produce(b, "flags", &[], b"a\nb\n");

    // Kafka's refusals, before anything is read.
    let refusals: [(&[&str], &str); 8] = [
        (
            &["--group", "g", "--offset", "0"],
            "The partition is required when offset is specified.",
        ),
        (
            &["--offset", "earliest"],
            "The partition is required when offset is specified.",
        ),
        (
            &["--partition", "0", "--offset", "0", "--from-beginning"],
            "Options from-beginning and offset cannot be specified together.",
        ),
        (
            &["--partition", "0", "--offset", "x"],
            "The provided offset value 'x' is incorrect. Valid values are 'earliest', \
             'latest', or a non-negative long.",
        ),
        (
            &[
                "--from-beginning",
                "--consumer-property",
                "auto.offset.reset=latest",
            ],
            "Can't simultaneously specify --from-beginning and 'auto.offset.reset=latest', \
             please remove one option",
        ),
        (
            &["--group", "a", "--consumer-property", "group.id=b"],
            "do not match. Detected group ids: 'a', 'b'",
        ),
        (
            &["--partition", "0", "--consumer-property", "group.id=b"],
            "Options group and partition cannot be specified together.",
        ),
        (
            &["--partition", "0", "--group", "b"],
            "Options group and partition cannot be specified together.",
        ),
    ];
    for (extra, message) in refusals {
        assert_refused(&console_consumer(b, "flags", extra), message);
    }
    let include = run(
        &[
            "console-consumer",
            "--bootstrap-server",
            b,
            "--include",
            "fl.*",
            "--offset",
            "0",
        ],
        None,
    );
    assert_refused(
        &include,
        "The partition is required when offset is specified.",
    );

    // The user's auto.offset.reset is used: earliest without --from-beginning reads all.
    let two = ["--max-messages", "2", "--timeout-ms", "20000"];
    let mut args = vec!["--consumer-property", "auto.offset.reset=earliest"];
    args.extend_from_slice(&two);
    let out = console_consumer(b, "flags", &args);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "a\nb\n");
    // ... and agrees with --from-beginning.
    args.push("--from-beginning");
    assert_eq!(
        String::from_utf8_lossy(&console_consumer(b, "flags", &args).stdout),
        "a\nb\n"
    );

    // print.value=false: the last field printed ends the line.
    let out = console_consumer(
        b,
        "flags",
        &[
            "--from-beginning",
            "--max-messages",
            "2",
            "--timeout-ms",
            "20000",
            "--property",
            "print.offset=true",
            "--property",
            "print.partition=true",
            "--property",
            "print.value=false",
        ],
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "Partition:0\tOffset:0\nPartition:0\tOffset:1\n"
    );

    // group.id of --consumer.config is the group: it commits, and a second run, with the
    // same group as a --consumer-property, has nothing left to read.
    let config = dir.path().join("consumer.properties");
    std::fs::write(&config, "group.id=from-file\n").unwrap();
    let config = config.to_str().unwrap();
    let first = console_consumer(
        b,
        "flags",
        &[
            "--consumer.config",
            config,
            "--from-beginning",
            "--max-messages",
            "2",
            "--timeout-ms",
            "20000",
        ],
    );
    assert!(first.status.success(), "{first:?}");
    assert_eq!(String::from_utf8_lossy(&first.stdout), "a\nb\n");
    let described = ok(&[
        "groups",
        "--bootstrap-server",
        b,
        "--describe",
        "--group",
        "from-file",
    ]);
    assert!(described.contains("flags"), "{described}");
    let second = console_consumer(
        b,
        "flags",
        &[
            "--consumer-property",
            "group.id=from-file",
            "--group",
            "from-file",
            "--from-beginning",
            "--timeout-ms",
            "3000",
        ],
    );
    assert!(second.status.success(), "{second:?}");
    assert_eq!(String::from_utf8_lossy(&second.stdout), "");

    // An open transaction: read by default (read_uncommitted, as Kafka's console consumer),
    // not with --isolation-level read_committed, nor with the property (no flag to win).
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", b)
        .set("transactional.id", "flags-open")
        .create()
        .unwrap();
    producer.init_transactions(Duration::from_secs(20)).unwrap();
    producer.begin_transaction().unwrap();
    producer
        .send(BaseRecord::<(), str>::to("open").payload("pending"))
        .unwrap();
    producer.flush(Duration::from_secs(10)).unwrap();
    let read = |extra: &[&str]| {
        let mut args = vec!["--from-beginning", "--max-messages", "1", "--timeout-ms"];
        args.push("4000");
        args.extend_from_slice(extra);
        let out = console_consumer(b, "open", &args);
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(read(&[]), "pending\n");
    assert_eq!(read(&["--isolation-level", "read_committed"]), "");
    assert_eq!(
        read(&["--consumer-property", "isolation.level=read_committed"]),
        ""
    );
    assert_eq!(
        read(&[
            "--consumer-property",
            "isolation.level=read_committed",
            "--isolation-level",
            "read_uncommitted"
        ]),
        "pending\n"
    );
    producer.abort_transaction(Duration::from_secs(10)).unwrap();

    // --compression-codec wins over the properties' compression.type; without it, theirs is
    // used. (Lines that compress: librdkafka sends a batch that does not shrink as is.)
    let lines = "the same line again and again\n".repeat(200);
    let by_flag = [
        "--producer-property",
        "compression.type=gzip",
        "--compression-codec",
        "lz4",
    ];
    produce(b, "by-flag", &by_flag, lines.as_bytes());
    let by_property = ["--producer-property", "compression.type=snappy"];
    produce(b, "by-property", &by_property, lines.as_bytes());
    produce(b, "by-default", &["--compression-codec"], lines.as_bytes());
    stop_cleanly(&mut broker);
    for (topic, codec) in [
        ("by-flag", "lz4"),
        ("by-property", "snappy"),
        ("by-default", "gzip"),
    ] {
        let log = dir
            .path()
            .join(format!("broker/{topic}-0/00000000000000000000.log"));
        let dumped = ok(&["dump-log-segments", "--files", log.to_str().unwrap()]);
        assert!(
            dumped.contains(&format!("compresscodec: {codec} ")),
            "{topic}: {dumped}"
        );
    }
}

#[test]
fn flags_outside_their_modes_are_refused_naming_the_mode() {
    let dir = tempfile::tempdir().unwrap();
    let (mut broker, bootstrap) = broker_with_topic(dir.path(), "modes");
    let b = bootstrap.as_str();
    let with_server = |tool: &str, args: &[&str]| on_server(tool, b, args, None);
    // clap's refusal: exit 2, naming the flag and the action it cannot be used with.
    let refused = |tool: &str, args: &[&str], flag: &str, action: &str| {
        let out = with_server(tool, args);
        // 2 from clap, 1 from the tool's own checks.
        assert!(
            matches!(out.status.code(), Some(1 | 2)),
            "{tool} {args:?}: {out:?}"
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(flag) && stderr.contains(action),
            "{tool} {args:?}: expected {flag} and {action}: {stderr}"
        );
    };
    let cases: &[(&str, &[&str], &str, &str)] = &[
        (
            "topics",
            &["--list", "--partitions", "3"],
            "--partitions",
            "--list",
        ),
        (
            "topics",
            &["--describe", "--config", "a=b"],
            "--config",
            "--describe",
        ),
        (
            "topics",
            &["--delete", "--topic", "modes", "--partitions", "3"],
            "--partitions",
            "--delete",
        ),
        (
            "topics",
            &["--alter", "--topic", "modes", "--replication-factor", "1"],
            "--replication-factor",
            "--alter",
        ),
        (
            "topics",
            &["--list", "--if-exists"],
            "--if-exists",
            "--list",
        ),
        (
            "topics",
            &["--create", "--topic", "x", "--if-exists"],
            "--if-exists",
            "--create",
        ),
        (
            "topics",
            &["--describe", "--if-not-exists"],
            "--if-not-exists",
            "--describe",
        ),
        (
            "topics",
            &["--list", "--topics-with-overrides"],
            "--topics-with-overrides",
            "--list",
        ),
        (
            "topics",
            &["--create", "--topic", "x", "--exclude-internal"],
            "--exclude-internal",
            "--create",
        ),
        ("groups", &["--list", "--verbose"], "--verbose", "--list"),
        (
            "groups",
            &["--reset-offsets", "--group", "g", "--members"],
            "--members",
            "--reset-offsets",
        ),
        (
            "acls",
            &["--add", "--idempotent", "--topic", "t"],
            "--idempotent",
            "--producer",
        ),
        (
            "groups",
            &["--describe", "--group", "g", "--topic", "modes"],
            "--topic",
            "--describe",
        ),
        (
            "groups",
            &["--list", "--all-topics"],
            "--all-topics",
            "--list",
        ),
        ("groups", &["--list", "--group", "g"], "--group", "--list"),
        (
            "groups",
            &["--describe", "--group", "g", "--to-earliest"],
            "--to-earliest",
            "--describe",
        ),
        (
            "groups",
            &["--delete", "--group", "g", "--execute"],
            "--execute",
            "--delete",
        ),
        (
            "acls",
            &["--list", "--allow-principal", "User:a"],
            "--allow-principal",
            "--list",
        ),
        (
            "acls",
            &["--list", "--deny-host", "1.2.3.4"],
            "--deny-host",
            "--list",
        ),
        ("acls", &["--list", "--producer"], "--producer", "--list"),
        ("acls", &["--list", "--consumer"], "--consumer", "--list"),
        (
            "acls",
            &[
                "--add",
                "--producer",
                "--topic",
                "t",
                "--deny-principal",
                "User:a",
            ],
            "--deny-principal",
            "--producer",
        ),
        (
            "users",
            &["--list", "--mechanism", "SCRAM-SHA-256"],
            "--mechanism",
            "--list",
        ),
        (
            "users",
            &["--delete", "u", "--iterations", "8192"],
            "--iterations",
            "--delete",
        ),
        (
            "users",
            &["--list", "--password-stdin"],
            "--password-stdin",
            "--list",
        ),
        (
            "transactions",
            &["--list", "--transactional-id", "t"],
            "--transactional-id",
            "--describe",
        ),
        (
            "transactions",
            &["--transactional-id", "t", "list"],
            "--transactional-id",
            "--describe",
        ),
        (
            "transactions",
            &[
                "abort",
                "--topic",
                "t",
                "--partition",
                "0",
                "--start-offset",
                "0",
                "--producer-epoch",
                "1",
            ],
            "--start-offset",
            "--producer-epoch",
        ),
    ];
    for (tool, args, flag, action) in cases {
        refused(tool, args, flag, action);
    }
    // --verbose in --describe's offsets view has no columns to add: refused at run time.
    let verbose = with_server("groups", &["--describe", "--group", "g", "--verbose"]);
    assert_refused(&verbose, "--describe --members");
    // consumer-perf-test: --reporting-interval only with --show-detailed-stats.
    let perf = with_server(
        "consumer-perf-test",
        &[
            "--topic",
            "modes",
            "--messages",
            "1",
            "--reporting-interval",
            "1000",
        ],
    );
    assert_refused(&perf, "--show-detailed-stats");

    // The modes that take the flags still do.
    assert_eq!(
        ok(&[
            "topics",
            "--bootstrap-server",
            b,
            "--alter",
            "--topic",
            "modes",
            "--partitions",
            "2",
            "--config",
            "retention.ms=70000",
            "--if-exists"
        ]),
        "Altered topic modes.\n"
    );

    stop_cleanly(&mut broker);
}

#[test]
fn command_config_and_command_property_reach_every_connection() {
    let dir = tempfile::tempdir().unwrap();
    let (mut broker, bootstrap) = broker_with_topic(dir.path(), "wired");
    let b = bootstrap.as_str();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    // Tools whose only connections are their own take client.id and the timeouts, and
    // refuse a property they would drop, naming it and the file.
    let used = write(
        "used.properties",
        "client.id=ops-tools\nrequest.timeout.ms=20000\n\
         socket.connection.setup.timeout.ms=5000\n",
    );
    let unused = write(
        "unused.properties",
        "client.id=ops\nacks=all\nlinger.ms=5\n",
    );
    let bad_timeout = write("timeout.properties", "request.timeout.ms=0\n");
    let tools: [&[&str]; 4] = [
        &["acls", "--list"],
        &["users", "--list"],
        &["transactions", "list"],
        &["configs", "--describe", "--topic", "wired"],
    ];
    for tool in tools {
        let with = |config: &str| {
            let args = [&["--command-config", config][..], &tool[1..]].concat();
            on_server(tool[0], b, &args, None)
        };
        let out = with(&used);
        assert!(out.status.success(), "{tool:?}: {out:?}");
        let out = with(&unused);
        assert_eq!(out.status.code(), Some(1), "{tool:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("unused.properties")
                && stderr.contains("`acks`, `linger.ms` are not used by this tool"),
            "{tool:?}: {stderr}"
        );
        let out = with(&bad_timeout);
        assert_eq!(out.status.code(), Some(1), "{tool:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("timeout.properties:1") && stderr.contains("request.timeout.ms"),
            "{tool:?}: {stderr}"
        );
    }
    // topics: --command-property reaches the Metadata request of --list too (TLS asked for,
    // without a CA, is refused rather than listed over plaintext).
    let out = run(
        &strs(&topics(
            b,
            &["--list", "--command-property", "security.protocol=ssl"],
        )),
        None,
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("ssl.ca.location"),
        "{out:?}"
    );
    let listed = topics(b, &["--list", "--command-property", "client.id=lister"]);
    assert_eq!(ok(&strs(&listed)), "wired\n");

    // consumer-perf-test: the flags given win over --consumer.config (a --fetch-size
    // librdkafka refuses is refused although the file's is fine); the file's is used
    // without them.
    produce(b, "wired", &[], b"one\ntwo\n");
    let perf_config = write("perf.properties", "max.partition.fetch.bytes=65536\n");
    let perf = |extra: &[&str]| {
        let flags = [
            "--topic",
            "wired",
            "--messages",
            "2",
            "--timeout",
            "20000",
            "--consumer.config",
            &perf_config,
        ];
        on_server("consumer-perf-test", b, &[&flags[..], extra].concat(), None)
    };
    let read = perf(&[]);
    assert!(read.status.success(), "{read:?}");
    assert_refused(&perf(&["--fetch-size", "0"]), "max.partition.fetch.bytes");

    stop_cleanly(&mut broker);
}
