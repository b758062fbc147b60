//! The Flume → Kafka → Flume chain under SIGKILL: a writer appends numbered lines to rotating
//! log files; the edge agent (`pipelines/chain/edge.yaml`: taildir → file channel → kafka sink)
//! sends them to the broker (`pipelines/chain/broker.yaml`, a process of its own); the
//! collector (`pipelines/chain/collector.yaml`: kafka source → file channel → file_roll)
//! writes them to files. Each of the three processes is killed with SIGKILL at random moments
//! and restarted; at the end the collector's output must hold every line: exactly once with
//! the kafka sink's `delivery: exactly_once`, at least once (duplicates counted and printed)
//! with `at_least_once`.
//!
//! `FERRY_CHAIN_LINES` sets the number of lines (default 1,000,000); the kill delays and the
//! choice of victim come from `CRASH_SEED` (printed) to replay a run.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::harness::{Agent, Lcg, crash_seed, free_port, pipeline, read_dir_concat, wait_until};

/// Kills in all, at least; each process at least `KILLS / 5` times.
const KILLS: usize = 15;

fn lines_wanted() -> usize {
    std::env::var("FERRY_CHAIN_LINES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}

fn line(n: usize) -> String {
    format!("line-{n:07}")
}

/// Appends `total` numbered lines to `dir/app.log` in chunks over about 30 s, rotating it by
/// rename (`app.log` → `app.log.<k>`, still matched by the edge's glob) every 100,000 lines.
fn write_logs(dir: &Path, total: usize, done: &AtomicBool) {
    let chunk = (total / 150).max(1);
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("app.log"))
        .unwrap();
    let mut rotations = 0;
    let mut n = 0;
    while n < total {
        let mut buf = String::with_capacity(chunk * 13);
        for i in n..(n + chunk).min(total) {
            buf.push_str(&line(i));
            buf.push('\n');
        }
        file.write_all(buf.as_bytes()).unwrap();
        n = (n + chunk).min(total);
        if n / 100_000 > rotations && n < total {
            rotations += 1;
            fs::rename(
                dir.join("app.log"),
                dir.join(format!("app.log.{rotations}")),
            )
            .unwrap();
            file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join("app.log"))
                .unwrap();
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    done.store(true, Ordering::SeqCst);
}

/// One of the three processes: its directory and configuration, and the running agent.
struct Proc {
    name: &'static str,
    dir: PathBuf,
    config: String,
    agent: Agent,
    kills: usize,
}

impl Proc {
    fn start(name: &'static str, dir: PathBuf, config: String) -> Proc {
        fs::create_dir_all(&dir).unwrap();
        let agent = started(&dir, &config, name);
        Proc {
            name,
            dir,
            config,
            agent,
            kills: 0,
        }
    }

    fn kill_and_restart(&mut self) {
        self.agent.signal(Signal::SIGKILL);
        let status = self.agent.wait(Duration::from_secs(30));
        assert_eq!(
            status.signal(),
            Some(Signal::SIGKILL as i32),
            "the {} exited by itself ({status:?}):\n{}",
            self.name,
            self.agent.log()
        );
        self.kills += 1;
        self.agent = started(&self.dir, &self.config, self.name);
    }
}

fn started(dir: &Path, config: &str, name: &str) -> Agent {
    let agent = Agent::start(dir, config);
    wait_until(Duration::from_secs(60), "an agent to start", || {
        let log = agent.log();
        log.contains("pipeline started") || log.contains("Error")
    });
    assert!(
        agent.log().contains("pipeline started"),
        "the {name} did not start:\n{}",
        agent.log()
    );
    agent
}

/// Lines in the collector's finished output files (a `.tmp` file may still lose an
/// unacknowledged tail to a kill).
fn finished_lines(out: &Path) -> usize {
    let Ok(entries) = fs::read_dir(out) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            !name.starts_with('.') && !name.ends_with(".tmp")
        })
        .map(|e| {
            fs::read(e.path())
                .map(|b| b.iter().filter(|c| **c == b'\n').count())
                .unwrap_or(0)
        })
        .sum()
}

