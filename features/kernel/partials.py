"""Every aggregation as a mergeable partial over pane tables, vectorized in numpy: phase 1 (events of each
(key, pane) -> partial columns), merge (partials over index ranges of a sorted pane table -> partial), finalize
(partial -> feature value with the meaning of an empty window in docs/semantics.md, Empty windows)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from features.kernel import quantiles
from features.kernel.frames import column_values
from features.kernel.plan import TS, Calc
from features.spec import DType

# ---------------------------------------------------------------------------------------------------------
# Range reductions: every aggregation as (phase 1 per group, merge over index ranges, finalize)


def ranges_add(values: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Sum of values[s:e] for each (s, e); 0 for empty ranges.

    Integers: differences of one running sum, O(rows + ranges) however long the ranges. Exact: the running sum
    may wrap around in int64, but a difference is then still right modulo 2^64, so right whenever the range's
    own sum fits. Floats: each range summed on its own, in row order (a difference of running sums would cancel
    digits), the same order in every engine."""
    if len(starts) == 0:
        return np.zeros(0, dtype=values.dtype)
    if values.dtype.kind in "iu":
        running = np.zeros(len(values) + 1, dtype=np.int64)
        np.cumsum(values, out=running[1:])
        return running[ends] - running[starts]
    padded = np.concatenate([values, np.zeros(1, dtype=values.dtype)])
    idx = np.empty(2 * len(starts), dtype=np.int64)
    idx[0::2], idx[1::2] = starts, ends
    out = np.add.reduceat(padded, idx)[0::2]
    return np.where(ends > starts, out, 0)


def ranges_extreme(values: np.ndarray, valid: np.ndarray, starts: np.ndarray, ends: np.ndarray, smallest: bool):
    """min/max of the valid values in each range, and whether the range had any."""
    count = ranges_add(valid.astype(np.int64), starts, ends)
    if values.dtype == object:  # strings: reduced as their ranks in sorted order, then mapped back
        ranks, distinct = pd.factorize(np.where(valid, values, None), sort=True, use_na_sentinel=True)
        picked, present = ranges_extreme(ranks.astype(np.int64), valid, starts, ends, smallest)
        out = np.asarray(distinct, dtype=object)[np.where(present, picked, 0)] if len(distinct) else picked
        return np.where(present, out, None), present
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


_ARROW = {DType.INT64: pa.int64(), DType.FLOAT64: pa.float64(), DType.STRING: pa.string(), DType.BOOL: pa.bool_()}


def arrow_lists(group: np.ndarray, values: np.ndarray, groups: int, dtype: DType | None) -> Any:
    """One Arrow list per group 0..groups-1 of the `values` (given sorted by `group`): a pane-table column of
    variable-length partials, built and flattened without a Python loop."""
    offsets = np.zeros(groups + 1, dtype=np.int64)
    np.cumsum(np.bincount(group, minlength=groups), out=offsets[1:])
    flat = pa.array(values, _ARROW.get(dtype))  # type: ignore[arg-type]
    return pd.arrays.ArrowExtensionArray(pa.LargeListArray.from_arrays(pa.array(offsets), flat))


def flatten(lists: Any) -> tuple[np.ndarray, np.ndarray]:
    """(row of each item, the items) of a column of Arrow lists."""
    array = pa.array(lists)
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    rows = pc.list_parent_indices(array).to_numpy()
    items = pc.list_flatten(array).to_numpy(zero_copy_only=False)
    return rows.astype(np.int64), items


PACKED_BOUND = 2**62  # pairs whose packed integers stay below this are sorted packed (`sorted_pairs`)


