//! How a Kafka client authenticates and encrypts: the security settings every role (the
//! source, the channel, the sink, and the agent's tools) takes, checked here once.
//!
//! | option | librdkafka / Kafka property | values |
//! |---|---|---|
//! | `security_protocol` | `security.protocol` | `plaintext` (default), `ssl`, `sasl_plaintext`, `sasl_ssl` (any case) |
//! | `sasl_mechanism` | `sasl.mechanism` | `PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`, `OAUTHBEARER` |
//! | `sasl_username`, `sasl_password` | `sasl.username`, `sasl.password` | PLAIN and SCRAM |
//! | `sasl_oauthbearer_token` | (none: handed to librdkafka by the token callback) | OAUTHBEARER |
//! | `ssl_ca_location` | `ssl.ca.location` | PEM file (or directory) of the CA certificates |
//! | `ssl_certificate_location`, `ssl_key_location` | `ssl.certificate.location`, `ssl.key.location` | PEM files of the client certificate and key |
//! | `ssl_key_password` | `ssl.key.password` | the key's passphrase |
//! | `ssl_endpoint_identification` | `ssl.endpoint.identification.algorithm` | `https` (default) or `none` |
//!
//! Secrets (passwords, the token) are [`Secret`]s: their `Debug` shows `***`, they have no
//! `Display`, and no error message carries them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rdkafka::ClientConfig;
use serde::Deserialize;

/// A secret from the configuration (a password, a token). Never shown: `Debug` prints `***`
/// and there is no `Display`.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// A secret of `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself, to hand to the client library.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("\"***\"")
    }
}

/// The options of the table in the module docs: the YAML name and the librdkafka property
/// (`None`: no property, the agent hands the value over itself).
pub(crate) const OPTIONS: [(&str, Option<&str>); 10] = [
    ("security_protocol", Some("security.protocol")),
    ("sasl_mechanism", Some("sasl.mechanism")),
    ("sasl_username", Some("sasl.username")),
    ("sasl_password", Some("sasl.password")),
    ("sasl_oauthbearer_token", None),
    ("ssl_ca_location", Some("ssl.ca.location")),
    ("ssl_certificate_location", Some("ssl.certificate.location")),
    ("ssl_key_location", Some("ssl.key.location")),
    ("ssl_key_password", Some("ssl.key.password")),
    (
        "ssl_endpoint_identification",
        Some("ssl.endpoint.identification.algorithm"),
    ),
];

/// The option a librdkafka property sets (`sasl.mechanisms` is librdkafka's older name).
pub(crate) fn option_of_property(property: &str) -> Option<&'static str> {
    let property = if property == "sasl.mechanisms" {
        "sasl.mechanism"
    } else {
        property
    };
    OPTIONS
        .iter()
        .find(|(_, p)| *p == Some(property))
        .map(|(option, _)| *option)
}

/// The librdkafka property of an option, for messages about a properties file.
pub(crate) fn property_of_option(option: &str) -> &str {
    OPTIONS
        .iter()
        .find(|(o, _)| *o == option)
        .and_then(|(_, p)| *p)
        .unwrap_or(option)
}

/// Why a Java client property has no librdkafka counterpart, and what to use instead.
pub(crate) fn java_only(property: &str) -> Option<&'static str> {
    Some(match property {
        "ssl.truststore.location"
        | "ssl.truststore.password"
        | "ssl.truststore.type"
        | "ssl.truststore.certificates" => {
            "is a Java client setting (a JKS or PKCS12 trust store); librdkafka reads the CA \
             certificates as PEM: set `ssl.ca.location` (YAML `ssl_ca_location`) to a PEM file"
        }
        "ssl.keystore.location"
        | "ssl.keystore.password"
        | "ssl.keystore.type"
        | "ssl.keystore.key"
        | "ssl.keystore.certificate.chain" => {
            "is a Java client setting (a JKS or PKCS12 key store); librdkafka reads the client \
             certificate and key as PEM: set `ssl.certificate.location` and `ssl.key.location` \
             (YAML `ssl_certificate_location`, `ssl_key_location`)"
        }
        "sasl.login.callback.handler.class" | "sasl.client.callback.handler.class" => {
            "names a Java class; librdkafka cannot load it"
        }
        _ => return None,
    })
}

/// `security.protocol`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SecurityProtocol {
    /// No TLS, no SASL (Kafka's default).
    #[default]
    Plaintext,
    /// TLS.
    Ssl,
    /// SASL without TLS.
    SaslPlaintext,
    /// SASL over TLS.
    SaslSsl,
}

