//! Where a component's Kafka clients connect and how they authenticate: the options every
//! Kafka component shares (`bootstrap_servers` and the security options of
//! [`super::security`]), parsed and checked here once, and the base settings of every client
//! role made from them.
//!
//! Flume's names are accepted too: `kafka.bootstrap.servers`, and the security properties
//! under Flume's prefix for the role, `kafka.consumer.` (source), `kafka.producer.` (sink) or
//! either (channel), e.g. `kafka.producer.security.protocol`.

use std::collections::BTreeMap;

use ferry_core::{ComponentConfig, ConfigError};
use rdkafka::ClientConfig;

use super::security::{
    OPTIONS, Security, SecurityOptions, TokenContext, WATCH_INTERVAL_MS, Watcher, java_only,
    option_of_property,
};

/// Which Kafka component, for the Flume names of its options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The source (a consumer).
    Source,
    /// The channel (a producer and a consumer).
    Channel,
    /// The sink (a producer).
    Sink,
}

impl Role {
    /// Flume's prefixes of Kafka client properties for this role.
    fn flume_prefixes(self) -> &'static [&'static str] {
        match self {
            Role::Source => &["kafka.consumer."],
            Role::Sink => &["kafka.producer."],
            Role::Channel => &["kafka.producer.", "kafka.consumer."],
        }
    }

    /// The connection option a Flume property of this role sets: `kafka.bootstrap.servers`
    /// gives `bootstrap_servers`, and a security property under the role's prefix its option
    /// (`kafka.producer.security.protocol` gives `security_protocol` for the sink).
    ///
    /// ```
    /// use ferry_kafka::client::Role;
    /// assert_eq!(Role::Sink.option_of_flume_key("kafka.producer.sasl.mechanism"), Some("sasl_mechanism"));
    /// assert_eq!(Role::Source.option_of_flume_key("kafka.producer.sasl.mechanism"), None);
    /// assert_eq!(Role::Channel.option_of_flume_key("kafka.bootstrap.servers"), Some("bootstrap_servers"));
    /// ```
    pub fn option_of_flume_key(self, key: &str) -> Option<&'static str> {
        if key == "kafka.bootstrap.servers" {
            return Some("bootstrap_servers");
        }
        self.flume_prefixes()
            .iter()
            .find_map(|prefix| key.strip_prefix(prefix))
            .and_then(option_of_property)
    }

    /// The Kafka property an option key names, when it is written the Flume way or as the
    /// snake_case of a property (`ssl_truststore_location`).
    fn property_of_key(self, key: &str) -> String {
        self.flume_prefixes()
            .iter()
            .find_map(|prefix| key.strip_prefix(prefix))
            .map_or_else(|| key.replace('_', "."), str::to_owned)
    }
}

/// The options parsed here: `bootstrap_servers` and every security option.
const NAMES: [&str; 11] = [
    "bootstrap_servers",
    OPTIONS[0].0,
    OPTIONS[1].0,
    OPTIONS[2].0,
    OPTIONS[3].0,
    OPTIONS[4].0,
    OPTIONS[5].0,
    OPTIONS[6].0,
    OPTIONS[7].0,
    OPTIONS[8].0,
    OPTIONS[9].0,
];

/// The connection settings of one Kafka component, checked once at build.
#[derive(Clone, Debug)]
pub struct Connection {
    bootstrap_servers: String,
    security: Security,
    /// Whose metrics the clients report to (see [`Connection::report_to`]).
    watcher: Option<ferry_core::ComponentMetrics>,
}

impl Connection {
    /// Takes the connection options out of component `cfg`'s options and checks them; returns
    /// them and the component's own options. Errors name the component and the option.
    pub fn from_config(
        cfg: &ComponentConfig,
        role: Role,
    ) -> Result<(Self, ComponentConfig), ConfigError> {
        for key in cfg.keys() {
            if let Some(why) = java_only(&role.property_of_key(key)) {
                return Err(cfg.error_at(key, format!("`{key}` {why}")));
            }
        }
        let (shared, own) = cfg.split_off(&NAMES, |key| role.option_of_flume_key(key))?;
        let options: SecurityOptions = shared.parse()?;
        let bootstrap_servers = options.bootstrap_servers.clone().unwrap_or_default();
        if bootstrap_servers.trim().is_empty() {
            return Err(shared.error_at(
                "bootstrap_servers",
                "`bootstrap_servers` is required (Flume: `kafka.bootstrap.servers`)",
            ));
        }
        let security = Security::check(&options, |option| format!("`{option}`"))
            .map_err(|p| shared.error_at(p.option, p.message))?;
        Ok((
            Self {
                bootstrap_servers,
                security,
                watcher: None,
            },
            own,
        ))
    }

