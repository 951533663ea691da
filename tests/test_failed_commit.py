"""A commit to the offline table that fails for real (its folder on a full disk) leaves both stores as they were, in a
backfill and in a stream's micro-batch alike: the online store is written only once the commit is made, so that it
never serves values no training set can reproduce (issue 66: a backfill onto a full disk exited with no offline
table, yet its online rows were written). With the space back, a stream's next run writes both."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest
from test_batch_reference import BASE, H, make_events
from test_stream import PAIR_GROUP, arrival_order, land

from features.cli import main
from features.pipelines.stream import stream
from features.repo import Repo
from features.spec import WINDOW_END
from features.stores import offline
from features.stores.serving import online_features

pytestmark = pytest.mark.spark

KEYS = [("u1-c0", m) for m in range(4)]  # keys with events in the first hours and in the later ones


def events() -> pd.DataFrame:
    every = make_events()
    return every[every["user_id"] == "u1"]


@contextmanager
def small_disk(folder: Path) -> Iterator[Path]:
    """`folder` on a file system of its own of 32 MB (a tmpfs), unmounted afterwards; yields the file that
    `fill` grows until that disk is full. Needs root, and a kernel that lets it mount (a container may not)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system for the offline folder needs root")
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(folder)], capture_output=True, text=True, check=False
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield folder / "filler"
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def fill(filler: Path) -> None:
    """Write to `filler` until the disk holds no byte more."""
    with filler.open("ab", buffering=0) as out:
        for size in (1 << 20, 4096, 1):
            try:
                while out.write(b"\0" * size):
                    pass
            except OSError:
                pass


def online(repo: Repo) -> pd.DataFrame:
    return online_features(repo, PAIR_GROUP, KEYS, with_window_end=True)


def repo_with(root: Path, events: pd.DataFrame, feast_repo_factory) -> Repo:
    land(root, arrival_order(events, pd.Timedelta(minutes=20), seed=5), 2)
    feast_repo_factory(root, [PAIR_GROUP])
    return Repo.load(root)


def backfill(root: Path, start: pd.Timestamp, end: pd.Timestamp) -> int:
    return main(
        ["backfill", "--repo", str(root), "--start", start.isoformat(), "--end", end.isoformat(), "--no-tracking"]
    )


def test_a_backfill_whose_commit_fails_leaves_the_online_store_as_it_was(
    spark, feast_repo_factory, tmp_path, capsys
) -> None:
    root = tmp_path / "repo"
    repo = repo_with(root, events(), feast_repo_factory)
    table = repo.offline_path(PAIR_GROUP)
    with small_disk(root / "data" / "offline") as filler:
        assert backfill(root, BASE, BASE + 12 * H) == 0
        before, version = online(repo), offline.current_version(table)
        assert before[WINDOW_END].notna().all()
        fill(filler)
        capsys.readouterr()
        assert backfill(root, BASE + 12 * H, BASE + 24 * H) == 2
        assert "error: the disk is full" in capsys.readouterr().err
        pd.testing.assert_frame_equal(online(repo), before)
        assert offline.current_version(table) == version


def test_a_micro_batch_whose_commit_fails_leaves_the_online_store_as_it_was(
    spark, feast_repo_factory, tmp_path
) -> None:
    landing, cut = events(), BASE + 16 * H
    root = tmp_path / "repo"
    repo = repo_with(root, landing[landing["event_ts"] < cut], feast_repo_factory)
    table = repo.offline_path(PAIR_GROUP)
    with small_disk(root / "data" / "offline") as filler:
        stream(repo, available_now=True, progress=False, tracking=False).await_termination()
        before, version = online(repo), offline.current_version(table)
        assert before[WINDOW_END].notna().all()
        fill(filler)
        land(root, arrival_order(landing[landing["event_ts"] >= cut], pd.Timedelta(minutes=20), seed=6), 1, 2)
        with pytest.raises(Exception, match=r"(?i)no space left"):
            stream(repo, available_now=True, progress=False, tracking=False).await_termination()
        pd.testing.assert_frame_equal(online(repo), before)
        assert offline.current_version(table) == version
        filler.unlink()
        stream(repo, available_now=True, progress=False, tracking=False).await_termination()  # the batch again
    after = online(repo)
    assert (after[WINDOW_END] > before[WINDOW_END]).any()
