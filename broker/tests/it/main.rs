//! The broker's integration tests: the real broker on a free port on 127.0.0.1, driven by real
//! Kafka clients (librdkafka through the `rdkafka` crate, kcat) and by raw protocol frames.
//! One test binary with a module per area.
//!
//! The librdkafka round trip at full size (CI runs it on a release build) is
//! `FERRY_BROKER_TEST_RECORDS=1000000 cargo test --release -p ferry-broker --test it clients::`.

mod common;

mod acls;
mod admin;
mod bad_input;
mod clients;
mod compaction;
mod consumer_groups;
mod corruption;
mod fuzz_corpus;
mod groups;
mod idempotence;
mod kcat;
mod lifecycle;
mod stats;
mod storage;
mod transactions;
