"""Files set aside whole: a landed Parquet file that does not conform to the source's schema (a column the group
reads missing, or of a type that does not convert without loss: `nonconforming_file`), decided from its footer,
or one Spark cannot read (`unreadable_file`), decided by a small read of one file per physical layout. The
batch read leaves them out by path, the stream by a check of each file's footer on the workers. A column of
Arrow's null type (pandas' type of a column of None alone) fits any type: the batch reads such a file apart, the
column as nulls (`null_typed`); the stream sets it aside as unreadable.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from features.spec import DType

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType


from features.engine.schema import (
    META,
    NONCONFORMING_FILE,
    UNREADABLE_FILE,
    expected_columns,
    in_microseconds,
    interrupted,
    quiet_spark_errors,
    read_types,
    source_columns,
    spark_reason,
    timestamp_columns,
)


@dataclass(frozen=True)
class SetAsideFile:
    """A file set aside whole: its reason (`nonconforming_file: ...` or `unreadable_file: ...`) and how many
    events it holds (from its footer; 0 for a file that is not Parquet)."""

    file: str  # as Spark lists it (a URI)
    reason: str
    events: int

    @property
    def kind(self) -> str:
        return self.reason.split(":", 1)[0]


def conforms(expected: Mapping[str, DType]) -> Column:
    """Whether a record's file conforms to `expected` (`nonconformity`), decided once per file in each Python
    worker, from the file's footer. A file the worker cannot open (a remote store) is left to Spark's reader."""
    import pandas as pd
    from pyspark.sql import functions as F

    wanted = tuple((column, dtype.value) for column, dtype in expected.items())

    def conforms(files: pd.Series) -> pd.Series:
        verdicts = {file: _file_conforms(file, wanted) for file in files.unique()}
        return files.map(verdicts).astype(bool)

    # PySpark reads a pandas UDF's kind from its type hints: here objects, not this module's postponed strings.
    conforms.__annotations__ = {"files": pd.Series, "return": pd.Series}
    return F.pandas_udf(conforms, "boolean")(F.col(META)["file_path"])  # type: ignore[call-overload]


def _file_conforms(uri: str, wanted: tuple[tuple[str, str], ...]) -> bool:
    local = _local_path(uri)
    if local is None:
        return True
    stat = os.stat(local)
    return _conforms_cached(local, stat.st_size, stat.st_mtime_ns, wanted)


@functools.lru_cache(maxsize=4096)
def _conforms_cached(local: str, size: int, mtime_ns: int, wanted: tuple[tuple[str, str], ...]) -> bool:
    """A file's verdict, kept while its size and time stay (the key): files land once and are not rewritten."""
    footer = _arrow_schema(_footer(local))
    return footer is None or nonconformity(footer, {column: DType(t) for column, t in wanted}) is None


def timestamp_unit(column: str) -> Column:
    """The unit ("s", "ms", "us" or "ns") in which each record's Parquet file stores `column`, from the file's
    footer, decided once per file in each Python worker; null where the column is no timestamp there, or where
    the worker cannot open the file (a remote store)."""
    import pandas as pd
    from pyspark.sql import functions as F

    def units(files: pd.Series) -> pd.Series:
        found = {file: _unit_of(file, column) for file in files.unique()}
        return files.map(found)

    units.__annotations__ = {"files": pd.Series, "return": pd.Series}
    return F.pandas_udf(units, "string")(F.col(META)["file_path"])  # type: ignore[call-overload]


# Why a stream sets aside a nanosecond file (on a Spark without nanosecond types: see `read_parquet`).
NANOS_LATE = (
    "column {column!r} holds nanosecond timestamps, and this stream started on microsecond files, so it reads "
    "microseconds only; fix: land the file's events again as microseconds (pandas: "
    'df.to_parquet(path, coerce_timestamps="us", allow_truncated_timestamps=True)), or start the stream over '
    "with `features stream --reset` to read nanosecond files too (a plain restart keeps the checkpoint's reads; "
    "slower: each file is read twice)"
)


