//! `agent groups`: list, describe (with lag), reset offsets of and delete consumer groups, as
//! Kafka's `kafka-consumer-groups.sh` does.

use std::io::Write;

use anyhow::{Context, bail};
use clap::Args;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use super::{ClusterArgs, REQUEST_TIMEOUT, runtime};

/// Flags of `agent groups`, named as `kafka-consumer-groups.sh` names them.
#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("action").required(true).args(["list", "describe", "reset_offsets", "delete"])))]
#[command(group(clap::ArgGroup::new("target").args(["to_earliest", "to_latest", "to_offset", "shift_by"])))]
pub struct GroupsArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// List all groups.
    #[arg(long)]
    list: bool,
    /// Describe a group: committed offset, log end offset and lag per partition, and owners.
    #[arg(long)]
    describe: bool,
    /// Move a group's committed offsets (dry run unless --execute).
    #[arg(long = "reset-offsets")]
    reset_offsets: bool,
    /// Delete a group.
    #[arg(long)]
    delete: bool,
    /// The group.
    #[arg(long)]
    group: Option<String>,
    /// With --reset-offsets: the topic whose offsets move; `topic:0,1` moves only those
    /// partitions, as in Kafka.
    #[arg(long)]
    topic: Option<String>,
    /// Reset to the earliest offset.
    #[arg(long = "to-earliest")]
    to_earliest: bool,
    /// Reset to the latest offset.
    #[arg(long = "to-latest")]
    to_latest: bool,
    /// Reset to this offset.
    #[arg(long = "to-offset")]
    to_offset: Option<i64>,
    /// Move each committed offset by this many (negative: back), kept within the log.
    #[arg(long = "shift-by", allow_hyphen_values = true)]
    shift_by: Option<i64>,
    /// With --describe: every group instead of --group.
    #[arg(long = "all-groups", conflicts_with = "group")]
    all_groups: bool,
    /// Apply the reset (without it, only the plan is printed).
    #[arg(long)]
    execute: bool,
    /// With --reset-offsets: only print the plan, committing nothing (the default, said
    /// explicitly as Kafka asks scripts to).
    #[arg(long = "dry-run", conflicts_with = "execute")]
    dry_run: bool,
}

/// Runs `agent groups`.
pub fn run(args: GroupsArgs) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    let group = || {
        args.group
            .as_deref()
            .context("--group is required for this action")
    };
    if args.list {
        let consumer: BaseConsumer = args
            .cluster
            .client_config(&[])?
            .create()
            .context("creating the client")?;
        let list = consumer
            .fetch_group_list(None, REQUEST_TIMEOUT)
            .context("listing groups")?;
        let mut names: Vec<&str> = list.groups().iter().map(|g| g.name()).collect();
        names.sort_unstable();
        for name in names {
            writeln!(out, "{name}")?;
        }
    } else if args.describe && args.all_groups {
        for name in group_names(&args.cluster)? {
            describe(&args.cluster, &name, &mut out)?;
        }
    } else if args.describe {
        describe(&args.cluster, group()?, &mut out)?;
    } else if args.reset_offsets {
        reset(&args, group()?, &mut out)?;
    } else if args.delete {
        let group = group()?;
        let admin: AdminClient<DefaultClientContext> = args
            .cluster
            .client_config(&[])?
            .create()
            .context("creating the admin client")?;
        let options = AdminOptions::new().request_timeout(Some(REQUEST_TIMEOUT));
        for result in runtime()?.block_on(admin.delete_groups(&[group], &options))? {
            if let Err((name, code)) = result {
                bail!("cannot delete group {name}: {code}");
            }
        }
        writeln!(
            out,
            "Deletion of requested consumer groups ('{group}') was successful."
        )?;
    }
    Ok(())
}

