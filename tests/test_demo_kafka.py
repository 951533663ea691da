"""`features demo --kafka` end to end, as a user runs it (a subprocess on a fresh copy of the example repo),
against the tests' Kafka broker (tests/kafka_broker.py): the demo's events are produced to a topic of their own
and streamed from it to the offline table and the online store; the online values are the counts of each user's
events. The demo's own local broker (features.demo.broker) is checked apart: it serves, and stops."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from kafka_broker import BOOTSTRAP, delete_topic, require_broker
from test_cli import EXAMPLE_REPO, GROUPS, USER_FEATURES, run, table_after

from features.demo import START, generate_transactions
from features.demo.broker import broker_answers, local_broker
from features.demo.run import SEED
from features.stores.offline import rows_by_date

EVENTS, USERS = 3000, 50


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A copy of the example repo as a clean checkout has it: definitions and configuration, no data."""
    copy = tmp_path / "feature_repo"
    shutil.copytree(EXAMPLE_REPO, copy, ignore=shutil.ignore_patterns("data", "__pycache__", ".ipynb_checkpoints"))
    return copy


@pytest.mark.slow
def test_the_kafka_demo_streams_its_events_from_a_topic_to_the_stores(repo, tmp_path) -> None:
    from confluent_kafka import Consumer, TopicPartition

    require_broker()
    args = ["--events", str(EVENTS), "--users", str(USERS), "--days", "1"]
    result = run("demo", "--kafka", "--bootstrap-servers", BOOTSTRAP, "--repo", str(repo), *args, cwd=tmp_path)
    out = result.stdout
    topic = re.search(r"to topic '([^']+)'", out)
    try:
        assert result.returncode == 0, out + result.stderr
        assert "Traceback" not in result.stderr, result.stderr
        for step in range(1, 6):
            assert f"[{step}/5]" in out, out
        assert f"Kafka: the broker answering at {BOOTSTRAP}" in out, out
        for group in GROUPS:
            assert re.search(rf"{group}: \d+ batches, {EVENTS:,} events, watermark 2026-01-01 ", out), out
            assert rows_by_date(str(repo / "data" / "offline" / group)) != {}

        # Every event is on the topic once: its one partition runs from offset 0 to EVENTS.
        assert topic is not None, out
        consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": "features-demo-test"})
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic.group(1), 0), timeout=30)
        finally:
            consumer.close()
        assert (low, high) == (0, EVENTS)

        # Online values of 5 users; each lifetime count is the user's events up to an hour the stream reached.
        header, rows = table_after(out, "get_online_features")
        assert header == ["user_id", *USER_FEATURES] and len(rows) == 5, out
        events = generate_transactions(EVENTS, USERS, START, 1, seed=SEED)
        for row in rows:
            times = events.loc[events["user_id"] == row[0], "event_ts"]
            count = int(row[header.index("txn_count_lifetime")])
            assert (times < pd.Timestamp(START) + pd.Timedelta(hours=22)).sum() <= count <= len(times), row
        assert f"Topic {topic.group(1)!r} stays on the broker" in out
    finally:
        if topic is not None:
            delete_topic(topic.group(1))


@pytest.mark.slow
def test_the_demo_s_own_broker_serves_and_stops(tmp_path) -> None:
    """On a port nothing answers on, the demo runs Kafka's own broker (jars fetched once by Spark's resolver)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{sock.getsockname()[1]}"
    assert not broker_answers(address)
    with local_broker(address) as served:
        assert served == address and broker_answers(address)
    assert not broker_answers(address)
