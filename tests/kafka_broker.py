"""A real Kafka broker for the tests (no fakes): the single-node KRaft broker `.ci/kafka start` runs on 127.0.0.1:9092.

`./dev test` starts it before the suite (the first time, `.ci/kafka` downloads Kafka's jars with Maven). A test
that needs it calls `require_broker()` first: without a broker that test fails when the environment variable CI is
set, and is skipped otherwise (the reason is printed in pytest's summary), as the Redis tests do.

Tests share the broker with whatever else uses it, so each creates its own topics (`topic_name()`) and deletes
them after. The client is confluent-kafka (librdkafka in a wheel, no Java), so these helpers start no JVM.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import pytest

BOOTSTRAP = "127.0.0.1:9092"
TIMEOUT_S = 30.0
# Records of any date are accepted and kept: the project's test data is from 2026-01-01, and a broker's defaults
# reject timestamps more than an hour ahead (Kafka 4.x) and delete records older than 7 days (time retention goes
# by record timestamps). `.ci/kafka` configures its broker the same way; this covers a broker started otherwise.
TOPIC_DEFAULTS = {
    "message.timestamp.before.max.ms": str(2**63 - 1),
    "message.timestamp.after.max.ms": str(2**63 - 1),
    "retention.ms": "-1",
}

# (key, value, partition or None for the producer's choice, timestamp in ms or None for now)
Record = tuple[bytes | None, bytes, int | None, int | None]


def topic_name(prefix: str = "t") -> str:
    """A topic name no other test uses."""
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def _config(**extra: object) -> dict[str, object]:
    return {"bootstrap.servers": BOOTSTRAP, **extra}


def _admin():
    from confluent_kafka.admin import AdminClient

    return AdminClient(_config())


def broker_available(timeout_s: float = 5.0) -> bool:
    """Does a Kafka broker serve on BOOTSTRAP, i.e. answer a metadata request listing a live broker?"""
    host, port = BOOTSTRAP.rsplit(":", 1)
    try:  # a refused connection answers at once, and spares librdkafka's connection-error log lines
        socket.create_connection((host, int(port)), timeout=2).close()
    except OSError:
        return False
    from confluent_kafka import KafkaException

    try:  # a broker still starting (fenced) lists no brokers, and cannot host a topic yet
        return bool(_admin().list_topics(timeout=timeout_s).brokers)
    except KafkaException:
        return False


def require_broker() -> None:
    """Skip the calling test when no broker serves on BOOTSTRAP, or fail it when the environment variable CI is set."""
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        problem = "the confluent-kafka package is not installed (it is in the dev extras: pip install -e '.[dev]')"
    else:
        if broker_available():
            return
        problem = (
            f"no broker serves on {BOOTSTRAP}. Fix: run .ci/kafka start (./dev test does; it needs Java 17+, "
            "and Maven the first time, to download Kafka's jars), or run a Kafka broker there yourself"
        )
    message = f"Kafka tests need a real Kafka broker: {problem}"
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def _wait_for_metadata(name: str, present: bool, partitions: int | None = None) -> None:
    # The admin calls return once the controller has the change; a producer or a Spark job that asks the broker
    # right after may not see it yet, so wait until the broker's metadata shows it (with a leader per partition).
    # All topics are listed, not this one: a request naming a missing topic may have the broker auto-create it.
    admin = _admin()
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        topic = admin.list_topics(timeout=TIMEOUT_S).topics.get(name)
        ready = topic is not None and topic.error is None
        if ready and present:
            ready = len(topic.partitions) == partitions and all(
                p.error is None and p.leader >= 0 for p in topic.partitions.values()
            )
        if ready == present:
            return
        time.sleep(0.1)
    raise TimeoutError(f"topic {name} {'did not appear' if present else 'was not deleted'} within {TIMEOUT_S:.0f}s")


def create_topic(name: str, partitions: int, config: dict[str, str] | None = None) -> None:
    """Create a topic (replication factor 1) and wait until the broker serves every partition of it."""
    from confluent_kafka.admin import NewTopic

    topic = NewTopic(name, num_partitions=partitions, replication_factor=1, config={**TOPIC_DEFAULTS, **(config or {})})
    admin = _admin()  # held until the result is in: a client garbage-collected earlier cancels its requests
    admin.create_topics([topic], operation_timeout=TIMEOUT_S)[name].result(timeout=TIMEOUT_S)
    _wait_for_metadata(name, present=True, partitions=partitions)


def produce(topic: str, records: Sequence[Record]) -> list[tuple[int, int]]:
    """Write records, in order, and wait until the broker has acknowledged every one of them.

    Returns each record's (partition, offset). A timestamp of None (or 0, which librdkafka reads the same way)
    means the producer's current time. Raises RuntimeError if any record was not delivered.
    """
    from confluent_kafka import Producer

    # Idempotence keeps a partition's records in the order given, and written once, even when a send is retried
    producer = Producer(_config(**{"enable.idempotence": True, "linger.ms": 5}))
    delivered: list[tuple[int, int] | None] = [None] * len(records)
    errors: list[str] = []

    def on_delivery(index: int):
        def report(error, message) -> None:
            if error is not None:
                errors.append(f"record {index}: {error}")
            else:
                delivered[index] = (message.partition(), message.offset())

        return report

    for index, (key, value, partition, timestamp_ms) in enumerate(records):
        kwargs: dict[str, object] = {"key": key, "value": value, "on_delivery": on_delivery(index)}
        if partition is not None:
            kwargs["partition"] = partition
        if timestamp_ms is not None:
            kwargs["timestamp"] = timestamp_ms
        while True:
            try:
                producer.produce(topic, **kwargs)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.5)
    remaining = producer.flush(TIMEOUT_S)
    if errors or remaining or None in delivered:
        shown = "; ".join(errors[:5]) or f"{remaining} record(s) still queued after {TIMEOUT_S:.0f}s"
        raise RuntimeError(f"Kafka did not acknowledge every record written to {topic}: {shown}")
    return [result for result in delivered if result is not None]


def json_values(events: pd.DataFrame, scratch: Path) -> list[bytes]:
    """Each event as the JSON object a producer sends: the JSON-lines files' own encoding (features.demo)."""
    from features.demo import write_events

    [path] = write_events(events, scratch, format="json", n_files=1)
    return [line.encode() for line in Path(path).read_text().splitlines()]


