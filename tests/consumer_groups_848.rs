//! KIP-848 consumer groups (`group.protocol=consumer`) on the bundled broker, with librdkafka
//! consumers (`agent console-consumer`) run as child processes so one can be SIGKILLed.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use crate::harness::{Agent, free_port, wait_until};

const PARTITIONS: i32 = 6;

fn consumer(dir: &Path, name: &str, bootstrap: &str, group: &str, kip848: bool) -> Child {
    let mut args = vec![
        "console-consumer",
        "--bootstrap-server",
        bootstrap,
        "--topic",
        "orders",
        "--group",
        group,
        "--from-beginning",
        "--consumer-property",
        "auto.commit.interval.ms=200",
    ];
    if kip848 {
        args.extend(["--consumer-property", "group.protocol=consumer"]);
    }
    Command::new(env!("CARGO_BIN_EXE_agent"))
        .args(&args)
        .stdin(Stdio::null())
        .stdout(fs::File::create(dir.join(format!("{name}.out"))).unwrap())
        .stderr(fs::File::create(dir.join(format!("{name}.err"))).unwrap())
        .spawn()
        .unwrap()
}

/// The records a consumer printed: `p{partition}-{n}`.
fn printed(dir: &Path, name: &str) -> Vec<(i32, u64)> {
    fs::read_to_string(dir.join(format!("{name}.out")))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (p, n) = l.strip_prefix('p')?.split_once('-')?;
            Some((p.parse().ok()?, n.parse().ok()?))
        })
        .collect()
}

fn partitions_of(records: &[(i32, u64)]) -> BTreeSet<i32> {
    records.iter().map(|r| r.0).collect()
}

fn start_broker(dir: &Path) -> (Agent, String) {
    fs::create_dir_all(dir).unwrap();
    let port = free_port();
    let config = format!(
        "broker:\n  listen: 127.0.0.1:{port}\n  data_dir: ./broker\n  num_partitions: {PARTITIONS}\n  \
         group_consumer_session_timeout_ms: 6000\n  group_consumer_heartbeat_interval_ms: 500\n"
    );
    let mut agent = Agent::start(dir, &config);
    let bootstrap = format!("127.0.0.1:{port}");
    agent.wait_listening(&bootstrap, "the broker");
    (agent, bootstrap)
}

/// Produces `p{p}-{n}` round-robin over the partitions until `stop`; counts in `sent`.
fn producing(
    bootstrap: &str,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
) -> std::thread::JoinHandle<()> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .create()
        .unwrap();
    std::thread::spawn(move || {
        let mut n = 0u64;
        while !stop.load(Ordering::SeqCst) {
            let p = (n % PARTITIONS as u64) as i32;
            let value = format!("p{p}-{n}");
            loop {
                match producer.send(
                    BaseRecord::<(), _>::to("orders")
                        .partition(p)
                        .payload(&value),
                ) {
                    Ok(()) => break,
                    Err(_) => {
                        producer.poll(Duration::from_millis(50));
                    }
                }
            }
            n += 1;
            producer.poll(Duration::ZERO);
            std::thread::sleep(Duration::from_millis(5));
        }
        producer.flush(Duration::from_secs(30)).unwrap();
        sent.store(n, Ordering::SeqCst);
    })
}

/// Waits until, over the records printed in a recent window, each of `names` reads exactly
/// `each` partitions and all of them together every partition; returns where the windows began.
fn wait_split(dir: &Path, names: &[&str], each: usize) -> Vec<usize> {
    let mut marks = vec![0usize; names.len()];
    wait_until(
        Duration::from_secs(60),
        "the partitions to be split evenly",
        || {
            let now: Vec<Vec<(i32, u64)>> = names.iter().map(|n| printed(dir, n)).collect();
            let windows: Vec<BTreeSet<i32>> = (0..names.len())
                .map(|i| partitions_of(&now[i][marks[i].min(now[i].len())..]))
                .collect();
            let ok = windows.iter().all(|w| w.len() == each)
                && windows.iter().flatten().collect::<BTreeSet<_>>().len() == PARTITIONS as usize
                && now.iter().zip(&marks).all(|(r, m)| r.len() > m + 30);
            if !ok {
                std::thread::sleep(Duration::from_millis(1500));
                for (mark, r) in marks.iter_mut().zip(&now) {
                    *mark = r.len();
                }
            }
            ok
        },
    );
    marks
}

