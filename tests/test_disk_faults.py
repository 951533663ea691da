"""Faults of the machine, not of the user's definitions: a full disk and a table file deleted by hand each end a
command with one `error:` line naming the cause and the fix, and no traceback. The disk is a real one: a small
tmpfs mounted over the offline tables' folder (as root, as CI runs)."""

from __future__ import annotations

import os
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from features import Entity, EventSource, Feature, FeatureGroup, Hop, agg
from features.cli import main
from features.demo import generate_transactions

SOURCE = EventSource(
    "transactions",
    path="data/transactions",
    timestamp="event_ts",
    schema={"user_id": "string", "amount": "double", "status": "string", "event_ts": "timestamp"},
)
GROUP = FeatureGroup(
    "spend",
    Entity("user", join_keys=["user_id"]),
    SOURCE,
    [Feature("amount_sum_1h", agg.sum("amount"), window=Hop("1h", every="5m"))],
)


def events():
    return generate_transactions(2_000, 200, datetime(2026, 1, 1, tzinfo=UTC), 3, seed=5)


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 24 KB file system of its own at tmp_path/small, unmounted after the test."""
    folder = tmp_path / "small"
    folder.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24k", "tmpfs", str(folder)], check=True)
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.mark.spark
def test_a_full_disk_is_one_error_line_with_the_fix(spark, feast_repo, small_disk: Path, capsys) -> None:
    root = feast_repo([GROUP], events())
    offline = root / "data" / "offline"
    offline.mkdir(parents=True, exist_ok=True)
    offline.rmdir()
    offline.symlink_to(small_disk)  # the offline tables on the small disk
    capsys.readouterr()
    status = main(["backfill", "--repo", str(root), "--start", "2026-01-01", "--end", "2026-01-04", "--no-tracking"])
    err = capsys.readouterr().err
    written = sum(f.stat().st_size for f in small_disk.rglob("*") if f.is_file())
    assert status == 2, (err, written, list(small_disk.rglob("*"))[:5])
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "No space left on device" in lines[0] and "Fix: free space" in lines[0], lines[0]


@pytest.mark.spark
def test_a_deleted_table_file_is_one_error_line_with_the_fix(spark, feast_repo, capsys) -> None:
    root = feast_repo([GROUP], events())
    args = ["backfill", "--repo", str(root), "--no-tracking", "--no-online"]
    assert main([*args, "--start", "2026-01-01", "--end", "2026-01-04"]) == 0
    [data_file] = (root / "data" / "offline" / "spend").glob("date=2026-01-02/*.parquet")
    data_file.unlink()  # by hand, as a clean-up gone wrong would
    capsys.readouterr()
    status = main([*args, "--start", "2026-01-02T06:00", "--end", "2026-01-02T12:00"])  # part of that day
    err = capsys.readouterr().err
    assert status == 2, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "is missing" in lines[0] and "features backfill --group spend --date 2026-01-02 --force" in lines[0]
    # The fix it names works.
    assert main([*args, "--group", "spend", "--date", "2026-01-02", "--force"]) == 0, capsys.readouterr().err
    assert main([*args, "--start", "2026-01-02T06:00", "--end", "2026-01-02T12:00"]) == 0
