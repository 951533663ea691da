"""The aggregations whose value is a list or a map: first_k / last_k (by time), top_k / bottom_k (by value),
histogram / top_frequent (counts per value) and distinct_values (a set). A pane keeps at most k items (or each
distinct value once), as Arrow lists; a window's value is read from its rows' items without merging partials
range by range."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from features.kernel.frames import column_values
from features.kernel.partials import (
    Kind,
    arrow_lists,
    flatten,
    large_lists,
    range_groups,
    range_of_rows,
    time_order,
)
from features.kernel.plan import TS, Calc
from features.spec import DType


def _list_column(offsets: np.ndarray, items: pa.Array, empty: np.ndarray | None = None) -> Any:
    mask = None if empty is None else pa.array(empty)
    return pd.arrays.ArrowExtensionArray(pa.LargeListArray.from_arrays(pa.array(offsets), items, mask=mask))


def _firsts_per_group(g: np.ndarray, k: int, last: bool = False) -> np.ndarray:
    """For items sorted by group: whether each is among the first (or last) k of its group."""
    position = np.arange(len(g))
    boundary = np.r_[np.flatnonzero(g[1:] != g[:-1]) + 1, len(g)]
    lengths = np.diff(np.r_[0, boundary])
    if last:
        return position >= np.repeat(boundary, lengths) - k
    return position < np.repeat(boundary - lengths, lengths) + k


class TimeK(Kind):
    """first_k / last_k: the k earliest / latest (ts, value) items (ties on ts: the smaller value counts as
    earlier). A pane's partial is its k earliest / latest items as Arrow lists, oldest first, so that the items
    of consecutive panes (which cover disjoint time) lie in time order when flattened: a window's value is the
    first / last k items of its rows' slice."""

    parts = ("t", "v")

    def __init__(self, earliest: bool) -> None:
        self.earliest = earliest

    def phase1(self, calc, codes, groups, mask, frame):
        values, valid = column_values(frame[calc.value], calc.value_type)
        ok = mask & valid
        return self._kept(calc, codes[ok], frame[TS].to_numpy(dtype=np.int64)[ok], values[ok], groups)

    def _kept(self, calc: Calc, g: np.ndarray, t: np.ndarray, v: np.ndarray, groups: int) -> dict[str, Any]:
        """Each group's k earliest / latest items (group, time, value), oldest first, as Arrow lists."""
        order = time_order(g, t, v)
        g = g[order]
        kept = _firsts_per_group(g, calc.k, last=not self.earliest)
        keep, g = order[kept], g[kept]
        return {
            "t": arrow_lists(g, t[keep], groups, DType.INT64),
            "v": arrow_lists(g, v[keep], groups, calc.value_type),
        }

    def merge(self, calc, cols, starts, ends, key_of_row, same_pane=False):
        """Rows of one pane from several batches (`same_pane`), which overlap in time: their items merged by
        (ts, value). A window's rows cover disjoint time and are read by `window` instead."""
        t = large_lists(cols["t"])
        range_of_row = range_of_rows(len(t), starts, ends)
        parent, times = flatten(t)
        take = range_of_row[parent] >= 0
        values = flatten(large_lists(cols["v"]))[1]
        return self._kept(calc, range_of_row[parent[take]], times[take], values[take], len(starts))

    def window(self, calc, cols, starts, ends, key_of_row):
        """The first k values of each range's slice, oldest first, or its last k, newest first; null for an
        empty window: the slice is in time order already, so the times are not read."""
        v = large_lists(cols["v"])
        offsets = v.offsets.to_numpy()
        n = np.minimum(offsets[ends] - offsets[starts], calc.k)
        out = np.zeros(len(starts) + 1, dtype=np.int64)
        np.cumsum(n, out=out[1:])
        within = np.arange(out[-1]) - np.repeat(out[:-1], n)  # item j of its range
        pick = np.repeat(offsets[starts], n) + within if self.earliest else np.repeat(offsets[ends] - 1, n) - within
        return _list_column(out, pc.list_flatten(v).take(pa.array(pick)), n == 0)

    def finalize(self, calc, cols):
        raise NotImplementedError("first_k and last_k are evaluated over a window's rows by `window`")


