"""Statistics of feature values per UTC day, as partials that merge exactly: what a backfill partition or a stream
micro-batch records of the rows it writes (features.quality.statistics computes them in Spark's workers,
features.stores.statistics keeps them), and what drift is measured on (features.kernel.drift_measures).

One `FeatureProfile` per (feature, day of the window end) holds:
- rows, and nulls (a null or NaN value, or an empty list or map);
- for numbers, the moments (n, mean, M2), min and max, and the value sketch of approx_percentile
  (features.kernel.quantiles: counts per logarithmic bucket, within 1% of the exact quantile, merged by adding
  counts); for lists and maps the same of their sizes;
- an estimate of distinct values: HyperLogLog registers (2^11 of them, about 2.3% standard error), merged by
  their maximum;
- for strings and booleans each value's count, for maps each key's count of rows that hold it, and for string
  lists each element's: at most `CATEGORY_CAP` values are kept, the rest counted in `other`.

Merging two profiles gives the profile of the union of their rows (to the bit for counts, sketches and registers;
the moments up to float rounding), whatever the order: a day's micro-batches are merged, never recomputed.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from features.kernel.quantiles import SHIFT, bucket_codes, bucket_values

NUMERIC, CATEGORICAL, LIST, MAP = "numeric", "categorical", "list", "map"
CATEGORY_CAP = 1000  # values kept per profile; more are counted in `other` (ids are not categories)
HLL_BITS = 11
HLL_REGISTERS = 1 << HLL_BITS
DAY_US = 86_400_000_000
PROFILE_ROWS = 500_000  # rows a Spark task profiles at once (their columns' memory, not the rows')
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)  # the quantiles the table shows as columns (any can be asked)


@dataclass
class FeatureProfile:
    """One feature's values on one day (see the module's text). `n`, the moments, `low`/`high` and the sketch
    describe the numbers: the values of a numeric feature, the sizes of a list or map feature."""

    kind: str
    rows: int = 0
    nulls: int = 0
    n: int = 0
    mean: float = 0.0
    m2: float = 0.0
    low: float = math.inf
    high: float = -math.inf
    codes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # sorted, distinct bucket codes
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    registers: np.ndarray = field(default_factory=lambda: np.zeros(HLL_REGISTERS, np.uint8))
    categories: dict[str, int] = field(default_factory=dict)
    other: int = 0  # counts of the values beyond CATEGORY_CAP

    @property
    def null_share(self) -> float:
        return self.nulls / self.rows if self.rows else 0.0

    @property
    def std(self) -> float | None:
        """The sample standard deviation (n - 1), None below two values."""
        return math.sqrt(max(self.m2, 0.0) / (self.n - 1)) if self.n > 1 else None

    def quantile(self, q: float) -> float | None:
        """The q-quantile of the numbers (the value of rank ceil(q n), within 1% of it), None without numbers."""
        total = int(self.counts.sum())
        if total == 0:
            return None
        rank = max(math.ceil(q * total), 1)
        at = int(np.searchsorted(np.cumsum(self.counts), rank))
        return float(bucket_values(self.codes[at : at + 1])[0])

    def distinct(self) -> float:
        """The HyperLogLog estimate of distinct values (linear counting while registers are empty)."""
        m = HLL_REGISTERS
        zeros = int(np.count_nonzero(self.registers == 0))
        if zeros == m:
            return 0.0
        raw = (0.7213 / (1 + 1.079 / m)) * m * m / float(np.sum(np.ldexp(1.0, -self.registers.astype(np.int64))))
        return m * math.log(m / zeros) if raw <= 2.5 * m and zeros else raw

    def merge(self, other: FeatureProfile) -> FeatureProfile:
        """The profile of both profiles' rows (neither is changed)."""
        n = self.n + other.n
        delta = other.mean - self.mean
        mean = self.mean + delta * other.n / n if n else 0.0
        m2 = self.m2 + other.m2 + (delta * delta * self.n * other.n / n if n else 0.0)
        codes, counts = _add_counts(self.codes, self.counts, other.codes, other.counts)
        categories = dict(self.categories)
        for value, count in other.categories.items():
            categories[value] = categories.get(value, 0) + count
        categories, dropped = _capped(categories)
        return FeatureProfile(
            kind=self.kind if self.rows or not other.rows else other.kind,
            rows=self.rows + other.rows,
            nulls=self.nulls + other.nulls,
            n=n,
            mean=mean,
            m2=m2,
            low=min(self.low, other.low),
            high=max(self.high, other.high),
            codes=codes,
            counts=counts,
            registers=np.maximum(self.registers, other.registers),
            categories=categories,
            other=self.other + other.other + dropped,
        )


