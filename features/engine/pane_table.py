"""The streaming engine's two phases in pandas/numpy: pane partials, their merge into window values, and the
change points between two watermarks. Pure Python (no Spark), so it is tested without a cluster; the
Spark streaming engine (`features.engine.stream`) runs it inside `transformWithStateInPandas`.

A pane table holds one row per (key, pane): the join keys, `fx_pane` (pane start, µs), `fx_n<i>` (rows passing
the group's i-th distinct `where`, which decide where values may change, exactly as the batch engine does),
and each feature's partial columns `<feature>.<part>`. One row per key may have `fx_pane == BASE`: the merged
partials of panes that only Lifetime windows still read.

The meaning of every value is DESIGN.md section 2; the window and pane arithmetic is `features.panes`.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from features.panes import MICROS, pane_length_us
from features.spec import AggKind, DType, FeatureGroup
from features.spec.aggregations import DEFAULT_HLL_LG_K, DEFAULT_KLL_K

PANE = "fx_pane"
TS = "fx_ts"  # Spark renames pandas columns that start with "_", so the processor's start with fx_
KEY = "fx_key"  # a join key's code in a KeyDictionary: what the stream keeps in state instead of the keys
BASE = np.iinfo(np.int64).min  # the `fx_pane` of a key's folded Lifetime partials
_I64_MAX = np.iinfo(np.int64).max


@dataclass(frozen=True)
class Calc:
    """One feature as the stream computes it: which input columns it reads and its window in µs."""

    name: str
    kind: AggKind
    condition: int  # index into StreamPlan.conditions
    value: str | None  # input column (already cast by Spark where the batch engine casts)
    value_type: DType | None
    output_type: DType
    size_us: int | None  # None: Lifetime
    every_us: int
    k: int = 1
    quantile: float = 0.5

    def col(self, part: str) -> str:
        return f"{self.name}.{part}"


@dataclass(frozen=True)
class StreamPlan:
    """What the processor needs to know about a group (built on the driver, shipped to the workers)."""

    keys: tuple[str, ...]
    conditions: tuple[str | None, ...]  # distinct `where`s; input column `fx_c<i>` holds each one's truth
    calcs: tuple[Calc, ...]
    pane_us: int

    @classmethod
    def of(cls, group: FeatureGroup, input_types: dict[str, DType]) -> StreamPlan:
        conds: list[str | None] = []
        for feat in group.features:
            if feat.where not in conds:
                conds.append(feat.where)
        calcs = []
        for feat in group.features:
            agg = feat.aggregation
            column = agg.column
            calcs.append(
                Calc(
                    name=feat.name,
                    kind=agg.kind,
                    condition=conds.index(feat.where),
                    value=None if column is None else value_column(feat.aggregation.kind, column),
                    value_type=None if column is None else input_type(agg.kind, input_types[column]),
                    output_type=agg.output_type(None if column is None else input_types[column]),
                    size_us=None if feat.window.size_s is None else feat.window.size_s * MICROS,
                    every_us=feat.window.every_s * MICROS,
                    k=agg.k or 1,
                    quantile=agg.quantile if agg.quantile is not None else 0.5,
                )
            )
        return cls(tuple(group.join_keys), tuple(conds), tuple(calcs), pane_length_us(f.window for f in group.features))

    def condition_column(self, i: int) -> str | None:
        return None if self.conditions[i] is None else f"fx_c{i}"

    @property
    def columns(self) -> list[str]:
        """The pane table's columns."""
        cols = [*self.keys, PANE, *(f"fx_n{i}" for i in range(len(self.conditions)))]
        for calc in self.calcs:
            cols.extend(calc.col(p) for p in _KINDS[calc.kind].parts)
        return cols


def value_column(kind: AggKind, column: str) -> str:
    """The processor's input column for a source column, named by how Spark casts it for this kind."""
    return f"fx_v_{_CAST.get(kind, 'raw')}_{column}"


_CAST = {AggKind.AVG: "double", AggKind.STDDEV: "double", AggKind.APPROX_PERCENTILE: "double"}


def input_type(kind: AggKind, source_type: DType) -> DType:
    if kind in _CAST:
        return DType.FLOAT64
    if kind is AggKind.APPROX_COUNT_DISTINCT and source_type not in (DType.INT64, DType.STRING):
        return DType.STRING  # hashed by its text, as the batch engine does
    return source_type


def hll_cast(kind: AggKind, source_type: DType) -> bool:
    """Whether Spark must cast this kind's input to string before the processor sees it."""
    return kind is AggKind.APPROX_COUNT_DISTINCT and source_type not in (DType.INT64, DType.STRING)


# ---------------------------------------------------------------------------------------------------------
# Range reductions: every aggregation as (phase 1 per group, merge over index ranges, finalize)


