"""The Spark batch engine: events -> change-point series, in two phases (DESIGN.md section 3).

Phase 1 reduces the events of each (key, pane) to one row of partial aggregates, one column per feature,
with Spark's map-side partial aggregation before the shuffle. Pane length = gcd of the features' `every`.

Phase 2 turns panes into window values without ever expanding a pane into its windows. A value can only
change at a pane's entry or exit window end, so those candidate ends are the only rows computed. A window
[E - size, E) is split at the multiple of `size` inside it (van Herk / Gil-Werman): its value is the merge of
a suffix of one size-aligned block and a prefix of the next. Both are running aggregates over the panes of a
block, which Spark evaluates incrementally, so the cost is linear in panes and change points for every
mergeable aggregation (sums, min/max, sketches, last-k). A Lifetime window is one running prefix per key.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from features.engine.partials import Partial, partial_for
from features.engine.source import schema_of
from features.panes import MICROS, WindowShape, lookback_us, pane_length_us, shapes
from features.spec import WINDOW_END, AggKind, Feature, FeatureGroup

PANE = "_pane"  # pane start, integer microseconds since the epoch
T = "_t"  # position of a phase-2 row on the time axis: a pane start or a probe time
E = "_e"  # the window end a probe row computes
KIND = "_kind"
ROWS = "_rows"  # events per pane
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
    where_cols = [F.lit(True) if w is None else F.coalesce(F.expr(w), F.lit(False)) for w in conditions(group)]
    aggs = [F.count(F.lit(1)).alias(ROWS)]
    aggs += [F.count_if(c).alias(f"_n{i}") for i, c in enumerate(where_cols)]
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


def candidate_ends(panes: DataFrame, group: FeatureGroup, compiled: list[Compiled], lo: int, hi: int) -> DataFrame:
    """(key, E) for every window end in [lo, hi] at which some feature can change, plus E = lo for every
    key with earlier panes, so that a range's first row carries the value it starts with."""
    keys = list(group.join_keys)
    pane = F.col(PANE)
    ends = []
    for shape in shapes(group):
        used = [c for c in compiled if c.shape == shape]
        has_rows = F.lit(False)
        for c in used:
            has_rows = has_rows | (F.col(f"_n{c.condition}") > 0)
        coarse = _floor(pane, shape.every_us)
        ends.append(F.when(has_rows, coarse + shape.every_us))
        if shape.size_us is not None:
            ends.append(F.when(has_rows, coarse + shape.size_us + shape.every_us))
    ends.append(F.when(pane < lo, F.lit(lo)))
    exploded = panes.select(*keys, F.explode(F.array(*ends)).alias(E))
    return exploded.where(F.col(E).between(lo, hi)).distinct()


def _probe_rows(ends: DataFrame, keys: list[str], shape: WindowShape, kind: int) -> DataFrame:
    at = _floor(F.col(E), shape.every_us)
    t = at if kind == _PREFIX else at - F.lit(shape.size_us)
    return ends.select(*keys, t.alias(T), F.col(E), F.lit(kind).alias(KIND))


def _frame_values(
    panes: DataFrame, ends: DataFrame, keys: list[str], shape: WindowShape, used: list[Compiled], kind: int
) -> DataFrame:
    """For each (key, E): the merged partial of the panes in E's prefix block (panes in
    [block start, E)) or suffix block (panes in [E - size, block end)), per feature of this shape."""
    pane_rows = panes.select(
        *keys,
        F.col(PANE).alias(T),
        F.lit(None).cast("long").alias(E),
        F.lit(_PANE_ROW).alias(KIND),
        *[F.col(c.p) for c in used],
    )
    probes = _probe_rows(ends, keys, shape, kind)
    rows = pane_rows.unionByName(probes, allowMissingColumns=True)
    partition = [F.col(k) for k in keys]
    if shape.size_us is not None:
        partition.append(_floor(F.col(T), shape.size_us))
    w = Window.partitionBy(*partition)
    if kind == _PREFIX:
        w = w.orderBy(F.col(T)).rangeBetween(Window.unboundedPreceding, -1)
    else:  # a suffix is a running aggregate in descending time order, so Spark evaluates it incrementally
        w = w.orderBy(F.col(T).desc()).rangeBetween(Window.unboundedPreceding, Window.currentRow)
    name = (lambda c: c.pre) if kind == _PREFIX else (lambda c: c.suf)
    merged = rows.select(*keys, E, KIND, *[c.partial.merge_over(F.col(c.p), w).alias(name(c)) for c in used])
    return merged.where(F.col(KIND) == kind).drop(KIND)


