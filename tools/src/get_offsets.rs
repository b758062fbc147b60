//! `agent get-offsets`: the offsets of topic partitions at a point in time, one
//! `topic:partition:offset` line each, with the flags of Kafka's `kafka-get-offsets.sh`
//! (`--topic` a regular expression, `--partitions`, `--topic-partitions`, `--time`).

use std::io::Write;

use anyhow::{Context, bail};
use clap::Args;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use super::{ClusterArgs, REQUEST_TIMEOUT, runtime};

/// Flags of `agent get-offsets`, as `kafka-get-offsets.sh` names them.
#[derive(Args, Debug)]
pub struct GetOffsetsArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// The topics, as a regular expression matching whole names (every topic when left out).
    #[arg(long, conflicts_with = "topic_partitions")]
    topic: Option<String>,
    /// With --topic: the partitions, comma-separated (every one when left out).
    #[arg(long, value_delimiter = ',', requires = "topic")]
    partitions: Vec<i32>,
    /// Topics and partitions: `t1:0,t2:0-2,t3` (a topic regex, then partitions or ranges).
    #[arg(long = "topic-partitions", value_name = "T:P,...")]
    topic_partitions: Option<String>,
    /// `-1` or `latest` (the log end), `-2` or `earliest` (the log start), `-3` or
    /// `max-timestamp` (the record with the largest timestamp), or a timestamp in
    /// milliseconds (the first offset whose timestamp is at or after it).
    #[arg(long, default_value = "latest", allow_hyphen_values = true)]
    time: String,
    /// Leave out internal topics (names starting with `__`).
    #[arg(long = "exclude-internal-topics")]
    exclude_internal_topics: bool,
}

/// The point in time asked for.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Time {
    Latest,
    Earliest,
    /// The record with the largest timestamp (ListOffsets v7, KIP-734).
    MaxTimestamp,
    At(i64),
}

fn parse_time(text: &str) -> anyhow::Result<Time> {
    Ok(match text.trim() {
        "-1" | "latest" => Time::Latest,
        "-2" | "earliest" => Time::Earliest,
        "-3" | "max-timestamp" => Time::MaxTimestamp,
        other => match other.parse::<i64>() {
            Ok(ms) if ms >= 0 => Time::At(ms),
            _ => bail!(
                "--time `{text}`: not -1 (latest), -2 (earliest), -3 (max-timestamp) or a \
                 timestamp in milliseconds"
            ),
        },
    })
}

/// Topics (a regular expression) and their partitions as inclusive ranges (every partition
/// when empty).
type Selection = (regex::Regex, Vec<(i32, i32)>);

/// The items of `--topic-partitions`.
fn parse_topic_partitions(text: &str) -> anyhow::Result<Vec<Selection>> {
    text.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| {
            let (topic, partitions) = match item.split_once(':') {
                Some((t, p)) => (t, Some(p)),
                None => (item, None),
            };
            let ranges = match partitions {
                None => Vec::new(),
                Some(p) => {
                    let bound = |s: &str| {
                        s.trim().parse::<i32>().with_context(|| {
                            format!("--topic-partitions: `{item}` has a bad partition `{s}`")
                        })
                    };
                    let range = match p.split_once('-') {
                        Some((low, "")) => (bound(low)?, i32::MAX),
                        Some((low, high)) => (bound(low)?, bound(high)?),
                        None => (bound(p)?, bound(p)?),
                    };
                    vec![range]
                }
            };
            Ok((whole(topic)?, ranges))
        })
        .collect()
}

/// A regular expression matching whole topic names.
fn whole(pattern: &str) -> anyhow::Result<regex::Regex> {
    regex::Regex::new(&format!("^(?:{pattern})$"))
        .with_context(|| format!("`{pattern}` is not a valid regular expression"))
}

/// Runs `agent get-offsets`.
pub fn run(args: GetOffsetsArgs) -> anyhow::Result<()> {
    let time = parse_time(&args.time)?;
    let filters: Vec<Selection> = match (&args.topic, &args.topic_partitions) {
        (Some(topic), _) => {
            let ranges = args.partitions.iter().map(|&p| (p, p)).collect();
            vec![(whole(topic)?, ranges)]
        }
        (None, Some(text)) => parse_topic_partitions(text)?,
        (None, None) => vec![(whole(".*")?, Vec::new())],
    };
    let consumer: BaseConsumer = args
        .cluster
        .client_config(&[])?
        .set("enable.auto.commit", "false")
        .create()
        .context("creating the client")?;
    let metadata = consumer
        .fetch_metadata(None, REQUEST_TIMEOUT)
        .context("fetching metadata")?;
    let mut wanted: Vec<(String, i32)> = Vec::new();
    for topic in metadata.topics() {
        if args.exclude_internal_topics && topic.name().starts_with("__") {
            continue;
        }
        for p in topic.partitions() {
            let id = p.id();
            let selected = filters.iter().any(|(name, ranges)| {
                name.is_match(topic.name())
                    && (ranges.is_empty() || ranges.iter().any(|&(lo, hi)| lo <= id && id <= hi))
            });
            if selected {
                wanted.push((topic.name().to_owned(), id));
            }
        }
    }
    wanted.sort();
    let mut out = std::io::stdout().lock();
    let offsets: Vec<Option<i64>> = match time {
        Time::Latest | Time::Earliest => wanted
            .iter()
            .map(|(topic, p)| {
                let (low, high) = consumer
                    .fetch_watermarks(topic, *p, REQUEST_TIMEOUT)
                    .with_context(|| format!("offsets of {topic}:{p}"))?;
                Ok(Some(if time == Time::Latest { high } else { low }))
            })
            .collect::<anyhow::Result<_>>()?,
        Time::MaxTimestamp => max_timestamp_offsets(&args.cluster, &metadata, &wanted)?,
        Time::At(ms) => {
            let mut list = TopicPartitionList::new();
            for (topic, p) in &wanted {
                list.add_partition_offset(topic, *p, Offset::Offset(ms))
                    .context("building the request")?;
            }
            let found = consumer
                .offsets_for_times(list, REQUEST_TIMEOUT)
                .context("looking the timestamp up")?;
            wanted
                .iter()
                .map(|(topic, p)| {
                    found
                        .find_partition(topic, *p)
                        .and_then(|e| match e.offset() {
                            Offset::Offset(n) => Some(n),
                            _ => None,
                        })
                })
                .collect()
        }
    };
    for ((topic, p), offset) in wanted.iter().zip(offsets) {
        // No record at or after the timestamp: Kafka's tool prints the line without an offset.
        let offset = offset.map_or_else(String::new, |o| o.to_string());
        writeln!(out, "{topic}:{p}:{offset}")?;
    }
    Ok(())
}

