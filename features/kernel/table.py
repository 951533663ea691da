"""Pane tables and phase 2: the one kernel that both engines run (pure numpy/pandas, no Spark).

A pane table holds one row per (key, pane): the join keys (or the stream's key code `fx_key`), `fx_pane` (pane
start, µs), `fx_n<i>` (rows passing the group's i-th distinct `where`, which decide where values may change), and
each feature's partial columns `<feature>.<part>` (features.kernel.partials). One row per key may have
`fx_pane == BASE`: the merged partials of panes that only Lifetime windows still read.

The batch engine runs `phase1` and `emit` on each hash bucket of keys (all of their events at once); the stream
runs `step` on each bucket's state once per micro-batch. The meaning of every value is docs/semantics.md; the
window and pane arithmetic is `features.kernel.panes`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from features.kernel import sessions
from features.kernel.kinds import KINDS
from features.kernel.partials import CountDistinct, bincount, ranges_add
from features.kernel.plan import BASE, KEY, PANE, TS, Calc, Plan

# ---------------------------------------------------------------------------------------------------------
# Pane tables


def pane_columns(plan: Plan) -> list[str]:
    """A pane table's columns."""
    cols = [*plan.keys, PANE, *(f"fx_n{i}" for i in range(len(plan.conditions)))]
    cols.extend(sessions.columns(i)[part] for i in plan.session_conditions for part in ("s0", "s1"))
    for calc in plan.calcs:
        cols.extend(calc.col(p) for p in KINDS[calc.kind].parts)
    return cols


def phase1(plan: Plan, events: pd.DataFrame) -> pd.DataFrame:
    """Reduce events (keys, `fx_ts` µs, `fx_c<i>` conditions, `fx_v_*` values) to one row per (key, pane)."""
    return phase1_sorted(plan, events).table


def phase1_sorted(plan: Plan, events: pd.DataFrame) -> Sorted:
    """`phase1`, its rows sorted by (key, pane) for range reductions: the events' key codes give the order, so
    that the pane table is neither factorized nor sorted again."""
    if events.empty:
        return Sorted.of(plan, empty_table(plan))
    ts = events[TS].to_numpy(dtype=np.int64)
    pane = ts - ts % plan.pane_us
    key_codes, keys = _factorize(events[list(plan.keys)])
    origin = int(pane.min())
    rank = (pane - origin) // plan.pane_us + 1  # as Sorted.of ranks panes
    span = int(rank.max()) + 2
    position, codes = np.unique(key_codes * span + rank, return_inverse=True)
    groups = len(position)
    key_of_group = position // span
    out = {k: keys[k].to_numpy()[key_of_group] for k in plan.keys}
    out[PANE] = origin + (position % span - 1) * plan.pane_us
    masks = []
    for i in range(len(plan.conditions)):
        column = plan.condition_column(i)
        mask = np.ones(len(events), dtype=bool) if column is None else events[column].fillna(False).to_numpy(bool)
        masks.append(mask)
        out[f"fx_n{i}"] = bincount(codes[mask], groups).astype(np.int64)
    for i in plan.session_conditions:
        bounds = sessions.phase1_bounds(codes, groups, masks[i], events)
        out.update({sessions.columns(i)[p]: v for p, v in bounds.items()})
    for calc in plan.calcs:
        parts = KINDS[calc.kind].phase1(calc, codes, groups, masks[calc.condition], events)
        out.update({calc.col(p): v for p, v in parts.items()})
    return Sorted(frame_of({c: out[c] for c in pane_columns(plan)}), key_of_group, position, origin, span)


def frame_of(columns: dict[str, Any]) -> pd.DataFrame:
    """A frame of these columns, not copied: pandas would otherwise stack the columns of each dtype into one
    block (a copy of every column, a fifth of an emit)."""
    return pd.DataFrame(columns, copy=False)


