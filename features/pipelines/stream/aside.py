"""What a stream's micro-batch sets aside instead of writing to the stores: events behind the watermark (the
late-events folder), bad source records and landed files that cannot be read (the quarantine), each with its
reason; and the hourly sweep of what was set aside longer ago than the retention (features.pipelines.retention)."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from features import quality
from features.engine import files, schema, stream_operator, stream_rows
from features.engine.batch import ARROW_TYPES
from features.engine.stream_source import StreamSource
from features.kernel import TS
from features.pipelines.retention import SWEEP_EVERY_S, held, sweep
from features.pipelines.rollup import MetricRollup
from features.repo import Repo
from features.spec import DType, FeatureGroup
from features.stores.feast_objects import source_schema

# A batch's late events up to this many are written from the driver, with the batch's stats rows collected in the
# same job: Spark's write of a few rows is a job of its own, 0.15 s of a 3 s micro-batch (bench/stream_profile.py).
DRIVER_LATE_ROWS = 10_000


class SetAside:
    """One group's late events, bad records and unreadable files, written as a micro-batch finds them."""

    def __init__(
        self,
        repo: Repo,
        group: FeatureGroup,
        spark: SparkSession,
        source: StreamSource,
        record_schema: str,
        rollup: MetricRollup,
        keep_s: float | None,
        nanoseconds: bool,
        nulls: bool,
    ) -> None:
        self.repo, self.group, self.spark, self.source, self.rollup = repo, group, spark, source, rollup
        self.record_schema = record_schema  # a bad record's columns (stream_operator.Projection.record_schema)
        # The reads the stream's checkpoint started with (stream_source.read_stream): whether it reads nanosecond
        # files, and files holding a column as Arrow's null type.
        self.nanoseconds, self.nulls = nanoseconds, nulls
        self.keep_s, self.swept = keep_s, None
        self.file_check: files.FileCheck | None = None  # unreadable Parquet files, checked as they land
        self.checked: set[str] = set()
        self.key_types: dict[str, Any] | None = None  # the join keys' types, read once
        self.sweep(-1)  # before the first batch: what an earlier run left beyond the retention

    def collects_late(self, late: int) -> bool:
        """Whether a batch's `late` events (some) are collected to the driver to be written from there."""
        if not 0 < late <= DRIVER_LATE_ROWS:
            return False
        return all(t in (DType.STRING, DType.INT64) for t in self._key_types().values())

    def write(
        self,
        batch: DataFrame,
        batch_id: int,
        counts: dict[str, int],
        late_records: list[str] | None = None,
        landed: list[str] | None = None,
    ) -> tuple[int, int]:
        """Set aside the batch's late events and bad records (their rows counted in `counts` by kind), and the
        landed files found unreadable since the last batch; returns (late events, bad records). `late_records`:
        the late events' records, when collected (`collects_late`); `landed`: the files the batch read, when its
        source's log tells (else the folder is listed)."""
        late = counts.get(stream_rows.LATE, 0)
        if late:
            folder = Path(self.repo.late_path(self.group)) / f"batch={batch_id}"
            write_late(self.group, self._key_types(), batch if late_records is None else late_records, folder, batch_id)
        bad = counts.get(stream_rows.BAD, 0)
        if bad:
            self._write_bad(batch, batch_id)
        return late, bad + self._set_aside_unreadable_files(landed)

    def sweep(self, batch_id: int) -> None:
        """Remove what was set aside longer ago than the retention (hourly); log what is held."""
        if self.keep_s is None or (self.swept is not None and time.monotonic() - self.swept < SWEEP_EVERY_S):
            return
        self.swept = time.monotonic()
        sweep(self.repo, self.group.name, self.keep_s)
        kept = {
            f"aside.{h.kind}.{unit}": getattr(h, unit)
            for h in held(self.repo, self.group.name)
            for unit in ("files", "bytes")
        }
        self.rollup.add(kept, max(batch_id, 0), self.group.name)

    def _write_bad(self, batch: DataFrame, batch_id: int) -> None:

        # The columns of the backfill's quarantined records (features.engine.source.SourceRead.rejected); the batch
        # id is in the folder's name.
        bad = batch.where(F.col(stream_rows.KIND) == stream_rows.BAD).select(
            F.col(stream_rows.REASON).alias(schema.REASON),
            F.from_json(F.col(stream_rows.RECORD), self.record_schema).alias("r"),
        )
        bad = bad.select(schema.REASON, "r.*")
        if self.group.source.format != "json" and self.group.source.kafka is None:
            bad = bad.drop(schema.RAW_RECORD)  # only a JSON text has a raw text beside its parsed columns
        folder = quality.quarantine_root(self.repo.root, self.group.name) / "records" / f"stream-b{batch_id}"
        stream_operator.write_json_records(bad, folder, None)

    def _set_aside_unreadable_files(self, landed: list[str] | None) -> int:
        """The landed Parquet files set aside whole (the stream's reads skip them): those that do not conform to
        the source's schema (`nonconforming_file: ...`, a column the group reads missing or of a type that does
        not convert without loss) and those Spark cannot read (`unreadable_file: ...`), each set aside once with
        its reason as a record of its own, like the backfill's; the number set aside. The files checked are those
        of the batch (`landed`, from its source's log), else those the folder lists that the last listing did not:
        a listing costs a call to the JVM and its walk of the folder each batch, 0.02 s at 200 files and 0.2-0.3 s
        at 10,000 (a week of a file a minute). Files on a store the driver cannot open are skipped unreported."""
        if self.group.source.format != "parquet" or self.group.source.kafka is not None:
            return 0
        if self.file_check is None:
            self.file_check = files.FileCheck(self.spark, self.source.schema, self.nanoseconds, self.nulls)
        if landed is not None:
            new = sorted(landed)
        else:
            reader = self.spark.read.schema(self.file_check.schema).option("recursiveFileLookup", "true")
            listed = set(files.input_files(reader.parquet(self.source.path)))
            new = sorted(listed - self.checked)
            # Only the names still landed: the set never outgrows the listing Spark's file source makes each batch.
            self.checked = listed
        # A file set aside before (by an earlier run, which a restart's first listing finds again) is neither
        # checked, counted nor written again: its record and its retention clock stay as they were.
        bad = self.file_check.unreadable([f for f in new if not self._file_record(f).exists()]) or []
        for reason, file in bad:
            folder = self._file_record(file)
            record = self.spark.createDataFrame(
                [(reason, file)], f"{schema.REASON} string, {schema.SOURCE_FILE} string"
            )
            stream_operator.write_json_records(record, folder, None)
        return len(bad)

    def _file_record(self, file: str) -> Path:
        """Where a file set aside whole has its record: named by the file, so that a replay finds the same one."""
        name = hashlib.sha1(file.encode()).hexdigest()[:16]
        return quality.quarantine_root(self.repo.root, self.group.name) / "records" / f"file-{name}"

    def _key_types(self) -> dict[str, Any]:
        if self.key_types is None:
            types = self.group.output_types(source_schema(self.group, self.repo.root))
            self.key_types = {k: types[k] for k in self.group.join_keys}
        return self.key_types