/// Runs the chain with the edge's kafka sink in `delivery` mode under kills; returns the
/// number of duplicated lines in the output (losing a line fails the test).
fn chain_under_kills(delivery: &str) -> usize {
    let seed = crash_seed();
    let mut rng = Lcg(seed);
    let total = lines_wanted();
    let root = tempfile::tempdir().unwrap();
    let address = format!("127.0.0.1:{}", free_port());
    let broker_config = pipeline("chain/broker.yaml", &[("127.0.0.1:9092", &address)]);
    let edge_config = pipeline(
        "chain/edge.yaml",
        &[
            ("127.0.0.1:9092", &address),
            ("delivery: exactly_once", &format!("delivery: {delivery}")),
        ],
    );
    let collector_config = pipeline(
        "chain/collector.yaml",
        &[
            ("127.0.0.1:9092", &address),
            ("roll_interval: 1m", "roll_interval: 1s"),
        ],
    );
    let mut procs = vec![Proc::start(
        "broker",
        root.path().join("broker"),
        broker_config,
    )];
    procs.push(Proc::start("edge", root.path().join("edge"), edge_config));
    procs.push(Proc::start(
        "collector",
        root.path().join("collector"),
        collector_config,
    ));
    let logs = root.path().join("edge/logs");
    fs::create_dir_all(&logs).unwrap();
    let out = root.path().join("collector/var/chain/out");

    let written = Arc::new(AtomicBool::new(false));
    let writer = {
        let (logs, written) = (logs.clone(), Arc::clone(&written));
        std::thread::spawn(move || write_logs(&logs, total, &written))
    };
    let started = Instant::now();
    let mut kills = 0;
    while kills < KILLS
        || procs.iter().any(|p| p.kills < KILLS / 5)
        || !written.load(Ordering::SeqCst)
    {
        std::thread::sleep(Duration::from_millis(300 + rng.next_below(1700)));
        // The process killed least so far is favoured, the others picked at random.
        let least = (0..3).min_by_key(|i| procs[*i].kills).unwrap();
        let victim = if rng.next_below(2) == 0 {
            least
        } else {
            rng.next_below(3) as usize
        };
        procs[victim].kill_and_restart();
        kills += 1;
    }
    writer.join().unwrap();
    assert!(written.load(Ordering::SeqCst));
    println!(
        "{kills} kills in {:?} (broker {}, edge {}, collector {}); waiting for the output",
        started.elapsed(),
        procs[0].kills,
        procs[1].kills,
        procs[2].kills
    );

    // Let the chain finish: every line in finished files (or no progress for 150 s). A burst
    // of collector kills leaves dead members in its group: the first rebalance after the last
    // kill waits for their sessions to time out (librdkafka's 45 s), maybe twice, before the
    // live collector gets its partitions.
    let mut last = (0, Instant::now());
    wait_until(Duration::from_secs(600), "the collector's output", || {
        let n = finished_lines(&out);
        if n != last.0 {
            last = (n, Instant::now());
        }
        n >= total || last.1.elapsed() > Duration::from_secs(150)
    });
    for proc in procs.iter_mut().rev() {
        proc.agent.signal(Signal::SIGTERM);
        let status = proc.agent.wait(Duration::from_secs(60));
        assert!(
            status.success(),
            "{}: {status:?}\n{}",
            proc.name,
            proc.agent.log()
        );
    }
    let duplicates = count_output(&out, total, seed);
    println!("{delivery}: {total} lines, {duplicates} duplicates, {kills} kills");
    duplicates
}

/// Checks that the output files in `out` hold every one of `total` lines and nothing else;
/// returns the number of duplicates.
fn count_output(out: &Path, total: usize, seed: u64) -> usize {
    let text = String::from_utf8(read_dir_concat(out)).unwrap();
    let mut counts: HashMap<&str, usize> = HashMap::with_capacity(total);
    for l in text.lines() {
        *counts.entry(l).or_default() += 1;
    }
    let missing: Vec<String> = (0..total)
        .map(line)
        .filter(|l| !counts.contains_key(l.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "CRASH_SEED={seed}: {} of {total} lines lost, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    assert_eq!(
        counts.len(),
        total,
        "CRASH_SEED={seed}: lines that were never written"
    );
    counts.values().map(|c| c - 1).sum()
}

#[test]
fn chain_delivers_every_line_exactly_once_through_kills_of_every_process() {
    let duplicates = chain_under_kills("exactly_once");
    assert_eq!(duplicates, 0, "lines delivered more than once");
}

#[test]
fn chain_with_at_least_once_loses_nothing_through_kills() {
    let duplicates = chain_under_kills("at_least_once");
    println!("at_least_once duplicated {duplicates} lines");
}

/// `pipelines/taildir-kafka-channel-to-file.yaml` (taildir → kafka channel on the bundled
/// broker in the same process → file_roll) killed with SIGKILL at random moments while the
/// writer appends: every line exactly once.
#[test]
fn kafka_channel_pipeline_delivers_every_line_exactly_once_through_kills() {
    let seed = crash_seed();
    let mut rng = Lcg(seed);
    let total = lines_wanted() / 4;
    let root = tempfile::tempdir().unwrap();
    let address = format!("127.0.0.1:{}", free_port());
    let config = pipeline(
        "taildir-kafka-channel-to-file.yaml",
        &[
            ("127.0.0.1:9092", &address),
            ("roll_interval: 5m", "roll_interval: 1s"),
        ],
    );
    let mut agent = Proc::start("agent", root.path().to_path_buf(), config);
    let logs = root.path().join("logs");
    fs::create_dir_all(&logs).unwrap();
    let out = root.path().join("var/kc-out");
    let written = Arc::new(AtomicBool::new(false));
    let writer = {
        let (logs, written) = (logs.clone(), Arc::clone(&written));
        std::thread::spawn(move || write_logs(&logs, total, &written))
    };
    while agent.kills < KILLS || !written.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(300 + rng.next_below(1700)));
        agent.kill_and_restart();
    }
    writer.join().unwrap();
    // As above: dead members of the channel's group may hold its partitions for a session.
    let mut last = (0, Instant::now());
    wait_until(Duration::from_secs(600), "the output", || {
        let n = finished_lines(&out);
        if n != last.0 {
            last = (n, Instant::now());
        }
        n >= total || last.1.elapsed() > Duration::from_secs(150)
    });
    agent.agent.signal(Signal::SIGTERM);
    let status = agent.agent.wait(Duration::from_secs(60));
    assert!(status.success(), "{status:?}\n{}", agent.agent.log());
    let duplicates = count_output(&out, total, seed);
    println!(
        "kafka channel: {total} lines, {duplicates} duplicates, {} kills",
        agent.kills
    );
    assert_eq!(
        duplicates, 0,
        "CRASH_SEED={seed}: lines delivered more than once"
    );
}

