"""Window values read from a held pane table (features.kernel.held) without reading every pane of the window.

A key's value at window end E is its aggregation's `Kind.window` over the rows that hold its panes in
[E - size, E) (docs/semantics.md, Windows), in time order. Here those rows are: the key's panes in the two
chunks where the window starts and ends, and between them, for the whole chunks, summaries: one row per key, its
partials of a run of chunks merged by `Kind.merge`, for aligned runs of 2^h chunks (a segment tree over chunk
numbers), at most two runs per h. So a value reads some 2 chunks' panes of its key and 2 log2(window / chunk)
summary rows, however long the window; a summary is merged when first read and kept until a chunk under it
changes (`Held.changed`). A batch changes the newest chunks, whose runs no window reads whole until they are
complete, so each run is merged about once. Every kind reads these rows with the function the batch engine
applies to a window's panes; merged partials are partials of the same kind, so the values are the same (float
sums and moments to rounding: they are added in another grouping)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from features.kernel import sessions
from features.kernel.held import Held, arrow_array, stacked
from features.kernel.kinds import KINDS
from features.kernel.partials import sorted_pairs
from features.kernel.plan import BASE, KEY, PANE, Calc, Plan
from features.kernel.table import (
    Sorted,
    frame_of,
    merged_partials,
    pane_columns,
    session_runs,
    values_at,
)


def value_rows(held: Held, key: np.ndarray, ends: np.ndarray) -> pd.DataFrame:
    """Rows (`fx_key`, `window_end`, features): each feature's value at each (key, E), once per pair, sorted by
    key, then E."""
    earliest = int(ends.min()) if len(ends) else 0
    key, since = sorted_pairs(key, ends - earliest)
    first = np.r_[True, (key[1:] != key[:-1]) | (since[1:] != since[:-1])] if len(key) else np.zeros(0, bool)
    key, ends = key[first], since[first] + earliest
    out: dict[str, Any] = {KEY: key, "window_end": ends}
    out.update(window_values(held, key, ends))
    return frame_of(out)


# A step asking for values at least an eighth as many as the panes held (a catch-up batch, hours of events) reads
# them from the panes whole, as the batch engine does (`table.values_at`): sorting them once then costs less than
# reading some tens of rows for each value. Steady batches ask for a few hundredths.
WHOLE_SHARE = 8


def window_values(held: Held, key: np.ndarray, ends: np.ndarray) -> dict[str, Any]:
    """Every feature's value at window end E for each (key code, E) query (sorted by key, then E)."""
    plan, out = held.plan, {}
    if len(key) * WHOLE_SHARE >= held.rows:
        return values_at(plan, held.whole(), key, ends)
    shapes: dict[tuple[int, int | None, int | None, int | None], list[Calc]] = {}
    for calc in plan.calcs:
        shape = (calc.every_us, calc.size_us, calc.gap_us, None if calc.gap_us is None else calc.condition)
        shapes.setdefault(shape, []).append(calc)
    for (every_us, size_us, gap_us, _), calcs in shapes.items():
        hi = ends - ends % every_us
        if gap_us is not None:
            lo = _session_starts(held, calcs[0], key, hi)
        elif size_us is None:  # Lifetime: every pane before E, and the BASE row
            starts = held.starts()
            lo = np.full(len(key), starts[0] if len(starts) else 0, dtype=np.int64)
            lo = np.minimum(lo, hi)
        else:
            lo = hi - size_us
        columns = list(dict.fromkeys(c.col(p) for c in calcs for p in KINDS[c.kind].parts))
        if gap_us is not None:
            columns += list(sessions.columns(calcs[0].condition).values())
        rows, first, stop = _gathered(held, key, lo, hi, columns, base=size_us is None and gap_us is None)
        for calc in calcs:
            out[calc.name] = KINDS[calc.kind].window(calc, rows.columns(calc), first, stop, rows.key_code)
    return out


