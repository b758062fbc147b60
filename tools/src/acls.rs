//! `agent acls`: add, remove and list ACLs, with the flags and output of Kafka's
//! `kafka-acls.sh`.
//!
//! librdkafka's admin ACL calls are not in the Rust client, so this tool speaks the Kafka
//! protocol itself (see `wire`): CreateAcls for `--add`, DeleteAcls for `--remove` and
//! DescribeAcls for `--list` (and for the listing printed after a change), to the first
//! bootstrap server that answers. Unlike `kafka-acls.sh`, `--remove` never asks for
//! confirmation; `--force` is accepted for scripts written for it.

use std::collections::BTreeMap;
use std::io::Write;

use anyhow::{Context, bail};
use clap::Args;
use ferry_broker::{AclOperation, AclPermissionType, CLUSTER_NAME, PatternType, ResourceType};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use kafka_protocol::messages::{CreateAclsRequest, DeleteAclsRequest, DescribeAclsRequest};
use kafka_protocol::protocol::StrBytes;

use super::wire::Connection;
use super::{ClusterArgs, runtime};

/// Flags of `agent acls`, as `kafka-acls.sh` names them.
#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("action").required(true).args(["add", "remove", "list"])))]
pub struct AclsArgs {
    #[command(flatten)]
    server: ClusterArgs,
    /// Add the ACLs the other flags describe.
    #[arg(long)]
    add: bool,
    /// Remove the ACLs the other flags describe (all ACLs of the resources when no principal
    /// is given).
    #[arg(long)]
    remove: bool,
    /// List the ACLs of the resources given, or of every resource (the principals with
    /// --principal; the flags of --add and --remove are refused).
    #[arg(long, conflicts_with_all = ["allow_principal", "deny_principal", "allow_host", "deny_host", "producer", "consumer"])]
    list: bool,
    /// A principal (`User:alice`, `User:*`) to allow; repeatable.
    #[arg(long = "allow-principal", value_name = "PRINCIPAL")]
    allow_principal: Vec<String>,
    /// A principal to deny; repeatable.
    #[arg(long = "deny-principal", value_name = "PRINCIPAL")]
    deny_principal: Vec<String>,
    /// A host (IP address) the allow principals are allowed from; default `*`, every host.
    #[arg(long = "allow-host", value_name = "HOST")]
    allow_host: Vec<String>,
    /// A host the deny principals are denied from; default `*`, every host.
    #[arg(long = "deny-host", value_name = "HOST")]
    deny_host: Vec<String>,
    /// With --list: only the ACLs of this principal; repeatable.
    #[arg(long, value_name = "PRINCIPAL")]
    principal: Vec<String>,
    /// An operation (Read, Write, Create, Delete, Alter, Describe, ClusterAction,
    /// DescribeConfigs, AlterConfigs, IdempotentWrite, All); repeatable, default All.
    #[arg(long, value_name = "OPERATION", value_parser = operation)]
    operation: Vec<AclOperation>,
    /// A topic, a topic prefix with --resource-pattern-type prefixed, or `*`; repeatable.
    #[arg(long, value_name = "TOPIC")]
    topic: Vec<String>,
    /// A consumer group (or prefix, or `*`); repeatable.
    #[arg(long, value_name = "GROUP")]
    group: Vec<String>,
    /// A transactional id (or prefix, or `*`); repeatable.
    #[arg(long = "transactional-id", value_name = "ID")]
    transactional_id: Vec<String>,
    /// The cluster resource.
    #[arg(long)]
    cluster: bool,
    /// How resource names match: literal (default) or prefixed; --list and --remove also
    /// take match (every pattern that applies to the names) and any (every pattern type).
    #[arg(long = "resource-pattern-type", value_name = "TYPE", default_value = "literal",
          value_parser = pattern_filter)]
    resource_pattern_type: PatternFilter,
    /// The ACLs of a producer: Write, Describe and Create on the topics, Write and Describe on
    /// the transactional ids, IdempotentWrite on the cluster with --idempotent.
    #[arg(long, conflicts_with_all = ["operation", "deny_principal", "deny_host"])]
    producer: bool,
    /// The ACLs of a consumer: Read and Describe on the topics, Read on the groups.
    #[arg(long, conflicts_with_all = ["operation", "deny_principal", "deny_host"])]
    consumer: bool,
    /// With --producer: IdempotentWrite on the cluster too.
    #[arg(long)]
    idempotent: bool,
    /// Do not ask for confirmation (this tool never asks).
    #[arg(long)]
    force: bool,
}