def write_late(
    group: FeatureGroup, key_types: dict[str, DType], late: DataFrame | list[str], folder: Path, batch_id: int
) -> None:
    """A batch's late events into `folder`: its keys, event time and batch id, from the batch's LATE rows (Spark
    writes them) or from their records collected to the driver (written from there; the same columns)."""
    if isinstance(late, list):
        parsed = [json.loads(r) for r in late]
        columns = {k: pa.array([p[k] for p in parsed], ARROW_TYPES[key_types[k]]) for k in group.join_keys}
        times = pa.array([p[TS] for p in parsed], pa.int64())
        columns[group.source.timestamp] = times.cast(pa.timestamp("us", tz="UTC"))
        # Spark's literal: an int while it fits
        columns["batch_id"] = pa.array([batch_id] * len(parsed), pa.int32() if batch_id < 2**31 else pa.int64())
        stream_operator.write_table_records(pa.table(columns), folder)
        return
    rows = late.where(F.col(stream_rows.KIND) == stream_rows.LATE)
    record = F.from_json(F.col(stream_rows.RECORD), stream_operator.late_schema(group, key_types)).alias("r")
    rows = rows.select(record).select(
        *[F.col(f"r.{k}").alias(k) for k in group.join_keys],
        F.timestamp_micros(F.col(f"r.{TS}")).alias(group.source.timestamp),
        F.lit(batch_id).alias("batch_id"),
    )
    stream_operator.write_json_records(rows, folder, None)
