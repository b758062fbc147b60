//! `agent console-producer` and `agent console-consumer`: lines in, records out, as Kafka's
//! console tools do.

use std::io::{BufRead, Write};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use super::{ClusterArgs, DeliveryFailures, REQUEST_TIMEOUT, split_property};

/// Formatting properties shared by both tools (`--property key=value`).
#[derive(Debug, Default)]
struct LineFormat {
    /// `parse.key` / `print.key`.
    key: bool,
    /// `key.separator`, a tab by default.
    separator: String,
    /// `ignore.error`: a line without the key separator becomes a value without key.
    ignore_error: bool,
    /// `parse.headers`: each line starts with headers, then `headers.delimiter`.
    headers: bool,
    /// `headers.delimiter` (a tab), `headers.separator` (`,`), `headers.key.separator` (`:`).
    headers_delimiter: String,
    headers_separator: String,
    headers_key_separator: String,
}

/// `bytes` split at every `sep`.
fn split_all<'a>(bytes: &'a [u8], sep: &[u8]) -> Vec<&'a [u8]> {
    let mut parts = Vec::new();
    let mut rest = bytes;
    while let Some(i) = find(rest, sep) {
        parts.push(&rest[..i]);
        rest = &rest[i + sep.len()..];
    }
    parts.push(rest);
    parts
}

/// Where `needle` starts in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return None;
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

impl LineFormat {
    fn from_properties(properties: &[String], key_property: &str) -> anyhow::Result<Self> {
        let mut format = LineFormat {
            key: false,
            separator: "\t".into(),
            ignore_error: false,
            headers: false,
            headers_delimiter: "\t".into(),
            headers_separator: ",".into(),
            headers_key_separator: ":".into(),
        };
        for pair in properties {
            let (k, v) = split_property(pair)?;
            match k {
                _ if k == key_property => format.key = v.eq_ignore_ascii_case("true"),
                "key.separator" => format.separator = v.to_owned(),
                "ignore.error" => format.ignore_error = v.eq_ignore_ascii_case("true"),
                "parse.headers" if key_property == "parse.key" => {
                    format.headers = v.eq_ignore_ascii_case("true");
                }
                "headers.delimiter" => format.headers_delimiter = v.to_owned(),
                "headers.separator" => format.headers_separator = v.to_owned(),
                "headers.key.separator" => format.headers_key_separator = v.to_owned(),
                other => bail!(
                    "unknown --property `{other}` (known: {key_property}, key.separator, \
                     ignore.error, parse.headers, headers.delimiter, headers.separator, \
                     headers.key.separator)"
                ),
            }
        }
        Ok(format)
    }
}

/// What `agent console-consumer` prints of each record, as Kafka's `DefaultMessageFormatter`
/// (`--property print.timestamp=true` ...): timestamp, partition, offset, headers, key and
/// value, in that order, each but the value followed by `key.separator`.
#[derive(Debug)]
struct RecordFormat {
    timestamp: bool,
    partition: bool,
    offset: bool,
    headers: bool,
    key: bool,
    value: bool,
    separator: String,
    line_separator: String,
    headers_separator: String,
}

/// The formatters `--formatter` accepts: Kafka's default one, under its old and new names.
const DEFAULT_FORMATTERS: [&str; 2] = [
    "kafka.tools.DefaultMessageFormatter",
    "org.apache.kafka.tools.consumer.DefaultMessageFormatter",
];

impl RecordFormat {
    fn from_properties(properties: &[String]) -> anyhow::Result<Self> {
        let mut format = RecordFormat {
            timestamp: false,
            partition: false,
            offset: false,
            headers: false,
            key: false,
            value: true,
            separator: "\t".into(),
            line_separator: "\n".into(),
            headers_separator: ",".into(),
        };
        for pair in properties {
            let (k, v) = split_property(pair)?;
            let on = || v.trim().eq_ignore_ascii_case("true");
            match k {
                "print.timestamp" => format.timestamp = on(),
                "print.partition" => format.partition = on(),
                "print.offset" => format.offset = on(),
                "print.headers" => format.headers = on(),
                "print.key" => format.key = on(),
                "print.value" => format.value = on(),
                "key.separator" => format.separator = v.to_owned(),
                "line.separator" => format.line_separator = v.to_owned(),
                "headers.separator" => format.headers_separator = v.to_owned(),
                other => bail!(
                    "unknown --property `{other}` (known: print.timestamp, print.partition, \
                     print.offset, print.headers, print.key, print.value, key.separator, \
                     line.separator, headers.separator)"
                ),
            }
        }
        Ok(format)
    }

