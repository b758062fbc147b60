//! `agent delete-records`: moves the log start offset of topic partitions forward (the records
//! before it can no longer be read, and the segments wholly before it are deleted), as Kafka's
//! `kafka-delete-records.sh` does, from the same JSON file:
//!
//! ```json
//! {"partitions": [{"topic": "t", "partition": 0, "offset": 3}], "version": 1}
//! ```
//!
//! An offset of -1 means the high watermark (the whole partition). The output is Kafka's: a
//! `partition: t-0\tlow_watermark: 3` line per partition, or `partition: t-0\terror: ...` with
//! the message of Kafka's exception for the error.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use serde_json::Value;

use super::{ClusterArgs, REQUEST_TIMEOUT, runtime};

/// Flags of `agent delete-records`, as `kafka-delete-records.sh` names them.
#[derive(Args, Debug)]
pub struct DeleteRecordsArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// The partitions and the offsets to delete before, as JSON:
    /// `{"partitions": [{"topic": "t", "partition": 0, "offset": 3}], "version": 1}`
    /// (offset -1: the high watermark).
    #[arg(long = "offset-json-file", value_name = "FILE")]
    offset_json_file: PathBuf,
}

/// One partition and the offset before which its records go.
#[derive(Debug, Clone, PartialEq)]
struct ToDelete {
    topic: String,
    partition: i32,
    offset: i64,
}

/// The partitions of an offset JSON file (`path` names it in errors).
fn parse_offsets(path: &Path, text: &str) -> anyhow::Result<Vec<ToDelete>> {
    let file = path.display();
    let json: Value = serde_json::from_str(text)
        .with_context(|| format!("{file}: the input string is not a valid JSON"))?;
    let Some(top) = json.as_object() else {
        bail!("{file}: expected a JSON object with `partitions` and `version`");
    };
    match top.get("version") {
        None => {}
        Some(v) if v.as_i64() == Some(1) => {}
        Some(v) => bail!("{file}: version: not supported version field value {v} (only 1 is)"),
    }
    let Some(partitions) = top.get("partitions") else {
        bail!("{file}: missing partitions field");
    };
    let Some(partitions) = partitions.as_array() else {
        bail!("{file}: partitions: expected an array");
    };
    let mut found: Vec<ToDelete> = Vec::with_capacity(partitions.len());
    for (i, entry) in partitions.iter().enumerate() {
        let at = |field: &str| format!("{file}: partitions[{i}].{field}");
        let Some(entry) = entry.as_object() else {
            bail!("{file}: partitions[{i}]: expected an object with topic, partition and offset");
        };
        let topic = match entry.get("topic") {
            Some(Value::String(t)) if !t.is_empty() => t.clone(),
            Some(other) => bail!("{}: expected a topic name, got {other}", at("topic")),
            None => bail!("{}: missing", at("topic")),
        };
        let partition = match entry.get("partition") {
            Some(p) => match p.as_i64().and_then(|n| i32::try_from(n).ok()) {
                Some(n) if n >= 0 => n,
                _ => bail!("{}: expected a partition number, got {p}", at("partition")),
            },
            None => bail!("{}: missing", at("partition")),
        };
        let offset = match entry.get("offset") {
            Some(o) => match o.as_i64() {
                Some(n) => n,
                None => bail!(
                    "{}: expected an offset (-1 for the high watermark), got {o}",
                    at("offset")
                ),
            },
            None => bail!("{}: missing", at("offset")),
        };
        found.push(ToDelete {
            topic,
            partition,
            offset,
        });
    }
    let mut duplicates: Vec<String> = Vec::new();
    for (i, d) in found.iter().enumerate() {
        let name = format!("{}-{}", d.topic, d.partition);
        if found[..i]
            .iter()
            .any(|e| e.topic == d.topic && e.partition == d.partition)
            && !duplicates.contains(&name)
        {
            duplicates.push(name);
        }
    }
    if !duplicates.is_empty() {
        bail!(
            "{file}: offset json file contains duplicate topic partitions: {}",
            duplicates.join(",")
        );
    }
    Ok(found)
}

/// What Kafka's tool prints for a partition's error: its exception's class and message.
fn kafka_message(code: RDKafkaErrorCode) -> String {
    let (class, message) = match code {
        RDKafkaErrorCode::OffsetOutOfRange => (
            "OffsetOutOfRangeException",
            "The requested offset is not within the range of offsets maintained by the server.",
        ),
        // Also what librdkafka says of a partition its metadata does not have.
        RDKafkaErrorCode::UnknownTopicOrPartition
        | RDKafkaErrorCode::UnknownPartition
        | RDKafkaErrorCode::UnknownTopic => (
            "UnknownTopicOrPartitionException",
            "This server does not host this topic-partition.",
        ),
        RDKafkaErrorCode::TopicAuthorizationFailed => {
            ("TopicAuthorizationException", "Topic authorization failed.")
        }
        RDKafkaErrorCode::PolicyViolation => (
            "PolicyViolationException",
            "Request parameters do not satisfy the configured policy.",
        ),
        RDKafkaErrorCode::KafkaStorageError => (
            "KafkaStorageException",
            "Disk error when trying to access log file on the disk.",
        ),
        RDKafkaErrorCode::RequestTimedOut => ("TimeoutException", "The request timed out."),
        other => return other.to_string(),
    };
    format!("org.apache.kafka.common.errors.{class}: {message}")
}

