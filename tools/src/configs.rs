//! `agent configs`: describe and alter topic configs, and describe broker settings, with the
//! flags and output of Kafka's `kafka-configs.sh` (`--entity-type topics|brokers`,
//! `--entity-name`, `--describe [--all]`, `--alter --add-config k=v,... --delete-config k,...`).
//! It speaks the protocol itself (DescribeConfigs with synonyms, IncrementalAlterConfigs):
//! librdkafka's binding offers only the non-incremental AlterConfigs, which replaces every
//! override of a topic.

use std::io::Write;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::describe_configs_response::DescribeConfigsResourceResult;
use kafka_protocol::messages::{
    DescribeConfigsRequest, IncrementalAlterConfigsRequest, MetadataRequest,
    describe_configs_request, incremental_alter_configs_request,
};
use kafka_protocol::protocol::StrBytes;

use super::wire::Connection;
use super::{ClusterArgs, runtime};

/// Flags of `agent configs`, as `kafka-configs.sh` names them.
#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("action").required(true).args(["describe", "alter"])))]
pub struct ConfigsArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// What the configs belong to.
    #[arg(long = "entity-type", value_enum)]
    entity_type: Option<EntityType>,
    /// The topic name or broker id (every topic, or the broker, when left out with
    /// --describe).
    #[arg(long = "entity-name", value_name = "NAME")]
    entity_name: Option<String>,
    /// Same as `--entity-type topics --entity-name NAME`.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["entity_type", "broker"])]
    topic: Option<String>,
    /// Same as `--entity-type brokers --entity-name ID`.
    #[arg(long, value_name = "ID", conflicts_with_all = ["entity_type"])]
    broker: Option<String>,
    /// List the configs: the overrides, or with --all every config and its value.
    #[arg(long)]
    describe: bool,
    /// With --describe: every config, not only those set on the entity.
    #[arg(long, requires = "describe")]
    all: bool,
    /// Change configs (--add-config, --delete-config).
    #[arg(long)]
    alter: bool,
    /// Configs to set: `k1=v1,k2=[a,b,c]` (a list value in square brackets).
    #[arg(long = "add-config", value_name = "K=V,...", requires = "alter")]
    add_config: Option<String>,
    /// Configs to remove (back to their defaults), comma-separated.
    #[arg(long = "delete-config", value_name = "K,...", requires = "alter")]
    delete_config: Option<String>,
}

/// Kafka's entity types (the plural names; the singular ones are accepted too).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum EntityType {
    #[value(alias = "topic")]
    Topics,
    #[value(alias = "broker")]
    Brokers,
}

/// Kafka's resource types.
const TOPIC: i8 = 2;
const BROKER: i8 = 4;
/// IncrementalAlterConfigs operations.
const SET: i8 = 0;
const DELETE: i8 = 1;

/// Kafka's names of config sources, as kafka-configs.sh prints synonyms.
fn source_name(source: i8) -> &'static str {
    match source {
        1 => "DYNAMIC_TOPIC_CONFIG",
        2 => "DYNAMIC_BROKER_CONFIG",
        3 => "DYNAMIC_DEFAULT_BROKER_CONFIG",
        4 => "STATIC_BROKER_CONFIG",
        5 => "DEFAULT_CONFIG",
        6 => "DYNAMIC_BROKER_LOGGER_CONFIG",
        7 => "CLIENT_METRICS_CONFIG",
        8 => "GROUP_CONFIG",
        _ => "UNKNOWN",
    }
}

/// Splits `k1=v1,k2=[a,b]` into pairs; commas inside square brackets belong to the value.
fn parse_add_config(text: &str) -> anyhow::Result<Vec<(String, String)>> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                items.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&text[start..]);
    items
        .into_iter()
        .filter(|item| !item.trim().is_empty())
        .map(|item| {
            let (key, value) = item
                .split_once('=')
                .with_context(|| format!("--add-config: `{item}` is not of the form key=value"))?;
            let value = value.trim();
            let value = value
                .strip_prefix('[')
                .and_then(|v| v.strip_suffix(']'))
                .unwrap_or(value);
            Ok((key.trim().to_owned(), value.to_owned()))
        })
        .collect()
}