def avro_values(events: pd.DataFrame, schema: str, header: bytes = b"") -> list[bytes]:
    """Each event as the Avro record of `schema` a producer sends (fastavro's encoder, not Spark's), after
    `header` (Confluent's wire format puts its magic byte and schema id there). A missing value (NaN, NA) is
    written as null."""
    import io
    import json

    import fastavro

    parsed = fastavro.parse_schema(json.loads(schema))
    values = []
    for record in events.astype(object).where(events.notna(), None).to_dict("records"):
        out = io.BytesIO(header)
        out.seek(len(header))
        fastavro.schemaless_writer(out, parsed, record)
        values.append(out.getvalue())
    return values


def confluent_header(schema_id: int, magic: int = 0) -> bytes:
    """Confluent's wire format before an Avro body: a magic byte (0) and the schema's id in its registry."""
    return bytes([magic]) + schema_id.to_bytes(4, "big")


def round_robin(values: Sequence[bytes], partitions: int, start: int = 0) -> list[Record]:
    """Records spread over the partitions in turn, so that every partition's event time moves alike: Spark reads
    each partition up to its share of maxOffsetsPerTrigger, and partitions written unevenly would drift apart
    in event time (their events then late against the watermark the others moved)."""
    return [(None, value, (start + i) % partitions, None) for i, value in enumerate(values)]


def delete_topic(name: str) -> None:
    """Delete a topic (no error if it does not exist) and wait until the broker no longer lists it."""
    from confluent_kafka import KafkaError, KafkaException

    try:
        admin = _admin()
        admin.delete_topics([name], operation_timeout=TIMEOUT_S)[name].result(timeout=TIMEOUT_S)
    except KafkaException as error:
        if error.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
            raise
    _wait_for_metadata(name, present=False)


def delete_records(topic: str, partition: int, before: int) -> None:
    """Delete a partition's records before offset `before`, as the topic's retention would."""
    from confluent_kafka import TopicPartition

    admin = _admin()
    [future] = admin.delete_records([TopicPartition(topic, partition, before)]).values()
    future.result(timeout=TIMEOUT_S)
