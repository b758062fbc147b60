//! Who a request comes from: the principal a connection authenticated as, and where it
//! connects from. The connection sets a [`Session`] around every request it serves
//! ([`SESSION`]); handlers read it through [`session`] (for the group member's host, for
//! authorization) without it being threaded through every handler's signature.
//!
//! - `acl`: the ACLs and the authorizer that checks requests against them.
//! - `tls`: TLS listeners and the principal of a client certificate.
//! - `sasl`: a connection's SASL exchange; `scram`: SCRAM credentials and exchanges;
//!   `credentials`: the users SASL checks against.

pub(crate) mod acl;
pub(crate) mod credentials;
pub(crate) mod sasl;
pub(crate) mod scram;
pub(crate) mod tls;

pub use acl::{
    AclBinding, AclOperation, AclPermissionType, CLUSTER_NAME, PatternType, ResourceType,
};
pub(crate) use acl::{AclBindingFilter, Authorizer, Resource, config_error};

use std::fmt;
use std::sync::Arc;

/// A Kafka principal, `User:alice` (Kafka's `KafkaPrincipal`). A connection that did not
/// authenticate is `User:ANONYMOUS`; one authenticated by a TLS client certificate is named
/// by the certificate's distinguished name, as Kafka's default principal builder does.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Principal {
    /// The principal type; Kafka's only built-in one is `User`.
    pub(crate) kind: String,
    /// The user name (or certificate subject).
    pub(crate) name: String,
}

impl Principal {
    /// A `User:` principal.
    pub(crate) fn user(name: impl Into<String>) -> Principal {
        Principal {
            kind: "User".into(),
            name: name.into(),
        }
    }

    /// `User:ANONYMOUS`, the principal of an unauthenticated connection.
    pub(crate) fn anonymous() -> Principal {
        Principal::user("ANONYMOUS")
    }

    /// Parses `Type:name` (`User:alice`; the name may itself hold colons).
    pub(crate) fn parse(text: &str) -> Option<Principal> {
        let (kind, name) = text.split_once(':')?;
        (!kind.is_empty() && !name.is_empty()).then(|| Principal {
            kind: kind.into(),
            name: name.into(),
        })
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind, self.name)
    }
}

/// The caller of one request.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    /// Who it authenticated as.
    pub(crate) principal: Principal,
    /// The client's address as Kafka shows it in DescribeGroups (`/127.0.0.1`).
    pub(crate) client_host: String,
    /// The client's IP address as ACLs match it (`127.0.0.1`).
    pub(crate) ip: String,
    /// The `host:port` of the listener the connection arrived on, as its clients are to
    /// reach this broker (Metadata, FindCoordinator, DescribeCluster); `None` outside a
    /// connection.
    pub(crate) advertised: Option<(String, i32)>,
}

impl Session {
    /// An unauthenticated session from `peer`.
    pub(crate) fn anonymous(peer: std::net::SocketAddr) -> Session {
        Session {
            principal: Principal::anonymous(),
            client_host: format!("/{}", peer.ip()),
            ip: peer.ip().to_string(),
            advertised: None,
        }
    }
}

tokio::task_local! {
    /// The session of the request being served, set by the connection around each request.
    pub(crate) static SESSION: Arc<Session>;
}

/// The session of the request being served; outside a connection (tests calling handlers
/// directly, background tasks) an anonymous session from nowhere.
pub(crate) fn session() -> Arc<Session> {
    SESSION.try_with(Arc::clone).unwrap_or_else(|_| {
        Arc::new(Session {
            principal: Principal::anonymous(),
            client_host: String::new(),
            ip: String::new(),
            advertised: None,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn principals_parse_and_print_as_kafka_writes_them() {
        let p = Principal::parse("User:CN=client,O=ferry").unwrap();
        assert_eq!(p.kind, "User");
        assert_eq!(p.name, "CN=client,O=ferry");
        assert_eq!(p.to_string(), "User:CN=client,O=ferry");
        assert_eq!(Principal::anonymous().to_string(), "User:ANONYMOUS");
        assert!(Principal::parse("alice").is_none());
        assert!(Principal::parse("User:").is_none());
    }
}
