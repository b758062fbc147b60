"""Topic configs against a running ferry broker, as Kafka applies them: the topic's
compression.type (every codec, read back by confluent-kafka and kafka-python), LogAppendTime,
min.insync.replicas, list configs altered with APPEND and SUBTRACT, the configs Kafka accepts
without an effect here, and errors that name the config.

BOOTSTRAP names the broker, e.g. BOOTSTRAP=127.0.0.1:9092 (scripts/test starts one).
"""

import os
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition, OFFSET_BEGINNING
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)
from kafka import KafkaConsumer, KafkaProducer
from kafka.structs import TopicPartition as KpTopicPartition

BOOTSTRAP = os.environ.get("BOOTSTRAP")
pytestmark = pytest.mark.skipif(not BOOTSTRAP, reason="BOOTSTRAP is not set")

COUNT = 500
CODECS = ["uncompressed", "gzip", "snappy", "lz4", "zstd"]


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def value(i):
    # Compressible and distinct: a codec that mangled records would show.
    return (f"record-{i:05}-" * 20).encode()


_ADMIN = []


def admin():
    # One client for the module: a future fails when its client is destroyed before it ends.
    if not _ADMIN:
        _ADMIN.append(AdminClient({"bootstrap.servers": BOOTSTRAP}))
    return _ADMIN[0]


def create(topic, config):
    futures = admin().create_topics([NewTopic(topic, 1, 1, config=config)])
    futures[topic].result(timeout=10)


def describe(topic):
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return admin().describe_configs([resource])[resource].result(timeout=10)


def ck_read(topic, expected, timeout=30):
    consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": unique("g"), "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    out = []
    deadline = time.time() + timeout
    while len(out) < expected and time.time() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        assert msg.error() is None, msg.error()
        out.append(msg)
    consumer.close()
    return out


def kp_read(topic, expected, timeout=30):
    consumer = KafkaConsumer(bootstrap_servers=BOOTSTRAP, enable_auto_commit=False, consumer_timeout_ms=2000)
    tp = KpTopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    out = []
    deadline = time.time() + timeout
    while len(out) < expected and time.time() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            out.extend(records)
    consumer.close()
    return out


@pytest.mark.parametrize("topic_codec", CODECS)
@pytest.mark.parametrize("producer_codec", ["none", "gzip", "zstd"])
def test_topic_compression_is_applied_and_read_back_by_both_clients(topic_codec, producer_codec):
    topic = unique(f"codec-{topic_codec}")
    create(topic, {"compression.type": topic_codec})
    assert describe(topic)["compression.type"].value == topic_codec
    producer = Producer(
        {"bootstrap.servers": BOOTSTRAP, "acks": "all", "compression.type": producer_codec, "linger.ms": 5}
    )
    for i in range(COUNT):
        producer.produce(topic, key=str(i).encode(), value=value(i), headers=[("n", str(i).encode())],
                         timestamp=1_700_000_000_000 + i)
        producer.poll(0)
    assert producer.flush(30) == 0

    records = ck_read(topic, COUNT)
    assert [m.offset() for m in records] == list(range(COUNT))
    assert [m.value() for m in records] == [value(i) for i in range(COUNT)]
    assert [m.key() for m in records] == [str(i).encode() for i in range(COUNT)]
    assert [m.headers() for m in records] == [[("n", str(i).encode())] for i in range(COUNT)]
    assert [m.timestamp()[1] for m in records] == [1_700_000_000_000 + i for i in range(COUNT)]

    records = kp_read(topic, COUNT)
    assert [r.offset for r in records] == list(range(COUNT))
    assert [r.value for r in records] == [value(i) for i in range(COUNT)]
    assert [r.timestamp for r in records] == [1_700_000_000_000 + i for i in range(COUNT)]


def test_kafka_python_producer_into_a_recompressing_topic():
    topic = unique("codec-kp")
    create(topic, {"compression.type": "lz4"})
    producer = KafkaProducer(bootstrap_servers=BOOTSTRAP, acks="all", compression_type="snappy")
    for i in range(COUNT):
        producer.send(topic, value=value(i), partition=0)
    producer.flush(30)
    producer.close()
    assert [m.value() for m in ck_read(topic, COUNT)] == [value(i) for i in range(COUNT)]


