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
    DType.COUNT_MAP: "map<string,bigint>",
    DType.TIMESTAMP: "timestamp",
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


def bucket_of(group: FeatureGroup, labels: list[int]) -> Column:
    """A key's hash bucket, the unit of work of one kernel call: `labels[hash of the keys % len(labels)]`."""
    index = F.pmod(F.xxhash64(*[F.col(k) for k in group.join_keys]), F.lit(len(labels)))
    return F.element_at(F.array(*[F.lit(v).cast("bigint") for v in labels]), (index + 1).cast("int"))


def bucket_labels(buckets: int, partitions: int) -> list[int]:
    """The bucket column's values: bucket i gets the smallest free number that Spark's shuffle by that column
    puts in partition i % partitions (pmod of its Murmur3 hash). With the plain numbers 0..buckets-1, some
    partitions get two or three buckets and others none, and one task then does the work of several while a
    core idles."""
    free: dict[int, list[int]] = {p: [] for p in range(partitions)}
    for value in range(64 * (buckets + partitions)):
        free[_spark_hash_long(value) % partitions].append(value)
    return [free[i % partitions].pop(0) for i in range(buckets)]


def _spark_hash_long(value: int) -> int:
    """Spark's `hash()` of a bigint (Murmur3 x86 32-bit, seed 42), as a signed 32-bit integer."""
    mask = 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & mask

    def mix(h: int, k: int) -> int:
        k = rotl((k * 0xCC9E2D51) & mask, 15) * 0x1B873593 & mask
        return (rotl(h ^ k, 13) * 5 + 0xE6546B64) & mask

    h = mix(mix(42, value & mask), (value >> 32) & mask) ^ 8
    h = ((h ^ (h >> 16)) * 0x85EBCA6B) & mask
    h = ((h ^ (h >> 13)) * 0xC2B2AE35) & mask
    h ^= h >> 16
    return h - (1 << 32) if h & 0x80000000 else h


def ddl(columns: dict[str, DType]) -> str:
    return ", ".join(f"`{name}` {SPARK_TYPES[dtype]}" for name, dtype in columns.items())
