//! `agent topics`: create, list, describe, alter and delete topics (Kafka's `kafka-topics.sh`).

use std::io::Write;

use anyhow::{Context, bail};
use clap::Args;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::MetadataRequest;
use rdkafka::admin::{
    AdminClient, AdminOptions, NewPartitions, NewTopic, ResourceSpecifier, TopicReplication,
};
use rdkafka::client::DefaultClientContext;

use super::wire::{Connection, Security};
use super::{ClusterArgs, REQUEST_TIMEOUT, runtime, split_property};

/// Flags of `agent topics`, named as `kafka-topics.sh` names them.
#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("action").required(true).args(["create", "list", "describe", "alter", "delete"])))]
pub struct TopicsArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Create a topic.
    #[arg(long)]
    create: bool,
    /// List all topics.
    #[arg(long)]
    list: bool,
    /// Describe a topic (or all topics).
    #[arg(long)]
    describe: bool,
    /// Change a topic's partition count (`--partitions`) or configs (`--config`).
    #[arg(long)]
    alter: bool,
    /// Delete a topic.
    #[arg(long)]
    delete: bool,
    /// The topic. With --list, --describe, --alter and --delete a regular expression that
    /// must match the whole name, as in Kafka (`'t.*'`); with --create the name itself.
    #[arg(long)]
    topic: Option<String>,
    /// Number of partitions (create: default the cluster's `num.partitions`; alter: the new,
    /// larger count). Only with --create and --alter.
    #[arg(long, conflicts_with_all = ["list", "describe", "delete"])]
    partitions: Option<i32>,
    /// Replication factor (the bundled broker is single-node: 1); default the cluster's
    /// `default.replication.factor`, as Kafka. Only with --create.
    #[arg(long = "replication-factor", conflicts_with_all = ["list", "describe", "alter", "delete"])]
    replication_factor: Option<i32>,
    /// A topic config `key=value`; repeatable. Only with --create and --alter.
    #[arg(long = "config", value_name = "KEY=VALUE", conflicts_with_all = ["list", "describe", "delete"])]
    configs: Vec<String>,
    /// With --create: no error if the topic exists.
    #[arg(long = "if-not-exists", conflicts_with_all = ["list", "describe", "alter", "delete"])]
    if_not_exists: bool,
    /// With --alter, --delete and --describe: do nothing, and no error, if no topic matches.
    #[arg(long = "if-exists", conflicts_with_all = ["create", "list"])]
    if_exists: bool,
    /// With --list and --describe: leave out internal topics (those starting with `__`).
    #[arg(long = "exclude-internal", conflicts_with_all = ["create", "alter", "delete"])]
    exclude_internal: bool,
    /// With --describe: only the topics with configs that override the broker's defaults,
    /// and only their topic line.
    #[arg(long = "topics-with-overrides", conflicts_with_all = ["create", "list", "alter", "delete"])]
    topics_with_overrides: bool,
    /// A client property `key=value` for librdkafka; repeatable.
    #[arg(long = "command-property", value_name = "KEY=VALUE")]
    command_properties: Vec<String>,
}

/// Runs `agent topics`: an error is reported as `kafka-topics.sh` reports it, on standard
/// output as `Error while executing topic command : ...`, with exit status 1.
pub fn main(args: TopicsArgs) -> std::process::ExitCode {
    match run(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) if super::is_broken_pipe(&e) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(
                std::io::stdout(),
                "Error while executing topic command : {e:#}"
            );
            std::process::ExitCode::FAILURE
        }
    }
}

/// One topic as the cluster's metadata describes it.
struct TopicInfo {
    name: String,
    id: uuid::Uuid,
    internal: bool,
    partitions: Vec<PartitionInfo>,
}

struct PartitionInfo {
    index: i32,
    leader: i32,
    replicas: Vec<i32>,
    isr: Vec<i32>,
}

impl TopicInfo {
    fn is_internal(&self) -> bool {
        self.internal || self.name.starts_with("__")
    }
}