def _ranges_add(values: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Sum of values[s:e] for each (s, e); 0 for empty ranges. Queries sorted by start run in linear time."""
    if len(starts) == 0:
        return np.zeros(0, dtype=values.dtype)
    padded = np.concatenate([values, np.zeros(1, dtype=values.dtype)])
    idx = np.empty(2 * len(starts), dtype=np.int64)
    idx[0::2], idx[1::2] = starts, ends
    out = np.add.reduceat(padded, idx)[0::2]
    return np.where(ends > starts, out, 0)


def _ranges_extreme(values: np.ndarray, valid: np.ndarray, starts: np.ndarray, ends: np.ndarray, smallest: bool):
    """min/max of the valid values in each range, and whether the range had any."""
    count = _ranges_add(valid.astype(np.int64), starts, ends)
    if values.dtype == object:  # strings: a loop, there is no vectorized min of str
        pick = min if smallest else max
        out = np.empty(len(starts), dtype=object)
        for i, (s, e) in enumerate(zip(starts, ends, strict=True)):
            vals = values[s:e][valid[s:e]]
            out[i] = pick(vals) if len(vals) else None
        return out, count > 0
    if values.dtype.kind == "f":
        fill = np.inf if smallest else -np.inf
    else:
        info = np.iinfo(values.dtype)
        fill = info.max if smallest else info.min
    filled = np.where(valid, values, fill)
    if len(starts) == 0:
        return filled[:0], count > 0
    ufunc = np.minimum if smallest else np.maximum
    padded = np.concatenate([filled, np.array([fill], dtype=filled.dtype)])
    idx = np.empty(2 * len(starts), dtype=np.int64)
    idx[0::2], idx[1::2] = starts, ends
    return ufunc.reduceat(padded, idx)[0::2], count > 0


class Kind:
    """How one aggregation kind is reduced. Subclasses define `parts` (partial column suffixes)."""

    parts: tuple[str, ...] = ()

    def phase1(self, calc: Calc, codes: np.ndarray, groups: int, mask: np.ndarray, frame: pd.DataFrame):
        raise NotImplementedError

    def merge(self, calc: Calc, cols: dict[str, np.ndarray], starts, ends, key_of_row, same_pane=False) -> dict:
        """Merge rows [start, end) per range. `same_pane`: each range holds rows of one pane (from several
        batches), which overlap in time."""
        raise NotImplementedError

    def finalize(self, calc: Calc, cols: dict[str, np.ndarray]) -> np.ndarray:
        raise NotImplementedError


def _bincount(codes: np.ndarray, groups: int, weights: np.ndarray | None = None) -> np.ndarray:
    return np.bincount(codes, weights=weights, minlength=groups)


def _group_sum(codes: np.ndarray, groups: int, values: np.ndarray) -> np.ndarray:
    out = np.zeros(groups, dtype=values.dtype)
    np.add.at(out, codes, values)
    return out


class Count(Kind):
    parts = ("n",)

    def phase1(self, calc, codes, groups, mask, frame):
        return {"n": _bincount(codes[mask], groups).astype(np.int64)}

    def merge(self, calc, cols, starts, ends, key_of_row, same_pane=False):
        return {"n": _ranges_add(cols["n"], starts, ends)}

    def finalize(self, calc, cols):
        return cols["n"]


class Sum(Kind):
    """sum and avg: (count of values, sum); float sums in float64, integer sums exact in int64."""

    parts = ("c", "s")

    def __init__(self, average: bool) -> None:
        self.average = average

    def phase1(self, calc, codes, groups, mask, frame):
        values = frame[calc.value].to_numpy()
        ok = mask & ~pd.isna(values)
        dtype = np.int64 if calc.value_type is DType.INT64 and not self.average else np.float64
        s = _group_sum(codes[ok], groups, values[ok].astype(dtype))
        return {"c": _bincount(codes[ok], groups).astype(np.int64), "s": s}

    def merge(self, calc, cols, starts, ends, key_of_row, same_pane=False):
        return {"c": _ranges_add(cols["c"], starts, ends), "s": _ranges_add(cols["s"], starts, ends)}

    def finalize(self, calc, cols):
        if self.average:
            with np.errstate(invalid="ignore", divide="ignore"):
                return _nullable(cols["s"] / np.maximum(cols["c"], 1), cols["c"] > 0)
        return np.where(cols["c"] > 0, cols["s"], 0).astype(cols["s"].dtype)


class Stddev(Kind):
    """(n, mean, M2) partials merged as in Chan et al., around a per-key shift as the batch engine does."""

    parts = ("n", "mean", "m2")

    def phase1(self, calc, codes, groups, mask, frame):
        values = frame[calc.value].to_numpy(dtype=np.float64, na_value=np.nan)
        ok = mask & ~np.isnan(values)
        c, v = codes[ok], values[ok]
        n = _bincount(c, groups)
        mean = _bincount(c, groups, v) / np.maximum(n, 1)
        dev = v - mean[c]
        m2 = _bincount(c, groups, dev * dev)
        return {"n": n.astype(np.int64), "mean": mean, "m2": m2}

    def merge(self, calc, cols, starts, ends, key_of_row, same_pane=False):
        n, mean, m2 = cols["n"], cols["mean"], cols["m2"]
        # Shift by the first pane mean of each key: sums of n*d stay small, with no cancellation.
        shift = _first_per_key(mean, n > 0, key_of_row)
        d = np.where(n > 0, mean - shift, 0.0)
        total = _ranges_add(n, starts, ends)
        a = _ranges_add(n * d, starts, ends)
        b = _ranges_add(np.where(n > 0, m2 + n * d * d, 0.0), starts, ends)
        safe = np.maximum(total, 1)
        row_shift = shift[np.minimum(starts, len(shift) - 1)] if len(shift) else np.zeros(len(starts))
        return {"n": total, "mean": np.where(total > 0, row_shift + a / safe, 0.0), "m2": b - a * a / safe}

    def finalize(self, calc, cols):
        n = cols["n"]
        with np.errstate(invalid="ignore", divide="ignore"):
            value = np.sqrt(np.maximum(0.0, cols["m2"] / np.maximum(n - 1, 1)))
        return _nullable(value, n > 1)


def _first_per_key(values: np.ndarray, valid: np.ndarray, key_of_row: np.ndarray) -> np.ndarray:
    """Per row: the first valid value among its key's rows (rows sorted by key), 0 if none."""
    out = np.zeros(len(values))
    if len(values) == 0:
        return out
    idx = np.flatnonzero(valid)
    if len(idx) == 0:
        return out
    first_row_of_key = np.r_[0, np.flatnonzero(np.diff(key_of_row)) + 1]
    j = np.searchsorted(idx, first_row_of_key)
    pick = np.where(j < len(idx), idx[np.minimum(j, len(idx) - 1)], -1)
    same_key = (pick >= 0) & (key_of_row[np.maximum(pick, 0)] == key_of_row[first_row_of_key])
    per_key = np.where(same_key, values[np.maximum(pick, 0)], 0.0)
    lengths = np.diff(np.r_[first_row_of_key, len(values)])
    return np.repeat(per_key, lengths)


class Extreme(Kind):
    parts = ("c", "v")

    def __init__(self, smallest: bool) -> None:
        self.smallest = smallest

    def phase1(self, calc, codes, groups, mask, frame):
        values = frame[calc.value].to_numpy()
        ok = mask & ~pd.isna(values)
        series = pd.Series(values[ok], dtype=_pandas_dtype(calc.value_type)).groupby(codes[ok])
        picked = series.min() if self.smallest else series.max()
        v = np.full(groups, _empty(calc.value_type), dtype=_numpy_dtype(calc.value_type))
        v[picked.index.to_numpy()] = picked.to_numpy()
        return {"c": _bincount(codes[ok], groups).astype(np.int64), "v": v}

    def merge(self, calc, cols, starts, ends, key_of_row, same_pane=False):
        v, present = _ranges_extreme(cols["v"], cols["c"] > 0, starts, ends, self.smallest)
        return {"c": present.astype(np.int64), "v": v}

    def finalize(self, calc, cols):
        return _nullable(cols["v"], cols["c"] > 0)


class ByTime(Kind):
    """first/last: the earliest/latest (ts, value), ties on ts to the smaller/larger value. Panes cover
    disjoint time, so over a range of panes it is the partial of the first/last pane that has one."""

    parts = ("c", "t", "v")

    def __init__(self, earliest: bool) -> None:
        self.earliest = earliest

    def phase1(self, calc, codes, groups, mask, frame):
        values = frame[calc.value].to_numpy()
        ok = mask & ~pd.isna(values)
        rows = pd.DataFrame({"g": codes[ok], "t": frame[TS].to_numpy()[ok], "v": values[ok]})
        rows = rows.sort_values(["g", "t", "v"], kind="stable").drop_duplicates(
            "g", keep="first" if self.earliest else "last"
        )
        t = np.zeros(groups, dtype=np.int64)
        v = np.full(groups, _empty(calc.value_type), dtype=_numpy_dtype(calc.value_type))
        g = rows["g"].to_numpy()
        t[g], v[g] = rows["t"].to_numpy(), rows["v"].to_numpy()
        return {"c": _bincount(codes[ok], groups).astype(np.int64), "t": t, "v": v}

    def merge(self, calc, cols, starts, ends, key_of_row, same_pane=False):
        valid = np.flatnonzero(cols["c"] > 0)
        if len(valid) == 0:
            return _empty_partial(calc, len(starts))
        if same_pane:
            return self._merge_overlapping(calc, cols, starts, ends)
        if self.earliest:
            j = np.minimum(np.searchsorted(valid, starts), len(valid) - 1)
            pick = valid[j]
            ok = (pick >= starts) & (pick < ends)
        else:
            pick = valid[np.maximum(np.searchsorted(valid, ends) - 1, 0)]
            ok = (pick >= starts) & (pick < ends)
        pick = np.where(ok, pick, 0)
        v = cols["v"][pick].copy()
        v[~ok] = _empty(calc.value_type)
        return {"c": ok.astype(np.int64), "t": np.where(ok, cols["t"][pick], 0), "v": v}

    def _merge_overlapping(self, calc, cols, starts, ends):
        lengths = ends - starts
        group = np.repeat(np.arange(len(starts)), lengths)
        row = np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(lengths.sum())
        rows = pd.DataFrame({"g": group, "t": cols["t"][row], "v": cols["v"][row]})[cols["c"][row] > 0]
        rows = rows.sort_values(["g", "t", "v"], kind="stable").drop_duplicates(
            "g", keep="first" if self.earliest else "last"
        )
        out = _empty_partial(calc, len(starts))
        g = rows["g"].to_numpy()
        out["c"][g], out["t"][g], out["v"][g] = 1, rows["t"].to_numpy(), rows["v"].to_numpy()
        return out

    def finalize(self, calc, cols):
        return _nullable(cols["v"], cols["c"] > 0)


class LastK(Kind):
    """The k newest (ts, value) items, newest first (ties on ts: larger value first): parallel lists of
    timestamps and values per pane. Panes cover disjoint time, so a range merges newest pane first."""

    parts = ("t", "v")

    def phase1(self, calc, codes, groups, mask, frame):
        values = frame[calc.value].to_numpy()
        ok = mask & ~pd.isna(values)
        rows = pd.DataFrame({"g": codes[ok], "t": frame[TS].to_numpy()[ok], "v": values[ok]})
        rows = rows.sort_values(["g", "t", "v"], ascending=[True, False, False], kind="stable")
        rows = rows.groupby("g", sort=False).head(calc.k)
        t, v = np.empty(groups, dtype=object), np.empty(groups, dtype=object)
        for g, part in rows.groupby("g", sort=False):
            t[g], v[g] = part["t"].tolist(), part["v"].tolist()
        return {"t": t, "v": v}

    def merge(self, calc, cols, starts, ends, key_of_row, same_pane=False):
        ts, vs = cols["t"], cols["v"]
        out_t, out_v = np.empty(len(starts), dtype=object), np.empty(len(starts), dtype=object)
        for i, (s, e) in enumerate(zip(starts, ends, strict=True)):
            if same_pane:  # rows of one pane overlap in time: merge their items by (ts, value)
                items = sorted(
                    (item for j in range(s, e) if ts[j] is not None for item in zip(ts[j], vs[j], strict=True)),
                    reverse=True,
                )[: calc.k]
                if items:
                    out_t[i], out_v[i] = [t for t, _ in items], [v for _, v in items]
                continue
            t: list = []
            v: list = []
            for j in range(e - 1, s - 1, -1):
                if ts[j] is not None and len(ts[j]):
                    take = calc.k - len(t)
                    t.extend(list(ts[j][:take]))
                    v.extend(list(vs[j][:take]))
                    if len(t) == calc.k:
                        break
            if t:
                out_t[i], out_v[i] = t, v
        return {"t": out_t, "v": out_v}

    def finalize(self, calc, cols):
        out = np.empty(len(cols["v"]), dtype=object)
        out[:] = [None if v is None else [x.item() if hasattr(x, "item") else x for x in v] for v in cols["v"]]
        return out


class Sketch(Kind):
    """approx_count_distinct (HLL) and approx_percentile (KLL) with the DataSketches library, whose sketches
    and hashing are the ones Spark's hll_*/kll_* functions use in the batch engine."""

    parts = ("sk",)

    def __init__(self, hll: bool) -> None:
        self.hll = hll

    def _new(self):
        import datasketches as ds

        return ds.hll_sketch(DEFAULT_HLL_LG_K) if self.hll else ds.kll_doubles_sketch(DEFAULT_KLL_K)

    def _load(self, blob: bytes):
        import datasketches as ds

        return ds.hll_sketch.deserialize(blob) if self.hll else ds.kll_doubles_sketch.deserialize(blob)

    def _bytes(self, sketch) -> bytes:
        return sketch.serialize_compact() if self.hll else sketch.serialize()

    def phase1(self, calc, codes, groups, mask, frame):
        values = frame[calc.value].to_numpy()
        ok = mask & ~pd.isna(values)
        c, v = codes[ok], values[ok]
        order = np.argsort(c, kind="stable")
        c, v = c[order], v[order]
        bounds = np.flatnonzero(np.diff(c)) + 1
        out = np.empty(groups, dtype=object)
        cast = int if calc.value_type is DType.INT64 else (float if not self.hll else str)
        for part_c, part_v in zip(np.split(c, bounds), np.split(v, bounds), strict=True):
            if len(part_c):
                sketch = self._new()
                for x in part_v.tolist():
                    sketch.update(cast(x))
                out[part_c[0]] = self._bytes(sketch)
        return {"sk": out}

    def merge(self, calc, cols, starts, ends, key_of_row, same_pane=False):
        import datasketches as ds

        blobs = cols["sk"]
        out = np.empty(len(starts), dtype=object)
        for i, (s, e) in enumerate(zip(starts, ends, strict=True)):
            parts = [b for b in blobs[s:e] if b is not None]
            if not parts:
                continue
            if self.hll:
                union = ds.hll_union(DEFAULT_HLL_LG_K)
                for b in parts:
                    union.update(self._load(b))
                out[i] = union.get_result(ds.tgt_hll_type.HLL_4).serialize_compact()
            else:
                merged = self._load(parts[0])
                for b in parts[1:]:
                    merged.merge(self._load(b))
                out[i] = self._bytes(merged)
        return {"sk": out}

    def finalize(self, calc, cols):
        out = np.empty(len(cols["sk"]), dtype=object)
        for i, blob in enumerate(cols["sk"]):
            if self.hll:
                out[i] = 0 if blob is None else round(self._load(blob).get_estimate())
            elif blob is not None:
                sketch = self._load(blob)
                out[i] = None if sketch.is_empty() else sketch.get_quantile(calc.quantile, True)  # as Spark: inclusive
        return out.astype(np.int64) if self.hll else out


_KINDS: dict[AggKind, Kind] = {
    AggKind.COUNT: Count(),
    AggKind.SUM: Sum(average=False),
    AggKind.AVG: Sum(average=True),
    AggKind.STDDEV: Stddev(),
    AggKind.MIN: Extreme(smallest=True),
    AggKind.MAX: Extreme(smallest=False),
    AggKind.FIRST: ByTime(earliest=True),
    AggKind.LAST: ByTime(earliest=False),
    AggKind.LAST_K: LastK(),
    AggKind.APPROX_COUNT_DISTINCT: Sketch(hll=True),
    AggKind.APPROX_PERCENTILE: Sketch(hll=False),
}


def _numpy_dtype(dtype: DType | None) -> Any:
    return {DType.INT64: np.int64, DType.FLOAT64: np.float64}.get(dtype, object)  # type: ignore[arg-type]


def _pandas_dtype(dtype: DType | None) -> Any:
    return {DType.INT64: "int64", DType.FLOAT64: "float64"}.get(dtype, object)  # type: ignore[arg-type]


def _empty(dtype: DType | None) -> Any:
    return {DType.INT64: 0, DType.FLOAT64: np.nan}.get(dtype)  # type: ignore[arg-type]


def _nullable(values: np.ndarray, present: np.ndarray) -> np.ndarray:
    out = values.astype(object)
    out[~present] = None
    return out


# ---------------------------------------------------------------------------------------------------------
# Pane tables


def phase1(plan: StreamPlan, events: pd.DataFrame) -> pd.DataFrame:
    """Reduce events (keys, `fx_ts` µs, `fx_c<i>` conditions, `fx_v_*` values) to one row per (key, pane)."""
    if events.empty:
        return empty_table(plan)
    ts = events[TS].to_numpy(dtype=np.int64)
    pane = ts - ts % plan.pane_us
    keyed = events[list(plan.keys)].assign(**{PANE: pane})
    codes, uniques = _factorize(keyed)
    groups = len(uniques)
    out = {c: uniques[c].to_numpy() for c in (*plan.keys, PANE)}
    masks = []
    for i in range(len(plan.conditions)):
        column = plan.condition_column(i)
        mask = np.ones(len(events), dtype=bool) if column is None else events[column].fillna(False).to_numpy(bool)
        masks.append(mask)
        out[f"fx_n{i}"] = _bincount(codes[mask], groups).astype(np.int64)
    for calc in plan.calcs:
        parts = _KINDS[calc.kind].phase1(calc, codes, groups, masks[calc.condition], events)
        out.update({calc.col(p): v for p, v in parts.items()})
    return pd.DataFrame(out)[plan.columns]


def _factorize(frame: pd.DataFrame) -> tuple[np.ndarray, pd.DataFrame]:
    """Group codes 0..n-1 for the distinct rows of `frame`, and those rows."""
    if frame.shape[1] == 1:  # one key column: a hash table over it, several times faster than a groupby
        codes = pd.factorize(frame.iloc[:, 0], use_na_sentinel=False)[0]
    else:
        codes = frame.groupby(list(frame.columns), sort=False, dropna=False).ngroup().to_numpy()
    firsts = np.full(codes.max() + 1 if len(codes) else 0, -1, dtype=np.int64)
    firsts[codes[::-1]] = np.arange(len(codes))[::-1]
    return codes, frame.iloc[firsts].reset_index(drop=True)


class KeyDictionary:
    """Join keys as dense integer codes, 0, 1, 2, ... in order of first sight. The stream keeps a bucket's
    pane tables keyed by code: sorting, taking and storing an integer costs far less than a Python string."""

    def __init__(self, keys: Sequence[str], frame: pd.DataFrame | None = None) -> None:
        self.keys = list(keys)
        self.frame = frame if frame is not None else pd.DataFrame({k: np.empty(0, dtype=object) for k in keys})

    def __len__(self) -> int:
        return len(self.frame)

    def encode(self, keys: pd.DataFrame) -> tuple[np.ndarray, pd.DataFrame]:
        """Each row's code; keys not seen before get the next codes. Also returns those new keys, in code
        order (what to add to the stored dictionary)."""
        codes = self._index().get_indexer(self._index(keys[self.keys]))
        new = codes < 0
        if not new.any():
            return codes.astype(np.int64), self.frame.iloc[:0]
        fresh_codes, fresh = _factorize(keys.loc[new, self.keys].reset_index(drop=True))
        codes[new] = len(self.frame) + fresh_codes
        self.frame = pd.concat([self.frame, fresh], ignore_index=True) if len(self.frame) else fresh
        return codes.astype(np.int64), fresh

    def decode(self, codes: np.ndarray) -> dict[str, pa.Array]:
        """The keys of `codes`, as Arrow arrays (taken in Arrow: the output goes to Spark that way)."""
        indices = pa.array(codes, pa.int64())
        return {k: pa.array(self.frame[k].to_numpy()).take(indices) for k in self.keys}

    def compact(self, live: np.ndarray) -> np.ndarray:
        """Keep only the codes in `live` (sorted, unique), renumbered 0..len-1. Returns old code -> new code."""
        renumber = np.full(len(self.frame), -1, dtype=np.int64)
        renumber[live] = np.arange(len(live))
        self.frame = self.frame.iloc[live].reset_index(drop=True)
        return renumber

    def _index(self, frame: pd.DataFrame | None = None) -> pd.Index:
        frame = self.frame if frame is None else frame
        return pd.Index(frame.iloc[:, 0]) if len(self.keys) == 1 else pd.MultiIndex.from_frame(frame)


def empty_table(plan: StreamPlan) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in plan.columns}).astype(
        {**{PANE: np.int64}, **{f"fx_n{i}": np.int64 for i in range(len(plan.conditions))}}
    )


