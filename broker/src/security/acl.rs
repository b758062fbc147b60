//! ACLs: who may do what on which resource, decided as Kafka's authorizer decides
//! (`AclAuthorizer`, `StandardAuthorizer`).
//!
//! A binding is a resource pattern (type, name, literal or prefixed) and an entry (principal,
//! host, operation, allow or deny). For a request of `operation` on a resource:
//!
//! 1. a principal in `super_users` is allowed;
//! 2. the bindings matching the resource are those whose pattern is the literal name, the
//!    literal wildcard `*`, or a prefix of the name; if there are none at all (whoever they are
//!    for), `allow_everyone_if_no_acl_found` decides;
//! 3. of those, the entries for the caller are the ones whose principal is its own or `User:*`
//!    and whose host is its IP or `*`;
//! 4. an entry denying the operation (or `All`) denies: deny wins over allow;
//! 5. otherwise an entry allowing the operation (or `All`) allows, where Describe is also
//!    allowed by Read, Write, Delete or Alter, and DescribeConfigs by AlterConfigs;
//! 6. otherwise denied.
//!
//! The bindings live in the catalog (`acls` table) and, for the checks, in an in-memory index
//! behind a read-write lock: a check takes the read lock and does a few hash lookups, never
//! SQLite work. Changes (CreateAcls, DeleteAcls) are serialised by their own lock, written to
//! SQLite first, then swapped into the index.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, RwLock};

use serde::Deserialize;

use super::{Principal, Session};
use crate::catalog::{Catalog, CatalogError};
use crate::config::BrokerConfig;

/// The name of the one cluster resource (Kafka's `kafka-cluster`).
pub const CLUSTER_NAME: &str = "kafka-cluster";
/// The literal resource name that matches every resource of its type.
const WILDCARD: &str = "*";

/// An enum of Kafka's ACL vocabulary: its protocol codes and the names Kafka's tools print.
macro_rules! kafka_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $code:literal, $text:literal;)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name {
            $($(#[$vdoc])* $variant,)*
        }

        impl $name {
            /// Every value.
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            /// The protocol code.
            pub const fn code(self) -> i8 {
                match self {
                    $($name::$variant => $code,)*
                }
            }

            /// The value of a protocol code.
            pub fn from_code(code: i8) -> Option<$name> {
                match code {
                    $($code => Some($name::$variant),)*
                    _ => None,
                }
            }

            /// Kafka's name, as its tools print it (`TOPIC`, `DESCRIBE_CONFIGS`).
            pub const fn kafka_name(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)*
                }
            }

            /// The value named `text`, in any case, with or without underscores
            /// (`Read`, `describe_configs`, `DescribeConfigs`).
            pub fn from_name(text: &str) -> Option<$name> {
                let wanted: String = text
                    .chars()
                    .filter(|c| *c != '_' && *c != '-')
                    .map(|c| c.to_ascii_uppercase())
                    .collect();
                Self::ALL
                    .iter()
                    .copied()
                    .find(|v| v.kafka_name().replace('_', "") == wanted)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.kafka_name())
            }
        }
    };
}

kafka_enum! {
    /// A kind of resource an ACL protects (Kafka's `ResourceType`).
    ResourceType {
        /// A topic.
        Topic = 2, "TOPIC";
        /// A consumer group.
        Group = 3, "GROUP";
        /// The cluster, named `kafka-cluster`.
        Cluster = 4, "CLUSTER";
        /// A transactional producer's id.
        TransactionalId = 5, "TRANSACTIONAL_ID";
    }
}

kafka_enum! {
    /// How a binding's resource name matches (Kafka's `PatternType`).
    PatternType {
        /// The exact name; `*` matches every name.
        Literal = 3, "LITERAL";
        /// Every name starting with it.
        Prefixed = 4, "PREFIXED";
    }
}

kafka_enum! {
    /// What a binding allows or denies (Kafka's `AclOperation`).
    AclOperation {
        /// Every operation.
        All = 2, "ALL";
        /// Fetch, commit offsets, join a group.
        Read = 3, "READ";
        /// Produce, write in a transaction.
        Write = 4, "WRITE";
        /// Create topics.
        Create = 5, "CREATE";
        /// Delete topics, groups, offsets.
        Delete = 6, "DELETE";
        /// Add partitions, change ACLs.
        Alter = 7, "ALTER";
        /// See metadata, offsets, groups, transactions, ACLs.
        Describe = 8, "DESCRIBE";
        /// Inter-broker requests.
        ClusterAction = 9, "CLUSTER_ACTION";
        /// Read configs.
        DescribeConfigs = 10, "DESCRIBE_CONFIGS";
        /// Change configs.
        AlterConfigs = 11, "ALTER_CONFIGS";
        /// Be an idempotent producer.
        IdempotentWrite = 12, "IDEMPOTENT_WRITE";
    }
}