/// A `--resource-pattern-type`: a pattern type, or one of the filter-only ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PatternFilter {
    Any,
    Match,
    Exact(PatternType),
}

impl PatternFilter {
    /// The protocol code (ANY is 1, MATCH 2).
    fn code(self) -> i8 {
        match self {
            PatternFilter::Any => 1,
            PatternFilter::Match => 2,
            PatternFilter::Exact(p) => p.code(),
        }
    }
}

fn pattern_filter(text: &str) -> Result<PatternFilter, String> {
    match text.to_ascii_lowercase().as_str() {
        "any" => Ok(PatternFilter::Any),
        "match" => Ok(PatternFilter::Match),
        _ => PatternType::from_name(text)
            .map(PatternFilter::Exact)
            .ok_or_else(|| "expected literal, prefixed, match or any".into()),
    }
}

fn operation(text: &str) -> Result<AclOperation, String> {
    AclOperation::from_name(text).ok_or_else(|| {
        let names: Vec<_> = AclOperation::ALL
            .iter()
            .map(|o| camel(o.kafka_name()))
            .collect();
        format!("expected one of {}", names.join(", "))
    })
}

/// `DESCRIBE_CONFIGS` as `DescribeConfigs`.
fn camel(name: &str) -> String {
    name.split('_')
        .map(|w| {
            let mut w = w.to_ascii_lowercase();
            if let Some(first) = w.get_mut(0..1) {
                first.make_ascii_uppercase();
            }
            w
        })
        .collect()
}

/// The protocol's ANY code of every ACL enum.
const ANY: i8 = 1;

/// A resource pattern, as Kafka's `ResourcePattern` prints.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Pattern {
    resource_type: i8,
    name: String,
    pattern_type: i8,
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind =
            ResourceType::from_code(self.resource_type).map_or("UNKNOWN", |t| t.kafka_name());
        let pattern =
            PatternType::from_code(self.pattern_type).map_or("UNKNOWN", |p| p.kafka_name());
        write!(
            f,
            "ResourcePattern(resourceType={kind}, name={}, patternType={pattern})",
            self.name
        )
    }
}

/// An access control entry, as Kafka's `AccessControlEntry` prints.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    principal: String,
    host: String,
    operation: i8,
    permission_type: i8,
}

impl std::fmt::Display for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let op = AclOperation::from_code(self.operation).map_or("UNKNOWN", |o| o.kafka_name());
        let permission = AclPermissionType::from_code(self.permission_type)
            .map_or("UNKNOWN", |p| p.kafka_name());
        write!(
            f,
            "(principal={}, host={}, operation={op}, permissionType={permission})",
            self.principal, self.host
        )
    }
}

/// Runs `agent acls`.
pub fn run(args: AclsArgs) -> anyhow::Result<()> {
    if args.idempotent && !args.producer {
        bail!("The --idempotent option is only available if --producer is set");
    }
    if !args.principal.is_empty() && !args.list {
        // Kafka's refusal: with --remove, it would otherwise read as "remove this principal's
        // ACLs" and remove everyone's.
        bail!(
            "The --principal option is only available if --list is set: with --add or \
             --remove name the principals with --allow-principal or --deny-principal"
        );
    }
    let mut out = std::io::stdout().lock();
    let security = args.server.wire_only_security()?;
    runtime()?.block_on(async {
        let mut connection =
            Connection::bootstrap(&args.server.bootstrap_server, &security).await?;
        let resources = resources(&args)?;
        if args.list {
            let listed = list(&mut connection, &args, &resources).await?;
            return print_current(&mut out, &listed);
        }
        let acls = bindings(&args, &resources)?;
        if args.add {
            for (pattern, entries) in &acls {
                print_block(&mut out, "Adding ACLs for resource", pattern, entries)?;
            }
            add(&mut connection, &acls).await?;
        } else {
            remove(&mut connection, &args, &resources, &acls).await?;
        }
        let current = list(&mut connection, &args, &resources).await?;
        print_current(&mut out, &current)
    })
}

