//! Any bytes as one Kafka request frame (after its size prefix), decoded and served by the
//! broker as a connection would: a response, an error closing the connection, never a panic.

#![no_main]

use std::sync::OnceLock;

use ferry_broker::fuzzing::Harness;
use libfuzzer_sys::fuzz_target;

fn harness() -> &'static Harness {
    static HARNESS: OnceLock<(tempfile::TempDir, Harness)> = OnceLock::new();
    &HARNESS
        .get_or_init(|| {
            let dir = tempfile::tempdir().expect("a scratch directory");
            let harness = Harness::new(&dir.path().join("broker"));
            (dir, harness)
        })
        .1
}

fuzz_target!(|frame: &[u8]| {
    harness().request(frame);
});