kafka_enum! {
    /// Whether a binding allows or denies (Kafka's `AclPermissionType`).
    AclPermissionType {
        /// Denies, whatever else allows.
        Deny = 2, "DENY";
        /// Allows, unless something denies.
        Allow = 3, "ALLOW";
    }
}

impl AclOperation {
    /// The operations whose allowance also allows this one.
    fn allowed_by(self) -> &'static [AclOperation] {
        use AclOperation::*;
        match self {
            Describe => &[Describe, Read, Write, Delete, Alter],
            DescribeConfigs => &[DescribeConfigs, AlterConfigs],
            Read => &[Read],
            Write => &[Write],
            Create => &[Create],
            Delete => &[Delete],
            Alter => &[Alter],
            ClusterAction => &[ClusterAction],
            AlterConfigs => &[AlterConfigs],
            IdempotentWrite => &[IdempotentWrite],
            All => &[All],
        }
    }

    /// Whether a binding for `self` covers a request for `wanted`.
    fn covers(self, wanted: AclOperation) -> bool {
        self == wanted || self == AclOperation::All
    }
}

impl ResourceType {
    /// The operations an ACL on this kind of resource may name (Kafka's
    /// `AclEntry.supportedOperations`).
    pub fn operations(self) -> &'static [AclOperation] {
        use AclOperation::*;
        match self {
            ResourceType::Topic => &[
                Read,
                Write,
                Create,
                Describe,
                Delete,
                Alter,
                DescribeConfigs,
                AlterConfigs,
                All,
            ],
            ResourceType::Group => &[Read, Describe, Delete, All],
            ResourceType::Cluster => &[
                Create,
                ClusterAction,
                DescribeConfigs,
                AlterConfigs,
                IdempotentWrite,
                Alter,
                Describe,
                All,
            ],
            ResourceType::TransactionalId => &[Describe, Write, All],
        }
    }
}

fn any_host() -> String {
    WILDCARD.into()
}

fn literal() -> PatternType {
    PatternType::Literal
}

fn allow() -> AclPermissionType {
    AclPermissionType::Allow
}

/// One ACL (Kafka's `AclBinding`): a resource pattern and who may or may not do what on it
/// from where. As a config entry (`acls:`), `pattern_type` defaults to `literal`, `host` to
/// `*` and `permission_type` to `allow`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AclBinding {
    /// The kind of resource.
    pub resource_type: ResourceType,
    /// The resource's name, its prefix, or `*` (literal) for all; `kafka-cluster` for the
    /// cluster.
    pub resource_name: String,
    /// How `resource_name` matches.
    #[serde(default = "literal")]
    pub pattern_type: PatternType,
    /// `User:alice`, or `User:*` for everyone.
    pub principal: String,
    /// The client IP address the entry applies to, or `*` for any.
    #[serde(default = "any_host")]
    pub host: String,
    /// The operation.
    pub operation: AclOperation,
    /// Allow or deny.
    #[serde(default = "allow")]
    pub permission_type: AclPermissionType,
}

impl AclBinding {
    /// Why Kafka would refuse to create this binding, if it would.
    pub fn invalid(&self) -> Option<String> {
        if self.resource_name.is_empty() {
            return Some("the resource name is empty".into());
        }
        if self.resource_type == ResourceType::Cluster && self.resource_name != CLUSTER_NAME {
            return Some(format!(
                "the only valid name for the CLUSTER resource is {CLUSTER_NAME}"
            ));
        }
        if Principal::parse(&self.principal).is_none() {
            return Some(format!(
                "principal `{}` is not of the form Type:name (User:alice)",
                self.principal
            ));
        }
        if self.host.is_empty() {
            return Some("the host is empty (use * for any host)".into());
        }
        if !self.resource_type.operations().contains(&self.operation) {
            return Some(format!(
                "operation {} is not valid on a {} resource",
                self.operation, self.resource_type
            ));
        }
        None
    }
}

/// How a filter matches resource patterns (Kafka's filter pattern types).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatternFilter {
    /// Any pattern type, the name compared exactly (`ANY`, code 1).
    Any,
    /// Every pattern that would apply to a resource of that name (`MATCH`, code 2).
    Match,
    /// Exactly this pattern type.
    Exact(PatternType),
}