    /// Refuses connection settings in a map of client properties passed through to
    /// librdkafka (`producer`, `consumer`): they are set with their own options, checked and
    /// never shown; a secret in the map would be shown by the component's `Debug`.
    pub fn check_passthrough(
        cfg: &ComponentConfig,
        map_name: &str,
        map: &BTreeMap<String, String>,
    ) -> Result<(), ConfigError> {
        for property in map.keys() {
            let message = if let Some(option) = option_of_property(property) {
                format!("`{map_name}`: `{property}` is set with the option `{option}`, not here")
            } else if property == "bootstrap.servers" {
                format!("`{map_name}`: `{property}` is set with the option `bootstrap_servers`")
            } else if let Some(why) = java_only(property) {
                format!("`{map_name}`: `{property}` {why}")
            } else if property == "sasl.jaas.config"
                || property.contains("password")
                || property.contains("secret")
            {
                format!(
                    "`{map_name}`: `{property}` holds a secret; set the security options \
                     (`sasl_username`, `sasl_password`, ...) instead"
                )
            } else {
                continue;
            };
            return Err(cfg.error_at(map_name, message));
        }
        Ok(())
    }

    /// A connection to `bootstrap_servers` without security (tests).
    #[cfg(any(test, feature = "test-support"))]
    pub(crate) fn plaintext(bootstrap_servers: &str) -> Self {
        Self {
            bootstrap_servers: bootstrap_servers.to_owned(),
            security: Security::default(),
            watcher: None,
        }
    }

    /// `host:port[,host:port]` of the cluster.
    pub fn bootstrap_servers(&self) -> &str {
        &self.bootstrap_servers
    }

    /// The checked security settings.
    pub fn security(&self) -> &Security {
        &self.security
    }

    /// The settings of any client role (producer, consumer, admin) for this cluster.
    ///
    /// `reconnect.backoff.ms` is 20 rather than librdkafka's 100: a new client drops its
    /// bootstrap connection once it learns the cluster's brokers, and connects to one of them
    /// only after half that backoff, so every new client (a sink starting, a producer made
    /// again after a failure) waited 50 ms for nothing. Repeated failures still back off
    /// exponentially up to `reconnect.backoff.max.ms`. A component's own properties override it.
    pub fn client_config(&self) -> ClientConfig {
        let mut client = ClientConfig::new();
        client
            .set("bootstrap.servers", &self.bootstrap_servers)
            .set("reconnect.backoff.ms", "20");
        self.security.apply(&mut client);
        client
    }

    /// The client context every client of this connection is made with (it hands over the
    /// OAUTHBEARER token, and reports to the component's metrics once
    /// [`report_to`](Self::report_to) was called).
    pub(crate) fn context(&self) -> TokenContext {
        let watcher = self.watcher.as_ref().map(|metrics| Watcher {
            metrics: metrics.clone(),
            bootstrap_servers: self.bootstrap_servers.as_str().into(),
        });
        self.security.token_context().watched_by(watcher)
    }

    /// From now on the clients made with [`context`](Self::context) and `client` (settings
    /// made from this connection) report what they cannot reach to `metrics`, so the
    /// component's `/health` fails within seconds of a dead cluster. `client` gets the settings
    /// that needs unless it has them: librdkafka's statistics every second (how a broker is
    /// seen up again) and reconnection attempts at most a second apart (the Java client's
    /// `reconnect.backoff.max.ms`; librdkafka waits up to 10 s).
    pub(crate) fn report_to(
        &mut self,
        metrics: &ferry_core::ComponentMetrics,
        client: &mut ClientConfig,
    ) {
        self.watcher = Some(metrics.clone());
        Self::watch_settings(client);
    }

    /// This connection, its clients reporting to `metrics` (as after
    /// [`report_to`](Self::report_to)); the clients' settings need
    /// [`watch_settings`](Self::watch_settings).
    pub(crate) fn reporting_to(&self, metrics: &ferry_core::ComponentMetrics) -> Self {
        let mut connection = self.clone();
        connection.watcher = Some(metrics.clone());
        connection
    }

    /// The metrics the clients report to, once told.
    pub(crate) fn watcher(&self) -> Option<&ferry_core::ComponentMetrics> {
        self.watcher.as_ref()
    }

    /// The settings a client reporting what it cannot reach needs, unless `client` has them:
    /// librdkafka's statistics every second (how a broker is seen up again) and reconnection
    /// attempts at most a second apart.
    pub(crate) fn watch_settings(client: &mut ClientConfig) {
        for (property, value) in [
            ("statistics.interval.ms", WATCH_INTERVAL_MS),
            ("reconnect.backoff.max.ms", "1000"),
        ] {
            if client.get(property).is_none() {
                client.set(property, value);
            }
        }
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
            .set("enable.partition.eof", "false")
            // librdkafka stops fetching a partition whose local queue holds
            // `queued.min.messages` (100,000) and then waits this long before it fetches again
            // (default 1 s): a consumer that reads faster than that drains the queue and sits
            // idle for most of the second. 20 ms keeps the queue fed at a few wake-ups a second.
            .set("fetch.queue.backoff.ms", "20");
        client
    }
}

#[cfg(test)]
mod tests {
    use ferry_core::ComponentKind;

    use super::*;

    fn cfg(kind: ComponentKind, yaml: &str) -> ComponentConfig {
        ComponentConfig::from_yaml(kind, "k", "kafka", yaml).unwrap()
    }

