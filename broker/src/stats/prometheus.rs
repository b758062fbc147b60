//! The broker's numbers as Prometheus metrics, read from the live state at every scrape.
//!
//! | metric | type | labels | what |
//! |---|---|---|---|
//! | `kafka_log_start_offset` | gauge | topic, partition | first offset still stored |
//! | `kafka_high_watermark` | gauge | topic, partition | offset the next record gets |
//! | `kafka_last_stable_offset` | gauge | topic, partition | where read_committed consumers stop |
//! | `kafka_log_size_bytes` | gauge | topic, partition | bytes of the segment files |
//! | `kafka_log_segments` | gauge | topic, partition | segments, the active one included |
//! | `kafka_log_damaged_ranges` | gauge | topic, partition | damaged ranges found and not removed |
//! | `kafka_log_damaged_bytes` | gauge | topic, partition | bytes of those ranges |
//! | `kafka_log_cleaner_passes_total` | counter | topic, partition | compaction passes swapped in |
//! | `kafka_log_cleaner_records_removed_total` | counter | topic, partition | records those passes removed |
//! | `kafka_log_cleaner_checkpoint` | gauge | topic, partition | where the last compaction pass ended |
//! | `kafka_topic_bytes_in_total` | counter | topic | bytes of batches appended by Produce |
//! | `kafka_topic_bytes_out_total` | counter | topic | bytes of batches sent by Fetch |
//! | `kafka_topic_records_in_total` | counter | topic | records appended by Produce |
//! | `kafka_topic_records_out_total` | counter | topic | offsets of the batches sent by Fetch |
//! | `kafka_requests_total` | counter | api | requests served |
//! | `kafka_request_errors_total` | counter | api, error | error codes answered (Kafka's names) |
//! | `kafka_request_duration_seconds` | histogram | api | time to serve a request |
//! | `kafka_connections` | gauge | listener | connections open now |
//! | `kafka_connections_accepted_total` | counter | listener | connections accepted |
//! | `kafka_connections_closed_total` | counter | listener | connections closed |
//! | `kafka_connections_refused_total` | counter | listener | connections refused by a limit or for want of descriptors |
//! | `kafka_connections_malformed_total` | counter | listener | connections closed for a request that made no sense |
//! | `kafka_connections_receive_timeouts_total` | counter | listener | connections closed for a request not received whole within `request_receive_timeout_ms` |
//! | `kafka_connections_unauthenticated_too_large_total` | counter | listener | connections closed for a request before SASL authentication larger than `sasl_server_max_receive_size` |
//! | `kafka_connections_handshake_timeouts_total` | counter | listener | connections closed for a TLS handshake not done within `ssl_handshake_timeout_ms` |
//! | `kafka_connections_authentication_timeouts_total` | counter | listener | connections closed for not authenticating within `sasl_authentication_timeout_ms` |
//! | `kafka_limit_reached_total` | counter | limit | requests refused (producer states forgotten, fetches answered early) because a bound on what clients make the broker hold was reached, by its setting |
//! | `kafka_queued_request_bytes` | gauge | | bytes of requests read and not yet answered |
//! | `kafka_group_members` | gauge | group, state | members of a group |
//! | `kafka_group_committed_offset` | gauge | group, topic, partition | committed offset |
//! | `kafka_group_lag` | gauge | group, topic, partition | high watermark minus committed offset |
//! | `kafka_open_transactions` | gauge | | transactions Ongoing or Prepare* |
//! | `kafka_transaction_open_seconds` | gauge | transactional_id | how long each has been open |

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use super::{BrokerObserver, BrokerStats, counters::LATENCY_BUCKETS_MS};

/// A Prometheus [`Collector`] of a broker's metrics (the table in this module's docs): each
/// scrape takes one [`BrokerObserver::stats`] snapshot and encodes it.
#[derive(Debug, Clone)]
pub struct BrokerCollector {
    observer: BrokerObserver,
}

impl BrokerCollector {
    pub(crate) fn new(observer: BrokerObserver) -> Self {
        BrokerCollector { observer }
    }
}

