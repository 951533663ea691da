"""Spark's file-source log kept to the files it still needs (docs/streaming.md, "Running a stream for months").

Spark's file source writes the files each micro-batch read into its checkpoint (`sources/<n>/<batch>`, JSON lines
after a version line) and folds them every few batches into `<batch>.compact`, which holds every file the stream
ever read: it grows by a line per landed file for as long as the stream runs, and Spark rewrites it whole at each
fold. Spark itself needs only part of it. Its `maxFileAge` rule takes a file as new only when its modification time
is at most that age older than the newest file seen; older files are never read again, listed in the log or not.
So entries older than the newest entry's time less `FILE_AGE_MS` decide nothing, and `prune` drops them from the
newest `.compact` file; Spark's next fold starts from that file, so they stay out.

What the state holds is still known: the files a committed batch read are the log's entries, plus every file of
the folder modified before the cutoff of the last prune, kept in `PRUNED` (a definition change or a savepoint
reads them: features.engine.query_log.Position)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from features.atomic import replace_hadoop_file

DAY_MS = 86_400_000
FILE_AGE_MS = 7 * DAY_MS  # the file source's `maxFileAge` (Spark's default, set explicitly so the two agree)
FILE_AGE = "7d"
PRUNED = "features-pruned.json"  # in the query's `sources` folder: {"landed_before_ms": ...}
COMPACT = ".compact"
PRUNE_EVERY_S = 3600.0  # entries only age out as time passes: an hour's worth at a time is plenty


@dataclass(frozen=True)
class Pruned:
    entries: int  # entries dropped
    kept: int  # entries left in the newest compact file
    landed_before_ms: int  # every file modified before this is taken as read


def landed_before_ms(query_checkpoint: Path) -> int | None:
    """The cutoff of the last prune: files modified before it were read by the stream (None: never pruned)."""
    record = query_checkpoint / "sources" / PRUNED
    return json.loads(record.read_text())["landed_before_ms"] if record.exists() else None


def record_pruned(query_checkpoint: Path, cutoff_ms: int) -> None:
    """Note that the log no longer lists the files modified before `cutoff_ms` (a cutoff only moves forward)."""
    before = landed_before_ms(query_checkpoint)
    if before is not None and before >= cutoff_ms:
        return
    record = query_checkpoint / "sources" / PRUNED
    record.parent.mkdir(parents=True, exist_ok=True)
    replace_hadoop_file(record, json.dumps({"landed_before_ms": cutoff_ms}))


def logged_files(query_checkpoint: Path, last: int) -> frozenset[str]:
    """The files the log lists as read by the query's batches up to `last`, read as Spark reads it: the newest
    compact file and the source's batches after it (earlier files are Spark's to delete, and a pruned compact
    file lists less). The source numbers its own batches, which fall behind the query's at each batch that ran
    on no new file: `last`'s offsets say which of the source's batch it had read up to."""
    upto = _source_offset(query_checkpoint, last)
    files = set()
    for folder in _source_folders(query_checkpoint):
        compact = _newest_compact(folder)
        start, logs = (compact[0], [compact[1]]) if compact else (-1, [])
        for path in [*logs, *_deltas_after(folder, start)]:
            files.update(e["path"] for e in _entries(path) if e["batchId"] <= upto)
    return frozenset(files)


def batch_files(query_checkpoint: Path, batch: int) -> list[str] | None:
    """The files the query's `batch` reads, as its file sources' logs list them (each source's batches after the
    one the query's previous batch had read up to, up to the one `batch` reads up to), each once, in the log's
    order; None when the logs do not tell (a batch Spark has not logged, a log file gone)."""
    offsets = query_checkpoint / "offsets"
    if not (offsets / str(batch)).exists() or (batch > 0 and not (offsets / str(batch - 1)).exists()):
        return None
    found: dict[str, None] = {}
    for index, folder in enumerate(_source_folders(query_checkpoint)):
        upto = _source_offset(query_checkpoint, batch, index)
        after = _source_offset(query_checkpoint, batch - 1, index) if batch > 0 else -1
        for source_batch in range(after + 1, upto + 1):
            path = folder / str(source_batch)
            if not path.exists():
                path = folder / f"{source_batch}{COMPACT}"  # a fold's batch: its own entries are in the fold
            if not path.exists():
                return None
            found.update((e["path"], None) for e in _entries(path) if e["batchId"] == source_batch)
    return list(found)


def _entries(path: Path) -> list[dict[str, Any]]:
    """A log file's entries (each line after its version line, a JSON object)."""
    return [json.loads(line) for line in path.read_text().splitlines()[1:]]


def _source_offset(query_checkpoint: Path, batch: int, source: int = 0) -> int:
    """The file source's batch that the query's `batch` read up to (its offsets: a version line, the batch's
    metadata, then each source's offset, `{"logOffset": n}`, or "-" before it had any)."""
    line = (query_checkpoint / "offsets" / str(batch)).read_text().splitlines()[2 + source]
    return -1 if line.strip() == "-" else int(json.loads(line)["logOffset"])


def prune(query_checkpoint: Path) -> Pruned | None:
    """Drop from each file source's newest compact file the entries older than its newest entry less
    `FILE_AGE_MS`. The entries of the compact file's own batch stay: that batch may not have committed, and it
    runs again from them (the source moves one batch per micro-batch, so none before it can be pending). Called
    between Spark's writes to the log: in a micro-batch's sink, or with the query stopped. None when nothing
    went."""
    dropped, kept, cutoff = 0, 0, None
    for folder in _source_folders(query_checkpoint):
        compact = _newest_compact(folder)
        if compact is None:
            continue  # not folded yet, or a Kafka source's offsets
        batch, path = compact
        lines = path.read_text().splitlines()
        entries = [json.loads(line) for line in lines[1:]]
        later = [e for p in _deltas_after(folder, batch) for e in _entries(p)]
        newest = max((e["timestamp"] for e in entries + later), default=None)
        if newest is None:
            continue
        cut = newest - FILE_AGE_MS
        keep = [
            line for line, e in zip(lines[1:], entries, strict=True) if e["timestamp"] >= cut or e["batchId"] == batch
        ]
        if len(keep) == len(entries):
            continue
        # The cutoff is noted first: a prune cut short then leaves a log that still lists the files it names.
        record_pruned(query_checkpoint, cut)
        replace_hadoop_file(path, "\n".join([lines[0], *keep]))
        dropped, kept, cutoff = dropped + len(entries) - len(keep), kept + len(keep), cut
    return None if cutoff is None else Pruned(dropped, kept, cutoff)


class Pruning:
    """A running stream's pruning: at its first micro-batch, then at most once per `PRUNE_EVERY_S` (`clock`
    gives seconds; tests pass their own)."""

    def __init__(self, query_checkpoint: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.query_checkpoint, self.clock = query_checkpoint, clock
        self.due = float("-inf")

    def after_batch(self) -> Pruned | None:
        """Called in a micro-batch's sink, before it commits: Spark writes no log meanwhile."""
        now = self.clock()
        if now < self.due:
            return None
        self.due = now + PRUNE_EVERY_S
        return prune(self.query_checkpoint)


def _source_folders(query_checkpoint: Path) -> list[Path]:
    return sorted(p for p in (query_checkpoint / "sources").glob("*") if p.is_dir())


def _newest_compact(folder: Path) -> tuple[int, Path] | None:
    return max(((int(p.name.removesuffix(COMPACT)), p) for p in folder.glob(f"*{COMPACT}")), default=None)


def _deltas_after(folder: Path, batch: int) -> list[Path]:
    return [p for p in folder.iterdir() if p.name.isdigit() and int(p.name) > batch]