def nanosecond_files(folder: str, columns: list[str]) -> list[str] | None:
    """The Parquet files under a folder the driver can open whose footers store one of `columns` as
    nanoseconds (as file URIs, the way Spark lists them); None when the driver cannot list it (a remote store)."""
    if "://" in folder or folder.startswith("dbfs:") or not Path(folder).is_dir():
        return None
    found = []
    for file in sorted(Path(folder).rglob("*.parquet")):
        if any(part.startswith((".", "_")) for part in file.relative_to(folder).parts):
            continue  # hidden from Spark's listing: files being written, Spark's own logs
        if any(_unit_of(str(file), column) == "ns" for column in columns):
            found.append(file.resolve().as_uri())
    return found


def _unit_of(uri: str, column: str) -> str | None:
    local = _local_path(uri)
    if local is None:
        return None
    stat = os.stat(local)
    return _unit_cached(local, stat.st_size, stat.st_mtime_ns, column.lower())


@functools.lru_cache(maxsize=4096)
def _unit_cached(local: str, size: int, mtime_ns: int, column: str) -> str | None:
    import pyarrow as pa

    footer = _arrow_schema(_footer(local))
    name = None if footer is None else {n.lower(): n for n in footer.names}.get(column)
    if name is None or not pa.types.is_timestamp(footer.field(name).type):
        return None
    return str(footer.field(name).type.unit)


def unreadable_files(
    spark: SparkSession, raw: DataFrame, schema: StructType | None, check: FileCheck | None = None
) -> list[tuple[str, str]]:
    """(reason, file) for each file of `raw`'s read that does not conform to `schema` or that Spark cannot read
    with it (see `FileCheck`, or `check`); where the driver cannot open the files (a remote URI), those absent
    from a read of every column."""
    files = sorted(raw.inputFiles())
    bad = (check or FileCheck(spark, schema)).unreadable(files)
    return bad if bad is not None else _unreadable_by_scan(spark, raw, schema, files)


# The Parquet (physical type, logical type) pairs Spark reads as each Spark type without a conversion: a layout
# of these alone is readable, with no probe read (on a fresh JVM that read costs a cold job, about a second).
# Anything else (nanoseconds, narrower or unsigned integers, timestamps without a time zone) is probed.
NATIVE = {
    "LongType": {("INT64", "None"), ("INT64", "Int(bitWidth=64, isSigned=true)")},
    "IntegerType": {("INT32", "None"), ("INT32", "Int(bitWidth=32, isSigned=true)")},
    "DoubleType": {("DOUBLE", "None")},
    "FloatType": {("FLOAT", "None")},
    "BooleanType": {("BOOLEAN", "None")},
    "StringType": {("BYTE_ARRAY", "String")},
}
NATIVE_STAMPS = (
    "Timestamp(isAdjustedToUTC=true, timeUnit=microseconds",
    "Timestamp(isAdjustedToUTC=true, timeUnit=milliseconds",
)


