//! `agent transactions`: list the transactions the coordinators know and describe one, in the
//! columns Kafka's `kafka-transactions.sh` prints (`list` and `describe`).
//!
//! librdkafka has no admin call for DescribeTransactions or ListTransactions, so this tool speaks
//! the Kafka protocol itself over TCP: ApiVersions on every connection (each request is sent at
//! the highest version both sides speak, and an API the broker does not advertise is an error
//! naming the broker), then
//!
//! - `--list`: Metadata for the brokers of the cluster, ListTransactions to each of them (every
//!   broker coordinates its share of the transactional ids);
//! - `--describe`: FindCoordinator (key type 1, transaction) for the transactional id, then
//!   DescribeTransactions to that coordinator.

use std::io::Write;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::Args;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::describe_transactions_response::TransactionState;
use kafka_protocol::messages::{
    DescribeTransactionsRequest, FindCoordinatorRequest, ListTransactionsRequest, MetadataRequest,
    TransactionalId,
};
use kafka_protocol::protocol::StrBytes;

mod producers;

use super::wire::{Connection, Security};
use super::{ClusterArgs, runtime};

/// Flags of `agent transactions`: Kafka's `kafka-transactions.sh` commands, as subcommands
/// (`list`, `describe`, `describe-producers`, `find-hanging`, `abort`) or, for `list` and
/// `describe`, as the flags `--list` and `--describe`.
#[derive(Args, Debug)]
pub struct TransactionsArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// List the transactions of every broker: id, coordinator, producer id and state.
    #[arg(long, conflicts_with = "describe")]
    list: bool,
    /// Describe the current transaction of one transactional id.
    #[arg(long, requires = "transactional_id")]
    describe: bool,
    /// With --describe: the transactional id (refused with --list and the subcommands).
    #[arg(long = "transactional-id", value_name = "ID")]
    transactional_id: Option<String>,
    #[command(subcommand)]
    command: Option<TransactionsCommand>,
}

/// The commands of `kafka-transactions.sh`.
#[derive(clap::Subcommand, Debug)]
pub enum TransactionsCommand {
    /// List transactions.
    List,
    /// Describe the state of an active transactional-id.
    Describe {
        /// The transactional id.
        #[arg(long = "transactional-id", value_name = "ID")]
        transactional_id: String,
    },
    /// Describe the states of active producers for a topic partition.
    DescribeProducers {
        /// The broker to ask (the partition's leader when not given).
        #[arg(long = "broker-id", value_name = "ID")]
        broker_id: Option<i32>,
        #[arg(long)]
        topic: String,
        #[arg(long)]
        partition: i32,
    },
    /// Find hanging transactions: open on a partition longer than the largest transaction
    /// timeout, with no transaction the coordinator knows.
    FindHanging {
        /// Search the partitions this broker hosts.
        #[arg(long = "broker-id", value_name = "ID")]
        broker_id: Option<i32>,
        /// Maximum transaction timeout in minutes: open longer than this is a candidate.
        #[arg(
            long = "max-transaction-timeout",
            default_value_t = 15,
            value_name = "MINUTES"
        )]
        max_transaction_timeout: u32,
        /// Limit the search to this topic.
        #[arg(long)]
        topic: Option<String>,
        /// With --topic: limit the search to this partition.
        #[arg(long, requires = "topic")]
        partition: Option<i32>,
    },
    /// Abort a hanging transaction (needs ClusterAction on the cluster): by its start offset,
    /// or by producer id, epoch and coordinator epoch.
    Abort {
        #[arg(long)]
        topic: String,
        #[arg(long)]
        partition: i32,
        /// Start offset of the transaction to abort.
        #[arg(
            long = "start-offset",
            conflicts_with_all = ["producer_id", "producer_epoch", "coordinator_epoch"]
        )]
        start_offset: Option<i64>,
        #[arg(long = "producer-id", requires_all = ["producer_epoch", "coordinator_epoch"])]
        producer_id: Option<i64>,
        #[arg(long = "producer-epoch")]
        producer_epoch: Option<i16>,
        #[arg(long = "coordinator-epoch")]
        coordinator_epoch: Option<i32>,
    },
}

