//! `agent state` and `agent validate --state` on the real binary: a taildir → file channel →
//! http pipeline whose sink cannot deliver (the server answers 503) holds every line written;
//! the state shows them as the channel's depth and the tailed files' offsets, while the agent
//! runs and after it stopped, without changing a byte of the data directory; a damaged state
//! database or segment file makes both commands fail naming the file.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, SystemTime};

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::harness::{Agent, http_server, wait_until};

/// A pipeline tailing `logs/*.log` into a file channel in `data/`, drained by an http sink to
/// `port`.
fn pipeline(port: u16) -> String {
    format!(
        "agent:
  data_dir: ./data
  drain_timeout: 1s
sources:
  app:
    type: taildir
    channels: [buffer]
    filegroups: {{ logs: ./logs/*.log }}
    interceptors: [ {{ type: timestamp }} ]
channels:
  buffer: {{ type: file }}
sinks:
  out:
    type: http
    channel: buffer
    endpoint: http://127.0.0.1:{port}/
"
    )
}

/// Appends `lines` numbered lines to `file`.
fn append(file: &Path, from: usize, lines: usize) {
    let mut out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)
        .unwrap();
    for n in from..from + lines {
        writeln!(out, "line {n} of {}", file.display()).unwrap();
    }
}

/// Runs `agent ARGS...` in `dir` and returns what it printed.
fn agent(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agent"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

/// `agent state --json` on `data_dir`: the exit code and the report.
fn state_json(dir: &Path) -> (i32, Value) {
    let out = agent(dir, &["state", "--data-dir", "data", "--json"]);
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), report)
}

fn depth(report: &Value) -> u64 {
    report["data_dirs"][0]["channels"][0]["depth"]
        .as_u64()
        .unwrap_or(0)
}

/// The taildir positions of the report, by file name: (offset, bytes behind or `None` when
/// the file is gone).
fn positions(report: &Value) -> BTreeMap<String, (u64, Option<u64>)> {
    let files = report["data_dirs"][0]["sources"][0]["checkpoint"]["files"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    files
        .iter()
        .map(|f| {
            let name = Path::new(f["path"].as_str().unwrap())
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let behind = (f["now"]["state"] == "present")
                .then(|| f["now"]["bytes_behind"].as_u64().unwrap());
            (name, (f["offset"].as_u64().unwrap(), behind))
        })
        .collect()
}

/// Every file under `dir`: its bytes and modification time.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (Vec<u8>, SystemTime)> {
    let mut out = BTreeMap::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = fs::metadata(&path).unwrap();
            if meta.is_dir() {
                pending.push(path);
            } else {
                out.insert(
                    path.clone(),
                    (fs::read(&path).unwrap(), meta.modified().unwrap()),
                );
            }
        }
    }
    out
}

/// Runs the pipeline until the channel holds `a.log`'s 30 lines and `b.log`'s 20, then stops
/// it with `signal`. Returns the test directory.
fn filled_and_stopped(signal: Signal) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    fs::create_dir(&logs).unwrap();
    append(&logs.join("a.log"), 0, 30);
    append(&logs.join("b.log"), 0, 20);
    let (port, _received) = http_server(|_| 503, Duration::ZERO);
    let mut running = Agent::start(dir.path(), &pipeline(port));
    wait_until(
        Duration::from_secs(30),
        "the channel to hold 50 events",
        || {
            let (_, report) = state_json(dir.path());
            depth(&report) == 50
        },
    );
    running.signal(signal);
    running.wait(Duration::from_secs(30));
    dir
}

#[test]
fn shows_depth_and_offsets_of_a_stopped_agent_and_changes_nothing() {
    let dir = filled_and_stopped(Signal::SIGTERM);
    let data = dir.path().join("data");
    let before = snapshot(&data);
    let (code, report) = state_json(dir.path());
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["healthy"], true);
    assert_eq!(depth(&report), 50, "{report:#}");
    let a_len = fs::metadata(dir.path().join("logs/a.log")).unwrap().len();
    let b_len = fs::metadata(dir.path().join("logs/b.log")).unwrap().len();
    let expected: BTreeMap<String, (u64, Option<u64>)> = [
        ("a.log".to_owned(), (a_len, Some(0))),
        ("b.log".to_owned(), (b_len, Some(0))),
    ]
    .into();
    assert_eq!(positions(&report), expected, "{report:#}");
    let channel = &report["data_dirs"][0]["channels"][0];
    assert_eq!(channel["name"], "buffer");
    assert_eq!(
        channel["oldest_age_from"], "timestamp_header",
        "{channel:#}"
    );
    assert!(
        channel["oldest_age_ms"].as_u64().unwrap() < 120_000,
        "{channel:#}"
    );
    assert!(
        channel["size_on_disk"].as_u64().unwrap() > a_len + b_len,
        "{channel:#}"
    );
    assert_eq!(report["data_dirs"][0]["integrity"][0], "ok");

    // The table carries the same numbers.
    let table = agent(dir.path(), &["state", "--config", "pipeline.yaml"]);
    assert!(table.status.success());
    let text = String::from_utf8(table.stdout).unwrap();
    assert!(text.contains("integrity ok"), "{text}");
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with("buffer"))
        .unwrap();
    assert_eq!(row.split_whitespace().nth(1), Some("50"), "{text}");
    assert!(
        text.contains(&format!("offset {a_len}")) && text.contains("behind 0B"),
        "{text}"
    );
    assert_eq!(
        snapshot(&data),
        before,
        "agent state changed the data directory"
    );

    // Appended lines show as bytes behind; a removed file as gone.
    append(&dir.path().join("logs/a.log"), 30, 5);
    fs::remove_file(dir.path().join("logs/b.log")).unwrap();
    let grown = fs::metadata(dir.path().join("logs/a.log")).unwrap().len();
    let (code, report) = state_json(dir.path());
    assert_eq!(code, 0);
    let expected: BTreeMap<String, (u64, Option<u64>)> = [
        ("a.log".to_owned(), (a_len, Some(grown - a_len))),
        ("b.log".to_owned(), (b_len, None)),
    ]
    .into();
    assert_eq!(positions(&report), expected, "{report:#}");
    let text =
        String::from_utf8(agent(dir.path(), &["state", "--data-dir", "data"]).stdout).unwrap();
    assert!(text.contains("file gone"), "{text}");
    assert_eq!(
        snapshot(&data),
        before,
        "agent state changed the data directory"
    );
}

#[test]
fn reads_a_running_agent_and_a_killed_one_without_disturbing_either() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    fs::create_dir(&logs).unwrap();
    append(&logs.join("a.log"), 0, 10);
    let (port, _received) = http_server(|_| 503, Duration::ZERO);
    let mut running = Agent::start(dir.path(), &pipeline(port));
    wait_until(Duration::from_secs(30), "10 events stored", || {
        depth(&state_json(dir.path()).1) == 10
    });
    // Reading many times while the agent tails more: it goes on storing every line.
    for round in 1..=5 {
        append(&logs.join("a.log"), round * 10, 10);
        let (code, _) = state_json(dir.path());
        assert_eq!(code, 0);
    }
    wait_until(Duration::from_secs(30), "60 events stored", || {
        depth(&state_json(dir.path()).1) == 60
    });
    let log = running.log();
    assert!(
        !log.contains("locked") && !log.contains("readonly"),
        "{log}"
    );
    running.signal(Signal::SIGKILL);
    running.wait(Duration::from_secs(10));
    let data = dir.path().join("data");
    let before = snapshot(&data);
    assert!(
        before
            .keys()
            .any(|p| p.to_string_lossy().ends_with("state.db-wal")),
        "a killed agent leaves its WAL: {:?}",
        before.keys()
    );
    let (code, report) = state_json(dir.path());
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(depth(&report), 60);
    assert_eq!(
        snapshot(&data),
        before,
        "agent state changed the data directory"
    );
}

#[test]
fn a_damaged_database_fails_state_and_validate_naming_it() {
    let dir = filled_and_stopped(Signal::SIGTERM);
    let db = dir.path().join("data/state.db");
    let mut bytes = fs::read(&db).unwrap();
    let page = 4096;
    assert!(bytes.len() >= 3 * page, "{} bytes", bytes.len());
    // Every b-tree page after the first gets a header that is not one.
    for start in (page..bytes.len()).step_by(page) {
        bytes[start..start + 8].copy_from_slice(&[0x0d, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0]);
    }
    fs::write(&db, &bytes).unwrap();
    let out = agent(dir.path(), &["state", "--data-dir", "data"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("state.db"), "{stderr}");
    let out = agent(dir.path(), &["validate", "--state", "pipeline.yaml"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("state.db"), "{stderr}");
    // Without `--state`, validate checks the configuration only.
    assert!(
        agent(dir.path(), &["validate", "pipeline.yaml"])
            .status
            .success()
    );
}

#[test]
fn a_truncated_segment_fails_state_and_validate_naming_it() {
    let dir = filled_and_stopped(Signal::SIGTERM);
    assert!(
        agent(dir.path(), &["validate", "--state", "pipeline.yaml"])
            .status
            .success()
    );
    let segments = dir.path().join("data/channels/1");
    let segment = fs::read_dir(&segments)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "log"))
        .unwrap();
    let len = fs::metadata(&segment).unwrap().len();
    OpenOptions::new()
        .write(true)
        .open(&segment)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let (code, report) = state_json(dir.path());
    assert_eq!(code, 1, "{report:#}");
    let problems = report["data_dirs"][0]["problems"].to_string();
    let name = segment.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        problems.contains(&name) && problems.contains("committed"),
        "{problems}"
    );
    let out = agent(dir.path(), &["validate", "--state", "pipeline.yaml"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&name), "{stderr}");
    fs::remove_file(&segment).unwrap();
    let (code, report) = state_json(dir.path());
    assert_eq!(code, 1);
    assert!(
        report["data_dirs"][0]["problems"]
            .to_string()
            .contains("missing")
    );
}

#[test]
fn what_cannot_be_read_is_named() {
    let dir = tempfile::tempdir().unwrap();
    // Before the first run there is nothing to check, and nothing is made.
    fs::write(dir.path().join("pipeline.yaml"), pipeline(1)).unwrap();
    let out = agent(dir.path(), &["validate", "--state", "pipeline.yaml"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("./data: no state yet"));
    assert!(!dir.path().join("data").exists());
    let out = agent(dir.path(), &["state", "--data-dir", "nowhere"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nowhere"));
    fs::create_dir(dir.path().join("data")).unwrap();
    fs::write(
        dir.path().join("data/state.db"),
        b"not a database, not at all",
    )
    .unwrap();
    let out = agent(dir.path(), &["state", "--data-dir", "data"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.contains("state.db: not an SQLite state database"),
        "{stderr}"
    );
    assert_eq!(fs::read_dir(dir.path().join("data")).unwrap().count(), 1);
}

#[test]
fn a_pipeline_file_names_every_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let (port, _received) = http_server(|_| 503, Duration::ZERO);
    let config = format!(
        "agent:
  data_dir: ./data
  drain_timeout: 1s
sources:
  counter:
    type: seq
    channels: [elsewhere]
    total_events: 7
channels:
  elsewhere: {{ type: file, data_dir: ./other }}
sinks:
  out:
    type: http
    channel: elsewhere
    endpoint: http://127.0.0.1:{port}/
"
    );
    let mut running = Agent::start(dir.path(), &config);
    let report = || {
        let out = agent(
            dir.path(),
            &["state", "--config", "pipeline.yaml", "--json"],
        );
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    wait_until(Duration::from_secs(30), "7 events in ./other", || {
        report()["data_dirs"][1]["channels"][0]["depth"] == 7
    });
    running.signal(Signal::SIGTERM);
    running.wait(Duration::from_secs(30));
    let report = report();
    let dirs: Vec<&str> = report["data_dirs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["data_dir"].as_str().unwrap())
        .collect();
    assert_eq!(dirs, ["./data", "./other"], "{report:#}");
    assert_eq!(report["healthy"], true, "{report:#}");
    let source = &report["data_dirs"][1]["sources"][0];
    assert_eq!(source["name"], "counter");
    assert_eq!(source["checkpoint"]["format"], "seq", "{source:#}");
    assert_eq!(source["checkpoint"]["next"], 7, "{source:#}");
    let out = agent(dir.path(), &["validate", "--state", "pipeline.yaml"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("./other: state ok"), "{stdout}");
}
