//! `agent producer-perf-test` and `agent consumer-perf-test`: Kafka's
//! `kafka-producer-perf-test.sh` and `kafka-consumer-perf-test.sh`, with their flags and their
//! output, on librdkafka.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::Args;
use ferry_kafka::client::properties::ClientProperties;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::util::Timeout;
use rdkafka::{ClientContext, Statistics};

use super::{REQUEST_TIMEOUT, split_property};

/// Kafka's transactional id when transactions are asked for without one.
const DEFAULT_TRANSACTIONAL_ID: &str = "performance-producer-default-transactional-id";
/// Kafka's commit interval when a transactional id is given without `--transaction-duration-ms`.
const DEFAULT_TRANSACTION_DURATION_MS: u64 = 3000;
/// The interval of the producer's progress lines, as Kafka's.
const PRODUCER_REPORTING_INTERVAL: Duration = Duration::from_millis(5000);
/// Properties Kafka's tools set themselves (Java classes): taken and left alone.
const JAVA_SERDES: [&str; 4] = [
    "key.serializer",
    "value.serializer",
    "key.deserializer",
    "value.deserializer",
];

/// Flags of `agent producer-perf-test`, as `kafka-producer-perf-test.sh` names them.
#[derive(Args, Debug)]
pub struct ProducerPerfArgs {
    /// The server(s) to connect to, comma-separated (or `bootstrap.servers` in
    /// --producer-props or --producer.config, as Kafka's tool takes it).
    #[arg(long = "bootstrap-server", value_name = "HOST:PORT")]
    bootstrap_server: Option<String>,
    /// The topic to write to.
    #[arg(long)]
    topic: String,
    /// How many records to send.
    #[arg(long = "num-records", value_name = "N", allow_negative_numbers = true)]
    num_records: i64,
    /// The size of each record in bytes (random upper-case letters, as Kafka's).
    #[arg(
        long = "record-size",
        value_name = "BYTES",
        allow_negative_numbers = true,
        required_unless_present_any = ["payload_file", "payload_monotonic"],
        conflicts_with_all = ["payload_file", "payload_monotonic"]
    )]
    record_size: Option<i64>,
    /// Each record's payload is its number (`0`, `1`, ...), as Kafka's --payload-monotonic.
    #[arg(long = "payload-monotonic", conflicts_with = "payload_file")]
    payload_monotonic: bool,
    /// A file of payloads separated by --payload-delimiter; each record is one of them,
    /// picked at random.
    #[arg(long = "payload-file", value_name = "FILE")]
    payload_file: Option<PathBuf>,
    /// What separates the payloads of --payload-file (`\n`, a newline, by default).
    #[arg(
        long = "payload-delimiter",
        default_value = "\\n",
        requires = "payload_file"
    )]
    payload_delimiter: String,
    /// At most about this many records a second; -1 for no limit.
    #[arg(long, value_name = "RECORDS_PER_SEC", allow_negative_numbers = true)]
    throughput: f64,
    /// Producer properties `key=value` (librdkafka's, e.g. `acks=all linger.ms=5`).
    #[arg(long = "producer-props", value_name = "KEY=VALUE", num_args = 1..)]
    producer_props: Vec<String>,
    /// A producer properties file (`key=value` lines), read before --producer-props.
    #[arg(
        long = "producer.config",
        value_name = "FILE",
        alias = "command-config"
    )]
    producer_config: Option<PathBuf>,
    /// Print the client's statistics (librdkafka's) at the end.
    #[arg(long = "print-metrics")]
    print_metrics: bool,
    /// Send in transactions under this transactional id.
    #[arg(long = "transactional-id", value_name = "ID")]
    transactional_id: Option<String>,
    /// Commit the transaction every this many milliseconds (3000 when only
    /// --transactional-id is given); transactions are used when it is given.
    #[arg(
        long = "transaction-duration-ms",
        value_name = "MS",
        allow_negative_numbers = true
    )]
    transaction_duration_ms: Option<i64>,
}

/// Reads a properties file as the tools do, also taking `bootstrap.servers` from it (which
/// the cluster tools refuse); gives the properties and the servers.
fn read_properties(path: &Path) -> anyhow::Result<(ClientProperties, Option<String>)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{}: cannot read the file", path.display()))?;
    let parsed = ferry_core::properties::parse(&text)
        .map_err(|e| anyhow::anyhow!("{}:{}: {}", path.display(), e.line, e.message))?;
    let servers = parsed
        .iter()
        .rev()
        .find(|p| p.key == "bootstrap.servers")
        .map(|p| p.value.clone());
    let skipped: Vec<usize> = parsed
        .iter()
        .filter(|p| p.key == "bootstrap.servers" || JAVA_SERDES.contains(&p.key.as_str()))
        .map(|p| p.line)
        .collect();
    // Those lines are blanked, so that the others keep their numbers in the messages.
    let kept: Vec<&str> = text
        .lines()
        .enumerate()
        .map(|(i, line)| if skipped.contains(&(i + 1)) { "" } else { line })
        .collect();
    let properties = ClientProperties::parse(path, &kept.join("\n"))?;
    Ok((properties, servers))
}

/// The `key=value` flags as checked client properties (security settings such as
/// `sasl.jaas.config` translated as in a file), and `bootstrap.servers` if among them.
fn flag_properties(
    flag: &str,
    pairs: &[String],
) -> anyhow::Result<(ClientProperties, Option<String>)> {
    let mut servers = None;
    let mut lines = Vec::new();
    for pair in pairs {
        let (key, value) = split_property(pair).with_context(|| flag.to_owned())?;
        if key == "bootstrap.servers" {
            servers = Some(value.to_owned());
        } else if !JAVA_SERDES.contains(&key) {
            // As a properties line: backslashes stay themselves.
            lines.push(format!("{key}={}", value.replace('\\', "\\\\")));
        } else {
            lines.push(String::new());
        }
    }
    let properties = ClientProperties::parse(Path::new(flag), &lines.join("\n")).map_err(|e| {
        let item = e
            .line
            .and_then(|l| pairs.get(l - 1))
            .map(|pair| format!(" `{pair}`"))
            .unwrap_or_default();
        anyhow::anyhow!("{flag}{item}: {}", e.message)
    })?;
    Ok((properties, servers))
}