    fn write(
        &self,
        message: &rdkafka::message::BorrowedMessage<'_>,
        out: &mut impl Write,
    ) -> std::io::Result<()> {
        use rdkafka::message::{Headers as _, Timestamp};
        // As Kafka's formatter: each field is followed by `key.separator` when another one
        // follows it, by `line.separator` when it is the last (`print.value=false`).
        let shown = [
            self.timestamp,
            self.partition,
            self.offset,
            self.headers,
            self.key,
            self.value,
        ];
        let after = |field: usize, out: &mut dyn Write| -> std::io::Result<()> {
            if shown[field + 1..].contains(&true) {
                out.write_all(self.separator.as_bytes())
            } else {
                out.write_all(self.line_separator.as_bytes())
            }
        };
        if self.timestamp {
            match message.timestamp() {
                Timestamp::NotAvailable => out.write_all(b"NO_TIMESTAMP")?,
                Timestamp::CreateTime(t) => write!(out, "CreateTime:{t}")?,
                Timestamp::LogAppendTime(t) => write!(out, "LogAppendTime:{t}")?,
            }
            after(0, out)?;
        }
        if self.partition {
            write!(out, "Partition:{}", message.partition())?;
            after(1, out)?;
        }
        if self.offset {
            write!(out, "Offset:{}", message.offset())?;
            after(2, out)?;
        }
        if self.headers {
            match message.headers().filter(|h| h.count() > 0) {
                None => out.write_all(b"NO_HEADERS")?,
                Some(headers) => {
                    for (i, header) in headers.iter().enumerate() {
                        if i > 0 {
                            out.write_all(self.headers_separator.as_bytes())?;
                        }
                        out.write_all(header.key.as_bytes())?;
                        out.write_all(b":")?;
                        out.write_all(header.value.unwrap_or(b"null"))?;
                    }
                }
            }
            after(3, out)?;
        }
        if self.key {
            out.write_all(message.key().unwrap_or(b"null"))?;
            after(4, out)?;
        }
        if self.value {
            out.write_all(message.payload().unwrap_or(b"null"))?;
            out.write_all(self.line_separator.as_bytes())?;
        }
        Ok(())
    }
}

/// Flags of `agent console-producer`.
#[derive(Args, Debug)]
pub struct ProducerArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// The topic to write to.
    #[arg(long)]
    topic: String,
    /// `parse.key=true` splits each line at `key.separator` into key and value.
    #[arg(long = "property", value_name = "KEY=VALUE")]
    properties: Vec<String>,
    /// A librdkafka producer property `key=value` (e.g. `acks=all`); repeatable.
    #[arg(long = "producer-property", value_name = "KEY=VALUE")]
    producer_properties: Vec<String>,
    /// Compression: none, gzip, snappy, lz4 or zstd (`gzip` when given without a value, as
    /// Kafka). It wins over `compression.type` of the properties; without it, theirs is used,
    /// else none.
    #[arg(
        long = "compression-codec",
        value_name = "CODEC",
        num_args = 0..=1,
        default_missing_value = "gzip"
    )]
    compression_codec: Option<String>,
    /// The acknowledgement each request waits for (Kafka's `acks`): `all`, `-1`, `0` or `1`.
    #[arg(long = "request-required-acks", value_name = "ACKS")]
    request_required_acks: Option<String>,
    /// Send each record on its own and wait for its acknowledgement before the next line.
    #[arg(long)]
    sync: bool,
}

/// Runs `agent console-producer`: every line of standard input becomes one record.
pub fn produce(args: ProducerArgs) -> anyhow::Result<()> {
    let format = LineFormat::from_properties(&args.properties, "parse.key")?;
    let config = producer_config(&args)?;
    let producer: BaseProducer<DeliveryFailures> = config
        .create_with_context(DeliveryFailures::default())
        .context("creating the producer")?;
    // A bad line ends the input, but the lines before it are still delivered.
    let sent = send_lines(&producer, &args, &format);
    let flushed = producer
        .flush(REQUEST_TIMEOUT)
        .context("waiting for the last records to be acknowledged");
    sent?;
    flushed?;
    if let Some((failed, first)) = producer.context().summary() {
        bail!("{failed} records were not delivered; first error: {first}");
    }
    Ok(())
}

