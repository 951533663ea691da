"""Stale partitions: which completed days of a group a changed definition or the stream's late events make
wrong, so that `features backfill --date/--since-last` recomputes them (features.pipelines.schedule_plan).

An event at time ts changes the window ends in (ts, ts + size + every] of each feature, so the completed days
holding those ends are stale; a `Lifetime` window changes at every later window end, so a late event makes
every completed day from its own on stale (recomputing them costs little more than one day: a Lifetime group
reads the whole source for any day anyway). The stream writes events that arrive behind its watermark to
`Repo.late_path(group)` as `batch=<id>/*.parquet`; each batch is read once, and remembered in the manifest by
a signature of its files.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from features.kernel.panes import MICROS, WindowShape
from features.repo import Repo
from features.spec import FeatureGroup
from features.spec.fingerprint import definition_hash, feature_hashes
from features.stores.manifest import LateBatch, Manifest, PartitionRecord, batch_order

DAY_US = 86_400 * MICROS
EPOCH = date(1970, 1, 1)


def definition_change(recorded: Mapping[str, str], current: Mapping[str, str]) -> str:
    """What changed between the feature hashes a partition was computed with and the current ones."""
    added = sorted(set(current) - set(recorded))
    removed = sorted(set(recorded) - set(current))
    changed = sorted(n for n in set(recorded) & set(current) if recorded[n] != current[n])
    parts = [
        f"{what} feature{'s' if len(names) > 1 else ''} {', '.join(map(repr, names))}"
        for what, names in (("added", added), ("removed", removed), ("changed", changed))
        if names
    ]
    return "definition changed" + (": " + "; ".join(parts) if parts else "")


def affected_days(group: FeatureGroup, event_us: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Per event time, the first and last day (days since 1970-01-01) of the window ends it changes;
    the last is None when a Lifetime window makes every later day change."""
    ts = np.asarray(event_us, dtype=np.int64)
    firsts, lasts = [], []
    for shape in {WindowShape.of(f.window) for f in group.features}:
        pane = ts - ts % shape.every_us
        firsts.append(pane + shape.every_us)  # the pane enters
        lasts.append(None if shape.size_us is None else pane + shape.size_us + shape.every_us)  # it leaves
    first = np.minimum.reduce(firsts) // DAY_US
    if any(last is None for last in lasts):
        return first, None
    return first, np.maximum.reduce(lasts) // DAY_US


def stale_days(group: FeatureGroup, event_us: np.ndarray, completed: Iterable[date]) -> list[date]:
    """The completed days whose partitions events at these times change."""
    done = sorted(completed)
    if len(event_us) == 0 or not done:
        return []
    first, last = affected_days(group, event_us)
    if last is None:
        start = EPOCH + timedelta(days=int(first.min()))
        return [d for d in done if d >= start]
    spans_ = np.unique(np.stack([first, last], axis=1), axis=0)
    out = []
    for day in done:
        n = (day - EPOCH).days
        if np.any((spans_[:, 0] <= n) & (n <= spans_[:, 1])):
            out.append(day)
    return out


def late_batch_folders(repo: Repo, group: FeatureGroup) -> dict[str, Path]:
    """The stream's late-event batches of a group: `batch=<id>` folders (hidden or staged ones skipped)."""
    root = Path(repo.late_path(group))
    if not root.is_dir():
        return {}
    found = {p.name.split("=", 1)[1]: p for p in root.glob("batch=*") if p.is_dir() and p.name != "batch="}
    return dict(sorted(found.items(), key=lambda item: batch_order(item[0])))


def _data_files(folder: Path) -> list[Path]:
    """A batch folder's Parquet files (Spark's _SUCCESS, .crc and hidden staging files skipped)."""
    return sorted(
        f for f in folder.rglob("*.parquet") if not any(p.startswith((".", "_")) for p in f.relative_to(folder).parts)
    )


def batch_signature(folder: Path) -> str:
    """Changes when the batch folder is written again (file names, sizes and modification times)."""
    import hashlib

    stats = [(str(f.relative_to(folder)), f.stat().st_size, f.stat().st_mtime_ns) for f in _data_files(folder)]
    return hashlib.sha256(repr(stats).encode()).hexdigest()[:16]