def _session_starts(held: Held, calc: Calc, key: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """For each query (key, window end `hi`): where the session open at `hi` starts, or `hi` when none is."""
    whole = held.whole()
    until = whole.locate(key, hi, held.plan)
    start = session_runs(whole, calc).ranges(whole.key_start(key), until, hi, calc.gap_us)  # type: ignore[arg-type]
    pane = whole.table[PANE].to_numpy(dtype=np.int64)
    return np.where(start < until, pane[np.minimum(start, max(len(pane) - 1, 0))], hi)


@dataclass
class _Taken:
    """Rows of one table for some queries: `rows` of `table`, for queries `query` (sorted), the `within`-th of
    each query's rows from this table."""

    table: Sorted
    rows: np.ndarray
    query: np.ndarray
    within: np.ndarray


def _gathered(
    held: Held, key: np.ndarray, lo: np.ndarray, hi: np.ndarray, columns: list[str], base: bool
) -> tuple[Sorted, np.ndarray, np.ndarray]:
    """The rows holding each query's panes in [lo, hi) (with `base`, its BASE row too), query after query, each
    query's in time order: a table whose `key_code` is the query's number, and each query's range of it."""
    plan, chunk_us = held.plan, held.chunk_us
    template = next(iter(held.chunks.values()))
    taken = [_Taken(template, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))]
    if base and BASE in held.chunks:
        taken.append(_summary_rows(held.chunks[BASE], key, np.arange(len(key))))
    live = np.flatnonzero(lo < hi)
    first, last = lo // chunk_us, (hi - plan.pane_us) // chunk_us
    for number in np.unique(first[live]).tolist():  # the chunk the window starts in: its panes from lo
        s = held.chunks.get(number * chunk_us)
        if s is not None:
            q = live[first[live] == number]  # (a window end past the chunk locates the end of its key's rows)
            taken.append(_ranges(s, q, s.locate(key[q], lo[q], plan), s.locate(key[q], hi[q], plan)))
    numbers = held.starts() // chunk_us
    if len(numbers):
        inner = live[last[live] > first[live] + 1]
        left = np.maximum(first[inner] + 1, numbers[0])
        right = np.minimum(last[inner], numbers[-1] + 1)
        some = right > left  # a window whose middle lies before or after every chunk held reads no summary
        taken += _middle(held, numbers, key, inner[some], left[some], right[some])
    for number in np.unique(last[live][last[live] > first[live]]).tolist():  # the chunk it ends in: up to hi
        s = held.chunks.get(number * chunk_us)
        if s is not None:
            q = live[(last[live] == number) & (last[live] > first[live])]
            taken.append(_ranges(s, q, s.key_start(key[q]), s.locate(key[q], hi[q], plan)))
    return _stacked_rows(taken, columns, len(key))


