//! Throughput of the durable `file` channel: one producer putting batches and one consumer
//! taking and committing them, concurrently, with durable (fsynced) commits.
//!
//! ```sh
//! cargo run --release -p ferry-channels --example file_channel_bench -- \
//!     [DIR] [--size BYTES --batch EVENTS] [--events N]
//! ```
//!
//! DIR (default: a temporary directory under the current one) should be on the disk to
//! measure. Without `--size`/`--batch` it runs four cases (100 B and 1000 B events, batches of
//! 100 and 1000); with both, only that case. Each case moves 512 MiB of event bodies, or
//! `--events N` events. Prints a Markdown table (event size, batch size, events/s, MB/s),
//! then one JSON line per case for scripts (`scripts/bench` reads them).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_channels::{FileChannel, FileChannelConfig};
use ferry_core::config::ByteSize;
use ferry_core::state::Durability;
use ferry_core::{Channel, Event, PutBatch};

type BenchError = Box<dyn std::error::Error>;

const BYTES_PER_CASE: usize = 512 << 20;
const CASES: [(usize, usize); 4] = [(100, 100), (100, 1000), (1000, 100), (1000, 1000)];

/// What the command line asks for.
struct Options {
    dir: String,
    /// (event size, batch size) pairs to run.
    cases: Vec<(usize, usize)>,
    /// Events per case; default: `BYTES_PER_CASE` of bodies.
    events: Option<usize>,
}

/// One case's result.
struct Measured {
    size: usize,
    batch: usize,
    events: usize,
    seconds: f64,
}

impl Measured {
    fn events_per_s(&self) -> f64 {
        self.events as f64 / self.seconds
    }

    fn mb_per_s(&self) -> f64 {
        (self.events * self.size) as f64 / self.seconds / 1e6
    }
}

#[tokio::main]
async fn main() -> Result<(), BenchError> {
    let options = parse_args(std::env::args().skip(1))?;
    println!("| event size | batch | events/s | MB/s |");
    println!("|---:|---:|---:|---:|");
    let mut results = Vec::new();
    for &(size, batch) in &options.cases {
        let dir = tempfile::tempdir_in(&options.dir)?;
        // Whole batches only: the consumer waits for exactly what the producer puts.
        let events = options.events.unwrap_or(BYTES_PER_CASE / size);
        let batches = events.div_ceil(batch).max(1);
        let measured = run(dir.path(), size, batch, batches).await?;
        println!(
            "| {size} B | {batch} | {:.0} | {:.1} |",
            measured.events_per_s(),
            measured.mb_per_s()
        );
        results.push(measured);
    }
    for m in &results {
        println!(
            "{{\"bench\":\"file_channel\",\"durability\":\"full\",\"size\":{},\"batch\":{},\
             \"events\":{},\"seconds\":{:.6},\"events_per_s\":{:.1},\"mb_per_s\":{:.3}}}",
            m.size,
            m.batch,
            m.events,
            m.seconds,
            m.events_per_s(),
            m.mb_per_s()
        );
    }
    Ok(())
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Options, BenchError> {
    let mut dir = None;
    let mut size = None;
    let mut batch = None;
    let mut events = None;
    while let Some(arg) = args.next() {
        let mut value = |name: &str| -> Result<usize, BenchError> {
            let value = args.next().ok_or_else(|| format!("{name} needs a value"))?;
            value
                .parse()
                .map_err(|e| format!("{name} {value}: {e}").into())
        };
        match arg.as_str() {
            "--size" => size = Some(value("--size")?),
            "--batch" => batch = Some(value("--batch")?),
            "--events" => events = Some(value("--events")?),
            flag if flag.starts_with("--") => return Err(format!("unknown option {flag}").into()),
            _ if dir.is_none() => dir = Some(arg),
            _ => return Err(format!("unexpected argument {arg}").into()),
        }
    }
    let cases = match (size, batch) {
        (None, None) => CASES.to_vec(),
        (Some(size), Some(batch)) if size > 0 && batch > 0 => vec![(size, batch)],
        _ => return Err("--size and --batch go together, both above 0".into()),
    };
    Ok(Options {
        dir: dir.unwrap_or_else(|| ".".into()),
        cases,
        events,
    })
}

async fn run(
    dir: &std::path::Path,
    size: usize,
    batch: usize,
    total_batches: usize,
) -> Result<Measured, BenchError> {
    let options = FileChannelConfig {
        capacity: 100_000,
        transaction_capacity: batch,
        durability: Durability::Full,
        data_dir: None,
        minimum_free_space: ByteSize(0),
        max_file_size: ByteSize(64 << 20),
    };
    let channel = Arc::new(FileChannel::new("bench", &options, dir.to_owned()));
    channel.start().await?;
    let template: Vec<Event> = (0..batch)
        .map(|_| Event::from_body(vec![b'x'; size]))
        .collect();
    let started = Instant::now();
    let producer = {
        let channel = Arc::clone(&channel);
        tokio::spawn(async move {
            for _ in 0..total_batches {
                channel
                    .put(PutBatch {
                        source: "bench".into(),
                        events: template.clone(),
                        checkpoint: None,
                        ack: None,
                        joint: None,
                    })
                    .await?;
            }
            Ok::<_, ferry_core::ChannelError>(())
        })
    };
    let mut taken = 0;
    while taken < total_batches * batch {
        let take = channel.take(batch, Duration::from_secs(1)).await?;
        taken += take.events().len();
        take.commit().await?;
    }
    producer.await??;
    Ok(Measured {
        size,
        batch,
        events: total_batches * batch,
        seconds: started.elapsed().as_secs_f64(),
    })
}
