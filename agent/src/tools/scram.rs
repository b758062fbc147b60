//! The client side of SCRAM (RFC 5802, with SHA-256 and SHA-512 as RFC 7677 and Kafka's
//! KIP-84 name them), for the tools' own protocol connections.
//!
//! ```text
//! client-first  n,,n=<user>,r=<client nonce>
//! server-first  r=<client nonce + server nonce>,s=<salt>,i=<iterations>
//! client-final  c=biws,r=<nonce>,p=<ClientKey XOR HMAC(StoredKey, AuthMessage)>
//! server-final  v=<HMAC(ServerKey, AuthMessage)>
//! ```

use anyhow::{Context, bail};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha512};

/// The hash a SCRAM mechanism is built on.
#[derive(Debug, Clone, Copy)]
pub(super) enum ScramHash {
    Sha256,
    Sha512,
}

impl ScramHash {
    fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        match self {
            ScramHash::Sha256 => mac::<Hmac<Sha256>>(key, data),
            ScramHash::Sha512 => mac::<Hmac<Sha512>>(key, data),
        }
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            ScramHash::Sha256 => Sha256::digest(data).to_vec(),
            ScramHash::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    /// `Hi(password, salt, iterations)`: PBKDF2 with this hash's HMAC.
    fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        match self {
            ScramHash::Sha256 => {
                pbkdf2::pbkdf2_hmac_array::<Sha256, 32>(password, salt, iterations).to_vec()
            }
            ScramHash::Sha512 => {
                pbkdf2::pbkdf2_hmac_array::<Sha512, 64>(password, salt, iterations).to_vec()
            }
        }
    }
}

fn mac<M: Mac + hmac::digest::KeyInit>(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac =
        <M as hmac::digest::KeyInit>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// One client exchange: client-first, client-final, then the server's signature checked.
pub(super) struct ScramClient {
    hash: ScramHash,
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
    pub(super) fn new(
        hash: ScramHash,
        username: &str,
        password: &str,
    ) -> anyhow::Result<ScramClient> {
        let mut random = [0u8; 24];
        getrandom::fill(&mut random)
            .map_err(|e| anyhow::anyhow!("no random bytes for a SCRAM nonce: {e}"))?;
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
    pub(super) fn respond(&mut self, challenge: &[u8]) -> anyhow::Result<Option<Vec<u8>>> {
        match std::mem::replace(&mut self.step, Step::Done) {
            Step::First => {
                let client_first_bare = format!("n={},r={}", saslname(&self.username), self.nonce);
                let message = format!("n,,{client_first_bare}").into_bytes();
                self.step = Step::Final { client_first_bare };
                Ok(Some(message))
            }
            Step::Final { client_first_bare } => {
                let server_first = std::str::from_utf8(challenge)
                    .context("the SCRAM server-first message is not UTF-8")?;
                let (nonce, salt, iterations) = parse_server_first(server_first)?;
                if !nonce.starts_with(&self.nonce) || nonce.len() == self.nonce.len() {
                    bail!("the SCRAM server nonce does not extend the client's");
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
                    .context("the SCRAM server-final message is not UTF-8")?;
                if let Some(error) = server_final.strip_prefix("e=") {
                    bail!("the server refused the SCRAM proof: {error}");
                }
                let verifier = server_final
                    .split(',')
                    .find_map(|a| a.strip_prefix("v="))
                    .context("the SCRAM server-final message has no verifier")?;
                if BASE64.decode(verifier).ok().as_deref() != Some(&server_signature[..]) {
                    bail!(
                        "the server's SCRAM signature is wrong: it does not know this user's credentials"
                    );
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
fn parse_server_first(message: &str) -> anyhow::Result<(&str, Vec<u8>, u32)> {
    let (mut nonce, mut salt, mut iterations) = (None, None, None);
    for attribute in message.split(',') {
        match attribute.split_at_checked(2) {
            Some(("r=", v)) => nonce = Some(v),
            Some(("s=", v)) => {
                salt = Some(BASE64.decode(v).context("the SCRAM salt is not base64")?)
            }
            Some(("i=", v)) => {
                iterations = Some(
                    v.parse::<u32>()
                        .context("the SCRAM iteration count is not a number")?,
                )
            }
            Some(("m=", _)) => {
                bail!("the server asks for a SCRAM extension this client does not know")
            }
            _ => {}
        }
    }
    match (nonce, salt, iterations) {
        (Some(n), Some(s), Some(i)) if i > 0 => Ok((n, s, i)),
        _ => bail!(
            "the SCRAM server-first message `{message}` lacks a nonce, salt or iteration count"
        ),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// RFC 7677's example exchange, the client nonce fixed to the RFC's.
    #[test]
    fn computes_the_rfc_7677_client_proof_and_checks_the_server_signature() {
        let mut client = ScramClient::new(ScramHash::Sha256, "user", "pencil").unwrap();
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
        let mut client = ScramClient::new(ScramHash::Sha512, "a,b=c", "pw").unwrap();
        let first = String::from_utf8(client.respond(b"").unwrap().unwrap()).unwrap();
        assert!(first.starts_with("n,,n=a=2Cb=3Dc,r="), "{first}");
        let nonce = first.rsplit_once("r=").unwrap().1.to_owned();
        assert!(client.respond(b"r=other,s=AAAA,i=4096").is_err());
        let mut client = ScramClient::new(ScramHash::Sha512, "u", "pw").unwrap();
        client.nonce = nonce.clone();
        client.respond(b"").unwrap();
        for bad in [&b"garbage"[..], b"r=x", &[0xff, 0xfe]] {
            let mut c = ScramClient::new(ScramHash::Sha256, "u", "pw").unwrap();
            c.respond(b"").unwrap();
            assert!(c.respond(bad).is_err());
        }
        let server_first = format!("r={nonce}srv,s=AAAA,i=4096");
        client.respond(server_first.as_bytes()).unwrap().unwrap();
        let err = client.respond(b"v=AAAA").unwrap_err().to_string();
        assert!(err.contains("signature is wrong"), "{err}");
    }
}