/// librdkafka's names of the compression setting: one setting under two names.
const COMPRESSION_KEYS: [&str; 2] = ["compression.codec", "compression.type"];

/// The producer's settings as Kafka's console producer merges them: --producer.config, then
/// --producer-property, then the flags given (--compression-codec, --request-required-acks),
/// which win. The compression is kept under one name, so the last one given decides.
fn producer_config(args: &ProducerArgs) -> anyhow::Result<rdkafka::config::ClientConfig> {
    let mut config = args.cluster.client_config(&[])?;
    let file_codecs: Vec<&str> = COMPRESSION_KEYS
        .iter()
        .filter_map(|k| config.get(k))
        .collect();
    if let [first, second] = file_codecs[..]
        && first != second
    {
        bail!(
            "--producer.config sets both compression.codec ({first}) and compression.type \
             ({second}): keep one"
        );
    }
    let set_compression = |config: &mut rdkafka::config::ClientConfig, codec: &str| {
        for key in COMPRESSION_KEYS {
            config.remove(key);
        }
        config.set("compression.codec", codec);
    };
    if let Some(codec) = file_codecs.first().map(|c| (*c).to_owned()) {
        set_compression(&mut config, &codec);
    }
    for pair in &args.producer_properties {
        let (k, v) = split_property(pair)?;
        if COMPRESSION_KEYS.contains(&k) {
            set_compression(&mut config, v);
        } else {
            config.set(k, v);
        }
    }
    if let Some(codec) = &args.compression_codec {
        set_compression(&mut config, codec);
    }
    if let Some(acks) = &args.request_required_acks {
        config.set("acks", acks);
    }
    Ok(config)
}

/// Sends every line of standard input; stops at the first bad one (unless `ignore.error`).
fn send_lines(
    producer: &BaseProducer<DeliveryFailures>,
    args: &ProducerArgs,
    format: &LineFormat,
) -> anyhow::Result<()> {
    let stdin = std::io::stdin().lock();
    for (n, line) in stdin.split(b'\n').enumerate() {
        let line = line.context("reading standard input")?;
        let line = line.strip_suffix(b"\r").unwrap_or(&line);
        let mut headers = rdkafka::message::OwnedHeaders::new();
        let line = if format.headers {
            match find(line, format.headers_delimiter.as_bytes()) {
                Some(at) => {
                    for pair in split_all(&line[..at], format.headers_separator.as_bytes()) {
                        if pair.is_empty() {
                            continue;
                        }
                        let ksep = format.headers_key_separator.as_bytes();
                        let Some(i) = find(pair, ksep) else {
                            bail!(
                                "No header key separator found in pair '{}' on line number {}",
                                String::from_utf8_lossy(pair),
                                n + 1
                            );
                        };
                        let key = String::from_utf8_lossy(&pair[..i]).into_owned();
                        headers = headers.insert(rdkafka::message::Header {
                            key: &key,
                            value: Some(&pair[i + ksep.len()..]),
                        });
                    }
                    &line[at + format.headers_delimiter.len()..]
                }
                None if format.ignore_error => line,
                None => bail!(
                    "No headers delimiter found on line number {}: '{}'",
                    n + 1,
                    String::from_utf8_lossy(line)
                ),
            }
        } else {
            line
        };
        let (key, value) = if format.key {
            let sep = format.separator.as_bytes();
            match line.windows(sep.len()).position(|w| w == sep) {
                Some(at) => (Some(&line[..at]), &line[at + sep.len()..]),
                // As Kafka: the whole line becomes the value.
                None if format.ignore_error => (None, line),
                None => bail!(
                    "No key separator found on line number {}: '{}'",
                    n + 1,
                    String::from_utf8_lossy(line)
                ),
            }
        } else {
            (None, line)
        };
        let mut record = BaseRecord::<[u8], [u8]>::to(&args.topic).payload(value);
        if format.headers {
            record = record.headers(headers);
        }
        if let Some(key) = key {
            record = record.key(key);
        }
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    producer.poll(Duration::from_millis(50));
                }
                Err((error, _)) => bail!("line {}: {error}", n + 1),
            }
        }
        producer.poll(Duration::ZERO);
        if args.sync {
            producer
                .flush(REQUEST_TIMEOUT)
                .with_context(|| format!("line {}: waiting for its acknowledgement", n + 1))?;
        }
    }
    Ok(())
}

