//! The bundled broker run by the agent (alone and inside a pipeline), driven by the agent's
//! Kafka tools, which are librdkafka clients.

#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::harness;

use crate::harness::{Agent, free_port, wait_until};

/// Runs the agent and expects exit status 0.
fn agent(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let out = harness::agent_output(args, stdin);
    assert!(
        out.status.success(),
        "agent {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// Starts `agent run` on a pipeline file holding only a `broker:` section.
fn start_broker(dir: &std::path::Path) -> (Agent, String) {
    harness::broker_agent(dir, 2)
}

#[test]
fn topics_tool_creates_describes_lists_grows_and_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let (mut broker, bootstrap) = start_broker(dir.path());
    let b = bootstrap.as_str();
    let describe = |topic: &str| {
        stdout(&agent(
            &[
                "topics",
                "--bootstrap-server",
                b,
                "--describe",
                "--topic",
                topic,
            ],
            None,
        ))
    };
    let created = agent(
        &[
            "topics",
            "--bootstrap-server",
            b,
            "--create",
            "--topic",
            "first",
            "--partitions",
            "3",
            "--replication-factor",
            "1",
            "--config",
            "retention.ms=60000",
        ],
        None,
    );
    assert_eq!(stdout(&created), "Created topic first.\n");
    agent(
        &[
            "topics",
            "--bootstrap-server",
            b,
            "--create",
            "--topic",
            "second",
        ],
        None,
    );
    let listed = agent(&["topics", "--bootstrap-server", b, "--list"], None);
    assert_eq!(stdout(&listed), "first\nsecond\n");
    // Without --partitions, the broker's num_partitions (2 here), as Kafka.
    let second = describe("second");
    assert!(second.contains("\tPartitionCount: 2\t"), "{second}");
    let described = describe("first");
    let lines: Vec<&str> = described.lines().collect();
    assert_eq!(lines.len(), 4, "{described}");
    assert!(
        lines[0].starts_with("Topic: first\tTopicId: ")
            && lines[0].contains("\tPartitionCount: 3\tReplicationFactor: 1\tConfigs: "),
        "{described}"
    );
    assert!(lines[0].contains("retention.ms=60000"), "{described}");
    for (p, line) in lines[1..].iter().enumerate() {
        assert_eq!(
            *line,
            format!("\tTopic: first\tPartition: {p}\tLeader: 0\tReplicas: 0\tIsr: 0")
        );
    }
    agent(
        &[
            "topics",
            "--bootstrap-server",
            b,
            "--alter",
            "--topic",
            "first",
            "--partitions",
            "5",
        ],
        None,
    );
    agent(
        &[
            "topics",
            "--bootstrap-server",
            b,
            "--alter",
            "--topic",
            "first",
            "--config",
            "retention.ms=120000",
            "--config",
            "segment.bytes=1048576",
        ],
        None,
    );
    let described = describe("first");
    assert!(described.contains("PartitionCount: 5"), "{described}");
    assert!(described.contains("retention.ms=120000"), "{described}");
    assert!(described.contains("segment.bytes=1048576"), "{described}");
    // Another --alter --config changes its key and leaves the other overrides.
    agent(
        &[
            "topics",
            "--bootstrap-server",
            b,
            "--alter",
            "--topic",
            "first",
            "--config",
            "retention.ms=180000",
        ],
        None,
    );
    let described = describe("first");
    assert!(described.contains("retention.ms=180000"), "{described}");
    assert!(described.contains("segment.bytes=1048576"), "{described}");
    let deleted = agent(
        &[
            "topics",
            "--bootstrap-server",
            b,
            "--delete",
            "--topic",
            "second",
        ],
        None,
    );
    assert_eq!(stdout(&deleted), "Deleted topic second.\n");
    let listed = agent(&["topics", "--bootstrap-server", b, "--list"], None);
    assert_eq!(stdout(&listed), "first\n");
    broker.signal(Signal::SIGTERM);
    assert!(
        broker.wait(Duration::from_secs(30)).success(),
        "{}",
        broker.log()
    );
}

#[test]
fn console_producer_and_consumer_round_trip_keys_and_values() {
    let dir = tempfile::tempdir().unwrap();
    let (mut broker, bootstrap) = start_broker(dir.path());
    let b = bootstrap.as_str();
    let lines: Vec<String> = (0..5000)
        .map(|i| format!("key-{}:value {i}", i % 7))
        .collect();
    let input = lines.join("\n") + "\n";
    agent(
        &[
            "console-producer",
            "--bootstrap-server",
            b,
            "--topic",
            "events",
            "--property",
            "parse.key=true",
            "--property",
            "key.separator=:",
            "--compression-codec",
            "zstd",
        ],
        Some(input.as_bytes()),
    );
    let out = agent(
        &[
            "console-consumer",
            "--bootstrap-server",
            b,
            "--topic",
            "events",
            "--from-beginning",
            "--max-messages",
            "5000",
            "--property",
            "print.key=true",
            "--property",
            "key.separator=:",
        ],
        None,
    );
    let mut got: Vec<String> = stdout(&out).lines().map(str::to_owned).collect();
    let mut want = lines.clone();
    got.sort();
    want.sort();
    assert_eq!(got, want);
    // Each partition read on its own from an offset: all records of a key are in one
    // partition, in the order produced.
    let mut total = 0;
    for partition in ["0", "1"] {
        let out = agent(
            &[
                "console-consumer",
                "--bootstrap-server",
                b,
                "--topic",
                "events",
                "--partition",
                partition,
                "--offset",
                "earliest",
                "--timeout-ms",
                "1500",
                "--property",
                "print.key=true",
                "--property",
                "key.separator=:",
            ],
            None,
        );
        let text = stdout(&out);
        total += text.lines().count();
        for key in 0..7 {
            let prefix = format!("key-{key}:");
            let got: Vec<&str> = text.lines().filter(|l| l.starts_with(&prefix)).collect();
            if got.is_empty() {
                continue;
            }
            let want: Vec<&str> = lines
                .iter()
                .map(String::as_str)
                .filter(|l| l.starts_with(&prefix))
                .collect();
            assert_eq!(got, want, "partition {partition}, key {key}");
        }
    }
    assert_eq!(total, 5000);
    broker.signal(Signal::SIGTERM);
    assert!(
        broker.wait(Duration::from_secs(30)).success(),
        "{}",
        broker.log()
    );
}

#[test]
fn broker_command_serves_until_sigterm_and_keeps_data() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = dir.path().join("broker.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: 127.0.0.1:{port}\ndata_dir: {}\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let bootstrap = format!("127.0.0.1:{port}");
    // Its standard error, so that a start that fails says why.
    let log = dir.path().join("broker.log");
    let run = || {
        let mut child = Command::new(env!("CARGO_BIN_EXE_agent"))
            .args(["broker", "--config", config.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        harness::wait_listening(&mut child, &bootstrap, "the broker", || {
            std::fs::read_to_string(&log).unwrap_or_default()
        });
        child
    };
    let stop = |mut child: std::process::Child| {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            Signal::SIGTERM,
        )
        .unwrap();
        assert!(child.wait().unwrap().success());
    };
    let child = run();
    agent(
        &[
            "console-producer",
            "--bootstrap-server",
            &bootstrap,
            "--topic",
            "kept",
        ],
        Some(b"one\ntwo\nthree\n"),
    );
    stop(child);
    let child = run();
    let out = agent(
        &[
            "console-consumer",
            "--bootstrap-server",
            &bootstrap,
            "--topic",
            "kept",
            "--from-beginning",
            "--max-messages",
            "3",
        ],
        None,
    );
    assert_eq!(stdout(&out), "one\ntwo\nthree\n");
    stop(child);
}

#[test]
fn broker_settings_are_validated_with_lines() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.yaml");
    std::fs::write(
        &file,
        "broker:\n  listen: 127.0.0.1:0\n  num_partitons: 3\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_agent"))
        .arg("validate")
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            ":3:3: section `broker`: unknown option `num_partitons`, did you mean `num_partitions`?"
        ),
        "{stderr}"
    );
}