impl SecurityProtocol {
    const NAMES: [&'static str; 4] = ["plaintext", "ssl", "sasl_plaintext", "sasl_ssl"];

    fn parse(text: &str) -> Option<Self> {
        Some(match text.to_ascii_lowercase().as_str() {
            "plaintext" => Self::Plaintext,
            "ssl" => Self::Ssl,
            "sasl_plaintext" => Self::SaslPlaintext,
            "sasl_ssl" => Self::SaslSsl,
            _ => return None,
        })
    }

    /// librdkafka's name.
    pub fn as_str(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    fn uses_sasl(self) -> bool {
        matches!(self, Self::SaslPlaintext | Self::SaslSsl)
    }

    fn uses_tls(self) -> bool {
        matches!(self, Self::Ssl | Self::SaslSsl)
    }
}

/// `sasl.mechanism`: the ones librdkafka has built in (GSSAPI needs Cyrus SASL, not built).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaslMechanism {
    /// User name and password, in the clear (use with TLS).
    Plain,
    /// Salted challenge-response with SHA-256.
    ScramSha256,
    /// Salted challenge-response with SHA-512.
    ScramSha512,
    /// A bearer token.
    OauthBearer,
}

impl SaslMechanism {
    const NAMES: [&'static str; 4] = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"];

    fn parse(text: &str) -> Option<Self> {
        Some(match text.to_ascii_uppercase().as_str() {
            "PLAIN" => Self::Plain,
            "SCRAM-SHA-256" => Self::ScramSha256,
            "SCRAM-SHA-512" => Self::ScramSha512,
            "OAUTHBEARER" => Self::OauthBearer,
            _ => return None,
        })
    }

    /// Kafka's name.
    pub fn as_str(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    fn uses_password(self) -> bool {
        !matches!(self, Self::OauthBearer)
    }
}

/// The connection options as written, before they are checked: from a component's YAML, or
/// (without `bootstrap_servers`) from a tool's properties file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SecurityOptions {
    /// `host:port[,host:port]` of the cluster. Required in YAML. Flume:
    /// `kafka.bootstrap.servers`.
    pub(crate) bootstrap_servers: Option<String>,
    pub(crate) security_protocol: Option<String>,
    pub(crate) sasl_mechanism: Option<String>,
    pub(crate) sasl_username: Option<String>,
    pub(crate) sasl_password: Option<Secret>,
    pub(crate) sasl_oauthbearer_token: Option<Secret>,
    pub(crate) ssl_ca_location: Option<PathBuf>,
    pub(crate) ssl_certificate_location: Option<PathBuf>,
    pub(crate) ssl_key_location: Option<PathBuf>,
    pub(crate) ssl_key_password: Option<Secret>,
    pub(crate) ssl_endpoint_identification: Option<String>,
}

/// A problem with the security options: which option, and what is wrong (never a secret).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Problem {
    pub(crate) option: &'static str,
    pub(crate) message: String,
}

/// Checked security settings, ready for librdkafka.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Security {
    protocol: SecurityProtocol,
    sasl: Option<Sasl>,
    tls: Option<Tls>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Sasl {
    Password {
        mechanism: SaslMechanism,
        username: String,
        password: Secret,
    },
    Token(Secret),
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Tls {
    ca: Option<PathBuf>,
    certificate: Option<(PathBuf, PathBuf)>,
    key_password: Option<Secret>,
    verify_host_name: bool,
}

impl Security {
    /// Checks `options`; `name` writes an option's name as the user wrote it (YAML or
    /// property name), for the messages.
    pub(crate) fn check(
        options: &SecurityOptions,
        name: impl Fn(&str) -> String,
    ) -> Result<Self, Problem> {
        let problem = |option: &'static str, message: String| Problem { option, message };
        let protocol = match &options.security_protocol {
            None => SecurityProtocol::Plaintext,
            Some(text) => SecurityProtocol::parse(text).ok_or_else(|| {
                problem(
                    "security_protocol",
                    ferry_core::config::unknown_name_message(
                        &name("security_protocol"),
                        text,
                        SecurityProtocol::NAMES,
                    ),
                )
            })?,
        };
        let sasl = Self::check_sasl(options, protocol, &name)?;
        let tls = Self::check_tls(options, protocol, &name)?;
        Ok(Self {
            protocol,
            sasl,
            tls,
        })
    }

    fn check_sasl(
        options: &SecurityOptions,
        protocol: SecurityProtocol,
        name: &impl Fn(&str) -> String,
    ) -> Result<Option<Sasl>, Problem> {
        let problem = |option: &'static str, message: String| Problem { option, message };
        let mechanism = match &options.sasl_mechanism {
            None => None,
            Some(text) => Some(SaslMechanism::parse(text).ok_or_else(|| {
                problem(
                    "sasl_mechanism",
                    ferry_core::config::unknown_name_message(
                        &name("sasl_mechanism"),
                        text,
                        SaslMechanism::NAMES,
                    ),
                )
            })?),
        };
        let Some(mechanism) = mechanism else {
            if protocol.uses_sasl() {
                return Err(problem(
                    "security_protocol",
                    format!(
                        "{} {} needs {} (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER; \
                         GSSAPI is not built in)",
                        name("security_protocol"),
                        protocol.as_str(),
                        name("sasl_mechanism")
                    ),
                ));
            }
            for option in ["sasl_username", "sasl_password", "sasl_oauthbearer_token"] {
                if is_set(options, option) {
                    return Err(problem(
                        static_name(option),
                        format!(
                            "{} is set but no SASL: set {} to sasl_plaintext or sasl_ssl and {}",
                            name(option),
                            name("security_protocol"),
                            name("sasl_mechanism")
                        ),
                    ));
                }
            }
            return Ok(None);
        };
        if !protocol.uses_sasl() {
            return Err(problem(
                "sasl_mechanism",
                format!(
                    "{} needs {} sasl_plaintext or sasl_ssl (it is {})",
                    name("sasl_mechanism"),
                    name("security_protocol"),
                    protocol.as_str()
                ),
            ));
        }
        let unused = |option: &'static str| {
            problem(
                option,
                format!(
                    "{} is not used with {} {}",
                    name(option),
                    name("sasl_mechanism"),
                    mechanism.as_str()
                ),
            )
        };
        if mechanism.uses_password() {
            if options.sasl_oauthbearer_token.is_some() {
                return Err(unused("sasl_oauthbearer_token"));
            }
            let missing = |option: &'static str| {
                problem(
                    "sasl_mechanism",
                    format!(
                        "{} {} needs {}",
                        name("sasl_mechanism"),
                        mechanism.as_str(),
                        name(option)
                    ),
                )
            };
            let username = match options.sasl_username.as_deref() {
                Some("") => {
                    return Err(problem(
                        "sasl_username",
                        format!("{} is empty", name("sasl_username")),
                    ));
                }
                Some(username) => username.to_owned(),
                None => return Err(missing("sasl_username")),
            };
            let password = options
                .sasl_password
                .clone()
                .ok_or_else(|| missing("sasl_password"))?;
            Ok(Some(Sasl::Password {
                mechanism,
                username,
                password,
            }))
        } else {
            for option in ["sasl_username", "sasl_password"] {
                if is_set(options, option) {
                    return Err(unused(static_name(option)));
                }
            }
            let token = options.sasl_oauthbearer_token.clone().ok_or_else(|| {
                problem(
                    "sasl_mechanism",
                    format!(
                        "{} OAUTHBEARER needs {} (fetching tokens from an OIDC endpoint is not \
                         built in)",
                        name("sasl_mechanism"),
                        name("sasl_oauthbearer_token")
                    ),
                )
            })?;
            if token.expose().trim().is_empty() {
                return Err(problem(
                    "sasl_oauthbearer_token",
                    format!("{} is empty", name("sasl_oauthbearer_token")),
                ));
            }
            Ok(Some(Sasl::Token(token)))
        }
    }

