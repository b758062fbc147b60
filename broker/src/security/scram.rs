//! SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677): salted credentials and the server
//! side of the exchange, without I/O.
//!
//! ```text
//! client-first  n,[a=authzid],n=saslname,r=client-nonce[,extensions]
//! server-first  r=client-nonce+server-nonce,s=base64(salt),i=iterations
//! client-final  c=base64(gs2-header),r=nonce,p=base64(ClientKey XOR ClientSignature)
//! server-final  v=base64(ServerSignature)
//! ```
//!
//! A credential is what the broker keeps of a password (Kafka's `ScramCredential`):
//! `SaltedPassword = PBKDF2-HMAC(password, salt, iterations)`,
//! `StoredKey = H(HMAC(SaltedPassword, "Client Key"))`,
//! `ServerKey = HMAC(SaltedPassword, "Server Key")`. The password cannot be had back from it;
//! a client proves it knows the password by a proof the server checks against `StoredKey`,
//! and the server proves it holds the credential by a signature made with `ServerKey`.
//! Channel binding is not offered: only the gs2 flag `n` is accepted.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha512};

/// Fewest iterations accepted for a credential (Kafka's minimum).
pub(crate) const MIN_ITERATIONS: i32 = 4096;
/// Most iterations accepted for a credential (Kafka's maximum).
pub(crate) const MAX_ITERATIONS: i32 = 16384;
/// Iterations of the credentials made from configured passwords.
pub(crate) const DEFAULT_ITERATIONS: i32 = 4096;

/// A SCRAM hash function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum ScramMechanism {
    Sha256,
    Sha512,
}

impl ScramMechanism {
    pub(crate) const ALL: [ScramMechanism; 2] = [ScramMechanism::Sha256, ScramMechanism::Sha512];

    /// The IANA name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            ScramMechanism::Sha256 => "SCRAM-SHA-256",
            ScramMechanism::Sha512 => "SCRAM-SHA-512",
        }
    }

    /// Kafka's id of the mechanism in the KIP-554 APIs (`ScramMechanism.type()`).
    pub(crate) fn kafka_type(self) -> i8 {
        match self {
            ScramMechanism::Sha256 => 1,
            ScramMechanism::Sha512 => 2,
        }
    }

    pub(crate) fn from_kafka_type(t: i8) -> Option<ScramMechanism> {
        ScramMechanism::ALL
            .into_iter()
            .find(|m| m.kafka_type() == t)
    }

    pub(crate) fn from_name(name: &str) -> Option<ScramMechanism> {
        ScramMechanism::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(name))
    }

    fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        match self {
            ScramMechanism::Sha256 => hmac_bytes::<Hmac<Sha256>>(key, data),
            ScramMechanism::Sha512 => hmac_bytes::<Hmac<Sha512>>(key, data),
        }
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            ScramMechanism::Sha256 => Sha256::digest(data).to_vec(),
            ScramMechanism::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    /// `Hi(password, salt, iterations)`: PBKDF2 with this HMAC.
    pub(crate) fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        match self {
            ScramMechanism::Sha256 => {
                let mut out = vec![0u8; 32];
                pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out);
                out
            }
            ScramMechanism::Sha512 => {
                let mut out = vec![0u8; 64];
                pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, iterations, &mut out);
                out
            }
        }
    }
}

fn hmac_bytes<M: Mac + hmac::digest::KeyInit>(key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC takes a key of any length: `new_from_slice` cannot fail for it.
    match <M as hmac::digest::KeyInit>::new_from_slice(key) {
        Ok(mut mac) => {
            mac.update(data);
            mac.finalize().into_bytes().to_vec()
        }
        Err(_) => Vec::new(),
    }
}

/// Compares in time that depends on the lengths only, not on where the bytes differ.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// What the broker keeps of a user's password for one mechanism.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct ScramCredential {
    pub(crate) mechanism: ScramMechanism,
    pub(crate) salt: Vec<u8>,
    pub(crate) iterations: i32,
    pub(crate) stored_key: Vec<u8>,
    pub(crate) server_key: Vec<u8>,
}

impl fmt::Debug for ScramCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScramCredential")
            .field("mechanism", &self.mechanism)
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

