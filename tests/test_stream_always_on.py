"""A stream that keeps running: the current time of each micro-batch, the late boundary at pane edges, replayed
batches, eager values at the stream's own event time, and `features verify` before any final row."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pytest
from reference import reference_frame
from test_stream import land, offline_rows, same_value

from features import Entity, EventSource, Feature, FeatureGroup, Hop, agg
from features import kernel as pt
from features.errors import ConfigError
from features.pipelines.stream import batch_progress, stream
from features.repo import Repo
from features.spec import WINDOW_END, DType
from features.stores.serving import online_features

pytestmark = pytest.mark.spark

M = pd.Timedelta(minutes=1)
T0 = pd.Timestamp("2026-03-02", tz="UTC")
USER = Entity("user", join_keys=["user_id"])


def _group(name: str, watermark: str = "5m", **source: object) -> FeatureGroup:
    return FeatureGroup(
        name,
        USER,
        EventSource("transactions", path="data/transactions", timestamp="event_ts", watermark=watermark, **source),
        [
            Feature("n_30m", agg.count(), window=Hop("30m", every="10m")),
            Feature("amount_sum_1h", agg.sum("amount"), window=Hop("1h", every="5m")),
        ],
    )


def _events(user: str, times: list[pd.Timestamp], amount: float = 1.0) -> pd.DataFrame:
    return pd.DataFrame({"user_id": user, "event_ts": pd.Series(times, dtype="datetime64[us, UTC]"), "amount": amount})


def _late_files(repo: Repo, group: FeatureGroup) -> list[Path]:
    return sorted(Path(repo.late_path(group)).rglob("*.parquet"))


def _wait_for(run, events: int, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while run.status().get("events", pd.Series(dtype=int)).sum() < events:
        assert not run.errors, run.errors
        assert time.monotonic() < deadline, f"the stream did not read {events} events in {seconds}s"
        time.sleep(0.2)


def test_max_future_is_a_span_of_seconds_in_any_session_time_zone(spark) -> None:
    """The stream's check (`now` a column: each micro-batch's time) adds `max_future` as the batch read does, in
    seconds: a day from noon in New York before the clocks go forward is 24 hours, not the calendar day's 23."""
    from pyspark.sql import functions as F

    from features.engine.source import FUTURE_TIMESTAMP, reason_of

    group = _group("zoned")  # max_future: 1 day
    now = pd.Timestamp("2026-03-07 17:00", tz="UTC")  # 12:00 in New York; 2026-03-08 has 23 hours there
    stamps = [now + pd.Timedelta("23h30m"), now + pd.Timedelta("24h30m")]
    events = pd.DataFrame({"user_id": ["u1", "u2"], "event_ts": stamps, "amount": [1.0, 2.0]})
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        rows = spark.createDataFrame(events)
        streamed = [r[0] for r in rows.select(reason_of(group, rows, F.lit(now.to_pydatetime()))).collect()]
        batch = [r[0] for r in rows.select(reason_of(group, rows, now.to_pydatetime())).collect()]
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    assert streamed == batch == [None, FUTURE_TIMESTAMP]


def test_max_future_is_checked_against_each_micro_batch_time(spark, feast_repo_factory, tmp_path) -> None:
    """An event stamped "now" is never from the future, however long the stream has run: the check moves with
    each micro-batch's time. (With the time fixed when the query started, every event landed more than
    `max_future` later was quarantined as future_timestamp.)"""
    group = _group("live", max_future="2s")
    land(tmp_path, _events("u1", [pd.Timestamp.now(tz="UTC")]), 1)
    feast_repo_factory(tmp_path, [group])
    repo = Repo.load(tmp_path)
    started = time.monotonic()
    run = stream(repo, trigger="1s", progress=False, tracking=False)
    try:
        _wait_for(run, 1)
        time.sleep(max(0.0, 3.5 - (time.monotonic() - started)))  # longer than max_future since the query started
        land(tmp_path, _events("u1", [pd.Timestamp.now(tz="UTC")]), 1, start_index=1)
        _wait_for(run, 2)
    finally:
        run.stop()
    assert run.progress()[0].bad_records_total == 0
    # Still checked: an event stamped beyond max_future from its batch's time is set aside.
    land(tmp_path, _events("u1", [pd.Timestamp.now(tz="UTC") + pd.Timedelta(hours=1)]), 1, start_index=2)
    drained = stream(repo, available_now=True, progress=False, tracking=False)
    drained.await_termination()
    assert drained.progress()[0].bad_records_total == 1