@dataclass
class Sorted:
    """A pane table sorted by (key, pane) with a dense key code per row, ready for range reductions."""

    table: pd.DataFrame
    key_code: np.ndarray
    position: np.ndarray  # key_code * span + pane rank: sorted, so ranges are found by searchsorted
    origin: int
    span: int

    @classmethod
    def of(cls, plan: StreamPlan, table: pd.DataFrame) -> Sorted:
        codes = _key_codes(plan, table)
        pane = table[PANE].to_numpy(dtype=np.int64)
        real = pane[pane != BASE]
        origin = int(real.min()) if len(real) else 0
        rank = np.where(pane == BASE, 0, (pane - origin) // plan.pane_us + 1)
        span = int(rank.max()) + 2 if len(rank) else 2
        position = codes.astype(np.int64) * span + rank
        order = np.argsort(position, kind="stable")
        return cls(_renumbered(table.iloc[order]), codes[order], position[order], origin, span)

    def locate(self, key_code: np.ndarray, at_us: np.ndarray, plan: StreamPlan) -> np.ndarray:
        """Index of the first row of `key_code` whose pane is >= at (at: multiples of the pane length)."""
        rank = np.clip((at_us - self.origin) // plan.pane_us + 1, 1, self.span - 1)
        return np.searchsorted(self.position, key_code * self.span + rank, side="left")

    def key_start(self, key_code: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.position, key_code * self.span, side="left")

    def columns(self, calc: Calc) -> dict[str, np.ndarray]:
        return {p: self.table[calc.col(p)].to_numpy() for p in _KINDS[calc.kind].parts}


def _key_codes(plan: StreamPlan, table: pd.DataFrame) -> np.ndarray:
    """A dense-enough integer per key: the key itself when it is already a small code (the stream's key
    dictionary), else the order of first appearance."""
    if len(table) == 0:
        return np.zeros(0, np.int64)
    if plan.keys == (KEY,):
        return table[KEY].to_numpy(dtype=np.int64)
    return _factorize(table[list(plan.keys)])[0]


def _renumbered(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` (a fresh selection of rows) indexed 0..n-1 in place: reset_index would copy every column."""
    frame.index = pd.RangeIndex(len(frame))
    return frame


def combine(plan: StreamPlan, tables: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """One row per (key, pane): rows of the same pane from several batches merged."""
    return combine_sorted(plan, tables).table


def combine_sorted(plan: StreamPlan, tables: Sequence[pd.DataFrame]) -> Sorted:
    """`combine`, sorted for range reductions (one sort serves the merge and the emit)."""
    frames = [t for t in tables if len(t)] or [empty_table(plan)]
    table = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    s = Sorted.of(plan, table)
    first = np.r_[True, np.diff(s.position) != 0]
    if first.all():
        return s
    starts = np.flatnonzero(first)
    ends = np.r_[starts[1:], len(s.position)]
    several = np.flatnonzero(ends - starts > 1)  # most (key, pane)s got rows from one batch only: kept as they are
    partials = _merged_partials(plan, s, starts[several], ends[several])
    columns = {}
    for column in s.table.columns:
        columns[column] = s.table[column].to_numpy()[starts]
        if column in partials:
            columns[column][several] = partials[column]
    merged = pd.DataFrame(columns, copy=False)
    return Sorted(merged, s.key_code[starts], s.position[starts], s.origin, s.span)


def _merged_partials(plan: StreamPlan, s: Sorted, starts: np.ndarray, ends: np.ndarray) -> dict[str, np.ndarray]:
    """Every partial column merged over rows [start, end) of `s`, each range the rows of one (key, pane)."""
    out = {}
    for i in range(len(plan.conditions)):
        out[f"fx_n{i}"] = _ranges_add(s.table[f"fx_n{i}"].to_numpy(dtype=np.int64), starts, ends)
    for calc in plan.calcs:
        merged = _KINDS[calc.kind].merge(calc, s.columns(calc), starts, ends, s.key_code, same_pane=True)
        out.update({calc.col(p): v for p, v in merged.items()})
    return out


def change_ends(plan: StreamPlan, table: pd.DataFrame, after_us: int | None, upto_us: int | None) -> pd.DataFrame:
    """(row index, E) for every window end in (after, upto] where some feature's value may change: where a
    pane holding rows for it enters or leaves its window (features.panes)."""
    pane = table[PANE].to_numpy(dtype=np.int64)
    rows, ends = [], []
    for calc in plan.calcs:
        has = (table[f"fx_n{calc.condition}"].to_numpy(dtype=np.int64) > 0) & (pane != BASE)
        idx = np.flatnonzero(has)
        coarse = pane[idx] - pane[idx] % calc.every_us
        moves = [coarse + calc.every_us]
        if calc.size_us is not None:
            moves.append(coarse + calc.size_us + calc.every_us)
        for e in moves:
            keep = np.ones(len(e), dtype=bool)
            if after_us is not None:
                keep &= e > after_us
            if upto_us is not None:
                keep &= e <= upto_us
            rows.append(idx[keep])
            ends.append(e[keep])
    return pd.DataFrame({"row": np.concatenate(rows), "E": np.concatenate(ends)})


def values_at(plan: StreamPlan, s: Sorted, key_code: np.ndarray, ends: np.ndarray) -> dict[str, np.ndarray]:
    """Every feature's value at window end E for each (key, E) query (sorted by key, then E)."""
    out = {}
    for calc in plan.calcs:
        at = ends - ends % calc.every_us
        hi = s.locate(key_code, at, plan)
        lo = s.key_start(key_code) if calc.size_us is None else s.locate(key_code, at - calc.size_us, plan)
        kind = _KINDS[calc.kind]
        out[calc.name] = kind.finalize(calc, kind.merge(calc, s.columns(calc), lo, hi, s.key_code))
    return out


def emit(plan: StreamPlan, table: pd.DataFrame | Sorted, after_us: int | None, upto_us: int) -> pd.DataFrame:
    """The change-point rows (keys, `window_end` µs, features) with window end in (after, upto]."""
    s = table if isinstance(table, Sorted) else Sorted.of(plan, table)
    points = change_ends(plan, s.table, after_us, upto_us)
    if points.empty:
        return pd.DataFrame({c: [] for c in (*plan.keys, "window_end", *(c.name for c in plan.calcs))})
    points["key"] = s.key_code[points["row"].to_numpy()]
    points = points.drop_duplicates(["key", "E"]).sort_values(["key", "E"], kind="stable")
    rows = points["row"].to_numpy()
    out = {k: s.table[k].to_numpy()[rows] for k in plan.keys}
    out["window_end"] = points["E"].to_numpy(dtype=np.int64)
    out.update(values_at(plan, s, points["key"].to_numpy(), out["window_end"]))
    return pd.DataFrame(out)


def next_change(plan: StreamPlan, table: pd.DataFrame, after_us: int) -> int | None:
    """The first window end after `after` where a value may change (for the event-time timer)."""
    points = change_ends(plan, table, after_us, None)
    return None if points.empty else int(points["E"].min())


def prune(plan: StreamPlan, table: pd.DataFrame, upto_us: int, align_us: int | None = None) -> pd.DataFrame:
    """Drop panes that no window ending after `upto` reads; fold those only Lifetime windows still read into
    each key's BASE row. With `align_us`, only whole stretches of that length go (stored chunks)."""
    cut = min(
        (upto_us - upto_us % c.every_us) - (c.size_us if c.size_us is not None else c.every_us) for c in plan.calcs
    )
    if align_us:
        cut -= cut % align_us
    pane = table[PANE].to_numpy(dtype=np.int64)
    old = pane < cut
    if not old.any():
        return table
    keep = table[~old]
    if all(c.size_us is not None for c in plan.calcs):
        return _renumbered(keep)
    folded = table[old].copy()
    folded[PANE] = BASE
    base = combine(plan, [folded])
    for i in range(len(plan.conditions)):  # the base row never makes a change point
        base[f"fx_n{i}"] = 0
    for calc in plan.calcs:  # nor carries a Hop feature's data
        if calc.size_us is not None:
            base = _clear(calc, base)
    return pd.concat([base, keep], ignore_index=True)


def _clear(calc: Calc, table: pd.DataFrame) -> pd.DataFrame:
    for part, values in _empty_partial(calc, len(table)).items():
        table[calc.col(part)] = values
    return table


def _empty_partial(calc: Calc, n: int) -> dict[str, np.ndarray]:
    """The partial of no rows, n times."""
    frame = pd.DataFrame({TS: np.zeros(0, dtype=np.int64)})
    if calc.value is not None:
        frame[calc.value] = np.zeros(0, dtype=_numpy_dtype(calc.value_type))
    return _KINDS[calc.kind].phase1(calc, np.zeros(0, dtype=np.int64), n, np.zeros(0, dtype=bool), frame)


# ---------------------------------------------------------------------------------------------------------
# Serialization of pane tables for the state store


def to_bytes(table: pd.DataFrame) -> bytes:
    """A pane table as bytes for the state store: its columns pickled as numpy arrays (far cheaper than a
    conversion to Arrow for the many small chunks a batch writes), integer columns as offsets from their
    smallest value in the narrowest type that holds them (key codes, panes of one hour and counts need a few
    bytes, not eight)."""
    return pickle.dumps({c: _narrow(table[c].to_numpy()) for c in table.columns}, protocol=5)


def from_bytes(plan: StreamPlan, blob: bytes) -> pd.DataFrame:
    return read_frame(blob)[plan.columns]


def read_frame(blob: bytes) -> pd.DataFrame:
    """A frame written by `to_bytes`."""
    return pd.DataFrame({c: _widen(v) for c, v in pickle.loads(blob).items()})


def _narrow(values: np.ndarray) -> Any:
    if values.dtype != np.int64 or len(values) == 0:
        return values
    low, high = int(values.min()), int(values.max())
    for dtype in (np.uint8, np.uint16, np.uint32):
        if high - low <= np.iinfo(dtype).max:
            return (low, (values - low).astype(dtype))
    return values


def _widen(stored: Any) -> np.ndarray:
    if isinstance(stored, tuple):
        low, offsets = stored
        return offsets.astype(np.int64) + low
    return stored


def chunk_of(table: pd.DataFrame, chunk_us: int) -> np.ndarray:
    """Each row's chunk: its pane's time rounded down to `chunk_us` (BASE rows form their own chunk)."""
    pane = table[PANE].to_numpy(dtype=np.int64)
    return np.where(pane == BASE, BASE, pane - pane % chunk_us)


@dataclass(frozen=True)
class Step:
    table: pd.DataFrame  # the pane table after the step
    rows: pd.DataFrame  # change points with window end in (after, upto]
    late: pd.DataFrame  # input events behind `after`: they would change rows already emitted
    next_change: int | None  # the first window end after `upto` where a value may change


def step(
    plan: StreamPlan,
    table: pd.DataFrame | Sequence[pd.DataFrame],
    events: pd.DataFrame,
    after: int | None,
    upto: int,
    align_us: int | None = None,
) -> Step:
    """One micro-batch for one set of keys: merge the events' pane partials into the table (or its chunks, in
    any order), emit the change points whose window end the watermark passed, and drop what no later window
    reads.

    `after` is the watermark the previous step emitted up to: an event before it is late (its change points
    were emitted already) and is returned instead of used."""
    late = np.zeros(len(events), dtype=bool) if after is None else events[TS].to_numpy(dtype=np.int64) < after
    tables = [table] if isinstance(table, pd.DataFrame) else list(table)
    merged = combine_sorted(plan, [*tables, phase1(plan, events[~late])])
    if after is None or upto > after:
        rows = emit(plan, merged, after, upto)
    else:
        rows = emit(plan, merged.table.iloc[:0], None, 0)
    table = prune(plan, merged.table, upto, align_us)
    return Step(table, rows, events[late], next_change(plan, table, upto))