    fn check_tls(
        options: &SecurityOptions,
        protocol: SecurityProtocol,
        name: &impl Fn(&str) -> String,
    ) -> Result<Option<Tls>, Problem> {
        let problem = |option: &'static str, message: String| Problem { option, message };
        if !protocol.uses_tls() {
            for option in [
                "ssl_ca_location",
                "ssl_certificate_location",
                "ssl_key_location",
                "ssl_key_password",
                "ssl_endpoint_identification",
            ] {
                if is_set(options, option) {
                    return Err(problem(
                        static_name(option),
                        format!(
                            "{} is set but no TLS: set {} to ssl or sasl_ssl",
                            name(option),
                            name("security_protocol")
                        ),
                    ));
                }
            }
            return Ok(None);
        }
        let readable = |option: &'static str, path: &Option<PathBuf>| match path {
            None => Ok(None),
            Some(path) => check_readable(path)
                .map(|()| Some(path.clone()))
                .map_err(|e| {
                    problem(
                        option,
                        format!("{}: cannot read {}: {e}", name(option), path.display()),
                    )
                }),
        };
        // librdkafka's `probe` looks for the system's CA certificates.
        let ca = match &options.ssl_ca_location {
            Some(path) if path == Path::new("probe") => Some(path.clone()),
            other => readable("ssl_ca_location", other)?,
        };
        let certificate = readable(
            "ssl_certificate_location",
            &options.ssl_certificate_location,
        )?;
        let key = readable("ssl_key_location", &options.ssl_key_location)?;
        let certificate = match (certificate, key) {
            (Some(certificate), Some(key)) => Some((certificate, key)),
            (None, None) => None,
            (Some(_), None) => {
                return Err(problem(
                    "ssl_certificate_location",
                    format!(
                        "{} needs {} (the client certificate's private key)",
                        name("ssl_certificate_location"),
                        name("ssl_key_location")
                    ),
                ));
            }
            (None, Some(_)) => {
                return Err(problem(
                    "ssl_key_location",
                    format!(
                        "{} needs {} (the client certificate)",
                        name("ssl_key_location"),
                        name("ssl_certificate_location")
                    ),
                ));
            }
        };
        if options.ssl_key_password.is_some() && certificate.is_none() {
            return Err(problem(
                "ssl_key_password",
                format!(
                    "{} is set but no {}",
                    name("ssl_key_password"),
                    name("ssl_key_location")
                ),
            ));
        }
        let verify_host_name = match options.ssl_endpoint_identification.as_deref() {
            None => true,
            Some(text) if text.eq_ignore_ascii_case("https") => true,
            Some(text) if text.eq_ignore_ascii_case("none") => false,
            Some(text) => {
                return Err(problem(
                    "ssl_endpoint_identification",
                    ferry_core::config::unknown_name_message(
                        &name("ssl_endpoint_identification"),
                        text,
                        ["https", "none"],
                    ),
                ));
            }
        };
        Ok(Some(Tls {
            ca,
            certificate,
            key_password: options.ssl_key_password.clone(),
            verify_host_name,
        }))
    }

    /// The protocol.
    pub fn protocol(&self) -> SecurityProtocol {
        self.protocol
    }

    /// The static OAUTHBEARER token, if that is the mechanism.
    pub(crate) fn oauth_token(&self) -> Option<&Secret> {
        match &self.sasl {
            Some(Sasl::Token(token)) => Some(token),
            _ => None,
        }
    }

    /// Sets the librdkafka properties of these settings on `client`.
    pub fn apply(&self, client: &mut ClientConfig) {
        client.set("security.protocol", self.protocol.as_str());
        match &self.sasl {
            Some(Sasl::Password {
                mechanism,
                username,
                password,
            }) => {
                client
                    .set("sasl.mechanism", mechanism.as_str())
                    .set("sasl.username", username)
                    .set("sasl.password", password.expose());
            }
            Some(Sasl::Token(_)) => {
                client.set("sasl.mechanism", SaslMechanism::OauthBearer.as_str());
            }
            None => {}
        }
        if let Some(tls) = &self.tls {
            if let Some(ca) = &tls.ca {
                client.set("ssl.ca.location", ca.display().to_string());
            }
            if let Some((certificate, key)) = &tls.certificate {
                client
                    .set(
                        "ssl.certificate.location",
                        certificate.display().to_string(),
                    )
                    .set("ssl.key.location", key.display().to_string());
            }
            if let Some(password) = &tls.key_password {
                client.set("ssl.key.password", password.expose());
            }
            client.set(
                "ssl.endpoint.identification.algorithm",
                if tls.verify_host_name {
                    "https"
                } else {
                    "none"
                },
            );
        }
    }

    /// The client context that hands librdkafka the OAUTHBEARER token, if any.
    pub(crate) fn token_context(&self) -> TokenContext {
        TokenContext {
            token: self.oauth_token().cloned().map(Arc::new),
            watcher: None,
        }
    }
}

