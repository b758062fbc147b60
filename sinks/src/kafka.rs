//! `kafka`: Flume's KafkaSink. Writes each event as a Kafka record, through librdkafka, to the
//! bundled broker or any Kafka cluster.
//!
//! A batch is delivered when every record of it was acknowledged by the cluster (`acks`);
//! if any record fails, the batch is rolled back and sent again: at-least-once. Flume headers
//! travel as Kafka record headers; the record key comes from the `key_header` header.

use std::collections::BTreeMap;
use std::time::Duration;

use ferry_core::{
    ComponentConfig, ConfigError, Event, Sink, SinkBatch, SinkContext, SinkError, async_trait,
};
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use serde::Deserialize;

/// Options of the `kafka` sink.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSinkConfig {
    /// `host:port[,host:port]` of the cluster. Required. Flume: `kafka.bootstrap.servers`.
    pub bootstrap_servers: String,
    /// Topic to write to; `%{name}` is replaced by the event's header `name`. Default
    /// `default-flume-topic`. Flume: `kafka.topic`.
    #[serde(default = "default_topic")]
    pub topic: String,
    /// Header that names the topic of an event, when `allow_topic_override`. Default `topic`.
    /// Flume: `topicHeader`.
    #[serde(default = "default_topic_header")]
    pub topic_header: String,
    /// Let `topic_header` choose the topic. Default `true`. Flume: `allowTopicOverride`.
    #[serde(default = "default_true")]
    pub allow_topic_override: bool,
    /// Header whose value becomes the record key. Default `key` (Flume uses the header `key`).
    #[serde(default = "default_key_header")]
    pub key_header: String,
    /// Header holding the partition number of an event. Default none. Flume:
    /// `partitionIdHeader`.
    #[serde(default)]
    pub partition_id_header: Option<String>,
    /// Partition of every event without a partition header. Default: the producer's
    /// partitioner decides. Flume: `defaultPartitionId`.
    #[serde(default)]
    pub default_partition_id: Option<i32>,
    /// Acknowledgements to wait for: `0`, `1` or `all`. Default `1`, as Flume's
    /// `kafka.producer.acks`.
    #[serde(default = "default_acks")]
    pub acks: String,
    /// `none`, `gzip`, `snappy`, `lz4` or `zstd`. Default `none`. Kafka: `compression.type`.
    #[serde(default = "default_compression")]
    pub compression: String,
    /// How long the producer waits to fill a request. Default `5ms`. Kafka: `linger.ms`.
    #[serde(default = "default_linger", with = "ferry_core::config::duration")]
    pub linger: Duration,
    /// Any other producer property, passed to librdkafka as written. Flume: `kafka.producer.*`.
    #[serde(default)]
    pub producer: BTreeMap<String, String>,
}

fn default_topic() -> String {
    "default-flume-topic".into()
}
fn default_topic_header() -> String {
    "topic".into()
}
fn default_key_header() -> String {
    "key".into()
}
fn default_true() -> bool {
    true
}
fn default_acks() -> String {
    "1".into()
}
fn default_compression() -> String {
    "none".into()
}
fn default_linger() -> Duration {
    Duration::from_millis(5)
}

/// The Kafka sink.
pub struct KafkaSink {
    config: KafkaSinkConfig,
    client: ClientConfig,
    producer: Option<FutureProducer>,
}

impl std::fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink")
            .field("config", &self.config)
            .finish()
    }
}

impl KafkaSink {
    /// Validates the options; the producer is created at `start`.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        let config: KafkaSinkConfig = cfg.parse()?;
        if config.bootstrap_servers.trim().is_empty() {
            return Err(cfg.error_at("bootstrap_servers", "`bootstrap_servers` is empty"));
        }
        if config.topic.is_empty() {
            return Err(cfg.error_at("topic", "`topic` is empty"));
        }
        let acks = ["0", "1", "all", "-1"];
        if !acks.contains(&config.acks.as_str()) {
            return Err(cfg.error_at(
                "acks",
                ferry_core::config::unknown_name_message("acks", &config.acks, acks),
            ));
        }
        let codecs = ["none", "gzip", "snappy", "lz4", "zstd"];
        if !codecs.contains(&config.compression.as_str()) {
            return Err(cfg.error_at(
                "compression",
                ferry_core::config::unknown_name_message(
                    "compression",
                    &config.compression,
                    codecs,
                ),
            ));
        }
        let mut client = ClientConfig::new();
        client
            .set("bootstrap.servers", &config.bootstrap_servers)
            .set("acks", &config.acks)
            .set("compression.type", &config.compression)
            .set("linger.ms", config.linger.as_millis().to_string())
            // Retries happen batch by batch in the runner; idempotence needs a broker with
            // producer ids, which `delivery: exactly_once` will bring.
            .set("enable.idempotence", "false");
        for (key, value) in &config.producer {
            client.set(key, value);
        }
        Ok(Self {
            config,
            client,
            producer: None,
        })
    }

    /// The topic of `event`: the override header, or the template with headers filled in.
    fn topic_of(&self, event: &Event) -> String {
        if self.config.allow_topic_override
            && let Some(topic) = event.headers.get(&self.config.topic_header)
        {
            return topic.clone();
        }
        fill_template(&self.config.topic, event)
    }

    fn partition_of(&self, event: &Event) -> Result<Option<i32>, SinkError> {
        match &self.config.partition_id_header {
            Some(header) => match event.headers.get(header) {
                Some(value) => value.parse().map(Some).map_err(|_| {
                    SinkError::Delivery(format!(
                        "header `{header}` is `{value}`, not a partition number"
                    ))
                }),
                None => Ok(self.config.default_partition_id),
            },
            None => Ok(self.config.default_partition_id),
        }
    }
}