impl ScramCredential {
    /// The credential of a salted password, as AlterUserScramCredentials carries it.
    pub(crate) fn from_salted_password(
        mechanism: ScramMechanism,
        salt: Vec<u8>,
        iterations: i32,
        salted_password: &[u8],
    ) -> ScramCredential {
        let client_key = mechanism.hmac(salted_password, b"Client Key");
        ScramCredential {
            mechanism,
            salt,
            iterations,
            stored_key: mechanism.hash(&client_key),
            server_key: mechanism.hmac(salted_password, b"Server Key"),
        }
    }

    /// The credential of `password` with a fresh random salt.
    pub(crate) fn from_password(
        mechanism: ScramMechanism,
        password: &str,
        iterations: i32,
    ) -> Result<ScramCredential, getrandom::Error> {
        let mut salt = vec![0u8; 32];
        getrandom::fill(&mut salt)?;
        let salted = mechanism.salted_password(password.as_bytes(), &salt, iterations as u32);
        Ok(ScramCredential::from_salted_password(
            mechanism, salt, iterations, &salted,
        ))
    }

    /// Whether `password` is the one this credential was made from (SASL PLAIN).
    pub(crate) fn matches_password(&self, password: &str) -> bool {
        let Ok(iterations) = u32::try_from(self.iterations) else {
            return false;
        };
        let salted = self
            .mechanism
            .salted_password(password.as_bytes(), &self.salt, iterations);
        let client_key = self.mechanism.hmac(&salted, b"Client Key");
        constant_time_eq(&self.mechanism.hash(&client_key), &self.stored_key)
    }
}

/// A password salted as AlterUserScramCredentials carries it (KIP-554): what
/// `kafka-configs.sh --add-config 'SCRAM-SHA-256=[password=...]'` and `agent users --add` send.
/// The password itself is not in it, and its `Debug` shows neither salt nor salted password.
#[derive(Clone)]
pub struct SaltedPassword {
    /// Kafka's id of the mechanism (1 SCRAM-SHA-256, 2 SCRAM-SHA-512).
    pub mechanism_type: i8,
    /// The random salt.
    pub salt: Vec<u8>,
    /// PBKDF2 iterations.
    pub iterations: i32,
    /// `Hi(password, salt, iterations)`.
    pub salted_password: Vec<u8>,
}

impl fmt::Debug for SaltedPassword {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SaltedPassword")
            .field("mechanism_type", &self.mechanism_type)
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

/// Why a password cannot be salted.
#[derive(Debug, thiserror::Error)]
pub enum SaltError {
    /// Only the SCRAM mechanisms keep credentials.
    #[error("{0} is not a SCRAM mechanism: use SCRAM-SHA-256 or SCRAM-SHA-512")]
    NotScram(crate::config::SaslMechanism),
    /// Iterations outside what brokers accept.
    #[error("{0} iterations: SCRAM needs {MIN_ITERATIONS} to {MAX_ITERATIONS}")]
    Iterations(i32),
    /// No randomness for the salt.
    #[error("no randomness for the salt: {0}")]
    Random(String),
}

/// Salts `password` for `mechanism` with a fresh random salt.
pub fn salt_password(
    mechanism: crate::config::SaslMechanism,
    password: &str,
    iterations: i32,
) -> Result<SaltedPassword, SaltError> {
    use crate::config::SaslMechanism;
    let scram = match mechanism {
        SaslMechanism::ScramSha256 => ScramMechanism::Sha256,
        SaslMechanism::ScramSha512 => ScramMechanism::Sha512,
        SaslMechanism::Plain => return Err(SaltError::NotScram(mechanism)),
    };
    if !(MIN_ITERATIONS..=MAX_ITERATIONS).contains(&iterations) {
        return Err(SaltError::Iterations(iterations));
    }
    let mut salt = vec![0u8; 32];
    getrandom::fill(&mut salt).map_err(|e| SaltError::Random(e.to_string()))?;
    let salted_password = scram.salted_password(password.as_bytes(), &salt, iterations as u32);
    Ok(SaltedPassword {
        mechanism_type: scram.kafka_type(),
        salt,
        iterations,
        salted_password,
    })
}

/// Why an exchange failed. The client is only told that authentication failed; this is for
/// the broker's log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ScramError {
    #[error("malformed {message} message: {reason}")]
    Malformed {
        message: &'static str,
        reason: &'static str,
    },
    #[error("channel binding was asked for (gs2 flag `{0}`); only `n` is accepted")]
    ChannelBinding(String),
    #[error("unknown user `{0}`")]
    UnknownUser(String),
    #[error("authorization id `{authzid}` differs from user `{user}`")]
    Authzid { authzid: String, user: String },
    #[error("the client-final nonce does not end with the server-first one")]
    Nonce,
    #[error("wrong password for user `{0}`")]
    Proof(String),
    #[error("no message expected at this step")]
    State,
}

