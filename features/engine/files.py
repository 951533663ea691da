"""Files set aside whole: a landed Parquet file that does not conform to the source's schema (a column the group
reads missing, or of a type that does not convert without loss: `nonconforming_file`), decided from its footer,
or one Spark cannot read (`unreadable_file`), decided by a small read of one file per physical layout. The
batch read leaves them out by path, the stream by a check of each file's footer on the workers. A column of
Arrow's null type (pandas' type of a column of None alone) fits any type, but Spark's vectorized reader refuses it
as a string, a boolean or a timestamp: both engines read such a file apart (`null_rows`), the column as nulls of
its type.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from features.spec import DType

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType


from features.engine.schema import (
    META,
    NONCONFORMING_FILE,
    UNREADABLE_FILE,
    expected_columns,
    in_microseconds,
    interrupted,
    quiet_spark_errors,
    read_types,
    schema_of,
    source_columns,
    spark_reason,
    timestamp_columns,
)

# A file's column types, as (column, DType value) pairs: hashable, so a worker's verdict on a file is cached.
Columns = tuple[tuple[str, str], ...]


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


@dataclass(frozen=True)
class Conformity:
    """Which records of a stream's Parquet read come from files that conform to `expected` (`nonconformity`),
    decided once per file in each Python worker, from the file's footer, where the stream packs its events
    (features.engine.stream_operator): a per-record filter of Spark's would hold every record until its file's
    verdict came back, a sixth of a micro-batch. With `held` (the read's columns, when `null_rows` reads the files
    holding one of them as Arrow's null type), a file holding one is left out too. A file the worker cannot open
    (a remote store) is left to Spark's reader."""

    wanted: Columns
    held: Columns | None

    @classmethod
    def of(cls, schema: StructType, null_read: bool) -> Conformity:
        return cls(_columns(expected_columns(schema)), _columns(schema_of(schema)) if null_read else None)

    def kept(self, files: pa.Array) -> pa.Array | None:
        """Whether each record is kept, from the file each one must be checked for (`CHECKED_FILE`: null for a
        record that needs no check); None when every record is."""
        import pyarrow as pa
        import pyarrow.compute as pc

        names = pc.unique(files).drop_null().to_pylist()
        refused = [name for name in names if not _file_conforms(name, self.wanted, self.held)]
        if not refused:
            return None
        return pc.invert(pc.fill_null(pc.is_in(files, value_set=pa.array(refused, pa.string())), False))


def _columns(types: Mapping[str, DType]) -> Columns:
    return tuple((column, dtype.value) for column, dtype in types.items())


def _file_conforms(uri: str, wanted: Columns, held: Columns | None) -> bool:
    local = _local_path(uri)
    if local is None:
        return True
    stat = os.stat(local)
    return _conforms_cached(local, stat.st_size, stat.st_mtime_ns, wanted, held)


@functools.lru_cache(maxsize=4096)
def _conforms_cached(local: str, size: int, mtime_ns: int, wanted: Columns, held: Columns | None) -> bool:
    """A file's verdict, kept while its size and time stay (the key): files land once and are not rewritten."""
    footer = _arrow_schema(_footer(local))
    if footer is None:
        return True
    if held is not None and _null_typed(footer, held, wanted) is not None:
        return False  # read by `null_rows`, or set aside whole
    return nonconformity(footer, {column: DType(t) for column, t in wanted}) is None


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
# The fix for a file a stream sets aside for a column of Arrow's null type: its checkpoint is older than the read of
# such files (`null_rows`), which takes a source of its own in the query.
NULLS_LATE = (
    "the file holds a column as Arrow's null type (pandas writes a column of None alone so), which this stream, "
    "started before streams read such files, cannot read; fix: land the file again with the column's type "
    '(pandas: df.astype({"column": "string"})), or start the stream over with `features stream --reset`, after '
    "which it reads such files (a plain restart keeps the checkpoint's reads)"
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


def input_files(frame: DataFrame) -> list[str]:
    """`frame.inputFiles()` in a few calls to the JVM: PySpark's own asks for each name in a call of its own, and a
    stream lists its source folder every micro-batch (a folder of 10,000 files: 10,000 calls, seconds). The names
    are joined by line breaks in the JVM and read in pieces (`ANSWER_CHARS`); a name holding a line break itself
    falls back to PySpark's way."""
    jdf = getattr(frame, "_jdf", None)
    if jdf is None:  # Spark Connect: the names come in one answer already
        return frame.inputFiles()
    names = jdf.inputFiles()
    count = len(names)
    if not count:
        return []
    array_seq, builder = _scala_classes(frame.sparkSession._jvm)
    joined = array_seq.unsafeWrapArray(names).addString(builder(), "\n")  # stays in the JVM: a Scala builder
    length = joined.length()
    found = "".join(joined.substring(i, min(i + ANSWER_CHARS, length)) for i in range(0, length, ANSWER_CHARS))
    parts = found.split("\n")
    return parts if len(parts) == count else list(names)


# The characters of text one answer of py4j brings: its JVM side writes an answer of 8,192 characters or more in two
# parts, the second sent only once the first is acknowledged, and Python's side acknowledges after 40 ms (Nagle's
# algorithm meeting delayed acknowledgement): 1.3 ms for 8,000 characters, 44 ms for 8,200, measured.
ANSWER_CHARS = 3000


@functools.lru_cache(maxsize=4)
def _scala_classes(jvm: Any) -> tuple[Any, Any]:
    """Scala's ArraySeq, whose wrapper takes an array as an Object (py4j matches no Java method that takes one as an
    array), and its StringBuilder (py4j hands it back as a reference, where a String comes back whole): looked up once,
    as py4j resolves a class name a package at a time."""
    return jvm.scala.collection.immutable.ArraySeq, jvm.scala.collection.mutable.StringBuilder


def unreadable_files(
    spark: SparkSession, raw: DataFrame, schema: StructType | None, check: FileCheck | None = None
) -> list[tuple[str, str]]:
    """(reason, file) for each file of `raw`'s read that does not conform to `schema` or that Spark cannot read
    with it (see `FileCheck`, or `check`); where the driver cannot open the files (a remote URI), those absent
    from a read of every column."""
    files = sorted(input_files(raw))
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
        whether it reads the files holding a column as Arrow's null type apart (`null_rows`: a batch does, and a
        stream whose checkpoint started with that read)."""
        from pyspark.sql import types as T

        self.spark, self.schema, self.nanoseconds, self.nulls = spark, schema, nanoseconds, nulls
        self.expected = expected_columns(schema)
        self.held = _columns(schema_of(schema)) if schema is not None else ()
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
        late = set()  # files holding a column as the null type, which this read does not read apart
        for file, local_path in zip(files, local, strict=True):
            metadata = _footer(local_path)  # type: ignore[arg-type]
            rows = metadata.num_rows if metadata is not None else 0
            self.rows[file] = rows
            footer = _arrow_schema(metadata)
            nulls = _null_typed(footer, self.held, _columns(self.expected)) if footer is not None else None
            if nulls is not None and self.nulls:
                # `null_rows` reads it, unless it does not conform: decided alike there.
                if nulls.misfit is not None and rows:
                    bad.append((nulls.misfit.reason(local_path), file))  # type: ignore[arg-type]
                continue
            if nulls is not None:
                late.add(file)
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
            reason = _why_unreadable(self.spark, self.checked, first, not self.nanoseconds)
            if reason is None:
                if most and isinstance(layout, tuple):
                    self.readable.add(layout)
                continue
            for _, file in sorted(group):  # Spark's reason names the file: each one's own
                why = reason if file == first else _why_unreadable(self.spark, self.checked, file, not self.nanoseconds)
                if why is not None:
                    bad.append((f"{UNREADABLE_FILE}: {why}{f'; {NULLS_LATE}' if file in late else ''}", file))
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


@dataclass(frozen=True)
class NullTyped:
    """A Parquet file holding some of a schema's columns as Arrow's null type (pandas writes a column of None alone
    so, with no values and no type of its own), and whether it conforms to the schema all the same."""

    misfit: Misfit | None  # how it does not conform (set aside whole), else None: `null_rows` reads it


def _null_typed(footer: pa.Schema, held: Columns, expected: Columns) -> NullTyped | None:
    """Whether a file (its footer) holds a column of `held` (the read's schema) as Arrow's null type: None if not;
    else its misfit over the columns the group reads (`expected`) and every other column of
    `held` it holds (a null-typed one fits any type; `null_rows` converts them all)."""
    import pyarrow as pa

    names = {name.lower(): name for name in footer.names}
    found = (names.get(c.lower()) for c, _ in held)
    if not any(n is not None and pa.types.is_null(footer.field(n).type) for n in found):
        return None
    wanted = {c: DType(t) for c, t in held if c.lower() in names} | {c: DType(t) for c, t in expected}
    return NullTyped(nonconformity(footer, wanted))


def null_typed_files(folder: str, schema: StructType) -> list[str]:
    """The Parquet files under a folder the driver can open that hold a column of `schema` as Arrow's null type
    (as file URIs, the way Spark lists them): the batch reads them apart (`null_rows`). Empty where the driver
    cannot list the folder (a remote store: such a file is then set aside as unreadable)."""
    if "://" in folder or folder.startswith("dbfs:") or not Path(folder).is_dir():
        return []
    held = _columns(schema_of(schema))
    found = []
    for file in sorted(Path(folder).rglob("*.parquet")):
        if any(part.startswith((".", "_")) for part in file.relative_to(folder).parts):
            continue  # hidden from Spark's listing
        footer = _arrow_schema(_footer(str(file)))
        if footer is not None and _null_typed(footer, held, ()) is not None:
            found.append(file.resolve().as_uri())
    return found


LISTED = "fx_listed"  # a listed file's `_metadata` (a binaryFile read's), the input of `null_rows`


def null_rows(listing: DataFrame, schema: StructType, meta: DataType) -> DataFrame:
    """The records of the files a binaryFile read lists (batch or stream, their content left unread) that hold a
    column of `schema` as Arrow's null type and conform to it (`_null_typed`, decided from each footer in the
    Python workers, as `FileCheck` decides): read by pyarrow in `schema` (features.engine.retype), with their
    file's metadata in `META` of type `meta` (the one Spark's Parquet reads give, whose fields it fills by name).
    Every other file gives none: it is read by Spark's reader (`read_parquet`), or set aside whole."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    held, expected = _columns(schema_of(schema)), _columns(expected_columns(schema))
    out = T.StructType([*schema.fields, T.StructField(META, meta)])

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return _null_batches(batches, held, expected, out)

    return listing.select(F.col("path"), F.col("_metadata").alias(LISTED)).mapInArrow(read, out)