/// Flags of `agent console-consumer`.
#[derive(Args, Debug)]
pub struct ConsumerArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// The topic to read.
    #[arg(long, required_unless_present = "include", conflicts_with = "include")]
    topic: Option<String>,
    /// Read every topic whose whole name matches this regular expression (as Kafka's
    /// `--include`), also those created later; as a member of `--group`, or of a group
    /// `console-consumer-<pid>` of its own without it.
    #[arg(long, value_name = "REGEX", conflicts_with = "partition")]
    include: Option<String>,
    /// Start at the earliest record rather than the end (in a group: where the group has no
    /// committed offset); refused next to --offset or another `auto.offset.reset`.
    #[arg(long = "from-beginning")]
    from_beginning: bool,
    /// Exit after this many records.
    #[arg(long = "max-messages")]
    max_messages: Option<u64>,
    /// Consume as a member of this consumer group, committing offsets as it goes (without
    /// it, every partition is read directly and nothing is committed). `group.id` of
    /// --consumer.config or --consumer-property is taken the same way; given in several
    /// places, it must be the same.
    #[arg(long)]
    group: Option<String>,
    /// Read only this partition.
    #[arg(long)]
    partition: Option<i32>,
    /// With --partition (and without --from-beginning): `earliest`, `latest` or an offset.
    #[arg(long)]
    offset: Option<String>,
    /// Exit when no record arrived for this many milliseconds.
    #[arg(long = "timeout-ms")]
    timeout_ms: Option<u64>,
    /// What to print besides the value, as Kafka's DefaultMessageFormatter: `print.timestamp`,
    /// `print.partition`, `print.offset`, `print.headers`, `print.key`, `print.value` (each
    /// `true`/`false`), `key.separator` (a tab), `line.separator`, `headers.separator` (`,`).
    #[arg(long = "property", value_name = "KEY=VALUE")]
    properties: Vec<String>,
    /// A librdkafka consumer property `key=value` (e.g. `isolation.level=read_uncommitted`).
    #[arg(long = "consumer-property", value_name = "KEY=VALUE")]
    consumer_properties: Vec<String>,
    /// `read_committed` or `read_uncommitted`; without it the properties' `isolation.level`,
    /// else `read_uncommitted`, as Kafka's console consumer.
    #[arg(long = "isolation-level", value_parser = ["read_committed", "read_uncommitted"])]
    isolation_level: Option<String>,
    /// The message formatter: only Kafka's default one is known
    /// (`kafka.tools.DefaultMessageFormatter` or
    /// `org.apache.kafka.tools.consumer.DefaultMessageFormatter`).
    #[arg(long)]
    formatter: Option<String>,
}

impl ConsumerArgs {
    /// The topic read, or the `--include` pattern: what messages name.
    fn label(&self) -> &str {
        self.topic
            .as_deref()
            .or(self.include.as_deref())
            .unwrap_or_default()
    }
}

/// Where a consumer without a group starts: `--offset`, else `--from-beginning`, else the
/// end; for the partitions of a whole topic without `--partition`, the reset policy
/// (`auto.offset.reset`) decides, as it does for Kafka's consumer of a fresh group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Start {
    Earliest,
    Latest,
    At(i64),
}

/// `--offset` as Kafka reads it: `earliest`, `latest` (any case) or a non-negative number.
fn parse_offset(text: &str) -> anyhow::Result<Start> {
    match text.to_ascii_lowercase().as_str() {
        "earliest" => Ok(Start::Earliest),
        "latest" => Ok(Start::Latest),
        _ => match text.parse::<i64>() {
            Ok(n) if n >= 0 => Ok(Start::At(n)),
            _ => bail!(
                "The provided offset value '{text}' is incorrect. Valid values are \
                 'earliest', 'latest', or a non-negative long."
            ),
        },
    }
}

