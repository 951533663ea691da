"""The Spark batch engine: events -> change-point series, in two phases (DESIGN.md section 3).

Phase 1 reduces the events of each (key, pane) to one row of partial aggregates, one column per feature.
Pane length = gcd of the features' `every`. Events are shuffled once, by key, before phase 1: everything
after it then runs without another shuffle. (Spark's map-side partial aggregation would need a second
shuffle by key for phase 2; measured in bench/backfill.py it cost 30-50% more than it saved.)

Phase 2 turns panes into window values without ever expanding a pane into its windows. A value can only
change at a pane's entry or exit window end, so those candidate ends are the only rows computed. A window
[E - size, E) is split at the multiple of `size` inside it (van Herk / Gil-Werman): its value is the merge of
a suffix of one size-aligned block and a prefix of the next. Both are running aggregates over the panes of a
block, which Spark evaluates incrementally, so the cost is linear in panes and change points for every
mergeable aggregation (sums, min/max, sketches, last-k). A Lifetime window is one running prefix per key.
Exact integer sums (counts, integer sums) take a cheaper path: +partial where a pane enters, -partial where
it leaves, one running sum per key, computed in numpy per key partition (features.engine.signed).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Observation, Window
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from features.engine.partials import Partial, partial_for
from features.engine.signed import SignedSpec, signed_changes
from features.engine.source import schema_of
from features.panes import MICROS, WindowShape, lookback_us, pane_length_us, shapes
from features.spec import WINDOW_END, AggKind, Feature, FeatureGroup

PANE = "_pane"  # pane start, integer microseconds since the epoch
T = "_t"  # position of a phase-2 row on the time axis: a pane start or a probe time
E = "_e"  # the window end a probe row computes
KIND = "_kind"
_PANE_ROW, _PREFIX, _SUFFIX = 0, 1, 2


@dataclass(frozen=True)
class Compiled:
    """A feature with its Spark expressions and the index of its `where` condition."""

    feature: Feature
    partial: Partial
    condition: int

    @property
    def shape(self) -> WindowShape:
        return WindowShape.of(self.feature.window)

    @property
    def signed(self) -> bool:
        """Exact integer sums take the cheaper path: +partial when a pane enters, -partial when it leaves,
        and one running sum per key. (Float sums stay on the block path, which cannot accumulate drift.)"""
        agg = self.feature.aggregation
        return agg.kind is AggKind.COUNT or (agg.kind is AggKind.SUM and self.partial.integral)

    @property
    def has_suffix(self) -> bool:
        return self.shape.size_us is not None and not self.signed

    @property
    def p(self) -> str:
        return f"_p_{self.feature.name}"

    @property
    def pre(self) -> str:
        return f"_pre_{self.feature.name}"

    @property
    def suf(self) -> str:
        return f"_suf_{self.feature.name}"


def conditions(group: FeatureGroup) -> list[str | None]:
    """The group's distinct `where` filters; phase 1 counts each one's rows per pane."""
    out: list[str | None] = []
    for feat in group.features:
        if feat.where not in out:
            out.append(feat.where)
    return out


def compile_group(group: FeatureGroup, events: DataFrame) -> list[Compiled]:
    schema = schema_of(events.schema)
    conds = conditions(group)
    out = []
    for feat in group.features:
        column = feat.aggregation.column
        out.append(
            Compiled(feat, partial_for(feat, None if column is None else schema[column]), conds.index(feat.where))
        )
    return out


def read_lower_bound(group: FeatureGroup, start_us: int) -> int | None:
    """The earliest event time a range starting at `start_us` needs: one longest window, plus one pane
    whose exit falls exactly on `start`. None when a Lifetime window needs all history."""
    lookback = lookback_us(group)
    if lookback is None:
        return None
    return start_us - lookback - max(f.window.every_s for f in group.features) * MICROS


def _floor(col: Column, step: int) -> Column:
    return col - F.pmod(col, F.lit(step))


def phase1(group: FeatureGroup, events: DataFrame, compiled: list[Compiled]) -> DataFrame:
    """One row per (key, pane): every feature's partial and, per distinct `where`, its row count."""
    keys = list(group.join_keys)
    ts = F.unix_micros(F.col(group.source.timestamp).cast("timestamp"))
    where_cols = [None if w is None else F.coalesce(F.expr(w), F.lit(False)) for w in conditions(group)]
    aggs = [F.count(F.lit(1) if c is None else F.when(c, 1)).alias(f"_n{i}") for i, c in enumerate(where_cols)]
    for c in compiled:
        column = c.feature.aggregation.column
        value = None if column is None else F.col(column)
        aggs.append(c.partial.phase1(where_cols[c.condition], value, F.col("_ts")).alias(c.p))
    present = F.col("_ts").isNotNull()
    for key in keys:
        present = present & F.col(key).isNotNull()
    return (
        events.withColumn("_ts", ts)
        .where(present)
        .groupBy(*keys, _floor(F.col("_ts"), pane_length_us(f.window for f in group.features)).alias(PANE))
        .agg(*aggs)
    )


