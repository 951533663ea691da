"""The manifest of a group's offline table: which date partitions a backfill completed, and with what.

It is `_manifest.json` inside the table's folder (`data/offline/<group>/`): readers of the table skip
`_`-names, and removing the table removes its manifest too. Per date it holds the definition hash and the
feature hashes the partition was computed with, its rows, when it completed, the late-event batches its
computation consumed, and a stale mark when late events made it out of date. It also lists every late batch
already looked at, so that each is read once, and, per date, what the latest backfill of it set aside of the
source: whole files (unreadable, or not conforming to the source's schema), their events stamped that date, and
the bad records stamped that date (`set_aside_by_day`, for a status report).

Only a backfill records a date, and only after its partition was swapped into the table: rows the stream
appended for a date do not make it completed. The file is replaced atomically (written aside, then renamed
over the old one), so a reader sees the previous manifest or the next one, never a partial file. Changes go
through `update`, which holds an exclusive lock (`_manifest.lock`) for the read-modify-write, so that two
backfills of one group never lose each other's records.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from features.atomic import write_whole
from features.errors import ConfigError

FORMAT = 1
MANIFEST_FILE = "_manifest.json"
LOCK_FILE = "_manifest.lock"


@dataclass(frozen=True)
class Stale:
    """Why a completed partition no longer matches the source: late events arrived for its windows."""

    late_batches: tuple[str, ...]
    marked_at: datetime
    reason: str = "late events"


@dataclass(frozen=True)
class PartitionRecord:
    """One completed date partition of the table."""

    day: date
    definition_hash: str
    feature_hashes: Mapping[str, str]
    rows: int
    completed_at: datetime
    late_batches: tuple[str, ...] = ()  # the late batches whose events this computation was redone for
    stale: Stale | None = None
    # When the backfill began reading the source (the machine's clock, as file times are): a source file written
    # after it may hold events the partition lacks (features.pipelines.stale.landed_after). None in manifests
    # written before it was kept: their completion time stands in.
    source_read_at: datetime | None = None

    @property
    def read_at(self) -> datetime:
        return self.source_read_at or self.completed_at


@dataclass(frozen=True)
class LateBatch:
    """A batch of late events the schedule has looked at, and the completed dates it made stale."""

    batch: str
    seen_at: datetime
    events: int
    days: tuple[date, ...] = ()
    # Of the folder's files (names, sizes, times): a batch folder written again (a replayed micro-batch, or
    # ids starting over after the stream's --reset) is a new batch, even under a known id.
    signature: str = ""


@dataclass(frozen=True)
class SetAside:
    """What the latest backfill of a date set aside of the source's events stamped that date."""

    files: int  # files set aside whole that hold events of the date
    events: int  # their events stamped that date
    records: int  # bad records stamped that date (each set aside on its own)
    recorded_at: datetime

    @property
    def total_events(self) -> int:
        return self.events + self.records


@dataclass
class Manifest:
    group: str
    partitions: dict[date, PartitionRecord] = field(default_factory=dict)
    late_batches: dict[str, LateBatch] = field(default_factory=dict)
    set_aside: dict[date, SetAside] = field(default_factory=dict)

    def completed(self) -> list[date]:
        return sorted(self.partitions)

    def record(
        self,
        day: date,
        definition_hash: str,
        feature_hashes: Mapping[str, str],
        rows: int,
        completed_at: datetime | None = None,
        source_read_at: datetime | None = None,
    ) -> PartitionRecord:
        """Record `day` as completed; the late batches that had made it stale are consumed by it. Without
        `source_read_at` (a day recorded without reading the source again), the earlier record's stays."""
        before = self.partitions.get(day)
        if source_read_at is None and before is not None:
            source_read_at = before.source_read_at
        consumed = before.stale.late_batches if before is not None and before.stale is not None else ()
        entry = PartitionRecord(
            day,
            definition_hash,
            dict(feature_hashes),
            rows,
            completed_at or now_utc(),
            late_batches=consumed,
            source_read_at=source_read_at,
        )
        self.partitions[day] = entry
        return entry

    def mark_stale(self, days: Iterable[date], late_batches: Iterable[str], at: datetime | None = None) -> None:
        """Mark completed days stale because of late batches (days not completed are left alone: whichever
        backfill completes them reads the late events from the source anyway)."""
        batches = tuple(late_batches)
        for day in days:
            entry = self.partitions.get(day)
            if entry is None:
                continue
            known = entry.stale.late_batches if entry.stale is not None else ()
            merged = tuple(sorted(set(known) | set(batches), key=batch_order))
            self.partitions[day] = replace(entry, stale=Stale(merged, at or now_utc()))

    def remember_late(self, batch: LateBatch) -> None:
        self.late_batches[batch.batch] = batch

    def note_set_aside(self, day: date, files: int, events: int, records: int, at: datetime | None = None) -> None:
        """What a backfill of `day` set aside, replacing what an earlier one did (nothing set aside: no entry)."""
        if files or events or records:
            self.set_aside[day] = SetAside(files, events, records, at or now_utc())
        else:
            self.set_aside.pop(day, None)


def batch_order(batch: str) -> tuple[int, int | str]:
    """Numeric batch ids in numeric order (batch=9 before batch=10), others after them by name."""
    return (0, int(batch)) if batch.isdigit() else (1, batch)


def now_utc() -> datetime:
    return datetime.now(UTC)


