"""Session windows in the kernel (docs/semantics.md, Sessions): which panes make a key's open session at a
window end, where its value changes, and how far back a stream must keep panes for it.

Events of one pane are less than the pane length apart, and a session's `gap` is a whole multiple of it, so a
session never splits inside a pane: sessions are runs of a key's panes (those holding events that pass the
feature's `where`) in which each pane's first event is less than `gap` after the previous pane's last. So a
session `where`'s panes keep the first and last time of its events (beside the event count every `where` has),
which all its session features share, and a session is a range of pane rows that any aggregation reads as it
reads a window's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from features.kernel.partials import Kind, bincount, nullable, ranges_add, ranges_extreme
from features.kernel.plan import TS


def columns(condition: int) -> dict[str, str]:
    """A session `where`'s pane-table columns by part: its event count (the `fx_n` every `where` has) and the
    first and last event times, which the session features of that `where` share."""
    return {"sn": f"fx_n{condition}", "s0": f"fx_first{condition}", "s1": f"fx_last{condition}"}


def phase1_bounds(codes: np.ndarray, groups: int, mask: np.ndarray, events: Any) -> dict[str, np.ndarray]:
    """Per pane: the first and last time of the events passing a `where`."""
    c, t = codes[mask], events[TS].to_numpy(dtype=np.int64)[mask]
    first, last = np.full(groups, np.iinfo(np.int64).max), np.full(groups, np.iinfo(np.int64).min)
    np.minimum.at(first, c, t)
    np.maximum.at(last, c, t)
    present = bincount(c, groups) > 0
    return {"s0": np.where(present, first, 0), "s1": np.where(present, last, 0)}


def merged_parts(cols: dict[str, Any], starts: np.ndarray, ends: np.ndarray) -> dict[str, np.ndarray]:
    """The event count and the first and last event times over rows [start, end)."""
    present = cols["sn"] > 0
    first, any_ = ranges_extreme(cols["s0"], present, starts, ends, smallest=True)
    last = ranges_extreme(cols["s1"], present, starts, ends, smallest=False)[0]
    return {"sn": ranges_add(cols["sn"], starts, ends), "s0": np.where(any_, first, 0), "s1": np.where(any_, last, 0)}


@dataclass(frozen=True)
class Runs:
    """A pane table's sessions for one (where, gap): for each row, the last row at or before it (of its key)
    holding events, and for each such row the first row of its session."""

    last_present: np.ndarray  # row index, or -1
    start: np.ndarray  # for rows holding events: the first row of their session
    s1: np.ndarray

    @classmethod
    def of(cls, cols: dict[str, Any], key_code: np.ndarray, gap_us: int) -> Runs:
        n = len(key_code)
        present = np.flatnonzero(cols["sn"] > 0)
        s0, s1 = cols["s0"], cols["s1"]
        # A session starts at a key's first row with events, and wherever a row's first event is a gap or more
        # after the previous row's last.
        starts = np.ones(len(present), dtype=bool)
        starts[1:] = (key_code[present[1:]] != key_code[present[:-1]]) | (s0[present[1:]] - s1[present[:-1]] >= gap_us)
        start = np.full(n, -1, dtype=np.int64)
        start[present] = present[np.maximum.accumulate(np.where(starts, np.arange(len(present)), 0))]
        mark = np.full(n, -1, dtype=np.int64)
        mark[present] = present
        last_present = np.maximum.accumulate(mark) if n else mark
        same_key = last_present >= 0
        same_key[same_key] = key_code[last_present[same_key]] == key_code[np.flatnonzero(same_key)]
        return cls(np.where(same_key, last_present, -1), start, s1)

    def ranges(self, key_first: np.ndarray, hi: np.ndarray, ends: np.ndarray, gap_us: int) -> np.ndarray:
        """For each query (its key's first row, first row at or after E, E): the first row of the session open
        at E, or `hi` (an empty range) when none is."""
        before = np.where(hi > key_first, hi - 1, -1)
        last = np.where(before >= 0, self.last_present[np.maximum(before, 0)], -1)
        last = np.where(last >= key_first, last, -1)
        open_ = (last >= 0) & (ends - self.s1[np.maximum(last, 0)] < gap_us)
        return np.where(open_, self.start[np.maximum(last, 0)], hi)

    def closes(self, every_us: int, gap_us: int) -> tuple[np.ndarray, np.ndarray]:
        """(row, E) where each session closes: the first window end at least `gap` after its last event."""
        present = np.flatnonzero(self.start >= 0)
        if len(present) == 0:
            return present, present
        last_of_run = np.r_[self.start[present[1:]] != self.start[present[:-1]], True]
        rows = present[last_of_run]
        reach = self.s1[rows] + gap_us
        return rows, reach + (-reach) % every_us

    def live_starts(self, upto_us: int, gap_us: int) -> np.ndarray:
        """The first rows of the sessions still open after `upto` (that a later event can extend): what a stream
        keeps (`prune` takes the earliest of their panes)."""
        present = np.flatnonzero(self.start >= 0)
        return np.unique(self.start[present[self.s1[present] + gap_us > upto_us]])


class SessionBounds(Kind):
    """session_start (the first event's time, to the whole second) / session_duration (seconds from the first
    event to the last): read from the session parts every session feature has."""

    parts = ()

    def __init__(self, duration: bool) -> None:
        self.duration = duration

    def phase1(self, calc, codes, groups, mask, frame):
        return {}

    def merge(self, calc, cols, starts, ends, key_of_row, same_pane=False):
        return {}

    def window(self, calc, cols, starts, ends, key_of_row):
        bounds = merged_parts(cols, starts, ends)
        present = bounds["sn"] > 0
        if self.duration:
            return nullable((bounds["s1"] - bounds["s0"]) / 1e6, present)
        # whole seconds: Feast's online store keeps times to the second, and every store holds the same value
        return nullable(bounds["s0"] - bounds["s0"] % 1_000_000, present)

    def finalize(self, calc, cols):
        raise NotImplementedError("a session's bounds are read over its rows by `window`")