/// A filter over bindings (Kafka's `AclBindingFilter`); `None` matches anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AclBindingFilter {
    pub(crate) resource_type: Option<ResourceType>,
    pub(crate) resource_name: Option<String>,
    pub(crate) pattern_type: PatternFilter,
    pub(crate) principal: Option<String>,
    pub(crate) host: Option<String>,
    pub(crate) operation: Option<AclOperation>,
    pub(crate) permission_type: Option<AclPermissionType>,
}

/// The protocol's `ANY` code of every ACL enum.
const ANY: i8 = 1;
/// The protocol's `MATCH` pattern type code.
const MATCH: i8 = 2;

/// `None` for ANY, `Some` for a known code, `Err` for an unknown one.
fn any_or<T>(code: i8, from_code: fn(i8) -> Option<T>) -> Result<Option<T>, String> {
    if code == ANY {
        return Ok(None);
    }
    from_code(code)
        .map(Some)
        .ok_or_else(|| format!("unknown code {code}"))
}

impl AclBindingFilter {
    /// A filter from the fields of a DescribeAcls request or a DeleteAcls filter.
    pub(crate) fn from_codes(
        resource_type: i8,
        resource_name: Option<&str>,
        pattern_type: i8,
        principal: Option<&str>,
        host: Option<&str>,
        operation: i8,
        permission_type: i8,
    ) -> Result<AclBindingFilter, String> {
        let pattern_type = match pattern_type {
            ANY => PatternFilter::Any,
            MATCH => PatternFilter::Match,
            code => PatternFilter::Exact(
                PatternType::from_code(code)
                    .ok_or_else(|| format!("unknown pattern type {code}"))?,
            ),
        };
        Ok(AclBindingFilter {
            resource_type: any_or(resource_type, ResourceType::from_code)
                .map_err(|e| format!("resource type: {e}"))?,
            resource_name: resource_name.map(str::to_owned),
            pattern_type,
            principal: principal.map(str::to_owned),
            host: host.map(str::to_owned),
            operation: any_or(operation, AclOperation::from_code)
                .map_err(|e| format!("operation: {e}"))?,
            permission_type: any_or(permission_type, AclPermissionType::from_code)
                .map_err(|e| format!("permission type: {e}"))?,
        })
    }

    /// Whether `binding` passes (Kafka's `ResourcePatternFilter.matches` and
    /// `AccessControlEntryFilter.matches`).
    pub(crate) fn matches(&self, binding: &AclBinding) -> bool {
        let equal =
            |filter: &Option<String>, value: &str| filter.as_deref().is_none_or(|f| f == value);
        self.resource_type
            .is_none_or(|t| t == binding.resource_type)
            && self.matches_name(binding)
            && equal(&self.principal, &binding.principal)
            && equal(&self.host, &binding.host)
            && self.operation.is_none_or(|o| o == binding.operation)
            && self
                .permission_type
                .is_none_or(|p| p == binding.permission_type)
    }

    fn matches_name(&self, binding: &AclBinding) -> bool {
        if let PatternFilter::Exact(pattern) = self.pattern_type
            && pattern != binding.pattern_type
        {
            return false;
        }
        let Some(name) = &self.resource_name else {
            return true;
        };
        match (self.pattern_type, binding.pattern_type) {
            (PatternFilter::Match, PatternType::Literal) => {
                *name == binding.resource_name || binding.resource_name == WILDCARD
            }
            (PatternFilter::Match, PatternType::Prefixed) => {
                name.starts_with(&binding.resource_name)
            }
            _ => *name == binding.resource_name,
        }
    }
}

/// A resource a request acts on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Resource<'a> {
    pub(crate) resource_type: ResourceType,
    pub(crate) name: &'a str,
}

impl<'a> Resource<'a> {
    pub(crate) fn topic(name: &'a str) -> Resource<'a> {
        Resource {
            resource_type: ResourceType::Topic,
            name,
        }
    }

    pub(crate) fn group(name: &'a str) -> Resource<'a> {
        Resource {
            resource_type: ResourceType::Group,
            name,
        }
    }

    pub(crate) fn transactional_id(name: &'a str) -> Resource<'a> {
        Resource {
            resource_type: ResourceType::TransactionalId,
            name,
        }
    }

    pub(crate) fn cluster() -> Resource<'static> {
        Resource {
            resource_type: ResourceType::Cluster,
            name: CLUSTER_NAME,
        }
    }
}

impl fmt::Display for Resource<'_> {
    /// As Kafka's authorizer log shows a resource: `Topic:LITERAL:logs`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.resource_type {
            ResourceType::Topic => "Topic",
            ResourceType::Group => "Group",
            ResourceType::Cluster => "Cluster",
            ResourceType::TransactionalId => "TransactionalId",
        };
        write!(f, "{kind}:LITERAL:{}", self.name)
    }
}

