"""Streaming from a real Kafka broker (tests/kafka_broker.py, started by `.ci/kafka start`): the change points
equal the batch engine's over the same events, bad records are set aside with their topic, partition and offset,
and a restart goes on from the offsets in the checkpoint (events behind the watermark then are late)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from kafka_broker import BOOTSTRAP, json_values, produce, round_robin
from test_batch_reference import BASE, EVENTS, H
from test_stream import (
    FLOAT_SUMS,
    GROUPS,
    KAFKA_SCHEMA,
    arrival_order,
    assert_batch_engine_rows,
    offline_rows,
    same_value,
)

from features import EventSource, FeatureGroup, KafkaTopic
from features.engine.schema import MISSING_KEY, UNPARSEABLE, WRONG_TYPE
from features.pipelines.stream import stream
from features.quality import quarantine_root
from features.repo import Repo
from features.spec import WINDOW_END

pytestmark = pytest.mark.spark

PARTITIONS = 4


def kafka_groups(topic: str, archive: bool = False, per_trigger: int = 400, **value: str) -> list[FeatureGroup]:
    """The file-stream tests' groups, their events read from `topic` (the folder stays the backfills' source);
    `value`: KafkaTopic's value_format and schema."""
    options = {"startingOffsets": "earliest", "maxOffsetsPerTrigger": str(per_trigger)}
    source = EventSource(
        "transactions",
        path="data/transactions",
        timestamp="event_ts",
        watermark="30m",
        schema=KAFKA_SCHEMA,
        kafka=KafkaTopic(topic, BOOTSTRAP, archive=archive, options=options, **value),
    )
    return [FeatureGroup(g.name, g.entity, source, list(g.features)) for g in GROUPS]


def test_a_topic_streams_what_the_batch_engine_computes(spark, feast_repo_factory, tmp_path, kafka_topic) -> None:
    topic = kafka_topic
    events = arrival_order(EVENTS, pd.Timedelta(minutes=20), seed=3)  # within the 30 minute watermark
    bad_values = [
        b"{not json",
        b'{"card_id": "c", "amount": 1.0, "event_ts": "2026-03-02T05:00:00.000000Z"}',  # no user_id
        b'{"user_id": "u1", "amount": "a lot", "event_ts": "2026-03-02T05:00:00.000000Z"}',
    ]
    values = json_values(events, tmp_path / "values")
    middle = len(values) // 2
    records = round_robin(values[:middle] + bad_values + values[middle:], PARTITIONS)
    offsets = produce(topic, records)
    groups = kafka_groups(topic)
    feast_repo_factory(tmp_path, groups)
    repo = Repo.load(tmp_path)

    run = stream(repo, available_now=True, progress=False, tracking=False)
    run.await_termination()
    progress = {p.group: p for p in run.progress()}
    history = run.status()
    for group in groups:
        assert (history["group"] == group.name).sum() >= 3  # maxOffsetsPerTrigger splits the topic
        watermark = pd.Timestamp(progress[group.name].watermark)
        got = offline_rows(spark, repo, group)
        assert len(got) > 100
        assert_batch_engine_rows(spark, group, got, EVENTS, watermark)

        # Each bad record once, with its reason and where it is in the topic.
        records_folder = quarantine_root(repo.root, group.name) / "records"
        bad = pd.concat([pd.read_parquet(f) for f in records_folder.glob("stream-b*/*.parquet")], ignore_index=True)
        where = [f"kafka:{topic}/{p}/{o}" for p, o in offsets[middle : middle + len(bad_values)]]
        assert sorted(bad["source_file"]) == sorted(where)
        reasons = dict(zip(bad["source_file"], bad["reason"], strict=True))
        assert reasons[where[0]].startswith(UNPARSEABLE)
        assert reasons[where[1]].startswith(MISSING_KEY)
        assert reasons[where[2]] == f"{WRONG_TYPE}: amount"
        # The text of a value that did not parse as the schema, as a JSON file's bad line keeps it.
        raw = dict(zip(bad["source_file"], bad["raw_record"], strict=True))
        assert [raw[w] for w in where] == [bad_values[0].decode(), None, bad_values[2].decode()]


def test_a_restart_goes_on_from_the_checkpointed_offsets(spark, feast_repo_factory, tmp_path, kafka_topic) -> None:
    """The second run reads only what was produced since; an event behind the watermark by then is late."""
    topic = kafka_topic
    first = EVENTS[EVENTS["event_ts"] < BASE + 12 * H].sort_values("event_ts", kind="stable")
    later = EVENTS[EVENTS["event_ts"] >= BASE + 12 * H].sort_values("event_ts", kind="stable")
    late = first.iloc[:5].assign(user_id="u_again")  # stamped hours behind the watermark of the first run
    values = json_values(first, tmp_path / "first")
    produce(topic, round_robin(values, PARTITIONS))
    groups = kafka_groups(topic)[:1]
    feast_repo_factory(tmp_path, groups)
    repo = Repo.load(tmp_path)
    stream(repo, available_now=True, progress=False, tracking=False).await_termination()
    produce(topic, round_robin(json_values(pd.concat([late, later]), tmp_path / "later"), PARTITIONS, len(values)))
    run = stream(repo, available_now=True, progress=False, tracking=False)
    run.await_termination()
    [progress] = run.progress()
    assert run.status()["events"].sum() == len(late) + len(later)  # nothing read twice
    group = groups[0]
    late_rows = pd.concat([pd.read_parquet(f) for f in Path(repo.late_path(group)).rglob("*.parquet")])
    assert sorted(late_rows["user_id"]) == ["u_again"] * len(late)
    assert_batch_engine_rows(spark, group, offline_rows(spark, repo, group), EVENTS, pd.Timestamp(progress.watermark))


