"""What a group's runs set aside, and how long it is kept.

A stream writes a folder per micro-batch that had late events (`Repo.late_path(group)/batch=<id>`) and per
micro-batch or file with bad records or a failed validation (under `quarantine/<group>/`); backfills write a
folder per run that set anything aside. Over months that is an unbounded number of folders. They are copies
kept for inspection and healing (the events themselves stay in the source, where a backfill reads them again),
so each folder is kept for a retention period after it was written, then removed whole.

    held(repo, group)                       what is kept now, per kind: folders, files, bytes, the oldest
    sweep(repo, group, keep_s, now=...)     remove the folders written before now - keep_s; returns what went

The stream sweeps when it starts and then hourly (`features stream --retention`, default 30 days);
`features retention` reports and sweeps on demand.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from features.quality import quarantine_root
from features.repo import Repo

SWEEP_EVERY_S = 3600.0  # how often a running stream sweeps


@dataclass(frozen=True)
class Held:
    """One kind of set-aside data of a group: late events, bad records, or failed batches."""

    group: str
    kind: str  # "late" | "records" | "batches"
    folders: int
    files: int
    bytes: int
    oldest: datetime | None  # when the oldest folder was written

    def line(self) -> str:
        oldest = self.oldest.strftime("%Y-%m-%d %H:%M") if self.oldest else "-"
        return (
            f"{self.group:<24} {self.kind:<8} {self.folders:>8,} folders {self.files:>9,} files "
            f"{self.bytes / 1e6:>10.1f} MB  oldest {oldest}"
        )


def _kinds(repo: Repo, group: str) -> dict[str, Path]:
    root = quarantine_root(repo.root, group)
    return {"late": Path(repo.late_path(group)), "records": root / "records", "batches": root / "batches"}


def _folders(parent: Path) -> Iterator[Path]:
    """The set-aside folders under `parent` (one per batch, file or run); hidden ones are writes in progress."""
    if parent.is_dir():
        yield from (p for p in parent.iterdir() if p.is_dir() and not p.name.startswith("."))


def _written(folder: Path) -> float:
    return folder.stat().st_mtime


def _summary(group: str, kind: str, folders: list[Path]) -> Held:
    files = [f for folder in folders for f in folder.rglob("*") if f.is_file()]
    oldest = min((_written(f) for f in folders), default=None)
    when = None if oldest is None else datetime.fromtimestamp(oldest, UTC)
    return Held(group, kind, len(folders), len(files), sum(f.stat().st_size for f in files), when)


def held(repo: Repo, group: str) -> list[Held]:
    """What `group` keeps set aside now, per kind."""
    return [_summary(group, kind, list(_folders(parent))) for kind, parent in _kinds(repo, group).items()]


def sweep(repo: Repo, group: str, keep_s: float, *, now: float | None = None, dry_run: bool = False) -> list[Held]:
    """Remove `group`'s set-aside folders written more than `keep_s` seconds before `now` (the clock by
    default); returns what was removed (or would be, with `dry_run`), per kind."""
    cutoff = (time.time() if now is None else now) - keep_s
    out = []
    for kind, parent in _kinds(repo, group).items():
        old = [f for f in _folders(parent) if _written(f) < cutoff]
        out.append(_summary(group, kind, old))
        for folder in [] if dry_run else old:
            # Gone meanwhile: another sweep (a second stream, `features retention`) removed it.
            with suppress(FileNotFoundError):
                shutil.rmtree(folder)
    return out
