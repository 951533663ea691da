"""Late events and quarantined data are kept for a retention period (features.pipelines.retention): reported, swept on
demand and by the stream itself. The clock is the test's: folders are dated with os.utime."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pandas as pd
import pytest
from test_stream import land

from features import Entity, EventSource, Feature, FeatureGroup, Hop, agg
from features.cli import main
from features.pipelines.retention import held, sweep
from features.pipelines.stream import stream
from features.quality import quarantine_root
from features.repo import Repo

DAY = 86400.0
GROUP = FeatureGroup(
    "kept",
    Entity("user", join_keys=["user_id"]),
    EventSource("transactions", path="data/transactions", timestamp="event_ts", watermark="5m"),
    [Feature("n_1h", agg.count(), window=Hop("1h", every="10m"))],
)
EVENTS = pd.DataFrame(
    {"user_id": ["u1", "u2"], "event_ts": pd.to_datetime(["2026-03-02 00:01", "2026-03-02 00:02"], utc=True)}
)


def _aside(folder: Path, days_old: float, now: float, files: int = 1) -> Path:
    folder.mkdir(parents=True)
    for i in range(files):
        (folder / f"part-{i}.parquet").write_bytes(b"x" * 100)
    os.utime(folder, (now - days_old * DAY, now - days_old * DAY))
    return folder


@pytest.fixture
def repo(feast_repo, tmp_path) -> Repo:
    return Repo.load(feast_repo([GROUP], EVENTS, apply=False))


def test_sweep_removes_only_what_is_older_than_the_retention(repo: Repo) -> None:
    now = time.time()
    late = Path(repo.late_path(GROUP))
    records = quarantine_root(repo.root, GROUP.name) / "records"
    _aside(late / "batch=1", 40, now, files=2)
    _aside(late / "batch=9", 2, now)
    _aside(records / "stream-b1", 31, now)
    _aside(quarantine_root(repo.root, GROUP.name) / "batches" / "stream-b2", 29, now)

    would = {h.kind: h for h in sweep(repo, GROUP.name, 30 * DAY, now=now, dry_run=True)}
    assert (would["late"].folders, would["late"].files, would["late"].bytes) == (1, 2, 200)
    assert would["records"].folders == 1 and would["batches"].folders == 0
    assert (late / "batch=1").exists()  # a dry run removes nothing

    sweep(repo, GROUP.name, 30 * DAY, now=now)
    assert sorted(p.name for p in late.iterdir()) == ["batch=9"]
    assert not (records / "stream-b1").exists()
    kept = {h.kind: h for h in held(repo, GROUP.name)}
    assert (kept["late"].folders, kept["records"].folders, kept["batches"].folders) == (1, 0, 1)
    assert kept["batches"].oldest is not None and kept["batches"].oldest.timestamp() == pytest.approx(now - 29 * DAY)


def test_the_retention_command_reports_and_sweeps(repo: Repo, capsys) -> None:
    now = time.time()
    _aside(Path(repo.late_path(GROUP)) / "batch=1", 3, now)
    assert main(["retention", "--repo", str(repo.root), "--keep", "7d"]) == 0
    out = capsys.readouterr().out
    assert "held:    kept" in out and "removed" not in out
    assert main(["retention", "--repo", str(repo.root), "--keep", "1d", "--dry-run"]) == 0
    assert "would remove: kept" in capsys.readouterr().out and (Path(repo.late_path(GROUP)) / "batch=1").exists()
    assert main(["retention", "--repo", str(repo.root), "--keep", "1d"]) == 0
    assert "removed: kept" in capsys.readouterr().out and not (Path(repo.late_path(GROUP)) / "batch=1").exists()
    assert main(["retention", "--repo", str(repo.root), "--keep", "a while"]) == 2
    assert "--keep" in capsys.readouterr().err


@pytest.mark.spark
def test_a_stream_sweeps_what_an_earlier_run_left_beyond_its_retention(spark, feast_repo, tmp_path) -> None:
    root = feast_repo([GROUP], EVENTS)
    repo = Repo.load(root)
    now = time.time()
    old = _aside(Path(repo.late_path(GROUP)) / "batch=1", 8, now)
    recent = _aside(quarantine_root(repo.root, GROUP.name) / "records" / "stream-b1", 6, now)
    stream(repo, available_now=True, progress=False, tracking=False, retention="7d").await_termination()
    assert not old.exists() and recent.exists()
    land(root, EVENTS, 1, start_index=5)
    stream(repo, available_now=True, progress=False, tracking=False, retention=None).await_termination()
    assert recent.exists()
