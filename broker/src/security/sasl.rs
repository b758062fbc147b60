//! SASL authentication of one connection on a `sasl_*` listener (Kafka's
//! `SaslServerAuthenticator`), without I/O:
//!
//! ```text
//! AwaitingHandshake --SaslHandshake(mechanism enabled)--> Handshaken
//! Handshaken --SaslAuthenticate(PLAIN, right password)--> Authenticated
//! Handshaken --SaslAuthenticate(SCRAM client-first)--> Scram --SaslAuthenticate(client-final)--> Authenticated
//! any other step, or a failed one --> Failed (the connection is closed after the response)
//! ```
//!
//! Until it is `Authenticated` a connection is served ApiVersions, SaslHandshake and
//! SaslAuthenticate only (the connection enforces it). The client is only ever told
//! Kafka's "invalid credentials" message; why is in the broker's log, never with a password.

use super::Principal;
use super::credentials::Credentials;
use super::scram::{ScramError, ScramMechanism, ScramServer};
use crate::config::SaslMechanism;

/// A connection's authentication state.
pub(crate) struct Authenticator {
    enabled: Vec<SaslMechanism>,
    state: State,
}

enum State {
    AwaitingHandshake,
    Handshaken(SaslMechanism),
    Scram(ScramServer),
    Authenticated,
    Failed,
}

/// Why a SaslHandshake is refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum HandshakeRefusal {
    /// Not an enabled mechanism: the enabled ones are listed to the client.
    Unsupported,
    /// A handshake was already made on this connection.
    IllegalState,
}

/// The outcome of one SaslAuthenticate.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// The exchange goes on: these bytes go to the client.
    Continue(Vec<u8>),
    /// Authenticated as `principal`; the last bytes go to the client.
    Done {
        principal: Principal,
        reply: Vec<u8>,
    },
    /// Refused (wrong credentials, malformed message); the connection is closed after the
    /// error response.
    Failed {
        mechanism: Option<SaslMechanism>,
        reason: String,
    },
    /// A SaslAuthenticate without a handshake first.
    IllegalState,
}

impl Authenticator {
    pub(crate) fn new(enabled: Vec<SaslMechanism>) -> Authenticator {
        Authenticator {
            enabled,
            state: State::AwaitingHandshake,
        }
    }

    /// The enabled mechanisms' names.
    pub(crate) fn enabled(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.enabled.iter().map(|m| m.name())
    }

    pub(crate) fn is_authenticated(&self) -> bool {
        matches!(self.state, State::Authenticated)
    }

    /// SaslHandshake: picks `mechanism` for the exchange.
    pub(crate) fn handshake(&mut self, mechanism: &str) -> Result<(), HandshakeRefusal> {
        if !matches!(self.state, State::AwaitingHandshake) {
            self.state = State::Failed;
            return Err(HandshakeRefusal::IllegalState);
        }
        match SaslMechanism::from_name(mechanism).filter(|m| self.enabled.contains(m)) {
            Some(m) => {
                self.state = State::Handshaken(m);
                Ok(())
            }
            None => {
                self.state = State::Failed;
                Err(HandshakeRefusal::Unsupported)
            }
        }
    }

    /// SaslAuthenticate: one message of the exchange.
    pub(crate) fn authenticate(&mut self, bytes: &[u8], credentials: &Credentials) -> Step {
        match std::mem::replace(&mut self.state, State::Failed) {
            State::Handshaken(SaslMechanism::Plain) => match plain(bytes, credentials) {
                Ok(user) => {
                    self.state = State::Authenticated;
                    Step::Done {
                        principal: Principal::user(user),
                        reply: Vec::new(),
                    }
                }
                Err(reason) => Step::Failed {
                    mechanism: Some(SaslMechanism::Plain),
                    reason,
                },
            },
            State::Handshaken(m @ (SaslMechanism::ScramSha256 | SaslMechanism::ScramSha512)) => {
                let scram = if m == SaslMechanism::ScramSha256 {
                    ScramMechanism::Sha256
                } else {
                    ScramMechanism::Sha512
                };
                let mut server = ScramServer::new(scram);
                match server.client_first(bytes, |user| credentials.lookup(user, scram)) {
                    Ok(reply) => {
                        self.state = State::Scram(server);
                        Step::Continue(reply)
                    }
                    Err(e) => scram_failed(m, &e),
                }
            }
            State::Scram(mut server) => {
                let mechanism = match server.mechanism() {
                    ScramMechanism::Sha256 => SaslMechanism::ScramSha256,
                    ScramMechanism::Sha512 => SaslMechanism::ScramSha512,
                };
                match server.client_final(bytes) {
                    Ok((user, reply)) => {
                        self.state = State::Authenticated;
                        Step::Done {
                            principal: Principal::user(user),
                            reply,
                        }
                    }
                    Err(e) => scram_failed(mechanism, &e),
                }
            }
            State::AwaitingHandshake | State::Authenticated | State::Failed => Step::IllegalState,
        }
    }
}

fn scram_failed(mechanism: SaslMechanism, e: &ScramError) -> Step {
    Step::Failed {
        mechanism: Some(mechanism),
        reason: e.to_string(),
    }
}

