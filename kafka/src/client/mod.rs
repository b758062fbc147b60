//! The Kafka client plumbing the source, the channel and the sink share, written once:
//!
//! - [`Connection`]: where the clients connect and how they authenticate (`bootstrap_servers`
//!   and the [`security`] options, checked once), and the base settings of every client role
//!   made from them;
//! - [`properties`]: Kafka's client properties files, for the tools' `--command-config`;
//! - [`headers`]: Flume headers ↔ Kafka record headers;
//! - [`GroupConsumer`]: a consumer of a group that never subscribes, standing for the group in
//!   `send_offsets_to_transaction` and reading the metadata of its committed offsets (where the
//!   sink keeps its progress and the channel its sources' checkpoints);
//! - [`Producer`]: librdkafka's producer with one counter of the records sent since the last
//!   wait, and the one answer to a full producer queue (wait for reports, then retry);
//! - [`TransactionalProducer`]: the transactional session: init (fencing an older instance),
//!   begin, send, `send_offsets_to_transaction`, commit, and abort-and-reset;
//! - [`ClientError`]: the one mapping of librdkafka's errors into the plugin API's.
//!
//! Every call that waits on the cluster is bounded by [`CALL_TIMEOUT`] and runs off the async
//! worker threads ([`call_blocking`]), because the bundled broker may run on the same runtime.

mod admin;
mod connection;
mod error;
mod group;
pub(crate) mod headers;
mod producer;
pub mod properties;
pub mod security;
mod transaction;

use std::time::Duration;

use rdkafka::error::KafkaError;

pub(crate) use admin::create_topic;
pub use connection::{Connection, Role};
pub use error::ClientError;
pub(crate) use group::GroupConsumer;
pub(crate) use producer::Producer;
pub use security::{Secret, Security};
pub(crate) use transaction::{GroupOffset, TransactionalProducer};

/// How long a call to the cluster (a transactional call, a commit, reading committed offsets,
/// flushing, creating a topic) may take before the operation fails and is retried.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `f`, a blocking librdkafka call, on tokio's blocking threads so the async workers (and
/// the bundled broker on them) keep running while it waits.
pub(crate) async fn call_blocking<T: Send + 'static>(
    context: &str,
    f: impl FnOnce() -> Result<T, KafkaError> + Send + 'static,
) -> Result<T, ClientError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ClientError::other(context, e))?
        .map_err(|e| ClientError::kafka(context, e))
}
