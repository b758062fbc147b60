//! `agent log-repair`: lists the damaged ranges of a stopped broker's data directory and, with
//! `--execute`, removes them, the intact batches keeping their offsets (see
//! `ferry_broker::find_damage` and `ferry_broker::remove_damage`).

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

/// Flags of `agent log-repair`.
#[derive(Args, Debug)]
pub struct LogRepairArgs {
    /// The broker's data directory (its `data_dir`). The broker must be stopped.
    #[arg(long = "data-dir", value_name = "DIR")]
    data_dir: PathBuf,
    /// Remove the damaged ranges; without it nothing is changed.
    #[arg(long)]
    execute: bool,
}

/// Runs `agent log-repair`.
pub fn run(args: LogRepairArgs) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    let ranges = ferry_broker::find_damage(&args.data_dir)
        .with_context(|| format!("checking {}", args.data_dir.display()))?;
    if ranges.is_empty() {
        writeln!(out, "no damaged ranges in {}", args.data_dir.display())?;
        return Ok(());
    }
    for range in &ranges {
        writeln!(out, "damaged: {range}")?;
    }
    let bytes: u64 = ranges.iter().map(|r| r.end - r.position).sum();
    if !args.execute {
        writeln!(
            out,
            "{} damaged range(s), {bytes} bytes; nothing changed (dry run): stop the broker and \
             run again with --execute to remove them",
            ranges.len()
        )?;
        return Ok(());
    }
    ferry_broker::remove_damage(&args.data_dir, &ranges)
        .with_context(|| format!("repairing {}", args.data_dir.display()))?;
    writeln!(
        out,
        "removed {} damaged range(s), {bytes} bytes; the other batches keep their offsets",
        ranges.len()
    )?;
    Ok(())
}