    fn connect(kind: ComponentKind, role: Role, yaml: &str) -> Result<Connection, ConfigError> {
        Connection::from_config(&cfg(kind, yaml), role).map(|(connection, _)| connection)
    }

    #[test]
    fn flume_names_are_accepted_for_the_role() {
        let yaml = "kafka.bootstrap.servers: h:1\n\
                    kafka.producer.security.protocol: SASL_SSL\n\
                    kafka.producer.sasl.mechanism: SCRAM-SHA-512\n\
                    sasl_username: u\n\
                    kafka.producer.sasl.password: p\n\
                    topic: t";
        let (connection, own) =
            Connection::from_config(&cfg(ComponentKind::Sink, yaml), Role::Sink).unwrap();
        assert_eq!(connection.bootstrap_servers(), "h:1");
        let client = connection.client_config();
        assert_eq!(client.get("security.protocol"), Some("sasl_ssl"));
        assert_eq!(client.get("sasl.mechanism"), Some("SCRAM-SHA-512"));
        assert_eq!(client.get("sasl.password"), Some("p"));
        assert_eq!(own.keys().collect::<Vec<_>>(), ["topic"]);
        // A source reads Flume's consumer names; the producer's are left to its own options
        // (which refuse them).
        let (_, own) = Connection::from_config(
            &cfg(
                ComponentKind::Source,
                "bootstrap_servers: h:1\nkafka.producer.security.protocol: ssl",
            ),
            Role::Source,
        )
        .unwrap();
        assert_eq!(
            own.keys().collect::<Vec<_>>(),
            ["kafka.producer.security.protocol"]
        );
        // The channel's producer and consumer share the settings: one may be set, not both.
        let err = connect(
            ComponentKind::Channel,
            Role::Channel,
            "bootstrap_servers: h:1\nkafka.producer.security.protocol: ssl\n\
             kafka.consumer.security.protocol: ssl",
        )
        .unwrap_err();
        assert!(err.message.contains("set it once"), "{err:?}");
        assert_eq!(err.location.map(|l| l.line), Some(3));
    }

    #[test]
    fn errors_name_the_component_the_option_and_its_line() {
        let err = connect(
            ComponentKind::Sink,
            Role::Sink,
            "bootstrap_servers: h:1\nsasl_mechanism: PLAIN\nsasl_username: u\nsasl_password: hunter2",
        )
        .unwrap_err();
        assert_eq!(err.component.as_deref(), Some("sink `k`"));
        assert_eq!(err.location.map(|l| l.line), Some(2), "{err:?}");
        assert!(
            err.message
                .contains("`sasl_mechanism` needs `security_protocol`"),
            "{err:?}"
        );
        assert!(!format!("{err:?}").contains("hunter2"));

        let err = connect(
            ComponentKind::Source,
            Role::Source,
            "bootstrap_servers: h:1\nkafka.consumer.ssl.truststore.location: /t.jks",
        )
        .unwrap_err();
        assert_eq!(err.location.map(|l| l.line), Some(2), "{err:?}");
        assert!(err.message.contains("ssl_ca_location"), "{err:?}");

        let err = connect(ComponentKind::Sink, Role::Sink, "topic: t").unwrap_err();
        assert!(
            err.message.contains("`bootstrap_servers` is required"),
            "{err:?}"
        );

        let err = connect(ComponentKind::Sink, Role::Sink, "bootstrap_servers: ' '").unwrap_err();
        assert_eq!(err.location.map(|l| l.line), Some(1), "{err:?}");
    }

    #[test]
    fn a_misspelt_security_option_is_suggested_by_the_component() {
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Own {
            topic: String,
        }
        let (_, own) = Connection::from_config(
            &cfg(
                ComponentKind::Sink,
                "bootstrap_servers: h:1\ntopic: t\nsasl_usernme: u",
            ),
            Role::Sink,
        )
        .unwrap();
        let err = own.parse::<Own>().unwrap_err();
        assert!(
            err.message.contains("did you mean `sasl_username`"),
            "{err:?}"
        );
        assert_eq!(err.location.map(|l| l.line), Some(3));
    }

    #[test]
    fn secrets_may_not_hide_in_the_passthrough_maps() {
        let c = cfg(ComponentKind::Sink, "bootstrap_servers: h:1\nproducer: {}");
        for key in [
            "sasl.password",
            "sasl.username",
            "ssl.keystore.location",
            "sasl.jaas.config",
            "sasl.oauthbearer.client.secret",
            "bootstrap.servers",
        ] {
            let map = BTreeMap::from([(key.to_owned(), "hunter2".to_owned())]);
            let err = Connection::check_passthrough(&c, "producer", &map).unwrap_err();
            assert!(err.message.contains(key), "{err:?}");
            assert!(!err.message.contains("hunter2"), "{err:?}");
            assert_eq!(err.location.map(|l| l.line), Some(2));
        }
        let map = BTreeMap::from([("linger.ms".to_owned(), "5".to_owned())]);
        Connection::check_passthrough(&c, "producer", &map).unwrap();
    }
}
