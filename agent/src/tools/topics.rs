//! `agent topics`: create, list, describe, alter and delete topics (Kafka's `kafka-topics.sh`).

use std::io::Write;

use anyhow::{Context, bail};
use clap::Args;
use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, NewPartitions, NewTopic, ResourceSpecifier,
    TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::metadata::Metadata;

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
    /// The topic.
    #[arg(long)]
    topic: Option<String>,
    /// Number of partitions (create: default 1; alter: the new, larger count).
    #[arg(long)]
    partitions: Option<i32>,
    /// Replication factor (the bundled broker is single-node: 1).
    #[arg(long = "replication-factor", default_value_t = 1)]
    replication_factor: i32,
    /// A topic config `key=value`; repeatable.
    #[arg(long = "config", value_name = "KEY=VALUE")]
    configs: Vec<String>,
    /// With --create: no error if the topic exists.
    #[arg(long = "if-not-exists")]
    if_not_exists: bool,
    /// A client property `key=value` for librdkafka; repeatable.
    #[arg(long = "command-property", value_name = "KEY=VALUE")]
    command_properties: Vec<String>,
}

/// Runs `agent topics`.
pub fn run(args: TopicsArgs) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = args
        .cluster
        .client_config(&args.command_properties)?
        .create()
        .context("creating the admin client")?;
    let rt = runtime()?;
    let options = AdminOptions::new().request_timeout(Some(REQUEST_TIMEOUT));
    let topic = || {
        args.topic
            .as_deref()
            .context("--topic is required for this action")
    };
    let mut out = std::io::stdout().lock();
    if args.create {
        let name = topic()?;
        let mut new = NewTopic::new(
            name,
            args.partitions.unwrap_or(1),
            TopicReplication::Fixed(args.replication_factor),
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
    } else if args.list {
        let metadata = fetch_metadata(&admin, None)?;
        let mut names: Vec<&str> = metadata.topics().iter().map(|t| t.name()).collect();
        names.sort_unstable();
        for name in names {
            writeln!(out, "{name}")?;
        }
    } else if args.describe {
        describe(&admin, &rt, &options, args.topic.as_deref(), &mut out)?;
    } else if args.alter {
        let name = topic()?;
        if args.partitions.is_none() && args.configs.is_empty() {
            bail!("--alter needs --partitions or --config");
        }
        if let Some(partitions) = args.partitions {
            let count = usize::try_from(partitions).context("--partitions must be positive")?;
            for result in
                rt.block_on(admin.create_partitions([&NewPartitions::new(name, count)], &options))?
            {
                if let Err((name, code)) = result {
                    bail!("cannot change the partitions of {name}: {code}");
                }
            }
        }
        if !args.configs.is_empty() {
            let mut alter = AlterConfig::new(ResourceSpecifier::Topic(name));
            for pair in &args.configs {
                let (k, v) = split_property(pair)?;
                alter = alter.set(k, v);
            }
            for result in rt.block_on(admin.alter_configs([&alter], &options))? {
                if let Err((_, code)) = result {
                    bail!("cannot change the configs of {name}: {code}");
                }
            }
        }
        writeln!(out, "Altered topic {name}.")?;
    } else if args.delete {
        let name = topic()?;
        for result in rt.block_on(admin.delete_topics(&[name], &options))? {
            if let Err((name, code)) = result {
                bail!("cannot delete topic {name}: {code}");
            }
        }
        writeln!(out, "Deleted topic {name}.")?;
    }
    Ok(())
}

fn fetch_metadata(
    admin: &AdminClient<DefaultClientContext>,
    topic: Option<&str>,
) -> anyhow::Result<Metadata> {
    admin
        .inner()
        .fetch_metadata(topic, super::REQUEST_TIMEOUT)
        .context("fetching metadata")
}

/// Prints topics as `kafka-topics.sh --describe` does.
fn describe(
    admin: &AdminClient<DefaultClientContext>,
    rt: &tokio::runtime::Runtime,
    options: &AdminOptions,
    topic: Option<&str>,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let metadata = fetch_metadata(admin, topic)?;
    let mut topics: Vec<_> = metadata.topics().iter().collect();
    topics.sort_by_key(|t| t.name());
    for t in topics {
        if let Some(error) = t.error() {
            let code = rdkafka::types::RDKafkaErrorCode::from(error);
            bail!("topic {}: {code}", t.name());
        }
        let configs = rt
            .block_on(admin.describe_configs([&ResourceSpecifier::Topic(t.name())], options))?
            .into_iter()
            .filter_map(Result::ok)
            .flat_map(|resource| resource.entries)
            .filter(|e| !e.is_default)
            .filter_map(|e| e.value.map(|v| format!("{}={v}", e.name)))
            .collect::<Vec<_>>()
            .join(",");
        let replication = t.partitions().first().map_or(0, |p| p.replicas().len());
        writeln!(
            out,
            "Topic: {}\tPartitionCount: {}\tReplicationFactor: {}\tConfigs: {}",
            t.name(),
            t.partitions().len(),
            replication,
            configs
        )?;
        let mut partitions: Vec<_> = t.partitions().iter().collect();
        partitions.sort_by_key(|p| p.id());
        for p in partitions {
            let list = |ids: &[i32]| ids.iter().map(i32::to_string).collect::<Vec<_>>().join(",");
            writeln!(
                out,
                "\tTopic: {}\tPartition: {}\tLeader: {}\tReplicas: {}\tIsr: {}",
                t.name(),
                p.id(),
                p.leader(),
                list(p.replicas()),
                list(p.isr())
            )?;
        }
    }
    Ok(())
}
