//! Throughput of the durable `file` channel: one producer putting batches and one consumer
//! taking and committing them, concurrently, with durable (fsynced) commits.
//!
//! ```sh
//! cargo run --release -p ferry-channels --example file_channel_bench -- [DIR]
//! ```
//!
//! DIR (default: a temporary directory under the current one) should be on the disk to
//! measure. Prints one line per case: event size, batch size, events/s and MB/s.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_channels::{FileChannel, FileChannelConfig};
use ferry_core::config::ByteSize;
use ferry_core::state::Durability;
use ferry_core::{Channel, Event, PutBatch};

const BYTES_PER_CASE: usize = 512 << 20;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let base = std::env::args().nth(1).unwrap_or_else(|| ".".into());
    println!("| event size | batch | events/s | MB/s |");
    println!("|---:|---:|---:|---:|");
    for (size, batch) in [(100, 100), (100, 1000), (1000, 100), (1000, 1000)] {
        let dir = tempfile::tempdir_in(&base)?;
        let (events_per_s, mb_per_s) = run(dir.path(), size, batch).await?;
        println!("| {size} B | {batch} | {events_per_s:.0} | {mb_per_s:.1} |");
    }
    Ok(())
}

async fn run(
    dir: &std::path::Path,
    size: usize,
    batch: usize,
) -> Result<(f64, f64), Box<dyn std::error::Error>> {
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
    let total_batches = BYTES_PER_CASE / (size * batch);
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
    let seconds = started.elapsed().as_secs_f64();
    let events = (total_batches * batch) as f64;
    Ok((events / seconds, events * size as f64 / seconds / 1e6))
}