/// Runs `agent transactions`.
pub fn run(args: TransactionsArgs) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    let now_ms = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64)
    };
    let security = args.cluster.wire_only_security()?;
    let bootstrap = &args.cluster.bootstrap_server;
    if args.transactional_id.is_some() && !args.describe {
        bail!(
            "--transactional-id is only for --describe (the `describe` subcommand takes its \
             own --transactional-id after it)"
        );
    }
    let command = match (args.command, args.list, args.describe) {
        (Some(command), false, false) => command,
        (None, true, false) => TransactionsCommand::List,
        (None, false, true) => TransactionsCommand::Describe {
            transactional_id: args
                .transactional_id
                .context("--describe needs --transactional-id")?,
        },
        (None, false, false) => {
            bail!("a command is needed: list, describe, describe-producers, find-hanging or abort")
        }
        (Some(_), ..) => bail!("--list and --describe cannot be given with a command"),
        (None, true, true) => bail!("--list and --describe cannot be given together"),
    };
    runtime()?.block_on(async {
        match command {
            TransactionsCommand::List => {
                let rows = list(bootstrap, &security).await?;
                print_table(&mut out, &LIST_HEADER, &rows)
            }
            TransactionsCommand::Describe { transactional_id } => {
                let row = describe(bootstrap, &security, &transactional_id, now_ms).await?;
                print_table(&mut out, &DESCRIBE_HEADER, &[row])
            }
            TransactionsCommand::DescribeProducers {
                broker_id,
                topic,
                partition,
            } => {
                let mut cluster = producers::Cluster::connect(bootstrap, &security).await?;
                let producers = cluster
                    .describe_producers(&topic, partition, broker_id)
                    .await?;
                let rows: Vec<[String; 6]> =
                    producers.iter().map(producers::describe_row).collect();
                print_table(&mut out, &producers::DESCRIBE_PRODUCERS_HEADER, &rows)
            }
            TransactionsCommand::FindHanging {
                broker_id,
                max_transaction_timeout,
                topic,
                partition,
            } => {
                if topic.is_none() && broker_id.is_none() {
                    bail!(
                        "The `find-hanging` command requires either --topic or --broker-id to \
                         limit the scope of the search"
                    );
                }
                let mut cluster = producers::Cluster::connect(bootstrap, &security).await?;
                let max_ms = i64::from(max_transaction_timeout) * 60_000;
                let hanging = cluster
                    .find_hanging(broker_id, topic.as_deref(), partition, max_ms, now_ms())
                    .await?;
                let rows: Vec<[String; 8]> = hanging
                    .iter()
                    .map(|h| producers::hanging_row(h, now_ms()))
                    .collect();
                print_table(&mut out, &producers::HANGING_HEADER, &rows)
            }
            TransactionsCommand::Abort {
                topic,
                partition,
                start_offset,
                producer_id,
                producer_epoch,
                coordinator_epoch,
            } => {
                let mut cluster = producers::Cluster::connect(bootstrap, &security).await?;
                let spec = match (start_offset, producer_id, producer_epoch, coordinator_epoch) {
                    (Some(offset), ..) => cluster.abort_spec(&topic, partition, offset).await?,
                    (None, Some(id), Some(epoch), Some(coordinator_epoch)) => {
                        producers::AbortSpec {
                            producer_id: id,
                            producer_epoch: epoch,
                            // -1 (never seen a marker) is sent as 0, as Kafka's tool does.
                            coordinator_epoch: coordinator_epoch.max(0),
                        }
                    }
                    _ => bail!(
                        "The transaction to abort must be identified either with --start-offset \
                         (for brokers on 3.0 or above) or with --producer-id, --producer-epoch, \
                         and --coordinator-epoch (for older brokers)"
                    ),
                };
                cluster.abort(&topic, partition, &spec).await
            }
        }
    })
}

const LIST_HEADER: [&str; 4] = [
    "TransactionalId",
    "Coordinator",
    "ProducerId",
    "TransactionState",
];

const DESCRIBE_HEADER: [&str; 9] = [
    "CoordinatorId",
    "TransactionalId",
    "ProducerId",
    "ProducerEpoch",
    "TransactionState",
    "TransactionTimeoutMs",
    "CurrentTransactionStartTimeMs",
    "TransactionDurationMs",
    "TopicPartitions",
];

