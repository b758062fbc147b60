//! `agent validate` on broken configurations and on every shipped pipeline.

#![allow(clippy::unwrap_used)]

use std::process::Command;

use crate::harness;

fn validate(path: &std::path::Path) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_agent"))
        .arg("validate")
        .arg(path)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_shipped_pipeline_is_valid() {
    let dir = harness::repo_root().join("pipelines");
    let mut checked = 0;
    let chain = ["broker.yaml", "edge.yaml", "collector.yaml"].map(|f| dir.join("chain").join(f));
    let chain = chain
        .into_iter()
        .chain([harness::repo_root().join("examples/process-plugins/pipeline.yaml")]);
    let shipped = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path());
    for path in shipped.chain(chain) {
        if path.extension().is_some_and(|e| e == "yaml") {
            let (code, _, stderr) = validate(&path);
            assert_eq!(code, 0, "{}: {stderr}", path.display());
            checked += 1;
        }
    }
    assert!(checked >= 11, "only {checked} pipelines found");
}

/// Each broken file, with the lines that must appear in the report (after the file name).
const BROKEN: &[(&str, &[&str])] = &[
    (
        "unknown-types.yaml",
        &[
            ":3:11: source `app`: unknown source type `netcta`, did you mean `netcat`?",
            ":7:11: channel `buffer`: unknown channel type `memroy`, did you mean `memory`?",
            ":10:11: sink `out`: unknown sink type `loger`, did you mean `logger`?",
        ],
    ),
    (
        "missing-references.yaml",
        &[
            ":4:16: source `numbers`: unknown channel `bufer`, did you mean `buffer`?",
            ":6:3: channel `buffer`: no sink takes from this channel",
            ":8:3: channel `unread`: no sink takes from this channel",
            ":13:14: sink `out`: unknown channel `missing`",
        ],
    ),
    (
        "batch-too-large.yaml",
        &[
            ":5:5: source `numbers`: batch_size 500 is above the transaction_capacity 100 of channel `buffer`",
            ":15:5: sink `out`: batch_size 200 is above the transaction_capacity 100 of channel `buffer`",
        ],
    ),
    (
        "bad-options.yaml",
        &[
            ":2:3: section `agent`: unknown option `data_dri`, did you mean `data_dir`?",
            ":7:11: source `lines`: ",
            ":12:5: channel `buffer`: `transaction_capacity` (100) is larger than `capacity` (10)",
            ":18:5: sink `files`: unknown option `directroy`, did you mean `directory`?",
            // Found with the one above: a component reports every bad option at once.
            ":19:20: sink `files`: option `roll_interval`: invalid duration `soon`",
        ],
    ),
    (
        "exactly-once-from-memory.yaml",
        &[
            ":12:5: sink `to_kafka`: this delivery needs a channel that numbers its events (a file channel, or a kafka channel on a one-partition topic); channel `buffer` does not",
        ],
    ),
    (
        "several-bad-options.yaml",
        &[
            ":6:5: source `numbers`: unknown option `batch_sise`, did you mean `batch_size`?",
            ":7:19: source `numbers`: option `total_events`: ",
            ":17:5: sink `to_kafka`: unknown compression `zip`, did you mean `gzip`?",
            ":18:5: sink `to_kafka`: unknown acks `al`, did you mean `all`?",
            ":19:13: sink `to_kafka`: option `linger`: invalid duration `soon`",
        ],
    ),
    (
        "capacity-out-of-range.yaml",
        &[
            // The real bound, not "must be at least 1".
            ":9:5: channel `buffer`: `transaction_capacity` must be between 1 and 4294967295",
        ],
    ),
    ("not-yaml.yaml", &[": invalid YAML: "]),
];

#[test]
fn broken_configs_report_every_problem_with_lines_and_exit_2() {
    let dir = harness::repo_root().join("tests/configs/broken");
    for (file, expected) in BROKEN {
        let path = dir.join(file);
        let (code, _, stderr) = validate(&path);
        assert_eq!(code, 2, "{file}: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        for want in *expected {
            assert!(
                lines.iter().any(|l| l.contains(want)),
                "{file}: no line containing `{want}` in:\n{stderr}"
            );
        }
        let n = expected.len();
        let summary = format!("{n} problem{} in ", if n == 1 { "" } else { "s" });
        assert!(
            stderr.contains(&summary),
            "{file}: expected exactly {n} problems:\n{stderr}"
        );
    }
}

#[test]
fn run_refuses_a_broken_config_and_starts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let port = harness::free_port();
    let config = format!(
        "sources:\n  n: {{ type: netcat, port: {port}, channels: [c] }}\nchannels:\n  c: {{ type: memory }}\nsinks:\n  s: {{ type: logger, channel: nope }}\n"
    );
    let file = dir.path().join("p.yaml");
    std::fs::write(&file, config).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_agent"))
        .arg("run")
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown channel `nope`"));
    // Nothing was started: the port was never bound.
    assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_ok());
}

#[test]
fn flume_spellings_of_types_are_taken_with_the_canonical_name_noted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flume-types.yaml");
    std::fs::write(
        &path,
        "\
sources:
  s: { type: SEQ, channels: [c], total_events: 3 }
channels:
  c: { type: org.apache.flume.channel.MemoryChannel }
sinks:
  k: { type: FILE_ROLL, channel: c, directory: ./out }
",
    )
    .unwrap();
    let (code, stdout, stderr) = validate(&path);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains(": ok"), "{stdout}");
    for note in [
        ":2:14: source type `SEQ` is taken as `seq`; write `seq`",
        ":4:14: channel type `org.apache.flume.channel.MemoryChannel` is taken as `memory`",
        ":6:14: sink type `FILE_ROLL` is taken as `file_roll`",
    ] {
        assert!(stderr.contains(note), "no `{note}` in:\n{stderr}");
    }
}