def _null_batches(
    batches: Iterator[pa.RecordBatch], held: Columns, expected: Columns, out: StructType
) -> Iterator[pa.RecordBatch]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import to_arrow_schema

    from features.engine.retype import retyped_columns

    schema = to_arrow_schema(out, timezone="UTC")
    meta = schema.field(META).type
    for batch in batches:
        listed = batch.column(LISTED)
        for i, uri in enumerate(batch.column("path").to_pylist()):
            local = _local_path(uri)
            footer = _arrow_schema(_footer(local)) if local is not None else None
            if footer is None:
                continue  # not Parquet, or on a store the worker cannot open: read by Spark's reader, or set aside
            nulls = _null_typed(footer, held, expected)
            if nulls is None or nulls.misfit is not None:
                continue
            read = {c.lower() for c, _ in held}
            table = pq.read_table(local, columns=[name for name in footer.names if name.lower() in read])
            n = table.num_rows
            known = {field.name: pa.repeat(listed[i][field.name], n) for field in listed.type}
            known["row_index"] = pa.array(range(n), pa.int64())
            info = [known.get(f.name, pa.nulls(n)).cast(f.type) for f in meta]
            columns = retyped_columns(table, list(schema)[:-1])
            whole = pa.Table.from_arrays([*columns, pa.StructArray.from_arrays(info, fields=list(meta))], schema=schema)
            yield from whole.to_batches(max_chunksize=10_000)


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