def late_event_micros(folder: Path, timestamp: str) -> np.ndarray:
    """The event times (UTC microseconds) in a late batch's Parquet files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = _data_files(folder)
    if not files:
        return np.empty(0, dtype=np.int64)
    try:
        column = pa.concat_arrays(
            [chunk for f in files for chunk in pq.read_table(f, columns=[timestamp]).column(0).chunks]
        )
    except (pa.ArrowException, KeyError, OSError) as exc:
        from features.errors import DataError

        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise DataError(
            f"{folder}: cannot read the late events' {timestamp!r} column ({reason}); the stream writes the "
            "source's columns there; move the folder away if it is not one of its late batches"
        ) from exc
    return _micros(column)


def _micros(column: Any) -> np.ndarray:
    """An Arrow column of event times (timestamps of any unit, or text) as UTC microseconds, nulls dropped."""
    import pyarrow as pa

    if pa.types.is_timestamp(column.type):
        micros = column.cast(pa.timestamp("us", tz=column.type.tz), safe=False).cast(pa.int64())
        return micros.drop_null().to_numpy()
    import pandas as pd

    parsed = pd.to_datetime(pd.Series(column.to_pylist()), utc=True, errors="coerce").dropna()
    return parsed.dt.as_unit("us").astype("int64").to_numpy()


def landed_after(repo: Repo, group: FeatureGroup, manifest: Manifest) -> dict[date, list[str]]:
    """Completed days that source files written after the day's backfill began reading change, with those
    files' names: a day's export that landed late, after its day was computed. Only files newer than the oldest
    such read are opened (their timestamp column alone); a file that cannot be read is the jobs' to set aside."""
    if not manifest.partitions:
        return {}
    oldest = min(entry.read_at for entry in manifest.partitions.values()).timestamp()
    folder = Path(repo.source_path(group))
    out: dict[date, list[str]] = {}
    for file, written in _source_files(folder, group.source.format, oldest):
        events = _file_micros(file, group.source.format, group.source.timestamp)
        if events is None:
            continue
        behind = [d for d, e in manifest.partitions.items() if e.read_at.timestamp() < written]
        for day in stale_days(group, events, behind):
            out.setdefault(day, []).append(file.relative_to(folder).as_posix())
    return out


def _source_files(folder: Path, fmt: str, after: float) -> list[tuple[Path, float]]:
    """The source's data files written after `after` (seconds since the epoch), with their times; hidden and
    `_` names skipped, as Spark skips them."""
    if not folder.is_dir():
        return []
    pattern = "*.parquet" if fmt == "parquet" else "*"
    found = []
    for file in folder.rglob(pattern):
        if any(p.startswith((".", "_")) for p in file.relative_to(folder).parts) or not file.is_file():
            continue
        written = file.stat().st_mtime
        if written > after:
            found.append((file, written))
    return sorted(found)


def _file_micros(file: Path, fmt: str, timestamp: str) -> np.ndarray | None:
    import pyarrow as pa

    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            return _micros(pq.read_table(file, columns=[timestamp]).column(0))
        import pandas as pd

        frame = pd.read_json(file, lines=True, dtype=False)
        if timestamp not in frame.columns:
            return None
        return _micros(pa.array(frame[timestamp].astype("string").tolist(), pa.string()))
    except (pa.ArrowException, KeyError, OSError, ValueError):
        return None


def new_late_batches(repo: Repo, group: FeatureGroup, manifest: Manifest, now: datetime) -> dict[str, LateBatch]:
    """Late batches not looked at before (or written again since), each with the completed days it makes
    stale."""
    completed = manifest.completed()
    out = {}
    for batch, folder in late_batch_folders(repo, group).items():
        signature = batch_signature(folder)
        known = manifest.late_batches.get(batch)
        if known is not None and known.signature == signature:
            continue
        events = late_event_micros(folder, group.source.timestamp)
        out[batch] = LateBatch(batch, now, len(events), tuple(stale_days(group, events, completed)), signature)
    return out


def stale_partitions(
    group: FeatureGroup,
    manifest: Manifest,
    new_late: dict[str, LateBatch],
    landed: Mapping[date, list[str]] | None = None,
) -> dict[date, str]:
    """Completed days to recompute, with why: another definition, late events (known or new), or source files
    that landed after the day was computed (`landed_after`)."""
    current, hashes = definition_hash(group), feature_hashes(group)
    out = {}
    for day, entry in manifest.partitions.items():
        reasons = []
        if entry.definition_hash != current:
            reasons.append(definition_change(entry.feature_hashes, hashes))
        late = late_batches(entry, day, new_late)
        if late:
            reasons.append("late events in " + ", ".join(f"batch={b}" for b in sorted(late, key=batch_order)))
        files = (landed or {}).get(day)
        if files:
            more = f" and {len(files) - 1} more" if len(files) > 1 else ""
            reasons.append(f"source files landed after it was computed: {files[0]}{more}")
        if reasons:
            out[day] = "; ".join(reasons)
    return out


def late_batches(entry: PartitionRecord, day: date, new_late: dict[str, LateBatch]) -> set[str]:
    late = set(entry.stale.late_batches) if entry.stale is not None else set()
    return late | {b.batch for b in new_late.values() if day in b.days}


def changed_features(
    group: FeatureGroup, manifest: Manifest, new_late: dict[str, LateBatch], days: Iterable[date]
) -> dict[date, tuple[str, ...] | None]:
    """Per day, the features a recompute needs: the added and changed ones, when the day was completed with the
    current definition of the others and no late event changed it (() when features were only removed: nothing to
    compute); None (all of them) otherwise."""
    hashes = feature_hashes(group)
    out: dict[date, tuple[str, ...] | None] = {}
    for day in days:
        entry = manifest.partitions.get(day)
        if entry is None or late_batches(entry, day, new_late):
            out[day] = None
            continue
        names = tuple(n for n, h in hashes.items() if entry.feature_hashes.get(n) != h)
        removed = set(entry.feature_hashes) - set(hashes)
        # Nothing added, changed or removed: the day is recomputed for another reason (a range asked for, a
        # change of the group's own settings), which needs every feature.
        out[day] = None if len(names) == len(hashes) or not (names or removed) else names
    return out