/// Statistics of librdkafka, kept for `--print-metrics`.
#[derive(Default)]
struct Metrics {
    /// The latest statistics (JSON) and when they came.
    latest: Mutex<Option<(Instant, Vec<u8>)>>,
}

impl Metrics {
    fn keep(&self, statistics: &[u8]) {
        let mut latest = self.latest.lock().unwrap_or_else(|e| e.into_inner());
        *latest = Some((Instant::now(), statistics.to_vec()));
    }

    /// Statistics that came after `after`, waiting for them up to `patience` while `poll`
    /// serves the client's events.
    fn after(&self, after: Instant, patience: Duration, mut poll: impl FnMut()) -> Option<Vec<u8>> {
        let deadline = Instant::now() + patience;
        loop {
            {
                let latest = self.latest.lock().unwrap_or_else(|e| e.into_inner());
                if let Some((at, json)) = latest.as_ref()
                    && *at >= after
                {
                    return Some(json.clone());
                }
            }
            if Instant::now() >= deadline {
                let latest = self.latest.lock().unwrap_or_else(|e| e.into_inner());
                return latest.as_ref().map(|(_, json)| json.clone());
            }
            poll();
        }
    }
}

/// The statistics interval asked of librdkafka for `--print-metrics`.
const STATISTICS_INTERVAL_MS: &str = "500";

/// Prints librdkafka's statistics as Kafka's tools print their metrics: a `Metric Name` /
/// `Value` table, one `group:name:{tags}` line per number (`rdkafka` for the client,
/// `rdkafka-broker`, `rdkafka-topic` and `rdkafka-partition` for the parts).
fn print_metrics(out: &mut impl Write, statistics: Option<Vec<u8>>) -> anyhow::Result<()> {
    let Some(json) = statistics else {
        bail!("--print-metrics: librdkafka gave no statistics");
    };
    let value: serde_json::Value =
        serde_json::from_slice(&json).context("--print-metrics: librdkafka's statistics")?;
    let mut rows: Vec<(String, String)> = Vec::new();
    let client_tag = format!(
        "client-id={}",
        value
            .get("client_id")
            .and_then(|v| v.as_str())
            .unwrap_or("")
    );
    if let Some(top) = value.as_object() {
        for (key, v) in top {
            match key.as_str() {
                "brokers" => each_part(v, |name, part| {
                    flatten(
                        part,
                        "rdkafka-broker",
                        "",
                        &format!("broker={name}"),
                        &mut rows,
                    );
                }),
                "topics" => each_part(v, |topic, part| {
                    if let Some(fields) = part.as_object() {
                        for (k, f) in fields {
                            if k == "partitions" {
                                each_part(f, |p, partition| {
                                    flatten(
                                        partition,
                                        "rdkafka-partition",
                                        "",
                                        &format!("topic={topic}, partition={p}"),
                                        &mut rows,
                                    );
                                });
                            } else {
                                flatten(
                                    f,
                                    "rdkafka-topic",
                                    k,
                                    &format!("topic={topic}"),
                                    &mut rows,
                                );
                            }
                        }
                    }
                }),
                _ => flatten(v, "rdkafka", key, &client_tag, &mut rows),
            }
        }
    }
    rows.sort();
    let width = rows.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    writeln!(out)?;
    writeln!(out, "{:<width$}   Value", "Metric Name")?;
    for (name, value) in rows {
        writeln!(out, "{name:<width$} : {value}")?;
    }
    Ok(())
}

/// Calls `f` with each entry of a JSON object.
fn each_part(value: &serde_json::Value, mut f: impl FnMut(&str, &serde_json::Value)) {
    if let Some(parts) = value.as_object() {
        for (name, part) in parts {
            f(name, part);
        }
    }
}

/// The numbers of `value` as rows `group:path:{tags}`; nested objects join their keys with `.`.
fn flatten(
    value: &serde_json::Value,
    group: &str,
    path: &str,
    tags: &str,
    rows: &mut Vec<(String, String)>,
) {
    match value {
        serde_json::Value::Number(n) => {
            if let Some(x) = n.as_f64() {
                rows.push((format!("{group}:{path}:{{{tags}}}"), format!("{x:.3}")));
            }
        }
        serde_json::Value::Object(fields) => {
            for (k, v) in fields {
                let path = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                flatten(v, group, &path, tags, rows);
            }
        }
        _ => {}
    }
}

