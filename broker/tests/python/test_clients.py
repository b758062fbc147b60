"""Python Kafka clients (confluent-kafka and kafka-python) against a running ferry broker.

BOOTSTRAP names the broker, e.g. BOOTSTRAP=127.0.0.1:9092. Start one with
`cargo run -p ferry-broker --example serve -- --listen 127.0.0.1:9092 --data-dir DIR`.
"""

import os
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition, OFFSET_BEGINNING
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
)
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic as KpNewTopic
from kafka.structs import TopicPartition as KpTopicPartition

BOOTSTRAP = os.environ.get("BOOTSTRAP")
pytestmark = pytest.mark.skipif(not BOOTSTRAP, reason="BOOTSTRAP is not set")

COUNT = 2000
PARTITIONS = 3


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def payload(i):
    return f"value-{i}-".encode() + bytes(range(i % 256))


# confluent-kafka (librdkafka) -------------------------------------------------------------


def ck_create(admin, topic, partitions=PARTITIONS, config=None):
    futures = admin.create_topics([NewTopic(topic, partitions, 1, config=config or {})])
    futures[topic].result(timeout=10)


def ck_consume(topic, partitions, expected, timeout=30):
    consumer = Consumer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": unique("py"),
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    out = []
    deadline = time.time() + timeout
    while len(out) < expected and time.time() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        assert msg.error() is None, msg.error()
        out.append((msg.partition(), msg.offset(), msg.key(), msg.value()))
    consumer.close()
    return out


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_confluent_kafka_produces_and_consumes_from_beginning(compression):
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    topic = unique(f"ck-{compression}")
    ck_create(admin, topic)
    producer = Producer(
        {"bootstrap.servers": BOOTSTRAP, "acks": "all", "compression.type": compression, "linger.ms": 5}
    )
    errors = []
    for i in range(COUNT):
        producer.produce(topic, key=str(i).encode(), value=payload(i),
                         on_delivery=lambda err, _msg: err and errors.append(err))
        producer.poll(0)
    assert producer.flush(30) == 0
    assert errors == []
    records = ck_consume(topic, PARTITIONS, COUNT)
    assert len(records) == COUNT
    assert {int(k): v for _, _, k, v in records} == {i: payload(i) for i in range(COUNT)}
    per_partition = {}
    for p, offset, _, _ in sorted(records):
        assert offset == per_partition.get(p, 0)
        per_partition[p] = offset + 1


def test_confluent_kafka_lists_offsets_and_admins_topics():
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    topic = unique("ck-admin")
    ck_create(admin, topic, partitions=1, config={"retention.ms": "3600000"})
    producer = Producer({"bootstrap.servers": BOOTSTRAP, "linger.ms": 0})
    for i in range(10):
        producer.produce(topic, value=b"x", partition=0, timestamp=1_000_000 + i * 100)
        producer.flush(10)
    consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": unique("py"), "enable.auto.commit": False})
    assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, 10)
    found = consumer.offsets_for_times([TopicPartition(topic, 0, 1_000_450)], timeout=10)
    assert found[0].offset == 5
    consumer.close()

    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    described = admin.describe_configs([resource])[resource].result(timeout=10)
    assert described["retention.ms"].value == "3600000"

    change = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET)],
    )
    admin.incremental_alter_configs([change])[change].result(timeout=10)
    described = admin.describe_configs([resource])[resource].result(timeout=10)
    assert described["retention.ms"].value == "7200000"

    admin.create_partitions([NewPartitions(topic, 4)])[topic].result(timeout=10)
    assert len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == 4

    admin.delete_topics([topic])[topic].result(timeout=10)
    assert topic not in admin.list_topics(timeout=10).topics


# kafka-python -----------------------------------------------------------------------------


def test_kafka_python_produces_consumes_lists_offsets_and_admins_topics():
    admin = KafkaAdminClient(bootstrap_servers=BOOTSTRAP)
    topic = unique("kp")
    admin.create_topics([KpNewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])
    assert topic in admin.list_topics()

    # kafka-python 3 enables idempotence by default (InitProducerId, sequence numbers).
    producer = KafkaProducer(bootstrap_servers=BOOTSTRAP, acks="all")
    futures = [producer.send(topic, key=str(i).encode(), value=payload(i)) for i in range(COUNT)]
    producer.flush(30)
    for f in futures:
        f.get(timeout=10)
    producer.close()

    consumer = KafkaConsumer(bootstrap_servers=BOOTSTRAP, group_id=None, enable_auto_commit=False)
    partitions = [KpTopicPartition(topic, p) for p in range(PARTITIONS)]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    got = {}
    deadline = time.time() + 30
    while len(got) < COUNT and time.time() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            for r in records:
                got[int(r.key)] = r.value
    assert got == {i: payload(i) for i in range(COUNT)}

    end = consumer.end_offsets(partitions)
    begin = consumer.beginning_offsets(partitions)
    assert sum(end.values()) == COUNT
    assert all(v == 0 for v in begin.values())
    now_ms = int(time.time() * 1000)
    later = consumer.offsets_for_times({tp: now_ms + 3_600_000 for tp in partitions})
    assert all(v is None for v in later.values())
    consumer.close()

    admin.delete_topics([topic])
    deadline = time.time() + 10
    while topic in admin.list_topics() and time.time() < deadline:
        time.sleep(0.1)
    assert topic not in admin.list_topics()
    admin.close()