/// The resources named by the flags, with the pattern type given.
fn resources(args: &AclsArgs) -> anyhow::Result<Vec<(ResourceType, String)>> {
    let mut resources = Vec::new();
    let named = [
        (ResourceType::Topic, &args.topic),
        (ResourceType::Group, &args.group),
        (ResourceType::TransactionalId, &args.transactional_id),
    ];
    for (kind, names) in named {
        resources.extend(names.iter().map(|n| (kind, n.clone())));
    }
    if args.cluster || args.idempotent {
        resources.push((ResourceType::Cluster, CLUSTER_NAME.to_owned()));
    }
    if resources.is_empty() && !args.list {
        bail!("give at least one resource: --topic, --group, --transactional-id or --cluster");
    }
    if args.consumer && (args.topic.is_empty() || args.group.is_empty()) {
        bail!("--consumer needs --topic and --group");
    }
    if args.producer && args.topic.is_empty() && args.transactional_id.is_empty() {
        bail!("--producer needs --topic or --transactional-id");
    }
    Ok(resources)
}

/// The operations a resource gets from the flags.
fn operations(args: &AclsArgs, kind: ResourceType) -> Vec<AclOperation> {
    use AclOperation::*;
    if args.producer || args.consumer {
        let mut ops = Vec::new();
        if args.producer {
            ops.extend_from_slice(match kind {
                ResourceType::Topic => &[Write, Describe, Create][..],
                ResourceType::TransactionalId => &[Write, Describe],
                ResourceType::Cluster if args.idempotent => &[IdempotentWrite],
                _ => &[],
            });
        }
        if args.consumer {
            ops.extend_from_slice(match kind {
                ResourceType::Topic => &[Read, Describe][..],
                ResourceType::Group => &[Read],
                _ => &[],
            });
        }
        return ops;
    }
    if args.operation.is_empty() {
        vec![All]
    } else {
        args.operation.clone()
    }
}

/// The entries of the flags' principals: each principal from each of its hosts.
fn entries(args: &AclsArgs, ops: &[AclOperation]) -> anyhow::Result<Vec<Entry>> {
    let sides = [
        (
            &args.allow_principal,
            &args.allow_host,
            AclPermissionType::Allow,
            "--allow-host",
        ),
        (
            &args.deny_principal,
            &args.deny_host,
            AclPermissionType::Deny,
            "--deny-host",
        ),
    ];
    let mut entries = Vec::new();
    for (principals, hosts, permission, host_flag) in sides {
        if principals.is_empty() && !hosts.is_empty() {
            bail!("{host_flag} needs the principals it is for");
        }
        let any = ["*".to_owned()];
        let hosts = if hosts.is_empty() {
            &any[..]
        } else {
            &hosts[..]
        };
        for principal in principals {
            if !principal.contains(':') {
                bail!("principal `{principal}` is not of the form Type:name (User:alice)");
            }
            for host in hosts {
                entries.extend(ops.iter().map(|op| Entry {
                    principal: principal.clone(),
                    host: host.clone(),
                    operation: op.code(),
                    permission_type: permission.code(),
                }));
            }
        }
    }
    Ok(entries)
}

/// The ACLs of `--add` and `--remove`, by resource pattern.
fn bindings(
    args: &AclsArgs,
    resources: &[(ResourceType, String)],
) -> anyhow::Result<BTreeMap<Pattern, Vec<Entry>>> {
    let mut acls = BTreeMap::new();
    for (kind, name) in resources {
        let ops = operations(args, *kind);
        if let Some(bad) = ops.iter().find(|op| !kind.operations().contains(op)) {
            let valid: Vec<_> = kind
                .operations()
                .iter()
                .map(|o| camel(o.kafka_name()))
                .collect();
            bail!(
                "resource type {} does not have operation {}; it has {}",
                kind,
                camel(bad.kafka_name()),
                valid.join(", ")
            );
        }
        let entries = entries(args, &ops)?;
        if entries.is_empty() && args.add {
            bail!("--add needs --allow-principal or --deny-principal");
        }
        let pattern_type = match (args.resource_pattern_type, args.add) {
            (PatternFilter::Exact(p), _) => p.code(),
            (_, true) => bail!("--add takes --resource-pattern-type literal or prefixed"),
            (filter, false) => filter.code(),
        };
        let pattern = Pattern {
            resource_type: kind.code(),
            name: name.clone(),
            pattern_type,
        };
        acls.insert(pattern, entries);
    }
    Ok(acls)
}