/// The consumer settings of `--consumer.config` then `--consumer-property`, as Kafka merges
/// them (a property given on the command line wins over the file's).
fn consumer_settings(args: &ConsumerArgs) -> anyhow::Result<rdkafka::config::ClientConfig> {
    let mut config = args.cluster.client_config(&[])?;
    for pair in &args.consumer_properties {
        let (k, v) = split_property(pair)?;
        config.set(k, v);
    }
    Ok(config)
}

/// Checks the flags as Kafka's console consumer does, before connecting: the group given in
/// one place or several alike, no group with `--partition`, `--offset` only with
/// `--partition` and not with `--from-beginning`, and an `auto.offset.reset` that agrees with
/// `--from-beginning`. Gives the group (none: partitions are read directly), where to start
/// and the reset policy.
fn check_consumer_flags(
    args: &ConsumerArgs,
    config: &rdkafka::config::ClientConfig,
    file_group: Option<&str>,
) -> anyhow::Result<(Option<String>, Start, &'static str)> {
    if args.partition.is_some() {
        if args.topic.is_none() {
            bail!("The topic is required when partition is specified.");
        }
        if args.from_beginning && args.offset.is_some() {
            bail!("Options from-beginning and offset cannot be specified together.");
        }
    } else if args.offset.is_some() {
        bail!("The partition is required when offset is specified.");
    }
    // The group: --group, `group.id` of --consumer.config, `group.id` of --consumer-property.
    let property_group = args
        .consumer_properties
        .iter()
        .filter_map(|pair| split_property(pair).ok())
        .filter(|(k, _)| *k == "group.id")
        .map(|(_, v)| v)
        .next_back();
    let mut groups: Vec<&str> = Vec::new();
    for group in [args.group.as_deref(), file_group, property_group]
        .into_iter()
        .flatten()
    {
        if !groups.contains(&group) {
            groups.push(group);
        }
    }
    if groups.len() > 1 {
        let quoted: Vec<String> = groups.iter().map(|g| format!("'{g}'")).collect();
        bail!(
            "The group ids provided in different places (directly using '--group', via \
             '--consumer-property', or via '--consumer.config') do not match. Detected group \
             ids: {}",
            quoted.join(", ")
        );
    }
    let group = groups.first().map(|g| (*g).to_owned());
    if group.is_some() && args.partition.is_some() {
        bail!("Options group and partition cannot be specified together.");
    }
    // auto.offset.reset: the user's, unless it contradicts --from-beginning.
    let reset = match config.get("auto.offset.reset") {
        Some(value) => {
            let policy = match value.trim().to_ascii_lowercase().as_str() {
                "earliest" | "smallest" | "beginning" => "earliest",
                "latest" | "largest" | "end" => "latest",
                "none" | "error" => "error",
                other => bail!("auto.offset.reset `{other}`: expected earliest, latest or none"),
            };
            if args.from_beginning && policy != "earliest" {
                bail!(
                    "Can't simultaneously specify --from-beginning and \
                     'auto.offset.reset={value}', please remove one option"
                );
            }
            policy
        }
        None if args.from_beginning => "earliest",
        None => "latest",
    };
    let start = match (&args.offset, args.from_beginning) {
        (Some(offset), _) => parse_offset(offset)?,
        (None, true) => Start::Earliest,
        (None, false) => Start::Latest,
    };
    Ok((group, start, reset))
}

