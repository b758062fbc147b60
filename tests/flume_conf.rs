//! The Flume files of `tests/flume-conf/` run unchanged (`agent run FILE --name NAME`) and
//! give the same output as the YAML `agent convert` prints for them.
//!
//! Each file is run twice, each time in a fresh directory (with a broker of its own where it
//! needs Kafka): once as the Flume file, once as the converted YAML. Values the files take
//! from the environment (`${KAFKA_BOOTSTRAP}`, `${HTTP_PORT}`, ...: Flume's
//! `EnvVarResolverProperties` syntax) stay variables in the converted YAML.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsStr;
use std::fs;
use std::io::Write as _;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::harness::{Agent, broker_agent, free_port, read_dir_concat, repo_root, wait_until};
use nix::sys::signal::Signal;

/// How a Flume file is run.
#[derive(Clone, Copy, Debug)]
enum Mode {
    /// `agent run FILE --name NAME`.
    Flume,
    /// `agent convert FILE --name NAME > converted.yaml`, then `agent run converted.yaml`.
    Converted,
}

const MODES: [Mode; 2] = [Mode::Flume, Mode::Converted];

fn conf(name: &str) -> PathBuf {
    repo_root().join("tests/flume-conf").join(name)
}

/// Runs the agent binary to completion.
fn agent(args: &[&OsStr], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agent"))
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The YAML `agent convert` prints for `file`.
fn converted(file: &Path, name: &str) -> String {
    let out = agent(
        &[
            "convert".as_ref(),
            file.as_os_str(),
            "--name".as_ref(),
            name.as_ref(),
        ],
        Path::new("."),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "convert failed: {stderr}");
    let yaml = String::from_utf8(out.stdout).unwrap();
    assert!(
        yaml.starts_with(&format!(
            "# Converted from the Flume file {}",
            file.display()
        )),
        "{yaml}"
    );
    yaml
}

/// Starts `file`'s agent `name` in `dir` the way `mode` says.
fn start(mode: Mode, dir: &Path, file: &Path, name: &str, env: &[(&str, &str)]) -> Agent {
    fs::create_dir_all(dir).unwrap();
    match mode {
        Mode::Flume => Agent::run_args(
            dir,
            &[file.as_os_str(), "--name".as_ref(), name.as_ref()],
            env,
        ),
        Mode::Converted => {
            let yaml = dir.join("converted.yaml");
            fs::write(&yaml, converted(file, name)).unwrap();
            Agent::run_args(dir, &[yaml.as_os_str()], env)
        }
    }
}

fn stop(mut agent: Agent) {
    agent.signal(Signal::SIGTERM);
    let status = agent.wait(Duration::from_secs(30));
    assert!(
        status.success(),
        "agent exited with {status}: {}",
        agent.log()
    );
}

/// The lines of every file under `dir`, once there are `n` of them.
fn lines_in(dir: &Path, n: usize, agent: &Agent) -> Vec<String> {
    let mut lines = Vec::new();
    wait_until(
        Duration::from_secs(60),
        &format!("{n} lines in {}", dir.display()),
        || {
            let text = String::from_utf8(read_dir_concat(dir)).unwrap();
            lines = text.lines().map(str::to_owned).collect();
            assert!(
                lines.len() <= n,
                "more than {n} lines: {lines:?}\n{}",
                agent.log()
            );
            lines.len() == n
        },
    );
    lines
}

/// The values of the first `n` records of `topic`, once there are `n` (the topic exists once
/// the agent wrote to it).
fn consume(bootstrap: &str, topic: &str, n: usize, running: &Agent) -> Vec<String> {
    let mut got = Vec::new();
    let mut stderr = String::new();
    wait_until(
        Duration::from_secs(60),
        &format!("{n} records in {topic}"),
        || {
            let out = agent(
                &[
                    "console-consumer".as_ref(),
                    "--bootstrap-server".as_ref(),
                    bootstrap.as_ref(),
                    "--topic".as_ref(),
                    topic.as_ref(),
                    "--from-beginning".as_ref(),
                    "--max-messages".as_ref(),
                    n.to_string().as_ref(),
                    "--timeout-ms".as_ref(),
                    "5000".as_ref(),
                ],
                Path::new("."),
            );
            stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            got = String::from_utf8(out.stdout)
                .unwrap()
                .lines()
                .map(str::to_owned)
                .collect();
            assert!(got.len() <= n, "{got:?}\n{}", running.log());
            got.len() == n
        },
    );
    assert!(got.len() == n, "{stderr}");
    got
}

#[test]
fn taildir_memory_kafka_runs_unchanged_and_as_converted() {
    let file = conf("taildir-memory-kafka.conf");
    let want: Vec<String> = (0..300).map(|i| format!("order {i} shipped")).collect();
    let mut outputs = Vec::new();
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let (broker, bootstrap) = broker_agent(&dir.path().join("broker"), 1);
        let work = dir.path().join("agent");
        fs::create_dir_all(work.join("logs")).unwrap();
        fs::write(work.join("logs/shop.log"), want.join("\n") + "\n").unwrap();
        let running = start(mode, &work, &file, "a1", &[("KAFKA_BOOTSTRAP", &bootstrap)]);
        let got = consume(&bootstrap, "app-logs", want.len(), &running);
        assert_eq!(got, want, "{mode:?}: {}", running.log());
        // The Flume file's notes are warnings, not silence.
        if let Mode::Flume = mode {
            let log = running.log();
            assert!(
                log.contains(
                    "taildir-memory-kafka.conf:28: a1.channels.c1.keep-alive: no effect here"
                ),
                "{log}"
            );
        }
        stop(running);
        drop(broker);
        outputs.push(got);
    }
    assert_eq!(outputs[0], outputs[1]);
}

