//! The Kafka protocol spoken by the tools themselves, for the admin calls librdkafka has no
//! function for (transactions, ACLs, SCRAM users): one request at a time on one connection,
//! each at the highest version both sides speak (learnt with ApiVersions when the connection
//! opens); an API the broker does not advertise is an error naming the broker.
//!
//! A connection is secured as a librdkafka client would be with the same properties (see
//! [`Security`]): TLS with rustls (the CA and client certificate as PEM files), then SASL
//! (SaslHandshake v1 and SaslAuthenticate) with PLAIN or SCRAM.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use anyhow::{Context, bail};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, RequestHeader, ResponseHeader,
};
use kafka_protocol::messages::{SaslAuthenticateRequest, SaslHandshakeRequest};
use kafka_protocol::protocol::{Decodable, Encodable, Message, Request, StrBytes};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use ferry_broker::ScramClient;

use super::REQUEST_TIMEOUT;

/// The keys of a client properties file the connections take besides the security ones:
/// the client id of every request, the time a request may take, the time connecting may
/// take (Kafka's names, which librdkafka takes too).
pub(super) const CONNECTION_KEYS: [&str; 3] = [
    "client.id",
    "request.timeout.ms",
    "socket.connection.setup.timeout.ms",
];

/// The security keys [`Security::from_properties`] reads.
pub(super) const SECURITY_KEYS: [&str; 10] = [
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "sasl.password",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
    "ssl.endpoint.identification.algorithm",
];

/// A byte stream to a broker: TCP, or TLS over TCP.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// How a connection is secured: Kafka's `security.protocol` and what it needs.
#[derive(Clone)]
pub(super) struct Security {
    tls: Option<Arc<rustls::ClientConfig>>,
    sasl: Option<Sasl>,
    /// `client.id`, sent in every request header (`agent-tools` by default).
    client_id: String,
    /// `request.timeout.ms`: how long a request may wait for its answer.
    request_timeout: std::time::Duration,
    /// `socket.connection.setup.timeout.ms`: how long connecting (TCP and TLS) may take.
    connect_timeout: std::time::Duration,
}

impl Default for Security {
    fn default() -> Self {
        Security {
            tls: None,
            sasl: None,
            client_id: "agent-tools".into(),
            request_timeout: REQUEST_TIMEOUT,
            connect_timeout: REQUEST_TIMEOUT,
        }
    }
}

#[derive(Clone)]
struct Sasl {
    mechanism: String,
    username: String,
    password: String,
}

impl fmt::Debug for Security {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Security")
            .field("tls", &self.tls.is_some())
            .field(
                "sasl",
                &self.sasl.as_ref().map(|s| (&s.mechanism, &s.username)),
            )
            .finish()
    }
}

