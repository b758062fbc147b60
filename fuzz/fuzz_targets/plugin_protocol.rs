//! Any bytes as one line from a plugin program, through what the agent does with it.
//! Never a panic.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|line: &[u8]| {
    ferry_process::fuzzing::plugin_line(line);
});
