"""A running stream that reads a Kafka topic continues after a definition change without a replay: the features it
adds are built from the topic's records between the offsets the stream started from and those of its last
committed micro-batch (docs/streaming.md, "Changing a running group"), and where the topic's retention has
deleted records those features need, the stream says which and what the choices are."""

from __future__ import annotations

import json
import tempfile
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from kafka_broker import BOOTSTRAP, delete_records, json_values, produce, round_robin
from test_batch_reference import BASE, H, make_events
from test_stream import KAFKA_SCHEMA, arrival_order, assert_batch_engine_rows, offline_rows
from test_stream_upgrade import AFTER, BEFORE, assert_online_reference, define

from features import EventSource, FeatureGroup, KafkaTopic
from features.engine.query_log import committed_position
from features.errors import ConfigError
from features.pipelines.stream import savepoint, stream
from features.repo import Repo
from features.spec import WINDOW_END

pytestmark = pytest.mark.spark

PARTITIONS = 4


def _on_topic(group: FeatureGroup, topic: str, events: pd.DataFrame) -> FeatureGroup:
    options = {"startingOffsets": "earliest", "maxOffsetsPerTrigger": "300"}
    schema = {c: t for c, t in KAFKA_SCHEMA.items() if c in events.columns}
    kafka = KafkaTopic(topic, BOOTSTRAP, options=options)
    source = EventSource("transactions", "data/transactions", "event_ts", watermark="30m", schema=schema, kafka=kafka)
    return replace(group, source=source)


def _produce(topic: str, events: pd.DataFrame, start: int = 0) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        produce(topic, round_robin(json_values(events, Path(scratch)), PARTITIONS, start))


def _stream(repo: Repo) -> None:
    stream(repo, available_now=True, progress=False, tracking=False).await_termination()


def test_a_changed_kafka_group_builds_its_new_features_from_the_topic(spark, tmp_path, capsys, kafka_topic) -> None:
    events = make_events()
    first = arrival_order(events[events["event_ts"] < BASE + 16 * H], pd.Timedelta(minutes=20), seed=1)
    rest = arrival_order(events[events["event_ts"] >= BASE + 16 * H], pd.Timedelta(minutes=20), seed=2)
    root = tmp_path / "repo"
    _produce(kafka_topic, first)
    _stream(define(root, _on_topic(BEFORE, kafka_topic, events)))
    checkpoint = Path(Repo.load(root).checkpoint_path(BEFORE, None))
    position = committed_position(checkpoint / "query")
    assert position.offsets is not None and sum(position.offsets.end.values()) == len(first)
    changed_at = pd.Timestamp(position.watermark_us, unit="us", tz="UTC")

    # Retention deletes partition 0's oldest records, stamped in the first hours: long before any Hop window of
    # the change needs, but a Lifetime feature needs every event the state holds.
    delete_records(kafka_topic, 0, 10)
    after = _on_topic(AFTER, kafka_topic, events)
    with pytest.raises(ConfigError, match=r"retention deleted partition 0: offsets 0 to 9\).*--reset") as failed:
        stream(define(root, after), available_now=True, progress=False, tracking=False)
    assert "all of the events the state holds (a Lifetime or Session feature)" in str(failed.value)

    # Without the Lifetime feature the change needs only what the topic still holds.
    after = replace(after, features=[f for f in after.features if f.name != "n_lifetime"])
    repo = define(root, after)
    half = len(rest) // 2
    _produce(kafka_topic, rest.iloc[:half], start=len(first))
    capsys.readouterr()
    _stream(repo)
    line = capsys.readouterr().err
    assert "state carried over without a replay" in line and "kept amount_sum_1h, status_last" in line
    assert "built failed_4h, qty_sum_2h from" in line and f"of {PARTITIONS} partitions of {kafka_topic}" in line

    # Rescaled: the state moves to twice the buckets, and the stream reads on from its offsets.
    buckets = json.loads((checkpoint / "features-definition.json").read_text())["buckets"]
    _produce(kafka_topic, rest.iloc[half:], start=len(first) + half)
    run = stream(repo, available_now=True, buckets=2 * buckets, progress=False, tracking=False)
    run.await_termination()
    assert f"--buckets {buckets} -> {2 * buckets}: the state of" in capsys.readouterr().err
    assert sum(p.events for p in run.history) == len(rest) - half

    rows = offline_rows(spark, repo, after)
    later = rows[rows[WINDOW_END] > changed_at].reset_index(drop=True)
    assert_batch_engine_rows(spark, after, later, events, rows[WINDOW_END].max(), since=changed_at)
    assert_online_reference(repo, after, events, later["user_id"].unique(), ["failed_4h", "qty_sum_2h"])