impl Security {
    /// From librdkafka client properties (as `--command-config` gives them): `security.protocol`,
    /// `sasl.mechanism` (or `sasl.mechanisms`), `sasl.username`, `sasl.password`,
    /// `ssl.ca.location`, `ssl.certificate.location`, `ssl.key.location`,
    /// `ssl.endpoint.identification.algorithm`. Other properties are not about the connection
    /// and are left to whoever reads them.
    pub(super) fn from_properties(
        properties: &BTreeMap<String, String>,
    ) -> anyhow::Result<Security> {
        let get = |key: &str| properties.get(key).map(|v| v.trim());
        let protocol = get("security.protocol")
            .unwrap_or("plaintext")
            .to_ascii_lowercase();
        let (tls, sasl) = match protocol.as_str() {
            "plaintext" => (false, false),
            "ssl" => (true, false),
            "sasl_plaintext" => (false, true),
            "sasl_ssl" => (true, true),
            other => bail!(
                "security.protocol `{other}` is not one of plaintext, ssl, sasl_plaintext, sasl_ssl"
            ),
        };
        let tls = if tls {
            Some(Arc::new(tls_config(&get)?))
        } else {
            None
        };
        let sasl = if sasl {
            let mechanism = get("sasl.mechanism")
                .or_else(|| get("sasl.mechanisms"))
                .unwrap_or("PLAIN")
                .to_ascii_uppercase();
            if !matches!(
                mechanism.as_str(),
                "PLAIN" | "SCRAM-SHA-256" | "SCRAM-SHA-512"
            ) {
                bail!(
                    "sasl.mechanism `{mechanism}` is not supported by this tool: use PLAIN, \
                     SCRAM-SHA-256 or SCRAM-SHA-512"
                );
            }
            let username = get("sasl.username")
                .filter(|u| !u.is_empty())
                .context("SASL needs sasl.username")?
                .to_owned();
            let password = properties
                .get("sasl.password")
                .context("SASL needs sasl.password")?
                .clone();
            Some(Sasl {
                mechanism,
                username,
                password,
            })
        } else {
            None
        };
        let millis = |key: &str| -> anyhow::Result<Option<std::time::Duration>> {
            get(key)
                .map(|v| match v.parse::<u64>() {
                    Ok(ms) if ms > 0 => Ok(std::time::Duration::from_millis(ms)),
                    _ => bail!("{key} `{v}`: expected a positive number of milliseconds"),
                })
                .transpose()
        };
        let defaults = Security::default();
        Ok(Security {
            tls,
            sasl,
            client_id: get("client.id").map_or(defaults.client_id, str::to_owned),
            request_timeout: millis("request.timeout.ms")?.unwrap_or(defaults.request_timeout),
            connect_timeout: millis("socket.connection.setup.timeout.ms")?
                .unwrap_or(defaults.connect_timeout),
        })
    }
}

/// Where systems keep their CA bundle, for `ssl.ca.location=probe`.
const SYSTEM_CA_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// rustls settings from the `ssl.*` properties: the CA bundle to trust (a PEM file, or the
/// system's bundle for `probe`), an optional client certificate.
fn tls_config<'a>(get: &impl Fn(&str) -> Option<&'a str>) -> anyhow::Result<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    let ca = get("ssl.ca.location").context(
        "TLS needs ssl.ca.location: the PEM file of the CA that signed the brokers' certificates",
    )?;
    // librdkafka's `probe`: the system's bundle, where Debian, Fedora and Alpine keep it.
    let ca = if ca == "probe" {
        SYSTEM_CA_BUNDLES
            .iter()
            .copied()
            .find(|p| std::path::Path::new(p).exists())
            .context("ssl.ca.location probe: no system CA bundle found; name the PEM file")?
    } else {
        ca
    };
    for cert in CertificateDer::pem_file_iter(ca)
        .with_context(|| format!("cannot read ssl.ca.location {ca}"))?
    {
        let cert = cert.with_context(|| format!("ssl.ca.location {ca} is not PEM"))?;
        roots
            .add(cert)
            .with_context(|| format!("ssl.ca.location {ca} holds an unusable certificate"))?;
    }
    if roots.is_empty() {
        bail!("ssl.ca.location {ca} holds no certificate");
    }
    let verify_names = match get("ssl.endpoint.identification.algorithm").unwrap_or("https") {
        "https" => true,
        "none" | "" => false,
        other => bail!("ssl.endpoint.identification.algorithm `{other}` is not https or none"),
    };
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::clone(&provider),
    )
    .build()
    .context("cannot build the certificate verifier")?;
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("no TLS version in common with the crypto provider")?;
    let builder: rustls::ConfigBuilder<rustls::ClientConfig, rustls::client::WantsClientCert> =
        if verify_names {
            builder.with_webpki_verifier(verifier)
        } else {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyName(verifier)))
        };
    match (get("ssl.certificate.location"), get("ssl.key.location")) {
        (None, None) => Ok(builder.with_no_client_auth()),
        (Some(cert), Some(key)) => {
            if get("ssl.key.password").is_some() {
                bail!(
                    "ssl.key.password: this tool reads unencrypted PEM keys only; decrypt the \
                     key (openssl pkey -in KEY -out PLAIN)"
                );
            }
            let chain = CertificateDer::pem_file_iter(cert)
                .with_context(|| format!("cannot read ssl.certificate.location {cert}"))?
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("ssl.certificate.location {cert} is not PEM"))?;
            let key = PrivateKeyDer::from_pem_file(key).with_context(|| {
                format!("cannot read a private key from ssl.key.location {key}")
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .context("the client certificate and key do not go together")
        }
        _ => bail!("a client certificate needs both ssl.certificate.location and ssl.key.location"),
    }
}