def merge_all(profiles: Iterable[FeatureProfile]) -> FeatureProfile | None:
    merged = None
    for p in profiles:
        merged = p if merged is None else merged.merge(p)
    return merged


def kind_of(arrow_type: pa.DataType) -> str:
    if pa.types.is_map(arrow_type):
        return MAP
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return LIST
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or pa.types.is_boolean(arrow_type):
        return CATEGORICAL
    return NUMERIC


def profile_column(values: pa.Array) -> FeatureProfile:
    """The profile of one column's values (of one day)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    kind = kind_of(values.type)
    rows = len(values)
    if kind == NUMERIC:
        numbers = _numbers(values)  # nulls as NaN
        present = ~np.isnan(numbers)
        finite = np.isfinite(numbers)
        finite_numbers = numbers if finite.all() else numbers[finite]  # no copy in the common case
        profile = _numeric(FeatureProfile(kind, rows), finite_numbers)
        profile.registers = _registers(_float_hashes(finite_numbers))
        profile.nulls = rows - int(present.sum())
        return profile
    present = ~np.asarray(values.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    if kind == CATEGORICAL:
        profile = FeatureProfile(kind, rows)
        texts = values.cast(pa.string()) if pa.types.is_boolean(values.type) else values
        _count_categories(profile, texts.filter(pa.array(present)))
    else:  # lists and maps: their sizes, their elements or keys
        elements = _map_keys(values) if kind == MAP else values
        sizes = np.asarray(pc.list_value_length(elements).fill_null(0).to_numpy(zero_copy_only=False), np.float64)
        present &= sizes > 0  # an empty list or map counts as null
        profile = _numeric(FeatureProfile(kind, rows), sizes[present])  # sizes are finite
        flat = pc.list_flatten(elements.filter(pa.array(present)))
        if kind == MAP or kind_of(flat.type) == CATEGORICAL:
            _count_categories(profile, flat.cast(pa.string()) if pa.types.is_boolean(flat.type) else flat)
        else:
            numbers = _numbers(flat)
            profile.registers = _registers(_float_hashes(numbers[~np.isnan(numbers)]))
    profile.nulls = rows - int(present.sum())
    return profile


def profile_days(
    table: pa.Table | pa.RecordBatch, time_column: str, names: Sequence[str]
) -> dict[tuple[int, str], FeatureProfile]:
    """The profile of each feature of `names` per day of `time_column` (days since 1970-01-01, UTC)."""
    ends = table.column(time_column).cast(pa.timestamp("us", "UTC")).cast(pa.int64())
    day_of_row = np.floor_divide(np.asarray(ends.to_numpy(zero_copy_only=False), np.int64), DAY_US)
    out: dict[tuple[int, str], FeatureProfile] = {}
    for day in np.unique(day_of_row).tolist():
        taken = table.filter(pa.array(day_of_row == day))
        for name in names:
            out[(int(day), name)] = profile_column(taken.column(name))
    return out


def merge_into(into: dict[Any, FeatureProfile], found: dict[Any, FeatureProfile]) -> None:
    for key, p in found.items():
        into[key] = p if key not in into else into[key].merge(p)


def _map_keys(values: pa.MapArray) -> pa.ListArray:
    """Each map's keys as a list (pyarrow's compute functions take lists, not maps)."""
    # `offsets` of a sliced array index into the unsliced `keys`, which is what `keys` returns; a null map's
    # offsets span no key, so its list is empty (counted as null, as empty maps are)
    return pa.ListArray.from_arrays(values.offsets, values.keys)


def _numbers(values: pa.Array) -> np.ndarray:
    """Numbers as float64 (times as microseconds), nulls as NaN."""
    if pa.types.is_timestamp(values.type) or pa.types.is_date(values.type):
        values = values.cast(pa.timestamp("us", "UTC")).cast(pa.int64())
    if values.type != pa.float64():
        # Unchecked: an int64 beyond 2**53 (an id) has no exact float64, and statistics are approximate anyway
        values = values.cast(pa.float64(), safe=False)
    if values.null_count:  # else the buffer as it is, without a copy
        values = values.fill_null(math.nan)
    return np.asarray(values.to_numpy(zero_copy_only=False), np.float64)


def _numeric(profile: FeatureProfile, v: np.ndarray) -> FeatureProfile:
    """The moments, extremes and sketch of the finite numbers `v` added to an empty profile."""
    if len(v) == 0:
        return profile
    profile.n = len(v)
    profile.mean = float(v.mean())
    profile.m2 = float(np.sum((v - profile.mean) ** 2))
    profile.low, profile.high = float(v.min()), float(v.max())
    # Counted by bincount over the code range, not np.unique: no sort (bucket codes + SHIFT are below 2**BITS)
    counted = np.bincount(bucket_codes(v).astype(np.int64) + SHIFT)
    codes = np.flatnonzero(counted)
    profile.codes, profile.counts = (codes - SHIFT).astype(np.int32), counted[codes].astype(np.int64)
    return profile


def _count_categories(profile: FeatureProfile, texts: pa.Array) -> None:
    counted = pc.value_counts(texts.drop_null()) if len(texts) else None
    if counted is None or len(counted) == 0:
        return
    names = counted.field("values").to_pylist()
    numbers = counted.field("counts").to_pylist()
    profile.categories, profile.other = _capped(dict(zip(names, numbers, strict=True)))
    profile.registers = _registers(_text_hashes(names))


def _capped(categories: dict[str, int]) -> tuple[dict[str, int], int]:
    """At most CATEGORY_CAP values, the most frequent (ties by value), and the count of the others."""
    if len(categories) <= CATEGORY_CAP:
        return categories, 0
    kept = sorted(categories.items(), key=lambda item: (-item[1], item[0]))[:CATEGORY_CAP]
    return dict(kept), sum(categories.values()) - sum(c for _, c in kept)


def _add_counts(codes_a: np.ndarray, counts_a: np.ndarray, codes_b: np.ndarray, counts_b: np.ndarray):
    codes = np.concatenate([codes_a, codes_b])
    if len(codes) == 0:
        return codes.astype(np.int32), np.zeros(0, np.int64)
    distinct, inverse = np.unique(codes, return_inverse=True)
    counts = np.zeros(len(distinct), np.int64)
    np.add.at(counts, inverse, np.concatenate([counts_a, counts_b]))
    return distinct.astype(np.int32), counts


_MIX_1, _MIX_2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _float_hashes(v: np.ndarray) -> np.ndarray:
    """splitmix64 of each value's bits (-0.0 as 0.0): equal numbers, equal hashes, in every process."""
    x = (v + 0.0).astype(np.float64).view(np.uint64)
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * _MIX_1
        x = (x ^ (x >> np.uint64(27))) * _MIX_2
    return x ^ (x >> np.uint64(31))