/// A binding's entry, as the index keeps it under its resource pattern.
#[derive(Debug)]
struct Entry {
    principal: Principal,
    host: String,
    operation: AclOperation,
    permission_type: AclPermissionType,
}

impl Entry {
    /// Whether the entry is about the caller of `session`.
    fn applies_to(&self, session: &Session) -> bool {
        let principal = self.principal == session.principal
            || (self.principal.kind == "User" && self.principal.name == WILDCARD);
        principal && (self.host == WILDCARD || self.host == session.ip)
    }
}

/// The entries of one resource type, by literal name and by prefix.
#[derive(Debug, Default)]
struct TypeIndex {
    literal: HashMap<String, Vec<Entry>>,
    prefixed: HashMap<String, Vec<Entry>>,
}

/// Every binding, and the same indexed for checks.
#[derive(Debug, Default)]
struct Index {
    bindings: BTreeSet<AclBinding>,
    by_type: HashMap<ResourceType, TypeIndex>,
}

impl Index {
    fn new(bindings: BTreeSet<AclBinding>) -> Index {
        let mut by_type: HashMap<ResourceType, TypeIndex> = HashMap::new();
        for b in &bindings {
            // Stored bindings were validated when created; a principal that does not parse
            // cannot match anyone.
            let Some(principal) = Principal::parse(&b.principal) else {
                continue;
            };
            let index = by_type.entry(b.resource_type).or_default();
            let names = match b.pattern_type {
                PatternType::Literal => &mut index.literal,
                PatternType::Prefixed => &mut index.prefixed,
            };
            names
                .entry(b.resource_name.clone())
                .or_default()
                .push(Entry {
                    principal,
                    host: b.host.clone(),
                    operation: b.operation,
                    permission_type: b.permission_type,
                });
        }
        Index { bindings, by_type }
    }

    /// Calls `f` with every entry whose pattern matches `resource`.
    fn visit(&self, resource: Resource<'_>, mut f: impl FnMut(&Entry)) {
        let Some(index) = self.by_type.get(&resource.resource_type) else {
            return;
        };
        let name = resource.name;
        let mut visit =
            |entries: Option<&Vec<Entry>>| entries.into_iter().flatten().for_each(&mut f);
        visit(index.literal.get(name));
        if name != WILDCARD {
            visit(index.literal.get(WILDCARD));
        }
        if !index.prefixed.is_empty() {
            for (at, c) in name.char_indices() {
                visit(index.prefixed.get(&name[..at + c.len_utf8()]));
            }
        }
    }
}

/// Decides whether a request may act on a resource, from the ACLs (see the module docs).
pub(crate) struct Authorizer {
    catalog: Arc<Catalog>,
    super_users: Vec<Principal>,
    allow_everyone_if_no_acl_found: bool,
    index: RwLock<Arc<Index>>,
    /// Serialises changes, so that the hot path's read lock never waits for SQLite.
    changes: Mutex<()>,
}

impl Authorizer {
    /// The stored ACLs, with those of `config.acls` added (and stored) if missing.
    pub(crate) fn load(
        config: &BrokerConfig,
        catalog: Arc<Catalog>,
    ) -> Result<Authorizer, CatalogError> {
        let mut bindings: BTreeSet<AclBinding> = catalog.acls()?.into_iter().collect();
        let missing: Vec<AclBinding> = config
            .acls
            .iter()
            .filter(|b| !bindings.contains(*b))
            .cloned()
            .collect();
        if !missing.is_empty() {
            catalog.add_acls(&missing)?;
            bindings.extend(missing);
        }
        Ok(Authorizer {
            catalog,
            super_users: config
                .super_users
                .iter()
                .filter_map(|p| Principal::parse(p))
                .collect(),
            allow_everyone_if_no_acl_found: config.allow_everyone_if_no_acl_found,
            index: RwLock::new(Arc::new(Index::new(bindings))),
            changes: Mutex::new(()),
        })
    }