/// Rows of `--list`, from every broker of the cluster, sorted by transactional id.
async fn list(bootstrap: &str, security: &Security) -> anyhow::Result<Vec<[String; 4]>> {
    let mut first = Connection::bootstrap(bootstrap, security).await?;
    let version = first.version::<MetadataRequest>()?;
    // An empty topic list asks for brokers only (from version 1; version 0 would list all).
    let metadata = first
        .call(
            version,
            &MetadataRequest::default().with_topics(Some(Vec::new())),
        )
        .await?;
    let mut rows = Vec::new();
    for broker in &metadata.brokers {
        let address = format!("{}:{}", broker.host, broker.port);
        let mut connection = if address == first.address {
            None
        } else {
            Some(first.open_another(&address).await?)
        };
        let connection = connection.as_mut().unwrap_or(&mut first);
        let version = connection.version::<ListTransactionsRequest>()?;
        let response = connection
            .call(version, &ListTransactionsRequest::default())
            .await?;
        if let Some(error) = ResponseError::try_from_code(response.error_code) {
            bail!(
                "failed to list transactions of broker {} ({address}): {error}",
                broker.node_id.0
            );
        }
        for t in response.transaction_states {
            rows.push([
                t.transactional_id.0.to_string(),
                broker.node_id.0.to_string(),
                t.producer_id.0.to_string(),
                t.transaction_state.to_string(),
            ]);
        }
    }
    rows.sort();
    Ok(rows)
}

/// How long a coordinator that is loading or not yet available is waited for.
const COORDINATOR_WAIT: Duration = Duration::from_secs(10);
/// FindCoordinator key type of a transactional id.
const TRANSACTION_KEY: i8 = 1;
/// FindCoordinator versions from 4 on look up a list of keys.
const BATCHED_FIND_COORDINATOR: i16 = 4;

/// The row of `--describe` for `id`.
async fn describe(
    bootstrap: &str,
    security: &Security,
    id: &str,
    now_ms: impl Fn() -> i64,
) -> anyhow::Result<[String; 9]> {
    let (node_id, state) = describe_state(bootstrap, security, id).await?;
    Ok(describe_row(node_id, &state, now_ms()))
}

/// The coordinator of `id` and its state of the transaction.
async fn describe_state(
    bootstrap: &str,
    security: &Security,
    id: &str,
) -> anyhow::Result<(i32, TransactionState)> {
    let mut first = Connection::bootstrap(bootstrap, security).await?;
    let what = || format!("failed to describe transactional-id `{id}`");
    let deadline = Instant::now() + COORDINATOR_WAIT;
    let (node_id, address) = loop {
        let version = first.version::<FindCoordinatorRequest>()?;
        let key = StrBytes::from_string(id.to_owned());
        let request = FindCoordinatorRequest::default().with_key_type(TRANSACTION_KEY);
        let request = if version >= BATCHED_FIND_COORDINATOR {
            request.with_coordinator_keys(vec![key])
        } else {
            request.with_key(key)
        };
        let response = first.call(version, &request).await?;
        let found = if version >= BATCHED_FIND_COORDINATOR {
            let c =
                response.coordinators.into_iter().next().with_context(|| {
                    format!("{}: {} found no coordinator", what(), first.address)
                })?;
            (c.error_code, c.error_message, c.node_id, c.host, c.port)
        } else {
            (
                response.error_code,
                response.error_message,
                response.node_id,
                response.host,
                response.port,
            )
        };
        let (code, message, node_id, host, port) = found;
        match ResponseError::try_from_code(code) {
            None => break (node_id.0, format!("{host}:{port}")),
            Some(e) if e.is_retriable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Some(e) => bail!(
                "{}: finding its coordinator at {} failed: {}",
                what(),
                first.address,
                error_text(e, message.as_deref())
            ),
        }
    };
    let mut coordinator = if address == first.address {
        first
    } else {
        first.open_another(&address).await?
    };
    let version = coordinator.version::<DescribeTransactionsRequest>()?;
    let response = coordinator
        .call(
            version,
            &DescribeTransactionsRequest::default().with_transactional_ids(vec![TransactionalId(
                StrBytes::from_string(id.to_owned()),
            )]),
        )
        .await?;
    let state = response
        .transaction_states
        .into_iter()
        .find(|s| s.transactional_id.0.as_str() == id)
        .with_context(|| format!("{}: coordinator {address} did not answer for it", what()))?;
    if let Some(e) = ResponseError::try_from_code(state.error_code) {
        bail!(
            "{}: coordinator {node_id} ({address}) answered {}",
            what(),
            error_text(e, None)
        );
    }
    Ok((node_id, state))
}

