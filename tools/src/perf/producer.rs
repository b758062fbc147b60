//! `agent producer-perf-test`, as Kafka's `kafka-producer-perf-test.sh`: its flags, the
//! records sent at the asked rate (in transactions if asked), and the latency and throughput
//! lines Kafka's tool prints.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::util::Timeout;
use rdkafka::{ClientContext, Statistics};

use super::super::REQUEST_TIMEOUT;
use super::{
    Metrics, Random, STATISTICS_INTERVAL_MS, flag_properties, java_fixed, millis, print_metrics,
    read_properties,
};

/// Kafka's transactional id when transactions are asked for without one.
const DEFAULT_TRANSACTIONAL_ID: &str = "performance-producer-default-transactional-id";
/// Kafka's commit interval when a transactional id is given without `--transaction-duration-ms`.
const DEFAULT_TRANSACTION_DURATION_MS: u64 = 3000;
/// The interval of the producer's progress lines, as Kafka's.
const PRODUCER_REPORTING_INTERVAL: Duration = Duration::from_millis(5000);

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

/// The producer's context: the statistics of delivered records, the failures, librdkafka's
/// statistics.
struct PerfProducer {
    stats: Mutex<Stats>,
    failures: super::super::DeliveryFailures,
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

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
}
