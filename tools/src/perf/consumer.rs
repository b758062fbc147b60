//! `agent consumer-perf-test`, as Kafka's `kafka-consumer-perf-test.sh`: its flags, the
//! records read in a group, the summary or `--show-detailed-stats` lines, and the times printed
//! in a Java `SimpleDateFormat` pattern.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::Args;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::message::Message;
use rdkafka::{ClientContext, Statistics};

use super::{
    Metrics, Random, STATISTICS_INTERVAL_MS, java_fixed, millis, print_metrics, read_properties,
};

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
    /// The most bytes fetched of a partition at once (`max.partition.fetch.bytes`; default
    /// 1048576). Given, it wins over --consumer.config.
    #[arg(long = "fetch-size", value_name = "BYTES")]
    fetch_size: Option<u64>,
    /// The socket receive buffer (`socket.receive.buffer.bytes`; default 2097152). Given, it
    /// wins over --consumer.config.
    #[arg(long = "socket-buffer-size", value_name = "BYTES")]
    socket_buffer_size: Option<u64>,
    /// Start a new group at the end of the topic, not at its beginning (`auto.offset.reset`
    /// latest, winning over --consumer.config; without it, the file's or earliest).
    #[arg(long = "from-latest")]
    from_latest: bool,
    /// Print a line every --reporting-interval instead of the summary.
    #[arg(long = "show-detailed-stats")]
    show_detailed_stats: bool,
    /// With --show-detailed-stats: the interval of the lines, in milliseconds.
    /// (Default 5000; refused without --show-detailed-stats.)
    #[arg(long = "reporting-interval", value_name = "MS")]
    reporting_interval: Option<u64>,
    /// Leave out the header line.
    #[arg(long = "hide-header")]
    hide_header: bool,
    /// How times are printed: a Java `SimpleDateFormat` pattern (in UTC).
    #[arg(long = "date-format", default_value = "yyyy-MM-dd HH:mm:ss:SSS")]
    date_format: String,
    /// A consumer properties file (`key=value` lines): after the tool's defaults, before the
    /// flags given, which win (its `group.id` is taken when --group is not given).
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
    if args.reporting_interval.is_some() && !args.show_detailed_stats {
        bail!("--reporting-interval is the interval of --show-detailed-stats' lines: give both");
    }
    let reporting_interval = args.reporting_interval.unwrap_or(5000);
    if reporting_interval == 0 {
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
        .set("max.partition.fetch.bytes", (1024 * 1024).to_string())
        .set("socket.receive.buffer.bytes", (2 * 1024 * 1024).to_string())
        .set("auto.offset.reset", "earliest");
    if let Some(path) = &args.consumer_config {
        let (properties, _) = read_properties(path)?;
        properties.apply(&mut config);
    }
    // The flags given win over the file, as in Kafka.
    if let Some(bytes) = args.fetch_size {
        config.set("max.partition.fetch.bytes", bytes.to_string());
    }
    if let Some(bytes) = args.socket_buffer_size {
        config.set("socket.receive.buffer.bytes", bytes.to_string());
    }
    if args.from_latest {
        config.set("auto.offset.reset", "latest");
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
    let interval = reporting_interval;
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
}