def _signed_values(
    panes: DataFrame, ends: DataFrame, keys: list[str], shape: WindowShape, used: list[Compiled]
) -> DataFrame:
    """For each (key, E): the running sum of +partial at pane entries and -partial at pane exits."""
    coarse = _floor(F.col(PANE), shape.every_us)
    moves = [F.struct((coarse + shape.every_us).alias("at"), F.lit(1).alias("sign"))]
    if shape.size_us is not None:
        moves.append(F.struct((coarse + shape.size_us + shape.every_us).alias("at"), F.lit(-1).alias("sign")))
    deltas = panes.select(*keys, *[F.col(c.p) for c in used], F.explode(F.array(*moves)).alias("_m")).select(
        *keys,
        F.col("_m.at").alias(T),
        F.lit(None).cast("long").alias(E),
        F.lit(_PANE_ROW).alias(KIND),
        *[(F.col(c.p) * F.col("_m.sign")).alias(c.p) for c in used],
    )
    rows = deltas.unionByName(_probe_rows(ends, keys, shape, _PREFIX), allowMissingColumns=True)
    w = Window.partitionBy(*keys).orderBy(F.col(T)).rangeBetween(Window.unboundedPreceding, Window.currentRow)
    merged = rows.select(*keys, E, KIND, *[F.sum(c.p).over(w).alias(c.pre) for c in used])
    return merged.where(F.col(KIND) == _PREFIX).drop(KIND)


def phase2(panes: DataFrame, ends: DataFrame, group: FeatureGroup, compiled: list[Compiled]) -> DataFrame:
    """The value of every feature at every candidate end: (keys, window_end, features)."""
    keys = list(group.join_keys)
    parts = []
    for shape in shapes(group):
        signed = [c for c in compiled if c.shape == shape and c.signed]
        blocks = [c for c in compiled if c.shape == shape and not c.signed]
        if signed:
            parts.append(_signed_values(panes, ends, keys, shape, signed))
        if blocks:
            parts.append(_frame_values(panes, ends, keys, shape, blocks, _PREFIX))
        if blocks and shape.size_us is not None:
            parts.append(_frame_values(panes, ends, keys, shape, blocks, _SUFFIX))
    merged = parts[0]
    if len(parts) > 1:  # every part has one row per (key, E): bring each E's parts together
        rows = parts[0]
        for part in parts[1:]:
            rows = rows.unionByName(part, allowMissingColumns=True)
        combined = [F.first(c.pre, ignorenulls=True).alias(c.pre) for c in compiled]
        combined += [F.first(c.suf, ignorenulls=True).alias(c.suf) for c in compiled if c.has_suffix]
        merged = rows.groupBy(*keys, E).agg(*combined)
    values = []
    for c in compiled:
        partial = c.partial.merge2(F.col(c.pre), F.col(c.suf)) if c.has_suffix else F.col(c.pre)
        values.append(c.partial.finalize(partial).alias(c.feature.name))
    return merged.select(*keys, F.timestamp_micros(F.col(E)).alias(WINDOW_END), *values)


@dataclass(frozen=True)
class ChangePoints:
    rows: DataFrame  # keys, window_end, one column per feature
    panes: DataFrame  # phase 1 output, cached

    def events_read(self) -> int:
        return int(self.panes.agg(F.sum(ROWS)).first()[0] or 0)


def change_points(group: FeatureGroup, events: DataFrame, start_us: int, end_us: int) -> ChangePoints:
    """The change-point series with window ends in [start, end] (end included, so the last row of each
    key is its value as of `end`), from events before `end`. Panes are cached: phase 2 reads them often."""
    keys = list(group.join_keys)
    lower = read_lower_bound(group, start_us)
    ts = F.col(group.source.timestamp)
    in_range = ts < F.timestamp_micros(F.lit(end_us))
    if lower is not None:
        in_range = in_range & (ts >= F.timestamp_micros(F.lit(lower)))
    compiled = compile_group(group, events)
    panes = phase1(group, events.where(in_range), compiled).repartition(*keys).cache()
    ends = candidate_ends(panes, group, compiled, start_us, end_us)
    return ChangePoints(phase2(panes, ends, group, compiled), panes)