/// Two collectors share a consumer group on a 3-partition topic while a producer agent writes
/// to it; they join and leave (SIGTERM) in turn, so partitions move between them several
/// times. Clean hand-overs are exact: the union of their outputs holds every record once.
#[test]
fn kafka_source_group_hands_partitions_over_exactly_on_clean_stops() {
    let total = 30_000;
    let root = tempfile::tempdir().unwrap();
    let address = format!("127.0.0.1:{}", free_port());
    let broker_config = pipeline("chain/broker.yaml", &[("127.0.0.1:9092", &address)]);
    let mut broker = Proc::start("broker", root.path().join("broker"), broker_config);
    let producer_config = format!(
        "\
agent:
  data_dir: ./state
sources:
  numbers:
    type: seq
    channels: [durable]
    batch_size: 100
    total_events: {total}
channels:
  durable:
    type: file
    transaction_capacity: 100
sinks:
  to_kafka:
    type: kafka
    channel: durable
    batch_size: 100
    bootstrap_servers: {address}
    topic: app-logs
    linger: 50ms
"
    );
    let collector_config = pipeline(
        "chain/collector.yaml",
        &[
            ("127.0.0.1:9092", &address),
            ("roll_interval: 1m", "roll_interval: 1s"),
        ],
    );
    let outputs = [
        root.path().join("a/var/chain/out"),
        root.path().join("b/var/chain/out"),
    ];
    let delivered = || outputs.iter().map(|o| finished_lines(o)).sum::<usize>();
    let mut a = Proc::start(
        "collector a",
        root.path().join("a"),
        collector_config.clone(),
    );
    let mut producer = Proc::start("producer", root.path().join("p"), producer_config);
    let mut b: Option<Proc> = None;
    // a alone; b joins; a leaves; a joins again; b leaves.
    for step in 0..4 {
        let before = delivered();
        wait_until(
            Duration::from_secs(120),
            "progress between hand-overs",
            || delivered() > before + 1000 || delivered() >= total,
        );
        match step {
            0 | 2 => {
                let dir = root.path().join("b");
                if step == 0 {
                    b = Some(Proc::start("collector b", dir, collector_config.clone()));
                } else {
                    a = Proc::start(
                        "collector a",
                        root.path().join("a"),
                        collector_config.clone(),
                    );
                }
            }
            1 => stop(&mut a.agent, "collector a"),
            _ => stop(&mut b.as_mut().unwrap().agent, "collector b"),
        }
    }
    let mut last = (0, Instant::now());
    wait_until(Duration::from_secs(300), "every record", || {
        let n = delivered();
        if n != last.0 {
            last = (n, Instant::now());
        }
        n >= total || last.1.elapsed() > Duration::from_secs(30)
    });
    stop(&mut a.agent, "collector a");
    stop(&mut producer.agent, "producer");
    stop(&mut broker.agent, "broker");
    let mut counts: HashMap<String, usize> = HashMap::new();
    for out in &outputs {
        for l in String::from_utf8(read_dir_concat(out)).unwrap().lines() {
            *counts.entry(l.to_owned()).or_default() += 1;
        }
    }
    let missing: Vec<usize> = (0..total)
        .filter(|n| !counts.contains_key(&n.to_string()))
        .collect();
    assert!(
        missing.is_empty(),
        "{} records lost, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    let repeated: Vec<&String> = counts
        .iter()
        .filter(|(_, c)| **c > 1)
        .map(|(l, _)| l)
        .collect();
    assert!(
        repeated.is_empty(),
        "{} records delivered twice, e.g. {:?}",
        repeated.len(),
        &repeated[..repeated.len().min(10)]
    );
    assert_eq!(counts.len(), total);
}

fn stop(agent: &mut Agent, name: &str) {
    agent.signal(Signal::SIGTERM);
    let status = agent.wait(Duration::from_secs(60));
    assert!(status.success(), "{name}: {status:?}\n{}", agent.log());
}
