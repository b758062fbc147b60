//! The users SASL authenticates: those of the configuration (`users:`), salted in memory at
//! start, and those stored in the metadata database by AlterUserScramCredentials. A configured
//! user is looked up first; the configuration cannot be altered through the API.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::scram::{DEFAULT_ITERATIONS, ScramCredential, ScramMechanism};
use crate::catalog::{Catalog, CatalogError};
use crate::config::UserConfig;

/// Every user's SCRAM credentials.
pub(crate) struct Credentials {
    configured: BTreeMap<(String, ScramMechanism), ScramCredential>,
    catalog: Arc<Catalog>,
}

impl Credentials {
    /// Salts the configured users' passwords (for each SCRAM mechanism); the plain text is
    /// not kept.
    pub(crate) fn new(
        users: &[UserConfig],
        catalog: Arc<Catalog>,
    ) -> Result<Credentials, getrandom::Error> {
        let mut configured = BTreeMap::new();
        for user in users {
            for mechanism in ScramMechanism::ALL {
                let credential = ScramCredential::from_password(
                    mechanism,
                    user.password.expose(),
                    DEFAULT_ITERATIONS,
                )?;
                configured.insert((user.name.clone(), mechanism), credential);
            }
        }
        Ok(Credentials {
            configured,
            catalog,
        })
    }

    /// The credential of `user` for `mechanism`, configured or stored. A database failure is
    /// logged and counts as no credential: authentication fails rather than lets anyone in.
    pub(crate) fn lookup(&self, user: &str, mechanism: ScramMechanism) -> Option<ScramCredential> {
        if let Some(credential) = self.configured.get(&(user.to_owned(), mechanism)) {
            return Some(credential.clone());
        }
        match self.catalog.scram_credential(user, mechanism) {
            Ok(credential) => credential,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read SCRAM credentials");
                None
            }
        }
    }

    /// Whether `user` is defined in the configuration (and so not alterable).
    pub(crate) fn is_configured(&self, user: &str) -> bool {
        self.configured.keys().any(|(name, _)| name == user)
    }

    /// Every user, configured or stored, with its mechanisms and iterations.
    pub(crate) fn users(
        &self,
    ) -> Result<BTreeMap<String, Vec<(ScramMechanism, i32)>>, CatalogError> {
        let mut users = self.catalog.scram_users()?;
        for ((name, mechanism), credential) in &self.configured {
            let entry = users.entry(name.clone()).or_default();
            entry.retain(|(m, _)| m != mechanism);
            entry.push((*mechanism, credential.iterations));
            entry.sort();
        }
        Ok(users)
    }

    /// The metadata database the stored credentials live in.
    pub(crate) fn catalog(&self) -> &Catalog {
        &self.catalog
    }
}
