//! `agent dead-letters`: what a sink's `dead_letter` channel holds, and putting it back.
//!
//! - `list` prints the events of a file channel (any file channel, though it is meant for
//!   dead-letter ones): sequence number, when and by which sink the event was dead-lettered,
//!   the reason, and the first bytes of the body.
//! - `replay` moves the events of a range of sequence numbers into another file channel (the
//!   sink's own, typically, once the destination accepts them), without the
//!   `ferry.dead_letter.*` headers. The take from the dead-letter channel and the put into the
//!   other commit in one transaction when both live in one state store, so that an event is in
//!   one channel or the other, once, whatever interrupts the tool.
//!
//! Both read the pipeline file for the channels and the `data_dir`, and take the data
//! directory's lock: with an agent running on it they refuse, naming the agent.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use ferry_channels::FileChannel;
use ferry_core::{Channel, Event, Registry};

use crate::dead_letter::{CHANNEL_HEADER, REASON_HEADER, SINK_HEADER, TIME_HEADER};
use crate::lock::DataDirLock;

/// `agent dead-letters`.
#[derive(Args, Debug)]
pub struct DeadLettersArgs {
    #[command(subcommand)]
    command: DeadLettersCommand,
}

#[derive(Subcommand, Debug)]
enum DeadLettersCommand {
    /// Lists the events of a file channel: sequence number, time, sink, reason, body.
    List {
        #[command(flatten)]
        channel: ChannelArgs,
        /// First sequence number to list.
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Most events listed.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Bytes of each body shown.
        #[arg(long, default_value_t = 64)]
        body_bytes: usize,
    },
    /// Moves the events with sequence numbers `--from` to `--to` (inclusive) into another
    /// file channel, without their dead-letter headers. The agent must be stopped.
    Replay {
        #[command(flatten)]
        channel: ChannelArgs,
        /// First sequence number to replay.
        #[arg(long)]
        from: u64,
        /// Last sequence number to replay (inclusive); default: the last one.
        #[arg(long)]
        to: Option<u64>,
        /// The file channel to put them into, e.g. the channel of the sink that refused them.
        #[arg(long, value_name = "CHANNEL")]
        into: String,
    },
}

/// The pipeline file and the channel of it.
#[derive(Args, Debug)]
struct ChannelArgs {
    /// The pipeline file (YAML) whose `data_dir` and channels to use.
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// The file channel holding the dead letters.
    #[arg(long)]
    channel: String,
}

/// Runs `agent dead-letters`, with the component types of `registry`.
pub fn run(args: DeadLettersArgs, registry: &Registry) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
    runtime.block_on(async {
        match args.command {
            DeadLettersCommand::List {
                channel,
                from,
                limit,
                body_bytes,
            } => {
                let channels = open(&channel.config, registry)?;
                let dlq = channels.get(&channel.channel, &channel.config)?;
                dlq.start().await?;
                list(&dlq, from, limit, body_bytes).await
            }
            DeadLettersCommand::Replay {
                channel,
                from,
                to,
                into,
            } => {
                let channels = open(&channel.config, registry)?;
                let dlq = channels.get(&channel.channel, &channel.config)?;
                if into == channel.channel {
                    bail!("--into names the channel replayed from (`{into}`); name another");
                }
                let target = channels.get(&into, &channel.config)?;
                dlq.start().await?;
                target.start().await?;
                let to = to.unwrap_or(u64::MAX);
                if to < from {
                    bail!("--to {to} is below --from {from}");
                }
                let target: Arc<dyn Channel> = Arc::new(target);
                let moved = replay(&dlq, from..=to, &target).await?;
                eprintln!(
                    "replayed {moved} events from channel `{}` into `{into}`",
                    channel.channel
                );
                Ok(())
            }
        }
    })
}

/// The file channels of a pipeline file, with its data directory locked.
struct Channels {
    files: BTreeMap<String, FileChannel>,
    types: BTreeMap<String, String>,
    _lock: DataDirLock,
}