def sorted_pairs(major: np.ndarray, minor: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pairs (major, minor) of non-negative integers in lexicographic order: where they fit, both packed in one
    integer and sorted by value (a fourth of `np.lexsort`'s time on a step's half million pairs), else by index."""
    if len(major) == 0:
        return major, minor
    span = int(minor.max()) + 1
    if (int(major.max()) + 1) * span < PACKED_BOUND:
        return np.divmod(np.sort(major * span + minor), span)
    order = np.lexsort((minor, major))
    return major[order], minor[order]


def time_order(g: np.ndarray, t: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The stable order of items by (group, time, value): text values compare by their rank in sorted order,
    so that one integer sort replaces a sort of Python strings."""
    rank = v if v.dtype.kind in "iufb" else pd.factorize(v, sort=True)[0]
    return np.lexsort((rank, t, g))


def range_groups(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For ranges [start, end) of rows: (range number, row) of every row they hold."""
    lengths = ends - starts
    group = np.repeat(np.arange(len(starts)), lengths)
    row = np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(lengths.sum())
    return group, row


def large_lists(column: Any) -> Any:
    """A column of Arrow lists as one LargeListArray whose offsets start at 0."""
    array = pa.array(column)
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if array.offset or (len(array) and array.offsets[0].as_py()):
        array = pa.concat_arrays([array])  # a slice: copied so that offsets start at 0
    return array


def range_of_rows(n: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For each of n rows, the (disjoint) range [start, end) that holds it, or -1."""
    group, row = range_groups(starts, ends)
    out = np.full(n, -1, dtype=np.int64)
    out[row] = group
    return out


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

    def window(self, calc: Calc, cols: dict[str, Any], starts, ends, key_of_row) -> Any:
        """The feature's value over the rows of each range [start, end) (a window's panes)."""
        return self.finalize(calc, self.merge(calc, cols, starts, ends, key_of_row))

    def empty(self, calc: Calc, n: int) -> dict[str, Any]:
        """The partial of no rows, n times."""
        frame = pd.DataFrame({TS: np.zeros(0, dtype=np.int64)})
        if calc.value is not None:
            frame[calc.value] = np.zeros(0, dtype=numpy_dtype(calc.value_type))
        return self.phase1(calc, np.zeros(0, dtype=np.int64), n, np.zeros(0, dtype=bool), frame)


def bincount(codes: np.ndarray, groups: int, weights: np.ndarray | None = None) -> np.ndarray:
    return np.bincount(codes, weights=weights, minlength=groups)


def _group_sum(codes: np.ndarray, groups: int, values: np.ndarray) -> np.ndarray:
    out = np.zeros(groups, dtype=values.dtype)
    np.add.at(out, codes, values)
    return out


class Count(Kind):
    parts = ("n",)

    def phase1(self, calc, codes, groups, mask, frame):
        return {"n": bincount(codes[mask], groups).astype(np.int64)}

    def merge(self, calc, cols, starts, ends, key_of_row, same_pane=False):
        return {"n": ranges_add(cols["n"], starts, ends)}

    def finalize(self, calc, cols):
        return cols["n"]


class Sum(Kind):
    """sum and avg: (count of values, sum); float sums in float64, integer sums exact in int64."""

    parts = ("c", "s")

    def __init__(self, average: bool) -> None:
        self.average = average

    def phase1(self, calc, codes, groups, mask, frame):
        values, valid = column_values(frame[calc.value], calc.value_type)
        ok = mask & valid
        dtype = np.int64 if calc.value_type is DType.INT64 and not self.average else np.float64
        s = _group_sum(codes[ok], groups, values[ok].astype(dtype))
        return {"c": bincount(codes[ok], groups).astype(np.int64), "s": s}

    def merge(self, calc, cols, starts, ends, key_of_row, same_pane=False):
        return {"c": ranges_add(cols["c"], starts, ends), "s": ranges_add(cols["s"], starts, ends)}

    def finalize(self, calc, cols):
        if self.average:
            with np.errstate(invalid="ignore", divide="ignore"):
                return nullable(cols["s"] / np.maximum(cols["c"], 1), cols["c"] > 0)
        return np.where(cols["c"] > 0, cols["s"], 0).astype(cols["s"].dtype)


def first_per_key(values: np.ndarray, valid: np.ndarray, key_of_row: np.ndarray) -> np.ndarray:
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
        values, valid = column_values(frame[calc.value], calc.value_type)
        ok = mask & valid
        series = pd.Series(values[ok], dtype=_pandas_dtype(calc.value_type)).groupby(codes[ok])
        picked = series.min() if self.smallest else series.max()
        v = np.full(groups, empty_value(calc.value_type), dtype=numpy_dtype(calc.value_type))
        v[picked.index.to_numpy()] = picked.to_numpy()
        return {"c": bincount(codes[ok], groups).astype(np.int64), "v": v}

    def merge(self, calc, cols, starts, ends, key_of_row, same_pane=False):
        v, present = ranges_extreme(cols["v"], cols["c"] > 0, starts, ends, self.smallest)
        return {"c": present.astype(np.int64), "v": v}

    def finalize(self, calc, cols):
        return nullable(cols["v"], cols["c"] > 0)


class ByTime(Kind):
    """first/last: the earliest/latest (ts, value), ties on ts to the smaller/larger value. Panes cover
    disjoint time, so over a range of panes it is the partial of the first/last pane that has one."""

    parts = ("c", "t", "v")

    def __init__(self, earliest: bool) -> None:
        self.earliest = earliest

    def phase1(self, calc, codes, groups, mask, frame):
        values, valid = column_values(frame[calc.value], calc.value_type)
        ok = mask & valid
        g, picked_t, picked_v = self._picked(codes[ok], frame[TS].to_numpy(dtype=np.int64)[ok], values[ok])
        t = np.zeros(groups, dtype=np.int64)
        v = np.full(groups, empty_value(calc.value_type), dtype=numpy_dtype(calc.value_type))
        t[g], v[g] = picked_t, picked_v
        return {"c": bincount(codes[ok], groups).astype(np.int64), "t": t, "v": v}

    def _picked(self, g: np.ndarray, t: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per group of items (group, time, value): the earliest or latest item."""
        if len(g) == 0:
            return g, t, v
        order = time_order(g, t, v)
        g = g[order]
        boundary = g[1:] != g[:-1]
        chosen = np.r_[True, boundary] if self.earliest else np.r_[boundary, True]
        pick = order[chosen]
        return g[chosen], t[pick], v[pick]

    def merge(self, calc, cols, starts, ends, key_of_row, same_pane=False):
        valid = np.flatnonzero(cols["c"] > 0)
        if len(valid) == 0:
            return self.empty(calc, len(starts))
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
        v[~ok] = empty_value(calc.value_type)
        return {"c": ok.astype(np.int64), "t": np.where(ok, cols["t"][pick], 0), "v": v}

    def _merge_overlapping(self, calc, cols, starts, ends):
        group, row = range_groups(starts, ends)
        present = cols["c"][row] > 0
        group, row = group[present], row[present]
        g, t, v = self._picked(group, cols["t"][row], cols["v"][row])
        out = self.empty(calc, len(starts))
        out["c"][g], out["t"][g], out["v"][g] = 1, t, v
        return out

    def finalize(self, calc, cols):
        return nullable(cols["v"], cols["c"] > 0)


NO_TIME = np.iinfo(np.int64).min  # a pane without events for a last_event_time: no time, not 1970


class LatestTime(Kind):
    """last_event_time: the time of the latest event passing the feature's `where`, whatever its values. A pane
    keeps that one time (NO_TIME without such events); a range of panes, the largest of theirs, in any order.
    The value is rounded down to the second: Feast's online store keeps times in whole seconds, and every store
    must hold the same value."""

    parts = ("t",)

    def phase1(self, calc, codes, groups, mask, frame):
        latest = np.full(groups, NO_TIME, dtype=np.int64)
        np.maximum.at(latest, codes[mask], frame[TS].to_numpy(dtype=np.int64)[mask])
        return {"t": latest}

    def merge(self, calc, cols, starts, ends, key_of_row, same_pane=False):
        t = np.asarray(cols["t"], dtype=np.int64)
        latest, present = ranges_extreme(t, t != NO_TIME, starts, ends, smallest=False)
        return {"t": np.where(present, latest, NO_TIME)}

    def finalize(self, calc, cols):
        present = cols["t"] != NO_TIME
        t = np.where(present, cols["t"], 0)
        return nullable(t - t % 1_000_000, present)


class Quantiles(Kind):
    """approx_percentile: a pane's partial is its values' counts per logarithmic bucket, as Arrow lists of
    (bucket code, count); a window's quantile is a weighted order statistic over its rows' entries, within 1%
    of the exact value (features.kernel.quantiles)."""

    parts = ("b", "c")

    def phase1(self, calc, codes, groups, mask, frame):
        values, valid = column_values(frame[calc.value], DType.FLOAT64)
        ok = mask & valid
        return self._counted(codes[ok], quantiles.bucket_codes(values[ok]), None, groups)

    def _counted(self, group: np.ndarray, bucket: np.ndarray, weight: np.ndarray | None, groups: int) -> dict:
        """(bucket, count) lists per group from one entry per value (or per weighted entry)."""
        packed = group.astype(np.int64) * (1 << quantiles.BITS) + (bucket.astype(np.int64) + quantiles.SHIFT)
        unique, inverse = np.unique(packed, return_inverse=True)
        counts = np.bincount(inverse, weights=weight, minlength=len(unique)).astype(np.int64)
        g = unique >> quantiles.BITS
        b = (unique & ((1 << quantiles.BITS) - 1)) - quantiles.SHIFT
        return {"b": arrow_lists(g, b, groups, DType.INT64), "c": arrow_lists(g, counts, groups, DType.INT64)}

    def merge(self, calc, cols, starts, ends, key_of_row, same_pane=False):
        range_of_row = range_of_rows(len(cols["b"]), starts, ends)
        parent, buckets = flatten(cols["b"])
        counts = flatten(cols["c"])[1]
        take = range_of_row[parent] >= 0
        return self._counted(range_of_row[parent[take]], buckets[take], counts[take], len(starts))

    def window(self, calc, cols, starts, ends, key_of_row):
        lists = large_lists(cols["b"])
        offsets = lists.offsets.to_numpy()
        buckets = pc.list_flatten(lists).to_numpy()
        counts = pc.list_flatten(large_lists(cols["c"])).to_numpy()
        value, n = quantiles.window_quantiles(buckets, counts, offsets[starts], offsets[ends], calc.quantile)
        return nullable(value, n > 0)

    def finalize(self, calc, cols):
        raise NotImplementedError("approx_percentile is evaluated over a window's rows by `window`")


@dataclass(frozen=True)
class Coverage:
    """count_distinct's values as runs of window-end ranks per key: a value counts at the ends where one of its
    runs has started and not ended. Positions are key code * span + rank, sorted, so a key's runs are found by
    binary search."""

    asked: np.ndarray  # the key codes it was built for (a mask)
    span: int
    limit: int  # a rank at or after every run's end
    starts: np.ndarray  # position of the first end rank each run counts at
    ends: np.ndarray | None  # position of the first end rank it no longer counts at (None: Lifetime, never)

    def count(self, queries: np.ndarray, query_rank: np.ndarray) -> np.ndarray:
        """The count at each query (key code, window-end rank); every key queried must be `asked`."""
        base = queries * self.span
        q = base + np.clip(query_rank, 0, self.limit)
        count = np.searchsorted(self.starts, q, "right") - np.searchsorted(self.starts, base, "right")
        if self.ends is not None:
            count -= np.searchsorted(self.ends, q, "right") - np.searchsorted(self.ends, base, "right")
        return count.astype(np.int64)


class CountDistinct(Kind):
    """Exact distinct non-null values (Chronon's unique_count). A pane's partial is the list of its distinct
    values. A value counts at window end E while some pane holding it is in the window, so per (key, value) the
    panes' windows merge into covered stretches, and the count at E is the stretches begun minus those ended:
    linear in distinct (key, value, pane), whatever the window length."""

    parts = ("vals",)

    def phase1(self, calc, codes, groups, mask, frame):
        values, valid = column_values(frame[calc.value], calc.value_type)
        ok = mask & valid
        items, dtype = self.items(calc, values[ok])
        item_codes, distinct = pd.factorize(items)
        # (group, item) pairs packed into one integer: unique, then sorted into group order (numpy 2.4's plain
        # np.unique is several times slower than a hash table and a sort)
        pairs = np.sort(pd.unique(codes[ok].astype(np.int64) * max(len(distinct), 1) + item_codes))
        g, item = np.divmod(pairs, max(len(distinct), 1))
        return {"vals": arrow_lists(g, np.asarray(distinct)[item], groups, dtype)}

    def items(self, calc: Calc, values: np.ndarray) -> tuple[np.ndarray, DType | None]:
        """What a pane keeps of its values: the values themselves."""
        return values, calc.value_type

    def merge(self, calc, cols, starts, ends, key_of_row, same_pane=False):
        range_of_row = range_of_rows(len(cols["vals"]), starts, ends)
        parent, items = flatten(cols["vals"])
        take = range_of_row[parent] >= 0
        pairs = pd.DataFrame({"g": range_of_row[parent[take]], "v": items[take]}).drop_duplicates()
        pairs = pairs.sort_values("g", kind="stable")
        dtype = pa.array(cols["vals"]).type.value_type
        flat = pa.array(pairs["v"].to_numpy(), dtype)
        offsets = np.zeros(len(starts) + 1, dtype=np.int64)
        np.cumsum(np.bincount(pairs["g"].to_numpy(), minlength=len(starts)), out=offsets[1:])
        return {"vals": pd.arrays.ArrowExtensionArray(pa.LargeListArray.from_arrays(pa.array(offsets), flat))}

    def coverage(self, calc: Calc, lists: Any, key_code: np.ndarray, rank: np.ndarray, asked: np.ndarray, pane_us: int):
        """Where each value counts, for the keys `asked` (a mask over key codes), rows ranked as in
        `table.Sorted`: the window-end ranks of each run of panes that hold it (`Coverage`)."""
        parent, items = flatten(lists)
        kept = asked[key_code[parent]]  # only the keys queried (a stream's batch touches few of its state's)
        parent, items = parent[kept], items[kept]
        width = None if calc.size_us is None else calc.size_us // pane_us
        if len(items) == 0:
            return Coverage(asked, 2, 0, np.zeros(0, np.int64), None if width is None else np.zeros(0, np.int64))
        values = pd.factorize(items)[0]
        n_values = int(values.max()) + 1
        kv, r = sorted_pairs(key_code[parent] * n_values + values, rank[parent])  # kv: (key, value) as one integer
        same = np.r_[False, kv[1:] == kv[:-1]]
        # A pane of rank r is in the windows whose end has rank r+1 .. r+width: a run of a value's panes with
        # gaps of at most `width` covers the ends from its first rank + 1 to its last + width.
        begins = ~same if width is None else ~same | (np.r_[0, np.diff(r)] > width)
        first = np.flatnonzero(begins)
        limit = int(r.max()) + (width or 0) + 1  # every count is settled by this rank
        span = limit + 1
        keys = kv[first] // n_values
        starts = np.sort(keys * span + r[first] + 1)
        if width is None:
            return Coverage(asked, span, limit, starts, None)
        last = np.r_[first[1:] - 1, len(r) - 1]
        return Coverage(asked, span, limit, starts, np.sort(keys * span + r[last] + width + 1))

    def counted(self, calc: Calc, counts: np.ndarray) -> np.ndarray:
        """The feature's value from the number of distinct values at each window end."""
        return counts

    def window(self, calc, cols, starts, ends, key_of_row):
        """Over ranges of rows that may overlap (sessions): the distinct values gathered range by range. Hop and
        Lifetime windows, which overlap from one end to the next, are read by `coverage` instead."""
        lists = large_lists(cols["vals"])
        offsets = lists.offsets.to_numpy()
        which, row = range_groups(starts, ends)
        of_item, item = range_groups(offsets[row], offsets[row + 1])
        values = pd.factorize(pc.list_flatten(lists).to_numpy(zero_copy_only=False))[0]
        width = int(values.max(initial=0)) + 1
        pairs = pd.unique(which[of_item].astype(np.int64) * width + values[item])
        return self.counted(calc, np.bincount(pairs // width, minlength=len(starts)).astype(np.int64))

    def finalize(self, calc, cols):
        raise NotImplementedError("count_distinct is evaluated by `coverage`, never from a merged partial")


class BoundedDistinct(CountDistinct):
    """bounded_count_distinct: count_distinct, capped at k."""

    def counted(self, calc: Calc, counts: np.ndarray) -> np.ndarray:
        return np.minimum(counts, calc.k)


class HashedDistinct(CountDistinct):
    """approx_count_distinct: the exact count of distinct 64-bit hashes of the values, computed as
    count_distinct is. Hashes merge in numpy, in any order, to the same result (batch = stream, bit for bit);
    the only error is a hash collision, with probability below n^2 / 2^65 for n distinct values (under
    1e-7 for a million), far inside an HLL sketch's 1.6%. A pane keeps 8 bytes per distinct value it holds."""

    def items(self, calc: Calc, values: np.ndarray) -> tuple[np.ndarray, DType | None]:
        hashes = pd.util.hash_array(values, categorize=True) if len(values) else np.zeros(0, np.uint64)
        return hashes.view(np.int64), DType.INT64


def numpy_dtype(dtype: DType | None) -> Any:
    return {DType.INT64: np.int64, DType.FLOAT64: np.float64}.get(dtype, object)  # type: ignore[arg-type]


def _pandas_dtype(dtype: DType | None) -> Any:
    return {DType.INT64: "int64", DType.FLOAT64: "float64"}.get(dtype, object)  # type: ignore[arg-type]


def empty_value(dtype: DType | None) -> Any:
    return {DType.INT64: 0, DType.FLOAT64: np.nan}.get(dtype)  # type: ignore[arg-type]


def nullable(values: np.ndarray, present: np.ndarray) -> np.ndarray:
    out = values.astype(object)
    out[~present] = None
    return out
