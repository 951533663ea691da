"""A running stream whose group changes (features added, removed, widened) continues from its checkpoint without a
replay: after the change, its offline rows equal the batch engine's over all events, and the new features' online
values are the reference's (docs/streaming.md, "Changing a running group")."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import build_feast_repo
from reference import reference_frame
from test_batch_reference import BASE, H, make_events
from test_stream import (
    SOURCE,
    arrival_order,
    assert_batch_engine_rows,
    check_sample,
    land,
    offline_rows,
    same_value,
)

from features import Entity, Feature, FeatureGroup, Hop, Lifetime, agg
from features.engine.query_log import committed_position
from features.errors import ConfigError
from features.pipelines.stream import stream
from features.repo import Repo
from features.spec import WINDOW_END
from features.stores.serving import online_features

pytestmark = pytest.mark.spark

USER = Entity("user", join_keys=["user_id"])
BEFORE = FeatureGroup(
    "user_changing",
    USER,
    SOURCE,
    [
        Feature("failed_4h", agg.count(), window=Hop("4h", every="20m"), where="status = 'FAILED'"),
        Feature("amount_sum_1h", agg.sum("amount"), window=Hop("1h", every="5m")),
        Feature("amount_max_4h", agg.max("amount"), window=Hop("4h", every="20m")),
        Feature("status_last", agg.last("status"), window=Lifetime(every="5m")),
    ],
)
AFTER = FeatureGroup(
    "user_changing",
    USER,
    SOURCE,
    [
        Feature("failed_4h", agg.count(), window=Hop("6h", every="20m"), where="status = 'FAILED'"),  # widened
        Feature("amount_sum_1h", agg.sum("amount"), window=Hop("1h", every="5m")),
        Feature("status_last", agg.last("status"), window=Lifetime(every="5m")),
        Feature("qty_sum_2h", agg.sum("qty"), window=Hop("2h", every="10m"), where="ok"),  # added, a new `where`
        Feature("n_lifetime", agg.count(), window=Lifetime(every="1h")),  # added: all of history
    ],
)


def define(root: Path, group: FeatureGroup) -> Repo:
    for old in root.glob("test_definitions_*.py"):
        old.unlink()
    build_feast_repo(root, [group])
    return Repo.load(root)


def stream_files(repo: Repo) -> None:
    stream(repo, available_now=True, max_files_per_trigger=1, progress=False, tracking=False).await_termination()


def streamed_before(root: Path) -> tuple[pd.DataFrame, pd.DataFrame, Path, pd.Timestamp]:
    """BEFORE streamed over the events of the first 16 hours landed in `root`: all events, the rest (not landed),
    the group's checkpoint and the watermark it reached."""
    events = make_events()
    cut = BASE + 16 * H
    first, rest = events[events["event_ts"] < cut], events[events["event_ts"] >= cut]
    land(root, arrival_order(first, pd.Timedelta(minutes=20), seed=1), 3)
    stream_files(define(root, BEFORE))
    checkpoint = Path(Repo.load(root).checkpoint_path(BEFORE, None))
    changed_at = pd.Timestamp(committed_position(checkpoint / "query").watermark_us, unit="us", tz="UTC")
    return events, rest, checkpoint, changed_at


def assert_online_reference(repo: Repo, group: FeatureGroup, events: pd.DataFrame, users, names) -> None:
    """The online values of `names` for `users` are the reference's at the window end each holds."""
    online = online_features(repo, group, sorted(users), with_window_end=True)
    want = reference_frame(
        events, group, [((u,), t) for u, t in zip(online["user_id"], online[WINDOW_END], strict=True)]
    )
    for name in names:
        assert all(same_value(a, b) for a, b in zip(online[name], want[name], strict=True)), name