class FileCheck:
    """Which Parquet files are set aside whole with a schema: those that do not conform to the columns it marks
    as read (`nonconformity`, from each footer), then those Spark cannot read. A layout of types Spark reads
    as they are (`NATIVE`) is readable; Spark decides on the others, one file per physical layout: files are
    grouped by their footers' types of the read columns (a file whose footer does not parse is its own group),
    and one small read of a group's largest file stands for all of them. A layout found readable is remembered
    (the stream checks each new file as it lands)."""

    def __init__(
        self, spark: SparkSession, schema: StructType | None, nanoseconds: bool = True, nulls: bool = False
    ) -> None:
        """`nanoseconds`: whether the read being checked reads nanosecond files (see `read_parquet`); `nulls`:
        whether it reads a file's null-typed columns as nulls (`null_typed`: the batch does; a stream, which
        learns of its files only as one read takes them all, does not, and sets such a file aside)."""
        from pyspark.sql import types as T

        self.spark, self.schema, self.nanoseconds, self.nulls = spark, schema, nanoseconds, nulls
        self.expected = expected_columns(schema)
        # Spark checks the columns the group reads (all of the schema's, where none is marked): a read of
        # the source prunes the others, so a file whose other columns do not fit is read all the same.
        self.checked = schema
        if schema is not None and self.expected:
            self.checked = T.StructType([f for f in schema.fields if f.name in self.expected])
        self.columns = [f.name for f in self.checked.fields] if self.checked is not None else []
        self.stamps = timestamp_columns(self.checked) if self.checked is not None else []
        self.readable: set[tuple[str, ...]] = set()
        self.rows: dict[str, int] = {}  # file -> rows, from its footer, for each file checked

    def unreadable(self, files: list[str]) -> list[tuple[str, str]] | None:
        """(reason, file) for each file set aside; None if the driver cannot open some of them."""
        local = [_local_path(f) for f in files]
        if not all(local):
            return None
        layouts: dict[object, list[tuple[int, str]]] = {}
        bad = []
        for file, local_path in zip(files, local, strict=True):
            metadata = _footer(local_path)  # type: ignore[arg-type]
            rows = metadata.num_rows if metadata is not None else 0
            self.rows[file] = rows
            footer = _arrow_schema(metadata)
            misfit = nonconformity(footer, self.expected) if footer is not None and self.expected else None
            if misfit is not None and rows:  # a file with no rows loses nothing and reads whatever its types
                bad.append((misfit.reason(local_path), file))  # type: ignore[arg-type]
                continue
            nanos = [c for c in self.stamps if _unit_of(file, c) == "ns"] if not self.nanoseconds else []
            if nanos and rows:
                bad.append((f"{UNREADABLE_FILE}: {local_path}: {NANOS_LATE.format(column=nanos[0])}", file))
                continue
            layout = _layout(metadata, self.columns)
            if layout not in self.readable and not self._native(metadata):
                layouts.setdefault(layout or file, []).append((-rows, file))
        for layout, group in layouts.items():
            # The file with the most rows: a file with no rows reads without error, whatever its columns' types.
            (most, first), *_ = sorted(group)
            # The files of a layout share their null-typed columns, which the batch reads as nulls.
            checked = self.checked
            if checked is not None and self.nulls:
                checked = without_values(checked, first)
            reason = _why_unreadable(self.spark, checked, first, not self.nanoseconds)
            if reason is None:
                if most and isinstance(layout, tuple):
                    self.readable.add(layout)
                continue
            for _, file in sorted(group):  # Spark's reason names the file: each one's own
                why = reason if file == first else _why_unreadable(self.spark, checked, file, not self.nanoseconds)
                if why is not None:
                    bad.append((f"{UNREADABLE_FILE}: {why}", file))
        return bad

    def _native(self, metadata: pq.FileMetaData | None) -> bool:
        """Whether each read column the footer holds is of a type Spark reads as the schema's type as it is."""
        if metadata is None or self.checked is None:
            return False
        wanted = {f.name.lower(): type(f.dataType).__name__ for f in self.checked.fields}
        footer = metadata.schema
        for column in (footer.column(i) for i in range(len(footer))):
            top = column.path.split(".")[0].lower()
            if top not in wanted:
                continue
            if "." in column.path:  # a nested column
                return False
            kind, logical = column.physical_type, str(column.logical_type)
            if wanted[top] == "TimestampType":
                if kind != "INT64" or not logical.startswith(NATIVE_STAMPS):
                    return False
            elif (kind, logical) not in NATIVE.get(wanted[top], ()):
                return False
        return True


@dataclass(frozen=True)
class Misfit:
    """How a file does not conform to the columns a group reads: one column, missing or of a type that does
    not convert to the schema's without loss."""

    column: str
    want: DType
    found: str | None  # the file's Arrow type of the column; None when the file lacks it
    detail: str  # what is wrong, e.g. "column 'amount' missing (found columns: amt, event_ts, user_id)"

    def reason(self, file: str) -> str:
        """The reason of the file's quarantine record: the file, the column, the type found, and the fix."""
        if self.found is None:
            fix = f"write {self.column!r} ({self.want.value}) into the file, or move the file out of the source folder"
        else:
            fix = (
                f"rewrite the file with {self.column!r} as {self.want.value}, or move it out of the source folder "
                f"(if {self.want.value} is not the type you mean, declare schema= on the EventSource)"
            )
        return f"{NONCONFORMING_FILE}: {file}: {self.detail}; fix: {fix}, then backfill its days again with --force"