def test_the_archive_holds_every_record_once_and_backfills_to_the_streams_rows(
    spark, feast_repo_factory, tmp_path, kafka_topic
) -> None:
    from features.pipelines.backfill import backfill

    topic = kafka_topic
    values = json_values(arrival_order(EVENTS, pd.Timedelta(minutes=20), seed=5), tmp_path / "values")
    produce(topic, round_robin([*values, b"{not json"], PARTITIONS))
    groups = kafka_groups(topic, archive=True)[:1]
    feast_repo_factory(tmp_path, groups)
    repo = Repo.load(tmp_path)
    run = stream(repo, available_now=True, progress=False, tracking=False)
    run.await_termination()
    group = groups[0]

    archive = Path(repo.source_path(group))
    assert sorted(p.name for p in archive.iterdir())[:2] == ["_spark_metadata", "date=2026-03-02"]
    archived = spark.read.parquet(str(archive)).toPandas()  # what Spark's log lists: committed batches only
    assert len(archived) == len(EVENTS)
    assert archived["event_ts"].min() == EVENTS["event_ts"].min().tz_localize(None)

    streamed = offline_rows(spark, repo, group)
    end = pd.Timestamp(run.progress()[0].watermark).floor("1h")
    backfill(repo, BASE.to_pydatetime(), end.to_pydatetime(), online=False, progress=False, track=False)
    backfilled = offline_rows(spark, repo, group)
    inside = [(frame[WINDOW_END] >= BASE) & (frame[WINDOW_END] < end) for frame in (streamed, backfilled)]
    a, b = streamed[inside[0]].reset_index(drop=True), backfilled[inside[1]].reset_index(drop=True)
    keys = [*group.join_keys, WINDOW_END]
    assert len(a) > 100 and a[keys].equals(b[keys])
    for feat in group.features:
        exact = feat.aggregation.kind not in FLOAT_SUMS
        assert all(same_value(x, y, exact) for x, y in zip(a[feat.name], b[feat.name], strict=True)), feat.name


def test_a_partition_hours_behind_is_not_waited_for(spark, feast_repo_factory, tmp_path, kafka_topic) -> None:
    """Spark's watermark is the newest event time of any partition minus the delay: the events of a partition
    hours behind the others are used while nothing has been emitted past them, and late after that; a backfill
    over the archive (which holds the late events too) gives the values of every event."""
    from features.pipelines.backfill import backfill

    topic = kafka_topic
    ahead = arrival_order(EVENTS[EVENTS["event_ts"] >= BASE + 5 * H], pd.Timedelta(minutes=20), seed=7)
    behind = EVENTS[EVENTS["event_ts"] < BASE + 3 * H].sort_values("event_ts", kind="stable")
    slow = PARTITIONS - 1
    records = round_robin(json_values(ahead, tmp_path / "ahead"), slow)  # partitions 0-2 move together
    records += [(None, value, slow, None) for value in json_values(behind, tmp_path / "behind")]
    produce(topic, records)
    [group] = kafka_groups(topic, archive=True, per_trigger=200)[:1]
    feast_repo_factory(tmp_path, [group])
    repo = Repo.load(tmp_path)
    run = stream(repo, available_now=True, progress=False, tracking=False)
    run.await_termination()

    # Which of the slow partition's records each batch read (from Spark's offsets), and whether a watermark had
    # been emitted before it: the first batch emits up to its own newest time minus 30 minutes (the watermark
    # Spark hands the second batch), hours past every event of the slow partition, which is late from the second
    # batch on.
    batches = [p for p in run.queries[group.name].recentProgress if p.numInputRows > 0]
    assert len(batches) >= 4  # maxOffsetsPerTrigger reads every partition in proportion, the slow one too
    late_from = json.loads(batches[1].sources[0].startOffset)[topic][str(slow)]
    assert pd.Timestamp(batches[1].eventTime["watermark"]) > behind["event_ts"].max() + 2 * H
    assert 0 < late_from < len(behind)
    late_rows = pd.concat([pd.read_parquet(f) for f in Path(repo.late_path(group)).rglob("*.parquet")])
    want_late = behind.iloc[late_from:]
    got = sorted(zip(late_rows["user_id"], late_rows["event_ts"], strict=True))
    assert got == sorted(zip(want_late["user_id"], want_late["event_ts"], strict=True))
    assert run.progress()[0].late_total == len(want_late)

    used = pd.concat([ahead, behind.iloc[:late_from]])
    watermark = pd.Timestamp(run.progress()[0].watermark)
    assert_batch_engine_rows(spark, group, offline_rows(spark, repo, group), used, watermark)

    end = watermark.floor("1h")
    backfill(repo, BASE.to_pydatetime(), end.to_pydatetime(), online=False, progress=False, track=False)
    healed = offline_rows(spark, repo, group)
    healed = healed[healed[WINDOW_END] < end].reset_index(drop=True)
    assert_batch_engine_rows(spark, group, healed, pd.concat([ahead, behind]), end)