def _factorize(frame: pd.DataFrame) -> tuple[np.ndarray, pd.DataFrame]:
    """Group codes 0..n-1 for the distinct rows of `frame`, and those rows."""
    # A hash table per column, then one over the columns' codes packed into an integer: several times faster
    # than a groupby over the columns.
    codes = np.zeros(len(frame), dtype=np.int64)
    span = 1
    for column in frame.columns:
        column_codes, distinct = pd.factorize(frame[column], use_na_sentinel=False)
        span *= max(len(distinct), 1)
        if span >= 2**62:  # too many combinations to pack: the groupby
            codes = frame.groupby(list(frame.columns), sort=False, dropna=False).ngroup().to_numpy()
            break
        codes = codes * max(len(distinct), 1) + column_codes
    else:
        if frame.shape[1] > 1:
            codes = pd.factorize(codes)[0]
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


def empty_table(plan: Plan) -> pd.DataFrame:
    integers = [PANE, *(f"fx_n{i}" for i in range(len(plan.conditions)))]
    integers += [sessions.columns(i)[part] for i in plan.session_conditions for part in ("s0", "s1")]
    return pd.DataFrame({c: pd.Series(dtype=object) for c in pane_columns(plan)}).astype(
        dict.fromkeys(integers, np.int64)
    )


ASKED = "asked"  # Sorted.memo: key codes that reads of the table will ask about, when known in advance


