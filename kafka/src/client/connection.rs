//! Where a component's Kafka clients connect: the settings every client role shares.

use ferry_core::{ComponentConfig, ConfigError};
use rdkafka::ClientConfig;

/// The connection settings of one Kafka component, checked once at build.
#[derive(Clone)]
pub struct Connection {
    bootstrap_servers: String,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .finish()
    }
}

impl Connection {
    /// Checks the connection options of component `cfg`: `bootstrap_servers` (Flume:
    /// `kafka.bootstrap.servers`) must name at least one `host:port`.
    pub fn from_options(
        cfg: &ComponentConfig,
        bootstrap_servers: &str,
    ) -> Result<Self, ConfigError> {
        if bootstrap_servers.trim().is_empty() {
            return Err(cfg.error_at("bootstrap_servers", "`bootstrap_servers` is empty"));
        }
        Ok(Self {
            bootstrap_servers: bootstrap_servers.to_owned(),
        })
    }

    /// A connection to `bootstrap_servers` without any check (tests).
    #[cfg(any(test, feature = "test-support"))]
    pub(crate) fn plaintext(bootstrap_servers: &str) -> Self {
        Self {
            bootstrap_servers: bootstrap_servers.to_owned(),
        }
    }

    /// `host:port[,host:port]` of the cluster.
    pub fn bootstrap_servers(&self) -> &str {
        &self.bootstrap_servers
    }

    /// The settings of any client role (producer, consumer, admin) for this cluster.
    pub fn client_config(&self) -> ClientConfig {
        let mut client = ClientConfig::new();
        client.set("bootstrap.servers", &self.bootstrap_servers);
        client
    }

    /// A consumer of `group` that commits only what it is told to: no automatic commits or
    /// offset stores, no end-of-partition events; reading from the earliest offset at
    /// read_committed unless the caller sets otherwise.
    pub(crate) fn consumer_config(&self, group: &str) -> ClientConfig {
        let mut client = self.client_config();
        client
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("isolation.level", "read_committed")
            .set("enable.partition.eof", "false");
        client
    }
}
