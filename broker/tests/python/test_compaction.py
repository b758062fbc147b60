"""A compacted topic (cleanup.policy=compact) read by confluent-kafka and kafka-python after
the broker's cleaner ran: offsets keep their gaps, each key's last value is there, tombstones
stay (delete.retention.ms is a day), a committed transaction's records stay with their marker
and an aborted one's are gone.

BOOTSTRAP names the broker, e.g. BOOTSTRAP=127.0.0.1:9092; scripts/test starts one with
log_cleaner_backoff_ms: 200 so that passes come quickly.
"""

import os
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition, OFFSET_BEGINNING
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kafka.structs import TopicPartition as KpTopicPartition

BOOTSTRAP = os.environ.get("BOOTSTRAP")
pytestmark = pytest.mark.skipif(not BOOTSTRAP, reason="BOOTSTRAP is not set")

KEYS = 30
UPDATES = 3000


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def ck_read_all(topic):
    """Every record from the start to the high watermark, read_committed: (offset, key, value)."""
    consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": unique("g"), "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    out = []
    deadline = time.time() + 30
    while time.time() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            position = consumer.position([TopicPartition(topic, 0)])[0].offset
            if position >= high:
                break
            continue
        assert msg.error() is None, msg.error()
        out.append((msg.offset(), msg.key(), msg.value()))
    consumer.close()
    return out


def kp_read_all(topic):
    consumer = KafkaConsumer(bootstrap_servers=BOOTSTRAP, enable_auto_commit=False,
                             isolation_level="read_committed")
    tp = KpTopicPartition(topic, 0)
    consumer.assign([tp])
    high = consumer.end_offsets([tp])[tp]
    consumer.seek_to_beginning(tp)
    out = []
    deadline = time.time() + 30
    while consumer.position(tp) < high and time.time() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            out.extend((r.offset, r.key, r.value) for r in records)
    consumer.close()
    return out


def test_a_compacted_topic_is_read_by_both_clients_after_cleaning():
    topic = unique("compacted")
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    config = {"cleanup.policy": "compact", "segment.bytes": "16384", "min.cleanable.dirty.ratio": "0.01"}
    admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(timeout=10)

    acked = {}

    def delivered(err, msg):
        assert err is None, err
        acked[msg.offset()] = (msg.key(), msg.value())

    producer = Producer({"bootstrap.servers": BOOTSTRAP, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 5})
    for i in range(UPDATES):
        producer.produce(topic, key=f"k{i % KEYS}".encode(), value=(f"{i:06}-" * 10).encode(),
                         partition=0, on_delivery=delivered)
        producer.poll(0)
    for key in ("k0", "k1"):
        producer.produce(topic, key=key.encode(), value=None, partition=0, on_delivery=delivered)
    assert producer.flush(30) == 0

    txn = Producer({"bootstrap.servers": BOOTSTRAP, "transactional.id": unique("tx")})
    txn.init_transactions(10)
    txn.begin_transaction()
    txn.produce(topic, key=b"committed", value=b"yes", partition=0)
    txn.commit_transaction(10)
    txn.begin_transaction()
    txn.produce(topic, key=b"aborted", value=b"no", partition=0)
    txn.abort_transaction(10)

    # More updates roll the segments holding the tombstones and the transactions.
    for i in range(UPDATES, UPDATES + 1000):
        producer.produce(topic, key=f"k{2 + i % (KEYS - 2)}".encode(), value=(f"{i:06}-" * 10).encode(),
                         partition=0, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(30) == 0

    deadline = time.time() + 60
    while True:
        records = ck_read_all(topic)
        if len(records) < len(acked) // 3:
            break
        assert time.time() < deadline, f"not compacted: {len(records)} of {len(acked)} records"
        time.sleep(0.5)

    newest = {}
    for offset, (key, value) in sorted(acked.items()):
        newest[key] = (offset, value)
    for read in (ck_read_all, kp_read_all):
        records = read(topic)
        offsets = [r[0] for r in records]
        assert offsets == sorted(set(offsets)), f"{read.__name__}: offsets grow"
        assert len(records) < len(acked) // 3, f"{read.__name__}: compacted"
        plain = [r for r in records if r[1] not in (b"committed", b"aborted")]
        for offset, key, value in plain:
            assert acked[offset] == (key, value), f"{read.__name__}: the record at {offset}"
        for key, (offset, value) in newest.items():
            assert (offset, key, value) in plain, f"{read.__name__}: the newest {key} at {offset}"
        assert [(k, v) for _, k, v in records if k in (b"k0", b"k1")] == [(b"k0", None), (b"k1", None)], \
            f"{read.__name__}: the tombstones stay"
        assert [(k, v) for _, k, v in records if k in (b"committed", b"aborted")] == [(b"committed", b"yes")], \
            f"{read.__name__}: the committed transaction stays, the aborted one is gone"
