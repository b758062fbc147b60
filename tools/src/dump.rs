//! `agent dump-log-segments` (as kafka-dump-log.sh / DumpLogSegments): the batches (with
//! producer ids, sequences and transaction markers) and records of broker segment files, and
//! the entries of their `.index`, `.timeindex` and `.txnindex` files.

use std::io::Write as _;
use std::path::PathBuf;

use clap::Args;

#[derive(Args)]
pub struct DumpLogSegmentsArgs {
    /// Segment files (`.log`, `.index`, `.timeindex`, `.txnindex`), comma-separated as in
    /// Kafka.
    #[arg(long, value_delimiter = ',', required = true)]
    files: Vec<PathBuf>,
    /// Print each record's key, value and headers too.
    #[arg(long = "print-data-log")]
    print_data_log: bool,
    /// Check every batch's CRC, print each damaged range and dump the intact batches
    /// after it; exits 1 when any is found.
    #[arg(long)]
    verify: bool,
    /// Read at most this many bytes of each `.log` file (whole batches only), as Kafka's
    /// --max-bytes.
    #[arg(long = "max-bytes", value_parser = clap::value_parser!(u64).range(1..))]
    max_bytes: Option<u64>,
    /// Check each `.index`/`.timeindex` against its `.log` without printing its entries:
    /// only Kafka's messages for the entries that disagree (on standard error); exits 1
    /// when any is found.
    #[arg(long = "verify-index-only")]
    verify_index_only: bool,
    /// Iterate the records inside each batch: as Kafka, --print-data-log does it too, so the
    /// flag is taken with --print-data-log; alone (each record's metadata without its key and
    /// payload) it is refused, naming --print-data-log.
    #[arg(long = "deep-iteration")]
    deep_iteration: bool,
    /// Kafka's flag to decode `__consumer_offsets` records: refused, since the bundled broker
    /// keeps group offsets in its metadata database, not in a topic (`agent groups
    /// --describe` prints them).
    #[arg(long = "offsets-decoder")]
    offsets_decoder: bool,
}

/// Dumps every file of `args`; an error when a damaged range or (with --verify-index-only)
/// a disagreeing index entry was found.
pub fn run(args: &DumpLogSegmentsArgs) -> anyhow::Result<()> {
    if args.offsets_decoder {
        anyhow::bail!(
            "--offsets-decoder is not supported: the bundled broker keeps group offsets in its \
             metadata database, not in a __consumer_offsets topic; `agent groups --describe` \
             prints them, and --print-data-log prints any topic's records"
        );
    }
    if args.deep_iteration && !args.print_data_log {
        anyhow::bail!(
            "--deep-iteration alone (each record without its key and payload) is not \
             supported: use --print-data-log, which iterates the records too and prints each \
             with its key and payload"
        );
    }
    let options = ferry_broker::DumpOptions {
        print_data_log: args.print_data_log,
        verify: args.verify,
        max_bytes: args.max_bytes,
        verify_index_only: args.verify_index_only,
    };
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut damaged = Vec::new();
    let mut report = ferry_broker::DumpReport::default();
    for file in &args.files {
        let before = report.damaged;
        ferry_broker::dump_segment_file_with(file, &options, &mut out, &mut report)?;
        let found = report.damaged - before;
        if found > 0 {
            damaged.push(format!("{} ({found})", file.display()));
        }
    }
    out.flush()?;
    // As Kafka: the index problems of every file, after the dumps.
    report.write_index_problems(&mut std::io::stderr().lock())?;
    if !damaged.is_empty() {
        anyhow::bail!("damaged ranges found in {}", damaged.join(", "));
    }
    if options.verify_index_only && report.index_problems() {
        anyhow::bail!("index entries that disagree with their log were found");
    }
    Ok(())
}