/// The names of every group of the cluster, sorted.
fn group_names(cluster: &ClusterArgs) -> anyhow::Result<Vec<String>> {
    let consumer: BaseConsumer = cluster
        .client_config(&[])?
        .create()
        .context("creating the client")?;
    let list = consumer
        .fetch_group_list(None, REQUEST_TIMEOUT)
        .context("listing groups")?;
    let mut names: Vec<String> = list.groups().iter().map(|g| g.name().to_owned()).collect();
    names.sort_unstable();
    Ok(names)
}

/// A consumer acting for `group` without joining it (for offset reads and commits).
fn group_client(cluster: &ClusterArgs, group: &str) -> anyhow::Result<BaseConsumer> {
    let mut config = cluster.client_config(&[])?;
    config
        .set("group.id", group)
        .set("enable.auto.commit", "false");
    config.create().context("creating the client")
}

/// One row of `--describe`.
struct Row {
    topic: String,
    partition: i32,
    current: Option<i64>,
    end: i64,
    owner: Option<(String, String, String)>,
}

/// (topic, partition, (member id, host, client id)) of the members of a consumer-protocol
/// group; none when the group is not one or the cluster does not serve ConsumerGroupDescribe.
fn consumer_protocol_owners(
    cluster: &ClusterArgs,
    group: &str,
) -> Vec<(String, i32, (String, String, String))> {
    use kafka_protocol::messages::{ConsumerGroupDescribeRequest, GroupId};
    use kafka_protocol::protocol::StrBytes;

    let described = || -> anyhow::Result<_> {
        let security = cluster.wire_security()?;
        super::runtime()?.block_on(async {
            let mut connection =
                super::wire::Connection::bootstrap(&cluster.bootstrap_server, &security).await?;
            let version = connection.version::<ConsumerGroupDescribeRequest>()?;
            let request = ConsumerGroupDescribeRequest::default()
                .with_group_ids(vec![GroupId(StrBytes::from_string(group.to_owned()))]);
            connection.call(version, &request).await
        })
    };
    let Ok(response) = described() else {
        return Vec::new();
    };
    let mut owners = Vec::new();
    for described in response.groups.into_iter().filter(|g| g.error_code == 0) {
        for member in described.members {
            for assigned in &member.assignment.topic_partitions {
                for &partition in &assigned.partitions {
                    owners.push((
                        assigned.topic_name.0.to_string(),
                        partition,
                        (
                            member.member_id.to_string(),
                            format!("/{}", member.client_host.trim_start_matches('/')),
                            member.client_id.to_string(),
                        ),
                    ));
                }
            }
        }
    }
    owners
}