def _has_rows(used: list[Compiled]) -> Column:
    """True for panes that hold a row for any of these features (after their `where`)."""
    cond = F.lit(False)
    for c in used:
        cond = cond | (F.col(f"_n{c.condition}") > 0)
    return cond


def _moves(shape: WindowShape, used: list[Compiled], lo: int) -> list[Column]:
    """(at, sign) of the window ends where a pane enters (+1) and leaves (-1) this shape's windows.

    Moves before `lo` are moved to `lo`: the value at `lo` still sums all of them, and a range's first row
    (at `lo`) then carries the value the range starts with, without a row for every earlier end."""
    coarse = _floor(F.col(PANE), shape.every_us)
    has_rows = _has_rows(used)

    def move(at: Column, sign: int) -> Column:
        return F.when(has_rows, F.struct(F.greatest(at, F.lit(lo)).alias("at"), F.lit(sign).alias("sign")))

    moves = [move(coarse + shape.every_us, 1)]
    if shape.size_us is not None:
        moves.append(move(coarse + shape.size_us + shape.every_us, -1))
    return moves


def _signed_part(panes: DataFrame, keys: list[str], shape: WindowShape, used: list[Compiled], lo: int, hi: int):
    """Exact integer sums: + partial where a pane enters, - where it leaves, one running sum per key; computed
    per key partition in numpy (features.engine.signed), the panes being partitioned by key already."""
    flags = sorted({f"_n{c.condition}" for c in used})
    # A count's partial is its condition's row count: that column is sent once.
    values = [f"_n{c.condition}" if c.feature.aggregation.kind is AggKind.COUNT else c.p for c in used]
    spec = SignedSpec(
        keys=tuple(keys),
        pane=PANE,
        flags=tuple(flags),
        values=tuple(values),
        out=tuple(c.pre for c in used),
        features=tuple(c.feature.name for c in used),
        end=E,
        every_us=shape.every_us,
        size_us=shape.size_us,
        lo=lo,
        hi=hi,
    )
    schema = StructType(
        [
            *[panes.schema[k] for k in keys],
            StructField(E, LongType(), False),
            *[StructField(c.pre, LongType(), False) for c in used],
        ]
    )
    sums = sorted({v for v in values if v not in flags})
    columns = [*keys, PANE, *flags, *[F.col(v).cast("long").alias(v) for v in sums]]
    return panes.select(*columns).mapInArrow(functools.partial(signed_changes, spec=spec), schema)


def _block_part(panes: DataFrame, keys: list[str], shape: WindowShape, used: list[Compiled], lo: int, hi: int):
    """Any mergeable aggregation: each window = suffix of one size-aligned block (+) prefix of the next."""
    ends = (
        panes.select(*keys, F.explode(F.array(*_moves(shape, used, lo))).alias("m"))
        .select(*keys, F.col("m.at").alias(E))
        .where(F.col(E).between(lo, hi))
        .distinct()
    )
    prefix = _block_frame(panes, ends, keys, shape, used, _PREFIX)
    if shape.size_us is None:  # Lifetime: everything before E is one running prefix
        return prefix.select(*keys, E, *[F.col(c.pre) for c in used])
    suffix = _block_frame(panes, ends, keys, shape, used, _SUFFIX)
    both = prefix.unionByName(suffix, allowMissingColumns=True).groupBy(*keys, E)
    merged = both.agg(*[F.first(n, ignorenulls=True).alias(n) for c in used for n in (c.pre, c.suf)])
    return merged.select(*keys, E, *[c.partial.merge2(F.col(c.pre), F.col(c.suf)).alias(c.pre) for c in used])


def _block_frame(
    panes: DataFrame, ends: DataFrame, keys: list[str], shape: WindowShape, used: list[Compiled], kind: int
) -> DataFrame:
    """For each (key, E): the merged partial of the panes in [block start, E) (prefix) or in
    [E - size, block end) (suffix), where blocks are the size-aligned stretches of time."""
    at = _floor(F.col(E), shape.every_us)  # the value at E is the value of the window ending at `at`
    probes = ends.select(*keys, (at if kind == _PREFIX else at - F.lit(shape.size_us)).alias(T), E)
    pane_rows = panes.select(*keys, F.col(PANE).alias(T), *[F.col(c.p) for c in used])
    rows = pane_rows.unionByName(probes.withColumn(KIND, F.lit(kind)), allowMissingColumns=True)
    partition = [F.col(k) for k in keys]
    if shape.size_us is not None:
        partition.append(_floor(F.col(T), shape.size_us))
    w = Window.partitionBy(*partition)
    prepared = [c for c in used if c.partial.prepare is not None]
    if prepared:
        rows = rows.select(
            *[c for c in rows.columns if c not in {p.p for p in prepared}],
            *[p.partial.prepare(F.col(p.p), w).alias(p.p) for p in prepared],  # type: ignore[misc]
        )
    if kind == _PREFIX:
        w = w.orderBy(F.col(T)).rangeBetween(Window.unboundedPreceding, -1)
    else:  # a suffix is a running aggregate in descending time, which Spark evaluates incrementally
        w = w.orderBy(F.col(T).desc()).rangeBetween(Window.unboundedPreceding, Window.currentRow)
    out = (lambda c: c.pre) if kind == _PREFIX else (lambda c: c.suf)
    merged = rows.select(*keys, E, KIND, *[c.partial.merge_over(F.col(c.p), w).alias(out(c)) for c in used])
    return merged.where(F.col(KIND).isNotNull()).drop(KIND)