def test_a_changed_group_continues_from_its_checkpoint_and_a_new_key_does_not(spark, tmp_path, capsys) -> None:
    root = tmp_path / "repo"
    events, rest, checkpoint, changed_at = streamed_before(root)

    repo = define(root, AFTER)
    land(root, arrival_order(rest, pd.Timedelta(minutes=20), seed=2), 3, start_index=3)
    capsys.readouterr()
    stream_files(repo)
    line = capsys.readouterr().err
    assert "state carried over without a replay" in line
    assert "kept amount_sum_1h, status_last" in line and "built failed_4h, qty_sum_2h, n_lifetime" in line
    assert "dropped amount_max_4h" in line

    rows = offline_rows(spark, repo, AFTER)
    after = rows[rows[WINDOW_END] > changed_at].reset_index(drop=True)
    assert_batch_engine_rows(spark, AFTER, after, events, rows[WINDOW_END].max(), since=changed_at)
    check_sample(AFTER, after, events)
    saved = json.loads((checkpoint / "features-definition.json").read_text())
    assert saved["upgrade"] is None  # every bucket stepped under the new definition: the change is done
    assert not any((checkpoint / "upgrade").glob("*"))

    assert_online_reference(repo, AFTER, events, after["user_id"].unique(), ["failed_4h", "qty_sum_2h", "n_lifetime"])

    # Keyed otherwise, every key is new: the least it takes is a replay, and the stream says so.
    rekeyed = FeatureGroup("user_changing", Entity("card", join_keys=["card_id"]), SOURCE, AFTER.features)
    with pytest.raises(ConfigError, match=r"every key is new.*--group user_changing --reset"):
        stream(define(root, rekeyed), available_now=True, progress=False, tracking=False)


