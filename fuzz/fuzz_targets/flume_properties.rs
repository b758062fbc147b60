//! Any text as a Flume properties file: read by the properties reader, converted for agent
//! `a1` as `agent convert` does, and the YAML it gives validated. Never a panic, and a
//! conversion that succeeds gives YAML that parses.

#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use ferry_core::Registry;
use libfuzzer_sys::fuzz_target;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(ferry_agent::builtin_registry)
}

fuzz_target!(|text: &str| {
    if let Ok(conversion) = ferry_agent::flume::convert(Path::new("fuzz.conf"), text, "a1") {
        let _ = ferry_agent::topology::parse(&conversion.yaml, registry());
    }
});