def nonconformity(footer: pa.Schema, expected: Mapping[str, DType]) -> Misfit | None:
    """How a file's columns do not fit the columns a group reads (`expected`), or None when they do: the first
    such column missing (matched as Spark matches names, ignoring case), else the first whose type does not
    convert to the expected one without loss (features.parquet_schema.conversion_problem). Other columns, and
    extra ones, are fine."""
    from features.parquet_schema import conversion_problem

    by_name = {name.lower(): name for name in footer.names}
    for column, want in expected.items():
        name = by_name.get(column.lower())
        if name is None:
            found = sorted(footer.names)
            listed = ", ".join(found[:12]) + (f" and {len(found) - 12} more" if len(found) > 12 else "")
            return Misfit(column, want, None, f"column {column!r} missing (found columns: {listed or 'none'})")
        found_type = footer.field(name).type
        problem = conversion_problem(found_type, want)
        if problem is not None:
            detail = f"column {column!r} is {found_type} where the source schema has {want.value} ({problem})"
            return Misfit(column, want, str(found_type), detail)
    return None


def null_typed(file: str, schema: StructType) -> frozenset[str]:
    """The columns of `schema` that a Parquet file holds as Arrow's null type: pandas writes a column of None
    alone so, with no values and no type of its own. Spark's vectorized Parquet reader refuses such a column as
    a string, a boolean or a timestamp (failing the whole file), though it has nothing to convert: a batch reads
    them as nulls (`without_values`), cast to the schema's type. Empty where the driver cannot open the file."""
    local = _local_path(file)
    if local is None:
        return frozenset()
    stat = os.stat(local)
    nulls = _nulls_cached(local, stat.st_size, stat.st_mtime_ns)
    return frozenset(f.name for f in schema.fields if f.name.lower() in nulls)


@functools.lru_cache(maxsize=4096)
def _nulls_cached(local: str, size: int, mtime_ns: int) -> frozenset[str]:
    """The null-typed columns of a file (lower case), kept while its size and time stay."""
    import pyarrow as pa

    footer = _arrow_schema(_footer(local))
    if footer is None:
        return frozenset()
    return frozenset(name.lower() for name in footer.names if pa.types.is_null(footer.field(name).type))


def without_values(schema: StructType, file: str) -> StructType:
    """`schema` with the columns `file` holds as Arrow's null type (`null_typed`) read as Spark's null type."""
    from pyspark.sql import types as T

    nulls = null_typed(file, schema)
    if not nulls:
        return schema
    return T.StructType(
        [T.StructField(f.name, T.NullType(), True, f.metadata) if f.name in nulls else f for f in schema]
    )


def files_without_values(folder: str, schema: StructType) -> dict[frozenset[str], list[str]]:
    """The Parquet files under a folder the driver can open that hold some of `schema`'s columns as Arrow's null
    type (`null_typed`), grouped by those columns (as file URIs, the way Spark lists them); empty where the
    driver cannot list the folder (a remote store: such a file is then set aside as unreadable)."""
    if "://" in folder or folder.startswith("dbfs:") or not Path(folder).is_dir():
        return {}
    found: dict[frozenset[str], list[str]] = {}
    for file in sorted(Path(folder).rglob("*.parquet")):
        if any(part.startswith((".", "_")) for part in file.relative_to(folder).parts):
            continue  # hidden from Spark's listing
        nulls = null_typed(str(file), schema)
        if nulls:
            found.setdefault(nulls, []).append(file.resolve().as_uri())
    return found


