//! The benchmark's reader: reads a topic of numbered lines with librdkafka until it has seen
//! every one, as a downstream consumer would:
//!
//! ```text
//! cargo run --release -p ferry-broker --example read_topic -- \
//!     --bootstrap HOST:PORT --topic TOPIC --lines N [--exactly-once] [--seconds 600]
//! ```
//!
//! Each record's value starts with its line's index, 8 decimal digits (`scripts/bench` writes
//! the lines so). The reader waits for the topic to exist, is assigned every partition from the
//! beginning (no group: a join would wait for the broker's initial rebalance delay) with
//! `isolation.level=read_committed`, and stops when each index below `--lines` was read. With
//! `--exactly-once` a line read twice is an error. It prints one JSON line: the wall-clock
//! times (ns since the Unix epoch) of its first record and of the last line it needed, and
//! the records it read, so that a script on the same machine can time a pipeline from its
//! start.
//! Exit status 1 on any error (message on stderr), among them a line read twice with
//! `--exactly-once`, a value without an index, or lines still missing after `--seconds`.
//!
//! librdkafka's consumer in C does what a reader in Python would at a fraction of the CPU,
//! which on a small machine the pipeline being measured would otherwise share with it.

use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

type ReadError = Box<dyn std::error::Error + Send + Sync>;

/// What the command line asks for.
struct Options {
    bootstrap: String,
    topic: String,
    lines: usize,
    exactly_once: bool,
    seconds: u64,
}

fn main() {
    let result = parse_args(std::env::args().skip(1)).and_then(|options| read(&options));
    match result {
        Ok(report) => println!("{report}"),
        Err(e) => {
            eprintln!("read_topic: {e}");
            std::process::exit(1);
        }
    }
}

fn read(options: &Options) -> Result<String, ReadError> {
    let deadline = Instant::now() + Duration::from_secs(options.seconds);
    // librdkafka stops fetching a partition that has queued.min.messages (100,000 by default)
    // records queued and looks at it again only a second later: one 1 MB fetch of short lines
    // compressed with zstd holds 265,000 records, and that second would be in the figures.
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &options.bootstrap)
        .set("group.id", "ferry-bench")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .set("fetch.max.bytes", "52428800")
        .set("max.partition.fetch.bytes", "10485760")
        .set("queued.min.messages", "10000000")
        .set("queued.max.messages.kbytes", "2097151")
        .create()?;
    let partitions = loop {
        if Instant::now() > deadline {
            return Err(format!("topic {} never appeared", options.topic).into());
        }
        let found = consumer
            .fetch_metadata(Some(&options.topic), Duration::from_secs(1))
            .ok()
            .and_then(|metadata| {
                metadata
                    .topics()
                    .iter()
                    .find(|t| t.name() == options.topic && t.error().is_none())
                    .map(|t| t.partitions().iter().map(|p| p.id()).collect::<Vec<_>>())
            })
            .filter(|partitions| !partitions.is_empty());
        match found {
            Some(partitions) => break partitions,
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let mut assignment = TopicPartitionList::new();
    for partition in partitions {
        assignment.add_partition_offset(&options.topic, partition, Offset::Beginning)?;
    }
    consumer.assign(&assignment)?;

    let mut seen = vec![false; options.lines];
    let (mut distinct, mut records, mut first) = (0, 0u64, None);
    let mut last_error = None;
    while distinct < options.lines {
        if Instant::now() > deadline {
            let error = last_error.map_or(String::new(), |e| format!(" (last error: {e})"));
            return Err(format!(
                "read {distinct} of {} lines in {} s{error}",
                options.lines, options.seconds
            )
            .into());
        }
        // Errors here are librdkafka's events (a broker not listening yet, a connection
        // lost): it retries on its own, so they are kept for the message if lines are missing
        // at the deadline.
        let message = match consumer.poll(Duration::from_millis(200)) {
            None => continue,
            Some(Err(e)) => {
                last_error = Some(e);
                continue;
            }
            Some(Ok(message)) => message,
        };
        first.get_or_insert_with(unix_ns);
        records += 1;
        let value = message.payload().unwrap_or_default();
        let index = value
            .get(..8)
            .and_then(|digits| std::str::from_utf8(digits).ok())
            .and_then(|digits| digits.parse::<usize>().ok())
            .filter(|index| *index < options.lines)
            .ok_or_else(|| {
                format!(
                    "partition {} offset {}: the value does not start with a line index below {}: {:?}",
                    message.partition(),
                    message.offset(),
                    options.lines,
                    String::from_utf8_lossy(&value[..value.len().min(40)])
                )
            })?;
        if !seen[index] {
            seen[index] = true;
            distinct += 1;
        } else if options.exactly_once {
            return Err(format!(
                "line {index} was read twice (partition {} offset {})",
                message.partition(),
                message.offset()
            )
            .into());
        }
    }
    let done = unix_ns();
    Ok(format!(
        "{{\"first_unix_ns\":{},\"done_unix_ns\":{done},\"records\":{records}}}",
        first.unwrap_or(done)
    ))
}

/// The wall clock, as Python's `time.time_ns()` reads it.
fn unix_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Options, ReadError> {
    let (mut bootstrap, mut topic, mut lines) = (None, None, None);
    let (mut exactly_once, mut seconds) = (false, 600);
    while let Some(flag) = args.next() {
        if flag == "--exactly-once" {
            exactly_once = true;
            continue;
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || -> Result<u64, ReadError> {
            match value.parse::<u64>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(format!("{flag} {value}: expected a number above 0").into()),
            }
        };
        match flag.as_str() {
            "--bootstrap" => bootstrap = Some(value.clone()),
            "--topic" => topic = Some(value.clone()),
            "--lines" => match number()? {
                // A value's index has 8 digits.
                n @ 1..=100_000_000 => lines = Some(usize::try_from(n)?),
                _ => return Err(format!("--lines {value}: at most 100000000").into()),
            },
            "--seconds" => seconds = number()?,
            _ => return Err(format!("unknown option {flag}").into()),
        }
    }
    Ok(Options {
        bootstrap: bootstrap.ok_or("--bootstrap is required")?,
        topic: topic.ok_or("--topic is required")?,
        lines: lines.ok_or("--lines is required")?,
        exactly_once,
        seconds,
    })
}
