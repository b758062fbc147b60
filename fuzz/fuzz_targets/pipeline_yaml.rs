//! Any text as a pipeline file, validated as `agent validate` does: a topology or errors
//! naming lines, never a panic.

#![no_main]

use std::sync::OnceLock;

use ferry_core::Registry;
use libfuzzer_sys::fuzz_target;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(ferry_agent::builtin_registry)
}

fuzz_target!(|text: &str| {
    let _ = ferry_agent::topology::parse(text, registry());
});