/// `x` as Java's `%.Nf` prints it (`Infinity`, `NaN` for what a division by zero gives).
fn java_fixed(x: f64, decimals: usize) -> String {
    if x.is_nan() {
        "NaN".into()
    } else if x.is_infinite() {
        if x > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else {
        format!("{x:.decimals$}")
    }
}

/// One record handed to the producer: when, and its size.
struct Sent {
    at: Instant,
    bytes: u64,
}

/// The latency and throughput figures, as Kafka's `ProducerPerformance.Stats`: every record's
/// latency (from the send to its delivery report) counts, and a sample of at most 500,000
/// of them gives the percentiles.
struct Stats {
    start: Instant,
    window_start: Instant,
    sampling: u64,
    iteration: u64,
    latencies: Vec<u64>,
    count: u64,
    bytes: u64,
    max_latency: u64,
    total_latency: u64,
    window_count: u64,
    window_max_latency: u64,
    window_total_latency: u64,
    window_bytes: u64,
    /// The first failure writing a progress line (standard output closed).
    write_error: Option<std::io::Error>,
}

impl Stats {
    fn new(num_records: u64, start: Instant) -> Self {
        let sampling = (num_records / num_records.clamp(1, 500_000)).max(1);
        Stats {
            start,
            window_start: start,
            sampling,
            iteration: 0,
            latencies: Vec::with_capacity(usize::try_from(num_records / sampling + 1).unwrap_or(0)),
            count: 0,
            bytes: 0,
            max_latency: 0,
            total_latency: 0,
            window_count: 0,
            window_max_latency: 0,
            window_total_latency: 0,
            window_bytes: 0,
            write_error: None,
        }
    }

    /// Counts a delivered record; prints the window's line every 5 s.
    fn record(&mut self, latency: u64, bytes: u64, now: Instant) {
        self.count += 1;
        self.bytes += bytes;
        self.total_latency += latency;
        self.max_latency = self.max_latency.max(latency);
        self.window_count += 1;
        self.window_bytes += bytes;
        self.window_total_latency += latency;
        self.window_max_latency = self.window_max_latency.max(latency);
        if self.iteration.is_multiple_of(self.sampling) {
            self.latencies.push(latency);
        }
        self.iteration += 1;
        if now.duration_since(self.window_start) >= PRODUCER_REPORTING_INTERVAL {
            let line = self.window_line(now);
            if self.write_error.is_none()
                && let Err(e) = writeln!(std::io::stdout(), "{line}")
            {
                self.write_error = Some(e);
            }
            self.window_start = now;
            self.window_count = 0;
            self.window_bytes = 0;
            self.window_total_latency = 0;
            self.window_max_latency = 0;
        }
    }

    /// `N records sent, X records/sec (Y MB/sec), Z ms avg latency, W ms max latency.`
    fn window_line(&self, now: Instant) -> String {
        let elapsed = millis(now.duration_since(self.window_start)) as f64;
        let records_per_sec = 1000.0 * self.window_count as f64 / elapsed;
        let mb_per_sec = 1000.0 * self.window_bytes as f64 / elapsed / (1024.0 * 1024.0);
        format!(
            "{} records sent, {} records/sec ({} MB/sec), {} ms avg latency, {} ms max latency.",
            self.window_count,
            java_fixed(records_per_sec, 1),
            java_fixed(mb_per_sec, 2),
            java_fixed(
                self.window_total_latency as f64 / self.window_count as f64,
                1
            ),
            java_fixed(self.window_max_latency as f64, 1),
        )
    }

    /// The summary: totals and the 50th, 95th, 99th and 99.9th percentiles of the latency.
    fn total_line(&mut self, now: Instant) -> String {
        let elapsed = millis(now.duration_since(self.start)) as f64;
        let records_per_sec = 1000.0 * self.count as f64 / elapsed;
        let mb_per_sec = 1000.0 * self.bytes as f64 / elapsed / (1024.0 * 1024.0);
        self.latencies.sort_unstable();
        let n = self.latencies.len();
        let percentile = |p: f64| -> u64 {
            let i = ((p * n as f64) as usize).min(n.saturating_sub(1));
            self.latencies.get(i).copied().unwrap_or(0)
        };
        format!(
            "{} records sent, {} records/sec ({} MB/sec), {} ms avg latency, {} ms max latency, \
             {} ms 50th, {} ms 95th, {} ms 99th, {} ms 99.9th.",
            self.count,
            java_fixed(records_per_sec, 6),
            java_fixed(mb_per_sec, 2),
            java_fixed(self.total_latency as f64 / self.count as f64, 2),
            java_fixed(self.max_latency as f64, 2),
            percentile(0.5),
            percentile(0.95),
            percentile(0.99),
            percentile(0.999),
        )
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The producer's context: the statistics of delivered records, the failures, librdkafka's
/// statistics.
struct PerfProducer {
    stats: Mutex<Stats>,
    failures: super::DeliveryFailures,
    metrics: Metrics,
}

impl ClientContext for PerfProducer {
    fn stats_raw(&self, statistics: &[u8]) {
        self.metrics.keep(statistics);
    }
    fn stats(&self, _: Statistics) {}
}

impl ProducerContext for PerfProducer {
    type DeliveryOpaque = Box<Sent>;
    fn delivery(&self, result: &DeliveryResult<'_>, sent: Box<Sent>) {
        let now = Instant::now();
        match result {
            Ok(_) => {
                let latency = millis(now.duration_since(sent.at));
                let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
                stats.record(latency, sent.bytes, now);
            }
            // As Kafka's: a failed record is not counted as sent.
            Err((error, _)) => self.failures.record(error),
        }
    }
}

/// Keeps the send rate near the target, as Kafka's `ThroughputThrottler`: once ahead of the
/// rate, each record adds 1/target seconds to a sleep deficit, slept off in steps of at
/// least 2 ms.
struct Throttler {
    target: f64,
    start: Instant,
    sleep_per_record: Duration,
    deficit: Duration,
}

impl Throttler {
    const MIN_SLEEP: Duration = Duration::from_millis(2);

    fn new(target: f64, start: Instant) -> Self {
        let sleep_per_record = if target > 0.0 {
            Duration::from_secs_f64(1.0 / target)
        } else {
            Duration::ZERO
        };
        Throttler {
            target,
            start,
            sleep_per_record,
            deficit: Duration::ZERO,
        }
    }

    fn should_throttle(&self, sent_so_far: u64, now: Instant) -> bool {
        if self.target < 0.0 {
            return false;
        }
        // Milliseconds, as Kafka's.
        let elapsed = millis(now.duration_since(self.start)) as f64 / 1000.0;
        elapsed > 0.0 && sent_so_far as f64 / elapsed > self.target
    }

    /// Sleeps off the deficit when it reached 2 ms, serving the producer's delivery reports
    /// meanwhile.
    fn throttle(&mut self, mut serve: impl FnMut(Duration)) {
        self.deficit += self.sleep_per_record;
        if self.deficit >= Self::MIN_SLEEP {
            let deadline = Instant::now() + self.deficit;
            loop {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                serve(deadline - now);
            }
            self.deficit = Duration::ZERO;
        }
    }
}

/// The payloads of `--payload-file`, split at the delimiter (`\n` meaning a newline); empty
/// trailing ones are dropped, as Java's `String.split` drops them.
fn read_payloads(path: &Path, delimiter: &str) -> anyhow::Result<Vec<Vec<u8>>> {
    let delimiter = if delimiter == "\\n" { "\n" } else { delimiter };
    if delimiter.is_empty() {
        bail!("--payload-delimiter must not be empty");
    }
    let text = std::fs::read(path)
        .with_context(|| format!("--payload-file {}: cannot read the file", path.display()))?;
    let mut payloads: Vec<Vec<u8>> = Vec::new();
    let sep = delimiter.as_bytes();
    let mut rest = text.as_slice();
    while let Some(i) = rest.windows(sep.len()).position(|w| w == sep) {
        payloads.push(rest[..i].to_vec());
        rest = &rest[i + sep.len()..];
    }
    payloads.push(rest.to_vec());
    while payloads.last().is_some_and(Vec::is_empty) {
        payloads.pop();
    }
    if payloads.is_empty() {
        bail!(
            "--payload-file {}: the file does not contain any payloads",
            path.display()
        );
    }
    Ok(payloads)
}

/// A small, fast pseudo-random generator (xorshift64*), seeded from the clock: payload
/// letters and the pick among the file's payloads need no better.
struct Random(u64);

impl Random {
    fn seeded() -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Random((nanos ^ u64::from(std::process::id()) << 32) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Whether transactions are used, their id and the commit interval (ms), as Kafka decides:
/// any of --transactional-id, --transaction-duration-ms or a `transactional.id` property
/// turns them on.
fn transactions(
    args: &ProducerPerfArgs,
    configured_id: Option<&str>,
) -> anyhow::Result<Option<(String, u64)>> {
    if args.transactional_id.is_none()
        && args.transaction_duration_ms.is_none()
        && configured_id.is_none()
    {
        return Ok(None);
    }
    let id = args
        .transactional_id
        .as_deref()
        .or(configured_id)
        .unwrap_or(DEFAULT_TRANSACTIONAL_ID)
        .to_owned();
    if id.is_empty() {
        bail!("--transactional-id must not be empty");
    }
    let duration = match args.transaction_duration_ms {
        None => DEFAULT_TRANSACTION_DURATION_MS,
        Some(ms) if ms > 0 => ms.unsigned_abs(),
        Some(ms) => bail!("--transaction-duration-ms {ms}: must be positive"),
    };
    Ok(Some((id, duration)))
}

/// Runs `agent producer-perf-test`.
pub fn produce(args: ProducerPerfArgs) -> anyhow::Result<()> {
    let num_records = match u64::try_from(args.num_records) {
        Ok(n) if n > 0 => n,
        _ => bail!("--num-records {}: must be positive", args.num_records),
    };
    if args.throughput == 0.0 || args.throughput.is_nan() {
        bail!(
            "--throughput {}: give a positive number of records a second, or -1 for no limit",
            args.throughput
        );
    }
    if args.topic.is_empty() {
        bail!("--topic must not be empty");
    }
    let mut out = std::io::stdout().lock();
    let payloads: Vec<Vec<u8>> = match (&args.payload_file, args.record_size) {
        (Some(path), _) => {
            let absolute = std::path::absolute(path).unwrap_or_else(|_| path.clone());
            writeln!(out, "Reading payloads from: {}", absolute.display())?;
            let payloads = read_payloads(path, &args.payload_delimiter)?;
            writeln!(out, "Number of messages read: {}", payloads.len())?;
            payloads
        }
        (None, Some(size)) => {
            let size = match usize::try_from(size) {
                Ok(s) if s > 0 => s,
                _ => {
                    bail!("--record-size {size}: must be at least 1 byte (or give --payload-file)")
                }
            };
            // As Kafka's: one payload of random upper-case letters, sent again and again.
            let mut random = Random::seeded();
            vec![(0..size).map(|_| b'A' + random.below(26) as u8).collect()]
        }
        // --payload-monotonic: made record by record.
        (None, None) if args.payload_monotonic => Vec::new(),
        (None, None) => {
            bail!("one of --record-size, --payload-file or --payload-monotonic must be given")
        }
    };
    drop(out);

    let mut config = ClientConfig::new();
    let mut servers = None;
    if let Some(path) = &args.producer_config {
        let (properties, from_file) = read_properties(path)?;
        properties.apply(&mut config);
        servers = from_file;
    }
    let (properties, from_flags) = flag_properties("--producer-props", &args.producer_props)?;
    properties.apply(&mut config);
    let servers = args
        .bootstrap_server
        .clone()
        .or(from_flags)
        .or(servers)
        .context(
            "no servers to connect to: give --bootstrap-server HOST:PORT or \
             --producer-props bootstrap.servers=HOST:PORT",
        )?;
    config.set("bootstrap.servers", &servers);
    let transactions = transactions(&args, config.get("transactional.id"))?;
    if let Some((id, _)) = &transactions {
        config.set("transactional.id", id);
    }
    if args.print_metrics && config.get("statistics.interval.ms").is_none() {
        config.set("statistics.interval.ms", STATISTICS_INTERVAL_MS);
    }
    let producer: BaseProducer<PerfProducer> = config
        .create_with_context(PerfProducer {
            stats: Mutex::new(Stats::new(num_records, Instant::now())),
            failures: Default::default(),
            metrics: Metrics::default(),
        })
        .context("creating the producer (check --producer-props and --producer.config)")?;
    if transactions.is_some() {
        producer
            .init_transactions(REQUEST_TIMEOUT)
            .context("initialising transactions")?;
    }
    let sent = send_all(
        &producer,
        &args,
        num_records,
        &payloads,
        transactions.as_ref(),
    );
    if sent.is_err() && transactions.is_some() {
        let _ = producer.abort_transaction(REQUEST_TIMEOUT);
    }
    // Every record ends delivered or failed (after `message.timeout.ms` at most).
    let flushed = producer
        .flush(Timeout::Never)
        .context("waiting for the last records to be acknowledged");
    sent?;
    flushed?;
    let done = Instant::now();
    let context = producer.context();
    let mut out = std::io::stdout().lock();
    {
        let mut stats = context.stats.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = stats.write_error.take() {
            return Err(e).context("writing to standard output");
        }
        writeln!(out, "{}", stats.total_line(done))?;
    }
    if args.print_metrics {
        let statistics = context.metrics.after(done, Duration::from_secs(3), || {
            producer.poll(Duration::from_millis(100));
        });
        print_metrics(&mut out, statistics)?;
    }
    if let Some((failed, first)) = context.failures.summary() {
        bail!(
            "{failed} of {num_records} records were not delivered to {}; first error: {first}",
            args.topic
        );
    }
    Ok(())
}

/// Sends the records, at the asked rate, committing a transaction every interval.
fn send_all(
    producer: &BaseProducer<PerfProducer>,
    args: &ProducerPerfArgs,
    num_records: u64,
    payloads: &[Vec<u8>],
    transactions: Option<&(String, u64)>,
) -> anyhow::Result<()> {
    // As Kafka's: the clock starts with the first record, once the producer is ready.
    let start = Instant::now();
    {
        let mut stats = producer
            .context()
            .stats
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        stats.start = start;
        stats.window_start = start;
    }
    let mut throttler = Throttler::new(args.throughput, start);
    let mut random = Random::seeded();
    let mut in_transaction = 0u64;
    let mut transaction_start = Instant::now();
    for i in 0..num_records {
        let number;
        let payload: &[u8] = if payloads.is_empty() {
            number = i.to_string();
            number.as_bytes()
        } else if payloads.len() == 1 {
            &payloads[0]
        } else {
            &payloads[random.below(payloads.len() as u64) as usize]
        };
        if transactions.is_some() && in_transaction == 0 {
            producer
                .begin_transaction()
                .context("beginning a transaction")?;
            transaction_start = Instant::now();
        }
        let at = Instant::now();
        let sent = Box::new(Sent {
            at,
            bytes: payload.len() as u64,
        });
        let mut record =
            BaseRecord::<[u8], [u8], Box<Sent>>::with_opaque_to(&args.topic, sent).payload(payload);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    producer.poll(Duration::from_millis(10));
                }
                Err((error, _)) => bail!("record {}: sending to {}: {error}", i + 1, args.topic),
            }
        }
        producer.poll(Duration::ZERO);
        in_transaction += 1;
        if let Some((_, duration_ms)) = transactions
            && millis(at.duration_since(transaction_start)) >= *duration_ms
        {
            producer
                .commit_transaction(Timeout::Never)
                .context("committing the transaction")?;
            in_transaction = 0;
        }
        if throttler.should_throttle(i, at) {
            throttler.throttle(|d| {
                producer.poll(d);
            });
        }
        if i % 1024 == 0 {
            let stats = producer.context().stats.lock();
            if stats.is_ok_and(|s| s.write_error.is_some()) {
                // Standard output closed: nothing more is wanted.
                return Ok(());
            }
        }
    }
    if transactions.is_some() && in_transaction > 0 {
        producer
            .commit_transaction(Timeout::Never)
            .context("committing the last transaction")?;
    }
    Ok(())
}

/// Flags of `agent consumer-perf-test`, as `kafka-consumer-perf-test.sh` names them.
#[derive(Args, Debug)]
pub struct ConsumerPerfArgs {
    /// The server(s) to connect to, comma-separated (`--broker-list`, Kafka's older
    /// spelling, is taken too).
    #[arg(
        long = "bootstrap-server",
        value_name = "HOST:PORT",
        alias = "broker-list"
    )]
    bootstrap_server: String,
    /// The topic to read.
    #[arg(long)]
    topic: String,
    /// How many records to read (`--num-records`, Kafka's newer name, is taken too).
    #[arg(
        long,
        value_name = "N",
        alias = "num-records",
        allow_negative_numbers = true
    )]
    messages: i64,
    /// The consumer group (`perf-consumer-NNNNN`, a random one, by default, as Kafka's).
    #[arg(long)]
    group: Option<String>,
    /// Give up after this many milliseconds without a record.
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    timeout: u64,
    /// The most bytes fetched of a partition at once (`max.partition.fetch.bytes`).
    #[arg(long = "fetch-size", value_name = "BYTES", default_value_t = 1024 * 1024)]
    fetch_size: u64,
    /// The socket receive buffer (`socket.receive.buffer.bytes`).
    #[arg(long = "socket-buffer-size", value_name = "BYTES", default_value_t = 2 * 1024 * 1024)]
    socket_buffer_size: u64,
    /// Start a new group at the end of the topic, not at its beginning.
    #[arg(long = "from-latest")]
    from_latest: bool,
    /// Print a line every --reporting-interval instead of the summary.
    #[arg(long = "show-detailed-stats")]
    show_detailed_stats: bool,
    /// With --show-detailed-stats: the interval of the lines, in milliseconds.
    #[arg(long = "reporting-interval", value_name = "MS", default_value_t = 5000)]
    reporting_interval: u64,
    /// Leave out the header line.
    #[arg(long = "hide-header")]
    hide_header: bool,
    /// How times are printed: a Java `SimpleDateFormat` pattern (in UTC).
    #[arg(long = "date-format", default_value = "yyyy-MM-dd HH:mm:ss:SSS")]
    date_format: String,
    /// A consumer properties file (`key=value` lines).
    #[arg(
        long = "consumer.config",
        value_name = "FILE",
        alias = "command-config"
    )]
    consumer_config: Option<PathBuf>,
    /// Print the client's statistics (librdkafka's) at the end.
    #[arg(long = "print-metrics")]
    print_metrics: bool,
    /// Kafka's deprecated thread counts: taken and ignored (one consumer reads).
    #[arg(long, hide = true)]
    threads: Option<u32>,
    #[arg(long = "num-fetch-threads", hide = true)]
    num_fetch_threads: Option<u32>,
}