#[test]
fn dump_log_segments_prints_the_records_produced() {
    let dir = tempfile::tempdir().unwrap();
    let (mut broker, bootstrap) = start_broker(dir.path());
    let b = bootstrap.as_str();
    agent(
        &[
            "topics",
            "--bootstrap-server",
            b,
            "--create",
            "--topic",
            "dumped",
            "--partitions",
            "1",
        ],
        None,
    );
    let input: String = (0..300).map(|i| format!("k{i}\tvalue-{i}\n")).collect();
    agent(
        &[
            "console-producer",
            "--bootstrap-server",
            b,
            "--topic",
            "dumped",
            "--property",
            "parse.key=true",
        ],
        Some(input.as_bytes()),
    );
    broker.signal(Signal::SIGTERM);
    assert!(broker.wait(Duration::from_secs(30)).success());
    let segment = dir.path().join("broker/dumped-0/00000000000000000000.log");
    let out = stdout(&agent(
        &[
            "dump-log-segments",
            "--files",
            segment.to_str().unwrap(),
            "--print-data-log",
        ],
        None,
    ));
    assert!(
        out.starts_with(&format!("Dumping {}\n", segment.display())),
        "{out}"
    );
    assert!(out.contains("baseOffset: 0 "), "{out}");
    let records: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("| offset: "))
        .collect();
    assert_eq!(records.len(), 300, "{out}");
    for (i, record) in records.iter().enumerate() {
        assert!(record.starts_with(&format!("| offset: {i} ")), "{record}");
        assert!(
            record.ends_with(&format!(" key: k{i} payload: value-{i}")),
            "{record}"
        );
    }
    let batches: usize = out
        .lines()
        .filter(|l| l.starts_with("baseOffset: "))
        .map(|l| {
            let count = l.split(" count: ").nth(1).unwrap();
            count.split(' ').next().unwrap().parse::<usize>().unwrap()
        })
        .sum();
    assert_eq!(batches, 300, "batch counts add up to the records");
}

