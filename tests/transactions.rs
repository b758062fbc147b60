//! Transactions through the bundled broker run by the real `agent` binary: a transactional
//! librdkafka producer keeps writing while the broker is SIGKILLed in the middle of a
//! transaction (half of its records in the log) and restarted, again and again, and
//! `agent transactions` describes a producer's transaction as kafka-transactions.sh does.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

use crate::harness::{Agent, Lcg, crash_seed, free_port, wait_until};

const PARTITIONS: i32 = 3;
/// Records per transaction, spread over the partitions.
const PER_TRANSACTION: usize = 12;
const KILLS: usize = 5;

/// Starts `agent run` on a pipeline holding only a `broker:` section on `port`, storing in
/// `dir/broker`, and waits for it to listen.
fn start_broker(dir: &Path, port: u16) -> Agent {
    let config = format!("broker:\n  listen: 127.0.0.1:{port}\n  data_dir: ./broker\n");
    let mut agent = Agent::start(dir, &config);
    agent.wait_listening(&format!("127.0.0.1:{port}"), "the broker");
    agent
}

fn client(bootstrap: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .set("log_level", "3");
    config
}

fn create_topic(bootstrap: &str, topic: &str) {
    let admin: AdminClient<DefaultClientContext> = client(bootstrap).create().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let results = runtime
        .block_on(admin.create_topics(
            [&NewTopic::new(
                topic,
                PARTITIONS,
                TopicReplication::Fixed(1),
            )],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        ))
        .unwrap();
    for result in results {
        result.unwrap();
    }
}

/// A transactional producer with `id`, initialised.
fn transactional_producer(bootstrap: &str, id: &str) -> Result<BaseProducer, KafkaError> {
    let producer: BaseProducer = client(bootstrap)
        .set("transactional.id", id)
        .set("linger.ms", "5")
        .set("reconnect.backoff.max.ms", "200")
        .create()?;
    producer.init_transactions(Duration::from_secs(10))?;
    Ok(producer)
}

/// Sends records `first..last` of transaction `t`: `t<t>-<i>`, record i to partition
/// i % PARTITIONS.
fn send_records(
    producer: &BaseProducer,
    topic: &str,
    t: usize,
    records: std::ops::Range<usize>,
) -> Result<(), KafkaError> {
    for i in records {
        let value = format!("t{t}-{i}");
        let record = BaseRecord::<(), str>::to(topic)
            .payload(&value)
            .partition((i % PARTITIONS as usize) as i32);
        producer.send(record).map_err(|(e, _)| e)?;
        producer.poll(Duration::ZERO);
    }
    Ok(())
}

/// What the writer thread knows, and the handshake that places each kill inside a transaction.
#[derive(Default)]
struct Written {
    /// Transactions whose commit_transaction returned Ok.
    committed: BTreeSet<usize>,
    /// Transactions left open when the broker was killed (their producer is then dropped).
    abandoned: BTreeSet<usize>,
    /// Transactions attempted (committed or not).
    attempted: usize,
    /// Set by the test: stop in the middle of the next transaction.
    kill_requested: bool,
    /// Set by the writer: a transaction is open and half of it is in the log.
    paused: bool,
    /// Set by the test: the broker was killed; go on.
    killed: bool,
}

/// Writes transactions one after the other until `stop`. When a kill is requested it pauses
/// inside a transaction, once half of its records are flushed to the broker; after the kill it
/// drops that producer and goes on with a new instance with the same transactional id, whose
/// initialisation fences the old one and must abort the open transaction. After any other
/// failure it also starts over with a new instance.
fn writer(bootstrap: String, topic: String, stop: Arc<AtomicBool>, written: Arc<Mutex<Written>>) {
    let mut producer: Option<BaseProducer> = None;
    let mut t = 0;
    while !stop.load(Ordering::SeqCst) {
        let current = match producer.take() {
            Some(p) => p,
            None => match transactional_producer(&bootstrap, "crash-writer") {
                Ok(p) => p,
                Err(_) => continue,
            },
        };
        written.lock().unwrap().attempted = t + 1;
        let half = PER_TRANSACTION / 2;
        let first_half = current
            .begin_transaction()
            .and_then(|()| send_records(&current, &topic, t, 0..half))
            .and_then(|()| current.flush(Duration::from_secs(10)));
        if first_half.is_ok() && written.lock().unwrap().kill_requested {
            written.lock().unwrap().paused = true;
            while !written.lock().unwrap().killed {
                std::thread::sleep(Duration::from_millis(5));
            }
            let mut w = written.lock().unwrap();
            w.abandoned.insert(t);
            (w.kill_requested, w.paused, w.killed) = (false, false, false);
            drop(w);
            drop(current);
            t += 1;
            continue;
        }
        let result = first_half
            .and_then(|()| send_records(&current, &topic, t, half..PER_TRANSACTION))
            .and_then(|()| current.commit_transaction(Duration::from_secs(10)));
        if result.is_ok() {
            written.lock().unwrap().committed.insert(t);
            producer = Some(current);
        }
        t += 1;
    }
}