/// Every topic of the cluster, from a Metadata request for all topics that never creates one
/// (a request naming a topic can auto-create it).
fn all_topics(
    cluster: &ClusterArgs,
    security: &Security,
    rt: &tokio::runtime::Runtime,
) -> anyhow::Result<Vec<TopicInfo>> {
    let response = rt.block_on(async {
        let mut connection = Connection::bootstrap(&cluster.bootstrap_server, security).await?;
        let version = connection.version::<MetadataRequest>()?;
        // Version 0 asks for every topic with an empty list, later versions with none.
        let topics = if version == 0 { Some(Vec::new()) } else { None };
        let request = MetadataRequest::default()
            .with_topics(topics)
            .with_allow_auto_topic_creation(false);
        connection.call(version, &request).await
    })?;
    let mut topics = Vec::new();
    for t in response.topics {
        let Some(name) = t.name.map(|n| n.0.to_string()) else {
            continue;
        };
        if let Some(e) = ResponseError::try_from_code(t.error_code) {
            bail!("topic {name}: {e}");
        }
        let mut partitions: Vec<PartitionInfo> = t
            .partitions
            .into_iter()
            .map(|p| PartitionInfo {
                index: p.partition_index,
                leader: p.leader_id.0,
                replicas: p.replica_nodes.iter().map(|b| b.0).collect(),
                isr: p.isr_nodes.iter().map(|b| b.0).collect(),
            })
            .collect();
        partitions.sort_by_key(|p| p.index);
        topics.push(TopicInfo {
            name,
            id: t.topic_id,
            internal: t.is_internal,
            partitions,
        });
    }
    topics.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(topics)
}

/// `--topic` as Kafka reads it outside --create: a regular expression matching whole names.
fn topic_filter(topic: Option<&str>) -> anyhow::Result<Option<regex::Regex>> {
    topic
        .map(|t| {
            regex::Regex::new(&format!("^(?:{t})$"))
                .with_context(|| format!("--topic `{t}` is not a regular expression"))
        })
        .transpose()
}

/// A topic id as Kafka prints it: URL-safe base64 of its 16 bytes, without padding.
fn topic_id(id: &uuid::Uuid) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(id.as_bytes())
}

/// Runs `agent topics`.
pub fn run(args: TopicsArgs) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = args
        .cluster
        .client_config(&args.command_properties)?
        .create()
        .context("creating the admin client")?;
    // The tool's own connections (Metadata, IncrementalAlterConfigs) take the same
    // properties: security, client.id and the timeouts.
    let security = args.cluster.wire_security_with(&args.command_properties)?;
    let rt = runtime()?;
    let options = AdminOptions::new().request_timeout(Some(REQUEST_TIMEOUT));
    let mut out = std::io::stdout().lock();
    if args.create {
        let name = args
            .topic
            .as_deref()
            .context("--topic is required for --create")?;
        // -1: the cluster's default (CreateTopics v4, KIP-464).
        let mut new = NewTopic::new(
            name,
            args.partitions.unwrap_or(-1),
            TopicReplication::Fixed(args.replication_factor.unwrap_or(-1)),
        );
        for pair in &args.configs {
            let (k, v) = split_property(pair)?;
            new = new.set(k, v);
        }
        for result in rt.block_on(admin.create_topics([&new], &options))? {
            match result {
                Ok(name) => writeln!(out, "Created topic {name}.")?,
                Err((_, code))
                    if args.if_not_exists
                        && code == rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists => {}
                Err((name, code)) => bail!("cannot create topic {name}: {code}"),
            }
        }
        return Ok(());
    }
    let filter = topic_filter(args.topic.as_deref())?;
    let topics: Vec<TopicInfo> = all_topics(&args.cluster, &security, &rt)?
        .into_iter()
        .filter(|t| filter.as_ref().is_none_or(|f| f.is_match(&t.name)))
        .filter(|t| !(args.exclude_internal && t.is_internal()))
        .collect();
    if args.list {
        for t in &topics {
            writeln!(out, "{}", t.name)?;
        }
        return Ok(());
    }
    // --describe, --alter and --delete of a --topic that matches nothing.
    if topics.is_empty()
        && let Some(topic) = &args.topic
    {
        if args.if_exists {
            return Ok(());
        }
        bail!("Topic '{topic}' does not exist as expected");
    }
    if args.describe {
        describe(
            &admin,
            &rt,
            &options,
            &topics,
            args.topics_with_overrides,
            &mut out,
        )?;
    } else if args.alter {
        if args.topic.is_none() {
            bail!("--topic is required for --alter");
        }
        if args.partitions.is_none() && args.configs.is_empty() {
            bail!("--alter needs --partitions or --config");
        }
        for t in &topics {
            alter(
                (&args.cluster.bootstrap_server, &security),
                &admin,
                &rt,
                &options,
                &t.name,
                args.partitions,
                &args.configs,
            )?;
            writeln!(out, "Altered topic {}.", t.name)?;
        }
    } else if args.delete {
        if args.topic.is_none() {
            bail!("--topic is required for --delete");
        }
        let names: Vec<&str> = topics.iter().map(|t| t.name.as_str()).collect();
        for result in rt.block_on(admin.delete_topics(&names, &options))? {
            match result {
                Ok(name) => writeln!(out, "Deleted topic {name}.")?,
                Err((name, code)) => bail!("cannot delete topic {name}: {code}"),
            }
        }
    }
    Ok(())
}