#[test]
fn kafka_source_file_channel_file_roll_runs_unchanged_and_as_converted() {
    let file = conf("kafka-file-fileroll.conf");
    let want: Vec<String> = (0..500).map(|i| format!("event {i}")).collect();
    let mut outputs = Vec::new();
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let (broker, bootstrap) = broker_agent(&dir.path().join("broker"), 1);
        let mut producer = Command::new(env!("CARGO_BIN_EXE_agent"))
            .args([
                "console-producer",
                "--bootstrap-server",
                &bootstrap,
                "--topic",
                "app-logs",
            ])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        producer
            .stdin
            .take()
            .unwrap()
            .write_all((want.join("\n") + "\n").as_bytes())
            .unwrap();
        assert!(producer.wait().unwrap().success());
        let work = dir.path().join("agent");
        let running = start(
            mode,
            &work,
            &file,
            "collector",
            &[("KAFKA_BOOTSTRAP", &bootstrap)],
        );
        let got = lines_in(&work.join("out"), want.len(), &running);
        assert_eq!(got, want, "{mode:?}");
        // The channel's files are where `dataDirs` says.
        assert!(work.join("var/flume/data/state.db").exists(), "{mode:?}");
        stop(running);
        drop(broker);
        outputs.push(got);
    }
    assert_eq!(outputs[0], outputs[1]);
}

#[test]
fn a_flume_file_that_cannot_run_is_refused_with_its_lines() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("old.properties");
    fs::write(
        &file,
        "a1.sources = r1\n\
         a1.channels = c1\n\
         a1.sinks = k1\n\
         a1.sources.r1.type = avro\n\
         a1.sources.r1.channels = c1\n\
         a1.channels.c1.type = memory\n\
         a1.sinks.k1.type = hdfs\n\
         a1.sinks.k1.channel = c1\n",
    )
    .unwrap();
    for command in ["run", "validate", "convert"] {
        // flume-ng's spellings, and the extension without `--name` for validate.
        let args: Vec<&OsStr> = match command {
            "validate" => vec![command.as_ref(), file.as_os_str()],
            _ => vec![
                command.as_ref(),
                "-f".as_ref(),
                file.as_os_str(),
                "-n".as_ref(),
                "a1".as_ref(),
            ],
        };
        let out = agent(&args, dir.path());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{command}: {stderr}");
        assert!(out.stdout.is_empty(), "{command}");
        let shown = file.display();
        assert!(
            stderr.contains(&format!(
                "{shown}:4: a1.sources.r1.type: Flume's source `avro` cannot run here"
            )),
            "{command}: {stderr}"
        );
        assert!(
            stderr.contains(&format!(
                "{shown}:7: a1.sinks.k1.type: `hdfs.path` is missing (Flume requires it too): HDFS is not written"
            )),
            "{command}: {stderr}"
        );
        assert!(stderr.contains("2 problems in"), "{command}: {stderr}");
    }
}

