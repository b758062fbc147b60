//! `agent groups`: list, describe (with lag), reset offsets of and delete consumer groups, as
//! Kafka's `kafka-consumer-groups.sh` does.
//!
//! This file holds the flags, the dispatch to each action, `--list`, and what the actions
//! share: a group as the cluster describes it, its coordinator, the group names and the
//! client acting for a group. `--describe` is in `describe.rs`, `--reset-offsets` in
//! `reset.rs`, `--delete` in `delete.rs`.

use std::io::Write;

use anyhow::{Context, bail};
use clap::Args;
use rdkafka::consumer::{BaseConsumer, Consumer};

use super::{ClusterArgs, REQUEST_TIMEOUT, runtime};

mod delete;
mod describe;
mod reset;

use delete::delete;
use describe::{describe, describe_members, describe_state};
use reset::reset;

/// Flags of `agent groups`, named as `kafka-consumer-groups.sh` names them.
#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("action").required(true).args(["list", "describe", "reset_offsets", "delete"])))]
#[command(group(clap::ArgGroup::new("target").args(["to_earliest", "to_latest", "to_offset", "shift_by", "to_datetime", "by_duration", "to_current"]).conflicts_with_all(["list", "describe", "delete"])))]
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
    /// The group (not with --list).
    #[arg(long, conflicts_with = "list")]
    group: Option<String>,
    /// With --describe: the members of the group (CONSUMER-ID, HOST, CLIENT-ID, #PARTITIONS).
    #[arg(long, conflicts_with_all = ["list", "reset_offsets", "delete"])]
    members: bool,
    /// With --describe: the group's coordinator, assignment strategy, state and member count.
    /// With --list: each group's state (GROUP, STATE), only the groups in STATES when given
    /// (comma-separated, any case, e.g. `Stable,Empty`).
    #[arg(long, num_args = 0..=1, value_name = "STATES")]
    state: Option<Option<String>>,
    /// With --describe: offsets and lag per partition (the default).
    #[arg(long, conflicts_with_all = ["list", "reset_offsets", "delete"])]
    offsets: bool,
    /// With --describe --members or --state: more columns (epochs and assignments).
    #[arg(long, conflicts_with_all = ["list", "reset_offsets", "delete"])]
    verbose: bool,
    /// With --reset-offsets: the topic whose offsets move; `topic:0,1` moves only those
    /// partitions, as in Kafka. May be repeated.
    #[arg(long, conflicts_with_all = ["list", "describe"])]
    topic: Vec<String>,
    /// With --reset-offsets: every topic the group has committed offsets for.
    #[arg(long = "all-topics", conflicts_with_all = ["topic", "list", "describe"])]
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
    #[arg(long = "all-groups", conflicts_with_all = ["group", "list"])]
    all_groups: bool,
    /// With --reset-offsets: apply the reset (without it, only the plan is printed).
    #[arg(long, conflicts_with_all = ["list", "describe", "delete"])]
    execute: bool,
    /// With --reset-offsets: only print the plan, committing nothing (the default, said
    /// explicitly as Kafka asks scripts to).
    #[arg(
        long = "dry-run",
        conflicts_with_all = ["execute", "list", "describe", "delete"]
    )]
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
    if args.delete && (!args.topic.is_empty() || args.all_topics) {
        // Kafka's refusal: deleting the whole group is not what was asked.
        bail!(
            "The consumer does not support topic-specific offset deletion from a consumer \
             group: --delete deletes whole groups"
        );
    }
    if args.state.is_some() && !args.list && !args.describe {
        bail!("--state needs --list or --describe");
    }
    if args.list {
        match &args.state {
            None => {
                for name in group_names(&args.cluster)? {
                    writeln!(out, "{name}")?;
                }
            }
            Some(states) => list_states(&args.cluster, states.as_deref(), &mut out)?,
        }
    } else if args.describe {
        let names = match args.all_groups {
            true => group_names(&args.cluster)?,
            false => vec![group()?.to_owned()],
        };
        for name in &names {
            if args.verbose && !args.members && args.state.is_none() {
                bail!(
                    "--verbose adds columns to --describe --members and --describe --state \
                     only: the offsets view has no more columns"
                );
            }
            if args.members {
                describe_members(&args.cluster, name, args.verbose, &mut out)?;
            } else if let Some(states) = &args.state {
                if let Some(states) = states {
                    bail!("--describe --state takes no states (`{states}`): they filter --list");
                }
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

/// The states a group can be in, as Kafka names them (classic and consumer protocol).
const STATES: [&str; 8] = [
    "Unknown",
    "PreparingRebalance",
    "CompletingRebalance",
    "Stable",
    "Dead",
    "Empty",
    "Assigning",
    "Reconciling",
];

/// `--list --state [STATES]`: each group with its state, as kafka-consumer-groups.sh prints
/// them (a `GROUP STATE` table, the first column at least 15 wide), only those in `states`
/// (comma-separated, any case) when given.
fn list_states(
    cluster: &ClusterArgs,
    states: Option<&str>,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let wanted: Option<Vec<&str>> = match states {
        None => None,
        Some(list) => {
            let parsed: Option<Vec<&str>> = list
                .split(',')
                .map(|s| {
                    STATES
                        .iter()
                        .copied()
                        .find(|k| k.eq_ignore_ascii_case(s.trim()))
                })
                .collect();
            match parsed {
                Some(parsed) if !list.trim().is_empty() => Some(parsed),
                _ => bail!(
                    "Invalid state list '{list}'. Valid states are: {}",
                    STATES.join(", ")
                ),
            }
        }
    };
    let mut rows = Vec::new();
    for name in group_names(cluster)? {
        let state = group_view(cluster, &name)?.state;
        if wanted.as_ref().is_none_or(|w| w.contains(&state.as_str())) {
            rows.push((name, state));
        }
    }
    let width = rows.iter().map(|(name, _)| name.len()).fold(15, usize::max);
    writeln!(out, "{:<width$} STATE", "GROUP")?;
    for (name, state) in rows {
        writeln!(out, "{name:<width$} {state}")?;
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