/// `wire`: the bootstrap servers and how to connect, for the tool's own requests.
fn alter(
    wire: (&str, &Security),
    admin: &AdminClient<DefaultClientContext>,
    rt: &tokio::runtime::Runtime,
    options: &AdminOptions,
    name: &str,
    partitions: Option<i32>,
    configs: &[String],
) -> anyhow::Result<()> {
    if let Some(partitions) = partitions {
        let count = usize::try_from(partitions).context("--partitions must be positive")?;
        for result in
            rt.block_on(admin.create_partitions([&NewPartitions::new(name, count)], options))?
        {
            if let Err((name, code)) = result {
                bail!("cannot change the partitions of {name}: {code}");
            }
        }
    }
    if !configs.is_empty() {
        // Incrementally (IncrementalAlterConfigs SET), so that the topic's other overrides
        // stay: librdkafka's AlterConfigs would replace them all.
        let mut pairs = Vec::new();
        for pair in configs {
            let (k, v) = split_property(pair)?;
            pairs.push((k.to_owned(), v.to_owned()));
        }
        rt.block_on(async {
            let mut connection = Connection::bootstrap(wire.0, wire.1).await?;
            super::configs::set_topic_configs(&mut connection, name, pairs).await
        })
        .with_context(|| format!("cannot change the configs of {name}"))?;
    }
    Ok(())
}

/// Prints topics as `kafka-topics.sh --describe` of Kafka 3.x does: a line per topic (with its
/// id and the configs that override the defaults), then a line per partition (left out with
/// `overrides_only`, which also leaves out the topics without overrides).
fn describe(
    admin: &AdminClient<DefaultClientContext>,
    rt: &tokio::runtime::Runtime,
    options: &AdminOptions,
    topics: &[TopicInfo],
    overrides_only: bool,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    for t in topics {
        let configs = rt
            .block_on(admin.describe_configs([&ResourceSpecifier::Topic(&t.name)], options))?
            .into_iter()
            .filter_map(Result::ok)
            .flat_map(|resource| resource.entries)
            .filter(|e| !e.is_default)
            .filter_map(|e| e.value.map(|v| format!("{}={v}", e.name)))
            .collect::<Vec<_>>();
        if overrides_only && configs.is_empty() {
            continue;
        }
        let replication = t.partitions.first().map_or(0, |p| p.replicas.len());
        writeln!(
            out,
            "Topic: {}\tTopicId: {}\tPartitionCount: {}\tReplicationFactor: {}\tConfigs: {}",
            t.name,
            topic_id(&t.id),
            t.partitions.len(),
            replication,
            configs.join(",")
        )?;
        if overrides_only {
            continue;
        }
        for p in &t.partitions {
            let list = |ids: &[i32]| ids.iter().map(i32::to_string).collect::<Vec<_>>().join(",");
            writeln!(
                out,
                "\tTopic: {}\tPartition: {}\tLeader: {}\tReplicas: {}\tIsr: {}",
                t.name,
                p.index,
                p.leader,
                list(&p.replicas),
                list(&p.isr)
            )?;
        }
    }
    Ok(())
}