def _value_ranks(values: np.ndarray) -> np.ndarray:
    """Each value's rank in ascending order (equal values share one), for numbers and text alike."""
    return pd.factorize(values, sort=True)[0].astype(np.int64)


class ValueK(Kind):
    """top_k / bottom_k: the k largest / smallest values, duplicates kept. A pane's partial is its own k best,
    best first. A window's k best are the k best of its panes' items, read from a sparse table: for every row
    and every power of two 2^L, the k best items of the 2^L rows from it; a window of n rows is the union of
    the two blocks of 2^floor(log2 n) rows at its two ends, which overlap, so items are told apart by identity.
    Building costs O(rows k log k) per level, a window O(k log k), however many panes it spans."""

    parts = ("v",)

    def __init__(self, largest: bool) -> None:
        self.largest = largest

    def _order(self, values: np.ndarray) -> np.ndarray:
        """A key that sorts the values best first (equal values alike): numbers as they are (descending by their
        bitwise complement or negation, which cannot overflow), text by its rank: one sort, not two."""
        if values.dtype.kind == "i":
            return ~values if self.largest else values
        if values.dtype.kind == "f":
            return -values if self.largest else values
        rank = _value_ranks(values)
        return -rank if self.largest else rank

    def phase1(self, calc, codes, groups, mask, frame):
        values, valid = column_values(frame[calc.value], calc.value_type)
        ok = mask & valid
        return self._best(calc, codes[ok], values[ok], groups)

    def _best(self, calc: Calc, g: np.ndarray, v: np.ndarray, groups: int) -> dict[str, Any]:
        order = np.lexsort((self._order(v), g))
        g = g[order]
        kept = _firsts_per_group(g, calc.k)
        return {"v": arrow_lists(g[kept], v[order[kept]], groups, calc.value_type)}

    def merge(self, calc, cols, starts, ends, key_of_row, same_pane=False):
        lists = large_lists(cols["v"])
        range_of_row = range_of_rows(len(lists), starts, ends)
        parent, values = flatten(lists)
        take = range_of_row[parent] >= 0
        return self._best(calc, range_of_row[parent[take]], values[take], len(starts))

    def window(self, calc, cols, starts, ends, key_of_row):
        lists = large_lists(cols["v"])
        offsets = lists.offsets.to_numpy()
        items = pc.list_flatten(lists)
        rows, k = len(offsets) - 1, calc.k
        values = items.to_numpy(zero_copy_only=False)
        if k <= HEADS_K and (starts[1:] >= ends[:-1]).all():  # ranges apart: each value read from its own rows
            best = _best_heads(self._order(values), offsets, starts, ends, k)
            n = (best >= 0).sum(axis=1)
            out = np.zeros(len(starts) + 1, dtype=np.int64)
            np.cumsum(n, out=out[1:])
            return _list_column(out, items.take(pa.array(best[best >= 0])), n == 0)
        # Every item's place in one global order, best first (equal values: by position).
        by_order = np.argsort(self._order(values), kind="stable")
        place = np.empty(len(values), dtype=np.int64)
        place[by_order] = np.arange(len(values))
        none = len(values)  # an empty slot, after every item
        parent = np.repeat(np.arange(rows), np.diff(offsets))
        slot = np.arange(len(values)) - offsets[parent]
        level = np.full((rows, k), none, dtype=np.int64)
        kept = slot < k
        level[parent[kept], slot[kept]] = place[kept]
        level.sort(axis=1)
        lengths = ends - starts
        height = np.zeros(len(starts), dtype=np.int64)
        nonempty = lengths > 0
        height[nonempty] = np.floor(np.log2(lengths[nonempty])).astype(np.int64)
        best = np.full((len(starts), k), none, dtype=np.int64)
        for h in range(int(height.max(initial=0)) + 1):
            if h:  # blocks of 2^h rows from the two disjoint halves of 2^(h-1)
                half = 1 << (h - 1)
                level = np.sort(np.concatenate([level[:-half], level[half:]], axis=1), axis=1)[:, :k]
            asked = np.flatnonzero(nonempty & (height == h))
            if len(asked) == 0:
                continue
            both = np.sort(np.concatenate([level[starts[asked]], level[ends[asked] - (1 << h)]], axis=1), axis=1)
            both[:, 1:][both[:, 1:] == both[:, :-1]] = none  # an item both blocks hold, once
            best[asked] = np.sort(both, axis=1)[:, :k]
        n = (best < none).sum(axis=1)
        out = np.zeros(len(starts) + 1, dtype=np.int64)
        np.cumsum(n, out=out[1:])
        picked = by_order[best[best < none]]  # row-major: each range's items best first
        return _list_column(out, items.take(pa.array(picked)), n == 0)

    def finalize(self, calc, cols):
        raise NotImplementedError("top_k and bottom_k are evaluated over a window's rows by `window`")