def test_a_live_file_stream_tells_how_long_finding_new_files_took(
    spark, feast_repo_factory, tmp_path, monkeypatch, capsys
) -> None:
    """A live stream over files watches its file source's listing time (the query progress's `latestOffset`) and
    says it with the fix; the bounds made nil here so that a listing of two files counts as slow."""
    monkeypatch.setattr(batch_progress, "LISTING_FLOOR_S", 0.0)
    monkeypatch.setattr(batch_progress, "LISTING_SHARE", 0.0)
    monkeypatch.setattr(batch_progress, "LISTING_BATCHES", 2)
    land(tmp_path, _events("u1", [pd.Timestamp.now(tz="UTC")]), 1)
    feast_repo_factory(tmp_path, [_group("listed")])
    run = stream(Repo.load(tmp_path), trigger="1s", progress=False, tracking=False)
    try:
        _wait_for(run, 1)
        land(tmp_path, _events("u1", [pd.Timestamp.now(tz="UTC")]), 1, start_index=1)
        _wait_for(run, 2)
    finally:
        run.stop()
    told = [line for line in capsys.readouterr().err.splitlines() if "finding new files took" in line]
    assert told  # (again only once it has doubled: tests/test_listing_watch.py)
    assert told[0].startswith("listed: finding new files took") and "(every 1s)" in told[0]
    assert str(tmp_path / "data" / "transactions") in told[0] and "Running a stream for months" in told[0]


def test_lateness_is_measured_from_the_last_emitted_window_end(spark, feast_repo_factory, tmp_path) -> None:
    """Three batches (one file each). After the second, rows were emitted up to the watermark 00:52, i.e. up to
    the window end 00:50 on every grid. An event at exactly 00:50, or at 00:51 (behind the watermark but after the
    last emitted end), changes only rows not yet written: it is used. One at 00:49:59.999999 would change the row
    at 00:50: it is late."""
    group = _group("late_edges")
    first = _events("u1", [T0 + m * M for m in (0, 7, 21, 33, 44, 57)])
    second = _events("u2", [T0 + 58 * M])
    edge = T0 + 50 * M
    third = pd.concat(
        [_events("u1", [edge, T0 + 51 * M]), _events("u1", [edge - pd.Timedelta(microseconds=1)], amount=100.0)]
    )
    land(tmp_path, first, 1)
    land(tmp_path, second, 1, start_index=1)
    land(tmp_path, third, 1, start_index=2)
    land(tmp_path, _events("u2", [T0 + 3 * 60 * M]), 1, start_index=3)  # moves the watermark past everything above
    feast_repo_factory(tmp_path, [group])
    repo = Repo.load(tmp_path)
    run = stream(repo, available_now=True, max_files_per_trigger=1, progress=False, tracking=False)
    run.await_termination()

    late = pd.concat(pd.read_parquet(f) for f in _late_files(repo, group))
    assert late["event_ts"].tolist() == [edge - pd.Timedelta(microseconds=1)]
    used = pd.concat([first, second, third.iloc[:2]], ignore_index=True)
    got = offline_rows(spark, repo, group)
    assert (got[WINDOW_END] > T0 + 50 * M).any()
    pairs = [((k,), t) for k, t in zip(got["user_id"], got[WINDOW_END], strict=True)]
    want = reference_frame(used, group, pairs)
    for feat in group.features:
        assert [*got[feat.name]] == [*want[feat.name]], feat.name


def test_eager_values_are_taken_at_the_streams_event_time_in_every_bucket(spark, feast_repo_factory, tmp_path) -> None:
    """Each key's online value is its value at the newest window end the whole stream's event time has closed,
    also for a key alone in a bucket whose own events stopped earlier (a quiet bucket)."""
    from features.engine.inputs import bucket_labels, bucket_of

    group = _group("eager_everywhere", watermark="1h")
    labels = bucket_labels(2, 2)
    names = [f"u{i}" for i in range(40)]
    buckets = (
        spark.createDataFrame(pd.DataFrame({"user_id": names}))
        .select("user_id", bucket_of(group, labels).alias("b"))
        .toPandas()
    )
    quiet = buckets["user_id"].iloc[0]
    busy = buckets.loc[buckets["b"] != buckets["b"].iloc[0], "user_id"].iloc[:2].tolist()
    busy_events = [_events(u, [T0 + m * M for m in (3, 9, 11)]) for u in busy]
    events = pd.concat([_events(quiet, [T0 + m * M for m in (1, 2, 4)]), *busy_events], ignore_index=True)
    land(tmp_path, events, 1)
    feast_repo_factory(tmp_path, [group])
    repo = Repo.load(tmp_path)
    stream(repo, available_now=True, buckets=2, progress=False, tracking=False).await_termination()

    # The stream saw 00:11: every key's eager value is at 00:10 (the 10m and the 5m grids' newest closed end).
    users = [quiet, *busy]
    got = online_features(repo, group, users, with_window_end=True)
    assert got[WINDOW_END].tolist() == [T0 + 10 * M] * 3
    want = reference_frame(events, group, [((u,), T0 + 10 * M) for u in users])
    for feat in group.features:
        assert all(same_value(a, b) for a, b in zip(got[feat.name], want[feat.name], strict=True)), feat.name
    assert got.loc[0, "n_30m"] == 3  # the quiet key: all three of its events, at the stream's time


