//! Kafka for the agent: Flume's Kafka source, channel and sink, through librdkafka, against
//! the bundled broker or any Kafka cluster.
//!
//! | type      | kind    | module       | Flume counterpart |
//! |-----------|---------|--------------|-------------------|
//! | `kafka`   | source  | [`source`]   | `KafkaSource`     |
//! | `kafka`   | channel | [`channel`]  | `KafkaChannel`    |
//! | `kafka`   | sink    | [`sink`]     | `KafkaSink`       |
//!
//! The three share one client module, [`client`]: connection settings, header conversion,
//! the group-metadata consumer, the transactional session, the answer to a full producer
//! queue and the mapping of client errors. A component's own file holds only what is its own.

use std::sync::Arc;

use ferry_core::Registry;

pub mod channel;
pub mod client;
pub mod sink;
pub mod source;
#[cfg(any(test, feature = "test-support"))]
pub mod test_support;

pub use channel::{KafkaChannel, KafkaChannelConfig};
pub use sink::{KafkaSink, KafkaSinkConfig};
pub use source::{KafkaSource, KafkaSourceConfig};

/// Registers `kafka` as a source, a channel and a sink type.
pub fn register(registry: &mut Registry) {
    registry
        .register_source("kafka", |cfg| Ok(Box::new(KafkaSource::build(cfg)?)))
        .register_channel("kafka", |cfg| Ok(Arc::new(KafkaChannel::build(cfg)?)))
        .register_sink("kafka", |cfg| Ok(Box::new(KafkaSink::build(cfg)?)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_core::config::ComponentKind;

    #[test]
    fn registers_kafka_as_source_channel_and_sink() {
        let mut registry = Registry::new();
        register(&mut registry);
        for kind in [
            ComponentKind::Source,
            ComponentKind::Channel,
            ComponentKind::Sink,
        ] {
            assert_eq!(registry.type_names(kind), vec!["kafka"], "{kind}");
        }
    }
}
