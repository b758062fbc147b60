//! Crash safety end to end: the real agent, killed with SIGKILL at random moments and
//! restarted, must deliver every event exactly once through a durable channel.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use nix::sys::signal::Signal;

use crate::harness;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::harness::{
    Agent, Lcg, Tmpfs, crash_seed, free_port, http_server, read_dir_concat, wait_until,
};

/// Starts the agent on `config` `rounds` times, killing it with SIGKILL each time at a random
/// moment after it started: after 50 to 450 ms, or as soon as the files under `out` grew by a
/// random number of bytes up to `budget / rounds`, whichever comes first. The growth bound
/// keeps the runs from finishing the work however fast the agent is (`budget` is well under
/// the whole output), so every round really kills it in the middle.
fn kill_repeatedly(
    dir: &std::path::Path,
    config: &str,
    rng: &mut Lcg,
    rounds: usize,
    out: &std::path::Path,
    budget: u64,
) {
    for round in 0..rounds {
        let mut agent = Agent::start(dir, config);
        wait_until(Duration::from_secs(60), "the agent to start", || {
            agent.log().contains("pipeline started")
        });
        let deadline = std::time::Instant::now() + Duration::from_millis(50 + rng.next_below(400));
        let until = dir_size(out) + 1 + rng.next_below(budget / rounds as u64);
        while std::time::Instant::now() < deadline && dir_size(out) < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        agent.signal(Signal::SIGKILL);
        let status = agent.wait(Duration::from_secs(30));
        assert!(
            !status.success(),
            "round {round}: the agent finished before the kill"
        );
    }
}

/// seq → a `channel_type` channel → file_roll into `./out`, state in `./state`.
fn seq_to_file_roll(total: usize, channel_type: &str) -> String {
    format!(
        "\
agent:
  data_dir: ./state
sources:
  numbers:
    type: seq
    channels: [buffer]
    batch_size: 500
    total_events: {total}
channels:
  buffer:
    type: {channel_type}
    capacity: 20000
    transaction_capacity: 1000
sinks:
  files:
    type: file_roll
    channel: buffer
    batch_size: 700
    directory: ./out
    roll_size: 256KiB
"
    )
}

/// Bytes in the files under `dir`, recursively.
fn dir_size(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .map(|e| e.unwrap())
            .map(|e| match e.file_type().unwrap().is_dir() {
                true => dir_size(&e.path()),
                false => e.metadata().map_or(0, |m| m.len()),
            })
            .sum()
    })
}

/// Copies the files of `from` into `to`, recursively.
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// `tests/fixtures/row-format-v1` was written by the agent of the row-format file channel
/// (state schema version 1): a `seq` source with `total_events: 2000` drained through a file
/// channel into `file_roll` (`out/`), then the same source raised to 5000 with an `http` sink
/// to a closed port, killed with SIGKILL while events 2000..4999 (sequence numbers 2001..5000)
/// waited in the channel's SQLite rows.
#[test]
fn a_data_dir_of_the_row_format_channel_drains_exactly_once_after_the_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(
        &harness::repo_root().join("tests/fixtures/row-format-v1"),
        dir.path(),
    );
    let config = seq_to_file_roll(5000, "file");
    let mut agent = Agent::start(dir.path(), &config);
    let status = agent.wait(Duration::from_secs(120));
    assert!(status.success(), "{status:?}\n{}", agent.log());
    assert!(
        agent
            .log()
            .contains("moved the channel's events from the row format"),
        "{}",
        agent.log()
    );
    let text = String::from_utf8(read_dir_concat(&dir.path().join("out"))).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let expected: Vec<String> = (0..5000).map(|i| i.to_string()).collect();
    assert_eq!(lines, expected, "every event once, in order");
    // Run again: nothing is left to deliver, nothing is delivered twice.
    let mut agent = Agent::start(dir.path(), &config);
    assert!(
        agent.wait(Duration::from_secs(60)).success(),
        "{}",
        agent.log()
    );
    let again = String::from_utf8(read_dir_concat(&dir.path().join("out"))).unwrap();
    assert_eq!(again.lines().count(), 5000);
}