def _ranges(s: Sorted, query: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> _Taken:
    lengths = np.maximum(ends - starts, 0)
    total = int(lengths.sum())
    offsets = np.repeat(np.cumsum(lengths) - lengths, lengths)
    within = np.arange(total) - offsets
    return _Taken(s, np.repeat(starts, lengths) + within, np.repeat(query, lengths), within)


def _summary_rows(s: Sorted, key: np.ndarray, query: np.ndarray) -> _Taken:
    """The row of each query's key in a table of one row per key (a summary, or the BASE chunk), where it has one."""
    codes = s.key_code
    at = np.searchsorted(codes, key)
    hit = at < len(codes)
    hit[hit] = codes[at[hit]] == key[hit]
    return _Taken(s, at[hit], query[hit], np.zeros(int(hit.sum()), np.int64))


def _middle(
    held: Held, numbers: np.ndarray, key: np.ndarray, query: np.ndarray, left: np.ndarray, right: np.ndarray
) -> list[_Taken]:
    """The summary rows of the whole chunks [left, right) (by number) of each query, in time order: the runs of
    the segment tree that cover them. Queries of one stretch (the keys read at one window end) share its runs, so
    each distinct stretch is split into runs once."""
    if not len(query):
        return []
    width = int((right - left).max()) + 1
    stretch, of_query = np.unique((left - left.min()) * width + (right - left), return_inverse=True)
    by_stretch = np.argsort(of_query, kind="stable")
    bounds = np.r_[0, np.cumsum(np.bincount(of_query, minlength=len(stretch)))]
    lo = stretch // width + left.min()
    hi = lo + stretch % width
    runs: dict[tuple[int, int], list[int]] = {}  # (h, run) -> the stretches it covers part of
    h, which = 0, np.arange(len(stretch))
    while (open_ := lo < hi).any():
        take = open_ & (lo & 1 == 1)
        for i, run in zip(which[take].tolist(), lo[take].tolist(), strict=True):
            runs.setdefault((h, run), []).append(i)
        lo = lo + take
        take = open_ & (hi & 1 == 1)
        hi = hi - take
        for i, run in zip(which[take].tolist(), hi[take].tolist(), strict=True):
            runs.setdefault((h, run), []).append(i)
        lo, hi, h = lo >> 1, hi >> 1, h + 1
    summaries(held, numbers, list(runs))
    out = []
    for h, run in sorted(runs, key=lambda r: r[1] << r[0]):  # by start: a query's runs in time order
        s = held.summaries[h, run]
        if s is not None:
            q = np.concatenate([query[by_stretch[bounds[i] : bounds[i + 1]]] for i in runs[h, run]])
            out.append(_summary_rows(s, key[q], q))
    return out


def _stacked_rows(taken: list[_Taken], columns: list[str], n: int) -> tuple[Sorted, np.ndarray, np.ndarray]:
    """The taken rows as one table, query after query, each query's rows in the order taken."""
    counts = np.zeros(n, dtype=np.int64)
    for t in taken:
        counts += np.bincount(t.query, minlength=n)
    ends = np.cumsum(counts)
    starts = ends - counts
    following = starts.copy()
    places = []
    for t in taken:  # each query's rows after those of the tables before
        places.append(following[t.query] + t.within)
        following += np.bincount(t.query, minlength=n)
    total = int(ends[-1]) if n else 0
    out: dict[str, Any] = {}
    for column in columns:
        parts = [t.table.array(column) for t in taken]
        if any(isinstance(p, pd.arrays.ArrowExtensionArray) for p in parts):
            arrays = [arrow_array(p).take(pa.array(t.rows)) for p, t in zip(parts, taken, strict=True)]
            joined = pa.concat_arrays([a.cast(arrays[0].type) for a in arrays])
            back = np.empty(total, dtype=np.int64)
            back[np.concatenate(places)] = np.arange(total)
            out[column] = pd.arrays.ArrowExtensionArray(joined.take(pa.array(back)))
            continue
        values = np.empty(total, dtype=np.result_type(*(p.dtype for p in parts)))
        for p, t, place in zip(parts, taken, places, strict=True):
            values[place] = p[t.rows]
        out[column] = values
    query = np.repeat(np.arange(n), counts)
    return Sorted.of_columns(out, query, query, 0, 1), starts, ends


def summaries(held: Held, numbers: np.ndarray, wanted: list[tuple[int, int]]) -> None:
    """Keep the summaries `wanted` by (h, run): the chunks numbered run * 2^h up to (run + 1) * 2^h (`numbers`:
    the held chunks' numbers), one row per key holding panes there, its partials merged in time order (None where
    no chunk is held). Those not kept yet are merged level by level, each level's in one merge (and so are the
    ones under them that they are merged from)."""
    missing: dict[int, list[int]] = {}
    todo = [w for w in dict.fromkeys(wanted) if w not in held.summaries]
    seen = set(todo)
    while todo:
        h, run = todo.pop()
        lo, hi = np.searchsorted(numbers, [run << h, (run + 1) << h])
        if lo == hi:
            held.summaries[h, run] = None
            continue
        missing.setdefault(h, []).append(run)
        for child in ((h - 1, 2 * run), (h - 1, 2 * run + 1)) if h else ():
            if child not in held.summaries and child not in seen:
                seen.add(child)
                todo.append(child)
    for h in sorted(missing):
        runs = sorted(missing[h])
        if h == 0:
            parts = [[held.chunks[run * held.chunk_us]] for run in runs]
        else:  # a run with one child held is that child
            parts = [[c for c in (held.summaries[h - 1, 2 * r], held.summaries[h - 1, 2 * r + 1]) if c] for r in runs]
        merged = iter(_merged_runs(held.plan, [p for p in parts if h == 0 or len(p) > 1]))
        for run, part in zip(runs, parts, strict=True):
            held.summaries[h, run] = next(merged) if h == 0 or len(part) > 1 else part[0]


def _merged_runs(plan: Plan, parts: list[list[Sorted]]) -> list[Sorted]:
    """For each list of tables (rows sorted by key, each table's rows after the previous one's in time), one row
    per key: its rows merged, in one merge for all the lists (each (list, key) its own range). A key with one
    row keeps it as it is."""
    if not parts:
        return []
    columns = [KEY, *pane_columns(plan)[2:]]
    tables = [t for p in parts for t in p]
    codes = np.concatenate([t.key_code for t in tables])
    of_part = np.repeat(np.arange(len(parts)), [sum(len(t.key_code) for t in p) for p in parts])
    group = of_part * (int(codes.max(initial=0)) + 1) + codes
    order = np.argsort(group, kind="stable")
    group = group[order]  # each (list, key) its own group: a moment's shift is taken within it
    rows = Sorted.of_columns({c: stacked(tables, c, order) for c in columns}, group, group, 0, 1)
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    ends = np.r_[starts[1:], len(group)]
    several = np.flatnonzero(ends - starts > 1)
    partials = merged_partials(plan, rows, starts[several], ends[several], False)
    out: dict[str, Any] = {}
    for column in columns:
        values = rows.array(column)
        if isinstance(values, pd.arrays.ArrowExtensionArray):
            pick = starts.copy()
            pick[several] = len(values) + np.arange(len(several))
            joined = pa.chunked_array([arrow_array(values), pa.array(partials[column]).cast(arrow_array(values).type)])
            out[column] = pd.arrays.ArrowExtensionArray(joined.take(pa.array(pick)).combine_chunks())
            continue
        out[column] = values[starts]
        if column in partials:
            out[column][several] = partials[column]
    key = out[KEY]
    bounds = np.r_[np.searchsorted(of_part[order][starts], np.arange(len(parts))), len(starts)]
    return [
        Sorted.of_columns({c: v[a:b] for c, v in out.items()}, key[a:b], key[a:b], 0, 1)
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)
    ]