/// The consumer's context: the time spent joining the group, librdkafka's statistics.
struct PerfConsumer {
    /// When the current (re)join began, in ms since the epoch.
    join_start: AtomicU64,
    /// The whole time spent joining, and since the last report (ms).
    join_total: AtomicU64,
    join_round: AtomicU64,
    metrics: Metrics,
}

impl ClientContext for PerfConsumer {
    fn stats_raw(&self, statistics: &[u8]) {
        self.metrics.keep(statistics);
    }
    fn stats(&self, _: Statistics) {}
}

impl ConsumerContext for PerfConsumer {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if matches!(rebalance, Rebalance::Revoke(_)) {
            self.join_start.store(epoch_ms(), Ordering::Relaxed);
        }
    }
    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if matches!(rebalance, Rebalance::Assign(_)) {
            let took = epoch_ms().saturating_sub(self.join_start.load(Ordering::Relaxed));
            self.join_total.fetch_add(took, Ordering::Relaxed);
            self.join_round.fetch_add(took, Ordering::Relaxed);
        }
    }
}

fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(millis)
        .unwrap_or(0)
}

/// Runs `agent consumer-perf-test`.
pub fn consume(args: ConsumerPerfArgs) -> anyhow::Result<()> {
    let messages = match u64::try_from(args.messages) {
        Ok(n) if n > 0 => n,
        _ => bail!("--messages {}: must be positive", args.messages),
    };
    if args.reporting_interval == 0 {
        bail!("--reporting-interval must be positive");
    }
    let date_format = DateFormat::parse(&args.date_format)?;
    let mut config = ClientConfig::new();
    let mut configured_group = None;
    if let Some(path) = &args.consumer_config {
        let (properties, _) = read_properties(path)?;
        let mut from_file = ClientConfig::new();
        properties.apply(&mut from_file);
        configured_group = from_file.get("group.id").map(str::to_owned);
    }
    // Kafka's settings, then the file's.
    config
        .set("bootstrap.servers", &args.bootstrap_server)
        .set("client.id", "perf-consumer-client")
        .set("isolation.level", "read_uncommitted")
        .set("enable.auto.commit", "true")
        .set("check.crcs", "false")
        .set("max.partition.fetch.bytes", args.fetch_size.to_string())
        .set(
            "socket.receive.buffer.bytes",
            args.socket_buffer_size.to_string(),
        )
        .set(
            "auto.offset.reset",
            if args.from_latest {
                "latest"
            } else {
                "earliest"
            },
        );
    if let Some(path) = &args.consumer_config {
        let (properties, _) = read_properties(path)?;
        properties.apply(&mut config);
    }
    let group = args.group.clone().or(configured_group).unwrap_or_else(|| {
        let mut random = Random::seeded();
        format!("perf-consumer-{}", random.below(100_000))
    });
    config.set("group.id", &group);
    if args.print_metrics && config.get("statistics.interval.ms").is_none() {
        config.set("statistics.interval.ms", STATISTICS_INTERVAL_MS);
    }
    let start_ms = epoch_ms();
    let consumer: BaseConsumer<PerfConsumer> = config
        .create_with_context(PerfConsumer {
            join_start: AtomicU64::new(start_ms),
            join_total: AtomicU64::new(0),
            join_round: AtomicU64::new(0),
            metrics: Metrics::default(),
        })
        .context("creating the consumer (check --consumer.config)")?;
    let mut out = std::io::stdout().lock();
    if !args.hide_header {
        let fields = "data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, \
                      rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec";
        if args.show_detailed_stats {
            writeln!(out, "time, threadId, {fields}")?;
        } else {
            writeln!(out, "start.time, end.time, {fields}")?;
        }
    }
    consumer
        .subscribe(&[&args.topic])
        .with_context(|| format!("subscribing to {}", args.topic))?;

    let timeout = Duration::from_millis(args.timeout);
    let interval = args.reporting_interval;
    let context = consumer.context();
    let (mut read, mut bytes) = (0u64, 0u64);
    let (mut last_read, mut last_bytes) = (0u64, 0u64);
    let mut last_consumed = Instant::now();
    let mut last_report_ms = start_ms;
    let mut reported_errors = 0;
    while read < messages && last_consumed.elapsed() <= timeout {
        match consumer.poll(Duration::from_millis(100)) {
            None => continue,
            Some(Err(error)) => {
                // As Kafka's consumer, errors of the cluster are waited out (up to --timeout).
                if reported_errors < 5 {
                    eprintln!("warning: {}: {error}", args.topic);
                    reported_errors += 1;
                }
                continue;
            }
            Some(Ok(message)) => {
                last_consumed = Instant::now();
                read += 1;
                bytes += message.key().map_or(0, <[u8]>::len) as u64;
                bytes += message.payload().map_or(0, <[u8]>::len) as u64;
            }
        }
        let now_ms = epoch_ms();
        if now_ms.saturating_sub(last_report_ms) >= interval {
            let join_round = context.join_round.swap(0, Ordering::Relaxed);
            if args.show_detailed_stats {
                let line = progress_line(
                    &date_format,
                    (bytes, last_bytes),
                    (read, last_read),
                    (last_report_ms, now_ms),
                    join_round,
                );
                writeln!(out, "{line}")?;
            }
            last_report_ms = now_ms;
            last_read = read;
            last_bytes = bytes;
        }
    }
    let end_ms = epoch_ms();
    if read < messages {
        writeln!(
            out,
            "WARNING: Exiting before consuming the expected number of messages: timeout ({} ms) \
             exceeded. You can use the --timeout option to increase the timeout.",
            args.timeout
        )?;
    }
    if !args.show_detailed_stats {
        let join_ms = context.join_total.load(Ordering::Relaxed);
        let elapsed_sec = end_ms.saturating_sub(start_ms) as f64 / 1000.0;
        let fetch_ms = end_ms as i64 - start_ms as i64 - join_ms as i64;
        let mb = bytes as f64 / (1024.0 * 1024.0);
        writeln!(
            out,
            "{}, {}, {:.4}, {}, {}, {}, {}, {}, {}, {}",
            date_format.format(start_ms),
            date_format.format(end_ms),
            mb,
            java_fixed(mb / elapsed_sec, 4),
            read,
            java_fixed(read as f64 / elapsed_sec, 4),
            join_ms,
            fetch_ms,
            java_fixed(mb / (fetch_ms as f64 / 1000.0), 4),
            java_fixed(read as f64 / (fetch_ms as f64 / 1000.0), 4),
        )?;
    }
    if args.print_metrics {
        let done = Instant::now();
        let statistics = context.metrics.after(done, Duration::from_secs(3), || {
            let _ = consumer.poll(Duration::from_millis(100));
        });
        print_metrics(&mut out, statistics)?;
    }
    Ok(())
}

