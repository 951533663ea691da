"""The tests' Kafka broker (`.ci/kafka start`) and the helpers of kafka_broker.py, without Spark: what `produce`
writes to explicit partitions with explicit timestamps is what a consumer reads back, record for record."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from kafka_broker import BOOTSTRAP, create_topic, delete_topic, produce, require_broker, topic_name

PARTITIONS = 3
# The project's data is from 2026-01-01: the records are older than the broker's default time retention (7 days)
# would keep, and one is far in the future, which a default Kafka 4.x broker would refuse.
START_MS = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)


def _consume_all(topic: str, expected: int) -> list[tuple[bytes | None, bytes, int, int]]:
    from confluent_kafka import TIMESTAMP_CREATE_TIME, Consumer, TopicPartition

    # Partitions assigned by hand from offset 0, so no group coordination is involved and nothing is committed
    consumer = Consumer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": f"{topic}-reader",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.assign([TopicPartition(topic, partition, 0) for partition in range(PARTITIONS)])
        read: list[tuple[bytes | None, bytes, int, int]] = []
        deadline = time.monotonic() + 30
        while len(read) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            timestamp_type, timestamp_ms = message.timestamp()
            assert timestamp_type == TIMESTAMP_CREATE_TIME
            read.append((message.key(), message.value(), message.partition(), timestamp_ms))
        return read
    finally:
        consumer.close()


def test_records_round_trip_through_the_broker():
    require_broker()
    topic = topic_name("roundtrip")
    create_topic(topic, PARTITIONS)
    try:
        records = [
            (f"user-{i % 4}".encode(), f"event {i}".encode(), i % PARTITIONS, START_MS + i * 60_000) for i in range(12)
        ]
        records.append((None, b"no key", 1, START_MS - 86_400_000))  # keyless, a day before the others
        records.append((b"late", b"", 2, START_MS + 3 * 365 * 86_400_000))  # empty value, years ahead
        delivered = produce(topic, records)

        assert [partition for partition, _ in delivered] == [partition for _, _, partition, _ in records]
        for partition in range(PARTITIONS):  # offsets count up from 0 in each partition, in the order written
            offsets = [offset for p, offset in delivered if p == partition]
            assert offsets == list(range(len(offsets)))

        read = _consume_all(topic, len(records))
        assert len(read) == len(records)
        for partition in range(PARTITIONS):  # partitions interleave when read; each keeps its write order
            written = [record for record in records if record[2] == partition]
            got = [record for record in read if record[2] == partition]
            assert got == written, f"partition {partition}"
    finally:
        delete_topic(topic)
