//! A consumer of a group that never subscribes. It stands for the group in
//! `send_offsets_to_transaction` (its group metadata), and reads what the group committed:
//! the sink keeps its progress, the channel each source's checkpoint, as the metadata of the
//! group's committed offset of one partition.

use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerGroupMetadata};

use super::security::TokenContext;
use super::{CALL_TIMEOUT, ClientError, Connection};

/// A consumer of one group, for its metadata and its committed offsets.
pub(crate) struct GroupConsumer {
    group: String,
    consumer: BaseConsumer<TokenContext>,
}

impl GroupConsumer {
    /// A consumer of `group` on `connection`'s cluster (no network traffic yet).
    pub(crate) fn new(connection: &Connection, group: &str) -> Result<Self, ClientError> {
        let consumer = connection
            .client_config()
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .create_with_context(connection.context())
            .map_err(|e| ClientError::kafka(format!("creating a consumer of group {group}"), e))?;
        Ok(Self {
            group: group.to_owned(),
            consumer,
        })
    }

    /// The group's metadata, for `send_offsets_to_transaction`.
    pub(crate) fn metadata(&self) -> Result<ConsumerGroupMetadata, ClientError> {
        self.consumer.group_metadata().ok_or_else(|| {
            ClientError::other(
                format!("group {}", self.group),
                "librdkafka has no group metadata for it",
            )
        })
    }

    /// The metadata of the group's committed offset of `topic` `partition`, empty when it
    /// committed none. Blocks on the cluster: call it off the async workers.
    pub(crate) fn committed_metadata(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<String, ClientError> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(topic, partition);
        let committed = self
            .consumer
            .committed_offsets(tpl, CALL_TIMEOUT)
            .map_err(|e| {
                ClientError::kafka(
                    format!("reading the committed offsets of group {}", self.group),
                    e,
                )
            })?;
        Ok(committed
            .find_partition(topic, partition)
            .map(|e| e.metadata().to_owned())
            .unwrap_or_default())
    }
}
