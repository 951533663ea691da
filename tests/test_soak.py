"""The soak (bench/soak.py), short: a live `features stream --trigger 1s` in a process of its own, fed a file a
second whose event time runs from a day ago to now in 7.2 s (12,000 times the wall clock) and then live, killed
(SIGKILL) halfway and started again; at the end its stores against a backfill, the reference and verify."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest
from reference import reference_frame
from test_stream import offline_rows, same_value

from features.pipelines.registration import apply
from features.pipelines.stream import stream
from features.pipelines.verify import verify_group
from features.repo import Repo
from features.spec import WINDOW_END
from features.stores.serving import online_features

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _bench():
    path = Path(__file__).resolve().parents[1] / "bench" / "soak.py"
    spec = importlib.util.spec_from_file_location("bench_soak", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]  # its dataclasses look their module up by name
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def apply_here(repo: Path) -> None:
    apply(str(repo))


def drain_here(repo: Path) -> None:
    """What `features stream --available-now` runs, in the tests' session."""
    run = stream(Repo.load(repo), available_now=True, progress=False, tracking=False)
    try:
        run.await_termination()
    finally:
        run.stop()


def test_a_stream_soaked_through_event_time_and_a_kill(spark, tmp_path) -> None:
    soak = _bench()
    work = tmp_path / "soak"
    # The bench samples every 5 s and kills at the first sample past half the run: 9.6 s kills at 5 s, where 18 s
    # waited until 10 s. The restart's cold start outlasts the rest either way, so that live events still land.
    result = soak.soak(
        work, catch_up_min=0.12, live_min=0.04, days=1.0, events_per_file=50, drain=drain_here, apply=apply_here
    )
    # Micro-batches with events before the kill and after the restart (how many depends on the machine's speed).
    assert 0 < result["batches_before_kill"] < result["batches"]
    # Every event good and in order: nothing set aside.
    assert result["aside"] == {g: 0 for g in soak.GROUPS}, soak.aside_detail(result["repo"])
    assert result["max_files_per_partition"] <= soak.FILES_BOUND
    # A live stream's JVM takes its whole heap when it starts (features.engine.session, long_running).
    assert "-XX:+AlwaysPreTouch" in result["heap_options"], result["heap_options"]
    assert any(o.startswith("-Xms") for o in result["heap_options"]), result["heap_options"]

    _, differences = soak.backfill_twin(result["repo"], work, spark, apply=apply_here)
    for group, (rows, differ) in differences.items():
        assert rows > 100 and differ == 0, (group, rows, differ)

    repo = Repo.load(result["repo"])
    events = pd.read_parquet(work / "events.parquet")
    group = repo.groups["user_transactions"]
    rows = offline_rows(spark, repo, group)
    sample = rows.sample(40, random_state=1)
    pairs = [((k,), t) for k, t in zip(sample["user_id"], sample[WINDOW_END], strict=True)]
    want = reference_frame(events, group, pairs)
    for feat in group.features:
        assert all(same_value(a, b) for a, b in zip(want[feat.name], sample[feat.name], strict=True)), feat.name
    # Online: every key's value as of the newest window end the stream's event time closed (eager values for the
    # keys with events, and for every key whose value changed since), touched lately or not.
    users = sample["user_id"].drop_duplicates().tolist()
    online = online_features(repo, group, users, with_window_end=True)
    closed = events["event_ts"].max().floor("5min")
    assert (online[WINDOW_END] <= closed).all()
    want = reference_frame(events, group, [((u,), closed) for u in users])
    for feat in group.features:
        assert all(same_value(a, b) for a, b in zip(want[feat.name], online[feat.name], strict=True)), feat.name
    for name in soak.GROUPS:
        report = verify_group(spark, repo, repo.groups[name], sample=50)
        assert report.ok, report.table()
