"""Which process streams a group, and a rescale handed to it (features.pipelines.stream.handoff): no Spark. The
live side (the stream moving its state) is tests/test_stream_upgrade.py's."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import build_feast_repo

from features import Entity, EventSource, Feature, FeatureGroup, Hop, agg
from features.errors import ConfigError, EnvironmentProblem
from features.pipelines.stream import handoff
from features.repo import Repo


def held_by(checkpoint: Path, pid: int, live: bool = True) -> None:
    """A marker as another process on this host writes it."""
    handoff.hold(checkpoint, live)
    record = json.loads((checkpoint / handoff.MARKER).read_text())
    (checkpoint / handoff.MARKER).write_text(json.dumps({**record, "pid": pid}))


@pytest.fixture
def other_process():
    process = subprocess.Popen(["sleep", "60"])
    yield process.pid
    process.kill()
    process.wait()


def test_a_checkpoint_is_held_by_a_live_other_process_only(tmp_path, other_process) -> None:
    checkpoint = tmp_path / "g"
    assert handoff.holder(checkpoint) is None
    handoff.hold(checkpoint, live=True)
    assert handoff.holder(checkpoint) is None  # this process's own: Spark refuses a second query here itself
    mine = handoff.holder(checkpoint, include_self=True)  # as `features status` shows it
    assert mine is not None and mine.pid == os.getpid() and mine.describe().startswith("a live `features stream` (")
    held_by(checkpoint, other_process)
    other = handoff.holder(checkpoint)
    assert other is not None and other.pid == other_process and other.live
    handoff.release(checkpoint)  # not this process's: left
    assert (checkpoint / handoff.MARKER).exists()

    stale = time.time() - handoff.FRESH_S - 1
    os.utime(checkpoint / handoff.MARKER, (stale, stale))  # not refreshed: its process hangs or died elsewhere
    assert handoff.holder(checkpoint) is None
    handoff.refresh(checkpoint)
    assert handoff.holder(checkpoint) is not None


def test_a_marker_whose_process_is_gone_holds_nothing(tmp_path) -> None:
    process = subprocess.Popen(["true"])
    process.wait()
    held_by(tmp_path, process.pid)  # killed without removing it
    assert handoff.holder(tmp_path) is None
    handoff.check_free(repo_at(tmp_path), "g", tmp_path)


def test_a_held_checkpoint_is_refused_with_the_way_on(tmp_path, other_process) -> None:
    repo = repo_at(tmp_path)
    held_by(tmp_path, other_process, live=True)
    with pytest.raises(ConfigError) as live:
        handoff.check_free(repo, "g", tmp_path)
    assert f"g: its checkpoint {tmp_path} is being streamed by a live `features stream` (process {other_process}" in (
        str(live.value)
    )
    assert "stop it first" in str(live.value)
    assert f"`features stream --repo {repo.root} --group g --buckets N` hands it the rescale" in str(live.value)
    held_by(tmp_path, other_process, live=False)
    with pytest.raises(ConfigError, match=r"--available-now` run .*run this again once it has ended"):
        handoff.check_free(repo, "g", tmp_path)


def test_a_rescale_is_asked_and_answered_through_the_checkpoint(tmp_path, other_process) -> None:
    held_by(tmp_path, other_process)

    def live_side(line: str | None, error: str | None) -> None:
        deadline = time.monotonic() + 30
        while (request := handoff.pending(tmp_path)) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert request is not None and request.buckets == 8
        handoff.answer(tmp_path, request, line=line, error=error)

    answering = threading.Thread(target=live_side, args=("g: --buckets 4 -> 8: moved", None))
    answering.start()
    assert handoff.ask_rescale("g", tmp_path, 8) == "g: --buckets 4 -> 8: moved"
    answering.join()
    assert not (tmp_path / handoff.REQUEST).exists() and not (tmp_path / handoff.ANSWER).exists()

    answering = threading.Thread(target=live_side, args=(None, "g: is still applying a previous change"))
    answering.start()
    with pytest.raises(ConfigError, match="still applying a previous change"):
        handoff.ask_rescale("g", tmp_path, 8)
    answering.join()


def test_a_rescale_no_one_takes_up_says_so(tmp_path, other_process) -> None:
    with pytest.raises(ConfigError, match="--buckets: 0 is not a positive number of hash buckets"):
        handoff.ask_rescale("g", tmp_path, 0)
    with pytest.raises(EnvironmentProblem, match="g: no live stream runs it any more; start it with `--buckets 8`"):
        handoff.ask_rescale("g", tmp_path, 8)
    held_by(tmp_path, other_process)
    with pytest.raises(EnvironmentProblem, match=r"did not take `--buckets 8` up within 0s or ended first"):
        handoff.ask_rescale("g", tmp_path, 8, wait_s=0.2)
    assert not (tmp_path / handoff.REQUEST).exists()  # not left for a later run to take up


def test_only_groups_all_held_by_live_runs_are_handed_over(tmp_path, other_process) -> None:
    repo = repo_at(tmp_path)
    names = sorted(repo.groups)
    assert handoff.live_holders(repo, None, None) is None
    for name in names:
        held_by(Path(repo.checkpoint_path(name)), other_process)
    assert handoff.live_holders(repo, None, None) == {n: Path(repo.checkpoint_path(n)) for n in names}
    held_by(Path(repo.checkpoint_path(names[0])), other_process, live=False)
    assert handoff.live_holders(repo, None, None) is None
    assert handoff.live_holders(repo, names[1:], None) is not None


def repo_at(tmp_path: Path) -> Repo:
    user = Entity("user", join_keys=["user_id"])
    source = EventSource("transactions", path="data/transactions", timestamp="event_ts")
    groups = [
        FeatureGroup(name, user, source, [Feature("n_1h", agg.count(), window=Hop("1h", every="5m"))])
        for name in ("g", "h")
    ]
    root = tmp_path / "repo"
    build_feast_repo(root, groups, apply=False)
    return Repo.load(root)


def test_a_key_change_a_running_stream_cannot_take_is_refused_by_apply_and_plan(
    tmp_path, other_process, capsys
) -> None:
    """Applied under a running stream, a new join key would re-key Feast's registry while the stream, which refuses
    the change, keeps writing rows of the old key: apply and plan refuse it, with the way on."""
    from conftest import definitions_code

    from features.cli import main
    from features.engine.stream_definition import save_state

    schema = {"user_id": "string", "card_id": "string", "event_ts": "timestamp"}
    source = EventSource("transactions", path="data/transactions", timestamp="event_ts", schema=schema)
    count = [Feature("n_1h", agg.count(), window=Hop("1h", every="5m"))]
    g = FeatureGroup("g", Entity("user", join_keys=["user_id"]), source, count)
    repo = Repo.load(build_feast_repo(tmp_path / "repo", [g], apply=False))
    checkpoint = Path(repo.checkpoint_path(g))
    save_state(checkpoint, g, [0, 1], 2, False, None)  # as the stream saves it when it starts
    held_by(checkpoint, other_process)
    card = Entity("card", join_keys=["card_id"])
    rekeyed = [FeatureGroup("g", card, source, count)]
    for old in repo.root.glob("test_definitions_*.py"):
        old.unlink()
    (repo.root / "test_definitions_rekeyed.py").write_text(definitions_code(rekeyed))
    capsys.readouterr()
    for command in ("plan", "apply"):
        assert main([command, "--repo", str(repo.root)]) == 2, command
        err = capsys.readouterr().err
        assert err.startswith(f"error: g: a live `features stream` (process {other_process} "), err
        assert "keys its state by user_id, and the group is now keyed by card_id" in err
        assert f"`features stream --repo {repo.root} --group g --reset`" in err and "a new name" in err
        assert len(err.strip().splitlines()) == 1
    # No stream runs it: apply goes ahead, and the stream, when it starts, asks for --reset itself.
    handoff.release(checkpoint)
    (checkpoint / handoff.MARKER).unlink()
    assert main(["apply", "--repo", str(repo.root)]) == 0