/// Replaces `%{name}` by the event's header `name` (empty when absent).
fn fill_template(template: &str, event: &Event) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find("%{") {
        out.push_str(&rest[..start]);
        match rest[start + 2..].find('}') {
            Some(end) => {
                let name = &rest[start + 2..start + 2 + end];
                out.push_str(event.headers.get(name).map_or("", String::as_str));
                rest = &rest[start + 3 + end..];
            }
            None => {
                out.push_str(&rest[start..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

fn kafka_error(context: &str, error: KafkaError) -> SinkError {
    SinkError::Delivery(format!("{context}: {error}"))
}

#[async_trait]
impl Sink for KafkaSink {
    async fn start(&mut self, _ctx: &SinkContext) -> Result<(), SinkError> {
        let producer: FutureProducer = self
            .client
            .create()
            .map_err(|e| kafka_error("creating the Kafka producer", e))?;
        self.producer = Some(producer);
        Ok(())
    }

    async fn deliver(&mut self, batch: SinkBatch<'_>) -> Result<(), SinkError> {
        let Some(producer) = &self.producer else {
            return Err(SinkError::Delivery("kafka sink used before start".into()));
        };
        let mut pending: Vec<DeliveryFuture> = Vec::with_capacity(batch.events.len());
        for event in batch.events {
            let topic = self.topic_of(event);
            let partition = self.partition_of(event)?;
            let mut headers = OwnedHeaders::new_with_capacity(event.headers.len());
            for (key, value) in &event.headers {
                headers = headers.insert(Header {
                    key,
                    value: Some(value.as_bytes()),
                });
            }
            let mut record = FutureRecord::<[u8], [u8]>::to(&topic)
                .payload(&event.body[..])
                .headers(headers);
            if let Some(key) = event.headers.get(&self.config.key_header) {
                record = record.key(key.as_bytes());
            }
            if let Some(partition) = partition {
                record = record.partition(partition);
            }
            loop {
                match producer.send_result(record) {
                    Ok(delivery) => {
                        pending.push(delivery);
                        break;
                    }
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        // The local queue is full: wait for the oldest record of this batch.
                        record = back;
                        if let Some(oldest) = pending.first_mut() {
                            wait_for(oldest).await?;
                            pending.remove(0);
                        } else {
                            producer.poll(Duration::from_millis(10));
                        }
                    }
                    Err((error, _)) => {
                        return Err(kafka_error(&format!("sending to {topic}"), error));
                    }
                }
            }
        }
        for delivery in &mut pending {
            wait_for(delivery).await?;
        }
        Ok(())
    }

    async fn stop(&mut self) -> Result<(), SinkError> {
        if let Some(producer) = self.producer.take() {
            tokio::task::spawn_blocking(move || producer.flush(Duration::from_secs(30)))
                .await
                .map_err(|e| SinkError::Delivery(format!("flushing the producer: {e}")))?
                .map_err(|e| kafka_error("flushing the producer", e))?;
        }
        Ok(())
    }
}

async fn wait_for(delivery: &mut DeliveryFuture) -> Result<(), SinkError> {
    match delivery.await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err((error, _))) => Err(kafka_error("record not acknowledged", error)),
        Err(_) => Err(SinkError::Delivery("the producer was closed".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(headers: &[(&str, &str)]) -> Event {
        let mut e = Event::from_body("x");
        for (k, v) in headers {
            e.headers.insert((*k).into(), (*v).into());
        }
        e
    }

    #[test]
    fn topic_templates_take_header_values() {
        let e = event(&[("app", "web"), ("env", "prod")]);
        assert_eq!(fill_template("logs-%{app}-%{env}", &e), "logs-web-prod");
        assert_eq!(fill_template("logs-%{missing}", &e), "logs-");
        assert_eq!(fill_template("plain", &e), "plain");
        assert_eq!(fill_template("broken-%{app", &e), "broken-%{app");
    }

    #[test]
    fn topic_header_overrides_unless_disabled() {
        let sink = KafkaSink::build(&crate::config(
            "kafka",
            "bootstrap_servers: 127.0.0.1:9092\ntopic: base",
        ))
        .unwrap();
        assert_eq!(sink.topic_of(&event(&[("topic", "other")])), "other");
        let sink = KafkaSink::build(&crate::config(
            "kafka",
            "bootstrap_servers: 127.0.0.1:9092\ntopic: base\nallow_topic_override: false",
        ))
        .unwrap();
        assert_eq!(sink.topic_of(&event(&[("topic", "other")])), "base");
    }

    #[test]
    fn bad_options_name_the_closest_value() {
        let err = KafkaSink::build(&crate::config("kafka", "bootstrap_servers: h:1\nacks: al"))
            .unwrap_err();
        assert!(err.message.contains("did you mean `all`"), "{err:?}");
        assert_eq!(err.location.map(|l| l.line), Some(2));
    }
}
