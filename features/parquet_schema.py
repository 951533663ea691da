"""The columns and types of an event source's files, read from the files themselves: each Parquet footer's
Arrow types as the package's logical types, a folder's schema decided by all its files together (the type most
rows fit, the others named as conflicts), and which types convert to which without loss as Spark reads them.
Below the layers that read sources (features.engine) and keep Feast's objects (features.stores), which both ask.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from features.errors import DataError
from features.spec import DType


def dtype_of_arrow(arrow_type: pa.DataType) -> DType | None:
    """The logical type of an Arrow column, or None if the package cannot use it (structs, maps, ...)."""
    if pa.types.is_dictionary(arrow_type):
        return dtype_of_arrow(arrow_type.value_type)
    if pa.types.is_integer(arrow_type):
        return DType.INT64
    if pa.types.is_floating(arrow_type) or pa.types.is_decimal(arrow_type):
        return DType.FLOAT64
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or _is_string_view(arrow_type):
        return DType.STRING
    if pa.types.is_boolean(arrow_type):
        return DType.BOOL
    if pa.types.is_timestamp(arrow_type):
        return DType.TIMESTAMP
    return None


def _is_string_view(arrow_type: pa.DataType) -> bool:
    is_view = getattr(pa.types, "is_string_view", None)  # pyarrow >= 16
    return bool(is_view and is_view(arrow_type))


def schema_of_arrow(schema: pa.Schema) -> dict[str, DType]:
    """Column -> DType for the columns of an Arrow schema that have a logical type."""
    types = {name: dtype_of_arrow(schema.field(name).type) for name in schema.names}
    return {name: dtype for name, dtype in types.items() if dtype is not None}


def infer_parquet(path: str, where: str) -> dict[str, DType] | None:
    """The columns of the Parquet files under `path` and their types, decided by all the files together (see
    `infer_parquet_schema`); None when there are no files."""
    inferred = infer_parquet_schema(path, where)
    return None if inferred is None else dict(inferred.columns)


@dataclass(frozen=True)
class FileColumn:
    """One file's type of a column, as its footer gives it."""

    file: str
    type: str  # the Arrow type, e.g. "string", "int64", "timestamp[ns, tz=UTC]"
    rows: int


@dataclass(frozen=True)
class ColumnConflict:
    """A column whose files disagree on its type: the type recorded, and the files that do not fit it (they are
    set aside whole at each read, as nonconforming)."""

    column: str
    recorded: DType
    fitting_files: int
    fitting_rows: int
    misfits: tuple[FileColumn, ...]

    def describe(self, where: str) -> str:
        by_type: dict[str, list[FileColumn]] = {}
        for misfit in self.misfits:
            by_type.setdefault(misfit.type, []).append(misfit)
        others = "; ".join(
            f"{kind} in {_count(len(files), 'file')} ({_count(sum(f.rows for f in files), 'row')}: "
            f"{_names([f.file for f in files])})"
            for kind, files in sorted(by_type.items())
        )
        return (
            f"{where}: column {self.column!r} has conflicting types across files: "
            f"{self.recorded.value} in {_count(self.fitting_files, 'file')} ({_count(self.fitting_rows, 'row')}), "
            f"{others}. Recorded {self.recorded.value} (the type most rows fit); every read sets the other files "
            f"aside whole as nonconforming. Fix: rewrite those files with {self.column!r} as "
            f"{self.recorded.value}, or declare the type you mean with schema= on the EventSource"
        )


@dataclass(frozen=True)
class InferredSchema:
    """A source's schema as all its files give it: each column's type is the one most rows fit (a conflict
    between files is kept, to report and record), and which files lack a column."""

    columns: dict[str, DType]
    files: int  # the Parquet files read (files that are not Parquet are left out)
    conflicts: tuple[ColumnConflict, ...] = ()
    missing: dict[str, tuple[str, ...]] = field(default_factory=dict)  # column -> the files without it

    def missing_note(self, where: str, column: str) -> str | None:
        """A warning for a column that some files lack (they are set aside where a group reads it)."""
        files = self.missing.get(column)
        if not files:
            return None
        return (
            f"{where}: column {column!r} is missing from {_count(len(files), 'file')} of {self.files} "
            f"({_names(list(files))}); every read sets them aside whole as nonconforming, as a group reads "
            f"{column!r}. Fix: write {column!r} into those files, or move them out of the source folder"
        )


# Type order for a tie between types that fit the same rows and files: the narrowest first.
_TIE_ORDER = (DType.BOOL, DType.INT64, DType.FLOAT64, DType.TIMESTAMP, DType.STRING)