#[test]
fn taildir_to_kafka_pipeline_lands_every_line_in_the_bundled_broker() {
    const LINES: usize = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let bootstrap = format!("127.0.0.1:{port}");
    let config = harness::pipeline(
        "taildir-to-kafka.yaml",
        &[
            ("127.0.0.1:9092", &bootstrap),
            ("./var/taildir-to-kafka", "./state"),
            ("./var/broker", "./broker"),
        ],
    );
    std::fs::create_dir(dir.path().join("logs")).unwrap();
    let mut log = std::fs::File::create(dir.path().join("logs/app.log")).unwrap();
    for i in 0..LINES / 2 {
        writeln!(log, "line {i}").unwrap();
    }
    let mut pipeline = Agent::start(dir.path(), &config);
    for i in LINES / 2..LINES {
        writeln!(log, "line {i}").unwrap();
    }
    pipeline.wait_listening(&bootstrap, "the bundled broker");
    wait_until(Duration::from_secs(60), "the topic to exist", || {
        stdout(&agent_unchecked(&[
            "topics",
            "--bootstrap-server",
            &bootstrap,
            "--list",
        ]))
        .contains("app-logs")
    });
    let out = agent(
        &[
            "console-consumer",
            "--bootstrap-server",
            &bootstrap,
            "--topic",
            "app-logs",
            "--from-beginning",
            "--max-messages",
            &LINES.to_string(),
            "--property",
            "print.key=false",
        ],
        None,
    );
    let mut got: Vec<String> = stdout(&out).lines().map(str::to_owned).collect();
    got.sort();
    let mut want: Vec<String> = (0..LINES).map(|i| format!("line {i}")).collect();
    want.sort();
    assert_eq!(got, want);
    pipeline.signal(Signal::SIGTERM);
    assert!(
        pipeline.wait(Duration::from_secs(60)).success(),
        "{}",
        pipeline.log()
    );
}