def _text_hashes(texts: Sequence[str]) -> np.ndarray:
    """A 64-bit hash of each distinct text (Python's own hash() differs between processes)."""
    digests = b"".join(hashlib.blake2b(t.encode("utf-8", "surrogatepass"), digest_size=8).digest() for t in texts)
    return np.frombuffer(digests, dtype="<u8").astype(np.uint64)


def _registers(hashes: np.ndarray) -> np.ndarray:
    """HyperLogLog registers of 64-bit hashes: the top HLL_BITS choose the register, which keeps the largest
    rank (1 + leading zeros) of the next 32 bits (enough below about 10^9 distinct values)."""
    registers = np.zeros(HLL_REGISTERS, np.uint8)
    if len(hashes) == 0:
        return registers
    index = (hashes >> np.uint64(64 - HLL_BITS)).astype(np.intp)
    rest = ((hashes >> np.uint64(32 - HLL_BITS)) & np.uint64(0xFFFFFFFF)).astype(np.float64)  # exact in a double
    # rest = m 2^e with m in [0.5, 1): 32 - floor(log2(rest)) = 33 - e leading zeros plus one; rest 0 gives e 0, 33
    rank = (33 - np.frexp(rest)[1]).astype(np.uint8)
    np.maximum.at(registers, index, rank)
    return registers