/// The offset of each partition's record with the largest timestamp: ListOffsets v7+ with
/// timestamp -3 (KIP-734), sent to each partition's leader (librdkafka's binding takes no
/// negative timestamp).
fn max_timestamp_offsets(
    cluster: &ClusterArgs,
    metadata: &rdkafka::metadata::Metadata,
    wanted: &[(String, i32)],
) -> anyhow::Result<Vec<Option<i64>>> {
    use std::collections::BTreeMap;

    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    use kafka_protocol::messages::{BrokerId, ListOffsetsRequest, TopicName};
    use kafka_protocol::protocol::StrBytes;

    let brokers: BTreeMap<i32, String> = metadata
        .brokers()
        .iter()
        .map(|b| (b.id(), format!("{}:{}", b.host(), b.port())))
        .collect();
    // Leader -> topic -> partitions.
    let mut by_leader: BTreeMap<i32, BTreeMap<&str, Vec<i32>>> = BTreeMap::new();
    for (topic, partition) in wanted {
        let leader = metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .and_then(|t| t.partitions().iter().find(|p| p.id() == *partition))
            .map(|p| p.leader())
            .with_context(|| format!("{topic}:{partition} has no leader"))?;
        by_leader
            .entry(leader)
            .or_default()
            .entry(topic)
            .or_default()
            .push(*partition);
    }
    let security = cluster.wire_security()?;
    let mut found: BTreeMap<(String, i32), i64> = BTreeMap::new();
    runtime()?.block_on(async {
        let first =
            super::wire::Connection::bootstrap(&cluster.bootstrap_server, &security).await?;
        for (leader, topics) in &by_leader {
            let address = brokers
                .get(leader)
                .with_context(|| format!("broker {leader} is not in the metadata"))?;
            let mut connection = first.open_another(address).await?;
            let version = connection.version::<ListOffsetsRequest>()?;
            if version < 7 {
                bail!(
                    "broker {address} serves ListOffsets up to v{version}: max-timestamp needs v7"
                );
            }
            let request = ListOffsetsRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_topics(
                    topics
                        .iter()
                        .map(|(topic, partitions)| {
                            ListOffsetsTopic::default()
                                .with_name(TopicName(StrBytes::from_string((*topic).to_owned())))
                                .with_partitions(
                                    partitions
                                        .iter()
                                        .map(|p| {
                                            ListOffsetsPartition::default()
                                                .with_partition_index(*p)
                                                .with_timestamp(-3)
                                        })
                                        .collect(),
                                )
                        })
                        .collect(),
                );
            let response = connection.call(version, &request).await?;
            for topic in response.topics {
                for p in topic.partitions {
                    if p.error_code != 0 {
                        bail!(
                            "offsets of {}:{}: error code {}",
                            topic.name.0,
                            p.partition_index,
                            p.error_code
                        );
                    }
                    if p.offset >= 0 {
                        found.insert((topic.name.0.to_string(), p.partition_index), p.offset);
                    }
                }
            }
        }
        anyhow::Ok(())
    })?;
    Ok(wanted
        .iter()
        .map(|(topic, p)| found.get(&(topic.clone(), *p)).copied())
        .collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn times_and_topic_partitions_parse_as_kafka_get_offsets_sh() {
        assert_eq!(parse_time("-1").unwrap(), Time::Latest);
        assert_eq!(parse_time("earliest").unwrap(), Time::Earliest);
        assert_eq!(
            parse_time("1700000000000").unwrap(),
            Time::At(1_700_000_000_000)
        );
        assert_eq!(parse_time("-3").unwrap(), Time::MaxTimestamp);
        assert_eq!(parse_time("max-timestamp").unwrap(), Time::MaxTimestamp);
        assert!(parse_time("soon").is_err());
        let parsed = parse_topic_partitions("logs:0-2,metrics.*:5,all,open:3-").unwrap();
        assert_eq!(parsed.len(), 4);
        assert!(parsed[0].0.is_match("logs") && !parsed[0].0.is_match("logs2"));
        assert_eq!(parsed[0].1, [(0, 2)]);
        assert!(parsed[1].0.is_match("metrics.cpu"));
        assert_eq!(parsed[2].1, []);
        assert_eq!(parsed[3].1, [(3, i32::MAX)]);
        assert!(parse_topic_partitions("logs:x").is_err());
    }
}
