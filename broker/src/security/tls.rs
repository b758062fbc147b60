//! TLS listeners (rustls, ring provider): the server config of a listener from its PEM files,
//! and the principal of a client certificate.
//!
//! A client authenticated by a certificate is named as Kafka's default principal builder names
//! it: `User:` and the certificate's subject in RFC 2253 form (the X.500 distinguished name
//! with its last RDN first, Java's `X500Principal.getName()`), e.g. `User:CN=client,OU=eng,O=ferry`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use super::Principal;
use crate::config::{ClientAuth, SslConfig};

/// Why a listener's TLS settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file cannot be read.
    #[error("listener {listener}: cannot read {what} {path}: {source}")]
    Read {
        /// The listener's name.
        listener: String,
        /// Which file: `certificate`, `key`, `ca`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A PEM file holds nothing usable.
    #[error("listener {listener}: {what} {path}: {reason}")]
    Pem {
        /// The listener's name.
        listener: String,
        /// Which file.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The certificate and key do not go together, or rustls refuses them.
    #[error("listener {listener}: certificate {certificate} with key {key}: {reason}")]
    Certificate {
        /// The listener's name.
        listener: String,
        /// The certificate file.
        certificate: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls' reason.
        reason: String,
    },
    /// Client authentication without a CA, or a CA bundle that cannot verify.
    #[error("listener {listener}: {reason}")]
    ClientAuth {
        /// The listener's name.
        listener: String,
        /// What is wrong.
        reason: String,
    },
}

fn read(listener: &str, what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        listener: listener.to_owned(),
        what,
        path: path.to_owned(),
        source,
    })
}

fn certificates(
    listener: &str,
    what: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem_error = |reason: String| TlsError::Pem {
        listener: listener.to_owned(),
        what,
        path: path.to_owned(),
        reason,
    };
    let bytes = read(listener, what, path)?;
    let certificates = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(format!("not a PEM certificate file: {e}")))?;
    if certificates.is_empty() {
        return Err(pem_error("no CERTIFICATE found in the file".into()));
    }
    Ok(certificates)
}

/// The TLS acceptor of the listener `listener` from its settings.
pub(crate) fn acceptor(listener: &str, ssl: &SslConfig) -> Result<TlsAcceptor, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certificates(listener, "certificate", &ssl.certificate)?;
    let key_bytes = read(listener, "key", &ssl.key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|e| TlsError::Pem {
        listener: listener.to_owned(),
        what: "key",
        path: ssl.key.clone(),
        reason: match e {
            rustls_pki_types::pem::Error::NoItemsFound => {
                "no private key found (PKCS#8, RSA or EC PEM)".into()
            }
            e => format!("not a PEM private key: {e}"),
        },
    })?;
    let certificate_error = |reason: String| TlsError::Certificate {
        listener: listener.to_owned(),
        certificate: ssl.certificate.clone(),
        key: ssl.key.clone(),
        reason,
    };
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| certificate_error(e.to_string()))?;
    let builder = match (ssl.client_auth, &ssl.ca) {
        (ClientAuth::None, _) => builder.with_no_client_auth(),
        (_, None) => {
            return Err(TlsError::ClientAuth {
                listener: listener.to_owned(),
                reason: "ssl.client_auth asks for client certificates: ssl.ca must name the PEM \
                         bundle of the CAs that sign them"
                    .into(),
            });
        }
        (client_auth, Some(ca)) => {
            let mut roots = rustls::RootCertStore::empty();
            for certificate in certificates(listener, "ca", ca)? {
                roots.add(certificate).map_err(|e| TlsError::Pem {
                    listener: listener.to_owned(),
                    what: "ca",
                    path: ca.clone(),
                    reason: format!("not a usable CA certificate: {e}"),
                })?;
            }
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider));
            let verifier = if client_auth == ClientAuth::Requested {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            let verifier = verifier.build().map_err(|e| TlsError::ClientAuth {
                listener: listener.to_owned(),
                reason: format!("ssl.ca {}: {e}", ca.display()),
            })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder
        .with_single_cert(chain, key)
        .map_err(|e| certificate_error(e.to_string()))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The principal of a verified client certificate: its subject in RFC 2253 form.
pub(crate) fn principal_of(certificate: &CertificateDer<'_>) -> Option<Principal> {
    subject_rfc2253(certificate.as_ref()).map(Principal::user)
}

/// One DER element: its tag and its contents, and what follows it.
fn element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;

/// The subject of a DER certificate, as Java's `X500Principal.getName(RFC2253)` writes it.
fn subject_rfc2253(der: &[u8]) -> Option<String> {
    let (SEQUENCE, certificate, _) = element(der)? else {
        return None;
    };
    let (SEQUENCE, tbs, _) = element(certificate)? else {
        return None;
    };
    let mut rest = tbs;
    // [0] version, when present.
    if rest.first() == Some(&0xa0) {
        rest = element(rest)?.2;
    }
    // serialNumber, signature, issuer, validity.
    for _ in 0..4 {
        rest = element(rest)?.2;
    }
    let (SEQUENCE, mut name, _) = element(rest)? else {
        return None;
    };
    let mut rdns = Vec::new();
    while !name.is_empty() {
        let (SET, mut set, next) = element(name)? else {
            return None;
        };
        name = next;
        let mut attributes = Vec::new();
        while !set.is_empty() {
            let (SEQUENCE, attribute, next) = element(set)? else {
                return None;
            };
            set = next;
            let (OID, oid, value) = element(attribute)? else {
                return None;
            };
            attributes.push(attribute_rfc2253(oid, value)?);
        }
        rdns.push(attributes.join("+"));
    }
    rdns.reverse();
    Some(rdns.join(","))
}

/// `KEYWORD=value` of one attribute: keywords Java's RFC 2253 output knows, the dotted OID and
/// `#hex` of the DER value otherwise.
fn attribute_rfc2253(oid: &[u8], value_der: &[u8]) -> Option<String> {
    let keyword = match oid {
        [0x55, 0x04, 0x03] => Some("CN"),
        [0x55, 0x04, 0x06] => Some("C"),
        [0x55, 0x04, 0x07] => Some("L"),
        [0x55, 0x04, 0x08] => Some("ST"),
        [0x55, 0x04, 0x09] => Some("STREET"),
        [0x55, 0x04, 0x0a] => Some("O"),
        [0x55, 0x04, 0x0b] => Some("OU"),
        [0x09, 0x92, 0x26, 0x89, 0x93, 0xf2, 0x2c, 0x64, 0x01, 0x19] => Some("DC"),
        [0x09, 0x92, 0x26, 0x89, 0x93, 0xf2, 0x2c, 0x64, 0x01, 0x01] => Some("UID"),
        _ => None,
    };
    let (tag, content, _) = element(value_der)?;
    let text = match tag {
        // UTF8String, PrintableString, TeletexString (as Latin-1 would be a guess: ASCII only),
        // IA5String.
        0x0c | 0x13 | 0x14 | 0x16 => std::str::from_utf8(content).ok().map(str::to_owned),
        // BMPString: UTF-16BE.
        0x1e if content.len() % 2 == 0 => String::from_utf16(
            &content
                .chunks(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]))
                .collect::<Vec<_>>(),
        )
        .ok(),
        _ => None,
    };
    match (keyword, text) {
        (Some(keyword), Some(text)) => Some(format!("{keyword}={}", escape_rfc2253(&text))),
        _ => {
            let hex: String = value_der.iter().map(|b| format!("{b:02x}")).collect();
            Some(format!("{}=#{hex}", dotted_oid(oid)?))
        }
    }
}

