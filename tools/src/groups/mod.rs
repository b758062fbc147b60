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
#[command(group(clap::ArgGroup::new("target").args(["to_earliest", "to_latest", "to_offset", "shift_by", "to_datetime", "by_duration", "to_current"])))]
#[command(group(clap::ArgGroup::new("view").args(["members", "state", "offsets"])))]
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
    /// With --describe: the members of the group (CONSUMER-ID, HOST, CLIENT-ID, #PARTITIONS).
    #[arg(long, requires = "describe")]
    members: bool,
    /// With --describe: the group's coordinator, assignment strategy, state and member count.
    #[arg(long, requires = "describe")]
    state: bool,
    /// With --describe: offsets and lag per partition (the default).
    #[arg(long, requires = "describe")]
    offsets: bool,
    /// With --describe --members or --state: more columns (epochs and assignments).
    #[arg(long)]
    verbose: bool,
    /// With --reset-offsets: the topic whose offsets move; `topic:0,1` moves only those
    /// partitions, as in Kafka. May be repeated.
    #[arg(long)]
    topic: Vec<String>,
    /// With --reset-offsets: every topic the group has committed offsets for.
    #[arg(long = "all-topics", conflicts_with = "topic")]
    all_topics: bool,
    /// Reset to the first offset whose timestamp is at or after this time
    /// (`YYYY-MM-DDTHH:mm:SS.sss`, optionally followed by `Z` or `+hh:mm`/`-hh:mm`; without a
    /// zone, UTC).
    #[arg(long = "to-datetime")]
    to_datetime: Option<String>,
    /// Reset to the first offset whose timestamp is at or after now minus this ISO-8601
    /// duration (`PnDTnHnMnS`, e.g. `PT1H30M`, `P1D`).
    #[arg(long = "by-duration")]
    by_duration: Option<String>,
    /// Reset to the committed offset (the log end offset where there is none).
    #[arg(long = "to-current")]
    to_current: bool,
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
    /// With --describe, --reset-offsets or --delete: every group instead of --group.
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
    } else if args.describe {
        let names = match args.all_groups {
            true => group_names(&args.cluster)?,
            false => vec![group()?.to_owned()],
        };
        for name in &names {
            if args.members {
                describe_members(&args.cluster, name, args.verbose, &mut out)?;
            } else if args.state {
                describe_state(&args.cluster, name, args.verbose, &mut out)?;
            } else {
                describe(&args.cluster, name, &mut out)?;
            }
        }
    } else if args.reset_offsets {
        let names = match args.all_groups {
            true => group_names(&args.cluster)?,
            false => vec![group()?.to_owned()],
        };
        reset(&args, &names, &mut out)?;
    } else if args.delete {
        let names = match args.all_groups {
            true => group_names(&args.cluster)?,
            false => vec![group()?.to_owned()],
        };
        delete(&args.cluster, &names, &mut out)?;
    }
    Ok(())
}

/// Deletes `names`, answering as Kafka does: one line when all went, else each failure.
fn delete(cluster: &ClusterArgs, names: &[String], out: &mut impl Write) -> anyhow::Result<()> {
    if names.is_empty() {
        bail!("there is no group to delete");
    }
    let admin: AdminClient<DefaultClientContext> = cluster
        .client_config(&[])?
        .create()
        .context("creating the admin client")?;
    let options = AdminOptions::new().request_timeout(Some(REQUEST_TIMEOUT));
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut deleted = Vec::new();
    let mut failed = Vec::new();
    for result in runtime()?.block_on(admin.delete_groups(&refs, &options))? {
        match result {
            Ok(name) => deleted.push(format!("'{name}'")),
            Err((name, code)) => failed.push((name, code)),
        }
    }
    if failed.is_empty() {
        writeln!(
            out,
            "Deletion of requested consumer groups ({}) was successful.",
            deleted.join(", ")
        )?;
        return Ok(());
    }
    writeln!(out, "\nError: Deletion of some consumer groups failed:")?;
    for (name, code) in &failed {
        writeln!(out, "* Group '{name}' could not be deleted due to: {code}")?;
    }
    if !deleted.is_empty() {
        writeln!(
            out,
            "\nThese consumer groups were deleted successfully: {}",
            deleted.join(", ")
        )?;
    }
    out.flush()?;
    bail!(
        "{} of {} group(s) could not be deleted",
        failed.len(),
        names.len()
    )
}

