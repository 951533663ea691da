"""What both Spark engines hand the kernel (features.kernel): per event the join keys, its time in µs, the truth of
each distinct `where`, and the value columns cast as the kernel expects; plus the Spark types of its output.

One projection for the batch and the streaming engine, so that they feed the kernel the same values."""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from features import kernel
from features.spec import DType, FeatureGroup

SPARK_TYPES = {
    DType.INT64: "bigint",
    DType.FLOAT64: "double",
    DType.STRING: "string",
    DType.BOOL: "boolean",
    DType.INT64_LIST: "array<bigint>",
    DType.FLOAT64_LIST: "array<double>",
    DType.STRING_LIST: "array<string>",
    DType.BOOL_LIST: "array<boolean>",
}


def kernel_inputs(group: FeatureGroup, types: dict[str, DType], plan: kernel.Plan) -> list[Column]:
    """The kernel's input columns: keys, `fx_ts` (µs), `fx_c<i>` per `where`, and the cast `fx_v_*` values."""
    cols: list[Column] = [F.col(k) for k in group.join_keys]
    cols.append(F.unix_micros(F.col(group.source.timestamp).cast("timestamp")).alias(kernel.TS))
    for i, cond in enumerate(plan.conditions):
        if cond is not None:
            cols.append(F.coalesce(F.expr(cond), F.lit(False)).alias(f"fx_c{i}"))
    seen = set()
    for calc, feat in zip(plan.calcs, group.features, strict=True):
        if calc.value is None or calc.value in seen:
            continue
        seen.add(calc.value)
        column = F.col(feat.aggregation.column)  # type: ignore[arg-type]
        if kernel.text_cast(calc.kind, types[feat.aggregation.column]):  # type: ignore[index]
            column = column.cast("string")
        elif calc.value_type is DType.FLOAT64:
            column = column.cast("double")
        cols.append(column.alias(calc.value))
    return cols


def bucket_of(group: FeatureGroup, buckets: int) -> Column:
    """A key's hash bucket, 0..buckets-1: the unit of work of one kernel call."""
    return F.pmod(F.xxhash64(*[F.col(k) for k in group.join_keys]), F.lit(buckets))


def ddl(columns: dict[str, DType]) -> str:
    return ", ".join(f"`{name}` {SPARK_TYPES[dtype]}" for name, dtype in columns.items())