def infer_parquet_schema(path: str, where: str) -> InferredSchema | None:
    """The schema of the Parquet files under `path`, each file's footer read on its own, and never decided by
    which file comes first: a column's type is the one that the most rows convert to without loss (then the
    most files; see `conversion_problem`), and files of other types are conflicts. A file that is not
    Parquet is left out (the engines set it aside with its reason), a column typed `null` (pandas writes an
    empty object column so) fits any type, and a timestamp is one, whatever its unit."""
    import pyarrow.parquet as pq

    folder = Path(path)
    files = _data_files(folder)
    if not files:
        return None
    seen: dict[str, list[tuple[FileColumn, pa.DataType]]] = {}
    names: list[str] = []
    for file in files:
        try:
            metadata = pq.ParquetFile(file).metadata
            schema = metadata.schema.to_arrow_schema()
        except (pa.ArrowException, OSError):
            continue
        name = str(file.relative_to(folder)) if folder.is_dir() else file.name
        names.append(name)
        for column in schema.names:
            arrow_type = schema.field(column).type
            seen.setdefault(column, []).append((FileColumn(name, str(arrow_type), metadata.num_rows), arrow_type))
    if not names:
        raise _unreadable(where, path, ValueError(f"none of its {len(files)} files is Parquet"))
    columns: dict[str, DType] = {}
    conflicts = []
    for column, found in seen.items():
        candidates = {d for _, t in found if (d := dtype_of_arrow(t)) is not None}
        if not candidates:
            continue  # only null-typed (or unusable) columns: nothing to read a type from
        fits = {d: [f for f, t in found if conversion_problem(t, d) is None] for d in candidates}
        chosen = max(candidates, key=lambda d: (sum(f.rows for f in fits[d]), len(fits[d]), -_TIE_ORDER.index(d)))
        columns[column] = chosen
        misfits = tuple(f for f, t in found if conversion_problem(t, chosen) is not None)
        if misfits:
            fitting = fits[chosen]
            conflicts.append(ColumnConflict(column, chosen, len(fitting), sum(f.rows for f in fitting), misfits))
    present = {column: {f.file for f, _ in found} for column, found in seen.items()}
    missing = {
        column: tuple(n for n in names if n not in present[column])
        for column in columns
        if len(present[column]) < len(names)
    }
    return InferredSchema(columns, len(names), tuple(conflicts), missing)


# Arrow types whose every value is a float64 exactly (and Spark's reader converts them so).
_EXACT_IN_FLOAT64 = (pa.float32(), pa.float64(), pa.int8(), pa.int16(), pa.int32(), pa.uint8(), pa.uint16())


def conversion_problem(found: pa.DataType, want: DType) -> str | None:
    """Why values of Arrow type `found` do not convert to `want` without loss as Spark's Parquet reader reads
    them, or None when they do. Integers fit int64 up to int64 and uint32; float64 takes floats and the
    integers up to 32 bits (exact); int64 does not fit float64, since only its values below 2^53 convert exactly
    (and Spark's reader refuses it). A null-typed column has no values, so it fits any type."""
    if pa.types.is_dictionary(found):
        found = found.value_type
    if pa.types.is_null(found):
        return None
    fits = {
        DType.INT64: pa.types.is_signed_integer(found) or found in (pa.uint8(), pa.uint16(), pa.uint32()),
        DType.FLOAT64: found in _EXACT_IN_FLOAT64,
        DType.STRING: pa.types.is_string(found) or pa.types.is_large_string(found) or _is_string_view(found),
        DType.BOOL: pa.types.is_boolean(found),
        DType.TIMESTAMP: pa.types.is_timestamp(found),
    }.get(want, False)
    if fits:
        return None
    if want is DType.FLOAT64 and found in (pa.int64(), pa.uint64()):
        return f"{found} converts to float64 exactly only below 2^53, so a 64-bit integer column is not read as float64"
    if want is DType.FLOAT64 and found == pa.uint32():
        return "Spark's Parquet reader converts uint32 to float64 wrongly (values from 2^31 on come out negative)"
    if want is DType.INT64 and found == pa.uint64():
        return "uint64 values above 2^63-1 do not fit int64"
    return f"{found} does not convert to {want.value} without loss"


def _count(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def _names(files: list[str], most: int = 5) -> str:
    shown = ", ".join(files[:most])
    return shown if len(files) <= most else f"{shown} and {len(files) - most} more"


def infer_json(path: str, where: str) -> dict[str, DType] | None:
    import pyarrow.json as pj

    first = _first_data_file(Path(path))
    if first is None:
        return None
    try:
        return schema_of_arrow(pj.read_json(first).schema)
    except pa.ArrowException as exc:
        raise _unreadable(where, str(first), exc) from exc


def _unreadable(where: str, path: str, exc: Exception) -> DataError:
    return DataError(
        f"{where}.path: cannot read the schema from {path} ({exc}). Fix: check the files match format=, "
        "or declare schema= on the EventSource"
    )


def _data_files(folder: Path) -> list[Path]:
    """The files (in name order) under `folder`, skipping hidden and _-prefixed side files, as Spark does."""
    if folder.is_file():
        return [folder]
    if not folder.is_dir():
        return []
    return [
        candidate
        for candidate in sorted(folder.rglob("*"))
        if candidate.is_file() and not any(p.startswith((".", "_")) for p in candidate.relative_to(folder).parts)
    ]


def _first_data_file(folder: Path) -> Path | None:
    """The first file (in name order) under `folder`, skipping hidden and _-prefixed side files."""
    files = _data_files(folder)
    return files[0] if files else None