HEADS_K = 16  # up to this k, the best of rows read apart are taken from the heads of their lists, k rounds


def _best_heads(order: np.ndarray, offsets: np.ndarray, starts: np.ndarray, ends: np.ndarray, k: int) -> np.ndarray:
    """For ranges of rows apart from each other, whose lists of items are each best first (`order`: each item's
    sort key, best smallest): each range's k best items, as (range, j) -> item (-1: none), equal items in row
    order, as one sort of them all would give. k rounds of taking the best head of each range's lists."""
    rows = len(offsets) - 1
    in_range = range_of_rows(rows, starts, ends) >= 0
    of_row = np.maximum(range_of_rows(rows, starts, ends), 0)
    head, stop = offsets[:-1].copy(), offsets[1:]
    fill = np.inf if order.dtype.kind == "f" else np.iinfo(np.int64).max
    best = np.full((len(starts), k), -1, dtype=np.int64)
    nonempty = ends > starts
    bounds = np.empty(2 * len(starts), dtype=np.int64)
    bounds[0::2], bounds[1::2] = starts, ends
    for j in range(k):
        live = in_range & (head < stop)
        if not live.any():
            break
        key = np.where(live, order[np.minimum(head, max(len(order) - 1, 0))], fill)
        top = np.minimum.reduceat(np.r_[key, fill], bounds)[0::2]
        row = np.where(live & (key == top[of_row]), np.arange(rows), rows)
        first = np.minimum.reduceat(np.r_[row, rows], bounds)[0::2]
        taken = nonempty & (first < rows)
        best[taken, j] = head[first[taken]]
        head[first[taken]] += 1
    return best


