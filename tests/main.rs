//! The agent's end-to-end tests: the real `agent` binary, the real broker, real Kafka clients,
//! real files and real signals. One test binary with a module per area, so the agent (with
//! librdkafka and OpenSSL) is linked into one test program instead of one per area.
//!
//! `scripts/test` runs them with `cargo nextest` (each test in its own process; see
//! `.config/nextest.toml` for the tests that get a core of their own); `cargo test -p
//! ferry-agent --test e2e [FILTER]` runs them too.

mod harness;
mod s3;
mod s3_file_roll;
mod s3_harness;
mod s3_sweep;

mod acls;
mod chain;
mod client_state;
mod compaction;
mod consumer_groups_848;
mod dead_letters;
mod delete_records;
mod durability;
mod flume_conf;
mod flume_sources;
mod fuzz_corpus;
mod kafka_interop;
mod kafka_tool_flags;
mod kafka_tools;
mod limits;
mod log_corruption;
mod observability;
mod perf_tools;
mod pipelines;
mod plugins;
mod reload;
mod security;
mod selectors;
mod sinkgroups;
mod soak;
mod state;
mod taildir;
mod transactions;
mod validate;