fn describe(cluster: &ClusterArgs, group: &str, out: &mut impl Write) -> anyhow::Result<()> {
    let consumer = group_client(cluster, group)?;
    let list = consumer
        .fetch_group_list(Some(group), REQUEST_TIMEOUT)
        .context("describing the group")?;
    let info = list
        .groups()
        .iter()
        .find(|g| g.name() == group)
        .with_context(|| format!("group {group} not found"))?;
    // Who owns which partition, from the members' consumer-protocol assignments.
    let mut owners = Vec::new();
    for member in info.members() {
        for (topic, partition) in member
            .assignment()
            .map(decode_assignment)
            .unwrap_or_default()
        {
            owners.push((
                topic,
                partition,
                (
                    member.id().to_owned(),
                    format!("/{}", member.client_host().trim_start_matches('/')),
                    member.client_id().to_owned(),
                ),
            ));
        }
    }
    // A KIP-848 (consumer protocol) group has no members in DescribeGroups: its owners come
    // from ConsumerGroupDescribe.
    if owners.is_empty() {
        owners = consumer_protocol_owners(cluster, group);
    }
    // Committed offsets of every partition of every topic; keep those the group has.
    let metadata = consumer
        .fetch_metadata(None, REQUEST_TIMEOUT)
        .context("fetching metadata")?;
    let mut all = TopicPartitionList::new();
    for topic in metadata.topics() {
        for p in topic.partitions() {
            all.add_partition(topic.name(), p.id());
        }
    }
    let committed = consumer
        .committed_offsets(all, REQUEST_TIMEOUT)
        .context("fetching committed offsets")?;
    let mut rows = Vec::new();
    for element in committed.elements() {
        let current = match element.offset() {
            Offset::Offset(n) => Some(n),
            _ => None,
        };
        let owner = owners
            .iter()
            .find(|(t, p, _)| t == element.topic() && *p == element.partition())
            .map(|(_, _, o)| o.clone());
        if current.is_none() && owner.is_none() {
            continue;
        }
        let (_, end) = consumer
            .fetch_watermarks(element.topic(), element.partition(), REQUEST_TIMEOUT)
            .with_context(|| {
                format!(
                    "log end offset of {}-{}",
                    element.topic(),
                    element.partition()
                )
            })?;
        rows.push(Row {
            topic: element.topic().to_owned(),
            partition: element.partition(),
            current,
            end,
            owner,
        });
    }
    rows.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    if rows.is_empty() {
        writeln!(
            out,
            "Consumer group '{group}' has no active members and no committed offsets."
        )?;
        return Ok(());
    }
    let dash = || "-".to_owned();
    let table: Vec<[String; 9]> = rows
        .into_iter()
        .map(|r| {
            let (id, host, client) = r.owner.unwrap_or_else(|| (dash(), dash(), dash()));
            [
                group.to_owned(),
                r.topic,
                r.partition.to_string(),
                r.current.map_or_else(dash, |c| c.to_string()),
                r.end.to_string(),
                r.current
                    .map_or_else(dash, |c| (r.end - c).max(0).to_string()),
                id,
                host,
                client,
            ]
        })
        .collect();
    let header = [
        "GROUP",
        "TOPIC",
        "PARTITION",
        "CURRENT-OFFSET",
        "LOG-END-OFFSET",
        "LAG",
        "CONSUMER-ID",
        "HOST",
        "CLIENT-ID",
    ];
    print_table(out, &header, &table)
}

/// Prints rows with columns padded to their widest cell plus one space, as Kafka's tools do.
fn print_table<const N: usize>(
    out: &mut impl Write,
    header: &[&str; N],
    rows: &[[String; N]],
) -> anyhow::Result<()> {
    let mut widths = header.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    writeln!(out)?;
    let line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == N {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<w$} ", w = w));
            }
        }
        text
    };
    writeln!(out, "{}", line(header.to_vec()))?;
    for row in rows {
        writeln!(out, "{}", line(row.iter().map(String::as_str).collect()))?;
    }
    Ok(())
}