type Labels = Vec<(&'static str, String)>;

/// A metric's name, help and how to read its value from a row of the snapshot.
type Described<Row, V> = (&'static str, &'static str, fn(&Row) -> V);

/// Encodes one metric family: `rows` of label set and value.
fn family<V: Copy>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    metric_type: MetricType,
    rows: impl IntoIterator<Item = (Labels, V)>,
    encode: impl Fn(V, prometheus_client::encoding::MetricEncoder<'_>) -> std::fmt::Result,
) -> std::fmt::Result {
    let mut metric = encoder.encode_descriptor(name, help, None, metric_type)?;
    for (labels, value) in rows {
        encode(value, metric.encode_family(&labels)?)?;
    }
    Ok(())
}

fn gauge(value: i64, encoder: prometheus_client::encoding::MetricEncoder<'_>) -> std::fmt::Result {
    ConstGauge::new(value).encode(encoder)
}

fn counter(
    value: u64,
    encoder: prometheus_client::encoding::MetricEncoder<'_>,
) -> std::fmt::Result {
    ConstCounter::new(value).encode(encoder)
}

impl Collector for BrokerCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        let stats = self.observer.stats();
        encode_partitions(&mut encoder, &stats)?;
        encode_topics(&mut encoder, &stats)?;
        encode_requests(&mut encoder, &stats)?;
        encode_connections(&mut encoder, &stats)?;
        encode_groups(&mut encoder, &stats)?;
        encode_transactions(&mut encoder, &stats)
    }
}

fn encode_partitions(encoder: &mut DescriptorEncoder<'_>, stats: &BrokerStats) -> std::fmt::Result {
    let labels = |p: &super::PartitionStats| {
        vec![
            ("topic", p.topic.clone()),
            ("partition", p.partition.to_string()),
        ]
    };
    let gauges: [Described<super::PartitionStats, i64>; 8] = [
        (
            "kafka_log_start_offset",
            "First offset still stored in the partition.",
            |p| p.log_start_offset,
        ),
        (
            "kafka_high_watermark",
            "Offset the next record appended to the partition gets.",
            |p| p.high_watermark,
        ),
        (
            "kafka_last_stable_offset",
            "Offset read_committed consumers read up to (before the oldest open transaction).",
            |p| p.last_stable_offset,
        ),
        (
            "kafka_log_size_bytes",
            "Bytes of the partition's segment files.",
            |p| i64::try_from(p.size_bytes).unwrap_or(i64::MAX),
        ),
        (
            "kafka_log_segments",
            "Segments of the partition, the active one included.",
            |p| i64::try_from(p.segments).unwrap_or(i64::MAX),
        ),
        (
            "kafka_log_damaged_ranges",
            "Damaged ranges found in the partition's segment files (CORRUPT_MESSAGE to fetches).",
            |p| i64::try_from(p.damaged_ranges).unwrap_or(i64::MAX),
        ),
        (
            "kafka_log_damaged_bytes",
            "Bytes of the damaged ranges found in the partition's segment files.",
            |p| i64::try_from(p.damaged_bytes).unwrap_or(i64::MAX),
        ),
        (
            "kafka_log_cleaner_checkpoint",
            "Where the partition's last compaction pass ended (0 before one).",
            |p| p.cleaner_checkpoint,
        ),
    ];
    for (name, help, value) in gauges {
        let rows = stats.partitions.iter().map(|p| (labels(p), value(p)));
        family(encoder, name, help, MetricType::Gauge, rows, gauge)?;
    }
    let counters: [Described<super::PartitionStats, u64>; 2] = [
        (
            "kafka_log_cleaner_passes",
            "Compaction passes swapped into the partition since the broker started.",
            |p| p.cleaner_passes,
        ),
        (
            "kafka_log_cleaner_records_removed",
            "Records compaction passes removed from the partition since the broker started.",
            |p| p.cleaner_records_removed,
        ),
    ];
    // Only compacted partitions have them: the others would only add zeros.
    let compacted: Vec<_> = stats
        .partitions
        .iter()
        .filter(|p| p.cleaner_passes > 0 || p.cleaner_checkpoint > 0)
        .collect();
    for (name, help, value) in counters {
        let rows = compacted.iter().map(|p| (labels(p), value(p)));
        family(encoder, name, help, MetricType::Counter, rows, counter)?;
    }
    Ok(())
}

