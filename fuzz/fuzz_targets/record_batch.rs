//! Any bytes as the records of a Produce request (their batch CRCs made right, so the input
//! reaches what lies behind the check: offsets, counts, producer state, the log), then the
//! same bytes as a segment file read by `dump-log-segments`. Never a panic.

#![no_main]

use std::sync::OnceLock;

use ferry_broker::fuzzing::{Harness, dump_segment};
use libfuzzer_sys::fuzz_target;

struct Scratch {
    dir: tempfile::TempDir,
    harness: Harness,
}

fn scratch() -> &'static Scratch {
    static SCRATCH: OnceLock<Scratch> = OnceLock::new();
    SCRATCH.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a scratch directory");
        let harness = Harness::new(&dir.path().join("broker"));
        Scratch { dir, harness }
    })
}

fuzz_target!(|records: &[u8]| {
    let scratch = scratch();
    scratch.harness.produce("batches", records);
    dump_segment(scratch.dir.path(), records);
});
