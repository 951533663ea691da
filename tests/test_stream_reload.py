"""What a live stream says when an applied definition cannot be taken up, before it touches its queries
(docs/streaming.md, "A live stream takes the apply up"), and how a run keeps its checkpoints marked as streamed by it.
No Spark: both refusals end before a query is stopped; tests/test_stream_upgrade.py runs the take-up itself on a live
stream."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from conftest import build_feast_repo

from features import Entity, EventSource, Feature, FeatureGroup, Hop, agg
from features.pipelines.registration import read_applied, record_applied
from features.pipelines.stream import reload
from features.repo import Repo
from features.spec.fingerprint import definition_hash

SOURCE = EventSource("transactions", path="data/transactions", timestamp="event_ts")
GROUP = FeatureGroup(
    "live", Entity("user", join_keys=["user_id"]), SOURCE, [Feature("n_1h", agg.count(), window=Hop("1h", "5m"))]
)


def idle_run() -> SimpleNamespace:
    """A run of GROUP with no query: a take-up that reached one would fail on the missing names."""
    return SimpleNamespace(
        stopping=False, errors={}, swapping=threading.Lock(), sinks={"live": SimpleNamespace(group=GROUP)}
    )


def test_apply_records_each_groups_definition_hash(tmp_path: Path) -> None:
    repo = Repo.load(build_feast_repo(tmp_path / "repo", [GROUP], apply=False))
    assert read_applied(repo.root) == {}  # before any apply recorded one
    record_applied(repo)
    assert read_applied(repo.root) == {"live": definition_hash(GROUP)}
    (repo.root / reload.APPLIED).write_text("{not json")
    assert read_applied(repo.root) == {}  # unreadable: the stream keeps what it runs


def test_a_definition_edited_again_after_the_apply_is_not_taken_up(tmp_path: Path, capsys) -> None:
    repo = Repo.load(build_feast_repo(tmp_path / "repo", [GROUP], apply=False))
    run = idle_run()
    applied = {"live": "the hash applied, which the files no longer give"}
    reload.take_up(run, SimpleNamespace(repo=repo, online=False), ["live"], applied)
    err = capsys.readouterr().err
    assert "live: the applied definition is not taken up; the stream goes on with the one it runs" in err
    assert "the repo's definitions changed since `features apply`" in err
    assert run.sinks["live"].group is GROUP and not run.errors


def test_definitions_that_no_longer_load_are_not_taken_up(tmp_path: Path, capsys) -> None:
    repo = Repo.load(build_feast_repo(tmp_path / "repo", [GROUP], apply=False))
    (repo.root / "broken.py").write_text("def broken(:\n")
    run = idle_run()
    reload.take_up(run, SimpleNamespace(repo=repo, online=False), ["live"], {"live": "new"})
    err = capsys.readouterr().err
    assert "live: the applied definition is not taken up; the stream goes on with the one it runs" in err
    assert "broken.py" in err and "SyntaxError" in err
    assert run.sinks["live"].group is GROUP and not run.errors


def test_a_run_keeps_its_mark_fresh_through_a_swap_and_not_after_it_ended(tmp_path: Path, monkeypatch) -> None:
    """The mark on a run's checkpoints (features.pipelines.stream.handoff) is refreshed while a query runs and while
    a swap has none running (a long take-up must not let it go stale), and no longer once no query runs."""
    monkeypatch.setattr(reload, "POLL_S", 0.02)
    query = SimpleNamespace(isActive=True)
    run = SimpleNamespace(stopping=False, errors={}, swapping=threading.Lock(), queries={"live": query})
    run.sinks = {"live": SimpleNamespace(checkpoint=tmp_path)}
    marker = tmp_path / "live.json"
    marker.write_text("{}")

    def refreshed() -> bool:
        os.utime(marker, (0, 0))
        time.sleep(0.2)
        return marker.stat().st_mtime > 0

    thread = threading.Thread(target=reload._keep_marked, args=(run,))
    thread.start()
    assert refreshed()
    with run.swapping:  # a swap under way: its query stopped, the new one not started yet
        query.isActive = False
        assert refreshed()
    thread.join(timeout=5)
    assert not thread.is_alive()  # no query and no swap: the run has ended
    assert not refreshed()