/// The columns of a described transaction; the start time and duration are `None` when no
/// transaction is under way (the broker sends -1), as Kafka prints them.
fn describe_row(coordinator: i32, state: &TransactionState, now_ms: i64) -> [String; 9] {
    let (start, duration) = if state.transaction_start_time_ms >= 0 {
        (
            state.transaction_start_time_ms.to_string(),
            (now_ms - state.transaction_start_time_ms).to_string(),
        )
    } else {
        ("None".to_owned(), "None".to_owned())
    };
    let mut partitions: Vec<(String, i32)> = state
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| (t.topic.0.to_string(), *p)))
        .collect();
    partitions.sort();
    let partitions: Vec<String> = partitions
        .into_iter()
        .map(|(topic, p)| format!("{topic}-{p}"))
        .collect();
    [
        coordinator.to_string(),
        state.transactional_id.0.to_string(),
        state.producer_id.0.to_string(),
        state.producer_epoch.to_string(),
        state.transaction_state.to_string(),
        state.transaction_timeout_ms.to_string(),
        start,
        duration,
        partitions.join(","),
    ]
}

fn error_text(error: ResponseError, message: Option<&str>) -> String {
    match message {
        Some(m) if !m.is_empty() => format!("{error} ({m})"),
        _ => error.to_string(),
    }
}