/// Verifies the chain but not the name in it (`ssl.endpoint.identification.algorithm=none`).
#[derive(Debug)]
struct AnyName(Arc<rustls::client::WebPkiServerVerifier>);

impl rustls::client::danger::ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName
                | rustls::CertificateError::NotValidForNameContext { .. },
            )) => Ok(rustls::client::danger::ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// One connection to one broker, with the versions it serves.
pub(super) struct Connection {
    pub(super) address: String,
    stream: Box<dyn Io>,
    security: Security,
    /// Api key → (min, max) version the broker serves.
    versions: HashMap<i16, (i16, i16)>,
    correlation_id: i32,
}

impl Connection {
    /// A connection to the first of the comma-separated `bootstrap` servers that answers.
    pub(super) async fn bootstrap(
        bootstrap: &str,
        security: &Security,
    ) -> anyhow::Result<Connection> {
        let mut failures = Vec::new();
        for address in bootstrap
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
        {
            match Connection::open(address, security).await {
                Ok(connection) => return Ok(connection),
                Err(e) => failures.push(format!("{e:#}")),
            }
        }
        if failures.is_empty() {
            bail!("--bootstrap-server names no server");
        }
        bail!("{}", failures.join("; "))
    }

    /// A connection to another broker of the same cluster, secured the same way.
    pub(super) async fn open_another(&self, address: &str) -> anyhow::Result<Connection> {
        Connection::open(address, &self.security).await
    }

    /// Connects to `address`, secures the connection and asks which versions it serves.
    async fn open(address: &str, security: &Security) -> anyhow::Result<Connection> {
        let tcp = tokio::time::timeout(security.connect_timeout, TcpStream::connect(address))
            .await
            .map_err(|_| anyhow::anyhow!("connecting to broker {address} timed out"))?
            .with_context(|| format!("cannot connect to broker {address}"))?;
        let stream: Box<dyn Io> = match &security.tls {
            None => Box::new(tcp),
            Some(config) => {
                let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
                let name = ServerName::try_from(host.trim_matches(['[', ']']).to_owned())
                    .with_context(|| format!("`{host}` is not a host name for TLS"))?;
                let connector = tokio_rustls::TlsConnector::from(Arc::clone(config));
                let tls =
                    tokio::time::timeout(security.connect_timeout, connector.connect(name, tcp))
                        .await
                        .map_err(|_| {
                            anyhow::anyhow!("TLS handshake with broker {address} timed out")
                        })?
                        .with_context(|| format!("TLS handshake with broker {address} failed"))?;
                Box::new(tls)
            }
        };
        let mut connection = Connection {
            address: address.to_owned(),
            stream,
            security: security.clone(),
            versions: HashMap::new(),
            correlation_id: 0,
        };
        // Version 0: every broker serves it, and its response header is version 0 always.
        let response: ApiVersionsResponse =
            connection.call(0, &ApiVersionsRequest::default()).await?;
        if let Some(e) = ResponseError::try_from_code(response.error_code) {
            bail!("broker {address} refused ApiVersions: {e}");
        }
        connection.versions = response
            .api_keys
            .iter()
            .map(|k| (k.api_key, (k.min_version, k.max_version)))
            .collect();
        if let Some(sasl) = &security.sasl {
            connection.authenticate(sasl).await?;
        }
        Ok(connection)
    }

    /// SaslHandshake v1 for the mechanism, then its exchange in SaslAuthenticate requests.
    async fn authenticate(&mut self, sasl: &Sasl) -> anyhow::Result<()> {
        let address = self.address.clone();
        let mechanism = StrBytes::from_string(sasl.mechanism.clone());
        let handshake = self
            .call(
                1,
                &SaslHandshakeRequest::default().with_mechanism(mechanism),
            )
            .await?;
        if let Some(e) = ResponseError::try_from_code(handshake.error_code) {
            let offered: Vec<&str> = handshake.mechanisms.iter().map(|m| m.as_str()).collect();
            bail!(
                "broker {address} refused SASL mechanism {}: {e} (it offers: {})",
                sasl.mechanism,
                offered.join(", ")
            );
        }
        let version = self.version::<SaslAuthenticateRequest>()?;
        let mut exchange = SaslExchange::new(sasl)?;
        let mut challenge = Bytes::new();
        while let Some(message) = exchange.respond(&challenge)? {
            let response = self
                .call(
                    version,
                    &SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(message)),
                )
                .await?;
            if let Some(e) = ResponseError::try_from_code(response.error_code) {
                let message = response.error_message.as_deref().unwrap_or_default();
                bail!(
                    "broker {address} refused the SASL authentication of `{}`: {e} {message}",
                    sasl.username
                );
            }
            challenge = response.auth_bytes;
        }
        Ok(())
    }

    /// The highest version of `R` that the broker and this tool both speak.
    pub(super) fn version<R: Request>(&self) -> anyhow::Result<i16> {
        let name = api_name(R::KEY);
        let Some(&(min, max)) = self.versions.get(&R::KEY) else {
            bail!("broker {} does not support {name}", self.address);
        };
        let ours = <R as Message>::VERSIONS;
        let version = max.min(ours.max);
        if version < min.max(ours.min) {
            bail!(
                "broker {} serves {name} versions {min} to {max}; this tool speaks {} to {}",
                self.address,
                ours.min,
                ours.max
            );
        }
        Ok(version)
    }

    /// Sends `request` at `version` and reads its response.
    pub(super) async fn call<R: Request>(
        &mut self,
        version: i16,
        request: &R,
    ) -> anyhow::Result<R::Response> {
        let name = api_name(R::KEY);
        let address = self.address.clone();
        let exchange = async {
            self.correlation_id += 1;
            let header = RequestHeader::default()
                .with_request_api_key(R::KEY)
                .with_request_api_version(version)
                .with_correlation_id(self.correlation_id)
                .with_client_id(Some(StrBytes::from_string(self.security.client_id.clone())));
            let mut body = BytesMut::new();
            header.encode(&mut body, R::header_version(version))?;
            request.encode(&mut body, version)?;
            let mut frame = BytesMut::with_capacity(body.len() + 4);
            frame.put_u32(body.len() as u32);
            frame.extend_from_slice(&body);
            self.stream.write_all(&frame).await?;
            let mut size = [0u8; 4];
            self.stream.read_exact(&mut size).await?;
            let mut buf = vec![0u8; u32::from_be_bytes(size) as usize];
            self.stream.read_exact(&mut buf).await?;
            let mut buf = Bytes::from(buf);
            let header = ResponseHeader::decode(
                &mut buf,
                <R::Response as kafka_protocol::protocol::HeaderVersion>::header_version(version),
            )?;
            if header.correlation_id != self.correlation_id {
                bail!(
                    "the response has correlation id {}, not {}",
                    header.correlation_id,
                    self.correlation_id
                );
            }
            let response = R::Response::decode(&mut buf, version)?;
            if buf.has_remaining() {
                bail!("{} bytes left after the response", buf.remaining());
            }
            Ok(response)
        };
        let limit = self.security.request_timeout;
        match tokio::time::timeout(limit, exchange).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(e)) => Err(e.context(format!("{name} v{version} to broker {address} failed"))),
            Err(_) => {
                bail!("{name} v{version} to broker {address}: no answer within {limit:?}")
            }
        }
    }
}