#[test]
fn three_consumer_protocol_members_split_partitions_and_survive_a_sigkill() {
    let tmp = tempfile::tempdir().unwrap();
    let dir: PathBuf = tmp.path().to_owned();
    let (mut broker, bootstrap) = start_broker(&dir.join("agent"));
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let producer = producing(&bootstrap, stop.clone(), sent.clone());
    let names = ["c0", "c1", "c2"];
    let mut children: Vec<Child> = names
        .iter()
        .map(|n| consumer(&dir, n, &bootstrap, "g848", true))
        .collect();
    // A classic group on the same topic, side by side.
    let mut classic = consumer(&dir, "classic", &bootstrap, "gclassic", false);
    // Each member ends up with two partitions: what each printed over a recent window.
    let marks = wait_split(&dir, &names, 2);
    let killed_parts = partitions_of(&printed(&dir, "c0")[marks[0]..]);
    for (i, n) in names.iter().enumerate() {
        eprintln!(
            "{n}: partitions {:?}",
            partitions_of(&printed(&dir, n)[marks[i]..])
        );
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(children[0].id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    children[0].wait().unwrap();
    // During the 6 s session timeout the survivors keep receiving their own partitions.
    let before: Vec<usize> = [1, 2]
        .iter()
        .map(|i| printed(&dir, names[*i]).len())
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    for (k, i) in [1, 2].iter().enumerate() {
        assert!(
            printed(&dir, names[*i]).len() > before[k] + 20,
            "{} stopped receiving records during the rebalance",
            names[*i]
        );
    }
    // Then they take over the killed member's partitions (three each), without stopping.
    let marks = wait_split(&dir, &names[1..], 3);
    let taken: BTreeSet<i32> = [0, 1]
        .iter()
        .flat_map(|i| partitions_of(&printed(&dir, names[i + 1])[marks[*i]..]))
        .collect();
    assert!(killed_parts.is_subset(&taken));
    let log = broker.log();
    assert!(log.contains("session timed out"), "{log}");
    stop.store(true, Ordering::SeqCst);
    producer.join().unwrap();
    let total = sent.load(Ordering::SeqCst);
    wait_until(Duration::from_secs(60), "every record consumed", || {
        let seen: BTreeSet<u64> = names
            .iter()
            .flat_map(|n| printed(&dir, n))
            .map(|r| r.1)
            .collect();
        seen.len() as u64 == total
    });
    // No loss; duplicates only of what the killed member had printed.
    let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
    for n in names {
        for r in printed(&dir, n) {
            *counts.entry(r.1).or_default() += 1;
        }
    }
    eprintln!(
        "{total} records; printed by c0 {}, c1 {}, c2 {}; twice: {}",
        printed(&dir, "c0").len(),
        printed(&dir, "c1").len(),
        printed(&dir, "c2").len(),
        counts.values().filter(|c| **c > 1).count()
    );
    assert_eq!(counts.len() as u64, total);
    assert!((0..total).all(|n| counts.contains_key(&n)));
    let killed: BTreeSet<u64> = printed(&dir, "c0").into_iter().map(|r| r.1).collect();
    let survivors_dups: Vec<u64> = [1, 2]
        .iter()
        .flat_map(|i| {
            let mut seen = BTreeSet::new();
            printed(&dir, names[*i])
                .into_iter()
                .filter(move |r| !seen.insert(r.1))
                .map(|r| r.1)
        })
        .collect();
    assert!(
        survivors_dups.is_empty(),
        "a survivor printed records twice: {survivors_dups:?}"
    );
    for (n, c) in &counts {
        assert!(
            *c == 1 || (*c == 2 && killed.contains(n)),
            "record {n} printed {c} times"
        );
    }
    // The classic group read the same topic meanwhile.
    wait_until(
        Duration::from_secs(60),
        "the classic group to read everything",
        || {
            printed(&dir, "classic")
                .iter()
                .map(|r| r.1)
                .collect::<BTreeSet<_>>()
                .len() as u64
                == total
        },
    );
    let list = Command::new(env!("CARGO_BIN_EXE_agent"))
        .args(["groups", "--bootstrap-server", &bootstrap, "--list"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&list.stdout);
    assert!(
        listed.contains("g848") && listed.contains("gclassic"),
        "{listed}"
    );
    // `agent groups --describe` names the owner of every partition of the consumer-protocol
    // group (from ConsumerGroupDescribe): the two survivors, three partitions each.
    let described = Command::new(env!("CARGO_BIN_EXE_agent"))
        .args([
            "groups",
            "--bootstrap-server",
            &bootstrap,
            "--describe",
            "--group",
            "g848",
        ])
        .output()
        .unwrap();
    let described = String::from_utf8_lossy(&described.stdout);
    let rows: Vec<Vec<&str>> = described
        .lines()
        .skip(1)
        .filter(|l| l.starts_with("g848"))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 6, "{described}");
    let owners: BTreeSet<&str> = rows.iter().map(|r| r[6]).collect();
    assert_eq!(owners.len(), 2, "two owners: {described}");
    assert!(!owners.contains("-"), "{described}");
    for c in children.iter_mut().skip(1).chain([&mut classic]) {
        let _ = c.kill();
        let _ = c.wait();
    }
    broker.signal(nix::sys::signal::Signal::SIGTERM);
    broker.wait(Duration::from_secs(30));
}