def _as_of_union(parts: list[DataFrame], keys: list[str], compiled: list[Compiled]) -> DataFrame:
    """Parts change at different ends: at every end of any part, carry each part's latest value forward."""
    rows = None
    for i, part in enumerate(parts):
        marked = part.withColumn(f"_part{i}", F.lit(True))
        rows = marked if rows is None else rows.unionByName(marked, allowMissingColumns=True)
    assert rows is not None
    upto = Window.partitionBy(*keys).orderBy(E).rangeBetween(Window.unboundedPreceding, Window.currentRow)
    filled = []
    for i, part in enumerate(parts):
        for c in compiled:
            if c.pre in part.columns:
                # Wrapped in a struct so that a null value is carried too (only rows of other parts are skipped).
                mine = F.when(F.col(f"_part{i}"), F.struct(F.col(c.pre).alias("v")))
                filled.append(F.last(mine, ignorenulls=True).over(upto)["v"].alias(c.pre))
    return rows.select(*keys, E, *filled).dropDuplicates([*keys, E])


def _parts(group: FeatureGroup, compiled: list[Compiled]) -> list[tuple[WindowShape, bool, list[Compiled]]]:
    """The features computed together: one window shape, on the signed path or the block path."""
    out = []
    for shape in shapes(group):
        for signed in (True, False):
            used = [c for c in compiled if c.shape == shape and c.signed == signed]
            if used:
                out.append((shape, signed, used))
    return out


def phase2(panes: DataFrame, group: FeatureGroup, compiled: list[Compiled], lo: int, hi: int) -> DataFrame:
    """The value of every feature at every end in [lo, hi] where one may change: (keys, window_end, ...)."""
    keys = list(group.join_keys)
    parts = [
        (_signed_part if signed else _block_part)(panes, keys, shape, used, lo, hi)
        for shape, signed, used in _parts(group, compiled)
    ]
    merged = parts[0] if len(parts) == 1 else _as_of_union(parts, keys, compiled)
    values = [c.partial.finalize(F.col(c.pre)).alias(c.feature.name) for c in compiled]
    return merged.select(*keys, F.timestamp_micros(F.col(E)).alias(WINDOW_END), *values)


def _by_key(events: DataFrame, keys: list[str]) -> DataFrame:
    """Events shuffled by key into the session's number of shuffle partitions. A fixed count, because
    adaptive execution would merge small partitions into fewer, unequal tasks (3 on 2 cores: a tail)."""
    configured = events.sparkSession.conf.get("spark.sql.shuffle.partitions") or ""
    return events.repartition(int(configured), *keys) if configured.isdigit() else events.repartition(*keys)


@dataclass(frozen=True)
class ChangePoints:
    rows: DataFrame  # keys, window_end, one column per feature
    panes: DataFrame  # phase 1 output
    events: DataFrame  # the events read
    observed: Observation | None = None  # counts the events while `rows` is computed

    def release(self) -> None:
        self.panes.unpersist()

    def events_read(self) -> int:
        """How many events the computation read. Once `rows` was computed (written), the count observed
        during that job, else a separate job that only scans timestamps."""
        if self.observed is not None:
            return int(self.observed.get["events"])
        return self.events.count()


def change_points(
    group: FeatureGroup, events: DataFrame, start_us: int, end_us: int, *, observe: bool = False
) -> ChangePoints:
    """The change-point series with window ends in [start, end] (end included, so the last row of each
    key is its value as of `end`), from events before `end`.

    `observe=True`: count the events in the job that computes the rows; `events_read()` then returns that
    count, and must only be called after `rows` was computed (an observation waits for its first job)."""
    keys = list(group.join_keys)
    lower = read_lower_bound(group, start_us)
    ts = F.col(group.source.timestamp)
    in_range = ts < F.timestamp_micros(F.lit(end_us))
    if lower is not None:
        in_range = in_range & (ts >= F.timestamp_micros(F.lit(lower)))
    compiled = compile_group(group, events)
    events = events.where(in_range)
    observed = Observation() if observe else None
    read = events if observed is None else events.observe(observed, F.count(F.lit(1)).alias("events"))
    panes = phase1(group, _by_key(read, keys), compiled)
    if len(_parts(group, compiled)) > 1:
        panes = panes.persist()  # read by every part: read and shuffle the source once
    return ChangePoints(phase2(panes, group, compiled, start_us, end_us), panes, events, observed)