/// One member of a group, as `--describe --members` shows it.
struct Member {
    id: String,
    instance_id: Option<String>,
    host: String,
    client_id: String,
    assignment: Vec<(String, i32)>,
    target: Vec<(String, i32)>,
    epoch: Option<i32>,
}

/// A group, classic or consumer protocol (KIP-848), as `--describe --members/--state` see it.
struct GroupView {
    state: String,
    strategy: String,
    members: Vec<Member>,
    group_epoch: Option<i32>,
    target_epoch: Option<i32>,
}

/// The group's coordinator (node id, host, port), from FindCoordinator.
fn coordinator(cluster: &ClusterArgs, group: &str) -> anyhow::Result<(i32, String, i32)> {
    use kafka_protocol::messages::FindCoordinatorRequest;
    use kafka_protocol::protocol::StrBytes;
    let security = cluster.wire_security()?;
    runtime()?.block_on(async {
        let mut connection =
            super::wire::Connection::bootstrap(&cluster.bootstrap_server, &security).await?;
        let version = connection.version::<FindCoordinatorRequest>()?;
        let key = StrBytes::from_string(group.to_owned());
        let request = if version >= 4 {
            FindCoordinatorRequest::default()
                .with_key_type(0)
                .with_coordinator_keys(vec![key])
        } else {
            FindCoordinatorRequest::default().with_key(key)
        };
        let response = connection.call(version, &request).await?;
        let (code, node, host, port) = match response.coordinators.first() {
            Some(c) if version >= 4 => (c.error_code, c.node_id.0, c.host.to_string(), c.port),
            _ => (
                response.error_code,
                response.node_id.0,
                response.host.to_string(),
                response.port,
            ),
        };
        if code != 0 {
            bail!("finding the coordinator of group {group}: error code {code}");
        }
        Ok((node, host, port))
    })
}

/// The group as ConsumerGroupDescribe (consumer protocol) or DescribeGroups (classic) tell it;
/// a group that does not exist has the state `Dead`.
fn group_view(cluster: &ClusterArgs, group: &str) -> anyhow::Result<GroupView> {
    if let Some(view) = consumer_protocol_view(cluster, group) {
        return Ok(view);
    }
    let consumer = group_client(cluster, group)?;
    let list = consumer
        .fetch_group_list(Some(group), REQUEST_TIMEOUT)
        .context("describing the group")?;
    let Some(info) = list.groups().iter().find(|g| g.name() == group) else {
        return Ok(GroupView {
            state: "Dead".to_owned(),
            strategy: String::new(),
            members: Vec::new(),
            group_epoch: None,
            target_epoch: None,
        });
    };
    let members = info
        .members()
        .iter()
        .map(|m| Member {
            id: m.id().to_owned(),
            instance_id: None,
            host: format!("/{}", m.client_host().trim_start_matches('/')),
            client_id: m.client_id().to_owned(),
            assignment: m.assignment().map(decode_assignment).unwrap_or_default(),
            target: Vec::new(),
            epoch: None,
        })
        .collect();
    Ok(GroupView {
        state: info.state().to_owned(),
        strategy: info.protocol().to_owned(),
        members,
        group_epoch: None,
        target_epoch: None,
    })
}

