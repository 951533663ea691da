"""Commits to the offline table made in the driver with `deltalake`, no Spark job: a stream's micro-batch appends
(features.stores.offline.append_batch), its compaction rounds (features.stores.compaction), and a local backfill's
range (features.stores.offline.Staged). A live stream's batch waits for the first two; through Spark an append of
25,000 rows took 0.2-0.3 s (a job, Delta's snapshot of the log, its commit), through deltalake 0.07 s. A nightly
backfill's 2M rows took 3.9 s through Spark in a fresh process, collected and written by deltalake 1.1 s
(bench/startup.py); only where the driver is the machine that computed them (a local session).

deltalake writes only the tables it fully supports: a plain protocol (reader version 1, writer version 2, as the
tables features creates are). Everything else goes through Spark: a table a user upgraded to table features,
and an append with a column the table lacks or has with another type (a feature added or changed by a definition
upgrade), where Delta's `mergeSchema` adds the column or refuses the type; deltalake would cast a double into a
long column without a word.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from features.stores.delta_open import newest

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable, Schema
    from pyspark.sql import DataFrame, SparkSession

# Whoever sets it is handed the rows a commit (`create`, `replace`, `append`) collected, before deltalake writes them:
# the statistics of a backfill or a stream's micro-batch are computed from them (features.quality.profiling), not
# from a second conversion of the same rows out of Spark, which cost as much as the statistics themselves.
COLLECTED: ContextVar[Callable[[pa.Table], None] | None] = ContextVar("features_collected_rows", default=None)


def _offer(arrow: pa.Table) -> None:
    seen = COLLECTED.get()
    if seen is not None:
        seen(arrow)


DRIVER_CELLS = 50_000_000  # the most values (rows x columns) a commit collects to the driver: about 1 GB of rows
# Heap a collected value takes in the driver, with a margin. On their way to Python a task's rows are in the driver
# several times over (the task's result, its serialized copy, the copy fetched from the block manager and the one
# deserialized), beside the batch's cache: a stream's first batch of 94M values (15.7M rows x 6 columns, sixty days
# of history) ran a 4 GB driver out of heap at times and a 3.6 GB one each time, about 40 bytes a value. Twice that
# keeps half the heap free; a 4 GB driver then takes DRIVER_CELLS, a smaller one fewer.
HEAP_PER_CELL = 80


def fits(rows: DataFrame, count: int) -> bool:
    """Whether `count` of `rows` may be collected to the driver for deltalake's commit: values (rows x columns) at
    most DRIVER_CELLS and at most the driver's heap over HEAP_PER_CELL. Past that, Spark's writer commits them from
    the executors."""
    return count * len(rows.columns) <= min(DRIVER_CELLS, _driver_heap(rows.sparkSession) // HEAP_PER_CELL)


def _driver_heap(spark: SparkSession) -> int:
    """The driver JVM's most heap in bytes; DRIVER_CELLS' worth for a session whose JVM this process cannot reach
    (Spark Connect)."""
    try:
        return int(spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory())  # type: ignore[union-attr]
    except Exception:
        return DRIVER_CELLS * HEAP_PER_CELL


def plain(delta: DeltaTable) -> bool:
    """Whether the table uses no Delta table feature (reader version 1, writer version 2 at most), as the tables
    features creates do: deltalake writes every such table."""
    protocol = delta.protocol()
    return protocol.min_reader_version <= 1 and protocol.min_writer_version <= 2


def append(table: str, rows: DataFrame, user_metadata: str) -> bool:
    """Append `rows` (few enough to collect to the driver: `fits`) in one commit recording `user_metadata`, when
    deltalake may: the table is plain and each column of `rows` the table has is of its type. The table's other
    columns (a feature removed from the group) are null in the rows appended, as Spark appends them; a column the
    table lacks (a feature added) is added to its schema, nullable, as Spark's `mergeSchema` adds it (without the
    Spark jobs that replay the table's log in a JVM that has not read it yet). False, and nothing written,
    otherwise."""
    import pyarrow as pa
    from deltalake import write_deltalake

    delta = newest(table)
    schema = delta.schema()
    columns = _table_columns(schema)
    appended = _columns(rows.schema.jsonValue())
    if not plain(delta) or any(name in columns and columns[name] != kind for name, kind in appended.items()):
        return False
    arrow = rows.toArrow()
    _offer(arrow)
    fields = pa.schema(schema.to_arrow())
    for name in (name for name in columns if name not in arrow.column_names):
        arrow = arrow.append_column(fields.field(name), pa.nulls(arrow.num_rows, fields.field(name).type))
    added = [name for name in appended if name not in columns]
    if added:  # the rows before hold no value for them
        arrow = arrow.cast(pa.schema([f.with_nullable(True) if f.name in added else f for f in arrow.schema]))
    write_deltalake(
        delta,
        arrow,
        mode="append",
        schema_mode="merge" if added else None,
        commit_properties=_recording(user_metadata),
    )
    return True


def create(
    table: str, rows: DataFrame, user_metadata: str, *, partition_by: list[str], configuration: dict[str, str]
) -> int:
    """The table made of `rows` (collected to the driver) in one commit recording `user_metadata`, partitioned by
    `partition_by`, with `configuration`, every column nullable as Spark makes them; returns the rows written."""
    import pyarrow as pa
    from deltalake import write_deltalake

    arrow = rows.toArrow()
    _offer(arrow)
    arrow = arrow.cast(pa.schema([f.with_nullable(True) for f in arrow.schema]))
    write_deltalake(
        table,
        arrow,
        mode="append",
        partition_by=partition_by,
        configuration=configuration,
        commit_properties=_recording(user_metadata),
    )
    return arrow.num_rows


def replace(table: str, rows: DataFrame, predicate: str, user_metadata: str) -> int | None:
    """The table's rows matching `predicate` replaced by `rows` (collected to the driver) in one commit recording
    `user_metadata`; returns the rows written. Only when deltalake may: the table is plain and its columns are
    exactly those of `rows`, of the same types. None, and nothing written, otherwise (a feature added, removed or
    changed goes to Spark's writer, whose `mergeSchema` adds a column or refuses a type).

    A commit another writer made since the table was read is detected as Delta's Spark writer detects it (a
    concurrent append into the replaced range: `CommitFailedError`), for the caller to make the commit again."""
    from deltalake import DeltaTable, write_deltalake

    delta = DeltaTable(table)
    columns = _table_columns(delta.schema())
    if not plain(delta) or columns != _columns(rows.schema.jsonValue()):
        return None
    arrow = rows.select(*columns).toArrow()
    _offer(arrow)
    write_deltalake(delta, arrow, mode="overwrite", predicate=predicate, commit_properties=_recording(user_metadata))
    return arrow.num_rows


def _recording(user_metadata: str) -> Any:
    """A commit's properties that record `user_metadata` as Spark's `userMetadata` option does."""
    from deltalake import CommitProperties

    return CommitProperties(custom_metadata={"userMetadata": user_metadata})


def _table_columns(schema: Schema) -> dict[str, Any]:
    import json

    return _columns(json.loads(schema.to_json()))


def _columns(schema: dict[str, Any]) -> dict[str, Any]:
    """Each column's type in Delta's (and Spark's) JSON form, nullability aside: Spark marks some computed
    columns not null where the table's are nullable, which an append may differ in."""
    return {f["name"]: _shape(f["type"]) for f in schema["fields"]}


def _shape(kind: Any) -> Any:
    if isinstance(kind, dict):
        drop = {"containsNull", "valueContainsNull", "nullable", "metadata"}
        return {k: _shape(v) for k, v in kind.items() if k not in drop}
    if isinstance(kind, list):
        return [_shape(v) for v in kind]
    return kind
