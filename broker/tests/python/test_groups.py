"""Consumer groups with Python clients (confluent-kafka and kafka-python) against a running
ferry broker: commit, close, resume from the committed offset in the same group; a new group
with auto.offset.reset=latest sees only new records, with earliest all of them.

BOOTSTRAP names the broker, as for test_clients.py. A restart of the broker in between is
covered by the Rust test `committed_offsets_survive_a_restart...` in broker/tests/it/groups.rs.
"""

import os
import time
import uuid

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, KafkaProducer
from kafka.structs import TopicPartition as KpTopicPartition

BOOTSTRAP = os.environ.get("BOOTSTRAP")
pytestmark = pytest.mark.skipif(not BOOTSTRAP, reason="BOOTSTRAP is not set")

PARTITIONS = 2


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def new_topic():
    topic = unique("py-groups")
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    futures = admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    futures[topic].result(timeout=10)
    return topic


def produce(topic, prefix, count):
    # kafka-python enables idempotence by default (InitProducerId, sequence numbers).
    producer = KafkaProducer(bootstrap_servers=BOOTSTRAP)
    for i in range(count):
        producer.send(topic, key=f"{prefix}{i}".encode(), value=b"v", partition=i % PARTITIONS)
    producer.flush()
    producer.close()


def ck_consumer(group, reset):
    return Consumer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": reset,
            "session.timeout.ms": 6000,
        }
    )


def ck_take(consumer, count, timeout=30, commit=True):
    keys = []
    deadline = time.time() + timeout
    while len(keys) < count and time.time() < deadline:
        msg = consumer.poll(0.2)
        if msg is None or msg.error():
            continue
        keys.append(msg.key().decode())
        if commit:
            consumer.commit(message=msg, asynchronous=False)
    return keys


def kp_consumer(topic, group, reset):
    return KafkaConsumer(
        topic,
        bootstrap_servers=BOOTSTRAP,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset=reset,
        session_timeout_ms=10000,
        heartbeat_interval_ms=500,
        max_poll_records=1,
    )


def kp_take(consumer, count, timeout=30):
    keys = []
    deadline = time.time() + timeout
    while len(keys) < count and time.time() < deadline:
        for records in consumer.poll(timeout_ms=200).values():
            for record in records:
                keys.append(record.key.decode())
                consumer.commit()
    return keys


def settle(consumer, poll):
    """Polls until the consumer owns every partition (a new group's first rebalance waits
    group.initial.rebalance.delay.ms) and a second more, so its offset reset is done before
    new records arrive. Returns what was read meanwhile."""
    extra = []
    deadline = time.time() + 20
    while len(consumer.assignment()) < PARTITIONS and time.time() < deadline:
        extra.extend(poll())
    quiet = time.time() + 1
    while time.time() < quiet:
        extra.extend(poll())
    return extra


def test_confluent_kafka_group_resumes_from_its_commits_and_new_groups_follow_auto_offset_reset():
    topic = new_topic()
    produce(topic, "a", 10)
    group = unique("ck")
    consumer = ck_consumer(group, "earliest")
    consumer.subscribe([topic])
    first = ck_take(consumer, 6)
    consumer.close()
    assert len(first) == 6

    consumer = ck_consumer(group, "earliest")
    consumer.subscribe([topic])
    rest = ck_take(consumer, 4)
    rest += settle(consumer, lambda: ck_take(consumer, 1, timeout=0.2))
    consumer.close()
    assert sorted(first + rest) == sorted(f"a{i}" for i in range(10))

    latest = ck_consumer(unique("ck-latest"), "latest")
    latest.subscribe([topic])
    assert settle(latest, lambda: ck_take(latest, 1, timeout=0.2, commit=False)) == []
    produce(topic, "b", 2)
    assert sorted(ck_take(latest, 2, commit=False)) == ["b0", "b1"]
    latest.close()

    earliest = ck_consumer(unique("ck-earliest"), "earliest")
    earliest.subscribe([topic])
    assert len(ck_take(earliest, 12, commit=False)) == 12
    earliest.close()


def test_kafka_python_group_resumes_from_its_commits_and_new_groups_follow_auto_offset_reset():
    topic = new_topic()
    produce(topic, "a", 10)
    group = unique("kp")
    consumer = kp_consumer(topic, group, "earliest")
    first = kp_take(consumer, 6)
    committed = sum(consumer.committed(KpTopicPartition(topic, p)) or 0 for p in range(PARTITIONS))
    consumer.close()
    assert len(first) == 6
    assert committed == 6

    consumer = kp_consumer(topic, group, "earliest")
    rest = kp_take(consumer, 4)
    rest += settle(consumer, lambda: kp_take(consumer, 1, timeout=0.2))
    consumer.close()
    assert sorted(first + rest) == sorted(f"a{i}" for i in range(10))

    latest = kp_consumer(topic, unique("kp-latest"), "latest")
    assert settle(latest, lambda: kp_take(latest, 1, timeout=0.2)) == []
    produce(topic, "b", 2)
    assert sorted(kp_take(latest, 2)) == ["b0", "b1"]
    latest.close()

    earliest = kp_consumer(topic, unique("kp-earliest"), "earliest")
    assert len(kp_take(earliest, 12)) == 12
    earliest.close()