    fn index(&self) -> Arc<Index> {
        Arc::clone(&self.index.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Whether the caller of `session` may perform `operation` on `resource`.
    pub(crate) fn authorize(
        &self,
        session: &Session,
        operation: AclOperation,
        resource: Resource<'_>,
    ) -> bool {
        #[cfg(test)]
        tests::AUTHORIZED.with(|n| n.set(n.get() + 1));
        if self.super_users.contains(&session.principal) {
            return true;
        }
        let index = self.index.read().unwrap_or_else(|p| p.into_inner());
        if index.bindings.is_empty() {
            return self.allow_everyone_if_no_acl_found;
        }
        let (mut found, mut denied, mut allowed) = (false, false, false);
        index.visit(resource, |entry| {
            found = true;
            if !entry.applies_to(session) {
                return;
            }
            match entry.permission_type {
                AclPermissionType::Deny => denied |= entry.operation.covers(operation),
                AclPermissionType::Allow => {
                    allowed |= operation
                        .allowed_by()
                        .iter()
                        .any(|op| entry.operation.covers(*op));
                }
            }
        });
        if !found {
            self.allow_everyone_if_no_acl_found
        } else {
            allowed && !denied
        }
    }

    /// Whether the caller may perform `operation` on some resource of `resource_type` (Kafka's
    /// `authorizeByResourceType`, used for an idempotent producer's Write on any topic): a
    /// literal name or prefix allowed for it that no deny for it dominates.
    pub(crate) fn authorize_any(
        &self,
        session: &Session,
        operation: AclOperation,
        resource_type: ResourceType,
    ) -> bool {
        // Super users, and a resource type without any ACL when everyone is allowed then, as
        // Kafka checks with a made-up name.
        let probe = Resource {
            resource_type,
            name: "hardcode",
        };
        if self.authorize(session, operation, probe) {
            return true;
        }
        let index = self.index();
        let mut denied: HashMap<PatternType, BTreeSet<&str>> = HashMap::new();
        let mut allowed: Vec<(PatternType, &str)> = Vec::new();
        for b in &index.bindings {
            let applies = b.resource_type == resource_type
                && b.operation.covers(operation)
                && (b.host == WILDCARD || b.host == session.ip)
                && (b.principal == "User:*"
                    || Principal::parse(&b.principal).as_ref() == Some(&session.principal));
            if !applies {
                continue;
            }
            let everything = match b.pattern_type {
                PatternType::Literal => b.resource_name == WILDCARD,
                PatternType::Prefixed => b.resource_name.is_empty(),
            };
            match b.permission_type {
                AclPermissionType::Deny if everything => return false,
                AclPermissionType::Deny => {
                    denied
                        .entry(b.pattern_type)
                        .or_default()
                        .insert(&b.resource_name);
                }
                AclPermissionType::Allow if everything => return true,
                AclPermissionType::Allow => allowed.push((b.pattern_type, &b.resource_name)),
            }
        }
        let denied_literal = denied.get(&PatternType::Literal);
        let denied_prefixes = denied.get(&PatternType::Prefixed);
        allowed.iter().any(|(pattern, name)| {
            if *pattern == PatternType::Literal && denied_literal.is_some_and(|d| d.contains(name))
            {
                return false;
            }
            !name.char_indices().any(|(at, c)| {
                denied_prefixes.is_some_and(|d| d.contains(&name[..at + c.len_utf8()]))
            })
        })
    }

    /// The bindings `filter` matches, sorted.
    pub(crate) fn describe(&self, filter: &AclBindingFilter) -> Vec<AclBinding> {
        self.index()
            .bindings
            .iter()
            .filter(|b| filter.matches(b))
            .cloned()
            .collect()
    }

    /// Stores new bindings (already there ones are kept once).
    pub(crate) fn create(&self, new: &[AclBinding]) -> Result<(), CatalogError> {
        let _change = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        self.catalog.add_acls(new)?;
        let mut bindings = self.index().bindings.clone();
        bindings.extend(new.iter().cloned());
        self.swap(bindings);
        Ok(())
    }

    /// Deletes the bindings each filter matches; returns them per filter (a binding matched by
    /// several filters is reported with the first, as Kafka does).
    pub(crate) fn delete(
        &self,
        filters: &[AclBindingFilter],
    ) -> Result<Vec<Vec<AclBinding>>, CatalogError> {
        let _change = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        let mut bindings = self.index().bindings.clone();
        let mut deleted: Vec<Vec<AclBinding>> = vec![Vec::new(); filters.len()];
        bindings.retain(|b| match filters.iter().position(|f| f.matches(b)) {
            Some(i) => {
                deleted[i].push(b.clone());
                false
            }
            None => true,
        });
        let all: Vec<AclBinding> = deleted.iter().flatten().cloned().collect();
        if !all.is_empty() {
            self.catalog.delete_acls(&all)?;
            self.swap(bindings);
        }
        Ok(deleted)
    }

    fn swap(&self, bindings: BTreeSet<AclBinding>) {
        let index = Arc::new(Index::new(bindings));
        *self.index.write().unwrap_or_else(|p| p.into_inner()) = index;
    }
}

/// Why the security settings of `config` cannot be used, if they cannot.
pub(crate) fn config_error(config: &BrokerConfig) -> Option<String> {
    if let Some(bad) = config
        .super_users
        .iter()
        .find(|p| Principal::parse(p).is_none())
    {
        return Some(format!(
            "super_users: `{bad}` is not a principal of the form Type:name (User:alice)"
        ));
    }
    config.acls.iter().enumerate().find_map(|(i, b)| {
        b.invalid().map(|why| {
            format!(
                "acls[{i}] ({} `{}`): {why}",
                b.resource_type, b.resource_name
            )
        })
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    thread_local! {
        /// Authorization decisions taken on this thread (a test's runtime has one thread).
        pub(crate) static AUTHORIZED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    fn binding(
        resource_type: ResourceType,
        name: &str,
        pattern_type: PatternType,
        principal: &str,
        operation: AclOperation,
        permission_type: AclPermissionType,
    ) -> AclBinding {
        AclBinding {
            resource_type,
            resource_name: name.into(),
            pattern_type,
            principal: principal.into(),
            host: "*".into(),
            operation,
            permission_type,
        }
    }

    fn allow_topic(
        name: &str,
        pattern: PatternType,
        principal: &str,
        op: AclOperation,
    ) -> AclBinding {
        binding(
            ResourceType::Topic,
            name,
            pattern,
            principal,
            op,
            AclPermissionType::Allow,
        )
    }

    fn deny_topic(
        name: &str,
        pattern: PatternType,
        principal: &str,
        op: AclOperation,
    ) -> AclBinding {
        binding(
            ResourceType::Topic,
            name,
            pattern,
            principal,
            op,
            AclPermissionType::Deny,
        )
    }

    fn authorizer(config: BrokerConfig, acls: &[AclBinding]) -> (tempfile::TempDir, Authorizer) {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Arc::new(Catalog::open(dir.path()).unwrap());
        let config = BrokerConfig {
            acls: acls.to_vec(),
            ..config
        };
        let authorizer = Authorizer::load(&config, catalog).unwrap();
        (dir, authorizer)
    }

    fn strict(acls: &[AclBinding]) -> (tempfile::TempDir, Authorizer) {
        let config = BrokerConfig {
            allow_everyone_if_no_acl_found: false,
            ..BrokerConfig::default()
        };
        authorizer(config, acls)
    }

    fn session(principal: &str, ip: &str) -> Session {
        Session {
            principal: Principal::parse(principal).unwrap(),
            client_host: format!("/{ip}"),
            ip: ip.into(),
            advertised: None,
        }
    }

    fn alice() -> Session {
        session("User:alice", "10.0.0.1")
    }

    use AclOperation::*;
    use PatternType::*;

    #[test]
    fn without_any_acl_the_flag_decides() {
        let (_d, open) = authorizer(BrokerConfig::default(), &[]);
        assert!(open.authorize(&alice(), Write, Resource::topic("logs")));
        assert!(open.authorize(&alice(), Alter, Resource::cluster()));
        let (_d, closed) = strict(&[]);
        assert!(!closed.authorize(&alice(), Read, Resource::topic("logs")));
    }

    #[test]
    fn a_resource_without_matching_acls_falls_back_to_the_flag_even_when_others_have_some() {
        let acls = [allow_topic("logs", Literal, "User:bob", Read)];
        let (_d, open) = authorizer(BrokerConfig::default(), &acls);
        assert!(open.authorize(&alice(), Read, Resource::topic("other")));
        // An ACL on `logs` for someone else: alice is not allowed on it any more.
        assert!(!open.authorize(&alice(), Read, Resource::topic("logs")));
        assert!(open.authorize(
            &session("User:bob", "1.2.3.4"),
            Read,
            Resource::topic("logs")
        ));
    }

    #[test]
    fn deny_wins_over_allow() {
        let acls = [
            allow_topic("*", Literal, "User:*", All),
            deny_topic("secret", Literal, "User:alice", Read),
        ];
        let (_d, a) = strict(&acls);
        assert!(!a.authorize(&alice(), Read, Resource::topic("secret")));
        assert!(a.authorize(&alice(), Write, Resource::topic("secret")));
        assert!(a.authorize(&alice(), Read, Resource::topic("public")));
        // A deny of Read does not deny Describe, which Write still implies.
        assert!(a.authorize(&alice(), Describe, Resource::topic("secret")));
        let (_d, a) = strict(&[
            allow_topic("logs", Literal, "User:alice", Read),
            deny_topic("lo", Prefixed, "User:*", All),
        ]);
        assert!(!a.authorize(&alice(), Read, Resource::topic("logs")));
        assert!(!a.authorize(&alice(), Describe, Resource::topic("logs")));
    }

    #[test]
    fn prefixed_and_wildcard_names_match_as_in_kafka() {
        let acls = [
            allow_topic("logs-", Prefixed, "User:alice", Write),
            allow_topic("*", Literal, "User:bob", Read),
        ];
        let (_d, a) = strict(&acls);
        assert!(a.authorize(&alice(), Write, Resource::topic("logs-x")));
        assert!(a.authorize(&alice(), Write, Resource::topic("logs-")));
        assert!(!a.authorize(&alice(), Write, Resource::topic("logs")));
        assert!(!a.authorize(&alice(), Read, Resource::topic("logs-x")));
        let bob = session("User:bob", "10.0.0.2");
        assert!(a.authorize(&bob, Read, Resource::topic("anything")));
        assert!(!a.authorize(&bob, Read, Resource::group("anything")));
    }

    #[test]
    fn read_write_delete_alter_imply_describe_and_alter_configs_implies_describe_configs() {
        for op in [Read, Write, Delete, Alter] {
            let (_d, a) = strict(&[allow_topic("t", Literal, "User:alice", op)]);
            assert!(
                a.authorize(&alice(), Describe, Resource::topic("t")),
                "{op}"
            );
            assert!(
                !a.authorize(&alice(), DescribeConfigs, Resource::topic("t")),
                "{op}"
            );
        }
        let (_d, a) = strict(&[allow_topic("t", Literal, "User:alice", AlterConfigs)]);
        assert!(a.authorize(&alice(), DescribeConfigs, Resource::topic("t")));
        assert!(!a.authorize(&alice(), Describe, Resource::topic("t")));
        let (_d, a) = strict(&[allow_topic("t", Literal, "User:alice", Create)]);
        assert!(!a.authorize(&alice(), Describe, Resource::topic("t")));
        let (_d, a) = strict(&[allow_topic("t", Literal, "User:alice", All)]);
        for op in AclOperation::ALL {
            assert!(a.authorize(&alice(), *op, Resource::topic("t")), "{op}");
        }
    }

    #[test]
    fn hosts_and_principals_must_match_the_caller() {
        let mut from_host = allow_topic("t", Literal, "User:alice", Read);
        from_host.host = "10.0.0.1".into();
        let (_d, a) = strict(&[from_host]);
        assert!(a.authorize(&alice(), Read, Resource::topic("t")));
        assert!(!a.authorize(
            &session("User:alice", "10.0.0.9"),
            Read,
            Resource::topic("t")
        ));
        assert!(!a.authorize(&session("User:bob", "10.0.0.1"), Read, Resource::topic("t")));
    }

    #[test]
    fn super_users_are_allowed_whatever_denies() {
        let config = BrokerConfig {
            allow_everyone_if_no_acl_found: false,
            super_users: vec!["User:admin".into()],
            ..BrokerConfig::default()
        };
        let (_d, a) = authorizer(config, &[deny_topic("*", Literal, "User:*", All)]);
        let admin = session("User:admin", "10.0.0.3");
        assert!(a.authorize(&admin, Write, Resource::topic("t")));
        assert!(a.authorize(&admin, Alter, Resource::cluster()));
        assert!(!a.authorize(&alice(), Write, Resource::topic("t")));
    }

    #[test]
    fn write_on_any_topic_is_found_unless_a_deny_dominates_it() {
        let (_d, a) = strict(&[allow_topic("logs-", Prefixed, "User:alice", Write)]);
        assert!(a.authorize_any(&alice(), Write, ResourceType::Topic));
        assert!(!a.authorize_any(&session("User:bob", "1.1.1.1"), Write, ResourceType::Topic));
        let (_d, a) = strict(&[
            allow_topic("logs-x", Literal, "User:alice", Write),
            deny_topic("logs-", Prefixed, "User:alice", Write),
        ]);
        assert!(!a.authorize_any(&alice(), Write, ResourceType::Topic));
        let (_d, a) = strict(&[
            allow_topic("a", Literal, "User:alice", Write),
            deny_topic("*", Literal, "User:*", Write),
        ]);
        assert!(!a.authorize_any(&alice(), Write, ResourceType::Topic));
        let (_d, open) = authorizer(BrokerConfig::default(), &[]);
        assert!(open.authorize_any(&alice(), Write, ResourceType::Topic));
    }

    #[test]
    fn filters_match_as_kafkas_any_and_match_filters() {
        let literal = allow_topic("logs", Literal, "User:alice", Read);
        let wildcard = allow_topic("*", Literal, "User:alice", Read);
        let prefixed = allow_topic("lo", Prefixed, "User:alice", Read);
        let filter = |pattern, name: Option<&str>| AclBindingFilter {
            resource_type: Some(ResourceType::Topic),
            resource_name: name.map(str::to_owned),
            pattern_type: pattern,
            principal: None,
            host: None,
            operation: None,
            permission_type: None,
        };
        let matched = |f: &AclBindingFilter| {
            [&literal, &wildcard, &prefixed]
                .iter()
                .filter(|b| f.matches(b))
                .count()
        };
        assert_eq!(matched(&filter(PatternFilter::Any, None)), 3);
        assert_eq!(matched(&filter(PatternFilter::Any, Some("logs"))), 1);
        assert_eq!(matched(&filter(PatternFilter::Match, Some("logs"))), 3);
        assert_eq!(matched(&filter(PatternFilter::Match, Some("other"))), 1);
        assert_eq!(
            matched(&filter(PatternFilter::Exact(Prefixed), Some("lo"))),
            1
        );
        assert_eq!(
            matched(&filter(PatternFilter::Exact(Prefixed), Some("logs"))),
            0
        );
        let mut by_principal = filter(PatternFilter::Any, None);
        by_principal.principal = Some("User:bob".into());
        assert_eq!(matched(&by_principal), 0);
        assert!(AclBindingFilter::from_codes(9, None, 1, None, None, 1, 1).is_err());
        assert_eq!(
            AclBindingFilter::from_codes(1, None, 1, None, None, 1, 1).unwrap(),
            AclBindingFilter {
                resource_type: None,
                ..filter(PatternFilter::Any, None)
            }
        );
    }

    #[test]
    fn changes_are_stored_and_survive_a_reload() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Arc::new(Catalog::open(dir.path()).unwrap());
        let config = BrokerConfig {
            allow_everyone_if_no_acl_found: false,
            ..BrokerConfig::default()
        };
        let a = Authorizer::load(&config, Arc::clone(&catalog)).unwrap();
        let read = allow_topic("t", Literal, "User:alice", Read);
        let write = allow_topic("t", Literal, "User:alice", Write);
        a.create(&[read.clone(), write.clone()]).unwrap();
        assert!(a.authorize(&alice(), Read, Resource::topic("t")));
        let only_read = AclBindingFilter::from_codes(2, Some("t"), 3, None, None, 3, 1).unwrap();
        assert_eq!(a.delete(&[only_read]).unwrap(), vec![vec![read]]);
        assert!(!a.authorize(&alice(), Read, Resource::topic("t")));
        drop(a);
        let reloaded = Authorizer::load(&config, catalog).unwrap();
        let everything = AclBindingFilter::from_codes(1, None, 1, None, None, 1, 1).unwrap();
        assert_eq!(reloaded.describe(&everything), vec![write]);
    }

    #[test]
    fn names_parse_as_kafka_tools_write_them() {
        assert_eq!(AclOperation::from_name("Read"), Some(Read));
        assert_eq!(
            AclOperation::from_name("DescribeConfigs"),
            Some(DescribeConfigs)
        );
        assert_eq!(
            AclOperation::from_name("IDEMPOTENT_WRITE"),
            Some(IdempotentWrite)
        );
        assert_eq!(
            ResourceType::from_name("transactional-id"),
            Some(ResourceType::TransactionalId)
        );
        assert_eq!(AclOperation::from_name("Fly"), None);
        let invalid = binding(
            ResourceType::Group,
            "g",
            Literal,
            "User:alice",
            Write,
            AclPermissionType::Allow,
        );
        assert!(invalid.invalid().is_some());
        let cluster = binding(
            ResourceType::Cluster,
            "c",
            Literal,
            "User:alice",
            Alter,
            AclPermissionType::Allow,
        );
        assert!(cluster.invalid().unwrap().contains("kafka-cluster"));
    }
}