fn is_set(options: &SecurityOptions, option: &str) -> bool {
    match option {
        "sasl_username" => options.sasl_username.is_some(),
        "sasl_password" => options.sasl_password.is_some(),
        "sasl_oauthbearer_token" => options.sasl_oauthbearer_token.is_some(),
        "ssl_ca_location" => options.ssl_ca_location.is_some(),
        "ssl_certificate_location" => options.ssl_certificate_location.is_some(),
        "ssl_key_location" => options.ssl_key_location.is_some(),
        "ssl_key_password" => options.ssl_key_password.is_some(),
        "ssl_endpoint_identification" => options.ssl_endpoint_identification.is_some(),
        _ => false,
    }
}

fn static_name(option: &str) -> &'static str {
    OPTIONS
        .iter()
        .map(|(o, _)| *o)
        .find(|o| *o == option)
        .unwrap_or("security_protocol")
}

/// A file that can be opened for reading, or a directory that can be listed (librdkafka takes
/// a directory of CA certificates too).
fn check_readable(path: &Path) -> std::io::Result<()> {
    if path.is_dir() {
        std::fs::read_dir(path).map(drop)
    } else {
        std::fs::File::open(path).map(drop)
    }
}

/// The client context of every Kafka client the components make: it hands librdkafka the
/// static OAUTHBEARER token when it asks (librdkafka asks only with `sasl.mechanism`
/// OAUTHBEARER, again before the token's lifetime ends), and, for a component's clients,
/// tells the component's `/health` what librdkafka cannot reach (see [`Watcher`]).
#[derive(Clone, Default)]
pub struct TokenContext {
    token: Option<Arc<Secret>>,
    watcher: Option<Watcher>,
}

