//! The `agent` command, as a library so that plugin crates can reuse its `main`.
//!
//! A plugin binary registers its own component types next to the built-ins and hands over:
//!
//! ```no_run
//! fn main() -> std::process::ExitCode {
//!     let mut registry = ferry_agent::builtin_registry();
//!     // registry.register_sink("my_sink", |cfg| ...);
//!     ferry_agent::main_with(registry)
//! }
//! ```
//!
//! The crate, top to bottom: each file uses only the ones below it.
//!
//! - [`cli`]: the command line. `run`, `validate`, `convert`, `broker`, `state` and
//!   `dead-letters` are here; the Kafka tools are the `ferry-tools` crate's.
//! - [`run`]: the run and reload loop of one agent: its data-directory lock, the bundled broker,
//!   the HTTP server, and the [`pipeline`] until the stop signal (`reload` watches the file and
//!   hands the pipeline what changed).
//! - [`pipeline`]: the running pipeline, as units (a source, a sink, a sink group) started,
//!   stopped and replaced on reload.
//! - [`runner`]: what drives one unit: the source runner, and the sink runner that delivers
//!   batches to a sink or to the members of a sink group, in the order its [`sinkgroup`]
//!   processor names them, and moves refused events to a [`dead_letter`] channel.
//! - [`http`]: `/metrics`, `/health`, the API and the console, over the counters of the
//!   components.
//! - [`topology`] (with [`flume`], its reader of Flume files): a pipeline file checked and built
//!   into components, ready to run.

use ferry_core::Registry;

pub mod cli;
pub mod dead_letter;
pub mod flume;
pub mod http;
mod lock;
pub mod pipeline;
mod reload;
pub mod run;
pub mod runner;
pub mod sinkgroup;
pub mod topology;

pub use cli::main_with;

/// Exit code for a bad configuration: nothing was started.
pub const EXIT_BAD_CONFIG: u8 = 2;

/// Every built-in source, channel, sink and interceptor.
pub fn builtin_registry() -> Registry {
    let mut registry = Registry::new();
    ferry_sources::register(&mut registry);
    ferry_channels::register(&mut registry);
    ferry_sinks::register(&mut registry);
    ferry_kafka::register(&mut registry);
    ferry_process::register(&mut registry);
    registry
}