/// Runs the agent with `args`, whatever its exit status.
fn agent_unchecked(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agent"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn groups_tool_shows_lag_resets_and_deletes_a_console_consumer_group() {
    let dir = tempfile::tempdir().unwrap();
    let (mut broker, bootstrap) = start_broker(dir.path());
    let b = bootstrap.as_str();
    agent(
        &[
            "topics",
            "--bootstrap-server",
            b,
            "--create",
            "--topic",
            "lagged",
            "--partitions",
            "1",
        ],
        None,
    );
    let input: String = (0..100).map(|i| format!("r{i}\n")).collect();
    agent(
        &[
            "console-producer",
            "--bootstrap-server",
            b,
            "--topic",
            "lagged",
        ],
        Some(input.as_bytes()),
    );
    // A console consumer in group g1 reads 40 records and commits as it goes.
    let read = agent(
        &[
            "console-consumer",
            "--bootstrap-server",
            b,
            "--topic",
            "lagged",
            "--group",
            "g1",
            "--from-beginning",
            "--max-messages",
            "40",
        ],
        None,
    );
    let expected: String = (0..40).map(|i| format!("r{i}\n")).collect();
    assert_eq!(stdout(&read), expected);
    let listed = stdout(&agent(&["groups", "--bootstrap-server", b, "--list"], None));
    assert!(listed.lines().any(|l| l == "g1"), "{listed}");
    let row = |text: &str| -> Vec<String> {
        let lines: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
        assert_eq!(lines.len(), 2, "{text}");
        let header: Vec<&str> = lines[0].split_whitespace().collect();
        assert_eq!(
            header,
            [
                "GROUP",
                "TOPIC",
                "PARTITION",
                "CURRENT-OFFSET",
                "LOG-END-OFFSET",
                "LAG",
                "CONSUMER-ID",
                "HOST",
                "CLIENT-ID"
            ]
        );
        lines[1].split_whitespace().map(str::to_owned).collect()
    };
    let describe = || {
        stdout(&agent(
            &[
                "groups",
                "--bootstrap-server",
                b,
                "--describe",
                "--group",
                "g1",
            ],
            None,
        ))
    };
    assert_eq!(
        row(&describe())[..6],
        ["g1", "lagged", "0", "40", "100", "60"]
    );
    // A dry run changes nothing; --execute moves the offsets.
    let plan = stdout(&agent(
        &[
            "groups",
            "--bootstrap-server",
            b,
            "--reset-offsets",
            "--group",
            "g1",
            "--topic",
            "lagged",
            "--to-earliest",
        ],
        None,
    ));
    assert!(plan.contains("NEW-OFFSET"), "{plan}");
    assert_eq!(row(&describe())[3], "40");
    agent(
        &[
            "groups",
            "--bootstrap-server",
            b,
            "--reset-offsets",
            "--group",
            "g1",
            "--topic",
            "lagged",
            "--to-offset",
            "90",
            "--execute",
        ],
        None,
    );
    assert_eq!(
        row(&describe())[..6],
        ["g1", "lagged", "0", "90", "100", "10"]
    );
    // The group resumes from its committed offset.
    let rest = agent(
        &[
            "console-consumer",
            "--bootstrap-server",
            b,
            "--topic",
            "lagged",
            "--group",
            "g1",
            "--max-messages",
            "10",
        ],
        None,
    );
    let expected: String = (90..100).map(|i| format!("r{i}\n")).collect();
    assert_eq!(stdout(&rest), expected);
    let deleted = stdout(&agent(
        &[
            "groups",
            "--bootstrap-server",
            b,
            "--delete",
            "--group",
            "g1",
        ],
        None,
    ));
    assert!(
        deleted.contains("'g1'") && deleted.contains("successful"),
        "{deleted}"
    );
    let listed = stdout(&agent(&["groups", "--bootstrap-server", b, "--list"], None));
    assert!(!listed.lines().any(|l| l == "g1"), "{listed}");
    broker.signal(Signal::SIGTERM);
    assert!(
        broker.wait(Duration::from_secs(30)).success(),
        "{}",
        broker.log()
    );
}