/// The line of one config, as `kafka-configs.sh --describe` prints it.
fn config_line(config: &DescribeConfigsResourceResult) -> String {
    let value = if config.is_sensitive {
        "null".to_owned()
    } else {
        config.value.as_deref().unwrap_or("null").to_owned()
    };
    let synonyms: Vec<String> = config
        .synonyms
        .iter()
        .map(|s| {
            format!(
                "{}:{}={}",
                source_name(s.source),
                s.name,
                s.value.as_deref().unwrap_or("null")
            )
        })
        .collect();
    format!(
        "  {}={value} sensitive={} synonyms={{{}}}",
        config.name,
        config.is_sensitive,
        synonyms.join(", ")
    )
}

/// Runs `agent configs`.
pub fn run(args: ConfigsArgs) -> anyhow::Result<()> {
    let (kind, name) = match (&args.topic, &args.broker, args.entity_type) {
        (Some(topic), _, _) => (EntityType::Topics, Some(topic.clone())),
        (None, Some(broker), _) => (EntityType::Brokers, Some(broker.clone())),
        (None, None, Some(kind)) => (kind, args.entity_name.clone()),
        (None, None, None) => {
            bail!("--entity-type (topics or brokers), --topic or --broker is needed")
        }
    };
    let security = args.cluster.wire_only_security()?;
    let bootstrap = args.cluster.bootstrap_server.clone();
    let mut out = std::io::stdout().lock();
    runtime()?.block_on(async {
        let mut connection = Connection::bootstrap(&bootstrap, &security).await?;
        if args.alter {
            let name = name.context("--alter needs --entity-name (or --topic, --broker)")?;
            return alter(&mut connection, kind, &name, &args, &mut out).await;
        }
        let names = match (kind, name) {
            (_, Some(name)) => vec![name],
            (EntityType::Topics, None) => topic_names(&mut connection).await?,
            (EntityType::Brokers, None) => vec![String::new()],
        };
        for name in names {
            describe(&mut connection, kind, &name, args.all, &mut out).await?;
        }
        Ok(())
    })
}

/// Every topic's name, sorted, internal topics included as Kafka's tool lists them.
async fn topic_names(connection: &mut Connection) -> anyhow::Result<Vec<String>> {
    let version = connection.version::<MetadataRequest>()?;
    let metadata = connection
        .call(version, &MetadataRequest::default().with_topics(None))
        .await?;
    let mut names: Vec<String> = metadata
        .topics
        .into_iter()
        .filter_map(|t| t.name.map(|n| n.0.to_string()))
        .collect();
    names.sort();
    Ok(names)
}

async fn describe(
    connection: &mut Connection,
    kind: EntityType,
    name: &str,
    all: bool,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let resource_type = if kind == EntityType::Topics {
        TOPIC
    } else {
        BROKER
    };
    let version = connection.version::<DescribeConfigsRequest>()?;
    let request = DescribeConfigsRequest::default()
        .with_include_synonyms(true)
        .with_resources(vec![
            describe_configs_request::DescribeConfigsResource::default()
                .with_resource_type(resource_type)
                .with_resource_name(StrBytes::from_string(name.to_owned()))
                .with_configuration_keys(None),
        ]);
    let response = connection.call(version, &request).await?;
    let result = response
        .results
        .into_iter()
        .next()
        .context("the broker answered for no resource")?;
    let what = match kind {
        EntityType::Topics => format!("topic {name}"),
        EntityType::Brokers if name.is_empty() => "default brokers".to_owned(),
        EntityType::Brokers => format!("broker {name}"),
    };
    if let Some(e) = ResponseError::try_from_code(result.error_code) {
        let detail = result.error_message.as_deref().unwrap_or_default();
        bail!(
            "failed to describe configs of {what}: {e}{}",
            if detail.is_empty() {
                String::new()
            } else {
                format!(" ({detail})")
            }
        );
    }
    // Without --all: what is set on the entity itself (a topic override, a dynamic broker
    // setting), as Kafka's "Dynamic configs".
    let dynamic = |source: i8| matches!(source, 1..=3);
    let mut configs: Vec<_> = result
        .configs
        .into_iter()
        .filter(|c| all || dynamic(c.config_source))
        .collect();
    configs.sort_by(|a, b| a.name.cmp(&b.name));
    writeln!(
        out,
        "{} configs for {what} are:",
        if all { "All" } else { "Dynamic" }
    )?;
    for config in &configs {
        writeln!(out, "{}", config_line(config))?;
    }
    Ok(())
}