async fn add(
    connection: &mut Connection,
    acls: &BTreeMap<Pattern, Vec<Entry>>,
) -> anyhow::Result<()> {
    let creations: Vec<AclCreation> = acls
        .iter()
        .flat_map(|(pattern, entries)| {
            entries.iter().map(move |e| {
                AclCreation::default()
                    .with_resource_type(pattern.resource_type)
                    .with_resource_name(StrBytes::from_string(pattern.name.clone()))
                    .with_resource_pattern_type(pattern.pattern_type)
                    .with_principal(StrBytes::from_string(e.principal.clone()))
                    .with_host(StrBytes::from_string(e.host.clone()))
                    .with_operation(e.operation)
                    .with_permission_type(e.permission_type)
            })
        })
        .collect();
    let request = CreateAclsRequest::default().with_creations(creations);
    let version = connection.version::<CreateAclsRequest>()?;
    let response = connection.call(version, &request).await?;
    let failures: Vec<String> = response
        .results
        .iter()
        .filter_map(|r| broker_error(r.error_code, r.error_message.as_deref()))
        .collect();
    if !failures.is_empty() {
        bail!("adding ACLs failed: {}", failures.join("; "));
    }
    Ok(())
}

async fn remove(
    connection: &mut Connection,
    args: &AclsArgs,
    resources: &[(ResourceType, String)],
    acls: &BTreeMap<Pattern, Vec<Entry>>,
) -> anyhow::Result<()> {
    let no_principal = args.allow_principal.is_empty() && args.deny_principal.is_empty();
    // The codec's defaults are empty strings, which match nothing: null matches all.
    let filter = |pattern: &Pattern| {
        DeleteAclsFilter::default()
            .with_resource_type_filter(pattern.resource_type)
            .with_resource_name_filter(Some(StrBytes::from_string(pattern.name.clone())))
            .with_pattern_type_filter(pattern.pattern_type)
            .with_principal_filter(None)
            .with_host_filter(None)
    };
    let filters: Vec<DeleteAclsFilter> = if no_principal {
        // Every ACL of the resources.
        resources
            .iter()
            .map(|(kind, name)| {
                filter(&Pattern {
                    resource_type: kind.code(),
                    name: name.clone(),
                    pattern_type: args.resource_pattern_type.code(),
                })
                .with_operation(ANY)
                .with_permission_type(ANY)
            })
            .collect()
    } else {
        acls.iter()
            .flat_map(|(pattern, entries)| {
                entries.iter().map(move |e| {
                    filter(pattern)
                        .with_principal_filter(Some(StrBytes::from_string(e.principal.clone())))
                        .with_host_filter(Some(StrBytes::from_string(e.host.clone())))
                        .with_operation(e.operation)
                        .with_permission_type(e.permission_type)
                })
            })
            .collect()
    };
    let request = DeleteAclsRequest::default().with_filters(filters);
    let version = connection.version::<DeleteAclsRequest>()?;
    let response = connection.call(version, &request).await?;
    let failures: Vec<String> = response
        .filter_results
        .iter()
        .filter_map(|r| broker_error(r.error_code, r.error_message.as_deref()))
        .collect();
    if !failures.is_empty() {
        bail!("removing ACLs failed: {}", failures.join("; "));
    }
    Ok(())
}