class Counts(Kind):
    """histogram / top_frequent: a pane's partial is each distinct value it holds with its count. A window's
    count of a value is a difference of the value's running count over its key's rows, so a window costs the
    number of distinct values its key has, not the number of panes it spans. Map keys are the values' text,
    as Feast's Map type has them."""

    parts = ("v", "c")

    def __init__(self, top: bool) -> None:
        self.top = top  # top_frequent: only the k most frequent

    def phase1(self, calc, codes, groups, mask, frame):
        values, valid = column_values(frame[calc.value], calc.value_type)
        ok = mask & valid
        return self._counted(calc, codes[ok], values[ok], np.ones(int(ok.sum()), dtype=np.int64), groups)

    def _counted(self, calc: Calc, g: np.ndarray, v: np.ndarray, c: np.ndarray, groups: int) -> dict[str, Any]:
        code, distinct = pd.factorize(v)
        width = max(len(distinct), 1)
        unique, inverse = np.unique(g.astype(np.int64) * width + code, return_inverse=True)
        counts = np.bincount(inverse, weights=c, minlength=len(unique)).astype(np.int64)
        group, item = np.divmod(unique, width)
        return {
            "v": arrow_lists(group, np.asarray(distinct)[item], groups, calc.value_type),
            "c": arrow_lists(group, counts, groups, DType.INT64),
        }

    def merge(self, calc, cols, starts, ends, key_of_row, same_pane=False):
        range_of_row = range_of_rows(len(cols["v"]), starts, ends)
        parent, values = flatten(large_lists(cols["v"]))
        counts = flatten(large_lists(cols["c"]))[1]
        take = range_of_row[parent] >= 0
        return self._counted(calc, range_of_row[parent[take]], values[take], counts[take], len(starts))

    def window(self, calc, cols, starts, ends, key_of_row):
        parent, values = flatten(large_lists(cols["v"]))
        counts = flatten(large_lists(cols["c"]))[1]
        which, value, count = _range_counts(parent, values, counts, len(cols["v"]), key_of_row, starts, ends, self.top)
        if self.top:
            kept = _firsts_per_group(which, calc.k)
            which, value, count = which[kept], value[kept], count[kept]
        out = np.zeros(len(starts) + 1, dtype=np.int64)
        np.cumsum(np.bincount(which, minlength=len(starts)), out=out[1:])
        maps = pa.MapArray.from_arrays(pa.array(out, pa.int32()), pa.array(_texts(value), pa.string()), pa.array(count))
        return pd.arrays.ArrowExtensionArray(maps)

    def finalize(self, calc, cols):
        raise NotImplementedError("histogram and top_frequent are evaluated over a window's rows by `window`")


def _range_counts(
    parent: np.ndarray,
    values: np.ndarray,
    counts: np.ndarray,
    rows: int,
    key_of_row: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    top: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(range, value, count) of every value each range [start, end) of rows holds, from the rows' entries (row,
    value, count): by range, then by value ascending (`top`: by count, largest first, then value). A value's
    count in a range is a difference of its running count over its key's rows, and a value's rows fall in a run
    of consecutive ranges of its key (ranges of a key start and end in order, as the windows and sessions of
    successive ends do), so the (range, value) pairs are found without trying every value of the key in every
    range: a window costs the number of distinct values its key has, not the number of panes it spans."""
    code = _value_ranks(values)  # ascending value order
    width = int(code.max(initial=0)) + 1
    # (key, value) pairs, and every entry's place among its pair's entries in row order
    pair_of, pairs = pd.factorize(key_of_row[parent].astype(np.int64) * width + code, sort=True)
    pairs = np.asarray(pairs, dtype=np.int64)
    position = pair_of.astype(np.int64) * (rows + 1) + parent
    order = np.argsort(position, kind="stable")
    position, entry_row, entry_pair = position[order], parent[order], pair_of[order].astype(np.int64)
    running = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(counts[order], out=running[1:])
    which, pair = _ranges_holding(entry_row, entry_pair, key_of_row, starts, ends, rows)
    base = pair * (rows + 1)
    count = running[np.searchsorted(position, base + ends[which])]
    count -= running[np.searchsorted(position, base + starts[which])]
    keep = count > 0
    which, pair, count = which[keep], pair[keep], count[keep]
    # by range, then value ascending (pairs are in value order within a key); top: by count first
    if top:
        order = np.lexsort((pair, -count, which))
    else:
        order = np.argsort(which * (int(pair.max(initial=0)) + 1) + pair, kind="stable")
    which, pair, count = which[order], pair[order], count[order]
    return which, _pair_values(values, code, pairs[pair] % width), count


class DistinctValues(Kind):
    """distinct_values: a window's distinct values, smallest first, as a list. A pane keeps each distinct value
    it holds once; a window's values are found as histogram's are (`_range_counts`, each pane counting a value
    once), so a window costs its key's distinct values, not the panes it spans. An empty window gives []."""

    parts = ("v",)

    def phase1(self, calc, codes, groups, mask, frame):
        values, valid = column_values(frame[calc.value], calc.value_type)
        ok = mask & valid
        return self._distinct(calc, codes[ok], values[ok], groups)

    def _distinct(self, calc: Calc, g: np.ndarray, v: np.ndarray, groups: int) -> dict[str, Any]:
        code, distinct = pd.factorize(v)
        width = max(len(distinct), 1)
        group, item = np.divmod(np.unique(g.astype(np.int64) * width + code), width)
        return {"v": arrow_lists(group, np.asarray(distinct)[item], groups, calc.value_type)}

    def merge(self, calc, cols, starts, ends, key_of_row, same_pane=False):
        range_of_row = range_of_rows(len(cols["v"]), starts, ends)
        parent, values = flatten(large_lists(cols["v"]))
        take = range_of_row[parent] >= 0
        return self._distinct(calc, range_of_row[parent[take]], values[take], len(starts))

    def window(self, calc, cols, starts, ends, key_of_row):
        lists = large_lists(cols["v"])
        parent, values = flatten(lists)
        ones = np.ones(len(values), dtype=np.int64)
        which, value, _ = _range_counts(parent, values, ones, len(lists), key_of_row, starts, ends, top=False)
        out = np.zeros(len(starts) + 1, dtype=np.int64)
        np.cumsum(np.bincount(which, minlength=len(starts)), out=out[1:])
        return _list_column(out, pa.array(value, lists.type.value_type))

    def finalize(self, calc, cols):
        raise NotImplementedError("distinct_values is evaluated over a window's rows by `window`")