/// A topic's `compression.type` re-encodes what producers send (here uncompressed, from the
/// console producer) into its codec, on disk as `dump-log-segments` shows, and kcat reads
/// every record back in order.
#[test]
fn topic_compression_type_stores_every_codec_and_kcat_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let (mut broker, bootstrap) = start_broker(dir.path());
    let b = bootstrap.as_str();
    let input: String = (0..200)
        .map(|i| format!("line {i} {}\n", "x".repeat(i % 50)))
        .collect();
    // Kafka's names, and `none` as producers spell it; what dump-log-segments calls each.
    let codecs = [
        ("uncompressed", "none"),
        ("none", "none"),
        ("gzip", "gzip"),
        ("snappy", "snappy"),
        ("lz4", "lz4"),
        ("zstd", "zstd"),
    ];
    for (codec, _) in codecs {
        let topic = format!("codec-{codec}");
        let config = format!("compression.type={codec}");
        agent(
            &[
                "topics",
                "--bootstrap-server",
                b,
                "--create",
                "--topic",
                &topic,
            ]
            .into_iter()
            .chain(["--partitions", "1", "--config", &config])
            .collect::<Vec<_>>(),
            None,
        );
        agent(
            &[
                "console-producer",
                "--bootstrap-server",
                b,
                "--topic",
                &topic,
            ],
            Some(input.as_bytes()),
        );
        if harness::kcat_available() {
            let out = Command::new("kcat")
                .args(["-b", b, "-C", "-t", &topic, "-e", "-q", "-f", "%o %s\n"])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let expected: String = input
                .lines()
                .enumerate()
                .map(|(i, line)| format!("{i} {line}\n"))
                .collect();
            assert_eq!(String::from_utf8(out.stdout).unwrap(), expected, "{codec}");
        }
    }
    broker.signal(Signal::SIGTERM);
    assert!(broker.wait(Duration::from_secs(30)).success());
    for (codec, stored) in codecs {
        let segment = dir
            .path()
            .join(format!("broker/codec-{codec}-0/00000000000000000000.log"));
        let out = stdout(&agent(
            &["dump-log-segments", "--files", segment.to_str().unwrap()],
            None,
        ));
        let batches: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with("baseOffset: "))
            .collect();
        assert!(!batches.is_empty(), "{out}");
        for batch in batches {
            assert!(
                batch.contains(&format!(" compresscodec: {stored} ")),
                "{codec}: {batch}"
            );
            assert!(batch.contains(" isvalid: true"), "{batch}");
        }
    }
}

/// `agent configs` as kafka-configs.sh: alters a topic's overrides incrementally (a list
/// value in brackets), describes the overrides with their synonyms, or every config with
/// --all, and names the key of a refused value.
#[test]
fn configs_tool_alters_and_describes_topic_configs_as_kafka_configs_sh() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, bootstrap) = start_broker(dir.path());
    let b = bootstrap.as_str();
    agent(
        &[
            "topics",
            "--bootstrap-server",
            b,
            "--create",
            "--topic",
            "tuned",
        ]
        .into_iter()
        .chain(["--partitions", "1", "--config", "retention.ms=5000"])
        .collect::<Vec<_>>(),
        None,
    );
    let configs = |args: &[&str]| {
        let mut all = vec!["configs", "--bootstrap-server", b];
        all.extend_from_slice(args);
        stdout(&agent(&all, None))
    };
    let altered = configs(&[
        "--entity-type",
        "topics",
        "--entity-name",
        "tuned",
        "--alter",
        "--add-config",
        "segment.ms=60000,leader.replication.throttled.replicas=[0:0,1:0]",
    ]);
    assert_eq!(altered, "Completed updating config for topic tuned.\n");
    assert_eq!(
        configs(&[
            "--entity-type",
            "topics",
            "--entity-name",
            "tuned",
            "--describe"
        ]),
        "Dynamic configs for topic tuned are:\n\
         \x20 leader.replication.throttled.replicas=0:0,1:0 sensitive=false \
         synonyms={DYNAMIC_TOPIC_CONFIG:leader.replication.throttled.replicas=0:0,1:0}\n\
         \x20 retention.ms=5000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=5000}\n\
         \x20 segment.ms=60000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:segment.ms=60000}\n"
    );
    configs(&[
        "--topic",
        "tuned",
        "--alter",
        "--delete-config",
        "segment.ms,retention.ms",
    ]);
    let all = configs(&["--topic", "tuned", "--describe", "--all"]);
    assert!(
        all.starts_with("All configs for topic tuned are:\n"),
        "{all}"
    );
    assert!(
        all.contains("\n  compression.type=producer sensitive=false synonyms={}\n"),
        "{all}"
    );
    assert!(
        all.contains("\n  retention.ms=604800000 "),
        "back to the default: {all}"
    );
    assert!(!all.contains("segment.ms=60000"), "{all}");
    let brokers = configs(&[
        "--entity-type",
        "brokers",
        "--entity-name",
        "0",
        "--describe",
        "--all",
    ]);
    assert!(
        brokers.starts_with("All configs for broker 0 are:\n"),
        "{brokers}"
    );
    let refused = Command::new(env!("CARGO_BIN_EXE_agent"))
        .args([
            "configs",
            "--bootstrap-server",
            b,
            "--topic",
            "tuned",
            "--alter",
        ])
        .args(["--add-config", "compression.type=brotli"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("`compression.type`") && stderr.contains("brotli"),
        "{stderr}"
    );
}