/// The client side of one SASL exchange: each `respond` takes the broker's last message
/// (empty at first) and gives the next one to send, `None` once done.
enum SaslExchange {
    Plain(Option<Vec<u8>>),
    Scram(Box<ScramClient>),
    Done,
}

impl SaslExchange {
    fn new(sasl: &Sasl) -> anyhow::Result<SaslExchange> {
        Ok(match sasl.mechanism.as_str() {
            mechanism @ ("SCRAM-SHA-256" | "SCRAM-SHA-512") => SaslExchange::Scram(Box::new(
                ScramClient::new(mechanism, &sasl.username, &sasl.password)
                    .map_err(anyhow::Error::msg)?,
            )),
            // PLAIN (RFC 4616): no authorization id, the user name, the password.
            _ => {
                let mut message = vec![0];
                message.extend_from_slice(sasl.username.as_bytes());
                message.push(0);
                message.extend_from_slice(sasl.password.as_bytes());
                SaslExchange::Plain(Some(message))
            }
        })
    }

    fn respond(&mut self, challenge: &[u8]) -> anyhow::Result<Option<Vec<u8>>> {
        match self {
            SaslExchange::Plain(message) => Ok(message.take()),
            SaslExchange::Scram(scram) => {
                let next = scram.respond(challenge).map_err(anyhow::Error::msg)?;
                if next.is_none() {
                    *self = SaslExchange::Done;
                }
                Ok(next)
            }
            SaslExchange::Done => Ok(None),
        }
    }
}