async fn alter(
    connection: &mut Connection,
    kind: EntityType,
    name: &str,
    args: &ConfigsArgs,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let mut changes = Vec::new();
    if let Some(add) = &args.add_config {
        for (key, value) in parse_add_config(add)? {
            changes.push(
                incremental_alter_configs_request::AlterableConfig::default()
                    .with_name(StrBytes::from_string(key))
                    .with_config_operation(SET)
                    .with_value(Some(StrBytes::from_string(value))),
            );
        }
    }
    if let Some(delete) = &args.delete_config {
        for key in delete.split(',').map(str::trim).filter(|k| !k.is_empty()) {
            changes.push(
                incremental_alter_configs_request::AlterableConfig::default()
                    .with_name(StrBytes::from_string(key.to_owned()))
                    .with_config_operation(DELETE),
            );
        }
    }
    if changes.is_empty() {
        bail!("--alter needs --add-config or --delete-config");
    }
    let what = match kind {
        EntityType::Topics => format!("topic {name}"),
        EntityType::Brokers => format!("broker {name}"),
    };
    let resource_type = if kind == EntityType::Topics {
        TOPIC
    } else {
        BROKER
    };
    incremental_alter(connection, resource_type, name, changes)
        .await
        .with_context(|| format!("failed to alter configs of {what}"))?;
    writeln!(out, "Completed updating config for {what}.")?;
    Ok(())
}

/// Sets `pairs` (key, value) on topic `name`, leaving its other overrides as they are
/// (`agent topics --alter --config`).
pub(crate) async fn set_topic_configs(
    connection: &mut Connection,
    name: &str,
    pairs: Vec<(String, String)>,
) -> anyhow::Result<()> {
    let changes = pairs
        .into_iter()
        .map(|(key, value)| {
            incremental_alter_configs_request::AlterableConfig::default()
                .with_name(StrBytes::from_string(key))
                .with_config_operation(SET)
                .with_value(Some(StrBytes::from_string(value)))
        })
        .collect();
    incremental_alter(connection, TOPIC, name, changes).await
}

/// One IncrementalAlterConfigs of `changes` on one resource; the error names Kafka's error
/// and the broker's message.
async fn incremental_alter(
    connection: &mut Connection,
    resource_type: i8,
    name: &str,
    changes: Vec<incremental_alter_configs_request::AlterableConfig>,
) -> anyhow::Result<()> {
    let version = connection.version::<IncrementalAlterConfigsRequest>()?;
    let request = IncrementalAlterConfigsRequest::default().with_resources(vec![
        incremental_alter_configs_request::AlterConfigsResource::default()
            .with_resource_type(resource_type)
            .with_resource_name(StrBytes::from_string(name.to_owned()))
            .with_configs(changes),
    ]);
    let response = connection.call(version, &request).await?;
    for result in response.responses {
        if let Some(e) = ResponseError::try_from_code(result.error_code) {
            let detail = result.error_message.as_deref().unwrap_or_default();
            bail!("{e}: {detail}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn add_config_keeps_bracketed_lists_whole() {
        assert_eq!(
            parse_add_config("retention.ms=1000,cleanup.policy=[compact,delete], a = b").unwrap(),
            [
                ("retention.ms".to_owned(), "1000".to_owned()),
                ("cleanup.policy".to_owned(), "compact,delete".to_owned()),
                ("a".to_owned(), "b".to_owned()),
            ]
        );
        let error = parse_add_config("retention.ms").unwrap_err().to_string();
        assert!(error.contains("`retention.ms`"), "{error}");
    }
}
