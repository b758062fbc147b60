//! The agent's fuzz targets' inputs, replayed in every test run: the committed corpus
//! (`fuzz/corpus/`: the shipped pipelines, the test configs and Flume files, plugin protocol
//! lines, grown by fuzzing) and the inputs that once crashed a target (`fuzz/regressions/`).
//! Each must give a result or an error, never a panic, as `scripts/fuzz` checks with
//! coverage-guided mutations of them.

#![allow(clippy::unwrap_used)]

use crate::harness;

use std::path::{Path, PathBuf};

fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let root = harness::repo_root().join("fuzz");
    let mut inputs = Vec::new();
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            inputs.push((path.clone(), std::fs::read(&path).unwrap()));
        }
    }
    inputs.sort();
    inputs
}

#[test]
fn every_pipeline_yaml_input_validates_or_fails_without_a_panic() {
    let registry = ferry_agent::builtin_registry();
    let inputs = inputs("pipeline_yaml");
    assert!(inputs.len() >= 10);
    for (_, bytes) in &inputs {
        if let Ok(text) = std::str::from_utf8(bytes) {
            let _ = ferry_agent::topology::parse(text, &registry);
        }
    }
}

#[test]
fn every_flume_properties_input_converts_or_fails_without_a_panic() {
    let registry = ferry_agent::builtin_registry();
    let inputs = inputs("flume_properties");
    assert!(!inputs.is_empty());
    let mut converted = 0;
    for (_, bytes) in &inputs {
        let Ok(text) = std::str::from_utf8(bytes) else {
            continue;
        };
        if let Ok(conversion) = ferry_agent::flume::convert(Path::new("fuzz.conf"), text, "a1") {
            converted += 1;
            let _ = ferry_agent::topology::parse(&conversion.yaml, &registry);
        }
    }
    assert!(converted > 0, "the corpus holds Flume files that convert");
}

#[test]
fn every_plugin_protocol_input_is_read_without_a_panic() {
    let inputs = inputs("plugin_protocol");
    assert!(!inputs.is_empty());
    for (_, line) in &inputs {
        ferry_process::fuzzing::plugin_line(line);
    }
}