/// A `--show-detailed-stats` line, as Kafka's: the time, thread 0, the MB read so far and
/// the interval's rate, the records so far and their rate, the time spent joining in the
/// interval, the rest of it (fetching), and the rates over that fetching time.
fn progress_line(
    date_format: &DateFormat,
    (bytes, last_bytes): (u64, u64),
    (read, last_read): (u64, u64),
    (start_ms, end_ms): (u64, u64),
    join_ms: u64,
) -> String {
    let elapsed_ms = end_ms.saturating_sub(start_ms) as f64;
    let total_mb = bytes as f64 / (1024.0 * 1024.0);
    let interval_mb = (bytes - last_bytes) as f64 / (1024.0 * 1024.0);
    let interval_read = (read - last_read) as f64;
    let fetch_ms = end_ms as i64 - start_ms as i64 - join_ms as i64;
    let (fetch_mb_sec, fetch_msg_sec) = if fetch_ms <= 0 {
        (0.0, 0.0)
    } else {
        (
            1000.0 * interval_mb / fetch_ms as f64,
            1000.0 * interval_read / fetch_ms as f64,
        )
    };
    format!(
        "{}, 0, {:.4}, {}, {}, {}, {}, {}, {:.4}, {:.4}",
        date_format.format(end_ms),
        total_mb,
        java_fixed(1000.0 * interval_mb / elapsed_ms, 4),
        read,
        java_fixed(1000.0 * interval_read / elapsed_ms, 4),
        join_ms,
        fetch_ms,
        fetch_mb_sec,
        fetch_msg_sec,
    )
}