/// Prints a table as `kafka-transactions.sh` does: every cell, the last included, padded to
/// its column's width and followed by a tab.
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
    let mut line = |cells: &mut dyn Iterator<Item = &str>| -> std::io::Result<()> {
        let mut text = String::new();
        for (cell, w) in cells.zip(widths) {
            text.push_str(&format!("{cell:<w$}\t"));
        }
        writeln!(out, "{text}")
    };
    line(&mut header.iter().copied())?;
    for row in rows {
        line(&mut row.iter().map(String::as_str))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use bytes::{Bytes, BytesMut};
    use clap::Parser;
    use kafka_protocol::messages::describe_transactions_response::TopicData;
    use kafka_protocol::messages::{ApiKey, ResponseHeader};
    use kafka_protocol::messages::{ProducerId, TopicName};
    use kafka_protocol::protocol::{Decodable, Encodable};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: TransactionsArgs,
    }

    fn parse(args: &[&str]) -> Result<TransactionsArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("transactions").chain(args.iter().copied()))
            .map(|c| c.args)
    }

    #[test]
    fn needs_one_action_and_an_id_to_describe() {
        let b = ["--bootstrap-server", "127.0.0.1:9092"];
        assert!(parse(&[b[0], b[1], "--list"]).unwrap().list);
        let describe = parse(&[b[0], b[1], "--describe", "--transactional-id", "t1"]).unwrap();
        assert!(describe.describe);
        assert_eq!(describe.transactional_id.as_deref(), Some("t1"));
        assert!(parse(&[b[0], b[1], "--list", "--describe"]).is_err());
        // Kafka's subcommand form.
        let list = parse(&[b[0], b[1], "list"]).unwrap();
        assert!(matches!(list.command, Some(TransactionsCommand::List)));
        let producers = parse(&[
            b[0],
            b[1],
            "describe-producers",
            "--topic",
            "t",
            "--partition",
            "0",
        ]);
        assert!(matches!(
            producers.unwrap().command,
            Some(TransactionsCommand::DescribeProducers { partition: 0, .. })
        ));
        assert!(parse(&[b[0], b[1], "describe"]).is_err(), "no id");
        assert!(
            parse(&[b[0], b[1], "find-hanging", "--partition", "1"]).is_err(),
            "no topic"
        );
        assert!(
            parse(&[
                b[0],
                b[1],
                "abort",
                "--topic",
                "t",
                "--partition",
                "0",
                "--producer-id",
                "1"
            ])
            .is_err(),
            "an id needs its epochs"
        );
        assert!(parse(&[b[0], b[1], "--describe"]).is_err(), "no id");
        assert!(parse(&["--list"]).is_err(), "no bootstrap server");
    }

    #[test]
    fn prints_tab_terminated_columns_as_kafka_transactions_sh() {
        let mut out = Vec::new();
        let rows = [[
            "a-long-transactional-id".to_owned(),
            "0".to_owned(),
            "12".to_owned(),
            "Ongoing".to_owned(),
        ]];
        print_table(&mut out, &LIST_HEADER, &rows).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "TransactionalId        \tCoordinator\tProducerId\tTransactionState\t\n\
             a-long-transactional-id\t0          \t12        \tOngoing         \t\n"
        );
    }

    #[test]
    fn describes_start_time_duration_and_sorted_partitions() {
        let state = TransactionState::default()
            .with_transactional_id(TransactionalId(StrBytes::from_static_str("t1")))
            .with_transaction_state(StrBytes::from_static_str("Ongoing"))
            .with_transaction_timeout_ms(60000)
            .with_transaction_start_time_ms(1000)
            .with_producer_id(ProducerId(4))
            .with_producer_epoch(2)
            .with_topics(vec![
                TopicData::default()
                    .with_topic(TopicName(StrBytes::from_static_str("b")))
                    .with_partitions(vec![2, 0]),
                TopicData::default()
                    .with_topic(TopicName(StrBytes::from_static_str("a")))
                    .with_partitions(vec![1]),
            ]);
        assert_eq!(
            describe_row(0, &state, 1500),
            [
                "0",
                "t1",
                "4",
                "2",
                "Ongoing",
                "60000",
                "1000",
                "500",
                "a-1,b-0,b-2"
            ]
        );
        let done = state
            .with_transaction_state(StrBytes::from_static_str("CompleteCommit"))
            .with_transaction_start_time_ms(-1)
            .with_topics(vec![]);
        assert_eq!(
            describe_row(0, &done, 1500),
            [
                "0",
                "t1",
                "4",
                "2",
                "CompleteCommit",
                "60000",
                "None",
                "None",
                ""
            ]
        );
    }

    /// A broker stand-in serving `apis` (key, max version) with canned answers: one
    /// transaction `t1` (producer 4, epoch 2, Ongoing on `out-0`), coordinated by node 3.
    async fn fake_broker(apis: &'static [(ApiKey, i16)]) -> String {
        use kafka_protocol::messages::api_versions_response::ApiVersion;
        use kafka_protocol::messages::find_coordinator_response::Coordinator;
        use kafka_protocol::messages::metadata_response::MetadataResponseBroker;
        use kafka_protocol::messages::{
            ApiVersionsResponse, BrokerId, DescribeTransactionsResponse, FindCoordinatorResponse,
            ListTransactionsResponse, MetadataResponse, list_transactions_response,
        };
        use kafka_protocol::protocol::decode_request_header_from_buffer;

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    loop {
                        let mut size = [0u8; 4];
                        if stream.read_exact(&mut size).await.is_err() {
                            return;
                        }
                        let mut buf = vec![0u8; u32::from_be_bytes(size) as usize];
                        stream.read_exact(&mut buf).await.unwrap();
                        let mut buf = Bytes::from(buf);
                        let header = decode_request_header_from_buffer(&mut buf).unwrap();
                        let key = ApiKey::try_from(header.request_api_key).unwrap();
                        let version = header.request_api_version;
                        let mut body = BytesMut::new();
                        ResponseHeader::default()
                            .with_correlation_id(header.correlation_id)
                            .encode(&mut body, key.response_header_version(version))
                            .unwrap();
                        let host = StrBytes::from_static_str("127.0.0.1");
                        let port = i32::from(address.port());
                        match key {
                            ApiKey::ApiVersions => ApiVersionsResponse::default()
                                .with_api_keys(
                                    apis.iter()
                                        .map(|(k, max)| {
                                            ApiVersion::default()
                                                .with_api_key(*k as i16)
                                                .with_max_version(*max)
                                        })
                                        .collect(),
                                )
                                .encode(&mut body, version),
                            ApiKey::Metadata => MetadataResponse::default()
                                .with_brokers(vec![
                                    MetadataResponseBroker::default()
                                        .with_node_id(BrokerId(3))
                                        .with_host(host)
                                        .with_port(port),
                                ])
                                .encode(&mut body, version),
                            ApiKey::FindCoordinator => {
                                let request =
                                    FindCoordinatorRequest::decode(&mut buf, version).unwrap();
                                assert_eq!(request.key_type, TRANSACTION_KEY);
                                assert_eq!(request.coordinator_keys.len(), 1);
                                FindCoordinatorResponse::default()
                                    .with_coordinators(vec![
                                        Coordinator::default()
                                            .with_key(request.coordinator_keys[0].clone())
                                            .with_node_id(BrokerId(3))
                                            .with_host(host)
                                            .with_port(port),
                                    ])
                                    .encode(&mut body, version)
                            }
                            ApiKey::DescribeTransactions => {
                                let request =
                                    DescribeTransactionsRequest::decode(&mut buf, version).unwrap();
                                let states = request
                                    .transactional_ids
                                    .into_iter()
                                    .map(|id| {
                                        let known = id.0.as_str() == "t1";
                                        TransactionState::default()
                                            .with_error_code(if known { 0 } else { 105 })
                                            .with_transactional_id(id)
                                            .with_transaction_state(StrBytes::from_static_str(
                                                "Ongoing",
                                            ))
                                            .with_transaction_timeout_ms(60000)
                                            .with_transaction_start_time_ms(1000)
                                            .with_producer_id(ProducerId(4))
                                            .with_producer_epoch(2)
                                            .with_topics(vec![
                                                TopicData::default()
                                                    .with_topic(TopicName(
                                                        StrBytes::from_static_str("out"),
                                                    ))
                                                    .with_partitions(vec![0]),
                                            ])
                                    })
                                    .collect();
                                DescribeTransactionsResponse::default()
                                    .with_transaction_states(states)
                                    .encode(&mut body, version)
                            }
                            ApiKey::ListTransactions => ListTransactionsResponse::default()
                                .with_transaction_states(vec![
                                    list_transactions_response::TransactionState::default()
                                        .with_transactional_id(TransactionalId(
                                            StrBytes::from_static_str("t1"),
                                        ))
                                        .with_producer_id(ProducerId(4))
                                        .with_transaction_state(StrBytes::from_static_str(
                                            "Ongoing",
                                        )),
                                ])
                                .encode(&mut body, version),
                            other => panic!("unexpected {other:?}"),
                        }
                        .unwrap();
                        let mut frame = (body.len() as u32).to_be_bytes().to_vec();
                        frame.extend_from_slice(&body);
                        stream.write_all(&frame).await.unwrap();
                    }
                });
            }
        });
        address.to_string()
    }

    const ALL_APIS: &[(ApiKey, i16)] = &[
        (ApiKey::ApiVersions, 3),
        (ApiKey::Metadata, 12),
        (ApiKey::FindCoordinator, 6),
        (ApiKey::DescribeTransactions, 0),
        (ApiKey::ListTransactions, 1),
    ];

    #[tokio::test]
    async fn describes_through_the_coordinator_and_lists_every_broker() {
        let address = fake_broker(ALL_APIS).await;
        // The first bootstrap server is down: the second one answers.
        let bootstrap = format!("127.0.0.1:1,{address}");
        let row = describe(&bootstrap, &Security::default(), "t1", || 4000)
            .await
            .unwrap();
        assert_eq!(
            row,
            [
                "3", "t1", "4", "2", "Ongoing", "60000", "1000", "3000", "out-0"
            ]
        );
        let rows = list(&bootstrap, &Security::default()).await.unwrap();
        assert_eq!(rows, [["t1", "3", "4", "Ongoing"]]);
        let unknown = describe(&address, &Security::default(), "nope", || 0)
            .await
            .unwrap_err();
        assert_eq!(
            format!("{unknown:#}"),
            format!(
                "failed to describe transactional-id `nope`: coordinator 3 ({address}) \
                 answered TransactionalIdNotFound"
            )
        );
    }

    #[tokio::test]
    async fn names_the_broker_and_the_missing_api() {
        let address = fake_broker(&[(ApiKey::ApiVersions, 3), (ApiKey::FindCoordinator, 4)]).await;
        let error = describe(&address, &Security::default(), "t1", || 0)
            .await
            .unwrap_err();
        assert_eq!(
            format!("{error:#}"),
            format!("broker {address} does not support DescribeTransactions")
        );
        let error = list("127.0.0.1:1", &Security::default()).await.unwrap_err();
        assert!(
            format!("{error:#}").starts_with("cannot connect to broker 127.0.0.1:1: "),
            "{error:#}"
        );
    }
}