/// Runs `agent delete-records`.
pub fn run(args: DeleteRecordsArgs) -> anyhow::Result<()> {
    let path = &args.offset_json_file;
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let wanted = parse_offsets(path, &text)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "Executing records delete operation")?;
    let mut results: Vec<Result<i64, String>> = Vec::with_capacity(wanted.len());
    if !wanted.is_empty() {
        let admin: AdminClient<DefaultClientContext> = args
            .cluster
            .client_config(&[])?
            .create()
            .context("creating the admin client")?;
        let mut list = TopicPartitionList::new();
        for d in &wanted {
            list.add_partition_offset(&d.topic, d.partition, Offset::from_raw(d.offset))
                .with_context(|| format!("the offset of {}-{}", d.topic, d.partition))?;
        }
        let options = AdminOptions::new().operation_timeout(Some(REQUEST_TIMEOUT));
        let answered = runtime()?
            .block_on(admin.delete_records(&list, &options))
            .context("deleting records")?;
        for d in &wanted {
            results.push(match answered.find_partition(&d.topic, d.partition) {
                None => Err("no answer for the partition".to_owned()),
                Some(e) => match e.error() {
                    Err(KafkaError::OffsetFetch(code)) => Err(kafka_message(code)),
                    Err(other) => Err(other.to_string()),
                    Ok(()) => match e.offset() {
                        Offset::Offset(low) => Ok(low),
                        other => Err(format!("unexpected low watermark {other:?}")),
                    },
                },
            });
        }
    }
    writeln!(out, "Records delete operation completed:")?;
    for (d, result) in wanted.iter().zip(results) {
        match result {
            Ok(low) => writeln!(
                out,
                "partition: {}-{}\tlow_watermark: {low}",
                d.topic, d.partition
            )?,
            Err(e) => writeln!(out, "partition: {}-{}\terror: {e}", d.topic, d.partition)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn parse(text: &str) -> anyhow::Result<Vec<ToDelete>> {
        parse_offsets(Path::new("offsets.json"), text)
    }

    fn error(text: &str) -> String {
        format!("{:#}", parse(text).unwrap_err())
    }

    #[test]
    fn kafka_offset_json_parses_and_bad_fields_are_named() {
        let parsed = parse(
            r#"{"partitions":[{"topic":"t","partition":0,"offset":3},
                {"topic":"u","partition":2,"offset":-1}],"version":1}"#,
        )
        .unwrap();
        assert_eq!(
            parsed,
            [
                ToDelete {
                    topic: "t".into(),
                    partition: 0,
                    offset: 3
                },
                ToDelete {
                    topic: "u".into(),
                    partition: 2,
                    offset: -1
                }
            ]
        );
        // No version: version 1, as Kafka's tool takes it.
        assert_eq!(
            parse(r#"{"partitions":[{"topic":"t","partition":1,"offset":0}]}"#)
                .unwrap()
                .len(),
            1
        );
        assert!(error("{").contains("offsets.json: the input string is not a valid JSON"));
        assert_eq!(
            error(r#"{"version":1}"#),
            "offsets.json: missing partitions field"
        );
        assert!(error(r#"{"partitions":[],"version":2}"#).contains("version"));
        assert_eq!(
            error(r#"{"partitions":[{"topic":"t","partition":0,"offset":"3"}]}"#),
            "offsets.json: partitions[0].offset: expected an offset (-1 for the high watermark), \
             got \"3\""
        );
        assert_eq!(
            error(r#"{"partitions":[{"topic":"t","offset":1},{"topic":"t"}]}"#),
            "offsets.json: partitions[0].partition: missing"
        );
        assert!(
            error(r#"{"partitions":[{"topic":"t","partition":0,"offset":1},{"partition":0}]}"#)
                .starts_with("offsets.json: partitions[1].topic")
        );
        assert!(
            error(r#"{"partitions":[{"topic":"t","partition":-1,"offset":1}]}"#)
                .starts_with("offsets.json: partitions[0].partition")
        );
        assert_eq!(
            error(
                r#"{"partitions":[{"topic":"t","partition":0,"offset":1},
                    {"topic":"t","partition":0,"offset":2}]}"#
            ),
            "offsets.json: offset json file contains duplicate topic partitions: t-0"
        );
    }

    #[test]
    fn errors_read_as_kafkas_exceptions() {
        assert_eq!(
            kafka_message(RDKafkaErrorCode::OffsetOutOfRange),
            "org.apache.kafka.common.errors.OffsetOutOfRangeException: The requested offset is \
             not within the range of offsets maintained by the server."
        );
    }
}