/// A consumer-protocol group from ConsumerGroupDescribe, asked of its coordinator; none when
/// the group is not one or the cluster does not serve the request.
fn consumer_protocol_view(cluster: &ClusterArgs, group: &str) -> Option<GroupView> {
    use kafka_protocol::messages::{ConsumerGroupDescribeRequest, GroupId};
    use kafka_protocol::protocol::StrBytes;

    let described = || -> anyhow::Result<_> {
        let security = cluster.wire_security()?;
        let coordinator = coordinator(cluster, group).ok();
        runtime()?.block_on(async {
            let bootstrap =
                super::wire::Connection::bootstrap(&cluster.bootstrap_server, &security).await?;
            let mut connection = match coordinator {
                Some((_, host, port)) => bootstrap
                    .open_another(&format!("{host}:{port}"))
                    .await
                    .unwrap_or(bootstrap),
                None => bootstrap,
            };
            let version = connection.version::<ConsumerGroupDescribeRequest>()?;
            let request = ConsumerGroupDescribeRequest::default()
                .with_group_ids(vec![GroupId(StrBytes::from_string(group.to_owned()))]);
            connection.call(version, &request).await
        })
    };
    let response = described().ok()?;
    let g = response.groups.into_iter().find(|g| g.error_code == 0)?;
    let pairs = |a: &kafka_protocol::messages::consumer_group_describe_response::Assignment| {
        let mut out = Vec::new();
        for t in &a.topic_partitions {
            for &p in &t.partitions {
                out.push((t.topic_name.0.to_string(), p));
            }
        }
        out
    };
    let members = g
        .members
        .iter()
        .map(|m| Member {
            id: m.member_id.to_string(),
            instance_id: m.instance_id.as_ref().map(|i| i.to_string()),
            host: format!("/{}", m.client_host.trim_start_matches('/')),
            client_id: m.client_id.to_string(),
            assignment: pairs(&m.assignment),
            target: pairs(&m.target_assignment),
            epoch: Some(m.member_epoch),
        })
        .collect();
    Some(GroupView {
        state: g.group_state.to_string(),
        strategy: g.assignor_name.to_string(),
        members,
        group_epoch: Some(g.group_epoch),
        target_epoch: Some(g.assignment_epoch),
    })
}

/// Kafka's notes on a group's state before its table: `false` when there is nothing to show.
fn state_note(group: &str, state: &str, rows: usize, out: &mut impl Write) -> anyhow::Result<bool> {
    match state {
        "Dead" => writeln!(out, "\nError: Consumer group '{group}' does not exist.")?,
        "Empty" => eprintln!("\nConsumer group '{group}' has no active members."),
        "PreparingRebalance" | "CompletingRebalance" | "Assigning" | "Reconciling" => {
            eprintln!("\nWarning: Consumer group '{group}' is rebalancing.")
        }
        _ => {}
    }
    Ok(state != "Dead" && rows > 0)
}

/// `topic:0,1;other:2`, as Kafka prints an assignment (`-` when empty).
fn assignment_text(assignment: &[(String, i32)]) -> String {
    let mut by_topic: std::collections::BTreeMap<&str, Vec<i32>> = Default::default();
    for (topic, partition) in assignment {
        by_topic.entry(topic).or_default().push(*partition);
    }
    if by_topic.is_empty() {
        return "-".to_owned();
    }
    by_topic
        .into_iter()
        .map(|(topic, mut partitions)| {
            partitions.sort_unstable();
            let list: Vec<String> = partitions.iter().map(i32::to_string).collect();
            format!("{topic}:{}", list.join(","))
        })
        .collect::<Vec<_>>()
        .join(";")
}

