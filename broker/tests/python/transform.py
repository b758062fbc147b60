"""A consume-transform-produce loop with exactly-once delivery (confluent-kafka), run and
killed by test_transactions.py.

Usage: transform.py BOOTSTRAP INPUT OUTPUT GROUP TRANSACTIONAL_ID COMMIT_EVERY

Reads every partition of INPUT (read_committed), writes `out:<value>` with the same key to the
same partition of OUTPUT, and every COMMIT_EVERY records commits one transaction holding those
records and the next input offsets of GROUP, printing `committed` after each. It starts from
GROUP's committed offsets and exits 0 once it has committed up to the end of INPUT as it was at
start.

The partitions are assigned, not subscribed, so a restart after SIGKILL does not wait for the
dead member to leave a group; the transactional id fences the killed instance instead:
init_transactions aborts whatever transaction it left open, and only then are the group's
offsets read.
"""

import sys

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

TIMEOUT = 30


def main():
    bootstrap, input_topic, output_topic, group, transactional_id, commit_every = sys.argv[1:]
    commit_every = int(commit_every)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "linger.ms": 5}
    )
    producer.init_transactions(TIMEOUT)

    partitions = consumer.list_topics(input_topic, timeout=TIMEOUT).topics[input_topic].partitions
    committed = consumer.committed(
        [TopicPartition(input_topic, p) for p in partitions], timeout=TIMEOUT
    )
    consumer.assign(
        [
            TopicPartition(input_topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING)
            for tp in committed
        ]
    )
    ends = {
        p: consumer.get_watermark_offsets(TopicPartition(input_topic, p), timeout=TIMEOUT)[1]
        for p in partitions
    }
    positions = {tp.partition: max(tp.offset, 0) for tp in committed}

    def commit():
        offsets = [TopicPartition(input_topic, p, o) for p, o in positions.items()]
        producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), TIMEOUT)
        producer.commit_transaction(TIMEOUT)
        print("committed", flush=True)

    producer.begin_transaction()
    pending = 0
    while any(positions[p] < ends[p] for p in partitions):
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF:
                continue
            raise RuntimeError(msg.error())
        producer.produce(
            output_topic, key=msg.key(), value=b"out:" + msg.value(), partition=msg.partition()
        )
        positions[msg.partition()] = msg.offset() + 1
        pending += 1
        if pending >= commit_every:
            commit()
            producer.begin_transaction()
            pending = 0
    commit()
    consumer.close()


if __name__ == "__main__":
    main()