def manifest_path(table: str | Path) -> Path:
    return Path(table) / MANIFEST_FILE


# ---------------------------------------------------------------------------------------------------------
# Reading and writing


def read_manifest(table: str | Path, group: str) -> Manifest:
    """The table's manifest (an empty one when no backfill completed a date of it yet)."""
    path = manifest_path(table)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return Manifest(group)
    try:
        data = json.loads(text)
        return _from_json(data, group, path)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(
            f"{path}: not a readable manifest ({type(exc).__name__}: {exc}); restore it, or delete it to treat "
            "every partition of the table as not computed (the next --since-last recomputes them)"
        ) from None


def set_aside_by_day(table: str | Path, group: str) -> dict[date, SetAside]:
    """Per date, what the latest backfill of it set aside (dates where it set nothing aside are left out)."""
    return dict(sorted(read_manifest(table, group).set_aside.items()))


def write_manifest(table: str | Path, manifest: Manifest) -> None:
    """Replace the manifest atomically: written to a hidden file beside it, then renamed over it."""
    path = manifest_path(table)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(path, json.dumps(_to_json(manifest), indent=1) + "\n")


@contextmanager
def update(table: str | Path, group: str) -> Iterator[Manifest]:
    """Read the manifest under an exclusive lock, let the caller change it, write it back (not on error)."""
    folder = Path(table)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOCK_FILE, "a") as lock:
        _lock(lock.fileno())
        manifest = read_manifest(folder, group)
        yield manifest
        write_manifest(folder, manifest)


def _lock(fd: int) -> None:
    try:
        import fcntl
    except ImportError:  # not a POSIX system: single writer assumed
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        # Some network/FUSE file systems do not implement flock; the atomic rename still keeps the file whole.
        return


# ---------------------------------------------------------------------------------------------------------
# JSON


def _time(value: datetime) -> str:
    return value.astimezone(UTC).isoformat()


def _parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value).astimezone(UTC)


def _to_json(manifest: Manifest) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "group": manifest.group,
        "partitions": {day.isoformat(): _partition_json(entry) for day, entry in sorted(manifest.partitions.items())},
        "late_batches": {
            batch.batch: {
                "seen_at": _time(batch.seen_at),
                "events": batch.events,
                "days": [d.isoformat() for d in batch.days],
                "signature": batch.signature,
            }
            for batch in sorted(manifest.late_batches.values(), key=lambda b: batch_order(b.batch))
        },
        "set_aside": {
            day.isoformat(): {
                "files": entry.files,
                "events": entry.events,
                "records": entry.records,
                "recorded_at": _time(entry.recorded_at),
            }
            for day, entry in sorted(manifest.set_aside.items())
        },
    }


def _partition_json(entry: PartitionRecord) -> dict[str, Any]:
    data: dict[str, Any] = {
        "definition_hash": entry.definition_hash,
        "feature_hashes": dict(entry.feature_hashes),
        "rows": entry.rows,
        "completed_at": _time(entry.completed_at),
        "late_batches": list(entry.late_batches),
    }
    if entry.source_read_at is not None:
        data["source_read_at"] = _time(entry.source_read_at)
    if entry.stale is not None:
        data["stale"] = {
            "reason": entry.stale.reason,
            "late_batches": list(entry.stale.late_batches),
            "marked_at": _time(entry.stale.marked_at),
        }
    return data


def _from_json(data: dict[str, Any], group: str, path: Path) -> Manifest:
    version = data.get("format")
    if not isinstance(version, int) or version > FORMAT:
        raise ConfigError(
            f"{path}: manifest format {version!r} is newer than this version of features reads ({FORMAT}); "
            "upgrade the features package on this machine"
        )
    if data.get("group", group) != group:
        raise ConfigError(
            f"{path}: the manifest belongs to group {data['group']!r}, not {group!r}; the table folder was copied "
            "or renamed: delete the manifest to recompute the table"
        )
    partitions = {}
    for day_text, entry in data.get("partitions", {}).items():
        day = date.fromisoformat(day_text)
        stale = entry.get("stale")
        partitions[day] = PartitionRecord(
            day=day,
            definition_hash=str(entry["definition_hash"]),
            feature_hashes={str(k): str(v) for k, v in entry["feature_hashes"].items()},
            rows=int(entry["rows"]),
            completed_at=_parse_time(entry["completed_at"]),
            late_batches=tuple(str(b) for b in entry.get("late_batches", [])),
            stale=None
            if stale is None
            else Stale(
                tuple(str(b) for b in stale["late_batches"]),
                _parse_time(stale["marked_at"]),
                str(stale.get("reason", "late events")),
            ),
            source_read_at=_parse_time(entry["source_read_at"]) if "source_read_at" in entry else None,
        )
    late = {
        str(batch): LateBatch(
            str(batch),
            _parse_time(entry["seen_at"]),
            int(entry.get("events", 0)),
            tuple(date.fromisoformat(d) for d in entry.get("days", [])),
            str(entry.get("signature", "")),
        )
        for batch, entry in data.get("late_batches", {}).items()
    }
    set_aside = {
        date.fromisoformat(day): SetAside(
            int(entry["files"]), int(entry["events"]), int(entry["records"]), _parse_time(entry["recorded_at"])
        )
        for day, entry in data.get("set_aside", {}).items()
    }
    return Manifest(group, partitions, late, set_aside)