/// Every record of `topic` a read_committed consumer sees, read to the end of each partition.
fn read_committed(bootstrap: &str, topic: &str) -> Vec<String> {
    let consumer: BaseConsumer = client(bootstrap)
        .set("group.id", "crash-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .create()
        .unwrap();
    let mut assignment = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        assignment
            .add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&assignment).unwrap();
    let mut at_end = HashSet::new();
    let mut values = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while at_end.len() < PARTITIONS as usize {
        assert!(
            Instant::now() < deadline,
            "read_committed did not reach the end of {topic}: {at_end:?}"
        );
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                at_end.remove(&m.partition());
                values.push(String::from_utf8(m.payload().unwrap().to_vec()).unwrap());
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => panic!("consume error: {e}"),
            None => {}
        }
    }
    values
}

#[test]
fn transactions_are_whole_or_absent_after_broker_kills() {
    let seed = crash_seed();
    let mut rng = Lcg(seed);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let bootstrap = format!("127.0.0.1:{port}");
    let mut broker = start_broker(dir.path(), port);
    let topic = "crash-txns";
    create_topic(&bootstrap, topic);

    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(Mutex::new(Written::default()));
    let thread = {
        let (bootstrap, topic) = (bootstrap.clone(), topic.to_owned());
        let (stop, written) = (Arc::clone(&stop), Arc::clone(&written));
        std::thread::spawn(move || writer(bootstrap, topic, stop, written))
    };
    let committed_count = || written.lock().unwrap().committed.len();
    for kill in 0..KILLS {
        // Each run commits something, then dies in the middle of a transaction.
        let before = committed_count();
        wait_until(
            Duration::from_secs(30),
            &format!("a transaction committed before kill {kill}"),
            || committed_count() > before,
        );
        written.lock().unwrap().kill_requested = true;
        wait_until(
            Duration::from_secs(30),
            &format!("the writer inside a transaction for kill {kill}"),
            || written.lock().unwrap().paused,
        );
        // The records of the open transaction are in the log; also vary when the kill lands
        // relative to the broker's own background work.
        std::thread::sleep(Duration::from_millis(rng.next_below(100)));
        broker.signal(Signal::SIGKILL);
        broker.wait(Duration::from_secs(10));
        written.lock().unwrap().killed = true;
        broker = start_broker(dir.path(), port);
    }
    let before = committed_count();
    wait_until(
        Duration::from_secs(30),
        "a transaction committed after the last restart",
        || committed_count() > before,
    );
    stop.store(true, Ordering::SeqCst);
    thread.join().unwrap();
    let written = written.lock().unwrap();
    assert_eq!(written.abandoned.len(), KILLS);

    let mut by_transaction: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for value in read_committed(&bootstrap, topic) {
        let (t, i) = value[1..].split_once('-').unwrap();
        by_transaction
            .entry(t.parse().unwrap())
            .or_default()
            .push(i.parse().unwrap());
    }
    for (t, mut records) in by_transaction.clone() {
        records.sort_unstable();
        assert_eq!(
            records,
            (0..PER_TRANSACTION).collect::<Vec<_>>(),
            "transaction {t} is not whole (or repeated)"
        );
        assert!(t < written.attempted, "transaction {t} was never written");
    }
    for t in &written.committed {
        assert!(
            by_transaction.contains_key(t),
            "transaction {t} was committed but is missing"
        );
    }
    for t in &written.abandoned {
        assert!(
            !by_transaction.contains_key(t),
            "transaction {t} was never committed (its producer was dropped half-way) but is visible"
        );
    }
    println!(
        "{} transactions attempted, {} committed, {} abandoned at a kill, {} visible",
        written.attempted,
        written.committed.len(),
        written.abandoned.len(),
        by_transaction.len()
    );
}