fn reset(args: &GroupsArgs, group: &str, out: &mut impl Write) -> anyhow::Result<()> {
    let spec = args
        .topic
        .as_deref()
        .context("--reset-offsets needs --topic")?;
    // `topic:0,1`: only those partitions.
    let (topic, only) = match spec.rsplit_once(':') {
        Some((topic, list)) => {
            let only = list
                .split(',')
                .map(|p| {
                    p.trim()
                        .parse::<i32>()
                        .with_context(|| format!("--topic {spec}: `{p}` is not a partition number"))
                })
                .collect::<anyhow::Result<Vec<i32>>>()?;
            (topic, Some(only))
        }
        None => (spec, None),
    };
    if !(args.to_earliest || args.to_latest || args.to_offset.is_some() || args.shift_by.is_some())
    {
        bail!("--reset-offsets needs --to-earliest, --to-latest, --to-offset or --shift-by");
    }
    let consumer = group_client(&args.cluster, group)?;
    let metadata = consumer
        .fetch_metadata(Some(topic), REQUEST_TIMEOUT)
        .context("fetching metadata")?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .map(|t| t.partitions().iter().map(|p| p.id()).collect())
        .unwrap_or_default();
    if partitions.is_empty() {
        bail!("topic {topic} not found");
    }
    if let Some(only) = &only
        && let Some(missing) = only.iter().find(|p| !partitions.contains(p))
    {
        bail!("topic {topic} has no partition {missing}");
    }
    let partitions: Vec<i32> = match only {
        Some(only) => only,
        None => partitions,
    };
    let committed = match args.shift_by {
        Some(_) => {
            let mut wanted = TopicPartitionList::new();
            for p in &partitions {
                wanted.add_partition(topic, *p);
            }
            Some(
                consumer
                    .committed_offsets(wanted, REQUEST_TIMEOUT)
                    .context("reading the committed offsets")?,
            )
        }
        None => None,
    };
    let mut plan = TopicPartitionList::new();
    let mut rows = Vec::new();
    for p in partitions {
        let (low, high) = consumer
            .fetch_watermarks(topic, p, REQUEST_TIMEOUT)
            .with_context(|| format!("offsets of {topic}-{p}"))?;
        let target = match (args.to_offset, args.shift_by, &committed) {
            (Some(n), _, _) => n.clamp(low, high),
            (None, Some(shift), Some(committed)) => {
                let current = committed
                    .find_partition(topic, p)
                    .and_then(|e| e.offset().to_raw())
                    .filter(|o| *o >= 0)
                    .with_context(|| {
                        format!(
                            "Cannot shift offset for partition {topic}-{p} since there is no \
                             current committed offset"
                        )
                    })?;
                current.saturating_add(shift).clamp(low, high)
            }
            _ if args.to_earliest => low,
            _ => high,
        };
        plan.add_partition_offset(topic, p, Offset::Offset(target))?;
        rows.push([
            group.to_owned(),
            topic.to_owned(),
            p.to_string(),
            target.to_string(),
        ]);
    }
    if !args.execute && !args.dry_run {
        eprintln!(
            "WARN: No action will be performed as the --execute option is missing. \
             You should add the --dry-run option explicitly if you are scripting this command."
        );
    }
    if args.execute {
        consumer
            .commit(&plan, CommitMode::Sync)
            .context("committing the new offsets (the group must have no active members)")?;
    }
    print_table(out, &["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"], &rows)
}

/// The (topic, partition) pairs of a consumer-protocol assignment (version, topics, user data).
fn decode_assignment(bytes: &[u8]) -> Vec<(String, i32)> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        if b.len() < n {
            return None;
        }
        let (head, tail) = b.split_at(n);
        *b = tail;
        Some(head)
    }
    fn i16_(b: &mut &[u8]) -> Option<i16> {
        take(b, 2).map(|x| i16::from_be_bytes([x[0], x[1]]))
    }
    fn i32_(b: &mut &[u8]) -> Option<i32> {
        take(b, 4).map(|x| i32::from_be_bytes([x[0], x[1], x[2], x[3]]))
    }
    let mut b = bytes;
    let mut out = Vec::new();
    let parse = |b: &mut &[u8], out: &mut Vec<(String, i32)>| -> Option<()> {
        i16_(b)?;
        let topics = i32_(b)?;
        for _ in 0..topics.max(0) {
            let len = i16_(b)?;
            let name = String::from_utf8_lossy(take(b, len.max(0) as usize)?).into_owned();
            let count = i32_(b)?;
            for _ in 0..count.max(0) {
                out.push((name.clone(), i32_(b)?));
            }
        }
        Some(())
    };
    let _ = parse(&mut b, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_consumer_assignments_and_survives_garbage() {
        let mut bytes = vec![
            0, 0, 0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 5,
        ];
        bytes.extend_from_slice(&[0, 0, 0, 0]);
        assert_eq!(
            decode_assignment(&bytes),
            [("t".to_owned(), 3), ("t".to_owned(), 5)]
        );
        assert_eq!(decode_assignment(&[0, 0, 0x7f, 0xff, 0xff, 0xff]), []);
        assert_eq!(decode_assignment(&[]), []);
    }
}