/// Where a component's clients report that they cannot reach the cluster: the component's
/// metrics, whose failure `/health` shows. librdkafka tells at once when all brokers are down,
/// a name does not resolve or authentication fails (an error callback); a record only fails when
/// `message.timeout.ms` (5 minutes) runs out, and a consumer never fails. The component is
/// reachable again when the client reports a broker up (its statistics, every second), or a
/// delivery succeeds.
#[derive(Clone)]
pub(crate) struct Watcher {
    pub(crate) metrics: ferry_core::ComponentMetrics,
    pub(crate) bootstrap_servers: Arc<str>,
}

/// How often a watched client reports its brokers' states (librdkafka's statistics).
pub(crate) const WATCH_INTERVAL_MS: &str = "1000";

impl Watcher {
    /// librdkafka's global error `code` (`reason` its text): the errors that mean no broker
    /// can be used mark the component unreachable.
    fn error(&self, code: Option<rdkafka::types::RDKafkaErrorCode>, reason: &str) {
        use rdkafka::types::RDKafkaErrorCode as Code;
        let cut_off = matches!(
            code,
            // One broker's connection dropping (`_TRANSPORT`) is not enough: a cluster's
            // brokers close idle connections, and the others still serve.
            Some(
                Code::AllBrokersDown
                    | Code::Resolve
                    | Code::Authentication
                    | Code::SaslAuthenticationFailed
                    | Code::SSL
            )
        );
        if cut_off {
            self.metrics.unreachable(format!(
                "cannot reach Kafka at {}: {reason}",
                self.bootstrap_servers
            ));
        }
    }

    /// librdkafka's statistics (JSON): a broker in state `UP` makes the component reachable.
    /// Read only while it is not.
    fn statistics(&self, json: &[u8]) {
        if !self.metrics.is_unreachable() {
            return;
        }
        let Ok(stats) = serde_json::from_slice::<serde_json::Value>(json) else {
            return;
        };
        let up = stats["brokers"].as_object().is_some_and(|brokers| {
            brokers
                .values()
                .any(|b| b["state"] == "UP" && b["nodeid"].as_i64().is_some_and(|id| id >= 0))
        });
        if up {
            self.metrics.reachable();
        }
    }
}

impl TokenContext {
    /// This context, reporting to `watcher`.
    pub(crate) fn watched_by(mut self, watcher: Option<Watcher>) -> Self {
        self.watcher = watcher;
        self
    }
}

impl TokenContext {
    /// The token and its lifetime for librdkafka: the lifetime is the JWT's `exp` claim when
    /// the token is a JWT that has one, else an hour from now (librdkafka asks again before
    /// then, and gets the same token).
    pub(crate) fn oauth_token(
        &self,
    ) -> Result<rdkafka::client::OAuthToken, Box<dyn std::error::Error>> {
        let Some(token) = &self.token else {
            return Err("sasl.mechanism OAUTHBEARER needs sasl_oauthbearer_token".into());
        };
        let claims = jwt_claims(token.expose());
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let lifetime_ms = claims
            .as_ref()
            .and_then(|c| c.get("exp"))
            .and_then(serde_json::Value::as_i64)
            .map_or(now_ms + 3_600_000, |exp| exp * 1000);
        let principal_name = claims
            .as_ref()
            .and_then(|c| c.get("sub"))
            .and_then(serde_json::Value::as_str)
            .unwrap_or("ferry")
            .to_owned();
        Ok(rdkafka::client::OAuthToken {
            token: token.expose().to_owned(),
            principal_name,
            lifetime_ms,
        })
    }
}