fn encode_topics(encoder: &mut DescriptorEncoder<'_>, stats: &BrokerStats) -> std::fmt::Result {
    // The text encoding appends `_total` to a counter's name.
    let counters: [Described<super::TopicStats, u64>; 4] = [
        (
            "kafka_topic_bytes_in",
            "Bytes of record batches appended to the topic by Produce.",
            |t| t.bytes_in,
        ),
        (
            "kafka_topic_bytes_out",
            "Bytes of record batches of the topic sent by Fetch.",
            |t| t.bytes_out,
        ),
        (
            "kafka_topic_records_in",
            "Records appended to the topic by Produce.",
            |t| t.records_in,
        ),
        (
            "kafka_topic_records_out",
            "Offsets (records and transaction markers) of the batches of the topic sent by Fetch.",
            |t| t.records_out,
        ),
    ];
    for (name, help, value) in counters {
        let rows = stats
            .topics
            .iter()
            .map(|t| (vec![("topic", t.topic.clone())], value(t)));
        family(encoder, name, help, MetricType::Counter, rows, counter)?;
    }
    Ok(())
}

fn encode_requests(encoder: &mut DescriptorEncoder<'_>, stats: &BrokerStats) -> std::fmt::Result {
    let rows = stats
        .requests
        .iter()
        .map(|a| (vec![("api", a.api.clone())], a.requests));
    family(
        encoder,
        "kafka_requests",
        "Requests served, by API.",
        MetricType::Counter,
        rows,
        counter,
    )?;
    let rows = stats.requests.iter().flat_map(|a| {
        a.errors.iter().map(|e| {
            (
                vec![("api", a.api.clone()), ("error", e.error.clone())],
                e.count,
            )
        })
    });
    family(
        encoder,
        "kafka_request_errors",
        "Error codes in responses (one per partition, topic or group answered with it), by API \
         and Kafka's error name.",
        MetricType::Counter,
        rows,
        counter,
    )?;
    let mut metric = encoder.encode_descriptor(
        "kafka_request_duration_seconds",
        "Time from decoding a request to its response being ready, by API.",
        None,
        MetricType::Histogram,
    )?;
    for api in &stats.requests {
        let buckets: Vec<(f64, u64)> = api
            .latency
            .buckets
            .iter()
            .map(|b| (b.le_ms.map_or(f64::INFINITY, |ms| ms / 1000.0), b.count))
            .collect();
        debug_assert_eq!(buckets.len(), LATENCY_BUCKETS_MS.len() + 1);
        let labels = vec![("api", api.api.clone())];
        metric
            .encode_family(&labels)?
            .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                api.latency.sum_ms / 1000.0,
                api.latency.count,
                &buckets,
                None,
            )?;
    }
    Ok(())
}

