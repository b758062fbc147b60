//! Kafka-style command-line tools (`topics`, `groups`, `console-producer`, `console-consumer`,
//! `transactions`, `acls`, `users`, `get-offsets`, `delete-records`, `producer-perf-test`,
//! `consumer-perf-test`), built on librdkafka so that they work against any Kafka cluster, not
//! only the bundled broker (`transactions`, `acls` and `users` speak the protocol themselves:
//! the librdkafka binding has no admin call for them). Flags follow Kafka's own tools
//! (`kafka-topics.sh`, `kafka-console-producer.sh`, ...).

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use ferry_kafka::client::properties::ClientProperties;
use rdkafka::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::producer::{DeliveryResult, ProducerContext};

pub mod acls;
pub mod configs;
pub mod console;
pub mod delete_records;
pub mod dump;
pub mod get_offsets;
pub mod groups;
pub mod log_repair;
pub mod perf;
pub mod top;
pub mod topics;
pub mod transactions;
pub mod users;
mod wire;

/// How long a tool waits for the cluster to answer one request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A producer tool's failed deliveries: how many, and the first error. Also the context of a
/// producer that needs nothing else from its deliveries.
#[derive(Default)]
struct DeliveryFailures {
    count: AtomicU64,
    first: Mutex<Option<String>>,
}

impl DeliveryFailures {
    /// Counts a failed delivery, keeping its error if it is the first.
    fn record(&self, error: &KafkaError) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first.lock().unwrap_or_else(|e| e.into_inner());
        first.get_or_insert_with(|| error.to_string());
    }

    /// The number of failed deliveries and the first error, when there were any.
    fn summary(&self) -> Option<(u64, String)> {
        let count = self.count.load(Ordering::Relaxed);
        let first = self.first.lock().map(|e| e.clone().unwrap_or_default());
        (count > 0).then(|| (count, first.unwrap_or_default()))
    }
}

impl ClientContext for DeliveryFailures {}

impl ProducerContext for DeliveryFailures {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((error, _)) = result {
            self.record(error);
        }
    }
}

/// Where a tool connects, and how: Kafka's `--bootstrap-server` and `--command-config`.
#[derive(Args, Debug)]
pub struct ClusterArgs {
    /// The server(s) to connect to, comma-separated (`--broker-list`, the older spelling of
    /// Kafka's console producer, is taken too).
    #[arg(
        long = "bootstrap-server",
        value_name = "HOST:PORT",
        alias = "broker-list"
    )]
    bootstrap_server: String,
    /// A Kafka client properties file (`key=value` lines): `security.protocol`,
    /// `sasl.mechanism`, `sasl.jaas.config` (PLAIN or SCRAM login module), `ssl.ca.location`
    /// and any other librdkafka property. Also `--producer.config` and `--consumer.config`,
    /// as Kafka's console tools call it.
    #[arg(
        long = "command-config",
        value_name = "FILE",
        alias = "producer.config",
        alias = "consumer.config"
    )]
    command_config: Option<PathBuf>,
}

impl ClusterArgs {
    /// The checked properties of `--command-config`, if given.
    fn properties(&self) -> anyhow::Result<Option<ClientProperties>> {
        match &self.command_config {
            Some(path) => Ok(Some(ClientProperties::read(path)?)),
            None => Ok(None),
        }
    }