impl rdkafka::ClientContext for TokenContext {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn generate_oauth_token(
        &self,
        _config: Option<&str>,
    ) -> Result<rdkafka::client::OAuthToken, Box<dyn std::error::Error>> {
        self.oauth_token()
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        self.client_error(error, reason);
    }

    fn stats_raw(&self, statistics: &[u8]) {
        self.client_statistics(statistics);
    }
}

impl TokenContext {
    /// A global error of librdkafka's: logged (as librdkafka's client does by default) and
    /// told to the watcher.
    pub(crate) fn client_error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        tracing::error!(target: "librdkafka", "librdkafka: {error}: {reason}");
        if let Some(watcher) = &self.watcher {
            watcher.error(error.rdkafka_error_code(), reason);
        }
    }

    /// librdkafka's statistics, told to the watcher.
    pub(crate) fn client_statistics(&self, statistics: &[u8]) {
        if let Some(watcher) = &self.watcher {
            watcher.statistics(statistics);
        }
    }
}

impl rdkafka::consumer::ConsumerContext for TokenContext {}

impl rdkafka::producer::ProducerContext for TokenContext {
    type DeliveryOpaque = ();

    fn delivery(&self, _result: &rdkafka::producer::DeliveryResult<'_>, _opaque: ()) {}
}

/// The claims of a JWT (`header.claims.signature`, base64url), when `token` is one.
fn jwt_claims(token: &str) -> Option<serde_json::Map<String, serde_json::Value>> {
    use base64::Engine;
    let claims = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(claims.trim_end_matches('='))
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn options(pairs: &[(&str, &str)]) -> SecurityOptions {
        let mut options = SecurityOptions::default();
        for (key, value) in pairs {
            let text = Some(value.to_string());
            let secret = Some(Secret::new(*value));
            match *key {
                "security_protocol" => options.security_protocol = text,
                "sasl_mechanism" => options.sasl_mechanism = text,
                "sasl_username" => options.sasl_username = text,
                "sasl_password" => options.sasl_password = secret,
                "sasl_oauthbearer_token" => options.sasl_oauthbearer_token = secret,
                "ssl_ca_location" => options.ssl_ca_location = text.map(PathBuf::from),
                "ssl_certificate_location" => {
                    options.ssl_certificate_location = text.map(PathBuf::from)
                }
                "ssl_key_location" => options.ssl_key_location = text.map(PathBuf::from),
                "ssl_key_password" => options.ssl_key_password = secret,
                "ssl_endpoint_identification" => options.ssl_endpoint_identification = text,
                other => panic!("no option {other}"),
            }
        }
        options
    }

    fn check(pairs: &[(&str, &str)]) -> Result<Security, Problem> {
        Security::check(&options(pairs), |o| format!("`{o}`"))
    }

    fn problem(pairs: &[(&str, &str)]) -> (&'static str, String) {
        let problem = check(pairs).expect_err("a problem");
        assert!(!problem.message.contains("hunter2"), "{problem:?}");
        (problem.option, problem.message)
    }

    /// The properties set on `client`, in order, sensitive values shown as rust-rdkafka
    /// shows them.
    pub(crate) fn properties(client: &ClientConfig) -> Vec<(String, String)> {
        client
            .config_map()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    /// The build links OpenSSL (feature `ssl-vendored`): TLS and SCRAM are there, and a
    /// `sasl_ssl` + SCRAM client is accepted, not refused as built without SSL/SASL.
    #[test]
    fn librdkafka_is_built_with_tls_and_scram() {
        let features = ClientConfig::new()
            .create_native_config()
            .unwrap()
            .get("builtin.features")
            .unwrap();
        let features: Vec<&str> = features.split(',').collect();
        for wanted in ["ssl", "sasl_plain", "sasl_scram", "sasl_oauthbearer"] {
            assert!(
                features.contains(&wanted),
                "{wanted} missing from {features:?}"
            );
        }
        for mechanism in ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"] {
            let security = check(&[
                ("security_protocol", "sasl_ssl"),
                ("sasl_mechanism", mechanism),
                ("sasl_username", "u"),
                ("sasl_password", "p"),
            ])
            .unwrap();
            let mut client = ClientConfig::new();
            client.set("bootstrap.servers", "127.0.0.1:1");
            security.apply(&mut client);
            let created: Result<rdkafka::producer::BaseProducer<TokenContext>, _> =
                client.create_with_context(security.token_context());
            assert!(created.is_ok(), "{mechanism}: {:?}", created.err());
        }
    }

    #[test]
    fn secrets_never_show_in_debug_output() {
        let security = check(&[
            ("security_protocol", "SASL_PLAINTEXT"),
            ("sasl_mechanism", "scram-sha-512"),
            ("sasl_username", "u"),
            ("sasl_password", "hunter2"),
        ])
        .unwrap();
        let shown = format!(
            "{security:?} {:?}",
            options(&[("sasl_password", "hunter2")])
        );
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("***"), "{shown}");
    }

