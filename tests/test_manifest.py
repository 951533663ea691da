"""The offline table's manifest (features.stores.manifest): what it records, atomic replacement, concurrent writers,
and the errors a damaged file gives. Unit tests: no Spark."""

from __future__ import annotations

import json
import multiprocessing
import threading
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest

from features.errors import ConfigError
from features.stores.manifest import (
    LOCK_FILE,
    MANIFEST_FILE,
    LateBatch,
    Manifest,
    manifest_path,
    read_manifest,
    update,
    write_manifest,
)

D1, D2, D3 = date(2026, 3, 1), date(2026, 3, 2), date(2026, 3, 3)
T = datetime(2026, 3, 4, 1, 30, tzinfo=UTC)
HASHES = {"txn_count_1h": "aaaa", "amount_sum_1h": "bbbb"}


def test_missing_manifest_is_empty(tmp_path: Path) -> None:
    manifest = read_manifest(tmp_path / "no_table", "g")
    assert manifest == Manifest("g") and manifest.completed() == []
    assert not (tmp_path / "no_table").exists()  # reading creates nothing


def test_round_trip_of_everything_it_records(tmp_path: Path) -> None:
    manifest = Manifest("g")
    manifest.record(D2, "def1", HASHES, 120, T)
    manifest.record(D1, "def1", HASHES, 0, T - timedelta(hours=1))
    manifest.remember_late(LateBatch("10", T, 3, (D1, D2), "5e1f"))
    manifest.remember_late(LateBatch("9", T, 1, ()))
    manifest.mark_stale([D1, D2, D3], ["10"], T)  # D3 is not completed: left alone
    write_manifest(tmp_path, manifest)

    again = read_manifest(tmp_path, "g")
    assert again == manifest
    assert again.completed() == [D1, D2]
    assert again.partitions[D2].rows == 120 and again.partitions[D2].feature_hashes == HASHES
    assert again.partitions[D1].stale is not None and again.partitions[D1].stale.late_batches == ("10",)
    assert D3 not in again.partitions
    # Human-readable JSON, late batches in numeric order.
    data = json.loads(manifest_path(tmp_path).read_text())
    assert data["format"] == 1 and data["group"] == "g"
    assert list(data["late_batches"]) == ["9", "10"]
    assert data["partitions"]["2026-03-02"]["definition_hash"] == "def1"
    assert data["partitions"]["2026-03-02"]["completed_at"] == T.isoformat()
    assert sorted(p.name for p in tmp_path.iterdir()) == [MANIFEST_FILE]  # no temporary file left


def test_recording_a_stale_day_consumes_its_late_batches(tmp_path: Path) -> None:
    manifest = Manifest("g")
    manifest.record(D1, "def1", HASHES, 5, T)
    manifest.mark_stale([D1], ["10"], T)
    manifest.mark_stale([D1], ["9", "10"], T)  # marks merge, numeric order
    assert manifest.partitions[D1].stale.late_batches == ("9", "10")
    entry = manifest.record(D1, "def2", HASHES, 7, T + timedelta(hours=1))
    assert entry.stale is None and entry.late_batches == ("9", "10")
    assert entry.definition_hash == "def2" and entry.rows == 7
    # Recorded again without a stale mark: nothing consumed this time.
    assert manifest.record(D1, "def2", HASHES, 7).late_batches == ()


def test_update_writes_back_and_not_on_error(tmp_path: Path) -> None:
    with update(tmp_path / "t", "g") as manifest:
        manifest.record(D1, "def1", HASHES, 1, T)
    assert read_manifest(tmp_path / "t", "g").completed() == [D1]
    assert (tmp_path / "t" / LOCK_FILE).is_file()
    with pytest.raises(RuntimeError), update(tmp_path / "t", "g") as manifest:
        manifest.record(D2, "def1", HASHES, 1, T)
        raise RuntimeError("the partition swap failed")
    assert read_manifest(tmp_path / "t", "g").completed() == [D1]


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("{not json", ["not a readable manifest", "JSONDecodeError", "delete it", "--since-last"]),
        ('{"format": 1, "partitions": {"2026-3-1": {}}}', ["not a readable manifest", "delete it"]),
        ('{"format": 1, "partitions": {"2026-03-01": {"rows": 1}}}', ["KeyError", "'definition_hash'"]),
        ("[1, 2]", ["not a readable manifest"]),
        ('{"format": 2}', ["format 2 is newer", "upgrade the features package"]),
        ('{"format": 1, "group": "other"}', ["belongs to group 'other', not 'g'", "delete the manifest"]),
    ],
    ids=["bad-json", "bad-date", "missing-field", "not-an-object", "newer-format", "other-group"],
)
def test_damaged_manifest_errors(tmp_path: Path, text: str, needles: list[str]) -> None:
    manifest_path(tmp_path).write_text(text)
    with pytest.raises(ConfigError) as info:
        read_manifest(tmp_path, "g")
    message = str(info.value)
    assert str(manifest_path(tmp_path)) in message and "\n" not in message
    for needle in needles:
        assert needle in message, message


def test_readers_never_see_a_partial_manifest(tmp_path: Path) -> None:
    """A reader polling while a writer replaces a large manifest always parses a whole one."""
    stop = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def read() -> None:
        while not stop.is_set():
            try:
                seen.append(len(read_manifest(tmp_path, "g").partitions))
            except BaseException as exc:
                errors.append(exc)
                return

    manifest = Manifest("g")
    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(150):
            manifest.record(D1 + timedelta(days=i), "def1", {f"f{j}": "h" * 16 for j in range(40)}, i, T)
            write_manifest(tmp_path, manifest)
    finally:
        stop.set()
        reader.join()
    assert not errors, errors[0]
    assert len(seen) > 10 and seen == sorted(seen)  # each read saw some whole version, never going back
    assert sorted(p.name for p in tmp_path.iterdir()) == [MANIFEST_FILE]


def _record_days(table: str, first: int, n: int) -> None:
    for i in range(first, first + n):
        with update(table, "g") as manifest:
            manifest.record(D1 + timedelta(days=i), "def1", HASHES, i, T)


def test_concurrent_writers_lose_no_record(tmp_path: Path) -> None:
    """Backfills in several processes record their own days in one manifest: every record stays."""
    table = str(tmp_path / "t")
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_record_days, args=(table, k * 15, 15)) for k in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
        assert worker.exitcode == 0
    manifest = read_manifest(table, "g")
    assert manifest.completed() == [D1 + timedelta(days=i) for i in range(45)]
    assert all(entry.rows == (day - D1).days for day, entry in manifest.partitions.items())