/// `agent get-offsets` prints `topic:partition:offset` lines as kafka-get-offsets.sh: the log
/// end by default, the start with `--time -2`, the first offset at a timestamp, nothing after
/// the colon where no record is that late, the record with the largest timestamp with `-3`.
#[test]
fn get_offsets_prints_topic_partition_offset_lines() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, bootstrap) = start_broker(dir.path());
    let b = bootstrap.as_str();
    for topic in ["offsets-a", "offsets-b"] {
        agent(
            &[
                "topics",
                "--bootstrap-server",
                b,
                "--create",
                "--topic",
                topic,
                "--partitions",
                "2",
            ],
            None,
        );
    }
    let input: String = (0..30).map(|i| format!("k{i}\tv{i}\n")).collect();
    agent(
        &[
            "console-producer",
            "--bootstrap-server",
            b,
            "--topic",
            "offsets-a",
        ]
        .into_iter()
        .chain(["--property", "parse.key=true"])
        .collect::<Vec<_>>(),
        Some(input.as_bytes()),
    );
    let offsets = |args: &[&str]| {
        let mut all = vec!["get-offsets", "--bootstrap-server", b];
        all.extend_from_slice(args);
        stdout(&agent(&all, None))
    };
    let latest = offsets(&["--topic", "offsets-.*"]);
    let lines: Vec<&str> = latest.lines().collect();
    assert_eq!(lines.len(), 4, "{latest}");
    assert_eq!(lines[2..], ["offsets-b:0:0", "offsets-b:1:0"], "{latest}");
    let total: i64 = lines[..2]
        .iter()
        .map(|l| {
            assert!(l.starts_with("offsets-a:"), "{l}");
            l.rsplit(':').next().unwrap().parse::<i64>().unwrap()
        })
        .sum();
    assert_eq!(total, 30, "{latest}");
    assert_eq!(
        offsets(&["--topic", "offsets-a", "--time", "-2"]),
        "offsets-a:0:0\noffsets-a:1:0\n"
    );
    assert_eq!(
        offsets(&["--topic-partitions", "offsets-a:1", "--time", "earliest"]),
        "offsets-a:1:0\n"
    );
    // Every record is older than the year 2200; the first is at or after 0.
    assert_eq!(
        offsets(&[
            "--topic",
            "offsets-a",
            "--partitions",
            "0",
            "--time",
            "7258118400000"
        ]),
        "offsets-a:0:\n"
    );
    assert_eq!(
        offsets(&["--topic", "offsets-a", "--partitions", "0", "--time", "0"]),
        "offsets-a:0:0\n"
    );
    // The record with the largest timestamp (ListOffsets v7): the second of three.
    let producer: rdkafka::producer::BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", b)
        .create()
        .unwrap();
    for ts in [1_000, 5_000, 3_000] {
        let record = rdkafka::producer::BaseRecord::<(), _>::to("offsets-b")
            .partition(0)
            .payload("x")
            .timestamp(ts);
        producer.send(record).map_err(|(e, _)| e).unwrap();
    }
    rdkafka::producer::Producer::flush(&producer, Duration::from_secs(10)).unwrap();
    assert_eq!(
        offsets(&["--topic", "offsets-b", "--time", "-3"]),
        "offsets-b:0:1\noffsets-b:1:\n"
    );
    assert_eq!(
        offsets(&[
            "--topic-partitions",
            "offsets-b:0",
            "--time",
            "max-timestamp"
        ]),
        "offsets-b:0:1\n"
    );
}
