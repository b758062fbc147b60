//! `--describe` of `agent groups`: a group's offsets, log end offsets, lag and owners per
//! partition (the default), its members (`--members`) or its state (`--state`), in the
//! columns of Kafka's `kafka-consumer-groups.sh`.

use std::io::Write;

use anyhow::Context;
use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};

use super::super::{ClusterArgs, REQUEST_TIMEOUT};
use super::{Member, coordinator, decode_assignment, group_client, group_view};

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
pub(super) fn describe_members(
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
pub(super) fn describe_state(
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
        super::super::runtime()?.block_on(async {
            let mut connection =
                super::super::wire::Connection::bootstrap(&cluster.bootstrap_server, &security)
                    .await?;
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

pub(super) fn describe(
    cluster: &ClusterArgs,
    group: &str,
    out: &mut impl Write,
) -> anyhow::Result<()> {
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