fn encode_connections(
    encoder: &mut DescriptorEncoder<'_>,
    stats: &BrokerStats,
) -> std::fmt::Result {
    let labels = |l: &super::ListenerStats| vec![("listener", l.listener.clone())];
    let rows = stats
        .connections
        .iter()
        .map(|l| (labels(l), i64::try_from(l.open).unwrap_or(i64::MAX)));
    family(
        encoder,
        "kafka_connections",
        "Client connections open now, by listener.",
        MetricType::Gauge,
        rows,
        gauge,
    )?;
    let rows = stats.connections.iter().map(|l| (labels(l), l.accepted));
    family(
        encoder,
        "kafka_connections_accepted",
        "Client connections accepted, by listener.",
        MetricType::Counter,
        rows,
        counter,
    )?;
    let rows = stats.connections.iter().map(|l| (labels(l), l.closed));
    family(
        encoder,
        "kafka_connections_closed",
        "Client connections closed, by listener.",
        MetricType::Counter,
        rows,
        counter,
    )?;
    let rows = stats.connections.iter().map(|l| (labels(l), l.refused));
    family(
        encoder,
        "kafka_connections_refused",
        "Client connections refused by a connection limit or for want of file descriptors, by listener.",
        MetricType::Counter,
        rows,
        counter,
    )?;
    let rows = stats.connections.iter().map(|l| (labels(l), l.malformed));
    family(
        encoder,
        "kafka_connections_malformed",
        "Client connections closed because a request could not be made sense of, by listener.",
        MetricType::Counter,
        rows,
        counter,
    )?;
    let rows = stats
        .connections
        .iter()
        .map(|l| (labels(l), l.receive_timeouts));
    family(
        encoder,
        "kafka_connections_receive_timeouts",
        "Client connections closed because a request did not arrive whole within \
         request_receive_timeout_ms of its first byte, by listener.",
        MetricType::Counter,
        rows,
        counter,
    )?;
    let rows = stats
        .connections
        .iter()
        .map(|l| (labels(l), l.unauthenticated_too_large));
    family(
        encoder,
        "kafka_connections_unauthenticated_too_large",
        "Client connections closed because a request before SASL authentication was larger \
         than sasl_server_max_receive_size, by listener.",
        MetricType::Counter,
        rows,
        counter,
    )?;
    let rows = stats
        .connections
        .iter()
        .map(|l| (labels(l), l.handshake_timeouts));
    family(
        encoder,
        "kafka_connections_handshake_timeouts",
        "Client connections closed because their TLS handshake was not done within \
         ssl_handshake_timeout_ms, by listener.",
        MetricType::Counter,
        rows,
        counter,
    )?;
    let rows = stats
        .connections
        .iter()
        .map(|l| (labels(l), l.authentication_timeouts));
    family(
        encoder,
        "kafka_connections_authentication_timeouts",
        "Client connections closed because they had not authenticated within \
         sasl_authentication_timeout_ms, by listener.",
        MetricType::Counter,
        rows,
        counter,
    )?;
    let rows = [(
        Vec::new(),
        i64::try_from(stats.queued_request_bytes).unwrap_or(i64::MAX),
    )];
    family(
        encoder,
        "kafka_queued_request_bytes",
        "Bytes of requests read and not yet answered (bounded by queued_max_request_bytes).",
        MetricType::Gauge,
        rows,
        gauge,
    )?;
    let rows = stats
        .limits_reached
        .iter()
        .map(|l| (vec![("limit", l.limit.clone())], l.count));
    family(
        encoder,
        "kafka_limit_reached",
        "Times a bound on what clients make the broker hold was reached (a request refused, a \
         producer state forgotten, a fetch answered early), by the setting that bounds it.",
        MetricType::Counter,
        rows,
        counter,
    )
}

fn encode_groups(encoder: &mut DescriptorEncoder<'_>, stats: &BrokerStats) -> std::fmt::Result {
    let rows = stats.groups.iter().map(|g| {
        (
            vec![("group", g.group.clone()), ("state", g.state.clone())],
            i64::try_from(g.members.len()).unwrap_or(i64::MAX),
        )
    });
    family(
        encoder,
        "kafka_group_members",
        "Members of a consumer group, with its state.",
        MetricType::Gauge,
        rows,
        gauge,
    )?;
    let offsets = || {
        stats.groups.iter().flat_map(|g| {
            g.offsets.iter().map(|o| {
                let labels = vec![
                    ("group", g.group.clone()),
                    ("topic", o.topic.clone()),
                    ("partition", o.partition.to_string()),
                ];
                (labels, o)
            })
        })
    };
    family(
        encoder,
        "kafka_group_committed_offset",
        "Offset committed by a consumer group on a partition.",
        MetricType::Gauge,
        offsets().map(|(labels, o)| (labels, o.committed_offset)),
        gauge,
    )?;
    family(
        encoder,
        "kafka_group_lag",
        "High watermark minus the committed offset of a consumer group on a partition.",
        MetricType::Gauge,
        offsets().map(|(labels, o)| (labels, o.lag)),
        gauge,
    )
}

fn encode_transactions(
    encoder: &mut DescriptorEncoder<'_>,
    stats: &BrokerStats,
) -> std::fmt::Result {
    family(
        encoder,
        "kafka_open_transactions",
        "Transactions open now (Ongoing, PrepareCommit or PrepareAbort).",
        MetricType::Gauge,
        [(
            Vec::new(),
            i64::try_from(stats.transactions.len()).unwrap_or(i64::MAX),
        )],
        gauge,
    )?;
    let rows = stats.transactions.iter().map(|t| {
        (
            vec![("transactional_id", t.transactional_id.clone())],
            t.duration_ms as f64 / 1000.0,
        )
    });
    family(
        encoder,
        "kafka_transaction_open_seconds",
        "How long an open transaction has been open.",
        MetricType::Gauge,
        rows,
        |value, encoder| ConstGauge::new(value).encode(encoder),
    )
}
