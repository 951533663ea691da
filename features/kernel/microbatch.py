"""The stream's micro-batch over a pane table (features.kernel.table): merge the batch's panes, emit the change
points the watermark passed, and drop the panes no later window reads. Pure numpy/pandas, no Spark; the meaning
of every value is docs/semantics.md."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from features.kernel.kinds import KINDS
from features.kernel.plan import BASE, KEY, PANE, TS, Calc, Plan
from features.kernel.table import (
    ASKED,
    Sorted,
    change_ends,
    combine,
    combine_sorted,
    emit,
    frame_of,
    inserted,
    keys_at,
    phase1,
    renumbered,
    session_runs,
    values_at,
)


def prune(plan: Plan, table: pd.DataFrame, upto_us: int, align_us: int | None = None) -> pd.DataFrame:
    """Drop panes that no window ending after `upto` reads; fold those only Lifetime windows still read into
    each key's BASE row. With `align_us`, only whole stretches of that length go (stored chunks)."""
    return _pruned(plan, table, upto_us, align_us)[0]


def _pruned(plan: Plan, table: pd.DataFrame, upto_us: int, align_us: int | None) -> tuple[pd.DataFrame, bool]:
    """`prune`, and whether it folded panes into BASE rows."""
    cut = min(
        (upto_us - upto_us % c.every_us) - (c.size_us if c.size_us is not None else c.every_us) for c in plan.calcs
    )
    cut = min(cut, _session_cut(plan, table, upto_us))
    if align_us:
        cut -= cut % align_us
    pane = table[PANE].to_numpy(dtype=np.int64)
    old = pane < cut  # BASE rows among them: each fold merges the newly old panes into them
    if not (old & (pane != BASE)).any():
        return table, False
    keep = table[~old]
    if all(c.bounded for c in plan.calcs):
        return renumbered(keep), False
    folded = table[old].copy()
    folded[PANE] = BASE
    base = combine(plan, [folded])
    for i in range(len(plan.conditions)):  # the base row never makes a change point, nor is part of a session
        base[f"fx_n{i}"] = 0
    for calc in plan.calcs:  # nor carries a Hop's or a Session's data
        if calc.bounded:
            base = _clear(calc, base)
    put = inserted(plan, keep, base)  # kept sorted for the next step's insertion where it applies
    if put is not None:
        return put.table, True
    return pd.concat([base, keep], ignore_index=True), True


def _clear(calc: Calc, table: pd.DataFrame) -> pd.DataFrame:
    for part, values in KINDS[calc.kind].empty(calc, len(table)).items():
        table[calc.col(part)] = values
    return table


def _session_cut(plan: Plan, table: pd.DataFrame, upto_us: int) -> int:
    """The earliest pane a session feature still reads after `upto`: the start of the earliest session that may
    still be open then (one that a later event can extend), else one gap and one `every` back."""
    cut = np.iinfo(np.int64).max
    calcs = [c for c in plan.calcs if c.gap_us is not None]
    if not calcs:
        return cut
    s = Sorted.of(plan, table)
    pane = s.table[PANE].to_numpy(dtype=np.int64)
    for calc in calcs:
        gap = calc.gap_us
        cut = min(cut, upto_us - upto_us % calc.every_us - gap - calc.every_us)  # type: ignore[operator]
        live = session_runs(s, calc).live_starts(upto_us - upto_us % calc.every_us - calc.every_us, gap)  # type: ignore[arg-type]
        if len(live):
            cut = min(cut, int(pane[live].min()))
    return cut


@dataclass(frozen=True)
class Step:
    table: pd.DataFrame  # the pane table after the step
    rows: pd.DataFrame  # change points with window end in (after, upto]
    late: pd.DataFrame  # input events behind `after`: they would change rows already emitted
    next_change: int | None  # the first window end after `upto` where a value may change
    eager: pd.DataFrame | None = None  # the value at `eager_at` of each key the events touched
    folded: bool = False  # panes were folded into BASE rows: the keys' Lifetime partials changed


def step(
    plan: Plan,
    table: pd.DataFrame | Sequence[pd.DataFrame],
    events: pd.DataFrame,
    after: int | None,
    upto: int,
    align_us: int | None = None,
    eager_at: int | None = None,
    eager_after: int | None = None,
) -> Step:
    """One micro-batch for one set of keys: merge the events' pane partials into the table (or its chunks, in
    any order), emit the change points whose window end the watermark passed, and drop what no later window
    reads.

    `after` is the watermark the previous step emitted up to: an event before the window end it closed
    (`Plan.closed_end`) is late (it would change a change point emitted already) and is returned instead of used;
    one between that end and `after` changes only rows still to come, and is used.

    `eager_at` (a window end ahead of the watermark): also the value there, from the events received so far, of
    each key the events touched and of each key whose value changes in (`eager_after`, `eager_at`] (a pane of an
    earlier batch closed, or left a window, since the previous eager value was written)."""
    late = np.zeros(len(events), dtype=bool)
    if after is not None:
        late = events[TS].to_numpy(dtype=np.int64) < plan.closed_end(after)
    tables = [table] if isinstance(table, pd.DataFrame) else list(table)
    fresh = events[~late]
    merged = combine_sorted(plan, [*tables, phase1(plan, fresh)])
    # Every end in (after, horizon] where a value may change, found once for the rows, the eager values and the
    # timer (the panes `prune` drops make no change after `upto`).
    horizon = upto if eager_at is None else max(upto, eager_at)
    row, end = change_ends(plan, merged, after, horizon)
    if eager_at is not None and plan.keys == (KEY,):
        # The keys whose values the rows and the eager values read (key codes here: the stream's), so that what
        # they share is built once (`values_at`).
        merged.memo[ASKED] = np.concatenate([fresh[KEY].to_numpy(dtype=np.int64), merged.key_code[row]])
    if after is None or upto > after:
        rows = emit(plan, merged, after, upto, changes=(row, end))
    else:
        rows = emit(plan, merged.table.iloc[:0], None, 0)
    eager = None
    if eager_at is not None and len(merged.table):  # an empty table (every pane pruned) has no value to give
        wanted = fresh[list(plan.keys)]
        if eager_after is not None and eager_after < eager_at:
            changed = row[(end > eager_after) & (end <= eager_at)]
            wanted = pd.concat([wanted, merged.table[list(plan.keys)].iloc[changed]])
        eager = values_of(plan, merged, wanted, eager_at)
    table, folded = _pruned(plan, merged.table, upto, align_us)
    later = end[end > upto]
    if not len(later):  # none before the horizon: the first one after it, if any
        later = change_ends(plan, merged, horizon, None)[1]
    return Step(table, rows, events[late], int(later.min()) if len(later) else None, eager, folded)


def values_of(plan: Plan, s: Sorted, keys: pd.DataFrame, at_us: int) -> pd.DataFrame:
    """Rows (keys, `window_end` = at, features): the value at `at` of each key of `keys` that `s` holds."""
    first = s.key_firsts()
    held = s.table[list(plan.keys)].iloc[first]
    wanted = keys.drop_duplicates()
    if len(plan.keys) == 1:
        hit = pd.Index(held.iloc[:, 0]).isin(wanted.iloc[:, 0])
    else:
        hit = pd.MultiIndex.from_frame(held).isin(pd.MultiIndex.from_frame(wanted))
    rows = first[hit]
    ends = np.full(len(rows), at_us, dtype=np.int64)
    out = keys_at(plan, s, rows)
    out["window_end"] = ends
    out.update(values_at(plan, s, s.key_code[rows], ends))
    return frame_of(out)