def file_days(file: str, timestamp: str) -> dict[date, int] | None:
    """How many of a Parquet file's events are stamped on each UTC day, from its timestamp column (a naive
    time taken as UTC); None when the driver cannot open the file or it has no such timestamp column."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    local = _local_path(file)
    footer = _arrow_schema(_footer(local)) if local is not None else None
    if footer is None:
        return None
    name = {n.lower(): n for n in footer.names}.get(timestamp.lower())
    if name is None or not pa.types.is_timestamp(footer.field(name).type):
        return None
    stamps = pq.read_table(local, columns=[name]).column(name).drop_null()
    per_day = {"s": 86_400, "ms": 86_400_000, "us": 86_400_000_000, "ns": 86_400_000_000_000}[stamps.type.unit]
    days, counts = np.unique(np.floor_divide(stamps.cast(pa.int64()).to_numpy(), per_day), return_counts=True)
    epoch = date(1970, 1, 1)
    return {epoch + timedelta(days=int(d)): int(n) for d, n in zip(days, counts, strict=True)}


def _local_path(uri: str) -> str | None:
    """The driver's path of a `file:` URI (as Spark lists files) that the driver sees, else None (a remote
    store, or a Spark Connect server's own disk)."""
    from urllib.parse import unquote, urlparse

    parsed = urlparse(uri)
    path = unquote(parsed.path)
    return path if parsed.scheme in ("file", "") and Path(path).is_file() else None


def _footer(file: str) -> pq.FileMetaData | None:
    """A Parquet file's footer, or None if pyarrow cannot read one (a file that is not Parquet)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(file).metadata
    except (pa.ArrowException, OSError):
        return None


def _arrow_schema(metadata: pq.FileMetaData | None) -> pa.Schema | None:
    """A footer's columns as Arrow types (pandas' and pyarrow's own types where the file keeps them)."""
    import pyarrow as pa

    if metadata is None:
        return None
    try:
        return metadata.schema.to_arrow_schema()
    except (pa.ArrowException, OSError):
        return None


def _layout(metadata: pq.FileMetaData | None, columns: list[str]) -> tuple[str, ...] | None:
    """The physical and logical types of `columns` in a Parquet file's footer (None without a footer)."""
    if metadata is None:
        return None
    footer, wanted = metadata.schema, set(columns)
    return tuple(
        f"{c.path}:{c.physical_type}:{c.logical_type}:{c.max_definition_level}"
        for c in (footer.column(i) for i in range(len(footer)))
        if c.path.split(".")[0] in wanted
    )


def _unreadable_by_scan(
    spark: SparkSession, raw: DataFrame, schema: StructType | None, files: list[str]
) -> list[tuple[str, str]]:
    """`unreadable_files` where the driver cannot open the files: those absent from the records of a read of
    every column (a file whose column has the wrong type fails only when that column is read), except the
    ones that read without error (files with no rows)."""
    from pyspark.sql import functions as F

    every_column = F.hash(*[F.col(f"`{c}`") for c in source_columns(raw)])
    per_file = raw.groupBy(F.col(META)["file_path"].alias("path")).agg(F.max(every_column).alias("h"))
    seen = {row["path"] for row in per_file.collect()}
    bad = []
    for file in (f for f in files if f not in seen):
        # Only the microsecond read: a file read by neither is unreadable, and on a Spark without nanosecond
        # types a nanosecond file the workers could not open has no records though its integers read.
        reason = _why_unreadable(spark, schema, file, microseconds_only=True)
        if reason is not None:
            bad.append((f"{UNREADABLE_FILE}: {reason}", file))
    return bad


def _why_unreadable(
    spark: SparkSession, schema: StructType | None, file: str, microseconds_only: bool = False
) -> str | None:
    """Why Spark cannot read one Parquet file with `schema` (None if it can, e.g. a file with no rows)."""
    from pyspark.sql import functions as F

    reasons = []
    every = in_microseconds(schema) if schema is not None else []  # PySpark cannot parse the nanosecond type
    for ddl in read_types(spark, schema)[: 1 if microseconds_only else None]:
        # A count of non-null values makes Spark decode every read column, and collects no value of a type
        # PySpark cannot parse.
        decoded = [F.count(column) for column in every]
        try:
            with quiet_spark_errors():
                spark.read.schema(ddl).parquet(file).limit(1).select(*decoded).collect()
            return None
        except Exception as exc:  # the reason is kept: classic PySpark raises py4j's error, no PySparkException
            if interrupted(exc):  # a stop (the query's, the session's) while reading: the file is not at fault
                raise
            reasons.append(spark_reason(exc))
    return reasons[0]