fn agent(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agent"))
        .args(args)
        .output()
        .unwrap()
}

/// The rows of a kafka-transactions.sh table: tab-separated cells, padding trimmed.
fn table(out: &Output) -> Vec<Vec<String>> {
    assert!(
        out.status.success(),
        "agent failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone())
        .unwrap()
        .lines()
        .map(|line| {
            let cells: Vec<&str> = line
                .strip_suffix('\t')
                .unwrap_or(line)
                .split('\t')
                .collect();
            cells.into_iter().map(|c| c.trim_end().to_owned()).collect()
        })
        .collect()
}

#[test]
fn transactions_tool_lists_and_describes_an_open_then_committed_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let bootstrap = format!("127.0.0.1:{port}");
    let _broker = start_broker(dir.path(), port);
    let topic = "described";
    create_topic(&bootstrap, topic);
    let producer = transactional_producer(&bootstrap, "described-writer").unwrap();
    producer.begin_transaction().unwrap();
    for p in [0, 2] {
        producer
            .send(BaseRecord::<(), str>::to(topic).payload("x").partition(p))
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();

    let b = bootstrap.as_str();
    let list = || table(&agent(&["transactions", "--bootstrap-server", b, "--list"]));
    let describe = || {
        table(&agent(&[
            "transactions",
            "--bootstrap-server",
            b,
            "--describe",
            "--transactional-id",
            "described-writer",
        ]))
    };
    let listed = list();
    assert_eq!(
        listed[0],
        [
            "TransactionalId",
            "Coordinator",
            "ProducerId",
            "TransactionState"
        ]
    );
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert_eq!(listed[1][0], "described-writer");
    assert_eq!(listed[1][1], "0");
    let producer_id = listed[1][2].clone();
    assert!(producer_id.parse::<i64>().unwrap() >= 0, "{listed:?}");
    assert_eq!(listed[1][3], "Ongoing");

    let described = describe();
    assert_eq!(
        described[0],
        [
            "CoordinatorId",
            "TransactionalId",
            "ProducerId",
            "ProducerEpoch",
            "TransactionState",
            "TransactionTimeoutMs",
            "CurrentTransactionStartTimeMs",
            "TransactionDurationMs",
            "TopicPartitions"
        ]
    );
    let row = &described[1];
    assert_eq!(row[..2], ["0", "described-writer"]);
    assert_eq!(row[2], producer_id);
    assert!(row[3].parse::<i16>().unwrap() >= 0, "{row:?}");
    assert_eq!(row[4], "Ongoing");
    // librdkafka's default transaction.timeout.ms.
    assert_eq!(row[5], "60000");
    assert!(row[6].parse::<i64>().unwrap() > 0, "{row:?}");
    assert!(row[7].parse::<i64>().unwrap() >= 0, "{row:?}");
    assert_eq!(row[8], "described-0,described-2");

    producer
        .commit_transaction(Duration::from_secs(10))
        .unwrap();
    let described = describe();
    assert_eq!(described[1][4], "CompleteCommit", "{described:?}");
    assert_eq!(described[1].get(8).map_or("", String::as_str), "");
    assert_eq!(list()[1][3], "CompleteCommit");

    let unknown = agent(&[
        "transactions",
        "--bootstrap-server",
        b,
        "--describe",
        "--transactional-id",
        "nobody",
    ]);
    assert_eq!(unknown.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert!(
        stderr.contains("`nobody`") && stderr.contains("TransactionalIdNotFound"),
        "{stderr}"
    );
}

/// Kafka's subcommands: `describe-producers` shows the open transaction's start offset,
/// `find-hanging` leaves alone a transaction its coordinator counts, and `abort
/// --start-offset` writes the ABORT marker (WriteTxnMarkers), which closes it on the partition
/// and lets read_committed consumers past it.
#[test]
fn transactions_tool_describes_producers_finds_hanging_and_aborts() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let bootstrap = format!("127.0.0.1:{port}");
    let _broker = start_broker(dir.path(), port);
    let topic = "producers";
    create_topic(&bootstrap, topic);
    let b = bootstrap.as_str();
    // Two committed plain records first: the transaction starts at offset 2.
    let plain: BaseProducer = client(b).create().unwrap();
    for _ in 0..2 {
        plain
            .send(
                BaseRecord::<(), str>::to(topic)
                    .payload("plain")
                    .partition(0),
            )
            .map_err(|(e, _)| e)
            .unwrap();
    }
    plain.flush(Duration::from_secs(10)).unwrap();
    let producer = transactional_producer(b, "stuck-writer").unwrap();
    producer.begin_transaction().unwrap();
    producer
        .send(
            BaseRecord::<(), str>::to(topic)
                .payload("open")
                .partition(0),
        )
        .map_err(|(e, _)| e)
        .unwrap();
    producer.flush(Duration::from_secs(10)).unwrap();

    let tool = |args: &[&str]| {
        let mut all = vec!["transactions", "--bootstrap-server", b];
        all.extend_from_slice(args);
        table(&agent(&all))
    };
    let describe = || tool(&["describe-producers", "--topic", topic, "--partition", "0"]);
    let described = describe();
    assert_eq!(
        described[0],
        [
            "ProducerId",
            "ProducerEpoch",
            "LatestCoordinatorEpoch",
            "LastSequence",
            "LastTimestamp",
            "CurrentTransactionStartOffset"
        ]
    );
    let listed = tool(&["list"]);
    let producer_id = &listed[1][2];
    let row = described
        .iter()
        .find(|r| &r[0] == producer_id)
        .unwrap_or_else(|| panic!("{described:?}"));
    assert_eq!(row[3], "0", "one record, sequence 0: {row:?}");
    assert!(row[4].parse::<i64>().unwrap() > 0, "{row:?}");
    assert_eq!(row[5], "2", "{row:?}");

    // Open for longer than 0 minutes, but counted by its coordinator: not hanging.
    let hanging = tool(&[
        "find-hanging",
        "--topic",
        topic,
        "--max-transaction-timeout",
        "0",
    ]);
    assert_eq!(hanging.len(), 1, "{hanging:?}");
    assert_eq!(
        hanging[0],
        [
            "Topic",
            "Partition",
            "ProducerId",
            "ProducerEpoch",
            "CoordinatorEpoch",
            "StartOffset",
            "LastTimestamp",
            "Duration(min)"
        ]
    );
    let refused = agent(&["transactions", "--bootstrap-server", b, "find-hanging"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--topic or --broker-id"));

    let wrong = agent(&[
        "transactions",
        "--bootstrap-server",
        b,
        "abort",
        "--topic",
        topic,
        "--partition",
        "0",
        "--start-offset",
        "1",
    ]);
    assert_eq!(wrong.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&wrong.stderr)
            .contains("Could not find any open transactions starting at offset 1"),
        "{}",
        String::from_utf8_lossy(&wrong.stderr)
    );
    tool(&[
        "abort",
        "--topic",
        topic,
        "--partition",
        "0",
        "--start-offset",
        "2",
    ]);
    let row = describe()
        .into_iter()
        .find(|r| &r[0] == producer_id)
        .unwrap();
    assert_eq!(row[5], "None", "closed on the partition: {row:?}");

    // A read_committed consumer now reads past the aborted record: the plain two, then the
    // end at 4 (the record and its marker).
    let consumer: BaseConsumer = client(b)
        .set("group.id", "after-abort")
        .set("isolation.level", "read_committed")
        .create()
        .unwrap();
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&assignment).unwrap();
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.len() < 2 && Instant::now() < deadline {
        if let Some(message) = consumer.poll(Duration::from_millis(200)) {
            let message = message.unwrap();
            seen.push(String::from_utf8_lossy(message.payload().unwrap()).into_owned());
        }
    }
    assert_eq!(seen, ["plain", "plain"]);
    // Past the aborted record and its marker: without the abort it would stop at 2, the
    // last stable offset.
    let position = || {
        let positions = consumer.position().unwrap();
        positions.find_partition(topic, 0).unwrap().offset()
    };
    wait_until(
        Duration::from_secs(20),
        "the consumer to pass the marker",
        || {
            assert!(consumer.poll(Duration::from_millis(100)).is_none());
            position() == Offset::Offset(4)
        },
    );
}

#[test]
fn transactions_tool_names_an_unreachable_broker() {
    let port = free_port();
    let out = agent(&[
        "transactions",
        "--bootstrap-server",
        &format!("127.0.0.1:{port}"),
        "--list",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("cannot connect to broker 127.0.0.1:{port}")),
        "{stderr}"
    );
}

#[test]
fn dump_log_segments_shows_producers_markers_and_aborted_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let bootstrap = format!("127.0.0.1:{port}");
    let _broker = start_broker(dir.path(), port);
    let topic = "dumped";
    create_topic(&bootstrap, topic);
    let producer = transactional_producer(&bootstrap, "dumped-writer").unwrap();
    for (t, commit) in [(0, true), (1, false)] {
        producer.begin_transaction().unwrap();
        for i in 0..2 {
            let value = format!("t{t}-{i}");
            producer
                .send(
                    BaseRecord::<(), str>::to(topic)
                        .payload(&value)
                        .partition(0),
                )
                .map_err(|(e, _)| e)
                .unwrap();
        }
        producer.flush(Duration::from_secs(10)).unwrap();
        if commit {
            producer
                .commit_transaction(Duration::from_secs(10))
                .unwrap();
        } else {
            producer.abort_transaction(Duration::from_secs(10)).unwrap();
        }
    }
    // Offsets: t0 at 0 and 1, its COMMIT marker at 2, t1 at 3 and 4, its ABORT marker at 5.
    let partition = dir.path().join("broker").join(format!("{topic}-0"));
    let log = partition.join("00000000000000000000.log");
    let index = partition.join("00000000000000000000.txnindex");
    wait_until(Duration::from_secs(10), "the .txnindex", || index.exists());
    let files = format!("{},{}", log.display(), index.display());
    let out = agent(&["dump-log-segments", "--files", &files, "--print-data-log"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let field = |line: &str, name: &str| -> String {
        let at = line.find(&format!(" {name}: ")).unwrap();
        line[at + name.len() + 3..]
            .split(' ')
            .next()
            .unwrap()
            .to_owned()
    };
    let batches: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("baseOffset:"))
        .collect();
    let producer_id = field(batches[0], "producerId");
    assert!(producer_id.parse::<i64>().unwrap() >= 0, "{text}");
    for batch in &batches {
        assert_eq!(field(batch, "producerId"), producer_id, "{batch}");
        assert_eq!(field(batch, "isTransactional"), "true", "{batch}");
    }
    let markers: Vec<&&str> = batches
        .iter()
        .filter(|b| field(b, "isControl") == "true")
        .collect();
    assert_eq!(markers.len(), 2, "{text}");
    assert!(
        markers[0].starts_with("baseOffset: 2 lastOffset: 2 count: 1 "),
        "{text}"
    );
    assert!(
        markers[1].starts_with("baseOffset: 5 lastOffset: 5 count: 1 "),
        "{text}"
    );
    assert_eq!(field(markers[0], "baseSequence"), "-1", "{text}");
    let records: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("| offset:"))
        .collect();
    assert_eq!(records.len(), 6, "{text}");
    assert!(records[0].ends_with(" payload: t0-0"), "{text}");
    assert!(
        records[2].contains(" endTxnMarker: COMMIT coordinatorEpoch: "),
        "{text}"
    );
    assert!(records[4].ends_with(" payload: t1-1"), "{text}");
    assert!(
        records[5].contains(" endTxnMarker: ABORT coordinatorEpoch: "),
        "{text}"
    );
    let aborted: Vec<&str> = text.lines().filter(|l| l.starts_with("version:")).collect();
    assert_eq!(
        aborted,
        [format!(
            "version: 0 producerId: {producer_id} firstOffset: 3 lastOffset: 5 lastStableOffset: 6"
        )],
        "{text}"
    );
}