/// A Java `SimpleDateFormat` pattern: letters `y M d H h k K m s S a E z Z X`, quoted text
/// (`'T'`, `''` for a quote) and other characters as they are. Times are printed in UTC.
#[derive(Debug, PartialEq)]
struct DateFormat(Vec<Piece>);

#[derive(Debug, PartialEq)]
enum Piece {
    Text(String),
    Field(char, usize),
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

impl DateFormat {
    fn parse(pattern: &str) -> anyhow::Result<Self> {
        let mut pieces = Vec::new();
        let chars: Vec<char> = pattern.chars().collect();
        let mut text = String::new();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if c == '\'' {
                if chars.get(i + 1) == Some(&'\'') {
                    text.push('\'');
                    i += 2;
                    continue;
                }
                let mut j = i + 1;
                loop {
                    match chars.get(j) {
                        None => bail!("--date-format `{pattern}`: an unterminated quote"),
                        Some('\'') if chars.get(j + 1) == Some(&'\'') => {
                            text.push('\'');
                            j += 2;
                        }
                        Some('\'') => break,
                        Some(&other) => {
                            text.push(other);
                            j += 1;
                        }
                    }
                }
                i = j + 1;
            } else if c.is_ascii_alphabetic() {
                if !"yMdHhkKmsSaEzZX".contains(c) {
                    bail!(
                        "--date-format `{pattern}`: unknown pattern letter `{c}` (known: y M d \
                         H h k K m s S a E z Z X)"
                    );
                }
                let mut n = 1;
                while chars.get(i + n) == Some(&c) {
                    n += 1;
                }
                if !text.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut text)));
                }
                pieces.push(Piece::Field(c, n));
                i += n;
            } else {
                text.push(c);
                i += 1;
            }
        }
        if !text.is_empty() {
            pieces.push(Piece::Text(text));
        }
        Ok(DateFormat(pieces))
    }

    /// `ms` since the epoch, in UTC.
    fn format(&self, ms: u64) -> String {
        let days = (ms / 86_400_000) as i64;
        let of_day = ms % 86_400_000;
        let (year, month, day) = civil_from_days(days);
        let hour = of_day / 3_600_000;
        let minute = of_day / 60_000 % 60;
        let second = of_day / 1000 % 60;
        let milli = of_day % 1000;
        // 1970-01-01 was a Thursday.
        let weekday = (days + 3).rem_euclid(7) as usize;
        let mut out = String::new();
        let number = |out: &mut String, v: i64, width: usize| {
            out.push_str(&format!("{v:0width$}"));
        };
        for piece in &self.0 {
            match *piece {
                Piece::Text(ref t) => out.push_str(t),
                Piece::Field(c, n) => match c {
                    'y' if n == 2 => number(&mut out, year.rem_euclid(100), 2),
                    'y' => number(&mut out, year, n),
                    'M' if n >= 4 => out.push_str(MONTHS[month as usize - 1]),
                    'M' if n == 3 => out.push_str(&MONTHS[month as usize - 1][..3]),
                    'M' => number(&mut out, month, n),
                    'd' => number(&mut out, day, n),
                    'H' => number(&mut out, hour as i64, n),
                    'k' => number(&mut out, if hour == 0 { 24 } else { hour as i64 }, n),
                    'K' => number(&mut out, (hour % 12) as i64, n),
                    'h' => number(
                        &mut out,
                        if hour.is_multiple_of(12) {
                            12
                        } else {
                            (hour % 12) as i64
                        },
                        n,
                    ),
                    'm' => number(&mut out, minute as i64, n),
                    's' => number(&mut out, second as i64, n),
                    'S' => number(&mut out, milli as i64, n),
                    'a' => out.push_str(if hour < 12 { "AM" } else { "PM" }),
                    'E' if n >= 4 => out.push_str(DAYS[weekday]),
                    'E' => out.push_str(&DAYS[weekday][..3]),
                    'z' => out.push_str("UTC"),
                    'Z' => out.push_str("+0000"),
                    _ => out.push('Z'),
                },
            }
        }
        out
    }
}

