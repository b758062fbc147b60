//! `custom-agent`: the `agent` binary with two more component types, `ticker` (a source) and
//! `jsonl` (a sink). Every built-in type and every subcommand still works:
//!
//! ```sh
//! cargo run -p custom-plugin --bin custom-agent -- run examples/custom-plugin/pipeline.yaml
//! ```

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut registry = ferry_agent::builtin_registry();
    custom_plugin::register(&mut registry);
    ferry_agent::main_with(registry)
}