impl Channels {
    fn get(&self, name: &str, config: &std::path::Path) -> anyhow::Result<FileChannel> {
        if let Some(channel) = self.files.get(name) {
            return Ok(channel.clone());
        }
        match self.types.get(name) {
            Some(kind) => bail!(
                "channel `{name}` of {} is a `{kind}` channel; only `file` channels keep events between runs",
                config.display()
            ),
            None => bail!(
                "{} has no channel `{name}` (channels: {})",
                config.display(),
                self.types.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        }
    }
}

/// Loads `config` with `registry`, keeping a handle on each file channel, and locks its
/// data directory.
fn open(config: &std::path::Path, registry: &Registry) -> anyhow::Result<Channels> {
    let files: Arc<Mutex<BTreeMap<String, FileChannel>>> = Arc::default();
    let mut registry = registry.clone();
    let kept = Arc::clone(&files);
    registry.register_channel("file", move |cfg| {
        let channel = FileChannel::build(cfg)?;
        kept.lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(cfg.name().to_owned(), channel.clone());
        Ok(Arc::new(channel))
    });
    let topology = crate::topology::load(config, &registry).map_err(|p| anyhow::anyhow!("{p}"))?;
    let lock = DataDirLock::acquire(&topology.agent.data_dir)?;
    let files = std::mem::take(&mut *files.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(Channels {
        files,
        types: topology.channel_types.clone(),
        _lock: lock,
    })
}

/// Prints up to `limit` events of `channel` from sequence number `from` on.
async fn list(
    channel: &FileChannel,
    from: u64,
    limit: usize,
    body_bytes: usize,
) -> anyhow::Result<()> {
    use std::io::Write as _;
    let take = channel.take_sequences(from..=u64::MAX, limit).await?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let sequences = take.sequences().unwrap_or_default();
    for (seq, event) in sequences.iter().zip(take.events()) {
        writeln!(out, "{}", describe(*seq, event, body_bytes))?;
    }
    out.flush()?;
    eprintln!(
        "{} events listed from channel `{}`",
        sequences.len(),
        channel.name()
    );
    take.rollback().await?;
    Ok(())
}

/// One line for an event: `17 time=... sink=... channel=... reason="..." body="..." (N bytes)`.
fn describe(seq: u64, event: &Event, body_bytes: usize) -> String {
    let header = |name: &str| event.headers.value(name).unwrap_or("-");
    let shown = &event.body[..event.body.len().min(body_bytes)];
    format!(
        "{seq} time={} sink={} channel={} reason={:?} body={:?} ({} bytes)",
        header(TIME_HEADER),
        header(SINK_HEADER),
        header(CHANNEL_HEADER),
        header(REASON_HEADER),
        String::from_utf8_lossy(shown),
        event.body.len()
    )
}

/// Moves the events of `range` from `from` into `into`, one joint transaction per batch
/// that fits a put of `into`; returns how many moved.
async fn replay(
    from: &FileChannel,
    range: std::ops::RangeInclusive<u64>,
    into: &Arc<dyn Channel>,
) -> anyhow::Result<u64> {
    let chunk = into
        .transaction_capacity()
        .min(from.transaction_capacity())
        .max(1);
    let mut next = *range.start();
    let mut moved = 0;
    loop {
        let take = from.take_sequences(next..=*range.end(), chunk).await?;
        let Some(last) = take.sequences().and_then(|s| s.last().copied()) else {
            break;
        };
        let events: Vec<Event> = take
            .events()
            .iter()
            .map(|event| {
                let mut event = event.clone();
                for header in [REASON_HEADER, SINK_HEADER, CHANNEL_HEADER, TIME_HEADER] {
                    event.headers.remove(header);
                }
                event
            })
            .collect();
        let n = events.len() as u64;
        crate::dead_letter::commit_moving(take, from, into, events, "agent dead-letters replay")
            .await
            .with_context(|| {
                format!(
                    "moving events {next}..={last} from `{}` into `{}`",
                    from.name(),
                    into.name()
                )
            })?;
        moved += n;
        if last == u64::MAX {
            break;
        }
        next = last + 1;
    }
    // A move into a channel of another store committed its take without an fsync.
    from.sync_takes().await?;
    Ok(moved)
}