/// The ACLs of the resources (every ACL when none is given), by resource pattern.
async fn list(
    connection: &mut Connection,
    args: &AclsArgs,
    resources: &[(ResourceType, String)],
) -> anyhow::Result<BTreeMap<Pattern, Vec<Entry>>> {
    // The codec's defaults are empty strings, which match nothing: null matches all.
    let all = DescribeAclsRequest::default()
        .with_resource_type_filter(ANY)
        .with_resource_name_filter(None)
        .with_principal_filter(None)
        .with_host_filter(None)
        .with_pattern_type_filter(ANY)
        .with_operation(ANY)
        .with_permission_type(ANY);
    let mut requests: Vec<DescribeAclsRequest> = if resources.is_empty() {
        vec![all]
    } else {
        resources
            .iter()
            .map(|(kind, name)| {
                all.clone()
                    .with_resource_type_filter(kind.code())
                    .with_resource_name_filter(Some(StrBytes::from_string(name.clone())))
                    .with_pattern_type_filter(args.resource_pattern_type.code())
            })
            .collect()
    };
    if !args.principal.is_empty() {
        requests = requests
            .into_iter()
            .flat_map(|r| {
                args.principal.iter().map(move |p| {
                    r.clone()
                        .with_principal_filter(Some(StrBytes::from_string(p.clone())))
                })
            })
            .collect();
    }
    let version = connection.version::<DescribeAclsRequest>()?;
    let mut listed: BTreeMap<Pattern, Vec<Entry>> = BTreeMap::new();
    for request in requests {
        let response = connection.call(version, &request).await?;
        if let Some(e) = broker_error(response.error_code, response.error_message.as_deref()) {
            bail!("listing ACLs failed: {e}");
        }
        for resource in response.resources {
            let pattern = Pattern {
                resource_type: resource.resource_type,
                name: resource.resource_name.to_string(),
                pattern_type: resource.pattern_type,
            };
            let entries = listed.entry(pattern).or_default();
            entries.extend(resource.acls.into_iter().map(|a| Entry {
                principal: a.principal.to_string(),
                host: a.host.to_string(),
                operation: a.operation,
                permission_type: a.permission_type,
            }));
            entries.sort();
            entries.dedup();
        }
    }
    Ok(listed)
}

/// A broker's error code as text, with its message (`CLUSTER_AUTHORIZATION_FAILED: Cluster
/// authorization failed.`), or `None` for no error.
fn broker_error(code: i16, message: Option<&str>) -> Option<String> {
    let error = ResponseError::try_from_code(code)?;
    let name = kafka_error_name(error);
    Some(match message {
        Some(m) if !m.is_empty() => format!("{name}: {m}"),
        _ => name,
    })
}

/// Kafka's name of an error (`ClusterAuthorizationFailed` as `CLUSTER_AUTHORIZATION_FAILED`).
fn kafka_error_name(error: ResponseError) -> String {
    let mut name = String::new();
    for (i, c) in format!("{error:?}").chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

/// One resource's block, as `kafka-acls.sh` prints it.
fn print_block(
    out: &mut impl Write,
    title: &str,
    pattern: &Pattern,
    entries: &[Entry],
) -> anyhow::Result<()> {
    let lines: Vec<String> = entries.iter().map(|e| format!("\t{e}")).collect();
    writeln!(out, "{title} `{pattern}`: \n {} \n", lines.join("\n")).context("writing output")
}

fn print_current(
    out: &mut impl Write,
    listed: &BTreeMap<Pattern, Vec<Entry>>,
) -> anyhow::Result<()> {
    for (pattern, entries) in listed {
        print_block(out, "Current ACLs for resource", pattern, entries)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_resources_and_entries_as_kafka_acls_sh() {
        let pattern = Pattern {
            resource_type: ResourceType::Topic.code(),
            name: "logs-".into(),
            pattern_type: PatternType::Prefixed.code(),
        };
        let entry = Entry {
            principal: "User:alice".into(),
            host: "*".into(),
            operation: AclOperation::Write.code(),
            permission_type: AclPermissionType::Allow.code(),
        };
        let mut out = Vec::new();
        print_block(&mut out, "Current ACLs for resource", &pattern, &[entry]).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "Current ACLs for resource `ResourcePattern(resourceType=TOPIC, name=logs-, \
             patternType=PREFIXED)`: \n \t(principal=User:alice, host=*, operation=WRITE, \
             permissionType=ALLOW) \n\n"
        );
        assert_eq!(camel("DESCRIBE_CONFIGS"), "DescribeConfigs");
        assert_eq!(
            kafka_error_name(ResponseError::ClusterAuthorizationFailed),
            "CLUSTER_AUTHORIZATION_FAILED"
        );
    }
}