    /// The properties of `--command-config` then the `k=v` `overrides`, as librdkafka names
    /// them.
    fn all_properties(
        &self,
        overrides: &[String],
    ) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
        let mut config = ClientConfig::new();
        if let Some(properties) = self.properties()? {
            properties.apply(&mut config);
        }
        for pair in overrides {
            let (key, value) = split_property(pair)?;
            config.set(key, value);
        }
        // `config_map` hides secrets behind a placeholder: the values come from `get`.
        Ok(config
            .config_map()
            .into_keys()
            .filter_map(|k| Some((k.to_owned(), config.get(k)?.to_owned())))
            .collect())
    }

    /// How the tools' own protocol connections are made (security, `client.id`, timeouts),
    /// from `--command-config` and the `k=v` `overrides`, for a tool that also makes a
    /// librdkafka client of them (which takes the other properties).
    fn wire_security_with(&self, overrides: &[String]) -> anyhow::Result<wire::Security> {
        wire::Security::from_properties(&self.all_properties(overrides)?)
    }

    /// As [`Self::wire_security_with`] without overrides.
    fn wire_security(&self) -> anyhow::Result<wire::Security> {
        self.wire_security_with(&[])
    }

    /// As [`Self::wire_security`], for a tool whose only connections are its own: a
    /// property they do not take is refused, naming it, rather than dropped.
    fn wire_only_security(&self) -> anyhow::Result<wire::Security> {
        let properties = self.all_properties(&[])?;
        let unused: Vec<&str> = properties
            .keys()
            .map(String::as_str)
            .filter(|k| !wire::SECURITY_KEYS.contains(k) && !wire::CONNECTION_KEYS.contains(k))
            .collect();
        if let (false, Some(path)) = (unused.is_empty(), &self.command_config) {
            bail!(
                "{}: {} not used by this tool, whose connections take only the security \
                 properties (security.protocol, sasl.*, ssl.*) and {}",
                path.display(),
                unused
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
                    + if unused.len() == 1 { " is" } else { " are" },
                wire::CONNECTION_KEYS.join(", ")
            );
        }
        wire::Security::from_properties(&properties)
    }

    /// A librdkafka configuration for the cluster, with `--command-config` and then the `k=v`
    /// `overrides`.
    fn client_config(&self, overrides: &[String]) -> anyhow::Result<ClientConfig> {
        let mut config = ClientConfig::new();
        if let Some(properties) = self.properties()? {
            properties.apply(&mut config);
        }
        config.set("bootstrap.servers", &self.bootstrap_server);
        for pair in overrides {
            let (key, value) = split_property(pair)?;
            config.set(key, value);
        }
        Ok(config)
    }
}

/// Whether `error` comes from writing to a closed pipe (`agent ... | head`): the reader has
/// all it wants, so the tool ends quietly with exit status 0.
pub fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Splits `key=value`.
fn split_property(pair: &str) -> anyhow::Result<(&str, &str)> {
    match pair.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k, v)),
        _ => bail!("expected key=value, got `{pair}`"),
    }
}

/// A runtime for the asynchronous admin calls.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(file: Option<PathBuf>) -> ClusterArgs {
        ClusterArgs {
            bootstrap_server: "h:1".into(),
            command_config: file,
        }
    }

    #[test]
    fn command_config_settings_come_before_the_flags() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("client.properties");
        std::fs::write(
            &file,
            "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\n\
             sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule \
             required username=\"ops\" password=\"pw\";\nclient.id=from-file\n",
        )
        .unwrap();
        let config = cluster(Some(file))
            .client_config(&["client.id=from-flag".into()])
            .unwrap();
        assert_eq!(config.get("bootstrap.servers"), Some("h:1"));
        assert_eq!(config.get("security.protocol"), Some("sasl_plaintext"));
        assert_eq!(config.get("sasl.username"), Some("ops"));
        assert_eq!(config.get("sasl.password"), Some("pw"));
        assert_eq!(config.get("client.id"), Some("from-flag"));
        assert_eq!(
            cluster(None)
                .client_config(&[])
                .unwrap()
                .get("bootstrap.servers"),
            Some("h:1")
        );
    }

    #[test]
    fn a_bad_command_config_names_the_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("bad.properties");
        std::fs::write(&file, "acks=all\nssl.truststore.location=/t.jks\n").unwrap();
        let err = cluster(Some(file.clone())).client_config(&[]).unwrap_err();
        let shown = format!("{err:#}");
        assert!(
            shown.starts_with(&format!("{}:2: ", file.display())),
            "{shown}"
        );
        assert!(shown.contains("ssl.ca.location"), "{shown}");
        let missing = dir.path().join("missing.properties");
        let err = cluster(Some(missing)).client_config(&[]).unwrap_err();
        assert!(format!("{err:#}").contains("cannot read"), "{err:#}");
    }
}