#[test]
fn validate_takes_flume_files_and_prints_their_notes() {
    let file = conf("kafka-file-fileroll.conf");
    let out = agent(
        &[
            "validate".as_ref(),
            file.as_os_str(),
            "--name".as_ref(),
            "collector".as_ref(),
        ],
        Path::new("."),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    // `${KAFKA_BOOTSTRAP}` is not set here.
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("kafka-file-fileroll.conf:12: ")
            && stderr.contains("`KAFKA_BOOTSTRAP` is not set"),
        "{stderr}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_agent"))
        .args([OsStr::new("validate"), file.as_os_str()])
        .env("KAFKA_BOOTSTRAP", "127.0.0.1:9")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "kafka-file-fileroll.conf:20: collector.channels.durable.checkpointDir: no effect here"
        ),
        "{stderr}"
    );
}

/// POSTs `events` (`(headers, body)`) to the http source listening on `port`, as Flume's
/// JSONHandler takes them.
fn post(port: u16, events: &[(&[(&str, &str)], &str)]) {
    let json: Vec<serde_json::Value> = events
        .iter()
        .map(|(headers, body)| {
            let headers: serde_json::Map<String, serde_json::Value> = headers
                .iter()
                .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
                .collect();
            serde_json::json!({ "headers": headers, "body": body })
        })
        .collect();
    let body = serde_json::to_vec(&json).unwrap();
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        stream,
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    stream.write_all(&body).unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut stream, &mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[test]
fn multiplexing_fan_out_runs_unchanged_and_as_converted() {
    let file = conf("multiplexing.conf");
    let mut outputs = Vec::new();
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port().to_string();
        let mut running = start(mode, dir.path(), &file, "a1", &[("HTTP_PORT", &port)]);
        running.wait_listening(&format!("127.0.0.1:{port}"), "the http source");
        let port = port.parse().unwrap();
        post(
            port,
            &[
                (&[("country", "CZ")], "praha"),
                (&[("country", "US")], "boston"),
                (&[("country", "SK")], "bratislava"),
                (&[("country", "FR")], "paris"),
                (&[], "nowhere"),
            ],
        );
        let out = dir.path().join("out");
        let got = [
            lines_in(&out.join("europe"), 2, &running),
            lines_in(&out.join("america"), 1, &running),
            lines_in(&out.join("other"), 2, &running),
        ];
        assert_eq!(
            got,
            [
                vec!["praha".to_owned(), "bratislava".to_owned()],
                vec!["boston".to_owned()],
                vec!["paris".to_owned(), "nowhere".to_owned()],
            ],
            "{mode:?}"
        );
        stop(running);
        outputs.push(got);
    }
    assert_eq!(outputs[0], outputs[1]);
}

#[test]
fn failover_sink_group_runs_unchanged_and_as_converted() {
    let file = conf("failover.conf");
    let mut outputs = Vec::new();
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port().to_string();
        let mut running = start(mode, dir.path(), &file, "a1", &[("NETCAT_PORT", &port)]);
        let address = format!("127.0.0.1:{port}");
        running.wait_listening(&address, "the netcat source");
        let mut stream = TcpStream::connect(&address).unwrap();
        for i in 0..50 {
            writeln!(stream, "line {i}").unwrap();
        }
        let out = dir.path().join("out");
        let got = lines_in(&out.join("primary"), 50, &running);
        // The higher priority sink takes everything while it works.
        assert!(read_dir_concat(&out.join("backup")).is_empty(), "{mode:?}");
        stop(running);
        outputs.push(got);
    }
    assert_eq!(outputs[0], outputs[1]);
}

#[test]
fn syslog_to_file_runs_unchanged_and_as_converted() {
    let file = conf("syslog-file.conf");
    let mut outputs = Vec::new();
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port().to_string();
        let mut running = start(mode, dir.path(), &file, "a1", &[("SYSLOG_PORT", &port)]);
        let address = format!("127.0.0.1:{port}");
        running.wait_listening(&address, "the syslog source");
        let mut stream = TcpStream::connect(&address).unwrap();
        for i in 0..20 {
            writeln!(
                stream,
                "<13>Feb  5 17:32:18 web1 app[42]: request {i} served"
            )
            .unwrap();
        }
        let got = lines_in(&dir.path().join("out"), 20, &running);
        assert!(got[0].contains("request 0 served"), "{got:?}");
        stop(running);
        outputs.push(got);
    }
    assert_eq!(outputs[0], outputs[1]);
}
