"""DeleteRecords against a running ferry broker, from confluent-kafka's AdminClient.delete_records
and kafka-python's KafkaAdminClient.delete_records: the low watermark each answers, consumers of
both starting there, an offset past the high watermark refused, OFFSET_END (-1) emptying the
partition.

BOOTSTRAP names the broker, e.g. BOOTSTRAP=127.0.0.1:9092 (scripts/test starts one).
"""

import os
import uuid

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kafka.admin import KafkaAdminClient
from kafka.structs import TopicPartition as KpTopicPartition

BOOTSTRAP = os.environ.get("BOOTSTRAP")
pytestmark = pytest.mark.skipif(not BOOTSTRAP, reason="BOOTSTRAP is not set")


def make_topic():
    """A topic of one partition whose segments hold a few records, with v0..v9 in it, one batch
    each."""
    topic = f"trim-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    admin.create_topics([NewTopic(topic, 1, 1, config={"segment.bytes": "280"})])[topic].result(
        timeout=10
    )
    producer = Producer({"bootstrap.servers": BOOTSTRAP, "linger.ms": 0})
    for i in range(10):
        producer.produce(topic, value=f"v{i}".encode(), partition=0)
        assert producer.flush(10) == 0
    return admin, topic


def first_offset(topic):
    consumer = Consumer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        for _ in range(100):
            message = consumer.poll(0.2)
            if message is not None:
                assert message.error() is None, message.error()
                return message.offset(), message.value()
        raise AssertionError("no record")
    finally:
        consumer.close()


def test_confluent_kafka_delete_records_moves_the_low_watermark():
    admin, topic = make_topic()
    futures = admin.delete_records([TopicPartition(topic, 0, 6)])
    (deleted,) = [f.result(timeout=10) for f in futures.values()]
    assert deleted.low_watermark == 6
    assert first_offset(topic) == (6, b"v6")

    # Past the high watermark: refused, nothing moves.
    futures = admin.delete_records([TopicPartition(topic, 0, 11)])
    with pytest.raises(KafkaException) as refused:
        list(futures.values())[0].result(timeout=10)
    assert refused.value.args[0].code() == KafkaError.OFFSET_OUT_OF_RANGE
    assert first_offset(topic) == (6, b"v6")

    futures = admin.delete_records([TopicPartition(topic, 0, OFFSET_END)])
    assert list(futures.values())[0].result(timeout=10).low_watermark == 10


def test_kafka_python_delete_records_moves_the_low_watermark():
    _, topic = make_topic()
    admin = KafkaAdminClient(bootstrap_servers=BOOTSTRAP)
    try:
        tp = KpTopicPartition(topic, 0)
        result = admin.delete_records({tp: 4})
        assert result[tp]["low_watermark"] == 4
        assert result[tp]["error_code"] == 0

        consumer = KafkaConsumer(bootstrap_servers=BOOTSTRAP, enable_auto_commit=False)
        try:
            consumer.assign([tp])
            consumer.seek_to_beginning(tp)
            assert consumer.position(tp) == 4
            assert consumer.beginning_offsets([tp]) == {tp: 4}
            records = consumer.poll(timeout_ms=10000, max_records=1)
            assert [r.offset for r in records[tp]] == [4]
            assert records[tp][0].value == b"v4"
        finally:
            consumer.close()

        with pytest.raises(Exception) as refused:
            admin.delete_records({tp: 99})
        assert "OffsetOutOfRange" in str(refused.value)
    finally:
        admin.close()