@dataclass
class Sorted:
    """A pane table sorted by (key, pane) with a dense key code per row, ready for range reductions."""

    table: pd.DataFrame
    key_code: np.ndarray
    position: np.ndarray  # key_code * span + pane rank: sorted, so ranges are found by searchsorted
    origin: int
    span: int
    memo: dict[Any, Any] = field(default_factory=dict, repr=False)  # what reads of the table share

    @classmethod
    def of_columns(
        cls, columns: dict[str, Any], key_code: np.ndarray, position: np.ndarray, origin: int, span: int
    ) -> Sorted:
        """A sorted table of these columns' values, which reads of it take as they are (`array`)."""
        s = cls(frame_of(columns), key_code, position, origin, span)
        s.memo.update({("array", c): v for c, v in columns.items()})
        return s

    @classmethod
    def of(cls, plan: Plan, table: pd.DataFrame) -> Sorted:
        codes, position, origin, span = _positions(plan, table)
        order = np.argsort(position, kind="stable")
        return cls(renumbered(table.iloc[order]), codes[order], position[order], origin, span)

    def locate(self, key_code: np.ndarray, at_us: np.ndarray, plan: Plan) -> np.ndarray:
        """Index of the first row of `key_code` whose pane is >= at (at: multiples of the pane length)."""
        rank = np.clip((at_us - self.origin) // plan.pane_us + 1, 1, self.span - 1)
        return np.searchsorted(self.position, key_code * self.span + rank, side="left")

    def key_firsts(self) -> np.ndarray:
        """The index of each key's first row."""
        if len(self.key_code) == 0:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(np.r_[True, self.key_code[1:] != self.key_code[:-1]])

    def key_start(self, key_code: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.position, key_code * self.span, side="left")

    def array(self, column: str) -> Any:
        """A column's values (`column_array`), kept for the reads that follow (a pandas column costs more to find
        than a small chunk's values to read)."""
        key = ("array", column)
        if key not in self.memo:
            self.memo[key] = column_array(self.table[column])
        return self.memo[key]

    def columns(self, calc: Calc) -> dict[str, Any]:
        """A feature's partial columns by part, and for a session feature its `where`'s bounds (`bounds`)."""
        out = {p: self.array(calc.col(p)) for p in KINDS[calc.kind].parts}
        if calc.gap_us is not None:
            out.update(self.bounds(calc.condition))
        return out

    def bounds(self, condition: int) -> dict[str, Any]:
        """A session `where`'s event count `sn` and first and last event times `s0`, `s1` per row."""
        return {p: self.array(c) for p, c in sessions.columns(condition).items()}


def _positions(plan: Plan, *tables: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Each row's key code and (key, pane) position (`Sorted.position`, unsorted), the origin and the span: of
    the rows of `tables` one after the other (key codes then mean the same in each)."""
    codes = np.concatenate([_key_codes(plan, t) for t in tables]) if len(tables) > 1 else _key_codes(plan, tables[0])
    pane = np.concatenate([t[PANE].to_numpy(dtype=np.int64) for t in tables])
    real = pane[pane != BASE]
    origin = int(real.min()) if len(real) else 0
    rank = np.where(pane == BASE, 0, (pane - origin) // plan.pane_us + 1)
    span = int(rank.max()) + 2 if len(rank) else 2
    return codes, codes.astype(np.int64) * span + rank, origin, span


def to_arrow(column: pd.Series, arrow_type: pa.DataType) -> pa.Array:
    """A column of kernel output as an Arrow array of `arrow_type` (the type Spark expects)."""
    if isinstance(column.dtype, pd.ArrowDtype):
        array = pa.array(column)
        array = array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array
        return array.cast(arrow_type)
    return pa.array(column.to_numpy(), arrow_type, from_pandas=True)


def column_array(column: pd.Series) -> Any:
    """A column's values: numpy, or Arrow for the lists of variable-length partials."""
    return column.array if isinstance(column.dtype, pd.ArrowDtype) else column.to_numpy()


def _key_codes(plan: Plan, table: pd.DataFrame) -> np.ndarray:
    """A dense-enough integer per key: the key itself when it is already a small code (the stream's key
    dictionary), else the order of first appearance."""
    if len(table) == 0:
        return np.zeros(0, np.int64)
    if plan.keys == (KEY,):
        return table[KEY].to_numpy(dtype=np.int64)
    return _factorize(table[list(plan.keys)])[0]


def renumbered(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` (a fresh selection of rows) indexed 0..n-1 in place: reset_index would copy every column."""
    frame.index = pd.RangeIndex(len(frame))
    return frame


def combine(plan: Plan, tables: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """One row per (key, pane): rows of the same pane from several batches merged."""
    return combine_sorted(plan, tables).table


def combine_sorted(plan: Plan, tables: Sequence[pd.DataFrame]) -> Sorted:
    """`combine`, sorted for range reductions (one sort serves the merge and the emit)."""
    frames = [t for t in tables if len(t)] or [empty_table(plan)]
    if len(frames) == 2 and (put := inserted(plan, frames[0], frames[1])) is not None:
        return put
    table = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    codes, position, origin, span = _positions(plan, table)
    order = np.argsort(position, kind="stable")
    position = position[order]
    first = np.r_[True, np.diff(position) != 0]
    if first.all():
        if (np.diff(order) == 1).all():  # sorted already (a stored chunk): not copied
            if not table.index.equals(pd.RangeIndex(len(table))):
                table = renumbered(table.copy(deep=False))
            return Sorted(table, codes, position, origin, span)
        return Sorted(renumbered(table.iloc[order]), codes[order], position, origin, span)
    starts = np.flatnonzero(first)
    ends = np.r_[starts[1:], len(position)]
    # Most (key, pane)s got rows from one batch only: each column is taken once, at the first row of each
    # (key, pane); the rows of the few with several are gathered apart and merged.
    several = np.flatnonzero(ends - starts > 1)
    lengths = ends[several] - starts[several]
    within = np.repeat(starts[several] - np.r_[0, np.cumsum(lengths)[:-1]], lengths) + np.arange(lengths.sum())
    rows = order[within]
    group = Sorted(renumbered(table.iloc[rows]), codes[rows], position[within], origin, span)
    bounds = np.r_[0, np.cumsum(lengths)]
    partials = merged_partials(plan, group, bounds[:-1], bounds[1:])
    keep = order[starts]
    columns = {}
    for column in table.columns:
        values = column_array(table[column])
        if isinstance(values, pd.arrays.ArrowExtensionArray):  # immutable lists: one take from rows + merged
            pick = keep.copy()
            merged = pa.array(values)  # in chunks, as concatenated
            chunks = merged.chunks if isinstance(merged, pa.ChunkedArray) else [merged]
            if column in partials:
                pick[several] = len(merged) + np.arange(len(several))
                chunks.append(pa.array(partials[column]).cast(merged.type))
            merged = pa.chunked_array(chunks, merged.type)
            columns[column] = pd.arrays.ArrowExtensionArray(merged.take(pa.array(pick)).combine_chunks())
            continue
        columns[column] = values[keep]
        if column in partials:
            columns[column][several] = partials[column]
    return Sorted(frame_of(columns), codes[keep], position[starts], origin, span)


INSERT_RATIO = 8  # a table this many times smaller than a sorted one is inserted into it instead of sorted with it


def inserted(plan: Plan, big: pd.DataFrame, small: pd.DataFrame) -> Sorted | None:
    """`combine_sorted` of a table already sorted by (key, pane) with one row each (a stream's state after its
    previous step) and a much smaller one (a micro-batch's panes): the small one's rows are put in place, and
    merged where the big one has their (key, pane), so the big one's columns are copied in order, never sorted
    or gathered. None where that does not apply: keys that are not the stream's codes (which mean the same in
    both), a small one not `INSERT_RATIO` times smaller, or a big one not so sorted."""
    if plan.keys != (KEY,) or len(small) * INSERT_RATIO > len(big):
        return None
    codes, position, origin, span = _positions(plan, big, small)
    n = len(big)
    held = position[:n]
    if n > 1 and not (held[1:] > held[:-1]).all():
        return None
    order = np.argsort(position[n:], kind="stable")
    incoming = position[n:][order]
    if len(incoming) > 1 and not (incoming[1:] > incoming[:-1]).all():
        return None  # rows of the same (key, pane) in the small one
    at = np.searchsorted(held, incoming)
    hit = at < n
    hit[hit] = held[at[hit]] == incoming[hit]
    new, before = order[~hit], at[~hit]  # the small one's rows of a new (key, pane), and the big one's row after
    placed = np.zeros(n + len(new), dtype=bool)  # the result's rows that come from the small one
    placed[before + np.arange(len(new))] = True
    kept = ~placed
    # The big one's rows that got rows of the small one: their places in the result, and the pairs merged.
    pairs = at[hit]
    pair_slots = pairs + np.searchsorted(before, pairs, side="right")
    if len(pairs):
        both = pd.concat([big.iloc[pairs], small.iloc[order[hit]]], ignore_index=True)
        interleave = np.ravel(np.c_[np.arange(len(pairs)), len(pairs) + np.arange(len(pairs))])
        group = Sorted(renumbered(both.iloc[interleave]), np.repeat(codes[n:][order[hit]], 2), np.zeros(0), 0, 0)
        partials = merged_partials(plan, group, np.arange(0, 2 * len(pairs), 2), np.arange(2, 2 * len(pairs) + 1, 2))
    else:
        partials = {}

    def spliced(old: Any, added: Any, merged: Any | None) -> Any:
        if isinstance(old, pd.arrays.ArrowExtensionArray) or isinstance(added, pd.arrays.ArrowExtensionArray):
            pick = np.empty(len(placed), dtype=np.int64)
            pick[kept] = np.arange(n)
            pick[placed] = n + np.arange(len(new))
            chunks = [pa.array(old), pa.array(added)]
            if merged is not None:
                pick[pair_slots] = n + len(new) + np.arange(len(pairs))
                chunks.append(pa.array(merged))
            joined = pa.chunked_array([c.cast(chunks[0].type) for c in chunks], chunks[0].type)
            return pd.arrays.ArrowExtensionArray(joined.take(pa.array(pick)).combine_chunks())
        out = np.empty(len(placed), dtype=np.result_type(old.dtype, added.dtype))
        out[kept] = old
        out[placed] = added
        if merged is not None:
            out[pair_slots] = merged
        return out

    columns = {c: spliced(column_array(big[c]), column_array(small[c])[new], partials.get(c)) for c in big.columns}
    return Sorted(
        frame_of(columns),
        spliced(codes[:n], codes[n:][new], None),
        spliced(held, position[n:][new], None),
        origin,
        span,
    )


def merged_partials(
    plan: Plan, s: Sorted, starts: np.ndarray, ends: np.ndarray, same_pane: bool = True
) -> dict[str, np.ndarray]:
    """Every partial column merged over rows [start, end) of `s`: each range the rows of one (key, pane), or with
    `same_pane` False, consecutive panes of one key in time order."""
    out = {}
    for i in range(len(plan.conditions)):
        out[f"fx_n{i}"] = ranges_add(s.table[f"fx_n{i}"].to_numpy(dtype=np.int64), starts, ends)
    for i in plan.session_conditions:
        merged = sessions.merged_parts(s.bounds(i), starts, ends)
        out.update({sessions.columns(i)[p]: merged[p] for p in ("s0", "s1")})  # the count is fx_n's, above
    for calc in plan.calcs:
        merged = KINDS[calc.kind].merge(calc, s.columns(calc), starts, ends, s.key_code, same_pane=same_pane)
        out.update({calc.col(p): v for p, v in merged.items()})
    return out


def change_ends(
    plan: Plan, s: Sorted, after_us: int | None, upto_us: int | None, clamp_us: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(row indexes, Es) for every window end in (after, upto] where some feature's value may change: where a
    pane holding rows for it enters or leaves its window (features.kernel.panes), or where a session closes.

    `clamp_us` (a backfill's range start): ends before it are moved to it, so that each key's first row of the
    range carries the value the range starts with, without a row for every earlier end."""
    pane = s.table[PANE].to_numpy(dtype=np.int64)
    rows, ends = [], []
    shapes = dict.fromkeys((c.condition, c.every_us, c.size_us, c.gap_us) for c in plan.calcs)
    for condition, every_us, size_us, gap_us in shapes:
        counts = s.table[f"fx_n{condition}"].to_numpy(dtype=np.int64)
        # A pane enters its window at an end in (pane, pane + every] and leaves it `size` later.
        moves = [pane_moves(pane, counts, every_us, 0, after_us, upto_us, clamp_us)]
        if size_us is not None:
            moves.append(pane_moves(pane, counts, every_us, size_us, after_us, upto_us, clamp_us))
        if gap_us is not None:
            calc = next(c for c in plan.calcs if (c.condition, c.every_us, c.gap_us) == (condition, every_us, gap_us))
            moves.append(session_runs(s, calc).closes(every_us, gap_us))
        for at, e in moves:
            if clamp_us is not None:
                e = np.maximum(e, clamp_us)
            keep = np.ones(len(e), dtype=bool)
            if after_us is not None:
                keep &= e > after_us
            if upto_us is not None:
                keep &= e <= upto_us
            rows.append(at[keep])
            ends.append(e[keep])
    return np.concatenate(rows), np.concatenate(ends)


def pane_moves(
    pane: np.ndarray,
    counts: np.ndarray,
    every_us: int,
    offset_us: int,
    after_us: int | None,
    upto_us: int | None,
    clamp_us: int | None,
) -> tuple[np.ndarray, np.ndarray]:
    """(rows, E): the end `offset` after each pane with rows enters its window, for the panes whose end can fall
    in (after, upto]. The end lies in (pane + offset, pane + offset + every], so a pane interval is tested first:
    a step's few panes near the watermark are then all that is read of a table holding a window of them."""
    near = pane != BASE
    if upto_us is not None:
        near &= pane < upto_us - offset_us
    if after_us is not None and (clamp_us is None or clamp_us <= after_us):
        near &= pane > after_us - offset_us - every_us
    idx = np.flatnonzero(near)
    idx = idx[counts[idx] > 0]
    at = pane[idx]
    return idx, at - at % every_us + offset_us + every_us


def session_runs(s: Sorted, calc: Calc) -> sessions.Runs:
    """The sessions of `s` for a session feature's `where` and gap (shared by the features that have both)."""
    memo = ("runs", calc.condition, calc.gap_us)
    if memo not in s.memo:
        s.memo[memo] = sessions.Runs.of(s.bounds(calc.condition), s.key_code, calc.gap_us)  # type: ignore[arg-type]
    return s.memo[memo]


def values_at(plan: Plan, s: Sorted, key_code: np.ndarray, ends: np.ndarray) -> dict[str, np.ndarray]:
    """Every feature's value at window end E for each (key, E) query (sorted by key, then E)."""
    out = {}
    found: dict[tuple[int, int | None], np.ndarray] = {}  # first row at or after (every, offset): one search each

    def first_row(every_us: int, offset: int | None) -> np.ndarray:
        """Lifetime (offset None): the key's first row; else the first row at or after E's window end - offset."""
        if offset is None:
            every_us = 0
        if (every_us, offset) not in found:
            found[every_us, offset] = (
                s.key_start(key_code) if offset is None else s.locate(key_code, ends - ends % every_us - offset, plan)
            )
        return found[every_us, offset]

    for calc in plan.calcs:
        kind = KINDS[calc.kind]
        if isinstance(kind, CountDistinct) and calc.gap_us is None:  # and approx_count_distinct
            cover = s.memo.get(calc.name)
            if cover is None or not cover.asked[key_code].all():
                asked = np.zeros(int(max(s.key_code.max(initial=0), key_code.max(initial=0))) + 1, dtype=bool)
                asked[key_code] = True
                asked[s.memo.get(ASKED, key_code)] = True
                rank = s.position - s.key_code * s.span
                lists = s.table[calc.col("vals")].array
                cover = s.memo[calc.name] = kind.coverage(calc, lists, s.key_code, rank, asked, plan.pane_us)
            counts = cover.count(key_code, (ends - ends % calc.every_us - s.origin) // plan.pane_us + 1)
            out[calc.name] = kind.counted(calc, counts)
            continue
        hi = first_row(calc.every_us, 0)
        if calc.gap_us is not None:
            lo = session_runs(s, calc).ranges(
                first_row(calc.every_us, None), hi, ends - ends % calc.every_us, calc.gap_us
            )
        else:
            lo = first_row(calc.every_us, calc.size_us)
        out[calc.name] = kind.window(calc, s.columns(calc), lo, hi, s.key_code)
    return out


def emit(
    plan: Plan,
    table: pd.DataFrame | Sorted,
    after_us: int | None,
    upto_us: int,
    clamp_us: int | None = None,
    changes: tuple[np.ndarray, np.ndarray] | None = None,
) -> pd.DataFrame:
    """The change-point rows (keys, `window_end` µs, features) with window end in (after, upto], sorted by key
    and window end (see `change_ends` for `clamp_us`). `changes`: `change_ends` of the table from `after` on,
    when the caller has them."""
    s = table if isinstance(table, Sorted) else Sorted.of(plan, table)
    row, end = change_ends(plan, s, after_us, upto_us, clamp_us) if changes is None else _upto(changes, upto_us)
    if len(row) == 0:
        return pd.DataFrame({c: [] for c in (*plan.keys, "window_end", *(c.name for c in plan.calcs))})
    key = s.key_code[row]
    # (key, E) packed into one integer for one sort: every end is a multiple of the pane length but a clamped
    # range start, which is below all others, so the ends' steps above the smallest are distinct.
    step = (end - end.min() + plan.pane_us - 1) // plan.pane_us
    _, first = np.unique(key * (int(step.max()) + 1) + step, return_index=True)
    row, end, key = row[first], end[first], key[first]
    out = keys_at(plan, s, row)
    out["window_end"] = end
    out.update(values_at(plan, s, key, end))
    return frame_of(out)


def key_lasts(columns: Sequence[Any]) -> np.ndarray:
    """A mask of each key's last row, in rows sorted by key (as `emit` returns them): `columns` are the key's
    columns (numpy, pandas or Arrow arrays, never null)."""
    n = len(columns[0])
    last = np.zeros(n, dtype=bool)
    last[-1:] = True
    for column in columns:
        column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else pa.array(column)
        last[:-1] |= np.asarray(pc.not_equal(column[1:], column[:-1]), dtype=bool)
    return last


def keys_at(plan: Plan, s: Sorted, rows: np.ndarray) -> dict[str, Any]:
    """The join keys of rows `rows` of `s`. Text keys are taken in Arrow from each key's first row: converting
    millions of Python strings to Arrow on the way out costs more than most features' values."""
    firsts = s.key_firsts()
    index_of_key = np.zeros(int(s.key_code.max(initial=0)) + 1, dtype=np.int64)
    index_of_key[s.key_code[firsts]] = np.arange(len(firsts))
    which = pa.array(index_of_key[s.key_code[rows]])
    out = {}
    for k in plan.keys:
        column = s.table[k].to_numpy()
        if column.dtype == object:
            out[k] = pd.arrays.ArrowExtensionArray(pa.array(column[firsts]).take(which))
        else:
            out[k] = column[rows]
    return out


def _upto(changes: tuple[np.ndarray, np.ndarray], upto_us: int) -> tuple[np.ndarray, np.ndarray]:
    row, end = changes
    keep = end <= upto_us
    return row[keep], end[keep]
