//! The broker's fuzz targets' inputs, replayed in every test run: the committed corpus
//! (`fuzz/corpus/`, real clients' requests and segments, grown by fuzzing) and the inputs
//! that once crashed a target (`fuzz/regressions/`). Each must be served without a panic, as
//! `scripts/fuzz` checks with coverage-guided mutations of them.

use std::path::{Path, PathBuf};

use ferry_broker::fuzzing::{Harness, dump_segment};

fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut inputs = Vec::new();
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("a corpus entry").path();
            let bytes = std::fs::read(&path).expect("a corpus file");
            inputs.push((path, bytes));
        }
    }
    inputs.sort();
    inputs
}

#[test]
fn every_kafka_request_input_is_served_without_a_panic() {
    let inputs = inputs("kafka_request");
    assert!(
        inputs.len() >= 20,
        "the corpus holds real clients' requests"
    );
    let dir = tempfile::tempdir().unwrap();
    let harness = Harness::new(&dir.path().join("broker"));
    for (_, frame) in &inputs {
        harness.request(frame);
    }
}

#[test]
fn every_record_batch_input_is_produced_and_dumped_without_a_panic() {
    let inputs = inputs("record_batch");
    assert!(!inputs.is_empty());
    let dir = tempfile::tempdir().unwrap();
    let harness = Harness::new(&dir.path().join("broker"));
    for (_, records) in &inputs {
        harness.produce("batches", records);
        dump_segment(dir.path(), records);
    }
}
