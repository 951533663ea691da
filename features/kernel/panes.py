"""Window and pane arithmetic, in integer microseconds since the epoch (UTC).

The one place that says which events a window holds and when a value changes. The batch and streaming
engines and the reference all call these functions (or compile exactly these formulas), so they cannot drift.

For a window of `size` ending at every multiple of `every`, the value at time t covers events with
timestamp in [E - size, E), E = floor(t / every) * every. A pane p = floor(ts / every) * every lies inside
the windows ending at E in [p + every, p + size], so a key's value can change only at p + every (the pane
enters) and p + size + every (it leaves).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import reduce
from math import gcd

from features.spec import FeatureGroup, Window

MICROS = 1_000_000


def floor_to(t_us: int, step_us: int) -> int:
    """The largest multiple of `step_us` that is <= `t_us` (true floor, also before 1970)."""
    return t_us - t_us % step_us


def window_end(t_us: int, every_us: int) -> int:
    """E: the end of the window whose value is current at time t."""
    return floor_to(t_us, every_us)


def window_interval(t_us: int, window: Window) -> tuple[int | None, int]:
    """[lo, hi) of event times that make the value at time t; lo is None for Lifetime."""
    hi = window_end(t_us, window.every_s * MICROS)
    return (None if window.size_s is None else hi - window.size_s * MICROS), hi


def entry_end(pane_us: int, every_us: int) -> int:
    """The first window end whose window holds the pane."""
    return pane_us + every_us


def exit_end(pane_us: int, size_us: int, every_us: int) -> int:
    """The first window end whose window no longer holds the pane."""
    return pane_us + size_us + every_us


@dataclass(frozen=True)
class WindowShape:
    """A distinct (size, every) among a group's features, in microseconds; size None for Lifetime."""

    size_us: int | None
    every_us: int

    @classmethod
    def of(cls, window: Window) -> WindowShape:
        return cls(None if window.size_s is None else window.size_s * MICROS, window.every_s * MICROS)

    def change_points(self, pane_us: int) -> tuple[int, ...]:
        """Window ends at which a pane (of any length dividing `every`) changes this window's value."""
        coarse = floor_to(pane_us, self.every_us)
        enter = entry_end(coarse, self.every_us)
        if self.size_us is None:
            return (enter,)
        return enter, exit_end(coarse, self.size_us, self.every_us)


def pane_length_us(windows: Iterable[Window]) -> int:
    """The one pane length a group's phase 1 uses: the gcd of its features' `every`."""
    return reduce(gcd, (w.every_s for w in windows)) * MICROS


def lookback_start(windows: Iterable[Window], watermark_us: int | None) -> int | None:
    """The earliest event time the windows ending after `watermark_us` read: a Hop's size and one `every` before
    the last end of its grid the watermark passed. None (every event) for a Lifetime's totals, a Session's start,
    or no watermark yet."""
    if watermark_us is None:
        return None
    earliest = []
    for window in windows:
        if window.size_s is None or window.gap_s is not None:
            return None
        every = window.every_s * MICROS
        earliest.append(watermark_us - watermark_us % every - window.size_s * MICROS - every)
    return min(earliest, default=None)


def lookback_us(group: FeatureGroup) -> int | None:
    """How far before a range start events still matter (the longest window); None if any is Lifetime."""
    sizes = [f.window.size_s for f in group.features]
    if any(s is None for s in sizes):
        return None
    return max(s for s in sizes if s is not None) * MICROS


def shapes(group: FeatureGroup) -> list[WindowShape]:
    """The group's distinct window shapes, in a stable order."""
    seen: dict[WindowShape, None] = {}
    for feat in group.features:
        seen.setdefault(WindowShape.of(feat.window))
    return list(seen)
