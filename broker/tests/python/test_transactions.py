"""Transactions with confluent-kafka against a running ferry broker: committed and aborted
transactions over three partitions as read_committed and read_uncommitted consumers see them,
and a consume-transform-produce loop (transform.py) killed with SIGKILL again and again that
still delivers every input record exactly once.

BOOTSTRAP names the broker, as for test_clients.py. TRANSFORM_SEED replays the kill moments of
a failed run (it is printed by the test).
"""

import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

BOOTSTRAP = os.environ.get("BOOTSTRAP")
pytestmark = pytest.mark.skipif(not BOOTSTRAP, reason="BOOTSTRAP is not set")

PARTITIONS = 3
TIMEOUT = 30
TRANSFORM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "transform.py")


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def new_topic(prefix, partitions=PARTITIONS):
    topic = unique(prefix)
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=10)
    return topic


def read_to_end(topic, isolation, partitions=PARTITIONS, timeout=TIMEOUT):
    """Every record from the beginning until each partition reports its end (for read_committed,
    the last stable offset): a list of (partition, offset, key, value)."""
    consumer = Consumer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": unique("py-reader"),
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    out = []
    at_end = set()
    deadline = time.time() + timeout
    while len(at_end) < partitions:
        assert time.time() < deadline, f"{isolation} read of {topic}: ended {at_end} ({len(out)} records)"
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        if msg.error():
            assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
            at_end.add(msg.partition())
            continue
        at_end.discard(msg.partition())
        out.append((msg.partition(), msg.offset(), msg.key(), msg.value()))
    consumer.close()
    return out


def test_read_committed_sees_committed_transactions_and_read_uncommitted_all_records():
    topic = new_topic("py-txn")
    producer = Producer({"bootstrap.servers": BOOTSTRAP, "transactional.id": unique("py-txn"), "linger.ms": 5})
    producer.init_transactions(TIMEOUT)
    committed, everything = [], []
    for t in range(6):
        producer.begin_transaction()
        values = [f"t{t}-{i}".encode() for i in range(30)]
        for i, value in enumerate(values):
            producer.produce(topic, value=value, partition=i % PARTITIONS)
        if t % 3 == 1:
            assert producer.flush(TIMEOUT) == 0
            producer.abort_transaction(TIMEOUT)
        else:
            producer.commit_transaction(TIMEOUT)
            committed += values
        everything += values

    read = read_to_end(topic, "read_committed")
    assert sorted(v for _, _, _, v in read) == sorted(committed)
    read = read_to_end(topic, "read_uncommitted")
    assert sorted(v for _, _, _, v in read) == sorted(everything)
    # One marker per transaction and partition sits in the log after the data.
    consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": unique("py-marks")})
    ends = [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(PARTITIONS)]
    consumer.close()
    assert ends == [60 + 6] * PARTITIONS


def lines_of(proc):
    """A queue of the lines `proc` prints, then None."""
    lines = queue.Queue()

    def pump():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


INPUT_RECORDS = 20000
KILLS = 5
COMMIT_EVERY = 200


def test_consume_transform_produce_is_exactly_once_across_kills():
    input_topic = new_topic("py-eos-in")
    output_topic = new_topic("py-eos-out")
    group = unique("py-eos")
    producer = Producer({"bootstrap.servers": BOOTSTRAP, "linger.ms": 20, "enable.idempotence": True})
    for i in range(INPUT_RECORDS):
        producer.produce(input_topic, key=str(i).encode(), value=str(i).encode(), partition=i % PARTITIONS)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(TIMEOUT) == 0

    seed = int(os.environ.get("TRANSFORM_SEED", time.time_ns()))
    print(f"TRANSFORM_SEED={seed}")
    rng = random.Random(seed)
    args = [sys.executable, TRANSFORM, BOOTSTRAP, input_topic, output_topic, group, unique("py-eos"), str(COMMIT_EVERY)]
    kills = 0
    deadline = time.time() + 120
    while True:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        lines = lines_of(proc)
        if kills < KILLS:
            # Killed after 1 to 3 commits, a moment into the next transaction.
            commits = rng.randint(1, 3)
            while commits > 0:
                line = lines.get(timeout=max(deadline - time.time(), 1))
                if line is None:
                    break
                commits -= line.startswith("committed")
            if commits == 0:
                time.sleep(rng.uniform(0, 0.05))
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                kills += 1
                continue
        returncode = proc.wait(timeout=max(deadline - time.time(), 1))
        assert returncode == 0, f"transform.py exited with {returncode}"
        break
    assert kills >= KILLS, f"the transform finished after only {kills} kills: make the input larger"

    read = read_to_end(output_topic, "read_committed")
    values = sorted(int(v[len(b"out:"):]) for _, _, _, v in read)
    assert len(values) == len(set(values)), f"{len(values) - len(set(values))} records were written twice"
    assert values == list(range(INPUT_RECORDS))
    # Each output record sits in the partition of its input record.
    assert all(int(k) % PARTITIONS == p for p, _, k, _ in read)