pub(super) fn api_name(key: i16) -> String {
    ApiKey::try_from(key).map_or_else(|_| format!("API {key}"), |k| format!("{k:?}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn security(pairs: &[(&str, &str)]) -> anyhow::Result<Security> {
        let properties = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Security::from_properties(&properties)
    }

    #[test]
    fn settings_are_checked_and_errors_name_the_property() {
        assert!(security(&[]).unwrap().tls.is_none());
        let error = |pairs: &[(&str, &str)]| format!("{:#}", security(pairs).unwrap_err());
        assert!(error(&[("security.protocol", "tls")]).contains("security.protocol `tls`"));
        assert!(error(&[("security.protocol", "sasl_plaintext")]).contains("sasl.username"));
        let no_password = [
            ("security.protocol", "SASL_PLAINTEXT"),
            ("sasl.username", "alice"),
        ];
        assert!(error(&no_password).contains("sasl.password"));
        let gssapi = [
            ("security.protocol", "sasl_plaintext"),
            ("sasl.mechanism", "GSSAPI"),
        ];
        assert!(error(&gssapi).contains("GSSAPI"));
        assert!(error(&[("security.protocol", "ssl")]).contains("ssl.ca.location"));
        let missing = [
            ("security.protocol", "ssl"),
            ("ssl.ca.location", "/nonexistent/ca.pem"),
        ];
        assert!(error(&missing).contains("/nonexistent/ca.pem"));
        let sasl = security(&[
            ("security.protocol", "sasl_plaintext"),
            ("sasl.mechanism", "scram-sha-512"),
            ("sasl.username", "alice"),
            ("sasl.password", "pw-not-printed"),
        ])
        .unwrap();
        assert!(!format!("{sasl:?}").contains("pw-not-printed"));
        if SYSTEM_CA_BUNDLES
            .iter()
            .any(|p| std::path::Path::new(p).exists())
        {
            let probe = [("security.protocol", "ssl"), ("ssl.ca.location", "probe")];
            assert!(security(&probe).unwrap().tls.is_some());
        }
    }
}
