"""A stream's pane table as its state holds it: in chunks of pane time (docs/internals.md, "A micro-batch's work").

Each chunk is a pane table of the stream's key codes, sorted by (key, pane), holding the panes of `chunk_us` of
time (the chunks the state store keeps); the BASE chunk holds the keys' folded Lifetime partials. A micro-batch
merges its panes into the chunks they fall in, finds change points in the chunks near the watermark, reads window
values through `features.kernel.summaries`, and drops whole chunks as windows leave them, so its work grows with
the chunks it touches, not with the panes held. The meaning of every value is docs/semantics.md."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from features.kernel.kinds import KINDS
from features.kernel.plan import BASE, KEY, PANE, Calc, Plan
from features.kernel.state import chunk_of
from features.kernel.table import (
    Sorted,
    change_ends,
    column_array,
    combine,
    combine_sorted,
    empty_table,
    frame_of,
    pane_moves,
    session_runs,
)


@dataclass
class Held:
    """A key-coded pane table in chunks (`chunks`: chunk start µs, or BASE, -> its rows sorted by (key, pane)),
    and what reads of it keep between micro-batches: the merged summaries of runs of chunks (`summaries`, by
    (h, run): chunks run * 2^h up to (run + 1) * 2^h, by chunk number), dropped when a chunk under them changes."""

    plan: Plan
    chunk_us: int
    chunks: dict[int, Sorted] = field(default_factory=dict)
    summaries: dict[tuple[int, int], Sorted | None] = field(default_factory=dict)
    memo: dict[str, object] = field(default_factory=dict)  # what is derived from all the chunks, until one changes

    @classmethod
    def of(cls, plan: Plan, chunk_us: int, tables: Sequence[pd.DataFrame]) -> Held:
        """The chunks of pane tables given in any order or chunking (stored chunks of another length are refiled);
        rows of one (key, pane) in several tables are merged."""
        pieces: dict[int, list[tuple[pd.DataFrame, dict[str, Any]]]] = {}
        for table in tables:
            for chunk, rows, columns in _by_chunk(table, chunk_us):
                pieces.setdefault(chunk, []).append((rows, columns))
        held = cls(plan, chunk_us)
        held.chunks = {chunk: _filed(plan, parts) for chunk, parts in pieces.items()}
        return held

    @property
    def rows(self) -> int:
        return sum(len(s.key_code) for s in self.chunks.values())

    def frame(self) -> pd.DataFrame:
        """Every row, chunk after chunk (BASE first)."""
        frames = [self.chunks[c].table for c in sorted(self.chunks)]
        return (
            pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0] if frames else empty_table(self.plan)
        )

    def starts(self) -> np.ndarray:
        """The start of each chunk of panes (BASE aside), in time order."""
        if "starts" not in self.memo:
            self.memo["starts"] = np.array(sorted(c for c in self.chunks if c != BASE), dtype=np.int64)
        return self.memo["starts"]  # type: ignore[return-value]

    def add(self, panes: pd.DataFrame) -> set[int]:
        """Merge a micro-batch's pane rows (one per (key, pane), sorted by key and pane) into their chunks;
        returns the chunks changed."""
        pieces = list(_by_chunk(panes, self.chunk_us))
        if len(pieces) == 1:  # a steady batch: its panes put in place in the chunk they fall in
            chunk, rows, _ = pieces[0]
            held = self.chunks.get(chunk)
            self.chunks[chunk] = combine_sorted(self.plan, [rows] if held is None else [held.table, rows])
        elif pieces:  # panes of several chunks: merged with theirs in one combine, then filed again
            held = [self.chunks[c].table for c, _, _ in pieces if c in self.chunks]
            merged = combine_sorted(self.plan, [*held, panes]).table
            for chunk, rows, columns in _by_chunk(merged, self.chunk_us):
                self.chunks[chunk] = _filed(self.plan, [(rows, columns)])
        for chunk, _, _ in pieces:
            self.changed(chunk)
        return {chunk for chunk, _, _ in pieces}

    def refreshed(self, tables: dict[int, pd.DataFrame | None]) -> None:
        """Chunks replaced by the tables given (each of its own chunk's panes; None: the chunk is gone), as
        another copy of this state stored them."""
        for chunk, table in tables.items():
            self.chunks.pop(chunk, None)
            if table is not None and len(table):
                self.chunks.update(Held.of(self.plan, self.chunk_us, [table]).chunks)
            self.changed(chunk)

    def changed(self, chunk: int) -> None:
        """Forget what was derived from a chunk whose rows changed (or that came or went)."""
        self.memo.clear()
        if chunk == BASE:
            return
        number = chunk // self.chunk_us
        for h in range(64):
            self.summaries.pop((h, number >> h), None)

    def whole(self) -> Sorted:
        """All the rows as one table sorted by key and pane: what session features read (a session has no bound
        on its length), and a step asking for many values. The chunks are sorted and in time order, so a stable
        sort by key alone puts each key's rows in pane order."""
        if "whole" not in self.memo:
            chunks = [self.chunks[c] for c in sorted(self.chunks)]
            if not chunks:
                return Sorted.of(self.plan, empty_table(self.plan))
            codes = np.concatenate([s.key_code for s in chunks])
            pane = np.concatenate([s.array(PANE) for s in chunks]).astype(np.int64, copy=False)
            starts = self.starts()
            origin = int(starts[0] - starts[0] % self.plan.pane_us) if len(starts) else 0
            rank = np.where(pane == BASE, 0, (pane - origin) // self.plan.pane_us + 1)
            span = int(rank.max(initial=0)) + 2
            order = np.argsort(codes, kind="stable")
            columns = {c: stacked(chunks, c, order) for c in chunks[0].table.columns}
            self.memo["whole"] = Sorted.of_columns(columns, codes[order], (codes * span + rank)[order], origin, span)
        return self.memo["whole"]  # type: ignore[return-value]

    def between(self, after_us: int | None, before_us: int | None) -> Iterator[tuple[int, Sorted]]:
        """The chunks (start, rows) that may hold panes in (after, before), in time order (None: unbounded)."""
        starts = self.starts()
        lo = 0 if after_us is None else int(np.searchsorted(starts, after_us - self.chunk_us, side="right"))
        hi = len(starts) if before_us is None else int(np.searchsorted(starts, before_us, side="left"))
        for chunk in starts[lo:hi].tolist():
            yield chunk, self.chunks[chunk]

    def changes(self, after_us: int | None, upto_us: int) -> tuple[np.ndarray, np.ndarray]:
        """(key, E) for every window end in (after, upto] where some feature's value may change (`change_ends`):
        read from the chunks that can hold panes entering or leaving a window then, and for session features
        from the panes whole (a session closes a gap after its last pane, however old)."""
        hops = replace(self.plan, calcs=tuple(c for c in self.plan.calcs if c.gap_us is None))
        near: set[int] = set()
        for _, every_us, size_us, _ in _shapes(hops):
            for offset in (0,) if size_us is None else (0, size_us):
                low = None if after_us is None else after_us - offset - every_us
                near.update(chunk for chunk, _ in self.between(low, upto_us - offset))
        found = [(s, *change_ends(hops, s, after_us, upto_us)) for s in (self.chunks[c] for c in sorted(near))]
        if self.plan.session_conditions:
            sessions = replace(self.plan, calcs=tuple(c for c in self.plan.calcs if c.gap_us is not None))
            whole = self.whole()
            found.append((whole, *change_ends(sessions, whole, after_us, upto_us)))
        keys = [np.zeros(0, np.int64), *(s.key_code[rows] for s, rows, _ in found)]
        ends = [np.zeros(0, np.int64), *(e for _, _, e in found)]
        return np.concatenate(keys), np.concatenate(ends)

    def first_change(self, after_us: int) -> int | None:
        """The first window end after `after` where some value may change, if any: read from the oldest chunks
        that can hold it on."""
        found = []
        for condition, every_us, size_us, gap_us in _shapes(self.plan):
            for offset in (0,) if size_us is None else (0, size_us):
                for _, s in self.between(after_us - offset - every_us, None):  # ends grow with panes: the first wins
                    pane, counts = _moving(s, condition)
                    e = pane_moves(pane, counts, every_us, offset, after_us, None, None)[1]
                    if len(e := e[e > after_us]):
                        found.append(int(e.min()))
                        break
            if gap_us is not None:
                calc = _session_calc(self.plan, condition, every_us, gap_us)
                e = session_runs(self.whole(), calc).closes(every_us, gap_us)[1]
                if len(e := e[e > after_us]):
                    found.append(int(e.min()))
        return min(found) if found else None

    def prune(self, upto_us: int, align_us: int | None) -> tuple[bool, set[int]]:
        """Drop the panes no window ending after `upto` reads (`prune_cut`); fold those only Lifetime windows
        still read into each key's BASE row. Returns whether it folded, and the chunks it changed or dropped."""
        cut = prune_cut(self.plan, self.whole if self.plan.session_conditions else None, upto_us, align_us)
        old, changed = [], set()
        for chunk, s in list(self.between(None, cut)):
            older = s.table[PANE].to_numpy(dtype=np.int64) < cut
            if older.all():
                old.append(s.table)
                del self.chunks[chunk]
            elif older.any():  # a chunk across an unaligned cut: its older rows
                old.append(s.table[older])
                self.chunks[chunk] = Sorted.of(self.plan, s.table[~older])
            else:
                continue
            changed.add(chunk)
        for chunk in changed:
            self.changed(chunk)
        if not old or all(c.bounded for c in self.plan.calcs):
            return False, changed
        base = self.chunks.get(BASE)
        self.chunks[BASE] = Sorted.of(self.plan, folded_base(self.plan, [base.table] if base else [], old))
        self.changed(BASE)
        return True, changed | {BASE}

    def renumbered(self, renumber: np.ndarray) -> None:
        """Map every key code through `renumber` (increasing on the codes held: each chunk's order stays)."""
        for chunk, s in self.chunks.items():
            codes = renumber[s.key_code]
            rank = s.position - s.key_code * s.span
            table = s.table.assign(**{KEY: codes})
            self.chunks[chunk] = Sorted(table, codes, codes * s.span + rank, s.origin, s.span)
        self.summaries.clear()
        self.memo.clear()

    def key_codes(self) -> np.ndarray:
        """The distinct key codes held, sorted."""
        each = [_keys_of(s) for s in self.chunks.values()]
        return np.unique(np.concatenate(each)) if each else np.zeros(0, np.int64)

    def most_keys(self) -> int:
        """The most keys any one chunk holds: at most the keys held, and far cheaper to know."""
        return max((len(_keys_of(s)) for s in self.chunks.values()), default=0)


def prune_cut(plan: Plan, whole: Callable[[], Sorted] | None, upto_us: int, align_us: int | None) -> int:
    """The earliest pane some window ending after `upto` reads (rounded down to `align_us`): each Hop's window
    start at the window end `upto` closes, and for session features the start of the earliest session that may
    still be open then. `whole`: a function giving the sorted table, called only for session features."""
    cut = min(
        (upto_us - upto_us % c.every_us) - (c.size_us if c.size_us is not None else c.every_us) for c in plan.calcs
    )
    calcs = [c for c in plan.calcs if c.gap_us is not None]
    if calcs:
        s = whole()  # type: ignore[misc]
        pane = s.table[PANE].to_numpy(dtype=np.int64)
        for calc in calcs:
            end = upto_us - upto_us % calc.every_us
            cut = min(cut, end - calc.gap_us - calc.every_us)
            live = session_runs(s, calc).live_starts(end - calc.every_us, calc.gap_us)
            if len(live):
                cut = min(cut, int(pane[live].min()))
    if align_us:
        cut -= cut % align_us
    return cut


def folded_base(plan: Plan, base: list[pd.DataFrame], old: list[pd.DataFrame]) -> pd.DataFrame:
    """Each key's BASE row: its BASE rows and its `old` panes (in time order) merged, with no event counts (a
    BASE row never makes a change point, nor is part of a session) and no Hop's or Session's data."""
    folded = pd.concat([*base, *old], ignore_index=True)
    folded[PANE] = BASE
    out = combine(plan, [folded])
    for i in range(len(plan.conditions)):
        out[f"fx_n{i}"] = 0
    for calc in plan.calcs:
        if calc.bounded:
            for part, values in KINDS[calc.kind].empty(calc, len(out)).items():
                out[calc.col(part)] = values
    return out


def stacked(tables: Sequence[Sorted], column: str, order: np.ndarray) -> Any:
    """A column of tables one after the other, its rows taken in `order`."""
    parts = [t.array(column) for t in tables]
    if isinstance(parts[0], pd.arrays.ArrowExtensionArray):
        arrays = [arrow_array(p) for p in parts]
        joined = pa.concat_arrays([a.cast(arrays[0].type) for a in arrays])
        return pd.arrays.ArrowExtensionArray(joined.take(pa.array(order)))
    return np.concatenate(parts)[order]


def arrow_array(values: Any) -> pa.Array:
    """A column's values as one Arrow array (a concatenation's come chunked)."""
    array = pa.array(values)
    return array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array


def _by_chunk(table: pd.DataFrame, chunk_us: int) -> Iterator[tuple[int, pd.DataFrame, dict[str, Any]]]:
    """A table's rows by chunk, each chunk's in the table's order, with its columns' values."""
    if not len(table):
        return
    of_row = chunk_of(table, chunk_us)
    columns = {c: column_array(table[c]) for c in table.columns}
    if of_row[0] == of_row[-1] and (of_row == of_row[0]).all():
        yield int(of_row[0]), table, columns
        return
    order = np.argsort(of_row, kind="stable")
    of_row = of_row[order]
    columns = {c: values[order] for c, values in columns.items()}  # one take each, then slices (no copy)
    bounds = np.r_[0, np.flatnonzero(np.diff(of_row)) + 1, len(order)]
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        part = {c: values[lo:hi] for c, values in columns.items()}
        yield int(of_row[lo]), frame_of(part), part


def _filed(plan: Plan, parts: list[tuple[pd.DataFrame, dict[str, Any]]]) -> Sorted:
    """A chunk from pieces of tables (rows, their columns' values), merged where they share a (key, pane)."""
    s = combine_sorted(plan, [rows for rows, _ in parts])
    if s.table is parts[0][0]:  # as given (sorted, one row each): its columns' values are at hand
        s.memo.update({("array", c): v for c, v in parts[0][1].items()})
    return s


def _shapes(plan: Plan) -> list[tuple[int, int, int | None, int | None]]:
    """The distinct (where, every, size, gap) of the plan's features: each moves its values on its own grid."""
    return list(dict.fromkeys((c.condition, c.every_us, c.size_us, c.gap_us) for c in plan.calcs))


def _keys_of(s: Sorted) -> np.ndarray:
    """A chunk's distinct key codes (kept with it: a chunk a step does not change keeps them)."""
    if "keys" not in s.memo:
        s.memo["keys"] = s.key_code[s.key_firsts()]
    return s.memo["keys"]


def _moving(s: Sorted, condition: int) -> tuple[np.ndarray, np.ndarray]:
    return s.array(PANE).astype(np.int64, copy=False), s.array(f"fx_n{condition}").astype(np.int64, copy=False)


def _session_calc(plan: Plan, condition: int, every_us: int, gap_us: int) -> Calc:
    return next(c for c in plan.calcs if (c.condition, c.every_us, c.gap_us) == (condition, every_us, gap_us))