def test_verify_checks_eager_values_before_any_final_row(spark, feast_repo_factory, tmp_path, capsys) -> None:
    """A stream whose watermark has emitted no final row yet: `features verify` checks its eager online values
    against the recompute instead of stopping for the missing offline table."""
    from features.cli import main
    from features.pipelines.verify import verify_group

    group = _group("no_final_rows", watermark="1d")
    land(tmp_path, _events("u1", [T0 + m * M for m in (1, 2, 14)]), 1)
    feast_repo_factory(tmp_path, [group])
    repo = Repo.load(tmp_path)
    assert main(["verify", "--repo", str(tmp_path), "--no-tracking"]) == 2
    assert "has no offline rows and no online values yet" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="no offline rows and no online values yet; run `features backfill`"):
        verify_group(spark, repo, group)

    stream(repo, available_now=True, progress=False, tracking=False).await_termination()
    assert not Path(repo.offline_path(group)).exists()
    report = verify_group(spark, repo, group)
    assert report.ok, report.table()
    assert report.tallies["online", "n_30m"].match == 1


def test_closed_end_is_the_latest_end_on_any_grid() -> None:
    types = {"user_id": DType.STRING, "event_ts": DType.TIMESTAMP, "amount": DType.FLOAT64}
    plan = pt.Plan.of(_group("plan"), types)
    minute = 60 * 1_000_000
    assert plan.closed_end(52 * minute) == 50 * minute
    assert plan.closed_end(57 * minute) == 55 * minute  # the 5m grid's
    assert plan.closed_end(50 * minute) == 50 * minute


def test_the_stream_sets_bad_records_aside_as_the_backfill_does(spark, feast_repo_factory, tmp_path) -> None:
    """One kind of quarantine file: the same columns (reason, source_file, the source's columns) and values
    from a backfill and from the stream."""
    from features.pipelines.backfill import backfill
    from features.quality import quarantine_root

    group = _group("aside_alike")
    events = _events("u1", [T0 + m * M for m in (1, 2, 3)])
    events.loc[1, "user_id"] = None
    land(tmp_path, events, 1)
    feast_repo_factory(tmp_path, [group])
    repo = Repo.load(tmp_path)
    backfill(repo, T0, T0 + 60 * M, online=False, progress=False, track=False)
    stream(repo, available_now=True, progress=False, tracking=False).await_termination()
    records = quarantine_root(repo.root, group.name) / "records"
    by_stream = [pd.read_parquet(f) for f in records.glob("stream-b*/*.parquet")]
    by_backfill = [pd.read_parquet(f) for f in records.glob("[!s]*/*.parquet")]
    assert len(by_stream) == 1 and len(by_backfill) == 1
    pd.testing.assert_frame_equal(by_stream[0], by_backfill[0], check_dtype=False)
    assert by_stream[0]["reason"].tolist() == ["missing_key: user_id"]
    assert by_stream[0]["source_file"].str.endswith("part-00000.parquet").all()


def test_the_command_ends_with_the_runs_totals_not_a_repeat_of_its_last_batch(
    spark, feast_repo_factory, tmp_path, capsys
) -> None:
    from features.cli import main

    group = _group("summed")
    land(tmp_path, _events("u1", [T0 + m * M for m in (1, 2)]), 1)
    land(tmp_path, _events("u2", [T0 + m * M for m in (30, 90)]), 1, start_index=1)
    feast_repo_factory(tmp_path, [group])
    capsys.readouterr()  # what applying the repo printed
    command = ["stream", "--repo", str(tmp_path), "--available-now", "--max-files-per-trigger", "1", "--no-tracking"]
    assert main(command) == 0
    out, err = capsys.readouterr()
    batch_lines = [line for line in err.splitlines() if line.startswith("summed batch ")]
    assert len(batch_lines) >= 2  # one per batch, as each ended
    assert len(out.splitlines()) == 1
    assert out.startswith(f"summed: {len(batch_lines)} batches, 4 events, ")
    assert not any(line in out for line in batch_lines)