# ---------------------------------------------------------------------------------------------------------
# As Arrow records: how Spark's workers hand partials to the driver, and how the statistics table keeps them

RECORD_SCHEMA = pa.schema(
    [
        ("day", pa.int32()),
        ("feature", pa.string()),
        ("kind", pa.string()),
        ("rows", pa.int64()),
        ("nulls", pa.int64()),
        ("n", pa.int64()),
        ("mean", pa.float64()),
        ("m2", pa.float64()),
        ("min", pa.float64()),
        ("max", pa.float64()),
        ("sketch_codes", pa.list_(pa.int32())),
        ("sketch_counts", pa.list_(pa.int64())),
        ("registers", pa.binary()),
        ("category_values", pa.list_(pa.string())),
        ("category_counts", pa.list_(pa.int64())),
        ("category_other", pa.int64()),
    ]
)


def to_records(profiles: dict[tuple[int, str], FeatureProfile]) -> pa.Table:
    """Profiles keyed by (day, feature) as rows of RECORD_SCHEMA."""
    rows = []
    for (day, name), p in sorted(profiles.items()):
        rows.append(
            {
                "day": day,
                "feature": name,
                "kind": p.kind,
                "rows": p.rows,
                "nulls": p.nulls,
                "n": p.n,
                "mean": p.mean,
                "m2": p.m2,
                "min": p.low if p.n else None,
                "max": p.high if p.n else None,
                "sketch_codes": p.codes.tolist(),
                "sketch_counts": p.counts.tolist(),
                "registers": p.registers.tobytes(),
                "category_values": list(p.categories),
                "category_counts": list(p.categories.values()),
                "category_other": p.other,
            }
        )
    return pa.Table.from_pylist(rows, schema=RECORD_SCHEMA)


def from_records(table: pa.Table) -> Iterator[tuple[tuple[int, str], FeatureProfile]]:
    """The profiles of rows of RECORD_SCHEMA (other columns are ignored), keyed by (day, feature)."""
    for r in table.select(RECORD_SCHEMA.names).to_pylist():
        profile = FeatureProfile(
            kind=r["kind"],
            rows=r["rows"],
            nulls=r["nulls"],
            n=r["n"],
            mean=r["mean"],
            m2=r["m2"],
            low=math.inf if r["min"] is None else r["min"],
            high=-math.inf if r["max"] is None else r["max"],
            codes=np.array(r["sketch_codes"] or [], np.int32),
            counts=np.array(r["sketch_counts"] or [], np.int64),
            registers=np.frombuffer(r["registers"], np.uint8).copy(),
            categories=dict(zip(r["category_values"] or [], r["category_counts"] or [], strict=True)),
            other=r["category_other"],
        )
        yield (r["day"], r["feature"]), profile


def profile_batches(
    batches: Iterator[pa.RecordBatch], time_column: str, names: Sequence[str]
) -> Iterator[pa.RecordBatch]:
    """Spark's mapInArrow: the profiles of all the batches of one partition, as record batches of RECORD_SCHEMA.
    Batches are profiled together, up to PROFILE_ROWS rows at a time: one sort of a column's bucket codes instead
    of one per Arrow batch of 10,000 rows, and fewer merges."""
    found: dict[tuple[int, str], FeatureProfile] = {}
    held: list[pa.RecordBatch] = []
    rows = 0
    for batch in batches:
        if batch.num_rows:
            held.append(batch)
            rows += batch.num_rows
        if rows >= PROFILE_ROWS:
            merge_into(found, profile_days(pa.Table.from_batches(held), time_column, names))
            held, rows = [], 0
    if held:
        merge_into(found, profile_days(pa.Table.from_batches(held), time_column, names))
    yield from to_records(found).to_batches()