fn malformed(message: &'static str, reason: &'static str) -> ScramError {
    ScramError::Malformed { message, reason }
}

/// Decodes a `saslname` (RFC 5802 §5.1): `=2C` is `,`, `=3D` is `=`, any other `=` is an
/// error.
pub(crate) fn decode_saslname(name: &str) -> Option<String> {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(at) = rest.find('=') {
        out.push_str(&rest[..at]);
        match rest.get(at + 1..at + 3) {
            Some("2C") => out.push(','),
            Some("3D") => out.push('='),
            _ => return None,
        }
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Some(out)
}

/// A parsed client-first message.
#[derive(Debug, PartialEq, Eq)]
struct ClientFirst {
    authzid: Option<String>,
    user: String,
    nonce: String,
    /// The message without its gs2 header, part of the AuthMessage.
    bare: String,
}

fn parse_client_first(message: &[u8]) -> Result<ClientFirst, ScramError> {
    const M: &str = "client-first";
    let text = std::str::from_utf8(message).map_err(|_| malformed(M, "not UTF-8"))?;
    let mut parts = text.splitn(3, ',');
    let flag = parts.next().unwrap_or_default();
    let authzid = parts.next().ok_or_else(|| malformed(M, "no gs2 header"))?;
    let bare = parts.next().ok_or_else(|| malformed(M, "no gs2 header"))?;
    match flag {
        "n" => {}
        "y" => return Err(ScramError::ChannelBinding(flag.into())),
        f if f.starts_with("p=") => return Err(ScramError::ChannelBinding(flag.into())),
        _ => return Err(malformed(M, "gs2 flag is not n, y or p=")),
    }
    let authzid = match authzid {
        "" => None,
        a => Some(
            a.strip_prefix("a=")
                .and_then(decode_saslname)
                .ok_or_else(|| malformed(M, "bad authorization id"))?,
        ),
    };
    let mut attributes = bare.split(',');
    if bare.starts_with("m=") {
        return Err(malformed(M, "mandatory extension m= not supported"));
    }
    let user = attributes
        .next()
        .and_then(|a| a.strip_prefix("n="))
        .ok_or_else(|| malformed(M, "no n= user name"))?;
    let user = decode_saslname(user).ok_or_else(|| malformed(M, "bad = escape in user name"))?;
    if user.is_empty() {
        return Err(malformed(M, "empty user name"));
    }
    let nonce = attributes
        .next()
        .and_then(|a| a.strip_prefix("r="))
        .ok_or_else(|| malformed(M, "no r= nonce"))?;
    if nonce.is_empty()
        || !nonce
            .bytes()
            .all(|b| (0x21..=0x7e).contains(&b) && b != b',')
    {
        return Err(malformed(M, "nonce is empty or not printable"));
    }
    // Further attributes are extensions (Kafka's `tokenauth=true`); none is acted on.
    Ok(ClientFirst {
        authzid,
        user,
        nonce: nonce.to_owned(),
        bare: bare.to_owned(),
    })
}

/// The server side of one SCRAM exchange.
pub(crate) struct ScramServer {
    mechanism: ScramMechanism,
    state: State,
}

enum State {
    Initial,
    SentFirst {
        user: String,
        credential: ScramCredential,
        client_first_bare: String,
        server_first: String,
        nonce: String,
    },
    Done,
}

impl ScramServer {
    pub(crate) fn new(mechanism: ScramMechanism) -> ScramServer {
        ScramServer {
            mechanism,
            state: State::Initial,
        }
    }

    pub(crate) fn mechanism(&self) -> ScramMechanism {
        self.mechanism
    }

    /// Reads client-first, looks the user up and answers server-first with a fresh nonce.
    pub(crate) fn client_first(
        &mut self,
        message: &[u8],
        lookup: impl FnOnce(&str) -> Option<ScramCredential>,
    ) -> Result<Vec<u8>, ScramError> {
        let mut nonce = [0u8; 24];
        if getrandom::fill(&mut nonce).is_err() {
            return Err(malformed("client-first", "no randomness for the nonce"));
        }
        self.client_first_with_nonce(message, lookup, &BASE64.encode(nonce))
    }

    fn client_first_with_nonce(
        &mut self,
        message: &[u8],
        lookup: impl FnOnce(&str) -> Option<ScramCredential>,
        server_nonce: &str,
    ) -> Result<Vec<u8>, ScramError> {
        if !matches!(self.state, State::Initial) {
            return Err(ScramError::State);
        }
        self.state = State::Done;
        let first = parse_client_first(message)?;
        if let Some(authzid) = &first.authzid
            && *authzid != first.user
        {
            return Err(ScramError::Authzid {
                authzid: authzid.clone(),
                user: first.user,
            });
        }
        let credential = lookup(&first.user)
            .filter(|c| c.mechanism == self.mechanism)
            .ok_or_else(|| ScramError::UnknownUser(first.user.clone()))?;
        let nonce = format!("{}{server_nonce}", first.nonce);
        let server_first = format!(
            "r={nonce},s={},i={}",
            BASE64.encode(&credential.salt),
            credential.iterations
        );
        let reply = server_first.clone().into_bytes();
        self.state = State::SentFirst {
            user: first.user,
            credential,
            client_first_bare: first.bare,
            server_first,
            nonce,
        };
        Ok(reply)
    }

    /// Reads client-final, checks the proof and returns the user with server-final.
    pub(crate) fn client_final(&mut self, message: &[u8]) -> Result<(String, Vec<u8>), ScramError> {
        const M: &str = "client-final";
        let State::SentFirst {
            user,
            credential,
            client_first_bare,
            server_first,
            nonce,
        } = std::mem::replace(&mut self.state, State::Done)
        else {
            return Err(ScramError::State);
        };
        let text = std::str::from_utf8(message).map_err(|_| malformed(M, "not UTF-8"))?;
        let (without_proof, proof) = text
            .rsplit_once(",p=")
            .ok_or_else(|| malformed(M, "no p= proof"))?;
        let mut attributes = without_proof.split(',');
        let binding = attributes
            .next()
            .and_then(|a| a.strip_prefix("c="))
            .ok_or_else(|| malformed(M, "no c= channel binding"))?;
        let binding = BASE64
            .decode(binding)
            .map_err(|_| malformed(M, "c= is not base64"))?;
        // The gs2 header again: `n,,` or `n,a=...,` (no channel binding data).
        if !binding.starts_with(b"n,") {
            return Err(ScramError::ChannelBinding(
                String::from_utf8_lossy(&binding).into_owned(),
            ));
        }
        let their_nonce = attributes
            .next()
            .and_then(|a| a.strip_prefix("r="))
            .ok_or_else(|| malformed(M, "no r= nonce"))?;
        // Kafka checks that the nonce ends with the server-first one, not that it equals it,
        // and librdkafka up to 2.x (kcat) depends on it: it repeats its own nonce before the
        // combined one. The proof covers the message as sent, so the server's fresh nonce
        // still guards against replays.
        if !their_nonce.ends_with(&nonce) {
            return Err(ScramError::Nonce);
        }
        let proof = BASE64
            .decode(proof)
            .map_err(|_| malformed(M, "p= is not base64"))?;
        let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
        let mechanism = self.mechanism;
        let client_signature = mechanism.hmac(&credential.stored_key, auth_message.as_bytes());
        if proof.len() != client_signature.len() {
            return Err(ScramError::Proof(user));
        }
        let client_key: Vec<u8> = proof
            .iter()
            .zip(&client_signature)
            .map(|(p, s)| p ^ s)
            .collect();
        if !constant_time_eq(&mechanism.hash(&client_key), &credential.stored_key) {
            return Err(ScramError::Proof(user));
        }
        let server_signature = mechanism.hmac(&credential.server_key, auth_message.as_bytes());
        let reply = format!("v={}", BASE64.encode(server_signature)).into_bytes();
        Ok((user, reply))
    }
}

/// One client exchange: client-first, client-final, then the server's signature checked.
pub struct ScramClient {
    hash: ScramMechanism,
    username: String,
    password: String,
    nonce: String,
    step: Step,
}

enum Step {
    First,
    Final { client_first_bare: String },
    Verify { server_signature: Vec<u8> },
    Done,
}

impl ScramClient {
    /// A client for `mechanism` (`SCRAM-SHA-256`, `SCRAM-SHA-512`).
    pub fn new(mechanism: &str, username: &str, password: &str) -> Result<ScramClient, String> {
        let hash = ScramMechanism::from_name(mechanism)
            .ok_or_else(|| format!("`{mechanism}` is not a SCRAM mechanism"))?;
        let mut random = [0u8; 24];
        getrandom::fill(&mut random)
            .map_err(|e| format!("no random bytes for a SCRAM nonce: {e}"))?;
        Ok(ScramClient {
            hash,
            username: username.to_owned(),
            password: password.to_owned(),
            nonce: BASE64.encode(random),
            step: Step::First,
        })
    }

    /// The next message to send after the server's `challenge` (empty at first); `None` once
    /// the server proved it knows the credentials too.
    pub fn respond(&mut self, challenge: &[u8]) -> Result<Option<Vec<u8>>, String> {
        match std::mem::replace(&mut self.step, Step::Done) {
            Step::First => {
                let client_first_bare = format!("n={},r={}", saslname(&self.username), self.nonce);
                let message = format!("n,,{client_first_bare}").into_bytes();
                self.step = Step::Final { client_first_bare };
                Ok(Some(message))
            }
            Step::Final { client_first_bare } => {
                let server_first = std::str::from_utf8(challenge)
                    .map_err(|_| "the SCRAM server-first message is not UTF-8".to_owned())?;
                let (nonce, salt, iterations) = parse_server_first(server_first)?;
                if !nonce.starts_with(&self.nonce) || nonce.len() == self.nonce.len() {
                    return Err("the SCRAM server nonce does not extend the client's".to_owned());
                }
                let salted = self
                    .hash
                    .salted_password(self.password.as_bytes(), &salt, iterations);
                let client_key = self.hash.hmac(&salted, b"Client Key");
                let stored_key = self.hash.hash(&client_key);
                let without_proof = format!("c=biws,r={nonce}");
                let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
                let signature = self.hash.hmac(&stored_key, auth_message.as_bytes());
                let proof: Vec<u8> = client_key
                    .iter()
                    .zip(&signature)
                    .map(|(a, b)| a ^ b)
                    .collect();
                let server_key = self.hash.hmac(&salted, b"Server Key");
                self.step = Step::Verify {
                    server_signature: self.hash.hmac(&server_key, auth_message.as_bytes()),
                };
                Ok(Some(
                    format!("{without_proof},p={}", BASE64.encode(proof)).into_bytes(),
                ))
            }
            Step::Verify { server_signature } => {
                let server_final = std::str::from_utf8(challenge)
                    .map_err(|_| "the SCRAM server-final message is not UTF-8".to_owned())?;
                if let Some(error) = server_final.strip_prefix("e=") {
                    return Err(format!("the server refused the SCRAM proof: {error}"));
                }
                let verifier = server_final
                    .split(',')
                    .find_map(|a| a.strip_prefix("v="))
                    .ok_or_else(|| "the SCRAM server-final message has no verifier".to_owned())?;
                if BASE64.decode(verifier).ok().as_deref() != Some(&server_signature[..]) {
                    return Err("the server's SCRAM signature is wrong: it does not know this user's credentials".to_owned());
                }
                Ok(None)
            }
            Step::Done => Ok(None),
        }
    }
}

/// A user name as SCRAM writes it: `,` and `=` escaped.
fn saslname(name: &str) -> String {
    name.replace('=', "=3D").replace(',', "=2C")
}

/// `r=...,s=...,i=...` of a server-first message.
fn parse_server_first(message: &str) -> Result<(&str, Vec<u8>, u32), String> {
    let (mut nonce, mut salt, mut iterations) = (None, None, None);
    for attribute in message.split(',') {
        match attribute.split_at_checked(2) {
            Some(("r=", v)) => nonce = Some(v),
            Some(("s=", v)) => {
                salt = Some(
                    BASE64
                        .decode(v)
                        .map_err(|_| "the SCRAM salt is not base64".to_owned())?,
                )
            }
            Some(("i=", v)) => {
                iterations = Some(
                    v.parse::<u32>()
                        .map_err(|_| "the SCRAM iteration count is not a number".to_owned())?,
                )
            }
            Some(("m=", _)) => {
                return Err(
                    "the server asks for a SCRAM extension this client does not know".to_owned(),
                );
            }
            _ => {}
        }
    }
    match (nonce, salt, iterations) {
        (Some(n), Some(s), Some(i)) if i > 0 => Ok((n, s, i)),
        _ => Err(format!(
            "the SCRAM server-first message `{message}` lacks a nonce, salt or iteration count"
        )),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Encodes a user name as a `saslname`, as clients do.
    fn encode_saslname(name: &str) -> String {
        name.replace('=', "=3D").replace(',', "=2C")
    }

    /// The client side, for tests: what a Kafka client sends.
    pub(crate) fn client_final(
        mechanism: ScramMechanism,
        password: &str,
        client_first_bare: &str,
        server_first: &str,
    ) -> String {
        client_final_with_nonce_prefix(mechanism, password, client_first_bare, server_first, "")
    }

    /// A client-final whose nonce has `prefix` before the combined one (librdkafka 2.x).
    fn client_final_with_nonce_prefix(
        mechanism: ScramMechanism,
        password: &str,
        client_first_bare: &str,
        server_first: &str,
        prefix: &str,
    ) -> String {
        let fields: Vec<&str> = server_first.split(',').collect();
        let nonce = format!("{prefix}{}", &fields[0][2..]);
        let salt = BASE64.decode(&fields[1][2..]).unwrap();
        let iterations: u32 = fields[2][2..].parse().unwrap();
        let salted = mechanism.salted_password(password.as_bytes(), &salt, iterations);
        let client_key = mechanism.hmac(&salted, b"Client Key");
        let stored_key = mechanism.hash(&client_key);
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
        let signature = mechanism.hmac(&stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&signature)
            .map(|(a, b)| a ^ b)
            .collect();
        format!("{without_proof},p={}", BASE64.encode(proof))
    }

    fn rfc7677_credential() -> ScramCredential {
        let salt = BASE64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let salted = ScramMechanism::Sha256.salted_password(b"pencil", &salt, 4096);
        ScramCredential::from_salted_password(ScramMechanism::Sha256, salt, 4096, &salted)
    }

    #[test]
    fn rfc7677_exchange_gives_the_published_server_signature() {
        let mut server = ScramServer::new(ScramMechanism::Sha256);
        let first = server
            .client_first_with_nonce(
                b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO",
                |user| (user == "user").then(rfc7677_credential),
                "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
            )
            .unwrap();
        assert_eq!(
            String::from_utf8(first).unwrap(),
            "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
        );
        let (user, last) = server
            .client_final(
                b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
                  p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
            )
            .unwrap();
        assert_eq!(user, "user");
        assert_eq!(
            String::from_utf8(last).unwrap(),
            "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
        );
    }

    #[test]
    fn wrong_password_fails_the_proof() {
        for mechanism in ScramMechanism::ALL {
            let credential = ScramCredential::from_password(mechanism, "right", 4096).unwrap();
            let mut server = ScramServer::new(mechanism);
            let bare = "n=alice,r=abcdef";
            let first = server
                .client_first(format!("n,,{bare}").as_bytes(), |_| {
                    Some(credential.clone())
                })
                .unwrap();
            let first = String::from_utf8(first).unwrap();
            let wrong = client_final(mechanism, "wrong", bare, &first);
            assert_eq!(
                server.client_final(wrong.as_bytes()),
                Err(ScramError::Proof("alice".into()))
            );
            // And the right one passes on a new exchange.
            let mut server = ScramServer::new(mechanism);
            let first = server
                .client_first(format!("n,,{bare}").as_bytes(), |_| {
                    Some(credential.clone())
                })
                .unwrap();
            let right = client_final(mechanism, "right", bare, &String::from_utf8(first).unwrap());
            assert_eq!(server.client_final(right.as_bytes()).unwrap().0, "alice");
        }
    }

    /// librdkafka up to 2.x sends its nonce, then the combined one; Kafka accepts it.
    #[test]
    fn client_final_nonce_may_repeat_the_client_nonce_before_the_combined_one() {
        let credential =
            ScramCredential::from_password(ScramMechanism::Sha256, "pw", 4096).unwrap();
        let mut server = ScramServer::new(ScramMechanism::Sha256);
        let bare = "n=alice,r=cnonce";
        let first = server
            .client_first(format!("n,,{bare}").as_bytes(), |_| {
                Some(credential.clone())
            })
            .unwrap();
        let first = String::from_utf8(first).unwrap();
        let last =
            client_final_with_nonce_prefix(ScramMechanism::Sha256, "pw", bare, &first, "cnonce");
        assert_eq!(server.client_final(last.as_bytes()).unwrap().0, "alice");
        // A nonce that does not end with the server's is refused.
        let mut server = ScramServer::new(ScramMechanism::Sha256);
        server
            .client_first_with_nonce(
                format!("n,,{bare}").as_bytes(),
                |_| Some(credential.clone()),
                "SRV",
            )
            .unwrap();
        assert_eq!(
            server.client_final(b"c=biws,r=cnonceSRVx,p=AAAA"),
            Err(ScramError::Nonce)
        );
    }

    #[test]
    fn saslnames_unescape_commas_and_equals_and_refuse_other_escapes() {
        assert_eq!(decode_saslname("a=2Cb=3Dc").as_deref(), Some("a,b=c"));
        assert_eq!(decode_saslname("plain").as_deref(), Some("plain"));
        assert_eq!(decode_saslname("bad=2"), None);
        assert_eq!(decode_saslname("bad=41"), None);
        assert_eq!(encode_saslname("a,b=c"), "a=2Cb=3Dc");
        let first = parse_client_first(b"n,a=x=2Cy,n=x=2Cy,r=n0nce").unwrap();
        assert_eq!(first.user, "x,y");
        assert_eq!(first.authzid.as_deref(), Some("x,y"));
    }

    #[test]
    fn malformed_client_messages_are_errors_not_panics() {
        let cases: &[&[u8]] = &[
            b"",
            b"n",
            b"n,,",
            b"n,,r=abc",
            b"n,,n=,r=abc",
            b"n,,n=a",
            b"n,,n=a,r=",
            b"n,,n=a=ZZ,r=abc",
            b"x,,n=a,r=abc",
            b"n,b=c,n=a,r=abc",
            b"\xff\xfe",
            b"n,,m=ext,n=a,r=abc",
        ];
        for case in cases {
            let mut server = ScramServer::new(ScramMechanism::Sha256);
            let result = server.client_first(case, |_| Some(rfc7677_credential()));
            assert!(
                matches!(result, Err(ScramError::Malformed { .. })),
                "{:?}: {result:?}",
                String::from_utf8_lossy(case)
            );
        }
        let mut server = ScramServer::new(ScramMechanism::Sha256);
        assert!(matches!(
            server.client_first(b"y,,n=user,r=abc", |_| Some(rfc7677_credential())),
            Err(ScramError::ChannelBinding(_))
        ));
        let mut server = ScramServer::new(ScramMechanism::Sha256);
        assert!(matches!(
            server.client_first(
                b"p=tls-unique,,n=user,r=abc",
                |_| Some(rfc7677_credential())
            ),
            Err(ScramError::ChannelBinding(_))
        ));
        let finals: &[&[u8]] = &[
            b"",
            b"c=biws",
            b"c=biws,r=abc",
            b"c=!!,r=abc,p=AAAA",
            b"c=biws,r=abcXYZ,p=!!",
            b"c=biws,r=abcXYZ,p=AAAA",
            b"c=cD10bHMtdW5pcXVlLCw=,r=abcXYZ,p=AAAA",
        ];
        for case in finals {
            let mut server = ScramServer::new(ScramMechanism::Sha256);
            server
                .client_first_with_nonce(b"n,,n=user,r=abc", |_| Some(rfc7677_credential()), "XYZ")
                .unwrap();
            assert!(
                server.client_final(case).is_err(),
                "{}",
                String::from_utf8_lossy(case)
            );
        }
        // A second client-final, or one before client-first, is out of order.
        let mut server = ScramServer::new(ScramMechanism::Sha256);
        assert_eq!(server.client_final(b"c=biws"), Err(ScramError::State));
    }

    #[test]
    fn unknown_users_and_other_authorization_ids_are_refused() {
        let mut server = ScramServer::new(ScramMechanism::Sha256);
        assert_eq!(
            server.client_first(b"n,,n=nobody,r=abc", |_| None),
            Err(ScramError::UnknownUser("nobody".into()))
        );
        let mut server = ScramServer::new(ScramMechanism::Sha256);
        assert!(matches!(
            server.client_first(b"n,a=admin,n=user,r=abc", |_| Some(rfc7677_credential())),
            Err(ScramError::Authzid { .. })
        ));
    }

    #[test]
    fn plain_passwords_match_their_credential_only() {
        let credential = rfc7677_credential();
        assert!(credential.matches_password("pencil"));
        assert!(!credential.matches_password("pencil2"));
        assert!(!format!("{credential:?}").contains("stored_key"));
    }

    /// RFC 7677's example exchange, the client nonce fixed to the RFC's.
    #[test]
    fn client_computes_the_rfc_7677_client_proof_and_checks_the_server_signature() {
        let mut client = ScramClient::new("SCRAM-SHA-256", "user", "pencil").unwrap();
        client.nonce = "rOprNGfwEbeRWgbNEkqO".into();
        let first = client.respond(b"").unwrap().unwrap();
        assert_eq!(first, b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let server_first =
            b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let last = client.respond(server_first).unwrap().unwrap();
        assert_eq!(
            String::from_utf8(last).unwrap(),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
             p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        assert!(
            client
                .respond(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn refuses_a_wrong_server_signature_and_malformed_messages() {
        let mut client = ScramClient::new("SCRAM-SHA-512", "a,b=c", "pw").unwrap();
        let first = String::from_utf8(client.respond(b"").unwrap().unwrap()).unwrap();
        assert!(first.starts_with("n,,n=a=2Cb=3Dc,r="), "{first}");
        let nonce = first.rsplit_once("r=").unwrap().1.to_owned();
        assert!(client.respond(b"r=other,s=AAAA,i=4096").is_err());
        let mut client = ScramClient::new("SCRAM-SHA-512", "u", "pw").unwrap();
        client.nonce = nonce.clone();
        client.respond(b"").unwrap();
        for bad in [&b"garbage"[..], b"r=x", &[0xff, 0xfe]] {
            let mut c = ScramClient::new("SCRAM-SHA-256", "u", "pw").unwrap();
            c.respond(b"").unwrap();
            assert!(c.respond(bad).is_err());
        }
        let server_first = format!("r={nonce}srv,s=AAAA,i=4096");
        client.respond(server_first.as_bytes()).unwrap().unwrap();
        let err = client.respond(b"v=AAAA").unwrap_err();
        assert!(err.contains("signature is wrong"), "{err}");
    }

    /// The client and the server of this module agree with each other, for both hashes, and
    /// a wrong password fails at the server.
    #[test]
    fn client_and_server_complete_an_exchange() {
        for mechanism in ScramMechanism::ALL {
            let credential = ScramCredential::from_password(mechanism, "s3cret", 4096).unwrap();
            for (password, accepted) in [("s3cret", true), ("wrong", false)] {
                let mut client = ScramClient::new(mechanism.name(), "alice", password).unwrap();
                let mut server = ScramServer::new(mechanism);
                let first = client.respond(b"").unwrap().unwrap();
                let server_first = server
                    .client_first(&first, |user| (user == "alice").then(|| credential.clone()))
                    .unwrap();
                let last = client.respond(&server_first).unwrap().unwrap();
                match server.client_final(&last) {
                    Ok((user, server_final)) => {
                        assert!(accepted, "{mechanism:?} accepted a wrong password");
                        assert_eq!(user, "alice");
                        assert!(client.respond(&server_final).unwrap().is_none());
                    }
                    Err(e) => assert!(!accepted, "{mechanism:?}: {e}"),
                }
            }
        }
    }
}