/// `--describe --members`: Kafka's columns, widths (at least 15) and trailing spaces.
fn describe_members(
    cluster: &ClusterArgs,
    group: &str,
    verbose: bool,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let view = group_view(cluster, group)?;
    let mut members: Vec<&Member> = view.members.iter().collect();
    members.sort_by(|a, b| a.id.cmp(&b.id));
    let show = state_note(group, &view.state, members.len(), out)?;
    let shown: &[&Member] = if show { &members } else { &[] };
    let width =
        |f: &dyn Fn(&Member) -> usize, min: usize| shown.iter().map(|m| f(m)).fold(min, usize::max);
    let group_w = group.len().max(15);
    let id_w = width(&|m| m.id.len(), 15);
    let instance_w = width(&|m| m.instance_id.as_deref().map_or(0, str::len), 17);
    let host_w = width(&|m| m.host.len(), 15);
    let client_w = width(&|m| m.client_id.len(), 15);
    let current_w = width(&|m| assignment_text(&m.assignment).len(), 20);
    let target_w = width(&|m| assignment_text(&m.target).len(), 20);
    let with_instance = shown.iter().any(|m| m.instance_id.is_some());
    let base = |cells: [&str; 6]| {
        let [g, id, instance, host, client, count] = cells;
        if with_instance {
            format!(
                "{g:<group_w$} {id:<id_w$} {instance:<instance_w$} {host:<host_w$} {client:<client_w$} {count:<15} "
            )
        } else {
            format!("{g:<group_w$} {id:<id_w$} {host:<host_w$} {client:<client_w$} {count:<15} ")
        }
    };
    let extra = |cells: [&str; 4]| {
        let [epoch, current, target_epoch, target] = cells;
        format!("{epoch:<15} {current:<current_w$} {target_epoch:<15} {target:<target_w$}")
    };
    let mut header = base([
        "GROUP",
        "CONSUMER-ID",
        "GROUP-INSTANCE-ID",
        "HOST",
        "CLIENT-ID",
        "#PARTITIONS",
    ]);
    if verbose {
        header.push_str(&extra([
            "CURRENT-EPOCH",
            "CURRENT-ASSIGNMENT",
            "TARGET-EPOCH",
            "TARGET-ASSIGNMENT",
        ]));
    }
    writeln!(out, "\n{header}")?;
    let dash = || "-".to_owned();
    for m in shown {
        let mut line = base([
            group,
            &m.id,
            m.instance_id.as_deref().unwrap_or(""),
            &m.host,
            &m.client_id,
            &m.assignment.len().to_string(),
        ]);
        if verbose {
            line.push_str(&extra([
                &m.epoch.map_or_else(dash, |e| e.to_string()),
                &assignment_text(&m.assignment),
                &view.target_epoch.map_or_else(dash, |e| e.to_string()),
                &assignment_text(&m.target),
            ]));
        }
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// `--describe --state`: Kafka's columns and widths.
fn describe_state(
    cluster: &ClusterArgs,
    group: &str,
    verbose: bool,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let view = group_view(cluster, group)?;
    if !state_note(group, &view.state, 1, out)? {
        return Ok(());
    }
    let (id, host, port) = coordinator(cluster, group)?;
    let coordinator = format!("{host}:{port}  ({id})");
    let coordinator_w = coordinator.len().max(25);
    let group_w = group.len().max(15);
    let strategy = if view.strategy.is_empty() {
        "-"
    } else {
        view.strategy.as_str()
    };
    let members = view.members.len().to_string();
    let dash = || "-".to_owned();
    if verbose {
        let line = |c: [&str; 7]| {
            format!(
                "{:<group_w$} {:<coordinator_w$} {:<20} {:<20} {:<15} {:<25} {}",
                c[0], c[1], c[2], c[3], c[4], c[5], c[6]
            )
        };
        writeln!(
            out,
            "\n{}",
            line([
                "GROUP",
                "COORDINATOR (ID)",
                "ASSIGNMENT-STRATEGY",
                "STATE",
                "GROUP-EPOCH",
                "TARGET-ASSIGNMENT-EPOCH",
                "#MEMBERS"
            ])
        )?;
        writeln!(
            out,
            "{}",
            line([
                group,
                &coordinator,
                strategy,
                &view.state,
                &view.group_epoch.map_or_else(dash, |e| e.to_string()),
                &view.target_epoch.map_or_else(dash, |e| e.to_string()),
                &members
            ])
        )?;
    } else {
        let line = |c: [&str; 5]| {
            format!(
                "{:<group_w$} {:<coordinator_w$} {:<20} {:<20} {}",
                c[0], c[1], c[2], c[3], c[4]
            )
        };
        writeln!(
            out,
            "\n{}",
            line([
                "GROUP",
                "COORDINATOR (ID)",
                "ASSIGNMENT-STRATEGY",
                "STATE",
                "#MEMBERS"
            ])
        )?;
        writeln!(
            out,
            "{}",
            line([group, &coordinator, strategy, &view.state, &members])
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
    ]
    .map(str::to_owned);
    // Kafka's widths: group, topic, consumer id and host at least 15 (or their widest),
    // PARTITION 10, the offsets and lag 15, the client id last and unpadded.
    let widest = |i: usize| table.iter().map(|r| r[i].len()).fold(15, usize::max);
    let widths = [widest(0), widest(1), 10, 15, 15, 15, widest(6), widest(7)];
    writeln!(out)?;
    for row in std::iter::once(&header).chain(&table) {
        let mut line = String::new();
        for (cell, w) in row.iter().zip(widths) {
            line.push_str(&format!("{cell:<w$} "));
        }
        line.push_str(&row[8]);
        writeln!(out, "{line}")?;
    }
    Ok(())
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

/// `--topic` values: `topic` or `topic:0,1`.
fn parse_topic_spec(spec: &str) -> anyhow::Result<(&str, Option<Vec<i32>>)> {
    match spec.rsplit_once(':') {
        Some((topic, list)) => {
            let only = list
                .split(',')
                .map(|p| {
                    p.trim()
                        .parse::<i32>()
                        .with_context(|| format!("--topic {spec}: `{p}` is not a partition number"))
                })
                .collect::<anyhow::Result<Vec<i32>>>()?;
            Ok((topic, Some(only)))
        }
        None => Ok((spec, None)),
    }
}

/// Where `--reset-offsets` moves a group's offsets to.
enum Target {
    Earliest,
    Latest,
    Offset(i64),
    Shift(i64),
    /// The first offset at or after this time (milliseconds since the epoch).
    Time(i64),
    Current,
}

fn target(args: &GroupsArgs) -> anyhow::Result<Target> {
    Ok(if args.to_earliest {
        Target::Earliest
    } else if args.to_latest {
        Target::Latest
    } else if let Some(n) = args.to_offset {
        Target::Offset(n)
    } else if let Some(n) = args.shift_by {
        Target::Shift(n)
    } else if let Some(text) = &args.to_datetime {
        Target::Time(parse_datetime(text)?)
    } else if let Some(text) = &args.by_duration {
        let back = parse_duration(text)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .context("the clock is before 1970")?;
        Target::Time(now.saturating_sub(back).as_millis() as i64)
    } else if args.to_current {
        Target::Current
    } else {
        bail!(
            "--reset-offsets needs one of --to-earliest, --to-latest, --to-offset, --shift-by, \
             --to-datetime, --by-duration, --to-current"
        )
    })
}

/// Resets the offsets of each of `groups` that has no active member; an active one is
/// refused with Kafka's message and the others still reset.
fn reset(args: &GroupsArgs, groups: &[String], out: &mut impl Write) -> anyhow::Result<()> {
    if args.topic.is_empty() && !args.all_topics {
        bail!("One of the reset scopes should be defined: --all-topics, --topic.");
    }
    let target = target(args)?;
    let mut rows = Vec::new();
    for group in groups {
        let state = group_view(&args.cluster, group)?.state;
        if state != "Empty" && state != "Dead" {
            writeln!(
                out,
                "\nError: Assignments can only be reset if the group '{group}' is inactive, \
                 but the current state is {state}."
            )?;
            continue;
        }
        reset_group(args, group, &target, &mut rows)?;
    }
    if !args.execute && !args.dry_run {
        eprintln!(
            "WARN: No action will be performed as the --execute option is missing. \
             You should add the --dry-run option explicitly if you are scripting this command."
        );
    }
    if rows.is_empty() {
        return Ok(());
    }
    print_table(out, &["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"], &rows)
}

fn reset_group(
    args: &GroupsArgs,
    group: &str,
    target: &Target,
    rows: &mut Vec<[String; 4]>,
) -> anyhow::Result<()> {
    let consumer = group_client(&args.cluster, group)?;
    let metadata = consumer
        .fetch_metadata(None, REQUEST_TIMEOUT)
        .context("fetching metadata")?;
    let partitions_of = |topic: &str| -> Vec<i32> {
        metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .map(|t| t.partitions().iter().map(|p| p.id()).collect())
            .unwrap_or_default()
    };
    let mut all = TopicPartitionList::new();
    for topic in metadata.topics() {
        for p in topic.partitions() {
            all.add_partition(topic.name(), p.id());
        }
    }
    let committed = consumer
        .committed_offsets(all, REQUEST_TIMEOUT)
        .context("reading the committed offsets")?;
    let committed_at = |topic: &str, p: i32| {
        committed
            .find_partition(topic, p)
            .and_then(|e| e.offset().to_raw())
            .filter(|o| *o >= 0)
    };
    let mut wanted: Vec<(String, i32)> = Vec::new();
    if args.all_topics {
        for e in committed.elements() {
            if committed_at(e.topic(), e.partition()).is_some() {
                wanted.push((e.topic().to_owned(), e.partition()));
            }
        }
    }
    for spec in &args.topic {
        let (topic, only) = parse_topic_spec(spec)?;
        let partitions = partitions_of(topic);
        if partitions.is_empty() {
            bail!("topic {topic} not found");
        }
        if let Some(only) = &only
            && let Some(missing) = only.iter().find(|p| !partitions.contains(p))
        {
            bail!("topic {topic} has no partition {missing}");
        }
        for p in only.unwrap_or(partitions) {
            wanted.push((topic.to_owned(), p));
        }
    }
    wanted.sort();
    wanted.dedup();
    // --to-datetime and --by-duration: ListOffsets by timestamp.
    let by_time = match target {
        Target::Time(ms) => {
            let mut list = TopicPartitionList::new();
            for (topic, p) in &wanted {
                list.add_partition_offset(topic, *p, Offset::Offset(*ms))?;
            }
            Some(
                consumer
                    .offsets_for_times(list, REQUEST_TIMEOUT)
                    .context("looking up offsets by timestamp")?,
            )
        }
        _ => None,
    };
    let mut plan = TopicPartitionList::new();
    for (topic, p) in &wanted {
        let (topic, p) = (topic.as_str(), *p);
        let (low, high) = consumer
            .fetch_watermarks(topic, p, REQUEST_TIMEOUT)
            .with_context(|| format!("offsets of {topic}-{p}"))?;
        let new = match target {
            Target::Earliest => low,
            Target::Latest => high,
            Target::Offset(n) => (*n).clamp(low, high),
            Target::Shift(shift) => {
                let current = committed_at(topic, p).with_context(|| {
                    format!(
                        "Cannot shift offset for partition {topic}-{p} since there is no \
                         current committed offset"
                    )
                })?;
                current.saturating_add(*shift).clamp(low, high)
            }
            // No record at or after the time: the log end, as Kafka.
            Target::Time(_) => by_time
                .as_ref()
                .and_then(|l| l.find_partition(topic, p))
                .and_then(|e| e.offset().to_raw())
                .filter(|o| *o >= 0)
                .unwrap_or(high),
            Target::Current => committed_at(topic, p).unwrap_or(high),
        };
        plan.add_partition_offset(topic, p, Offset::Offset(new))?;
        rows.push([
            group.to_owned(),
            topic.to_owned(),
            p.to_string(),
            new.to_string(),
        ]);
    }
    if args.execute && plan.count() > 0 {
        consumer
            .commit(&plan, CommitMode::Sync)
            .with_context(|| format!("committing the new offsets of group {group}"))?;
    }
    Ok(())
}

/// Days from 1970-01-01 to a proleptic Gregorian date.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Kafka's `--to-datetime`: `YYYY-MM-DDTHH:mm:SS.sss`, then `Z`, `+hh:mm`, `-hh:mm`, `+hhmm`
/// or nothing (UTC); gives milliseconds since the epoch.
fn parse_datetime(text: &str) -> anyhow::Result<i64> {
    let bad = || {
        anyhow::anyhow!(
            "--to-datetime {text}: expected YYYY-MM-DDTHH:mm:SS.sss, optionally followed by Z \
             or a zone offset such as +02:00"
        )
    };
    let b = text.as_bytes();
    if b.len() < 23 || !text.is_char_boundary(23) {
        return Err(bad());
    }
    let (main, zone) = text.split_at(23);
    let shape = "dddd-dd-ddTdd:dd:dd.ddd";
    if !main.bytes().zip(shape.bytes()).all(|(c, s)| {
        if s == b'd' {
            c.is_ascii_digit()
        } else {
            c == s
        }
    }) {
        return Err(bad());
    }
    let num = |r: std::ops::Range<usize>| main[r].parse::<i64>().map_err(|_| bad());
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second, milli) = (num(11..13)?, num(14..16)?, num(17..19)?, num(20..23)?);
    let month_days = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let max_day = match month {
        2 if leap => 29,
        1..=12 => month_days[(month - 1) as usize],
        _ => return Err(bad()),
    };
    if day < 1 || day > max_day || hour > 23 || minute > 59 || second > 59 {
        return Err(bad());
    }
    let offset_minutes = match zone {
        "" | "Z" => 0,
        _ => {
            let (sign, rest) = match zone.split_at_checked(1) {
                Some(("+", rest)) => (1, rest),
                Some(("-", rest)) => (-1, rest),
                _ => return Err(bad()),
            };
            let digits: String = rest.chars().filter(|c| *c != ':').collect();
            let ok_shape = matches!(rest.len(), 2 | 4) && !rest.contains(':')
                || rest.len() == 5 && rest.as_bytes()[2] == b':';
            if !ok_shape || !digits.bytes().all(|c| c.is_ascii_digit()) {
                return Err(bad());
            }
            let hours: i64 = digits[..2].parse().map_err(|_| bad())?;
            let minutes: i64 = if digits.len() == 4 {
                digits[2..].parse().map_err(|_| bad())?
            } else {
                0
            };
            if hours > 18 || minutes > 59 {
                return Err(bad());
            }
            sign * (hours * 60 + minutes)
        }
    };
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_minutes * 60;
    Ok(seconds * 1000 + milli)
}

/// Kafka's `--by-duration`: an ISO-8601 duration `PnDTnHnMnS` (each part optional, seconds
/// may have a fraction).
fn parse_duration(text: &str) -> anyhow::Result<std::time::Duration> {
    let bad = || {
        anyhow::anyhow!(
            "--by-duration {text}: expected an ISO-8601 duration PnDTnHnMnS, e.g. PT30M or P1DT2H"
        )
    };
    let rest = text
        .strip_prefix('P')
        .or_else(|| text.strip_prefix('p'))
        .ok_or_else(bad)?;
    let (days_part, time_part) = match rest.split_once(['T', 't']) {
        Some((d, t)) => {
            if t.is_empty() {
                return Err(bad());
            }
            (d, Some(t))
        }
        None => (rest, None),
    };
    let mut millis: u128 = 0;
    let mut any = false;
    if !days_part.is_empty() {
        let n = days_part
            .strip_suffix(['D', 'd'])
            .and_then(|n| n.parse::<u64>().ok())
            .ok_or_else(bad)?;
        millis += u128::from(n) * 86_400_000;
        any = true;
    }
    if let Some(mut t) = time_part {
        let mut last_unit = 0;
        while !t.is_empty() {
            let end = t
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .ok_or_else(bad)?;
            let (number, tail) = t.split_at(end);
            let unit = tail.chars().next().ok_or_else(bad)?.to_ascii_uppercase();
            let (rank, scale) = match unit {
                'H' => (1, 3_600_000.0),
                'M' => (2, 60_000.0),
                'S' => (3, 1000.0),
                _ => return Err(bad()),
            };
            if rank <= last_unit || number.is_empty() || (unit != 'S' && number.contains('.')) {
                return Err(bad());
            }
            last_unit = rank;
            let value: f64 = number.parse().map_err(|_| bad())?;
            millis += (value * scale) as u128;
            any = true;
            t = &tail[1..];
        }
    }
    if !any {
        return Err(bad());
    }
    Ok(std::time::Duration::from_millis(
        u64::try_from(millis).map_err(|_| bad())?,
    ))
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

    #[test]
    fn parses_kafkas_datetimes_and_durations() {
        assert_eq!(parse_datetime("1970-01-01T00:00:00.000").unwrap(), 0);
        assert_eq!(parse_datetime("1970-01-01T00:00:01.500Z").unwrap(), 1500);
        assert_eq!(
            parse_datetime("2024-02-29T12:30:00.000").unwrap(),
            1_709_209_800_000
        );
        assert_eq!(
            parse_datetime("2024-02-29T14:30:00.000+02:00").unwrap(),
            1_709_209_800_000
        );
        assert_eq!(
            parse_datetime("2024-02-29T10:00:00.000-0230").unwrap(),
            1_709_209_800_000
        );
        for bad in [
            "2023-02-29T00:00:00.000",
            "2024-13-01T00:00:00.000",
            "2024-01-01 00:00:00.000",
            "2024-01-01T00:00:00",
            "2024-01-01T00:00:00.000+2",
            "2024-01-01T00:00:00.000Q",
            "2024-01-01T24:00:00.000",
            "",
            "2024-01-01T00:00:00.00é",
        ] {
            assert!(parse_datetime(bad).is_err(), "{bad}");
        }
        let d = |s: &str| parse_duration(s).unwrap().as_millis();
        assert_eq!(d("PT1H"), 3_600_000);
        assert_eq!(d("P1DT2H3M4.5S"), 93_784_500);
        assert_eq!(d("PT30M"), 1_800_000);
        assert_eq!(d("P2D"), 172_800_000);
        for bad in ["", "P", "PT", "1H", "PT1X", "PT1M1H", "P1H", "PTH", "P1.5D"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