/// Runs `agent console-consumer`: prints each record's value on its own line.
pub fn consume(mut args: ConsumerArgs) -> anyhow::Result<()> {
    if let Some(formatter) = &args.formatter
        && !DEFAULT_FORMATTERS.contains(&formatter.as_str())
    {
        bail!(
            "--formatter {formatter}: unknown; only {} (or {}) is known",
            DEFAULT_FORMATTERS[0],
            DEFAULT_FORMATTERS[1]
        );
    }
    let format = RecordFormat::from_properties(&args.properties)?;
    let file_group = args
        .cluster
        .client_config(&[])?
        .get("group.id")
        .map(str::to_owned);
    let mut config = consumer_settings(&args)?;
    let (group, start, reset) = check_consumer_flags(&args, &config, file_group.as_deref())?;
    // Auto-commit is the consumer's default in a group given by the user, and off in the
    // group the tool makes up; `enable.auto.commit` given by the user decides either way (with
    // `false`, nothing is ever committed), as for Kafka's console consumer.
    let commits = match config.get("enable.auto.commit") {
        Some(v) => v.trim().eq_ignore_ascii_case("true"),
        None => group.is_some(),
    };
    args.group = group;
    if args.include.is_some() && args.group.is_none() {
        // A pattern subscription needs a group, as in Kafka (which picks a random one).
        args.group = Some(format!("console-consumer-{}", std::process::id()));
    }
    // As Kafka's console consumer: --isolation-level wins, then the properties' own
    // `isolation.level`, then read_uncommitted.
    match &args.isolation_level {
        Some(level) => {
            config.set("isolation.level", level);
        }
        None if config.get("isolation.level").is_none() => {
            config.set("isolation.level", "read_uncommitted");
        }
        None => {}
    }
    config.set("auto.offset.reset", reset);
    if let Some(group) = &args.group {
        // As Kafka's console consumer: a new group starts where the reset policy says (the
        // end, or the beginning with --from-beginning); offsets are committed as records are
        // printed.
        config
            .set("group.id", group)
            .set("enable.auto.commit", if commits { "true" } else { "false" })
            // Only offsets of records already printed are committed.
            .set("enable.auto.offset.store", "false");
    } else {
        // Partitions are assigned, never committed: the group id is librdkafka's need only.
        config
            .set("group.id", "agent-console-consumer")
            .set("enable.auto.commit", "false");
    }
    let consumer: BaseConsumer = config.create().context("creating the consumer")?;
    if args.group.is_some() {
        let subscription = match (&args.include, &args.topic) {
            // librdkafka takes a pattern as a topic starting with `^`.
            (Some(include), _) => {
                regex::Regex::new(include).with_context(|| {
                    format!("--include `{include}` is not a regular expression")
                })?;
                format!("^({include})$")
            }
            (None, Some(topic)) => topic.clone(),
            (None, None) => bail!("--topic or --include is required"),
        };
        consumer
            .subscribe(&[&subscription])
            .context("joining the group")?;
        return print_records(&consumer, &args, &format, commits);
    }
    let start = match (args.partition, start) {
        (Some(_), Start::At(n)) => Offset::Offset(n),
        (Some(_), Start::Earliest) => Offset::Beginning,
        (Some(_), Start::Latest) => Offset::End,
        // Every partition of the topic, as Kafka's consumer of a fresh group: where the reset
        // policy says.
        (None, _) => match reset {
            "earliest" => Offset::Beginning,
            "latest" => Offset::End,
            _ => bail!(
                "auto.offset.reset=none: without a group there is no committed offset to start \
                 from; give --group (or group.id), --from-beginning, or --partition with --offset"
            ),
        },
    };
    let partitions: Vec<i32> = match args.partition {
        Some(p) => vec![p],
        None => match wait_for_partitions(&consumer, &args)? {
            Some(partitions) => partitions,
            // --timeout-ms passed before the topic appeared.
            None => {
                eprintln!("Processed a total of 0 messages");
                return Ok(());
            }
        },
    };
    let mut assignment = TopicPartitionList::new();
    for p in partitions {
        assignment.add_partition_offset(args.label(), p, start)?;
    }
    consumer
        .assign(&assignment)
        .context("assigning partitions")?;
    print_records(&consumer, &args, &format, false)
}

