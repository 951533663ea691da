"""The Spark side of savepoints (docs/streaming.md, "Savepoints"): a stream's state written as plain Parquet rows
of pane partials, those rows regrouped into the buckets of a new stream, and the source position of a new
checkpoint set to the files the savepoint's state holds.

A savepoint's `panes/` are Parquet files of pane rows: the group's key columns as themselves, `fx_pane` (the
pane's start in µs since the epoch, or the smallest int64 for a Lifetime key's base row), and the partial columns
of the state's layout (`features.kernel.migrate.Layout`: `fx_n<i>` a `where`'s counts, `<feature>.<part>` a
feature's partials). They depend on neither the state store nor this package's in-state encoding, which is why
a later version of `features`, whose state format differs, reads them.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import functions as F

from features import kernel
from features.atomic import replace_hadoop_file
from features.engine.inputs import bucket_of
from features.engine.kafka import OffsetRange, offsets_json
from features.engine.query_log import Position
from features.engine.state_upgrade import BLOB, BUCKET, PART, PART_ROWS, rebucket_state
from features.kernel.state import panes_from_arrow, panes_to_arrow
from features.spec import DType, FeatureGroup

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PANES = "panes"


@dataclass(frozen=True)
class Dumped:
    keys: int
    rows: int
    emitted_upto_us: int | None  # the least watermark any bucket had emitted up to
    newest_us: int | None  # the newest event time the buckets had seen


def dump_panes(
    spark: SparkSession,
    query_checkpoint: Path,
    group: FeatureGroup,
    key_types: dict[str, DType],
    batch: int,
    folder: Path,
) -> Dumped:
    """Every key's pane rows in the stream's state after committed micro-batch `batch`, as Parquet files in
    `folder/panes` (read with Spark's state data source; each file is written here, one stored part at a time)."""
    blobs = folder / "_blobs"
    moved = rebucket_state(spark, query_checkpoint, group, key_types, [0], blobs, batch)
    out = folder / PANES
    out.mkdir(parents=True, exist_ok=True)
    rows = 0
    for path in sorted(blobs.rglob("*.parquet")):
        for record in pq.ParquetFile(path).iter_batches(batch_size=1, columns=[PART, BLOB]):
            part, blob = record[PART][0].as_py(), record[BLOB][0].as_py()
            frame = kernel.read_frame(blob)
            rows += len(frame)
            pq.write_table(panes_to_arrow(frame), out / f"part-{part:09d}.parquet")
    shutil.rmtree(blobs)
    return Dumped(moved.keys, rows, moved.emitted_upto_us, moved.newest_us)


def regroup_panes(spark: SparkSession, group: FeatureGroup, folder: Path, labels: list[int], out: Path) -> None:
    """A savepoint's pane rows as a new stream's buckets take them (`labels`): per bucket, stored as the built
    panes of a definition change are (features.engine.state_upgrade.PendingUpgrade)."""
    files = sorted((folder / PANES).glob("*.parquet"))
    if not files:
        return  # a state without keys: every bucket starts empty
    schema = pq.read_schema(files[0])

    def pack(table: pa.Table) -> pa.Table:  # no hints: PySpark infers the UDF type from them
        bucket = int(table[BUCKET][0].as_py())
        frame = panes_from_arrow(table.drop_columns([BUCKET]).rename_columns(schema.names).cast(schema))
        blobs = [kernel.to_bytes(frame.iloc[i : i + PART_ROWS]) for i in range(0, len(frame), PART_ROWS)]
        return pa.table(
            {
                BUCKET: pa.array([bucket] * len(blobs), pa.int64()),
                PART: pa.array(range(len(blobs)), pa.int32()),
                BLOB: pa.array(blobs, pa.binary()),
            }
        )

    read = spark.read.parquet(*[str(f) for f in files])
    # Partial columns are named `<feature>.<part>`, which Spark would take for a struct's field: renamed by position.
    columns = [F.col(f"`{name}`").alias(f"fx_{i}") for i, name in enumerate(schema.names)]
    rows = read.select(bucket_of(group, labels).alias(BUCKET), *columns)
    packed = rows.groupBy(BUCKET).applyInArrow(pack, f"{BUCKET} bigint, {PART} int, {BLOB} binary")
    packed.write.mode("overwrite").parquet(str(out))


def held_files(spark: SparkSession, position: Position, source: str) -> frozenset[str]:
    """Every file of the source whose events the state holds: those the log lists, and those modified before the
    cutoff of its last prune (features.engine.source_log), listed here so that a savepoint names each file and
    does not depend on modification times, which a copy of the folder elsewhere does not keep."""
    if position.landed_before_ms is None:
        return position.files
    # Spark's own listing (without reading the files' bytes): the same files, hidden ones aside, as the stream's.
    listed = spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(source)
    older = listed.where(F.col("modificationTime") < F.timestamp_millis(F.lit(position.landed_before_ms)))
    return position.files | {row.path for row in older.select("path").collect()}


def relative_files(files: frozenset[str], source: str) -> list[str]:
    """The files a stream read, relative to its source folder where they lie in it (else their URIs as given),
    so that a savepoint can be restored where the folder lives at another path. Each file once, however Spark
    spelled it (its stream's log writes `file:///...`, its listing `file:/...`)."""
    root = Path(source).resolve() if "://" not in source else None
    out = set()
    for uri in files:
        local = _local(uri)
        if root is not None and local is not None and local.is_relative_to(root):
            out.add(local.relative_to(root).as_posix())
        else:
            out.add(uri)
    return sorted(out)


def source_uris(files: list[str], source: str) -> list[str]:
    """`relative_files` back to URIs as Spark's file source lists them (`file:///...`) under `source`."""
    root = Path(source).resolve() if "://" not in source else None
    return [f if "://" in f or root is None else (root / f).as_uri() for f in files]


def set_position(
    query_checkpoint: Path, files: list[str], watermark_us: int | None, kafka: OffsetRange | None = None
) -> None:
    """Make a new checkpoint's one committed micro-batch (batch 0, run over no events) stand where the savepoint's
    stream stood: its file sources' logs list `files` as read by it, so that the stream goes on with the files
    landed since (Spark's FileStreamSource takes every file its log lists as seen), and its offsets and commit
    carry the watermark the state emitted up to. For a Kafka source (`kafka`), the source's log becomes what
    Spark's connector writes: the offsets the state's first batch started from (`sources/0/0`), and batch 0's
    end offsets the savepoint's, from which the stream reads on.

    Spark's logs are JSON lines after a version line; these are the batch-0 files Spark itself wrote a moment
    before, with their entries replaced."""
    for log in sorted((query_checkpoint / "sources").glob("*/0")):
        version, seed = log.read_text().splitlines()[:2]  # the seed's one file, an entry as Spark writes them
        if kafka is not None:
            replace_hadoop_file(log, "\x00" + f"{version}\n{offsets_json(kafka.topic, kafka.start)}")
            continue
        entry = json.loads(seed)
        entries = [json.dumps({**entry, "path": f, "timestamp": _mtime_ms(f), "batchId": 0}) for f in files]
        replace_hadoop_file(log, "\n".join([version, *entries]))
    ms = (watermark_us or 0) // 1000
    offsets = query_checkpoint / "offsets" / "0"
    lines = offsets.read_text().splitlines()
    metadata = json.loads(lines[1])
    metadata["batchWatermarkMs"] = ms
    positions = lines[2:] if kafka is None else [offsets_json(kafka.topic, kafka.end)]
    replace_hadoop_file(offsets, "\n".join([lines[0], json.dumps(metadata), *positions]))
    commit = query_checkpoint / "commits" / "0"
    lines = commit.read_text().splitlines()
    replace_hadoop_file(commit, "\n".join([lines[0], json.dumps({**json.loads(lines[1]), "nextBatchWatermarkMs": ms})]))


def _mtime_ms(uri: str) -> int:
    path = _local(uri)
    return int(path.stat().st_mtime * 1000) if path is not None and path.exists() else 0


def _local(uri: str) -> Path | None:
    """A local file's path from its URI (`file:///...`, or a plain path); None for other stores."""
    parsed = urlparse(uri)
    return Path(unquote(parsed.path)) if parsed.scheme in ("", "file") else None