def wait_for(done, what: str, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, f"waited {seconds:g}s for {what}"
        time.sleep(0.05)


def test_a_live_stream_takes_up_an_applied_change_between_batches(spark, tmp_path, capsys, monkeypatch) -> None:
    """`features apply` of the changed group while a live stream runs it: the stream swaps its query for one on the
    new definition in the same process (no restart, no `--reset`), and what it writes after is the batch engine's.
    An apply that leaves the definition as it is swaps nothing; one that a start would refuse (another key) is
    said, and the stream goes on with the definition it ran."""

    from features.pipelines.stream import reload

    monkeypatch.setattr(reload, "POLL_S", 0.05)
    root = tmp_path / "repo"
    events, rest, checkpoint, changed_at = streamed_before(root)
    run = stream(Repo.load(root), trigger="1s", max_files_per_trigger=1, progress=False, tracking=False)
    try:
        before = run.queries[AFTER.name]
        repo = define(root, AFTER)  # the apply: written while the stream runs
        wait_for(lambda: run.queries[AFTER.name] is not before and run.queries[AFTER.name].isActive, "the swap")
        assert before.isActive is False and not run.errors
        swapped = run.queries[AFTER.name]
        land(root, arrival_order(rest, pd.Timedelta(minutes=20), seed=2), 3, start_index=3)
        wait_for(lambda: sum(p.events for p in run.history) >= len(rest), "the landed files' batches")
        define(root, AFTER)  # applied again, the same definition: nothing to take up
        time.sleep(0.5)
        assert run.queries[AFTER.name] is swapped and swapped.isActive
        err = capsys.readouterr().err
        assert err.count("a changed definition was applied; the stream continues with it from its checkpoint") == 1
        assert "kept amount_sum_1h, status_last" in err and "built failed_4h, qty_sum_2h, n_lifetime" in err

        rows = offline_rows(spark, repo, AFTER)
        after = rows[rows[WINDOW_END] > changed_at].reset_index(drop=True)
        assert_batch_engine_rows(spark, AFTER, after, events, rows[WINDOW_END].max(), since=changed_at)
        check_sample(AFTER, after, events)
        assert json.loads((checkpoint / "features-definition.json").read_text())["upgrade"] is None
        names = ["failed_4h", "qty_sum_2h", "n_lifetime"]
        assert_online_reference(repo, AFTER, events, after["user_id"].unique(), names)

        # A new key the running stream cannot take: apply refuses it while the stream runs (applied, Feast's
        # registry would be keyed by card_id under a stream still writing user_id rows), and the stream goes on.
        rekeyed = FeatureGroup("user_changing", Entity("card", join_keys=["card_id"]), SOURCE, AFTER.features)
        with pytest.raises(ConfigError, match=r"a live `features stream` .*every key is new.*--group user_changing"):
            define(root, rekeyed)
        time.sleep(0.5)
        assert run.queries[AFTER.name] is swapped and swapped.isActive
        assert not run.errors and run.sinks[AFTER.name].group == AFTER
    finally:
        run.stop()


def features_cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "features.cli", *args, "--repo", str(root)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_a_live_stream_takes_up_a_rescale_another_process_hands_it(spark, tmp_path, capsys, monkeypatch) -> None:
    """`features stream --buckets N` while a live stream runs the group: the live stream moves its state to N
    buckets between two batches in its own process, and the asking process prints its line and ends. Refused while
    a definition change is still pending (the stream goes on as it ran); another stream of the group is refused
    while the live one runs. The rows after the changes are the batch engine's."""

    from features.pipelines.stream import reload

    monkeypatch.setattr(reload, "POLL_S", 0.05)
    root = tmp_path / "repo"
    events, rest, checkpoint, changed_at = streamed_before(root)
    saved = lambda: json.loads((checkpoint / "features-definition.json").read_text())  # noqa: E731
    buckets = 2 * saved()["buckets"]
    run = stream(Repo.load(root), trigger="1s", max_files_per_trigger=1, progress=False, tracking=False)
    try:
        first = run.queries[AFTER.name]
        repo = define(root, AFTER)
        wait_for(lambda: run.queries[AFTER.name] is not first and run.queries[AFTER.name].isActive, "the apply")
        changing = run.queries[AFTER.name]
        refused = features_cli(root, "stream", "--group", AFTER.name, "--buckets", str(buckets))
        assert refused.returncode == 2, refused.stderr
        assert "is still applying a previous change" in refused.stderr
        wait_for(lambda: run.queries[AFTER.name] is not changing and run.queries[AFTER.name].isActive, "the restart")
        assert not run.errors and saved()["buckets"] == buckets // 2

        shown = features_cli(root, "status", "--group", AFTER.name)
        assert f"; streamed now by a live `features stream` (process {os.getpid()} on" in shown.stdout, shown.stderr
        other = features_cli(root, "stream", "--group", AFTER.name, "--available-now")
        assert other.returncode == 2
        assert f"is being streamed by a live `features stream` (process {os.getpid()} on" in other.stderr
        assert f"`features stream --repo {root} --group {AFTER.name} --buckets N` hands it the rescale" in other.stderr

        later = arrival_order(rest, pd.Timedelta(minutes=20), seed=2)
        half = len(later) // 2
        land(root, later.iloc[:half], 3, start_index=3)
        wait_for(lambda: saved()["upgrade"] is None, "the definition change done")
        moved = features_cli(root, "stream", "--group", AFTER.name, "--buckets", str(buckets))
        assert moved.returncode == 0, moved.stderr
        assert f"--buckets {buckets // 2} -> {buckets}" in moved.stderr and "moved to their new buckets" in moved.stderr
        assert saved()["buckets"] == buckets and not run.errors and run.queries[AFTER.name].isActive
        land(root, later.iloc[half:], 2, start_index=6)
        wait_for(lambda: sum(p.events for p in run.history) >= len(rest), "the landed files' batches")
        again = features_cli(root, "stream", "--group", AFTER.name, "--buckets", str(buckets))
        assert again.returncode == 0 and f"already in {buckets} buckets; nothing moved" in again.stderr
        err = capsys.readouterr().err
        assert err.count(f"--buckets {buckets} was asked for; the stream moves its state between batches") == 2
        assert f"--buckets {buckets} is not taken up; the stream goes on as it ran" in err
    finally:
        run.stop()
    assert not (checkpoint / "live.json").exists()
    rows = offline_rows(spark, repo, AFTER)
    after = rows[rows[WINDOW_END] > changed_at].reset_index(drop=True)
    assert_batch_engine_rows(spark, AFTER, after, events, rows[WINDOW_END].max(), since=changed_at)
    check_sample(AFTER, after, events)


def test_a_stream_rescaled_moves_its_state_and_replays_nothing(spark, tmp_path, capsys, monkeypatch) -> None:
    """--buckets doubled on a cluster of more cores, then brought down to one: each time the keys' state moves to
    their new buckets (read from the checkpoint, not the source), Spark spreads the state over one partition per
    bucket (as many as the cores allow), and the rows after the change equal the batch engine's."""
    from features.engine.query_log import state_partitions
    from features.pipelines.stream import upgrade as stream_upgrade

    events = make_events()
    parts = [events[events["event_ts"] < BASE + 10 * H], events[(events["event_ts"] >= BASE + 10 * H)]]
    parts = [parts[0], parts[1][parts[1]["event_ts"] < BASE + 20 * H], parts[1][parts[1]["event_ts"] >= BASE + 20 * H]]
    root = tmp_path / "repo"
    land(root, arrival_order(parts[0], pd.Timedelta(minutes=20), seed=1), 2)
    repo = define(root, AFTER)
    stream(repo, available_now=True, progress=False, tracking=False).await_termination()
    checkpoint = Path(repo.checkpoint_path(AFTER, None))
    before = json.loads((checkpoint / "features-definition.json").read_text())["buckets"]
    monkeypatch.setattr(stream_upgrade, "cores", lambda spark: 2 * before)  # the stream moved to a bigger cluster
    for i, buckets in enumerate((2 * before, 1)):
        changed_at = pd.Timestamp(committed_position(checkpoint / "query").watermark_us, unit="us", tz="UTC")
        partitions = state_partitions(checkpoint / "query")
        land(root, arrival_order(parts[i + 1], pd.Timedelta(minutes=20), seed=2), 2, start_index=2 * (i + 1))
        capsys.readouterr()
        stream(repo, available_now=True, buckets=buckets, progress=False, tracking=False).await_termination()
        said = capsys.readouterr().err
        assert "moved to their new buckets" in said and "without a replay" in said, said
        assert f"state spread from {partitions} to {buckets} partitions" in said, said
        saved = json.loads((checkpoint / "features-definition.json").read_text())
        assert saved["buckets"] == buckets and len(saved["labels"]) == buckets
        assert saved["partitions"] == buckets == state_partitions(checkpoint / "query")
        rows = offline_rows(spark, repo, AFTER)
        after = rows[rows[WINDOW_END] > changed_at].reset_index(drop=True)
        seen = events[events["event_ts"] < (BASE + 20 * H if i == 0 else BASE + 40 * H)]
        assert_batch_engine_rows(spark, AFTER, after, seen, rows[WINDOW_END].max(), since=changed_at)


@pytest.mark.slow
def test_a_stream_killed_while_it_carries_a_change_over_finishes_it_when_started_again(spark, tmp_path) -> None:
    """SIGKILL `features stream` while it builds the added features' panes, and again in the first micro-batch under
    the change (the change saved, no batch committed since): the third start finishes the change, and the rows
    after it are the batch engine's. The third start runs in this process (the stream a command runs, from what the
    killed processes left on disk), which spares a cold start."""
    root = tmp_path / "repo"
    events, rest, checkpoint, changed_at = streamed_before(root)
    commits = len(list((checkpoint / "query" / "commits").glob("[0-9]*")))
    repo = define(root, AFTER)
    land(root, arrival_order(rest, pd.Timedelta(minutes=20), seed=2), 3, start_index=3)

    def saved() -> dict:
        return json.loads((checkpoint / "features-definition.json").read_text())

    def building() -> bool:  # the built panes' folder appears when their job starts writing
        return any((checkpoint / "upgrade").glob("*"))

    def applying() -> bool:
        return saved().get("upgrade") is not None

    command = [sys.executable, "-m", "features.cli", "stream", "--available-now", "--max-files-per-trigger", "1"]
    for stage, reached in (("building", building), ("applying", applying)):
        process = subprocess.Popen([*command, "--repo", str(root)], stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 300
        while not reached() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        alive = process.poll() is None
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        assert alive and reached(), f"{stage}: the stream ended before the kill: {process.stderr.read()[-2000:]}"
        assert len(list((checkpoint / "query" / "commits").glob("[0-9]*"))) == commits, stage  # no batch since
        if stage == "building":
            assert saved()["upgrade"] is None  # killed before the change was saved: the next start builds again
    stream_files(Repo.load(root))
    assert saved()["upgrade"] is None and not any((checkpoint / "upgrade").glob("*"))  # the change is done

    rows = offline_rows(spark, repo, AFTER)
    after = rows[rows[WINDOW_END] > changed_at].reset_index(drop=True)
    assert_batch_engine_rows(spark, AFTER, after, events, rows[WINDOW_END].max(), since=changed_at)
    assert_online_reference(repo, AFTER, events, after["user_id"].unique(), ["failed_4h", "qty_sum_2h", "n_lifetime"])