#[test]
fn seq_through_file_channel_to_file_roll_is_exactly_once_across_sigkills() {
    const TOTAL: usize = 2_000_000;
    let seed = crash_seed();
    let mut rng = Lcg(seed);
    let dir = tempfile::tempdir().unwrap();
    let config = seq_to_file_roll(TOTAL, "file");
    let out = dir.path().join("out");
    // The output is about 7 bytes per event: the kills come within its first third.
    kill_repeatedly(dir.path(), &config, &mut rng, 10, &out, TOTAL as u64 * 2);
    // The last run goes to completion: the source ends, the channel drains, the agent exits.
    let mut agent = Agent::start(dir.path(), &config);
    let status = agent.wait(Duration::from_secs(300));
    assert!(status.success(), "{status:?}\n{}", agent.log());
    let text = String::from_utf8(read_dir_concat(&out)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    for (expected, line) in lines.iter().enumerate() {
        assert_eq!(
            *line,
            expected.to_string(),
            "CRASH_SEED={seed}: at event {expected} the output went wrong (duplicate, gap or reorder)"
        );
    }
    assert_eq!(lines.len(), TOTAL, "CRASH_SEED={seed}");
}

#[test]
fn full_disk_makes_the_source_wait_and_nothing_is_lost_when_space_returns() {
    full_disk_case(FullDisk::Everything);
}

/// The segment files on a filesystem of their own, without a reserve: a put's write fills it
/// in the middle of a segment and fails with ENOSPC. The source waits the same way; no half
/// written batch is ever served, and the segments taken free the space.
#[test]
fn a_write_that_fills_the_disk_mid_segment_is_cut_and_retried() {
    full_disk_case(FullDisk::SegmentsOnly);
}

enum FullDisk {
    /// The database and the segments on the full disk, with a 6 MiB reserve.
    Everything,
    /// Only the segments there (the database elsewhere), no reserve, 4 MiB segments.
    SegmentsOnly,
}

fn full_disk_case(case: FullDisk) {
    const LINES: usize = 60_000;
    let disk = Tmpfs::mount(24);
    // Most of the disk is taken by someone else's file; the channel gets what is left.
    let filler = disk.path.join("filler");
    std::fs::write(&filler, vec![0u8; 14 << 20]).unwrap();
    // The destination refuses everything until released, so the channel fills up.
    let open = Arc::new(AtomicBool::new(false));
    let gate = Arc::clone(&open);
    let (http_port, received) = http_server(
        move |_| {
            if gate.load(Ordering::SeqCst) {
                200
            } else {
                503
            }
        },
        Duration::ZERO,
    );
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let channel_options = match case {
        FullDisk::Everything => format!(
            "data_dir: {}\n    minimum_free_space: 6MiB",
            disk.path.join("channel").display()
        ),
        FullDisk::SegmentsOnly => {
            std::fs::create_dir_all(dir.path().join("state")).unwrap();
            std::os::unix::fs::symlink(&disk.path, dir.path().join("state/channels")).unwrap();
            "minimum_free_space: 0B\n    max_file_size: 4MiB".to_owned()
        }
    };
    let config = format!(
        "\
agent:
  data_dir: ./state
sources:
  lines:
    type: netcat
    channels: [durable]
    bind: 127.0.0.1
    port: {port}
    max_line_length: 1024
channels:
  durable:
    type: file
    capacity: 1000000
    transaction_capacity: 1000
    {channel_options}
sinks:
  remote:
    type: http
    channel: durable
    batch_size: 1000
    endpoint: http://127.0.0.1:{http_port}/
"
    );
    let mut agent = Agent::start(dir.path(), &config);
    wait_until(Duration::from_secs(30), "netcat source listening", || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let padding = "x".repeat(400);
    let sender = std::thread::spawn(move || {
        let mut payload = Vec::new();
        for i in 0..LINES {
            writeln!(payload, "{i} {padding}").unwrap();
        }
        writer.write_all(&payload).unwrap();
    });
    let acks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = Arc::clone(&acks);
    let reader = std::thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        while counter.load(Ordering::SeqCst) < LINES {
            line.clear();
            if reader.read_line(&mut line).unwrap() == 0 {
                break;
            }
            assert_eq!(line, "OK\n", "a line was refused instead of waiting");
            counter.fetch_add(1, Ordering::SeqCst);
        }
    });
    wait_until(Duration::from_secs(120), "the disk-full log line", || {
        agent.log().contains("disk full")
    });
    if let FullDisk::SegmentsOnly = case {
        wait_until(Duration::from_secs(60), "a segment write failing", || {
            agent.log().contains(".log: disk full")
        });
    }
    let stalled = acks.load(Ordering::SeqCst);
    assert!(
        stalled < LINES,
        "everything fit: the test did not fill the disk"
    );
    // Space returns, and the destination too.
    std::fs::remove_file(&filler).unwrap();
    open.store(true, Ordering::SeqCst);
    reader.join().unwrap();
    sender.join().unwrap();
    assert_eq!(acks.load(Ordering::SeqCst), LINES);
    wait_until(Duration::from_secs(120), "every line delivered", || {
        received.bodies.lock().unwrap().len() >= LINES
    });
    agent.signal(Signal::SIGTERM);
    assert!(
        agent.wait(Duration::from_secs(60)).success(),
        "{}",
        agent.log()
    );
    let bodies = received.bodies.lock().unwrap();
    assert_eq!(bodies.len(), LINES, "duplicates delivered");
    for (i, body) in bodies.iter().enumerate() {
        assert_eq!(
            body.split(' ').next(),
            Some(i.to_string().as_str()),
            "line {i}"
        );
    }
}