fn dotted_oid(oid: &[u8]) -> Option<String> {
    let (&first, rest) = oid.split_first()?;
    let mut parts = vec![u64::from(first / 40).min(2), {
        let first = u64::from(first);
        if first >= 80 { first - 80 } else { first % 40 }
    }];
    let mut value = 0u64;
    for &b in rest {
        value = (value << 7) | u64::from(b & 0x7f);
        if b & 0x80 == 0 {
            parts.push(value);
            value = 0;
        }
    }
    Some(
        parts
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join("."),
    )
}

/// RFC 2253 §2.4: `,+"\<>;` escaped, and a leading `#` or space and a trailing space.
fn escape_rfc2253(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let last = value.chars().count().saturating_sub(1);
    for (i, c) in value.chars().enumerate() {
        let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';')
            || (i == 0 && (c == '#' || c == ' '))
            || (i == last && c == ' ');
        if special {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_print_last_rdn_first_with_escapes() {
        let mut params = rcgen::CertificateParams::new(vec!["client".into()]).unwrap();
        let mut dn = rcgen::DistinguishedName::new();
        dn.push(rcgen::DnType::OrganizationName, "ferry");
        dn.push(rcgen::DnType::OrganizationalUnitName, "eng, ops");
        dn.push(rcgen::DnType::CommonName, "client");
        params.distinguished_name = dn;
        let key = rcgen::KeyPair::generate().unwrap();
        let certificate = params.self_signed(&key).unwrap();
        let principal = principal_of(certificate.der()).unwrap();
        assert_eq!(
            principal.to_string(),
            r"User:CN=client,OU=eng\, ops,O=ferry"
        );
    }

    #[test]
    fn unknown_attributes_print_as_oid_and_hex() {
        // 2.5.4.5 (serialNumber) as PrintableString "42".
        assert_eq!(
            attribute_rfc2253(&[0x55, 0x04, 0x05], &[0x13, 0x02, b'4', b'2']).unwrap(),
            "2.5.4.5=#13023432"
        );
        assert_eq!(escape_rfc2253("#a b "), r"\#a b\ ");
        assert!(subject_rfc2253(b"\x30\x05junk").is_none());
        assert!(subject_rfc2253(b"").is_none());
    }
}
