//! The example agent, run as a user would: its YAML names the plugin types like built-ins,
//! mistakes in their options are reported like the built-ins' are, and the ticker's checkpoint
//! makes a second run go on rather than start over.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

fn agent(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_custom-agent"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

fn pipeline(count: u64) -> String {
    let shipped =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("pipeline.yaml"))
            .unwrap();
    assert!(shipped.contains("count: 100"));
    shipped.replace("count: 100", &format!("count: {count}"))
}

fn lines(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("var/ticks.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn the_plugins_run_from_yaml_and_a_second_run_resumes_from_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.yaml"), pipeline(100)).unwrap();
    let out = agent(dir.path(), &["run", "p.yaml"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first = lines(dir.path());
    assert_eq!(first.len(), 100);
    assert_eq!(first[7]["body"], "hello 7");
    assert_eq!(first[7]["headers"]["n"], "7");

    // Asking for 150 in all: the ticker resumes at 100 from its checkpoint.
    std::fs::write(dir.path().join("p.yaml"), pipeline(150)).unwrap();
    let out = agent(dir.path(), &["run", "p.yaml"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all = lines(dir.path());
    assert_eq!(all.len(), 150);
    let bodies: Vec<String> = all
        .iter()
        .map(|l| l["body"].as_str().unwrap().to_owned())
        .collect();
    let expected: Vec<String> = (0..150).map(|n| format!("hello {n}")).collect();
    assert_eq!(bodies, expected);
}

#[test]
fn plugin_options_are_checked_like_built_in_ones() {
    let dir = tempfile::tempdir().unwrap();
    let broken = pipeline(100).replace("    message: hello", "    mesage: hello");
    std::fs::write(dir.path().join("p.yaml"), broken).unwrap();
    let out = agent(dir.path(), &["validate", "p.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("p.yaml:10:5"), "{stderr}");
    assert!(stderr.contains("source `greetings`"), "{stderr}");
    assert!(stderr.contains("did you mean `message`"), "{stderr}");
    // The built-ins are still there.
    let out = agent(
        dir.path(),
        &[
            "validate",
            &format!(
                "{}/../../pipelines/seq-to-logger.yaml",
                env!("CARGO_MANIFEST_DIR")
            ),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