/// The year, month and day of a day count since 1970-01-01 (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn dates_print_as_simple_date_format_in_utc() {
        let default = DateFormat::parse("yyyy-MM-dd HH:mm:ss:SSS").unwrap();
        // 2021-04-11 21:33:28.273 UTC
        assert_eq!(default.format(1_618_176_808_273), "2021-04-11 21:33:28:273");
        assert_eq!(default.format(0), "1970-01-01 00:00:00:000");
        let other = DateFormat::parse("EEE, d MMM yy 'at' h:mm a ''Z''").unwrap();
        assert_eq!(
            other.format(1_618_176_808_273),
            "Sun, 11 Apr 21 at 9:33 PM '+0000'"
        );
        assert_eq!(
            DateFormat::parse("yyyy-MM-dd'T'HH:mm:ss.SSSX")
                .unwrap()
                .format(951_782_400_000),
            "2000-02-29T00:00:00.000Z"
        );
        let err = DateFormat::parse("yyyy-qq").unwrap_err().to_string();
        assert!(err.contains("unknown pattern letter `q`"), "{err}");
        assert!(DateFormat::parse("'open").is_err());
    }

    #[test]
    fn summary_lines_have_kafkas_number_formats() {
        let start = Instant::now();
        let mut stats = Stats::new(1000, start);
        for latency in 1..=1000 {
            stats.record(latency, 100, start);
        }
        let line = stats.total_line(start + Duration::from_millis(2000));
        assert_eq!(
            line,
            "1000 records sent, 500.000000 records/sec (0.05 MB/sec), 500.50 ms avg latency, \
             1000.00 ms max latency, 501 ms 50th, 951 ms 95th, 991 ms 99th, 1000 ms 99.9th."
        );
        let mut stats = Stats::new(10, start);
        stats.record(3, 1_048_576, start);
        stats.record(5, 1_048_576, start);
        assert_eq!(
            stats.window_line(start + Duration::from_millis(1000)),
            "2 records sent, 2.0 records/sec (2.00 MB/sec), 4.0 ms avg latency, 5.0 ms max \
             latency."
        );
        assert_eq!(java_fixed(1.0 / 0.0, 4), "Infinity");
        assert_eq!(java_fixed(f64::NAN, 4), "NaN");
    }

    #[test]
    fn the_throttler_waits_only_when_ahead_of_the_rate() {
        let start = Instant::now();
        let unthrottled = Throttler::new(-1.0, start);
        assert!(!unthrottled.should_throttle(1_000_000, start + Duration::from_millis(1)));
        let mut throttler = Throttler::new(1000.0, start);
        assert!(!throttler.should_throttle(5, start));
        assert!(throttler.should_throttle(20, start + Duration::from_millis(10)));
        assert!(!throttler.should_throttle(5, start + Duration::from_millis(10)));
        // 1 ms per record: the first call builds the deficit, the second sleeps it off.
        let mut slept = Duration::ZERO;
        throttler.throttle(|d| slept += d);
        assert_eq!(slept, Duration::ZERO);
        let began = Instant::now();
        throttler.throttle(std::thread::sleep);
        assert!(began.elapsed() >= Duration::from_millis(2));
    }

    #[test]
    fn payload_files_split_at_the_delimiter() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("payloads");
        std::fs::write(&file, "a\nbb\n\nccc\n\n").unwrap();
        let payloads = read_payloads(&file, "\\n").unwrap();
        assert_eq!(
            payloads,
            vec![b"a".to_vec(), b"bb".to_vec(), vec![], b"ccc".to_vec()]
        );
        std::fs::write(&file, "x|yy").unwrap();
        assert_eq!(read_payloads(&file, "|").unwrap().len(), 2);
        std::fs::write(&file, "\n\n").unwrap();
        let err = read_payloads(&file, "\\n").unwrap_err().to_string();
        assert!(err.contains("does not contain any payloads"), "{err}");
    }

    #[test]
    fn statistics_print_as_a_metrics_table() {
        let json = br#"{"client_id":"c1","txmsgs":20,"name":"x",
            "brokers":{"b:1/1":{"rtt":{"avg":120}}},
            "topics":{"t":{"batchsize":{"avg":5},"partitions":{"0":{"txmsgs":20}}}}}"#;
        let mut out = Vec::new();
        print_metrics(&mut out, Some(json.to_vec())).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("Metric Name"), "{text}");
        assert!(text.contains("rdkafka:txmsgs:{client-id=c1} "), "{text}");
        assert!(
            text.contains("rdkafka-broker:rtt.avg:{broker=b:1/1}"),
            "{text}"
        );
        assert!(
            text.contains("rdkafka-topic:batchsize.avg:{topic=t}"),
            "{text}"
        );
        assert!(
            text.contains("rdkafka-partition:txmsgs:{topic=t, partition=0} : 20.000"),
            "{text}"
        );
        assert!(print_metrics(&mut Vec::new(), None).is_err());
    }
}