/// Kafka's message for any failed exchange.
pub(crate) fn failure_message(mechanism: Option<SaslMechanism>) -> String {
    match mechanism {
        Some(m) => format!(
            "Authentication failed during authentication due to invalid credentials with SASL \
             mechanism {m}"
        ),
        None => "Authentication failed during authentication due to invalid credentials".into(),
    }
}

/// RFC 4616: `[authzid] NUL authcid NUL passwd`, checked against the user's SCRAM
/// credential. The error never holds the password.
fn plain(message: &[u8], credentials: &Credentials) -> Result<String, String> {
    let text = std::str::from_utf8(message)
        .map_err(|_| "malformed PLAIN message: not UTF-8".to_owned())?;
    let mut parts = text.split('\0');
    let (Some(authzid), Some(user), Some(password), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("malformed PLAIN message: expected authzid NUL authcid NUL password".into());
    };
    if user.is_empty() || password.is_empty() {
        return Err("malformed PLAIN message: empty user name or password".into());
    }
    if !authzid.is_empty() && authzid != user {
        return Err(format!(
            "authorization id `{authzid}` differs from user `{user}`"
        ));
    }
    let credential = ScramMechanism::ALL
        .into_iter()
        .find_map(|m| credentials.lookup(user, m))
        .ok_or_else(|| format!("unknown user `{user}`"))?;
    if credential.matches_password(password) {
        Ok(user.to_owned())
    } else {
        Err(format!("wrong password for user `{user}`"))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::catalog::Catalog;
    use crate::config::{Password, UserConfig};

    fn credentials(dir: &std::path::Path) -> Credentials {
        let users = [UserConfig {
            name: "alice".into(),
            password: Password::new("alice-secret"),
        }];
        Credentials::new(&users, Arc::new(Catalog::open(dir).unwrap())).unwrap()
    }

    #[test]
    fn plain_authenticates_against_the_scram_credential() {
        let dir = tempfile::tempdir().unwrap();
        let credentials = credentials(dir.path());
        let mut auth = Authenticator::new(SaslMechanism::ALL.to_vec());
        auth.handshake("PLAIN").unwrap();
        assert_eq!(
            auth.authenticate(b"\0alice\0alice-secret", &credentials),
            Step::Done {
                principal: Principal::user("alice"),
                reply: Vec::new()
            }
        );
        assert!(auth.is_authenticated());
        for (message, why) in [
            (&b"\0alice\0wrong"[..], "wrong password"),
            (b"\0bob\0alice-secret", "unknown user"),
            (b"admin\0alice\0alice-secret", "authorization id"),
            (b"alice\0alice-secret", "malformed"),
            (b"\0alice\0alice-secret\0x", "malformed"),
            (b"\0\0", "malformed"),
        ] {
            let mut auth = Authenticator::new(SaslMechanism::ALL.to_vec());
            auth.handshake("plain").unwrap();
            match auth.authenticate(message, &credentials) {
                Step::Failed { reason, .. } => {
                    assert!(reason.contains(why), "{reason}");
                    assert!(!reason.contains("secret"), "{reason}");
                }
                other => panic!("{other:?}"),
            }
            assert!(!auth.is_authenticated());
        }
    }

    #[test]
    fn handshake_refuses_mechanisms_not_enabled_and_a_second_handshake() {
        let mut auth = Authenticator::new(vec![SaslMechanism::ScramSha512]);
        assert_eq!(auth.handshake("PLAIN"), Err(HandshakeRefusal::Unsupported));
        assert_eq!(auth.enabled().collect::<Vec<_>>(), ["SCRAM-SHA-512"]);
        let mut auth = Authenticator::new(vec![SaslMechanism::ScramSha512]);
        auth.handshake("SCRAM-SHA-512").unwrap();
        assert_eq!(
            auth.handshake("SCRAM-SHA-512"),
            Err(HandshakeRefusal::IllegalState)
        );
        let mut auth = Authenticator::new(vec![SaslMechanism::Plain]);
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            auth.authenticate(b"\0a\0b", &credentials(dir.path())),
            Step::IllegalState
        );
    }

    #[test]
    fn scram_exchange_through_the_authenticator() {
        let dir = tempfile::tempdir().unwrap();
        let credentials = credentials(dir.path());
        let mut auth = Authenticator::new(SaslMechanism::ALL.to_vec());
        auth.handshake("SCRAM-SHA-512").unwrap();
        let bare = "n=alice,r=client-nonce";
        let Step::Continue(first) =
            auth.authenticate(format!("n,,{bare}").as_bytes(), &credentials)
        else {
            panic!("no server-first")
        };
        let first = String::from_utf8(first).unwrap();
        assert!(first.contains(",i=4096"), "{first}");
        let last = crate::security::scram::tests::client_final(
            ScramMechanism::Sha512,
            "alice-secret",
            bare,
            &first,
        );
        assert!(matches!(
            auth.authenticate(last.as_bytes(), &credentials),
            Step::Done { principal, .. } if principal == Principal::user("alice")
        ));
    }
}