#[test]
fn seq_through_memory_channel_loses_nothing_across_sigkills() {
    const TOTAL: usize = 2_000_000;
    let seed = crash_seed();
    let mut rng = Lcg(seed);
    let dir = tempfile::tempdir().unwrap();
    let config = seq_to_file_roll(TOTAL, "memory");
    let out = dir.path().join("out");
    // The output is about 7 bytes per event: the kills come within its first third.
    kill_repeatedly(dir.path(), &config, &mut rng, 10, &out, TOTAL as u64 * 2);
    let mut agent = Agent::start(dir.path(), &config);
    let status = agent.wait(Duration::from_secs(300));
    assert!(status.success(), "{status:?}\n{}", agent.log());
    let text = String::from_utf8(read_dir_concat(&out)).unwrap();
    let mut seen = vec![0u32; TOTAL];
    for line in text.lines() {
        let n: usize = line
            .parse()
            .unwrap_or_else(|_| panic!("damaged line {line:?}"));
        seen[n] += 1;
    }
    let missing: Vec<usize> = (0..TOTAL).filter(|n| seen[*n] == 0).collect();
    assert!(
        missing.is_empty(),
        "CRASH_SEED={seed}: {} events lost, first {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    let duplicates: u32 = seen.iter().map(|c| c.saturating_sub(1)).sum();
    println!("{duplicates} duplicates after 10 SIGKILLs (allowed with a memory channel)");
}

#[test]
fn file_channel_holds_far_more_than_memory_and_drains_after_a_restart() {
    const LINES: usize = 500_000;
    const LINE: usize = 1000;
    // The destination refuses everything during the first run: all events pile up on disk.
    let (http_port, received) = http_server(|_| 503, Duration::ZERO);
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let channel = "\
channels:
  durable:
    type: file
    capacity: 10000000
    transaction_capacity: 1000
    durability: normal
    minimum_free_space: 0
";
    let filling = format!(
        "\
agent:
  data_dir: ./state
sources:
  lines:
    type: netcat
    channels: [durable]
    bind: 127.0.0.1
    port: {port}
    max_line_length: 2048
{channel}sinks:
  remote:
    type: http
    channel: durable
    batch_size: 1000
    endpoint: http://127.0.0.1:{http_port}/
"
    );
    let mut agent = Agent::start(dir.path(), &filling);
    wait_until(Duration::from_secs(30), "netcat source listening", || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let pad = "y".repeat(LINE - 11);
    let sender = std::thread::spawn(move || {
        for chunk in 0..LINES / 10_000 {
            let mut payload = Vec::with_capacity(10_000 * LINE);
            for i in chunk * 10_000..(chunk + 1) * 10_000 {
                writeln!(payload, "{i:010}{pad}").unwrap();
            }
            writer.write_all(&payload).unwrap();
        }
    });
    // Every `OK` is a line committed to the channel's database.
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    let mut peak = 0;
    for acked in 0..LINES {
        line.clear();
        reader.read_line(&mut line).unwrap();
        assert_eq!(line, "OK\n", "line {acked}");
        if acked % 10_000 == 0 {
            peak = peak.max(agent.rss_kib());
        }
    }
    sender.join().unwrap();
    let stored = dir_size(&dir.path().join("state"));
    agent.signal(Signal::SIGKILL);
    agent.wait(Duration::from_secs(30));
    println!(
        "the channel holds {} MiB; the agent's resident memory peaked at {} MiB",
        stored >> 20,
        peak >> 10
    );
    assert!(received.bodies.lock().unwrap().is_empty());
    assert!(
        peak < 150 * 1024,
        "resident memory peaked at {peak} KiB while the channel took {} MB",
        stored >> 20
    );
    // After the restart a working sink drains the channel: every line, once, in order.
    let draining = format!(
        "\
agent:
  data_dir: ./state
{channel}sinks:
  files:
    type: file_roll
    channel: durable
    batch_size: 1000
    directory: ./out
    roll_size: 64MiB
"
    );
    let mut agent = Agent::start(dir.path(), &draining);
    let out = dir.path().join("out");
    wait_until(Duration::from_secs(300), "the channel to drain", || {
        read_dir_concat(&out).len() >= LINES * LINE
    });
    agent.signal(Signal::SIGTERM);
    assert!(
        agent.wait(Duration::from_secs(60)).success(),
        "{}",
        agent.log()
    );
    let written = read_dir_concat(&out);
    assert_eq!(written.len(), LINES * LINE);
    for (i, line) in written.split(|b| *b == b'\n').take(LINES).enumerate() {
        assert_eq!(&line[..10], format!("{i:010}").as_bytes(), "line {i}");
    }
}