/// The partitions of `--topic`, waiting (as Kafka's console consumer does) for a topic that
/// does not exist yet; `None` when `--timeout-ms` passes first.
fn wait_for_partitions(
    consumer: &BaseConsumer,
    args: &ConsumerArgs,
) -> anyhow::Result<Option<Vec<i32>>> {
    let started = Instant::now();
    let limit = args.timeout_ms.map(Duration::from_millis);
    loop {
        let metadata = consumer
            .fetch_metadata(Some(args.label()), REQUEST_TIMEOUT)
            .context("fetching metadata")?;
        if let Some(topic) = metadata.topics().iter().find(|t| t.name() == args.label()) {
            match topic.error().map(RDKafkaErrorCode::from) {
                None if !topic.partitions().is_empty() => {
                    return Ok(Some(topic.partitions().iter().map(|p| p.id()).collect()));
                }
                None | Some(RDKafkaErrorCode::UnknownTopicOrPartition) => {}
                Some(error) => bail!("topic {}: {error}", args.label()),
            }
        }
        if limit.is_some_and(|limit| started.elapsed() >= limit) {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A flag set by the first SIGINT or SIGTERM: the consumer then stops as after
/// `--max-messages` (commits, leaves its group, prints its count) rather than dying.
fn stop_on_signals() -> anyhow::Result<std::sync::Arc<std::sync::atomic::AtomicBool>> {
    use tokio::signal::unix::{SignalKind, signal};
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let rt = super::runtime()?;
    // Registered here, before the first record is read.
    let (mut interrupt, mut terminate) = rt.block_on(async {
        Ok::<_, std::io::Error>((
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
        ))
    })?;
    let flag = std::sync::Arc::clone(&stop);
    std::thread::spawn(move || {
        rt.block_on(async {
            tokio::select! {
                _ = interrupt.recv() => {},
                _ = terminate.recv() => {},
            }
        });
        flag.store(true, Ordering::Relaxed);
    });
    Ok(stop)
}

/// Stores the consumer's position (the offset after the last record printed, or after the
/// control records that follow it) of each assigned partition, to be committed.
/// True when one was stored.
fn store_positions(consumer: &BaseConsumer) -> bool {
    let Ok(positions) = consumer.position() else {
        return false;
    };
    let mut known = rdkafka::TopicPartitionList::new();
    for e in positions.elements() {
        if let rdkafka::Offset::Offset(n) = e.offset()
            && n >= 0
        {
            let _ =
                known.add_partition_offset(e.topic(), e.partition(), rdkafka::Offset::Offset(n));
        }
    }
    // A partition revoked meanwhile is refused; its printed records were stored already.
    known.count() > 0 && consumer.store_offsets(&known).is_ok()
}

/// Prints records until `--max-messages`, `--timeout-ms` or SIGINT/SIGTERM; with a group,
/// commits at the end.
fn print_records(
    consumer: &BaseConsumer,
    args: &ConsumerArgs,
    format: &RecordFormat,
    commits: bool,
) -> anyhow::Result<()> {
    let stop = stop_on_signals()?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut count = 0u64;
    let idle_limit = args.timeout_ms.map(Duration::from_millis);
    let mut last = Instant::now();
    while args.max_messages.is_none_or(|max| count < max) && !stop.load(Ordering::Relaxed) {
        match consumer.poll(Duration::from_millis(100)) {
            None => {
                out.flush()?;
                if idle_limit.is_some_and(|limit| last.elapsed() >= limit) {
                    break;
                }
            }
            // A subscribed topic that does not exist yet: wait for it, as Kafka's consumer.
            Some(Err(KafkaError::MessageConsumption(
                RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic,
            ))) => {
                out.flush()?;
                if idle_limit.is_some_and(|limit| last.elapsed() >= limit) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Some(Err(error)) => bail!("consuming {}: {error}", args.label()),
            Some(Ok(message)) => {
                format.write(&message, &mut out)?;
                if commits {
                    // Out before its offset is stored for the next auto-commit: a kill never
                    // leaves a committed record unprinted (one write per record, only when
                    // committing).
                    out.flush()?;
                    consumer
                        .store_offset_from_message(&message)
                        .context("storing the offset of a printed record")?;
                }
                count += 1;
                last = Instant::now();
            }
        }
    }
    out.flush()?;
    if commits {
        // Kafka's consumer commits its position, which moves past transaction markers (that
        // are never printed), so a fully read transactional partition has lag 0; librdkafka's
        // position does the same, while a stored record offset would stop before the marker.
        if store_positions(consumer) || count > 0 {
            match consumer.commit_consumer_state(rdkafka::consumer::CommitMode::Sync) {
                // Every printed record's offset was committed already (auto-commit).
                Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
                Err(e) => return Err(e).context("committing the group's offsets"),
            }
        }
    }
    eprintln!("Processed a total of {count} messages");
    Ok(())
}