    #[test]
    fn settings_become_librdkafka_properties() {
        let dir = tempfile::tempdir().unwrap();
        let pem = |name: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, "-----BEGIN CERTIFICATE-----\n").unwrap();
            path.display().to_string()
        };
        let (ca, cert, key) = (pem("ca.pem"), pem("cert.pem"), pem("key.pem"));
        let security = check(&[
            ("security_protocol", "sasl_ssl"),
            ("sasl_mechanism", "PLAIN"),
            ("sasl_username", "key"),
            ("sasl_password", "secret"),
            ("ssl_ca_location", &ca),
            ("ssl_certificate_location", &cert),
            ("ssl_key_location", &key),
            ("ssl_key_password", "pass"),
            ("ssl_endpoint_identification", "none"),
        ])
        .unwrap();
        let mut client = ClientConfig::new();
        security.apply(&mut client);
        let expected: Vec<(String, String)> = [
            ("sasl.mechanism", "PLAIN"),
            ("sasl.password", "[sanitized for safety]"),
            ("sasl.username", "key"),
            ("security.protocol", "sasl_ssl"),
            ("ssl.ca.location", ca.as_str()),
            ("ssl.certificate.location", cert.as_str()),
            ("ssl.endpoint.identification.algorithm", "none"),
            ("ssl.key.location", key.as_str()),
            ("ssl.key.password", "[sanitized for safety]"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(properties(&client), expected);
        assert_eq!(client.get("sasl.password"), Some("secret"));
        assert_eq!(client.get("ssl.key.password"), Some("pass"));

        let mut client = ClientConfig::new();
        Security::default().apply(&mut client);
        assert_eq!(
            properties(&client),
            vec![("security.protocol".to_owned(), "plaintext".to_owned())]
        );
    }

    #[test]
    fn every_inconsistent_setting_names_its_option() {
        /// Options given, the option blamed, part of the message.
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a str);
        let cases: &[Case<'_>] = &[
            (
                &[("security_protocol", "tls")],
                "security_protocol",
                "unknown `security_protocol` `tls`",
            ),
            (
                &[("security_protocol", "sasl_ssl")],
                "security_protocol",
                "needs `sasl_mechanism`",
            ),
            (
                &[("sasl_mechanism", "PLAIN")],
                "sasl_mechanism",
                "needs `security_protocol` sasl_plaintext or sasl_ssl (it is plaintext)",
            ),
            (
                &[
                    ("security_protocol", "sasl_ssl"),
                    ("sasl_mechanism", "GSSAPI"),
                ],
                "sasl_mechanism",
                "unknown `sasl_mechanism` `GSSAPI`",
            ),
            (
                &[
                    ("security_protocol", "sasl_ssl"),
                    ("sasl_mechanism", "SCRAM-SHA-256"),
                    ("sasl_password", "hunter2"),
                ],
                "sasl_mechanism",
                "SCRAM-SHA-256 needs `sasl_username`",
            ),
            (
                &[
                    ("security_protocol", "sasl_ssl"),
                    ("sasl_mechanism", "PLAIN"),
                    ("sasl_username", "u"),
                ],
                "sasl_mechanism",
                "PLAIN needs `sasl_password`",
            ),
            (
                &[
                    ("security_protocol", "sasl_ssl"),
                    ("sasl_mechanism", "PLAIN"),
                    ("sasl_username", ""),
                    ("sasl_password", "hunter2"),
                ],
                "sasl_username",
                "`sasl_username` is empty",
            ),
            (
                &[
                    ("security_protocol", "sasl_ssl"),
                    ("sasl_mechanism", "OAUTHBEARER"),
                ],
                "sasl_mechanism",
                "needs `sasl_oauthbearer_token`",
            ),
            (
                &[
                    ("security_protocol", "sasl_ssl"),
                    ("sasl_mechanism", "OAUTHBEARER"),
                    ("sasl_oauthbearer_token", "t"),
                    ("sasl_password", "hunter2"),
                ],
                "sasl_password",
                "not used with `sasl_mechanism` OAUTHBEARER",
            ),
            (
                &[
                    ("security_protocol", "sasl_ssl"),
                    ("sasl_mechanism", "PLAIN"),
                    ("sasl_username", "u"),
                    ("sasl_password", "p"),
                    ("sasl_oauthbearer_token", "hunter2"),
                ],
                "sasl_oauthbearer_token",
                "not used with `sasl_mechanism` PLAIN",
            ),
            (
                &[("sasl_password", "hunter2")],
                "sasl_password",
                "is set but no SASL",
            ),
            (
                &[("ssl_ca_location", "/ca.pem")],
                "ssl_ca_location",
                "is set but no TLS",
            ),
            (
                &[
                    ("security_protocol", "ssl"),
                    ("ssl_ca_location", "/no/such/ca.pem"),
                ],
                "ssl_ca_location",
                "`ssl_ca_location`: cannot read /no/such/ca.pem: ",
            ),
            (
                &[
                    ("security_protocol", "ssl"),
                    ("ssl_endpoint_identification", "http"),
                ],
                "ssl_endpoint_identification",
                "did you mean `https`",
            ),
            (
                &[
                    ("security_protocol", "ssl"),
                    ("ssl_key_password", "hunter2"),
                ],
                "ssl_key_password",
                "is set but no `ssl_key_location`",
            ),
        ];
        for (pairs, option, message) in cases {
            let (at, text) = problem(pairs);
            assert_eq!(at, *option, "{pairs:?}: {text}");
            assert!(text.contains(message), "{pairs:?}: {text}");
        }
    }

    #[test]
    fn a_client_certificate_needs_its_key_and_the_key_its_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("cert.pem");
        std::fs::write(&cert, "x").unwrap();
        let cert = cert.display().to_string();
        let (at, text) = problem(&[
            ("security_protocol", "ssl"),
            ("ssl_certificate_location", &cert),
        ]);
        assert_eq!(
            (at, text.contains("needs `ssl_key_location`")),
            ("ssl_certificate_location", true),
            "{text}"
        );
        let (at, text) = problem(&[("security_protocol", "ssl"), ("ssl_key_location", &cert)]);
        assert_eq!(
            (at, text.contains("needs `ssl_certificate_location`")),
            ("ssl_key_location", true),
            "{text}"
        );
        // A directory of CA certificates, and librdkafka's `probe`, are accepted.
        let dir_path = dir.path().display().to_string();
        check(&[("security_protocol", "ssl"), ("ssl_ca_location", &dir_path)]).unwrap();
        check(&[("security_protocol", "ssl"), ("ssl_ca_location", "probe")]).unwrap();
    }

    #[test]
    fn a_static_token_is_handed_over_with_the_jwt_expiry() {
        use base64::Engine;
        let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(br#"{"sub":"svc","exp":4102444800}"#);
        let jwt = format!("eyJhbGciOiJub25lIn0.{claims}.");
        let security = check(&[
            ("security_protocol", "sasl_ssl"),
            ("sasl_mechanism", "oauthbearer"),
            ("sasl_oauthbearer_token", &jwt),
        ])
        .unwrap();
        let token = security.token_context().oauth_token().unwrap();
        assert_eq!(token.token, jwt);
        assert_eq!(token.principal_name, "svc");
        assert_eq!(token.lifetime_ms, 4_102_444_800_000);
        // An opaque token lives an hour, then is handed over again.
        let security = check(&[
            ("security_protocol", "sasl_plaintext"),
            ("sasl_mechanism", "OAUTHBEARER"),
            ("sasl_oauthbearer_token", "opaque"),
        ])
        .unwrap();
        let token = security.token_context().oauth_token().unwrap();
        assert_eq!(token.principal_name, "ferry");
        assert!(token.lifetime_ms > 0);
        assert!(TokenContext::default().oauth_token().is_err());
    }
}