def test_a_savepoint_of_a_kafka_group_holds_its_offsets_and_starts_a_new_checkpoint(
    spark, tmp_path, capsys, kafka_topic
) -> None:
    events = make_events()
    first = arrival_order(events[events["event_ts"] < BASE + 16 * H], pd.Timedelta(minutes=20), seed=1)
    rest = arrival_order(events[events["event_ts"] >= BASE + 16 * H], pd.Timedelta(minutes=20), seed=2)
    root = tmp_path / "repo"
    _produce(kafka_topic, first)
    before = _on_topic(BEFORE, kafka_topic, events)
    repo = define(root, before)
    _stream(repo)
    checkpoint = Path(repo.checkpoint_path(before, None))
    position = committed_position(checkpoint / "query")
    saved = json.loads((checkpoint / "features-definition.json").read_text())

    sp = tmp_path / "sp"
    taken = savepoint.take(spark, repo, before, str(sp))
    assert f"offsets of {PARTITIONS} partitions of {kafka_topic} done" in taken.line()
    kafka = json.loads((sp / "savepoint.json").read_text())["source"]["kafka"]
    assert kafka["topic"] == kafka_topic
    assert {int(p): o for p, o in kafka["end"].items()} == position.offsets.end
    assert sum(kafka["end"].values()) - sum(kafka["start"].values()) == len(first)

    # Restored into another checkpoint root, on the changed definition (a Lifetime feature added: built from the
    # whole topic up to the savepoint's offsets), with twice the buckets; then the rest is produced.
    after = _on_topic(AFTER, kafka_topic, events)
    repo = define(root, after)
    _produce(kafka_topic, rest, start=len(first))
    capsys.readouterr()
    other = str(tmp_path / "elsewhere")
    buckets = 2 * saved["buckets"]
    run = stream(
        repo,
        available_now=True,
        checkpoint_root=other,
        from_savepoint=str(sp),
        buckets=buckets,
        progress=False,
        tracking=False,
    )
    run.await_termination()
    line = capsys.readouterr().err
    assert f"started from the savepoint {sp} (batch {position.batch}" in line
    assert "built failed_4h, qty_sum_2h, n_lifetime" in line and "dropped amount_max_4h" in line
    assert sum(p.events for p in run.history if p.group == after.name) == len(rest)  # read on from the offsets
    restored = committed_position(Path(other) / after.name / "query")
    assert restored.offsets.start == position.offsets.start  # a later change builds from where the state began

    rows = offline_rows(spark, repo, after)
    changed_at = pd.Timestamp(position.watermark_us, unit="us", tz="UTC")
    later = rows[rows[WINDOW_END] > changed_at].reset_index(drop=True)
    assert_batch_engine_rows(spark, after, later, events, rows[WINDOW_END].max(), since=changed_at)
    assert_online_reference(repo, after, events, later["user_id"].unique(), [f.name for f in after.features])

    # The savepoint's offsets are of that topic: another group source cannot take them.
    on_files = replace(after, source=after.source.landing_folder())
    with pytest.raises(ConfigError, match=r"of a Kafka topic, and the group now reads a landing folder"):
        savepoint.read_manifest(sp, on_files)
