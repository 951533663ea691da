"""How far a stream's query got, from its checkpoint's files alone (no Spark job): Spark's commit log says which
micro-batches finished, each batch's offsets file the watermark Spark handed it and the settings it ran with.

The files of committed batches are exactly the events the state holds (Spark's file source keeps each batch's
files in `sources/<n>/<batch>`, read by features.engine.source_log); files of a batch that did not commit are
read again by that batch when the stream continues. For a Kafka source the same holds of offsets: Spark's
connector keeps the offsets the query started from (`sources/0/0`) and each batch's end offsets
(`offsets/<batch>`), and the state holds the records between the first and the last committed batch's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from features.atomic import write_whole
from features.engine.kafka import OffsetRange
from features.engine.source_log import landed_before_ms, logged_files


@dataclass(frozen=True)
class Position:
    """How far a stream's checkpoint got: its last committed batch, the watermark that batch emitted up to (µs),
    and the source files its committed batches read (as Spark spells their URIs), or for a Kafka source the
    offsets they read. Files modified before `landed_before_ms` were read too, though the log no longer lists them
    (features.engine.source_log)."""

    batch: int | None
    watermark_us: int | None
    files: frozenset[str]
    offsets: OffsetRange | None = None
    landed_before_ms: int | None = None

    def file_count(self) -> str:
        older = "" if self.landed_before_ms is None else f" and those landed before {_iso(self.landed_before_ms)}"
        return f"{len(self.files):,} files{older}"


def last_commit(query_checkpoint: Path) -> tuple[int | None, int | None]:
    """The query's last committed micro-batch and the watermark it emitted up to (its offsets' batchWatermarkMs,
    in µs); (None, None) for a new checkpoint."""
    commits = _batches(query_checkpoint / "commits")
    if not commits:
        return None, None
    last = max(commits)
    return last, watermark_at(query_checkpoint, last)


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


EMITTED = "features-emitted.json"  # in the query's checkpoint folder, which a `--reset` removes with the logs


def record_emitted(query_checkpoint: Path, batch: int, watermark_us: int) -> None:
    """Note the watermark micro-batch `batch` emitted up to, once its rows are written. Its buckets emit up to the
    watermark the batch's own events set (features.engine.stream_operator.PaneProcessor), which Spark writes into the
    offsets of the next batch only; this is where a stopped stream's last batch keeps it."""
    write_whole(query_checkpoint / EMITTED, json.dumps({"batch": batch, "watermark_us": watermark_us}))


def watermark_at(query_checkpoint: Path, batch: int) -> int | None:
    """The watermark (µs) micro-batch `batch` emitted up to: the one recorded for it (`record_emitted`), else
    its offsets' batchWatermarkMs, the watermark Spark gave it. That one is never later than what the batch
    emitted (a batch without events emits nothing new; a batch of an earlier version of features emitted up to
    it), so an upgrade that builds the lookback from it reads a little more, never less."""
    recorded = query_checkpoint / EMITTED
    if recorded.exists():
        noted = json.loads(recorded.read_text())
        if noted["batch"] == batch:
            return int(noted["watermark_us"])
    return handed_watermark(query_checkpoint, batch)


def handed_watermark(query_checkpoint: Path, batch: int) -> int | None:
    """The watermark (µs) Spark handed micro-batch `batch` (its offsets' batchWatermarkMs): what an earlier
    version of features emitted the batch up to. None before Spark's first watermark."""
    ms = _offsets_metadata(query_checkpoint, batch).get("batchWatermarkMs")
    return ms * 1000 if ms else None


def state_partitions(query_checkpoint: Path) -> int | None:
    """The partitions of the query's stateful operator: the shuffle partitions its newest micro-batch ran with,
    which Spark keeps in the batch's offsets (None: no batch yet)."""
    batches = _batches(query_checkpoint / "offsets")
    if not batches:
        return None
    value = _offsets_metadata(query_checkpoint, max(batches)).get("conf", {}).get("spark.sql.shuffle.partitions")
    return int(value) if value else None


def _batches(log: Path) -> list[int]:
    """The micro-batch ids of a checkpoint log folder (`commits`, `offsets`)."""
    return [int(p.name) for p in log.glob("[0-9]*") if p.name.isdigit()]


def _offsets_metadata(query_checkpoint: Path, batch: int) -> dict[str, Any]:
    """The second line of a batch's offsets file: its watermark, time and the settings the query runs with."""
    lines = (query_checkpoint / "offsets" / str(batch)).read_text().splitlines()
    return json.loads(lines[1]) if len(lines) > 1 else {}


def committed_position(query_checkpoint: Path, batch: int | None = None) -> Position:
    """The position after committed micro-batch `batch` (default: the last one)."""
    last, watermark_us = last_commit(query_checkpoint)
    if last is None:
        return Position(None, None, frozenset())
    if batch is not None:
        last, watermark_us = batch, watermark_at(query_checkpoint, batch)
    initial = _kafka_start(query_checkpoint)
    if initial is not None:
        # One source, one topic: the batch's end offsets are the third line of its offsets file.
        [(topic, end)] = json.loads((query_checkpoint / "offsets" / str(last)).read_text().splitlines()[2]).items()
        start = {int(p): o for p, o in initial.get(topic, {}).items()}
        return Position(last, watermark_us, frozenset(), OffsetRange(topic, start, {int(p): o for p, o in end.items()}))
    files = logged_files(query_checkpoint, last)
    return Position(last, watermark_us, files, landed_before_ms=landed_before_ms(query_checkpoint))


def _kafka_start(query_checkpoint: Path) -> dict[str, dict[str, int]] | None:
    """The offsets a Kafka source's query started from, which Spark's connector keeps in `sources/0/0` (a NUL
    byte, a version line, the JSON of each partition's offset); None for a file source."""
    first = query_checkpoint / "sources" / "0" / "0"
    data = first.read_bytes() if first.exists() else b""
    if not data.startswith(b"\x00"):
        return None
    return json.loads(data[1:].decode().splitlines()[1])