def _ranges_holding(
    row: np.ndarray, pair: np.ndarray, key_of_row: np.ndarray, starts: np.ndarray, ends: np.ndarray, rows: int
) -> tuple[np.ndarray, np.ndarray]:
    """(range, pair) for every range [start, end) that holds a row of the pair, in no order; the entries (row,
    pair) are sorted by pair, then row. The ranges of one key, taken in order of their ends, must
    start in order too: then the ranges holding a row are consecutive, and so are those holding any of a pair's
    rows that are closer than the ranges are long."""
    nonempty = ends > starts
    range_key = np.full(len(starts), -1, dtype=np.int64)
    range_key[nonempty] = key_of_row[starts[nonempty]]
    by_end = np.lexsort((starts, ends, range_key))  # the ranges in (key, end) order
    key_s, start_s, end_s = range_key[by_end], starts[by_end], ends[by_end]
    span = rows + 1
    if np.any((key_s[1:] == key_s[:-1]) & (start_s[1:] < start_s[:-1]) & (key_s[1:] >= 0)):
        raise RuntimeError("ranges of a key whose starts and ends are not in the same order")
    at = key_of_row[row].astype(np.int64) * span + row
    lo = np.searchsorted(key_s * span + end_s, at, side="right")  # the first range ending after the row
    hi = np.searchsorted(key_s * span + start_s, at, side="right")  # past the last range starting at or before it
    hi = np.maximum(hi, lo)
    if len(row) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    # runs of a pair's rows whose ranges overlap or touch: one stretch of ranges each
    run = np.ones(len(row), dtype=bool)
    run[1:] = (pair[1:] != pair[:-1]) | (lo[1:] > hi[:-1])
    first = np.flatnonzero(run)
    last = np.r_[first[1:], len(row)] - 1
    run_of, position = range_groups(lo[first], hi[last])
    return by_end[position], pair[first][run_of]


def _pair_values(values: np.ndarray, code: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """The value of each wanted rank (`code` gives each value's rank)."""
    of_rank = np.empty(int(code.max(initial=-1)) + 1, dtype=values.dtype)
    of_rank[code] = values
    return of_rank[wanted]


def _texts(values: np.ndarray) -> np.ndarray:
    """Map keys: strings as they are, integers in decimal."""
    return values if values.dtype == object else values.astype(str).astype(object)