def test_log_append_time_stamps_records_with_the_brokers_time():
    topic = unique("append-time")
    create(topic, {"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    producer = Producer({"bootstrap.servers": BOOTSTRAP, "acks": "all"})
    for i in range(10):
        producer.produce(topic, value=value(i), timestamp=1_000 + i)
    assert producer.flush(10) == 0
    after = int(time.time() * 1000)
    records = ck_read(topic, 10)
    assert len(records) == 10
    for m in records:
        kind, ts = m.timestamp()
        assert kind == 2, "TIMESTAMP_LOG_APPEND_TIME"
        assert before - 1000 <= ts <= after + 1000, (before, ts, after)
    records = kp_read(topic, 10)
    assert all(r.timestamp_type == 1 and before - 1000 <= r.timestamp <= after + 1000 for r in records)


def test_min_insync_replicas_above_one_refuses_acks_all_only():
    topic = unique("min-isr")
    create(topic, {"min.insync.replicas": "2"})
    errors = []
    strict = Producer({"bootstrap.servers": BOOTSTRAP, "acks": "all", "message.timeout.ms": 3000,
                       "enable.idempotence": False, "retries": 0})
    strict.produce(topic, value=b"x", on_delivery=lambda err, _m: errors.append(err))
    strict.flush(10)
    assert len(errors) == 1 and errors[0] is not None
    assert errors[0].name() in ("NOT_ENOUGH_REPLICAS", "_MSG_TIMED_OUT"), errors[0]
    loose = Producer({"bootstrap.servers": BOOTSTRAP, "acks": "1"})
    delivered = []
    loose.produce(topic, value=b"y", on_delivery=lambda err, _m: delivered.append(err))
    loose.flush(10)
    assert delivered == [None]


def test_list_configs_are_appended_to_and_subtracted_from():
    topic = unique("append")
    create(topic, {})
    client = admin()

    def alter(name, value, op):
        change = ConfigResource(ConfigResource.Type.TOPIC, topic,
                                incremental_configs=[ConfigEntry(name, value, incremental_operation=op)])
        client.incremental_alter_configs([change])[change].result(timeout=10)

    alter("leader.replication.throttled.replicas", "0:1", AlterConfigOpType.APPEND)
    alter("leader.replication.throttled.replicas", "1:1,0:1", AlterConfigOpType.APPEND)
    assert describe(topic)["leader.replication.throttled.replicas"].value == "0:1,1:1"
    alter("leader.replication.throttled.replicas", "0:1", AlterConfigOpType.SUBTRACT)
    assert describe(topic)["leader.replication.throttled.replicas"].value == "1:1"
    # APPEND applies to list configs only, and the error names the config.
    with pytest.raises(KafkaException) as refused:
        alter("retention.ms", "5", AlterConfigOpType.APPEND)
    assert "retention.ms" in str(refused.value)


def test_every_kafka_topic_config_is_accepted_and_described():
    topic = unique("all-configs")
    accepted = {
        "message.format.version": "3.0-IV1",
        "message.downconversion.enable": "false",
        "preallocate": "true",
        "segment.index.bytes": "1048576",
        "segment.jitter.ms": "100",
        "file.delete.delay.ms": "1000",
        "unclean.leader.election.enable": "true",
        "compression.zstd.level": "9",
        "message.timestamp.after.max.ms": "3600000",
        "local.retention.ms": "-2",
    }
    create(topic, accepted)
    described = describe(topic)
    for name, want in accepted.items():
        assert described[name].value == want, name
    # Defaults are described too, as Kafka does.
    assert described["min.insync.replicas"].value == "1"
    assert described["compression.gzip.level"].value == "-1"


@pytest.mark.parametrize(
    "name,value",
    [("compression.type", "brotli"), ("no.such.config", "1"), ("remote.storage.enable", "true"),
     ("compression.lz4.level", "99"), ("message.timestamp.type", "Sometime")],
)
def test_a_refused_topic_config_names_its_key(name, value):
    topic = unique("refused")
    futures = admin().create_topics([NewTopic(topic, 1, 1, config={name: value})])
    with pytest.raises(KafkaException) as refused:
        futures[topic].result(timeout=10)
    assert name in str(refused.value), refused.value
    assert topic not in admin().list_topics(timeout=10).topics


def test_kafka_python_describes_log_dirs_with_partition_sizes():
    from kafka import KafkaAdminClient

    topic = unique("log-dirs")
    create(topic, {})
    producer = Producer({"bootstrap.servers": BOOTSTRAP, "acks": "all"})
    for i in range(100):
        producer.produce(topic, value=value(i), partition=0)
    assert producer.flush(10) == 0
    client = KafkaAdminClient(bootstrap_servers=BOOTSTRAP)
    try:
        brokers = client.describe_log_dirs(topic_partitions={topic: [0]})
    finally:
        client.close()
    assert len(brokers) == 1
    (log_dir,) = brokers[0]["log_dirs"]
    assert log_dir["error_code"] == 0
    assert log_dir["log_dir"].startswith("/")
    (described,) = log_dir["topics"]
    assert described["name"] == topic
    (partition,) = described["partitions"]
    assert partition["partition_index"] == 0
    # 100 values of 260 bytes, with their record and batch headers.
    assert 26_000 < partition["partition_size"] < 40_000, partition
